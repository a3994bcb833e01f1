"""Result codes and solution containers."""

import dataclasses
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Float, PyTree

from ._models.base import AbstractSupermarketModel


# Equinox warns when an enumeration gives an inherited entry a new message: `successful` gets one on purpose.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Enumeration has duplicate incompatible values for successful")

    class RESULTS(optx.RESULTS):  # pyright: ignore
        """Outcomes of jsmkt's solvers; each value is the message shown to the user. A code prints as
        `jsmkt.RESULTS<message>`, e.g. `jsmkt.RESULTS<successful>`."""

        __module__ = "jsmkt"  # how it prints (and where it is public)
        successful = "successful"
        invalid_parameters = "invalid parameters (see the message above for which one); fix the model's inputs"
        unstable = (
            "the model is unstable: the load rho = lam * E[S] is >= 1 (service capacity per server). No steady "
            "state exists; lower `lam` or speed up service."
        )
        truncation_too_small = (
            "the truncation level K is too small: the fraction of servers with K jobs exceeds `tail_tol`. Raise `K` "
            "(e.g. model.with_K(2 * model.K)) or call solve_fixed_point(..., auto_K=True)."
        )
        nonfinite_solution = "the solver produced non-finite values; check the parameters or raise K"
        integration_failed = (
            "the ODE integration did not reach t1 (step size or max_steps); raise `max_steps`, or integrate to a "
            "smaller `t1`"
        )
        steady_state_failed = (
            "the ODE integration did not reach a steady state within `max_steps` steps; raise `max_steps`, or use "
            "solve_fixed_point"
        )


class FixedPoint(eqx.Module):
    """Fixed point of a mean-field model.

    **Attributes:**

    - `value`: the reduced state at the fixed point (tails `S_1..S_K`); NaN where the solve failed (with
      `throw=False`), so that everything computed from a failed solve is NaN (`nan_if_failed`).
    - `result`: a `jsmkt.RESULTS` code; `RESULTS.successful` when every check passed, else what failed.
    - `tail_mass`: `s_K`, fraction of servers at the truncation level (truncation error indicator), of Newton's
      last iterate.
    - `residual`: max-norm of the vector field at Newton's last iterate.
    - `model`: the model solved (its `K` may have grown with `auto_K=True`).
    - `stats`: solver statistics (`num_steps`).
    """

    value: PyTree[Array]
    result: RESULTS
    tail_mass: Float[Array, ""]
    residual: Float[Array, ""]
    model: AbstractSupermarketModel
    stats: dict[str, Any]

    def __repr__(self) -> str:
        if not _concrete_scalar(self.result._value):  # a batch (from vmap) or traced: shapes only
            return eqx.Module.__repr__(self)
        return (f"FixedPoint({_short(self.model)}: {self.result!r}, newton_steps={_short(self.stats['num_steps'])}, "
                f"residual={_short(self.residual)}, tail_mass={_short(self.tail_mass)}, value={_short(self.value)})")


class Trajectory(eqx.Module):
    """Transient solution of a mean-field model.

    **Attributes:**

    - `ts`: save times, shape `(n,)`.
    - `ys`: reduced states at `ts` (leading axis `n`).
    - `result`: a `jsmkt.RESULTS` code.
    - `model`: the model integrated.
    - `stats`: diffrax statistics.
    """

    ts: Float[Array, " n"]
    ys: PyTree[Array]
    result: RESULTS
    model: AbstractSupermarketModel
    stats: dict[str, Any]

    def __repr__(self) -> str:
        if not _concrete_scalar(self.result._value):
            return eqx.Module.__repr__(self)
        return f"Trajectory({_short(self.model)}: {self.result!r}, ts={_short(self.ts)}, ys={_short(self.ys)})"


def _concrete_scalar(x) -> bool:
    return not isinstance(x, jax.core.Tracer) and np.ndim(x) == 0


def _short(x) -> str:
    """`x` in a line: concrete scalars and short vectors by their values (6 digits), larger or traced arrays by
    dtype and shape (`f64[30]`), Modules by their fields."""
    if isinstance(x, eqx.Module):
        fields = ", ".join(f"{f.name}={_short(getattr(x, f.name))}" for f in dataclasses.fields(x))
        return f"{type(x).__name__}({fields})"
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if not isinstance(x, jax.core.Tracer) and np.ndim(x) <= 1 and np.size(x) <= 8:
            v = np.asarray(x)
            fmt = (lambda a: f"{a:.6g}") if v.dtype.kind == "f" else str  # noqa: E731
            return fmt(v.item()) if v.ndim == 0 else "[" + ", ".join(fmt(a) for a in v.tolist()) + "]"
        return f"{jnp.dtype(x.dtype).name.replace('float', 'f').replace('int', 'i')}[{','.join(map(str, x.shape))}]"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(map(_short, x)) + "]"
    return repr(x)


def check_values(model: AbstractSupermarketModel, token, throw: bool):
    """Run the model's value checks. Returns `(token, result)`; with `throw`, raises the first failing check's
    own message (under jit too, via `eqx.error_if`)."""
    result = RESULTS.successful
    for bad, msg in reversed(model.value_errors()):
        code = RESULTS.unstable if msg.startswith("unstable") else RESULTS.invalid_parameters
        result = RESULTS.where(jnp.asarray(bad), code, result)
    if throw:
        for bad, msg in model.value_errors():
            token = eqx.error_if(token, bad, msg)
    return token, result


# --- failed fixed points ----------------------------------------------------------------------------------------
# The rule: a fixed point solved with `throw=False` that failed gives NaN in everything computed from it (metrics,
# tails, sojourn- and waiting-time laws, the refined mean field), and in the derivatives of all of it, under any
# transformation; nothing computed from it raises for that reason (its `result` says why it failed), and the
# other entries of a `vmap` batch are untouched. With `throw=True` the solve itself raises.


def failed(state: Any) -> bool | Array:
    """Whether `state` is a failed fixed point: a `FixedPoint` whose `result` is not `RESULTS.successful`, or a
    reduced state (an array or a tuple of them) with a non-finite entry, such as the NaN `value` of a failed fixed
    point. A Python bool when that is known without tracing, else a traced boolean; `False` for other objects (a
    simulated occupancy, a refined mean field: whatever they are, they are not a failed solve)."""
    if isinstance(state, FixedPoint):
        code = state.result._value
        if isinstance(code, jax.core.Tracer):
            return ~(state.result == RESULTS.successful)
        return bool(np.any(np.asarray(code) != np.asarray(RESULTS.successful._value)))
    if isinstance(state, eqx.Module):
        return False
    leaves = jax.tree_util.tree_leaves(state)
    if not leaves or not all(isinstance(x, (jax.Array, np.ndarray, np.generic, float, int)) for x in leaves):
        return False
    traced = [x for x in leaves if isinstance(x, jax.core.Tracer)]
    concrete = [np.asarray(x) for x in leaves if not isinstance(x, jax.core.Tracer)]
    if any(c.dtype.kind in "fc" and not np.all(np.isfinite(c)) for c in concrete):
        return True
    if not traced:
        return False
    return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in traced]))


@jax.custom_jvp
def _nan_where(x, factor):
    """`x`, NaN where `factor` is NaN (it is 1 elsewhere). Its derivatives are those of `x` times `factor`: NaN
    where `x` is, even where `x` does not depend on what failed (a parameter, a constant such as s_0 = 1);
    unchanged, bit for bit, elsewhere."""
    return jnp.where(jnp.isnan(factor), jnp.nan, x)


@_nan_where.defjvp
def _nan_where_jvp(primals, tangents):
    x, factor = primals
    t, _ = tangents
    return _nan_where(x, factor), t * factor


def nan_where(bad: bool | Array, out: Any) -> Any:
    """`out` (a pytree) with every floating-point array NaN, and its derivatives NaN, where `bad` (a boolean, a
    scalar per entry of a `vmap` batch); `out` itself when `bad` is `False`."""
    if bad is False:
        return out
    factor = jnp.where(bad, jnp.nan, 1.0)
    return jax.tree_util.tree_map(lambda x: _nan_where(x, factor) if eqx.is_inexact_array(x) else x, out)


def nan_if_failed(out: Any, state: Any) -> Any:
    """`out`, computed from `state`, NaN (with its derivatives) where `state` is a failed fixed point (`failed`)."""
    return nan_where(failed(state), out)
