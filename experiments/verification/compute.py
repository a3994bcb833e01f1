r"""Verification: exact mean field vs Li & Lui's published forms vs N = 1000 simulation, JSQ(d) with PH service.

For d in {2, 3}, lam in {0.5, 0.8, 0.9, 0.95} and four service laws of mean 1 (exponential, Erlang-2,
hyperexponential H2 with SCV 4, Coxian-2 with SCV 2), computes s_1..s_4 and E[T]

- `simulation`: `jsmkt.simulate` with N = 1000 servers, replications added until the 95 % half-width of E[T] is
  at most `target` (0.5 %) of E[T] or the case's CPU budget is spent (the achieved half-width is recorded);
- `exact`: `jsmkt.JSQdPH` + `jsmkt.solve_fixed_point`;
- `published_closed_form`: `jsmkt.published.ph_fixed_point` / `ph_sojourn_time` (Theorem 1, Section 3);
- `published_ode`: the fixed point of `jsmkt.published.JSQdPHAsPublished` (equations (1)-(3));

and the relative error of each mean-field value against simulation. Writes `verification.csv` (one row per case
and method), `verification.json` (run metadata, per-case details including every simulation call, summary) and
`summary.md` (the headline numbers) to `--out`.

Warm-up and run length come from the relaxation time tau = 1/gap of the exact mean field (gap: the spectral gap
of its Jacobian at the fixed point): warm-up 10 tau, then 4 x warm-up of statistics per replication.

    python experiments/verification/compute.py [--quick] [--out DIR] [--budget-cpu SECONDS]
"""

import math
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "verification"
SERVICES = {
    # name: (constructor, label, SCV)
    "exponential": (lambda: jsmkt.exponential(1.0), "exponential", 1.0),
    "erlang2": (lambda: jsmkt.erlang(2), "Erlang-2", 0.5),
    "hyperexp2": (lambda: jsmkt.hyperexponential2(1.0, 4.0), "H2 (SCV 4)", 4.0),
    "coxian2": (lambda: jsmkt.coxian2(1.0, 2.0), "Coxian-2 (SCV 2)", 2.0),
}
METHODS = ("simulation", "exact", "published_closed_form", "published_ode")
N_TAILS = 4  # s_1..s_4

FULL = dict(
    ds=[2, 3],
    lams=[0.5, 0.8, 0.9, 0.95],
    services=list(SERVICES),
    n_servers=1000,
    target=0.005,  # 95 % half-width of E[T] / E[T]
    min_reps=8,
    reps_per_call=8,
    warmup_taus=10.0,
    length_factor=4.0,  # statistics period per replication = length_factor * warm-up
    min_length=200.0,
    budget_cpu=2100.0,  # seconds of simulation CPU time for all cases together
    seed=20240601,
    tail_min=0.01,  # relative errors of s_k are "meaningful" where the simulated s_k >= tail_min
)
QUICK = dict(
    FULL,
    ds=[2],
    lams=[0.5, 0.9],
    target=0.02,
    min_reps=4,
    reps_per_call=4,
    warmup_taus=6.0,
    length_factor=2.0,
    min_length=60.0,
    budget_cpu=60.0,
)


# --- mean-field methods -----------------------------------------------------------------------------------------


def mean_field(lam: float, service, d: int) -> dict:
    """s_0..s_K and E[T] of the three mean-field methods, plus the relaxation time of the exact one."""
    model = jsmkt.JSQdPH(lam, service, d=d)
    fp = jsmkt.solve_fixed_point(model)
    K = model.K
    out = {
        "exact": {
            "tails": np.asarray(jsmkt.tails(model, fp)),
            "ET": float(jsmkt.mean_sojourn_time(model, fp)),
            "K": K,
            "tail_mass_at_K": float(fp.tail_mass),
        }
    }
    cf = np.asarray(jsmkt.published.ph_fixed_point(lam, service, d, K)).sum(axis=1)
    out["published_closed_form"] = {
        "tails": np.concatenate([[1.0], cf]),
        "ET": float(jsmkt.published.ph_sojourn_time(lam, service, d)),
        "K": K,
    }
    pub = jsmkt.published.JSQdPHAsPublished(lam, service, d, K)
    pfp = jsmkt.solve_fixed_point(pub)
    out["published_ode"] = {
        "tails": np.asarray(jsmkt.tails(pub, pfp)),
        "ET": float(jsmkt.mean_sojourn_time(pub, pfp)),
        "K": K,
        "tail_mass_at_K": float(pfp.tail_mass),
    }
    return out, _common.relaxation_time(model, fp)


# --- table ------------------------------------------------------------------------------------------------------


def _rel(x: float, ref: float) -> float:
    return (x - ref) / ref if ref != 0 else math.nan


def rows_for(case: dict, tail_min: float) -> list[dict]:
    """One CSV row per method: values, CIs (simulation) and relative errors against simulation."""
    sim = case["simulation"]
    base = {k: case[k] for k in ("d", "lam", "service", "scv")}
    rows = []
    for method in METHODS:
        m = case[method]
        tails = np.asarray(m["tails"])
        row = dict(base, method=method, ET=m["ET"])
        for k in range(1, N_TAILS + 1):
            row[f"s{k}"] = float(tails[k]) if k < len(tails) else 0.0
        if method == "simulation":
            row["ET_ci"] = sim["ET_ci"]
            row["ET_ci_rel"] = sim["ET_ci"] / sim["ET"]
            row["little_gap"] = sim["EQ"] / (case["lam"] * sim["ET"]) - 1.0
            for k in range(1, N_TAILS + 1):
                row[f"s{k}_ci"] = float(sim["tails_ci"][k])
            row.update(
                n_replications=sim["n_replications"], t1=sim["t1"], warmup=sim["warmup"],
                events=sim["events"], cpu_s=sim["cpu_s"], target_met=sim["target_met"],
            )
        else:
            row["relerr_ET"] = _rel(m["ET"], sim["ET"])
            # deviation in units of ci / 1.96 (the half-width is a Student-t one, so this overstates it slightly)
            row["z_ET"] = (m["ET"] - sim["ET"]) / sim["ET_ci"] * 1.96 if sim["ET_ci"] > 0 else math.nan
            for k in range(1, N_TAILS + 1):
                s_sim = float(sim["tails"][k])
                row[f"relerr_s{k}"] = _rel(row[f"s{k}"], s_sim) if s_sim >= tail_min else math.nan
        rows.append(row)
    return rows


FIELDS = (
    ["d", "lam", "service", "scv", "method", "ET", "ET_ci", "ET_ci_rel"]
    + [f"s{k}" for k in range(1, N_TAILS + 1)]
    + [f"s{k}_ci" for k in range(1, N_TAILS + 1)]
    + ["relerr_ET", "z_ET"]
    + [f"relerr_s{k}" for k in range(1, N_TAILS + 1)]
    + ["little_gap", "n_replications", "t1", "warmup", "events", "cpu_s", "target_met"]
)


def summarise(rows: list[dict], p: dict) -> dict:
    """Largest |relative error| of each method against simulation, over lam <= 0.9 and over all cases."""
    out = {}
    for method in METHODS[1:]:
        mrows = [r for r in rows if r["method"] == method]
        entry = {}
        for scope, sel in (("lam_le_0.9", [r for r in mrows if r["lam"] <= 0.9 + 1e-12]), ("all", mrows)):
            if not sel:
                continue
            et = max(sel, key=lambda r: abs(r["relerr_ET"]))
            tail_errs = [
                (abs(r[f"relerr_s{k}"]), r, k)
                for r in sel
                for k in range(1, N_TAILS + 1)
                if not math.isnan(r[f"relerr_s{k}"])
            ]
            tmax = max(tail_errs, key=lambda t: t[0]) if tail_errs else (math.nan, None, None)
            entry[scope] = {
                "max_abs_relerr_ET": abs(et["relerr_ET"]),
                "at": {"d": et["d"], "lam": et["lam"], "service": et["service"]},
                "max_abs_relerr_tails": tmax[0],
                "tails_at": None if tmax[1] is None else {
                    "d": tmax[1]["d"], "lam": tmax[1]["lam"], "service": tmax[1]["service"], "k": tmax[2]
                },
                "max_abs_z_ET": max(abs(r["z_ET"]) for r in sel),
            }
        out[method] = entry
    sims = [r for r in rows if r["method"] == "simulation"]
    out["simulation"] = {
        "max_ET_ci_rel": max(r["ET_ci_rel"] for r in sims),
        "max_ET_ci_rel_lam_le_0.9": max((r["ET_ci_rel"] for r in sims if r["lam"] <= 0.9 + 1e-12), default=None),
        "cases_target_met": sum(bool(r["target_met"]) for r in sims),
        "cases": len(sims),
        "cpu_s": sum(r["cpu_s"] for r in sims),
        "events": sum(r["events"] for r in sims),
    }
    out["simulation"]["max_little_law_gap"] = max(
        abs(r["little_gap"]) for r in sims
    )  # |E[Q] / (lam E[T]) - 1| of the simulation: consistency check of the simulator itself
    ex = [r for r in rows if r["method"] == "exact" and r["lam"] <= 0.9 + 1e-12]
    sim_of = {(r["d"], r["lam"], r["service"]): r for r in sims}
    # Tails: the error is "resolved" when it exceeds the simulation's own 95 % half-width.
    tails_beyond = []
    for r in ex:
        s = sim_of[(r["d"], r["lam"], r["service"])]
        for k in range(1, N_TAILS + 1):
            e = r[f"relerr_s{k}"]
            if not math.isnan(e) and abs(e) > 0.01:
                ci_rel = s[f"s{k}_ci"] / s[f"s{k}"]
                tails_beyond.append({"d": r["d"], "lam": r["lam"], "service": r["service"], "k": k,
                                     "relerr": e, "sim_ci_rel": ci_rel, "within_ci": abs(e) <= ci_rel})
    out["exact_tails_beyond_1pct_lam_le_0.9"] = tails_beyond
    resolved = [  # tails the simulation resolves to 1 % (95 % half-width)
        abs(r[f"relerr_s{k}"])
        for r in ex
        for s in [sim_of[(r["d"], r["lam"], r["service"])]]
        for k in range(1, N_TAILS + 1)
        if not math.isnan(r[f"relerr_s{k}"]) and s[f"s{k}_ci"] <= 0.01 * s[f"s{k}"]
    ]
    out["exact_max_abs_relerr_resolved_tails_lam_le_0.9"] = max(resolved, default=None)
    # Tails by size: relative errors for s_k >= threshold, and N x the absolute gap (a finite-N effect is O(1/N)).
    by_size = {}
    for thr in (0.3, 0.1, p["tail_min"]):
        for scope, sel in (("lam_le_0.9", ex), ("all", [r for r in rows if r["method"] == "exact"])):
            errs, ngaps = [], []
            for r in sel:
                s = sim_of[(r["d"], r["lam"], r["service"])]
                for k in range(1, N_TAILS + 1):
                    if s[f"s{k}"] >= thr:
                        errs.append(abs(r[f"s{k}"] - s[f"s{k}"]) / s[f"s{k}"])
                        ngaps.append(p["n_servers"] * abs(r[f"s{k}"] - s[f"s{k}"]))
            by_size[f"s_ge_{thr}_{scope}"] = {"count": len(errs), "max_abs_relerr": max(errs, default=None),
                                              "max_N_abs_gap": max(ngaps, default=None)}
    out["exact_tails_by_size"] = by_size
    out["acceptance_exact_ET_within_1pct_lam_le_0.9"] = bool(ex and all(abs(r["relerr_ET"]) <= 0.01 for r in ex))
    out["acceptance_exact_tails_within_1pct_or_sim_ci_lam_le_0.9"] = bool(
        ex and all(t["within_ci"] for t in tails_beyond)
    )
    return out


def markdown_table(rows: list[dict]) -> str:
    """E[T] per case: simulation ± CI and the relative error of each mean-field method, plus the tails' largest
    exact-vs-simulation error."""
    head = (
        "| d | λ | service | sim E[T] ± 95 % CI | reps | exact E[T] (err) | published closed form (err) "
        "| published ODE (err) | exact: largest rel. error of s_1..s_4 |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r["d"], r["lam"], r["service"]), {})[r["method"]] = r
    for (d, lam, service), m in by_case.items():
        s = m["simulation"]

        def fmt(method):
            r = m[method]
            return f"{r['ET']:.4f} ({100 * r['relerr_ET']:+.2f} %)"

        terr = [abs(m["exact"][f"relerr_s{k}"]) for k in range(1, N_TAILS + 1)
                if not math.isnan(m["exact"][f"relerr_s{k}"])]
        ks = [k for k in range(1, N_TAILS + 1) if not math.isnan(m["exact"][f"relerr_s{k}"])]
        tcell = f"{100 * max(terr):.2f} % (k ≤ {max(ks)})" if terr else "–"
        lines.append(
            f"| {d} | {lam} | {SERVICES[service][1]} | {s['ET']:.4f} ± {s['ET_ci']:.4f} "
            f"({100 * s['ET_ci_rel']:.2f} %) | {s['n_replications']} | {fmt('exact')} | "
            f"{fmt('published_closed_form')} | {fmt('published_ode')} | {tcell} |"
        )
    return head + "\n".join(lines) + "\n"


# --- main -------------------------------------------------------------------------------------------------------


def main(argv=None) -> Path:
    jsmkt.use_cpu_cores()  # replications in parallel on every core (before JAX's first computation)
    ap = _common.parser(__doc__.splitlines()[0])
    ap.add_argument("--budget-cpu", type=float, default=None, help="simulation CPU seconds for all cases")
    ap.add_argument("--target", type=float, default=None, help="target 95 %% half-width of E[T] / E[T]")
    ap.add_argument(
        "--resume", action="store_true",
        help="reuse the simulations of an interrupted run with the same parameters (OUT/partial.json)",
    )
    ap.add_argument("--ds", type=int, nargs="+", default=None, help="override the choice numbers d")
    ap.add_argument("--lams", type=float, nargs="+", default=None, help="override the arrival rates")
    ap.add_argument("--services", nargs="+", choices=list(SERVICES), default=None, help="override the services")
    args = ap.parse_args(argv)
    p = dict(QUICK if args.quick else FULL)
    for name in ("ds", "lams", "services"):
        if getattr(args, name) is not None:
            p[name] = getattr(args, name)
    if args.budget_cpu is not None:
        p["budget_cpu"] = args.budget_cpu
    if args.target is not None:
        p["target"] = args.target
    out = _common.output_dir(NAME, args.out, args.quick)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    clock = _common.Clock()

    # Mean field first (cheap); it also gives each case's relaxation time and hence its simulation cost.
    cases = []
    for d in p["ds"]:
        for service in p["services"]:
            make, _, scv = SERVICES[service]
            for lam in p["lams"]:
                mf, tau = mean_field(lam, make(), d)
                cases.append(dict(d=d, lam=lam, service=service, scv=scv, tau=tau, **mf))
                print(f"mean field d={d} lam={lam} {service}: E[T]={mf['exact']['ET']:.4f} tau={tau:.1f}", flush=True)
    mf_cpu = clock.cpu()

    # Simulation: cheapest cases first, so that budget they leave unspent goes to the expensive ones.
    order = sorted(range(len(cases)), key=lambda i: (cases[i]["lam"], cases[i]["tau"]))
    spent = 0.0
    root = jr.PRNGKey(p["seed"])
    partial = out / "partial.json"
    done = {}
    if args.resume and partial.exists():
        saved = _common.read_json(partial)
        if saved["parameters"] == _common.jsonable(p):
            done = saved["simulations"]
            print(f"resuming: {len(done)} simulations from {partial}", flush=True)
    for j, i in enumerate(order):
        c = cases[i]
        tag = f"d={c['d']} lam={c['lam']} {c['service']}"
        if tag in done:
            c["simulation"] = done[tag]
            spent += done[tag]["cpu_s"]
            continue
        budget = (p["budget_cpu"] - spent) / (len(order) - j)
        warmup = p["warmup_taus"] * c["tau"]
        length = max(p["length_factor"] * warmup, p["min_length"])
        model = jsmkt.JSQdPH(c["lam"], SERVICES[c["service"]][0](), d=c["d"])
        key = jr.fold_in(root, i)
        sim = _common.simulate_adaptive(model, p, warmup=warmup, length=length, key=key, budget=budget)
        spent += sim["cpu_s"]
        c["simulation"] = sim
        done[tag] = sim
        _common.write_json(partial, {"parameters": p, "simulations": done})
        print(
            f"sim d={c['d']} lam={c['lam']} {c['service']}: E[T]={sim['ET']:.4f} ± {sim['ET_ci']:.4f} "
            f"({100 * sim['ET_ci'] / sim['ET']:.2f} %), {sim['n_replications']} reps x {sim['t1']:.0f}, "
            f"{sim['cpu_s']:.1f} s CPU (budget {budget:.1f}), exact {c['exact']['ET']:.4f}",
            flush=True,
        )

    rows = [r for c in cases for r in rows_for(c, p["tail_min"])]
    summary = summarise(rows, p)
    meta["runtime"] = clock.runtime(mean_field_cpu_s=mf_cpu, simulation_cpu_s=spent)
    _common.write_csv(out / "verification.csv", rows, FIELDS)
    _common.write_json(out / "verification.json", {"metadata": meta, "summary": summary, "cases": cases})
    (out / "summary.md").write_text(markdown_table(rows))
    partial.unlink(missing_ok=True)
    print(markdown_table(rows))
    print(_common.jsonable(summary))
    print(f"wrote {out} in {clock.wall():.0f} s wall, {clock.cpu():.0f} s CPU")
    return out


if __name__ == "__main__":
    main()
