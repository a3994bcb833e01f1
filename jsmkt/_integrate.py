"""Transient solutions of mean-field models with Diffrax."""

import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, PyTree

from . import _maps
from ._errors import is_concrete
from ._fixed_point import check_values
from ._models.base import AbstractSupermarketModel
from ._solution import RESULTS, Trajectory


@eqx.filter_jit
def _integrate(model, y0, t1, ts, solver, rtol, atol, max_steps, dt0, throw):
    y0, result = check_values(model, y0, throw)
    saveat = dfx.SaveAt(ts=ts) if ts is not None else dfx.SaveAt(t1=True)
    sol = dfx.diffeqsolve(
        dfx.ODETerm(lambda t, y, m: m.vector_field(t, y, None)),
        solver,
        t0=0.0,
        t1=t1,
        dt0=dt0,
        y0=y0,
        args=model,
        saveat=saveat,
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=False,
    )
    ok = sol.result == dfx.RESULTS.successful
    out = RESULTS.where(result == RESULTS.successful, RESULTS.where(ok, RESULTS.successful, RESULTS.integration_failed), result)
    ys = sol.ys
    if throw:
        ys = out.error_if(ys, out != RESULTS.successful)
    return Trajectory(ts=sol.ts, ys=ys, result=out, model=model, stats=dict(sol.stats))


def integrate(
    model: AbstractSupermarketModel,
    t1: float,
    x0: PyTree[Array] | None = None,
    *,
    ts: ArrayLike | None = None,
    solver: dfx.AbstractSolver | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-12,
    max_steps: int = 100_000,
    dt0: float = 1e-3,
    throw: bool = True,
) -> Trajectory:
    """Integrate the mean-field ODE of `model` from `x0` (default: the empty system) over `[0, t1]`.

    **Arguments:**

    - `model`: any jsmkt model.
    - `t1`: final time.
    - `x0`: initial reduced state; `model.initial_state()` (all servers empty) by default.
    - `ts`: times at which to save (default: `t1` only).
    - `solver`: a diffrax solver; `Kvaerno5` (L-stable, for the stiffness of fast PH phases) by default.
    - `rtol`, `atol`: step-size controller tolerances.

    **Returns:** a `jsmkt.Trajectory` whose `ys` has a leading time axis.

    Differentiable with respect to the model's array leaves (diffrax's default adjoint).
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if not isinstance(t1, jax.core.Tracer):
        try:
            t1f = float(t1)
        except (TypeError, ValueError) as e:
            raise ValueError(f"t1={t1!r} must be a positive finite time (a real number)") from e
        if not (t1f > 0 and math.isfinite(t1f)):
            raise ValueError(f"t1={t1!r} must be a positive finite time")
    if x0 is not None:
        model.check_state(x0)
    if is_concrete(model):
        model.check_values()
        _maps.before_compiling("jsmkt.integrate", ("integrate", _maps.signature((model, x0, ts)), type(solver)))
    y0 = model.initial_state() if x0 is None else x0
    if ts is not None:
        ts = jnp.asarray(ts, dtype=float)
        if ts.ndim != 1:
            raise ValueError(f"ts must be a 1-d array of times; got shape {ts.shape}")
    solver = dfx.Kvaerno5() if solver is None else solver
    return _integrate(model, y0, t1, ts, solver, rtol, atol, max_steps, dt0, throw)


@eqx.filter_jit
def _steady_state(model, y0, rtol, atol, max_steps):
    sol = dfx.diffeqsolve(
        dfx.ODETerm(lambda t, y, m: m.vector_field(t, y, None)),
        dfx.Kvaerno5(),
        t0=0.0,
        t1=jnp.inf,
        dt0=1e-3,
        y0=y0,
        args=model,
        saveat=dfx.SaveAt(t1=True),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
        event=dfx.Event(dfx.steady_state_event(rtol=rtol, atol=atol)),
        max_steps=max_steps,
        adjoint=dfx.ImplicitAdjoint(),
        throw=False,
    )
    ok = (sol.result == dfx.RESULTS.successful) | (sol.result == dfx.RESULTS.event_occurred)
    out = RESULTS.where(ok, RESULTS.successful, RESULTS.integration_failed)
    return jax.tree_util.tree_map(lambda v: v[-1], sol.ys), out


def steady_state(
    model: AbstractSupermarketModel,
    x0: PyTree[Array] | None = None,
    *,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    max_steps: int = 1_000_000,
    throw: bool = True,
) -> tuple[PyTree[Array], RESULTS]:
    """Steady state of the mean-field ODE by integrating until the vector field vanishes (diffrax
    `steady_state_event`), from `x0` (default: the empty system).

    Slower than `solve_fixed_point` but independent of Newton's method: used as its fallback starting point and
    as a test oracle. Differentiable with `diffrax.ImplicitAdjoint`. Returns `(state, result)`.
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if x0 is not None:
        model.check_state(x0)
    if is_concrete(model):
        model.check_values()
        _maps.before_compiling("jsmkt.steady_state", ("steady_state", _maps.signature((model, x0))))
    y0 = model.initial_state() if x0 is None else x0
    y, result = _steady_state(model, y0, rtol, atol, max_steps)
    if throw:
        y = result.error_if(y, result != RESULTS.successful)
    return y, result
