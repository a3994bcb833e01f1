r"""The exact mean field of the retrial supermarket model against N = 1000 simulation of the same system: E[T] for
lam in {0.5, 0.8}, theta in {0.5, 2}, re-probing retrials with (d1, d2) in {(1,1), (2,1), (2,2), (3,3)} and own
retrials with d1 in {1, 2} (linear policy, mu = 1). A case passes when the mean field lies within 1 % of the
simulated E[T] plus the simulation's 95 % confidence half-width (4 replications, Little's law). Writes
`validation.csv` and `validation.json` to `--out` (the table is printed as it goes).

    python experiments/retrial/validate.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "retrial"
CASES = [(lam, theta, d1, d2, "reprobe") for lam in (0.5, 0.8) for theta in (0.5, 2.0)
         for d1, d2 in ((1, 1), (2, 1), (2, 2), (3, 3))]
CASES += [(lam, theta, d1, 1, "own") for lam in (0.5, 0.8) for theta in (0.5, 2.0) for d1 in (1, 2)]
FULL = dict(cases=CASES, n_servers=1000, time=1000.0, warmup=100.0, slow_time=6000.0, slow_warmup=1000.0, reps=4,
            seed=11, tolerance=0.01)
QUICK = dict(FULL, cases=CASES[:2], n_servers=200, time=200.0, warmup=20.0, slow_time=200.0, slow_warmup=20.0,
             reps=2, tolerance=0.05)


def run_case(lam, theta, d1, d2, retrial, p, key):
    model = jsmkt.RetrialJSQ(lam, theta, d1=d1, d2=d2, retrial=retrial)
    fp = jsmkt.solve_fixed_point(model)
    ET = float(jsmkt.mean_sojourn_time(model, fp))
    s = np.asarray(jsmkt.tails(model, fp))
    top = int(np.flatnonzero(s < 1e-9)[0]) + 6 if np.any(s < 1e-9) else model.K  # orbits N servers reach
    slow = retrial == "own" and d1 == 1  # independent M/M/1 retrial queues relax slowly
    t1, warmup = (p["slow_time"], p["slow_warmup"]) if slow else (p["time"], p["warmup"])
    clock = _common.Clock()
    sim = jsmkt.simulate(model, p["n_servers"], t1, warmup=warmup, key=key, n_replications=p["reps"], max_queue=top)
    gap = abs(sim.mean_sojourn_time - ET)
    return dict(lam=lam, theta=theta, d1=d1, d2=d2, retrial=retrial, K=model.K, max_queue=top, time=t1,
                ET_mean_field=ET, ET_sim=sim.mean_sojourn_time, ET_ci=sim.mean_sojourn_time_ci,
                rel_diff=(sim.mean_sojourn_time - ET) / ET, passed=bool(gap < p["tolerance"] * ET
                                                                        + sim.mean_sojourn_time_ci),
                wall_s=clock.wall())


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    rows = []
    print("| lam | theta | d1 | d2 | retrial | E[T] mean field | E[T] simulated | 95% CI | rel. diff | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, case in enumerate(p["cases"]):
        r = run_case(*case, p, jr.PRNGKey(p["seed"] + i))
        rows.append(r)
        print(f"| {r['lam']} | {r['theta']} | {r['d1']} | {r['d2']} | {r['retrial']} | {r['ET_mean_field']:.5g} | "
              f"{r['ET_sim']:.5g} | ±{r['ET_ci']:.2g} | {100 * r['rel_diff']:+.2f} % | "
              f"{'yes' if r['passed'] else 'NO'} |", flush=True)
        _common.write_csv(out / "validation.csv", rows)
    meta = _common.run_metadata(NAME + "/validate", p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "validation.json", {"metadata": meta, "rows": rows})
    failed = [r for r in rows if not r["passed"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} cases within {100 * p['tolerance']:g} % + CI")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
