r"""Sojourn and waiting times of a tagged job in the mean-field limit: their distributions, not only their means.

**The tagged job.** In the mean-field limit a server evolves, at the fixed point $x^*$, as a Markov chain of its
own: its local events at their rates, and each dispatch choosing it at the rate the tail rule gives its cell
(`jsmkt._models.meanfield.chosen_factor`); the other servers are the stationary occupancy $x^*$. A tagged job
joins a server of cell $c$, through the effect row $c \to c'$ of an arrival stream, in proportion to that row's
flow $R\,h_c(x^*)\,x^*_c\,w$ (Poisson arrivals see the stationary occupancy); a batch's $b$ jobs take the positions
after the $\text{jobs}_c$ already there, one each. The server is an FCFS queue: a move that lowers its jobs by
$r$ removes the $r$ oldest (a completion, a helper's completion, a batch service), one that raises them appends
behind the tagged job, which it never delays. The tagged job leaves when the removals since it joined reach its
position $p$, so its sojourn time is the absorption time of the chain of (the server's cell, the job's
position), and its waiting time (time to the head of the queue, where service starts) that of $p - 1$ removals.

**A modulating phase** (`JSQdBMAP`: one BMAP feeds all servers). The phase moves $N$ times faster than one
server's events, so in the limit a server sees its streams at their averaged rates $\gamma r_s$ (`averaged`, the
description's mean field), and a batch finds the occupancy $x^*$ whatever phase it comes in. The chain is therefore
that of batch-Poisson arrivals: a job belongs to a batch of $b$ with the size-biased probability
$b\,\gamma D_b\mathbf 1/\sum_{b'} b'\,\gamma D_{b'}\mathbf 1$, joins cell $c$ by the tail rule and takes position
$\text{jobs}_c + j$, $j$ uniform on $1..b$; the FCFS server then removes jobs at its own rates, and later batches
queue behind the job. The phase's moves and correlations enter only the $1/N$ terms; for $d = 1$ the law is the
M^X/M/1 FCFS law of the averaged batch rates, not the BMAP/M/1 one.

**Two chains.** When the rates that move the tagged job forward (removals, and changes of the server's status,
e.g. the phase of the job in service or a failure) depend on the server's status only, not on its level (the
jobs behind the tagged job are then irrelevant), the chain lumps to (status, position): $m \cdot K$ states for PH
service with $m$ phases. This holds for JSQ(d) with exponential or PH service, batch arrivals, several classes
without helpers, batch service and repairable servers with a repairman per server (R.1, and R.3 below
saturation, where no server waits for the large repairman). It is decided from the description: every dispatch
that moves a non-empty server forward must give one priority key to every reachable cell of one status, and the
local events' rates are compared numerically. Otherwise the chain is the full one, (cell, position), exact too
but larger ($\sum_c \text{jobs}_c$ states): helpers that serve the longest queues (`JSQdClasses` with `helper_rates`)
and the repairmen that choose the failed server with the longest queue (`RepairableJSQ` with R.2, R.3 at
saturation) move the job in service at a rate that depends on the queue behind it.

**Random-order servers** (`Description.random_order`: own-orbit retrials). A server holds its waiting jobs
($\text{jobs}_c - \text{in service}_c$, an orbit) in random order and no job moves to another server. The tagged
job's state is (cell, role): in service, or waiting. A move $c \to c'$ that completes $k$ jobs in service and starts
$r$ waiting ones ($k = \text{jobs}_c - \text{jobs}_{c'}$, $r$ the fall of the waiting jobs; for an own retrial
$(j, \text{idle}) \to (j - 1, \text{busy})$, $k = 0$ and $r = 1$) removes the tagged job in service with
probability $k/\text{in service}_c$ and starts the waiting one with probability $r/\text{waiting}_c$ (each of
them equally likely: the orbit retries at $j\theta$ or at θ, one of its $j$ customers at random); every other move
changes only the cell. A job that joins through an arrival row $c \to c'$ starts at once if it is one of those the
row puts in service, else it waits. In the chain's format the role is the position, 1 in service and 2 waiting, so
that the start of service and the end of the stay are one removal each: the sojourn time is the absorption time, and
the waiting time (to the start of service) the time of $p - 1$ removals as at an FCFS queue, whose atom at 0 is the
probability of joining in service. The chain does not lump: the chance that the tagged job starts depends on how
many wait. Jobs that move to another server (re-probing retrials) are refused: the job's stay would run through
every server it visits, each found at the occupancy its probes see.

**Uniformisation.** With $Q$ the chain's transient generator, $q = \max_i(-Q_{ii})$ and $P = I + Q/q$, the
survival function is $\bar F(t) = \sum_{n \ge 0} e^{-qt}(qt)^n/n!\;a_n$ with $a_n = \pi_0 P^n \mathbf 1$, the
probability that the job is still there after $n$ steps of the uniformised chain. The sequence $a_n$ is computed
once (a structured product per step: the chain is block lower-triangular Toeplitz in the position, one block per
number of jobs a move removes), until $a_n < 10^{-17}$; then every $t$ costs one Poisson-weighted sum, with an
error below $a_n$ at the last step for every $t$. The mean is $\sum_n a_n/q$, the density
$q\sum_n e^{-qt}(qt)^n/n!\,(a_n - a_{n+1})$, and a quantile is found by safeguarded Newton steps on $t$, then one
more from the root that carries the derivatives (the implicit function theorem). The steps run in chunks that
stop once $a_n$ is negligible (`lax.cond`; under `vmap` every chunk runs), checkpointed, so `jax.grad` works
through them with memory for the chunk boundaries only.

**With $N$ servers** (`refined_sojourn_time_distribution`). The $1/N$ term of the law is not the mean-field law
at the corrected occupancy $y^* + V/N$: the server a job joins is chosen from the fluctuating occupancy, and,
where its stay depends on the other servers, the occupancy keeps fluctuating, correlated with the job's server,
while it stays. The jobs that arrive in a short interval, marked, form a population process together with the
occupancy, linear in the marked part, and the refined mean field of that pair (its transient $1/N$ term from the
stationary law) is the exact $1/N$ term of the job's law (`_refined_steps`).
"""

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import gammaln, xlogy
from jaxtyping import Array, ArrayLike, Float

from . import _maps
from ._compile import fast_jit
from ._errors import error_if, is_concrete
from ._graph import reachable
from ._models.base import AbstractDescribedModel, AbstractSupermarketModel
from ._models.description import Description
from ._models.meanfield import averaged, chosen_factor, clipped_targets, pool_cells, pooled, saturated_pool
from ._refined import _contract_hessian, _with_sampling_eps
from ._solution import Trajectory, failed, nan_where


MAX_TERMS = 2**15  # default cap on the uniformisation steps (a_n below _EPS well before, except near saturation)
_CHUNK = 64  # steps per chunk (a chunk after convergence is skipped)
_EPS = 1e-17  # a_n below this: the job has left, to float64 precision of the CDF
_LUMP_TOL = 1e-11  # relative mismatch of rates between levels above which the chain is not lumped
_MAX_P = 1.0 - 1e-12  # largest probability a quantile is asked for (the CDF is accurate to about 1e-16)
_DENSE_STATES = 16  # chains of up to this many states (or with a dense set of moves) step by matrix products


# --- the tagged server's chain ----------------------------------------------------------------------------------


class _Moves(NamedTuple):
    source: np.ndarray  # (M,) cells
    target: np.ndarray  # (M,) cells (clipped at K)
    rate: Array  # (M,) per-server rates at the occupancy


def _server_moves(desc: Description, x: Array) -> _Moves:
    """Every move of one server at occupancy `x`: local events at their rates, each dispatch's effect at the rate
    the tail rule chooses the cell, and, under a saturated pool, the promotion of a waiting server (uniform among
    the waiting, at the rate units are freed)."""
    cells = desc.cells
    src, tgt, rate = [], [], []
    freed = jnp.zeros((), x.dtype)

    def add(moves, per_server):
        nonlocal freed
        moves, frees = pooled(desc, moves)
        s = np.asarray(moves.source)
        src.append(s)
        tgt.append(clipped_targets(cells, moves))
        rate.append(per_server)
        if frees.any():
            idx = np.flatnonzero(frees)
            freed = freed + jnp.sum(per_server[idx] * x[s[idx]])

    for ev in desc.local_events:
        add(ev.moves, jnp.asarray(ev.moves.weight, x.dtype))
    for disp in desc.dispatches:
        eff = disp.effect
        add(eff, disp.rate * chosen_factor(disp, x)[np.asarray(eff.source)] * eff.weight)
    pool = saturated_pool(desc)
    if pool is not None:
        _, waits, _, promote = pool_cells(cells, pool)
        w = np.flatnonzero(waits)
        mass = jnp.sum(x[w])
        per = jnp.where(mass > 0, freed / jnp.where(mass > 0, mass, 1.0), 0.0)
        src.append(w)
        tgt.append(promote[w])
        rate.append(jnp.broadcast_to(per, w.shape))
    return _Moves(np.concatenate(src), np.concatenate(tgt), jnp.concatenate(rate))


def _move_structure(desc: Description) -> tuple[np.ndarray, np.ndarray]:
    """Source and target cells of the moves of `_server_moves`, in its order, without their rates (static)."""
    cells = desc.cells
    src, tgt = [], []
    for moves in [ev.moves for ev in desc.local_events] + [d.effect for d in desc.dispatches]:
        moves = pooled(desc, moves)[0]
        src.append(np.asarray(moves.source))
        tgt.append(clipped_targets(cells, moves))
    pool = saturated_pool(desc)
    if pool is not None:
        _, waits, _, promote = pool_cells(cells, pool)
        src.append(np.flatnonzero(waits))
        tgt.append(promote[waits])
    return np.concatenate(src), np.concatenate(tgt)


class _Facts(NamedTuple):
    """Static facts of a description for the tagged job: why it has no tagged chain (no FCFS queues nor
    random-order servers; or `None`), whether the head of every reachable non-empty queue is in service (a
    random-order server's waiting jobs start service directly), and the most jobs a move removes without emptying
    the server."""

    no_fcfs: str | None
    head_in_service: bool
    removals: int


_NO_FCFS = ("its servers hold no FCFS queues (jobs move between servers, e.g. from orbits, or leave from inside a "
            "queue, e.g. by abandoning): a job's sojourn time is not the time until the jobs ahead of it leave")
_MOVES = ("its servers hold no FCFS queues and its jobs move between servers (e.g. a re-probing retrial leaves its "
          "orbit for a server its probes choose): a job's stay then runs through every server it visits, each found "
          "at the occupancy its probes see, which the chain of one tagged server does not carry; only jobs that stay "
          "at their server (in FCFS queues, or waiting in random order as own-orbit retrials) have the law")
_FACTS: dict = {}


def _random_order_defect(desc: Description) -> str | None:
    """Why the tagged job's chain of a description with `fcfs=False` cannot be built (or `None`): it needs servers
    that hold their waiting jobs in random order (`random_order`), no job that moves to another server, and moves
    that each complete jobs in service and start waiting ones (or bring jobs), never return a job to waiting or
    remove a waiting one (a static fact)."""
    if any(d.origin is not None for d in desc.dispatches):
        return _MOVES
    if not desc.random_order:
        return _NO_FCFS
    cells = desc.cells
    jobs, serving = cells.jobs, cells.in_service
    src, tgt = _move_structure(desc)
    d_jobs, d_wait = jobs[tgt] - jobs[src], (jobs - serving)[tgt] - (jobs - serving)[src]
    gain = d_jobs > 0
    bad = np.where(gain, (serving[tgt] < serving[src]) | (d_wait < 0), (d_wait > 0) | (-d_jobs > serving[src]))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return (f"its servers hold their waiting jobs in random order, but a move from cell {int(src[i])} to cell "
                f"{int(tgt[i])} (jobs {int(jobs[src[i]])} -> {int(jobs[tgt[i]])}, in service "
                f"{int(serving[src[i]])} -> {int(serving[tgt[i]])}) neither only brings jobs nor only completes jobs "
                "in service and starts waiting ones: which job it moves is not defined")
    return None


def _facts(model: AbstractDescribedModel) -> _Facts:
    """`_Facts` of `model`'s description, kept per model structure (its tree structure, static fields included,
    and the shapes of its arrays)."""
    key = _maps.signature(model)
    out = _FACTS.get(key)
    if out is None:
        desc = model.description()
        if not desc.fcfs:  # random-order servers: service starts (and completes) one job at a time
            why = _random_order_defect(desc)
            out = _Facts(why, why is None, 1)
        elif any(d.origin is not None for d in desc.dispatches):
            out = _Facts(_NO_FCFS, False, 0)
        else:
            cells = desc.cells
            src, tgt = _move_structure(desc)
            reach = _reachable_from(cells.size, src, tgt)
            busy = reach & (cells.jobs >= 1)
            r = cells.jobs[src] - cells.jobs[tgt]
            stay = busy[src] & (cells.jobs[tgt] >= 1) & (r > 0)
            out = _Facts(None, bool(np.all(cells.in_service[busy] == 1)), int(r[stay].max(initial=1)))
        if len(_FACTS) >= 256:
            _FACTS.clear()
        _FACTS[key] = out
    return out


def _reachable(desc: Description, moves: _Moves) -> np.ndarray:
    """Cells a server can reach from the empty one (cell 0) through moves that exist (whatever their rates): the
    support of the tagged server's chain. A status the mean field never enters (R.3's waiting servers below
    saturation, where every failed server gets a small repairman) is left out."""
    return _reachable_from(desc.cells.size, moves.source, moves.target)


def _reachable_from(C: int, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    adj = np.zeros((C, C), bool)
    adj[source, target] = True
    return reachable(adj)


def _arrival_flows(desc: Description, x: Array, stream: str | None):
    """Rows of the arrival streams' effects (or of the stream named `stream`): source cell, target cell (clipped at
    `K`) and the flow per unit time and server of events through the row."""
    names = [d.name for d in desc.dispatches if d.arrivals]
    if stream is not None and stream not in names:
        raise ValueError(f"stream={stream!r} is not an arrival stream of this model; its arrival streams are {names}")
    src, tgt, flow = [], [], []
    for disp in desc.dispatches:
        if not disp.arrivals or (stream is not None and disp.name != stream):
            continue
        eff = pooled(desc, disp.effect)[0]
        s = np.asarray(eff.source)
        src.append(s)
        tgt.append(clipped_targets(desc.cells, eff))
        flow.append(disp.rate * chosen_factor(disp, x)[s] * x[s] * eff.weight)
    return np.concatenate(src), np.concatenate(tgt), jnp.concatenate(flow)


class _Chain(NamedTuple):
    """The tagged job's chain: states (statuses when lumped, else cells), positions `1..P`. Its moves that can keep
    the tagged job go from state `frm[i]` to `to[i]` at rate `rate[i]`, removing `shifts[shift[i]]` jobs ahead of
    it (position p -> p - r; at or below 0 the job has left); `out` is every state's total rate of moves that touch
    the tagged job (those that always remove it included); `init` the law of (position, state) at joining."""

    shifts: tuple[int, ...]
    frm: np.ndarray  # (M,)
    to: np.ndarray  # (M,)
    shift: np.ndarray  # (M,) index into `shifts`
    rate: Array  # (M,)
    out: Array  # (n,)
    init: Array  # (P, n)
    lumped: bool


def _key_dependence(desc: Description, reach: np.ndarray) -> str | None:
    """The name of a dispatch that moves a non-empty reachable server forward (removing jobs or changing its
    status) with keys that differ between cells of one status, i.e. at a rate that depends on the level: the
    chain does not lump (a static fact of the description)."""
    cells = desc.cells
    jobs, status = cells.jobs, cells.status
    for disp in desc.dispatches:
        eff, _ = pooled(desc, disp.effect)
        s, t = np.asarray(eff.source), clipped_targets(cells, eff)
        rel = reach[s] & (jobs[s] >= 1) & ((jobs[t] < jobs[s]) | (status[t] != status[s]))
        keys, st = np.asarray(disp.key)[s[rel]], status[s[rel]]
        for sigma in np.unique(st):
            if np.unique(keys[st == sigma]).size > 1:
                return disp.name
    return None


def _lumping_defect(desc: Description, moves: _Moves, reach: np.ndarray, rep: np.ndarray) -> Array:
    """The largest mismatch, relative to the largest rate, between a reachable non-empty cell's rates of moves
    that touch a tagged job and those of its status's representative (its top cell), compared as the tagged job
    at the cell's deepest position sees them: per target status and number of jobs removed, those that remove all
    the cell's jobs (which always remove the job) summed."""
    cells = desc.cells
    jobs, status = cells.jobs, cells.status
    S = len(cells.status_names)
    s, t = moves.source, moves.target
    r = np.maximum(jobs[s] - jobs[t], 0)
    rel = reach[s] & (jobs[s] >= 1) & ((r > 0) | (status[t] != status[s]))
    s, t, r, rate = s[rel], t[rel], r[rel], moves.rate[np.flatnonzero(rel)]
    if s.size == 0:
        return jnp.zeros((), moves.rate.dtype)
    R = int(r[r < jobs[s]].max(initial=0)) + 1  # bins 0..R-1 by jobs removed, R: the job leaves
    C = cells.size

    def index(cell, cut, r, tgt):
        gone = r >= cut
        return (cell * S + np.where(gone, 0, status[tgt])) * (R + 1) + np.where(gone, R, np.minimum(r, R))

    own = jax.ops.segment_sum(rate, jnp.asarray(index(s, jobs[s], r, t)), num_segments=C * S * (R + 1))
    pairs_c, pairs_m = [], []
    for sigma in np.unique(status[s]):
        mine = np.flatnonzero(s == rep[sigma])
        users = np.flatnonzero(reach & (jobs >= 1) & (status == sigma))
        pairs_c.append(np.repeat(users, mine.size))
        pairs_m.append(np.tile(mine, users.size))
    pc, pm = np.concatenate(pairs_c), np.concatenate(pairs_m)
    theirs = jax.ops.segment_sum(rate[pm], jnp.asarray(index(pc, jobs[pc], r[pm], t[pm])),
                                 num_segments=C * S * (R + 1))
    return jnp.max(jnp.abs(own - theirs)) / jnp.maximum(jnp.max(jnp.abs(rate)), 1e-300)


def tagged_chain(desc: Description, x: Array, stream: str | None = None, lumped: bool | None = None) -> _Chain:
    """The tagged job's chain at occupancy `x` (module docstring). `lumped=None` lumps when the description allows
    it; `True` requires it (a `ValueError` naming the dispatch otherwise), `False` builds the full chain. A
    modulating phase is averaged out first (module docstring)."""
    desc = averaged(desc)
    cells = desc.cells
    if not desc.fcfs:
        return _random_order_chain(desc, x, stream, lumped)
    if any(d.origin is not None for d in desc.dispatches):
        raise ValueError(_NO_FCFS)
    jobs, status = cells.jobs, cells.status
    P = int(jobs.max())
    moves = _server_moves(desc, x)
    reach = _reachable(desc, moves)
    busy = reach & (jobs >= 1)
    S = len(cells.status_names)
    dependent = _key_dependence(desc, reach)
    if lumped is None:
        lumped = dependent is None
    elif lumped and dependent is not None:
        raise ValueError(f"the dispatch {dependent!r} moves a tagged job forward at a rate that depends on the "
                         "server's level: the chain does not lump to (status, position)")
    if lumped:
        rep = np.full(S, -1)
        for sigma in range(S):
            top = np.flatnonzero(busy & (status == sigma))
            if top.size:
                rep[sigma] = top[np.argmax(cells.level[top])]
        state_of = np.full(cells.size, -1)
        live = np.flatnonzero(rep >= 0)
        state_of[busy] = np.searchsorted(live, status[busy])
        origin = np.isin(moves.source, rep[live])
    else:
        state_of = np.full(cells.size, -1)
        state_of[busy] = np.arange(int(busy.sum()))
        origin = busy[moves.source]
    n = int(state_of.max()) + 1
    s, t = moves.source[origin], moves.target[origin]
    rate = moves.rate[np.flatnonzero(origin)]
    r = np.maximum(jobs[s] - jobs[t], 0)
    touches = (r > 0) | (status[t] != status[s]) if lumped else t != s
    s, t, r = s[touches], t[touches], r[touches]
    rate = rate[np.flatnonzero(touches)]
    stays = (jobs[t] >= 1) & (r < jobs[s])  # the move can keep the tagged job (at a deep enough position)
    shifts = tuple(sorted({0} | set(r[stays].tolist())))
    k_of = {v: k for k, v in enumerate(shifts)}
    i, j = state_of[s], state_of[t]
    out = jax.ops.segment_sum(rate, jnp.asarray(i), num_segments=n)
    keep = np.flatnonzero(stays)
    shift = np.array([k_of[v] for v in r[keep]], dtype=np.int64)
    if lumped and dependent is None:
        defect = _lumping_defect(desc, moves, reach, rep)
        out = error_if(out, defect > _LUMP_TOL, "internal: the rates that move a tagged job forward depend on the "
                       "server's level although the description's keys do not say so; use lumped=False")
    # The law of (position, state) of a job at joining: row c -> c' of flow f puts jobs at positions
    # jobs_c + 1 .. jobs_c' (difference array over the positions, then a cumulative sum).
    a_src, a_tgt, flow = _arrival_flows(desc, x, stream)
    lo, hi = jobs[a_src], jobs[a_tgt]
    ok = (hi > lo) & (state_of[a_tgt] >= 0)
    lo, hi, st, f = lo[ok], hi[ok], state_of[a_tgt][ok], flow[np.flatnonzero(ok)]
    diff = jnp.zeros((P + 1) * n, x.dtype).at[jnp.asarray(lo * n + st)].add(f).at[jnp.asarray(hi * n + st)].add(-f)
    init = jnp.cumsum(diff.reshape(P + 1, n), axis=0)[:P]
    accepted = jnp.sum(f * jnp.asarray(hi - lo, x.dtype))
    init = init / jnp.where(accepted > 0, accepted, 1.0)
    return _Chain(shifts, i[keep], j[keep], shift, rate[keep], out, init, lumped)


def _random_order_states(desc: Description, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The states of `_random_order_chain`: of every cell, its (cell, in service) state and its (cell, waiting)
    state (-1 where none)."""
    cells = desc.cells
    serving, wait = cells.in_service, cells.jobs - cells.in_service
    in_service = np.full(cells.size, -1)
    ok = reach & (serving >= 1)
    in_service[ok] = np.arange(int(ok.sum()))
    waiting = np.full(cells.size, -1)
    ok = reach & (wait >= 1)
    waiting[ok] = int(in_service.max()) + 1 + np.arange(int(ok.sum()))
    return in_service, waiting


def _random_order_chain(desc: Description, x: Array, stream: str | None, lumped: bool | None) -> _Chain:
    """The tagged job's chain at a random-order server (module docstring, **Random-order servers**): states
    (cell, in service) for the reachable cells with a job in service, then (cell, waiting) for those with a
    waiting job; position 1 in service, 2 waiting, so that one removal (`shifts[1] = 1`) starts a waiting job or
    ends a job in service, and the waiting time is the time to the first."""
    why = _random_order_defect(desc)
    if why is not None:
        raise ValueError(why)
    if lumped:
        raise ValueError("lumped=True: at a random-order server the chance that the tagged job is the one to start "
                         "depends on how many jobs wait, so its chain does not lump to (status, position); use "
                         "lumped=None")
    cells = desc.cells
    jobs, serving = cells.jobs, cells.in_service
    wait = jobs - serving
    moves = _server_moves(desc, x)
    reach = _reachable(desc, moves)
    in_service, waiting = _random_order_states(desc, reach)
    n = max(int(waiting.max()), int(in_service.max())) + 1
    idx = np.flatnonzero((moves.source != moves.target) & reach[moves.source])
    s, t, rate = moves.source[idx], moves.target[idx], moves.rate[idx]
    done = np.maximum(jobs[s] - jobs[t], 0)  # jobs in service that the move completes
    start = np.maximum(wait[s] - wait[t], 0)  # waiting jobs that it starts
    w = np.maximum(wait[s], 1)
    # From (c, in service): completed with probability done / in service (it leaves), else in service at c'.
    # From (c, waiting): started with probability start / waiting (position 2 -> 1), else waiting at c'.
    # Every move that changes the cell leaves the state: `out` is their total rate.
    own, other = in_service[s], waiting[s]
    cases = ((own, in_service[t], 0, 1.0 - done / np.maximum(serving[s], 1), done < serving[s]),
             (other, waiting[t], 0, 1.0 - start / w, start < wait[s]),
             (other, in_service[t], 1, start / w, start > 0))
    rows = [np.flatnonzero((frm >= 0) & cond) for frm, _, _, _, cond in cases]
    frm = np.concatenate([c[0][r] for c, r in zip(cases, rows)])
    to = np.concatenate([c[1][r] for c, r in zip(cases, rows)])
    shift = np.concatenate([np.full(r.size, c[2]) for c, r in zip(cases, rows)])
    kept = jnp.concatenate([rate[r] * c[3][r] for c, r in zip(cases, rows)])
    mine = [np.flatnonzero(own >= 0), np.flatnonzero(other >= 0)]
    out = jax.ops.segment_sum(jnp.concatenate([rate[mine[0]], rate[mine[1]]]),
                              jnp.asarray(np.concatenate([own[mine[0]], other[mine[1]]])), num_segments=n)
    # Joining through row c -> c' of flow f: of its jobs_c' - jobs_c jobs, those put in service start at once
    # (position 1 at (c', in service)), the others wait (position 2 at (c', waiting)).
    a_src, a_tgt, flow = _arrival_flows(desc, x, stream)
    new = jobs[a_tgt] - jobs[a_src]
    joins = np.flatnonzero((new > 0) & reach[a_tgt])
    a_src, a_tgt, new, flow = a_src[joins], a_tgt[joins], new[joins], flow[joins]
    started, queued = serving[a_tgt] - serving[a_src], wait[a_tgt] - wait[a_src]
    at = np.concatenate([in_service[a_tgt], n + waiting[a_tgt]])
    share = np.concatenate([started, queued])
    use = np.flatnonzero(share > 0)
    init = jax.ops.segment_sum(jnp.concatenate([flow, flow])[use] * jnp.asarray(share[use], x.dtype),
                               jnp.asarray(at[use]), num_segments=2 * n).reshape(2, n)
    accepted = jnp.sum(flow * jnp.asarray(new, x.dtype))
    init = init / jnp.where(accepted > 0, accepted, 1.0)
    return _Chain((0, 1), frm, to, shift, kept, out, init, False)


def uniformised_survival(chain: _Chain, max_terms: int, waiting=False) -> tuple[Array, Array, Array]:
    r"""$a_n = \pi_0 P^n \mathbf 1$, $n = 0..$`max_terms` (zeros once below `_EPS`), the uniformisation rate $q$
    and whether $a_n$ fell below `_EPS`. `waiting` (a boolean, traced or not): the time to the head of the queue
    ($p - 1$ removals; $a_0$ is then the probability of waiting at all)."""
    init = jnp.where(waiting, jnp.concatenate([chain.init[1:], jnp.zeros_like(chain.init[:1])]), chain.init)
    q = jax.lax.stop_gradient(jnp.max(chain.out))
    q = jnp.where(q > 0, q, 1.0)
    P_, n = init.shape
    stay = 1.0 - chain.out / q
    dense = n * n <= max(_DENSE_STATES**2, 4 * chain.frm.size)  # the matrices are not much larger than the moves
    if dense:  # one matrix per number of jobs removed
        flat = (chain.shift * n + chain.frm) * n + chain.to
        blocks = jax.ops.segment_sum(chain.rate / q, jnp.asarray(flat), num_segments=len(chain.shifts) * n * n)
        blocks = blocks.reshape(len(chain.shifts), n, n)
    groups = [np.flatnonzero(chain.shift == k) for k in range(len(chain.shifts))]

    def step(u, _):
        new = u * stay[None, :]
        for k, r in enumerate(chain.shifts):
            if dense:
                v = u @ blocks[k]
            else:  # the moves as a scatter: O(P M) per step
                g = groups[k]
                v = jnp.zeros_like(u).at[:, chain.to[g]].add(u[:, chain.frm[g]] * (chain.rate[g] / q)[None, :])
            if r:  # position p -> p - r; those that reach 0 or below have left
                v = jnp.concatenate([v[r:], jnp.zeros((min(r, P_), n), u.dtype)])[:P_]
            new = new + v
        return new, jnp.sum(new)

    @jax.checkpoint
    def run(u):
        return jax.lax.scan(step, u, None, length=_CHUNK)

    def chunk(carry, _):
        u, done = carry
        u, a = jax.lax.cond(done, lambda u: (u, jnp.zeros(_CHUNK, u.dtype)), run, u)
        return (u, done | (a[-1] < _EPS)), a

    n_chunks = -(-max_terms // _CHUNK)
    a0 = jnp.sum(init)
    (_, done), a = jax.lax.scan(chunk, (init, a0 < _EPS), None, length=n_chunks)
    return jnp.concatenate([a0[None], a.reshape(-1)]), q, done


# --- the distribution -----------------------------------------------------------------------------------------


def _poisson(n: Array, lgam: Array, mu: Array) -> Array:
    return jnp.exp(xlogy(n, mu) - mu - lgam)


class TimeDistribution(eqx.Module):
    r"""The law of a tagged job's sojourn time or waiting time in the mean-field limit (from
    `jsmkt.sojourn_time_distribution` and `jsmkt.waiting_time_distribution`; see `jsmkt._sojourn` for the
    derivation).

    Stored as the uniformised survival sequence: $\bar F(t) = P(\text{time} > t) = \sum_n e^{-qt}(qt)^n/n!\;a_n$,
    $a_n$ the probability that the job is still there (still waiting) after $n$ steps of the tagged job's chain
    uniformised at rate $q$. Every method is a pure function of these arrays, so it composes with `jax.grad`
    (through the fixed point, with respect to every parameter of the model), `jax.vmap` and `jax.jit`.

    **Attributes:**

    - `survival_steps`: $a_n$, $n = 0, 1, \ldots$ ($a_0 = 1$ for sojourn times, the probability of waiting for
      waiting times; zeros once below $10^{-17}$).
    - `rate`: the uniformisation rate $q$.
    - `kind`: `"sojourn time"` or `"waiting time"`.

    The law of a fixed point that failed (solved with `throw=False`) has NaN steps and rate: every method then
    gives NaN, with NaN derivatives.
    """

    survival_steps: Float[Array, " n"]
    rate: Float[Array, ""]
    kind: str = eqx.field(static=True)

    def _at(self, t: Array) -> tuple[Array, Array]:
        """Survival $\bar F(t)$ and density $f(t)$ at a scalar `t >= 0`, from one set of Poisson weights."""
        a = self.survival_steps
        n = jnp.arange(a.shape[0], dtype=a.dtype)
        mu = self.rate * t
        w = jnp.exp(xlogy(n, mu) - mu - gammaln(n + 1.0))
        drop = a - jnp.concatenate([a[1:], jnp.zeros(1, a.dtype)])
        return jnp.sum(w * a), self.rate * jnp.sum(w * drop)

    def _unknown(self) -> Array:
        """Whether this is the law of a failed fixed point (NaN steps and rate)."""
        return jnp.isnan(self.rate) | jnp.isnan(self.survival_steps[0])

    @property
    def atom(self) -> Float[Array, ""]:
        """$P(\\text{time} = 0)$: 0 for sojourn times, the probability of not waiting for waiting times."""
        return 1.0 - self.survival_steps[0]

    @property
    def mean(self) -> Float[Array, ""]:
        r"""$E[\text{time}] = \sum_n a_n / q$ (equal to Little's law, `jsmkt.mean_sojourn_time` or
        `jsmkt.mean_waiting_time`, at a fixed point)."""
        return jnp.sum(self.survival_steps) / self.rate

    def cdf(self, t: ArrayLike) -> Float[Array, "..."]:
        r"""$P(\text{time} \le t)$ at the points `t` (any shape; 0 for $t < 0$)."""
        return _cdf(self, _times(t))

    def pdf(self, t: ArrayLike) -> Float[Array, "..."]:
        r"""The density at the points `t > 0` (any shape; 0 for $t < 0$). A waiting time's atom at 0 (`atom`) is
        not part of it: its density integrates to the probability of waiting."""
        return _pdf(self, _times(t))

    def quantile(self, p: ArrayLike) -> Float[Array, "..."]:
        r"""The smallest $t$ with $P(\text{time} \le t) \ge p$, for probabilities `p` in $[0, 1 - 10^{-12}]$ (any
        shape: e.g. `0.99` for p99, `jnp.array([0.5, 0.9, 0.99, 0.999])`). 0 where `p` is at most `atom`.
        Safeguarded Newton steps on $t$; derivatives (with respect to `p` and the model's parameters) by the
        implicit function theorem, $\partial t = -\partial\bar F/\bar F'$ at the root."""
        return _quantiles(self, _probabilities(p))

    def _quantile(self, p: Array) -> Array:
        frozen = TimeDistribution(jax.lax.stop_gradient(self.survival_steps), jax.lax.stop_gradient(self.rate),
                                  self.kind)
        valid = p > 1.0 - self.survival_steps[0]  # else the atom at 0 (waiting times)
        p = jnp.where(valid, p, 1.0 - 0.5 * self.survival_steps[0])
        target = 1.0 - jax.lax.stop_gradient(p)
        eps = jnp.finfo(p.dtype).eps

        # Double t from the mean until the survival falls below the target (hi = inf until then), then Newton steps
        # on t, replaced by bisection where they leave the bracket [lo, hi].
        def step(c):
            i, t, lo, hi, _ = c
            g, f = frozen._at(t)
            g = g - target
            lo, hi = jnp.where(g > 0, t, lo), jnp.where(g > 0, hi, t)
            nt = t + g / jnp.where(f > 0, f, 1.0)
            inside = (nt > lo) & (nt < hi) & (f > 0)
            t2 = jnp.where(jnp.isinf(hi), 2.0 * t, jnp.where(inside, nt, 0.5 * (lo + hi)))
            return i + 1, t2, lo, hi, jnp.abs(t2 - t)

        def going(c):
            i, t, lo, hi, moved = c
            return (i < 2200) & (moved > 4 * eps * t) & (jnp.isinf(hi) | (hi - lo > 4 * eps * hi))

        start = jnp.maximum(jnp.sum(frozen.survival_steps) / frozen.rate, 1e-300)
        zero = jnp.zeros_like(start)
        _, t, _, _, _ = jax.lax.while_loop(going, step, (0, start, zero, zero + jnp.inf, zero + jnp.inf))
        t = jax.lax.stop_gradient(t)
        # One Newton step from the root with the derivatives: t - (Fbar(t) - (1 - p)) / Fbar'(t).
        g, f = self._at(t)
        return jnp.where(valid, t + (g - (1.0 - p)) / f, 0.0)

    def __repr__(self) -> str:
        try:
            mean = f"{float(self.mean):.6g}"
        except Exception:  # noqa: BLE001  (traced)
            mean = "traced"
        return f"TimeDistribution(kind={self.kind!r}, mean={mean}, steps={self.survival_steps.shape[0]})"


@eqx.filter_jit
def _cdf(dist: TimeDistribution, t: Array) -> Array:
    g = jax.vmap(lambda u: dist._at(u)[0])(jnp.maximum(t, 0.0).reshape(-1)).reshape(t.shape)
    return nan_where(dist._unknown(), jnp.where(t < 0, 0.0, 1.0 - g))


@eqx.filter_jit
def _pdf(dist: TimeDistribution, t: Array) -> Array:
    f = jax.vmap(lambda u: dist._at(u)[1])(jnp.maximum(t, 0.0).reshape(-1)).reshape(t.shape)
    return nan_where(dist._unknown(), jnp.where(t < 0, 0.0, f))


@eqx.filter_jit
def _quantiles(dist: TimeDistribution, p: Array) -> Array:
    return nan_where(dist._unknown(), jax.vmap(dist._quantile)(p.reshape(-1)).reshape(p.shape))


def _times(t) -> Array:
    if isinstance(t, jax.core.Tracer):
        return t.astype(jnp.result_type(float))
    try:
        return jnp.asarray(t, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"t={t!r} is not a real number or array of real numbers (the times to evaluate at)") from e


def _probabilities(p) -> Array:
    if isinstance(p, (str, bytes)):
        raise ValueError(f"p={p!r} is not a probability; give a number in [0, 1) such as 0.99")
    if isinstance(p, jax.core.Tracer):
        p = p.astype(jnp.result_type(float))
        return error_if(p, jnp.any(~((p >= 0.0) & (p <= _MAX_P))),
                        f"p must be a probability in [0, {_MAX_P!r}] (0.99 for p99)")
    try:
        arr = np.asarray(p, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"p={p!r} is not a probability; give a number in [0, 1) such as 0.99") from e
    bad = ~((arr >= 0.0) & (arr <= _MAX_P))
    if bad.any():
        v = float(arr[bad].ravel()[0])
        hint = f" (for the {v:g}th percentile give p={v / 100:g})" if 1.0 < v <= 100.0 else ""
        raise ValueError(f"p={v!r} must be a probability in [0, 1 - 1e-12]{hint}")
    return jnp.asarray(arr)


# --- public entry points --------------------------------------------------------------------------------------


@fast_jit
def _compute(model: AbstractDescribedModel, y, stream, waiting: Array, max_terms: int, lumped, bad: Array):
    """The uniformised survival steps (`waiting` traced: the sojourn and waiting times of a model compile once).
    Where `bad` (a failed fixed point, whose occupancy is NaN) the chain starts with no job, so that no step is
    taken outside `vmap`; the caller makes its steps NaN."""
    chain = tagged_chain(model.description(), model.occupancy(y), stream, lumped)
    chain = chain._replace(init=jnp.where(bad, 0.0, chain.init))
    a, q, done = uniformised_survival(chain, max_terms, waiting)
    return a, q, done


def _checked(model, state, what: str, stream, max_terms, lumped):
    from ._metrics import _state
    from ._refined import RefinedMeanField

    if isinstance(state, RefinedMeanField):
        raise ValueError(
            f"state is a jsmkt.RefinedMeanField: the mean-field {what} distribution takes the fixed point; the law "
            f"with N servers to order 1/N is jsmkt.refined_{what.replace(' ', '_')}_distribution(refined, N)"
        )
    if isinstance(state, Trajectory):
        raise ValueError(f"state is a jsmkt.Trajectory: the {what} distribution is that of a job arriving at a "
                         "stationary occupancy; pass a jsmkt.FixedPoint")
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if not isinstance(model, AbstractDescribedModel):
        raise ValueError(f"{type(model).__name__} has no physical description (the papers' equations as published "
                         f"are models of the mean field only): no {what} distribution; use the exact model")
    if isinstance(max_terms, bool) or not isinstance(max_terms, (int, np.integer)) or max_terms < _CHUNK:
        raise ValueError(f"max_terms={max_terms!r} must be an integer >= {_CHUNK} (the most uniformisation steps)")
    if lumped not in (None, True, False):
        raise ValueError(f"lumped={lumped!r} must be None, True or False")
    return _state(model, state), int(max_terms)


def _refusal(model, waiting: bool) -> str | None:
    """Why `model` has no sojourn-time (`waiting=False`) or waiting-time law, or `None`."""
    facts = _facts(model)
    why = facts.no_fcfs
    if waiting and why is None and not facts.head_in_service:
        why = ("the job at the head of a queue is not always in service (e.g. at a failed server), so the time to "
               "reach the head is not the time to start service: waiting and interruptions do not separate")
    if waiting and why is None and facts.removals > 1:
        why = ("a service removes several jobs at once (batch service), so a job need not reach the head of its "
               "queue to leave; its sojourn-time distribution applies")
    return why


def _distribution(model, state, kind: str, waiting: bool, stream, max_terms, lumped, throw=True) -> TimeDistribution:
    y, max_terms = _checked(model, state, kind, stream, max_terms, lumped)
    why = _refusal(model, waiting)
    if why is not None:
        raise ValueError(f"{type(model).__name__}: no {kind} distribution: {why}")
    bad = failed(state)
    if bad is True:  # a failed fixed point (throw=False): its law is unknown, NaN, and nothing is computed
        return TimeDistribution(jnp.full(_CHUNK, jnp.nan), jnp.asarray(jnp.nan), kind)
    bad = jnp.asarray(bad, dtype=bool)  # False, or a traced flag (`~False` would be the integer -1)
    if is_concrete(model, y):
        _maps.before_compiling(f"jsmkt.{kind.replace(' ', '_')}_distribution",
                               ("sojourn", _maps.signature((model, y)), max_terms, lumped, stream))
    try:
        a, q, done = _compute(model, y, stream, jnp.asarray(waiting), max_terms, lumped, bad)
    except ValueError as e:  # refusals found while tracing the chain (e.g. a level-dependent dispatch)
        raise ValueError(f"{type(model).__name__}: no {kind} distribution: {e}") from None
    message = (f"the {kind}'s tail outlasts max_terms={max_terms} uniformisation steps (the load is close to 1, or "
               "rates differ by orders of magnitude); raise max_terms")
    if throw not in (True, False):
        raise ValueError(f"throw={throw!r} must be True or False")
    if is_concrete(a, done):
        if not bool(done) and not throw:
            return TimeDistribution(jnp.full(_CHUNK, jnp.nan), jnp.asarray(jnp.nan), kind)
        if not bool(done):
            raise ValueError(message)
        # Keep the steps up to where a_n is negligible (a power of two, so that few shapes compile).
        last = int(np.searchsorted(-np.asarray(a), -_EPS))
        size = min(a.shape[0], max(_CHUNK, 1 << int(np.ceil(np.log2(last + 1)))))
        a = a[:size]
    else:  # a failed entry of a batch is NaN, not an error (its fixed point's `result` says why)
        if throw:
            a = error_if(a, ~done & ~bad, message)
        a, q = nan_where(bad | ~done, (a, q))
    return TimeDistribution(a, q, kind)


def sojourn_time_distribution(model: AbstractSupermarketModel, state, *, stream: str | None = None,
                              max_terms: int = MAX_TERMS, lumped: bool | None = None,
                              throw: bool = True) -> TimeDistribution:
    r"""The law of the sojourn time (arrival to departure) of a job in the mean-field limit, at a fixed point.

    A tagged job joins a server chosen by the tail rule at the stationary occupancy and leaves when the FCFS
    queue has removed the jobs ahead of it and the job itself; its server evolves as one server of the mean
    field (module `jsmkt._sojourn`). Every family whose servers hold FCFS queues has it: `JSQd`, `JSQdPH`,
    `JSQdBatch` and `JSQdBMAP` (a job's position within its batch; the BMAP's phase averaged out), `JSQdClasses`
    (with helpers too), `JSQdBatchService`, `RepairableJSQ` (failures interrupt service). So do servers that
    hold their waiting jobs in random order: `RetrialJSQ` with `retrial="own"` (a customer leaves its orbit when
    one of its server's retrials, each by a customer of the orbit at random, finds the server idle). Re-probing
    retrials (`retrial="reprobe"`) have none: a customer moves between servers.

    **Arguments:**

    - `model`: a model stated by its physics (`jsmkt.AbstractDescribedModel`).
    - `state`: its `jsmkt.FixedPoint` (or the fixed point's reduced state).
    - `stream`: the name of one arrival stream (e.g. `"class 2 arrival"` of `JSQdClasses`): the law of that
      stream's jobs; by default of all jobs.
    - `max_terms`: the most uniformisation steps (static). The steps stop once the job has left to float64
      precision (a few hundred for JSQ(2) at load 0.9); under `jax.vmap` every entry runs all of them, so lower
      it there. A `ValueError` says when it is too small (near saturation).

    A fixed point that failed (solved with `throw=False`, e.g. an unstable entry of a `vmap` batch) gives a law
    whose every value (`cdf`, `pdf`, `quantile`, `mean`, `atom`) and derivative is NaN; nothing raises for it, and
    the other entries of the batch keep their values.
    - `lumped`: `None` (default) lumps the chain to (status, position) where the description allows it; `False`
      uses the full (cell, position) chain (a check), `True` requires lumping.
    - `throw`: with `False`, a law whose tail outlasts `max_terms` is NaN (as that of a failed fixed point) instead
      of an error, so that a batch can try its entries again with more steps (`jsmkt.sweep` does).

    **Returns:** a `jsmkt.TimeDistribution` with `cdf`, `pdf`, `quantile` and `mean` (equal to
    `jsmkt.mean_sojourn_time`, Little's law), differentiable with respect to the model's parameters.

    **Raises:** `ValueError` for a model whose jobs move between servers, a `jsmkt.RefinedMeanField` as `state` (no
    refined law: see the module docstring), or too few `max_terms`.

    !!! example

        ```python
        model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2)
        T = jsmkt.sojourn_time_distribution(model, jsmkt.solve_fixed_point(model))
        T.quantile(jnp.array([0.5, 0.99])), T.cdf(10.0), T.mean
        ```
    """
    return _distribution(model, state, "sojourn time", False, stream, max_terms, lumped, throw)


def waiting_time_distribution(model: AbstractSupermarketModel, state, *, stream: str | None = None,
                              max_terms: int = MAX_TERMS, lumped: bool | None = None,
                              throw: bool = True) -> TimeDistribution:
    r"""The law of the waiting time (arrival to start of service) of a job in the mean-field limit, at a fixed
    point: the time until the jobs ahead of it have left. An atom at 0 (`atom`, the probability of not waiting,
    $1 - $ `jsmkt.prob_wait`) and a density on $t > 0$; its mean is `jsmkt.mean_waiting_time`.

    Defined where the job at the head of a queue is always in service and services remove one job at a time:
    `JSQd`, `JSQdPH`, `JSQdBatch`, `JSQdBMAP`, `JSQdClasses` (and `JSQdBatchService` with batches of one); and at
    servers whose waiting jobs start in random order, `RetrialJSQ` with `retrial="own"` (the time in orbit).
    Refused for `RepairableJSQ` (a failed server's head job waits too, so waiting and interruptions do not
    separate) and batch service (a job may leave without reaching the head). Arguments, returns and errors as
    `jsmkt.sojourn_time_distribution`.
    """
    return _distribution(model, state, "waiting time", True, stream, max_terms, lumped, throw)


# --- the refined (1/N) law ------------------------------------------------------------------------------------


class RefinedTimeDistribution(eqx.Module):
    r"""The law of a tagged job's sojourn or waiting time with $N$ servers to order $1/N$ (from
    `jsmkt.refined_sojourn_time_distribution`; derivation in `_refined_steps`):
    $\bar F_N(t) = \bar F(t) + c(t)/N + O(1/N^2)$, $\bar F$ the mean-field survival function.

    Stored as two uniformised sequences at one rate $q$: the mean field's $a_n$ and the correction's $c_n$, so
    that $\bar F_N(t) = \sum_n e^{-qt}(qt)^n/n!\,(a_n + c_n/N)$. `cdf`, `pdf`, `quantile`, `mean` and `atom` are
    those of this refined survival function (`law`), with the same methods, errors and derivatives as
    `jsmkt.TimeDistribution`; `mean` equals the refined mean of Little's law.

    **Attributes:**

    - `mean_field`: the mean-field law, a `jsmkt.TimeDistribution` (the same law as
      `jsmkt.sojourn_time_distribution`'s, uniformised at the rate $q$ of the correction).
    - `correction_steps`: $c_n$, $n = 0, 1, \ldots$
    - `n_servers`: $N$.
    """

    mean_field: TimeDistribution
    correction_steps: Float[Array, " n"]
    n_servers: Float[Array, ""]

    @property
    def law(self) -> TimeDistribution:
        """The refined law as a `jsmkt.TimeDistribution`: steps $a_n + c_n/N$."""
        mf = self.mean_field
        return TimeDistribution(mf.survival_steps + self.correction_steps / self.n_servers, mf.rate, mf.kind)

    @property
    def atom(self) -> Float[Array, ""]:
        """$P(\\text{time} = 0)$ to order $1/N$ (0 for sojourn times)."""
        return self.law.atom

    @property
    def mean(self) -> Float[Array, ""]:
        """$E[\\text{time}]$ to order $1/N$."""
        return self.law.mean

    def cdf(self, t: ArrayLike) -> Float[Array, "..."]:
        r"""$P(\text{time} \le t)$ to order $1/N$ at the points `t` (any shape)."""
        return self.law.cdf(t)

    def pdf(self, t: ArrayLike) -> Float[Array, "..."]:
        """The density to order $1/N$ at the points `t > 0` (any shape)."""
        return self.law.pdf(t)

    def quantile(self, p: ArrayLike) -> Float[Array, "..."]:
        r"""The time $t$ where the refined CDF reaches `p` (any shape, e.g. `0.99` for p99): the root of
        $1 - \bar F(t) - c(t)/N = p$, by the safeguarded Newton steps of `jsmkt.TimeDistribution.quantile`."""
        return self.law.quantile(p)

    def __repr__(self) -> str:
        try:
            mean, n = f"{float(self.mean):.6g}", f"{float(self.n_servers):.6g}"
        except Exception:  # noqa: BLE001  (traced)
            mean = n = "traced"
        return (f"RefinedTimeDistribution(kind={self.mean_field.kind!r}, n_servers={n}, mean={mean}, "
                f"steps={self.correction_steps.shape[0]})")


def _forward(chain: _Chain, u: Array, rate: Array, out: Array) -> Array:
    """$u\\,G$: the tagged job's chain's generator (moves `chain.frm -> chain.to` at `rate`, total rates `out`)
    applied to a row vector `u` of shape (positions, states)."""
    P_, n = u.shape
    new = -u * out[None, :]
    for k, r in enumerate(chain.shifts):
        g = np.flatnonzero(chain.shift == k)
        if g.size == 0:
            continue
        v = jnp.zeros_like(u).at[:, chain.to[g]].add(u[:, chain.frm[g]] * rate[g][None, :])
        if r:
            v = jnp.concatenate([v[r:], jnp.zeros((min(r, P_), n), u.dtype)])[:P_]
        new = new + v
    return new


def _accepted(desc: Description, x: Array, stream: str | None) -> Array:
    """Jobs accepted per unit time and server (those a full buffer loses are not)."""
    src, tgt, flow = _arrival_flows(desc, x, stream)
    return jnp.sum(flow * jnp.asarray(np.maximum(desc.cells.jobs[tgt] - desc.cells.jobs[src], 0), x.dtype))


def _full_states(desc: Description, x: Array) -> tuple[np.ndarray, np.ndarray]:
    """The states of the full chain (`tagged_chain(..., lumped=False)`) by cell: `(state_of, cell_of)`, where
    `state_of` is `(C,)` for FCFS servers (the (cell, position) chain) and `(2, C)` (in service, waiting) at
    random-order ones, -1 where a cell has no such state; `cell_of` is the cell of every state."""
    reach = _reachable(desc, _server_moves(desc, x))
    if not desc.fcfs:
        state_of = np.stack(_random_order_states(desc, reach))
    else:
        busy = reach & (desc.cells.jobs >= 1)
        state_of = np.full(desc.cells.size, -1)
        state_of[busy] = np.arange(int(busy.sum()))
    cell_of = np.zeros(int(state_of.max()) + 1, np.int64)
    for row in np.atleast_2d(state_of):
        cell_of[row[row >= 0]] = np.flatnonzero(row >= 0)
    return state_of, cell_of


def _marks(desc: Description, x: Array, stream: str | None, state_of: np.ndarray, weight: Array) -> Array:
    """Jobs joining per unit time and server at each (position, state) of the full chain (as its `init` before
    normalising), each arrival row's flow times `weight[..., row]` (the last axis; leading axes are kept)."""
    cells = desc.cells
    src, tgt, flow = _arrival_flows(desc, x, stream)
    flow = flow.reshape((1,) * (weight.ndim - 1) + (-1,)) * weight
    lead = flow.shape[:-1]
    n = int(state_of.max()) + 1
    if not desc.fcfs:  # random order: in service at once (position 1) or waiting (position 2)
        serving, wait = cells.in_service, cells.jobs - cells.in_service
        out = jnp.zeros(lead + (2, n), x.dtype)
        for pos, (gain, states) in enumerate(((serving[tgt] - serving[src], state_of[0][tgt]),
                                              (wait[tgt] - wait[src], state_of[1][tgt]))):
            use = np.flatnonzero((gain > 0) & (states >= 0) & (cells.jobs[tgt] > cells.jobs[src]))
            gained = jnp.asarray(gain[use], x.dtype).reshape((1,) * len(lead) + (-1,))
            out = out.at[..., pos, states[use]].add(flow[..., use] * gained)
        return out
    P = int(cells.jobs.max())
    lo, hi = cells.jobs[src], cells.jobs[tgt]
    ok = np.flatnonzero((hi > lo) & (state_of[tgt] >= 0))
    f = flow[..., ok]
    diff = jnp.zeros(lead + ((P + 1) * n,), x.dtype)
    diff = diff.at[..., lo[ok] * n + state_of[tgt[ok]]].add(f).at[..., hi[ok] * n + state_of[tgt[ok]]].add(-f)
    return jnp.cumsum(diff.reshape(lead + (P + 1, n)), axis=-2)[..., :P, :]


_DEPENDS: dict = {}


def _stay_depends(model: AbstractDescribedModel, stream: str | None) -> bool:
    """Whether the rates of the (lumped where possible) tagged chain depend on the occupancy, i.e. whether a job's
    stay, not only the server it joins, depends on the other servers: a static fact, found from the derivative of
    the chain's rates at a generic occupancy and kept per model structure. A traced model whose structure was not
    seen yet is taken as dependent (the full chain: the same law, at a higher cost)."""
    key = (_maps.signature(model), stream)
    out = _DEPENDS.get(key)
    if out is None:
        if not is_concrete(model):
            return True
        desc = model.description()
        x = np.random.default_rng(0).uniform(0.5, 1.5, desc.cells.size)
        x = jnp.asarray(x / x.sum())
        lumped = []

        def rates(u):
            chain = tagged_chain(desc, u, stream)
            lumped.append(chain.lumped)  # a static fact, recorded while tracing
            return chain.rate, chain.out

        jac = jax.jit(jax.jacfwd(rates))(x)
        out = (not lumped[0]) or any(bool(jnp.any(j != 0)) for j in jac)
        if len(_DEPENDS) >= 256:
            _DEPENDS.clear()
        _DEPENDS[key] = out
    return out


@fast_jit
def _refined_steps(model, y, V, W, stream, waiting, max_terms: int, replace: bool, depends: bool):
    r"""The uniformised steps $a_n$ (mean field) and $c_n$ (the $1/N$ term) of a tagged job's survival function.

    **Marked jobs.** Mark the jobs that arrive during $[0, \delta]$ in a stationary system. With $N$ servers,
    $P(T > t) = \lim_{\delta \to 0} E[M^N(t)]/E[M^N(0^+)]$, $M^N(t)$ the marked jobs still there at $t$ per
    server. The servers with a marked job, by (position, state) of the tagged chain, form a density-dependent
    population process together with the occupancy $Y^N$: its rates are $N$ times smooth functions, linear in
    the marked part $m$, $\dot m = m\,G(y)$ ($G$ the tagged chain's generator at the occupancy $y$). So the
    refined mean field of the pair $(Y^N, M^N)$ (the transient one, `jsmkt.refined_transient`, from the
    stationary law) gives $E[M^N(t)] = m(t) + v(t)/N + O(1/N^2)$:

    - $m(0) = M_0(y^*)$, the jobs joining each (position, state) per unit time, $\dot m = m\,G$ at $y^*$
      (the mean-field law);
    - $v(0) = DM_0\,V + \frac12 D^2M_0 : W$ (the joining law averaged over the occupancy's $1/N$ law; plus
      $\partial_\varepsilon M_0$ when sampling without replacement from $N = 1/\varepsilon$), and
      $\dot v = v\,G + m\,(DG\,V + \frac12 D^2G : W + \partial_\varepsilon G) + \sum_i W_{ym,i}\,\partial_i G$;
    - $W_{ym} = \lim N\,\mathrm{Cov}(Y^N, M^N)$, the covariance of the occupancy with the marked servers that
      carries the correlation along the stay: $W_{ym}(0) = W\,DM_0^\top + \sum_{\text{arrival rows}}
      \text{flow}\;\ell\,e^\top$ (a marked job's arrival also moves its server in $y$, by $\ell$), and
      $\dot W_{ym,i} = \sum_j A_{ij} W_{ym,j} + W_{ym,i}\,G + m\,(\textstyle\sum_j W_{ij}\partial_j G)
      + m\,G^{(\ell_i)}$, where $A$ is the drift's Jacobian and $G^{(\ell_i)}$ the tagged chain's moves each
      weighted by its server's jump $\ell_i$ in the reduced state (the jump covariance of the pair).

    $Y^N$ stays stationary ($E = y^* + V/N$, $N\,\mathrm{Cov} = W$) whatever the marks. Where the chain's
    rates do not depend on the occupancy ($\partial G = 0$: the job's server moves by its own events only, as for
    FCFS servers with PH service or repairs), $W_{ym}$ drops out and $v(t) = v(0)\,e^{Gt}$, the chain started
    from the refined joining law; otherwise the full (cell, position) chain is used, whose states know their
    server's cell. The survival function is the ratio, to order $1/N$:
    $(\sum m + \sum v/N)/(\text{acc} + \text{acc}_1/N)$, acc the accepted jobs per unit time.

    Everything is linear in $(m, v, W_{ym})$ with constant coefficients, so it is uniformised at one rate $q$
    (at least every rate of $G$ and $\max_i\sum_j |A_{ij}|$) and stepped in checkpointed chunks as
    `uniformised_survival`."""
    flat, unravel = ravel_pytree(y)
    V, _ = ravel_pytree(V)
    n = flat.size
    zero = jnp.zeros((), flat.dtype)
    lumped = None if not depends else False

    def parts(z, eps):
        mod = model if replace else _with_sampling_eps(model, eps)
        desc = mod.description()
        x = mod.occupancy(unravel(z))
        chain = tagged_chain(desc, x, stream, lumped)
        init = jnp.where(waiting, jnp.concatenate([chain.init[1:], jnp.zeros_like(chain.init[:1])]), chain.init)
        acc = _accepted(averaged(desc), x, stream)
        return chain, init * acc, acc

    chain, m0, acc0 = parts(flat, zero)
    M, S = chain.rate.size, chain.out.size
    P_ = m0.shape[0]

    def values(z, eps=zero):
        c, m, acc = parts(z, eps)
        return jnp.concatenate([c.rate, c.out, m.reshape(-1), acc[None]])

    def split(vec):
        return vec[:M], vec[M:M + S], vec[M + S:-1].reshape(P_, S), vec[-1]

    first = jax.jvp(values, (flat,), (V,))[1] + 0.5 * _contract_hessian(values, flat, W)
    if not replace:
        first = first + jax.jvp(lambda e: values(flat, e), (zero,), (jnp.ones_like(zero),))[1]
    rate1, out1, v0, acc1 = split(first)

    q = jnp.max(chain.out)
    if depends:
        jac = jax.jacfwd(values)(flat)  # (len, n)
        drate, dout, dm0 = jac[:M], jac[M:M + S], jac[M + S:-1].reshape(P_, S, n)
        desc = averaged(model.description())
        x = model.occupancy(y)
        reduce_flat = lambda u: ravel_pytree(model.reduce(u))[0]  # noqa: E731
        R = jax.jacfwd(reduce_flat)(x)  # (n, C), the reduction is linear
        state_of, cell_of = _full_states(desc, x)
        src, tgt, _ = _arrival_flows(desc, x, stream)
        ell_rows = R[:, tgt] - R[:, src]  # each arrival row's jump of its server, (n, rows)
        jumps = _marks(desc, x, stream, state_of, ell_rows)  # (n, P, S); `dm0` has the waiting shift already
        jumps = jnp.where(waiting, jnp.concatenate([jumps[:, 1:], jnp.zeros_like(jumps[:, :1])], axis=1), jumps)
        w0 = jnp.einsum("psj,ij->ips", dm0, W) + jumps
        ell_kept = R[:, cell_of[chain.to]] - R[:, cell_of[chain.frm]]  # (n, kept moves)
        moves = _server_moves(desc, x)
        ell_all = R[:, moves.target] - R[:, moves.source]
        out_w = jax.ops.segment_sum((moves.rate[None, :] * ell_all).T, jnp.asarray(moves.source),
                                    num_segments=desc.cells.size)[cell_of].T  # (n, S)
        f = lambda z: ravel_pytree(model.vector_field(None, unravel(z)))[0]  # noqa: E731
        A = jax.jacfwd(f)(flat)
        rate_w = (drate @ W).T + chain.rate[None, :] * ell_kept  # (n, M)
        out_w = (dout @ W).T + out_w
        q = jnp.maximum(q, jnp.max(jnp.sum(jnp.abs(A), axis=1)))
        wym0 = w0
    else:
        wym0 = jnp.zeros((0, P_, S), flat.dtype)
    q = jax.lax.stop_gradient(q)
    q = jnp.where(q > 0, q, 1.0)
    rate0, out0 = chain.rate, chain.out
    fwd = lambda u, r, o: _forward(chain, u, r, o)  # noqa: E731

    def step(carry, _):
        m, v, wym = carry
        dm = fwd(m, rate0, out0)
        dv = fwd(v, rate0, out0) + fwd(m, rate1, out1)
        if depends:
            dv = dv + jnp.sum(jax.vmap(fwd, in_axes=(0, 1, 1))(wym, drate, dout), axis=0)
            dw = (jnp.tensordot(A, wym, axes=1) + jax.vmap(lambda u: fwd(u, rate0, out0))(wym)
                  + jax.vmap(lambda r, o: fwd(m, r, o))(rate_w, out_w))
            wym = wym + dw / q
        m, v = m + dm / q, v + dv / q
        sm = jnp.sum(m)
        return (m, v, wym), (sm / acc0, (jnp.sum(v) - sm * acc1 / acc0) / acc0)

    @jax.checkpoint
    def run(carry):
        return jax.lax.scan(step, carry, None, length=_CHUNK)

    def chunk(carry, _):
        state, done = carry
        state, (a, c) = jax.lax.cond(
            done, lambda s: (s, (jnp.zeros(_CHUNK, flat.dtype), jnp.zeros(_CHUNK, flat.dtype))), run, state)
        small = (a[-1] < _EPS) & (jnp.abs(c[-1]) < _EPS) & (jnp.max(jnp.abs(state[2]), initial=0.0) < _EPS)
        return (state, done | small), (a, c)

    a0 = jnp.sum(m0) / acc0
    c0 = (jnp.sum(v0) - jnp.sum(m0) * acc1 / acc0) / acc0
    n_chunks = -(-max_terms // _CHUNK)
    (_, done), (a, c) = jax.lax.scan(chunk, ((m0, v0, wym0), a0 < _EPS), None, length=n_chunks)
    return jnp.concatenate([a0[None], a.reshape(-1)]), jnp.concatenate([c0[None], c.reshape(-1)]), q, done


def _refined_distribution(refined, n_servers, kind: str, waiting: bool, stream, max_terms) -> RefinedTimeDistribution:
    from ._refined import RefinedMeanField, _check_n

    if not isinstance(refined, RefinedMeanField):
        raise ValueError(f"refined must be a jsmkt.RefinedMeanField (from jsmkt.refined_mean_field), got "
                         f"{type(refined).__name__}")
    n = _check_n(n_servers)
    model = refined.model
    y, max_terms = _checked(model, refined.value, kind, stream, max_terms, None)
    why = _refusal(model, waiting)
    env = model.description().environment
    if why is None and env is not None:
        why = ("its servers share an environment (a pool of repairmen or a modulating phase), whose moves couple "
               "servers or make arrivals non-Poisson: the 1/N term of a job's law is not derived for it")
    if why is not None:
        raise ValueError(f"{type(model).__name__}: no refined {kind} distribution: {why}")
    depends = _stay_depends(model, stream)
    bad = jnp.any(jnp.isnan(ravel_pytree(y)[0]))  # the expansion of a failed fixed point (NaN): its law is NaN
    if is_concrete(bad) and bool(bad):
        nan = jnp.full(_CHUNK, jnp.nan)
        return RefinedTimeDistribution(TimeDistribution(nan, jnp.asarray(jnp.nan), kind), nan, jnp.asarray(n))
    if is_concrete(model, y):
        _maps.before_compiling(f"jsmkt.refined_{kind.replace(' ', '_')}_distribution",
                               ("refined sojourn", _maps.signature((model, y)), max_terms, stream, depends))
    a, c, q, done = _refined_steps(model, y, refined.correction, refined.covariance, stream, jnp.asarray(waiting),
                                   max_terms, refined.sampling == "with_replacement", depends)
    if is_concrete(a, c, done):
        if not bool(done):
            raise ValueError(f"the refined {kind}'s tail outlasts max_terms={max_terms} uniformisation steps; "
                             "raise max_terms")
        tiny = (np.asarray(a) < _EPS) & (np.abs(np.asarray(c)) < _EPS)
        last = int(np.argmax(tiny)) if tiny.any() else a.shape[0]
        size = min(a.shape[0], max(_CHUNK, 1 << int(np.ceil(np.log2(last + 1)))))
        a, c = a[:size], c[:size]
    else:  # a failed entry of a batch is NaN, not an error
        a = error_if(a, ~done & ~bad, f"the refined {kind}'s tail outlasts max_terms={max_terms} uniformisation steps")
        a, c, q = nan_where(bad, (a, c, q))
    return RefinedTimeDistribution(TimeDistribution(a, q, kind), c, jnp.asarray(n))


def refined_sojourn_time_distribution(refined, n_servers, *, stream: str | None = None,
                                      max_terms: int = MAX_TERMS) -> RefinedTimeDistribution:
    r"""The law of a job's sojourn time with `n_servers` servers, to order $1/N$: the mean-field law
    (`jsmkt.sojourn_time_distribution`) plus its $1/N$ term.

    The $1/N$ term is exact (the expansion of the finite-N law, not a plug-in of a corrected occupancy): it
    averages the joining law over the occupancy's $1/N$ law (bias $V$ and covariance $W$ of
    `jsmkt.refined_mean_field`, and the sampling without replacement it was made for) and, where a job's stay
    depends on the other servers (the rates at which its server is chosen move it forward, as for helpers),
    the covariance between the occupancy and the tagged job along its stay. See `_refined_steps` for the
    equations. Percentiles from it correct the mean-field ones for finite $N$ (e.g. p99 at $N = 20$ to 100).

    **Arguments:**

    - `refined`: a `jsmkt.RefinedMeanField` (order 1 or 2; its order-1 terms are used).
    - `n_servers`: $N \ge 1$.
    - `stream`, `max_terms`: as for `jsmkt.sojourn_time_distribution`.

    **Returns:** a `jsmkt.RefinedTimeDistribution` (`cdf`, `pdf`, `quantile`, `mean`, and `mean_field`, the
    mean-field law); differentiable with respect to the model's parameters.

    **Raises:** `ValueError` where `jsmkt.sojourn_time_distribution` does, and for servers that share an
    environment (a pool of repairmen, a BMAP's phase), whose $1/N$ terms are not derived.

    !!! example

        ```python
        model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2)
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
        T = jsmkt.refined_sojourn_time_distribution(rmf, 50)
        T.quantile(0.99), T.mean_field.quantile(0.99)
        ```
    """
    return _refined_distribution(refined, n_servers, "sojourn time", False, stream, max_terms)


def refined_waiting_time_distribution(refined, n_servers, *, stream: str | None = None,
                                      max_terms: int = MAX_TERMS) -> RefinedTimeDistribution:
    r"""The law of a job's waiting time (arrival to start of service) with `n_servers` servers, to order $1/N$;
    defined where `jsmkt.waiting_time_distribution` is. Arguments, returns and errors as
    `jsmkt.refined_sojourn_time_distribution`."""
    return _refined_distribution(refined, n_servers, "waiting time", True, stream, max_terms)
