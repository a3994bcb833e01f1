r"""Mitzenmacher's table of expected time in system for the supermarket model: mean-field prediction and simulation.

Supermarket model: Poisson arrivals of rate n*lam to n servers, each job samples d servers (with replacement) and
joins the shortest queue, exponential service of mean 1, FIFO. The mean-field ("prediction") column is

    E[T] = sum_{i >= 1} lam^((d^i - d)/(d - 1))      (Mitzenmacher 2001, Corollary 3.8)

computed here two ways: by jsmkt's exact mean field (`jsmkt.JSQd` + `jsmkt.solve_fixed_point` +
`jsmkt.mean_sojourn_time`, Little's law on the solved tails) and by summing the series directly; the two must agree
to 1e-10. Beside it, `jsmkt.simulate` with n = 100 and n = 500 servers (replications added until the 95 %
half-width of E[T] is at most `target` of E[T] or the case's CPU budget is spent; the achieved half-width is
recorded). Writes `mitzenmacher.csv`, `mitzenmacher.json` (run metadata, per-case details) and `table.md` to
`--out`.

    python experiments/mitzenmacher_table/compute.py [--quick] [--out DIR] [--budget-cpu SECONDS]
"""

import math
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402

import jsmkt  # noqa: E402


NAME = "mitzenmacher_table"
FULL = dict(
    ds=[2, 3, 5],
    lams=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99],
    ns=[100, 500],
    sim_ds=[2, 3, 5],
    sim_lams=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99],
    K=20,  # truncation of the mean field (s_K < 1e-18 for every case; one compilation per d)
    target=0.005,
    min_reps=8,
    reps_per_call=8,
    warmup_taus=20.0,  # the finite-n system relaxes more slowly than the mean field near lam = 1
    length_factor=8.0,
    min_length=500.0,
    budget_cpu=900.0,
    seed=20010601,
)
QUICK = dict(
    FULL,
    sim_ds=[2],
    sim_lams=[0.5, 0.9],
    target=0.03,
    min_reps=4,
    reps_per_call=4,
    warmup_taus=6.0,
    length_factor=2.0,
    min_length=50.0,
    budget_cpu=20.0,
)


def closed_form(lam: float, d: int) -> float:
    """sum_{i >= 1} lam^((d^i - d)/(d - 1)), summed until the terms underflow (plain Python floats)."""
    total, i = 0.0, 1
    while True:
        term = lam ** ((d**i - d) / (d - 1))
        total += term
        if term < 1e-300:
            return total
        i += 1


def main(argv=None) -> Path:
    jsmkt.use_cpu_cores()  # replications in parallel on every core (before JAX's first computation)
    ap = _common.parser(__doc__.splitlines()[0])
    ap.add_argument("--budget-cpu", type=float, default=None, help="simulation CPU seconds for all cases")
    args = ap.parse_args(argv)
    p = dict(QUICK if args.quick else FULL)
    if args.budget_cpu is not None:
        p["budget_cpu"] = args.budget_cpu
    out = _common.output_dir(NAME, args.out, args.quick)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    clock = _common.Clock()

    rows = []
    for d in p["ds"]:
        for lam in p["lams"]:
            model = jsmkt.JSQd(lam, d, mu=1.0, K=p["K"])
            fp = jsmkt.solve_fixed_point(model)
            mf = float(jsmkt.mean_sojourn_time(model, fp))
            cf = closed_form(lam, d)
            rows.append({
                "d": d, "lam": lam, "mean_field": mf, "closed_form": cf, "mf_minus_cf": mf - cf,
                "published_formula": float(jsmkt.published.exponential_sojourn_time(lam, d)),
                "tail_mass_at_K": float(fp.tail_mass), "tau": _common.relaxation_time(model, fp),
            })
    mf_cpu = clock.cpu()

    sims = [(r, n) for r in rows for n in p["ns"] if r["d"] in p["sim_ds"] and r["lam"] in p["sim_lams"]]
    sims.sort(key=lambda rn: (rn[0]["lam"], rn[1]))  # cheapest first: leftover budget goes to lam = 0.99
    spent = 0.0
    root = jr.PRNGKey(p["seed"])
    details = []
    for j, (r, n) in enumerate(sims):
        budget = (p["budget_cpu"] - spent) / (len(sims) - j)
        warmup = p["warmup_taus"] * r["tau"]
        length = max(p["length_factor"] * warmup, p["min_length"])
        model = jsmkt.JSQd(r["lam"], r["d"], mu=1.0, K=p["K"])
        key = jr.fold_in(jr.fold_in(root, r["d"] * 1000 + round(r["lam"] * 100)), n)
        sim = _common.simulate_adaptive(model, dict(p, n_servers=n), warmup=warmup, length=length, key=key,
                                        budget=budget)
        spent += sim["cpu_s"]
        r[f"sim_{n}"], r[f"sim_{n}_ci"] = sim["ET"], sim["ET_ci"]
        r[f"sim_{n}_reps"], r[f"sim_{n}_t1"], r[f"sim_{n}_cpu_s"] = sim["n_replications"], sim["t1"], sim["cpu_s"]
        sim.pop("tails"), sim.pop("tails_ci")
        details.append({"d": r["d"], "lam": r["lam"], "n": n, **sim})
        print(
            f"d={r['d']} lam={r['lam']} n={n}: E[T]={sim['ET']:.4f} ± {sim['ET_ci']:.4f} "
            f"({100 * sim['ET_ci'] / sim['ET']:.2f} %), {sim['n_replications']} reps x {sim['t1']:.0f}, "
            f"{sim['cpu_s']:.1f} s CPU (budget {budget:.1f}); prediction {r['mean_field']:.4f}",
            flush=True,
        )

    meta["runtime"] = clock.runtime(mean_field_cpu_s=mf_cpu, simulation_cpu_s=spent)
    meta["max_abs_mf_minus_closed_form"] = max(abs(r["mf_minus_cf"]) for r in rows)
    fields = ["d", "lam"]
    for n in p["ns"]:
        fields += [f"sim_{n}", f"sim_{n}_ci", f"sim_{n}_reps", f"sim_{n}_t1", f"sim_{n}_cpu_s"]
    fields += ["mean_field", "closed_form", "mf_minus_cf", "published_formula", "tail_mass_at_K", "tau"]
    _common.write_csv(out / "mitzenmacher.csv", rows, fields)
    _common.write_json(out / "mitzenmacher.json", {"metadata": meta, "rows": rows, "simulations": details})
    table = markdown_table(rows, p["ns"])
    (out / "table.md").write_text(table)
    print(table)
    print(f"max |mean field - closed form| = {meta['max_abs_mf_minus_closed_form']:.3g}")
    print(f"wrote {out} in {clock.wall():.0f} s wall, {clock.cpu():.0f} s CPU")
    return out


def markdown_table(rows: list[dict], ns: list[int]) -> str:
    head = "| d | λ | " + " | ".join(f"sim n = {n} (± 95 % CI)" for n in ns) + " | prediction (jsmkt mean field) |\n"
    head += "|---|---|" + "---|" * len(ns) + "---|\n"
    lines = []
    for r in rows:
        cells = []
        for n in ns:
            v = r.get(f"sim_{n}")
            cells.append("–" if v is None or math.isnan(v) else f"{v:.4f} ± {r[f'sim_{n}_ci']:.4f}")
        lines.append(f"| {r['d']} | {r['lam']} | " + " | ".join(cells) + f" | {r['mean_field']:.4f} |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
