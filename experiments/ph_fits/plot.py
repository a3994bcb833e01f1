"""Plot the PH-fit study: the CDF of each target law beside its fitted PH distributions, and the mean-field E[T]
of JSQ(2) with each fit against the simulated E[T] of the true law.

    python experiments/ph_fits/plot.py [--quick] [--out DIR]

Reads `ph_fits.json` from `--out` (the folder `compute.py` wrote) and writes `ph_fits.pdf` and `ph_fits.png` there.
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import numpy as np  # noqa: E402


NAME = "ph_fits"


def figure(data):
    import jax.numpy as jnp
    import matplotlib.pyplot as plt

    import jsmkt

    rows, reps, p = data["rows"], data["representations"], data["metadata"]["parameters"]
    targets = list(p["targets"])
    fig, axes = plt.subplots(2, len(targets), figsize=(3.4 * len(targets), 5.8), squeeze=False)
    x = np.linspace(0.0, 4.0, 401)
    for k, name in enumerate(targets):
        t = p["targets"][name]
        law = jsmkt.lognormal(t["mean"], t["scv"]) if name == "lognormal" else jsmkt.deterministic(t["mean"])
        ax = axes[0, k]
        ax.plot(x, law.cdf(x), color="k", lw=2, label=name)
        for i, fit in enumerate(f for f in (r["fit"] for r in rows if r["target"] == name) if not f.startswith("true")):
            if fit.startswith("ML") or fit.startswith("moments"):
                continue
            S = jsmkt.PH(jnp.asarray(reps[f"{name}: {fit}"]["alpha"]), jnp.asarray(reps[f"{name}: {fit}"]["T"]))
            ax.plot(x, S.cdf(jnp.asarray(x)), lw=1, color=f"C{i}", label=fit)
        ax.set(xlabel="service time", ylabel="CDF", title=name)
        ax.legend(fontsize=6)
        ax = axes[1, k]
        sel = [r for r in rows if r["target"] == name]
        truth = sel[0]
        fits = [r for r in sel[1:]]
        ax.barh([r["fit"] for r in fits][::-1], [100 * r["ET_err"] for r in fits][::-1], color="0.4")
        ax.axvline(0.0, color="k", lw=0.8)
        ax.set(xlabel=f"mean-field E[T] error, % (true law simulated: {truth['ET_sim']:.3f})")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    data = _common.read_json(_common.require_input(out / "ph_fits.json", "ph_fits/compute.py", args.quick, args.out))
    _common.plot_style()
    fig = figure(data)
    _common.save_figure(fig, out, "ph_fits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
