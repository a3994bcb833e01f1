r"""Choice numbers under a probing cost: minimise E[T] + c * (probes per job) over randomised choice numbers with
`jsmkt.optimise_choice` (optax L-BFGS on the logits of a law over d = 1..d_max), and check every optimum against
exhaustive search.

Cases (mu = 1): JSQ(d) with exponential service at lam = 0.9, d_max = 6; the retrial model (linear re-probing,
lam = 0.8, theta = 1), optimising (d1, d2) over 1..4 with the retrials' probes counted. `case` also defines JSQ(d) at lam = 0.95 and with H2 service (SCV 4) at lam = 0.9, and
two arrival classes (lam = 0.45 each, class 2 in batches of 2; d per class over 1..4), left out of the full run for
its length (`FULL["cases"]`).

**Exhaustive search.** E[T] and the probes per job do not depend on c, so each is solved once on a grid of laws
(one vmapped solve per case): every integer choice number and every two-point mixture on a grid of `mix_points`
weights (for two choice numbers: the integer pairs, and the two-point mixtures of one with the other an integer),
and the grid optimum of E[T] + c P for each c is a minimum over stored values. A c passes when the optimised
objective is at most the grid optimum times (1 + 1e-6).

**Pareto front.** Sweeping c traces the lower convex hull of the achievable (probes, E[T]) pairs; the grid gives the
frontier of the laws it holds, among them the interpolated rule (`InterpolatedChoice`: the two neighbours of a real
d), whose E[T] against E[D] this study tests for convexity.

Writes `choice.csv` (one row per case and c), `grid.csv` (the grid of laws: E[T], probes per job), `choice.json`
(metadata and rows) and `summary.md` to `--out`.

    python experiments/choice_numbers/compute.py [--quick] [--out DIR]
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
from jsmkt._design import _with_laws  # noqa: E402
from jsmkt._sensitivity import parameters_of  # noqa: E402


NAME = "choice_numbers"
COSTS = [0.05, 0.5, 2.0]
FULL = dict(  # "jsq-0.95", "jsq-h2-0.9" and "classes" are defined below but left out: a run within minutes
    cases=["jsq-0.9", "retrial"],
    costs=COSTS, mix_points=201, tol=1e-6, steps=150,
)
QUICK = dict(FULL, cases=["jsq-0.9"], costs=[0.5], mix_points=11, steps=60)


def case(name):
    """`(model, wrt, d_max, K)` of a case."""
    if name.startswith("jsq-h2"):
        return jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=700), ["d"], 6, 700
    if name.startswith("jsq"):
        lam = float(name.split("-")[1])
        K = {0.9: 256, 0.95: 560}[lam]
        return jsmkt.JSQd(lam, d=2, K=K), ["d"], 6, K
    if name == "retrial":
        return jsmkt.RetrialJSQ(0.8, 1.0, d1=2, d2=2, K=64), ["d1", "d2"], 4, 64
    if name == "classes":
        model = jsmkt.JSQdClasses([0.45, 0.225], d=[2, 2], batch_sizes=[None, jnp.array([0.0, 1.0])], K=256)
        return model, ["d"], 4, 256
    raise ValueError(name)


def grid_laws(model, wrt, d_max, n):
    """The grid of laws: a list of `{name: law}` (a tuple of laws for per-class choices), their labels, and for
    each the pair `(i, j)` of choice numbers its mixed slot puts weight on (`i == j` for integers)."""
    eye = np.eye(d_max)
    single = [(f"{i + 1}", eye[i], (i + 1, i + 1)) for i in range(d_max)]
    for i in range(d_max):
        for j in range(i + 1, d_max):
            for q in np.linspace(0.0, 1.0, n)[1:-1]:
                single.append((f"{i + 1} w.p. {q:.4f} else {j + 1}", q * eye[i] + (1 - q) * eye[j], (i + 1, j + 1)))
    params = parameters_of(model)
    slots = []  # (name, index within a tuple or None)
    for name in wrt:
        x = params[name].where(model)
        slots += [(name, k) for k in range(len(x))] if isinstance(x, tuple) else [(name, None)]
    laws, labels, pairs = [], [], []
    for a in range(len(slots)):  # one slot mixed (or at an integer), the others at integers
        others = [s for s in range(len(slots)) if s != a]
        for ints in np.ndindex(*(d_max,) * len(others)):
            for lab, w, pair in single:
                law, text = {}, []
                for s, (name, k) in enumerate(slots):
                    v = w if s == a else eye[ints[others.index(s)]]
                    if k is None:
                        law[name] = v
                    else:
                        law.setdefault(name, [None] * len(params[name].where(model)))[k] = v
                    text.append(f"{name}{'' if k is None else k + 1}="
                                f"{lab if s == a else ints[others.index(s)] + 1}")
                laws.append({m: tuple(v) if isinstance(v, list) else v for m, v in law.items()})
                labels.append(", ".join(text))
                pairs.append(pair)
    return laws, labels, pairs


def solve_grid(model, wrt, laws):
    """E[T] and probes per job of every law (one vmapped solve)."""
    params = {n: parameters_of(model)[n] for n in wrt}
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *laws)

    @eqx.filter_jit
    def solve(stacked):
        def one(law):
            m = _with_laws(model, params, law)
            fp = jsmkt.solve_fixed_point(m, throw=False)
            return (jsmkt.mean_sojourn_time(m, fp), jsmkt.probe_rate(m, fp) / m.arrival_rate,
                    fp.result == jsmkt.RESULTS.successful)

        return jax.vmap(one)(stacked)

    ET, P, ok = (np.asarray(a) for a in solve(stacked))
    if not ok.all():
        raise RuntimeError(f"{int((~ok).sum())} grid solves failed")
    return ET, P


def run_case(name, p):
    model, wrt, d_max, K = case(name)
    clock = _common.Clock()
    laws, labels, pairs = grid_laws(model, wrt, d_max, p["mix_points"])
    ET, P = solve_grid(model, wrt, laws)
    grid_rows = [{"case": name, "law": lab, "i": i, "j": j, "ET": e, "probes": q}
                 for lab, (i, j), e, q in zip(labels, pairs, ET, P, strict=True)]
    print(f"{name}: {len(laws)} laws on the grid ({clock.wall():.0f} s)", flush=True)
    rows = []
    for c in p["costs"]:
        best = jsmkt.optimise_choice(model, c, wrt=wrt, d_max=d_max, K=K, steps=p["steps"], progress=False)
        obj = ET + c * P
        g = int(np.argmin(obj))
        laws_opt = {}
        params = parameters_of(best.model)
        for n in wrt:
            x = params[n].where(best.model)
            laws_opt[n] = [np.round(np.asarray(c_.probs), 6).tolist() for c_ in x] if isinstance(x, tuple) \
                else np.round(np.asarray(x.probs), 6).tolist()
        row = {"case": name, "c": c, "objective": float(best.objective), "ET": float(best.value),
               "probes": float(best.probes), "law": laws_opt, "steps": best.run.steps,
               "stop_reason": best.run.stop_reason, "grid_objective": float(obj[g]), "grid_law": labels[g],
               "grid_ET": float(ET[g]), "grid_probes": float(P[g]),
               "rel_gap": (float(best.objective) - float(obj[g])) / float(obj[g])}
        row["passed"] = bool(row["rel_gap"] <= p["tol"])
        rows.append(row)
        print(f"  c={c:<9g} objective {row['objective']:.10g} (grid {row['grid_objective']:.10g}, "
              f"{row['grid_law']}), gap {row['rel_gap']:+.2e}, E[T] {row['ET']:.6g}, probes {row['probes']:.4g}, "
              f"law {laws_opt}", flush=True)
    return rows, grid_rows


def convexity(grid_rows, case_name):
    """For a case with one choice number: the interpolated rule's E[T] against E[D] (integers and neighbouring
    two-point mixtures): its largest excess over the chord through its neighbours on the grid (positive: not
    convex there), and the largest gain in E[T] of a non-neighbouring mixture over the interpolated rule at the same
    E[D]."""
    sel = [r for r in grid_rows if r["case"] == case_name]
    adj = sorted(((r["probes"], r["ET"]) for r in sel if r["j"] - r["i"] <= 1))
    x, y = np.array([a for a, _ in adj]), np.array([b for _, b in adj])
    chord = (y[:-2] * (x[2:] - x[1:-1]) + y[2:] * (x[1:-1] - x[:-2])) / (x[2:] - x[:-2])
    other = [r for r in sel if r["j"] - r["i"] > 1]
    gain = max((float(np.interp(r["probes"], x, y) - r["ET"]) for r in other), default=float("nan"))
    return {"case": case_name, "max_convexity_violation": float(np.max(y[1:-1] - chord)),
            "max_gain_of_non_adjacent": gain}


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    clock = _common.Clock()
    rows, grid_rows = [], []
    for name in p["cases"]:
        r, g = run_case(name, p)
        rows += r
        grid_rows += g
    checks = [convexity(grid_rows, n) for n in p["cases"] if n.startswith("jsq")]
    _common.write_csv(out / "choice.csv", [{**r, "law": str(r["law"])} for r in rows])
    _common.write_csv(out / "grid.csv", grid_rows)
    meta = _common.run_metadata(NAME, p, quick=args.quick)
    meta["runtime"] = clock.runtime()
    _common.write_json(out / "choice.json", {"metadata": meta, "rows": rows, "convexity": checks})
    (out / "summary.md").write_text(summary(rows, checks, p))
    print((out / "summary.md").read_text())
    return 0 if all(r["passed"] for r in rows) else 1


def summary(rows, checks, p) -> str:
    lines = ["# Choice numbers under a probing cost: optimum of E[T] + c * probes per job", "",
             f"Optimised law (jsmkt.optimise_choice) against the exhaustive grid (integers and two-point mixtures, "
             f"{p['mix_points']} weights); pass: gap <= {p['tol']:g}.", ""]
    for name in p["cases"]:
        sel = [r for r in rows if r["case"] == name]
        lines += [f"## {name}", "", "| c | objective | grid optimum | gap | E[T] | probes/job | law (optimum) | grid law |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sel:
            lines.append(f"| {r['c']:g} | {r['objective']:.8g} | {r['grid_objective']:.8g} | {r['rel_gap']:+.1e} | "
                         f"{r['ET']:.6g} | {r['probes']:.4f} | {_law_text(r['law'])} | {r['grid_law']} |")
        lines.append("")
    worst = max(r["rel_gap"] for r in rows)
    lines += [f"Largest gap (optimum minus grid optimum, relative): {worst:+.2e}; "
              f"{sum(r['passed'] for r in rows)}/{len(rows)} pass.", ""]
    if checks:
        lines += ["| case | interpolated rule: largest excess over its chords | non-adjacent mixtures: largest gain "
                  "at equal E[D] |", "|---|---|---|"]
        lines += [f"| {c['case']} | {c['max_convexity_violation']:.3g} | {c['max_gain_of_non_adjacent']:.3g} |"
                  for c in checks]
    return "\n".join(lines) + "\n"


def _law_text(law) -> str:
    def one(w):
        return ", ".join(f"{i + 1}: {x:.3f}" for i, x in enumerate(w) if x >= 5e-4)

    parts = []
    for name, w in law.items():
        if w and isinstance(w[0], list):
            parts += [f"{name}{k + 1} ({one(v)})" for k, v in enumerate(w)]
        else:
            parts.append(f"{name} ({one(w)})")
    return "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
