r"""Event engines of the finite-N simulator (JAX, `lax.while_loop`, batched over replications).

Two exact engines share one state layout and one set of statistics:

- **PH service (Markov engine).** The system is a continuous-time Markov chain, simulated by uniformisation:
  events form a Poisson process of rate $N(\lambda + \bar q)$, $\bar q = \max_i(-T_{ii})$. An event is an arrival
  with probability $\lambda/(\lambda + \bar q)$; otherwise it picks a uniformly random server which, when busy in
  phase $i$, moves to phase $j \ne i$ with probability $T_{ij}/\bar q$, completes with probability $T^0_i/\bar q$
  and stays put otherwise (a self-loop). This is the same law as the physical system, with $O(1)$ work per event.
- **General service.** Each busy server holds the completion time of its job in service; the next event is the
  earlier of the next Poisson arrival and the earliest completion ($O(N)$ argmin per event).

Per replication the state holds, for each server, one packed integer `head * C + cell` (the ring-buffer head and
the *cell* `k * m + phase`, the number of jobs `k` and the phase of the job in service, phase 0 when idle; `C` is
the number of cells) and a ring buffer of the arrival times of its `max_queue` waiting/served jobs (FCFS sojourn
times). All arrays have fixed size, so memory does not grow with the run length.

Events are processed in blocks of `block` events: everything that does not depend on the state (random numbers,
event times for the Markov engine, candidate servers, choice numbers, phase moves for every possible phase) is
drawn for the whole block at once, a `lax.scan` applies the events one after the other, and the statistics of the
block (time integrals, sojourn times, histogram) are accumulated afterwards in vectorised form. Events past the
end of the chunk are discarded; this is exact since the arrival process and the uniformised clock are memoryless
and completion times are kept.

Time integrals of the cell counts use $\int_a^b c(t)\,dt = c(b)(b-a) - \sum_{\text{changes}} \Delta c\,(\tau-a)$,
so an event only adds $\pm(\tau - a)$ to the two cells it moves a server between; the counts $c(b)$ are
recounted from the servers at the end of each chunk.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
from jax import lax


_TWO32 = float(2**32)


class Config(NamedTuple):
    """Static description of a simulation (hashable: one compilation per `Config`)."""

    n: int  # number of servers
    max_queue: int  # ring-buffer capacity per server (largest queue length)
    m: int  # number of service phases (1 for general service)
    max_d: int  # largest choice number
    fixed_d: bool  # every arrival samples exactly max_d servers
    replace: bool  # sample with replacement
    block: int  # events per block
    unroll: int  # lax.scan unroll factor
    n_bins: int  # sojourn-time histogram bins (plus one underflow and one overflow bin)
    sampler: Callable | None  # None: PH service (Markov engine); else general service sampler(key)

    @property
    def n_cells(self) -> int:
        return (self.max_queue + 1) * self.m

    @property
    def packed_dtype(self):
        return jnp.int32 if self.max_queue * self.n_cells < 2**31 - 1 else jnp.int64

    @property
    def ring_size(self) -> int:
        return self.n * self.max_queue + 1  # the last slot is a dummy target for writes that do nothing


class Params(NamedTuple):
    """Dynamic (traced) parameters."""

    lam: jax.Array  # arrival rate per server
    alpha: jax.Array  # (m,) initial phase probabilities (PH) / (1,) ones
    T: jax.Array  # (m, m) sub-generator (PH) / (1, 1) unused
    weights: jax.Array  # (max_d,) P(D = j)
    log_lo: jax.Array  # log of the lower edge of the sojourn-time histogram
    bin_scale: jax.Array  # bins per unit of log(sojourn time)


class State(NamedTuple):
    key: jax.Array
    t: jax.Array  # current time
    a: jax.Array  # start of the current chunk
    packed: jax.Array  # (n,) head * C + cell
    ring: jax.Array  # (n * max_queue + 1,) arrival times
    comp: jax.Array  # (n,) completion times (general service), (0,) for PH
    next_arr: jax.Array  # next arrival time (general service)
    acc: jax.Array  # (C,) time-integral corrections of the cell counts in the current chunk
    soj_sum: jax.Array  # sum of sojourn times of jobs that left in the current chunk
    n_jobs: jax.Array  # number of such jobs
    hist: jax.Array  # (n_bins + 2,) histogram of their sojourn times
    events: jax.Array  # events processed in the current chunk (self-loops included)
    overflow: jax.Array  # arrivals refused because their queue held max_queue jobs (whole run)


class Stats(NamedTuple):
    area: jax.Array  # (C,) time integral of the number of servers in each cell over the chunk
    soj_sum: jax.Array
    n_jobs: jax.Array
    hist: jax.Array
    events: jax.Array
    overflow: jax.Array


# --- random numbers ---------------------------------------------------------------------------------------------


def _uniform(bits):
    """uint32 -> float64 uniform on (0, 1)."""
    return (bits.astype(jnp.float64) + 0.5) / _TWO32


def _randint(bits, n):
    """uint32 -> integer uniform on {0..n-1} (n may be an array); bias below n / 2^32."""
    return ((bits.astype(jnp.uint64) * jnp.asarray(n, jnp.uint64)) >> 32).astype(jnp.int32)


def _candidates(cfg: Config, bits):
    """Sampled servers, shape (B, max_d), from bits of shape (B, max_d)."""
    if cfg.replace:
        return _randint(bits, cfg.n)
    # Sequential sampling without replacement: draw i is uniform on the n - i servers not drawn yet, mapped onto
    # them by skipping the earlier draws in increasing order. This gives a uniformly random ordered sample.
    out = [_randint(bits[:, 0], cfg.n)]
    for i in range(1, cfg.max_d):
        x = _randint(bits[:, i], cfg.n - i)
        prev = jnp.sort(jnp.stack(out, axis=1), axis=1)
        for j in range(i):
            x = x + (x >= prev[:, j]).astype(jnp.int32)
        out.append(x)
    return jnp.stack(out, axis=1)


def _categorical(u, cum):
    """Index i with P(i) given by the increments of `cum` (cumulative thresholds without the final 1)."""
    return jnp.sum((u[..., None] >= cum).astype(jnp.int32), axis=-1)


# --- shared pieces ----------------------------------------------------------------------------------------------


def _choose(cfg: Config, packed, cands, n_choose):
    """Join the shortest of the sampled servers (first minimum, which is a uniform tie-break since the sample is
    exchangeable). `n_choose` is the choice number D of this arrival (ignored when fixed)."""
    if cfg.max_d == 1:
        return cands[0]
    C = cfg.n_cells
    k = (packed[cands] % C) // cfg.m
    if not cfg.fixed_d:
        k = jnp.where(jnp.arange(cfg.max_d) < n_choose, k, jnp.iinfo(jnp.int32).max)
    if cfg.max_d == 2:
        return jnp.where(k[1] < k[0], cands[1], cands[0])
    return cands[jnp.argmin(k)]


def _ring_step(cfg: Config, ring, n, head, k, write, tau, is_dep):
    """Write `tau` at the tail of server `n`'s queue when `write`; return the arrival time at its head."""
    Q = cfg.max_queue
    base = n * Q
    pos = jnp.where(write, base + (head + k) % Q, cfg.ring_size - 1)
    ring = ring.at[pos].set(tau)
    # Read after the write: an event either writes (arrival) or reads (departure), and the written slot is never
    # the head of a non-empty queue, so the order does not matter; reading first made XLA copy the whole buffer.
    arrived = ring[base + head]
    return ring, jnp.where(is_dep, tau - arrived, 0.0)


def _finish_block(cfg: Config, params: Params, state: State, tau, valid, cf, ct, soj, dep, ovf, t_end):
    w = jnp.where(valid & (cf != ct), tau - state.a, 0.0)
    acc = state.acc.at[cf].add(w).at[ct].add(-w)
    soj_sum = state.soj_sum + jnp.sum(jnp.where(dep, soj, 0.0))
    n_jobs = state.n_jobs + jnp.sum(dep, dtype=jnp.int64)
    lg = jnp.log(jnp.maximum(soj, 1e-300))
    b = jnp.clip(jnp.floor((lg - params.log_lo) * params.bin_scale) + 1.0, 0.0, cfg.n_bins + 1.0)
    hist = state.hist.at[b.astype(jnp.int32)].add(dep.astype(jnp.int64))
    events = state.events + jnp.sum(valid, dtype=jnp.int64)
    overflow = state.overflow + jnp.sum(ovf, dtype=jnp.int64)
    t = jnp.where(valid[-1], tau[-1], t_end)
    return state._replace(
        t=t, acc=acc, soj_sum=soj_sum, n_jobs=n_jobs, hist=hist, events=events, overflow=overflow
    )


# --- PH service: uniformisation ---------------------------------------------------------------------------------


class _Prep(NamedTuple):
    rate: jax.Array  # total event rate N (lam + qbar)
    p_arr: jax.Array  # probability that an event is an arrival
    move_cum: jax.Array  # (m, m) thresholds: outcome o < m -> phase o (o == i: stay), o == m -> completion
    alpha_cum: jax.Array  # (m - 1,) thresholds for the initial phase
    d_cum: jax.Array  # (max_d - 1,) thresholds for the choice number (D = 1 + index)


def _prepare(cfg: Config, params: Params) -> _Prep:
    T = params.T
    m = cfg.m
    qbar = jnp.max(-jnp.diagonal(T))
    exit_rates = -jnp.sum(T, axis=1)
    probs = T / qbar + jnp.eye(m)  # off-diagonal T_ij / qbar, diagonal 1 + T_ii / qbar (stay)
    probs = jnp.concatenate([probs, (exit_rates / qbar)[:, None]], axis=1)  # (m, m + 1)
    move_cum = jnp.cumsum(probs, axis=1)[:, :-1]
    alpha_cum = jnp.cumsum(params.alpha)[:-1]
    d_cum = jnp.cumsum(params.weights)[:-1]
    rate = cfg.n * (params.lam + qbar)
    return _Prep(rate, params.lam / (params.lam + qbar), move_cum, alpha_cum, d_cum)


def _markov_block(cfg: Config, params: Params, prep: _Prep, t_end, state: State) -> State:
    B, m, C, Q = cfg.block, cfg.m, cfg.n_cells, cfg.max_queue
    key, sub = jr.split(state.key)
    n_words = 4 + cfg.max_d
    bits = jr.bits(sub, (B, n_words), jnp.uint32)
    tau = state.t + jnp.cumsum(-jnp.log(_uniform(bits[:, 0])) / prep.rate)
    valid = tau <= t_end
    is_arr = _uniform(bits[:, 1]) < prep.p_arr
    u_move = _uniform(bits[:, 2])  # phase move of a service event / choice number of an arrival
    new_phase = _categorical(_uniform(bits[:, 3]), prep.alpha_cum) if m > 1 else jnp.zeros(B, jnp.int32)
    cands = _candidates(cfg, bits[:, 4:])  # cands[:, 0] is also the server of a service event
    n_choose = 1 + _categorical(u_move, prep.d_cum) if not cfg.fixed_d else jnp.zeros(B, jnp.int32)
    moves = _categorical(u_move[:, None], prep.move_cum[None, :, :])  # (B, m): outcome for each phase

    def step(carry, x):
        packed, ring = carry
        tau_j, valid_j, arr_j, newph_j, cands_j, nch_j, moves_j = x
        n = jnp.where(arr_j, _choose(cfg, packed, cands_j, nch_j), cands_j[0])
        p = packed[n]
        head = p // C
        cell = p - head * C
        k = cell // m
        ph = cell - k * m
        o = moves_j[ph] if m > 1 else moves_j[0]
        busy = k > 0
        ok = k < Q
        dep = valid_j & ~arr_j & busy & (o == m)
        move = ~arr_j & busy & (o < m)
        joins = valid_j & arr_j & ok
        k2 = k + joins.astype(k.dtype) - dep.astype(k.dtype)
        if m > 1:
            ph2 = jnp.where(arr_j, jnp.where(busy, ph, newph_j), jnp.where(dep, newph_j, jnp.where(move, o, ph)))
            ph2 = jnp.where(valid_j & (k2 > 0), ph2, jnp.where(k2 > 0, ph, 0))
        else:
            ph2 = jnp.zeros_like(ph)
        head2 = jnp.where(dep, jnp.where(head + 1 == Q, 0, head + 1), head)
        cell2 = k2 * m + ph2
        packed = packed.at[n].set((head2 * C + cell2).astype(packed.dtype))
        ring, soj = _ring_step(cfg, ring, n, head, k, joins, tau_j, dep)
        ovf = valid_j & arr_j & ~ok
        return (packed, ring), (cell, cell2, soj, dep, ovf)

    xs = (tau, valid, is_arr, new_phase, cands, n_choose, moves)
    (packed, ring), (cf, ct, soj, dep, ovf) = lax.scan(
        step, (state.packed, state.ring), xs, unroll=cfg.unroll
    )
    state = state._replace(key=key, packed=packed, ring=ring)
    return _finish_block(cfg, params, state, tau, valid, cf, ct, soj, dep, ovf, t_end)


# --- general service: completion times --------------------------------------------------------------------------


def _general_block(cfg: Config, params: Params, prep: _Prep, t_end, state: State) -> State:
    B, C, Q = cfg.block, cfg.n_cells, cfg.max_queue
    key, sub, skey = jr.split(state.key, 3)
    bits = jr.bits(sub, (B, 2 + cfg.max_d), jnp.uint32)
    gaps = -jnp.log(_uniform(bits[:, 0])) / (cfg.n * params.lam)
    n_choose = 1 + _categorical(_uniform(bits[:, 1]), prep.d_cum) if not cfg.fixed_d else jnp.zeros(B, jnp.int32)
    cands = _candidates(cfg, bits[:, 2:])
    service = jax.vmap(cfg.sampler)(jr.split(skey, B)).astype(jnp.float64)

    def step(carry, x):
        packed, ring, comp, next_arr = carry
        gap_j, cands_j, nch_j, svc_j = x
        nc = jnp.argmin(comp)
        tc = comp[nc]
        arr = next_arr <= tc
        tau = jnp.where(arr, next_arr, tc)
        valid = tau <= t_end
        n = jnp.where(arr, _choose(cfg, packed, cands_j, nch_j), nc)
        p = packed[n]
        head = p // C
        k = p - head * C
        ok = k < Q
        joins = valid & arr & ok
        dep = valid & ~arr
        k2 = k + joins.astype(k.dtype) - dep.astype(k.dtype)
        head2 = jnp.where(dep, jnp.where(head + 1 == Q, 0, head + 1), head)
        packed = packed.at[n].set((head2 * C + k2).astype(packed.dtype))
        starts = (joins & (k == 0)) | (dep & (k2 > 0))
        new_comp = jnp.where(starts, tau + svc_j, jnp.where(dep, jnp.inf, comp[n]))
        comp = comp.at[n].set(new_comp)
        next_arr = jnp.where(valid & arr, tau + gap_j, next_arr)
        ring, soj = _ring_step(cfg, ring, n, head, k, joins, tau, dep)
        ovf = valid & arr & ~ok
        return (packed, ring, comp, next_arr), (tau, valid, k, k2, soj, dep, ovf)

    carry = (state.packed, state.ring, state.comp, state.next_arr)
    (packed, ring, comp, next_arr), (tau, valid, cf, ct, soj, dep, ovf) = lax.scan(
        step, carry, (gaps, cands, n_choose, service), unroll=cfg.unroll
    )
    state = state._replace(key=key, packed=packed, ring=ring, comp=comp, next_arr=next_arr)
    return _finish_block(cfg, params, state, tau, valid, cf, ct, soj, dep, ovf, t_end)


# --- chunks -----------------------------------------------------------------------------------------------------


def init_state(cfg: Config, params: Params, key) -> State:
    """Empty system at time 0 (one replication)."""
    key, sub = jr.split(key)
    general = cfg.sampler is not None
    first_arrival = jr.exponential(sub, dtype=jnp.float64) / (cfg.n * params.lam)
    zero = jnp.zeros((), jnp.float64)
    return State(
        key=key,
        t=zero,
        a=zero,
        packed=jnp.zeros(cfg.n, cfg.packed_dtype),
        ring=jnp.zeros(cfg.ring_size, jnp.float64),
        comp=jnp.full(cfg.n if general else 0, jnp.inf),
        next_arr=first_arrival if general else zero,
        acc=jnp.zeros(cfg.n_cells, jnp.float64),
        soj_sum=zero,
        n_jobs=jnp.zeros((), jnp.int64),
        hist=jnp.zeros(cfg.n_bins + 2, jnp.int64),
        events=jnp.zeros((), jnp.int64),
        overflow=jnp.zeros((), jnp.int64),
    )


def _harvest(cfg: Config, t_end, state: State) -> tuple[State, Stats]:
    """Close the chunk at `t_end`: time integrals, then reset the per-chunk accumulators."""
    cells = (state.packed % cfg.n_cells).astype(jnp.int32)
    counts = jnp.zeros(cfg.n_cells, jnp.float64).at[cells].add(1.0)
    area = counts * (t_end - state.a) + state.acc
    stats = Stats(area, state.soj_sum, state.n_jobs, state.hist, state.events, state.overflow)
    state = state._replace(
        a=jnp.asarray(t_end, jnp.float64),
        acc=jnp.zeros_like(state.acc),
        soj_sum=jnp.zeros_like(state.soj_sum),
        n_jobs=jnp.zeros_like(state.n_jobs),
        hist=jnp.zeros_like(state.hist),
        events=jnp.zeros_like(state.events),
    )
    return state, stats


def run_chunk(cfg: Config, params: Params, states: State, t_end) -> tuple[State, Stats]:
    """Advance a batch of replications (leading axis) to `t_end` and return the chunk's statistics."""
    prep = _prepare(cfg, params)
    block = _general_block if cfg.sampler is not None else _markov_block
    body = jax.vmap(lambda s: block(cfg, params, prep, t_end, s))
    states = lax.while_loop(lambda s: jnp.any(s.t < t_end), body, states)
    return jax.vmap(lambda s: _harvest(cfg, t_end, s))(states)
