r"""Capacity planning: the largest load, and the smallest choice number, that meet bounds on metrics.

A **bound** is `{name: value}`, read as *metric <= value*. A name is a scalar metric of jsmkt (`mean_sojourn_time`,
`mean_waiting_time`, `mean_queue_length`, `mean_number_waiting`, `prob_wait`, `utilisation`, `throughput`,
`probe_rate`), a named observable of the model's family (`mean_orbit_size`, `prob_blocked`, `availability`, ...), or
a percentile of the sojourn or waiting time of the mean field's tagged job (`jsmkt.sojourn_time_distribution`):
`sojourn_p99`, `sojourn_p99.9`, `waiting_p99`; `pNN` is short for `sojourn_pNN`.

**`max_load`** finds the largest value $\theta^*$ of a parameter that raises the load (`lam`, `service.mean`, ...)
at which every bound holds. With $m_i(\theta)$ the metric of bound $i$ and $b_i$ its value, it solves
$G(\theta) = \max_i\,(1 - b_i/m_i(\theta)) = 0$ by Newton's method: $G < 0$ exactly where every bound holds, and
the transform makes the commonest metrics near saturation linear in $\theta$ (M/M/1's $E[T] = 1/(\mu - \lambda)$
and p99 $= \ln 100/(\mu - \lambda)$ give $G = 1 - b(\mu - \lambda)/c$: Newton's first step lands on the root). The
derivative $dm_i/d\theta$ is exact: forward-mode differentiation through `jsmkt.solve_fixed_point` (implicit
function theorem) and through the quantile (its implicit derivative $-\partial\bar F/\bar F'$ at the root). Each
iterate first chooses its truncation: `solve_fixed_point(..., auto_K=True)` doubles `K` until the tail mass at `K`
is below `tail_tol`, and the metrics and their derivatives are then computed at that `K` (the largest `K` met so
far is kept, so that few shapes compile). The search is safeguarded (Numerical Recipes' `rtsafe`): a bracket
$[\theta_{lo}, \theta_{hi}]$ with every bound met at $\theta_{lo}$ (at first the value where the load is
$10^{-6}$) and one violated, or no solution, at $\theta_{hi}$ (at first the stability limit, where the load reaches
1); a Newton step that leaves the bracket, or that does not halve the step before last, is replaced by bisection.
It assumes what holds for the metrics above as functions of the load: each grows with $\theta$, so that the bounds
hold on an interval from zero load up to $\theta^*$.
The search ends at a Newton step below $10^{-11}$ of the stability limit (the answer is that iterate), at a bracket
that narrow around a root that bisection found (its lower end), or where the bracket closes on its upper end: within
$10^{-9}$ of the stability limit, every bound holds up to the limit (`binding = "stability"`); within $10^{-6}$ of a
point whose metrics cannot be computed (`K` beyond `max_K`, a percentile's law beyond `max_terms` steps), a
`ValueError` says up to where the bounds hold.

**`min_choice`** finds the smallest choice number among candidates that meets every bound at the spec's load, by
bisection on the sorted candidates (about $\log_2$ of their number solves), assuming that no metric grows with the
choice number (as for JSQ(d): more choice, shorter queues).
"""

import math
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._sojourn import MAX_TERMS


_GENERIC = ("mean_sojourn_time", "mean_waiting_time", "mean_queue_length", "mean_number_waiting", "prob_wait",
            "utilisation", "throughput", "probe_rate")
"""The scalar metrics of every family that bounds may name (the families' own are their observables)."""

_PROBABILITIES = frozenset({"prob_wait", "utilisation", "prob_blocked", "prob_retrial_success", "availability",
                            "customers_at_failed_servers", "repairmen_utilisation", "fraction_failed_waiting"})
"""Metrics that are probabilities or fractions: a bound of 1 or more on them holds at every load."""

_PERCENTILE = re.compile(r"^(?:(sojourn|waiting)_)?p(\d+(?:\.\d+)?)$")
_LOW_LOAD = 1e-6  # the load at the lower end of max_load's bracket: "zero load"
_XTOL = 1e-11  # max_load's tolerance on the parameter, relative to its stability limit
_SATURATION = 1e-9  # bounds that hold within this (relative) of the stability limit hold up to it
_UNSOLVED = 1e-6  # the bracket's width (relative) below which a point without a solution above ends the search
_MAX_ITERATIONS = 200


class Capacity(NamedTuple):
    r"""The answer of `jsmkt.max_load` or `jsmkt.min_choice`.

    **Attributes:**

    - `over`: the parameter searched (`"lam"`, `"d"`, ...).
    - `value`: `max_load`: the largest value of `over` at which every bound holds (the root where the binding bound
      holds with equality, to about $10^{-11}$ relative); where no bound binds below the stability limit, that limit
      itself (a supremum: the model is unstable there). `min_choice`: the smallest choice number (an `int`).
    - `binding`: the name of the bound that binds, as given: for `max_load` the bound that holds with equality at
      `value` (the one whose root is smallest), or `"stability"` when every bound holds up to the stability limit;
      for `min_choice` the bound that the candidate before `value` violates most (relative to its value), or `None`
      when the first candidate meets every bound.
    - `metrics`: name -> the bounded metric at `value` (NaN for `binding == "stability"`: the limit is unstable).
    - `bounds`: name -> the bound's value.
    - `limit`: `max_load`: the stability limit of `over` (where the load reaches 1); `None` for `min_choice`.
    - `K`: the truncation level at which the metrics at `value` were computed.
    """

    over: str
    value: float | int
    binding: str | None
    metrics: dict[str, float]
    bounds: dict[str, float]
    limit: float | None
    K: int

    def to_dict(self) -> dict[str, Any]:
        """The answer as JSON-ready values: `over`, `{over: value}`, `binding`, `metrics` (NaN as `None`),
        `bounds`, `limit`, `K`."""
        finite = lambda v: v if v is None or math.isfinite(v) else None  # noqa: E731
        return {"over": self.over, self.over: self.value, "binding": self.binding,
                "metrics": {k: finite(v) for k, v in self.metrics.items()}, "bounds": dict(self.bounds),
                "limit": self.limit, "K": self.K}


class _Bound(NamedTuple):
    name: str  # as given
    kind: str  # "metric", "observable", "sojourn time" or "waiting time"
    metric: str  # the metric's name, or the canonical percentile name (sojourn_p99)
    p: float | None  # the percentile's probability
    value: float


# --- reading the arguments -----------------------------------------------------------------------------------------


def _model_of(spec_or_model, where: str = "spec"):
    """`(model, table)`: the model of a spec file (`str`/`pathlib.Path`), of a TOML table (`dict`; its errors name
    `where`) or a model itself (`table` None)."""
    from ._models.base import AbstractSupermarketModel
    from ._spec import _model_from_table, read_spec_file

    if isinstance(spec_or_model, (str, pathlib.Path)):
        table = read_spec_file(str(spec_or_model))
        return _model_from_table(table, str(spec_or_model)), table
    if isinstance(spec_or_model, Mapping):
        table = dict(spec_or_model)
        return _model_from_table(table, where), table
    if isinstance(spec_or_model, AbstractSupermarketModel):
        return spec_or_model, None
    raise ValueError(f"spec_or_model={spec_or_model!r} is not a spec file (a path), a TOML table (a dict) or a jsmkt "
                     "model")


def bound_names(model) -> list[str]:
    """The scalar metric names a bound on `model` may use (the percentiles `sojourn_pNN`, `waiting_pNN`, `pNN`
    aside): the generic metrics and the family's observables."""
    return list(_GENERIC) + [n for n in model.observables() if n not in _GENERIC]


def _bounds(model, bound) -> tuple[_Bound, ...]:
    """The bounds `{name: value}`, checked: known names, each metric once, finite positive values."""
    if not isinstance(bound, Mapping) or not bound:
        raise ValueError(f"bound={bound!r} must be a non-empty mapping {{name: largest value}}, e.g. "
                         "{'p99': 20.0, 'mean_sojourn_time': 3.0}")
    valid = bound_names(model)
    observables = set(model.observables())
    out, seen = [], {}
    for name, value in bound.items():
        if not isinstance(name, str):
            raise ValueError(f"bound: the name {name!r} is not a string (a metric or a percentile such as 'p99')")
        m = _PERCENTILE.match(name)
        if m:
            q = float(m.group(2))
            if not 0.0 < q < 100.0 or q / 100.0 > 1.0 - 1e-12:
                raise ValueError(f"bound {name!r}: the percentile {m.group(2)} must lie in (0, 100) and leave 1e-12 "
                                 "above it (e.g. p99, p99.9)")
            kind = f"{m.group(1) or 'sojourn'} time"
            key = _Bound(name, kind, f"{m.group(1) or 'sojourn'}_p{m.group(2)}", q / 100.0, 0.0)
        elif name in valid:
            key = _Bound(name, "observable" if name in observables else "metric", name, None, 0.0)
        else:
            raise ValueError(f"bound {name!r} is not a metric of {type(model).__name__} models; give one of "
                             f"{', '.join(valid)}, or a percentile of the sojourn or waiting time: sojourn_p99, "
                             "waiting_p99, sojourn_p99.9 (p99 is short for sojourn_p99)")
        if key.metric in seen:
            raise ValueError(f"bound names {key.metric} twice ({seen[key.metric]!r} and {name!r})")
        seen[key.metric] = name
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"bound {name!r}={value!r} is not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"bound {name!r}={value!r} must be a positive finite number (the metric's largest "
                             "allowed value)")
        out.append(key._replace(value=v))
    return tuple(out)


def _parameter(model, over: str, what: str):
    """The named parameter `over` of `model` (a TOML path or an alias, `jsmkt._sensitivity.parameters_of`)."""
    from ._sensitivity import parameter_aliases, parameters_of

    if not isinstance(over, str):
        raise ValueError(f"over={over!r} must be a parameter's name (a TOML path such as 'lam' or 'd')")
    params = parameters_of(model)
    name = parameter_aliases(model).get(over, over)
    if name not in params:
        raise ValueError(f"over={over!r} is not a parameter of {type(model).__name__} models; {what} (its "
                         f"parameters: {', '.join(params)})")
    return name, params[name]


# --- one point: the metrics (and their derivatives in the parameter) ---------------------------------------------


def _evaluate(model, over: str | None, theta, x0, bounds: tuple[tuple[str, str, float | None], ...],
              max_terms: int):
    """The bounded metrics at `model` with parameter `over` set to `theta` (`over` None: `model` as it is),
    solved from `x0` (`throw=False`), and the fixed point's result code."""
    from . import _metrics
    from ._fixed_point import solve_fixed_point
    from ._sensitivity import parameters_of, with_parameter
    from ._sojourn import sojourn_time_distribution, waiting_time_distribution

    m = model if over is None else with_parameter(parameters_of(model)[over], model, theta)
    fp = solve_fixed_point(m, x0, throw=False)
    laws = {}
    values = []
    for kind, name, p in bounds:
        if kind == "metric":
            values.append(getattr(_metrics, name)(m, fp))
        elif kind == "observable":
            values.append(_metrics._observable(m, fp, name))
        else:
            if kind not in laws:
                law = sojourn_time_distribution if kind == "sojourn time" else waiting_time_distribution
                laws[kind] = law(m, fp, max_terms=max_terms)
            values.append(laws[kind].quantile(p))
    return jnp.stack([jnp.asarray(v, dtype=float) for v in values]), fp.result


_values = eqx.filter_jit(_evaluate)


@eqx.filter_jit
def _values_and_derivatives(model, over, theta, x0, bounds, max_terms):
    """`_evaluate` and the derivatives of its metrics in `theta` (forward mode: one tangent)."""
    return jax.jvp(lambda t: _evaluate(model, over, t, x0, bounds, max_terms), (theta,), (jnp.ones_like(theta),),
                   has_aux=True)


class _Point(NamedTuple):
    theta: float
    values: np.ndarray | None  # the bounded metrics (None: the point failed)
    derivatives: np.ndarray | None
    K: int
    failure: str | None  # why the metrics could not be computed


def _first_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    for line in lines:  # an error raised inside a compiled call: its message follows Equinox's preamble
        if line.startswith("equinox.EquinoxRuntimeError:") or line.startswith("EquinoxRuntimeError:"):
            return line.split(":", 1)[1].strip()
    return lines[0] if lines else type(e).__name__


def _point(model, over: str | None, theta: float | None, bounds: tuple[_Bound, ...], max_K: int, max_terms: int,
           derivative: bool, strict: bool) -> _Point:
    """The bounded metrics (and with `derivative` their derivatives in `over`) at `theta`, at the `K` that
    `solve_fixed_point(auto_K=True)` chooses from `model.K` up. A point whose fixed point or distribution cannot be
    computed (unstable, `K` beyond `max_K`, no convergence, too few uniformisation steps) raises with `strict`,
    else is returned with the reason in `failure`."""
    from ._fixed_point import solve_fixed_point
    from ._sensitivity import parameters_of, with_parameter
    from ._solution import RESULTS

    t = None if over is None else jnp.asarray(theta, dtype=float)
    m = model if over is None else with_parameter(parameters_of(model)[over], model, t)
    try:
        fp = solve_fixed_point(m, auto_K=True, max_K=max_K)
    except (ValueError, RuntimeError) as e:
        if strict:
            raise
        return _Point(theta, None, None, m.K, _first_line(e))
    mK = model.with_K(fp.model.K)
    spec = tuple((b.kind, b.metric, b.p) for b in bounds)
    try:
        if derivative:
            values, derivatives, result = _values_and_derivatives(mK, over, t, fp.value, spec, int(max_terms))
        else:
            (values, result), derivatives = _values(mK, over, t, fp.value, spec, int(max_terms)), None
    except RuntimeError as e:  # raised at run time inside the compiled call (e.g. too few uniformisation steps)
        if strict:
            raise ValueError(_first_line(e)) from None
        return _Point(theta, None, None, mK.K, _first_line(e))
    if result != RESULTS.successful:
        message = f"the fixed-point solve failed ({RESULTS[result]})"
        if strict:
            raise RuntimeError(message)
        return _Point(theta, None, None, mK.K, message)
    values = np.asarray(values, dtype=float)
    derivatives = None if derivatives is None else np.asarray(derivatives, dtype=float)
    if not np.all(np.isfinite(values)) or (derivatives is not None and not np.all(np.isfinite(derivatives))):
        bad = [b.name for b, v in zip(bounds, values, strict=True) if not math.isfinite(v)]
        message = f"the metric{'s' if len(bad) != 1 else ''} {', '.join(bad) or 'derivatives'} came out non-finite"
        if strict:
            raise RuntimeError(message)
        return _Point(theta, None, None, mK.K, message)
    return _Point(theta, values, derivatives, mK.K, None)


def _excess(point: _Point, bounds: tuple[_Bound, ...], active: np.ndarray) -> tuple[float, float, int]:
    """`(G, dG/dtheta, i)` at a point: $G = \\max_i (1 - b_i/m_i)$ over the `active` bounds (a metric <= 0 meets
    its bound: $-\\infty$), its derivative $b_i m_i'/m_i^2$ and the bound $i$ attaining the maximum."""
    best, slope, arg = -math.inf, 0.0, -1
    for i, b in enumerate(bounds):
        if not active[i]:
            continue
        m = float(point.values[i])
        g = 1.0 - b.value / m if m > 0 else -math.inf
        if arg < 0 or g > best:
            dm = 0.0 if point.derivatives is None else float(point.derivatives[i])
            best, slope, arg = g, (b.value * dm / (m * m) if m > 0 else 0.0), i
    return best, slope, arg


def _violation(point: _Point, bounds: tuple[_Bound, ...]) -> tuple[float, int]:
    """The largest relative excess $m_i/b_i - 1$ over the bounds and its bound."""
    r = [float(v) / b.value - 1.0 for v, b in zip(point.values, bounds, strict=True)]
    i = int(np.argmax(r))
    return r[i], i


def _metrics_dict(point: _Point | None, bounds: tuple[_Bound, ...]) -> dict[str, float]:
    if point is None or point.values is None:
        return {b.name: math.nan for b in bounds}
    return {b.name: float(v) for b, v in zip(bounds, point.values, strict=True)}


def _shown(bounds: tuple[_Bound, ...]) -> str:
    return ", ".join(f"{b.name} <= {b.value:g}" for b in bounds)


def _check_limits(max_K, max_terms) -> None:
    if isinstance(max_K, bool) or not isinstance(max_K, (int, np.integer)) or max_K < 2:
        raise ValueError(f"max_K={max_K!r} must be an integer >= 2 (the largest truncation level tried)")
    if isinstance(max_terms, bool) or not isinstance(max_terms, (int, np.integer)) or max_terms < 64:
        raise ValueError(f"max_terms={max_terms!r} must be an integer >= 64 (the most uniformisation steps of a "
                         "percentile's law)")


# --- the stability limit -------------------------------------------------------------------------------------------


def _load_root(model, p, over: str, theta0: float, target: float) -> float:
    """The value of `over` at which the load is `target`, by Newton's method on the load (exact in one step where
    the load is linear in the parameter, as in `lam` and `service.mean`); `ValueError` where the load does not grow
    with the parameter."""
    from ._sensitivity import with_parameter

    def load(t):
        return with_parameter(p, model, t).load()

    t = float(theta0)
    for _ in range(100):
        L, dL = jax.jvp(load, (jnp.asarray(t),), (jnp.asarray(1.0),))
        L, dL = float(L), float(dL)
        if not (math.isfinite(L) and math.isfinite(dL) and dL > 0):
            raise ValueError(f"over={over!r}: the load does not grow with {over} (load {L:.6g}, d load / d {over} = "
                             f"{dL:.6g} at {over}={t:.6g}); max_load searches a parameter that raises the load (the "
                             "arrival rate lam, service.mean, ...); for the choice number use min_choice")
        step = (L - target) / dL
        new = t - step
        if new <= 0:
            new = t / 16
        if abs(new - t) <= 4e-16 * abs(t):
            return new
        t = new
    raise ValueError(f"over={over!r}: the load does not reach {target:g} as {over} grows (Newton's method on the "
                     f"load did not converge); max_load searches a parameter that raises the load")


# --- max_load ------------------------------------------------------------------------------------------------------


def max_load(spec_or_model, bound: Mapping[str, float], *, over: str = "lam", max_K: int = 4096,
             max_terms: int = MAX_TERMS) -> Capacity:
    r"""The largest value of a parameter (by default the arrival rate `lam`) at which every bound holds.

    Newton's method on the differentiable metrics (module `jsmkt._capacity`): each iterate solves the fixed point
    at the truncation `K` that `jsmkt.solve_fixed_point(..., auto_K=True)` chooses, differentiates the metrics
    there (implicitly: no finite differences), and steps on $G(\theta) = \max_i(1 - b_i/m_i(\theta))$, safeguarded
    by bisection within the bracket from zero load to the stability limit. A few iterates suffice; d = 1 near
    saturation too (K in the thousands).

    **Arguments:**

    - `spec_or_model`: a spec file (a path, read as `jsmkt.load_spec` reads it), a TOML table (a `dict`, as
      `jsmkt.loads_spec` reads one) or a model. Its value of `over` is Newton's first iterate (when below the
      stability limit); its other parameters stay as they are.
    - `bound`: `{name: largest value}`: scalar metrics (`mean_sojourn_time`, `mean_waiting_time`, `prob_wait`,
      `mean_queue_length`, `utilisation`, ...; the family's observables, e.g. `mean_orbit_size`) and percentiles
      of the sojourn or waiting time (`sojourn_p99`, `waiting_p99`, `sojourn_p99.9`; `p99` is short for
      `sojourn_p99`). Every value must be positive. A bound of 1 or more on a probability (`prob_wait`,
      `utilisation`, ...) holds at every load.
    - `over`: the parameter searched, by its TOML path (`lam`, `service.mean`, `batch_rate`, ...): a real scalar
      that the load grows with.
    - `max_K`: the largest truncation level an iterate may use.
    - `max_terms`: the most uniformisation steps of a percentile's law (`jsmkt.sojourn_time_distribution`).

    **Returns:** a `jsmkt.Capacity`: `value` the largest `over`, `binding` the bound that holds with equality there
    (`"stability"`, with `value` the stability limit, where every bound holds up to within $10^{-9}$ of it),
    `metrics` the bounded metrics at `value`.

    **Raises:** `ValueError` for an unknown bound or parameter, a parameter that does not raise the load, a bound
    already violated at zero load (load $10^{-6}$), or bounds that hold up to loads whose metrics cannot be
    computed (`K` beyond `max_K`, a sojourn-time tail longer than the uniformisation allows): the message says up
    to where they hold. `RuntimeError` if the search does not converge.

    !!! example

        ```python
        cap = jsmkt.max_load(jsmkt.JSQd(0.5, d=1), {"p99": 20.0, "mean_sojourn_time": 4.0})
        cap.value, cap.binding    # 0.75 (= 1 - 1/4, M/M/1's E[T] = 1/(1 - lam)), 'mean_sojourn_time'
        ```
    """
    model, _ = _model_of(spec_or_model)
    bounds = _bounds(model, bound)
    name, p = _parameter(model, over, "max_load searches a real parameter that raises the load, such as lam")
    from ._sensitivity import parameter_value

    value = parameter_value(p, model)
    if isinstance(value, tuple) or np.ndim(value) != 0 or p.kind not in ("real", "service mean"):
        raise ValueError(f"over={over!r} is not a real scalar parameter of {type(model).__name__} models; max_load "
                         "searches one number that raises the load (lam, service.mean, ...)"
                         + ("; for the choice number use min_choice" if p.kind == "choice" else ""))
    _check_limits(max_K, max_terms)
    theta0 = float(value)
    limit = _load_root(model, p, over, theta0, 1.0)
    lo_theta = _load_root(model, p, over, limit, _LOW_LOAD)
    active = np.array([not (b.metric in _PROBABILITIES and b.value >= 1.0) for b in bounds])
    xtol = _XTOL * limit
    K = model.K

    def at(theta: float, strict: bool = False) -> _Point:
        nonlocal K
        pt = _point(model.with_K(K), name, theta, bounds, max_K, max_terms, True, strict)
        K = max(K, pt.K)
        return pt

    def answer(value: float, binding: str, pt: _Point | None) -> Capacity:
        return Capacity(over, value, binding, _metrics_dict(pt, bounds), {b.name: b.value for b in bounds}, limit,
                        pt.K if pt is not None else K)

    lo = at(lo_theta, strict=True)
    G_lo, _, i_lo = _excess(lo, bounds, active)
    if G_lo > 0:
        b = bounds[i_lo]
        raise ValueError(f"the bound {b.name} <= {b.value:g} is not met even at zero load ({over}={lo_theta:.6g}, "
                         f"load {_LOW_LOAD:g}): {b.name} is {float(lo.values[i_lo]):.6g} there; no {over} meets it")
    if not active.any():
        return answer(limit, "stability", None)

    hi_theta, hi_why = limit, None  # hi: a violated bound, or no solution (`hi_why`; None at the limit: unstable)
    hi_point: _Point | None = None
    x = theta0 if lo_theta < theta0 < limit else 0.5 * (lo_theta + limit)
    dx_old = dx = limit - lo_theta
    for _ in range(_MAX_ITERATIONS):
        pt = at(x)
        if pt.failure is not None:
            hi_theta, hi_why, hi_point = x, pt.failure, None
            newton = math.nan
        else:
            G, dG, _ = _excess(pt, bounds, active)
            if G <= 0:
                lo = pt
            else:
                hi_theta, hi_why, hi_point = x, None, pt
            newton = x - G / dG if dG > 0 and math.isfinite(G) else math.nan
            if math.isfinite(newton) and abs(newton - x) <= xtol:
                return answer(x, bounds[_excess(pt, bounds, active)[2]].name, pt)
        inside = lo.theta < newton < hi_theta and abs(2 * (newton - x)) <= abs(dx_old)
        dx_old, dx = dx, (newton - x if inside else 0.5 * (lo.theta + hi_theta) - x)
        x = x + dx
        # A bracket this narrow ends the search: at a root (`hi_point`, a violated bound), or else (the stability
        # limit, or a point without a solution, above) at the largest load where the metrics can be trusted.
        width = xtol if hi_point is not None else _SATURATION * limit if hi_why is None else _UNSOLVED * limit
        if hi_theta - lo.theta <= width or not lo.theta < x < hi_theta:
            break
    else:
        raise RuntimeError(f"max_load did not converge in {_MAX_ITERATIONS} iterates ({over} in [{lo.theta:.12g}, "
                           f"{hi_theta:.12g}])")
    if hi_point is not None:  # a root found by bisection: the bound violated just above it binds
        return answer(lo.theta, bounds[_excess(hi_point, bounds, active)[2]].name, lo)
    if hi_why is None or limit - lo.theta <= _SATURATION * limit:
        return answer(limit, "stability", None)
    raise ValueError(f"every bound ({_shown(bounds)}) holds up to {over}={lo.theta:.10g} (load "
                     f"{lo.theta / limit:.10g} of the stability limit {over}={limit:.10g}), but above it the metrics "
                     f"cannot be computed: {hi_why}")


# --- min_choice ----------------------------------------------------------------------------------------------------


def _candidates(candidates) -> list[int]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise ValueError(f"candidates={candidates!r} must be a collection of choice numbers (integers >= 1), e.g. "
                         "range(1, 11)")
    out = list(candidates)
    bad = [c for c in out if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1]
    if not out or bad:
        raise ValueError(f"candidates={candidates!r} must be integers >= 1 (choice numbers), at least one; "
                         f"{bad[0]!r} is not" if bad else f"candidates={candidates!r} is empty; give choice numbers "
                         "such as range(1, 11)")
    return sorted({int(c) for c in out})


def min_choice(spec_or_model, bound: Mapping[str, float], *, over: str = "d", candidates=range(1, 11),
               max_K: int = 4096, max_terms: int = MAX_TERMS) -> Capacity:
    r"""The smallest choice number among `candidates` at which every bound holds, at the model's load.

    Bisection on the sorted candidates: the largest is solved first (if it fails every smaller one does too), then
    about $\log_2$ of their number; it assumes that no bounded metric grows with the choice number (as for JSQ(d)).
    Each candidate is a fixed integer choice number, solved at the `K` that `auto_K` chooses (a spec is rebuilt
    with it, so that its default `K` is that of the candidate).

    **Arguments:**

    - `spec_or_model`: a spec file (a path), a TOML table (a `dict`) or a model.
    - `bound`: `{name: largest value}`, as for `jsmkt.max_load`.
    - `over`: the choice-number parameter, by its TOML path (`d`; `d1`, `d2` of the retrial family; a choice law
      shared by every arrival).
    - `candidates`: the choice numbers tried (integers >= 1).
    - `max_K`: the largest truncation level a solve may use.
    - `max_terms`: the most uniformisation steps of a percentile's law (`jsmkt.sojourn_time_distribution`).

    **Returns:** a `jsmkt.Capacity` with `value` the smallest candidate that meets every bound (an `int`),
    `binding` the bound that the candidate before it violates (most, relative to its value; `None` when `value` is
    the smallest candidate), `metrics` the bounded metrics at `value`.

    **Raises:** `ValueError` for an unknown bound or parameter, an unstable load, or when no candidate meets the
    bounds (the message gives the metrics at the largest).

    !!! example

        ```python
        cap = jsmkt.min_choice(jsmkt.JSQd(0.9, d=1), {"mean_sojourn_time": 3.0})
        cap.value, cap.binding    # 2 (E[T] is 10 at d = 1, 2.61 at d = 2), 'mean_sojourn_time'
        ```
    """
    import equinox as eqx

    from ._choice import FixedChoice
    from ._spec import _model_from_table, apply_overrides

    model, table = _model_of(spec_or_model)
    bounds = _bounds(model, bound)
    name, p = _parameter(model, over, "min_choice searches a choice number such as d")
    if p.kind != "choice" or isinstance(p.where(model), tuple):
        raise ValueError(f"over={over!r} is not a choice number of {type(model).__name__} models (one choice law); "
                         "min_choice searches one, such as d" + ("; for a rate use max_load" if p.kind == "real"
                                                                 else ""))
    cands = _candidates(candidates)
    _check_limits(max_K, max_terms)
    model.check_values()  # an unstable load is refused here, once, whatever the candidates
    points: dict[int, _Point] = {}

    def at(c: int) -> _Point:
        if c not in points:
            if table is not None:
                mc = _model_from_table(apply_overrides(table, {over: c}), f"spec with {over}={c}")
            else:
                mc = eqx.tree_at(p.where, model, FixedChoice(c))
            try:
                points[c] = _point(mc, None, None, bounds, max_K, max_terms, False, True)
            except (ValueError, RuntimeError) as e:
                raise type(e)(f"at {over}={c}: {_first_line(e)}") from None
        return points[c]

    def meets(pt: _Point) -> bool:
        return _violation(pt, bounds)[0] <= 0.0

    last = at(cands[-1])
    if not meets(last):
        r, i = _violation(last, bounds)
        b = bounds[i]
        raise ValueError(f"no {over} among {', '.join(map(str, cands))} meets {_shown(bounds)}: at {over}="
                         f"{cands[-1]}, {b.name} is {float(last.values[i]):.6g}")
    lo, hi = -1, len(cands) - 1  # cands[hi] meets the bounds; cands[lo] does not (lo = -1: none below)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(at(cands[mid])):
            hi = mid
        else:
            lo = mid
    pt = points[cands[hi]]
    binding = None if lo < 0 else bounds[_violation(points[cands[lo]], bounds)[1]].name
    return Capacity(over, cands[hi], binding, _metrics_dict(pt, bounds), {b.name: b.value for b in bounds}, None,
                    pt.K)
