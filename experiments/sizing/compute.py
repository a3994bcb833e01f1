"""Sizing a JSQ(d) farm by tail latency: the largest arrival rate per server whose mean-field p99 of the sojourn
time meets a bound, for d = 1, 2, 3, 5, by Newton's method (Optimistix) on the differentiable quantile
(`jsmkt.sojourn_time_distribution(...).quantile(0.99)`, differentiated through the fixed point), then checked
against simulation of N = 1000 servers at the answers.

Writes `sizing.json` and `sizing.csv` (one row per service law and d) to the output folder. Run from the repository
root: `python experiments/sizing/compute.py [--quick] [--out DIR]`.
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optimistix as optx


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402

import jsmkt  # noqa: E402


jax.config.update("jax_enable_x64", True)

P = 0.99  # the percentile sized for (p99)


def services():
    """Name -> (service law of mean 1, p99 bound in units of the mean service time). H2 of SCV 4 alone has a p99
    of 10.8, so its bound is 20; exponential service gets 10."""
    return {"H2 (SCV 4)": (jsmkt.hyperexponential2(1.0, 4.0), 20.0), "exponential": (jsmkt.exponential(1.0), 10.0)}


def largest_rate(service, d: int, bound: float, lam_cap: float):
    """The arrival rate per server at which the mean-field p99 equals `bound`: Newton's method on
    u = logit(lambda) (lambda stays in (0, 1)), with the derivative of the quantile, at a fixed truncation K chosen
    for `lam_cap` (a load where the p99 exceeds the bound). Returns lambda, the number of Newton steps and the
    derivative dp99/dlambda at the answer."""
    K = jsmkt.JSQdPH(lam_cap, service, d=d).K

    def p99(lam):
        model = jsmkt.JSQdPH(lam, service, d=d, K=K)
        return jsmkt.sojourn_time_distribution(model, jsmkt.solve_fixed_point(model)).quantile(P)

    def excess(u, _):
        return p99(jax.nn.sigmoid(u)) - bound

    sol = optx.root_find(excess, optx.Newton(rtol=1e-11, atol=1e-9), jnp.asarray(0.0), max_steps=64)
    lam = float(jax.nn.sigmoid(sol.value))
    if not lam < lam_cap:
        raise RuntimeError(f"d={d}: the answer {lam} is not below lam_cap={lam_cap}; raise lam_cap")
    return lam, int(sol.stats["num_steps"]), float(jax.grad(p99)(lam)), K


def main(argv=None):
    args = _common.parser(__doc__).parse_args(argv)
    out = _common.output_dir("sizing", args.out, args.quick)
    ds = (1, 2) if args.quick else (1, 2, 3, 5)
    n, t1, warmup, reps = (200, 300.0, 50.0, 2) if args.quick else (1000, 1500.0, 150.0, 8)
    laws = dict(list(services().items())[-1:]) if args.quick else services()
    clock = _common.Clock()
    rows = []
    for name, (service, bound) in laws.items():
        for d in ds:
            t0 = time.perf_counter()
            lam, steps, slope, K = largest_rate(service, d, bound, 0.8 if d == 1 else 0.999)
            t_root = time.perf_counter() - t0
            model = jsmkt.JSQdPH(lam, service, d=d)
            fp = jsmkt.solve_fixed_point(model)
            T = jsmkt.sojourn_time_distribution(model, fp)
            p99 = float(T.quantile(P))
            sim = jsmkt.simulate(model, n, t1, warmup=warmup, key=jr.PRNGKey(7 * d), n_replications=reps,
                                 percentiles=(50, 99))
            s99, ci = sim.sojourn_time_percentiles[99], sim.sojourn_time_percentiles_ci[99]
            row = {"service": name, "d": d, "bound_p99": bound, "lam_max": lam, "newton_steps": steps,
                   "root_finding_s": t_root, "K": K, "p99_mean_field": p99, "dp99_dlam": slope,
                   "mean_sojourn_time": float(T.mean), "p50_mean_field": float(T.quantile(0.5)),
                   "p99_sim": s99, "p99_sim_ci": ci, "p50_sim": sim.sojourn_time_percentiles[50],
                   "bound_within_sim_ci": bool(abs(s99 - bound) <= ci), "n_servers": n, "t1": t1,
                   "replications": reps}
            if name == "exponential" and d == 1:  # M/M/1: P(T > t) = exp(-(1 - lam) t)
                row["lam_max_closed_form"] = 1.0 + np.log(1.0 - P) / bound
            rows.append(row)
            print(f"{name:12s} d = {d}: lam_max {lam:.6f} ({steps} Newton steps, {t_root:.1f} s)  p99 mean field "
                  f"{p99:.4f}  simulation {s99:.4f} ± {ci:.4f}  dp99/dlam {slope:.3g}", flush=True)
    meta = _common.run_metadata("sizing", {"percentile": P, "bounds": {k: v[1] for k, v in laws.items()},
                                           "d": list(ds), "n_servers": n, "t1": t1, "warmup": warmup,
                                           "replications": reps}, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "sizing.json", {"metadata": meta, "rows": rows})
    _common.write_csv(out / "sizing.csv", rows)


if __name__ == "__main__":
    main()
