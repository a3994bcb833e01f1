"""Plot the repair-allocation study: E[T] and the availability over (j, d2) in the saturated regime, with the
optimised allocations for each probing cost.

    python experiments/repair_allocation/plot.py [--quick] [--out DIR]

Reads `repair_allocation.csv` and `grid.csv` from `--out` (the folder `compute.py` wrote) and writes
`repair_allocation.pdf` and `repair_allocation.png` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import numpy as np  # noqa: E402


NAME = "repair_allocation"
KEYS = ("lam", "alpha", "beta", "d1", "arrival")


def figure(rows, grid):
    import matplotlib.pyplot as plt

    bases = list(dict.fromkeys(tuple(r[k] for k in KEYS) for r in rows))
    fig, axes = plt.subplots(len(bases), 2, figsize=(7.0, 3.0 * len(bases)), squeeze=False)
    for b, base in enumerate(bases):
        g = [r for r in grid if tuple(r[k] for k in KEYS) == base]
        js, ds = sorted({r["j"] for r in g}), sorted({r["d2"] for r in g})
        for col, (metric, key, label) in enumerate((("mean_sojourn_time", "ET", r"$E[T]$"),
                                                    ("availability", "availability", "availability"))):
            Z = np.full((len(ds), len(js)), np.nan)
            for r in g:
                Z[ds.index(r["d2"]), js.index(r["j"])] = r[key]
            ax = axes[b, col]
            cs = ax.contourf(js, ds, Z, levels=20, cmap="viridis")
            fig.colorbar(cs, ax=ax, label=label)
            for r in rows:
                if tuple(r[k] for k in KEYS) == base and r["metric"] == metric:
                    ax.plot(r["j"], r["d2"], "x", color="w", ms=5)
                    ax.annotate(f"c={r['c']:g}", (r["j"], r["d2"]), color="w", fontsize=6, xytext=(3, 3),
                                textcoords="offset points")
            ax.set(xlabel=r"$j$ (small repairmen)", ylabel=r"$d_2$ (large repairman)",
                   title=f"lam={base[0]}, alpha={base[1]}, beta={base[2]}, {base[4]}")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    rows = _common.read_csv(_common.require_input(out / "repair_allocation.csv", "repair_allocation/compute.py",
                                                  args.quick, args.out))
    grid = _common.read_csv(out / "grid.csv")
    _common.plot_style()
    fig = figure(rows, grid)
    _common.save_figure(fig, out, "repair_allocation")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
