"""`jsmkt stability`: the local stability of a spec's fixed point (`jsmkt.stability`: the spectral abscissa of the
drift's Jacobian, the relaxation time, the verdict) and the distinct fixed points a multi-start search finds
(`jsmkt.find_fixed_points`), of the exact mean field or, with `--as-published`, of the papers' ODE
(`jsmkt.published.published_equations`), at the K that `solving.fixed_point` chooses for the exact mean field."""

import json
import math
from typing import Any

from .output import _describe, _trim
from .solving import _grown_by, fixed_point
from .spec import SpecError, _build, _parse, family_of


_DEFAULT_STARTS = 32
_LEADING = 6  # eigenvalues of largest real part shown


def add_parser(sub, common) -> None:
    a = sub.add_parser("stability", parents=[common],
                       help="local stability of the fixed point of a model spec (TOML), and a search for other fixed "
                            "points",
                       description="The spectral abscissa (largest real part of an eigenvalue) of the Jacobian of the "
                                   "mean-field drift at the fixed point, in the reduced coordinates, the relaxation "
                                   "time -1/abscissa and a verdict (stable, unstable or inconclusive: the abscissa "
                                   "within its rounding tolerance of 0); then the distinct fixed points found from "
                                   "random starts, the empty and the full system, each integrated to a steady state "
                                   "and polished by Newton, and solved by Newton directly.")
    a.add_argument("spec", help="TOML model specification (see examples/)")
    a.add_argument("--starts", type=int, default=_DEFAULT_STARTS, metavar="N",
                   help=f"random starts of the search for fixed points (the empty and the full system are added; "
                        f"0: those two only; default: {_DEFAULT_STARTS})")
    a.add_argument("--seed", type=int, default=0, help="random seed of the starts (default: 0)")
    a.add_argument("--as-published", action="store_true",
                   help="the papers' ODE as published (jsmkt.published.published_equations) instead of the exact "
                        "mean field")
    a.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    a.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    a.set_defaults(func=_cmd_stability)


def _number(x: float) -> float | None:
    """A float for JSON: None for inf or NaN (an unstable fixed point has no relaxation time)."""
    return float(x) if math.isfinite(x) else None


def _stability_dict(st) -> dict[str, Any]:
    return {"spectral_abscissa": float(st.spectral_abscissa), "relaxation_time": _number(st.relaxation_time),
            "verdict": st.verdict, "tolerance": float(st.tolerance), "margin": _number(st.margin)}


def _point(p) -> dict[str, Any]:
    """A fixed point (or a root outside the state space) found by the search, for the output."""
    import numpy as np

    # Inside the state space the tails are probabilities, clipped at 0 as `jsmkt solve` prints them; a root outside
    # it keeps its signs.
    tail = np.maximum(p.tails, 0.0) if p.min_occupancy >= 0 else np.asarray(p.tails)
    return {**_stability_dict(p.stability), "mean_queue_length": float(np.sum(p.tails[1:])),
            "tail": [float(v) for v in tail[:len(_trim(np.abs(tail)))]],
            "min_occupancy": float(p.min_occupancy), "hits": p.hits, "by_ode": p.by_ode, "by_newton": p.by_newton}


def _cmd_stability(args) -> int:
    parsed = _parse(args)
    if args.starts < 0:
        raise SpecError(f"--starts={args.starts} must be >= 0 (random starts; the empty and the full system are "
                        "always tried)")
    if args.as_published and not parsed.family.published:
        raise SpecError(f"--as-published: model = {parsed.family.name!r} has no published form in jsmkt; run it "
                        "without --as-published (the exact mean field)")
    model = _build(parsed, args)
    import jax
    import numpy as np

    import jsmkt

    fp = fixed_point(model, _grown_by(args, parsed.K_given))  # the exact mean field's, at the K chosen
    model = fp.model
    target, tail_tol = model, None
    if args.as_published:
        from ..published import published_equations

        target = published_equations(model)
        if target is not model:
            # The published equations at the exact model's K; their own tail at K is reported, not judged.
            fp = jsmkt.solve_fixed_point(target, tail_tol=1.0)
            tail_tol = max(_tail_tol(), 10.0 * float(fp.tail_mass))
    st = jsmkt.stability(target, fp)
    search = jsmkt.find_fixed_points(target, args.starts, key=jax.random.key(args.seed), tail_tol=tail_tol)
    order = np.argsort(-st.eigenvalues.real, kind="stable")[:_LEADING]
    out = {
        "variant": "as-published" if args.as_published else "exact",
        "model": type(model).__name__,
        "lam": float(model.arrival_rate),
        **family_of(model).parameters(model),
        "K": model.K,
        **_stability_dict(st),
        "condition": float(st.condition),
        "leading_eigenvalues": [[float(z.real), float(z.imag)] for z in st.eigenvalues[order]],
        "tail_mass_at_K": float(fp.tail_mass),
        "min_occupancy": float(np.min(np.asarray(target.occupancy(fp.value)))),
        "n_fixed_points": search.n_fixed_points,
        "starts": search.n_starts,
        "failed_solves": search.n_failed,
        "fixed_points": [_point(p) for p in search.fixed_points],
        "roots_outside_state_space": [_point(p) for p in search.outside],
    }
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        title = "jsmkt stability: " + ("as published" if args.as_published else "exact mean field")
        _print_stability(out, title + "\n" + _describe(model))
    return 0


def _tail_tol() -> float:
    import inspect

    import jsmkt

    return inspect.signature(jsmkt.solve_fixed_point).parameters["tail_tol"].default


def _time(x: float | None) -> str:
    return "inf (not stable)" if x is None else f"{x:.6g}"


def _print_stability(out: dict[str, Any], header: str) -> None:
    print(header)
    print("  the Jacobian of the drift at the fixed point, in the reduced coordinates (total mass eliminated):")
    print(f"  spectral abscissa  {out['spectral_abscissa']:.10g}   (tolerance {out['tolerance']:.3g}, "
          f"eigenvalue condition {out['condition']:.3g})")
    print(f"  relaxation time    {_time(out['relaxation_time'])}")
    print(f"  verdict            {out['verdict']}" + (f" (margin {out['margin']:.3g} tolerances)"
                                                       if out["margin"] is not None else ""))
    if out["min_occupancy"] < -1e-9:
        print(f"  note: this fixed point lies outside the state space (an occupancy of {out['min_occupancy']:.3g}): "
              "it is no distribution of servers")
    eig = ", ".join(f"{re:.6g}" + (f"{im:+.6g}i" if im else "") for re, im in out["leading_eigenvalues"])
    print(f"  leading eigenvalues: {eig}")
    print(f"  fixed points found: {out['n_fixed_points']} from {out['starts']} starts, each integrated then polished "
          f"by Newton and solved by Newton directly ({out['failed_solves']} solves failed)")
    rows = [(str(i), p) for i, p in enumerate(out["fixed_points"], 1)]
    rows += [("out", p) for p in out["roots_outside_state_space"]]
    if out["roots_outside_state_space"]:
        print(f"  and {len(out['roots_outside_state_space'])} roots of the drift outside the state space (a negative "
              "occupancy: not states of the model), marked 'out'")
    print(f"  {'#':>3}  {'E[Q]':>12}  {'s_1':>12}  {'min occupancy':>14}  {'abscissa':>14}  {'verdict':>12}  "
          f"{'hits':>5}")
    for name, p in rows:
        s1 = p["tail"][1] if len(p["tail"]) > 1 else 0.0
        print(f"  {name:>3}  {p['mean_queue_length']:>12.6g}  {s1:>12.6g}  {p['min_occupancy']:>14.3g}  "
              f"{p['spectral_abscissa']:>14.6g}  {p['verdict']:>12}  {p['hits']:>5}")
