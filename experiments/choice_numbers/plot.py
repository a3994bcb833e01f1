"""Plot the choice-number study: E[T] against the probes per job for every law of the exhaustive grid (integers,
two-point mixtures), the optimised laws as c sweeps (the Pareto front), and the optimum's objective against c.

    python experiments/choice_numbers/plot.py [--quick] [--out DIR]

Reads `choice.csv` and `grid.csv` from `--out` (the folder `compute.py` wrote) and writes `choice.pdf` and
`choice.png` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402


NAME = "choice_numbers"


def figure(rows, grid):
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(2, len(cases), figsize=(3.0 * len(cases), 5.6), squeeze=False)
    for k, name in enumerate(cases):
        ax = axes[0, k]
        g = [r for r in grid if r["case"] == name]
        one = all("," not in r["law"] for r in g)  # one choice number: the neighbouring mixtures form a curve
        near = [r for r in g if one and r["j"] - r["i"] <= 1]
        other = [r for r in g if r not in near]
        ax.plot([r["probes"] for r in other], [r["ET"] for r in other], ".", color="0.8", ms=1.5,
                label="other laws on the grid" if one else "laws on the grid")
        if one:
            adj = sorted((r["probes"], r["ET"]) for r in near)
            ax.plot([a for a, _ in adj], [b for _, b in adj], "-", color="C0", lw=1, label="neighbouring mixtures")
        front, low = [], float("inf")  # the grid's Pareto front: no law has fewer probes and a smaller E[T]
        for q, e in sorted((r["probes"], r["ET"]) for r in g):
            if e < low:
                front.append((q, e))
                low = e
        ax.step([a for a, _ in front], [b for _, b in front], where="post", color="k", lw=0.6, label="Pareto front")
        ints = [r for r in g if r["i"] == r["j"]]
        ax.plot([r["probes"] for r in ints], [r["ET"] for r in ints], "o", color="C0", ms=3, label="integer d")
        sel = sorted((r for r in rows if r["case"] == name), key=lambda r: r["probes"])
        ax.plot([r["probes"] for r in sel], [r["ET"] for r in sel], "x", color="C3", ms=4, label="optima (c swept)")
        ax.set(xlabel="probes per job", ylabel=r"$E[T]$", title=name)
        top = max(r["ET"] for r in sel)
        ax.set_ylim(min(r["ET"] for r in g) * 0.98, top * 1.3)
        ax = axes[1, k]
        sel = sorted(sel, key=lambda r: r["c"])
        ax.plot([r["c"] for r in sel], [r["objective"] for r in sel], "-", color="C3", label="optimised")
        ax.plot([r["c"] for r in sel], [r["grid_objective"] for r in sel], ":", color="k", label="grid optimum")
        ax.set(xscale="log", xlabel="probe cost c", ylabel=r"$E[T] + c\,P$")
    axes[0, 0].legend(fontsize=6)
    axes[1, 0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    rows = _common.read_csv(_common.require_input(out / "choice.csv", "choice_numbers/compute.py", args.quick,
                                                  args.out))
    grid = _common.read_csv(out / "grid.csv")
    _common.plot_style()
    fig = figure(rows, grid)
    _common.save_figure(fig, out, "choice")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
