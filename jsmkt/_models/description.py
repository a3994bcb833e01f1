r"""The physical description of a model family: what each server can be in and what moves it.

A supermarket model is a population of $N$ exchangeable servers. A family states its physics once, as data, in a
`Description`, and everything else is derived from it: the mean-field transitions and drift, the reduced
coordinates, the Jacobian's structure, the metrics, the refined mean field and the simulator's tables.

**Recipe for a family** (see `jsmkt/_models/batch.py` for a complete one in a few dozen lines):

1. *Cells* (`make_cells`): the local states of one server, each a `level` (jobs at the server, or its orbit size)
   and a `status` (the phase of the job in service, idle/busy, working/failed), listed level by level up to the
   truncation `K`. Each cell also says how many `jobs` a server in it holds and how many of them are
   `in_service` (0 or 1), for the metrics. Cell 0 is the empty server at time 0.
2. *Local events* (`LocalEvent`): per-server clocks. Each row moves a server from cell `source` to the cell
   `(level, status)` at a per-server `rate` that may depend on the cell; rows sharing a source are the random
   targets of one clock (next phase ~ α, a batch service removing a random number of jobs).
3. *Dispatches* (`Dispatch`): streams that choose a server by sampling. A stream has a `rate` per server (an
   arrival class, a repairman) or starts at the servers themselves (`origin`: rows with per-server rates and the
   origin's own move, e.g. a retrial leaving its orbit). Each event samples $D$ servers by the stream's `choice`
   law, ranks them by the stream's priority `key` of their cells (lower preferred; `INELIGIBLE` cells are never
   chosen, and nothing happens to the sampled servers if none is eligible), breaks ties uniformly and moves the
   chosen server by the stream's random `effect` (rows with probabilities, e.g. random batch sizes).
4. *An environment* (optional): a `Pool` of units that servers of one status hold (a group of small repairmen):
   a move into that status finds a free unit or goes to a waiting status instead, and a unit that frees goes at
   once to a uniformly chosen waiting server. The family says in which regime the mean field is: a pool that
   never fills changes nothing; a saturated one pins the holding status's mass at the pool's size. Or a
   `Modulation`: one global Markov phase (a BMAP's) that sets the rates of some dispatch streams and moves with
   or without them; its rates are per server like every rate, so in the $N$-server system it moves $N$ times
   faster as $N$ grows.
5. Targets beyond the truncation (a level above `K`) are allowed: the mean field keeps the server at level `K`
   (the jobs above are lost, so throughput counts them out, and the solvers check that the mass at `K` is
   negligible), the simulator refuses them as an overflow.

**The tail rule.** With the eligible keys ranked $\kappa_1 < \kappa_2 < \dots$ and $F_{\ge\kappa}$ the fraction
of servers whose key is $\ge \kappa$ or ineligible, the best of $D$ servers sampled with replacement has key
$\kappa$ with probability $g(F_{\ge\kappa}) - g(F_{>\kappa})$ ($g$ the pgf of $D$), and within that key the chosen
server's cell is in proportion to occupancy. So a server in cell $c$ of key $\kappa$ is chosen at rate
$R\,h(F_{\ge\kappa}, F_{>\kappa})$ per unit of the stream's rate $R$ per server, with the divided difference
$h(a, b) = (g(a) - g(b))/(a - b)$ (`AbstractChoice.join_factor`), which never divides by a vanishing difference.
A stream with an origin moves two servers at once; its transitions carry the chosen server as a `Partner`, so the
jump covariance of the refined mean field sees both moves. In the mean-field limit the origin is sampled with
probability $O(1/N)$ and the choice sees the occupancy before the origin's move, which is $O(1/N)$ away; the
refined mean field adds that $1/N$ drift (`origin_drift_correction`).

**Reduced coordinates.** The occupancy vector $x$ (one fraction per cell) sums to 1. The derived reduced state
is, per cell $c$, the tail $T_c$: the fraction of servers in cells of $c$'s status at level $\ge$ level($c$),
for every cell but cell 0 (whose tail follows from the others by conservation). For one status this is
$s_1..s_K$; for PH service it is the phase tails $S_k$. Queueing drifts are local in these tails (a flow at rate
$r$ from every level $\ge k$ sums to $r$ times a tail), so their Jacobians are banded in the levels. A saturated
pool's status has a fixed mass: its total tail (at its lowest cell) is pinned at the pool's size and is not an
unknown (else it would be a neutral direction of the drift, and the fixed-point Jacobian singular).

**A modulating phase in the mean field** (averaging). The phase $J$ is a Markov chain of generator $NG$, $G$ the
`Modulation`'s per-server rates; a modulated stream fires at rate $N r_s(J)$. The occupancy moves by $O(1/N)$
per event, so over the time the occupancy takes to change the phase makes $O(N)$ moves and its fraction of time
in phase $i$ tends to $\gamma_i$, the stationary law of $G$, whatever the occupancy: the limit is the
description with stream $s$ at the constant rate $\gamma r_s$ (`averaged`). The phase's correlations enter the
$O(1/N)$ terms (`modulation_noise`), not the limit.

**A saturated pool in the mean field.** Every unit is held and servers wait, so a move into the holding status
goes to the waiting status (same level), and a move out of it carries a partner: the uniformly chosen waiting
server, cell $w$ with probability $x_w/\sum_{w'} x_{w'}$, which moves to the holding status at its level. The
holding status then keeps its mass exactly. The simulator executes the pool's rules themselves, in either regime.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._choice import AbstractChoice


INELIGIBLE = 2**30  # the key of a cell a dispatch may not choose


class Cells(NamedTuple):
    """The local states of a server (see `make_cells`), level by level."""

    level: Int[np.ndarray, " C"]
    status: Int[np.ndarray, " C"]
    jobs: Int[np.ndarray, " C"]
    in_service: Int[np.ndarray, " C"]
    status_names: tuple[str, ...]

    @property
    def size(self) -> int:
        return self.level.shape[0]

    @property
    def K(self) -> int:
        """The largest level."""
        return int(self.level.max())

    def index(self, level, status) -> np.ndarray:
        """Cell indices of the `(level, status)` pairs (`-1` where there is no such cell)."""
        level, status = np.broadcast_arrays(np.asarray(level), np.asarray(status))
        grid = _grid(self)
        inside = (level >= 0) & (level <= self.K) & (status >= 0) & (status < len(self.status_names))
        out = np.full(level.shape, -1)
        out[inside] = grid[level[inside], status[inside]]
        return out


def make_cells(level, status, status_names, *, jobs=None, in_service=None) -> Cells:
    """Cells from their levels and statuses (static NumPy integers), ordered by level then status, the first
    being the empty server. `jobs` defaults to the level, `in_service` to `1` where `jobs >= 1`."""
    level, status = np.asarray(level, dtype=np.int64), np.asarray(status, dtype=np.int64)
    if level.ndim != 1 or level.shape != status.shape or level.size < 2:
        raise ValueError("cells need 1-d level and status arrays of one length >= 2")
    order = np.lexsort((status, level))
    if not np.array_equal(order, np.arange(level.size)):
        raise ValueError("cells must be listed by level, then by status")
    if np.any((np.diff(level) == 0) & (np.diff(status) == 0)):
        raise ValueError("cells must be distinct (level, status) pairs")
    if level[0] != 0 or np.any(status < 0) or np.any(status >= len(status_names)):
        raise ValueError("the first cell must be at level 0, and statuses must index status_names")
    jobs = level.copy() if jobs is None else np.asarray(jobs, dtype=np.int64)
    in_service = (jobs >= 1).astype(np.int64) if in_service is None else np.asarray(in_service, dtype=np.int64)
    return Cells(level, status, jobs, in_service, tuple(status_names))


def _grid(cells: Cells) -> np.ndarray:
    """`(K + 1, n_status)` table of cell indices, `-1` where no cell."""
    grid = np.full((cells.K + 1, len(cells.status_names)), -1)
    grid[cells.level, cells.status] = np.arange(cells.size)
    return grid


class Moves(NamedTuple):
    """Rows `i`: a server in cell `source[i]` moves to the cell `(level[i], status[i])` with weight `weight[i]` (a
    per-server rate, or a probability in a dispatch's effect). A `level` above the truncation is allowed (see the
    module docstring). `jobs[i]`, when given, is the number of jobs the move brings to the server (default: the
    change of level, counted before truncation)."""

    source: Int[np.ndarray, " r"]
    level: Int[np.ndarray, " r"]
    status: Int[np.ndarray, " r"]
    weight: Float[Array, " r"]


class LocalEvent(NamedTuple):
    """A per-server clock: `moves.weight` are per-server rates."""

    name: str
    moves: Moves


class Dispatch(NamedTuple):
    """A stream that samples servers and moves the best one.

    - `choice`: the law of the number $D$ of servers sampled.
    - `key`: `(C,)` integer priority of each cell, lower preferred; `INELIGIBLE` for cells never chosen.
    - `effect`: the chosen server's moves, `weight` the probabilities (summing to 1 for each eligible cell).
    - `rate`: the stream's rate per server; or `None` with `origin`, rows whose `weight` is the per-server rate at
      which a server in cell `source` starts the stream, itself moving to `(level, status)`.
    - `arrivals`: the stream brings new jobs into the system (its jobs make the throughput).
    """

    name: str
    choice: AbstractChoice
    key: Int[np.ndarray, " C"]
    effect: Moves
    rate: Float[Array, ""] | None = None
    origin: Moves | None = None
    arrivals: bool = True


class Pool(NamedTuple):
    r"""A pool of `capacity` units per server ($J = $ `capacity` $\cdot N$ in all, e.g. small repairmen). A server in
    status `held` holds one unit. A move into `held` from another status takes a free unit, or, when none is free,
    goes to status `waiting` at the same level instead; a move out of `held` frees its unit, which goes at once to
    a uniformly chosen server in status `waiting` (if any), moving it to `held` at its level.

    `saturated` (static) is the mean-field regime, which the family decides from its parameters: `False`, the pool
    never fills and changes nothing in the mean field (no server waits); `True`, every unit is held: the mass of
    `held` is pinned at `capacity`, moves into `held` go to `waiting`, and moves out of it promote a waiting
    server (module docstring)."""

    held: int
    waiting: int
    capacity: Float[Array, ""]
    saturated: bool


class Modulation(NamedTuple):
    r"""A global Markov phase $J \in \{0..m-1\}$ that modulates dispatch streams (the phase of a BMAP).

    - `streams`: the indices, in `Description.dispatches`, of the modulated streams (their `rate` is `None`: the
      phase gives it).
    - `rates`: `(len(streams), m, m)`: `rates[s, i, j]` is the per-server rate at which, in phase $i$, stream
      `streams[s]` fires and the phase moves to $j$ ($j = i$: it stays).
    - `silent`: `(m, m)`: per-server rates of phase moves $i \to j \ne i$ without a dispatch (diagonal ignored).

    As every rate of a description, these are per server: the $N$-server system has them times $N$, so its phase
    moves $N$ times faster as $N$ grows (a BMAP of descriptor $(NC, ND_1, \ldots)$). The phase's generator is
    $G$ = the off-diagonal parts of `silent` and $\sum_s$ `rates[s]`, minus their row sums on the diagonal; the
    mean field averages the streams' rates over its stationary law $\gamma$ (module docstring, `averaged`). The
    simulator runs the phase itself; the system starts with $J \sim \gamma$."""

    streams: tuple[int, ...]
    rates: Float[Array, "S m m"]
    silent: Float[Array, "m m"]

    @property
    def order(self) -> int:
        """The number of phases m."""
        return self.silent.shape[0]


class Description(NamedTuple):
    """A family's physics: cells, local events, dispatches, and a global environment (a `Pool`, a `Modulation`, or
    `None`)."""

    cells: Cells
    local_events: tuple[LocalEvent, ...]
    dispatches: tuple[Dispatch, ...]
    environment: Pool | Modulation | None = None
    fcfs: bool = True  # servers hold FCFS queues of their `jobs` (per-job sojourn times in simulation)


class Partner(NamedTuple):
    """The second server that each event of a `TransitionClass` moves: from `source[j]` to `target[j]` with
    probability `prob[j]` (summing to at most 1: the rest of the events move no second server)."""

    source: Int[np.ndarray, " p"]
    target: Int[np.ndarray, " p"]
    prob: Float[Array, " p"]


class TransitionClass(NamedTuple):
    """One class of transitions: servers in local state `source[i]` move to `target[i]` at per-server rate
    `rate[i]` (so the flow is `rate[i] * x[source[i]]`). With a `partner`, each such event also moves a second
    server, drawn by the partner's probabilities (the flow of the pair `(i, j)` is
    `rate[i] * x[source[i]] * partner.prob[j]`)."""

    name: str
    source: Int[np.ndarray, " n"]
    target: Int[np.ndarray, " n"]
    rate: Float[Array, " n"]
    partner: Partner | None = None


# --- derived: transitions -------------------------------------------------------------------------------------


def clipped_targets(cells: Cells, moves: Moves) -> np.ndarray:
    """Target cells of `moves`, a level above `K` kept at `K` (the mean field's truncation)."""
    target = cells.index(np.minimum(moves.level, cells.K), moves.status)
    if np.any(target < 0):
        i = int(np.flatnonzero(target < 0)[0])
        raise ValueError(
            f"a move from cell {int(moves.source[i])} goes to (level {int(moves.level[i])}, status "
            f"{int(moves.status[i])}), which is not a cell"
        )
    return target


def chosen_factor(dispatch: Dispatch, x: Float[Array, " C"]) -> Float[Array, " C"]:
    r"""Per cell $c$ of key $\kappa$: $h(F_{\ge\kappa}, F_{>\kappa})$, the rate at which one server of the cell is
    chosen per unit of the stream's rate per server (0 for ineligible cells). $\sum_c x_c h_c = 1 - g(F_{\rm inel})$
    is the probability that some sampled server is eligible. The tails $F$ are reverse cumulative sums of the
    occupancy over the keys, so they keep their relative precision deep in the tail."""
    key = np.asarray(dispatch.key)
    eligible = key != INELIGIBLE
    ranks = np.unique(key[eligible])
    rank = np.where(eligible, np.searchsorted(ranks, key), ranks.size)
    mass = jax.ops.segment_sum(x, jnp.asarray(rank), num_segments=ranks.size + 1)
    F_ge = jnp.cumsum(mass[::-1])[::-1]  # F_ge[r]: keys of rank >= r, or ineligible
    h = dispatch.choice.join_factor(F_ge[:-1], F_ge[1:])
    return jnp.where(jnp.asarray(eligible), jnp.concatenate([h, jnp.zeros(1, h.dtype)])[rank], 0.0)


def stream_rate(dispatch: Dispatch, x: Float[Array, " C"]) -> Float[Array, ""]:
    """The stream's rate per server: its `rate`, or the rate at which servers start it."""
    if dispatch.origin is None:
        return dispatch.rate
    return jnp.sum(dispatch.origin.weight * x[np.asarray(dispatch.origin.source)])


def saturated_pool(desc: Description) -> Pool | None:
    """The description's pool when it is saturated in the mean field, else `None`."""
    pool = desc.environment
    return pool if isinstance(pool, Pool) and pool.saturated else None


def phase_generator(mod: Modulation) -> Float[Array, "m m"]:
    """The generator of a `Modulation`'s phase: its moves with and without a dispatch (per server)."""
    moves = mod.silent + jnp.sum(mod.rates, axis=0)
    off = moves - jnp.diag(jnp.diagonal(moves))
    return off - jnp.diag(jnp.sum(off, axis=1))


def check_modulation(desc: Description) -> Modulation | None:
    """The description's `Modulation` (or `None`), after its static checks: shapes, the modulated streams exist,
    have no `rate` of their own and start at no server; every other stream has a rate or an origin."""
    mod = desc.environment if isinstance(desc.environment, Modulation) else None
    S = len(desc.dispatches)
    streams = () if mod is None else tuple(int(s) for s in mod.streams)
    if mod is not None:
        m = mod.order
        if jnp.shape(mod.silent) != (m, m) or jnp.shape(mod.rates) != (len(streams), m, m) or m < 1:
            raise ValueError(f"the modulation's silent rates have shape {jnp.shape(mod.silent)} and its stream rates "
                             f"{jnp.shape(mod.rates)}; expected (m, m) and ({len(streams)}, m, m)")
        if len(set(streams)) != len(streams) or any(not 0 <= s < S for s in streams):
            raise ValueError(f"the modulation's streams {list(streams)} must be distinct dispatch indices 0..{S - 1}")
    for s, disp in enumerate(desc.dispatches):
        if s in streams:
            if disp.rate is not None or disp.origin is not None:
                raise ValueError(f"{disp.name}: a modulated stream takes its rate from the phase (rate=None) and "
                                 "starts at no server (origin=None)")
        elif disp.rate is None and disp.origin is None:
            raise ValueError(f"{disp.name}: a stream needs a rate, an origin, or a modulating phase")
    return mod


def averaged(desc: Description) -> Description:
    r"""The mean-field description of `desc`: a modulated stream $s$ at the constant rate $\gamma r_s$ ($r_s(i) =
    \sum_j$ `rates[s, i, j]`, $\gamma$ the phase's stationary law; module docstring), and no modulation. Other
    descriptions are returned unchanged."""
    mod = check_modulation(desc)
    if mod is None:
        return desc
    from .._distributions.bmap import stationary_vector

    gamma = stationary_vector(phase_generator(mod))
    mean = jnp.einsum("i,sij->s", gamma, mod.rates)
    dispatches = list(desc.dispatches)
    for k, s in enumerate(mod.streams):
        dispatches[s] = dispatches[s]._replace(rate=mean[k])
    return desc._replace(dispatches=tuple(dispatches), environment=None)


def _pooled(desc: Description, moves: Moves) -> tuple[Moves, np.ndarray]:
    """`moves` under a saturated pool (module docstring): those into the holding status from another go to the
    waiting status; also the mask of the moves that free a unit."""
    pool = saturated_pool(desc)
    status = np.asarray(moves.status)
    if pool is None:
        return moves, np.zeros(status.shape, bool)
    from_held = desc.cells.status[np.asarray(moves.source)] == pool.held
    takes = (status == pool.held) & ~from_held
    frees = from_held & (status != pool.held)
    return moves._replace(status=np.where(takes, pool.waiting, status)), frees


def pool_cells(cells: Cells, pool: Pool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cell: whether it holds a unit, whether it waits, its redirect (a holding cell's waiting cell at its
    level, else itself) and its promotion (a waiting cell's holding cell at its level, else -1)."""
    held, waits = cells.status == pool.held, cells.status == pool.waiting
    redirect = np.where(held, cells.index(cells.level, pool.waiting), np.arange(cells.size))
    promote = np.where(waits, cells.index(cells.level, pool.held), -1)
    for name, bad in (("holding", held & (redirect < 0)), ("waiting", waits & (promote < 0))):
        if bad.any():
            raise ValueError(f"the pool's {name} cells {np.flatnonzero(bad).tolist()} have no "
                             f"{'waiting' if name == 'holding' else 'holding'} cell at their level")
    return held, waits, redirect, promote


def _promotion(desc: Description, x: Float[Array, " C"]) -> Partner:
    """The waiting server a freed unit goes to: uniform among the waiting (a `Partner` moving it to the holding
    status at its level)."""
    _, waits, _, promote = pool_cells(desc.cells, saturated_pool(desc))
    waiting = np.flatnonzero(waits)
    held = promote[waiting]
    mass = jnp.sum(x[waiting])
    safe = jnp.where(mass > 0, mass, 1.0)
    return Partner(waiting, held, jnp.where(mass > 0, x[waiting] / safe, 0.0))


def _classes(desc: Description, name: str, source, target, rate, frees, x) -> list[TransitionClass]:
    """One transition class, split in two under a saturated pool: the rows that free a unit carry the
    promotion of a waiting server."""
    if not frees.any():
        return [TransitionClass(name, source, target, rate)]
    out = [TransitionClass(name + " (frees a unit)", source[frees], target[frees], rate[frees], _promotion(desc, x))]
    if not frees.all():
        out.append(TransitionClass(name, source[~frees], target[~frees], rate[~frees]))
    return out


def transitions(desc: Description, x: Float[Array, " C"]) -> list[TransitionClass]:
    """The mean-field transition classes of `desc` at occupancy `x`, by the tail rule (module docstring); a
    modulating phase is averaged out (`averaged`)."""
    desc = averaged(desc)
    cells = desc.cells
    out = []
    for ev in desc.local_events:
        moves, frees = _pooled(desc, ev.moves)
        out += _classes(desc, ev.name, np.asarray(moves.source), clipped_targets(cells, moves), moves.weight, frees, x)
    for disp in desc.dispatches:
        eff, frees = _pooled(desc, disp.effect)
        src = np.asarray(eff.source)
        h = chosen_factor(disp, x)
        if disp.origin is None:
            out += _classes(desc, disp.name, src, clipped_targets(cells, eff), disp.rate * h[src] * eff.weight, frees,
                            x)
        else:
            if saturated_pool(desc) is not None:
                raise ValueError(f"{disp.name}: a stream with an origin cannot act under a saturated pool (a jump "
                                 "moves at most two servers)")
            partner = Partner(src, clipped_targets(cells, eff), h[src] * x[src] * eff.weight)
            out.append(TransitionClass(disp.name, np.asarray(disp.origin.source), clipped_targets(cells, disp.origin),
                                       disp.origin.weight, partner))
    return out


def drift(classes: list[TransitionClass], x: Float[Array, " C"]) -> Float[Array, " C"]:
    """$\\dot x$: every flow moves mass from its source to its target (a partner's too)."""
    dx = jnp.zeros_like(x)
    for tc in classes:
        flow = tc.rate * x[tc.source]
        dx = dx.at[tc.target].add(flow).at[tc.source].add(-flow)
        if tc.partner is not None:
            p = tc.partner
            pflow = jnp.sum(flow) * p.prob
            dx = dx.at[p.target].add(pflow).at[p.source].add(-pflow)
    return dx


def jump_second_moment(classes: list[TransitionClass], x: Float[Array, " C"]) -> Float[Array, "C C"]:
    r"""$G = \sum_{\text{jumps}} \text{flow}\;\ell\ell^\top$ in the occupancy space, $\ell$ the change of $x$ (times
    $N$) of one event: $e_t - e_s$, plus $e_{t'} - e_{s'}$ for a partner. For a class with a partner the pair
    flows factor as $a_i b_j$, so $G$ is accumulated from the two sides and their cross term, never per pair."""
    n = x.shape[0]
    G = jnp.zeros((n, n), x.dtype)

    def add_side(G, s, t, w):
        return G.at[t, t].add(w).at[s, s].add(w).at[t, s].add(-w).at[s, t].add(-w)

    for tc in classes:
        a = tc.rate * x[tc.source]
        s, t = jnp.asarray(tc.source), jnp.asarray(tc.target)
        if tc.partner is None:
            G = add_side(G, s, t, a)
            continue
        p = tc.partner
        b = p.prob
        ps, pt = jnp.asarray(p.source), jnp.asarray(p.target)
        A, B = jnp.sum(a), jnp.sum(b)
        G = add_side(G, s, t, a * B)
        G = add_side(G, ps, pt, b * A)
        u = jnp.zeros(n, x.dtype).at[t].add(a).at[s].add(-a)  # sum_i a_i l_i
        v = jnp.zeros(n, x.dtype).at[pt].add(b).at[ps].add(-b)  # sum_j b_j l'_j
        G = G + jnp.outer(u, v) + jnp.outer(v, u)
    return G


def origin_drift_correction(desc: Description, x: Float[Array, " C"]) -> Float[Array, " C"]:
    r"""$f^{(1)}$, the $1/N$ term of the drift of the $N$-server system that streams with an origin add: the origin
    moves first and the stream then samples among all $N$ servers, so it sees the occupancy
    $x + (e_{o'} - e_o)/N$. With $\Phi(x)$ the chosen server's displacement per unit of the stream's rate (the
    tail rule) and $u = \sum_o r_o x_o (e_{o'} - e_o)$ the origins' own drift, the exact drift is
    $R\,\Phi(x) + D\Phi(x)\,u/N + O(1/N^2)$, so $f^{(1)} = D\Phi(x)\,u$ (one `jax.jvp` per stream). Zero
    without such streams."""
    cells = desc.cells
    out = jnp.zeros_like(x)
    for disp in desc.dispatches:
        if disp.origin is None:
            continue
        o = disp.origin
        src, tgt = np.asarray(o.source), clipped_targets(cells, o)
        flow = o.weight * x[src]
        u = jnp.zeros_like(x).at[tgt].add(flow).at[src].add(-flow)
        eff = disp.effect
        es, et = np.asarray(eff.source), clipped_targets(cells, eff)

        def displacement(z, disp=disp, eff=eff, es=es, et=et):
            p = chosen_factor(disp, z)[es] * z[es] * eff.weight
            return jnp.zeros_like(z).at[et].add(p).at[es].add(-p)

        out = out + jax.jvp(displacement, (x,), (u,))[1]
    return out


def modulation_noise(desc: Description, x: Float[Array, " C"]):
    r"""The $1/N$ terms of a modulating phase at occupancy $x$ (`jsmkt.refined_mean_field`).

    With $\Phi_s(x)$ the occupancy's drift per unit rate of modulated stream $s$ (the tail rule), $r_s(i)$ its
    rate in phase $i$, $\bar r_s = \gamma r_s$, the drift in phase $i$ is $f_i = f_0 + \sum_s r_s(i)\Phi_s$. The
    phase's generator $G$ is $N$ times faster than the occupancy: the corrector $h_i = \sum_s \eta_s(i)\Phi_s / N$
    with $G\eta_s = -(r_s - \bar r_s)$, $\gamma\eta_s = 0$ ($\eta_s = (\mathbf1\gamma - G)^{-1}(r_s - \bar r_s)$)
    makes $x + h_J$ a process with the averaged drift $\bar f$ up to $O(1/N)$. Its martingale's jumps,
    $(\ell + h_j - h_i)$ at an event that moves the phase $i \to j$, give the diffusion
    $Q + \Phi^\top\Sigma\,\Phi$ (per $1/N$) with

    $$\Sigma = a + a^\top + c,\quad a_{ss'} = \textstyle\sum_{ij}\gamma_i R_s[i, j]\,(\eta_{s'}(j) - \eta_{s'}(i)),
      \quad c_{s's''} = \sum_{ij}\gamma_i G_{ij}(\eta_{s'}(j) - \eta_{s'}(i))(\eta_{s''}(j) - \eta_{s''}(i)),$$

    and its drift the $1/N$ bias $b = \sum_{s s'}\kappa_{ss'}\,D\Phi_{s'}[\Phi_s]$, $\kappa_{ss'} = (\gamma R_s)\,
    \eta_{s'}$ (the chosen server's law moves with the occupancy between the phase's moves). For a counting process
    ($\Phi_s$ the batch size) $\bar r + \Phi^\top\Sigma\Phi$ is the BMAP's asymptotic variance rate.

    Returns `(Phi, Sigma, kappa)`: `(S, C)`, `(S, S)`, `(S, S)` for the modulated streams, in order."""
    mod = check_modulation(desc)
    from .._distributions.bmap import stationary_vector

    G = phase_generator(mod)
    m = mod.order
    gamma = stationary_vector(G)
    R = jnp.asarray(mod.rates)
    r = jnp.sum(R, axis=2)  # (S, m)
    rbar = r @ gamma
    Z = jnp.linalg.inv(jnp.outer(jnp.ones(m, G.dtype), gamma) - G)
    eta = (r - rbar[:, None]) @ Z.T  # (S, m): eta[s] = Z (r_s - rbar_s e)
    gR = jnp.einsum("i,sij->sj", gamma, R)  # (S, m): gamma R_s
    kappa = gR @ eta.T  # kappa[s, s'] = (gamma R_s) eta_s'
    a = kappa - (gamma[None, :] * r) @ eta.T  # a[s, s'] = sum_ij gamma_i R_s[i, j] (eta_s'(j) - eta_s'(i))
    c = (gamma[None, :] * eta) @ r.T
    c = c + c.T  # c[s', s''] = (gamma o eta_s'') r_s' + (gamma o eta_s') r_s''
    sigma = a + a.T + c
    return modulated_displacements(desc, x), sigma, kappa


def modulated_displacements(desc: Description, x: Float[Array, " C"]) -> Float[Array, "S C"]:
    r"""$\Phi_s(x)$, the occupancy's drift per unit rate of each modulated stream of `desc`, in order."""
    mod = check_modulation(desc)
    rows = []
    for s in mod.streams:
        one = desc._replace(local_events=(), dispatches=(desc.dispatches[s]._replace(rate=jnp.ones((), x.dtype)),),
                            environment=None)
        rows.append(drift(transitions(one, x), x))
    return jnp.stack(rows)


# --- derived: reduced coordinates -----------------------------------------------------------------------------


class TailMap(NamedTuple):
    """Static index tables of the derived reduced coordinates of a `Cells`."""

    level: np.ndarray  # (C,) levels
    status: np.ndarray  # (C,) statuses
    n_status: int
    K: int
    lowest: np.ndarray  # (n_status,) the lowest cell of each status (-1 if none)
    next_cell: np.ndarray  # (C,) the next cell of the same status one level up or more (-1 if none)
    at_or_above: np.ndarray  # (K + 1, n_status) lowest cell of each status at level >= k (-1 if none)


def tail_map(cells: Cells) -> TailMap:
    grid = _grid(cells)
    K, S = grid.shape[0] - 1, grid.shape[1]
    at_or_above = np.full((K + 2, S), -1)
    for k in range(K, -1, -1):
        at_or_above[k] = np.where(grid[k] >= 0, grid[k], at_or_above[k + 1])
    next_cell = at_or_above[cells.level + 1, cells.status]
    lowest = at_or_above[0]
    if lowest[cells.status[0]] != 0:
        raise ValueError("cell 0 must be the lowest cell of its status")
    return TailMap(cells.level, cells.status, S, K, lowest, next_cell, at_or_above[: K + 1])


def reduce_occupancy(tm: TailMap, x: Float[Array, " C"]) -> Float[Array, " C-1"]:
    """Tails $T_c$ of every cell but cell 0: reverse cumulative sums over the levels, per status."""
    grid = jnp.zeros((tm.K + 1, tm.n_status), x.dtype).at[tm.level, tm.status].set(x)
    T = jnp.cumsum(grid[::-1], axis=0)[::-1]
    return T[tm.level[1:], tm.status[1:]]


def occupancy_of_tails(tm: TailMap, y: Float[Array, " C-1"]) -> Float[Array, " C"]:
    """The occupancy vector of the reduced state `y` (the inverse of `reduce_occupancy`)."""
    others = [int(c) for s, c in enumerate(tm.lowest) if c > 0 and s != tm.status[0]]
    T0 = 1.0 - (jnp.sum(y[np.asarray(others) - 1]) if others else 0.0)
    T = jnp.concatenate([jnp.reshape(T0, (1,)).astype(y.dtype), y])
    T_next = jnp.where(jnp.asarray(tm.next_cell >= 0), T[np.maximum(tm.next_cell, 0)], 0.0)
    return T - T_next


def level_tails(tm: TailMap, y: Float[Array, " C-1"]) -> Float[Array, " K+1"]:
    """$s_k$, the fraction of servers at level $\\ge k$, $k = 0..K$, summed from the tails (no differences)."""
    T = jnp.concatenate([jnp.zeros(1, y.dtype), y])
    idx = tm.at_or_above
    s = jnp.sum(jnp.where(jnp.asarray(idx > 0), T[np.maximum(idx, 0)], 0.0), axis=1)
    return s.at[0].set(1.0)


# --- derived: the simulator's tables --------------------------------------------------------------------------


def _concrete(name: str, x) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{name} is traced: simulation needs concrete parameters (call it outside jit/grad/vmap)")
    return np.asarray(x, dtype=float)


def _targets_or_overflow(cells: Cells, moves: Moves) -> np.ndarray:
    from .._simulate.tables import OVERFLOW

    over = np.asarray(moves.level) > cells.K
    target = cells.index(np.minimum(moves.level, cells.K), moves.status)
    return np.where(over, OVERFLOW, target)


def _per_cell(C: int, source: np.ndarray, columns: list[np.ndarray], pads: list) -> list[np.ndarray]:
    """Rows grouped by source cell: each column as a `(C, width)` table padded with `pads`."""
    order = np.argsort(source, kind="stable")
    source = source[order]
    counts = np.bincount(source, minlength=C)
    width = max(int(counts.max()) if counts.size else 0, 1)
    slot = np.arange(source.size) - np.repeat(np.cumsum(counts) - counts, counts)
    out = []
    for col, pad in zip(columns, pads, strict=True):
        table = np.full((C, width), pad, dtype=np.asarray(col).dtype if np.ndim(pad) == 0 else float)
        table[source, slot] = np.asarray(col)[order]
        out.append(table)
    return out


def simulation_tables(desc: Description):
    """The generic simulator's `SimTables` of a description (concrete parameters): per cell its local events and
    the streams it starts, uniformised at the largest total rate of a cell; per stream its rate, choice law, keys
    and effects. Moves above the truncation are overflows."""
    from .._simulate.tables import INELIGIBLE as SIM_INELIGIBLE
    from .._simulate.tables import SimTables

    cells = desc.cells
    C = cells.size
    src, tgt, rate, stream = [], [], [], []
    for ev in desc.local_events:
        src.append(np.asarray(ev.moves.source))
        tgt.append(_targets_or_overflow(cells, ev.moves))
        rate.append(_concrete(f"the rates of {ev.name}", ev.moves.weight))
        stream.append(np.full(len(ev.moves.source), -1))
    for s, disp in enumerate(desc.dispatches):
        if disp.origin is not None:
            src.append(np.asarray(disp.origin.source))
            tgt.append(_targets_or_overflow(cells, disp.origin))
            rate.append(_concrete(f"the origin rates of {disp.name}", disp.origin.weight))
            stream.append(np.full(len(disp.origin.source), s))
    src = np.concatenate(src) if src else np.zeros(0, int)
    rate = np.concatenate(rate) if rate else np.zeros(0)
    total = np.bincount(src, weights=rate, minlength=C)
    u = float(total.max()) if total.size else 0.0
    prob = rate / u if u > 0 else rate * 0.0
    act_prob, act_target, act_stream = _per_cell(
        C, src, [prob, np.concatenate(tgt) if tgt else np.zeros(0, int), np.concatenate(stream) if stream else
                 np.zeros(0, int)], [0.0, 0, -1])
    # A padded action keeps the server where it is.
    act_target = np.where(act_prob > 0, act_target, np.arange(C)[:, None])
    S = len(desc.dispatches)
    max_d = max(d.choice.max_d for d in desc.dispatches) if S else 1
    choice = np.zeros((S, max_d))
    keys = np.full((S, C), SIM_INELIGIBLE, dtype=np.int64)
    effects = []
    for s, disp in enumerate(desc.dispatches):
        w = _concrete(f"the choice law of {disp.name}", disp.choice.weights())
        choice[s, : w.size] = w
        key = np.asarray(disp.key)
        keys[s] = np.where(key == INELIGIBLE, SIM_INELIGIBLE, key)
        eff = disp.effect
        effects.append(_per_cell(C, np.asarray(eff.source),
                                 [_concrete(f"the effect of {disp.name}", eff.weight), _targets_or_overflow(cells, eff)],
                                 [0.0, 0]))
    E = max((e[0].shape[1] for e in effects), default=1)
    eff_prob = np.zeros((S, C, E))
    eff_target = np.tile(np.arange(C)[None, :, None], (S, 1, E))
    for s, (p, t) in enumerate(effects):
        eff_prob[s, :, : p.shape[1]] = p
        eff_target[s, :, : t.shape[1]] = np.where(p > 0, t, np.arange(C)[:, None])
    origin = any(d.origin is not None for d in desc.dispatches)
    env = {}
    mod = check_modulation(desc)
    if isinstance(desc.environment, Pool):
        held, _, redirect, promote = pool_cells(cells, desc.environment)
        env = dict(pool_held=held, pool_redirect=redirect, pool_promote=promote,
                   pool_capacity=float(_concrete("the pool's capacity", desc.environment.capacity)))
    stream_rate = np.array([0.0 if d.rate is None else float(_concrete(f"the rate of {d.name}", d.rate))
                            for d in desc.dispatches])
    arrivals = np.array([d.arrivals for d in desc.dispatches], dtype=bool)
    if mod is not None:
        # Every stream gets its rates per phase move; the phase's silent moves are one more stream, which samples
        # one server and moves none (every cell ineligible). A stream runs at the largest of its phases' rates, the
        # engine thinning it in the others.
        if origin:
            raise ValueError("a modulating phase with streams that start at servers (origins) is not supported by "
                             "the simulator")
        m = mod.order
        rates = _concrete("the modulation's stream rates", mod.rates)
        silent = _concrete("the modulation's silent rates", mod.silent) * (1.0 - np.eye(m))
        phase_rates = stream_rate[:, None, None] * np.eye(m)[None]
        phase_rates[list(mod.streams)] = rates
        phase_rates = np.concatenate([phase_rates, silent[None]])
        stream_rate = phase_rates.sum(axis=2).max(axis=1)
        arrivals = np.concatenate([arrivals, [False]])
        choice = np.concatenate([choice, np.eye(1, choice.shape[1])])
        keys = np.concatenate([keys, np.full((1, C), SIM_INELIGIBLE, dtype=np.int64)])
        eff_prob = np.concatenate([eff_prob, np.zeros((1, C, E))])
        eff_target = np.concatenate([eff_target, np.tile(np.arange(C)[None, :, None], (1, 1, E))])
        from .._distributions.bmap import stationary_vector

        init = np.asarray(stationary_vector(jnp.asarray(phase_generator(Modulation(mod.streams, rates, silent)))))
        env |= dict(phase_rates=phase_rates, phase_init=np.maximum(init, 0.0) / np.maximum(init, 0.0).sum())
    return SimTables(
        level=cells.level, status=cells.status, status_names=cells.status_names, jobs=cells.jobs, empty_cell=0,
        fcfs=bool(desc.fcfs and not origin), u=u, act_prob=act_prob, act_target=act_target, act_stream=act_stream,
        stream_rate=stream_rate, choice=choice, key=keys, eff_prob=eff_prob, eff_target=eff_target,
        arrivals=arrivals, **env,
    )


# --- the derived model, whatever a family overrides -------------------------------------------------------------


def pinned_tail(desc: Description) -> int | None:
    """Index, among the tails of the cells but cell 0, of the one a saturated pool pins (its holding status's
    total), or `None`."""
    pool = saturated_pool(desc)
    if pool is None:
        return None
    lowest = int(tail_map(desc.cells).lowest[pool.held])
    if lowest <= 0:
        raise ValueError(f"the pool's holding status {pool.held} has no cell, or holds cell 0 (the empty server)")
    return lowest - 1


def reduced_index(desc: Description) -> np.ndarray:
    """Indices of the unknowns of the reduced state among the tails of every cell but cell 0 (all of them, but a
    pinned one)."""
    n = desc.cells.size - 1
    p = pinned_tail(desc)
    return np.arange(n) if p is None else np.delete(np.arange(n), p)


def _all_tails(desc: Description, y: Array) -> Float[Array, " C-1"]:
    y = jnp.ravel(y)
    p = pinned_tail(desc)
    if p is None:
        return y
    pool = saturated_pool(desc)
    return jnp.insert(y, p, jnp.asarray(pool.capacity, y.dtype))


def derived_reduce(desc: Description, x: Float[Array, " C"]) -> Float[Array, " n"]:
    return reduce_occupancy(tail_map(desc.cells), x)[reduced_index(desc)]


def derived_occupancy(desc: Description, y: Array) -> Float[Array, " C"]:
    return occupancy_of_tails(tail_map(desc.cells), _all_tails(desc, y))


def derived_vector_field(desc: Description, y: Array) -> Float[Array, " n"]:
    """The drift in the derived reduced coordinates (the flat tails), from the transitions by the tail rule."""
    tm = tail_map(desc.cells)
    x = occupancy_of_tails(tm, _all_tails(desc, y))
    return reduce_occupancy(tm, drift(transitions(desc, x), x))[reduced_index(desc)]


def derived_tails(desc: Description, y: Array) -> Float[Array, " K+1"]:
    return level_tails(tail_map(desc.cells), _all_tails(desc, y))


# --- derived: the metrics' flows --------------------------------------------------------------------------------


class JobFlows(NamedTuple):
    """Job flows per server of the arrival streams at occupancy `x` (rates, per unit time)."""

    offered: Array  # jobs brought by events that found an eligible server (those beyond the truncation included)
    accepted: Array  # jobs that joined (the throughput)
    waiting: Array  # jobs that joined (or were lost at the truncation) without starting service at once


def job_flows(desc: Description, x: Float[Array, " C"], stream: str | None = None) -> JobFlows:
    """`JobFlows` of every stream flagged `arrivals` (or of the one named `stream`), in the mean field (a
    modulating phase averaged out)."""
    desc = averaged(desc)
    cells = desc.cells
    jobs, busy = jnp.asarray(cells.jobs, x.dtype), jnp.asarray(cells.in_service, x.dtype)
    zero = jnp.zeros((), x.dtype)
    offered = accepted = waiting = zero
    names = [d.name for d in desc.dispatches if d.arrivals]
    if stream is not None and stream not in names:
        raise ValueError(f"stream={stream!r} is not an arrival stream of this model; its arrival streams are {names}")
    for disp in desc.dispatches:
        if not disp.arrivals or (stream is not None and disp.name != stream):
            continue
        eff = _pooled(desc, disp.effect)[0]
        src = np.asarray(eff.source)
        tgt = clipped_targets(cells, eff)
        lost = np.asarray(eff.level) - np.minimum(np.asarray(eff.level), cells.K)
        flow = stream_rate(disp, x) * chosen_factor(disp, x)[src] * x[src] * eff.weight
        brought = jobs[tgt] - jobs[src] + jnp.asarray(lost, x.dtype)
        starts = jnp.maximum(busy[tgt] - busy[src], 0.0)
        offered = offered + jnp.sum(flow * brought)
        accepted = accepted + jnp.sum(flow * (jobs[tgt] - jobs[src]))
        waiting = waiting + jnp.sum(flow * (brought - starts))
    return JobFlows(offered, accepted, waiting)
