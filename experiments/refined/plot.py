"""Figures of the refined study: |method − reference| against N on log-log axes, per model, for E[T] and p99.

Reads `refined.json` (written by `compute.py` into the same folder) and writes `refined.pdf` / `refined.png`:
one column per model (and one for the exact JSQ(2) systems with a buffer of 5), E[T] above and p99 below; the
reference is the simulation (its 95 % half-width drawn as a grey band: errors below it are not resolved) or the
exact law.

    python experiments/refined/plot.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import numpy as np  # noqa: E402


NAME = "refined"
STYLE = {"mean_field": ("mean field", "o-"), "order1": ("order 1", "s-"), "order2": ("order 2", "^-")}


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    data = _common.read_json(_common.require_input(out / "refined.json", f"{NAME}/compute.py", args.quick, args.out))
    _common.plot_style()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    def n_axis(ax, ns):
        ax.set_xscale("log")
        ax.set_xticks([n for n in ns if n in (5, 10, 20, 50, 100, 1000)])
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())

    cases = list(data["cases"])
    fig, axes = plt.subplots(2, len(cases) + 1, figsize=(2.6 * (len(cases) + 1), 4.6), squeeze=False)
    for col, case in enumerate(cases):
        rows = [r for r in data["rows"] if r["case"] == case]
        sims = {r["N"]: r for r in rows if r["method"] == "simulation"}
        ns = sorted(sims)
        for row, q in enumerate(("ET", "p99")):
            ax = axes[row, col]
            ci = [sims[n][f"{q}_ci"] for n in ns]
            if all(c is not None for c in ci) and all(sims[n][q] is not None for n in ns):
                ax.fill_between(ns, 1e-12, ci, color="0.85", label="95 % half-width")
            for method, (label, fmt) in STYLE.items():
                pts = [(n, abs(r[q] - sims[n][q])) for r in rows for n in [r["N"]]
                       if r["method"] == method and r[q] is not None and sims[n][q] is not None]
                if pts:
                    ax.loglog(*zip(*pts, strict=True), fmt, ms=3, label=label)
            n_axis(ax, ns)
            ax.set_xlabel("N")
            ax.set_ylabel(f"|{'E[T]' if q == 'ET' else 'p99'} − simulation|")
            if row == 0:
                ax.set_title(data["cases"][case].split(",")[0] + ("" if "," not in data["cases"][case] else
                                                                   "," + data["cases"][case].split(",")[1]))
            lo = [v for line in ax.get_lines() for v in np.asarray(line.get_ydata(), float) if v > 0]
            if lo:
                ax.set_ylim(min(lo) / 3, max(lo) * 3)
            else:
                ax.text(0.5, 0.5, "no simulated value", transform=ax.transAxes, ha="center", va="center")
    ex = data["exact"]["rows"]
    blocks = list(dict.fromkeys((r["lam"], r["K"]) for r in ex))
    dashes = ["-", "--", ":"]
    for row, q in enumerate(("ET", "p99")):
        ax = axes[row, -1]
        for b, (lam, K) in enumerate(blocks):
            for method, (label, fmt) in STYLE.items():
                key = f"{q}_{'mf' if method == 'mean_field' else method}"
                pts = [(r["N"], abs(r[key] - r[f"{q}_exact"])) for r in ex
                       if (r["lam"], r["K"]) == (lam, K) and r.get(key) is not None]
                if pts:
                    color = {"mean_field": "C0", "order1": "C1", "order2": "C2"}[method]
                    ax.loglog(*zip(*pts, strict=True), fmt[0] + dashes[b % 3], color=color, ms=3,
                              label=f"λ = {lam}, K = {K}" if method == "mean_field" else None)
        n_axis(ax, sorted({r["N"] for r in ex}))
        ax.set_xlabel("N")
        ax.set_ylabel(f"|{'E[T]' if q == 'ET' else 'p99'} − exact|")
        if row == 0:
            ax.set_title("JSQ(2) with a buffer (exact chain)")
            ax.legend(loc="lower left", fontsize=6)
    axes[0, 0].legend(loc="lower left")
    fig.tight_layout()
    _common.save_figure(fig, out, "refined")
    return 0


if __name__ == "__main__":
    sys.exit(main())
