r"""The tables a model family gives the generic simulation engine (`jsmkt._simulate.generic`).

A family at server level is a finite set of *cells* (local states of one server, `0..C-1`), per-server events
uniformised at a rate `u` per server, and dispatch streams that sample servers, compare their priority keys and
move the chosen one. `SimTables` holds that description as arrays; `check_tables` validates it (a `ValueError`
naming the field and the offending entry), and `Structure` is its hashable integer part, which the compiled
engine is specialised to (the float tables are traced arguments: new parameter values reuse the compilation).

What a model's `simulation_tables(top)` returns, as `simulate` uses it:

- a `SimTables` with concrete NumPy values: integer dtypes for the integer tables, levels at most `top`, `key`
  in `0..INELIGIBLE`, targets in `0..C-1` or `OVERFLOW`, `act_prob` rows summing to at most 1 (`u` at least
  every cell's total rate), `choice` rows and the `eff_prob` rows of eligible cells summing to 1 (to 1e-9);
- integer tables that do not depend on parameter values (else each value compiles anew); entries of
  probability 0 in every cell cost nothing (the structure leaves them out, and records which they are);
- `fcfs=True` only with `jobs[empty_cell] == 0` and no `act_stream >= 0`;
- with `act_stream[c, a] = s`, the server's own move comes first and is unconditional; stream `s` then samples
  the servers (the origin included, in its new cell), and does nothing when none is eligible;
- a `load()` method (in `[0, 1)`) when `simulate` is to choose `max_queue` itself;
- optionally a pool of units (`pool_held`, `pool_redirect`, `pool_promote`, `pool_capacity`): servers in held
  cells hold one unit each; a move into a held cell from a cell that holds none takes a free unit or, when none
  is free, goes to `pool_redirect` of that cell; a move out of the held cells frees a unit, which goes at once to a
  uniformly chosen server in a waiting cell (`pool_promote >= 0`), moving it to its `pool_promote` cell. The empty
  cell neither holds nor waits; redirects and promotions keep the level and the jobs; no stream has an origin and
  no move goes from a held cell straight to a waiting one;
- optionally servers whose waiting jobs start in random order (`random_order`, with `fcfs=False`, and
  `in_service`, 0 or 1 job in service per cell): a server holds `jobs - in_service` waiting jobs, and no job
  moves to another server. Each possible move changes the waiting and in-service counts by one of:
  nothing; (-1, +1), a waiting job chosen uniformly starts service (an own-orbit retrial); (0, -1), the job in
  service completes; (0, +1), an arriving job starts service at once; (+1, 0), an arriving job waits. Per-job
  sojourn and waiting times are then recorded as with FCFS queues. No stream has an origin, and there is no pool
  or global phase;
- optionally a global phase (`phase_rates`, `phase_init`): a Markov chain $J$ on `m` phases, started from
  `phase_init`, whose moves come with the streams' events: in phase $i$ stream $s$ fires at rate
  $N$ `phase_rates[s, i, j]` together with a move to phase $j$ ($j = i$: the phase stays). `stream_rate[s]` is
  then the largest of its phases' rates, $\max_i \sum_j$ `phase_rates[s, i, j]`: the engine draws the stream at
  that rate and thins it (an event of stream $s$ in phase $i$ fires with probability
  $\sum_j$ `phase_rates[s, i, j]` / `stream_rate[s]`). A stream at a constant rate has `phase_rates[s]` = its
  rate times the identity; the phase's moves without a dispatch are a stream whose cells are all ineligible. No
  stream has an origin.
"""

import hashlib
from typing import NamedTuple

import numpy as np


INELIGIBLE = 2**30  # key of a cell a dispatch may not choose
# target of a move beyond the truncation: the job(s) are refused and counted; simulate raises after the run naming
# max_queue
OVERFLOW = -1


class SimTables(NamedTuple):
    """A model family at server level, truncated at `top` jobs per server, as the generic engine executes it."""

    # (C,) int: level of each cell (queue length, or orbit size); the reported tails are s_k = fraction of servers in
    # cells with level >= k, k = 0..top
    level: np.ndarray
    status: np.ndarray  # (C,) int: status of each cell (phase, idle/busy, working/failed); status_names[i] names them
    status_names: tuple[str, ...]
    jobs: np.ndarray  # (C,) int: jobs held by a server in that cell
    empty_cell: int  # cell of every server at time 0
    # servers hold FCFS queues: a move that raises `jobs` by j appends j jobs stamped with the current time at the
    # tail; one that lowers it by j removes the j oldest from the head, each a departure whose sojourn time is
    # recorded
    fcfs: bool
    # per-server events (local clocks, and streams that start at a server), uniformised at rate u per server
    u: float  # per-server uniformisation rate (>= the largest total rate of any cell)
    # (C, A) float: probability of action a of a server in cell c at an event of its clock (row sums <= 1; the rest is
    # a self-loop)
    act_prob: np.ndarray
    act_target: np.ndarray  # (C, A) int: the server's new cell (or OVERFLOW)
    # (C, A) int: -1 for a local event; s >= 0: the server is the origin of dispatch stream s, which is executed right
    # after the server's own move
    act_stream: np.ndarray
    # dispatch streams s = 0..S-1
    # (S,) float: rate per server of streams that start outside the servers (arrivals, a repairman); 0 for streams
    # that only start at servers (act_stream)
    stream_rate: np.ndarray
    choice: np.ndarray  # (S, max_d) float: P(D = j), j = 1..max_d, for each stream
    # (S, C) int: priority of a cell for stream s; lower preferred; INELIGIBLE: never chosen (if no sampled server is
    # eligible, nothing happens to the sampled servers)
    key: np.ndarray
    # (S, C, E) float: the chosen server, in cell c, moves to eff_target[s, c, e] with probability eff_prob[s, c, e]
    # (sums to 1 over e for eligible cells; pad with probability 0)
    eff_prob: np.ndarray
    eff_target: np.ndarray  # (S, C, E) int: target cell or OVERFLOW
    # (S,) bool: the stream brings new jobs into the system (its job count enters throughput and `events`' arrival
    # count)
    arrivals: np.ndarray
    # an optional pool of J = round(pool_capacity * n) units (module docstring); None: no pool
    pool_held: np.ndarray | None = None  # (C,) bool: a server in the cell holds a unit
    pool_redirect: np.ndarray | None = None  # (C,) int: where a move into a held cell goes when no unit is free
    pool_promote: np.ndarray | None = None  # (C,) int: the held cell a waiting server moves to (-1: the cell never waits)
    pool_capacity: float = 0.0  # units per server
    # an optional global phase (module docstring); None: none
    phase_rates: np.ndarray | None = None  # (S, m, m) float: per-server rate of stream s in phase i moving it to j
    phase_init: np.ndarray | None = None  # (m,) float: the law of the phase at time 0
    # servers hold their waiting jobs in random order (module docstring); `in_service` (C,) int, 0 or 1, is then the
    # number of the cell's jobs in service
    random_order: bool = False
    in_service: np.ndarray | None = None


_TOL = 1e-9  # rounding allowed in probability sums


def _int_table(name: str, x, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "iu" and a.size:
        raise ValueError(f"tables.{name} must hold integers, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"tables.{name} has shape {a.shape}; expected {shape}")
    return a.astype(np.int64)


def _float_table(name: str, x, shape: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"tables.{name} must hold real numbers (concrete: simulate runs outside jit/grad/vmap)") from e
    if a.shape != shape:
        raise ValueError(f"tables.{name} has shape {a.shape}; expected {shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"tables.{name} holds non-finite entries")
    return a


def _where(mask: np.ndarray) -> str:
    return str(tuple(int(i) for i in np.argwhere(mask)[0]))


def check_tables(tables) -> SimTables:
    """`tables` with NumPy arrays of the right dtypes, after checking shapes, ranges and probabilities; a
    `ValueError` names the field and the first bad entry."""
    if not isinstance(tables, SimTables):
        raise ValueError(f"simulation_tables returned {type(tables).__name__}; expected jsmkt._simulate.tables.SimTables")
    level = np.asarray(tables.level)
    if level.ndim != 1 or level.size < 1:
        raise ValueError(f"tables.level must be a 1-d array of the C >= 1 cells' levels, got shape {level.shape}")
    C = level.size
    level = _int_table("level", level, (C,))
    status = _int_table("status", tables.status, (C,))
    jobs = _int_table("jobs", tables.jobs, (C,))
    names = tuple(str(s) for s in tables.status_names)
    for name, x in (("level", level), ("jobs", jobs)):
        if (x < 0).any():
            raise ValueError(f"tables.{name}[{int(np.flatnonzero(x < 0)[0])}] is negative")
    if (status < 0).any() or (status >= len(names)).any():
        raise ValueError(f"tables.status must index tables.status_names ({len(names)} names); got "
                         f"{int(status[(status < 0) | (status >= len(names))][0])}")
    empty = int(tables.empty_cell)
    if not 0 <= empty < C:
        raise ValueError(f"tables.empty_cell={empty} is not a cell 0..{C - 1}")
    fcfs = bool(tables.fcfs)
    if fcfs and jobs[empty] != 0:
        raise ValueError(f"tables.fcfs: the empty cell {empty} holds {jobs[empty]} jobs (an FCFS queue starts empty)")
    u = float(tables.u)
    if not (np.isfinite(u) and u >= 0):
        raise ValueError(f"tables.u={u!r} must be a finite rate >= 0")
    act_prob = np.asarray(tables.act_prob, dtype=np.float64)
    if act_prob.ndim != 2 or act_prob.shape[0] != C:
        raise ValueError(f"tables.act_prob has shape {act_prob.shape}; expected (C, A) with C = {C}")
    A = act_prob.shape[1]
    act_prob = _float_table("act_prob", act_prob, (C, A))
    act_target = _int_table("act_target", tables.act_target, (C, A))
    act_stream = _int_table("act_stream", tables.act_stream, (C, A))
    stream_rate = np.asarray(tables.stream_rate, dtype=np.float64)
    if stream_rate.ndim != 1:
        raise ValueError(f"tables.stream_rate has shape {stream_rate.shape}; expected (S,)")
    S = stream_rate.size
    stream_rate = _float_table("stream_rate", stream_rate, (S,))
    choice = np.asarray(tables.choice, dtype=np.float64)
    if choice.ndim != 2 or choice.shape[0] != S or choice.shape[1] < 1:
        raise ValueError(f"tables.choice has shape {choice.shape}; expected (S, max_d) with S = {S}")
    choice = _float_table("choice", choice, choice.shape)
    key = _int_table("key", tables.key, (S, C))
    eff_prob = np.asarray(tables.eff_prob, dtype=np.float64)
    if eff_prob.ndim != 3 or eff_prob.shape[:2] != (S, C) or eff_prob.shape[2] < 1:
        raise ValueError(f"tables.eff_prob has shape {eff_prob.shape}; expected (S, C, E) with S = {S}, C = {C}")
    eff_prob = _float_table("eff_prob", eff_prob, eff_prob.shape)
    eff_target = _int_table("eff_target", tables.eff_target, eff_prob.shape)
    arrivals = np.asarray(tables.arrivals)
    if arrivals.shape != (S,) or arrivals.dtype != bool:
        raise ValueError(f"tables.arrivals must be a bool array of shape ({S},), got {arrivals.dtype} {arrivals.shape}")

    for name, t in (("act_target", act_target), ("eff_target", eff_target)):
        bad = (t < OVERFLOW) | (t >= C)
        if bad.any():
            raise ValueError(f"tables.{name}{_where(bad)} = {int(t[bad][0])} is neither a cell 0..{C - 1} nor OVERFLOW")
    bad = (act_stream < -1) | (act_stream >= S)
    if bad.any():
        raise ValueError(f"tables.act_stream{_where(bad)} = {int(act_stream[bad][0])} is neither -1 nor a stream "
                         f"0..{S - 1}")
    for name, p in (("act_prob", act_prob), ("stream_rate", stream_rate), ("choice", choice), ("eff_prob", eff_prob)):
        if (p < 0).any():
            raise ValueError(f"tables.{name}{_where(p < 0)} is negative")
    rows = act_prob.sum(axis=1)
    if (rows > 1 + _TOL).any():
        c = int(np.argmax(rows))
        raise ValueError(f"tables.act_prob: cell {c}'s actions have total probability {rows[c]:.12g} > 1 (u={u!r} "
                         "must be at least the largest total rate of a cell)")
    if u == 0 and act_prob.any():
        raise ValueError("tables.u is 0 but tables.act_prob has actions")
    if (key < 0).any() or (key > INELIGIBLE).any():
        raise ValueError(f"tables.key{_where((key < 0) | (key > INELIGIBLE))} is outside 0..INELIGIBLE")
    d_sum = choice.sum(axis=1)
    if S and (np.abs(d_sum - 1) > _TOL).any():
        s = int(np.argmax(np.abs(d_sum - 1)))
        raise ValueError(f"tables.choice[{s}] sums to {d_sum[s]:.12g}; a choice law's probabilities sum to 1")
    e_sum = eff_prob.sum(axis=2)
    bad = (key < INELIGIBLE) & (np.abs(e_sum - 1) > _TOL)
    if bad.any():
        s, c = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"tables.eff_prob[{s}, {c}] sums to {e_sum[s, c]:.12g}; the effect on an eligible cell "
                         "(key < INELIGIBLE) must sum to 1")
    if not (u > 0 or stream_rate.sum() > 0):
        raise ValueError("the tables have no events: u = 0 and every stream_rate is 0")
    if fcfs and (act_stream >= 0).any():
        raise ValueError("tables.fcfs is True but some act_stream >= 0: a job that moves between servers has no "
                         "FCFS queue to keep (give fcfs=False; the mean sojourn time then comes from Little's law)")
    pool = _check_pool(tables, C, level, jobs, empty, act_stream)
    phase = _check_phase(tables, stream_rate, act_stream)
    checked = SimTables(
        level=level, status=status, status_names=names, jobs=jobs, empty_cell=empty, fcfs=fcfs, u=u,
        act_prob=act_prob, act_target=act_target, act_stream=act_stream, stream_rate=stream_rate, choice=choice,
        key=key, eff_prob=eff_prob, eff_target=eff_target, arrivals=arrivals, **pool, **phase,
    )
    return _check_random_order(tables, checked)


# The moves of a server whose waiting jobs start in random order, by (change of the waiting jobs, change of the jobs
# in service): bit 0 the job in service completes, bit 1 a uniformly chosen waiting job starts service, bit 2 an
# arriving job starts service at once, bit 3 an arriving job waits (0: the jobs stay as they are).
ORDER_MOVES = {(0, 0): 0, (0, -1): 1, (-1, 1): 2, (0, 1): 4, (1, 0): 8}
_ORDER_WORDS = {(0, -1): "the job in service completes", (-1, 1): "a waiting job starts service",
                (0, 1): "an arriving job starts service", (1, 0): "an arriving job waits"}


def order_moves(jobs: np.ndarray, in_service: np.ndarray, source, target) -> tuple[np.ndarray, np.ndarray]:
    """`ORDER_MOVES` codes of the moves `source -> target` (cells; `target` may be `OVERFLOW`, a refused move:
    code 0), and where a move is none of them (then code 0)."""
    source, target = np.broadcast_arrays(np.asarray(source), np.asarray(target))
    t = np.where(target >= 0, target, source)
    dq = in_service[t] - in_service[source]
    dw = (jobs[t] - in_service[t]) - (jobs[source] - in_service[source])
    code = np.zeros(source.shape, np.int32)
    known = np.zeros(source.shape, bool)
    for (w, q), c in ORDER_MOVES.items():
        hit = (dw == w) & (dq == q)
        code[hit], known[hit] = c, True
    return code, ~known


def _check_random_order(tables, t: SimTables) -> SimTables:
    """`t` with the checked `random_order` and `in_service` of `tables` (module docstring)."""
    ro = tables.random_order
    if not isinstance(ro, (bool, np.bool_)):
        raise ValueError(f"tables.random_order={ro!r} must be True or False")
    if not ro:
        return t
    C = t.level.size
    if tables.in_service is None:
        raise ValueError("tables.random_order needs tables.in_service (the jobs in service of each cell, 0 or 1)")
    ins = _int_table("in_service", tables.in_service, (C,))
    bad = (ins < 0) | (ins > 1) | (ins > t.jobs)
    if bad.any():
        c = int(np.flatnonzero(bad)[0])
        raise ValueError(f"tables.in_service[{c}] = {int(ins[c])} must be 0 or 1 and at most the cell's jobs "
                         f"({int(t.jobs[c])})")
    why = ("the FCFS queues (give fcfs=False)" if t.fcfs else
           "streams that start at servers (act_stream >= 0: their jobs move between servers)"
           if (t.act_stream >= 0).any() else "a pool" if t.pool_held is not None else
           "a global phase" if t.phase_rates is not None else None)
    if why:
        raise ValueError(f"tables.random_order is True with {why}; servers whose waiting jobs start in random order "
                         "have none")
    if t.jobs[t.empty_cell] != 0:
        raise ValueError(f"tables.random_order: the empty cell {t.empty_cell} holds {int(t.jobs[t.empty_cell])} jobs "
                         "(a server starts empty)")
    cells = np.arange(C)
    for name, src, tgt, prob in (("act_target", cells[:, None], t.act_target, t.act_prob),
                                 ("eff_target", cells[None, :, None], t.eff_target,
                                  t.eff_prob * (t.key < INELIGIBLE)[:, :, None])):
        _, unknown = order_moves(t.jobs, ins, np.broadcast_to(src, tgt.shape), tgt)
        bad = unknown & (prob > 0)
        if bad.any():
            i = tuple(int(x) for x in np.argwhere(bad)[0])
            c, d = int(np.broadcast_to(src, tgt.shape)[i]), int(tgt[i])
            raise ValueError(
                f"tables.{name}{i}: the move from cell {c} ({int(ins[c])} job(s) in service, "
                f"{int(t.jobs[c] - ins[c])} waiting) to cell {d} ({int(ins[d])} in service, {int(t.jobs[d] - ins[d])} "
                "waiting) is none of those of servers whose waiting jobs start in random order: "
                + "; ".join(f"{dw:+d} waiting, {dq:+d} in service: {w}" for (dw, dq), w in _ORDER_WORDS.items()))
    return t._replace(random_order=True, in_service=ins)


def _check_phase(tables, stream_rate, act_stream) -> dict:
    """The checked global-phase fields of `tables` (module docstring)."""
    if tables.phase_rates is None:
        if tables.phase_init is not None:
            raise ValueError("tables.phase_init needs tables.phase_rates")
        return {}
    S = stream_rate.size
    rates = np.asarray(tables.phase_rates, dtype=np.float64)
    if rates.ndim != 3 or rates.shape[0] != S or rates.shape[1] != rates.shape[2] or rates.shape[1] < 1:
        raise ValueError(f"tables.phase_rates has shape {rates.shape}; expected (S, m, m) with S = {S}")
    m = rates.shape[1]
    rates = _float_table("phase_rates", rates, rates.shape)
    if (rates < 0).any():
        raise ValueError(f"tables.phase_rates{_where(rates < 0)} is negative")
    top = rates.sum(axis=2).max(axis=1)
    bad = np.abs(top - stream_rate) > _TOL * np.maximum(top, 1.0)
    if bad.any():
        s = int(np.flatnonzero(bad)[0])
        raise ValueError(f"tables.stream_rate[{s}]={stream_rate[s]!r} must be the largest rate of stream {s} over the "
                         f"phases, {top[s]!r} (max_i sum_j phase_rates[{s}, i, j])")
    init = _float_table("phase_init", tables.phase_init, (m,))
    if (init < 0).any() or abs(init.sum() - 1) > _TOL:
        raise ValueError(f"tables.phase_init={init.tolist()!r} must be a probability vector")
    if (act_stream >= 0).any():
        raise ValueError("tables: a global phase with streams that start at servers (act_stream >= 0) is not "
                         "supported")
    return dict(phase_rates=rates, phase_init=init)


def _check_pool(tables, C, level, jobs, empty, act_stream) -> dict:
    """The checked pool fields of `tables` (module docstring)."""
    if tables.pool_held is None:
        if tables.pool_redirect is not None or tables.pool_promote is not None:
            raise ValueError("tables.pool_redirect and pool_promote need tables.pool_held")
        return {}
    held = np.asarray(tables.pool_held)
    if held.shape != (C,) or held.dtype != bool:
        raise ValueError(f"tables.pool_held must be a bool array of shape ({C},), got {held.dtype} {held.shape}")
    redirect = _int_table("pool_redirect", tables.pool_redirect, (C,))
    promote = _int_table("pool_promote", tables.pool_promote, (C,))
    cap = float(tables.pool_capacity)
    if not (np.isfinite(cap) and 0.0 <= cap <= 1.0):
        raise ValueError(f"tables.pool_capacity={cap!r} must lie in [0, 1] (units per server)")
    for name, t, ok in (("pool_redirect", redirect, (redirect >= 0) & (redirect < C)),
                        ("pool_promote", promote, (promote >= -1) & (promote < C))):
        if not ok.all():
            raise ValueError(f"tables.{name}[{int(np.flatnonzero(~ok)[0])}] = {int(t[~ok][0])} is not a cell")
    waits = promote >= 0
    same = lambda a, b: (level[a] == level[b]) & (jobs[a] == jobs[b])  # noqa: E731
    bad = held & ~(waits[redirect] & same(np.arange(C), redirect))
    if bad.any():
        raise ValueError(f"tables.pool_redirect[{int(np.flatnonzero(bad)[0])}] must be a waiting cell at the same level")
    bad = waits & ~(held[np.maximum(promote, 0)] & same(np.arange(C), np.maximum(promote, 0)))
    if bad.any():
        raise ValueError(f"tables.pool_promote[{int(np.flatnonzero(bad)[0])}] must be a held cell at the same level")
    if held[empty] or waits[empty]:
        raise ValueError(f"tables: the empty cell {empty} must neither hold a unit nor wait for one")
    if (held & waits).any():
        raise ValueError("tables: a cell cannot both hold a unit and wait for one")
    if (act_stream >= 0).any():
        raise ValueError("tables: a pool with streams that start at servers (act_stream >= 0) is not supported")
    for name, src, tgt in (("act_target", np.arange(C)[:, None], tables.act_target),
                           ("eff_target", np.arange(C)[None, :, None], tables.eff_target)):
        tgt = np.asarray(tgt)
        bad = held[np.broadcast_to(src, tgt.shape)] & (tgt >= 0) & waits[np.maximum(tgt, 0)]
        if bad.any():
            raise ValueError(f"tables.{name}{_where(bad)}: a move from a held cell to a waiting one is not supported "
                             "(its unit would go to the waiting)")
    return dict(pool_held=held, pool_redirect=redirect, pool_promote=promote, pool_capacity=cap)


def _used_columns(prob: np.ndarray) -> np.ndarray:
    """Indices of the columns of `prob` (rows, columns) with a positive entry; at least column 0 (when any)."""
    used = np.flatnonzero((prob > 0).any(axis=0))
    return used if used.size or prob.shape[1] == 0 else np.zeros(1, np.int64)


class Structure:
    """The integer part of checked `SimTables` (cells, targets, keys, streams, job counts) as the generic engine
    uses it, hashable by its bytes: one compilation per structure, whatever the probabilities and rates.

    The engine's move tables merge the clock and the streams into rows `r = 0..S` (row `S` is the clock): entry
    `e < W` of row `r` and cell `c` has target `target[r, c, e]` (the cell itself for the clock's self-loop and for
    padding; `C` for OVERFLOW) and job change `delta[r, c, e]`; for the clock, `stream[c, e]` is the stream the
    server then starts (-1: none). Actions and effects whose probability is 0 in every cell are left out
    (`act_cols`, `eff_cols`: those kept), so that padding costs the event loop nothing; the structure then also
    holds which entries are 0 everywhere, and a run in which others are recompiles."""

    def __init__(self, t: SimTables):
        self.act_cols = _used_columns(t.act_prob.reshape(-1, t.act_prob.shape[-1]))
        self.eff_cols = _used_columns(t.eff_prob.reshape(-1, t.eff_prob.shape[-1]))
        t = t._replace(act_prob=t.act_prob[:, self.act_cols], act_target=t.act_target[:, self.act_cols],
                       act_stream=t.act_stream[:, self.act_cols], eff_prob=t.eff_prob[..., self.eff_cols],
                       eff_target=t.eff_target[..., self.eff_cols])
        C, A = t.act_prob.shape
        S, _, E = t.eff_prob.shape
        W = max(A + 1, E)
        self.n_cells, self.n_streams, self.width = C, S, W
        self.max_d = t.choice.shape[1]
        cells = np.arange(C)
        target = np.tile(cells[None, :, None], (S + 1, 1, W))
        target[:S, :, :E] = t.eff_target
        target[S, :, :A] = t.act_target
        target = np.where(target == OVERFLOW, C, target)
        stream = np.full((C, W), -1, np.int64)
        stream[:, :A] = np.where(t.act_prob > 0, t.act_stream, -1)
        delta = np.where(target == C, 0, t.jobs[np.minimum(target, C - 1)] - t.jobs[None, :, None])
        # The largest job changes of a move (with probability > 0), which the FCFS queues unroll.
        prob = np.zeros((S + 1, C, W))
        prob[:S, :, :E] = t.eff_prob
        prob[S, :, :A] = t.act_prob
        live = (prob > 0) & (target < C)
        if S:
            live[:S] &= (t.key < INELIGIBLE)[:, :, None]
        self.up = int(max(delta[live].max(initial=0), 0))
        self.down = int(max((-delta[live]).max(initial=0), 0))
        self.origins = bool((stream >= 0).any())
        self.fcfs = t.fcfs
        self.queue = max(int(t.jobs.max()), 1)  # ring-buffer slots per server (FCFS)
        self.empty_cell = t.empty_cell
        self.target = target.astype(np.int32)
        self.delta = delta.astype(np.int32)
        self.stream = stream.astype(np.int32)
        self.key = np.asarray(t.key, np.int32)
        self.jobs = t.jobs
        self.arrivals = t.arrivals.copy()
        self.level = t.level
        self.status = t.status
        self.status_names = t.status_names
        self.phases = 0 if t.phase_rates is None else int(t.phase_rates.shape[1])  # 0: no global phase
        self.pool = t.pool_held is not None
        self.pool_held = t.pool_held if self.pool else np.zeros(C, bool)
        self.pool_redirect = t.pool_redirect if self.pool else cells
        self.pool_promote = t.pool_promote if self.pool else np.full(C, -1)
        # Random order (`SimTables.random_order`): the jobs in service of each cell, and each server's store of the
        # arrival times of its jobs, `slots` per server (slot 0 the job in service, 1..w the w waiting ones).
        self.random_order = bool(t.random_order)
        if self.random_order:
            self.in_service = np.asarray(t.in_service, np.int64)
            self.slots = 1 + max(int((t.jobs - self.in_service).max()), 1)
        else:
            self.in_service, self.slots = np.zeros(C, np.int64), 0
        h = hashlib.sha256()
        for a in (self.target, self.delta, self.stream, self.key, self.jobs, self.arrivals, self.level, self.status,
                  self.act_cols, self.eff_cols, self.pool_held, self.pool_redirect, self.pool_promote,
                  self.in_service):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr((C, S, W, self.max_d, self.fcfs, self.empty_cell, self.status_names, self.pool,
                       self.phases, self.random_order)).encode())
        self._digest = h.digest()

    def __hash__(self) -> int:
        return hash(self._digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, Structure) and self._digest == other._digest

    def __repr__(self) -> str:
        return (f"Structure(cells={self.n_cells}, streams={self.n_streams}, width={self.width}, max_d={self.max_d}, "
                f"fcfs={self.fcfs}, origins={self.origins}, pool={self.pool}, phases={self.phases}, up={self.up}, "
                f"down={self.down}, random_order={self.random_order})")
