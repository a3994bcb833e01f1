"""Several arrival classes and helpers (the framework paper, Section 5, with output choice numbers): the exact mean
field against simulation of N = 1000 servers at load 0.9, and the paper's closed form where it applies.

Writes `classes.json` and `classes.csv` (one row per case) to the output folder. Run from the repository root:
`python experiments/framework/compute.py [--quick] [--out DIR]`.
"""

import sys
from pathlib import Path

import jax
import jax.random as jr
import numpy as np


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402

import jsmkt  # noqa: E402


jax.config.update("jax_enable_x64", True)


def cases():
    """Name -> model, each at load 0.9."""
    h2 = jsmkt.hyperexponential2(1.0, 2.0)
    return {
        "exp, d = (1, 3)": jsmkt.JSQdClasses([0.3, 0.6], d=[1, 3]),
        "H2 (SCV 2), d = (2, 2), class 2 in pairs": jsmkt.JSQdClasses([0.5, 0.2], d=[2, 2],
                                                                     batch_sizes=[None, [0.0, 1.0]], service=h2),
        "exp, d = (2, 3), helpers nu = 0.2, f = 2": jsmkt.JSQdClasses([0.6, 0.48], d=[2, 3], helper_rates=[0.2],
                                                                      f=[2]),
        "H2 (SCV 2), d = 2, helpers nu = 0.1, f = 2": jsmkt.JSQdClasses([0.99], d=2, service=h2,
                                                                        helper_rates=[0.1], f=[2]),
    }


def closed_form(model) -> float | None:
    """E[Q] from the paper's pi_k = sum_j (lam_j / mu) pi_{k-1}^{d_j} (exponential single jobs, no helpers)."""
    if model.m != 1 or model.helper_choices or any(p.shape[0] > 1 for p in model.batch_sizes):
        return None
    mu = 1.0 / float(model.service.mean)
    lam = np.asarray(model.lam)
    d = [int(c.number) for c in model.choices]
    pi, total = 1.0, 0.0
    for _ in range(10_000):
        pi = float(sum(lj / mu * pi**dj for lj, dj in zip(lam, d, strict=True)))
        total += pi
        if pi < 1e-300:
            break
    return total


def main():
    args = _common.parser(__doc__).parse_args()
    out = _common.output_dir("framework", args.out, args.quick)
    n, t1, warmup, reps = (200, 300.0, 50.0, 2) if args.quick else (1000, 4000.0, 400.0, 8)
    rows = []
    for i, (name, model) in enumerate(cases().items()):
        fp = jsmkt.solve_fixed_point(model)
        ET = float(jsmkt.mean_sojourn_time(model, fp))
        EQ = float(jsmkt.mean_queue_length(model, fp))
        cf = closed_form(model)
        sim = jsmkt.simulate(model, n, t1, warmup=warmup, key=jr.PRNGKey(100 + i), n_replications=reps)
        gap = (sim.mean_sojourn_time - ET) / ET
        rows.append({"case": name, "load": float(model.load()), "K": model.K, "ET_mean_field": ET,
                     "EQ_mean_field": EQ, "EQ_closed_form": cf, "ET_sim": sim.mean_sojourn_time,
                     "ET_sim_ci": sim.mean_sojourn_time_ci, "gap": gap,
                     "within_1pct": bool(abs(gap) * ET < 0.01 * ET + sim.mean_sojourn_time_ci),
                     "n_servers": n, "t1": t1, "replications": reps})
        print(f"{name:45s} load {float(model.load()):.3f}  E[T] mean field {ET:.5f}  sim {sim.mean_sojourn_time:.5f}"
              f" ± {sim.mean_sojourn_time_ci:.5f}  gap {100 * gap:+.2f} %", flush=True)
    meta = _common.run_metadata("framework", {"n_servers": n, "t1": t1, "warmup": warmup, "replications": reps},
                                quick=args.quick)
    _common.write_json(out / "classes.json", {"meta": meta, "rows": rows})
    _common.write_csv(out / "classes.csv", rows)


if __name__ == "__main__":
    main()
