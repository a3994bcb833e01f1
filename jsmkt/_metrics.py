r"""Metrics: pure functions of `(model, state)` that compose with `jax.grad` and `jax.vmap`.

`state` is a reduced state (tails $S_1..S_K$) or a `FixedPoint`/`Trajectory` snapshot's value; a `FixedPoint`
may be passed directly. Metrics never solve anything.
"""

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._models.base import AbstractSupermarketModel
from ._solution import FixedPoint, Trajectory


def _state(model: AbstractSupermarketModel, state):
    if isinstance(state, Trajectory):
        raise ValueError(
            "state is a jsmkt.Trajectory, a sequence of states: pass one snapshot, e.g. "
            "jax.tree_util.tree_map(lambda y: y[-1], traj.ys), or jax.vmap the metric over traj.ys"
        )
    y = state.value if isinstance(state, FixedPoint) else state
    model.check_state(y, "state", values=False)
    return y


def tails(model: AbstractSupermarketModel, state) -> Float[Array, " K+1"]:
    r"""$s_k$, the fraction of servers with at least $k$ jobs, $k = 0..K$ ($s_0 = 1$)."""
    return model.tails(_state(model, state))


def phase_tails(model: AbstractSupermarketModel, state) -> Float[Array, "K m"]:
    r"""$S_k^{(i)}$, the fraction of servers with at least $k$ jobs whose job in service is in phase $i$,
    $k = 1..K$ (models without phases: shape `(K, 1)`)."""
    y = _state(model, state)
    if hasattr(model, "phase_tails"):
        return model.phase_tails(y)
    return model.tails(y)[1:, None]


def tail_mass_at_K(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """$s_K$: fraction of servers at the truncation level (a truncation-error indicator)."""
    return model.tails(_state(model, state))[-1]


def mean_queue_length(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean number of jobs per server (waiting and in service), $\sum_{k\ge1} s_k$."""
    return jnp.sum(model.tails(_state(model, state))[1:])


def throughput(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Rate of accepted jobs per server, $\lambda\,(1 - g(s_K))$ (arrivals that find all sampled servers at the
    truncation level are lost; this is $\lambda$ up to the truncation error)."""
    s = model.tails(_state(model, state))
    return model.arrival_rate * (1.0 - model.choice.pgf(s[-1]))


def mean_sojourn_time(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean time in system of an accepted job, by Little's law: $E[T] = E[Q]/\text{throughput}$."""
    return mean_queue_length(model, state) / throughput(model, state)


def mean_waiting_time(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean time in queue before service, by Little's law for the waiting jobs: $E[W] = \sum_{k\ge2} s_k /
    \text{throughput}$ (each server with $k \ge 1$ jobs has $k - 1$ waiting). At the fixed point this is
    $E[T] - E[S]$, without the cancellation of that difference at light load."""
    return jnp.sum(model.tails(_state(model, state))[2:]) / throughput(model, state)


def prob_wait(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Probability that an arrival has to wait (all sampled servers busy), $g(s_1) = E[s_1^D]$."""
    s = model.tails(_state(model, state))
    return model.choice.pgf(s[1])


def utilisation(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Fraction of busy servers, $s_1$ (equal to $\lambda E[S]$ at the fixed point)."""
    return model.tails(_state(model, state))[1]


def queue_length_distribution(model: AbstractSupermarketModel, state) -> Float[Array, " K+1"]:
    r"""Fraction of servers with exactly $k$ jobs, $s_k - s_{k+1}$, $k = 0..K$."""
    s = model.tails(_state(model, state))
    return s - jnp.concatenate([s[1:], jnp.zeros(1)])
