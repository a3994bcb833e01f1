r"""Finite-N check for the verification study: do the gaps between simulation and exact mean field shrink like 1/N?

The N = 1000 study (`compute.py`) resolves small gaps in the deeper tails (s_3, s_4 of 0.01-0.3 differ by a few
per cent, a few units of 1/N in absolute terms). If they are finite-N effects, N (s_k^sim - s_k^MF) stays roughly
constant as N grows and the gaps vanish in the limit the mean field describes. For two cases with the largest
resolved gaps at lam <= 0.9, this simulates N in {125, 250, 500, 1000, 2000} (replications added until the 95 %
half-width of E[T] is at most `target`) and writes `finite_n.csv` (one row per case and N: simulated and
mean-field s_1..s_4 and E[T], N x differences and their N x half-widths) and `finite_n.json` to `--out`.

    python experiments/verification/finite_n.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "verification"
SERVICES = {
    "exponential": lambda: jsmkt.exponential(1.0),
    "hyperexp2": lambda: jsmkt.hyperexponential2(1.0, 4.0),
}
N_TAILS = 4
FULL = dict(
    cases=[[3, 0.8, "hyperexp2"], [3, 0.9, "exponential"]],
    ns=[125, 250, 500, 1000, 2000],
    target=0.002,
    min_reps=8,
    reps_per_call=8,
    warmup_taus=10.0,
    length_factor=4.0,
    min_length=200.0,
    budget_cpu=900.0,  # generous: every (case, N) should stop on the CI target, not the budget (reproducible)
    seed=20240602,
)
QUICK = dict(FULL, cases=[[3, 0.8, "hyperexp2"]], ns=[125, 500], target=0.02, min_reps=4, reps_per_call=4,
             max_reps=8, warmup_taus=6.0, length_factor=2.0, min_length=60.0,
             budget_cpu=300.0)  # stops on the target or 8 replications, whatever the machine's speed


def main(argv=None) -> Path:
    jsmkt.use_cpu_cores()  # replications in parallel on every core (before JAX's first computation)
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = dict(QUICK if args.quick else FULL)
    out = _common.output_dir(NAME, args.out, args.quick)
    meta = _common.run_metadata(f"{NAME}/finite_n", p, quick=args.quick)
    clock = _common.Clock()
    rows, details = [], []
    jobs = [(c, n) for c in p["cases"] for n in p["ns"]]
    spent = 0.0
    for j, ((d, lam, service), n) in enumerate(jobs):
        model = jsmkt.JSQdPH(lam, SERVICES[service](), d=d)
        fp = jsmkt.solve_fixed_point(model)
        mf_tails = np.asarray(jsmkt.tails(model, fp))
        mf_et = float(jsmkt.mean_sojourn_time(model, fp))
        tau = _common.relaxation_time(model, fp)
        warmup = p["warmup_taus"] * tau
        length = max(p["length_factor"] * warmup, p["min_length"])
        budget = (p["budget_cpu"] - spent) / (len(jobs) - j)
        key = jr.fold_in(jr.fold_in(jr.PRNGKey(p["seed"]), j), n)
        sim = _common.simulate_adaptive(model, dict(p, n_servers=n), warmup=warmup, length=length, key=key,
                                        budget=budget)
        spent += sim["cpu_s"]
        row = {"d": d, "lam": lam, "service": service, "N": n, "ET_sim": sim["ET"], "ET_ci": sim["ET_ci"],
               "ET_mf": mf_et, "N_relgap_ET": n * (sim["ET"] - mf_et) / mf_et,
               "N_relgap_ET_ci": n * sim["ET_ci"] / mf_et}
        for k in range(1, N_TAILS + 1):
            s_sim, ci = float(sim["tails"][k]), float(sim["tails_ci"][k])
            row.update({f"s{k}_sim": s_sim, f"s{k}_ci": ci, f"s{k}_mf": float(mf_tails[k]),
                        f"N_gap_s{k}": n * (s_sim - float(mf_tails[k])), f"N_gap_s{k}_ci": n * ci})
        row.update(n_replications=sim["n_replications"], t1=sim["t1"], cpu_s=sim["cpu_s"],
                   target_met=sim["target_met"])
        rows.append(row)
        sim["calls"] = len(sim["calls"])  # (hundreds at small N; the pooled statistics are what matters here)
        details.append({"d": d, "lam": lam, "service": service, "N": n, **sim})
        print(
            f"d={d} lam={lam} {service} N={n}: E[T] {sim['ET']:.4f} ± {sim['ET_ci']:.4f} (MF {mf_et:.4f}), "
            "N(s_k - MF) = "
            + ", ".join(f"{row[f'N_gap_s{k}']:+.2f}±{row[f'N_gap_s{k}_ci']:.2f}" for k in range(2, 5))
            + f"; {sim['n_replications']} reps, {sim['cpu_s']:.1f} s CPU",
            flush=True,
        )
    meta["runtime"] = clock.runtime(simulation_cpu_s=spent)
    _common.write_csv(out / "finite_n.csv", rows)
    _common.write_json(out / "finite_n.json", {"metadata": meta, "rows": rows, "simulations": details})
    print(f"wrote {out} in {clock.wall():.0f} s wall, {clock.cpu():.0f} s CPU")
    return out


if __name__ == "__main__":
    main()
