"""Plot the verification study: relative error of E[T] against N = 1000 simulation, per service, one column per d.

Top row: the three mean-field methods (exact, published closed form, published ODE). Bottom row: the exact mean
field alone, with the simulation's 95 % confidence band (relative half-width) around zero.

    python experiments/verification/plot.py [--quick] [--out DIR]

Reads `verification.csv` from `--out` (the folder `compute.py` wrote) and writes `verification.pdf` and
`verification.png` there; if `finite_n.csv` (from `finite_n.py`) is there too, also `finite_n.pdf` and
`finite_n.png` (N x the simulation-minus-mean-field gaps against N, with the refined mean field's predicted 1/N
coefficients from `refined_finite_n.csv` where `refined.py` has written it).
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402


NAME = "verification"
SERVICE_STYLE = {
    # name: (label, colour)
    "exponential": ("exponential", "C0"),
    "erlang2": ("Erlang-2", "C1"),
    "hyperexp2": ("H2 (SCV 4)", "C2"),
    "coxian2": ("Coxian-2 (SCV 2)", "C3"),
}
METHOD_STYLE = {
    # name: (label, marker, linestyle)
    "exact": ("exact mean field", "o", "-"),
    "published_closed_form": ("published closed form", "s", "--"),
    "published_ode": ("published ODE", "^", ":"),
}


def figure(rows):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ds = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(2, len(ds), figsize=(3.4 * len(ds), 5.2), sharex=True, squeeze=False)
    sims = {(r["d"], r["lam"], r["service"]): r for r in rows if r["method"] == "simulation"}
    for j, d in enumerate(ds):
        top, bottom = axes[0, j], axes[1, j]
        for service, (_, colour) in SERVICE_STYLE.items():
            for method, (_, marker, ls) in METHOD_STYLE.items():
                sel = sorted(
                    (r for r in rows if r["d"] == d and r["service"] == service and r["method"] == method),
                    key=lambda r: r["lam"],
                )
                if not sel:
                    continue
                lams = [r["lam"] for r in sel]
                err = [100 * r["relerr_ET"] for r in sel]
                top.plot(lams, err, color=colour, marker=marker, ls=ls, ms=4, lw=1)
                if method == "exact":
                    ci = [100 * sims[(d, r["lam"], service)]["ET_ci_rel"] for r in sel]
                    bottom.errorbar(lams, err, yerr=ci, color=colour, marker=marker, ls=ls, ms=4, lw=1,
                                    capsize=2)
        top.axhline(0.0, color="k", lw=0.6)
        bottom.axhline(0.0, color="k", lw=0.6)
        for y in (-1.0, 1.0):
            bottom.axhline(y, color="0.5", lw=0.6, ls="--")
        top.set_title(f"d = {d}, N = 1000")
        bottom.set_xlabel("λ")
    axes[0, 0].set_ylabel("rel. error of E[T] vs simulation (%)")
    axes[1, 0].set_ylabel("exact mean field: rel. error (%)\n(bars: simulation 95 % CI)")
    handles = [Line2D([], [], color=c, lw=2, label=lab) for lab, c in SERVICE_STYLE.values()]
    handles += [
        Line2D([], [], color="k", marker=m, ls=ls, lw=1, ms=4, label=lab) for lab, m, ls in METHOD_STYLE.values()
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False, bbox_to_anchor=(0.5, -0.06))
    fig.tight_layout()
    return fig


def figure_finite_n(rows, predicted=None):
    """N x (simulation - mean field) against N: flat lines mean the gaps are O(1/N) finite-size effects. With
    `predicted` (rows of `refined_finite_n.csv`), the refined mean field's 1/N coefficients as dashed lines."""
    import matplotlib.pyplot as plt

    cases = sorted({(r["d"], r["lam"], r["service"]) for r in rows})
    fig, axes = plt.subplots(1, len(cases), figsize=(3.4 * len(cases), 2.9), squeeze=False)
    series = [("N_relgap_ET", "E[T] (relative)", "k")] + [(f"N_gap_s{k}", f"s_{k}", f"C{k}") for k in (2, 3, 4)]
    for ax, (d, lam, service) in zip(axes[0], cases):
        sel = sorted((r for r in rows if (r["d"], r["lam"], r["service"]) == (d, lam, service)), key=lambda r: r["N"])
        ns = [r["N"] for r in sel]
        for i, (col, label, colour) in enumerate(series):
            x = [n * (1 + 0.04 * (i - 1.5)) for n in ns]  # small horizontal offsets to separate error bars
            ax.errorbar(x, [r[col] for r in sel], yerr=[r[f"{col}_ci"] for r in sel], color=colour, marker="o",
                        ms=3, lw=1, capsize=2, label=label)
            if predicted:
                ref = next(r for r in predicted if (r["d"], r["lam"], r["service"]) == (d, lam, service))
                key = "N_relgap_ET_predicted" if col == "N_relgap_ET" else f"V{col[-1]}"
                ax.axhline(ref[key], color=colour, lw=0.9, ls="--")
        ax.axhline(0.0, color="0.5", lw=0.6)
        ax.set_xscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("N")
        ax.set_title(f"d = {d}, λ = {lam}, {SERVICE_STYLE[service][0]}")
    axes[0, 0].set_ylabel("N × (simulation − exact mean field)")
    if predicted:
        axes[0, -1].plot([], [], color="0.3", lw=0.9, ls="--", label="refined mean field: predicted")
        axes[0, -1].legend(loc="best")
    axes[0, 0].legend(loc="best")
    fig.tight_layout()
    return fig


def main(argv=None) -> list[Path]:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    _common.plot_style()
    rows = _common.read_csv(_common.require_input(out / "verification.csv", f"{NAME}/compute.py", args.quick, args.out))
    figures = {"verification": figure(rows)}
    if (out / "finite_n.csv").exists():
        ref = out / "refined_finite_n.csv"
        figures["finite_n"] = figure_finite_n(_common.read_csv(out / "finite_n.csv"),
                                              _common.read_csv(ref) if ref.exists() else None)
    paths = []
    for name, fig in figures.items():
        for ext in ("pdf", "png"):
            fig.savefig(out / f"{name}.{ext}")
            paths.append(out / f"{name}.{ext}")
    print("wrote", *paths)
    return paths


if __name__ == "__main__":
    main()
