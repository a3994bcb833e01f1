r"""E[T] and p99 of the sojourn time with N = 10..1000 servers, five ways: mean field, refined mean field of order 1
and 2, simulation, and the exact law of small systems; the measured orders of the errors.

Four models at loads where the mean field is visibly off at small N (`CASES`): JSQ(2) with exponential service
(`jsmkt.JSQd`, λ = 0.95), JSQ(2) with H2 service of SCV 4 (`jsmkt.JSQdPH`, λ = 0.9), own-orbit retrials
(`jsmkt.RetrialJSQ(..., retrial="own")`, λ = 0.8, θ = 1, d1 = 2) and repairable servers, Model I (A.1 arrivals,
R.1 repair; `jsmkt.RepairableJSQ`, λ = 0.8, α = 0.1, β = 1, d1 = d2 = 2). Per model and N:

- mean field: `jsmkt.mean_sojourn_time` at the fixed point, p99 of `jsmkt.sojourn_time_distribution`;
- order 1 and order 2: E[T] = E[Q]/θ by Little's law, with E[Q] = `jsmkt.mean_queue_length` of
  `rmf.state(N)` (linear in the state, so of order 1 resp. 2) and θ the mean-field throughput (the arrival rate up
  to the truncation's losses, the same for every method); p99 of order 1 from
  `jsmkt.refined_sojourn_time_distribution(rmf, N)`; a p99 of order 2 is not defined (missing);
- simulation: `jsmkt.simulate` (sampling with replacement, as the refined mean field here), calls of
  `reps_per_call` replications pooled (E[T] by one-way ANOVA, `_common.Pool`; p99 from the pooled per-replication
  histograms, 95 % half-width by sectioning) until E[T] and p99 are within their relative targets and, at the
  acceptance points (N = 20, 50, 100 for H2, retrials and Model I), the p99 half-width is below half the gap
  |mean field − simulation|, or the run's budget share is spent;
- exact: the N-server Markov chain of JSQ(2) with exponential service and a buffer of K jobs per server
  (arrivals to a full queue are lost; sparse, SciPy's direct solver) against the mean field and refined mean
  field of the same truncated model (`JSQd(..., K=K)`): λ = 0.5 and 0.7 with K = 3 for N = 5..50, and λ = 0.9
  with K = 4 for N = 5..20 (the sparse LU's fill-in bounds N: K = 5 with N = 20 already takes minutes). Stationary law,
  E[T] = E[Q]/θ as above, and the law of an accepted job's sojourn time (PASTA: a job that joins a queue of k
  jobs stays an Erlang(k + 1) time). The other models have no exact column: their chains (two phases per server,
  an unbounded orbit, failed servers and their repairmen) are far larger at the loads used here.

A method the library cannot compute for a model (a law it refuses, an API it lacks) is recorded as null with
the library's message. Orders: the least-squares slope of log |method − reference| against log N, the reference
being the exact value (exact block) or the simulation (only where |method − simulation| exceeds twice the
simulation's half-width: an unresolved error has no order).

Writes `refined.csv` (one row per model, N and method), `orders.csv`, `exact.csv`, `p99_acceptance.json` /
`p99_acceptance.md`, `refined.json` (all of it with the run's metadata) and `summary.md` to the output folder.

    python experiments/refined/compute.py [--quick] [--out DIR] [--reuse-simulations]

`--reuse-simulations` takes the simulations of an earlier `refined.json` in the output folder that have a p99 (run
with the same parameters: checked) and simulates only the others, e.g. after the library gained a refined law or
percentiles for a model (the exact chains are solved again: they are cheap).
"""

import itertools
import math
import sys
from math import comb
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "refined"
P = 0.99
CASES = {
    "jsq2": ("JSQ(2), exponential, λ = 0.95", lambda K=None: jsmkt.JSQd(0.95, d=2, K=K)),
    "jsq2_h2": ("JSQ(2), H2 (SCV 4), λ = 0.9",
                lambda K=None: jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=K)),
    "retrial_own": ("own-orbit retrials, λ = 0.8, θ = 1, d1 = 2",
                    lambda K=None: jsmkt.RetrialJSQ(0.8, 1.0, d1=2, retrial="own", K=K)),
    "repair_I": ("repairable Model I (A.1, R.1), λ = 0.8, α = 0.1, β = 1",
                 lambda K=None: jsmkt.RepairableJSQ(0.8, 0.1, 1.0, d1=2, d2=2, arrival="A1", repair="R1", K=K)),
}
METHODS = ("mean_field", "order1", "order2", "simulation")
FULL = dict(
    cases=list(CASES),
    ns=[10, 20, 50, 100, 200, 500, 1000],
    sampling="with_replacement",
    acceptance_cases=["jsq2_h2", "retrial_own", "repair_I"],
    acceptance_ns=[20, 50, 100],
    reps_per_call=8,
    jobs_per_rep=2.0e6,  # each replication records about this many jobs after its warm-up
    warmup_taus=10.0,  # warm-up in units of the mean field's relaxation time ...
    min_warmup=100.0,  # ... and at least this long
    target_ET=0.002,  # relative 95 % half-widths
    target_p99=0.005,
    max_calls=12,
    budget_s=900.0,  # wall seconds for all simulations, shared out adaptively (acceptance points count twice)
    exact=[dict(lam=0.5, d=2, K=3, ns=[5, 8, 10, 14, 20, 30, 40, 50]),
           dict(lam=0.7, d=2, K=3, ns=[5, 8, 10, 14, 20, 30, 40, 50]),
           dict(lam=0.9, d=2, K=4, ns=[5, 8, 10, 14, 20])],
    exact_tail=4,  # the slope over the 4 largest N as well
    seed=20260405,
)
QUICK = dict(FULL, cases=["jsq2", "repair_I"], ns=[10, 50], acceptance_cases=["repair_I"], acceptance_ns=[50],
             reps_per_call=4, jobs_per_rep=5.0e4, warmup_taus=3.0, min_warmup=20.0, target_ET=0.05, target_p99=0.1,
             max_calls=1, budget_s=60.0, exact=[dict(lam=0.7, d=2, K=3, ns=[5, 8, 10])], exact_tail=2)


# --- what the library computes ------------------------------------------------------------------------------------


def _missing(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _mean(dist) -> float:
    m = dist.mean
    return float(m() if callable(m) else m)


def mean_field_laws(model, fp, ns, sampling) -> dict:
    """Mean field and refined mean field of `model` at every N of `ns`: E[T] of each order, p99 of the mean field
    and of order 1, and why any of them is missing."""
    theta = float(jsmkt.throughput(model, fp))
    out = {"throughput": theta, "lam": float(model.lam), "K": int(model.K), "missing": {}}
    out["ET_mf"] = float(jsmkt.mean_sojourn_time(model, fp))
    try:
        out["p99_mf"] = float(jsmkt.sojourn_time_distribution(model, fp).quantile(P))
    except ValueError as e:
        out["p99_mf"] = None
        out["missing"]["p99_mean_field"] = _missing(e)
    r1 = jsmkt.refined_mean_field(fp, sampling)
    r2 = jsmkt.refined_mean_field(fp, sampling, order=2)
    out["per_n"] = {}
    for n in ns:
        row = {"ET_order1": float(jsmkt.mean_queue_length(model, r1.state(n))) / theta,
               "ET_order2": float(jsmkt.mean_queue_length(model, r2.state(n))) / theta,
               "p99_order1": None, "ET_order1_law": None}
        if out["p99_mf"] is not None or "p99_order1" not in out["missing"]:
            try:
                law = jsmkt.refined_sojourn_time_distribution(r1, n)
                row["p99_order1"] = float(law.quantile(P))
                row["ET_order1_law"] = _mean(law)
            except (AttributeError, ValueError) as e:  # AttributeError: a jsmkt without refined laws
                out["missing"]["p99_order1"] = _missing(e)
        out["per_n"][n] = row
    out["missing"]["p99_order2"] = "not defined: the refined sojourn-time law is of order 1 in 1/N"
    return out


# --- simulation -----------------------------------------------------------------------------------------------


def _pooled_p99(hists: list, lo: int) -> tuple[float, float]:
    from jsmkt._simulate.statistics import _percentiles

    width = max(h.shape[1] for h in hists)
    rows = np.concatenate([np.pad(h, ((0, 0), (0, width - h.shape[1]))) for h in hists])
    est, ci = _percentiles(rows, (99,), lo, False)
    return est[99], ci[99]


def simulate(model, n: int, p: dict, *, warmup: float, key, budget: float, p99_mf: float | None,
             acceptance: bool) -> dict:
    """Calls of `p["reps_per_call"]` replications of `warmup + length` pooled until E[T] and p99 meet their
    relative targets (and, at an acceptance point, the p99 half-width is below half |mean field - simulation|), or
    `p["max_calls"]` calls or `budget` wall seconds are spent."""
    length = max(p["jobs_per_rep"] / (n * float(model.lam)), 5.0 * warmup)
    pool, hists, lo = _common.Pool(), [], None
    clock = _common.Clock()
    calls, max_queue, stop, per_call = 0, None, None, None
    p99 = hw99 = None
    while True:
        if calls >= 1:
            et, hw_et = float(pool.mean["ET"]), float(pool.half_width("ET"))
            ok = hw_et <= p["target_ET"] * et
            if hists:
                p99, hw99 = _pooled_p99(hists, lo)
                ok = ok and hw99 <= p["target_p99"] * p99
                if acceptance and p99_mf is not None:
                    ok = ok and hw99 < 0.5 * abs(p99_mf - p99)
            if ok:
                stop = "target"
                break
            if calls >= p["max_calls"]:
                stop = "max_calls"
                break
            if clock.wall() + per_call > budget:
                stop = "budget"
                break
        key, sub = jr.split(key)
        t0 = clock.wall()
        try:
            res = jsmkt.simulate(model, n, warmup + length, warmup=warmup, key=sub, n_replications=p["reps_per_call"],
                                 max_queue=max_queue, sampling=p["sampling"], percentiles=(99,))
        except ValueError as e:  # a queue outgrew its ring buffer: this call again with a larger one
            if "max_queue" not in str(e):
                raise
            max_queue = 512 if max_queue is None else 2 * max_queue
            continue
        per_call = clock.wall() - t0 if per_call is None else max(per_call, clock.wall() - t0)
        calls += 1
        pool.add(p["reps_per_call"], {"ET": res.mean_sojourn_time}, {"ET": res.mean_sojourn_time_ci})
        if res.sojourn_time_histograms is not None:
            hists.append(np.asarray(res.sojourn_time_histograms))
            lo = res.histogram_lo if lo is None else lo
            if res.histogram_lo != lo:
                raise RuntimeError("histograms of different ranges: cannot pool them")
    return {"ET": float(pool.mean["ET"]), "ET_ci": float(pool.half_width("ET")), "p99": p99, "p99_ci": hw99,
            "p99_missing": None if hists else "the simulator records no sojourn-time histogram for this model",
            "n_replications": pool.n, "calls": calls, "warmup": warmup, "t1": warmup + length,
            "stop_reason": stop, "wall_s": clock.wall(), "cpu_s": clock.cpu()}


def _warmup(model, fp, p) -> float:
    try:
        tau = _common.relaxation_time(model, fp)
    except Exception:  # noqa: BLE001 -- a state that is not one flat array: the floor alone
        tau = 0.0
    return max(p["warmup_taus"] * tau, p["min_warmup"])


# --- the exact chain of small JSQ(d) systems ---------------------------------------------------------------------


def jsq_chain(n: int, K: int, lam: float, d: int, replace: bool = True):
    """JSQ(d) with `n` exponential servers (rate 1) and room for `K` jobs each, on the counts c_0..c_K of servers
    with k jobs: the states (rows of counts), the generator (CSR, rows = from) and, per state, the probability that
    an arrival joins a server with k jobs, k = 0..K-1 (all d sampled with >= k jobs: (m/n)^d with replacement,
    C(m, d)/C(n, d) without; the rest of the probability is the loss at K)."""
    import scipy.sparse as sp

    states = []
    for bars in itertools.combinations(range(n + K), K):  # stars and bars
        edges = (-1, *bars, n + K)
        states.append(tuple(edges[i + 1] - edges[i] - 1 for i in range(K + 1)))
    index = {s: i for i, s in enumerate(states)}

    def all_at_least(m):
        return (m / n) ** d if replace else comb(m, d) / comb(n, d)

    rows, cols, rates = [], [], []
    join = np.zeros((len(states), K))
    for i, c in enumerate(states):
        S = np.cumsum(c[::-1])[::-1]  # servers with >= k jobs
        for k in range(K):
            pk = all_at_least(S[k]) - all_at_least(S[k + 1])
            join[i, k] = pk
            if pk > 0:
                m = list(c)
                m[k] -= 1
                m[k + 1] += 1
                rows.append(i), cols.append(index[tuple(m)]), rates.append(n * lam * pk)
        for k in range(1, K + 1):
            if c[k]:
                m = list(c)
                m[k] -= 1
                m[k - 1] += 1
                rows.append(i), cols.append(index[tuple(m)]), rates.append(float(c[k]))
    size = len(states)
    G = sp.csr_matrix((rates, (rows, cols)), shape=(size, size))
    return np.array(states, dtype=float), (G - sp.diags(np.asarray(G.sum(axis=1)).ravel())).tocsr(), join


def exact_jsq(n: int, K: int, lam: float, d: int) -> dict:
    """E[Q] per server, the loss probability and the p99 and mean of an accepted job's sojourn time (a mixture of
    Erlang(k + 1) laws, weights by PASTA) from the exact stationary law."""
    import scipy.sparse.linalg as spla
    from scipy.optimize import brentq
    from scipy.special import gammaincc

    C, G, join = jsq_chain(n, K, lam, d)
    Gt = G.T.tocsc()
    pi = np.concatenate([[1.0], spla.spsolve(Gt[1:, 1:], -Gt[1:, 0].toarray().ravel())])
    pi /= pi.sum()
    EQ = float(pi @ (C @ np.arange(K + 1)) / n)
    w = pi @ join
    accept = float(w.sum())
    w = w / accept
    k = np.arange(K)

    def survival(t):
        return float(w @ gammaincc(k + 1, t))  # P(Erlang(k + 1) > t)

    p99 = brentq(lambda t: survival(t) - (1 - P), 0.0, 200.0, xtol=1e-12, rtol=1e-13)
    return {"states": len(C), "EQ": EQ, "loss": 1.0 - accept, "p99": p99, "ET_accepted": float(w @ (k + 1))}


def exact_block(e: dict, sampling: str) -> tuple[list[dict], dict]:
    """Mean field, order 1 and 2 and the exact laws of JSQ(d) with a buffer of `e["K"]`, at every N of `e["ns"]`."""
    model = jsmkt.JSQd(e["lam"], d=e["d"], K=e["K"])
    fp = jsmkt.solve_fixed_point(model, tail_tol=1.0)  # the buffer is part of the model: its losses are meant
    laws = mean_field_laws(model, fp, e["ns"], sampling)
    theta = laws["throughput"]
    rows = []
    for n in e["ns"]:
        clock = _common.Clock()
        ex = exact_jsq(n, e["K"], e["lam"], e["d"])
        got = laws["per_n"][n]
        rows.append({"lam": e["lam"], "K": e["K"], "N": n, "states": ex["states"], "ET_exact": ex["EQ"] / theta,
                     "ET_mf": laws["ET_mf"], "ET_order1": got["ET_order1"], "ET_order2": got["ET_order2"],
                     "p99_exact": ex["p99"], "p99_mf": laws["p99_mf"], "p99_order1": got["p99_order1"],
                     "ET_accepted_exact": ex["ET_accepted"], "loss_exact": ex["loss"], "exact_s": clock.wall()})
        print(f"exact lam={e['lam']} K={e['K']} N={n}: {ex['states']} states, E[T] {rows[-1]['ET_exact']:.6f} "
              f"(MF {laws['ET_mf']:.6f}, o1 {got['ET_order1']:.6f}, o2 {got['ET_order2']:.6f}), p99 {ex['p99']:.4f} "
              f"(MF {_f(laws['p99_mf'])}, o1 {_f(got['p99_order1'])})", flush=True)
    return rows, {k: v for k, v in laws.items() if k != "per_n"}


# --- orders -----------------------------------------------------------------------------------------------------


def slope(ns, errors) -> float | None:
    pts = [(n, abs(e)) for n, e in zip(ns, errors, strict=True) if e is not None and abs(e) > 0]
    if len(pts) < 3:
        return None
    x, y = np.log([q[0] for q in pts]), np.log([q[1] for q in pts])
    return float(np.polyfit(x, y, 1)[0])


def orders(rows: list[dict], cases: list[str]) -> list[dict]:
    """Per model, quantity and method: the fitted slope of log |method - simulation| against log N over the N
    whose error the simulation resolves (|error| > 2 half-widths)."""
    out = []
    for case in cases:
        sims = {r["N"]: r for r in rows if r["case"] == case and r["method"] == "simulation"}
        for q in ("ET", "p99"):
            for method in ("mean_field", "order1", "order2"):
                ns, errs, skipped = [], [], []
                for r in rows:
                    if r["case"] != case or r["method"] != method or r[q] is None:
                        continue
                    s = sims.get(r["N"])
                    if s is None or s[q] is None:
                        continue
                    err, ci = r[q] - s[q], s[f"{q}_ci"]
                    if ci is not None and math.isfinite(ci) and abs(err) > 2 * ci:
                        ns.append(r["N"]), errs.append(err)
                    else:
                        skipped.append(r["N"])
                out.append({"case": case, "quantity": q, "method": method, "reference": "simulation",
                            "slope": slope(ns, errs), "n_points": len(ns), "N_used": ns, "N_unresolved": skipped})
    return out


def exact_orders(rows: list[dict], tail: int) -> list[dict]:
    """Per exact block, quantity and method: the slope of log |method - exact| against log N over every N, and
    over the `tail` largest (the small systems are not yet in the asymptotic regime where the first neglected
    term dominates: the 1/N^2 coefficient of E[T] is about ten times the 1/N one)."""
    out = []
    for (lam, K) in dict.fromkeys((r["lam"], r["K"]) for r in rows):
        block = [r for r in rows if (r["lam"], r["K"]) == (lam, K)]
        for q in ("ET", "p99"):
            for method in ("mf", "order1", "order2"):
                if f"{q}_{method}" not in block[0]:
                    continue
                pts = [(r["N"], r[f"{q}_{method}"] - r[f"{q}_exact"]) for r in block if r[f"{q}_{method}"] is not None]
                ns = [n for n, _ in pts]
                out.append({"case": f"jsq2_exact_lam{lam}_K{K}", "quantity": q,
                            "method": "mean_field" if method == "mf" else method, "reference": "exact",
                            "slope": slope(ns, [e for _, e in pts]), "n_points": len(pts), "N_used": ns,
                            "slope_largest_N": slope(ns[-tail:], [e for _, e in pts][-tail:]),
                            "N_largest": ns[-tail:], "N_unresolved": []})
    return out


# --- tables -----------------------------------------------------------------------------------------------------


def _f(x, digits=4) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def acceptance(rows: list[dict], p: dict) -> list[dict]:
    out = []
    for case in p["acceptance_cases"]:
        for n in p["acceptance_ns"]:
            get = {r["method"]: r for r in rows if r["case"] == case and r["N"] == n}
            if not get:
                continue
            mf, o1, sim = get["mean_field"]["p99"], get["order1"]["p99"], get["simulation"]
            s, hw = sim["p99"], sim["p99_ci"]
            row = {"case": case, "N": n, "p99_mean_field": mf, "p99_refined": o1, "p99_sim": s, "p99_sim_ci": hw,
                   "n_replications": sim["n_replications"]}
            if None in (mf, s, hw):
                row |= {"half_width_below_half_gap": None, "refined_closer": None,
                        "missing": "; ".join(x for x in (get["mean_field"]["missing"], get["order1"]["missing"],
                                                          sim["missing"]) if x)}
            else:
                row["half_width_below_half_gap"] = bool(hw < 0.5 * abs(mf - s))
                row["refined_closer"] = None if o1 is None else bool(abs(o1 - s) < abs(mf - s))
                row["missing"] = get["order1"]["missing"] if o1 is None else None
            out.append(row)
    return out


def acceptance_md(acc: list[dict]) -> str:
    lines = ["| model | N | p99 mean field | p99 refined (order 1) | p99 simulation ± 95 % | half-width < ½ gap | "
             "refined closer |", "|---|---|---|---|---|---|---|"]
    yn = {True: "yes", False: "no", None: "—"}
    for r in acc:
        sim = "—" if r["p99_sim"] is None else f"{r['p99_sim']:.3f} ± {r['p99_sim_ci']:.3f}"
        lines.append(f"| {CASES[r['case']][0]} | {r['N']} | {_f(r['p99_mean_field'], 3)} | "
                     f"{_f(r['p99_refined'], 3)} | {sim} | {yn[r['half_width_below_half_gap']]} | "
                     f"{yn[r['refined_closer']]} |")
    missing = sorted({r["missing"] for r in acc if r.get("missing")})
    if missing:
        lines += ["", "Missing: " + " / ".join(missing)]
    return "\n".join(lines) + "\n"


def _exact_label(case: str) -> str:
    lam, K = case.removeprefix("jsq2_exact_lam").split("_K")
    return f"JSQ(2), exponential, λ = {lam}, buffer K = {K} (exact chain)"


def orders_md(ords: list[dict]) -> str:
    lines = ["| model | quantity | method | reference | slope | points (N) | slope over the largest N |",
             "|---|---|---|---|---|---|---|"]
    for o in ords:
        label = CASES[o["case"]][0] if o["case"] in CASES else _exact_label(o["case"])
        lines.append(f"| {label} | {'E[T]' if o['quantity'] == 'ET' else 'p99'} | {o['method']} | {o['reference']} | "
                     f"{_f(o['slope'], 2)} | {o['n_points']} ({', '.join(map(str, o['N_used']))}) | "
                     + ("" if "slope_largest_N" not in o else
                        f"{_f(o['slope_largest_N'], 2)} ({', '.join(map(str, o['N_largest']))})") + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    jsmkt.use_cpu_cores()  # replications in parallel on every core (before JAX's first computation)
    parser = _common.parser(__doc__.splitlines()[0])
    parser.add_argument("--reuse-simulations", action="store_true",
                        help="reuse the simulations with a p99 of an earlier refined.json in the output folder")
    args = parser.parse_args(argv)
    p = dict(QUICK if args.quick else FULL)
    out = _common.output_dir(NAME, args.out, args.quick)
    stored = {}
    if args.reuse_simulations:
        old = _common.read_json(_common.require_input(out / "refined.json", f"{NAME}/compute.py", args.quick,
                                                      args.out))
        same = {k: v for k, v in _common.jsonable(p).items() if not k.startswith("exact")}
        if same != {k: v for k, v in old["metadata"]["parameters"].items() if not k.startswith("exact")}:
            raise SystemExit(f"{out / 'refined.json'} was run with other parameters: cannot reuse its simulations")
        stored = {k: v for k, v in old["simulations"].items() if v["p99"] is not None}
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["reused_simulations"] = sorted(stored)
    clock = _common.Clock()

    exact_rows, exact_models = [], []
    for e in p["exact"]:
        r, m = exact_block(e, p["sampling"])
        exact_rows += r
        exact_models.append(m)

    rows, laws_all, sims = [], {}, {}
    prepared = []
    for case in p["cases"]:
        model = CASES[case][1]()
        fp = jsmkt.solve_fixed_point(model)
        laws = mean_field_laws(model, fp, p["ns"], p["sampling"])
        laws_all[case] = {k: v for k, v in laws.items() if k != "per_n"} | {"per_n": laws["per_n"]}
        prepared.append((case, model, fp, laws))
        print(f"{case}: K = {laws['K']}, E[T] MF {laws['ET_mf']:.5f}, p99 MF {laws['p99_mf']}; missing: "
              f"{laws['missing']}", flush=True)

    jobs = [(c, n) for c, *_ in prepared for n in p["ns"]]
    weight = {(c, n): 2.0 if (c in p["acceptance_cases"] and n in p["acceptance_ns"]) else 1.0 for c, n in jobs}
    left = p["budget_s"]
    for j, (case, model, fp, laws) in enumerate(prepared):
        warmup = _warmup(model, fp, p)
        for n in p["ns"]:
            share = left * weight[case, n] / sum(weight[k] for k in jobs[jobs.index((case, n)):])
            key = jr.fold_in(jr.fold_in(jr.PRNGKey(p["seed"]), j), n)
            acc = case in p["acceptance_cases"] and n in p["acceptance_ns"]
            if f"{case} N={n}" in stored:
                sim = stored[f"{case} N={n}"] | {"reused": True}
            else:
                sim = simulate(model, n, p, warmup=warmup, key=key, budget=share, p99_mf=laws["p99_mf"],
                               acceptance=acc)
                left -= sim["wall_s"]
            sims[case, n] = sim
            got = laws["per_n"][n]
            miss = laws["missing"]
            rows += [
                {"case": case, "N": n, "method": "mean_field", "ET": laws["ET_mf"], "ET_ci": None,
                 "p99": laws["p99_mf"], "p99_ci": None, "missing": miss.get("p99_mean_field")},
                {"case": case, "N": n, "method": "order1", "ET": got["ET_order1"], "ET_ci": None,
                 "p99": got["p99_order1"], "p99_ci": None, "missing": miss.get("p99_order1")},
                {"case": case, "N": n, "method": "order2", "ET": got["ET_order2"], "ET_ci": None, "p99": None,
                 "p99_ci": None, "missing": miss["p99_order2"]},
                {"case": case, "N": n, "method": "simulation", "ET": sim["ET"], "ET_ci": sim["ET_ci"],
                 "p99": sim["p99"], "p99_ci": sim["p99_ci"], "missing": sim["p99_missing"],
                 "n_replications": sim["n_replications"], "t1": sim["t1"], "warmup": sim["warmup"],
                 "stop_reason": sim["stop_reason"], "wall_s": sim["wall_s"]},
            ]
            print(f"{case} N={n}: E[T] sim {sim['ET']:.4f} ± {sim['ET_ci']:.4f} (MF {laws['ET_mf']:.4f}, "
                  f"o1 {got['ET_order1']:.4f}, o2 {got['ET_order2']:.4f}); p99 sim {_f(sim['p99'])} ± "
                  f"{_f(sim['p99_ci'])} (MF {_f(laws['p99_mf'])}, o1 {_f(got['p99_order1'])}); "
                  f"{sim['n_replications']} reps, {sim['stop_reason']}, {sim['wall_s']:.1f} s", flush=True)

    ords = exact_orders(exact_rows, p["exact_tail"]) + orders(rows, p["cases"])
    acc = acceptance(rows, p)
    meta["runtime"] = clock.runtime()
    _common.write_csv(out / "refined.csv", rows)
    _common.write_csv(out / "exact.csv", exact_rows)
    _common.write_csv(out / "orders.csv", [o | {"N_used": " ".join(map(str, o["N_used"])),
                                                "N_unresolved": " ".join(map(str, o["N_unresolved"]))}
                                           for o in ords])
    _common.write_json(out / "p99_acceptance.json", {"metadata": meta, "rows": acc})
    (out / "p99_acceptance.md").write_text(acceptance_md(acc))
    _common.write_json(out / "refined.json", {
        "metadata": meta, "cases": {c: CASES[c][0] for c in p["cases"]}, "mean_field": laws_all, "rows": rows,
        "simulations": {f"{c} N={n}": s for (c, n), s in sims.items()}, "exact": {"models": exact_models,
                                                                                "rows": exact_rows},
        "orders": ords, "acceptance": acc})
    (out / "summary.md").write_text(summary_md(rows, exact_rows, ords, acc, p))
    print(acceptance_md(acc))
    print(orders_md(ords))
    print(f"wrote {out} in {clock.wall():.0f} s wall, {clock.cpu():.0f} s CPU")
    return 0


def summary_md(rows, exact_rows, ords, acc, p) -> str:
    parts = ["# Refined mean field against simulation and exact laws\n"]
    for case in p["cases"]:
        parts.append(f"## {CASES[case][0]}\n")
        parts.append("| N | E[T] MF | order 1 | order 2 | simulation ± 95 % | p99 MF | p99 order 1 | "
                     "p99 simulation ± 95 % |\n|---|---|---|---|---|---|---|---|")
        for n in p["ns"]:
            g = {r["method"]: r for r in rows if r["case"] == case and r["N"] == n}
            s = g["simulation"]
            p99s = "—" if s["p99"] is None else f"{s['p99']:.3f} ± {s['p99_ci']:.3f}"
            parts.append(f"| {n} | {g['mean_field']['ET']:.4f} | {g['order1']['ET']:.4f} | {g['order2']['ET']:.4f} | "
                         f"{s['ET']:.4f} ± {s['ET_ci']:.4f} | {_f(g['mean_field']['p99'], 3)} | "
                         f"{_f(g['order1']['p99'], 3)} | {p99s} |")
        parts.append("")
    parts.append("## Exact: JSQ(2), exponential, with a buffer of K jobs per server\n")
    parts.append("| λ | K | N | states | E[T] exact | MF | order 1 | order 2 | p99 exact | p99 MF | p99 order 1 |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|")
    for r in exact_rows:
        parts.append(f"| {r['lam']} | {r['K']} | {r['N']} | {r['states']} | {r['ET_exact']:.6f} | {r['ET_mf']:.6f} | "
                     f"{r['ET_order1']:.6f} | {r['ET_order2']:.6f} | {r['p99_exact']:.4f} | {_f(r['p99_mf'])} | "
                     f"{_f(r['p99_order1'])} |")
    parts += ["", "## Orders of the errors (log-log slopes)\n", orders_md(ords),
              "## p99 acceptance (N = 20, 50, 100)\n", acceptance_md(acc)]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
