r"""Repair allocation under R.3 at fixed total repair capacity N beta: the share j of servers with a small repairman
and the large repairman's (relaxed) probing number d2, optimised by `jsmkt.optimise_repair` (optax L-BFGS on
sigmoid-reparametrised j in [0, j*) and d2 in [1, d2_max], three starts) and checked against a grid search.

Objectives: E[T] + c * (1 - j) beta E[D2] (minimised) and availability - c * (1 - j) beta E[D2] (maximised), the
second term the large repairman's probes per unit time per server, for several probing costs c. The search covers
the saturated regime j < j* = alpha/(alpha + beta), where the allocation matters; at and above j* the mean field
is R.1's whatever j and d2, and the objective tends to R.1's metric as j -> 1 (no probes): the table gives it
beside the optimum, so that the better regime can be read off.

**Grid.** The metric and the probes do not depend on c, so both are solved once on a `grid_j` x `grid_d2` grid of
(j, d2) (one vmapped solve per base point and metric), and the grid optimum of each c is a minimum over stored
values. A case passes when the optimised objective is at most the grid optimum plus 1e-6 of its magnitude.

Writes `repair_allocation.csv` (one row per base point, metric and c), `grid.csv`, `repair_allocation.json` and
`summary.md` to `--out`.

    python experiments/repair_allocation/compute.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt._design import _repair_model  # noqa: E402


NAME = "repair_allocation"
FULL = dict(  # costs per base: {metric: [c, ...]}; a second base point is left out of the full run for its length
    bases=[dict(lam=0.7, alpha=0.1, beta=1.0, d1=2, arrival="A1", K=24,
                costs={"mean_sojourn_time": [0.0, 0.2, 1.0], "availability": [0.02]})],
    d2_max=4, grid_j=101, grid_d2=61, tol=1e-6, steps=100,
)
QUICK = dict(FULL, bases=[dict(FULL["bases"][0], costs={"mean_sojourn_time": [0.2]})], grid_j=11, grid_d2=7, steps=60)


def base_model(b, d2_max):
    j_star = b["alpha"] / (b["alpha"] + b["beta"])
    return jsmkt.RepairableJSQ(b["lam"], b["alpha"], b["beta"], d1=b["d1"], arrival=b["arrival"], repair="R3",
                               j=0.5 * j_star, d2=jsmkt.InterpolatedChoice(2.0, d_max=d2_max), K=b["K"]), j_star


def grid_values(model, j_star, p):
    """The metric values and probes on the (j, d2) grid, one vmapped solve."""
    J, D = (a.ravel() for a in np.meshgrid(np.linspace(0.0, j_star * (1 - 1e-9), p["grid_j"]),
                                           np.linspace(1.0, p["d2_max"], p["grid_d2"])))

    @eqx.filter_jit
    def solve(j, d):
        def one(j, d):
            m = _repair_model(model, j, d, p["d2_max"])
            fp = jsmkt.solve_fixed_point(m, throw=False)
            return (jsmkt.mean_sojourn_time(m, fp), jsmkt.availability(m, fp),
                    jsmkt.probe_rate(m, fp, stream="large repairman"), fp.result == jsmkt.RESULTS.successful)

        return jax.vmap(one)(j, d)

    ET, A, P, ok = (np.asarray(a) for a in solve(jnp.asarray(J), jnp.asarray(D)))
    if not ok.all():
        raise RuntimeError(f"{int((~ok).sum())} grid solves failed")
    return J, D, {"mean_sojourn_time": ET, "availability": A}, P


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    rows, grid_rows = [], []
    for b in p["bases"]:
        costs_of = b["costs"]
        b = {k: v for k, v in b.items() if k != "costs"}
        model, j_star = base_model(b, p["d2_max"])
        J, D, values, P = grid_values(model, j_star, p)
        grid_rows += [{**b, "j": j, "d2": d, "ET": e, "availability": a, "probes": q}
                      for j, d, e, a, q in zip(J, D, values["mean_sojourn_time"], values["availability"], P,
                                               strict=True)]
        r1 = jsmkt.RepairableJSQ(b["lam"], b["alpha"], b["beta"], d1=b["d1"], arrival=b["arrival"], repair="R1",
                                 K=b["K"])
        fp1 = jsmkt.solve_fixed_point(r1)
        limit = {"mean_sojourn_time": float(jsmkt.mean_sojourn_time(r1, fp1)),
                 "availability": float(jsmkt.availability(r1, fp1))}
        print(f"base {b}: grid of {J.size} points ({clock.wall():.0f} s); R.1: {limit}", flush=True)
        for metric, costs in costs_of.items():
            sign = -1.0 if metric == "availability" else 1.0
            for c in costs:
                best = jsmkt.optimise_repair(model, c, metric=metric, d2_max=p["d2_max"], K=b["K"], steps=p["steps"],
                                             progress=False)
                obj = sign * values[metric] + c * P
                g = int(np.argmin(obj))
                row = {**b, "metric": metric, "c": c, "j_star": j_star, "objective": float(best.objective),
                       "value": float(best.value), "probes": float(best.probes), "j": float(best.model.j),
                       "d2": float(best.model.choice2.d), "steps": best.run.steps,
                       "stop_reason": best.run.stop_reason, "grid_objective": float(obj[g]), "grid_j": float(J[g]),
                       "grid_d2": float(D[g]), "R1_limit": sign * limit[metric]}
                row["gap"] = (row["objective"] - row["grid_objective"]) / abs(row["grid_objective"])
                row["passed"] = bool(row["objective"] <= row["grid_objective"] + p["tol"] * abs(row["grid_objective"]))
                rows.append(row)
                print(f"  {metric} c={c:g}: objective {row['objective']:.10g} at j={row['j']:.4g}, d2={row['d2']:.4g} "
                      f"(grid {row['grid_objective']:.10g} at j={row['grid_j']:.4g}, d2={row['grid_d2']:.4g}; gap "
                      f"{row['gap']:+.1e}); R.1 limit {row['R1_limit']:.6g}", flush=True)
    _common.write_csv(out / "repair_allocation.csv", rows)
    _common.write_csv(out / "grid.csv", grid_rows)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "repair_allocation.json", {"metadata": meta, "rows": rows})
    (out / "summary.md").write_text(summary(rows, p))
    print((out / "summary.md").read_text())
    return 0 if all(r["passed"] for r in rows) else 1


def summary(rows, p) -> str:
    lines = ["# R.3 repair allocation: optimum over (j, d2) against a grid", "",
             f"Grid {p['grid_j']} x {p['grid_d2']} over j in [0, j*) and d2 in [1, {p['d2_max']}]; objective = "
             "E[T] + c (1 - j) beta E[D2], or -(availability) + c (1 - j) beta E[D2]; pass: optimum <= grid optimum "
             f"+ {p['tol']:g} |grid optimum|. 'R.1 limit': the objective as j -> 1 (R.1's metric, no probes).", ""]
    for b in p["bases"]:
        sel = [r for r in rows if all(r[k] == v for k, v in b.items() if k != "costs")]
        if not sel:
            continue
        lines += [f"## lam = {b['lam']}, alpha = {b['alpha']}, beta = {b['beta']}, d1 = {b['d1']}, {b['arrival']} "
                  f"(j* = {sel[0]['j_star']:.4g})", "",
                  "| metric | c | objective | j | d2 | grid optimum | grid j | grid d2 | gap | R.1 limit |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sel:
            lines.append(f"| {'E[T]' if r['metric'] == 'mean_sojourn_time' else 'availability'} | {r['c']:g} | "
                         f"{r['objective']:.8g} | {r['j']:.4g} | {r['d2']:.4g} | {r['grid_objective']:.8g} | "
                         f"{r['grid_j']:.4g} | {r['grid_d2']:.4g} | {r['gap']:+.1e} | {r['R1_limit']:.6g} |")
        lines.append("")
    lines.append(f"{sum(r['passed'] for r in rows)}/{len(rows)} pass; largest gap {max(r['gap'] for r in rows):+.2e}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
