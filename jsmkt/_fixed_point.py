r"""Fixed points of mean-field models: Newton's method with Optimistix, differentiated implicitly.

`solve_fixed_point` finds the root of `model.vector_field(0, y, None)` in the reduced coordinates (tails
$S_1..S_K$, where conservation of mass is already eliminated, so the Jacobian is nonsingular at a stable fixed
point), passing the model as `args` so that `optx.ImplicitAdjoint` differentiates every array leaf of the model:
a gradient costs one extra linear solve with the Jacobian at the root. For a described model whose Jacobian in the
tails is dense, Newton solves an equivalent system with a banded Jacobian instead, the balance of each cell with
the rates of the streams that start at the servers as extra unknowns (`jsmkt._models.newton`): the same root, the
same derivatives.
"""


import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, PyTree

from . import _maps
from ._batched import ChunkedImplicitAdjoint
from ._compile import fast_jit
from ._errors import all_finite, error_if, is_concrete
from ._linalg import NeverFails
from ._models.base import AbstractSupermarketModel
from ._models.newton import newton_system
from ._models.newton import residual as system_residual
from ._models.newton import state as system_state
from ._models.newton import unknowns as system_unknowns
from ._models.newton import check_size
from ._solution import RESULTS, FixedPoint, check_values


def _residual_fn(y, model):
    return model.vector_field(0.0, y, None)


def _scaled_residual_fn(y, model):
    """The residual in units of the model's rates (Newton's tolerance `atol` on it is then free of the time unit;
    the root and its implicit derivative are those of `_residual_fn`)."""
    scale = model.rate_scale()
    return jax.tree_util.tree_map(lambda f: f / scale, _residual_fn(y, model))


def _scaled_system_fn(z, model):
    """The residual of the model's Newton system (`jsmkt._models.newton`) in units of its rates."""
    scale = model.rate_scale()
    return jax.tree_util.tree_map(lambda f: f / scale, system_residual(newton_system(model), model, z))


def _max_abs(tree) -> Array:
    return jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in jax.tree_util.tree_leaves(tree)]))


def linear_solver(model: AbstractSupermarketModel) -> lx.AbstractLinearSolver:
    """Newton's (and the implicit adjoint's) linear solver, chosen from the structure of the Jacobian of the
    system Newton solves (`jsmkt._models.newton`): block tridiagonal, block banded, bordered (Schur complement) or
    dense LU."""
    return newton_system(model).solver()


class _Newton(optx.Newton):
    r"""`optx.Newton` (Cauchy termination: a step and the residual within the tolerances) that also stops once
    its steps shrink quadratically to below the tolerance. With $\delta_k$ the size of step $k$ in units of the
    tolerance (`atol + rtol |y|`, max norm) and $q_k = \delta_k / \delta_{k-1}$, Newton's quadratic convergence
    $\delta_{k+1} \approx C \delta_k^2$ with $C \approx \delta_k / \delta_{k-1}^2$ predicts $\delta_{k+1}
    \approx \delta_k q_k^2$: when that is below `_PREDICTED` and $q_k$ below `_RATE` (the steps contract fast,
    so the iterate is inside Newton's region of quadratic convergence), the next step would be below the
    tolerance and is not taken; the current iterate is already that accurate. This spares the last step of Cauchy
    termination, whose Jacobian and linear solve only confirm convergence."""

    def terminate(self, fn, y, args, options, state, tags):
        terminate, result = super().terminate(fn, y, args, options, state, tags)
        rate = state.diffsize / state.diffsize_prev
        quadratic = ((state.step >= 2) & (rate < _RATE) & (state.diffsize * rate**2 < _PREDICTED)
                     & (state.result == optx.RESULTS.successful))
        return terminate | quadratic, result


_RATE = 1e-2  # the largest step ratio at which `_Newton` trusts its prediction of the next step
_PREDICTED = 1e-2  # the largest predicted next step (in units of the tolerance) at which `_Newton` stops


@jax.custom_jvp
def _nan_derivatives(y, params, poison):
    """`y`, whose derivatives with respect to `params` get `poison` added (0 or NaN per entry): marks the
    derivatives of a failed solve as NaN without passing NaN through a linear solve (Lineax raises on it)."""
    del params, poison
    return y


@_nan_derivatives.defjvp
def _nan_derivatives_jvp(primals, tangents):
    y, params, poison = primals
    t_y, t_params, _ = tangents
    total = sum((jnp.sum(t) for t in jax.tree_util.tree_leaves(t_params)), jnp.zeros((), poison.dtype))
    return y, jax.tree_util.tree_map(lambda t: t + poison * total, t_y)


@fast_jit
def _solve(model, y0, rtol, atol, max_steps, tail_tol, throw, adjoint, lin=None):
    if y0 is None:  # the model's initial guess, Newton's starting point (no derivatives flow through it)
        y0 = jax.tree_util.tree_map(jax.lax.stop_gradient, model.initial_guess())
    y0, result = check_values(model, y0, throw)
    # The system Newton solves: the vector field (a user's `linear_solver` always solves that one), or the
    # occupancy system of a described model whose vector field's Jacobian is dense (`jsmkt._models.newton`).
    system = newton_system(model) if lin is None else None
    if adjoint is None:
        # With throw=False a failed entry must not raise inside jvp/grad (Lineax's default), which would sink a
        # whole vmap batch: its adjoint solve never fails, and its derivatives are made NaN below.
        lin_adj = linear_solver(model) if lin is None else lin
        solver = lin_adj if throw else NeverFails(lin_adj)
        adjoint = optx.ImplicitAdjoint(linear_solver=solver)
    if type(adjoint) is optx.ImplicitAdjoint:
        # Under `jax.vmap`, Newton's iteration runs in vmapped blocks (`jsmkt._batched`): a vmapped while loop runs
        # every lane until the slowest converges, with temporaries as large as the batch.
        adjoint = ChunkedImplicitAdjoint(adjoint)
    solver = _Newton(rtol=rtol, atol=atol, linear_solver=linear_solver(model) if lin is None else lin)
    if system is None or not system.occupancy:
        sol = optx.root_find(_scaled_residual_fn, solver, y0, args=model, max_steps=max_steps, adjoint=adjoint,
                             throw=False)
        y = sol.value
    else:
        z0 = jax.lax.stop_gradient(system_unknowns(system, model, y0))
        sol = optx.root_find(_scaled_system_fn, solver, z0, args=model, max_steps=max_steps, adjoint=adjoint,
                             throw=False)
        y = system_state(system, model, sol.value)
    residual = _max_abs(_residual_fn(y, model))  # `_scaled_residual_fn`'s max is this over the rate scale
    tail_mass = model.tails(y)[-1]
    finite = all_finite(y)
    newton = RESULTS.promote(sol.result)
    # Near saturation (1 - rho of order 1e-5 and below) the Jacobian is so ill-conditioned that rounding keeps
    # Newton's steps above `rtol` after the residual has reached `atol`: that iterate is as accurate as float64
    # allows, so a residual within `atol` at the step limit counts as converged.
    converged = jax.lax.stop_gradient(residual / model.rate_scale()) <= atol
    newton = RESULTS.where((newton == RESULTS.nonlinear_max_steps_reached) & converged, RESULTS.successful, newton)
    out = RESULTS.where(result == RESULTS.successful, newton, result)
    out = RESULTS.where((out == RESULTS.successful) & ~finite, RESULTS.nonfinite_solution, out)
    out = RESULTS.where((out == RESULTS.successful) & (tail_mass > tail_tol), RESULTS.truncation_too_small, out)
    if throw:
        y = error_if(y, out != RESULTS.successful, out)
    else:
        # A failed entry's value is NaN, so that every metric of it is NaN (its result code says why), and so are
        # its derivatives (`_nan_derivatives`: Newton's last iterate is still what the implicit adjoint sees).
        ok = out == RESULTS.successful
        y = jax.tree_util.tree_map(lambda v: jnp.where(ok, v, jnp.nan), y)
        poison = jnp.where(ok, 0.0, jnp.nan)
        y = _nan_derivatives(y, eqx.filter(model, eqx.is_inexact_array), poison)
    return FixedPoint(value=y, result=out, tail_mass=tail_mass, residual=residual, model=model,
                      stats={"num_steps": sol.stats["num_steps"]})


class TruncationError(ValueError):
    """The fixed point puts more than `tail_tol` of the servers at the truncation level `K` (a `ValueError`);
    `auto_K` says whether `K` was already grown, up to `max_K`. Attributes: `K`, `tail_mass`, `tail_tol`, `auto_K`,
    `max_K`."""

    def __init__(self, K: int, tail_mass: float, tail_tol: float, auto_K: bool, max_K: int):
        self.K, self.tail_mass, self.tail_tol, self.auto_K, self.max_K = K, tail_mass, tail_tol, auto_K, max_K
        found = f"K={K} is too small: the fraction of servers with K jobs is {tail_mass:.3g} > tail_tol={tail_tol:.3g}"
        if auto_K and K > max_K:
            advice = (f"auto_K did not grow K, which starts above max_K={max_K}; raise max_K (e.g. max_K={16 * K}) "
                      "or K")
        elif auto_K:
            advice = f"auto_K stopped at max_K={max_K}; raise max_K, or lower the load or the service SCV"
        else:
            advice = (f"raise K (e.g. K={2 * K}, or more) or call solve_fixed_point(..., auto_K=True), which doubles K "
                      "until the tail mass at K is below tail_tol")
        super().__init__(f"{found}; {advice}")


def solve_fixed_point(
    model: AbstractSupermarketModel,
    x0: PyTree[Array] | None = None,
    *,
    rtol: float = 1e-11,
    atol: float = 1e-14,
    max_steps: int = 64,
    tail_tol: float = 1e-10,
    throw: bool = True,
    auto_K: bool = False,
    max_K: int = 4096,
    adjoint: optx.AbstractAdjoint | None = None,
    linear_solver: lx.AbstractLinearSolver | None = None,
) -> FixedPoint:
    r"""Fixed point of the mean-field ODE of `model`.

    **Main arguments:**

    - `model`: any `AbstractSupermarketModel` (`JSQd`, `JSQdPH`, ...).
    - `x0`: starting point in reduced coordinates; defaults to `model.initial_guess()` (the closed form for `JSQd`,
      an exact forward recursion through the queue levels for `JSQdPH`), from which Newton converges in a few
      steps.

    **Other arguments:**

    - `rtol`, `atol`: Newton's termination tolerances (max-norm) on the steps and on the residual, which is
      measured in units of `model.rate_scale()` (so the time unit does not matter).
    - `max_steps`: the most Newton steps. When Newton fails from the default starting point (it diverges, stalls
      or meets a singular or non-finite linear system), `solve_fixed_point` (outside `jit`) starts it again from
      the ODE's steady state (`jsmkt.steady_state`) before it reports a failure.
    - `tail_tol`: the largest acceptable fraction of servers at the truncation level `K`.
    - `throw`: raise on failure (default), saying what failed and what to do. With `throw=False` (for `vmap`),
      inspect `result` instead: the `value` of an entry that failed is NaN, and so is everything computed from it
      and every derivative of that (`grad`, `jvp`): every metric, `probe_rate` included, the sojourn- and
      waiting-time laws (`cdf`, `pdf`, `quantile`, `mean`, `atom`) and the refined mean field. None of them
      raises for it, and the other entries of a batch keep their values (its `tail_mass` and `residual` are
      those of Newton's last iterate).
    - `auto_K`: outside `jit` only: double `K` until the tail mass at `K` is below `tail_tol`.
    - `max_K`: the largest `K` that `auto_K` tries.
    - `linear_solver`: Newton's linear solver (and the default adjoint's); by default chosen from the structure of
      the Jacobian of the system Newton solves (block tridiagonal, block banded, bordered or dense:
      `jsmkt._models.structure`, `jsmkt._models.newton`). A solver given here solves Newton's steps on the
      vector field itself, e.g. `lineax.LU()` for the dense oracle.
    - `adjoint`: how to differentiate; by default `optx.ImplicitAdjoint` (one linear solve, with the same
      block-tridiagonal or dense solver as Newton). With an `optx.ImplicitAdjoint` (the default), `jax.vmap` of
      this function runs Newton's iteration as `lax.map` over vmapped blocks (32 entries on a CPU, the whole
      batch on a GPU), which keeps the per-solve rate of small batches on large ones; values and derivatives are
      those of one vmapped loop (see `jsmkt.batched`).

    **Returns:** a `jsmkt.FixedPoint` (`value`, `result`, `tail_mass`, `residual`, `model`, `stats`).

    **Raises** (with `throw=True`), each naming the problem: `ValueError` for an unstable load or invalid
    parameters, `jsmkt.TruncationError` (a `ValueError`) for a truncation level too small, `RuntimeError` when
    Newton does not converge; inside `jit`, an `eqx.error_if` error with the same message.

    `jax.grad` of any metric of `value` with respect to any array leaf of `model` works through this function.
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if x0 is not None:
        model.check_state(x0)
    concrete = is_concrete(model, x0)
    if auto_K and not concrete:
        raise ValueError("auto_K=True works outside jit/grad only: its loop inspects the tail mass")
    if not concrete:
        # Inside jit/grad/vmap: value checks and failures surface through `eqx.error_if` / `result`.
        y0 = model.initial_guess() if x0 is None else x0
        y0 = jax.tree_util.tree_map(jax.lax.stop_gradient, y0)
        return _solve(model, y0, rtol, atol, max_steps, tail_tol, throw, adjoint, linear_solver)

    # Concrete inputs: plain Python errors with the offending values; the parameters first (one small compiled
    # check), before anything the model's size or structure costs.
    if throw:
        model.check_values()
    while True:
        check_size(model, x0)
        _maps.before_compiling("jsmkt.solve_fixed_point", ("fixed_point", _maps.signature((model, x0))))
        if linear_solver is None:
            # The Newton system's structure (detected, or a declared one checked, once per model structure) here
            # rather than inside the trace of `_solve`, where its probe would run operation by operation.
            newton_system(model)
        # With x0 None, `_solve` starts from the model's initial guess, computed in the same compiled call.
        fp = _solve(model, x0, rtol, atol, max_steps, tail_tol, False, adjoint, linear_solver)
        newton_failed = not _is(fp.result, RESULTS.successful, RESULTS.unstable, RESULTS.invalid_parameters,
                                RESULTS.truncation_too_small)
        if newton_failed and x0 is None:
            # Newton did not converge from the model's initial guess (it diverged, stalled, met a singular or
            # non-finite linear system): start it from the ODE's steady state instead.
            from ._integrate import steady_state  # Diffrax, imported only when needed (the CLI's start-up)

            y_ode, _ = steady_state(model, rtol=1e-8, atol=1e-10, throw=False)
            fp = _solve(model, y_ode, rtol, atol, max_steps, tail_tol, False, adjoint, linear_solver)
        if not (auto_K and _is(fp.result, RESULTS.truncation_too_small) and model.K < max_K):
            break
        model, x0 = model.with_K(min(2 * model.K, max_K)), None
    if throw and not _is(fp.result, RESULTS.successful):
        _raise_for(fp, tail_tol, max_steps, auto_K, max_K)
    return fp


def _raise_for(fp: FixedPoint, tail_tol: float, max_steps: int, auto_K: bool = False, max_K: int = 4096):
    if _is(fp.result, RESULTS.truncation_too_small):
        raise TruncationError(fp.model.K, float(fp.tail_mass), tail_tol, auto_K, max_K)
    if _is(fp.result, RESULTS.unstable, RESULTS.invalid_parameters):
        raise ValueError(_message(fp.result))
    raise RuntimeError(
        f"the fixed-point solve did not converge ({_message(fp.result)}); residual {float(fp.residual):.3g} after "
        f"{int(fp.stats['num_steps'])} Newton steps (max_steps={max_steps}). Try a larger max_steps, a starting "
        "point x0 from jsmkt.integrate(model, t1).ys[-1], or a larger K"
    )


def _is(result, *codes) -> bool:
    """Whether the concrete result code `result` is one of `codes`, read on the host (`==` on codes would compile
    an operation of its own in a fresh process)."""
    return _message(result) in {RESULTS[c] for c in codes}


def _message(result) -> str:
    try:
        return RESULTS[result]
    except Exception:
        return str(result)
