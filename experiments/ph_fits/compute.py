r"""PH fits and the PH paper's question: for JSQ(2) with lognormal (mean 1, SCV 2) and deterministic (mean 1)
service at lam = 0.9, how close are E[T] from the mean field with a fitted PH(m), m = 1..4, and with the three-moment
PH(2) (Telek-Heindl), and the 99th percentile of the sojourn time from simulation with the fitted PH, to the
simulation of N = 1000 servers with the true service law?

**Fits** (`jsmkt.fit_ph`, mean matched exactly in each):

- `exp`: the exponential of the same mean (PH(1));
- `TH PH(2)`: the closed-form three-moment PH(2) (`fit_ph2_three_moments`, moments projected onto the PH(2) range
  where infeasible: for the deterministic law, SCV 0, the Erlang-2);
- `CDF PH(m)`, m = 2, 3, 4: the PH(m) whose CDF is nearest in $\int (F_{PH} - F)^2 dx$;
- `moments PH(m)`, m = 2, 3, 4: least squares on the first three moments (exact where feasible);
- lognormal only, `ML PH(m)`, m in `ml_orders` (2): maximum likelihood on `n_samples` samples (the mean is not
  matched).

Each fit's mean-field E[T] (`jsmkt.JSQdPH`, K grown until the tail mass at K is negligible) is compared with the
simulated E[T] of the true law; the fits marked `simulate` are also simulated (N servers, `reps` replications of
`time` after `warmup`), for their own E[T] and sojourn-time percentiles.

Writes `fits.csv` (one row per target and fit), `ph_fits.json` (metadata, rows, the PH representations) and
`summary.md` to `--out`.

    python experiments/ph_fits/compute.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt._fit import cdf_grid  # noqa: E402


NAME = "ph_fits"
FULL = dict(lam=0.9, d=2, targets={"lognormal": dict(mean=1.0, scv=2.0), "deterministic": dict(mean=1.0)},
            orders=[2, 3, 4], ml_orders=[2], simulate=["exp", "TH PH(2)", "CDF PH(2)", "CDF PH(3)", "CDF PH(4)"],
            n_samples=5000, n_servers=1000, time=1000.0, warmup=200.0, reps=4, seed=20240601)
QUICK = dict(FULL, orders=[2], ml_orders=[], simulate=["exp", "CDF PH(2)"], n_samples=2000, n_servers=200, time=300.0,
             warmup=50.0, reps=2)


def target_law(name, t):
    return jsmkt.lognormal(t["mean"], t["scv"]) if name == "lognormal" else jsmkt.deterministic(t["mean"])


def raw_moments(name, t):
    if name == "deterministic":
        return [t["mean"] ** k for k in (1, 2, 3)]
    s2 = float(np.log1p(t["scv"]))
    return [t["mean"] ** k * float(np.exp(k * (k - 1) * s2 / 2)) for k in (1, 2, 3)]


def fits(name, t, p, key):
    law = target_law(name, t)
    m = raw_moments(name, t)
    out = {"exp": jsmkt.exponential(1.0 / t["mean"]),
           "TH PH(2)": jsmkt.fit_ph2_three_moments(*m, clip=True)[0]}
    for order in p["orders"]:
        out[f"CDF PH({order})"] = jsmkt.fit_ph(law, order=order)
        out[f"moments PH({order})"] = jsmkt.fit_ph(m, order=order, to="moments")
    if name == "lognormal":
        x = np.asarray(jax.vmap(law.sample)(jr.split(key, p["n_samples"])))
        for order in p["ml_orders"]:
            out[f"ML PH({order})"] = jsmkt.fit_ph(x, order=order, to="samples")
    return out


def distance(S, law, mean):
    """$\\int (F_{PH} - F)^2 dx$ on the fits' grid, in units of the mean."""
    x, w = cdf_grid()
    return float(np.sum(w * (np.asarray(S.cdf(jnp.asarray(x * mean))) - law.cdf(x * mean)) ** 2))


def mean_field_ET(S, p):
    model = jsmkt.JSQdPH(p["lam"], S, d=p["d"])
    fp = jsmkt.solve_fixed_point(model, auto_K=True)
    return float(jsmkt.mean_sojourn_time(fp.model, fp)), fp.model.K


def simulate(service, p, key):
    model = jsmkt.JSQdPH(p["lam"], jsmkt.exponential(1.0), d=p["d"])
    sim = jsmkt.simulate(model, p["n_servers"], p["time"], warmup=p["warmup"], key=key, n_replications=p["reps"],
                         service=service)
    pct = sim.sojourn_time_percentiles or {}
    return {"ET_sim": sim.mean_sojourn_time, "ET_ci": sim.mean_sojourn_time_ci, "p50_sim": pct.get(50),
            "p90_sim": pct.get(90), "p99_sim": pct.get(99), "events": sim.events}


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    key = jr.PRNGKey(p["seed"])
    rows, representations = [], {}
    for name, t in p["targets"].items():
        key, kf, ks = jr.split(key, 3)
        law = target_law(name, t)
        truth = simulate(law, p, ks)
        print(f"{name}: simulated E[T] {truth['ET_sim']:.5g} ± {truth['ET_ci']:.2g}, p99 {truth['p99_sim']:.4g} "
              f"({clock.wall():.0f} s)", flush=True)
        rows.append({"target": name, "fit": "true law (simulated)", "order": None, **truth})
        for fit, S in fits(name, t, p, kf).items():
            ET, K = mean_field_ET(S, p)
            row = {"target": name, "fit": fit, "order": S.order, "mean": float(S.mean), "scv": float(S.scv),
                   "m3": float(S.moment(3)), "distance": distance(S, law, t["mean"]), "ET_mean_field": ET, "K": K,
                   "ET_err": ET / truth["ET_sim"] - 1.0}
            if fit in p["simulate"]:
                key, sub = jr.split(key)
                row |= simulate(S, p, sub)
                row["p99_err"] = row["p99_sim"] / truth["p99_sim"] - 1.0
            rows.append(row)
            representations[f"{name}: {fit}"] = {"alpha": np.asarray(S.alpha).tolist(), "T": np.asarray(S.T).tolist()}
            print(f"  {fit:<14} SCV {row['scv']:.4g}  distance {row['distance']:.3g}  mean-field E[T] {ET:.5g} "
                  f"({100 * row['ET_err']:+.2f} %)" + (f"  simulated p99 {row['p99_sim']:.4g} "
                                                       f"({100 * row['p99_err']:+.1f} %)" if "p99_sim" in row else "")
                  + f"  ({clock.wall():.0f} s)", flush=True)
    _common.write_csv(out / "fits.csv", rows)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "ph_fits.json", {"metadata": meta, "rows": rows, "representations": representations})
    (out / "summary.md").write_text(summary(rows, p))
    print((out / "summary.md").read_text())
    return 0


def summary(rows, p) -> str:
    lines = [f"# JSQ({p['d']}) at lam = {p['lam']}: fitted PH(m) against the true service law", "",
             f"Simulation: N = {p['n_servers']}, {p['reps']} replications of t = {p['time']:g} after a warm-up of "
             f"{p['warmup']:g}. Mean-field E[T] error: against the simulated E[T] of the true law.", ""]
    for name in p["targets"]:
        sel = [r for r in rows if r["target"] == name]
        truth = sel[0]
        lines += [f"## {name} (simulated E[T] = {truth['ET_sim']:.4f} ± {truth['ET_ci']:.2g}, p99 = "
                  f"{truth['p99_sim']:.3f})", "",
                  "| fit | SCV | E[S^3] | CDF distance | mean-field E[T] | error | simulated E[T] | simulated p99 | "
                  "p99 error |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sel[1:]:
            sim = (f"{r['ET_sim']:.4f} ± {r['ET_ci']:.2g} | {r['p99_sim']:.3f} | {100 * r['p99_err']:+.1f} %"
                   if r.get("ET_sim") is not None else " | | ")
            lines.append(f"| {r['fit']} | {r['scv']:.4g} | {r['m3']:.4g} | {r['distance']:.3g} | "
                         f"{r['ET_mean_field']:.4f} | {100 * r['ET_err']:+.2f} % | {sim} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
