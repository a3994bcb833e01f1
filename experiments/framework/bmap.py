"""BMAP arrivals (the framework paper, Section 3): what the N-server system with one global BMAP converges to, how
fast, and how far the paper's forms are from it.

One BMAP (N C, N D_1, N D_2, N D_3) feeds N exponential servers; its phase switches slowly between a calm phase
(single jobs) and a burst phase (batches of 3, an overload while it lasts). For d = 1 and 2 and N = 50, 200, 1000,
5000 it simulates the system and, beside it, the batch-Poisson control (`jsmkt.JSQdBatch` with the same batch
rates lambda_b = gamma D_b e and N), and tabulates:

- the exact limit (`jsmkt.JSQdBMAP`: the batch-Poisson model), its 1/N-refined values with the phase's noise and
  bias (`jsmkt.refined_mean_field`) and the control's, and for d = 1 the exact finite-N value (each server is a
  BMAP/M/1 queue fed by the MAP that the global phase gives it: descriptor (N C + (N - 1) sum D, D_1, D_2, D_3));
- the paper's forms: the fixed point of its equations (14)-(16) (`jsmkt.published.JSQdBMAPAsPublished`) and its
  closed form (35)-(36) (`jsmkt.published.bmap_fixed_point`), E[T] by Little's law;
- a weighted least-squares fit of the simulated gap to the limit, E_N - E_inf = a / N, per d and arrival process.

Writes `bmap.csv` (one row per d, arrivals and N), `bmap_fit.csv` and `bmap.json` (with the run's metadata) to the
output folder. Run from the repository root: `python experiments/framework/bmap.py [--quick] [--out DIR]`.
"""

import sys
from pathlib import Path

import jax
import jax.random as jr
import numpy as np
import scipy.sparse
import scipy.sparse.linalg


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402

import jsmkt  # noqa: E402


jax.config.update("jax_enable_x64", True)

# Calm phase 0: single jobs at 0.6 per server; burst phase 1: batches of 3 at 0.5 per server (1.5 jobs, an
# overload); switching 0 -> 1 at 0.01 and 1 -> 0 at 0.03 per server (gamma = [3/4, 1/4]). Jobs: 0.825 per server.
C = [[-0.61, 0.01], [0.03, -0.53]]
D = [[[0.6, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.5]]]
LOAD = 0.9


def bmap_m1_mean_queue(C, D, mu, levels):
    """E[Q] of one queue fed by the BMAP (C, D) with exponential service mu, and the mass at the top level, from
    the stationary law of its (level, phase) chain cut at `levels` (a sparse linear solve)."""
    C, D = np.asarray(C, float), np.asarray(D, float)
    m, B = C.shape[0], D.shape[0]
    n = (levels + 1) * m
    k = np.arange(levels + 1)
    blocks = [(k, k, C - np.diag(np.diag(C)))]  # silent phase moves (the diagonal is set from the row sums)
    blocks += [(k, np.minimum(k + b, levels), D[b - 1]) for b in range(1, B + 1)]
    blocks += [(k[1:], k[1:] - 1, mu * np.eye(m))]
    rows, cols, vals = [], [], []
    for src, dst, M in blocks:
        i, j = np.nonzero(M)
        rows.append((src[:, None] * m + i[None]).ravel())
        cols.append((dst[:, None] * m + j[None]).ravel())
        vals.append(np.broadcast_to(M[i, j], (src.size, i.size)).ravel())
    Q = scipy.sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), (n, n)).tocsr()
    Q = Q - scipy.sparse.diags(np.asarray(Q.sum(axis=1)).ravel())
    A = scipy.sparse.vstack([Q.T.tocsr()[:-1], scipy.sparse.csr_matrix(np.ones((1, n)))]).tocsc()
    pi = scipy.sparse.linalg.spsolve(A, np.concatenate([np.zeros(n - 1), [1.0]]))
    return float(np.repeat(k, m) @ pi), float(pi.reshape(-1, m)[-1].sum())


def finite_n_d1(n, mu):
    """Exact E[Q] of the N-server system with d = 1: a server sees the batches sent to it (D_b) and the phase's
    other moves (N C, and the batches sent elsewhere, (N - 1) D_b)."""
    C_, D_ = np.asarray(C), np.asarray(D)
    levels = 500
    while True:
        EQ, top = bmap_m1_mean_queue(n * C_ + (n - 1) * D_.sum(axis=0), D_, mu, levels)
        if top < 1e-15 or levels >= 64000:
            return EQ
        levels *= 2


def fit_rate(rows):
    """Weighted least squares of gap = a / N (gap = E[T]_N - E[T]_inf, weights 1/se^2): a, its standard error and
    the chi-square per degree of freedom of the fit."""
    n = np.array([r["n_servers"] for r in rows], float)
    g = np.array([r["ET_sim"] - r["ET_limit"] for r in rows])
    se = np.array([r["ET_sim_ci"] / _common.t975(r["replications"] - 1) for r in rows])
    x, w = 1.0 / n, 1.0 / se**2
    a = float(np.sum(w * x * g) / np.sum(w * x * x))
    a_se = float(1.0 / np.sqrt(np.sum(w * x * x)))
    chi2 = float(np.sum(w * (g - a * x) ** 2) / max(len(rows) - 1, 1))
    return a, a_se, chi2


def main(argv=None):
    p = _common.parser(__doc__)
    args = p.parse_args(argv)
    out = _common.output_dir("framework", args.out, args.quick)
    ns = (50, 200) if args.quick else (50, 200, 1000, 5000)
    ds = (2,) if args.quick else (1, 2)
    # simulated server-time per run after the warm-up (N (t1 - warmup) over the replications), the warm-up per
    # replication (about ten relaxation times: d = 1 servers are M^X/M/1-like queues at load 0.9) and the largest
    # queue the simulator keeps
    work = {1: 4e7, 2: 2e7} if not args.quick else {2: 2e4}
    warmups = {1: 3000.0, 2: 300.0} if not args.quick else {2: 50.0}
    max_queue = {1: 600, 2: 100}
    reps = 2 if args.quick else 8
    A = jsmkt.BMAP(C, D)
    mu = float(A.rate) / LOAD
    clock = _common.Clock()
    rows, fits, forms = [], [], {}
    for d in ds:
        bmap = jsmkt.JSQdBMAP(A, d=d, mu=mu)
        poisson = bmap.limit()
        fp = jsmkt.solve_fixed_point(bmap)
        ET_lim, EQ_lim = float(jsmkt.mean_sojourn_time(bmap, fp)), float(jsmkt.mean_queue_length(bmap, fp))
        refined = {"bmap": jsmkt.refined_mean_field(fp),
                   "poisson": jsmkt.refined_mean_field(jsmkt.solve_fixed_point(poisson))}
        fp_pub = jsmkt.solve_fixed_point(jsmkt.published.JSQdBMAPAsPublished(A, d=d, mu=mu, K=bmap.K), auto_K=True)
        EQ_pub = float(jsmkt.mean_queue_length(fp_pub.model, fp_pub))
        EQ_closed = float(np.asarray(jsmkt.published.bmap_fixed_point(A, d, mu, fp_pub.model.K))[1:].sum())
        forms[d] = {"ET_limit": ET_lim, "EQ_limit": EQ_lim, "ET_published_equations": EQ_pub / float(A.rate),
                    "EQ_published_equations": EQ_pub, "ET_closed_form": EQ_closed / float(A.rate),
                    "EQ_closed_form": EQ_closed, "K": bmap.K, "K_published": fp_pub.model.K}
        print(f"d = {d}: limit E[T] = {ET_lim:.5f}; published equations {EQ_pub / float(A.rate):.5f}, closed form "
              f"{EQ_closed / float(A.rate):.5f}", flush=True)
        for arrivals, model in (("bmap", bmap), ("poisson", poisson)):
            for i, n in enumerate(ns):
                t1 = warmups[d] + work[d] / (n * reps)
                run = _common.Clock()
                sim = jsmkt.simulate(model, n, t1, warmup=warmups[d], n_replications=reps, max_queue=max_queue[d],
                                     key=jr.PRNGKey(1000 * d + 100 * i + (arrivals == "poisson")))
                wall = run.wall()
                EQ_ref = float(jsmkt.mean_queue_length(model, refined[arrivals].state(n)))
                row = {"d": d, "arrivals": arrivals, "n_servers": n, "t1": t1, "warmup": warmups[d],
                       "replications": reps, "ET_sim": sim.mean_sojourn_time, "ET_sim_ci": sim.mean_sojourn_time_ci,
                       "EQ_sim": sim.mean_queue_length, "EQ_sim_ci": sim.mean_queue_length_ci,
                       "throughput_sim": sim.throughput, "ET_limit": ET_lim, "EQ_limit": EQ_lim,
                       "gap_ET": sim.mean_sojourn_time / ET_lim - 1.0,
                       "ET_refined": EQ_ref / float(A.rate), "EQ_refined": EQ_ref,
                       "EQ_exact_finite_n": finite_n_d1(n, mu) if d == 1 and arrivals == "bmap" else None,
                       "ET_published_equations": forms[d]["ET_published_equations"],
                       "ET_closed_form": forms[d]["ET_closed_form"], "events": sim.events,
                       "real_events": sim.real_events, "wall_s": wall}
                rows.append(row)
                print(f"  {arrivals:8s} N = {n:5d}: E[T] {sim.mean_sojourn_time:.5f} ± {sim.mean_sojourn_time_ci:.5f}"
                      f" (gap {100 * row['gap_ET']:+.3f} %), refined {row['ET_refined']:.5f}"
                      + (f", exact {row['EQ_exact_finite_n'] / float(A.rate):.5f}"
                         if row["EQ_exact_finite_n"] is not None else ""), flush=True)
            mine = [r for r in rows if r["d"] == d and r["arrivals"] == arrivals]
            a, a_se, chi2 = fit_rate(mine)
            ref_a = (mine[0]["ET_refined"] - ET_lim) * mine[0]["n_servers"]  # the refined 1/N coefficient of E[T]
            fits.append({"d": d, "arrivals": arrivals, "a": a, "a_se": a_se, "chi2_per_dof": chi2,
                         "a_refined": ref_a})
            print(f"  {arrivals}: E[T]_N - E[T]_inf = a / N, a = {a:.4f} ± {a_se:.4f} (chi2/dof {chi2:.2f}); "
                  f"refined mean field a = {ref_a:.4f}", flush=True)
    meta = _common.run_metadata("framework-bmap", {"C": C, "D": D, "mu": mu, "load": LOAD, "n_servers": list(ns),
                                                   "d": list(ds), "work": work, "warmups": warmups,
                                                   "max_queue": max_queue, "replications": reps},
                                quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "bmap.json", {"meta": meta, "forms": forms, "fits": fits, "rows": rows,
                                           "batch_rates": np.asarray(A.batch_rates).tolist(),
                                           "gamma": np.asarray(A.gamma).tolist()})
    _common.write_csv(out / "bmap.csv", rows)
    _common.write_csv(out / "bmap_fit.csv", fits)
    return 0


if __name__ == "__main__":
    main()
