"""Lineax solvers for the structured Jacobians of the queueing models (block tridiagonal, block banded, bordered by
a few dense rows and columns) with the choice of a structure from a Jacobian's sparsity pattern; their small dense
blocks are solved by `jsmkt._dense`."""

import functools
from operator import index as _index
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from ._dense import _UNROLL_MAX, small_solve
from ._errors import all_finite


def _small_matmul(A, B):
    """`A @ B` for small matrices as a broadcast product and sum, which XLA fuses with the operations around it
    (its CPU backend runs a dot as a library call of its own; `benchmarks/README.md`)."""
    if A.shape[1] > _UNROLL_MAX:
        return A @ B
    return jnp.sum(A[:, :, None] * B[None, :, :], axis=1)


_CLOSED_FORM_MAX = 4  # block sizes whose elimination blocks `_block_thomas` inverts by cofactors


def _cofactor_inverse(A: Float[Array, "m m"]) -> Float[Array, "m m"]:
    r"""The inverse of a small nonsingular `A` (`m <= _CLOSED_FORM_MAX`) by cofactors, $A^{-1} = \operatorname{adj}(A)
    / \det A$. Written out entry by entry, it is a few fused element-wise kernels, where Gaussian elimination with
    pivoting runs a dozen small kernels per pivot, each dispatched on its own inside the block elimination's
    `lax.scan`. It divides by $\det A$ only, so zero or small diagonal entries need no row exchanges
    (they would in elimination); it is as accurate as pivoted elimination for well-conditioned `A` with entries of
    order 1 (`_block_thomas` equilibrates the rows first, so that $\det A$, of degree $m$ in the entries, stays in
    range). A singular `A` gives non-finite entries."""
    m = A.shape[0]
    a = [[A[i, j] for j in range(m)] for i in range(m)]
    if m == 1:
        return jnp.reshape(1.0 / a[0][0], (1, 1))
    if m == 2:
        det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
        adj = [[a[1][1], -a[0][1]], [-a[1][0], a[0][0]]]
    elif m == 3:
        adj = [[a[(j + 1) % 3][(i + 1) % 3] * a[(j + 2) % 3][(i + 2) % 3]
                - a[(j + 1) % 3][(i + 2) % 3] * a[(j + 2) % 3][(i + 1) % 3] for j in range(3)] for i in range(3)]
        det = a[0][0] * adj[0][0] + a[0][1] * adj[1][0] + a[0][2] * adj[2][0]
    else:  # m == 4: the 2 x 2 minors of the first two rows (s) and of the last two (c), Laplace's expansion
        def minor(r, i, j):
            return a[r][i] * a[r + 1][j] - a[r][j] * a[r + 1][i]

        pairs = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
        s = {p: minor(0, *p) for p in pairs}
        c = {p: minor(2, *p) for p in pairs}
        det = (s[0, 1] * c[2, 3] - s[0, 2] * c[1, 3] + s[0, 3] * c[1, 2] + s[1, 2] * c[0, 3] - s[1, 3] * c[0, 2]
               + s[2, 3] * c[0, 1])

        def cof(i, j):  # cofactor of entry (i, j): the 3 x 3 minor without row i and column j, signed
            rows = [r for r in range(4) if r != i]
            cols = [x for x in range(4) if x != j]
            (r0, r1, r2), (k0, k1, k2) = rows, cols
            # expanded along row r0; the 2 x 2 minors of rows (r1, r2) are those of s or c when the rows match
            pair_minors = c if (r1, r2) == (2, 3) else s if (r1, r2) == (0, 1) else None

            def m2(x, y):
                if pair_minors is not None:
                    return pair_minors[x, y]
                return a[r1][x] * a[r2][y] - a[r1][y] * a[r2][x]

            value = a[r0][k0] * m2(k1, k2) - a[r0][k1] * m2(k0, k2) + a[r0][k2] * m2(k0, k1)
            return value if (i + j) % 2 == 0 else -value

        adj = [[cof(j, i) for j in range(4)] for i in range(4)]
    return jnp.stack([jnp.stack(row) for row in adj]) / det


def _block_thomas(L: Float[Array, "K m m"], D: Float[Array, "K m m"], U: Float[Array, "K m m"],
                  rhs: Float[Array, "K m q"]) -> Float[Array, "K m q"]:
    r"""Solve the block-tridiagonal system with sub-, main and super-diagonal blocks `L[r]`, `D[r]`, `U[r]`
    (`L[0]` and `U[K - 1]` are ignored) for `q` right-hand sides at once: block Gaussian elimination (the block
    Thomas algorithm) in a `lax.scan`,

    $$S_r = D_r - L_r C_{r-1}, \quad C_r = S_r^{-1} U_r, \quad d_r = S_r^{-1}(b_r - L_r d_{r-1}), \qquad
    x_r = d_r - C_r x_{r+1},$$

    with $S_r^{-1}$ by cofactors for blocks of up to `_CLOSED_FORM_MAX` rows (`_cofactor_inverse`, which needs no
    pivoting: it divides by $\det S_r$ alone) and partial pivoting inside each larger $S_r$; none across blocks.
    $[C_r, d_r]$ is carried as one array, so that each step is a few fused kernels. Each row is first divided by the
    power of two nearest its largest entry (exact: no digit of the entries changes), so that the entries are of
    order 1. Cost $O(K m^2 (m + q))$. A singular $S_r$ gives non-finite entries."""
    m = D.shape[1]
    largest = jnp.max(jnp.abs(jnp.concatenate([L, D, U], axis=2)), axis=2, keepdims=True)  # (K, m, 1)
    scale = jnp.where(largest > 0, jnp.exp2(-jnp.round(jnp.log2(jnp.where(largest > 0, largest, 1.0)))), 1.0)
    L, D, U, rhs = L * scale, D * scale, U * scale, rhs * scale

    q = rhs.shape[2]
    UR = jnp.concatenate([U, rhs], axis=2)  # [U_r, b_r]
    right = jnp.concatenate([jnp.zeros((1, m), D.dtype), jnp.ones((1, q), D.dtype)], axis=1)  # L_r d_{r-1} of P

    def forward(sol_prev, blocks):
        L_r, D_r, UR_r = blocks
        P = _small_matmul(L_r, sol_prev)  # [L_r C_{r-1}, L_r d_{r-1}]
        S = D_r - P[:, :m]
        R = UR_r - P * right  # [U_r, b_r - L_r d_{r-1}], element-wise (fused with the product)
        sol = _small_matmul(_cofactor_inverse(S), R) if m <= _CLOSED_FORM_MAX else small_solve(S, R)
        return sol, sol

    _, sols = jax.lax.scan(forward, jnp.zeros((m, m + q), D.dtype), (L, D, UR))

    def backward(x_next, sol_r):
        x_r = sol_r[:, m:] - _small_matmul(sol_r[:, :m], x_next)  # d_r - C_r x_{r+1}
        return x_r, x_r

    _, x = jax.lax.scan(backward, jnp.zeros((m, q), D.dtype), sols, reverse=True)
    return x


def _transpose_blocks(L, D, U):
    """The blocks of the transposed block-tridiagonal matrix: $L^T_r = U_{r-1}^T$, $D^T_r$, $U^T_r = L_{r+1}^T$."""
    zero = jnp.zeros_like(D[:1])
    Lt = jnp.concatenate([zero, jnp.swapaxes(U[:-1], 1, 2)])
    Ut = jnp.concatenate([jnp.swapaxes(L[1:], 1, 2), zero])
    return Lt, jnp.swapaxes(D, 1, 2), Ut


def _unravel(structure):
    """The `unravel` of `jax.flatten_util.ravel_pytree` for a PyTree of `jax.ShapeDtypeStruct`s, and the dtype of
    the flattened vector."""
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), structure)
    flat, unravel = ravel_pytree(zeros)
    return unravel, flat.dtype


def _solution(x, in_structure):
    """`x` (flat) as a PyTree of `in_structure`, with `RESULTS.singular` where it is not finite."""
    unravel, _ = _unravel(in_structure)
    result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful, lx.RESULTS.singular)
    return unravel(x), result, {}


class BlockTridiagonal(lx.AbstractLinearSolver):
    r"""Lineax solver for block-tridiagonal systems: block `r` of the (flattened) unknown couples only to blocks
    `r - 1`, `r`, `r + 1`, each of `block_size` entries, as the Jacobians of the queueing models do (level `k`
    exchanges servers with levels `k - 1` and `k + 1` only).

    `init` reads the three block diagonals off `3 * block_size` products with the operator (levels coloured
    modulo 3, so each product probes one column of every block at once) instead of materialising the dense
    matrix; `compute` is block Gaussian elimination (the block Thomas algorithm) in a `lax.scan`, partial pivoting
    inside each block. Cost $O(K m^3)$ and $O(K m^2)$ memory for $K$ blocks of size $m$, against $O((Km)^3)$ and
    $O((Km)^2)$ for dense LU. No pivoting across blocks: meant for the well-conditioned Jacobians at stable fixed
    points; a singular elimination block gives `RESULTS.singular`.

    The operator must be block tridiagonal in this sense: entries outside the band are not read, so they would be
    silently wrong. Models declare or detect their structure (`jsmkt._models.structure`), and a declared one is
    probed against the Jacobian before it is used.
    """

    block_size: int = eqx.field(static=True)

    def init(self, operator, options):
        del options
        if operator.in_size() != operator.out_size():
            raise ValueError("BlockTridiagonal needs a square operator")
        n, m = operator.in_size(), self.block_size
        if n % m:
            raise ValueError(f"operator size {n} is not a multiple of block_size={m}")
        K = n // m
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), operator.in_structure())
        _, unravel = ravel_pytree(zeros)
        level = jnp.arange(K) % 3
        probes = (level[None, :, None] == jnp.arange(3)[:, None, None])[:, :, :, None] & jnp.eye(m, dtype=bool)[
            None, None
        ]  # (colour, level, row, col): one column j of every block of the colour
        probes = jnp.moveaxis(probes, 3, 1).reshape(3 * m, n).astype(ravel_pytree(zeros)[0].dtype)
        Y = jax.vmap(lambda v: ravel_pytree(operator.mv(unravel(v)))[0])(probes)  # (3m, n)
        Y = Y.reshape(3, m, K, m)  # (colour, column j, level r, row i)
        r = jnp.arange(K)
        cols = jnp.moveaxis(Y, 2, 0)  # (level r, colour, j, i)
        D = jnp.swapaxes(cols[r, r % 3], 1, 2)
        L = jnp.swapaxes(cols[r, (r - 1) % 3], 1, 2).at[0].set(0.0)
        U = jnp.swapaxes(cols[r, (r + 1) % 3], 1, 2).at[K - 1].set(0.0)
        return (L, D, U), (operator.in_structure(), operator.out_structure())

    def compute(self, state, vector, options):
        del options
        (L, D, U), (in_structure, _) = state
        b, _ = ravel_pytree(vector)
        K, m, _ = D.shape
        x = _block_thomas(L, D, U, b.reshape(K, m, 1))
        return _solution(x.reshape(-1), in_structure)

    def transpose(self, state, options):
        blocks, (in_structure, out_structure) = state
        return (_transpose_blocks(*blocks), (out_structure, in_structure)), options

    def conj(self, state, options):
        (L, D, U), structures = state
        return ((L.conj(), D.conj(), U.conj()), structures), options

    def assume_full_rank(self):
        return True


# --- block-banded and bordered Jacobians ---------------------------------------------------------------------------
#
# The flattened unknown (`jax.flatten_util.ravel_pytree`) has a level per entry, `levels[i]`, nondecreasing in `i`
# and consecutive (a queue length: the entries of one level are adjacent). Levels may hold different numbers of
# entries. The solvers place the entries (border unknowns excepted) on a grid of K' levels of m slots, m the largest
# number of such entries on a level (slot `(k, j)` for the `j`-th entry of level `k`); free slots are dummy unknowns
# with identity rows and columns.


def _as_indices(values) -> tuple[int, ...]:
    """A sequence of integers (NumPy integers too) as a tuple of `int`, or a `TypeError`."""
    return tuple(_index(v) for v in np.asarray(values).reshape(-1).tolist())


def _as_border(values) -> tuple[int, ...]:
    return tuple(sorted(_as_indices(values)))


def _check_structure(levels: tuple[int, ...], bandwidth: int, border: tuple[int, ...] = ()) -> None:
    """`ValueError` unless `levels` are nondecreasing consecutive integers, `bandwidth >= 0` and `border` holds
    distinct indices of unknowns."""
    n = len(levels)
    if n == 0:
        raise ValueError("levels must name the level of at least one unknown")
    steps = np.diff(np.asarray(levels))
    bad = np.nonzero((steps != 0) & (steps != 1))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"levels must be nondecreasing consecutive integers (the flattened unknowns ordered by "
                         f"level), but levels[{i}] = {levels[i]} and levels[{i + 1}] = {levels[i + 1]}")
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, int) or bandwidth < 0:
        raise ValueError(f"bandwidth={bandwidth!r} must be an integer >= 0")
    if border and (border[0] < 0 or border[-1] >= n):
        raise ValueError(f"border indices must lie in [0, {n}), got {border}")
    if len(set(border)) != len(border):
        raise ValueError(f"border indices must be distinct, got {border}")


class _Grid(NamedTuple):
    """Index maps between the flattened unknowns (`n`) and the grid of `N` super-blocks of `b` levels of `m`
    slots (`N * B` slots, `B = b * m`), built once per structure (NumPy, read-only)."""

    n: int
    K: int  # levels
    m: int  # slots per level
    b: int  # levels per super-block (at least max(bandwidth, 1))
    N: int  # super-blocks
    B: int  # super-block size b * m
    src: np.ndarray  # (N*B,) the unknown in each slot; n for a dummy slot
    out_src: np.ndarray  # (n,) where unknown i is in [grid solution, border solution]
    probes: np.ndarray  # ((2 band + 1) m, n) bool: probe c*m + j is column j of every interior level of colour c
    band: np.ndarray  # (N, B, 3B) where [L_r, D_r, U_r] is in [products (flat), 0, 1] (see `_band_blocks`)
    border: np.ndarray  # (p,)


def _interior_sizes(levels, border) -> tuple[int, np.ndarray]:
    """The first level and the number of interior (non-border) unknowns on each level from there to the last level
    that holds one (levels with none in between count 0); (0, [1]) without interior unknowns."""
    lv = np.asarray(levels, dtype=np.int64)
    interior = np.ones(lv.size, dtype=bool)
    interior[list(border)] = False
    if not interior.any():
        return 0, np.ones(1, dtype=np.int64)
    base = int(lv[interior].min())
    return base, np.bincount(lv[interior] - base)


@functools.lru_cache(maxsize=32)
def _grid(levels: tuple[int, ...], bandwidth: int, border: tuple[int, ...], block_levels: int | None = None) -> _Grid:
    """The grid of the interior unknowns: border unknowns take no slot (their levels do not count), so a border
    unknown on a level of its own or beside the unknowns of a level does not enlarge the grid. Super-blocks hold
    `block_levels` levels (at least the bandwidth; by default the bandwidth): any such size makes the padded matrix
    block tridiagonal, read off the same $(2b + 1) m$ products."""
    lv = np.asarray(levels, dtype=np.int64)
    n = lv.size
    border_arr = np.asarray(border, dtype=np.int64)
    interior = np.ones(n, dtype=bool)
    interior[border_arr] = False
    base, sizes = _interior_sizes(levels, border)
    K, m = sizes.size, int(sizes.max())
    band = max(bandwidth, 1)
    b = band if block_levels is None else block_levels
    if b < band:
        raise ValueError(f"block_levels={block_levels} must be at least the bandwidth {band}")
    N = -(-K // b)
    B, Kp = b * m, N * b
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    lv_in = lv[interior] - base
    offset = np.arange(lv_in.size) - first[lv_in]  # position of each interior unknown within its level
    slot = lv_in * m + offset
    src = np.full(Kp * m, n, dtype=np.int64)
    src[slot] = np.nonzero(interior)[0]
    out_src = np.empty(n, dtype=np.int64)
    out_src[interior] = slot
    out_src[border_arr] = Kp * m + np.arange(border_arr.size)
    colours = 2 * band + 1  # columns of levels 2 band + 1 apart never meet in a row
    probes = np.zeros((colours * m, n), dtype=bool)
    probes[(lv_in % colours) * m + offset, np.nonzero(interior)[0]] = True
    # Entry (row i of level r b + p, column j of level (r - 1) b + t) of super-block row r: entry (unknown of the
    # row slot) of the product of probe (colour of the column level, j) when the levels are within b and both slots
    # hold interior unknowns; 1 on the diagonal of a dummy slot; 0 otherwise.
    r, p, i, t, j = np.ix_(np.arange(N), np.arange(b), np.arange(m), np.arange(3 * b), np.arange(m))
    row_level, col_level = r * b + p, (r - 1) * b + t
    row_unknown = src[row_level * m + i]
    on_grid = (col_level >= 0) & (col_level < Kp)
    col_real = src[np.where(on_grid, col_level, 0) * m + j] < n
    inside = (np.abs(col_level - row_level) <= band) & on_grid & col_real & (row_unknown < n)
    P = colours * m
    band = np.where(inside, ((col_level % colours) * m + j) * n + row_unknown, P * n)
    band = np.where((row_unknown == n) & (col_level == row_level) & (j == i), P * n + 1, band)
    band = band.reshape(N, B, 3 * B)
    arrays = [src, out_src, probes, band, border_arr]
    arrays = [np.array(a) for a in arrays]
    for a in arrays:
        a.flags.writeable = False
    return _Grid(n, K, m, b, N, B, *arrays)


def _to_grid(grid: _Grid, v: Array) -> Array:
    """`v` (n, q) on the grid (N*B, q): zero in the dummy slots, the border unknowns' entries left out."""
    return jnp.concatenate([v, jnp.zeros((1,) + v.shape[1:], v.dtype)])[grid.src]


def _check_operator(operator: lx.AbstractLinearOperator, grid: _Grid, name: str) -> None:
    if operator.in_size() != operator.out_size():
        raise ValueError(f"{name} needs a square operator, got {operator.out_size()} x {operator.in_size()}")
    if operator.in_size() != grid.n:
        raise ValueError(f"{name} was given levels for {grid.n} unknowns, but the operator has {operator.in_size()}")


def _band_blocks(operator: lx.AbstractLinearOperator, grid: _Grid, extra=None):
    r"""The block-tridiagonal super-blocks `(L, D, U)`, each `(N, B, B)`, of the operator's interior on the grid,
    read off $(2b + 1) m$ products `operator.mv`: probe $(c, j)$ is the sum of the unit vectors of column `j` of
    every interior level $l \equiv c \pmod{2b + 1}$. Row level `k` meets only column levels `k - b .. k + b`, which
    have distinct colours, so entry $(k, i; l, j)$ with $|k - l| \le b$ is entry $(k, i)$ of the product of probe
    $(l \bmod (2b + 1), j)$. Rows and columns of dummy slots become those of the identity. With `extra` (`(q, n)`
    vectors), their products come in the same batch and are returned too."""
    unravel, dtype = _unravel(operator.in_structure())
    probes = jnp.asarray(grid.probes, dtype=dtype)
    P = probes.shape[0]
    if extra is not None:
        probes = jnp.concatenate([probes, extra.astype(dtype)])
    Y = jax.vmap(lambda v: ravel_pytree(operator.mv(unravel(v)))[0])(probes)  # (probe, n)
    G = jnp.concatenate([Y[:P].reshape(-1), jnp.asarray([0.0, 1.0], dtype=dtype)])[grid.band]  # one gather
    B = grid.B
    blocks = G[:, :, :B], G[:, :, B:2 * B], G[:, :, 2 * B:]
    return blocks if extra is None else (blocks, Y[P:])


def _band_solve(blocks, grid: _Grid, v: Array) -> Array:
    """Solve with the grid matrix of `blocks` for `v` (N*B, q) given on the grid."""
    x = _block_thomas(*blocks, v.reshape(grid.N, grid.B, v.shape[1]))
    return x.reshape(grid.N * grid.B, v.shape[1])


class BlockBanded(lx.AbstractLinearSolver):
    r"""Lineax solver for block-banded systems: $J_{ij} = 0$ whenever $|\ell_i - \ell_j| > b$, for the levels
    $\ell_i$ = `levels[i]` of the flattened unknowns and the bandwidth $b$ = `bandwidth`. This is the Jacobian of a
    model whose transitions change a queue length by at most $b$ (batch arrivals of up to $b$ jobs);
    `bandwidth=1` is block tridiagonal, `bandwidth=0` (a block-diagonal matrix) is treated as 1.

    Each level is padded to $m$ = the largest level size with dummy unknowns (identity rows and columns), and $b$
    consecutive levels form one super-block of $bm$ unknowns (the level count padded to a multiple of $b$): a
    level meets only levels within $b$, hence only the neighbouring super-blocks, so the padded matrix is block
    tridiagonal with blocks of $bm$. `init` reads its three block diagonals off $(2b + 1) m$ products with the
    operator (levels coloured modulo $2b + 1$, each product probes one column of every level of a colour) and
    never materialises the dense matrix; `compute` is the block elimination of `BlockTridiagonal` on the
    super-blocks. Cost $O(K b^2 m^3)$ for $K$ levels and $O(K b m^2)$ memory, against $O((Km)^3)$ and
    $O((Km)^2)$ for dense LU. No pivoting across super-blocks: meant for well-conditioned Jacobians; a singular
    elimination block gives `RESULTS.singular`.

    The operator must be square, with its outputs flattened like its inputs (row `i` has level `levels[i]`, as
    for the Jacobian of a vector field $X \to X$), and have this structure: entries outside the band are not read,
    so they would be silently wrong (`structure_violations` checks a pattern against it).

    **Arguments:**

    - `levels`: the level of each flattened unknown, nondecreasing consecutive integers (any first value).
    - `bandwidth`: the largest level distance of a nonzero entry.
    """

    levels: tuple[int, ...] = eqx.field(static=True, converter=_as_indices)
    bandwidth: int = eqx.field(static=True, converter=_index)
    block_levels: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _check_structure(self.levels, self.bandwidth)

    def _grid(self) -> _Grid:
        return _grid(self.levels, self.bandwidth, (), self.block_levels)

    def init(self, operator, options):
        del options
        grid = self._grid()
        _check_operator(operator, grid, "BlockBanded")
        return _band_blocks(operator, grid), (operator.in_structure(), operator.out_structure())

    def compute(self, state, vector, options):
        del options
        blocks, (in_structure, _) = state
        grid = self._grid()
        b, _ = ravel_pytree(vector)
        x = _band_solve(blocks, grid, _to_grid(grid, b[:, None]))
        return _solution(x[grid.out_src, 0], in_structure)

    def transpose(self, state, options):
        blocks, (in_structure, out_structure) = state
        return (_transpose_blocks(*blocks), (out_structure, in_structure)), options

    def conj(self, state, options):
        blocks, structures = state
        return (tuple(a.conj() for a in blocks), structures), options

    def assume_full_rank(self):
        return True


class Bordered(lx.AbstractLinearSolver):
    r"""Lineax solver for block-banded systems with a few dense rows and columns: $J_{ij} = 0$ whenever neither
    $i$ nor $j$ is in `border` and $|\ell_i - \ell_j| > b$ (as `BlockBanded`, but the border unknowns, such as a
    total that couples to every level, may couple to anything).

    With $I$ the interior (the other unknowns) and $B$ the $p$ border unknowns, the Schur complement
    $S = J_{BB} - J_{BI} J_{II}^{-1} J_{IB}$ gives

    $$x_B = S^{-1}\left(b_B - J_{BI} J_{II}^{-1} b_I\right), \qquad x_I = J_{II}^{-1} b_I - W x_B, \quad
    W = J_{II}^{-1} J_{IB}.$$

    $J_{II}$ is factored as in `BlockBanded`, on the grid of the interior unknowns (a border unknown takes no slot,
    and a level it leaves short is padded with a dummy unknown like any other, so the levels stay uniform), from
    $(2b + 1) m$ products whose probes leave out the border columns;
    the border columns $J_{\cdot B}$ are $p$ products `operator.mv` with unit vectors, in the same batch as those
    probes, and the border rows $J_{B \cdot}$ are $p$ products with the transpose (`operator.transpose().mv`: a
    vector-Jacobian product for `lx.JacobianLinearOperator`, `jax.linear_transpose` for
    `lx.FunctionLinearOperator`). With `reuse=True` (the default) `init` forms $W$ ($p$ right-hand sides in one
    elimination) and $S$, and `compute` does one banded solve and a $p \times p$ dense one: for a state that
    serves many solves (a chord iteration's). With `reuse=False` `init` only reads the blocks and `compute` finds
    $W$ and $J_{II}^{-1} b_I$ in one elimination ($p + 1$ right-hand sides): one elimination per solve instead of
    two, for a state that serves one solve (a Newton step's, an implicit adjoint's); it then needs no products
    with the transpose either: the state keeps the operator, and $J_{BI}$ is applied to $[W, J_{II}^{-1} b_I]$ as
    the border rows of $p + 1$ products with those columns (zero on the border).
    Cost $O(K b m^2 (b m + p) + p^3)$. A singular $J_{II}$ or $S$ gives `RESULTS.singular`.

    The operator must be square with outputs flattened like its inputs, as for `BlockBanded`.

    **Arguments:**

    - `levels`: the level of each flattened unknown, nondecreasing consecutive integers (any first value); border
        unknowns have levels too (their position in the flattened unknown).
    - `bandwidth`: the largest level distance of a nonzero entry between interior unknowns.
    - `border`: the indices of the border unknowns in the flattened unknown.
    - `reuse`: whether `init` eliminates for $W$ (above).
    """

    levels: tuple[int, ...] = eqx.field(static=True, converter=_as_indices)
    bandwidth: int = eqx.field(static=True, converter=_index)
    border: tuple[int, ...] = eqx.field(static=True, converter=_as_border)
    block_levels: int | None = eqx.field(static=True, default=None)
    reuse: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        _check_structure(self.levels, self.bandwidth, self.border)
        if not self.border:
            raise ValueError("Bordered needs at least one border unknown; without a border use BlockBanded")

    def _grid(self) -> _Grid:
        return _grid(self.levels, self.bandwidth, self.border, self.block_levels)

    def init(self, operator, options):
        del options
        grid = self._grid()
        _check_operator(operator, grid, "Bordered")
        _, dtype = _unravel(operator.in_structure())
        unravel_out, _ = _unravel(operator.out_structure())
        units = jnp.asarray(np.arange(grid.n)[None, :] == grid.border[:, None], dtype=dtype)  # (p, n)
        # the band's probes and the border's unit vectors in one batch of products
        blocks, cols = _band_blocks(operator, grid, units)  # cols[c] = J[:, border[c]]
        J_IB = _to_grid(grid, cols.T)  # (N*B, p)
        J_BB = cols[:, grid.border].T
        if not self.reuse:
            return (blocks, J_IB, J_BB, operator), (operator.in_structure(), operator.out_structure())
        transposed = operator.transpose()
        rows = jax.vmap(lambda v: ravel_pytree(transposed.mv(unravel_out(v)))[0])(units)  # rows[a] = J[border[a]]
        J_BI = _to_grid(grid, rows.T).T  # (p, N*B)
        W = _band_solve(blocks, grid, J_IB)
        S = J_BB - J_BI @ W
        return (blocks, J_IB, J_BI, W, S), (operator.in_structure(), operator.out_structure())

    def compute(self, state, vector, options):
        del options
        arrays, (in_structure, _) = state
        grid = self._grid()
        b, _ = ravel_pytree(vector)
        b_I = _to_grid(grid, b[:, None])
        if self.reuse:
            blocks, _, J_BI, W, S = arrays
            y = _band_solve(blocks, grid, b_I)
            x_B = small_solve(S, b[grid.border][:, None] - J_BI @ y)
        else:
            # J_BI applied to [W, y] as the border rows of the products with [W, y] (zero on the border)
            blocks, J_IB, J_BB, operator = arrays
            p = J_IB.shape[1]
            Z = _band_solve(blocks, grid, jnp.concatenate([J_IB, b_I], axis=1))
            W, y = Z[:, :p], Z[:, p:]
            unravel, dtype = _unravel(operator.in_structure())
            flat = jnp.concatenate([Z, jnp.zeros((p, p + 1), Z.dtype)])[grid.out_src]  # (n, p + 1)
            JZ = jax.vmap(lambda v: ravel_pytree(operator.mv(unravel(v)))[0])(flat.T.astype(dtype))  # (p + 1, n)
            BZ = JZ[:, grid.border].T  # J_BI [W, y]
            x_B = small_solve(J_BB - BZ[:, :p], b[grid.border][:, None] - BZ[:, p:])
        x_I = y - W @ x_B
        return _solution(jnp.concatenate([x_I[:, 0], x_B[:, 0]])[grid.out_src], in_structure)

    def transpose(self, state, options):
        """$J^T$ has interior $J_{II}^T$, border columns $J_{BI}^T$, border rows $J_{IB}^T$ and Schur complement
        $S^T$ (border block $J_{BB}^T$); with `reuse=True` only the counterpart of $W$, $J_{II}^{-T} J_{BI}^T$,
        needs a solve (banded, $p$ right-hand sides); with `reuse=False` the border columns of $J^T$ are $p$
        products with the transposed operator, which the state keeps for its solves."""
        arrays, (in_structure, out_structure) = state
        blocks_t = _transpose_blocks(*arrays[0])
        grid = self._grid()
        if not self.reuse:
            _, _, J_BB, operator = arrays
            transposed = operator.transpose()
            unravel_out, dtype = _unravel(out_structure)
            units = jnp.asarray(np.arange(grid.n)[None, :] == grid.border[:, None], dtype=dtype)
            rows = jax.vmap(lambda v: ravel_pytree(transposed.mv(unravel_out(v)))[0])(units)  # rows[a] = J[border[a]]
            state_t = (blocks_t, _to_grid(grid, rows.T), J_BB.T, transposed)
            return (state_t, (out_structure, in_structure)), options
        J_IB_t, J_BI_t = arrays[2].T, arrays[1].T
        W_t = _band_solve(blocks_t, grid, J_IB_t)
        return ((blocks_t, J_IB_t, J_BI_t, W_t, arrays[4].T), (out_structure, in_structure)), options

    def conj(self, state, options):
        (blocks, *rest), structures = state
        rest = [lx.conj(a) if isinstance(a, lx.AbstractLinearOperator) else a.conj() for a in rest]
        return ((tuple(a.conj() for a in blocks), *rest), structures), options

    def assume_full_rank(self):
        return True


# --- choosing a structure --------------------------------------------------------------------------------------


def structure_solver(levels, bandwidth: int, border=(), *, reuse: bool = True) -> lx.AbstractLinearSolver:
    r"""The Lineax solver for a Jacobian with the structure `(levels, bandwidth, border)` (see `BlockBanded` and
    `Bordered`; `classify_sparsity` finds one from a sparsity pattern).

    The rule, for $n$ unknowns, $p$ of them in the border, the others on $K$ levels of at most $m$ unknowns,
    $b$ = max(`bandwidth`, 1) and $N = \lceil K/b \rceil$ super-blocks of $B = bm$:

    - `BlockTridiagonal(m)` when every level holds $m$ unknowns, `bandwidth <= 1` and there is no border
        (the models' nearest-neighbour Jacobians, whatever their size);
    - `lx.LU()` when the structure cannot pay: the three block diagonals of super-blocks hold at least half as
        many entries as the dense matrix, $(3N - 2) B^2 \ge n^2 / 2$ (few super-blocks, or levels so uneven that
        the padding dominates), or the border holds at least an eighth of the unknowns, $8p \ge n$;
    - `BlockBanded(levels, bandwidth)` when there is no border;
    - `Bordered(levels, bandwidth, border, reuse=reuse)` otherwise: `reuse=False` for a solver whose states each
        serve one solve (Newton's steps), which then eliminate once per solve.
    """
    levels, bandwidth, border = _as_indices(levels), _index(bandwidth), _as_border(border)
    _check_structure(levels, bandwidth, border)
    _, sizes = _interior_sizes(levels, border)
    n, m, p = len(levels), int(sizes.max()), len(border)
    if not border and bandwidth <= 1 and np.all(sizes == m):
        return BlockTridiagonal(m)
    b = max(bandwidth, 1)
    N = -(-sizes.size // b)
    if 2 * (3 * N - 2) * (b * m) ** 2 >= n * n or 8 * p >= n:
        return lx.LU()
    if not border:
        return BlockBanded(levels, bandwidth)
    return Bordered(levels, bandwidth, border, reuse=reuse)


def _pattern_levels(pattern, levels) -> tuple[np.ndarray, np.ndarray]:
    pattern = np.asarray(pattern, dtype=bool)
    levels = _as_indices(levels)
    _check_structure(levels, 0)
    n = len(levels)
    if pattern.shape != (n, n):
        raise ValueError(f"the pattern must be ({n}, {n}) for {n} levels, got shape {pattern.shape}")
    return pattern, np.asarray(levels, dtype=np.int64)


def _structure_cost(levels, n: int, bandwidth: int, border) -> int:
    """The arithmetic of `Bordered` (of `BlockBanded` without a border), up to constants: the elimination of N
    super-blocks of B = bm (K levels of at most m interior unknowns) with p extra right-hand sides, the p x p Schur
    system and the 2p border products."""
    _, sizes = _interior_sizes(levels, border)
    b, p = max(bandwidth, 1), len(border)
    N, B = -(-sizes.size // b), b * int(sizes.max())
    return N * B**3 + N * B**2 * p + p**3 + 2 * p * n


_SEARCH_MAX = 512  # unknowns above which a dense pattern is not searched for a border (`classify_sparsity`)


def classify_sparsity(pattern, levels) -> tuple[int, tuple[int, ...]]:
    r"""A structure `(bandwidth, border)` (for `structure_solver`, `BlockBanded`, `Bordered`) that covers every
    nonzero of the sparsity pattern `pattern` (`(n, n)` bool, e.g. `jax.jacfwd(f)(x) != 0` at a generic point
    `x`) of a Jacobian whose flattened unknowns have levels `levels`: every nonzero $(i, j)$ has $i$ or $j$ in
    `border` or $|\ell_i - \ell_j| \le$ `bandwidth`.

    The border is the set of unknowns whose rows or columns reach much farther in level than the rest (a column
    that couples to every level, an arrowhead), the bandwidth the largest level distance of the other nonzeros.
    The choice minimises the cost model of `Bordered`, about $(K/b)(bm)^3 + (K/b)(bm)^2 p + p^3 + 2pn$ for $K$
    levels of at most $m$ interior unknowns and $p$ border unknowns: for each candidate bandwidth $w$ (one below
    the largest level distance that the border so far leaves) the nonzeros farther than $w$ are covered greedily,
    adding to the border the unknown whose row and column hold most of the uncovered ones (ties: the one with most
    nonzeros), then dropping the border unknowns that the others make redundant; the border carries over to the
    next, smaller $w$, and the search stops once the border's own cost, $p^3 + 2pn$, exceeds that of the best
    structure found, or the border holds an eighth of the unknowns (where `structure_solver` takes dense LU).
    A diagonal pattern gives `(0, ())` (which the solvers treat as bandwidth 1), a tridiagonal one `(1, ())`.
    Above `_SEARCH_MAX` unknowns a pattern with at least a quarter of its entries nonzero is taken as dense (the
    largest level distance, no border) without the search, whose greedy steps each pass over every nonzero.
    """
    pattern, lv = _pattern_levels(pattern, levels)
    levels = tuple(lv.tolist())
    n = lv.size
    rows, cols = np.nonzero(pattern)
    dist = np.abs(lv[rows] - lv[cols])
    if dist.size == 0:
        return 0, ()
    if n > _SEARCH_MAX and 4 * rows.size >= n * n:
        return int(dist.max()), ()
    in_border = np.zeros(n, dtype=bool)
    # ties between equally useful unknowns go to the one with more nonzeros in its row and column
    degree = np.bincount(rows, minlength=n) + np.bincount(cols, minlength=n)
    best = (_structure_cost(levels, n, int(dist.max()), ()), int(dist.max()), ())  # (cost, bandwidth, border)
    w = best[1] - 1
    while w >= 0:  # w: the next bandwidth to try, one below the largest distance the border leaves
        far = (dist > w) & ~in_border[rows] & ~in_border[cols]
        while far.any():
            p = int(in_border.sum()) + 1
            if p**3 + 2 * p * n >= best[0] or 8 * p >= n:
                break  # a lower bound for every bandwidth with this border; `structure_solver` takes LU anyway
            counts = np.bincount(rows[far], minlength=n) + np.bincount(cols[far], minlength=n)
            u = int(np.argmax(counts * (2 * n + 1) + degree))
            in_border[u] = True
            far &= (rows != u) & (cols != u)
        if far.any():
            break  # covering this w (and every smaller one) costs more than the best structure
        for u in np.nonzero(in_border)[0]:  # drop border unknowns that the others make redundant
            mine = (dist > w) & ((rows == u) | (cols == u))
            if not np.any(mine & ~in_border[np.where(rows == u, cols, rows)]):
                in_border[u] = False
        left = ~in_border[rows] & ~in_border[cols]
        actual = int(dist[left].max()) if left.any() else 0
        border = tuple(np.nonzero(in_border)[0].tolist())
        cost = _structure_cost(levels, n, actual, border)
        if cost < best[0]:
            best = (cost, actual, border)
        w = actual - 1
    return best[1], best[2]


def structure_violations(pattern, levels, bandwidth: int, border=()) -> np.ndarray:
    """The `(k, 2)` index pairs `(i, j)` (in row-major order) of the nonzeros of `pattern` that the structure
    `(levels, bandwidth, border)` does not cover: neither `i` nor `j` in `border` and `|levels[i] - levels[j]| >
    bandwidth`. Empty (shape `(0, 2)`) when the structure fits, so a caller can refuse a wrongly declared
    structure by naming the first offending entry. `bandwidth` is taken as given (0: diagonal blocks only)."""
    pattern, lv = _pattern_levels(pattern, levels)
    bandwidth, border = _index(bandwidth), _as_border(border)
    _check_structure(tuple(lv.tolist()), bandwidth, border)
    in_border = np.zeros(lv.size, dtype=bool)
    in_border[list(border)] = True
    rows, cols = np.nonzero(pattern)
    bad = (np.abs(lv[rows] - lv[cols]) > bandwidth) & ~in_border[rows] & ~in_border[cols]
    return np.stack([rows[bad], cols[bad]], axis=1)


class NeverFails(lx.AbstractLinearSolver):
    """Wraps a Lineax solver so that it always reports success: a failed or non-finite solution comes back as
    zeros. For the implicit adjoint of a fixed point solved with `throw=False`: Lineax raises on a failed solve
    inside `jvp`/`grad` whatever `throw` says, which would sink a whole `vmap` batch for one bad entry; the entry's
    `result` reports the failure instead (and `solve_fixed_point` makes its derivatives NaN)."""

    solver: lx.AbstractLinearSolver

    def init(self, operator, options):
        return self.solver.init(operator, options)

    def compute(self, state, vector, options):
        x, result, stats = self.solver.compute(state, vector, options)
        ok = (result == lx.RESULTS.successful) & all_finite(x)
        x = jax.tree_util.tree_map(lambda a: jnp.where(ok, a, jnp.zeros_like(a)), x)
        return x, lx.RESULTS.successful, stats

    def transpose(self, state, options):
        return self.solver.transpose(state, options)

    def conj(self, state, options):
        return self.solver.conj(state, options)

    def assume_full_rank(self):
        return self.solver.assume_full_rank()
