"""Transient solutions of mean-field models with Diffrax."""

import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from . import _maps
from ._errors import all_finite, check_count, error_if, is_concrete
from ._models.base import AbstractSupermarketModel
from ._models.structure import linear_solver as structure_solver
from ._solution import RESULTS, FixedPoint, Trajectory, check_values


@eqx.filter_jit
def _integrate(model, y0, t1, ts, solver, rtol, atol, max_steps, dt0, throw, progress_meter):
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
        progress_meter=progress_meter,
    )
    ok = sol.result == dfx.RESULTS.successful
    out = RESULTS.where(result == RESULTS.successful, RESULTS.where(ok, RESULTS.successful, RESULTS.integration_failed), result)
    finite = all_finite(sol.ys)
    out = RESULTS.where((out == RESULTS.successful) & ~finite, RESULTS.nonfinite_solution, out)
    ys = sol.ys
    if throw:
        ys = error_if(ys, out != RESULTS.successful, out)
    return Trajectory(ts=sol.ts, ys=ys, result=out, model=model, stats=dict(sol.stats))


def _real(name: str, x, what: str = "number"):
    """A positive real number as a float64 JAX array (so that a new value does not compile anew), checked when
    concrete."""
    if isinstance(x, jax.core.Tracer):
        return x
    if isinstance(x, (str, bytes, bool, np.bool_)) or not (isinstance(x, (int, float, np.number)) or (
            isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 0)):
        raise ValueError(f"{name}={x!r} must be a positive finite {what} (a real number)")
    xf = float(x)
    if not (math.isfinite(xf) and xf > 0):
        raise ValueError(f"{name}={x!r} must be a positive finite {what}")
    return jnp.asarray(xf)


def _state_arg(x0):
    """A starting state: a `FixedPoint` gives its `value`, and a list of numbers becomes an array."""
    if isinstance(x0, FixedPoint):
        return x0.value
    if isinstance(x0, (list, tuple)):
        try:
            return jnp.asarray(x0, dtype=float)
        except (TypeError, ValueError):
            raise ValueError("x0 must be an array of the reduced state's shape (a list of numbers works too)") from None
    return x0


def _solver_arg(solver):
    """The diffrax solver to integrate with (default `Kvaerno5`); it must give error estimates, since the step size
    is adaptive."""
    if solver is None:
        return dfx.Kvaerno5()
    if not isinstance(solver, dfx.AbstractAdaptiveSolver):
        raise ValueError(
            f"solver={solver!r} must be a diffrax solver instance with error estimates (the step size is adaptive), "
            "e.g. diffrax.Tsit5() or diffrax.Kvaerno5()"
        )
    return solver


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
    progress_meter: dfx.AbstractProgressMeter | None = None,
) -> Trajectory:
    """Integrate the mean-field ODE of `model` from `x0` (default: the empty system) over `[0, t1]`.

    **Arguments:**

    - `model`: any jsmkt model.
    - `t1`: final time.
    - `x0`: initial reduced state; `model.initial_state()` (all servers empty) by default.
    - `ts`: times at which to save, non-decreasing in `[0, t1]` (default: `t1` only).
    - `solver`: a diffrax solver; `Kvaerno5` (L-stable, for the stiffness of fast PH phases) by default.
    - `rtol`, `atol`: step-size controller tolerances; `dt0`: first step; `max_steps`: the solver's step limit.
    - `throw`: raise on failure (default); with `throw=False` (for `vmap`), inspect `result` instead.
    - `progress_meter`: a Diffrax progress meter, e.g. `diffrax.TextProgressMeter()` (it prints the fraction of
      `[0, t1]` done; `jsmkt transient` shows it on stderr); none by default.

    The model must be stable (load lam E[S] < 1), as everywhere in jsmkt: an overloaded model is refused (with
    `throw=False`, its trajectory is computed and flagged `unstable`), although its truncated transient exists.

    `t1`, `rtol`, `atol` and `dt0` are passed to the compiled solve as values, so new values reuse it.

    **Returns:** a `jsmkt.Trajectory` whose `ys` has a leading time axis.

    Differentiable with respect to the model's array leaves and `t1` (diffrax's default adjoint).
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    t1 = _real("t1", t1, "time")
    rtol, atol, dt0 = _real("rtol", rtol), _real("atol", atol), _real("dt0", dt0)
    max_steps = check_count("max_steps", max_steps)
    x0 = _state_arg(x0)
    if x0 is not None:
        model.check_state(x0)
    solver = _solver_arg(solver)
    if progress_meter is None:
        progress_meter = dfx.NoProgressMeter()
    elif not isinstance(progress_meter, dfx.AbstractProgressMeter):
        raise ValueError(f"progress_meter={progress_meter!r} must be a diffrax progress meter, e.g. "
                         "diffrax.TextProgressMeter()")
    if ts is not None:
        if not isinstance(ts, jax.core.Tracer) and np.asarray(ts).dtype.kind not in "iuf":
            kind = {"b": "boolean", "U": "string", "S": "bytes"}.get(np.asarray(ts).dtype.kind, "non-numeric")
            raise ValueError(f"ts={ts!r} must hold real numbers (times), not {kind} values")
        ts = jnp.asarray(ts, dtype=float)
        if ts.ndim != 1 or ts.shape[0] < 1:
            raise ValueError(f"ts must be a 1-d array of at least one time; got shape {ts.shape}")
        if is_concrete(ts, t1):
            tc, t1c = np.asarray(ts), float(t1)
            if not (np.all(np.isfinite(tc)) and np.all(np.diff(tc) >= 0) and tc[0] >= 0 and tc[-1] <= t1c):
                raise ValueError(
                    f"ts={tc.tolist()!r} must be finite, non-decreasing times in [0, t1={t1c:g}] (the system starts "
                    "at time 0)"
                )
    if is_concrete(model):
        model.check_values()
        _maps.before_compiling(
            "jsmkt.integrate",
            ("integrate", _maps.signature((model, x0, ts)), type(solver), max_steps, type(progress_meter)),
        )
    y0 = model.initial_state() if x0 is None else x0
    if throw and is_concrete(model, y0, t1):
        # Eagerly, a failure is a plain Python error (its message without a JAX runtime traceback).
        tr = _integrate(model, y0, t1, ts, solver, rtol, atol, max_steps, dt0, False, progress_meter)
        if tr.result != RESULTS.successful:
            raise RuntimeError(f"jsmkt.integrate: {RESULTS[tr.result]} (t1={float(t1):g}, max_steps={max_steps})")
        return tr
    return _integrate(model, y0, t1, ts, solver, rtol, atol, max_steps, dt0, throw, progress_meter)


class _Split(eqx.Module):
    dynamic: PyTree
    static: PyTree = eqx.field(static=True)


def _split(state) -> _Split:
    dynamic, static = eqx.partition(state, eqx.is_array)
    return _Split(dynamic, static)


class _ArrayState(lx.AbstractLinearSolver):
    """`inner` with its state's non-array leaves (jsmkt's structured solvers keep the operator's
    `jax.ShapeDtypeStruct`s there) held static: Diffrax carries the chord iteration's factorisation from stage to
    stage through a loop, whose carry may hold arrays only."""

    inner: lx.AbstractLinearSolver

    def init(self, operator, options):
        return _split(self.inner.init(operator, options))

    def compute(self, state, vector, options):
        return self.inner.compute(eqx.combine(state.dynamic, state.static), vector, options)

    def transpose(self, state, options):
        state, options = self.inner.transpose(eqx.combine(state.dynamic, state.static), options)
        return _split(state), options

    def conj(self, state, options):
        state, options = self.inner.conj(eqx.combine(state.dynamic, state.static), options)
        return _split(state), options

    def assume_full_rank(self):
        return self.inner.assume_full_rank()


# The chord iteration of the implicit stages stops at these tolerances, or at the controller's if they are looser.
# With the controller's own (1e-10 by default) it nears rounding error: VeryChord asks for an estimated error of
# 1e-2 tolerances and declares divergence when its contraction rate exceeds 2, which rounding noise triggers, and
# every such failure rejects the step (`benchmarks/README.md`, `steady_state.py`).
_STAGE_RTOL, _STAGE_ATOL = 1e-5, 1e-7


def _steady_state_solver(model, rtol, atol) -> dfx.Kvaerno5:
    root_finder = dfx.VeryChord(
        rtol=jnp.maximum(rtol, _STAGE_RTOL),
        atol=jnp.maximum(atol, _STAGE_ATOL),
        linear_solver=_ArrayState(structure_solver(model)),
    )
    # The stages in a plain loop: Diffrax's default checkpoints them for backpropagation through the solve, which
    # `ImplicitAdjoint` never does.
    return dfx.Kvaerno5(scan_kind="lax", root_finder=root_finder)


@eqx.filter_jit
def _steady_state(model, y0, rtol, atol, max_steps, throw):
    y0, result = check_values(model, y0, throw)
    sol = dfx.diffeqsolve(
        dfx.ODETerm(lambda t, y, m: m.vector_field(t, y, None)),
        _steady_state_solver(model, rtol, atol),
        t0=0.0,
        t1=jnp.inf,
        dt0=1e-3,
        y0=y0,
        args=model,
        saveat=dfx.SaveAt(t1=True),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
        event=dfx.Event(dfx.steady_state_event()),  # the controller's rtol, atol (no traced closure)
        max_steps=max_steps,
        adjoint=dfx.ImplicitAdjoint(),
        throw=False,
    )
    ok = (sol.result == dfx.RESULTS.successful) | (sol.result == dfx.RESULTS.event_occurred)
    out = RESULTS.where(result == RESULTS.successful, RESULTS.where(ok, RESULTS.successful, RESULTS.steady_state_failed), result)
    y = jax.tree_util.tree_map(lambda v: v[-1], sol.ys)
    finite = all_finite(y)
    out = RESULTS.where((out == RESULTS.successful) & ~finite, RESULTS.nonfinite_solution, out)
    return y, out, sol.stats, sol.ts[-1]  # the steps taken and the stopping time, for benchmarks and tests


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
    as a test oracle. The integrator is `diffrax.Kvaerno5` (L-stable, for the stiffness of fast PH phases) with a
    PI step-size controller at `rtol`, `atol`. Its implicit stages are solved by a chord iteration (one Jacobian per
    step) with the linear solver of the model's Jacobian structure, as Newton's (block elimination in O(K) for the
    banded families instead of a dense LU in O(K^3)), and to the tolerances 1e-5 relative, 1e-7 absolute (or the
    controller's, if looser): iterating to the controller's own tolerances ends in rounding noise, which the
    iteration reads as divergence, and each such failure rejects a step. Only the path depends on these choices:
    the end point is certified by the drift test alone, evaluated with the vector field itself.

    It stops when the drift is below the tolerances, so its distance to the fixed point grows
    as the load nears 1, like tolerance / (1 - rho): with the defaults, 1e-8 at rho = 0.99 and 2e-6 at
    rho = 0.9999 for JSQ(2); tighten `rtol` and `atol` there. Differentiable with `diffrax.ImplicitAdjoint` (not under
    `jax_numpy_dtype_promotion="strict"`, where diffrax's adjoint multiplies a float time by an integer).

    **Arguments:**

    - `model`: any `AbstractSupermarketModel`.
    - `x0`: starting state in reduced coordinates (default: `model.initial_state()`, the empty system).
    - `rtol`, `atol`: the step-size controller's tolerances; the integration stops when the vector field is
      below them: at the first step whose end has `rms(f(y)) < atol + rtol * rms(y)` (`diffrax.steady_state_event`,
      `rms` the root mean square over all entries).
    - `max_steps`: the most solver steps before giving up.
    - `throw`: raise if the steady state is not reached (a `RuntimeError` outside `jit`, an `eqx.error_if` error
      inside); with `throw=False`, inspect `result` instead.

    **Returns:** `(state, result)`, the reduced state and a `jsmkt.RESULTS` code.
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    rtol, atol = _real("rtol", rtol), _real("atol", atol)
    max_steps = check_count("max_steps", max_steps)
    x0 = _state_arg(x0)
    if x0 is not None:
        model.check_state(x0)
    if is_concrete(model):
        model.check_values()
        _maps.before_compiling("jsmkt.steady_state", ("steady_state", _maps.signature((model, x0)), max_steps))
        # The Jacobian's structure (detected, or a declared one checked, once per model structure) here rather than
        # inside the trace of `_steady_state`, where its probe would run operation by operation.
        structure_solver(model)
    y0 = model.initial_state() if x0 is None else x0
    concrete = is_concrete(model, y0)
    y, result, _, _ = _steady_state(model, y0, rtol, atol, max_steps, throw and not concrete)
    if throw and concrete and result != RESULTS.successful:
        raise RuntimeError(f"jsmkt.steady_state: {RESULTS[result]} (max_steps={max_steps})")
    if throw:
        y = error_if(y, result != RESULTS.successful, result)
    return y, result
