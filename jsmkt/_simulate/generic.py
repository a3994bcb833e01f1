r"""The generic event engine: any model family given as `SimTables`, executed server by server.

**The system.** $N$ servers, each in a cell $c$ (`0..C-1`). Two kinds of events change them:

- *per-server clocks*, uniformised at rate $u$ per server: at an event of its clock a server in cell $c$ takes
  action $a$ with probability `act_prob[c, a]` (moving to `act_target[c, a]`) and stays put otherwise (a
  self-loop); an action may make the server the *origin* of a dispatch stream (`act_stream`), executed right
  after the server's own move (and only if that move was not refused);
- *dispatch streams* $s$ at rate `stream_rate[s]` per server: a dispatch draws $D$ from `choice[s]`, samples $D$
  servers (with or without replacement), compares their keys `key[s, cell]` (lower preferred, `INELIGIBLE` never
  chosen) and moves the chosen server from $c$ to `eff_target[s, c, e]` with probability `eff_prob[s, c, e]`. If
  no sampled server is eligible, nothing happens to them.

Events form one Poisson process of rate $N\Lambda$, $\Lambda = \sum_s$ `stream_rate[s]` $+ u$: an event is
stream $s$ with probability `stream_rate[s]` $/\Lambda$, otherwise the clock of a uniformly chosen server (tables
without FCFS queues draw the clocks' events exactly instead, below: `Config.exact`). This is
the law of the physical system, with $O(D)$ work per event. A move to `OVERFLOW` (beyond the truncation) is
refused and counted, and the driver raises after the run.

**Rows.** The clock is handled as one more stream (row `S`) whose "dispatch" samples one server and whose key
is 0 for every cell: every event then runs the same code, a choice among its sampled servers followed by a
categorical draw in the row `(r, c)` of a merged move table (`tables.Structure`), the clock's self-loop being an
entry whose target is the cell itself. The first minimum of the keys is a uniform tie-break, since the sample is
exchangeable (as in `core._choose`); when $D$ varies, the unused candidates are replaced by the first, which
never wins a strict comparison (`core._only_chosen`).

**FCFS queues.** With `fcfs`, each server keeps a ring buffer of the arrival times of its jobs (the packed state
is `head * C + cell`). A move that raises the server's jobs by $j$ stamps $j$ slots at the tail with the current
time, one that lowers them by $j$ removes the $j$ oldest jobs, whose sojourn times are recorded: the largest
changes are static (`Structure.up`, `.down`), so both are unrolled. Where jobs move between servers (a stream
with an origin) there is no FCFS queue to keep, and the driver reports the mean sojourn time by Little's law.

**Random order** (`Structure.random_order`: servers whose waiting jobs start in random order, as own-orbit
retrials; run by the exact engine below). Each server keeps a store of the arrival times of its jobs in the ring
buffer's place, `Structure.slots` per server: slot 0 the job in service (where its cell has one), slots
$1..w$ its $w$ waiting jobs, in no order. A move is, by its cells' jobs in service and waiting
(`tables.ORDER_MOVES`): the job in service completes (its sojourn time is recorded from slot 0); a waiting job
starts service, the one in slot $r$, $r$ uniform on $1..w$ (its waiting time is recorded, slot 0 takes its
arrival time, slot $r$ the last one's, slot $w$): so the job that starts is uniform among the waiting whatever
their order; an arriving job starts service at once (slot 0, a waiting time of 0) or waits (slot $w + 1$). The
event loop only records the server it moved; a loop of its own then updates the stores and histograms, event
by event, after each block (`_random_order_jobs`), drawing $r$ from a word its event left unused.

**One event at a time (CPU).** As `core._sequential_chunk`: an outer `lax.while_loop` iteration draws the
state-independent part of the next `block` events at once (event times, the row, candidates with the unused ones
masked, the uniforms of the moves; `_draw`, vectorised, carried in the state), an inner loop applies the events
up to `t_end` one per iteration, reading and writing single array elements only (no gather, scatter or sort), so
that XLA's CPU backend compiles it into one kernel, and the statistics are accumulated a block at a time from
compact per-event records (the cells moved between, the arrival times of departing jobs). The move tables are
arguments, not constants: XLA counts a constant in full towards the size of a loop it compiles into one kernel.
Elsewhere (GPU) the same events are applied by a loop of exactly `block` iterations, vmapped over replications,
those after `t_end` masked (a vmapped loop whose trip count differs between replications selects every carried
array at each iteration).

**Exact selection of the clocks (tables without FCFS queues, pool or global phase: `Config.exact`).** Uniformised
at the largest rate $u$ of a cell, a server whose cell has rate $r_c$ fires a self-loop at rate $u - r_c$: where rates
grow with the level (orbit retrials at $j\theta$, $u = \mu + K\theta$) most events are self-loops. Instead, each cell
gets an integer weight $w_c$ with $q w_c \ge r_c$ (`clock_weights`: $q$ at most an eighth of the smallest positive
rate, so at most one clock event in eight is a self-loop; $w_c = 0$ where nothing happens), and the state holds a
sum tree of the servers' weights (`State.tree`, integers, so its sums are exact). Events then form a Poisson
process of the state-dependent rate $\Lambda = N \sum_s$ `stream_rate[s]` $+ qW$, $W$ the total weight, constant
between events: the next event comes after an exponential time of rate $\Lambda$ (drawn as a unit exponential, its
rate applied when the event before it is done); it is the clocks' with probability $qW/\Lambda$, else stream $s$
with probability `stream_rate[s]` / $\sum_s$ `stream_rate[s]`; the clocks' event is server $i$'s with probability
$w_{c(i)}/W$ (a walk down the tree with a uniform integer below $W$), which takes action $a$ with probability
$r_{c,a}/(q w_c)$ and stays put otherwise. So server $i$'s action $a$ occurs at rate $r_{c(i),a}$ whatever the other
servers do, and a stream at its rate: the law of the system, exactly (a uniformisation of the chain whose bound
follows the state, changing only at events). A server's move changes its weight, and the tree above its leaf (one
addition per level). A dispatch started by a server's action runs in the next loop iteration, with the random
numbers of the same event (the candidates and choice number the clock event left unused, and a move uniform of its
own), so that an iteration writes one server once; and an iteration applies the move the previous one decided
before deciding its own (`_block_exact`): every write of an array then precedes the reads of it in an iteration,
and XLA neither copies the server array nor recomputes the decision in every fusion that uses it, which kept the
event loop of a model with an origin from compiling into one kernel (a copy of the $N$ servers at every event). The
tree's walks are loops over its levels, so an event costs $O(\log N)$ and the loop's size does not grow with $N$.

**A pool of units** (`tables` module docstring): the state also holds the number of units held and the list of
the waiting servers (with each server's position in it, so that adding and removing are $O(1)$). After the
event's move, a server entering a held cell with no unit free is redirected, and a unit freed goes to the waiting
server at a uniformly drawn position of the list: one more move, recorded like the others (the list has one
scratch slot, where the writes of an event that changes nothing go). XLA copies the server and list arrays at every
event of a model with a pool, so its event loop is not one kernel (about a tenth of the events per second).

**A global phase** (`tables` module docstring: a BMAP's phase, which modulates the streams). Each stream is drawn
at the largest of its rates over the phases and thinned: with the event's uniform, `_draw` finds, vectorised, the
outcome of the event in each phase it may find (the next phase, or "does not fire"), and the loop reads the one
of the current phase, a single element: the phase adds one read, a comparison and a select to an event, and the
loop stays one kernel. An event that does not fire moves no server; one that fires moves the phase, whether or not
a sampled server is eligible (the phase's silent moves are a stream with no eligible cell). The state holds the
phase; the system starts with the phase drawn from `phase_init`.

**Random numbers, chunks, statistics.** Event `e` uses the SplitMix64 words `h(seed, e * W + w)` of
`core._words`; a pending event past `t_end` keeps its time and words, so chunking does not change the run (with
`exact`, its time is known once the event before it is done, and is kept in the state). Time
integrals of the cell counts use the same trick as `core`: each move adds $\pm(\tau - a)$ to the two cells it
moves a server between, and the counts are recounted at the end of a chunk. *Real events* are those that
changed a server's cell or refused a job; the others are self-loops (of the uniformised clocks, or dispatches
that found no eligible server or whose effect kept the server in place).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax

from . import core
from .tables import INELIGIBLE, Structure


class Config(NamedTuple):
    """Static description of a generic run (hashable: one compilation per `Config`)."""

    n: int  # number of servers
    structure: Structure  # the integer tables
    replace: bool  # sample with replacement
    block: int  # events drawn per iteration of the outer loop
    n_bins: int  # sojourn-time histogram bins (plus one underflow and one overflow bin)
    sequential: bool  # one event per loop iteration, replication after replication (CPU); else vmapped
    waiting: bool = False  # also a histogram of waiting times (the time to reach the head of the queue)
    hist_groups: int = 1  # histograms returned per batch of replications (`core.run_chunk`)
    # the clock's events are drawn server by server from a sum tree of integer rate bounds (`_block_exact`), rather
    # than uniformised at the largest rate of a cell; no FCFS queues, pool or global phase
    exact: bool = False

    @property
    def tree_size(self) -> int:
        """Leaves of the sum tree of `exact` (a power of 2, at least 2 and `n`); its internal nodes are 1..size-1."""
        return max(2, 1 << (self.n - 1).bit_length())

    @property
    def hist_size(self) -> int:
        return (self.n_bins + 2) * (2 if self.waiting else 1)

    @property
    def max_d(self) -> int:
        return self.structure.max_d

    @property
    def fixed_d(self) -> bool:  # the clock samples one server: candidates are masked unless max_d == 1
        return self.max_d == 1

    @property
    def n_cells(self) -> int:
        return self.structure.n_cells

    @property
    def ring_size(self) -> int:
        """Slots of the ring buffers (FCFS) or of the random-order stores of the `n` servers (else 0)."""
        s = self.structure
        return self.n * (s.queue if s.fcfs else s.slots)

    @property
    def packed_dtype(self):
        s = self.structure
        return jnp.int32 if s.queue * s.n_cells < 2**31 - 1 else jnp.int64

    @property
    def n_words(self) -> int:
        """Random words per event: time step, row, move, choice number, candidates (and, with origins, the move,
        choice number and candidates of the dispatch a clock action starts; with a pool, its draw; with a global
        phase, its move)."""
        s = self.structure
        if self.exact:  # time, clock or stream, move, choice number, candidates, the clock's server, the stream
            # (and the move of the dispatch a clock action starts, which samples the candidates a clock event leaves
            # unused). With random order, the waiting job that starts service is drawn from a word the event leaves
            # unused (`_random_order_jobs`), so that tables that differ only in random order run along the same path
            return 6 + self.max_d + int(s.origins)
        return 4 + self.max_d + (2 + self.max_d if s.origins else 0) + int(s.pool) + int(s.phases > 0)


class Params(NamedTuple):
    """Arguments of a run: the float tables (traced: new values reuse the compilation), the histogram range, and
    the structure's integer tables as arrays: as constants, XLA would count each in full towards the size of the
    event loop it compiles into one kernel."""

    u: jax.Array  # per-server clock rate
    act_prob: jax.Array  # (C, A)
    stream_rate: jax.Array  # (S,)
    choice: jax.Array  # (S, max_d)
    eff_prob: jax.Array  # (S, C, E)
    hist_lo: jax.Array  # int64 key of the lower edge of the sojourn-time histogram
    target: jax.Array  # ((S + 1) * C * W,) int32 targets of the merged rows (C: OVERFLOW)
    delta: jax.Array  # ((S + 1) * C * W,) int32 job changes of those moves
    stream: jax.Array  # (C * W,) int32 stream a clock action starts, -1 for none
    key: jax.Array  # ((S + 1) * C,) int32 keys, the clock's row 0
    jobs: jax.Array  # (C,) int32 jobs per cell
    arrivals: jax.Array  # (S + 1,) bool: the row brings new jobs (False for the clock)
    pool_units: jax.Array  # int32 units of the pool, J (0 without a pool)
    pool_kind: jax.Array  # (C,) int32: 1 where a server holds a unit, 2 where it waits for one, 0 elsewhere
    pool_other: jax.Array  # (C,) int32: a held cell's redirect, a waiting cell's promotion (the cell itself elsewhere)
    # ((S + 1) * m * m,) with a global phase: per row r and phase i the cumulative probabilities, over the next phase
    # j, that an event of the row fires (phase_rates[r, i, :j + 1].sum() / stream_rate[r]); the clock's row keeps the
    # phase and always fires. A zero otherwise.
    phase_cum: jax.Array
    phase_init: jax.Array  # (m,) law of the phase at time 0 (a one otherwise)
    # `Config.exact`: the clock's rate bound of each cell is quantum * weight[c] (`clock_weights`); zeros otherwise
    weight: jax.Array  # (C,) int32
    quantum: jax.Array  # float64
    # random order: the waiting jobs and the jobs in service of each cell, (C,) int32 (zeros otherwise)
    waiting_jobs: jax.Array
    in_service: jax.Array


def clock_weights(tables, n: int) -> tuple[float, np.ndarray]:
    r"""The quantum $q$ and integer weights $w_c$ of the exact engine's clock (`Config.exact`) for `n` servers:
    $q w_c \ge r_c$, the total rate of the actions of cell $c$ ($w_c = 0$ where $r_c = 0$), with $q$ an eighth of
    the smallest positive $r_c$, so that $r_c / (q w_c) > 7/8$ (at most one clock event in eight is a self-loop),
    unless the weights of `n` servers would then not fit 31 bits: $q$ is then the largest $r_c$ over
    $2^{30} / n$ rounded down to a power of 2."""
    r = float(tables.u) * np.asarray(tables.act_prob, np.float64).sum(axis=1)
    pos = r[r > 0]
    if not pos.size:
        return 1.0, np.zeros(r.size, np.int32)
    top = 2.0 ** min(20, int(np.floor(np.log2(2.0**30 / max(n, 1)))))
    q = max(float(pos.min()) / 8.0, float(pos.max()) / top)
    w = np.ceil(r / q)
    w = np.where(q * w < r, w + 1, w)  # rounding: the bound must hold in floating point
    return q, w.astype(np.int32)


def pool_units(tables, n: int) -> int:
    """$J$, the units of the pool of `n` servers: `pool_capacity * n` rounded to the nearest integer."""
    return int(np.floor(float(tables.pool_capacity) * n + 0.5)) if tables.pool_held is not None else 0


def params_of(structure: Structure, tables, hist_lo: int, n: int = 0) -> Params:
    """`Params` of checked `tables` with `structure` (their integer part), for `n` servers (the pool's size)."""
    S, C = structure.n_streams, structure.n_cells
    quantum, weight = clock_weights(tables, n)
    key = np.concatenate([structure.key.reshape(-1), np.zeros(C, np.int32)])
    phase_cum, phase_init = np.zeros(1), np.ones(1)
    if structure.phases:
        m = structure.phases
        rate = np.asarray(tables.stream_rate, np.float64)
        p = np.asarray(tables.phase_rates, np.float64) / np.where(rate > 0, rate, 1.0)[:, None, None]
        clock = np.triu(np.ones((m, m)))  # cumulative over j of the identity: stays in phase i, always fires
        phase_cum = np.concatenate([np.cumsum(p, axis=2), clock[None]]).reshape(-1)
        phase_init = np.asarray(tables.phase_init, np.float64)
    return Params(
        u=jnp.asarray(tables.u, jnp.float64),
        act_prob=jnp.asarray(np.asarray(tables.act_prob)[:, structure.act_cols], jnp.float64),
        stream_rate=jnp.asarray(tables.stream_rate, jnp.float64).reshape(S),
        choice=jnp.asarray(tables.choice, jnp.float64),
        eff_prob=jnp.asarray(np.asarray(tables.eff_prob)[..., structure.eff_cols], jnp.float64),
        hist_lo=jnp.asarray(hist_lo, jnp.int64),
        target=jnp.asarray(structure.target.reshape(-1)),
        delta=jnp.asarray(structure.delta.reshape(-1)),
        stream=jnp.asarray(structure.stream.reshape(-1)),
        key=jnp.asarray(key, jnp.int32),
        jobs=jnp.asarray(structure.jobs, jnp.int32),
        arrivals=jnp.asarray(np.concatenate([structure.arrivals, [False]]), bool),
        pool_units=jnp.asarray(pool_units(tables, n), jnp.int32),
        pool_kind=jnp.asarray(np.where(structure.pool_held, 1, np.where(structure.pool_promote >= 0, 2, 0)), jnp.int32),
        pool_other=jnp.asarray(np.where(structure.pool_held, structure.pool_redirect,
                                        np.where(structure.pool_promote >= 0, structure.pool_promote, np.arange(C))),
                               jnp.int32),
        phase_cum=jnp.asarray(phase_cum, jnp.float64), phase_init=jnp.asarray(phase_init, jnp.float64),
        weight=jnp.asarray(weight, jnp.int32), quantum=jnp.asarray(quantum, jnp.float64),
        waiting_jobs=jnp.asarray(structure.jobs - structure.in_service, jnp.int32),
        in_service=jnp.asarray(structure.in_service, jnp.int32),
    )


class _Prep(NamedTuple):
    rate: jax.Array  # total event rate N * Lambda
    kind_cum: jax.Array  # (S,) thresholds: outcome s < S a stream, S the clock
    d_cum: jax.Array  # (S + 1, max_d - 1) thresholds of the choice number per row (clock: always 1)
    move_cum: jax.Array  # ((S + 1) * C * (W - 1),) cumulative move probabilities without the last entry
    phase_cum: jax.Array  # (S + 1, m, m) the phase's thinning tables (`Params.phase_cum`), or a zero
    stream_cum: jax.Array  # (S,) N times the cumulative stream rates (`Config.exact`)
    quantum: jax.Array  # `Params.quantum`


def _prepare(cfg: Config, params: Params) -> _Prep:
    s = cfg.structure
    S, C, W = s.n_streams, s.n_cells, s.width
    A, E = params.act_prob.shape[1], params.eff_prob.shape[2]
    total = jnp.sum(params.stream_rate) + params.u
    kind_cum = jnp.cumsum(params.stream_rate) / total
    d_cum = jnp.cumsum(params.choice, axis=1)[:, :-1]
    d_cum = jnp.concatenate([d_cum, jnp.full((1, cfg.max_d - 1), 2.0)], axis=0)
    act = params.act_prob
    if cfg.exact:  # cell c's clock fires at rate quantum * weight[c]: its actions' probabilities scale up
        bound = params.quantum * params.weight.astype(jnp.float64)
        act = act * jnp.where(bound > 0, params.u / jnp.where(bound > 0, bound, 1.0), 0.0)[:, None]
    clock = jnp.concatenate([act, (1.0 - jnp.sum(act, axis=1))[:, None], jnp.zeros((C, W - A - 1))], axis=1)
    effects = jnp.concatenate([params.eff_prob, jnp.zeros((S, C, W - E))], axis=2)
    prob = jnp.concatenate([effects, clock[None]], axis=0)  # (S + 1, C, W)
    move_cum = jnp.cumsum(prob, axis=2)[:, :, :-1].reshape(-1)
    phase_cum = params.phase_cum.reshape(S + 1, s.phases, s.phases) if s.phases else params.phase_cum
    return _Prep(cfg.n * total, kind_cum, d_cum, move_cum, phase_cum, cfg.n * jnp.cumsum(params.stream_rate),
                 params.quantum)


class _Draw(NamedTuple):
    """The state-independent part of the next `block` events."""

    tau: jax.Array  # (B,) event times
    kind: jax.Array  # (B,) row: stream s < S, or S for a clock event
    table: jax.Array  # (B, cols) int32: row * C, the candidates (masked); with origins the second candidates and
    #                   the choice number of each stream; with a global phase, last, the event's outcome for each
    #                   phase it may find (the next phase, or m: it does not fire)
    uni: jax.Array  # (B, 1 or 2) uniforms of the moves


def _draw(cfg: Config, prep: _Prep, seed, ctr, t) -> _Draw:
    if cfg.exact:
        return _draw_exact(cfg, prep, seed, ctr)
    s = cfg.structure
    B, D, S, C = cfg.block, cfg.max_d, s.n_streams, s.n_cells
    words = core._words(seed, ctr, B, cfg.n_words)
    tau = t + jnp.cumsum(-jnp.log(core._uniform(words[:, 0])) / prep.rate)
    kind = core._categorical(core._uniform(words[:, 1]), prep.kind_cum)
    cands = core._candidates(cfg, words[:, 4 : 4 + D])
    n_choose = 1 + core._categorical(core._uniform(words[:, 3]), prep.d_cum[kind])
    cols = [(kind * C)[:, None], core._only_chosen(cfg, cands, n_choose)]
    uni = [core._uniform(words[:, 2])]
    if s.origins:
        w2 = words[:, 4 + D :]
        cols.append(core._candidates(cfg, w2[:, 2 : 2 + D]))
        if S:
            u_d = core._uniform(w2[:, 1])
            cols.append(1 + core._categorical(u_d[:, None], prep.d_cum[None, :S]))
        uni.append(core._uniform(w2[:, 0]))
    if s.pool:
        uni.append(core._uniform(words[:, 4 + D]))
    if s.phases:  # the phase's move (the last word), drawn here for each phase the event may find (columns
        # `phase_column(cfg)` + phase: the next phase j, or m where the event does not fire)
        u_ph = core._uniform(words[:, cfg.n_words - 1])
        cols.append(jnp.sum(u_ph[:, None, None] >= prep.phase_cum[kind], axis=2))
    table = jnp.concatenate([c.astype(jnp.int32) for c in cols], axis=1)
    return _Draw(tau, kind, table, jnp.stack(uni, axis=1))


def _draw_exact(cfg: Config, prep: _Prep, seed, ctr) -> _Draw:
    """The state-independent part of the next `block` events of the exact engine (`_block_exact`), whose times
    and rows depend on the state: `tau` holds unit exponentials, `kind` is unused, `table` the candidates
    (unmasked), the choice number each stream would draw and the stream of a stream event, `uni` the uniform of the
    move, the total weight from which the event is the clocks', the uniform of the clocks' server (and that of the
    move of the dispatch a clock action starts)."""
    s = cfg.structure
    B, D, S = cfg.block, cfg.max_d, s.n_streams
    words = core._words(seed, ctr, B, cfg.n_words)
    expo = -jnp.log(core._uniform(words[:, 0]))

    n_choose = 1 + core._categorical(core._uniform(words[:, 3])[:, None], prep.d_cum[None, :S])  # per stream
    cols = [core._candidates(cfg, words[:, 4 : 4 + D]), n_choose]
    # The event is the clock's with probability quantum W / (streams + quantum W) (W the total weight): when
    # U (streams + quantum W) >= streams, i.e. W >= (1 / U - 1) streams / quantum; else it is stream s with
    # probability stream_rate[s] / sum(stream_rate), drawn from another word.
    streams = prep.stream_cum[-1:].sum()
    clock_from = (1.0 / core._uniform(words[:, 1]) - 1.0) * streams / prep.quantum
    kind = core._categorical(core._uniform(words[:, 5 + D]) * streams, prep.stream_cum[:-1])
    uni = [core._uniform(words[:, 2]), clock_from, core._uniform(words[:, 4 + D])]
    if s.origins:
        uni.append(core._uniform(words[:, 6 + D]))
    cols.append(kind[:, None])
    table = jnp.concatenate([c.astype(jnp.int32) for c in cols], axis=1)
    return _Draw(expo, jnp.zeros(B, jnp.int32), table, jnp.stack(uni, axis=1))


class State(NamedTuple):
    """One replication (a batch of them: a leading axis on every field)."""

    seed: jax.Array  # uint64 seed of the event stream
    ctr: jax.Array  # uint64 events processed so far
    t: jax.Array  # time of the last event
    a: jax.Array  # start of the current chunk
    packed: jax.Array  # (n,) head * C + cell with FCFS queues, else the cell
    ring: jax.Array | None  # (n * queue,) arrival times (FCFS), (n * slots,) (random order), else None
    draw: _Draw
    acc: jax.Array  # (C,) time-integral corrections of the cell counts in the current chunk
    soj_sum: jax.Array  # sum of the sojourn times of the jobs that left in the current chunk
    n_jobs: jax.Array  # number of such jobs
    hist: jax.Array  # (n_bins + 2,) histogram of their sojourn times
    events: jax.Array  # events in the current chunk (self-loops included)
    real: jax.Array  # real events in the current chunk
    accepted: jax.Array  # jobs brought by arrival streams and accepted in the current chunk
    overflow: jax.Array  # moves refused beyond the truncation (whole run)
    blocks: jax.Array  # outer-loop iterations in the current chunk
    # with a pool: (units held, waiting servers, (n + 1,) list of the waiting, (n + 1,) their positions; slot n is
    # scratch, where a write that is not to happen goes)
    pool: tuple | None
    phase: jax.Array | None  # int32 phase of the global Markov phase (None without one)
    # `Config.exact`: (tree_size,) int32 sum tree of the servers' clock weights (node k the sum of nodes 2k and
    # 2k + 1, the leaves tree_size + i the weights of server i, not stored; node 1 the total), and the time of the
    # next event (pending); None otherwise
    tree: jax.Array | None = None
    next: jax.Array | None = None


def _tree_of(cfg: Config, params: Params, packed) -> jax.Array:
    """The sum tree (`State.tree`) of the clock weights of the servers in cells `packed`."""
    level = jnp.zeros(cfg.tree_size, jnp.int32).at[: cfg.n].set(params.weight[packed.astype(jnp.int32)])
    nodes = []
    while level.size > 1:
        level = level.reshape(-1, 2).sum(axis=1, dtype=jnp.int32)
        nodes.insert(0, level)
    return jnp.concatenate([jnp.zeros(1, jnp.int32)] + nodes)


def _next_time(prep: _Prep, params: Params, t, tree, expo):
    """Time of the exact engine's next event after `t`: its unit exponential over the total rate, the streams' and
    the clocks' bounds (node 1 of the tree)."""
    return t + expo / (prep.stream_cum[-1:].sum() + params.quantum * tree[1].astype(jnp.float64))


@core._broadcasting
def init_state(cfg: Config, params: Params, key) -> State:
    """Every server in the empty cell at time 0 (one replication; `vmap` it over keys). The seed is drawn as in
    `core.init_state`: the same key gives the same event words, so that, for instance, an exponential JSQ(d) runs
    along the same path in both engines."""
    keys = jr.split(key, 3)
    seed = jr.bits(keys[1], (), jnp.uint64)
    zero = jnp.zeros((), jnp.float64)
    ctr = jnp.zeros((), jnp.uint64)
    i64 = jnp.zeros((), jnp.int64)
    prep = _prepare(cfg, params)
    packed = jnp.full(cfg.n, cfg.structure.empty_cell, cfg.packed_dtype)
    draw = _draw(cfg, prep, seed, ctr, zero)
    tree = _tree_of(cfg, params, packed) if cfg.exact else None
    return State(
        seed=seed, ctr=ctr, t=zero, a=zero,
        packed=packed,
        ring=jnp.zeros(cfg.ring_size, jnp.float64) if cfg.ring_size else None,
        draw=draw,
        acc=jnp.zeros(cfg.n_cells, jnp.float64), soj_sum=zero, n_jobs=i64,
        hist=jnp.zeros(cfg.hist_size, jnp.int64), events=i64, real=i64, accepted=i64, overflow=i64, blocks=i64,
        pool=(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros(cfg.n + 1, jnp.int32),
              jnp.zeros(cfg.n + 1, jnp.int32)) if cfg.structure.pool else None,
        phase=(jr.choice(keys[2], cfg.structure.phases, p=params.phase_init).astype(jnp.int32)
               if cfg.structure.phases else None),
        tree=tree, next=_next_time(prep, params, zero, tree, draw.tau[0]) if cfg.exact else None,
    )


def _div(x, c: int):
    return lax.div(x, jnp.asarray(c, x.dtype))


def _first(x, i):
    return lax.dynamic_slice(x, (i,), (1,))[0]


def _choose(key, packed, row_c, cands, cell_of):
    """The first minimum of the sampled servers' keys in the row of `key` starting at `row_c` (`cell_of` a packed
    server's cell). Only the server number leaves the choice (its key is read again from its cell): XLA recomputes a
    second result, such as the best key, inside every fusion that uses it, and each counts towards the size of a
    loop compiled into one kernel."""
    best = cands[0]
    if len(cands) == 1:
        return best
    k_best = _first(key, row_c + cell_of(_first(packed, best)))
    for c in cands[1:]:
        k_c = _first(key, row_c + cell_of(_first(packed, c)))
        better = k_c < k_best
        best, k_best = jnp.where(better, c, best), jnp.where(better, k_c, k_best)
    return best


def _move(move_cum, W: int, row_c, c, u):
    """Entry of the row (row_c + c) of `W` moves drawn with uniform u, from the row's cumulative probabilities
    `move_cum`: its flat index."""
    base = row_c + c
    e = jnp.zeros((), jnp.int32)
    for j in range(W - 1):
        e = e + (u >= _first(move_cum, base * (W - 1) + j)).astype(jnp.int32)
    return base * W + e


def _block(cfg: Config, params: Params, prep: _Prep, t_end, state: State, ring_base=0, hist_base=0,
           masked: bool = False) -> State:
    """The events of the drawn block up to `t_end`, one per iteration of an inner loop, then their statistics.
    `masked`: run all `block` iterations, those after `t_end` changing nothing (the vmapped form)."""
    s = cfg.structure
    B, D, S, C, W, Q = cfg.block, cfg.max_d, s.n_streams, s.n_cells, s.width, s.queue
    fcfs, origins, up, down, pool, n_ph = s.fcfs, s.origins, s.up, s.down, s.pool, s.phases
    tau, kind, table, uni = state.draw
    phase_col = table.shape[1] - n_ph  # the drawn next phases, one column per current phase
    nv = jnp.sum(tau <= t_end, dtype=jnp.int32)
    pd = cfg.packed_dtype

    def one(x, i):  # one element (no negative-index fix-ups, which XLA copies into every fusion using them)
        return lax.dynamic_slice(x, (i,), (1,))[0]

    def put(x, i, v):
        return lax.dynamic_update_slice(x, v.astype(x.dtype)[None], (i,))

    def col(i, c):
        return lax.dynamic_slice(table, (i, jnp.asarray(c, i.dtype)), (1, 1))[0, 0]

    def cell_of(p):
        return lax.rem(p, jnp.asarray(C, p.dtype)).astype(jnp.int32) if fcfs else p.astype(jnp.int32)

    def choose(packed, row_c, cands):
        return _choose(params.key, packed, row_c, cands, cell_of)

    def move(row_c, c, u):
        return _move(prep.move_cum, W, row_c, c, u)

    def event(i, carry):
        packed, ring, rec, arrived, pl, ph = carry
        active = (i < nv) if masked else True
        ti = tau[i]
        row_c = col(i, 0)
        n = choose(packed, row_c, [col(i, 1 + j) for j in range(D)])
        p = one(packed, n)
        if fcfs:
            head = _div(p, C)
            c = (p - head * C).astype(jnp.int32)
        else:
            c = p.astype(jnp.int32)
        k_best = one(params.key, row_c + c)
        idx = move(row_c, c, lax.dynamic_slice(uni, (i, jnp.zeros_like(i)), (1, 1))[0, 0])
        t = one(params.target, idx)
        ok = active & (k_best < INELIGIBLE)
        if n_ph:  # thinning by the phase: the row fires with the phase's move j (j = n_ph: it does not fire)
            j = col(i, phase_col + ph)
            fires = j < n_ph
            ok = ok & fires
            ph = jnp.where(active & fires, j, ph)
        goes = ok & (t < C)
        ct = jnp.where(goes, t, c)
        if pool:  # a server entering a held cell with no free unit waits instead; a unit it frees goes to the
            # waiting server at a uniformly drawn position q of the list. Every read of the list and of `packed`
            # comes before their writes, which holds as a server that frees a unit is never the one promoted (no
            # move goes from a held cell to a waiting one). XLA still copies both arrays at every event, so the
            # loop is not one kernel: O(N) per event.
            held, nw, lst, pos = pl
            kc, kt = one(params.pool_kind, c), one(params.pool_kind, ct)
            redirect = (kt == 1) & (kc != 1) & (held >= params.pool_units)
            ct = jnp.where(redirect, one(params.pool_other, ct), ct)
            kt = jnp.where(redirect, 2, kt)
            refill = (kc == 1) & (kt != 1) & (nw > 0)
            rm, add = (kc == 2) & (kt != 2), (kt == 2) & (kc != 2)  # the server leaves, or joins, the waiting
            u_pool = lax.dynamic_slice(uni, (i, jnp.ones_like(i)), (1, 1))[0, 0]
            q = jnp.minimum((u_pool * nw.astype(jnp.float64)).astype(jnp.int32), jnp.maximum(nw - 1, 0))
            m = one(lst, q)
            pm = one(packed, m)
            cm = cell_of(pm)
            ctm = jnp.where(refill, one(params.pool_other, cm), cm)
            r = jnp.where(refill, q, one(pos, n))  # the position that leaves the list; the last one takes it
            last = one(lst, jnp.maximum(nw - 1, 0))
            out = refill | rm
            scratch = jnp.asarray(cfg.n, jnp.int32)
            lst = put(lst, jnp.where(out, r, jnp.where(add, nw, scratch)), jnp.where(out, last, n))
            pos = put(pos, jnp.where(out, last, jnp.where(add, n, scratch)), jnp.where(out, r, nw))
            held = held + (kt == 1).astype(jnp.int32) - (kc == 1).astype(jnp.int32) + refill.astype(jnp.int32)
            pl = (held, nw + add.astype(jnp.int32) - out.astype(jnp.int32), lst, pos)
        if fcfs:
            dj = jnp.where(goes, one(params.delta, idx), 0)
            k = one(params.jobs, c)
            row = ring_base + n * Q
            tail = head.astype(jnp.int32) + k
            for q in range(up):  # stamp the jobs that join at the tail (other slots are rewritten unchanged)
                x = tail + q
                slot = row + jnp.where(x >= Q, x - Q, x)
                ring = put(ring, slot, jnp.where(q < dj, ti, one(ring, slot)))
            h = head.astype(jnp.int32)
            heads = []
            for q in range(down):  # arrival times of the jobs at the head (used where they leave)
                x = h + q
                heads.append(one(ring, row + jnp.where(x >= Q, x - Q, x)))
            if cfg.waiting:  # and of the job at the new head (it starts service where jobs leave)
                x = h - jnp.minimum(dj, 0)
                heads.append(one(ring, row + jnp.where(x >= Q, x - Q, x)))
            if heads:
                arrived = lax.dynamic_update_slice(arrived, jnp.stack(heads)[None], (i, jnp.zeros_like(i)))
            x = h - jnp.minimum(dj, 0)
            head2 = jnp.where(x >= Q, x - Q, x)
            pn = head2.astype(pd) * C + ct.astype(pd)
        else:
            pn = ct.astype(pd)
        packed = put(packed, n, pn)
        rec_row = [c, jnp.where(ok & (t == C), C, ct)]
        if pool:  # the promoted waiting server (else n's new state again: m may be n, read before n moved)
            pm2 = (_div(pm, C) * C + ctm.astype(pd)) if fcfs else ctm.astype(pd)
            packed = put(packed, jnp.where(refill, m, n), jnp.where(refill, pm2, pn))
            rec_row += [cm, ctm]
        if origins:  # the dispatch a clock action starts, after the origin's own move. (Its second write of the
            # server array, after reads of the first, makes XLA copy the array at every event; the plan runs tables
            # with origins on `_block_exact`, which does not.)
            s2 = jnp.where(goes & (row_c == S * C), one(params.stream, c * W + idx - (row_c + c) * W), -1)
            has2 = s2 >= 0
            s2c = jnp.maximum(s2, 0)
            n_choose = col(i, 1 + 2 * D + s2c) if S else jnp.ones((), jnp.int32)
            first = col(i, 1 + D)
            cands = [first] + [jnp.where(j < n_choose, col(i, 1 + D + j), first) for j in range(1, D)]
            row2 = s2c * C
            n2 = choose(packed, row2, cands)
            c2 = one(packed, n2).astype(jnp.int32)
            k2 = one(params.key, row2 + c2)
            idx2 = move(row2, c2, lax.dynamic_slice(uni, (i, jnp.ones_like(i)), (1, 1))[0, 0])
            t2 = one(params.target, idx2)
            ok2 = has2 & (k2 < INELIGIBLE)
            ct2 = jnp.where(ok2 & (t2 < C), t2, c2)
            packed = put(packed, n2, ct2.astype(pd))
            rec_row += [c2, jnp.where(ok2 & (t2 == C), C, ct2), s2]
        rec = lax.dynamic_update_slice(rec, jnp.stack(rec_row).astype(jnp.int32)[None], (i, jnp.zeros_like(i)))
        return packed, ring, rec, arrived, pl, ph

    n_rec = 5 if origins else 4 if pool else 2
    carry = (state.packed, state.ring if fcfs else jnp.zeros(1), jnp.zeros((B, n_rec), jnp.int32),
             jnp.zeros((B, max(down + cfg.waiting, 1)), jnp.float64), state.pool, state.phase)
    packed, ring, rec, arrived, pl, ph = lax.fori_loop(0, B if masked else nv, event, carry)
    ctr = state.ctr + nv.astype(jnp.uint64)
    t = jnp.where(nv > 0, tau[jnp.maximum(nv - 1, 0)], state.t)
    state = state._replace(ctr=ctr, t=t, packed=packed, ring=ring if fcfs else None, pool=pl, phase=ph,
                           draw=_draw(cfg, prep, state.seed, ctr, t))
    return _finish(cfg, params, state, tau, kind, nv, rec, arrived, hist_base)


def _block_exact(cfg: Config, params: Params, prep: _Prep, t_end, state: State, ring_base=0, hist_base=0,
                 masked: bool = False) -> State:
    """The events of the drawn block up to `t_end` for `Config.exact` (module docstring): one loop iteration per
    event, and one more for the dispatch a clock action starts, so that every iteration writes one server, once
    (a second write of the server array after reads of it made XLA copy the array at every event). An iteration
    first applies the move decided by the previous one (carried: the server, its cell, the move's entry, its row,
    whether the cell is eligible and whether the move starts a dispatch), then decides the next from the new
    state: every write then comes before the reads of its array, and the decision, a chain of dependent reads, is
    computed once (XLA recomputes such a chain inside every fusion that uses its result, which made the loop too
    large to compile into one kernel: XLA's CPU backend does so below 1 KiB accessed per iteration by its cost
    analysis). With random order the event records also hold the server moved, and the servers' stores are
    brought up to date after the loop (`_random_order_jobs`). `masked`: a loop of a fixed number of iterations
    (twice `block` with origins), those after `t_end` changing nothing."""
    s = cfg.structure
    B, D, S, C, W = cfg.block, cfg.max_d, s.n_streams, s.n_cells, s.width
    NP, L, origins, ro = cfg.tree_size, cfg.tree_size.bit_length() - 1, s.origins, s.random_order
    expo, _, table, uni = state.draw
    pd = cfg.packed_dtype

    def one(x, i):
        return lax.dynamic_slice(x, (i,), (1,))[0]

    def put(x, i, v):
        return lax.dynamic_update_slice(x, v.astype(x.dtype)[None], (i,))

    def col(i, c):
        return lax.dynamic_slice(table, (i, jnp.asarray(c, i.dtype)), (1, 1))[0, 0]

    def unif(i, c):
        return lax.dynamic_slice(uni, (i, jnp.asarray(c, i.dtype)), (1, 1))[0, 0]

    def choose(packed, row_c, cands):
        return _choose(params.key, packed, row_c, cands, lambda p: p.astype(jnp.int32))

    def move(row_c, c, u):
        return _move(prep.move_cum, W, row_c, c, u)

    # The tree's walks are loops of their own (over its levels), not unrolled, which keeps the event loop small.
    def update(tree, n, d):  # add d to the weights above server n's leaf
        def level(j, tree):
            node = lax.shift_right_logical(NP + n, j)
            return put(tree, node, one(tree, node) + d)

        return lax.fori_loop(jnp.int32(1), jnp.int32(L + 1), level, tree)

    def descend(tree, v, levels):  # the node `levels` levels down where v falls, and v within it
        def level(_, kv):
            k, v = kv
            w_left = one(tree, 2 * k)
            right = v >= w_left
            return 2 * k + right.astype(jnp.int32), jnp.where(right, v - w_left, v)

        return lax.fori_loop(jnp.int32(0), levels, level, (jnp.ones((), jnp.int32), v))

    def running(i, pend, t_next):
        return (pend >= 0) | ((i < B) & (t_next <= t_end))

    def decide(i, pend, t_next, packed, tree):
        """The move of the next iteration: (server, its cell, the move's flat entry, 4 row + 2 (it starts a
        dispatch) + (the cell is eligible))."""
        ii = jnp.minimum(i, B - 1)
        disp = pend >= 0  # the dispatch of event i, whose clock action came first
        total = one(tree, 1)
        # The row of event i: the clock with probability quantum * total / rate (`_draw_exact`: the weight from
        # which a uniform U falls on the clock, (1 / U - 1) N sum(stream_rate) / quantum), else its stream.
        kind = jnp.where(total.astype(jnp.float64) >= unif(ii, 1), S, col(ii, D + S))
        # The clock's server: the leaf where the uniform's share of the total weight falls.
        v = jnp.floor(unif(ii, 2) * total.astype(jnp.float64)).astype(jnp.int32)
        # (not walked for a dispatch, which needs no clock)
        k, v = descend(tree, jnp.maximum(jnp.minimum(v, total - 1), 0), jnp.where(disp, 0, L - 1).astype(jnp.int32))
        first_leaf = 2 * k - NP
        w_first = one(params.weight, one(packed, first_leaf).astype(jnp.int32))
        n_clock = first_leaf + (v >= w_first).astype(jnp.int32)
        # A stream's candidates: those of event i, whether its row is the stream or it is the dispatch that its
        # clock action starts (a clock event samples no candidate itself).
        stream = jnp.where(disp, pend, kind)
        first = col(ii, 0)
        if D > 1:
            n_choose = col(ii, D + jnp.minimum(stream, S - 1))
            cands = [first] + [jnp.where(j < n_choose, col(ii, j), first) for j in range(1, D)]
        else:
            cands = [first]
        row_c = stream * C
        n = jnp.where(stream == S, n_clock, choose(packed, row_c, cands))
        c = one(packed, n).astype(jnp.int32)
        idx = move(row_c, c, unif(ii, jnp.where(disp, 3, 0) if origins else 0))
        eligible = one(params.key, row_c + c) < INELIGIBLE
        if not origins:
            return n, c, idx, 4 * stream + eligible.astype(jnp.int32)
        # Whether the move starts a dispatch (decided here, where the move's reads are made anyway: the loop's
        # results that depend on it would each recompute them).
        t = one(params.target, idx)
        starts = eligible & (t < C) & (stream == S) & (one(params.stream, idx - S * C * W) >= 0)
        return n, c, idx, 4 * stream + 2 * starts.astype(jnp.int32) + eligible.astype(jnp.int32)

    def body(carry):
        (i, pend, t_next, packed, tree, rec, taus), (n, c, idx, se) = carry
        active = running(i, pend, t_next) if masked else True
        stream, ok = se // 4, active & (se % 2 == 1)
        ii = jnp.minimum(i, B - 1)
        disp = pend >= 0
        t = one(params.target, idx)
        goes = ok & (t < C)
        ct = jnp.where(goes, t, c)
        packed = put(packed, n, ct.astype(pd))
        tree = update(tree, n, one(params.weight, ct) - one(params.weight, c))
        ct_rec = jnp.where(ok & (t == C), C, ct)
        row = jnp.where(active, ii, B)  # inactive iterations write the scratch row
        # The record of event i: its row's move (the cells from and to, and the row), then, in columns 3..5, the
        # move of the dispatch its clock action starts (and the stream; -1 for none).
        if origins:
            s2 = one(params.stream, idx - S * C * W)
            later = active & (se % 4 >= 2)  # the clock action starts a dispatch: the next iteration runs it
            rec_row = jnp.stack([c, ct_rec, stream])
            rec_col = jnp.where(disp, 3, 0).astype(jnp.int32)
        else:  # (with random order, the row and the server in one column: row + (S + 1) server)
            later = jnp.zeros((), bool)
            rec_row = jnp.stack([c, ct_rec, stream + (S + 1) * n if ro else stream])
            rec_col = jnp.zeros_like(row)
        rec = lax.dynamic_update_slice(rec, rec_row.astype(jnp.int32)[None], (row, rec_col))
        taus = put(taus, row, t_next)
        done = active & ~later  # event i is over
        i2 = i + done.astype(jnp.int32)
        t2 = jnp.where(i2 < B, _next_time(prep, params, t_next, tree, one(expo, jnp.minimum(i2, B - 1))), jnp.inf)
        t_next = jnp.where(done, t2, t_next)
        pend = jnp.where(active, jnp.where(later, s2, -1), pend) if origins else pend
        st = (i2, pend, t_next, packed, tree, rec, taus)
        return st, decide(i2, pend, t_next, packed, tree)

    zero = jnp.zeros((), jnp.int32)
    rec = jnp.zeros((B + 1, 6), jnp.int32).at[:, 5].set(-1) if origins else jnp.zeros((B + 1, 3), jnp.int32)
    st = (zero, zero - 1, state.next, state.packed, state.tree, rec, jnp.zeros(B + 1, jnp.float64))
    carry = (st, decide(*st[:5]))
    if masked:
        carry = lax.fori_loop(0, B * (2 if origins else 1), lambda _, cr: body(cr), carry)
    else:
        carry = lax.while_loop(lambda cr: running(*cr[0][:3]), body, carry)
    nv, _, _, packed, tree, rec, taus = carry[0]
    tau, rec = taus[:B], rec[:B]
    if ro:
        state = _random_order_jobs(cfg, params, state, rec, tau, nv, ring_base, hist_base, masked)
    ctr = state.ctr + nv.astype(jnp.uint64)
    t = jnp.where(nv > 0, tau[jnp.maximum(nv - 1, 0)], state.t)
    draw = _draw(cfg, prep, state.seed, ctr, t)
    state = state._replace(ctr=ctr, t=t, packed=packed, tree=tree, draw=draw,
                           next=_next_time(prep, params, t, tree, draw.tau[0]))
    kind = rec[:, 2] % (S + 1) if ro else rec[:, 2]
    moves = jnp.concatenate([rec[:, :2], rec[:, 3:]], axis=1) if origins else rec[:, :2]
    return _finish(cfg, params, state, tau, kind, nv, moves, None, hist_base)


def _random_order_jobs(cfg: Config, params: Params, state: State, rec, tau, nv, ring_base=0, hist_base=0,
                       masked: bool = False) -> State:
    """`state` with the random-order stores (module docstring) brought up to date after the first `nv` events of
    a block, from their records (`rec[e]`: the cell moved from, the cell moved to or `C` for a refused move, the
    row + (S + 1) the server) and times, and the sojourn time of each job that leaves (and the waiting time of
    each that starts service, with `Config.waiting`) added to the histograms, the sum and the count. A move is
    that of its cells' jobs in service and waiting (`tables.ORDER_MOVES`); the waiting job that starts is that of
    slot r = 1 + floor(U w), w the waiting jobs, and the last one, slot w, takes its place. U is the uniform of a
    word of the event that it leaves unused, hashed here for that event alone: a clock event's the one that draws
    a stream event's stream, a stream event's the one that draws the clocks' server (`_draw_exact`).

    A loop of its own after the event loop, which it leaves as it was but for one more number in a record: the
    stores' reads and writes in the event loop made that loop too large to compile into one kernel, and drawing a
    word more per event in `_draw_exact` (vectorised, 64-bit products) made it a third slower. An iteration writes
    the store as the previous one decided (every write of the store then comes before its reads: reading it
    before writing twice made XLA copy it at every event), adds the previous event's time to the histogram, then
    reads what the next event's move needs, with the uniform hashed one iteration earlier still (each of the
    decision's results is recomputed in every fusion that uses it: the hash then in one only)."""
    s = cfg.structure
    B, C, Q, S, D, nb = cfg.block, s.n_cells, s.slots, s.n_streams, cfg.max_d, cfg.n_bins + 2

    def one(x, i):
        return lax.dynamic_slice(x, (i,), (1,))[0]

    def put(x, i, v):
        return lax.dynamic_update_slice(x, v.astype(x.dtype)[None], (i,))

    # What each event does, computed for the whole block at once (vectorised), so that an iteration of the loop
    # reads three numbers of its event: its server's slots, its move (0 none, 1 the job in service completes, 2 a
    # waiting job starts, 3 an arriving job starts, 4 one waits) + 8 w (w its waiting jobs) + 8 (Q + 1) (it is a
    # clock event), and its time.
    c, ct = rec[:, 0], rec[:, 1]
    moved = (jnp.arange(B, dtype=jnp.int32) < nv) & (ct < C) & (ct != c)
    ct = jnp.minimum(ct, C - 1)
    w = params.waiting_jobs[c]
    dq, dw = params.in_service[ct] - params.in_service[c], params.waiting_jobs[ct] - w
    op = jnp.where(~moved, 0, jnp.where(dq < 0, 1, jnp.where(dq > 0, jnp.where(dw < 0, 2, 3), jnp.where(dw > 0, 4, 0))))
    code = (op + 8 * w + 8 * (Q + 1) * (rec[:, 2] % (S + 1) == S).astype(jnp.int32)).astype(jnp.int32)
    slots = (ring_base + (rec[:, 2] // (S + 1)) * Q).astype(jnp.int32)

    def uniform(e):  # event e's unused uniform (module docstring)
        ee = jnp.minimum(e, B - 1)
        word = jnp.where(one(code, ee) >= 8 * (Q + 1), 5 + D, 4 + D)
        return core._uniform(core._word(state.seed, state.ctr + ee.astype(jnp.uint64), word, cfg.n_words))

    def decide(e, ring, u):
        """Event e's writes (slot 0's value; a second slot and its value), the time it completes (a sojourn or
        waiting time) and which (0 none, 1 a sojourn time, 2 a waiting time)."""
        ee = jnp.minimum(e, B - 1)
        k = one(code, ee)
        m, w = k % 8, (k // 8) % (Q + 1)
        dep, start, now, waits = m == 1, m == 2, m == 3, m == 4
        r = 1 + jnp.minimum((u * w.astype(jnp.float64)).astype(jnp.int32), jnp.maximum(w - 1, 0))
        base = one(slots, ee)
        a0, ar, last = one(ring, base), one(ring, base + r), one(ring, base + w)
        t = one(tau, ee)
        time = jnp.where(dep, t - a0, jnp.where(start, t - ar, 0.0))
        what = jnp.where(dep, 1, jnp.where(start | now, 2, 0))
        return (base, jnp.where(start, ar, jnp.where(now, t, a0)), base + jnp.where(waits, w + 1, r),
                jnp.where(start, last, jnp.where(waits, t, ar)), time, what)

    def body(e, carry):
        ring, hist, soj_sum, n_jobs, (base, first, slot, second, time, what), u = carry
        ring = put(put(ring, base, first), slot, second)
        left = what == 1
        counted = left | ((what == 2) if cfg.waiting else False)
        b = core._hist_bin(cfg, params, jnp.where(counted, time, 1.0)) + jnp.where(left, 0, nb) + hist_base
        b = jnp.where(counted, b, hist_base)
        hist = put(hist, b, one(hist, b) + counted.astype(hist.dtype))
        soj_sum = soj_sum + jnp.where(left, time, 0.0)
        n_jobs = n_jobs + left.astype(n_jobs.dtype)
        return ring, hist, soj_sum, n_jobs, decide(e + 1, ring, u), uniform(e + 2)

    zero = jnp.zeros((), jnp.int32)
    hist = state.hist.reshape(-1)
    carry = (state.ring, hist, state.soj_sum, state.n_jobs, decide(zero, state.ring, uniform(zero)), uniform(zero + 1))
    ring, hist, soj_sum, n_jobs, _, _ = lax.fori_loop(zero, jnp.int32(B) if masked else nv, body, carry)
    return state._replace(ring=ring, hist=hist.reshape(state.hist.shape), soj_sum=soj_sum, n_jobs=n_jobs)


def _finish(cfg: Config, params: Params, state: State, tau, kind, nv, rec, arrived, hist_base) -> State:
    """Statistics of the first `nv` events of a block from their records (`arrived`: with FCFS queues, the arrival
    times the events read at the heads of the queues; random order records its jobs' times itself,
    `_random_order_jobs`)."""
    s = cfg.structure
    B, C = cfg.block, s.n_cells
    done = jnp.arange(B, dtype=jnp.int32) < nv
    w_t = jnp.where(done, tau - state.a, 0.0)
    acc = state.acc
    real = jnp.zeros(B, bool)
    ovf = jnp.zeros((), jnp.int64)
    accepted = jnp.zeros((), jnp.int64)
    moves = [(rec[:, 0], rec[:, 1], kind)]
    if s.origins:
        moves.append((rec[:, 2], rec[:, 3], jnp.where(rec[:, 4] >= 0, rec[:, 4], s.n_streams)))
    if s.pool:
        moves.append((rec[:, 2], rec[:, 3], jnp.full(B, s.n_streams, jnp.int32)))
    dj1 = None
    for cf, ct_rec, row in moves:
        refused = done & (ct_rec == C)
        ct = jnp.where(refused, cf, ct_rec)
        changed = done & (cf != ct)
        w = jnp.where(changed, w_t, 0.0)
        acc = acc.at[cf].add(w).at[ct].add(-w)
        real = real | changed | refused
        ovf = ovf + jnp.sum(refused, dtype=jnp.int64)
        dj = params.jobs[ct] - params.jobs[cf]
        accepted = accepted + jnp.sum(jnp.where(done & params.arrivals[row], dj, 0), dtype=jnp.int64)
        dj1 = dj if dj1 is None else dj1
    soj_sum, n_jobs, hist = state.soj_sum, state.n_jobs, state.hist
    if s.fcfs and s.down:
        leaving = jnp.maximum(-dj1, 0)
        dep = done[:, None] & (jnp.arange(s.down, dtype=jnp.int32) < leaving[:, None])  # (B, down)
        soj = jnp.where(dep, tau[:, None] - arrived[:, : s.down], 1.0)
        bins = core._hist_bin(cfg, params, soj) + hist_base
        hist = hist.reshape(-1).at[bins.reshape(-1)].add(dep.reshape(-1).astype(jnp.int64)).reshape(hist.shape)
        soj_sum = soj_sum + jnp.sum(jnp.where(dep, soj, 0.0))
        n_jobs = n_jobs + jnp.sum(dep, dtype=jnp.int64)
        if cfg.waiting:  # the job at the new head starts service; so does a job joining an empty server
            after = params.jobs[jnp.where(done & (rec[:, 1] < C), rec[:, 1], rec[:, 0])]
            before = params.jobs[rec[:, 0]]
            nxt = done & (leaving > 0) & (after > 0)
            starts = nxt | (done & params.arrivals[kind] & (before == 0) & (after > 0))
            wait = jnp.where(nxt, tau - arrived[:, s.down], 0.0)
            wbins = core._hist_bin(cfg, params, jnp.where(starts, wait, 1.0)) + (cfg.n_bins + 2) + hist_base
            hist = hist.reshape(-1).at[wbins].add(starts.astype(jnp.int64)).reshape(hist.shape)
    return state._replace(
        acc=acc, soj_sum=soj_sum, n_jobs=n_jobs, hist=hist,
        events=state.events + nv.astype(jnp.int64),
        real=state.real + jnp.sum(real, dtype=jnp.int64),
        accepted=state.accepted + accepted,
        overflow=state.overflow + ovf,
        blocks=state.blocks + 1,
    )


def _chunk(cfg: Config, params: Params, prep: _Prep, t_end, state: State, ring_base=0, hist_base=0) -> State:
    """Advance one replication to `t_end`, one event at a time."""
    if cfg.exact:
        return lax.while_loop(lambda st: st.next <= t_end,
                              lambda st: _block_exact(cfg, params, prep, t_end, st, ring_base, hist_base), state)
    return lax.while_loop(
        lambda st: st.draw.tau[0] <= t_end,
        lambda st: _block(cfg, params, prep, t_end, st, ring_base, hist_base),
        state,
    )


def _sequential_batch(cfg: Config, params: Params, prep: _Prep, t_end, states: State) -> State:
    """Each replication of the batch in turn; the ring buffers and histograms stay in place, flattened over the
    batch (as `core._sequential_batch`: slicing them out and back cost more than a short chunk's events)."""
    n_rep = states.packed.shape[0]
    big = ("ring", "hist") if cfg.ring_size else ("hist",)
    small = states._replace(**{f: None for f in big})

    def one(r, carry):
        small, flat = carry
        state = jax.tree_util.tree_map(lambda x: x[r], small)._replace(**flat)
        state = _chunk(cfg, params, prep, t_end, state, r * cfg.ring_size, r * cfg.hist_size)
        small = jax.tree_util.tree_map(lambda xs, x: xs.at[r].set(x), small, state._replace(**{f: None for f in big}))
        return small, {f: getattr(state, f) for f in big}

    flat = {f: getattr(states, f).reshape(-1) for f in big}
    small, flat = lax.fori_loop(0, n_rep, one, (small, flat))
    return small._replace(**{f: flat[f].reshape(getattr(states, f).shape) for f in big})


def _harvest(cfg: Config, t_end, state: State) -> tuple[State, core.Stats]:
    """Close the chunk at `t_end` (one replication): time integrals, then reset the per-chunk accumulators."""
    cells = state.packed % cfg.n_cells if cfg.structure.fcfs else state.packed
    counts = jnp.zeros(cfg.n_cells, jnp.float64).at[cells.astype(jnp.int32)].add(1.0)
    area = counts * (t_end - state.a) + state.acc
    zero = jnp.zeros((), jnp.int64)
    stats = core.Stats(area=area, soj_sum=state.soj_sum, n_jobs=state.n_jobs, hist=state.hist, events=state.events,
                       overflow=state.overflow, bad_service=zero, blocks=state.blocks, real_events=state.real,
                       accepted=state.accepted)
    state = state._replace(
        a=jnp.asarray(t_end, jnp.float64), acc=jnp.zeros_like(state.acc), soj_sum=jnp.zeros_like(state.soj_sum),
        n_jobs=zero, hist=jnp.zeros_like(state.hist), events=zero, real=zero, accepted=zero, blocks=zero,
    )
    return state, stats


@core._broadcasting
def run_chunk(cfg: Config, params: Params, states: State, t_end) -> tuple[State, core.Stats]:
    """Advance a batch of replications (leading axis) to `t_end`; statistics per replication, the sojourn-time
    histogram pooled over the batch (as `core.run_chunk`). The first event after `t_end` stays pending."""
    prep = _prepare(cfg, params)
    if cfg.sequential:
        states = _sequential_batch(cfg, params, prep, t_end, states)
    elif cfg.exact:
        states = lax.while_loop(
            lambda st: jnp.any(st.next <= t_end),
            jax.vmap(lambda st: _block_exact(cfg, params, prep, t_end, st, masked=True)),
            states,
        )
    else:
        states = lax.while_loop(
            lambda st: jnp.any(st.draw.tau[:, 0] <= t_end),
            jax.vmap(lambda st: _block(cfg, params, prep, t_end, st, masked=True)),
            states,
        )
    states, stats = jax.vmap(lambda st: _harvest(cfg, t_end, st))(states)
    return states, stats._replace(hist=core.pool_histograms(cfg.hist_groups, stats.hist))
