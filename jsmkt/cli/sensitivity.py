"""`jsmkt sensitivity`: derivatives and elasticities of a metric at the fixed point (`jsmkt.sensitivity`), printed
as 0 below a relative threshold (`_ZERO_DERIVATIVE`)."""

import json
import math
from typing import Any

from .output import _describe
from .plots import _check_plot_path, _fit_title, _save_figure
from .spec import SpecError, _build, _parse, family_of


_SERVICE_PARAMETRISATIONS = {"h2": "hyperexponential2", "coxian2": "coxian2"}  # [service] kinds with an scv key


def _service_parametrisation(spec: dict[str, Any]):
    """The two-moment constructor of the spec's `[service]` (its kind has `mean` and `scv` keys), else `None`."""
    import jsmkt

    service = spec.get("service")
    kind = service.get("kind") if isinstance(service, dict) else None
    return getattr(jsmkt, _SERVICE_PARAMETRISATIONS[kind]) if kind in _SERVICE_PARAMETRISATIONS else None


def _plot_elasticities(rows: list[dict[str, Any]], path: str, title: str, json_output: bool = False) -> None:
    def draw(fig):
        ax = fig.subplots()
        names = [r["name"] for r in rows][::-1]
        ax.barh(names, [r["elasticity"] for r in rows][::-1], color="0.35")
        ax.axvline(0.0, color="k", lw=0.8)
        ax.set_xlabel("elasticity (theta / M) dM/dtheta")
        ax.set_title(_fit_title(title, 5), fontsize=9)

    _save_figure(draw, path, figsize=(6, 1.3 + 0.35 * len(rows)), json_output=json_output)


def _cmd_sensitivity(args) -> int:
    import jsmkt

    parsed = _parse(args)
    spec = parsed.spec
    wrt = None
    if args.wrt is not None:
        wrt = [w.strip() for w in args.wrt.split(",")]
        if not all(wrt):
            raise SpecError(f"--wrt={args.wrt!r}: give parameter names separated by commas, e.g. --wrt lam,theta")
    if args.plot:
        _check_plot_path(args.plot)
    model = _build(parsed, args)
    service = _service_parametrisation(spec)
    if service is None and wrt is not None and "scv" in wrt and hasattr(model, "service"):
        raise SpecError(f"--wrt scv: the [service] of {args.spec} has no scv key; derivatives with respect to the "
                        f"SCV need kind = {' or '.join(map(repr, _SERVICE_PARAMETRISATIONS))} (the parametrisation "
                        "they are taken through)")
    s = jsmkt.sensitivity(model, args.metric, wrt, service=service)
    rows = s.rows()
    shown = _shown_derivative(float(s.value), [(r["value"], r["derivative"]) for r in rows])
    undefined = None if float(s.value) != 0.0 else f"{s.metric} is 0, where its elasticity (theta/M) dM/dtheta " \
        "is undefined"
    if args.plot:
        from ..plotting import model_title

        _plot_elasticities(rows, args.plot, f"{model_title(model)}\nelasticities of {s.metric}", args.format == "json")
    if args.format == "json":
        out = {"variant": "sensitivity", "model": type(model).__name__, **family_of(model).parameters(model),
               "K": model.K, **s.to_dict()}
        for p in out["parameters"].values():
            p["derivative"] = _map_lists(shown, p["value"], p["derivative"])
            p["elasticity"] = _map_lists(lambda e, g: None if not math.isfinite(e) else 0.0 if g == 0.0 else e,
                                         p["elasticity"], p["derivative"])
        if undefined:
            out["note"] = f"elasticity null: {undefined}"
        print(json.dumps(out, indent=2))
        return 0
    print(f"jsmkt sensitivity: derivatives of {s.metric} at the mean-field fixed point")
    print(_describe(model))
    print(f"  {s.metric} = {float(s.value):.10g}")
    print()
    width = max(12, max(len(r["name"]) for r in rows) + 2)
    header = f"d {s.metric} / d parameter"
    dwidth = max(28, len(header) + 2)
    print(f"  {'parameter':<{width}} {'value':<16} {header:<{dwidth}} elasticity")
    for r in rows:
        side = f" ({r['one_sided']})" if r["one_sided"] else ""
        g = shown(r["value"], r["derivative"])
        e = "-" if not math.isfinite(r["elasticity"]) else "0" if g == 0.0 else f"{r['elasticity']:.6g}"
        print(f"  {r['name']:<{width}} {r['value']:<16.10g} {format(g, '.10g') + side:<{dwidth}} {e}")
    if any(r["one_sided"] for r in rows):
        print("  (right)/(left): one-sided derivative, a choice number at an integer (the randomised rule is "
              "piecewise linear in d)")
    if undefined:
        print(f"  -: {undefined}")
    if any(shown(r["value"], r["derivative"]) != r["derivative"] for r in rows):
        print(f"  (0: |theta dM/dtheta| below {_ZERO_DERIVATIVE:g} of the metric's scale, rounding noise of a zero "
              "derivative; see --help)")
    return 0


# A derivative this small relative to the metric's scale is printed as 0 (see `_shown_derivative`).
_ZERO_DERIVATIVE = 1e-10
_SENSITIVITY_DESCRIPTION = (
    "Derivatives dM/dtheta and elasticities (theta/M) dM/dtheta of a metric M at the mean-field fixed point, by the "
    f"implicit function theorem. A derivative with |theta dM/dtheta| (|dM/dtheta| where theta = 0) below "
    f"{_ZERO_DERIVATIVE:g} times the larger of |M| and the largest such product over the parameters is printed as 0 "
    "(rounding noise of a derivative that is 0; the elasticity is then 0). Where M = 0 the elasticity is undefined: "
    "'-' in the table, null in the JSON, with a note.")


def _shown_derivative(value: float, entries: list[tuple[float, float]]):
    """`(theta, dM/dtheta) -> ` the derivative as `jsmkt sensitivity` prints it: 0 where |theta dM/dtheta| (|dM/dtheta|
    for theta = 0) is below `_ZERO_DERIVATIVE` times the scale max(|M|, that product's largest value over `entries`,
    the model's `(theta, dM/dtheta)`). The fixed point is solved to about 1e-11 relative, and a derivative that is 0
    (a metric that does not depend on the parameter, such as the availability on lam) comes out as rounding noise,
    1e-14 to 1e-18 of that scale; a -0 prints as 0."""
    def effect(theta, g):
        return abs(g) * (abs(theta) if theta != 0.0 else 1.0)

    finite = [effect(t, g) for t, g in entries if math.isfinite(t) and math.isfinite(g)]
    scale = max([abs(value)] + finite) if math.isfinite(value) else math.inf

    def shown(theta, g):
        return 0.0 if math.isfinite(g) and effect(theta, g) <= _ZERO_DERIVATIVE * scale else g

    return shown


def _map_lists(fn, a, b):
    """`fn` entry by entry over two nested lists of one shape (or two numbers); None passes through."""
    if isinstance(a, (list, tuple)):
        return [_map_lists(fn, x, y) for x, y in zip(a, b, strict=True)]
    return None if a is None or b is None else fn(a, b)


