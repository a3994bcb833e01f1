"""Plot the convergence study: per family (one panel each), the spectrum of the drift's Jacobian at the fixed point
of the largest load tried (exact: dots; as published: crosses), the distance to the fixed point over time from the
empty system beside the line exp(abscissa t), and the fitted rates against -abscissa over every case.

    python experiments/convergence/plot.py [--quick] [--out DIR]

Reads `convergence.json` from `--out` (the folder `compute.py` wrote) and writes `spectra.{pdf,png}`,
`distance.{pdf,png}` and `rates.{pdf,png}` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402


NAME = "convergence"


def _largest_load(rows, curves, family):
    """The rows and curves of the case of `family` with the largest load (both variants)."""
    rs = [(r, c) for r, c in zip(rows, curves, strict=True) if r["family"] == family]
    top = max(r["load"] for r, _ in rs)
    return [(r, c) for r, c in rs if r["load"] == top]


def _panels(n):
    import matplotlib.pyplot as plt

    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def spectra(rows, curves):
    import numpy as np

    families = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = _panels(len(families))
    for ax, fam in zip(axes, families, strict=False):
        for r, c in _largest_load(rows, curves, fam):
            z = np.asarray(c["eigenvalues"])
            pub = r["variant"] == "published"
            ax.scatter(z[:, 0], z[:, 1], s=10 if pub else 6, marker="x" if pub else "o",
                       color="C3" if pub else "C0", label=f"{r['variant']} ({r['spec']})", alpha=0.8)
        ax.axvline(0.0, color="k", lw=0.6)
        ax.set_xscale("symlog", linthresh=1e-2)
        _label(ax, f"{fam}, load {r['load']:.3g}", "Re λ", "Im λ")
    fig.suptitle("Spectrum of the drift's Jacobian at the fixed point (reduced coordinates)")
    fig.tight_layout()
    return fig


def _label(ax, title, xlabel, ylabel):
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=6)


def distance(rows, curves):
    import numpy as np

    families = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = _panels(len(families))
    for ax, fam in zip(axes, families, strict=False):
        for r, c in _largest_load(rows, curves, fam):
            ts, dist = np.asarray(c["ts"]), np.asarray(c["distance"])
            keep = dist > 0
            colour = "C3" if r["variant"] == "published" else "C0"
            ax.semilogy(ts[keep], dist[keep], color=colour, label=f"{r['variant']}: fitted rate {r['fitted_rate']:.4g}")
            a = r["spectral_abscissa"]
            ax.semilogy(ts, dist[keep][0] * np.exp(a * ts), color=colour, ls=":", lw=1,
                        label=f"exp(abscissa t), abscissa {a:.4g}")
        ax.set_ylim(1e-14, 2.0)
        _label(ax, f"{fam}, load {r['load']:.3g}", "t", "max |y(t) − y*|")
    fig.suptitle("Distance to the fixed point from the empty system")
    fig.tight_layout()
    return fig


def rates(rows):
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, fam in enumerate(families):
        for variant, marker in (("exact", "o"), ("published", "x")):
            sel = [r for r in rows if r["family"] == fam and r["variant"] == variant and np.isfinite(r["fitted_rate"])]
            if sel:
                ax.scatter([-r["spectral_abscissa"] for r in sel], [r["fitted_rate"] for r in sel], marker=marker,
                           color=f"C{i}", s=14, label=f"{fam} ({variant})")
    lim = [min(-r["spectral_abscissa"] for r in rows) / 1.5, max(-r["spectral_abscissa"] for r in rows) * 1.5]
    ax.plot(lim, lim, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("−spectral abscissa")
    ax.set_ylabel("fitted exponential rate of the distance")
    ax.legend(fontsize=5)
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    data = _common.read_json(_common.require_input(out / "convergence.json", "compute.py", args.quick, args.out))
    _common.plot_style()
    rows, curves = data["rows"], data["curves"]
    for name, fig in (("spectra", spectra(rows, curves)), ("distance", distance(rows, curves)),
                      ("rates", rates(rows))):
        for ext in ("pdf", "png"):
            fig.savefig(out / f"{name}.{ext}")
    print(f"wrote spectra, distance and rates to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
