r"""Metrics: pure functions of `(model, state)` that compose with `jax.grad` and `jax.vmap`.

`state` is a reduced state or a `FixedPoint`/`Trajectory` snapshot's value; a `FixedPoint` may be passed
directly. Metrics never solve anything.

The generic metrics read the model's `totals` (`AbstractSupermarketModel.totals`): for a family stated by its
physics (`AbstractDescribedModel`) they are defined from the description: the occupancy $x$ of the cells, the
number of jobs and of jobs in service of each cell, and the job flows of the arrival streams
(`jsmkt._models.meanfield.job_flows`): the throughput is the rate of jobs that join a server, $E[T]$ and $E[W]$
follow by Little's law, $P(\text{wait})$ is the fraction of arriving jobs that do not start service at once. The
papers' ODEs as published (`jsmkt.published`) keep the JSQ formulas of the default `totals`.

Every metric of a fixed point that failed (solved with `throw=False`) is NaN, and so are its derivatives, even
where the formula does not read the state (`probe_rate` of JSQ(d) is $\lambda E[D]$): the fixed point's `result`
says why, and the other entries of a `vmap` batch keep their values (`jsmkt._solution.nan_if_failed`).

A family's own metrics (`mean_orbit_size`, `availability`, ...) are its named observables
(`AbstractDescribedModel.observables`), functions of the occupancy: they take a state as the others do, or a
simulated occupancy (`SimulationResult.occupancy`, or the `SimulationResult` itself), on which `jsmkt.simulate`
evaluates them too.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._compile import fast_jit
from ._models.base import AbstractSupermarketModel, Occupancy
from ._solution import FixedPoint, Trajectory, nan_if_failed


def _state(model: AbstractSupermarketModel, state):
    if isinstance(state, Trajectory):
        raise ValueError(
            "state is a jsmkt.Trajectory, a sequence of states: pass one snapshot, e.g. "
            "jax.tree_util.tree_map(lambda y: y[-1], traj.ys), or jax.vmap the metric over traj.ys"
        )
    y = state.value if isinstance(state, FixedPoint) else state
    model.check_state(y, "state", values=False)
    return y


def _nan_if_failed(metric):
    """`metric(model, state, ...)`, NaN with its derivatives where `state` is a failed fixed point."""

    @functools.wraps(metric)
    def wrapper(model, state, *args, **kwargs):
        return nan_if_failed(metric(model, state, *args, **kwargs), state)

    return wrapper

def _simulated(state) -> Occupancy | None:
    """The `Occupancy` that `state` is or carries (a `SimulationResult`), else `None`."""
    occ = state if isinstance(state, Occupancy) else getattr(state, "occupancy", None)
    return occ if isinstance(occ, Occupancy) else None


@fast_jit
def _observables_at(model: AbstractSupermarketModel, z, names: tuple[str, ...], reduced: bool) -> dict[str, Array]:
    """The observables `names` at the reduced state `z` (`reduced`) or the occupancy `z`, compiled once per model
    structure."""
    obs = model.observables()
    x = model.occupancy(z) if reduced else z
    return {n: obs[n](x) for n in names}


def _observable(model: AbstractSupermarketModel, state, name: str) -> Float[Array, ""]:
    """The named observable `name` of `model`'s family at `state`: a state (or `FixedPoint`), or a simulated
    `Occupancy` (or the `SimulationResult` that carries it), read in `model`'s cells (`cells_of`)."""
    occ = _simulated(state)
    if occ is None:
        try:
            y = _state(model, state)
        except ValueError as e:
            if isinstance(state, (jax.Array, np.ndarray)) and not isinstance(state, jax.core.Tracer):
                raise ValueError(f"{e}; for a simulation, pass its occupancy (res.occupancy, or res itself), not "
                                 "its tails") from None
            raise
        return _observables_at(model, y, (name,), True)[name]
    x = model.cells_of(occ)
    if x.ndim != 1:
        raise ValueError(f"the occupancy holds {x.shape[:-1]} occupancies (fractions of shape "
                         f"{jnp.shape(occ.fractions)}): give one, or use jsmkt._metrics.observable_values")
    return _observables_at(model, x, (name,), False)[name]


def family_metrics(model: AbstractSupermarketModel, state) -> dict[str, Array]:
    """Every named observable of `model`'s family (`AbstractDescribedModel.observables`) at a state or
    `FixedPoint` (NaN where the fixed point failed); `{}` for a family without. The CLI shows them with the
    generic metrics."""
    names = tuple(model.observables())
    if not names:
        return {}
    y = _state(model, state)
    return {n: nan_if_failed(v, state) for n, v in _observables_at(model, y, names, True).items()}


def observable_values(model: AbstractSupermarketModel, occupancy: Occupancy) -> dict[str, Array]:
    """Every named observable of `model`'s family (`{}` for a family without) on each occupancy of `occupancy`
    (fractions of shape `(..., C)`; the result has the leading shape), read in the cells of `model` (at its
    `K`: `model.with_K(occupancy.top)` reads any)."""
    names = tuple(model.observables())
    if not names:
        return {}
    x = model.cells_of(occupancy)
    flat = jax.vmap(lambda z: _observables_at(model, z, names, False))(x.reshape(-1, x.shape[-1]))
    return {n: flat[n].reshape(x.shape[:-1]) for n in names}


def observable_gradients(model: AbstractSupermarketModel, occupancy: Occupancy) -> dict[str, Array]:
    """The gradient of every named observable with respect to the occupancy vector of `model`'s cells, at the one
    occupancy `occupancy` (for the delta method: a ratio's batch-means interval)."""
    names = tuple(model.observables())
    if not names:
        return {}
    grads = _observable_gradients(model, model.cells_of(occupancy), names)
    return {n: grads[n] for n in names}


@fast_jit
def _observable_gradients(model, x, names):
    return {n: jax.grad(lambda z, n=n: _observables_at(model, z, (n,), False)[n])(x) for n in names}


@_nan_if_failed
def tails(model: AbstractSupermarketModel, state) -> Float[Array, " K+1"]:
    r"""$s_k$, the fraction of servers at level $\ge k$ (with at least $k$ jobs), $k = 0..K$ ($s_0 = 1$)."""
    return model.tails(_state(model, state))


@_nan_if_failed
def phase_tails(model: AbstractSupermarketModel, state) -> Float[Array, "K m"]:
    r"""$S_k^{(i)}$, the fraction of servers with at least $k$ jobs whose job in service is in phase $i$,
    $k = 1..K$ (models without phases: shape `(K, 1)`)."""
    y = _state(model, state)
    if model.has_phase_tails():
        return model.phase_tails(y)
    return model.tails(y)[1:, None]


@_nan_if_failed
def tail_mass_at_K(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """$s_K$: fraction of servers at the truncation level (a truncation-error indicator)."""
    return model.tails(_state(model, state))[-1]


@_nan_if_failed
def mean_queue_length(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean number of jobs per server (waiting and in service): $\sum_c x_c\,\text{jobs}_c$, which for queues is
    $\sum_{k\ge1} s_k$."""
    return model.totals(_state(model, state)).jobs


@_nan_if_failed
def throughput(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Rate of accepted jobs per server: the jobs that join a server per unit time (jobs beyond the truncation
    level are lost, so this is the job arrival rate up to the truncation error); for JSQ(d),
    $\lambda\,(1 - g(s_K))$."""
    return model.totals(_state(model, state)).accepted


@_nan_if_failed
def mean_sojourn_time(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean time in system of an accepted job, by Little's law: $E[T] = E[Q]/\text{throughput}$."""
    return mean_queue_length(model, state) / throughput(model, state)


@_nan_if_failed
def mean_waiting_time(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean time before service, by Little's law for the jobs not in service:
    $E[W] = \sum_c x_c(\text{jobs}_c - \text{in service}_c)/\text{throughput}$ (for queues $\sum_{k\ge2} s_k$
    over the throughput). At the fixed point this is $E[T] - E[S]$, without the cancellation of that difference
    at light load."""
    t = model.totals(_state(model, state))
    return t.waiting / t.accepted


@_nan_if_failed
def prob_wait(model: AbstractSupermarketModel, state, stream: str | None = None) -> Float[Array, ""]:
    r"""Probability that an arriving job has to wait: the fraction of the jobs of the arrival streams (or of the
    one named `stream`) that do not start service at once. For JSQ(d) this is $g(s_1) = E[s_1^D]$, all sampled
    servers busy; for batches, every job but the first of a batch that finds its server empty waits."""
    t = model.totals(_state(model, state), stream)
    return t.waiting_flow / t.offered


@_nan_if_failed
def probe_rate(model: AbstractSupermarketModel, state, stream: str | None = None) -> Float[Array, ""]:
    r"""Servers sampled per unit time per server, by every dispatch stream (arrivals, retrials, repairmen, helpers)
    or by the one named `stream`: $\sum_{\text{streams}} R\,E[D]$, $R$ the stream's rate per server (for a stream
    that starts at the servers, such as retrials, the rate at which they start it) and $D$ its choice number. For
    JSQ(d) this is $\lambda E[D]$: divided by the arrival rate, the mean number of probes per arrival."""
    return model.probe_rate(_state(model, state), stream)


@_nan_if_failed
def utilisation(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Fraction of busy servers, $\sum_c x_c\,\text{in service}_c$ ($s_1$ for queues; $\lambda E[S]$ at the fixed
    point)."""
    return model.totals(_state(model, state)).busy


@_nan_if_failed
def queue_length_distribution(model: AbstractSupermarketModel, state) -> Float[Array, " K+1"]:
    r"""Fraction of servers at level exactly $k$, $s_k - s_{k+1}$, $k = 0..K$."""
    s = model.tails(_state(model, state))
    return s - jnp.concatenate([s[1:], jnp.zeros(1)])


@_nan_if_failed
def mean_number_waiting(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Mean number of jobs per server not in service, $\sum_c x_c(\text{jobs}_c - \text{in service}_c)$: the
    queue behind the server ($\sum_{k\ge2} s_k$ for queues), the orbit for retrial models."""
    return model.totals(_state(model, state)).waiting


# --- retrial models ---------------------------------------------------------------------------------------------
# These and the repairable servers' metrics are the families' named observables (`observables()` of the family's
# class); `state` may also be a simulated occupancy (`SimulationResult.occupancy`).


def _family_metric(model, what: str) -> None:
    """Refuse a family metric `what` of a model whose family has no observable of that name (no instance of it
    names it: `AbstractDescribedModel.observables`); a model whose family has it for other settings goes on to
    the family's own check, which says which settings."""
    from ._models.parameters import families_with_observable

    if what in model.observables():
        return
    with jax.ensure_compile_time_eval():  # the examples' parameters are constants, also under a trace
        if any(what in m.observables() for m in type(model).examples().values()):
            return
        names = families_with_observable(what)
    kinds = " or ".join(f"{n} models (model = {n!r})" for n in names)
    raise ValueError(f"{what} is defined for {kinds}, not {type(model).__name__}")


@_nan_if_failed
def mean_orbit_size(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """Mean number of customers per orbit (retrial models): at a state, `mean_number_waiting`."""
    _family_metric(model, "mean_orbit_size")
    return _observable(model, state, "mean_orbit_size")


@_nan_if_failed
def prob_blocked(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    r"""Probability that a primary customer finds every sampled server busy and joins an orbit (retrial models):
    `prob_wait` of the primary stream, $g_1(\rho)$ at the fixed point."""
    _family_metric(model, "prob_blocked")
    return _observable(model, state, "prob_blocked")


@_nan_if_failed
def prob_retrial_success(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """Probability that a retrial is served (retrial models, `RetrialJSQ.observables`)."""
    _family_metric(model, "prob_retrial_success")
    return _observable(model, state, "prob_retrial_success")


@_nan_if_failed
def mean_sojourn_time_tagged(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """$E[T]$ from a tagged customer's path (linear re-probing retrial models, `RetrialJSQ.sojourn_time_tagged`);
    at the fixed point it equals `mean_sojourn_time` (Little's law)."""
    _family_metric(model, "mean_sojourn_time_tagged")
    model.check_tagged()
    return _observable(model, state, "mean_sojourn_time_tagged")


@_nan_if_failed
def orbit_size_distribution(model: AbstractSupermarketModel, state) -> Float[Array, " K+1"]:
    """Fraction of servers whose orbit holds exactly `j` customers, `j = 0..K` (retrial models)."""
    _family_metric(model, "mean_orbit_size")  # the retrial families' orbits
    return queue_length_distribution(model, state)


# --- repairable servers -----------------------------------------------------------------------------------------


@_nan_if_failed
def availability(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """The fraction of working servers (repairable-server models)."""
    _family_metric(model, "availability")
    return _observable(model, state, "availability")


@_nan_if_failed
def customers_at_failed_servers(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """The fraction of the customers in the system held at failed servers (repairable-server models)."""
    _family_metric(model, "customers_at_failed_servers")
    return _observable(model, state, "customers_at_failed_servers")


@_nan_if_failed
def repairmen_utilisation(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """The fraction of the repair capacity in use (repairable-server models, `RepairableJSQ.observables`)."""
    _family_metric(model, "repairmen_utilisation")
    return _observable(model, state, "repairmen_utilisation")


@_nan_if_failed
def fraction_failed_waiting(model: AbstractSupermarketModel, state) -> Float[Array, ""]:
    """The fraction of failed servers that wait for a repairman (repairable-server models with repair='R3')."""
    _family_metric(model, "fraction_failed_waiting")
    model.check_r3("fraction_failed_waiting")
    return _observable(model, state, "fraction_failed_waiting")
