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

What is derived from a description lives beside it: the mean-field transitions by the tail rule, the drift and the
metrics' flows in `jsmkt._models.meanfield`, the reduced coordinates in `jsmkt._models.reduced`, the $1/N$ terms of
the refined mean field in `jsmkt._refined_terms`, the simulator's tables in `jsmkt._simulate.described`.
"""

from typing import NamedTuple

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
        grid = cell_grid(self)
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


def cell_grid(cells: Cells) -> np.ndarray:
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
    server (`jsmkt._models.meanfield`)."""

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
    mean field averages the streams' rates over its stationary law $\gamma$ (`jsmkt._models.meanfield.averaged`). The
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
    # With `fcfs=False`: servers hold their waiting jobs (`jobs - in_service`) in random order and no job moves to
    # another server. A move that lowers the waiting jobs by r and raises `in_service` by r starts r of them chosen
    # uniformly (an own-orbit retrial); one that lowers `in_service` completes jobs in service.
    random_order: bool = False


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
