r"""Design by gradient descent: randomised choice numbers under a probing cost, and the repair allocation of R.3.

Both build a model from unconstrained parameters (softmax for a choice law, sigmoid for intervals), solve its fixed
point and let `jsmkt.optimise` minimise the objective; the derivatives go through the fixed point implicitly.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

from ._choice import InterpolatedChoice, MixedChoice
from ._optimise import OptimiseResult, optimise
from ._solution import RESULTS


class Optimum(eqx.Module):
    """The outcome of `jsmkt.optimise_choice` and `jsmkt.optimise_repair`.

    **Attributes:**

    - `model`: the model at the best point found (its choice laws, or `j` and `d2`, set there).
    - `objective`: the objective there (the metric, negated when maximised, plus the probing cost).
    - `value`: the metric there.
    - `probes`: the probing term: probes per arriving job (`optimise_choice`), or the large repairman's probes
      per unit time per server (`optimise_repair`).
    - `run`: the `jsmkt.OptimiseResult` of the optimisation (history, stop reason).
    """

    model: Any
    objective: Array
    value: Array
    probes: Array
    run: OptimiseResult


def _solve(model):
    from ._fixed_point import solve_fixed_point

    return solve_fixed_point(model, throw=False)


def _auto_K(models: Sequence) -> int:
    """The largest `K` that `auto_K` needs for any of `models` (concrete)."""
    from ._fixed_point import solve_fixed_point

    return max(solve_fixed_point(m, auto_K=True, max_K=max(4096, 4 * m.K)).model.K for m in models)


# --- choice numbers -----------------------------------------------------------------------------------------------


def _choice_params(model, wrt):
    from ._sensitivity import parameter_aliases, parameters_of

    params = parameters_of(model)
    aliases = {a: n for a, n in parameter_aliases(model).items() if n in params}  # `d` for the classes' `classes.d`
    choices = [n for n, p in params.items() if p.kind == "choice"]
    if wrt is None:
        wrt = choices
    elif isinstance(wrt, str):
        wrt = [wrt]
    wrt = list(wrt)
    for name in wrt:
        if aliases.get(name, name) not in choices:
            raise ValueError(f"wrt={name!r} is not a choice number of {type(model).__name__}; its choice numbers "
                             f"are {', '.join(choices)}")
    if not wrt:
        raise ValueError("wrt=[] names no choice number")
    if len({aliases.get(n, n) for n in wrt}) != len(wrt):
        raise ValueError(f"wrt={wrt!r} names a choice number twice")
    return {n: params[aliases.get(n, n)] for n in wrt}


def _with_laws(model, params: dict, laws: dict):
    """`model` with each named choice replaced by `MixedChoice(laws[name])` (a tuple of laws for tuples)."""
    for name, p in params.items():
        law = laws[name]
        new = tuple(MixedChoice(w) for w in law) if isinstance(law, tuple) else MixedChoice(law)
        model = eqx.tree_at(p.where, model, new)
    return model


def _choice_objective(logits, model, params, metric_fn, cost):
    from ._metrics import probe_rate

    laws = jax.tree_util.tree_map(jax.nn.softmax, logits)
    m = _with_laws(model, params, laws)
    fp = _solve(m)
    value = metric_fn(m, fp)
    probes = probe_rate(m, fp) / m.arrival_rate
    ok = fp.result == RESULTS.successful
    objective = jnp.where(ok, value + cost * probes, jnp.nan)
    return objective, (value, probes)


def optimise_choice(model, cost: float, *, wrt: str | Sequence[str] | None = None, d_max: int = 4,
                    metric: Any = "mean_sojourn_time", K: int | None = None, init: dict | None = None,
                    optimiser=None, steps: int = 300, progress: bool = True) -> Optimum:
    r"""Optimise randomised choice numbers under a probing cost: minimise $M + c\,P$, $M$ a metric (by default the
    mean sojourn time $E[T]$) and $P$ the mean number of servers probed per arriving job
    (`jsmkt.probe_rate` over the job arrival rate: $E[D]$ for JSQ(d); for retrials it counts the re-probes too).

    Each optimised choice number becomes a law over $1..d_{\max}$ servers, $P(D = i) = \mathrm{softmax}(z)_i$
    (`MixedChoice`), and the logits $z$ are trained (`jsmkt.optimise`, by default `optax.lbfgs()`). $E[T]$ is not
    linear in the law, so the optimum may mix choice numbers (not only two neighbours) where a linear cost would
    take an integer.

    **Arguments:**

    - `model`: a model of a registered family; its other parameters stay as they are.
    - `cost`: $c \ge 0$, the cost of one probe in units of the metric.
    - `wrt`: the choice numbers to optimise (default: all of the model's: `d`; `d1` and `d2` of the retrial and
      repairable models; `classes.d` (per class) and `helpers.f` (per helper pool) of `JSQdClasses`, also named `d` and
      `f`).
    - `d_max`: the largest choice number allowed.
    - `metric`: a metric name or function `(model, fixed_point) -> scalar` (as for `jsmkt.sensitivity`).
    - `K`: the truncation level of the search; by default the smallest that `auto_K` finds for the heaviest tail
      of the search (every law on $D = 1$) and for the uniform law, at least the model's (a few solves at growing
      `K`: give `K` to skip them).
    - `init`: starting logits, `{name: array of d_max}` (a tuple of them for per-class choices); default uniform.
    - `optimiser`, `steps`, `progress`: passed to `jsmkt.optimise`.

    **Returns:** a `jsmkt.Optimum` (`model` with the optimised laws, `objective`, `value`, `probes`, `run`).
    """
    from ._sensitivity import metric_function

    if not (isinstance(d_max, int) and not isinstance(d_max, bool) and d_max >= 1):
        raise ValueError(f"d_max={d_max!r} must be a positive integer (the largest choice number allowed)")
    cost = float(cost)
    if not (np.isfinite(cost) and cost >= 0):
        raise ValueError(f"cost={cost!r} must be a finite number >= 0 (the cost of one probe)")
    metric_fn, _ = metric_function(metric)
    params = _choice_params(model, wrt)

    def each(name, fn):
        x = params[name].where(model)
        return tuple(fn() for _ in x) if isinstance(x, tuple) else fn()

    if init is None:
        init = {n: each(n, lambda: jnp.zeros(d_max)) for n in params}
    else:
        init = {n: jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype=float), init[n]) for n in params}
    ones = {n: each(n, lambda: jnp.zeros(d_max).at[0].set(1.0)) for n in params}
    uniform = {n: each(n, lambda: jnp.full(d_max, 1.0 / d_max)) for n in params}
    if K is None:
        try:  # K for the heaviest tail of the search (every law on one server), when that model is stable
            K = _auto_K([_with_laws(model, params, ones), _with_laws(model, params, uniform)])
        except ValueError:
            K = _auto_K([_with_laws(model, params, uniform)])
        K = max(K, model.K)
    model = model.with_K(K)
    _with_laws(model, params, uniform).check_values()  # a clear error now rather than a NaN loss later
    run = optimise(_choice_objective, init, optimiser if optimiser is not None else optax.lbfgs(), steps=steps,
                   args=(model, params, metric_fn, jnp.asarray(cost)), has_aux=True, rtol=1e-13, atol=0.0, patience=10,
                   progress=progress, name="optimise_choice")
    laws = jax.tree_util.tree_map(jax.nn.softmax, run.params)
    value, probes = run.aux
    return Optimum(_with_laws(model, params, laws), run.loss, value, probes, run)


# --- repair allocation ----------------------------------------------------------------------------------------------


def _repair_model(model, j, d2, d2_max: int):
    m = eqx.tree_at(lambda m: m.j, model, j)
    return eqx.tree_at(lambda m: m.choice2, m, InterpolatedChoice(d2, d_max=d2_max))


def _repair_objective(u, model, j_star, d2_max, metric_fn, sign, cost):
    from ._metrics import probe_rate

    j = j_star * jax.nn.sigmoid(u["j"])
    d2 = 1.0 + (d2_max - 1) * jax.nn.sigmoid(u["d2"])
    m = _repair_model(model, j, d2, d2_max)
    fp = _solve(m)
    value = metric_fn(m, fp)
    probes = probe_rate(m, fp, stream="large repairman")
    ok = fp.result == RESULTS.successful
    return jnp.where(ok, sign * value + cost * probes, jnp.nan), (value, probes)


def optimise_repair(model, cost: float = 0.0, *, metric: Any = "mean_sojourn_time", maximise: bool | None = None,
                    d2_max: int = 4, K: int | None = None, init: tuple[float, float] | None = None, optimiser=None,
                    steps: int = 300, progress: bool = True) -> Optimum:
    r"""Optimise R.3's repair allocation at fixed total repair capacity $N\beta$: the share $j$ of the servers with a
    small repairman (the large repairman works at $(1 - j)N\beta$) and the large repairman's probing number
    $d_2$, relaxed to a real number in $[1, d_{2,\max}]$ (the randomised rule of `InterpolatedChoice`).

    The objective is the metric (minimised; `"availability"` is maximised) plus `cost` times the large
    repairman's probes per unit time per server, $(1 - j)\beta E[D_2]$ (`jsmkt.probe_rate` of its stream).

    **The regime.** Only the saturated regime $j < j^* = \alpha/(\alpha + \beta)$ is searched, with
    $j = j^*\sigma(u)$ and $d_2 = 1 + (d_{2,\max} - 1)\sigma(v)$ (the regime is static, so the derivatives are
    those of the saturated mean field, one-sided at $j^*$). At and above $j^*$ every failed server has its own
    small repairman: the mean field is R.1's whatever $j$ and $d_2$, and only the probing cost changes (least as
    $j \to 1$); compare `objective` with R.1's metric to choose between the regimes.

    **Arguments:**

    - `model`: a `RepairableJSQ` with `repair="R3"` (its `lam`, `alpha`, `beta`, `mu`, `d1`, `arrival`, `K` are
      kept; its `j` and `d2` are the starting point unless `init` is given).
    - `cost`: the cost of one probe per unit time per server, in units of the metric (default 0).
    - `metric`, `maximise`: the metric (name or function) and whether it is maximised (default: for
      `"availability"`).
    - `d2_max`: the largest probing number.
    - `K`: the truncation level of the search; by default the largest that `auto_K` finds at the corners of the
      search ($j \in \{0, j^*\}$, $d_2 \in \{1, d_{2,\max}\}$), at least the model's (give `K` to skip those
      solves).
    - `init`: the starting `(j, d2)`; by default three starts, $j \in \{0.1, 0.5, 0.9\}j^*$ with
      $d_2 = (1 + d_{2,\max})/2$, and the best result is kept (the objective need not be convex in $j$: with
      a probing cost, availability has a local maximum at each end of $[0, j^*]$).
    - `optimiser`, `steps`, `progress`: passed to `jsmkt.optimise` (default `optax.lbfgs()`).

    **Returns:** a `jsmkt.Optimum` (`model` at the best `j` and `d2`, `objective`, `value`, `probes`, `run`).
    """
    from ._models.base import AbstractSupermarketModel
    from ._sensitivity import metric_function

    if not isinstance(model, AbstractSupermarketModel) or not model.supports_repair_design():
        raise ValueError(f"model={type(model).__name__}: optimise_repair needs a RepairableJSQ with repair='R3' (small "
                         "repairmen and a large one)")
    if not (isinstance(d2_max, int) and not isinstance(d2_max, bool) and d2_max >= 2):
        raise ValueError(f"d2_max={d2_max!r} must be an integer >= 2 (the largest probing number)")
    cost = float(cost)
    if not (np.isfinite(cost) and cost >= 0):
        raise ValueError(f"cost={cost!r} must be a finite number >= 0")
    metric_fn, name = metric_function(metric)
    if maximise is None:
        maximise = name == "availability"
    sign = -1.0 if maximise else 1.0
    alpha, beta = float(model.alpha), float(model.beta)
    j_star = alpha / (alpha + beta)
    starts = [(f * j_star, 0.5 * (1 + d2_max)) for f in (0.1, 0.5, 0.9)] if init is None else [tuple(init)]
    for j0, d0 in starts:
        if not (0.0 < float(j0) < j_star and 1.0 < float(d0) < d2_max):
            raise ValueError(f"init=({j0!r}, {d0!r}) must have 0 < j < j* = alpha/(alpha + beta) = {j_star:.6g} "
                             f"and 1 < d2 < d2_max = {d2_max}")
    j0, d0 = starts[0]
    base = model.repair_design(j0, InterpolatedChoice(d0, d_max=d2_max))
    if K is None:
        corners = [_repair_model(base, jnp.asarray(j), jnp.asarray(d), d2_max)
                   for j in (0.0, j_star * (1 - 1e-9)) for d in (1.0, float(d2_max))]
        K = max(base.K, _auto_K(corners))
    base = base.with_K(K)
    logit = lambda p: float(np.log(p / (1.0 - p)))  # noqa: E731
    tx = optimiser if optimiser is not None else optax.lbfgs()
    run = None
    for i, (j0, d0) in enumerate(starts):  # the objective need not be convex in j: a few starts across [0, j*]
        u0 = {"j": jnp.asarray(logit(j0 / j_star)), "d2": jnp.asarray(logit((d0 - 1.0) / (d2_max - 1)))}
        r = optimise(_repair_objective, u0, tx, steps=steps,
                     args=(base, jnp.asarray(j_star), d2_max, metric_fn, sign, jnp.asarray(cost)), has_aux=True,
                     rtol=1e-13, atol=0.0, patience=10, progress=progress,
                     name=f"optimise_repair start {i + 1}/{len(starts)}")
        if run is None or float(r.loss) < float(run.loss):
            run = r
    j = j_star * jax.nn.sigmoid(run.params["j"])
    d2 = 1.0 + (d2_max - 1) * jax.nn.sigmoid(run.params["d2"])
    value, probes = run.aux
    return Optimum(_repair_model(base, j, d2, d2_max), run.loss, value, probes, run)
