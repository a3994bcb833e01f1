r"""Existence, uniqueness, local stability and convergence of the fixed point, per family, exact and as published,
over the parameter ranges of the papers' numerical sections (cut to run within minutes on two cores).

For every case (a family, its parameters, and the variant: the exact mean field, or the papers' ODE as published,
`jsmkt.published.published_equations`):

- **existence and uniqueness**: `jsmkt.find_fixed_points` from `starts` random occupancies, the empty and the full
  system, each integrated to a steady state then polished by Newton, and solved by Newton directly; the number of
  distinct fixed points inside the state space, and of roots of the drift outside it;
- **local stability**: `jsmkt.stability` at the fixed point `jsmkt.solve_fixed_point` gives: the spectral abscissa,
  its tolerance and the verdict;
- **convergence**: `jsmkt.convergence` from the empty system to `t1` = 40 relaxation times (at most `t_max`): the
  exponential rate fitted to the distance to the fixed point against -abscissa, and the monotone bound
  $S_k(t) \le S_k^*$ (every entry of the reduced state, phase by phase where it holds phase vectors) and on the
  tails $s_k(t) \le s_k^*$.

Each group of cases shares one truncation level `K` (the auto-K of its largest load), so that it compiles once.
Writes `convergence.csv` (one row per case), `convergence.json` (metadata, rows, the spectra and the distance
curves for `plot.py`) and `summary.md` to `--out`.

    python experiments/convergence/compute.py [--quick] [--out DIR]
"""

import math
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt.published import published_equations  # noqa: E402


NAME = "convergence"
EXAMPLES = _common.REPO / "examples"

# Groups: (family label, spec (TOML table), the parameter varied and its values, whether it has a published ODE).
# The ranges are those of the papers' numerical sections: Mitzenmacher's table (d = 2, 3, 5; lam up to 0.99), Li &
# Lui's (d = 2, 3; lam in 0.5..0.95; Erlang-2, H2 of SCV 4, Coxian-2 of SCV 2), the framework paper's BMAP and
# batch-service examples over their loads, the retrial paper's lam in 0.05..0.9 (here 0.3 and 0.8, theta = 0.5: its example spec), the repairable-server
# models I-IV at their example parameters (lam 0.5 and 0.7 for model I), and the batch-arrival and class examples.
FULL = dict(
    starts=8, t_max=5000.0, n_times=400, seed=0,
    groups=[
        ("jsq", {"model": "jsq", "d": 2}, "lam", [0.5, 0.8, 0.9, 0.95, 0.99], True),
        ("jsq", {"model": "jsq", "d": 3}, "lam", [0.5, 0.8, 0.9, 0.95, 0.99], True),
        ("jsq", {"model": "jsq", "d": 5}, "lam", [0.5, 0.9, 0.99], True),
        ("jsq-ph", {"model": "jsq-ph", "d": 2, "service": {"kind": "erlang", "k": 2, "mean": 1.0}}, "lam",
         [0.5, 0.8, 0.9, 0.95], True),
        ("jsq-ph", {"model": "jsq-ph", "d": 2, "service": {"kind": "h2", "mean": 1.0, "scv": 4.0}}, "lam",
         [0.5, 0.8, 0.9, 0.95], True),
        ("jsq-ph", {"model": "jsq-ph", "d": 2, "service": {"kind": "coxian2", "mean": 1.0, "scv": 2.0}}, "lam",
         [0.5, 0.8, 0.9, 0.95], True),
        ("jsq-ph", {"model": "jsq-ph", "d": 3, "service": {"kind": "h2", "mean": 1.0, "scv": 4.0}}, "lam",
         [0.5, 0.9], True),
        ("jsq-bmap", "jsq_bmap.toml", "mu", [1.13, 0.8071428571428572, 0.7, 0.6277777777777778], True),
        ("jsq-batch-service", "jsq_batch_service.toml", "lam", [0.6, 1.2, 1.35], True),
        ("retrial", "retrial_reprobe.toml", "lam", [0.3, 0.8], False),
        ("repairable", "repairable_model_I.toml", "lam", [0.5, 0.7], False),
        ("repairable", "repairable_model_II.toml", "lam", [0.7], False),
        ("repairable", "repairable_model_III.toml", "lam", [0.7], False),
        ("repairable", "repairable_model_IV.toml", "lam", [0.7], False),
        ("jsq-batch", "jsq2_batch.toml", "batch_rate", [0.3, 0.6], False),
        ("jsq-classes", "jsq_classes.toml", None, [None], False),
    ],
)
QUICK = dict(FULL, starts=4, n_times=200, groups=[
    ("jsq", {"model": "jsq", "d": 2}, "lam", [0.5, 0.9], True),
    ("jsq-ph", {"model": "jsq-ph", "d": 2, "service": {"kind": "h2", "mean": 1.0, "scv": 4.0}}, "lam", [0.8], True),
    ("retrial", "retrial_reprobe.toml", "lam", [0.8], False),
])


def spec_of(spec) -> dict:
    """A group's spec as a TOML table (a file under examples/ is read)."""
    if isinstance(spec, str):
        import tomllib

        return tomllib.loads((EXAMPLES / spec).read_text())
    return dict(spec)


def group_models(spec, name, values) -> list:
    """The group's models at one truncation level: the auto-K of the largest load's fixed point."""
    table = spec_of(spec)
    models = [jsmkt.loads_spec(_toml(table), overrides=None if name is None else {name: v}) for v in values]
    if name == "mu":  # a larger mu is a smaller load: the deepest K is that of the smallest mu
        worst = int(np.argmin(values))
    else:
        worst = len(values) - 1 if name is not None else 0
    K = jsmkt.solve_fixed_point(models[worst], auto_K=True).model.K
    return [m.with_K(K) for m in models]


def _toml(table: dict) -> str:
    """A TOML table as text (`jsmkt.loads_spec` reads text)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines, tables = [], []
    for k, v in table.items():
        if isinstance(v, dict):
            tables.append(f"[{k}]\n" + "".join(f"{a} = {value(b)}\n" for a, b in v.items()))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            tables.extend(f"[[{k}]]\n" + "".join(f"{a} = {value(b)}\n" for a, b in item.items()) for item in v)
        else:
            lines.append(f"{k} = {value(v)}")
    return "\n".join(lines) + "\n\n" + "\n".join(tables)


def analyse(target, fp, p: dict, key) -> tuple[dict, dict]:
    """One case: `(row, curves)`."""
    t0 = time.perf_counter()
    st = jsmkt.stability(target, fp)
    search = jsmkt.find_fixed_points(target, p["starts"], key=key, tail_tol=max(1e-10, 10 * float(fp.tail_mass)))
    t1 = min(40.0 * st.relaxation_time, p["t_max"]) if math.isfinite(st.relaxation_time) else p["t_max"]
    conv = jsmkt.convergence(target, t1, fixed_point=fp, n_times=p["n_times"])
    row = {
        "K": target.K, "n_unknowns": int(st.jacobian.shape[0]),
        "n_fixed_points": search.n_fixed_points, "n_outside": len(search.outside), "n_failed": search.n_failed,
        "n_solves": 2 * search.n_starts,
        "fixed_point_in_state_space": bool(_inside(target, fp)),
        "verdicts_found": ",".join(q.stability.verdict for q in search.fixed_points),
        "verdict": st.verdict, "spectral_abscissa": st.spectral_abscissa, "tolerance": st.tolerance,
        "condition": st.condition, "relaxation_time": st.relaxation_time,
        "t1": t1, "fitted_rate": conv.fitted_rate, "rate_ratio": conv.rate_ratio,
        "bound_held": conv.bound_held, "bound_excess": conv.bound_excess, "bound_time": conv.bound_where[0],
        "bound_level": conv.bound_where[2], "tails_bound_held": conv.tails_bound_held,
        "tails_excess": conv.tails_excess, "seconds": time.perf_counter() - t0,
    }
    curves = {"eigenvalues": [[float(z.real), float(z.imag)] for z in st.eigenvalues],
              "ts": conv.ts.tolist(), "distance": conv.distance.tolist()}
    return row, curves


def _inside(model, fp) -> bool:
    x = np.asarray(model.occupancy(fp.value))
    return bool(np.all(x >= -1e-9))


def run(p: dict) -> tuple[list[dict], list[dict]]:
    rows, curves = [], []
    key = jax.random.key(p["seed"])
    for family, spec, name, values, published in p["groups"]:
        for model, value in zip(group_models(spec, name, values), values, strict=True):
            base = {"family": family, "spec": spec if isinstance(spec, str) else _label(spec), "parameter": name,
                    "value": value, "load": float(model.load())}
            fp = jsmkt.solve_fixed_point(model)
            variants = [("exact", model, fp)]
            if published:
                pub = published_equations(model)
                if pub is model:
                    base["published"] = "the exact ODE"
                else:
                    variants.append(("published", pub, jsmkt.solve_fixed_point(pub, tail_tol=1.0)))
            for variant, target, f in variants:
                key, sub = jax.random.split(key)
                row, curve = analyse(target, f, p, sub)
                rows.append({**base, "variant": variant, **row})
                curves.append({"family": family, "spec": base["spec"], "value": value, "variant": variant, **curve})
                print(f"{family:18s} {base['spec'][:28]:28s} {name}={value!s:8s} {variant:9s} K={row['K']:<4d} "
                      f"fixed points {row['n_fixed_points']} (+{row['n_outside']} outside)  {row['verdict']:8s} "
                      f"abscissa {row['spectral_abscissa']:.5g}  fitted {row['fitted_rate']:.5g} "
                      f"(ratio {row['rate_ratio']:.4f})  bound {'held' if row['bound_held'] else 'FAILED'}  "
                      f"{row['seconds']:.1f}s", flush=True)
    return rows, curves


def _label(spec: dict) -> str:
    parts = [f"d={spec['d']}"] if "d" in spec else []
    if "service" in spec:
        s = spec["service"]
        parts.append(s["kind"] + (f" k={s['k']}" if "k" in s else "") + (f" scv={s['scv']}" if "scv" in s else ""))
    return " ".join(parts)


def summary(rows: list[dict]) -> str:
    """A Markdown table per family and variant: what held over the cases."""
    out = ["| family | variant | cases | loads | fixed points found (inside / outside the state space) | verdicts "
           "| min. margin (abscissa / tolerance) | fitted rate / -abscissa | monotone bound (reduced state) | "
           "tails bound |", "|---|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        if (r["family"], r["variant"]) not in keys:
            keys.append((r["family"], r["variant"]))
    for fam, var in keys:
        rs = [r for r in rows if r["family"] == fam and r["variant"] == var]
        loads = [r["load"] for r in rs]
        inside = sorted({r["n_fixed_points"] for r in rs})
        outside = sorted({r["n_outside"] for r in rs})
        verdicts = sorted({r["verdict"] for r in rs})
        margin = min(abs(r["spectral_abscissa"]) / r["tolerance"] for r in rs)
        ratios = [r["rate_ratio"] for r in rs if math.isfinite(r["rate_ratio"])]
        ratio = f"{min(ratios):.4f} – {max(ratios):.4f}" if ratios else "no fit"
        if len(ratios) < len(rs):
            ratio += f" ({len(rs) - len(ratios)} without a fit)"
        held = sum(r["bound_held"] for r in rs)
        bound = f"held in {held}/{len(rs)}"
        if held < len(rs):
            worst = max(rs, key=lambda r: r["bound_excess"])
            bound += (f"; worst excess {worst['bound_excess']:.3g} at level {worst['bound_level']}, "
                      f"t = {worst['bound_time']:.3g} ({worst['parameter']} = {worst['value']})")
        theld = sum(r["tails_bound_held"] for r in rs)
        tails = f"held in {theld}/{len(rs)}"
        if theld < len(rs):
            tails += f"; worst excess {max(r['tails_excess'] for r in rs):.3g}"
        out.append(f"| {fam} | {var} | {len(rs)} | {min(loads):.3g} – {max(loads):.3g} | "
                   f"{'/'.join(map(str, inside))} / {'/'.join(map(str, outside))} | {', '.join(verdicts)} | "
                   f"{margin:.3g} | {ratio} | {bound} | {tails} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    p = QUICK if args.quick else FULL
    out = _common.output_dir(NAME, args.out, args.quick)
    meta = _common.run_metadata(NAME, {k: v for k, v in p.items()}, quick=args.quick)
    t0 = time.perf_counter()
    rows, curves = run(p)
    meta["seconds"] = time.perf_counter() - t0
    _common.write_csv(out / "convergence.csv", rows)
    _common.write_json(out / "convergence.json", {"metadata": meta, "rows": rows, "curves": curves})
    (out / "summary.md").write_text(summary(rows))
    print(summary(rows))
    print(f"wrote {out} in {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
