r"""The reduced coordinates derived from a `Description`, in which the fixed-point Jacobian is nonsingular and
banded in the levels.

**Reduced coordinates.** The occupancy vector $x$ (one fraction per cell) sums to 1. The derived reduced state
is, per cell $c$, the tail $T_c$: the fraction of servers in cells of $c$'s status at level $\ge$ level($c$),
for every cell but cell 0 (whose tail follows from the others by conservation). For one status this is
$s_1..s_K$; for PH service it is the phase tails $S_k$. Queueing drifts are local in these tails (a flow at rate
$r$ from every level $\ge k$ sums to $r$ times a tail), so their Jacobians are banded in the levels. A saturated
pool's status has a fixed mass: its total tail (at its lowest cell) is pinned at the pool's size and is not an
unknown (else it would be a neutral direction of the drift, and the fixed-point Jacobian singular).
"""

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .description import Cells, Description, cell_grid
from .meanfield import drift, saturated_pool, transitions


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
    grid = cell_grid(cells)
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
