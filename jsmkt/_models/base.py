r"""The model contract shared by every supermarket model.

A supermarket model is a population of $N$ exchangeable servers, each in a *local state*, moved by per-server
events and sampled dispatches whose rates depend on the empirical distribution $x$ of local states (the
occupancy vector, summing to 1). As $N \to \infty$, $x$ follows the mean-field ODE
$\dot x = \sum_c \sum_{s} r_c(s; x)\, x_s\, (e_{\mathrm{to}_c(s)} - e_s)$.

Two levels of contract:

- `AbstractSupermarketModel`, what the solvers need: a *reduced state* `y` (tails, in which conservation of mass
  is eliminated so that the fixed-point Jacobian is nonsingular), `vector_field(t, y, args)`, `initial_state()`
  (the empty system), `initial_guess()`, `tails(y)`, `arrival_rate`, `load()`, `rate_scale()` (the unit in which
  the fixed-point residual is measured), `value_errors()` (checks run under `jit` at the entry points),
  `unknown_levels()` and the Jacobian's `structure()` (detected from `jax.jacfwd`, `jsmkt._models.structure`).
  The papers' ODEs as published (`jsmkt.published`) are models of this kind only.
- `AbstractDescribedModel`, a family stated by its physics: `description()` (`jsmkt._models.description`: cells,
  local events, dispatches) and `load()`. From it are derived `state_space`, `transitions` (the tail rule,
  transitions that move two servers included), `drift`, the reduced coordinates (`occupancy`, `reduce`,
  `vector_field`, `initial_state`, `tails`), the metrics' flows and the simulator's tables. A family may
  override `occupancy`, `reduce`, `vector_field` and `initial_guess` by faster hand-written forms; they are
  tested equal to the derived ones, and its reduced state must flatten to the derived one. A family names its
  own metrics as `observables()`: functions of the occupancy of its cells, which the metric functions evaluate on
  a mean-field state and the simulator on a simulated time-averaged occupancy (`Occupancy`).

Everything else a family knows sits in its class too: its TOML name, parameters and example specs as one
declarative `table` (`jsmkt._models.parameters.FamilyTable`), from which the spec parser, the overrides, the value
checks of its rates (`rate_value_errors`) and its parameters for sensitivities are generated; its small instances
(`examples`), its description line and JSON parameters (`describe_parameters`, `spec_values`); and the optional
hooks declared here with their defaults (`has_phase_tails`, `supports_repair_design`, `repair_design`), which the
generic modules call instead of naming a family.
"""

import abc
import copy
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from .._choice import AbstractChoice
from .._compile import fast_jit
from .._distributions.ph import PH, reachable_phases
from .._errors import check_count, concrete_array, is_concrete, number_texts
from .description import Description
from .description import TransitionClass as TransitionClass
from .meanfield import averaged, drift, job_flows, stream_rate, transitions
from .reduced import derived_occupancy, derived_reduce, derived_tails, derived_vector_field, reduced_index
from .parameters import FamilyTable


class AbstractSupermarketModel(eqx.Module):
    """Base class of every mean-field supermarket model (see the module docstring for the contract)."""

    K: eqx.AbstractVar[int]
    table: ClassVar[FamilyTable | None] = None  # the family's TOML name, parameters and example specs

    # --- optional hooks (defaults for families that state less) ----------------------------------------------
    @classmethod
    def examples(cls) -> dict[str, "AbstractSupermarketModel"]:
        """Small instances by name, over which the contract tests run (`tests/test_families.py`). None by
        default."""
        return {}

    def spec_values(self) -> dict[str, Any]:
        """The model's parameters as JSON values (the CLI's output): by default the fields of its table's
        parameters (its own, or the one read from its signature when it was registered), as plain numbers (a
        choice law as its mean), strings or lists."""
        from .parameters import table_of

        table = table_of(type(self))
        out: dict[str, Any] = {}
        for p in table.parameters if table is not None else ():
            if p.field is not None and (v := plain_value(getattr(self, p.field, None))) is not None:
                out[p.name] = v
        return out

    def describe_parameters(self) -> str:
        """One line of the model's parameters (the CLI's header)."""
        return "   ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}"
                          for k, v in self.spec_values().items())

    def rate_value_errors(self) -> list[tuple[Array, str]]:
        """The value check generated from the table's rates (parameters of kind `rate` with a field, outside arrays
        of tables): one check that each is finite and positive, whose message names them all with their values
        (`value_errors` of the families lists it first)."""
        from .parameters import table_of

        table = table_of(type(self))
        rates = [p for p in (table.parameters if table is not None else ()) if p.kind == "rate" and p.field]
        if not rates:
            return []
        values = {p.name: getattr(self, p.field) for p in rates}
        bad = jnp.zeros((), bool)
        for v in values.values():
            bad = bad | ~jnp.isfinite(v) | ~(v > 0)
        names = list(values)
        join = lambda xs: xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]  # noqa: E731
        text = fmt(join([f"{n}={{{n}}}" for n in names]), default=join(names), **values)
        return [(bad, f"invalid parameters: {text} must be finite and positive")]

    def describe_service(self, mean: float, scv: float) -> str:
        """The CLI's line on the service, given its mean and SCV (NaN without a PH service): by default an
        exponential service of rate `mu` where the table has one."""
        from .parameters import table_of

        table = table_of(type(self))
        if table is not None and any(p.name == "mu" and p.field for p in table.parameters):
            return f"service: exponential, rate mu = {float(self.mu):.6g}"
        return "service: as the family's description states"

    def observables(self) -> dict:
        """The family's own metrics, by name, as functions of the occupancy of its cells: none by default (a family
        stated by its physics declares them, `AbstractDescribedModel.observables`)."""
        return {}

    def has_phase_tails(self) -> bool:
        """Whether the model gives tails per service phase (`jsmkt.phase_tails`): by default, whether its class
        defines `phase_tails(y)` (the papers' PH models as published do)."""
        return callable(getattr(type(self), "phase_tails", None))

    def supports_repair_design(self) -> bool:
        """Whether `repair_design` applies (`jsmkt.optimise_repair`): False by default."""
        return False

    def repair_design(self, j, d2) -> "AbstractSupermarketModel":
        """The model with a share `j` of servers holding a small repairman and the large repairman probing by the
        choice law `d2`, in the saturated regime (`jsmkt.optimise_repair`); families with repairmen override
        it."""
        raise ValueError(f"{type(self).__name__} has no repairmen to allocate")

    # --- structure -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def state_space(self) -> list[tuple]:
        """Labels of the local states, in the order of the occupancy vector."""

    @abc.abstractmethod
    def transitions(self, x: Float[Array, " n"]) -> list[TransitionClass]:
        """Transition classes at occupancy `x`."""

    def drift(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        """Mean-field drift of the occupancy vector, derived from `transitions`."""
        return drift(self.transitions(x), x)

    def unknown_levels(self) -> np.ndarray:
        """The level of each entry of the flattened reduced state (the Jacobian's structure is banded in levels).
        By default the leading axis of the reduced state is the level `1..K`."""
        shape = jax.eval_shape(self.initial_state).shape
        return np.repeat(np.arange(1, shape[0] + 1), int(np.prod(shape[1:], dtype=int)))

    def declared_structure(self) -> tuple[int, tuple[int, ...]] | None:
        """`(bandwidth, border)` of the Jacobian of `vector_field`, if the family states it; `None` (the default):
        detected from `jax.jacfwd` (`jsmkt._models.structure`). A declared structure is checked against the
        detected sparsity, and refused where it does not cover it."""
        return None

    def structure(self):
        """The Jacobian's `Structure` (bandwidth in levels, border unknowns), from which the fixed-point solver
        picks its linear solver."""
        from .structure import structure

        return structure(self)

    # --- reduced coordinates ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def occupancy(self, y: PyTree[Array]) -> Float[Array, " n"]:
        """Occupancy vector (fraction of servers in each local state) of the reduced state `y`."""

    @abc.abstractmethod
    def reduce(self, x: Float[Array, " n"]) -> PyTree[Array]:
        """Reduced state of the occupancy vector `x` (linear in `x`)."""

    def vector_field(self, t: Any, y: PyTree[Array], args: Any = None) -> PyTree[Array]:
        """Mean-field ODE in reduced coordinates: `dy/dt`. Pure; `args` is unused (kept for diffrax)."""
        del t, args
        return self.reduce(self.drift(self.occupancy(y)))

    @abc.abstractmethod
    def initial_state(self) -> PyTree[Array]:
        """Reduced state of the empty system."""

    def initial_guess(self) -> PyTree[Array]:
        """Cheap approximation of the fixed point (Newton's starting point)."""
        return self.initial_state()

    # --- queueing quantities ---------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def arrival_rate(self) -> Float[Array, ""]:
        """Arrival rate per server, λ."""

    @abc.abstractmethod
    def load(self) -> Float[Array, ""]:
        """Offered load ρ = λ / (service capacity per server); the mean field is stable iff ρ < 1."""

    def rate_scale(self) -> Float[Array, ""]:
        """A typical transition rate per server (the time unit of the model): the fixed-point solver measures the
        residual of `vector_field` in these units, so that a fixed point does not depend on the unit of time. By
        default the service capacity per server, λ/ρ."""
        return self.arrival_rate / self.load()

    @abc.abstractmethod
    def tails(self, y: PyTree[Array]) -> Float[Array, " K+1"]:
        """`s_k`, fraction of servers with at least `k` jobs, for `k = 0..K` (`s_0 = 1`)."""

    def totals(self, y: PyTree[Array], stream: str | None = None) -> "Totals":
        r"""The sums over the servers and the job flows per server behind the generic metrics (`jsmkt._metrics`)
        at the reduced state `y`, for the arrival stream named `stream` (all of them by default).

        By default, those of single-server FCFS queues fed at rate `arrival_rate` by one stream that samples
        servers by the law `self.choice` and joins the shortest queue (JSQ(d), as the papers' equations state
        it): $\sum_{k\ge1} s_k$ jobs, $s_1$ busy, $\sum_{k\ge2} s_k$ waiting, $\lambda(1 - g(s_K))$ accepted
        (a job that finds every sampled server at `K` is lost) and $\lambda g(s_1)$ waiting. A described model
        sums its cells and flows instead (`AbstractDescribedModel.totals`)."""
        if stream is not None:
            raise ValueError(f"stream={stream!r}: {type(self).__name__} has one arrival stream")
        s = self.tails(y)
        lam, g = self.arrival_rate, self.choice.pgf
        return Totals(jobs=jnp.sum(s[1:]), busy=s[1], waiting=jnp.sum(s[2:]), offered=lam,
                      accepted=lam * (1.0 - g(s[-1])), waiting_flow=lam * g(s[1]))

    def probe_rate(self, y: PyTree[Array], stream: str | None = None) -> Float[Array, ""]:
        """Servers sampled per unit time per server (`jsmkt.probe_rate`): it needs the model's dispatch streams,
        which only a described model states."""
        raise ValueError(f"probe_rate needs a model stated by its physics (its dispatch streams); "
                         f"{type(self).__name__} is not")

    def value_errors(self) -> list[tuple[Array, str]]:
        """Value checks run at the public entry points: a list of `(bad, message)` pairs. They check parameters,
        not the truncation: `check_values` runs them on a copy of the model truncated at another `K`."""
        return []

    def check_state(self, y: PyTree[Array], name: str = "x0", values: bool = True) -> None:
        """Raise `ValueError` unless `y` has the structure and shapes of this model's reduced state and, with
        `values` when `y` is concrete, is a state: finite, non-negative entries whose tails $s_k$ lie in [0, 1]
        and do not grow with $k$ (up to 1e-9, for rounding)."""
        want = jax.eval_shape(self.initial_state)
        got = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), y)
        shape = lambda t: jax.tree_util.tree_map(lambda a: a.shape, t)  # noqa: E731
        try:
            same = jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want) and all(
                a.shape == b.shape for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
            )
        except TypeError:
            same = False
        if not same:
            g, w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
            batched = len(g) == len(w) and all(a.ndim == b.ndim + 1 and a.shape[1:] == b.shape for a, b in zip(g, w))
            advice = (
                "it looks like a batch of states (from jax.vmap): take one (e.g. y[0]), or call this inside jax.vmap"
                if batched else "give a state of that shape (e.g. from model.initial_guess())"
            )
            raise ValueError(
                f"{name} has shape {shape(got)}, but the reduced state of this model (K={self.K}) has shape "
                f"{shape(want)}; {advice}"
            )
        if values and is_concrete(y):
            self._check_state_values(y, name)

    def _check_state_values(self, y: PyTree[Array], name: str, tol: float = 1e-9) -> None:
        leaves = [np.asarray(a, dtype=float) for a in jax.tree_util.tree_leaves(y)]
        advice = "give fractions of servers (e.g. model.initial_state(), or a state from jsmkt.integrate)"
        if not all(np.all(np.isfinite(a)) for a in leaves):
            raise ValueError(f"{name} has non-finite entries; {advice}")
        low = min(float(a.min()) for a in leaves if a.size)
        if low < -tol:
            raise ValueError(f"{name} has a negative entry ({low:.6g}); {advice}")
        s = np.asarray(self.tails(y))
        if s[1] > 1 + tol:
            raise ValueError(f"{name} puts a fraction s_1={s[1]:.6g} > 1 of the servers at one job or more; {advice}")
        up = np.flatnonzero(np.diff(s) > tol)
        if up.size:
            k = int(up[0]) + 1
            raise ValueError(
                f"{name} has s_{k}={s[k]:.6g} > s_{k - 1}={s[k - 1]:.6g}, but the fraction of servers with at least "
                f"k jobs cannot grow with k; {advice}"
            )

    def check_values(self) -> None:
        """Raise `ValueError` with the first failing value check (concrete models only).

        The checks run as one compiled call (eagerly, each of their few dozen operations is dispatched), on a copy
        truncated at `K = 2` so that one compilation serves every `K`; the message of a failing check is then built
        from the concrete values."""
        for i, bad in enumerate(_value_flags(self.with_K(_VALUE_CHECK_K))):
            if np.ndim(bad):
                raise ValueError(
                    "the model holds a batch of parameters (e.g. built by jax.vmap): call jsmkt's functions on it "
                    "inside jax.vmap (or eqx.filter_vmap), or build one model per parameter set"
                )
            if bool(bad):
                raise ValueError(self.value_errors()[i][1])

    # --- optional hooks of the simulator ----------------------------------------------------------------------
    def jsq_fast_path(self) -> "JSQFastPath | None":
        """`JSQFastPath` when this model is exactly JSQ(d) with Poisson arrivals, FCFS queues and PH (or
        exponential) service: `jsmkt.simulate` then runs it on its fast JSQ engines (`jsmkt._simulate.core`), which
        also take general service laws. `None` (the default): the generic engine runs the model's description."""
        return None

    def rates_grow_with_level(self) -> bool:
        """Whether some per-server event rate grows with the level without bound (linear retrials: a cell's rate
        is proportional to its orbit size). The simulator is uniformised at the largest rate of a cell, so a
        generous truncation costs it events: for such a model it keeps only the levels the mean field gives mass
        (`jsmkt._simulate.plan`). `False` by default."""
        return False

    def with_K(self, K: int) -> "AbstractSupermarketModel":
        """The same model truncated at `K` jobs per server."""
        K = check_K(K)
        new = copy.copy(self)
        object.__setattr__(new, "K", K)
        return new


class Totals(NamedTuple):
    """Per server, at one state (`AbstractSupermarketModel.totals`): the mean number of `jobs`, the fraction
    `busy` (a job in service), the jobs `waiting` (not in service); and the job flows of the arrival streams:
    `offered` (jobs brought by events that found an eligible server, those beyond the truncation included),
    `accepted` (jobs that joined: the throughput) and `waiting_flow` (jobs that joined without starting service at
    once)."""

    jobs: Array
    busy: Array
    waiting: Array
    offered: Array
    accepted: Array
    waiting_flow: Array


@fast_jit
def _described_totals(model: "AbstractDescribedModel", y, stream: str | None) -> Totals:
    """`AbstractDescribedModel.totals`, compiled once per model structure (run op by op, its few dozen operations
    would compile one by one for every new shape)."""
    desc = model.description()
    x = model.occupancy(y)
    jobs, busy = jnp.asarray(desc.cells.jobs, x.dtype), jnp.asarray(desc.cells.in_service, x.dtype)
    f = job_flows(desc, x, stream)
    return Totals(jnp.sum(x * jobs), jnp.sum(x * busy), jnp.sum(x * (jobs - busy)), f.offered, f.accepted, f.waiting)


class JSQFastPath(NamedTuple):
    """What the fast JSQ simulation engines read of a model (`AbstractSupermarketModel.jsq_fast_path`): arrivals
    at rate `lam` per server, each sampling servers by the `choice` law and joining the shortest queue (ties
    uniformly at random), and FCFS service by `service`: a `PH`, or a rate (exponential service)."""

    lam: Array
    choice: AbstractChoice
    service: PH | Array


def choice_text(choice) -> str:
    """A choice law for the CLI's header: its integer `d`, or its mean for a randomised one."""
    d = choice.number
    return str(d) if isinstance(d, int) else f"{float(d):.6g} (randomised, E[D])"


def plain_value(value: Any) -> Any:
    """A model's attribute as a JSON value: a scalar array as a float, an integer, a boolean or a string as it is,
    a choice law as its mean, a vector as a list; `None` for anything else."""
    from .._choice import AbstractChoice

    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, AbstractChoice):
        value = value.mean
    try:
        a = np.asarray(value)
    except Exception:  # noqa: BLE001  (a traced value, or an object that is no array)
        return None
    if a.dtype.kind not in "fiu":
        return None
    return float(a) if a.shape == () else a.astype(float).tolist()


def fmt(template: str, *, default: str, **values: Any) -> str:
    """Fill `template` with the values when all are concrete (numbers as `number_texts` writes them: 6 significant
    digits, more where two of them would print alike); else return `default` (inside jit the values are unknown
    when the message is built)."""
    out, scalars = {}, {}
    for name, x in values.items():
        c = concrete_array(x)
        if c is None:
            return default
        if c.ndim == 0:
            scalars[name] = float(c)
        else:
            out[name] = repr(c.tolist())
    out.update(zip(scalars, number_texts(list(scalars.values())), strict=True))
    return template.format(**out)


_VALUE_CHECK_K = 2  # the truncation of the copy `check_values` checks (value checks do not depend on K)


@fast_jit
def _value_flags(model: AbstractSupermarketModel) -> list[Array]:
    return [bad for bad, _ in model.value_errors()]


def check_K(K: Any) -> int:
    """Validate a truncation level."""
    return check_count("K", K, "the largest queue length kept", minimum=2)


def default_K(
    rho: float, weights: np.ndarray, scv: float = 1.0, tol: float = 1e-14, decay: float | None = None
) -> int:
    """Heuristic truncation level for concrete parameters: iterate the exponential tail recursion
    `s_k = rho * g(s_{k-1})` until `s_k < tol`, then widen for service variability (SCV). Where arrivals sample
    a single server with positive probability, the tail ends geometric; `decay` is its ratio per level when known
    (`mph1_tail_decay`), and `K` is then at least the number of levels it takes to fall below `tol`. The solvers
    check the actual tail mass at `K` and say when `K` must grow."""
    g = np.polynomial.Polynomial(np.concatenate([[0.0], weights]))
    rho = min(max(float(rho), 0.0), 0.999)
    s, k = 1.0, 0
    while s > tol and k < 100_000:
        s = rho * g(s)
        k += 1
    levels = k * max(1.0, (1.0 + float(scv)) / 2.0)
    if decay is not None and 0.0 < decay < 1.0:
        levels = max(levels, np.log(tol) / np.log(decay))
    return max(8, int(np.ceil(levels * 1.25)) + 4)


def mph1_tail_decay(lam: float, alpha: np.ndarray, T: np.ndarray) -> float:
    r"""Geometric decay rate $\eta$ of the queue-length tail of an M/PH/1 queue with arrival rate `lam` and
    $\mathrm{PH}(\alpha, T)$ service, $P(Q \ge k) \sim c\,\eta^k$ (requires $\lambda E[S] < 1$): $\eta = 1/z$
    for the root $z > 1$ of $z = \tilde B(\lambda(1 - z))$, $\tilde B(s) = \alpha (sI - T)^{-1} t$ the service
    time's Laplace transform, found by bisection below the pole at $1 + \delta/\lambda$ ($-\delta$ the largest
    eigenvalue of $T$ restricted to the phases a job can visit: a phase it never reaches, e.g. after a Coxian
    continuation probability of 0, is no pole of $\tilde B$). For exponential service it is the load $\rho$."""
    alpha, T = np.asarray(alpha, float), np.asarray(T, float)
    reach = reachable_phases(alpha, T)
    alpha, T = alpha[reach], T[np.ix_(reach, reach)]
    t = -T.sum(axis=1)
    eye = np.eye(len(alpha))
    delta = -float(np.max(np.linalg.eigvals(T).real))

    def excess(z):  # B(lam (1 - z)) - z: negative just above 1 when rho < 1, +inf at the pole
        return float(alpha @ np.linalg.solve(lam * (1.0 - z) * eye - T, t)) - z

    lo, hi = 1.0, 1.0 + delta / lam
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if excess(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return 1.0 / hi


@dataclasses.dataclass(frozen=True, eq=False)
class Occupancy:
    r"""Fractions of servers in cells named by level and status, outside any model's truncation: a simulation's
    time-averaged occupancy (`SimulationResult.occupancy`), which the family metric functions (`mean_orbit_size`,
    `availability`, ...) accept in place of a state. Concrete NumPy arrays.

    **Attributes:**

    - `fractions`: shape `(..., C)`, the fraction of servers in each cell (leading axes: e.g. replications).
    - `level`, `status`: shape `(C,)`, each cell's level and status (an index into `status_names`).
    - `status_names`: the statuses' names, matched by name with a model's cells (`AbstractDescribedModel.cells_of`).
    """

    fractions: np.ndarray
    level: np.ndarray
    status: np.ndarray
    status_names: tuple[str, ...]

    @property
    def top(self) -> int:
        """The highest level that holds a positive fraction (0 for an empty occupancy)."""
        used = np.any(np.reshape(np.asarray(self.fractions), (-1, np.shape(self.level)[0])) > 0, axis=0)
        return int(np.max(np.asarray(self.level)[used], initial=0))


class AbstractDescribedModel(AbstractSupermarketModel):
    """A model family stated once by its physics, `description()`; everything else is derived (module docstring
    and `jsmkt._models.description`)."""

    @abc.abstractmethod
    def description(self) -> "Description":
        """The family's cells, local events and dispatches at truncation `K`."""

    def state_space(self) -> list[tuple]:
        """`(level, status)` of each cell, in the order of the occupancy vector."""
        cells = self.description().cells
        return [(int(k), int(s)) for k, s in zip(cells.level, cells.status, strict=True)]

    def transitions(self, x):
        return transitions(self.description(), x)

    def occupancy(self, y):
        return derived_occupancy(self.description(), y)

    def reduce(self, x):
        return derived_reduce(self.description(), x)

    def vector_field(self, t, y, args=None):
        """The derived drift of the reduced state, in the shape of `y` (a family's reduced state flattens to the
        derived one, e.g. phase tails of shape `(K, m)`: an ODE solver needs `dy/dt` shaped like `y`)."""
        del t, args
        return jnp.reshape(derived_vector_field(self.description(), y), jnp.shape(y))

    def initial_state(self):
        """The empty system (under a saturated pool, the pool's units held by empty servers)."""
        return jnp.zeros(reduced_index(self.description()).size)

    def tails(self, y):
        return derived_tails(self.description(), y)

    def totals(self, y, stream=None):
        """Sums over the cells (`jobs`, `in_service` of each) and the mean-field job flows of the arrival streams
        (`jsmkt._models.meanfield.job_flows`)."""
        if stream is not None:
            names = []
            jax.eval_shape(lambda: names.extend(d.name for d in self.description().dispatches if d.arrivals))
            if stream not in names:
                raise ValueError(f"stream={stream!r} is not an arrival stream of this model; its arrival streams "
                                 f"are {names}")
        return _described_totals(self, y, stream)

    def probe_rate(self, y, stream=None):
        r"""$\sum_{\text{streams}} R\,E[D]$ over the dispatch streams (or the one named `stream`), $R$ a stream's
        rate per server (a modulated stream at its mean-field rate) and $D$ its choice number."""
        desc = averaged(self.description())
        names = [d.name for d in desc.dispatches]
        if stream is not None and stream not in names:
            raise ValueError(f"stream={stream!r} is not a dispatch stream of this model; its streams are {names}")
        x = self.occupancy(y)
        return sum(stream_rate(d, x) * d.choice.mean for d in desc.dispatches if stream in (None, d.name))

    def unknown_levels(self) -> np.ndarray:
        out = []

        def levels():
            desc = self.description()
            out.append(desc.cells.level[1:][reduced_index(desc)])

        # Under `eval_shape` the description's rates are traced, not computed (run eagerly, each of their operations
        # would compile on its own); only its static tables are read.
        jax.eval_shape(levels)
        return out[0]

    # --- named observables ---------------------------------------------------------------------------------------
    def observables(self) -> dict[str, Callable[[Float[Array, " C"]], Float[Array, ""]]]:
        r"""The family's own metrics, by name: functions of the occupancy $x$ of the cells of `description()` (at
        this model's `K`) and of the model's parameters, traceable. The metric functions of the same names
        (`jsmkt.mean_orbit_size`, `jsmkt.availability`, ...) evaluate them on a mean-field state, and `simulate`
        on the time-averaged occupancy of each replication (or batch), giving their estimates and 95 % half-widths
        (`SimulationResult.metrics`). A flow ratio (e.g. the probability that an arrival is blocked) is written as
        a function of the occupancy, the mean-field flows of `jsmkt._models.meanfield`. An observable must not
        depend on the truncation once the cells above the highest occupied level are empty. None by default."""
        return {}

    def cells_of(self, occupancy: Occupancy) -> Float[Array, "... C"]:
        """The occupancy vector (shape `(..., C)`, in the order of this model's cells) of an `Occupancy` named by
        level and status. Statuses are matched by name (a family with one status takes every cell by its level
        alone); `ValueError` where a cell with a positive fraction has no counterpart here: a status this family
        does not have, or a level above `K` (then use `model.with_K(occupancy.top)`)."""
        out = []
        jax.eval_shape(lambda: out.append(self.description().cells))  # static tables only (no rates computed)
        cells = out[0]
        level = np.asarray(occupancy.level, dtype=np.int64)
        names = tuple(occupancy.status_names)
        fractions = np.asarray(occupancy.fractions, dtype=float)
        if level.ndim != 1 or fractions.shape[-1:] != level.shape or np.shape(occupancy.status) != level.shape:
            raise ValueError(f"occupancy has fractions of shape {fractions.shape} for {level.shape} levels and "
                             f"{np.shape(occupancy.status)} statuses: give one fraction per cell (last axis)")
        if len(cells.status_names) == 1:
            status = np.zeros_like(level)
        else:
            unknown = sorted(set(names) - set(cells.status_names))
            if unknown:
                raise ValueError(f"occupancy has statuses {unknown} that a {type(self).__name__}'s cells do not have "
                                 f"(its statuses are {list(cells.status_names)})")
            status = np.array([cells.status_names.index(names[s]) for s in np.asarray(occupancy.status)], np.int64)
        index = cells.index(level, status)
        lost = (index < 0) & np.any(np.reshape(fractions, (-1, level.size)) > 0, axis=0)
        if lost.any():
            c = int(np.flatnonzero(lost)[0])
            if level[c] > cells.K:
                raise ValueError(f"occupancy holds servers at level {int(level[c])} > K={self.K}: evaluate it with "
                                 f"model.with_K({occupancy.top})")
            name = names[int(np.asarray(occupancy.status)[c])]
            raise ValueError(f"occupancy holds servers at level {int(level[c])} in status {name!r}, a cell a "
                             f"{type(self).__name__} does not have")
        onto = np.zeros((level.size, cells.size))
        onto[np.flatnonzero(index >= 0), index[index >= 0]] = 1.0
        return jnp.asarray(fractions @ onto)
