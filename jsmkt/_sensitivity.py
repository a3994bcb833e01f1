r"""Sensitivity analysis: derivatives and elasticities of a metric at the fixed point with respect to a family's
named parameters.

A family's parameters are named in its table (`table` of the family's class, `jsmkt._models.parameters`), by their
TOML paths (`lam`, `service.mean`, `classes.lam`; older short names such as `mean` are aliases): each names the
model field it sets and how a value reads (`jsmkt._models.parameters.NamedParameter`). This module reads and writes them
(`parameter_value`, `with_parameter`), which is all that `jsmkt.sensitivity` and the optimisation helpers need:
a model is rebuilt with `eqx.tree_at`, so its truncation `K`, its static structure (e.g. R.3's regime) and its other
parameters stay as they are, and the derivatives go through the fixed point by the implicit function theorem.
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._choice import AbstractChoice, FixedChoice, InterpolatedChoice, MixedChoice
from ._distributions.ph import PH
from ._solution import RESULTS


METRICS = (
    "mean_sojourn_time", "mean_queue_length", "mean_waiting_time", "mean_number_waiting", "prob_wait", "utilisation",
    "throughput", "tail_mass_at_K", "probe_rate", "mean_orbit_size", "prob_blocked", "prob_retrial_success",
    "mean_sojourn_time_tagged", "availability", "customers_at_failed_servers", "repairmen_utilisation",
    "fraction_failed_waiting",
)


def metric_function(metric) -> tuple[Callable, str]:
    """`(fn, name)` for a metric given by name (one of `METRICS`, the scalar metrics of `jsmkt`) or as a function
    `(model, fixed_point) -> scalar`."""
    from . import _metrics

    if isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(f"metric={metric!r} is not a metric jsmkt knows; give one of {', '.join(METRICS)}, or a "
                             "function (model, fixed_point) -> scalar")
        return getattr(_metrics, metric), metric
    if not callable(metric):
        raise ValueError(f"metric={metric!r} must be a metric name ({', '.join(METRICS[:3])}, ...) or a function "
                         "(model, fixed_point) -> scalar")
    return metric, getattr(metric, "__name__", "metric")


# --- reading and writing named parameters -------------------------------------------------------------------------


def _choice_value(c: AbstractChoice, name: str) -> Array:
    if isinstance(c, FixedChoice):
        return jnp.asarray(float(c.d))
    if isinstance(c, InterpolatedChoice):
        return c.d
    if isinstance(c, MixedChoice):
        return c.probs
    raise ValueError(f"{name}: a choice rule of type {type(c).__name__} has no named value; use FixedChoice, "
                     "InterpolatedChoice or MixedChoice")


def _choice_with(c: AbstractChoice, v) -> AbstractChoice:
    if isinstance(c, FixedChoice):  # the integer d as the real d of the randomised rule: a right derivative
        return InterpolatedChoice(v, d_max=c.d + 1)
    if isinstance(c, InterpolatedChoice):
        return InterpolatedChoice(v, d_max=c.d_max)
    return MixedChoice(v)


def _tuple_map(fn, x):
    return tuple(fn(v) for v in x) if isinstance(x, tuple) else fn(x)


class _ServiceParameter:
    """`mean` and `scv` of the service through a two-moment parametrisation `service(mean, scv) -> PH`."""

    def __init__(self, which: str, service: Callable, mean: float, scv: float):
        self.which, self.service, self.mean, self.scv = which, service, mean, scv
        self.kind = "service " + which
        self.doc = f"service {'mean' if which == 'mean' else 'SCV'} (through {getattr(service, '__name__', service)})"

    def where(self, model):
        return model.service


def _table(model):
    """The table of `model`'s family; `ValueError` for a model that is no registered family."""
    from ._models.parameters import family_names, table_of

    table = table_of(type(model))
    if table is None:
        raise ValueError(f"{type(model).__name__} is not a registered model family ({', '.join(family_names())})")
    return table


def parameter_aliases(model) -> dict[str, str]:
    """Other names of `model`'s named parameters (`mean` for `service.mean`), to their TOML paths."""
    from ._models.parameters import sensitivity_parameters

    return sensitivity_parameters(_table(model))[1]


def parameters_of(model, service: Callable | None = None) -> dict[str, Any]:
    """The named parameters of `model` (its family's table's, by TOML path, less those it lacks, such as `j` outside
    R.3), with the service's `service.mean` and `service.scv` through `service(mean, scv) -> PH` when given
    (checked to give the model's service at its mean and SCV)."""
    from ._models.parameters import sensitivity_parameters

    out = {}
    for name, p in sensitivity_parameters(_table(model))[0].items():
        x = p.where(model)
        leaves = x if isinstance(x, tuple) else (x,)
        if x is None or not leaves or any(getattr(v, "size", 1) == 0 for v in leaves):
            continue
        out[name] = p
    if service is not None:
        if "service.mean" not in out:
            raise ValueError(f"service={getattr(service, '__name__', service)!r}: {type(model).__name__} has no PH "
                             "service to parametrise (its service rate is a parameter of its own, e.g. mu)")
        if not callable(service):
            raise ValueError(f"service={service!r} must be a function (mean, scv) -> jsmkt.PH, e.g. "
                             "jsmkt.hyperexponential2 or jsmkt.coxian2")
        S = model.service
        mean, scv = float(S.mean), float(S.scv)
        built = service(mean, scv)
        x = np.array([0.25, 0.5, 1.0, 2.0, 4.0]) * mean
        same = isinstance(built, PH) and np.allclose(np.asarray(built.moments(3)), np.asarray(S.moments(3)),
                                                     rtol=1e-9) and np.allclose(built.cdf(x), S.cdf(x), rtol=1e-9,
                                                                                atol=1e-12)
        if not same:
            raise ValueError(f"service={getattr(service, '__name__', service)}(mean={mean:.10g}, scv={scv:.10g}) is "
                             "not the model's service distribution; give the parametrisation the service was built "
                             "with (e.g. jsmkt.hyperexponential2 for an h2 service)")
        out["service.mean"] = _ServiceParameter("mean", service, mean, scv)
        out["service.scv"] = _ServiceParameter("scv", service, mean, scv)
    return out


def parameter_value(p, model):
    """The value of parameter `p` in `model`: an array, or a tuple of arrays (one per class or helper pool)."""
    x = p.where(model)
    if p.kind == "choice":
        return _tuple_map(lambda c: _choice_value(c, "choice"), x)
    if p.kind == "service mean":
        return x.mean
    if p.kind == "service scv":
        return x.scv
    if p.kind == "bmap rates":
        return jnp.concatenate([jnp.where(jnp.eye(x.order) > 0, 0.0, x.C)[None], x.D])
    return _tuple_map(jnp.asarray, x)


def with_parameter(p, model, value):
    """`model` with parameter `p` set to `value` (traced values allowed); everything else unchanged."""
    where = p.where
    if isinstance(p, _ServiceParameter):
        S = where(model)  # the other moment from the model's current service: mean and scv compose
        S = p.service(value, S.scv) if p.which == "mean" else p.service(S.mean, value)
        return eqx.tree_at(where, model, S)
    if p.kind == "choice":
        old = where(model)
        new = tuple(_choice_with(c, v) for c, v in zip(old, value, strict=True)) if isinstance(old, tuple) \
            else _choice_with(old, value)
        return eqx.tree_at(where, model, new)
    if p.kind == "service mean":
        S = where(model)
        return eqx.tree_at(where, model, PH(S.alpha, S.T * (S.mean / value)))
    if p.kind == "bmap rates":  # [0]: C off its diagonal, [b]: D[b - 1]; C's diagonal makes C + sum D a generator
        value = jnp.asarray(value, dtype=float)
        off = value[0] * (1.0 - jnp.eye(value.shape[-1]))
        D = value[1:]
        C = off - jnp.diag(jnp.sum(off, axis=1) + jnp.sum(D, axis=(0, 2)))
        return eqx.tree_at(lambda m: (where(m).C, where(m).D), model, (C, D))
    value = _tuple_map(lambda v: jnp.asarray(v, dtype=float), value)
    return eqx.tree_at(where, model, value)


def simplex_leaves(p, model) -> Any:
    """Per leaf of the parameter's value: whether it is a probability vector (its derivatives are taken along
    directions that keep the sum)."""
    x = p.where(model)
    if p.kind == "probabilities":
        return _tuple_map(lambda _: True, x)
    if p.kind == "choice":
        return _tuple_map(lambda c: isinstance(c, MixedChoice), x)
    return _tuple_map(lambda _: False, x) if isinstance(x, tuple) else False


def one_sided(p, model) -> Any:
    """Per leaf: `"right"` or `"left"` where the derivative is one-sided (a choice number at an integer: the
    randomised rule is piecewise linear in d), else `None`."""
    def side(c):
        if isinstance(c, FixedChoice):
            return "right"
        if isinstance(c, InterpolatedChoice):
            d = np.asarray(c.d)
            if d.ndim == 0 and float(d).is_integer():
                return "left" if float(d) >= c.d_max else "right"
        return None

    x = p.where(model)
    if p.kind == "choice":
        return _tuple_map(side, x)
    return _tuple_map(lambda _: None, x) if isinstance(x, tuple) else None


def _project(grad, simplex):
    return jax.tree_util.tree_map(lambda g, s: g - jnp.mean(g, axis=-1, keepdims=True) if s else g, grad, simplex)


# --- the result ----------------------------------------------------------------------------------------------------


class Sensitivity(eqx.Module):
    r"""Derivatives and elasticities of a metric at the fixed point (`jsmkt.sensitivity`).

    **Attributes:**

    - `metric`: the metric's name.
    - `value`: its value (shape of the grid; a scalar at a point).
    - `parameters`: name -> the parameter's value (an array, or a tuple of arrays per class or helper pool).
    - `derivatives`: name -> $\partial M/\partial\theta$, shaped like the parameter (leading grid axes added). For a
      probability vector, the gradient along directions that keep the sum 1 (the full gradient less its mean), so
      that moving mass $h$ from entry $i$ to entry $j$ changes $M$ by $h\,(\partial_i M - \partial_j M)$.
    - `elasticities`: name -> $(\theta/M)\,\partial M/\partial\theta$, entry by entry.
    - `ok`: whether each solve succeeded (on a grid, failed entries have NaN derivatives).
    - `one_sided`: name -> `"right"`, `"left"` or `None` per leaf: a choice number at an integer has one-sided
      derivatives only (the randomised rule is piecewise linear in d).
    """

    metric: str = eqx.field(static=True)
    value: Array
    parameters: dict[str, Any]
    derivatives: dict[str, Any]
    elasticities: dict[str, Any]
    ok: Array
    one_sided: dict[str, Any] = eqx.field(static=True)

    def rows(self) -> list[dict[str, Any]]:
        """One row per scalar parameter entry (a point only): `name` (`lam`, or `d[1]`, `batch_sizes[1][0]` for
        entries of vectors and tuples), `value`, `derivative`, `elasticity`, `one_sided`."""
        if np.ndim(self.value):
            raise ValueError("rows() describes a sensitivity at a point; this one holds a grid (index it first, e.g. "
                             "jax.tree_util.tree_map(lambda x: x[i], s))")
        out = []
        for name in self.derivatives:
            vals = _named_leaves(name, self.parameters[name], self.one_sided[name])
            ders = _named_leaves(name, self.derivatives[name], self.one_sided[name])
            els = _named_leaves(name, self.elasticities[name], self.one_sided[name])
            for (label, v, side), (_, g, _), (_, e, _) in zip(vals, ders, els, strict=True):
                out.append({"name": label, "value": v, "derivative": g, "elasticity": e, "one_sided": side})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The sensitivity as JSON-ready Python values: `metric`, `value`, `ok` and `parameters` (name ->
        `{"value", "derivative", "elasticity", "one_sided"}`, nested lists where the parameter is a vector, a tuple
        or a grid)."""
        def lists(x):
            return jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), x, is_leaf=lambda a: a is None)

        return {
            "metric": self.metric,
            "value": np.asarray(self.value).tolist(),
            "ok": np.asarray(self.ok).tolist(),
            "parameters": {name: {"value": lists(self.parameters[name]),
                                  "derivative": lists(self.derivatives[name]),
                                  "elasticity": lists(self.elasticities[name]),
                                  "one_sided": self.one_sided[name]}
                           for name in self.derivatives},
        }


def _named_leaves(name: str, x, side) -> list[tuple[str, float, str | None]]:
    """`(label, value, side)` for every scalar entry of `x` (an array or a tuple of arrays; `side` alike)."""
    if isinstance(x, tuple):
        return [row for i, xi in enumerate(x) for row in _named_leaves(f"{name}[{i}]", xi, side[i])]
    a = np.asarray(x)
    if a.ndim == 0:
        return [(name, float(a), side)]
    return [(f"{name}[{', '.join(map(str, i))}]", float(a[i]), side) for i in np.ndindex(a.shape)]


# --- the computation -----------------------------------------------------------------------------------------------


def _set_all(model, params: dict, values: dict):
    for name, v in values.items():
        model = with_parameter(params[name], model, v)
    return model


@eqx.filter_jit
def _value_and_grad(model, params, metric_fn, wrt_values, fixed_values, throw):
    from ._fixed_point import solve_fixed_point

    def f(v):
        m = _set_all(model, params, {**fixed_values, **v})
        fp = solve_fixed_point(m, throw=throw)
        return metric_fn(m, fp), fp.result == RESULTS.successful

    (value, ok), grads = jax.value_and_grad(f, has_aux=True)(wrt_values)
    return value, ok, grads


@eqx.filter_jit
def _grid_value_and_grad(model, params, metric_fn, wrt_values, grid_values, batched):
    def one(wv, gv):
        return _value_and_grad(model, params, metric_fn, wv, gv, False)

    axes = {k: 0 if batched[k] else None for k in wrt_values}
    return jax.vmap(one, in_axes=(axes, {k: 0 for k in grid_values}))(wrt_values, grid_values)


def sensitivity(model, metric="mean_sojourn_time", wrt: str | Sequence[str] | None = None, *,
                grid: dict[str, Any] | None = None, service: Callable | None = None) -> Sensitivity:
    r"""Derivatives and elasticities of a metric at the mean-field fixed point with respect to named parameters.

    The fixed point is differentiated implicitly (one linear solve per metric, whatever the number of parameters),
    so the derivatives are exact up to the solver's tolerance, not finite differences.

    **Arguments:**

    - `model`: a model of a registered family (`JSQd`, `JSQdPH`, `JSQdBatch`, `JSQdClasses`, `JSQdBatchService`,
      `RetrialJSQ`, `RepairableJSQ`).
    - `metric`: a metric name (`"mean_sojourn_time"`, `"mean_queue_length"`, `"prob_wait"`, `"availability"`,
      `"mean_orbit_size"`, `"prob_blocked"`, ...: the scalar metrics of `jsmkt`) or a function
      `(model, fixed_point) -> scalar`.
    - `wrt`: a parameter name or a list of them (default: all of the model's). Each family names its own in its
      table, by TOML path: `lam`, `mu`, `theta`, `alpha`, `beta`, `j` (R.3), `batch_rate`, `batch_sizes`,
      `service_batch_sizes`, `arrivals.rates`, `classes.lam`, `classes.batch_sizes`, `helpers.rate`, the choice
      numbers `d`, `d1`, `d2`, `classes.d`, `helpers.f` (a fixed integer is read as the real `d` of the
      randomised rule, whose derivative there is the right one; probabilities over 1, 2, ... servers as a
      probability vector), and for PH service `service.mean` (time scaled, shape kept) and, with `service`,
      `service.scv`. The short names of the tables' aliases (`mean`, `scv`, `rates`, `helper_rates`, `f`, and
      `lam`, `d`, `batch_sizes` for the classes) are accepted too; results are keyed by the names given. An
      unknown name is refused with the family's valid names.
    - `grid`: optional `{name: values}` of parameters to vary (scalar parameters: arrays broadcast to one grid
      shape; vector ones: that shape plus the vector's): one `jax.vmap`-ed solve over the grid, every result then
      has the grid's leading axes, and a failed entry is flagged in `ok` with NaN derivatives.
    - `service`: a two-moment parametrisation `service(mean, scv) -> PH` of the model's service (e.g.
      `jsmkt.hyperexponential2`, `jsmkt.coxian2`), for derivatives with respect to `mean` and `scv`; it must give
      the model's service at the service's mean and SCV.

    **Returns:** a `jsmkt.Sensitivity` (`value`, `derivatives`, `elasticities`, `parameters`, `ok`, `rows()`).

    **Raises:** `ValueError` for an unknown parameter or metric, a model outside the registry, invalid parameter
    values or a truncation `K` too small (at a point; on a grid these are flagged in `ok`).

    !!! example

        ```python
        s = jsmkt.sensitivity(jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0)), "mean_sojourn_time",
                              wrt=["lam", "scv"], service=jsmkt.hyperexponential2)
        s.derivatives["lam"], s.elasticities["scv"]
        ```
    """
    table = _table(model)
    metric_fn, metric_name = metric_function(metric)
    params = parameters_of(model, service)
    aliases = {**parameter_aliases(model), "scv": "service.scv"}
    params.update({a: params[n] for a, n in aliases.items() if n in params and a not in params})
    if wrt is None:
        wrt = [n for n in params if n not in aliases]
    elif isinstance(wrt, str):
        wrt = [wrt]
    else:
        wrt = list(wrt)
    grid = {} if grid is None else dict(grid)
    for name in list(wrt) + list(grid):
        if not isinstance(name, str) or name not in params:
            hint = ""
            if name in ("scv", "service.scv") and "service.mean" in params:
                hint = ("; scv needs a parametrisation of the service: pass service=jsmkt.hyperexponential2 (SCV >= 1) "
                        "or jsmkt.coxian2 (SCV >= 1/2), the constructor the service was built with")
            others = {n: [a for a, m in aliases.items() if m == n and a in params] for n in params}
            names = [n + (f" (or {', '.join(others[n])})" if others[n] else "") for n in params if n not in aliases]
            raise ValueError(f"wrt={name!r} is not a parameter of {table.name!r} models ({type(model).__name__}); its "
                             f"parameters are {', '.join(names)}{hint}")
    if not wrt:
        raise ValueError("wrt=[] names no parameter; give one or more of "
                         + ", ".join(n for n in params if n not in aliases))
    if len({aliases.get(n, n) for n in wrt}) != len(wrt):
        raise ValueError(f"wrt={wrt!r} names a parameter twice")
    used = {name: params[name] for name in dict.fromkeys(wrt + list(grid))}
    base = {name: parameter_value(p, model) for name, p in used.items()}
    simplex = {name: simplex_leaves(params[name], model) for name in wrt}
    sides = {name: one_sided(params[name], model) for name in wrt}
    if not grid:
        model.check_values()
        value, ok, grads = _value_and_grad(model, used, metric_fn, {n: base[n] for n in wrt}, {}, True)
        values = {n: base[n] for n in wrt}
    else:
        values, shape = _grid_values(grid, base)
        flat = {k: v.reshape(-1, *v.shape[len(shape):]) for k, v in values.items()}
        batched = {n: n in grid for n in wrt}
        wrt_flat = {n: flat[n] if batched[n] else base[n] for n in wrt}
        value, ok, grads = _grid_value_and_grad(model, used, metric_fn, wrt_flat,
                                                {k: flat[k] for k in grid if k not in wrt}, batched)
        unflat = lambda a: a.reshape(*shape, *a.shape[1:])  # noqa: E731
        value, ok, grads = unflat(value), unflat(ok), jax.tree_util.tree_map(unflat, grads)
        values = {n: values[n] if batched[n] else base[n] for n in wrt}
    derivatives = {n: _project(grads[n], simplex[n]) for n in wrt}
    elasticities = {n: jax.tree_util.tree_map(lambda g, v: g * v / _expand(value, g), derivatives[n], values[n])
                    for n in wrt}
    return Sensitivity(metric_name, value, values, derivatives, elasticities, ok, sides)


def _expand(value, g):
    """`value` with trailing axes for the parameter's own axes in `g`."""
    return jnp.reshape(value, jnp.shape(value) + (1,) * (jnp.ndim(g) - jnp.ndim(value)))


def _grid_values(grid: dict, base: dict) -> tuple[dict, tuple[int, ...]]:
    """The grid's values broadcast to one batch shape, and that shape."""
    shapes, values = [], {}
    for name, g in grid.items():
        ref = base[name]
        if isinstance(ref, tuple):
            raise ValueError(f"grid[{name!r}]: a parameter with one value per class or helper pool cannot be put on "
                             "a grid; vary a scalar parameter, or call jax.vmap yourself")
        g = jnp.asarray(g, dtype=float)
        k = g.ndim - jnp.ndim(ref)
        if k < 0 or g.shape[k:] != jnp.shape(ref):
            raise ValueError(f"grid[{name!r}] has shape {g.shape}; give an array of shape S + {jnp.shape(ref)} (S, the "
                             "grid's shape, the same for every entry)")
        values[name] = g
        shapes.append(g.shape[:k])
    try:
        shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"the grid's entries have batch shapes {shapes} that do not broadcast together") from None
    return {n: jnp.broadcast_to(v, shape + v.shape[len(s):]) for (n, v), s in zip(values.items(), shapes,
                                                                                     strict=True)}, shape
