"""Plot the retrial study: E[T] against lam, theta and the choice numbers (mean field lines, N-server simulation
points with 95 % confidence intervals).

    python experiments/retrial/plot.py [--quick] [--out DIR]

Reads `retrial.csv` and `simulation.csv` from `--out` (the folder `compute.py` wrote) and writes `retrial.pdf` and
`retrial.png` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402


NAME = "retrial"


def figure(rows, sims):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(10.2, 3.3))
    choices = sorted({(int(r["d1"]), int(r["d2"])) for r in rows if r["sweep"] == "lam"})
    for c, (d1, d2) in enumerate(choices):
        colour = f"C{c}"
        for ax, sweep, x in ((axes[0], "lam", "lam"), (axes[1], "theta", "theta")):
            sel = sorted((r for r in rows if r["sweep"] == sweep and int(r["d1"]) == d1 and int(r["d2"]) == d2),
                         key=lambda r: r[x])
            ax.plot([r[x] for r in sel], [r["ET"] for r in sel], color=colour, label=f"$d_1={d1}, d_2={d2}$")
        theta0 = float(next(r["theta"] for r in rows if r["sweep"] == "lam"))
        for s in sims:
            if (int(s["d1"]), int(s["d2"])) == (d1, d2) and float(s["theta"]) == theta0:
                axes[0].errorbar(s["lam"], s["ET_sim"], yerr=s["ET_ci"], fmt="o", color=colour, ms=3, capsize=2)
    axes[0].set(xlabel=r"$\lambda$", ylabel=r"$E[T]$", yscale="log",
                title=rf"$\theta = {theta0:g}$ (points: $N$-server simulation)")
    lam0 = float(next(r["lam"] for r in rows if r["sweep"] == "theta"))
    axes[1].set(xlabel=r"$\theta$", xscale="log", yscale="log", title=rf"$\lambda = {lam0:g}$")
    from matplotlib.ticker import NullFormatter

    thetas = sorted({float(r["theta"]) for r in rows if r["sweep"] == "theta"})
    ticks = [v for v in (0.2, 0.5, 1.0, 2.0, 5.0) if thetas[0] <= v <= thetas[-1]]
    axes[1].set_xticks(ticks, labels=[f"{v:g}" for v in ticks])
    axes[1].xaxis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=7)
    for sweep, marker, label in (("d1", "o", r"$d_1$ varies"), ("d2", "s", r"$d_2$ varies")):
        for other, ls in ((1, "-"), (2, "--")):
            key = "d2" if sweep == "d1" else "d1"
            sel = sorted((r for r in rows if r["sweep"] == sweep and int(r[key]) == other), key=lambda r: r["value"])
            axes[2].plot([r["value"] for r in sel], [r["ET"] for r in sel], marker=marker, ls=ls, ms=3,
                         label=f"{label}, ${key[0]}_{key[1]} = {other}$")
    axes[2].set(xlabel="choice number", ylabel=r"$E[T]$", title=rf"$\lambda = {lam0:g}$, $\theta = {theta0:g}$")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    rows = _common.read_csv(_common.require_input(out / "retrial.csv", "retrial/compute.py", args.quick, args.out))
    sims = _common.read_csv(out / "simulation.csv")
    _common.plot_style()
    fig = figure(rows, sims)
    _common.save_figure(fig, out, "retrial")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
