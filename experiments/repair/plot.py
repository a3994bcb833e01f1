"""Plot the repairable-server study: E[T] of Models I-IV against lam, alpha, beta and the choice numbers, and of
R.3 against its fraction j of small repairmen (Models I and II at the same point for reference).

    python experiments/repair/plot.py [--quick] [--out DIR]

Reads `repair.csv` from `--out` (the folder `compute.py` wrote) and writes `repair.pdf` and `repair.png` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402


NAME = "repair"
STYLE = {("A1", "R1"): ("I (A1, R1)", "C0", "-"), ("A1", "R2"): ("II (A1, R2)", "C1", "-"),
         ("A2", "R1"): ("III (A2, R1)", "C0", "--"), ("A2", "R2"): ("IV (A2, R2)", "C1", "--"),
         ("A1", "R3"): ("A1, R3", "C2", "-"), ("A2", "R3"): ("A2, R3", "C2", "--")}
LABELS = {"lam": r"$\lambda$", "alpha": r"failure rate $\alpha$", "beta": r"repair rate $\beta$",
          "d1": r"$d_1$ (arrivals)", "d2": r"$d_2$ (repairman)", "j": r"R.3: small repairmen $j$"}


def figure(rows):
    import matplotlib.pyplot as plt

    sweeps = [s for s in LABELS if any(r["sweep"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(2.9 * len(sweeps), 3.0), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps, strict=True):
        for (arrival, repair), (label, colour, ls) in STYLE.items():
            sel = sorted((r for r in rows if r["sweep"] == sweep and r["arrival"] == arrival and r["repair"] == repair),
                         key=lambda r: r["value"])
            ax.plot([r["value"] for r in sel], [r["ET"] for r in sel], color=colour, ls=ls, marker=".", label=label)
        if sweep == "j":
            base = [r for r in rows if r["sweep"] == "j"][0]
            for repair in ("R1", "R2"):
                at = [r for r in rows if r["sweep"] == "lam" and r["arrival"] == "A1" and r["repair"] == repair
                      and abs(r["value"] - base["lam"]) < 1e-9]
                if at:
                    ax.axhline(at[0]["ET"], color=STYLE["A1", repair][1], ls=":", lw=1)
            ax.axvline(base["alpha"] / (base["alpha"] + base["beta"]), color="0.6", lw=0.8)
        ax.set(xlabel=LABELS[sweep], ylabel=r"$E[T]$")
        if sweep in ("alpha", "beta"):
            ax.set_xscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    rows = _common.read_csv(_common.require_input(out / "repair.csv", "repair/compute.py", args.quick, args.out))
    _common.plot_style()
    fig = figure(rows)
    _common.save_figure(fig, out, "repair")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
