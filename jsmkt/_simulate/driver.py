"""`simulate`: its arguments, the chunked run and the result (the plan in `plan`, the limits in `limits`, the
estimators in `statistics`)."""

import functools
import math
import sys
import time

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import _maps
from .._distributions.ph import PH
from .._errors import staging
from .._models.base import AbstractDescribedModel, Occupancy
from . import core, generic
from .limits import _int_arg, _real_arg
from .plan import _n_shards, _Plan, plan_run
from .result import SimulationResult
from .service import GeneralService
from .statistics import (
    _N_BINS,
    _PERCENTILES,
    _half_width,
    _pad_levels,
    _percentile_args,
    _percentiles,
    _trim_cells,
    _warn_if_correlated,
    _with_zero_phases,
)


_SAMPLING = ("with_replacement", "without_replacement")
_ENGINES = ("auto", "fast", "generic")
_PROGRESS_UPDATES = 100  # about this many progress-bar updates per run
_HIST_SECTIONS = 32  # most groups of replications whose histograms come back apart (percentiles' intervals)


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
    # may update the server array in place, saving a copy per event (`benchmarks/README.md`). Not for the stores of
    # servers whose waiting jobs start in random order (`generic._random_order_jobs`): with it, that loop's reads
    # of a store after its writes saw other values (a run's job times then depended on its chunks).
    ordered = isinstance(cfg, generic.Config) and cfg.structure.random_order
    opts = ({"xla_cpu_copy_insertion_use_region_analysis": True}
            if (cfg.sequential or getattr(cfg, "sampler", None)) and not ordered else None)
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
    (`jsmkt.deterministic`, `jsmkt.lognormal`, `jsmkt.GeneralService`); a family is run so when its
    `jsq_fast_path()` says it is JSQ(d). Any other model runs on the generic engine from its simulation tables
    (a `jsmkt._simulate.tables.SimTables`: the cells of one server, its local events, and the dispatch streams that
    sample servers, compare their keys and move the chosen one): those of its description
    (`jsmkt._simulate.described`), or `model.simulation_tables(top)` for a model given by tables. The system
    starts empty; statistics are time averages over `[warmup, t1]`.

    This code path is independent of the mean-field solvers: it reads `lam`, `mu`/`service` and the choice rule's
    weights from a JSQ model, or the tables of another. It runs one compiled loop per time chunk (the warm-up,
    then each batch), on CPU or GPU, with memory independent of `t1`. The fast JSQ engines simulate PH service by
    uniformisation ($O(1)$ work per event, the phase of each server tracked): on a CPU, for choice numbers up to
    12, one event at a time, replication after replication; otherwise in speculative blocks batched over
    replications. General service is simulated by completion times fixed when each job arrives (FCFS), a server
    being brought up to date when an arrival samples it ($O(d)$ work per event). The generic engine uniformises
    the servers' clocks and the dispatch streams ($O(D)$ work per event; on a CPU one event at a time, elsewhere
    vmapped over replications); for tables without FCFS queues (the retrial family, whose rates grow with the
    orbit) it draws each server's events at the server's own rate instead, from a sum tree of the servers' rate
    bounds ($O(D + \log N)$ work per event, at most one clock event in eight a self-loop). All are exact: see
    `jsmkt._simulate.core` and `jsmkt._simulate.generic`. With
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

    - `model`: a family (`jsmkt.AbstractDescribedModel`: `jsmkt.JSQd`, `jsmkt.JSQdPH`, ...), or a model with a
      method `simulation_tables(top)` (and `load()`, for the default `max_queue`); concrete parameters.
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
      as for exponential service, times the largest batch a move adds; for a family whose rates grow with the
      level, `rates_grow_with_level()`, where the mean field's tail falls below `1e-12 / N`); a `ValueError` is
      raised after the run if an arrival found a full queue (a move beyond the truncation).
    - `n_batches`: number of batch means (of equal length, $\ge 30$ recommended) for confidence intervals of a
      single replication (with several, the run after the warm-up is not split). Batches shorter than the
      system's relaxation time give correlated batch means and half-widths that are too narrow: a
      `RuntimeWarning` says so when the lag-1 autocorrelation of the queue length's batch means exceeds 0.6.
    - `progress`: print a progress bar on stderr (the results do not depend on it).
    - `engine`: `"auto"` (the fast engines for `jsmkt.JSQd` and `jsmkt.JSQdPH`, the generic one for other models),
      `"fast"` (JSQ models only) or `"generic"` (any model with tables; for a JSQ model with a `service` override,
      tables written from its parameters, `jsmkt._simulate.jsq_tables`).
    - `percentiles`: the percentiles (in percent, each in (0, 100), e.g. `(50, 99, 99.9)`) of the sojourn (and
      waiting) time to report, with 95 % confidence half-widths; any other is at hand afterwards
      (`SimulationResult.sojourn_time_percentile`).
    - `waiting_times`: also record each job's waiting time (arrival to start of service), for
      `waiting_time_percentiles`; where a job starts service when it reaches the head of its FCFS queue (JSQ
      models, batch arrivals, classes; not batch service or repairable servers), or when its server starts it
      among its waiting jobs in random order (own-orbit retrials). Off by default: it reads one more arrival time
      per departure in the event loop.

    **Returns:** a `jsmkt.SimulationResult`. Sojourn times are those of the jobs that leave during
    `[warmup, t1]` (FCFS, from arrival to departure); a `ValueError` says to raise `t1` when a replication saw no
    job leave, or a single replication's jobs left in only one batch. Servers whose waiting jobs start in random
    order (own-orbit retrials: `Description.random_order`) record each job's times as well, a waiting job that
    starts service being drawn uniformly. Where jobs move between servers (tables with `fcfs=False` otherwise,
    e.g. re-probing retrials) the mean sojourn time is the mean number of jobs over the accepted job rate
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
    plan = plan_run(model, service, n, n_rep, replace, max_queue, keys, t1, waiting_times, engine)
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
    counted = n_jobs if plan.per_job else accepted  # jobs the sojourn time is estimated from
    empty = int((counted.sum(axis=1) == 0).sum())
    what = "left" if plan.per_job else "was accepted"
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
            f"jobs {'left' if plan.per_job else 'were accepted'} in only one of the n_batches={n_batches} batches of "
            f"[warmup, t1] = [{warmup:.6g}, {t1:.6g}]: batch means give no confidence interval; raise t1 (or lower "
            "n_batches)"
        )
    w = (batch_len / batch_len.sum())[None, :]

    def rep(x):  # time average over the batches of each replication
        return np.tensordot(w[0], x, axes=([0], [1])) if x.ndim > 2 else (w * x).sum(axis=1)

    tails_r, queue_r, cells_r, thr_r = rep(tails_rb), rep(queue_rb), rep(p), rep(thr_rb)
    tails_r[:, 0] = 1.0  # (the batch weights sum to 1 only to rounding)
    if plan.per_job:
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
    if plan.per_job:
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
