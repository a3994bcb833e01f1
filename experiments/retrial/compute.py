r"""The numerical study of the retrial supermarket model (Li, Wang, Lui & Wang, "The Chaos of Propagation in a
Retrial Supermarket Model", arXiv 1105.4341): E[Q] (customers per server, in service and in orbit) and E[T] as
functions of the primary arrival rate lam, the retrial rate theta and the choice numbers d1 (primary arrivals) and
d2 (retrials), from jsmkt's exact mean field (`jsmkt.RetrialJSQ`, re-probing retrials, linear policy, mu = 1), with
N = 1000 simulations of the same system overlaid at a few points.

Each sweep is one batched solve: `jax.vmap` over the swept parameter, at a truncation `K` shared by the sweep
(every point is checked: its fraction of servers at orbit size K is below 1e-10). Writes `retrial.csv` (one row
per mean-field point), `simulation.csv`, `retrial.json` (metadata and every row) and `summary.md` to `--out`.

    python experiments/retrial/compute.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "retrial"
CHOICES = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 3)]
FULL = dict(
    lams=[round(x, 3) for x in np.linspace(0.05, 0.9, 18)],
    thetas=[round(float(x), 4) for x in np.geomspace(0.2, 5.0, 15)],
    choices=CHOICES,
    d_range=[1, 2, 3, 4, 5],
    theta=1.0,  # the lam sweep's and the d sweeps' retrial rate
    lam=0.8,  # the theta sweep's and the d sweeps' arrival rate
    K=120,
    n_servers=1000,
    sim_points=[(0.5, 1.0, 1, 1), (0.8, 1.0, 1, 1), (0.5, 1.0, 2, 2), (0.8, 1.0, 2, 2), (0.8, 0.5, 3, 3),
                (0.8, 1.0, 2, 1), (0.8, 1.0, 1, 2)],
    sim_time=1500.0,
    sim_warmup=150.0,
    sim_reps=4,
    seed=20110522,
)
QUICK = dict(FULL, lams=[0.3, 0.6, 0.8], thetas=[0.5, 2.0], choices=[(2, 2)], d_range=[1, 2], K=40,
             n_servers=200, sim_points=[(0.8, 1.0, 2, 2)], sim_time=200.0, sim_warmup=20.0, sim_reps=2)


def _metrics(model, fp):
    return dict(EQ=jsmkt.mean_queue_length(model, fp), ET=jsmkt.mean_sojourn_time(model, fp),
                orbit=jsmkt.mean_orbit_size(model, fp), blocked=jsmkt.prob_blocked(model, fp),
                success=jsmkt.prob_retrial_success(model, fp))


def sweep(name: str, values, build) -> list[dict]:
    """The mean field at every value of one parameter, one vmapped solve (`build(v)` makes the model)."""
    rows = _common.vmapped_solve(build, _metrics, values, name)
    return [{"sweep": name, "value": float(v), **r} for v, r in zip(values, rows, strict=True)]


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    K = p["K"]
    rows = []
    for d1, d2 in p["choices"]:
        for r in sweep("lam", p["lams"], lambda x, d1=d1, d2=d2: jsmkt.RetrialJSQ(x, p["theta"], d1=d1, d2=d2, K=K)):
            rows.append({**r, "lam": r["value"], "theta": p["theta"], "d1": d1, "d2": d2})
        for r in sweep("theta", p["thetas"], lambda x, d1=d1, d2=d2: jsmkt.RetrialJSQ(p["lam"], x, d1=d1, d2=d2, K=K)):
            rows.append({**r, "lam": p["lam"], "theta": r["value"], "d1": d1, "d2": d2})
    for d1 in p["d_range"]:  # d1 and d2 each over the range, the other at 1 or 2
        for d2 in (1, 2):
            model = jsmkt.RetrialJSQ(p["lam"], p["theta"], d1=d1, d2=d2, K=K)
            fp = jsmkt.solve_fixed_point(model)
            m = {k: float(v) for k, v in _metrics(model, fp).items()} | {"tail_mass": float(fp.tail_mass)}
            rows.append({"sweep": "d1", "value": d1, **m, "lam": p["lam"], "theta": p["theta"], "d1": d1, "d2": d2})
            model = jsmkt.RetrialJSQ(p["lam"], p["theta"], d1=d2, d2=d1, K=K)
            fp = jsmkt.solve_fixed_point(model)
            m = {k: float(v) for k, v in _metrics(model, fp).items()} | {"tail_mass": float(fp.tail_mass)}
            rows.append({"sweep": "d2", "value": d1, **m, "lam": p["lam"], "theta": p["theta"], "d1": d2, "d2": d1})
    sims = []
    key = jr.PRNGKey(p["seed"])
    for lam, theta, d1, d2 in p["sim_points"]:
        model = jsmkt.RetrialJSQ(lam, theta, d1=d1, d2=d2)
        fp = jsmkt.solve_fixed_point(model)
        s = np.asarray(jsmkt.tails(model, fp))
        top = int(np.flatnonzero(s < 1e-9)[0]) + 6  # orbits the N servers reach (the run refuses more)
        key, sub = jr.split(key)
        res = jsmkt.simulate(model, p["n_servers"], p["sim_time"], warmup=p["sim_warmup"], key=sub,
                             n_replications=p["sim_reps"], max_queue=top)
        ET = float(jsmkt.mean_sojourn_time(model, fp))
        sims.append(dict(lam=lam, theta=theta, d1=d1, d2=d2, n_servers=p["n_servers"], ET_mf=ET,
                         EQ_mf=float(jsmkt.mean_queue_length(model, fp)), ET_sim=res.mean_sojourn_time,
                         ET_ci=res.mean_sojourn_time_ci, EQ_sim=res.mean_queue_length, EQ_ci=res.mean_queue_length_ci,
                         rel_diff=(res.mean_sojourn_time - ET) / ET))
    _common.write_csv(out / "retrial.csv", rows)
    _common.write_csv(out / "simulation.csv", sims)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "retrial.json", {"metadata": meta, "rows": rows, "simulation": sims})
    (out / "summary.md").write_text(summary(rows, sims, p))
    print((out / "summary.md").read_text())
    return 0


def summary(rows, sims, p) -> str:
    def at(sweep, **kw):
        return [r for r in rows if r["sweep"] == sweep and all(r[k] == v for k, v in kw.items())]

    lines = [f"# Retrial supermarket model: mean field (mu = 1, linear re-probing retrials, K = {p['K']})", ""]
    lines += [f"## E[T] against the choice numbers (lam = {p['lam']}, theta = {p['theta']})", "",
              "| d | E[T], d1 = d (d2 = 1) | E[T], d2 = d (d1 = 1) | E[T], d1 = d (d2 = 2) | E[T], d2 = d (d1 = 2) |",
              "|---|---|---|---|---|"]
    for d in p["d_range"]:
        a = at("d1", d1=d, d2=1)[0]["ET"]
        b = at("d2", d1=1, d2=d)[0]["ET"]
        c = at("d1", d1=d, d2=2)[0]["ET"]
        e = at("d2", d1=2, d2=d)[0]["ET"]
        lines.append(f"| {d} | {a:.6g} | {b:.6g} | {c:.6g} | {e:.6g} |")
    lines += ["", "P(primary blocked) = g1(rho) and P(retrial succeeds) = 1 - g2(rho) at rho = lam: d1 sets how many "
              "customers enter the orbits, d2 how fast they leave them, E[orbit] = lam g1(rho) / (theta (1 - g2(rho))).",
              "", f"## N = {p['n_servers']} simulation against the mean field", "",
              "| lam | theta | d1 | d2 | E[T] mean field | E[T] simulated | 95% CI | relative difference |",
              "|---|---|---|---|---|---|---|---|"]
    for s in sims:
        lines.append(f"| {s['lam']} | {s['theta']} | {s['d1']} | {s['d2']} | {s['ET_mf']:.5g} | {s['ET_sim']:.5g} | "
                     f"±{s['ET_ci']:.2g} | {100 * s['rel_diff']:+.2f} % |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
