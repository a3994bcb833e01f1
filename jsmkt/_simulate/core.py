r"""Event engines of the finite-N simulator (JAX, `lax.while_loop`, batched over replications).

Two exact engines share one state layout and one set of statistics (the generic engine, which runs any model
given by tables, is `jsmkt._simulate.generic`; it shares the random words, histogram bins and chunk semantics):

- **PH service (Markov engine).** The system is a continuous-time Markov chain, simulated by uniformisation:
  events form a Poisson process of rate $N(\lambda + \bar q)$, $\bar q = \max_i(-T_{ii})$. An event is an arrival
  with probability $\lambda/(\lambda + \bar q)$; otherwise it picks a uniformly random server which, when busy in
  phase $i$, moves to phase $j \ne i$ with probability $T_{ij}/\bar q$, completes with probability $T^0_i/\bar q$
  and stays put otherwise (a self-loop). This is the same law as the physical system, with $O(1)$ work per event.
- **General service.** Under FCFS a job's completion time is fixed when it arrives (it starts at the later of its
  arrival and the completion of the job ahead of it; its service time is drawn then), and stored beside its
  arrival time. A server changes only through the arrivals it receives and its own completions, so it is brought
  up to date only when an arrival samples it: the arrival first applies the due completions of the servers it
  samples, one event per loop iteration, then joins the shortest; the completions of servers no arrival samples
  are applied at the end of the chunk. Each server's next completion time is kept in an array of its own, so that
  the due completions are found with one read per sampled server. $O(d)$ work per event, whatever $N$.

Per replication the state holds, for each server, one packed integer `head * C + cell` (the ring-buffer head and
the *cell* `k * m + phase`: the number of jobs `k` and the phase of the job in service, phase 0 when idle; `C` is
the number of cells) and a ring buffer of the arrival times of its at most `max_queue` jobs (FCFS sojourn times),
with general service a second one of their completion times and the completion time of its job in service.
All arrays have a fixed size, so memory does not grow with the run length.

**Random numbers.** Event `e` of a replication uses the words `h(seed, e * W + w)`, `w < W`, of a counter-based
SplitMix64 stream (Steele, Lea & Flood 2014; passes BigCrush) whose 64-bit `seed` is drawn from the replication's
JAX key. Indexing by event number means an event's random numbers do not depend on how events are grouped into
loop iterations, and they cost a few integer operations per word, far less than `jax.random`'s Threefry, which
dominated the loop (`benchmarks/README.md`). The general engine numbers its arrivals instead (completions need no
random numbers), and its service times still come from `jax.random` keys (the sampler's interface),
`fold_in(key, e)` for arrival `e`.

**Speculative blocks (Markov engine).** Events change one server each. A loop iteration evaluates the next
`block` events all at once against the current state, finds the first event that reads a server (a sampled
candidate or the server it serves) changed by an earlier event of the block, and commits the events before it;
those provably saw the same state as in one-by-one processing, and they change distinct servers. The other events
are evaluated again in the next iteration with the same random numbers. With `N` servers about $1.2\sqrt{N}$
events commit per iteration, so the fixed cost of an iteration of XLA's loop is shared by many events.

**One event at a time (Markov engine on a CPU).** The blocks above suit a GPU, where a loop iteration costs
microseconds. On a CPU, `_sequential_chunk` applies the same events, with the same random numbers and so along
the same path, one per iteration of an inner loop that reads and writes single array elements only; XLA then
compiles that loop into one kernel, quicker per event than the blocks (`benchmarks/README.md`).
The state-independent part of the events and their statistics are still computed a block at a time, vectorised,
around the inner loop.

**Batching.** The block Markov engine is written for a batch of replications (leading axis of every state array),
with flat gathers and scatters into the flattened per-server arrays; the sequential one runs the replications one
after another, in place in the batch's flattened ring buffers and histograms (`_sequential_batch`). The general
engine likewise runs unbatched, replication after replication, on a CPU (its loops then compile into single
kernels too, up to 13 sampled servers), and is vmapped over replications elsewhere, with loops of a fixed number
of iterations (a vmapped loop whose condition differs between replications would select every carried array at
each iteration). Either way one compiled loop runs until every replication has reached `t_end`. With several
devices the driver gives each device an equal share of the batch (`shard_map`), so these loops run side by side.

**Chunks.** `run_chunk` advances to `t_end` and stops before the first event later than `t_end`, which stays
pending (its time and random numbers are kept), so splitting a run into chunks does not change it.

Time integrals of the cell counts use $\int_a^b c(t)\,dt = c(b)(b-a) - \sum_{\text{changes}} \Delta c\,(\tau-a)$,
so an event only adds $\pm(\tau - a)$ to the two cells it moves a server between; the counts $c(b)$ are
recounted from the servers at the end of each chunk.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
from jax import lax


_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

# Sojourn-time histogram: log-linear bins read off the bits of the float64 (HdrHistogram style), 2**HIST_SUB_BITS
# bins per octave (relative width <= 0.4 %), no logarithm per event.
HIST_SUB_BITS = 8
_HIST_SHIFT = 52 - HIST_SUB_BITS


class Config(NamedTuple):
    """Static description of a simulation (hashable: one compilation per `Config`)."""

    n: int  # number of servers
    max_queue: int  # ring-buffer capacity per server (largest queue length)
    m: int  # number of service phases (1 for general service)
    max_d: int  # largest choice number
    fixed_d: bool  # every arrival samples exactly max_d servers
    replace: bool  # sample with replacement
    block: int  # events evaluated per loop iteration (sequential PH engine: per iteration of the outer loop)
    n_bins: int  # sojourn-time histogram bins (plus one underflow and one overflow bin)
    sampler: Callable | None  # None: PH service (Markov engine); else general service sampler(key)
    sequential: bool = False  # PH service: one event per loop iteration (CPU) instead of speculative blocks
    waiting: bool = False  # also a histogram of waiting times (arrival to start of service)
    hist_groups: int = 1  # histograms returned per batch of replications (consecutive replications pooled)

    @property
    def hist_size(self) -> int:
        """Histogram bins per replication: sojourn times, then (with `waiting`) waiting times."""
        return (self.n_bins + 2) * (2 if self.waiting else 1)

    @property
    def n_cells(self) -> int:
        return (self.max_queue + 1) * self.m

    @property
    def packed_dtype(self):
        return jnp.int32 if self.max_queue * self.n_cells < 2**31 - 1 else jnp.int64

    @property
    def ring_size(self) -> int:
        return self.n * self.max_queue

    @property
    def n_words(self) -> int:
        """Random words per event."""
        return (_W_FIXED if self.sampler is None else 2) + self.max_d


class Params(NamedTuple):
    """Dynamic (traced) parameters."""

    lam: jax.Array  # arrival rate per server
    alpha: jax.Array  # (m,) initial phase probabilities (PH) / (1,) ones
    T: jax.Array  # (m, m) sub-generator (PH) / (1, 1) unused
    weights: jax.Array  # (max_d,) P(D = j)
    hist_lo: jax.Array  # int64 key (float64 bits >> _HIST_SHIFT) of the lower edge of the histogram


class State(NamedTuple):
    """State of a batch of replications (every field has a leading replication axis)."""

    key: jax.Array  # JAX key of the general service times (event e uses fold_in(key, e))
    seed: jax.Array  # uint64 seed of the event stream
    ctr: jax.Array  # uint64 number of events processed so far
    t: jax.Array  # time of the last event
    a: jax.Array  # start of the current chunk
    packed: jax.Array  # (n,) head * C + cell
    ring: jax.Array  # (n * max_queue,) arrival times
    comp: jax.Array | None  # (n * max_queue,) completion times of the queued jobs (general service), None for PH
    due: jax.Array | None  # (n,) completion time of the job in service, +inf when idle (general service), else None
    next_arr: jax.Array  # next arrival time (general service)
    draw: "_Draw | None"  # random quantities of events ctr .. ctr + block - 1 (PH), None for general service
    marks: jax.Array | None  # (n,) int64 stamps for interference checks (block PH engine), else None
    it: jax.Array  # int64 number of loop iterations so far
    acc: jax.Array  # (C,) time-integral corrections of the cell counts in the current chunk
    soj_sum: jax.Array  # sum of sojourn times of jobs that left in the current chunk
    n_jobs: jax.Array  # number of such jobs
    hist: jax.Array  # (hist_size,) histogram of their sojourn times (and of the waiting times of jobs that started
    #                  service in the chunk)
    events: jax.Array  # events processed in the current chunk (self-loops included)
    real: jax.Array  # real events in the current chunk: a server changed cell, or an arrival was refused
    accepted: jax.Array  # jobs that arrived and joined a queue in the current chunk
    overflow: jax.Array  # arrivals refused because their queue held max_queue jobs (whole run)
    bad_service: jax.Array  # arrivals whose sampled service time was negative, infinite or NaN (whole run)
    blocks: jax.Array  # loop iterations in the current chunk


class Stats(NamedTuple):
    area: jax.Array  # (C,) time integral of the number of servers in each cell over the chunk
    soj_sum: jax.Array
    n_jobs: jax.Array
    hist: jax.Array  # sojourn-time histogram (`run_chunk` pools it over the batch)
    events: jax.Array
    overflow: jax.Array
    bad_service: jax.Array
    blocks: jax.Array
    real_events: jax.Array  # events that changed a server's cell or refused a job (no self-loops)
    accepted: jax.Array  # jobs that arrived and were accepted


# --- random numbers ---------------------------------------------------------------------------------------------


def _words(seed, first, n_events: int, n_words: int):
    """SplitMix64 words for events `first .. first + n_events - 1` of the streams `seed` (any leading shape):
    shape `seed.shape + (n_events, n_words)`, uint64."""
    e = first[..., None] + jnp.arange(n_events, dtype=jnp.uint64)
    idx = e[..., None] * jnp.uint64(n_words) + jnp.arange(1, n_words + 1, dtype=jnp.uint64)
    return _mix(seed[..., None, None] + idx * jnp.uint64(_GAMMA))


def _word(seed, event, word, n_words: int):
    """The word `word` of event `event` (uint64 scalars) among `_words(seed, ..., n_words)`: one word, for a loop
    that needs it for some events only."""
    idx = event * jnp.uint64(n_words) + (word + 1).astype(jnp.uint64)
    return _mix(seed + idx * jnp.uint64(_GAMMA))


def _mix(z):
    z = (z ^ (z >> 30)) * jnp.uint64(_MIX1)
    z = (z ^ (z >> 27)) * jnp.uint64(_MIX2)
    return z ^ (z >> 31)


def _uniform(words):
    """uint64 -> float64 uniform on (0, 1) (53 random bits)."""
    return ((words >> 11).astype(jnp.float64) + 0.5) * 2.0**-53


def _randint(words, n):
    """uint64 -> integer uniform on {0..n-1} (bias below n / 2^53)."""
    return jnp.minimum(jnp.floor(_uniform(words) * n), n - 1).astype(jnp.int32)


def _candidates(cfg: Config, words):
    """Sampled servers, shape `words.shape`, from words of shape (..., max_d)."""
    if cfg.replace:
        return _randint(words, cfg.n)
    # Sequential sampling without replacement: draw i is uniform on the n - i servers not drawn yet, mapped onto
    # them by skipping the earlier draws in increasing order. This gives a uniformly random ordered sample.
    out = [_randint(words[..., 0], cfg.n)]
    for i in range(1, cfg.max_d):
        x = _randint(words[..., i], cfg.n - i)
        prev = jnp.sort(jnp.stack(out, axis=-1), axis=-1)
        for j in range(i):
            x = x + (x >= prev[..., j]).astype(jnp.int32)
        out.append(x)
    return jnp.stack(out, axis=-1)


def _only_chosen(cfg: Config, cands, n_choose):
    """Candidates `(..., max_d)` of arrivals choosing among their first `n_choose` only, for loops that compare all
    `max_d`: the others are replaced by the first, and a repeat of it never wins the first-minimum comparison."""
    if cfg.fixed_d:
        return cands
    return jnp.where(jnp.arange(cfg.max_d, dtype=jnp.int32) < n_choose[..., None], cands, cands[..., :1])


def _categorical(u, cum):
    """Index i with P(i) given by the increments of `cum` (cumulative thresholds without the final 1)."""
    return jnp.sum(u[..., None] >= cum, axis=-1, dtype=jnp.int32)


# --- shared pieces ----------------------------------------------------------------------------------------------


def _flat_offsets(shape: tuple[int, ...], size: int, dtype=jnp.int32):
    """Offsets `r * size` of the replications of a batch of leading shape `shape` into flattened arrays, with a
    trailing axis of length 1 (shape () for an unbatched call)."""
    count = 1
    for s in shape:
        count *= s
    return (jnp.arange(count, dtype=dtype) * size).reshape(shape + (1,)) if shape else jnp.zeros((), dtype)


def _choose(cfg: Config, packed_flat, cands, off, n_choose):
    """Join the shortest of the sampled servers `cands[..., :D]` (first minimum, which is a uniform tie-break
    since the sample is exchangeable); `n_choose` is the choice number D of each arrival (unused when fixed).
    `off` offsets local server numbers into the flattened `packed_flat`."""
    if cfg.max_d == 1:
        return cands[..., 0]
    k = (packed_flat[cands + off[..., None]] % cfg.n_cells) // cfg.m
    if not cfg.fixed_d:
        k = jnp.where(jnp.arange(cfg.max_d, dtype=jnp.int32) < n_choose[..., None], k, jnp.iinfo(jnp.int32).max)
    if cfg.max_d == 2:
        return jnp.where(k[..., 1] < k[..., 0], cands[..., 1], cands[..., 0])
    return jnp.take_along_axis(cands, jnp.argmin(k, axis=-1)[..., None], axis=-1)[..., 0]


def _ring_update(cfg: Config, ring_flat, gn, head, k, joins, deps, tau):
    """Append `tau` to the queue of (flat) server `gn` where `joins`; return the ring and, where `deps`, the
    arrival time of the job at the head of the queue. Writing first is safe: an event either writes (arrival) or
    reads (departure), and a slot written is never the head of a non-empty queue; reading first made XLA copy
    the whole buffer. Other events read slot 0, which stays in cache."""
    Q = cfg.max_queue
    base = gn * Q
    ring_flat = ring_flat.at[jnp.where(joins, base + (head + k) % Q, ring_flat.shape[0])].set(tau, mode="drop")
    return ring_flat, ring_flat[jnp.where(deps, base + head, 0)]


def _hist_bin(cfg: Config, params: Params, x):
    """Histogram bin of positive `x`: 0 below the range, `n_bins + 1` above."""
    key = lax.bitcast_convert_type(x, jnp.int64) >> _HIST_SHIFT
    return jnp.clip(key - params.hist_lo + 1, 0, cfg.n_bins + 1).astype(jnp.int32)


def _finish_block(cfg: Config, params: Params, state: State, tau, done, cf, ct, soj, dep, ovf, arr,
                  hist_base=0, wait=None, starts=None) -> State:
    """Accumulate the statistics of the events marked `done` (departures `dep`, refused arrivals `ovf`, accepted
    arrivals `arr`; real events are those that moved a server between cells or refused an arrival); event arrays
    have shape `lead + (B,)` for state fields with leading shape `lead`. `hist_base` offsets the bins into
    `state.hist` (the sequential engine passes the batch's flat histogram). With `cfg.waiting`, `wait` holds the
    waiting times of the jobs that start service at the events marked `starts`."""
    lead = tau.shape[:-1]
    w = jnp.where(done & (cf != ct), tau - state.a[..., None], 0.0)
    c_off = _flat_offsets(lead, cfg.n_cells)
    acc = state.acc.reshape(-1).at[cf + c_off].add(w).at[ct + c_off].add(-w).reshape(state.acc.shape)
    soj = jnp.where(dep, soj, 1.0)
    h_off = _flat_offsets(lead, cfg.hist_size) + hist_base
    hist = state.hist.reshape(-1).at[_hist_bin(cfg, params, soj) + h_off].add(dep.astype(jnp.int64))
    if cfg.waiting:
        bins = _hist_bin(cfg, params, jnp.where(starts, wait, 1.0)) + (cfg.n_bins + 2) + h_off
        hist = hist.at[bins].add(starts.astype(jnp.int64))
    return state._replace(
        acc=acc,
        soj_sum=state.soj_sum + jnp.sum(jnp.where(dep, soj, 0.0), axis=-1),
        n_jobs=state.n_jobs + jnp.sum(dep, axis=-1, dtype=jnp.int64),
        hist=hist.reshape(state.hist.shape),
        events=state.events + jnp.sum(done, axis=-1, dtype=jnp.int64),
        real=state.real + jnp.sum(done & ((cf != ct) | ovf), axis=-1, dtype=jnp.int64),
        accepted=state.accepted + jnp.sum(arr, axis=-1, dtype=jnp.int64),
        overflow=state.overflow + jnp.sum(ovf, axis=-1, dtype=jnp.int64),
        blocks=state.blocks + 1,
    )


class _Prep(NamedTuple):
    rate: jax.Array  # total event rate N (lam + qbar) of the uniformised chain
    p_arr: jax.Array  # probability that an event is an arrival
    move_cum: jax.Array  # (m, m) thresholds: outcome o < m -> phase o (o == i: stay), o == m -> completion
    alpha_cum: jax.Array  # (m - 1,) thresholds for the initial phase
    d_cum: jax.Array  # (max_d - 1,) thresholds for the choice number (D = 1 + index)


def _prepare(cfg: Config, params: Params) -> _Prep:
    T = params.T
    qbar = jnp.max(-jnp.diagonal(T))
    exit_rates = -jnp.sum(T, axis=1)
    probs = T / qbar + jnp.eye(cfg.m)  # off-diagonal T_ij / qbar, diagonal 1 + T_ii / qbar (stay)
    probs = jnp.concatenate([probs, (exit_rates / qbar)[:, None]], axis=1)  # (m, m + 1)
    move_cum = jnp.cumsum(probs, axis=1)[:, :-1]
    alpha_cum = jnp.cumsum(params.alpha)[:-1]
    d_cum = jnp.cumsum(params.weights)[:-1]
    rate = cfg.n * (params.lam + qbar)
    return _Prep(rate, params.lam / (params.lam + qbar), move_cum, alpha_cum, d_cum)


# --- PH service: uniformisation, speculative blocks -------------------------------------------------------------

# Words of an event: 0 time step, 1 arrival or service, 2 phase move / choice number, 3 initial phase,
# 4.. sampled servers (the first is also the server of a service event).
_W_FIXED = 4


class _Draw(NamedTuple):
    """The state-independent part of the next `block` events (PH engine), each array of shape (..., block)."""

    tau: jax.Array  # event times
    is_arr: jax.Array  # arrival (else service event)
    u_move: jax.Array  # uniform deciding the phase move of a service event
    new_phase: jax.Array  # initial phase of a job starting service
    cands: jax.Array  # (..., block, max_d) sampled servers; cands[..., 0] is also the server of a service event
    n_choose: jax.Array  # choice number D of an arrival


def _markov_draw(cfg: Config, prep: _Prep, seed, ctr, t) -> _Draw:
    """Random quantities of events `ctr .. ctr + block - 1` after an event at time `t` (batched over seeds).
    They are carried in the state from one loop iteration to the next: a loop-carried array is computed once,
    whereas XLA would otherwise recompute them inside every fusion that uses them (several times slower)."""
    words = _words(seed, ctr, cfg.block, cfg.n_words)
    tau = t[..., None] + jnp.cumsum(-jnp.log(_uniform(words[..., 0])) / prep.rate, axis=-1)
    u_move = _uniform(words[..., 2])
    new_phase = _categorical(_uniform(words[..., 3]), prep.alpha_cum)
    n_choose = 1 + _categorical(u_move, prep.d_cum)  # arrivals reuse the service events' uniform
    return _Draw(
        tau=tau,
        is_arr=_uniform(words[..., 1]) < prep.p_arr,
        u_move=u_move,
        new_phase=new_phase,
        cands=_candidates(cfg, words[..., _W_FIXED:]),
        n_choose=n_choose,
    )


def _markov_next(prep: _Prep, state: State):
    """Time of the next (pending) event of each replication."""
    return state.draw.tau[..., 0]


def _markov_block(cfg: Config, params: Params, prep: _Prep, t_end, state: State) -> State:
    """One loop iteration for a batch of R replications (explicitly batched: flat gathers and scatters)."""
    B, N, m, C, Q = cfg.block, cfg.n, cfg.m, cfg.n_cells, cfg.max_queue
    R = state.t.shape[0]
    tau, is_arr, u_move, new_phase, cands, n_choose = state.draw
    j = jnp.arange(B, dtype=jnp.int32)
    off = _flat_offsets((R,), N)  # (R, 1)
    valid = tau <= t_end

    # Every event of the block against the current state.
    packed = state.packed.reshape(-1)
    n = jnp.where(is_arr, _choose(cfg, packed, cands, off, n_choose), cands[..., 0])  # local server
    gn = n + off
    p = packed[gn]
    head = p // C
    cell = p - head * C
    k = cell // m
    ph = cell - k * m
    busy = k > 0
    ok = k < Q
    joins = valid & is_arr & ok
    ovf = valid & is_arr & ~ok
    if m > 1:
        o = _categorical(u_move, prep.move_cum[ph])  # outcome of a service event in phase ph
    else:
        o = (u_move >= prep.move_cum[0, 0]).astype(jnp.int32)
    service = valid & ~is_arr & busy
    dep = service & (o == m)
    move = service & (o < m) & (o != ph)
    k2 = k + joins.astype(k.dtype) - dep.astype(k.dtype)
    if m > 1:
        ph2 = jnp.where((joins & ~busy) | dep, new_phase, jnp.where(move, o, ph))
        ph2 = jnp.where(k2 > 0, ph2, 0)
    else:
        ph2 = jnp.zeros_like(ph)
    head2 = jnp.where(dep, jnp.where(head + 1 == Q, 0, head + 1), head)
    cell2 = k2 * m + ph2
    writes = joins | dep | move

    # Interference: event j reads a server that an earlier event of the block changes. Each server changed is
    # stamped with the iteration number and the first event changing it, `it * B + (B - 1 - j)` (scatter-max), so
    # older stamps need no clearing; writing then reading (no reset) lets XLA update `marks` in place.
    stamp = state.it[:, None] * B
    j64 = j.astype(jnp.int64)
    w_idx = jnp.where(writes, gn, R * N)
    marks = state.marks.reshape(-1).at[w_idx].max(stamp + (B - 1 - j64), mode="drop")
    reads = jnp.where(is_arr[..., None], cands + off[..., None], gn[..., None]) if cfg.max_d > 1 else gn[..., None]
    first = (B - 1) - (marks[reads] - stamp[..., None])  # first event of this iteration changing the server read
    conflict = jnp.any((first >= 0) & (first < j64[:, None]), axis=-1)
    stop = conflict | ~valid
    L = jnp.where(jnp.any(stop, axis=1), jnp.argmax(stop, axis=1), B).astype(jnp.int32)  # (R,)
    commit = j < L[:, None]

    # Commit the prefix; its events change distinct servers.
    new_p = (head2 * C + cell2).astype(packed.dtype)
    # The barrier makes the scatter's indices and values complete before it: fused into the scatter, their reads of
    # `packed` made XLA's GPU backend copy the whole (R, N) array twice per iteration rather than update it in place.
    w_idx, new_p = lax.optimization_barrier((jnp.where(commit & writes, gn, R * N), new_p))
    packed = packed.at[w_idx].set(new_p, mode="drop")
    ring, arrived = _ring_update(cfg, state.ring.reshape(-1), gn, head, k, commit & joins, commit & dep, tau)
    if cfg.waiting:  # the job behind a departing one starts service: the arrival time of the new head
        nxt = commit & dep & (k >= 2)
        started = ring[jnp.where(nxt, gn * Q + head2, 0)]
    last = jnp.take_along_axis(tau, jnp.maximum(L - 1, 0)[:, None], axis=1)[:, 0]
    t = jnp.where(L > 0, last, state.t)
    ctr = state.ctr + L.astype(jnp.uint64)
    state = state._replace(
        it=state.it + 1,
        ctr=ctr,
        t=t,
        packed=packed.reshape(state.packed.shape),
        ring=ring.reshape(state.ring.shape),
        marks=marks.reshape(state.marks.shape),
        draw=_markov_draw(cfg, prep, state.seed, ctr, t),
    )
    waits = {}
    if cfg.waiting:  # a job joining an empty server starts at once; the next one starts at a departure
        waits = dict(wait=jnp.where(nxt, tau - started, 0.0), starts=nxt | (commit & joins & (k == 0)))
    return _finish_block(cfg, params, state, tau, commit, cell, cell2, tau - arrived, commit & dep, commit & ovf,
                         commit & joins, **waits)


# --- PH service: uniformisation, one event at a time (CPU) ------------------------------------------------------


def _div(x, c: int):
    """Truncating division by a constant (of `x`'s dtype). `//` on signed integers emits floor-division fix-ups
    that XLA duplicates into every fusion using the result; the operands here are never negative."""
    return lax.div(x, jnp.asarray(c, x.dtype))


def _sequential_chunk(cfg: Config, params: Params, prep: _Prep, t_end, state: State, r) -> State:
    """Advance replication `r` to `t_end`, one event per iteration of an inner loop. `state` holds that
    replication's fields, except `ring` and `hist`: those of the whole batch, flattened, which the loop reads and
    writes in place at the replication's offsets (slicing them out and back cost more than a short chunk's events).

    An outer `lax.while_loop` iteration draws the state-independent part of the next `block` events at once
    (`_markov_draw`, vectorised: event times, candidate servers with the unused ones of a smaller choice number
    replaced by the first, the initial phase, and the outcome of a service event for every phase the server
    may be in), runs the inner loop over those of them up to `t_end`, then accumulates their statistics at once
    (`_finish_block`) from compact per-event records: the cells the server moved between and the arrival time of
    the job at the head of its queue.

    The inner loop only reads and writes single elements (`dynamic_slice`, `dynamic_update_slice`; no gather,
    scatter or sort) and stays small, so XLA's CPU backend compiles the whole loop into one kernel
    (`xla_cpu_small_call`: the bytes its body accesses in XLA's cost model must stay under 1024), a few tens of
    nanoseconds per event instead of several hundred for a loop run op by op. It applies the events in their order
    with the random numbers of the block engine, so both engines follow the same path. As there, the draw of the
    next block is carried in the state: XLA would otherwise recompute it inside every fusion using it (this made
    the engine twice slower)."""
    B, m, C, Q, D = cfg.block, cfg.m, cfg.n_cells, cfg.max_queue, cfg.max_d
    ring_base = r * cfg.ring_size  # int32: the driver keeps a batch's ring buffers under 2**30 slots

    def queue_length(p):
        return _div(lax.rem(p, jnp.asarray(C, p.dtype)), m)

    def event(table, tau, i, carry):
        """Apply event `i` of the block (row `i` of `table`: is_arr, the D candidates, new phase, outcomes)."""
        packed, ring, rec, arrived = carry[:4]

        def col(c):  # one element of row i: reading the whole row would count its size in every fusion using it
            return lax.dynamic_slice(table, (i, jnp.asarray(c, i.dtype)), (1, 1))[0, 0]

        is_arr = col(0) > 0
        n = col(1)
        if D > 1:  # the first of the shortest sampled queues
            best, k_best = n, queue_length(packed[n])
            for c in range(2, D + 1):
                cand = col(c)
                k_c = queue_length(packed[cand])
                better = k_c < k_best
                best, k_best = jnp.where(better, cand, best), jnp.where(better, k_c, k_best)
            n = jnp.where(is_arr, best, n)
        p = packed[n]
        head = _div(p, C)
        cell = p - head * C
        k = _div(cell, m)
        ph = cell - k * m
        busy = k > 0
        joins = is_arr & (k < Q)
        o = col(2 + D + ph.astype(i.dtype))
        service = ~is_arr & busy
        dep = service & (o == m)
        k2 = k + joins.astype(k.dtype) - dep.astype(k.dtype)
        if m > 1:
            ph = ph.astype(jnp.int32)  # o == ph: a self-loop
            ph2 = jnp.where((joins & ~busy) | dep, col(1 + D), jnp.where(service & (o < m), o, ph))
            ph2 = jnp.where(k2 > 0, ph2, 0).astype(k.dtype)
        else:
            ph2 = jnp.zeros_like(k)
        head2 = jnp.where(dep, jnp.where(head + 1 == Q, 0, head + 1), head)
        cell2 = k2 * m + ph2
        # Append the arrival time where the job joins (slot head + k; other events rewrite that slot unchanged),
        # then read the arrival time of the job at the head (used by departures; see `_ring_update`).
        tail = head + k
        slot = ring_base + n * Q + jnp.where(tail >= Q, tail - Q, tail).astype(jnp.int32)
        ring = ring.at[slot].set(jnp.where(joins, tau[i], ring[slot]))
        arrived = arrived.at[i].set(ring[ring_base + n * Q + head.astype(jnp.int32)])
        packed = packed.at[n].set(head2 * C + cell2)
        cells = jnp.stack([cell, cell2]).astype(jnp.int32)[None]
        rec = lax.dynamic_update_slice(rec, cells, (i, jnp.zeros_like(i)))
        if cfg.waiting:  # the arrival time of the job at the new head (read by departures of a longer queue)
            started = carry[4].at[i].set(ring[ring_base + n * Q + head2.astype(jnp.int32)])
            return packed, ring, rec, arrived, started
        return packed, ring, rec, arrived

    def block(state):
        tau, is_arr, u_move, new_phase, cands, n_choose = state.draw
        cands = _only_chosen(cfg, cands, n_choose)
        outcomes = _categorical(u_move[:, None], prep.move_cum)  # (B, m): the outcome in each phase
        table = jnp.concatenate([is_arr[:, None].astype(jnp.int32), cands, new_phase[:, None], outcomes], axis=1)
        nv = jnp.sum(tau <= t_end, dtype=jnp.int32)  # events of the block up to t_end (tau is increasing)
        carry = (state.packed, state.ring, jnp.zeros((B, 2), jnp.int32), jnp.zeros(B, jnp.float64))
        if cfg.waiting:
            carry = carry + (jnp.zeros(B, jnp.float64),)
        carry = lax.fori_loop(0, nv, functools.partial(event, table, tau), carry)
        packed, ring, rec, arrived = carry[:4]
        done = jnp.arange(B, dtype=jnp.int32) < nv
        cf, ct = rec[:, 0], rec[:, 1]
        dep = done & ~is_arr & (ct // m < cf // m)
        ovf = done & is_arr & (cf // m == Q)
        waits = {}
        if cfg.waiting:  # a job joining an empty server starts at once; the next one starts at a departure
            nxt = dep & (cf // m >= 2)
            waits = dict(wait=jnp.where(nxt, tau - carry[4], 0.0),
                         starts=nxt | (done & is_arr & ~ovf & (cf // m == 0)))
        ctr = state.ctr + nv.astype(jnp.uint64)
        t = jnp.where(nv > 0, tau[jnp.maximum(nv - 1, 0)], state.t)
        state = state._replace(
            ctr=ctr, t=t, packed=packed, ring=ring, draw=_markov_draw(cfg, prep, state.seed, ctr, t)
        )
        return _finish_block(cfg, params, state, tau, done, cf, ct, tau - arrived, dep, ovf, done & is_arr & ~ovf,
                             hist_base=r * cfg.hist_size, **waits)

    return lax.while_loop(lambda s: _markov_next(prep, s) <= t_end, block, state)


# --- general service: completion times fixed at arrival -------------------------------------------------------
#
# Under FCFS a job's completion time is known when it arrives: it starts service at the later of its arrival and
# the completion of the job ahead of it, and its service time is drawn then. A server's queue changes only through
# the arrivals it receives and its own completions, so it need not be followed between the arrivals that sample
# it: an arrival at time `tau` first applies, one per loop iteration, the completions up to `tau` of the servers it
# samples (their queue lengths are then exact at `tau`), then joins the shortest. Completions of servers that no
# arrival samples wait for the end of the chunk (`_general_catch_up`). Every iteration is one event, an arrival or
# a completion, and costs O(d): nothing scans the servers. The loop body handles as few values per sampled server
# as it can (a server number, a queue length, the completion time in service, `State.due`), so that XLA's CPU
# backend compiles it into one kernel up to 13 sampled servers (3 when it carried every field of every sampled
# server through the choice).
#
# The functions below take a replication's state whose `ring`, `comp` and `hist` are either its own (`base` = 0,
# under `vmap`) or the whole batch's, flattened, with the replication at offset `base` (ring slots) and
# `hist_base` (histogram bins), as in the sequential PH engine.


def _general_next(state: State):
    return state.next_arr


def _general_depart(cfg: Config, ring, comp, server, base):
    """Busy `server` (as `_general_read` reads it) completes the job at the head of its queue: its new packed
    state, its new `due` time (the completion of the next job, +inf when none) and the job's sojourn time."""
    s, p, head, k, e = server
    Q = cfg.max_queue
    head2 = jnp.where(head + 1 == Q, 0, head + 1)
    row = base + s * Q
    due2 = jnp.where(k > 1, comp[row + head2.astype(jnp.int32)], jnp.inf)
    return (head2 * cfg.n_cells + k - 1).astype(p.dtype), due2, e - ring[row + head.astype(jnp.int32)]


def _general_read(cfg: Config, packed, due, s):
    """What an event reads of server `s`: (s, packed state, ring-buffer head, queue length, completion time of the
    job in service or +inf)."""
    p = packed[s]
    head = _div(p, cfg.n_cells)
    return s, p, head, p - head * cfg.n_cells, due[s]


def _general_write(packed, due, ring, comp, pending):
    """The writes of an event: packed state `new_p` and completion time in service `new_due` of server `s`; arrival
    and completion times at ring `slot` (out-of-range indices: nothing to write)."""
    s, new_p, new_due, slot, arrived, done = pending
    ring = ring.at[slot].set(arrived, mode="drop")
    comp = comp.at[slot].set(done, mode="drop")
    return packed.at[s].set(new_p, mode="drop"), due.at[s].set(new_due, mode="drop"), ring, comp


def _general_nothing(cfg: Config, packed, ring):
    """Pending writes that write nothing."""
    zero = jnp.zeros((), jnp.float64)
    return jnp.asarray(cfg.n, jnp.int32), packed[0], zero, jnp.asarray(ring.shape[0], jnp.int32), zero, zero


def _general_records(cfg: Config, params: Params, state: State, rec, hist_base) -> State:
    """Statistics of event records (rows: time, sojourn time, queue length before, kind: 0 no event,
    1 completion, 2 arrival, 3 refused arrival; with `cfg.waiting`, the waiting time of an arrival, known when it
    arrives)."""
    kind = rec[:, 3]
    cf = rec[:, 2].astype(jnp.int32)
    ct = cf + jnp.where(kind == 2, 1, jnp.where(kind == 1, -1, 0))
    waits = dict(wait=rec[:, 4], starts=kind == 2) if cfg.waiting else {}
    return _finish_block(cfg, params, state, rec[:, 0], kind > 0, cf, ct, rec[:, 1], kind == 1, kind == 3,
                         kind == 2, hist_base=hist_base, **waits)


def _general_arrivals(cfg: Config, params: Params, prep: _Prep, t_end, state: State, base=0, hist_base=0) -> State:
    """The next `block` arrivals of one replication up to `t_end` (fewer when the completions they bring to light
    fill the `2 * block` events of the loop), with those completions."""
    B, Q, D, C = cfg.block, cfg.max_queue, cfg.max_d, cfg.n_cells
    RB = 2 * B
    words = _words(state.seed, state.ctr, B + 1, cfg.n_words)
    gaps = -jnp.log(_uniform(words[1:, 0])) / (cfg.n * params.lam)
    tau = state.next_arr + jnp.concatenate([jnp.zeros(1), jnp.cumsum(gaps)])  # arrivals ctr .. ctr + B
    cands = _candidates(cfg, words[:B, 2:])
    if not cfg.fixed_d:
        cands = _only_chosen(cfg, cands, 1 + _categorical(_uniform(words[:B, 1]), prep.d_cum))
    # Arrival e draws its service time with key fold_in(key, e), so that chunking does not change the run.
    events = state.ctr + jnp.arange(B, dtype=jnp.uint64)
    keys = jax.vmap(
        lambda e: jr.fold_in(jr.fold_in(state.key, (e >> 32).astype(jnp.uint32)), e.astype(jnp.uint32))
    )(events)
    service = jax.vmap(cfg.sampler)(keys).astype(jnp.float64)
    nv = jnp.sum(tau[:B] <= t_end, dtype=jnp.int32)

    def event(j, carry):
        """Apply the writes of the previous event, then read what this one needs and record its writes. Writing
        first keeps the indices and values of the writes free of reads of the buffers: computed in the same
        iteration they read each other's buffers (a packed state depends on a completion time, the slot of a
        completion time on a packed state), and XLA then copied a buffer at every event."""
        packed, due, ring, comp, i, rec, pending = carry
        packed, due, ring, comp = _general_write(packed, due, ring, comp, pending)
        active = i < nv
        ti = tau[i]
        row_i = jnp.minimum(i, B - 1)

        def cand(c):  # one element: reading the whole row would count its size in every fusion using it
            return lax.dynamic_slice(cands, (row_i, jnp.asarray(c, row_i.dtype)), (1, 1))[0, 0]

        # The event's server: the first sampled one with a completion due by ti, else the first of the shortest.
        # Only server numbers are chosen here, and the chosen server is read again below: each value the loop
        # body handles counts towards XLA's limit on the size of a loop compiled into one kernel.
        def queue_length(s):
            return lax.rem(packed[s], jnp.asarray(C, packed.dtype))

        s_dep = s_arr = cand(0)
        any_due, k_arr = due[s_dep] <= ti, queue_length(s_dep)
        for c in range(1, D):
            s_c = cand(c)
            is_due = due[s_c] <= ti
            s_dep, any_due = jnp.where(is_due & ~any_due, s_c, s_dep), is_due | any_due
            k_c = queue_length(s_c)
            better = k_c < k_arr
            s_arr, k_arr = jnp.where(better, s_c, s_arr), jnp.where(better, k_c, k_arr)
        any_due = any_due & active
        server = _general_read(cfg, packed, due, jnp.where(any_due, s_dep, s_arr))
        s, p, head, k, e = server
        p_dep, due_dep, soj = _general_depart(cfg, ring, comp, server, base)
        # The arrival appends its arrival and completion times at the tail of the queue, unless the queue is full.
        joins = k < Q
        arrive = active & ~any_due & joins
        tail = head + k
        row = base + s * Q
        slot = row + jnp.where(tail >= Q, tail - Q, tail).astype(jnp.int32)
        prev = row + jnp.where(tail > Q, tail - 1 - Q, jnp.where(tail == 0, Q - 1, tail - 1)).astype(jnp.int32)
        done = jnp.where(k > 0, comp[prev], ti) + service[row_i]
        pending = (jnp.where(any_due | arrive, s, cfg.n), jnp.where(any_due, p_dep, p + 1),
                   jnp.where(any_due, due_dep, jnp.where(k > 0, e, done)),
                   jnp.where(arrive, slot, ring.shape[0]), ti, done)
        kind = jnp.where(any_due, 1, jnp.where(active, jnp.where(joins, 2, 3), 0))
        rec_row = [jnp.where(any_due, e, ti), jnp.where(any_due, soj, 1.0), k.astype(jnp.float64),
                   kind.astype(jnp.float64)]
        if cfg.waiting:  # the job starts when the one ahead of it completes (at once at an empty server)
            rec_row.append(jnp.where(k > 0, comp[prev] - ti, 0.0))
        rec_row = jnp.stack(rec_row)
        rec = lax.dynamic_update_slice(rec, rec_row[None], (j, jnp.zeros_like(j)))
        return packed, due, ring, comp, i + (active & ~any_due).astype(i.dtype), rec, pending

    # A fixed number of iterations: under `vmap` a loop whose condition differs between replications selects every
    # carried array between its old and new values at each iteration (an O(N) copy per event).
    carry = (state.packed, state.due, state.ring, state.comp, jnp.zeros((), jnp.int32),
             jnp.zeros((RB, 5 if cfg.waiting else 4), jnp.float64), _general_nothing(cfg, state.packed, state.ring))
    packed, due, ring, comp, i, rec, pending = lax.fori_loop(0, RB, event, carry)
    packed, due, ring, comp = _general_write(packed, due, ring, comp, pending)
    # A sampler's negative, infinite or NaN service times are counted (the driver refuses the run), not repaired.
    bad = ~((service >= 0.0) & (service < jnp.inf)) & (jnp.arange(B, dtype=jnp.int32) < i)
    state = state._replace(
        ctr=state.ctr + i.astype(jnp.uint64), t=jnp.where(i > 0, tau[jnp.maximum(i - 1, 0)], state.t),
        packed=packed, due=due, ring=ring, comp=comp, next_arr=tau[i],
        bad_service=state.bad_service + jnp.sum(bad, dtype=jnp.int64),
    )
    return _general_records(cfg, params, state, rec, hist_base)


def _general_catch_up(cfg: Config, params: Params, t_end, state: State, s, base=0, hist_base=0):
    """Apply the completions up to `t_end` of servers `s`, `s + 1`, ... of one replication, server after server, up
    to `2 * block` of them; return the state and the first server not yet caught up (`n` when done). Run until
    done at the end of a chunk, so that every queue is then exact at `t_end`."""
    RB = 2 * cfg.block

    def event(j, carry):
        packed, due, s, rec, pending = carry
        packed, due, _, _ = _general_write(packed, due, state.ring, state.comp, pending)
        server = _general_read(cfg, packed, due, jnp.minimum(s, cfg.n - 1))
        sc, _, _, k, e = server
        d = (s < cfg.n) & (e <= t_end)
        p_dep, due_dep, soj = _general_depart(cfg, state.ring, state.comp, server, base)
        pending = (jnp.where(d, sc, cfg.n), p_dep, due_dep) + _general_nothing(cfg, packed, state.ring)[3:]
        row = jnp.stack([e, soj, k.astype(jnp.float64), d.astype(jnp.float64)] + [e * 0.0] * cfg.waiting)
        rec = lax.dynamic_update_slice(rec, row[None], (j, jnp.zeros_like(j)))
        return packed, due, s + (~d).astype(s.dtype), rec, pending

    inner = (state.packed, state.due, s, jnp.zeros((RB, 5 if cfg.waiting else 4), jnp.float64),
             _general_nothing(cfg, state.packed, state.ring))
    packed, due, s, rec, pending = lax.fori_loop(0, RB, event, inner)
    packed, due, _, _ = _general_write(packed, due, state.ring, state.comp, pending)
    return _general_records(cfg, params, state._replace(packed=packed, due=due), rec, hist_base), s


def _general_chunk(cfg: Config, params: Params, prep: _Prep, t_end, state: State, base=0, hist_base=0) -> State:
    """Advance one replication to `t_end`: arrivals (with the completions they reveal), then the other
    completions."""
    state = lax.while_loop(
        lambda s: _general_next(s) <= t_end,
        lambda s: _general_arrivals(cfg, params, prep, t_end, s, base, hist_base),
        state,
    )
    state, _ = lax.while_loop(
        lambda c: c[1] < cfg.n,
        lambda c: _general_catch_up(cfg, params, t_end, c[0], c[1], base, hist_base),
        (state, jnp.zeros((), jnp.int32)),
    )
    return state


# --- chunks -----------------------------------------------------------------------------------------------------


def _broadcasting(fn):
    """Trace `fn` with rank promotion allowed: the engines broadcast over replication and event axes on purpose
    (dtype promotion stays as the user set it; the code is written to pass `jax_numpy_dtype_promotion="strict"`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.numpy_rank_promotion("allow"):
            return fn(*args, **kwargs)

    return wrapper


@_broadcasting
def init_state(cfg: Config, params: Params, key) -> State:
    """Empty system at time 0 (one replication; `vmap` it over keys)."""
    key, k_seed, k_arr = jr.split(key, 3)
    general = cfg.sampler is not None
    zero = jnp.zeros((), jnp.float64)
    seed = jr.bits(k_seed, (), jnp.uint64)
    ctr = jnp.zeros((), jnp.uint64)
    return State(
        key=key,
        seed=seed,
        ctr=ctr,
        t=zero,
        a=zero,
        packed=jnp.zeros(cfg.n, cfg.packed_dtype),
        ring=jnp.zeros(cfg.ring_size, jnp.float64),
        # Unused fields are None rather than empty arrays: with jax 0.11, a `shard_map` whose arguments hold a
        # zero-sized array beside others crashes XLA's CPU compiler (segmentation fault).
        comp=jnp.zeros(cfg.ring_size, jnp.float64) if general else None,
        due=jnp.full(cfg.n, jnp.inf, jnp.float64) if general else None,
        next_arr=jr.exponential(k_arr, dtype=jnp.float64) / (cfg.n * params.lam) if general else zero,
        draw=None if general else _markov_draw(cfg, _prepare(cfg, params), seed, ctr, zero),
        marks=None if general or cfg.sequential else jnp.full(cfg.n, -1, jnp.int64),
        it=jnp.zeros((), jnp.int64),
        acc=jnp.zeros(cfg.n_cells, jnp.float64),
        soj_sum=zero,
        n_jobs=jnp.zeros((), jnp.int64),
        hist=jnp.zeros(cfg.hist_size, jnp.int64),
        events=jnp.zeros((), jnp.int64),
        real=jnp.zeros((), jnp.int64),
        accepted=jnp.zeros((), jnp.int64),
        overflow=jnp.zeros((), jnp.int64),
        bad_service=jnp.zeros((), jnp.int64),
        blocks=jnp.zeros((), jnp.int64),
    )


def _sequential_batch(cfg: Config, params: Params, prep: _Prep, t_end, states: State) -> State:
    """Each replication of the batch in turn, one event at a time (`_sequential_chunk` for PH service,
    `_general_chunk` for general service). The small fields of a replication are sliced out and written back; the
    ring buffers, completion times and histograms stay in place, flattened over the batch: slicing them out and
    back copied a replication's whole ring (0.4 MB for N = 1000) per chunk, which cost more than the events of a
    short chunk."""
    n_rep = states.packed.shape[0]
    big = ("ring", "hist") if states.comp is None else ("ring", "hist", "comp")
    small = states._replace(**{f: None for f in big})

    def one(r, carry):
        small, flat = carry
        state = jax.tree_util.tree_map(lambda x: x[r], small)._replace(**flat)
        if cfg.sampler is None:
            state = _sequential_chunk(cfg, params, prep, t_end, state, r)
        else:
            state = _general_chunk(cfg, params, prep, t_end, state, r * cfg.ring_size, r * cfg.hist_size)
        small = jax.tree_util.tree_map(
            lambda xs, x: xs.at[r].set(x), small, state._replace(**{f: None for f in big})
        )
        return small, {f: getattr(state, f) for f in big}

    flat = {f: getattr(states, f).reshape(-1) for f in big}
    small, flat = lax.fori_loop(0, n_rep, one, (small, flat))
    return small._replace(**{f: flat[f].reshape(getattr(states, f).shape) for f in big})


def _harvest(cfg: Config, t_end, state: State) -> tuple[State, Stats]:
    """Close the chunk at `t_end` (one replication): time integrals, then reset the per-chunk accumulators."""
    cells = (state.packed % cfg.n_cells).astype(jnp.int32)
    counts = jnp.zeros(cfg.n_cells, jnp.float64).at[cells].add(1.0)
    area = counts * (t_end - state.a) + state.acc
    stats = Stats(area, state.soj_sum, state.n_jobs, state.hist, state.events, state.overflow, state.bad_service,
                  state.blocks, state.real, state.accepted)
    state = state._replace(
        a=jnp.asarray(t_end, jnp.float64),
        acc=jnp.zeros_like(state.acc),
        soj_sum=jnp.zeros_like(state.soj_sum),
        n_jobs=jnp.zeros_like(state.n_jobs),
        hist=jnp.zeros_like(state.hist),
        events=jnp.zeros_like(state.events),
        real=jnp.zeros_like(state.real),
        accepted=jnp.zeros_like(state.accepted),
        blocks=jnp.zeros_like(state.blocks),
    )
    return state, stats


@_broadcasting
def run_chunk(cfg: Config, params: Params, states: State, t_end) -> tuple[State, Stats]:
    """Advance a batch of replications (leading axis) to `t_end` and return the chunk's statistics, per replication
    except for the sojourn-time histograms, which are pooled over `cfg.hist_groups` groups of consecutive
    replications (shape `(hist_groups, hist_size)`): the percentiles' confidence intervals need no more, and per
    replication and chunk they would be the bulk of what comes back to the host (82 kB each, against 0.4 kB for the
    rest with N = 1000). The first event after `t_end` stays pending."""
    states, stats = _run_chunk(cfg, params, states, t_end)
    return states, stats._replace(hist=pool_histograms(cfg.hist_groups, stats.hist))


def pool_histograms(groups: int, hist):
    """`(R, H)` histograms summed over `groups` groups of consecutive replications (`groups` divides `R`)."""
    R, H = hist.shape
    return jnp.sum(hist.reshape(groups, R // groups, H), axis=1)


def _run_chunk(cfg: Config, params: Params, states: State, t_end) -> tuple[State, Stats]:
    prep = _prepare(cfg, params)
    if cfg.sequential:
        states = _sequential_batch(cfg, params, prep, t_end, states)
    elif cfg.sampler is None:
        states = lax.while_loop(
            lambda s: jnp.any(_markov_next(prep, s) <= t_end),
            lambda s: _markov_block(cfg, params, prep, t_end, s),
            states,
        )
    else:  # one loop over blocks of arrivals for the whole batch (vmapped, its condition would copy the state)
        states = lax.while_loop(
            lambda s: jnp.any(_general_next(s) <= t_end),
            jax.vmap(lambda s: _general_arrivals(cfg, params, prep, t_end, s)),
            states,
        )
        states, _ = lax.while_loop(
            lambda c: jnp.any(c[1] < cfg.n),
            lambda c: jax.vmap(lambda st, s: _general_catch_up(cfg, params, t_end, st, s))(*c),
            (states, jnp.zeros(states.packed.shape[0], jnp.int32)),
        )
    return jax.vmap(lambda s: _harvest(cfg, t_end, s))(states)
