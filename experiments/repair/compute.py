r"""Supermarket models with repairable servers (N. Li, Q.-L. Li & Z. G. Zhang, arXiv 1703.08823): Models I-IV
(arrival policies A.1/A.2 x repair schemes R.1/R.2) from jsmkt's exact mean field (`jsmkt.RepairableJSQ`, mu = 1),
and R.3 (small repairmen and a large one) compared at equal repair capacity, and checked against N = 1000
simulation of the same rules.

**Equal repair capacity.** Under R.1 each of the N repairmen works at rate beta; under R.2 the super repairman
works at rate N beta. Both can repair at most N beta servers per unit time (R.1 when every server is failed, R.2
when each of its events finds a failed server), so the same beta is the same capacity; what differs is how much of
it is used (R.1: beta times the failed fraction; R.2: beta (1 - g2(a)) per server) and which servers get it (R.2
repairs the longest failed queue among d2 sampled). R.3's jN small repairmen of rate beta and large repairman of
rate (N - jN) beta make the same N beta.

Sweeps (each one vmapped solve over the swept parameter, one K): lam, alpha, beta, d1 and d2 around lam = 0.7,
alpha = 0.1, beta = 1, d1 = d2 = 2, and R.3's j (one vmapped solve per regime, either side of
j* = alpha/(alpha + beta)). Validation: Models I-IV at lam in {0.5, 0.7}, alpha = 0.1, beta = 1 and at
lam = 0.5, alpha = 0.2, beta = 0.5 (d1 = d2 = 2), plus R.3 with j = 0.5 (below saturation) and j = 0.05 (saturated)
under A.1 and A.2; a case passes when the mean field lies within 1 % of the simulated E[T] plus its 95 %
half-width. Writes `repair.csv`, `validation.csv`, `repair.json` and `summary.md` to `--out`.

    python experiments/repair/compute.py [--quick] [--out DIR]
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402


NAME = "repair"
MODELS = {"I": ("A1", "R1"), "II": ("A1", "R2"), "III": ("A2", "R1"), "IV": ("A2", "R2")}
BASE = dict(lam=0.7, alpha=0.1, beta=1.0, d1=2, d2=2)
FULL = dict(
    base=BASE,
    sweeps={"lam": [round(x, 3) for x in np.linspace(0.05, 0.85, 17)],
            "alpha": [round(float(x), 4) for x in np.geomspace(0.01, 0.35, 12)],
            "beta": [round(float(x), 4) for x in np.geomspace(0.35, 10.0, 12)]},
    j_sweep=[round(float(x), 4) for x in np.linspace(0.0, 0.3, 31)],
    d_range=[1, 2, 3, 4, 5],
    K=40,
    validation=[(lam, 0.1, 1.0) for lam in (0.5, 0.7)] + [(0.5, 0.2, 0.5)],
    r3_j=[0.5, 0.05],
    validation_models=list(MODELS) + ["R3"],
    n_servers=1000, sim_time=2000.0, sim_warmup=200.0, sim_reps=4, seed=20170324, tolerance=0.01,
)
QUICK = dict(FULL, sweeps={"lam": [0.3, 0.6]}, d_range=[2], K=30, validation=[(0.5, 0.1, 1.0)],
             j_sweep=[0.02, 0.05, 0.2], r3_j=[0.05], validation_models=["I", "IV", "R3"], n_servers=200, sim_time=200.0, sim_warmup=20.0, sim_reps=2,
             tolerance=0.05)


def _metrics(model, fp):
    out = dict(EQ=jsmkt.mean_queue_length(model, fp), ET=jsmkt.mean_sojourn_time(model, fp),
               availability=jsmkt.availability(model, fp),
               at_failed=jsmkt.customers_at_failed_servers(model, fp),
               repair_util=jsmkt.repairmen_utilisation(model, fp))
    if model.repair == "R3":
        out["waiting"] = jsmkt.fraction_failed_waiting(model, fp)
    return out


def _model(p, arrival, repair, K, **kw):
    q = p | kw
    return jsmkt.RepairableJSQ(q["lam"], q["alpha"], q["beta"], d1=q["d1"], d2=q["d2"], arrival=arrival,
                               repair=repair, K=K, j=q.get("j"), saturated=q.get("saturated"))


def sweep_j(values, arrival, base, K):
    """R.3 over j: one vmapped solve per regime (the regime is static: saturated below j*)."""
    js = base["alpha"] / (base["alpha"] + base["beta"])
    rows = []
    for saturated in (True, False):
        vs = [v for v in values if (v < js) == saturated]
        if vs:
            got = _common.vmapped_solve(lambda x: _model(base, arrival, "R3", K, j=x, saturated=saturated), _metrics,
                                        vs, f"j ({arrival}, R3, {'saturated' if saturated else 'below saturation'})")
            rows += [{"sweep": "j", "value": float(v), "arrival": arrival, "repair": "R3", **base, "j": float(v), **r}
                     for v, r in zip(vs, got, strict=True)]
    return sorted(rows, key=lambda r: r["value"])


def sweep(name, values, arrival, repair, base, K):
    """The mean field at every value of one parameter, one vmapped solve."""
    rows = _common.vmapped_solve(lambda x: _model(base, arrival, repair, K, **{name: x}), _metrics, values,
                                 f"{name} ({arrival}, {repair})")
    return [{"sweep": name, "value": float(v), "arrival": arrival, "repair": repair, **base, name: float(v), **r}
            for v, r in zip(values, rows, strict=True)]


def validate(p, key):
    names = [m for m in p["validation_models"] if m in MODELS]
    cases = [(name, *MODELS[name], lam, alpha, beta) for lam, alpha, beta in p["validation"] for name in names]
    if "R3" in p["validation_models"]:
        cases += [(f"R3 j={j:g}, {a}", a, "R3", lam, alpha, beta, j) for j in p["r3_j"]
                  for lam, alpha, beta in p["validation"] for a in ("A1", "A2")]
    rows = []
    for name, arrival, repair, lam, alpha, beta, *j in cases:
        model = jsmkt.RepairableJSQ(lam, alpha, beta, arrival=arrival, repair=repair, j=j[0] if j else None)
        ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
        key, sub = jr.split(key)
        sim = jsmkt.simulate(model, p["n_servers"], p["sim_time"], warmup=p["sim_warmup"], key=sub,
                             n_replications=p["sim_reps"])
        gap = abs(sim.mean_sojourn_time - ET)
        rows.append(dict(model=name, arrival=arrival, repair=repair, lam=lam, alpha=alpha, beta=beta,
                         j=j[0] if j else None, saturated=model.saturated, ET_mean_field=ET,
                         ET_sim=sim.mean_sojourn_time, ET_ci=sim.mean_sojourn_time_ci,
                         p99_sim=(sim.sojourn_time_percentiles or {}).get(99),
                         rel_diff=(sim.mean_sojourn_time - ET) / ET,
                         passed=bool(gap < p["tolerance"] * ET + sim.mean_sojourn_time_ci)))
        print(f"{name:>14} lam={lam} alpha={alpha} beta={beta}: E[T] {ET:.5g} mean field, {sim.mean_sojourn_time:.5g} "
              f"± {sim.mean_sojourn_time_ci:.2g} simulated ({100 * rows[-1]['rel_diff']:+.2f} %)", flush=True)
    return rows


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    rows = []
    for arrival, repair in MODELS.values():
        for name, values in p["sweeps"].items():
            rows += sweep(name, values, arrival, repair, p["base"], p["K"])
        for d in p["d_range"]:
            for which in ("d1", "d2"):
                model = _model(p["base"], arrival, repair, p["K"], **{which: d})
                fp = jsmkt.solve_fixed_point(model, auto_K=True)  # d1 = 1 needs a longer K
                m = {k: float(v) for k, v in _metrics(fp.model, fp).items()} | {"tail_mass": float(fp.tail_mass)}
                rows.append({"sweep": which, "value": d, "arrival": arrival, "repair": repair, **p["base"], which: d,
                             **m})
    for arrival in ("A1", "A2"):
        rows += sweep_j(p["j_sweep"], arrival, p["base"], p["K"])
    checks = validate(p, jr.PRNGKey(p["seed"]))
    _common.write_csv(out / "repair.csv", rows)
    _common.write_csv(out / "validation.csv", checks)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "repair.json", {"metadata": meta, "rows": rows, "validation": checks})
    (out / "summary.md").write_text(summary(rows, checks, p))
    print((out / "summary.md").read_text())
    return 0 if all(c["passed"] for c in checks) else 1


def summary(rows, checks, p) -> str:
    b = p["base"]

    def et(arrival, repair, sweep="lam", value=None):
        value = b[sweep] if value is None else value
        sel = [r for r in rows if r["sweep"] == sweep and r["arrival"] == arrival and r["repair"] == repair
               and abs(r["value"] - value) < 1e-9]
        return sel[0]["ET"] if sel else float("nan")

    lines = [f"# Repairable servers: Models I-IV (mu = 1, d1 = d2 = {b['d1']}, equal repair capacity beta)", "",
             "| lam | E[T] I (A1, R1) | II (A1, R2) | III (A2, R1) | IV (A2, R2) | A2 vs A1 (R1) | R2 vs R1 (A1) |",
             "|---|---|---|---|---|---|---|"]
    for lam in p["sweeps"]["lam"]:
        e = {n: et(a, r, "lam", lam) for n, (a, r) in MODELS.items()}
        lines.append(f"| {lam} | {e['I']:.5g} | {e['II']:.5g} | {e['III']:.5g} | {e['IV']:.5g} | "
                     f"{100 * (e['III'] / e['I'] - 1):+.1f} % | {100 * (e['II'] / e['I'] - 1):+.1f} % |")
    lines += ["", f"alpha = {b['alpha']}, beta = {b['beta']} in the table above.", "",
              f"## R.3 over j (lam = {b['lam']}, alpha = {b['alpha']}, beta = {b['beta']}; saturated below "
              f"j* = {b['alpha'] / (b['alpha'] + b['beta']):.4g})", "",
              "| j | E[T] A1 | E[T] A2 | availability | waiting / failed | vs R1 (A1) | vs R2 (A1) |", "|---|---|---|---|---|---|---|"]
    r3 = {(r["arrival"], r["value"]): r for r in rows if r["sweep"] == "j"}
    for j in p["j_sweep"]:
        a1, a2 = r3.get(("A1", j)), r3.get(("A2", j))
        if a1 is None or a2 is None:
            continue
        lines.append(f"| {j:g} | {a1['ET']:.5g} | {a2['ET']:.5g} | {a1['availability']:.4f} | {a1['waiting']:.4f} | "
                     f"{100 * (a1['ET'] / et('A1', 'R1') - 1):+.1f} % | {100 * (a1['ET'] / et('A1', 'R2') - 1):+.1f} % |")
    lines += ["",
              "## Mean field against N-server simulation", "",
              "| model | lam | alpha | beta | E[T] mean field | E[T] simulated | 95% CI | rel. diff | pass |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['model']} | {c['lam']} | {c['alpha']} | {c['beta']} | {c['ET_mean_field']:.5g} | "
                     f"{c['ET_sim']:.5g} | ±{c['ET_ci']:.2g} | {100 * c['rel_diff']:+.2f} % | "
                     f"{'yes' if c['passed'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
