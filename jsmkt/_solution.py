"""Result codes and solution containers."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, Float, PyTree

from ._models.base import AbstractSupermarketModel


class RESULTS(optx.RESULTS):  # pyright: ignore
    """Outcomes of jsmkt's solvers; each value is the message shown to the user."""

    invalid_parameters = "invalid parameters (see the message above for which one); fix the model's inputs"
    unstable = (
        "the model is unstable: the load rho = lam * E[S] is >= 1 (service capacity per server). No fixed point "
        "exists; lower `lam` or speed up service."
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

    - `value`: the reduced state at the fixed point (tails `S_1..S_K`).
    - `result`: a `jsmkt.RESULTS` code; `RESULTS.successful` when every check passed.
    - `tail_mass`: `s_K`, fraction of servers at the truncation level (truncation error indicator).
    - `residual`: max-norm of the vector field at `value`.
    - `model`: the model solved (its `K` may have grown with `auto_K=True`).
    - `stats`: solver statistics (`num_steps`).
    """

    value: PyTree[Array]
    result: RESULTS
    tail_mass: Float[Array, ""]
    residual: Float[Array, ""]
    model: AbstractSupermarketModel
    stats: dict[str, Any]


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
