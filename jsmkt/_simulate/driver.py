"""`simulate`: input checks, the chunked run and the statistics."""

import functools
import math
import operator
import sys
import time
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import _maps
from .._choice import choice_support
from .._distributions.ph import PH, concrete_mean_scv, reachable_phases
from .._errors import staging
from .._models.base import AbstractDescribedModel, AbstractSupermarketModel, Occupancy
from . import core, generic, jsq_tables
from . import tables as tables_mod
from .result import SimulationResult
from .service import GeneralService


_SAMPLING = ("with_replacement", "without_replacement")
_ENGINES = ("auto", "fast", "generic")
_GENERIC_BLOCK = 256  # events per outer-loop iteration of the generic engine vmapped over replications (GPU)
_FIRST_TOP = 8  # truncation of the tables read for the default max_queue of a model given by tables
_HIST_OCTAVES = 40  # sojourn-time histogram range: E[S] * 2**-20 .. E[S] * 2**20
_N_BINS = _HIST_OCTAVES << core.HIST_SUB_BITS
_GENERAL_BLOCK = 64  # arrivals per outer-loop iteration of the general-service engine, vmapped (GPU)
_GENERAL_SEQUENTIAL_BLOCK = 512  # the same, one replication at a time (CPU), as for the sequential PH engine
_SEQUENTIAL_BLOCK = 512  # events drawn per outer-loop iteration of the sequential PH engine (CPU)
_SEQUENTIAL_MAX_D = 12  # largest choice number for which XLA compiles that engine's event loop into one kernel
_PROGRESS_UPDATES = 100  # about this many progress-bar updates per run
_MAX_RING_SLOTS = 2**30  # 8 GiB of arrival times; also keeps the flat int32 indices of the engines in range
_MAX_CELLS = 2**27  # time-integral cells (max_queue + 1) * m over all replications: 1 GiB per float64 array
_MAX_HORIZON = 1e10  # largest t1 / E[S]: sojourn times are differences of event times of size up to t1
_HIST_SECTIONS = 32  # most groups of replications whose histograms come back apart (percentiles' intervals)
_PERCENTILES = (50, 90, 99)


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
    time."""
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


# --- Student-t quantiles without SciPy --------------------------------------------------------------------------


def _t_two_sided(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with `nu` degrees of freedom (exact finite series, Abramowitz & Stegun 26.7)."""
    theta = math.atan(t / math.sqrt(nu))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if nu % 2 == 1:
        total, term = 0.0, 1.0
        if nu > 1:
            total = term
            for j in range(1, (nu - 3) // 2 + 1):
                term *= c2 * (2 * j) / (2 * j + 1)
                total += term
        return 2.0 / math.pi * (theta + s * math.cos(theta) * total)
    total, term = 1.0, 1.0
    for j in range(1, (nu - 2) // 2 + 1):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return s * total


@functools.lru_cache(maxsize=None)
def t_quantile_975(nu: int) -> float:
    """The 97.5 % quantile of Student's t with `nu >= 1` degrees of freedom (bisection on the exact CDF)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_two_sided(mid, nu) < 0.95:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _half_width(samples: np.ndarray) -> np.ndarray:
    """95 % Student-t half-width of the mean of `samples` along axis 0."""
    n = samples.shape[0]
    if n < 2:
        return np.full(samples.shape[1:], np.nan)
    return t_quantile_975(n - 1) * samples.std(axis=0, ddof=1) / math.sqrt(n)


# --- input checks -----------------------------------------------------------------------------------------------


def _int_arg(name: str, value, minimum: int) -> int:
    """A Python, NumPy or concrete 0-d JAX integer (not a bool) >= `minimum`."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is traced (inside jit/grad/vmap); call simulate outside JAX transformations")
    try:
        if isinstance(value, (bool, np.bool_)) or np.asarray(value).dtype == bool:
            raise TypeError
        x = operator.index(value)
    except TypeError as e:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}") from e
    if x < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return x


def _real_arg(name: str, value) -> float:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is traced (inside jit/grad/vmap); call simulate outside JAX transformations")
    try:
        a = np.asarray(value)
        if a.shape != () or a.dtype.kind not in "iuf":
            raise TypeError
        x = float(a)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={value!r} must be a real number") from e
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} must be finite")
    return x


def _concrete(name: str, x) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ValueError(
            f"{name} is traced: simulate was called inside jit/grad/vmap, or with traced model parameters; it needs "
            "concrete values (call it outside JAX transformations)"
        )
    return np.asarray(x, dtype=float)


def _check_sampler(service: GeneralService, key) -> None:
    """The sampler must map one key (of the run's kind) to one real scalar (checked abstractly, without running
    it)."""
    try:
        out = jax.eval_shape(service.sampler, key)
    except Exception as e:  # noqa: BLE001  (whatever the sampler raises when traced)
        raise ValueError(
            f"service={service!r}: calling its sampler on one JAX key failed ({type(e).__name__}: {e}); a sampler "
            "must be a JAX-traceable function key -> service time"
        ) from e
    dtype = getattr(out, "dtype", None)
    if getattr(out, "shape", None) != () or dtype is None or jnp.dtype(dtype).kind not in "biuf":
        got = f"shape {out.shape} and dtype {dtype}" if hasattr(out, "shape") else repr(out)
        raise ValueError(
            f"service={service!r}: its sampler returned {got}; it must return one real scalar (shape ()) per key"
        )


def _service_of(model, service):
    """(kind, PH arrays or GeneralService, mean, scv)."""
    if service is None:
        if hasattr(model, "service"):
            service = model.service
        elif hasattr(model, "mu"):
            mu = float(_concrete("model.mu", model.mu))
            return "ph", (np.ones(1), np.array([[-mu]])), 1.0 / mu, 1.0
        else:
            raise ValueError(f"model={model!r} has no service rate `mu` or service distribution `service`")
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


def _unstable(lam: float, mean_s: float, service) -> str:
    """The instability error, in the words of the models' value checks (`jsmkt solve` says the same)."""
    simulated = "" if service is None else ", with the service simulated instead of the model's"
    return (f"unstable: lam={lam:.6g} >= capacity 1/E[S]={1.0 / mean_s:.6g} per server (load rho=lam*E[S]="
            f"{lam * mean_s:.6g}{simulated}); no steady state exists: lower lam or speed up service")


def _default_max_queue(rho: float, scv: float, d_min: int, n: int) -> int:
    """Ring-buffer size from the load. The heavy-traffic mean queue length of one M/G/1 queue sets the scale; a
    queue that overflows `64 + 80 scale` is then an event of probability about e^-80. JSQ(d >= 2) has much lighter
    tails, but only while the servers are many: the jobs in excess of N, whose number has about the tail of that
    M/G/1 queue (N servers of rate 1 against one server of rate N), share N queues, so a few servers (e.g. N = 1,
    an M/G/1 queue whatever d) need about 80 scale / N more levels."""
    scale = min(rho * (1.0 + scv) / (2.0 * (1.0 - rho)), 2.0**62)  # an SCV of 1e308 stays finite
    if d_min == 1:
        return 64 + math.ceil(80.0 * scale)
    return 32 + math.ceil(scale) + math.ceil(80.0 * scale / n)


# --- compiled pieces --------------------------------------------------------------------------------------------


def _n_shards(n_rep: int, n_devices: int) -> int:
    """Devices the replications are spread over: the largest count <= `n_devices` that divides `n_rep` (each
    device then runs the same number of replications)."""
    return max(k for k in range(1, min(n_rep, n_devices) + 1) if n_rep % k == 0)


@functools.lru_cache(maxsize=32)
def _compiled(cfg: core.Config | generic.Config, devices: tuple = ()):
    """`init(params, keys)` and `run(params, states, t_end)` for a batch of replications, of the fast engines
    (`core.Config`) or of the generic one (`generic.Config`). With several `devices` the replications are split
    evenly among them (`shard_map` over the leading axis): each device runs its share of replications, in
    parallel with the others (several GPUs, or the cores of a CPU exposed as several devices with
    `jsmkt.use_cpu_cores`). Called once per configuration, just before it compiles: it first makes sure the
    process has memory maps to spare (`jsmkt._maps`)."""
    _maps.make_room("jsmkt.simulate")
    engine = generic if isinstance(cfg, generic.Config) else core
    init = jax.vmap(functools.partial(engine.init_state, cfg), in_axes=(None, 0))
    run = functools.partial(engine.run_chunk, cfg)
    if len(devices) > 1:
        mesh = jax.sharding.Mesh(np.array(devices), ("rep",))
        rep, rest = jax.sharding.PartitionSpec("rep"), jax.sharding.PartitionSpec()
        init = jax.shard_map(init, mesh=mesh, in_specs=(rest, rep), out_specs=rep, check_vma=False)
        run = jax.shard_map(run, mesh=mesh, in_specs=(rest, rep, rest), out_specs=(rep, rep), check_vma=False)
    # XLA's copy insertion with region analysis (not its default) proves that the sequential engine's inner loop
    # may update the server array in place, saving a copy per event (`benchmarks/README.md`).
    opts = ({"xla_cpu_copy_insertion_use_region_analysis": True}
            if cfg.sequential or getattr(cfg, "sampler", None) else None)
    return jax.jit(init), jax.jit(run, donate_argnums=1, compiler_options=opts)


_maps.on_clear(_compiled.cache_clear)


def _add_stats(a: core.Stats, b: core.Stats) -> core.Stats:
    """Statistics of two consecutive chunks (the overflow and bad service counts are cumulative already)."""
    return core.Stats(
        area=a.area + b.area, soj_sum=a.soj_sum + b.soj_sum, n_jobs=a.n_jobs + b.n_jobs, hist=a.hist + b.hist,
        events=a.events + b.events, overflow=b.overflow, bad_service=b.bad_service, blocks=a.blocks + b.blocks,
        real_events=a.real_events + b.real_events, accepted=a.accepted + b.accepted,
    )


def _progress(frac: float, t: float, t1: float, events: int, start: float) -> None:
    width = 30
    filled = int(round(width * frac))
    elapsed = time.perf_counter() - start
    rate = events / elapsed if elapsed > 0 else 0.0
    sys.stderr.write(
        f"\rsimulate [{'#' * filled}{'.' * (width - filled)}] {100 * frac:5.1f}%  t={t:.4g}/{t1:.4g}  "
        f"{events:.3e} events  {elapsed:.1f}s  ({rate:.3g} events/s)"
    )
    sys.stderr.flush()


# --- what a run executes ----------------------------------------------------------------------------------------


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
    fcfs: bool  # per-job sojourn times (else Little's law)
    hist_lo: int
    out_level: np.ndarray  # (C_out,) level of each reported cell
    out_status: np.ndarray  # (C_out,) status of each reported cell
    status_names: tuple[str, ...]
    m: int  # phases of the fast PH engine (1 otherwise)
    reach: np.ndarray | None  # the fast PH engine's phases (mask over the service's phases), else None
    service: object  # the fast engine's service (error messages)
    arrival_rate: float  # arrival dispatches per unit time and server (error messages)


def _is_jsq(model) -> bool:
    """Whether `model` is exactly a `jsmkt.JSQd` or `jsmkt.JSQdPH` (a subclass may change the physics)."""
    from .._models.jsqd import JSQd
    from .._models.jsqd_ph import JSQdPH

    return type(model) in (JSQd, JSQdPH)


def _jsq_status(m: int, max_queue: int):
    """Reported statuses of the JSQ cells `k * m + i`: idle, then the phase of the job in service."""
    status = np.tile(np.arange(1, m + 1, dtype=np.int32), max_queue + 1)
    status[:m] = 0
    names = ("idle", "busy") if m == 1 else ("idle",) + tuple(f"phase {i + 1}" for i in range(m))
    return status, names


def _choice_weights(model) -> tuple[np.ndarray, int, int]:
    weights = _concrete("model.choice.weights()", model.choice.weights())
    support = choice_support(weights)
    if support is None:
        raise ValueError(f"the choice rule has weights {weights.tolist()!r}: no choice number has positive probability")
    d_min, max_d = support
    return weights[:max_d] / weights[:max_d].sum(), d_min, max_d


def _check_horizon(t1: float, mean_s: float) -> None:
    if t1 / mean_s > _MAX_HORIZON:
        raise ValueError(
            f"t1={t1!r} is {t1 / mean_s:.3g} mean service times (E[S]={mean_s:.6g}): event times near t1 resolve "
            f"sojourn times only to about {np.finfo(float).eps * t1 / mean_s:.1g} of E[S]; choose the time unit so "
            f"that t1 / E[S] <= {_MAX_HORIZON:.0e}"
        )


def _check_sizes(n_rep: int, n: int, max_queue: int, note: str, slot_bytes: int, cells: int, what: str,
                 waiting: bool = False) -> None:
    size = f"max_queue={max_queue}{note}"
    if n_rep * n * max_queue > _MAX_RING_SLOTS:
        raise ValueError(
            f"n_replications={n_rep} x n_servers={n} x {size} ring-buffer slots "
            f"({slot_bytes * n_rep * n * max_queue / 2**30:.3g} GiB) exceed the limit of {_MAX_RING_SLOTS:.3g}; "
            + ("give a smaller max_queue" if note else "lower max_queue") + " or n_replications (run replications "
            "in several calls)"
        )
    bins = (_N_BINS + 2) * (2 if waiting else 1)
    if n_rep * bins >= 2**31:
        raise ValueError(
            f"n_replications={n_rep} exceeds {(2**31 - 1) // bins}, the most whose sojourn-time histograms "
            f"({8 * bins / 2**10:.0f} KiB each) one call holds; run replications in several calls"
        )
    if n_rep * cells > _MAX_CELLS:
        raise ValueError(
            f"n_replications={n_rep} x {what} time-average cells exceed the limit of {_MAX_CELLS:.3g}; lower "
            "max_queue or n_replications (run replications in several calls)"
        )


def _fast_plan(model, service, n: int, n_rep: int, replace: bool, max_queue, keys, t1: float,
               waiting: bool = False) -> _Plan:
    """The fast JSQ engines (`core`): uniformisation for PH service, completion times at arrival otherwise."""
    lam = float(_concrete("model.lam", model.lam))
    if not lam > 0:
        raise ValueError(f"lam={lam!r} must be positive")
    kind, serv, mean_s, scv = _service_of(model, service)
    if kind == "general":
        _check_sampler(serv, keys[0])
    rho = lam * mean_s
    if not rho < 1:
        raise ValueError(_unstable(lam, mean_s, service))
    _check_horizon(t1, mean_s)
    weights, d_min, max_d = _choice_weights(model)
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
                 f"(max_queue + 1)={max_queue + 1} x {m} phase(s)", waiting)
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
        level=level, jobs=level, group=m, fcfs=True, hist_lo=hist_lo,
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


def _tables_plan(model, service, n: int, n_rep: int, replace: bool, max_queue, t1: float,
                 waiting: bool = False) -> _Plan:
    """The generic engine, on `model.simulation_tables(top)` (or, for JSQd / JSQdPH without tables or with a
    `service` override, on the tables of `jsq_tables`)."""
    jsq = _is_jsq(model)
    note = ""
    if jsq:
        lam = float(_concrete("model.lam", model.lam))
        if not lam > 0:
            raise ValueError(f"lam={lam!r} must be positive")
        kind, serv, mean_s, scv = _service_of(model, service)
        if kind == "general":
            raise ValueError(
                f"service={service!r} is a general distribution: the generic engine executes Markov tables (PH "
                "service only); use engine='fast' (or 'auto') for general service"
            )
        rho = lam * mean_s
        if not rho < 1:
            raise ValueError(_unstable(lam, mean_s, service))
        _check_horizon(t1, mean_s)
        weights, d_min, _ = _choice_weights(model)
        if max_queue is None:
            max_queue = _default_max_queue(rho, scv, d_min, n)
            note = f" (the default for load {rho:.6g} and service SCV {scv:.6g})"
        if service is None and hasattr(model, "simulation_tables"):
            make = model.simulation_tables
        else:
            alpha, T = serv
            make = functools.partial(jsq_tables.jsq_tables, lam, weights, alpha, T)
    else:
        if service is not None:
            raise ValueError(
                f"service={service!r}: a {type(model).__name__} simulates its own service (its simulation tables); "
                "give service=None"
            )
        make = model.simulation_tables
        top = model.simulation_top(n) if max_queue is None and hasattr(model, "simulation_top") else None
        if top is not None:
            max_queue, note = top, " (from the model's mean-field tail)"
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
        _check_waiting(model, jsq, structure)
    _check_sizes(n_rep, n, structure.queue if structure.fcfs else 0, note, 8, C, f"{C} cells", waiting)
    sequential = _generic_sequential()
    cfg = generic.Config(n=n, structure=structure, replace=replace,
                         block=_SEQUENTIAL_BLOCK if sequential else _GENERIC_BLOCK, n_bins=_N_BINS,
                         sequential=sequential, waiting=waiting)
    hist_lo = _hist_key(t1 * 2.0 ** (1 - _HIST_OCTAVES))
    arrival_rate = float(np.asarray(tables.stream_rate)[np.asarray(tables.arrivals, bool)].sum())
    return _Plan(
        engine="generic", kind="tables", cfg=cfg, params=generic.params_of(structure, tables, hist_lo, n),
        max_queue=max_queue, default_note=note, level=tables.level, jobs=tables.jobs, group=0, fcfs=tables.fcfs,
        hist_lo=hist_lo, out_level=tables.level, out_status=tables.status,
        status_names=tables.status_names, m=1,
        reach=None, service=None, arrival_rate=arrival_rate,
    )


def _check_waiting(model, jsq: bool, structure) -> None:
    """Waiting times are recorded where a job starts service when it reaches the head of its FCFS queue: the head
    of a non-empty queue is always in service, and jobs leave one at a time."""
    name = type(model).__name__
    if not structure.fcfs:
        raise ValueError(f"waiting_times=True: a {name} holds no FCFS queues (jobs move between servers), so no job "
                         "waits in a queue; give waiting_times=False")
    if structure.down > 1:
        raise ValueError(f"waiting_times=True: a {name} removes several jobs at once (batch service), so a job need "
                         "not reach the head of its queue to leave; give waiting_times=False")
    if not jsq and hasattr(model, "description"):
        cells = model.description().cells
        if not np.all(cells.in_service[cells.jobs >= 1] == 1):
            raise ValueError(f"waiting_times=True: the job at the head of a {name}'s queue is not always in service "
                             "(e.g. at a failed server), so reaching the head is not starting service; give "
                             "waiting_times=False")


def _percentile_args(percentiles) -> tuple[float, ...]:
    """The requested percentiles, each a real number in (0, 100) (an integral one kept as an `int`)."""
    if isinstance(percentiles, (str, bytes)) or np.ndim(percentiles) > 1:
        raise ValueError(f"percentiles={percentiles!r} must be a sequence of numbers in (0, 100), e.g. (50, 99, 99.9)")
    try:
        values = [_real_arg("percentiles", q) for q in np.atleast_1d(np.asarray(percentiles, dtype=object))]
    except ValueError as e:
        raise ValueError(f"percentiles={percentiles!r} must be a sequence of numbers in (0, 100), e.g. "
                         "(50, 99, 99.9)") from e
    for q in values:
        if not 0.0 < q < 100.0:
            raise ValueError(f"percentiles={percentiles!r}: {q!r} is not in (0, 100) (percent: 99.9 for p99.9)")
    return tuple(int(q) if float(q).is_integer() else q for q in values)


# --- simulate ---------------------------------------------------------------------------------------------------


def simulate(
    model,
    n_servers: int,
    t1: float,
    *,
    key,
    n_replications: int = 1,
    warmup: float | None = None,
    service: PH | GeneralService | None = None,
    sampling: str = "with_replacement",
    max_queue: int | None = None,
    n_batches: int = 30,
    progress: bool = False,
    engine: str = "auto",
    percentiles=_PERCENTILES,
    waiting_times: bool = False,
) -> SimulationResult:
    r"""Simulate the physical supermarket system with `n_servers` servers, exactly and event by event.

    For `jsmkt.JSQd` and `jsmkt.JSQdPH`: jobs arrive in a Poisson process of rate $N\lambda$; each arrival samples
    $D$ servers ($D$ drawn from the model's choice rule, `model.choice.weights()`), with replacement by default,
    and joins the one with the fewest jobs (ties uniformly at random). Each server serves its queue first-come
    first-served. Service is the model's (exponential with rate `mu` for `JSQd`, PH for `JSQdPH`, the phase of the
    job in service tracked per server) or `service`, which may also be a general distribution
    (`jsmkt.deterministic`, `jsmkt.lognormal`, `jsmkt.GeneralService`). Any other model runs on the generic
    engine from its simulation tables, `model.simulation_tables(top)` (a `jsmkt._simulate.tables.SimTables`: the
    cells of one server, its local events, and the dispatch streams that sample servers, compare their keys and
    move the chosen one). The system starts empty; statistics are time averages over `[warmup, t1]`.

    This code path is independent of the mean-field solvers: it reads `lam`, `mu`/`service` and the choice rule's
    weights from a JSQ model, or the tables of another. It runs one compiled loop per time chunk (the warm-up,
    then each batch), on CPU or GPU, with memory independent of `t1`. The fast JSQ engines simulate PH service by
    uniformisation ($O(1)$ work per event, the phase of each server tracked): on a CPU, for choice numbers up to
    12, one event at a time, replication after replication; otherwise in speculative blocks batched over
    replications. General service is simulated by completion times fixed when each job arrives (FCFS), a server
    being brought up to date when an arrival samples it ($O(d)$ work per event). The generic engine uniformises
    the servers' clocks and the dispatch streams ($O(D)$ work per event; on a CPU one event at a time, elsewhere
    vmapped over replications). All are exact: see `jsmkt._simulate.core` and `jsmkt._simulate.generic`. With
    several JAX devices (GPUs, or a CPU's cores exposed as devices by `jsmkt.use_cpu_cores()` before JAX's first
    computation, as `jsmkt simulate` does) the replications are split evenly among as many devices as divide
    their number, and run in parallel; each replication's run does not depend on the split. Each new
    configuration compiles anew (the generic engine once per table structure: new rates and probabilities reuse
    it); near the kernel's memory-map limit, which XLA's compiled kernels use up, JAX's caches are cleared first
    with a `RuntimeWarning` (`jsmkt._maps`).

    Random numbers: each replication gets a key from `jax.random.split(key, n_replications)`; its event loop
    draws from a counter-based SplitMix64 stream seeded from that key (event `e` always uses the same numbers, so
    results do not depend on chunking or `progress`), and general service times from `jax.random.fold_in(key, e)`
    for the `e`-th arrival.

    **Arguments:**

    - `model`: a `jsmkt.JSQd` or `jsmkt.JSQdPH`, or a model with a method `simulation_tables(top)` (and `load()`,
      for the default `max_queue`); concrete parameters.
    - `n_servers`: number of servers $N \ge 1$.
    - `t1`: simulated time horizon.
    - `key`: a concrete JAX PRNG key (simulate runs its own compiled loops: call it outside `jit`/`vmap`);
      replications use `jax.random.split(key, n_replications)`.
    - `n_replications`: independent replications (confidence intervals come from them when $\ge 2$).
    - `warmup`: initial period discarded from the statistics; defaults to `0.1 * t1`.
    - `service`: overrides a JSQ model's service distribution (`jsmkt.PH` or `jsmkt.GeneralService`; the generic
      engine takes PH only). A general sampler must map a key to one real scalar (checked before the run); a
      `ValueError` is raised after the run if it returned a negative, infinite or NaN time. PH phases that no job
      can enter are left out.
    - `sampling`: `"with_replacement"` (the mean-field model) or `"without_replacement"` ($D$ distinct servers).
    - `max_queue`: largest queue length a server may hold (ring-buffer size), the truncation `top` of a model's
      tables. Chosen from the load, the service SCV, the smallest choice number and $N$ when omitted (deeper for
      few servers, whose queues have geometric tails whatever $d$; for a model given by tables from `model.load()`
      as for exponential service, times the largest batch a move adds); a `ValueError` is raised after the run if
      an arrival found a full queue (a move beyond the truncation).
    - `n_batches`: number of batch means (of equal length, $\ge 30$ recommended) for confidence intervals of a
      single replication (with several, the run after the warm-up is not split). Batches shorter than the
      system's relaxation time give correlated batch means and half-widths that are too narrow: a
      `RuntimeWarning` says so when the lag-1 autocorrelation of the queue length's batch means exceeds 0.6.
    - `progress`: print a progress bar on stderr (the results do not depend on it).
    - `engine`: `"auto"` (the fast engines for `jsmkt.JSQd` and `jsmkt.JSQdPH`, the generic one for other models),
      `"fast"` (JSQ models only) or `"generic"` (any model with tables; for a JSQ model its own tables if it has
      them, else tables written from its parameters, `jsmkt._simulate.jsq_tables`).
    - `percentiles`: the percentiles (in percent, each in (0, 100), e.g. `(50, 99, 99.9)`) of the sojourn (and
      waiting) time to report, with 95 % confidence half-widths; any other is at hand afterwards
      (`SimulationResult.sojourn_time_percentile`).
    - `waiting_times`: also record each job's waiting time (arrival to start of service), for
      `waiting_time_percentiles`; where a job starts service when it reaches the head of its FCFS queue (JSQ
      models, batch arrivals, classes; not batch service or repairable servers). Off by default: it reads one
      more arrival time per departure in the event loop.

    **Returns:** a `jsmkt.SimulationResult`. Sojourn times are those of the jobs that leave during
    `[warmup, t1]` (FCFS, from arrival to departure); a `ValueError` says to raise `t1` when a replication saw no
    job leave, or a single replication's jobs left in only one batch. Without FCFS queues (tables whose jobs move
    between servers, `fcfs=False`) the mean sojourn time is the mean number of jobs over the accepted job rate
    (Little's law) and there are no percentiles. The batch-means half-width of the mean sojourn time is that of a
    ratio estimator (delta method). `events` counts every event processed, the warm-up and the self-loops of
    uniformisation included; `real_events` only those that changed a server or refused a job. `t1` may be at
    most `1e10` mean service times (sojourn times are differences of event times).

    !!! example

        ```python
        model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2)
        res = jsmkt.simulate(model, 1000, 2e3, key=jax.random.key(0), n_replications=4)
        res.mean_sojourn_time, res.mean_sojourn_time_ci
        ```
    """
    # -- arguments
    n = _int_arg("n_servers", n_servers, 1)
    t1 = _real_arg("t1", t1)
    if not t1 > 0:
        raise ValueError(f"t1={t1!r} must be positive (the simulated time horizon)")
    warmup = 0.1 * t1 if warmup is None else _real_arg("warmup", warmup)
    if warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be >= 0")
    if not t1 > warmup:
        raise ValueError(f"t1={t1!r} must exceed warmup={warmup!r} (statistics are taken over [warmup, t1])")
    n_rep = _int_arg("n_replications", n_replications, 1)
    n_batches = _int_arg("n_batches", n_batches, 2)
    if sampling not in _SAMPLING:
        raise ValueError(f"sampling={sampling!r} is not one of {_SAMPLING}")
    replace = sampling == "with_replacement"
    if max_queue is not None:
        max_queue = _int_arg("max_queue", max_queue, 1)
    if not isinstance(progress, bool):
        raise ValueError(f"progress={progress!r} must be True or False")
    if not isinstance(engine, str) or engine not in _ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {_ENGINES}")
    percentiles = _percentile_args(percentiles)
    if not isinstance(waiting_times, bool):
        raise ValueError(f"waiting_times={waiting_times!r} must be True or False")
    if isinstance(key, jax.core.Tracer) or staging():
        raise ValueError(
            ("key is traced: " if isinstance(key, jax.core.Tracer) else "")
            + "simulate was called inside jit/grad/vmap; call it outside JAX transformations (it runs its own "
            "compiled loops and vmaps over replications itself: use n_replications)"
        )
    try:
        keys = jr.split(key, n_rep)
    except Exception as e:  # noqa: BLE001  (any malformed key)
        raise ValueError(f"key={key!r} is not a JAX PRNG key (use jax.random.key(seed))") from e

    # -- model and engine
    if service is None and isinstance(model, AbstractSupermarketModel):
        model.check_values()  # its parameters' errors in the words `solve_fixed_point` uses (instability, ...)
    jsq = _is_jsq(model)
    if engine == "fast" and not jsq:
        raise ValueError(
            f"engine='fast' runs jsmkt.JSQd and jsmkt.JSQdPH only, not a {type(model).__name__}; use engine='auto' "
            "or 'generic' (the generic engine runs any model with simulation tables)"
        )
    if jsq and engine != "generic":
        plan = _fast_plan(model, service, n, n_rep, replace, max_queue, keys, t1, waiting_times)
    elif jsq or hasattr(model, "simulation_tables"):
        plan = _tables_plan(model, service, n, n_rep, replace, max_queue, t1, waiting_times)
    else:
        raise ValueError(
            f"model={model!r} must be a jsmkt.JSQd or jsmkt.JSQdPH, or a model with simulation tables: a "
            f"{type(model).__name__} has no simulation tables (no simulation_tables(top) method), so no engine can "
            "run it"
        )
    per_batch, events, real_events, ends, n_run_batches = _run_chunks(plan, keys, warmup, t1, n_batches, progress)
    return _result(plan, per_batch, events, real_events, ends, n_run_batches, n=n, n_rep=n_rep, t1=t1,
                   warmup=warmup, n_batches=n_batches, sampling=sampling, percentiles=percentiles, model=model)


def _run_chunks(plan: _Plan, keys, warmup: float, t1: float, n_batches: int, progress: bool):
    """Run chunk by chunk: warm-up, then `n_batches` batches of equal length. With several replications the
    confidence intervals come from them and the whole-run averages do not depend on the batches, so the run after
    the warm-up is one batch: at each chunk boundary every replication restarts with its buffers out of the
    processor's caches. Returns the per-batch statistics (cells cut after the last one reached), the events and
    real events of the whole run, the batch ends and the number of batches."""
    n_rep = keys.shape[0]
    devices = tuple(jax.devices())
    devices = devices[: _n_shards(n_rep, len(devices))]
    local = n_rep // len(devices)  # replications per device, whose histograms come back in groups
    groups = max(g for g in range(1, min(local, max(1, _HIST_SECTIONS // len(devices))) + 1) if local % g == 0)
    init, run = _compiled(plan.cfg._replace(hist_groups=groups), devices)
    states = init(plan.params, keys)
    n_run_batches = n_batches if n_rep == 1 else 1
    ends = [warmup + (t1 - warmup) * (i + 1) / n_run_batches for i in range(n_run_batches)]
    ends[-1] = t1
    # With a progress bar, each batch runs in a few sub-chunks (more updates; the run itself is unchanged, since
    # pending events keep their times and random numbers across chunk boundaries).
    sub = max(1, math.ceil(_PROGRESS_UPDATES / (n_run_batches + 1))) if progress else 1
    start = time.perf_counter()
    events = real_events = 0
    per_batch = []
    chunks = ([(0.0, warmup, False)] if warmup > 0 else []) + [
        (lo, hi, True) for lo, hi in zip([warmup] + ends[:-1], ends, strict=True)
    ]
    for i, (lo, hi, keep) in enumerate(chunks):
        total = None
        for j in range(sub):
            t_end = hi if j == sub - 1 else lo + (hi - lo) * (j + 1) / sub
            states, stats = run(plan.params, states, jnp.asarray(t_end, jnp.float64))
            stats = jax.tree_util.tree_map(np.asarray, stats)
            events += int(stats.events.sum())
            real_events += int(stats.real_events.sum())
            total = stats if total is None else _add_stats(total, stats)
            if progress:
                _progress((i + (j + 1) / sub) / len(chunks), t_end, t1, events, start)
        if keep:
            per_batch.append(_trim_cells(total, plan.group))
    if progress:
        sys.stderr.write("\n")
        sys.stderr.flush()
    return per_batch, events, real_events, ends, n_run_batches


def _result(plan: _Plan, per_batch, events: int, real_events: int, ends, n_run_batches: int, *, n: int, n_rep: int,
            t1: float, warmup: float, n_batches: int, sampling: str, percentiles=_PERCENTILES,
            model=None) -> SimulationResult:
    """Refuse a run that overflowed (or met bad service times), then the statistics: per replication r and batch
    b, over the cells up to the last one some server reached (the cells above are 0); the results are padded with
    zeros back to every cell and level. The named observables of `model`'s family are evaluated on the
    occupancies (`_family_metrics`)."""
    max_queue = plan.max_queue
    bad_service = int(per_batch[-1].bad_service.sum())
    if bad_service:
        raise ValueError(
            f"service={plan.service!r}: its sampler returned {bad_service} service time(s) that are negative, "
            "infinite or NaN; a sampler must return finite times >= 0"
        )
    overflow = int(per_batch[-1].overflow.sum())
    if overflow:
        if plan.engine == "fast":
            raise ValueError(
                f"max_queue={max_queue} is too small: {overflow} arrival(s) found a queue of {max_queue} jobs and "
                f"were dropped; raise max_queue (e.g. max_queue={2 * max_queue})"
            )
        raise ValueError(
            f"max_queue={max_queue}{plan.default_note} is too small: {overflow} move(s) beyond the truncation at "
            f"level {max_queue} were refused; raise max_queue (e.g. max_queue={2 * max_queue})"
        )

    batch_len = np.diff(np.asarray([warmup] + ends))  # (B,)
    width = max(s.area.shape[1] for s in per_batch)
    area = np.stack([np.pad(s.area, ((0, 0), (0, width - s.area.shape[1]))) for s in per_batch], axis=1)  # (R, B, C)
    p = area / (n * batch_len[None, :, None])
    level = plan.level[:width]
    if plan.group:  # cells k * m + i
        m = plan.group
        p4 = p.reshape(n_rep, n_run_batches, width // m, m)
        levels = p4.sum(axis=3)  # (R, B, K+1): fraction with exactly k jobs
    else:
        levels = p @ (level[:, None] == np.arange(int(level.max()) + 1)[None, :]).astype(float)
    tails_rb = np.cumsum(levels[..., ::-1], axis=2)[..., ::-1]
    tails_rb[..., 0] = 1.0  # every server has at least 0 jobs (the sum of the levels is 1 only to rounding)
    queue_rb = tails_rb[..., 1:].sum(axis=2) if plan.group else p @ plan.jobs[:width].astype(float)
    accepted = np.stack([s.accepted for s in per_batch], axis=1).astype(float)  # (R, B)
    thr_rb = accepted / (n * batch_len[None, :])
    soj_sum = np.stack([s.soj_sum for s in per_batch], axis=1)  # (R, B)
    n_jobs = np.stack([s.n_jobs for s in per_batch], axis=1)
    counted = n_jobs if plan.fcfs else accepted  # jobs the sojourn time is estimated from
    empty = int((counted.sum(axis=1) == 0).sum())
    what = "left" if plan.fcfs else "was accepted"
    if empty:
        which = f"no job {what}" if n_rep == 1 else f"in {empty} of n_replications={n_rep} replications no job {what}"
        due = (f"about {n * plan.arrival_rate * (t1 - warmup):.3g} arrivals were due per replication"
               if plan.engine == "fast" else
               f"about {n * plan.arrival_rate * (t1 - warmup):.3g} arrival dispatches were due per replication")
        raise ValueError(
            f"{which} during [warmup, t1] = [{warmup:.6g}, {t1:.6g}], so there is no sojourn time to report "
            f"({due}); raise t1"
        )
    if n_rep == 1 and (counted[0] > 0).sum() < 2:
        raise ValueError(
            f"jobs {'left' if plan.fcfs else 'were accepted'} in only one of the n_batches={n_batches} batches of "
            f"[warmup, t1] = [{warmup:.6g}, {t1:.6g}]: batch means give no confidence interval; raise t1 (or lower "
            "n_batches)"
        )
    w = (batch_len / batch_len.sum())[None, :]

    def rep(x):  # time average over the batches of each replication
        return np.tensordot(w[0], x, axes=([0], [1])) if x.ndim > 2 else (w * x).sum(axis=1)

    tails_r, queue_r, cells_r, thr_r = rep(tails_rb), rep(queue_rb), rep(p), rep(thr_rb)
    tails_r[:, 0] = 1.0  # (the batch weights sum to 1 only to rounding)
    if plan.fcfs:
        soj_r = soj_sum.sum(axis=1) / n_jobs.sum(axis=1)
        num_b, den_b = soj_sum[0], n_jobs[0].astype(float)  # batch means of a ratio: sum of times / jobs
    else:  # Little's law: mean jobs / accepted job rate
        soj_r = queue_r / thr_r
        num_b, den_b = queue_rb[0], thr_rb[0]
    phase = plan.kind == "ph"
    if phase:
        phase_rb = np.cumsum(p4[..., ::-1, :], axis=2)[..., ::-1, :][:, :, 1:, :]  # (R, B, K, m)
        phase_r = rep(phase_rb)
    if n_rep >= 2:
        ci_method = "replications"
        tails_ci, cells_ci = _half_width(tails_r), _half_width(cells_r)
        queue_ci, soj_ci = float(_half_width(queue_r)), float(_half_width(soj_r))
        thr_ci = float(_half_width(thr_r))
        phase_ci = _half_width(phase_r) if phase else None
    else:
        ci_method = "batch_means"
        _warn_if_correlated(queue_rb[0], batch_len[0])
        tails_ci, cells_ci = _half_width(tails_rb[0]), _half_width(p[0])
        queue_ci, thr_ci = float(_half_width(queue_rb[0])), float(_half_width(thr_rb[0]))
        phase_ci = _half_width(phase_rb[0]) if phase else None
        # The mean sojourn time is a ratio; the delta method gives its half-width from the batches' residuals,
        # and holds when some batches saw no job leave.
        resid = num_b - soj_r[0] * den_b
        soj_ci = float(_half_width(resid[:, None])[0] / den_b.mean())
    L = max_queue + 1
    above = L - tails_r.shape[1]  # levels no server reached: tails and their half-widths are 0
    tails_r, tails_ci = _pad_levels(tails_r, above, 1), _pad_levels(tails_ci, above, 0)  # (R, K+1), (K+1,)
    if phase:
        if plan.reach is not None and not plan.reach.all():  # phases no job visits: zero columns
            phase_r = _with_zero_phases(phase_r, plan.reach)
            phase_ci = _with_zero_phases(phase_ci, plan.reach)
        phase_r, phase_ci = _pad_levels(phase_r, above, 1), _pad_levels(phase_ci, above, 0)  # (R, K, m), (K, m)
    n_out = plan.out_status.size
    cell_fractions, cell_ci = np.zeros(n_out), np.zeros(n_out)
    out = np.arange(width)
    if plan.reach is not None and not plan.reach.all():  # engine cell k * m + i: reported k * m_out + phase i
        out = (out // plan.m) * plan.reach.size + np.flatnonzero(plan.reach)[out % plan.m]
    cell_fractions[out] = cells_r.mean(axis=0)
    cell_ci[out] = cells_ci

    def reported(x):  # engine cells -> every reported cell
        full = np.zeros(x.shape[:-1] + (n_out,))
        full[..., out] = x
        return Occupancy(full, plan.out_level, plan.out_status, plan.status_names)

    metrics, metrics_ci = _family_metrics(model, reported(cells_r) if n_rep >= 2 else reported(p[0]),
                                          reported(cells_r[0]) if n_rep == 1 else None)
    # Histograms by section: the groups of replications (several replications), else the batches.
    sections = per_batch[0].hist if n_rep >= 2 else np.concatenate([s.hist for s in per_batch], axis=0)
    nb = _N_BINS + 2
    soj_hist = wait_hist = None
    soj_pct = soj_pct_ci = wait_pct = wait_pct_ci = None
    if plan.fcfs:
        soj_hist = sections[:, :nb]
        soj_pct, soj_pct_ci = _percentiles(soj_hist, percentiles, plan.hist_lo, False)
        if plan.cfg.waiting:
            wait_hist = sections[:, nb:]
            wait_pct, wait_pct_ci = _percentiles(wait_hist, percentiles, plan.hist_lo, True)
    return SimulationResult(
        tails=tails_r.mean(axis=0),
        tails_ci=tails_ci,
        phase_tails=phase_r.mean(axis=0) if phase else None,
        phase_tails_ci=phase_ci if phase else None,
        mean_queue_length=float(queue_r.mean()),
        mean_queue_length_ci=queue_ci,
        mean_sojourn_time=float(np.mean(soj_r)),
        mean_sojourn_time_ci=soj_ci,
        sojourn_time_percentiles=soj_pct,
        events=events,
        n_jobs=int(n_jobs.sum()),
        overflow=overflow,
        n_servers=n,
        t1=t1,
        warmup=warmup,
        n_replications=n_rep,
        n_batches=n_run_batches,
        max_queue=max_queue,
        sampling=sampling,
        ci_method=ci_method,
        real_events=real_events,
        throughput=float(thr_r.mean()),
        throughput_ci=thr_ci,
        cell_fractions=cell_fractions,
        cell_fractions_ci=cell_ci,
        cell_level=plan.out_level,
        cell_status=plan.out_status,
        status_names=plan.status_names,
        engine=plan.engine,
        sojourn_time_percentiles_ci=soj_pct_ci,
        waiting_time_percentiles=wait_pct,
        waiting_time_percentiles_ci=wait_pct_ci,
        sojourn_time_histograms=soj_hist,
        waiting_time_histograms=wait_hist,
        histogram_lo=plan.hist_lo,
        metrics=metrics,
        metrics_ci=metrics_ci,
    )


def _family_metrics(model, samples: Occupancy, whole: Occupancy | None) -> tuple[dict, dict]:
    """The named observables of `model`'s family (`AbstractDescribedModel.observables`), the functions its
    mean-field metrics evaluate, on the simulated occupancies, read in the model's cells at its `K` (or at the
    highest level a server reached, if above). With replications (`whole` is `None`, `samples` one occupancy per
    replication), the mean and the Student-t half-width of their values, as for the mean sojourn time. With one
    replication (`samples` one occupancy per batch, `whole` the run's), the value at the whole run's occupancy
    (a ratio of flows is then the ratio of their long-run averages) and the half-width of the batches' residuals
    linearised about it, `grad f(x) . (x_b - x)` (the delta method, which for a ratio is the mean sojourn time's
    interval)."""
    from .._metrics import observable_gradients, observable_values

    if not isinstance(model, AbstractDescribedModel) or not model.observables():
        return {}, {}
    m = model.with_K(max(model.K, samples.top))
    if whole is None:
        values = {k: np.asarray(v, float) for k, v in observable_values(m, samples).items()}
        return ({k: float(v.mean()) for k, v in values.items()},
                {k: float(_half_width(v[:, None])[0]) for k, v in values.items()})
    est = observable_values(m, whole)
    grads = observable_gradients(m, whole)
    dx = np.asarray(m.cells_of(samples)) - np.asarray(m.cells_of(whole))[None, :]  # (B, C)
    return ({k: float(v) for k, v in est.items()},
            {k: float(_half_width((dx @ np.asarray(grads[k], float))[:, None])[0]) for k in est})


# Lag-1 autocorrelation of the batch means above which their confidence intervals are flagged as too narrow (the
# estimate from independent batch means exceeds it with probability 4e-5 for 30 batches, 2e-3 for 10).
_MAX_BATCH_CORRELATION = 0.6


def _warn_if_correlated(means: np.ndarray, batch_len: float) -> None:
    """Warn when the batch means of the queue length are correlated: batches shorter than the system's relaxation
    time give half-widths that are too narrow (at high load, e.g. 60 % coverage instead of 95 %)."""
    x = means - means.mean()
    denom = float(x @ x)
    r1 = float(x[:-1] @ x[1:]) / denom if denom > 0 else 0.0
    if r1 > _MAX_BATCH_CORRELATION:
        warnings.warn(
            f"the {means.size} batch means (batches of {batch_len:.4g} time units) are correlated (lag-1 "
            f"autocorrelation {r1:.2f}): the batches are shorter than the system's relaxation time, so the "
            "confidence intervals are too narrow; raise t1, or use n_replications >= 2",
            RuntimeWarning,
            stacklevel=3,
        )


def _trim_cells(stats: core.Stats, group: int) -> core.Stats:
    """`stats` with the time integrals cut after the last cell some server reached (the cells above are 0); with
    cells ordered by level, `group` per level, after the highest level reached. The statistics then take memory for
    the levels reached, not for `max_queue`."""
    reached = np.flatnonzero(stats.area.any(axis=0))
    last = int(reached[-1]) if reached.size else 0
    width = (last // group + 1) * group if group else last + 1
    return stats._replace(area=stats.area[:, :width].copy())


def _pad_levels(x: np.ndarray, above: int, axis: int) -> np.ndarray:
    """`x` with `above` zero levels appended along its queue-level axis `axis`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, above)
    return np.pad(x, pad)


def _with_zero_phases(x: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """`x` (..., m') over the phases in `reach`, widened to all len(reach) phases with zeros elsewhere."""
    out = np.zeros(x.shape[:-1] + reach.shape, x.dtype)
    out[..., reach] = x
    return out


def _hist_key(x: float) -> int:
    """Histogram key of x > 0: its float64 bits without the low mantissa bits (monotone in x)."""
    return int(np.array(x, np.float64).view(np.int64)) >> (52 - core.HIST_SUB_BITS)


def _hist_edge(key: int) -> float:
    """Smallest float64 with histogram key `key`."""
    return float(np.array(key << (52 - core.HIST_SUB_BITS), np.int64).view(np.float64))


def _percentile(hist: np.ndarray, q: float, hist_lo: int, zero_below: bool = False) -> float:
    """q-th percentile from the log-linear histogram (bin 0: below the range, last bin: above), interpolated
    linearly inside its bin (relative bin width <= 2**-HIST_SUB_BITS). `zero_below`: bin 0 holds zeros (waiting
    times of jobs that did not wait)."""
    total = hist.sum()
    if total == 0:
        return math.nan
    cum = np.cumsum(hist)
    target = q / 100.0 * total
    b = int(np.searchsorted(cum, target))
    n_bins = len(hist) - 2
    if b == 0:
        return 0.0 if zero_below else _hist_edge(hist_lo)
    if b == n_bins + 1:
        return _hist_edge(hist_lo + n_bins)
    lo, hi = _hist_edge(hist_lo + b - 1), _hist_edge(hist_lo + b)
    frac = (target - cum[b - 1]) / hist[b]
    return lo + frac * (hi - lo)


def _percentiles(sections: np.ndarray, qs, hist_lo: int, zero_below: bool) -> tuple[dict, dict]:
    """Percentiles `qs` of the pooled histogram of `sections` (rows: groups of replications, or batches), and 95 %
    half-widths from their spread over the sections (sectioning: the pooled estimate, with the Student-t interval
    of the sections' own estimates; NaN with fewer than two sections that saw jobs)."""
    pooled = sections.sum(axis=0)
    used = sections[sections.sum(axis=1) > 0]
    est, ci = {}, {}
    for q in qs:
        est[q] = float(_percentile(pooled, q, hist_lo, zero_below))
        each = np.array([_percentile(h, q, hist_lo, zero_below) for h in used])
        ci[q] = float(_half_width(each[:, None])[0]) if each.size >= 2 else math.nan
    return est, ci
