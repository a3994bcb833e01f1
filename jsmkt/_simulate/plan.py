"""`simulate`'s plan of a run: which engine runs the model (the fast JSQ engines or the generic one), on which
tables, with which truncation, event blocks and loops (one event at a time or vmapped over replications), over
how many devices."""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._choice import choice_support
from .._distributions.ph import PH, concrete_mean_scv, reachable_phases
from .._models.base import AbstractSupermarketModel, JSQFastPath
from . import core, generic, jsq_tables
from . import tables as tables_mod
from .described import has_tables, model_tables
from .limits import (
    _check_horizon,
    _check_sampler,
    _check_sizes,
    _check_waiting,
    _concrete,
    _default_max_queue,
    _unstable,
)
from .service import GeneralService
from .statistics import _HIST_OCTAVES, _N_BINS, _hist_key


_GENERIC_BLOCK = 256  # events per outer-loop iteration of the generic engine vmapped over replications (GPU)
_FIRST_TOP = 8  # truncation of the tables read for the default max_queue of a model given by tables
_GENERAL_BLOCK = 64  # arrivals per outer-loop iteration of the general-service engine, vmapped (GPU)
_GENERAL_SEQUENTIAL_BLOCK = 512  # the same, one replication at a time (CPU), as for the sequential PH engine
_SEQUENTIAL_BLOCK = 512  # events drawn per outer-loop iteration of the sequential PH engine (CPU)
_SEQUENTIAL_MAX_D = 12  # largest choice number for which XLA compiles that engine's event loop into one kernel


def _sequential_engine(max_d: int) -> bool:
    """Whether PH service runs one event at a time (`core._sequential_chunk`) rather than in speculative blocks
    vectorised over replications (`core._markov_block`). On a CPU, XLA compiles the sequential engine's event loop
    into a single kernel, quicker per event than the block engine (`benchmarks/README.md`); it
    does so while the loop body is small, which holds up to `_SEQUENTIAL_MAX_D` sampled servers (checked by the
    tests). Elsewhere (GPU) a loop iteration costs microseconds, and the block engine shares it among many events
    and replications."""
    return jax.default_backend() == "cpu" and max_d <= _SEQUENTIAL_MAX_D


_SEQUENTIAL_GENERAL_MAX_D = 13  # the same for the general-service engine's arrival loop


def _sequential_general_engine(max_d: int) -> bool:
    """Whether general service runs each replication in turn with unbatched loops (`core._sequential_batch`)
    rather than vmapped over replications: on a CPU, whatever `max_d`. XLA compiles the unbatched loops into
    single kernels while they read at most `_SEQUENTIAL_GENERAL_MAX_D` sampled servers (checked by the tests):
    quicker per event than vmapped (`benchmarks/general_service.py`). Above, both run op by op; the unbatched loop
    stays ahead (`benchmarks/README.md`)."""
    return jax.default_backend() == "cpu"


def _generic_sequential() -> bool:
    """Whether the generic engine runs one event at a time, replication after replication (a CPU), rather than
    vmapped over replications with loops of a fixed number of iterations (elsewhere). XLA's CPU backend compiles
    its event loop into one kernel while the loop body is small: up to `_GENERIC_ONE_KERNEL_MAX_D` sampled servers
    for JSQ(d) with PH service (checked by the tests); above, the loop runs op by op, still one event at a
    time. (XLA hoists a loop into one kernel when an iteration accesses under 1 KiB by its cost analysis, its
    `xla_cpu_small_while_loop_byte_threshold`; the exact engine's loop, `_exact_selection`, fits for the retrial
    family's examples, up to 3 sampled servers, also checked by the tests.)"""
    return jax.default_backend() == "cpu"


_GENERIC_ONE_KERNEL_MAX_D = 8  # see `_generic_sequential`
_GPU_SHARED_REPLICATIONS = 4096  # replications up to which a GPU iteration's fixed cost dominates (H200, N = 1000)


def _markov_block_size(n: int, n_rep: int) -> int:
    """Events evaluated per iteration of the block PH engine (a power of 2 in [8, 1024]). About 1.2 sqrt(N) of them
    commit per iteration; larger blocks share the fixed cost of an iteration among more events but waste more
    evaluations.

    - On a GPU an iteration's fixed cost (kernel launches, the loop condition read back by the host) dominates up
      to thousands of replications: 2 sqrt(N) up to R = 4096, then 2 sqrt(N * 4096 / R). Measured on an H200 at
      N = 1000 (`benchmarks/block_size.py`, `benchmarks/results/h200-2026-11-30`): B = 64 was best or within 3 %
      of the best for R = 1 to 4096 (1.26e9 events/s at R = 4096, against 6.2e8 with B = 8), and B = 32 best at
      R = 16384 (2.14e9 events/s, against 1.94e9 with B = 64).
    - On a CPU (where the block engine runs only for choice numbers above `_SEQUENTIAL_MAX_D`) the fixed cost is
      shared R ways, so the best block shrinks sooner: 2 sqrt(N / R) (measured on a 2-core CPU at N = 1000: 64
      for R = 1, 16 for R = 16)."""
    if jax.default_backend() == "cpu":
        per = n / n_rep
    else:
        per = n * min(1.0, _GPU_SHARED_REPLICATIONS / n_rep)
    return int(min(1024, max(8, 2 ** round(math.log2(2.0 * math.sqrt(per))))))


def _n_shards(n_rep: int, n_devices: int) -> int:
    """Devices the replications are spread over: the largest count <= `n_devices` that divides `n_rep` (each
    device then runs the same number of replications)."""
    return max(k for k in range(1, min(n_rep, n_devices) + 1) if n_rep % k == 0)


class _Plan(NamedTuple):
    """A configured run and how its statistics read: the engine's cells (`level`, `jobs`), and the cells and
    statuses reported (those of the engine, except that the fast PH engine leaves out the phases no job visits,
    which are reported as zeros: `reach`)."""

    engine: str  # "fast" or "generic"
    kind: str  # "ph", "general" (the fast engines' service) or "tables"
    cfg: core.Config | generic.Config
    params: core.Params | generic.Params
    max_queue: int  # largest level (the tails are s_0 .. s_max_queue)
    default_note: str  # how a default max_queue was chosen ("" when given)
    level: np.ndarray  # (C,) level of each engine cell
    jobs: np.ndarray  # (C,) jobs of each engine cell
    group: int  # engine cells ordered by level, `group` per level (fast engines); 0: any order (generic)
    per_job: bool  # per-job sojourn times: FCFS queues or random order (else Little's law)
    hist_lo: int
    out_level: np.ndarray  # (C_out,) level of each reported cell
    out_status: np.ndarray  # (C_out,) status of each reported cell
    status_names: tuple[str, ...]
    m: int  # phases of the fast PH engine (1 otherwise)
    reach: np.ndarray | None  # the fast PH engine's phases (mask over the service's phases), else None
    service: object  # the fast engine's service (error messages)
    arrival_rate: float  # arrival dispatches per unit time and server (error messages)


def _jsq_status(m: int, max_queue: int):
    """Reported statuses of the JSQ cells `k * m + i`: idle, then the phase of the job in service."""
    status = np.tile(np.arange(1, m + 1, dtype=np.int32), max_queue + 1)
    status[:m] = 0
    names = ("idle", "busy") if m == 1 else ("idle",) + tuple(f"phase {i + 1}" for i in range(m))
    return status, names


def _choice_weights(fast: JSQFastPath) -> tuple[np.ndarray, int, int]:
    weights = _concrete("model.choice.weights()", fast.choice.weights())
    support = choice_support(weights)
    if support is None:
        raise ValueError(f"the choice rule has weights {weights.tolist()!r}: no choice number has positive probability")
    d_min, max_d = support
    return weights[:max_d] / weights[:max_d].sum(), d_min, max_d


def _service_of(fast: JSQFastPath, service):
    """(kind, PH arrays or GeneralService, mean, scv) of `service`, or of the model's own service."""
    if service is None:
        service = fast.service
        if not isinstance(service, PH):  # a rate: exponential service
            mu = float(_concrete("model.mu", service))
            return "ph", (np.ones(1), np.array([[-mu]])), 1.0 / mu, 1.0
    if isinstance(service, PH):
        alpha, T = _concrete("service.alpha", service.alpha), _concrete("service.T", service.T)
        mean, scv = concrete_mean_scv(service)
        return "ph", (alpha, T), mean, scv
    if isinstance(service, GeneralService):
        return "general", service, service.mean, service.scv
    raise ValueError(
        f"service={service!r} must be a jsmkt.PH, a jsmkt.GeneralService (e.g. jsmkt.deterministic(1.0), "
        "jsmkt.lognormal(1.0, 2.0)) or None (the model's own service)"
    )


def _fast_plan(fast: JSQFastPath, service, n: int, n_rep: int, replace: bool, max_queue, keys, t1: float,
               waiting: bool = False) -> _Plan:
    """The fast JSQ engines (`core`): uniformisation for PH service, completion times at arrival otherwise."""
    lam = float(_concrete("model.lam", fast.lam))
    if not lam > 0:
        raise ValueError(f"lam={lam!r} must be positive")
    kind, serv, mean_s, scv = _service_of(fast, service)
    if kind == "general":
        _check_sampler(serv, keys[0])
    rho = lam * mean_s
    if not rho < 1:
        raise ValueError(_unstable(lam, mean_s, service))
    _check_horizon(t1, mean_s)
    weights, d_min, max_d = _choice_weights(fast)
    fixed_d = bool(weights[-1] == 1.0)
    if not replace and max_d > n:
        raise ValueError(
            f"d={max_d} exceeds n_servers={n}: cannot sample {max_d} distinct servers without replacement"
        )
    note = ""
    if max_queue is None:
        max_queue = _default_max_queue(rho, scv, d_min, n)
        note = f" (the default for load {rho:.6g} and service SCV {scv:.6g})"
    reach = None
    if kind == "ph":
        alpha, T = serv
        # Phases no job visits (e.g. after a Coxian continuation probability of 0) are left out: the uniformised
        # chain's event rate then only covers the phases servers can be in. `phase_tails` gets them back as zeros.
        reach = reachable_phases(alpha, T)
        alpha, T = alpha[reach], T[np.ix_(reach, reach)]
        m, sampler = len(alpha), None
    else:
        alpha, T = np.ones(1), -np.ones((1, 1))
        m, sampler = 1, serv.sampler
    _check_sizes(n_rep, n, max_queue, note, 8 if kind == "ph" else 16, (max_queue + 1) * m,
                 f"(max_queue + 1)={max_queue + 1} x {m} phase(s)", _hist_bins(waiting))
    sequential = _sequential_engine(max_d) if sampler is None else _sequential_general_engine(max_d)
    if sampler is not None:
        block = _GENERAL_SEQUENTIAL_BLOCK if sequential else _GENERAL_BLOCK
    else:
        block = _SEQUENTIAL_BLOCK if sequential else _markov_block_size(n, n_rep)
    cfg = core.Config(
        n=n, max_queue=max_queue, m=m, max_d=max_d, fixed_d=fixed_d, replace=replace, block=block,
        n_bins=_N_BINS, sampler=sampler, sequential=sequential, waiting=waiting,
    )
    hist_lo = _hist_key(mean_s * 2.0 ** (-_HIST_OCTAVES // 2))
    params = core.Params(
        lam=jnp.asarray(lam), alpha=jnp.asarray(alpha), T=jnp.asarray(T), weights=jnp.asarray(weights),
        hist_lo=jnp.asarray(hist_lo, jnp.int64),
    )
    m_out = 1 if reach is None else reach.size
    level = np.repeat(np.arange(max_queue + 1, dtype=np.int32), m)
    status, names = _jsq_status(m_out, max_queue)
    return _Plan(
        engine="fast", kind=kind, cfg=cfg, params=params, max_queue=max_queue, default_note=note,
        level=level, jobs=level, group=m, per_job=True, hist_lo=hist_lo,
        out_level=level if m_out == m else np.repeat(np.arange(max_queue + 1, dtype=np.int32), m_out),
        out_status=status, status_names=names, m=m, reach=reach, service=service, arrival_rate=lam,
    )


def _default_top(rho: float, tables, n: int) -> int:
    """`max_queue` for a model given by tables: the JSQ default for exponential service at load `rho` and the
    smallest choice number of the arrival streams, times the largest number of jobs a move adds (a batch)."""
    s = tables_mod.Structure(tables)
    arr = np.asarray(tables.arrivals, bool)
    d_min = 1
    if arr.any():
        support = [np.flatnonzero(np.asarray(tables.choice)[i] > 0) for i in np.flatnonzero(arr)]
        d_min = min(int(x[0]) + 1 if x.size else 1 for x in support)
    return max(s.up, 1) * _default_max_queue(rho, 1.0, d_min, n)


def _tables_plan(model, fast: JSQFastPath | None, service, n: int, n_rep: int, replace: bool, max_queue, t1: float,
                 waiting: bool = False) -> _Plan:
    """The generic engine, on the model's tables (`described.model_tables`); for a JSQ model (`fast`, its
    `jsq_fast_path()`) with a `service` override, on the tables of `jsq_tables`."""
    note = ""
    if fast is not None:
        lam = float(_concrete("model.lam", fast.lam))
        if not lam > 0:
            raise ValueError(f"lam={lam!r} must be positive")
        kind, serv, mean_s, scv = _service_of(fast, service)
        if kind == "general":
            raise ValueError(
                f"service={service!r} is a general distribution: the generic engine executes Markov tables (PH "
                "service only); use engine='fast' (or 'auto') for general service"
            )
        rho = lam * mean_s
        if not rho < 1:
            raise ValueError(_unstable(lam, mean_s, service))
        _check_horizon(t1, mean_s)
        weights, d_min, _ = _choice_weights(fast)
        if max_queue is None:
            max_queue = _default_max_queue(rho, scv, d_min, n)
            note = f" (the default for load {rho:.6g} and service SCV {scv:.6g})"
        if service is None:
            make = functools.partial(model_tables, model)
        else:
            alpha, T = serv
            make = functools.partial(jsq_tables.jsq_tables, lam, weights, alpha, T)
    else:
        if service is not None:
            raise ValueError(
                f"service={service!r}: a {type(model).__name__} simulates its own service (its simulation tables); "
                "give service=None"
            )
        make = functools.partial(model_tables, model)
        if max_queue is None and isinstance(model, AbstractSupermarketModel) and model.rates_grow_with_level():
            max_queue, note = _mean_field_top(model, n), " (from the model's mean-field tail)"
        elif max_queue is None:
            if not hasattr(model, "load"):
                raise ValueError(f"model={model!r} has no load(): give max_queue")
            rho = float(_concrete("model.load()", model.load()))
            if not (math.isfinite(rho) and 0 <= rho < 1):
                raise ValueError(
                    f"model={model!r} has load {rho!r}: the default max_queue is chosen for a load in [0, 1); give "
                    "max_queue (a system that blocks or loses jobs may be stable at higher loads)"
                )
            first = tables_mod.check_tables(make(_FIRST_TOP))
            max_queue = _default_top(rho, first, n)
            note = f" (the default for load {rho:.6g})"
    tables = tables_mod.check_tables(make(max_queue))
    if int(tables.level.max()) > max_queue:
        raise ValueError(
            f"simulation_tables({max_queue}) has cells of level {int(tables.level.max())} > {max_queue}: the levels "
            "of a model truncated at top must be at most top"
        )
    structure = tables_mod.Structure(tables)
    if not replace and structure.max_d > n:
        raise ValueError(
            f"d={structure.max_d} exceeds n_servers={n}: cannot sample {structure.max_d} distinct servers without "
            "replacement"
        )
    C = structure.n_cells
    if waiting:
        _check_waiting(model, structure)
    store = structure.queue if structure.fcfs else structure.slots  # arrival-time slots per server
    _check_sizes(n_rep, n, store, note, 8, C, f"{C} cells", _hist_bins(waiting))
    sequential = _generic_sequential()
    exact = _exact_selection(structure)
    if structure.random_order and not exact:
        raise ValueError(f"{type(model).__name__}: servers whose waiting jobs start in random order run on the exact "
                         "engine only (generic._block_exact)")
    cfg = generic.Config(n=n, structure=structure, replace=replace,
                         block=_SEQUENTIAL_BLOCK if sequential else _GENERIC_BLOCK, n_bins=_N_BINS,
                         sequential=sequential, waiting=waiting, exact=exact)
    hist_lo = _hist_key(t1 * 2.0 ** (1 - _HIST_OCTAVES))
    arrival_rate = float(np.asarray(tables.stream_rate)[np.asarray(tables.arrivals, bool)].sum())
    return _Plan(
        engine="generic", kind="tables", cfg=cfg, params=generic.params_of(structure, tables, hist_lo, n),
        max_queue=max_queue, default_note=note, level=tables.level, jobs=tables.jobs, group=0,
        per_job=tables.fcfs or tables.random_order,
        hist_lo=hist_lo, out_level=tables.level, out_status=tables.status,
        status_names=tables.status_names, m=1,
        reach=None, service=None, arrival_rate=arrival_rate,
    )


def _exact_selection(structure: tables_mod.Structure) -> bool:
    """Whether the generic engine draws the servers' clock events exactly (`generic._block_exact`) rather than
    uniformised at the largest rate of a cell: for tables without FCFS queues, a pool or a global phase (the
    retrial families, whose rates grow with the orbit and whose retrials may start at a server). It is the engine of
    tables whose waiting jobs start in random order (own-orbit retrials), which have none of them."""
    return not (structure.fcfs or structure.pool or structure.phases)


def _hist_bins(waiting: bool) -> int:
    """Histogram bins per replication: the sojourn times' (and the waiting times')."""
    return (_N_BINS + 2) * (2 if waiting else 1)


def _mean_field_top(model: AbstractSupermarketModel, n: int) -> int:
    """The truncation of the tables of a model whose event rates grow with the level (`rates_grow_with_level`):
    the first level whose tail in the mean field's fixed point falls below `1e-12 / n` (at most `K`), plus 4
    levels. A run that still reaches the top is refused after it (raise `max_queue`)."""
    from .._fixed_point import solve_fixed_point

    s = np.asarray(model.tails(solve_fixed_point(model).value))
    below = np.flatnonzero(s < 1e-12 / max(n, 1))
    return int(min(below[0] if below.size else model.K, model.K)) + 4


def plan_run(model, service, n: int, n_rep: int, replace: bool, max_queue, keys, t1: float, waiting: bool,
             engine: str) -> _Plan:
    """The plan of a run: the fast JSQ engines for a model whose `jsq_fast_path()` says it is JSQ(d) (unless
    `engine="generic"`), else the generic engine on the model's tables."""
    if service is None and isinstance(model, AbstractSupermarketModel):
        model.check_values()  # its parameters' errors in the words `solve_fixed_point` uses (instability, ...)
    fast = model.jsq_fast_path() if isinstance(model, AbstractSupermarketModel) else None
    if engine == "fast" and fast is None:
        raise ValueError(
            f"engine='fast' runs jsmkt.JSQd and jsmkt.JSQdPH only, not a {type(model).__name__}; use engine='auto' "
            "or 'generic' (the generic engine runs any model with simulation tables)"
        )
    if fast is not None and engine != "generic":
        return _fast_plan(fast, service, n, n_rep, replace, max_queue, keys, t1, waiting)
    if fast is not None or has_tables(model):
        return _tables_plan(model, fast, service, n, n_rep, replace, max_queue, t1, waiting)
    raise ValueError(
        f"model={model!r} must be a jsmkt.JSQd or jsmkt.JSQdPH, or a model with simulation tables: a "
        f"{type(model).__name__} has no simulation tables (no description() nor simulation_tables(top) method), so "
        "no engine can run it"
    )
