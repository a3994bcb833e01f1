"""Linear algebra helpers: small dense M-matrix solves and a block-tridiagonal Lineax solver."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from ._errors import all_finite


_UNROLL_MAX = 6


def mmatrix_solve(A: Float[Array, "m m"], b: Float[Array, " m"]) -> Float[Array, " m"]:
    """Solve `A x = b` for a nonsingular M-matrix `A` (or its transpose).

    Gaussian elimination without pivoting is stable for M-matrices (all pivots stay positive), so for the small
    phase counts of PH models it is written out in full: inside `lax.scan` loops this avoids one LAPACK call per
    iteration, which costs more than the arithmetic. Larger systems use `jnp.linalg.solve`.
    """
    m = A.shape[0]
    if m > _UNROLL_MAX:
        return jnp.linalg.solve(A, b)
    a = [[A[i, j] for j in range(m)] for i in range(m)]
    y = [b[i] for i in range(m)]
    for k in range(m):
        for i in range(k + 1, m):
            f = a[i][k] / a[k][k]
            for j in range(k + 1, m):
                a[i][j] = a[i][j] - f * a[k][j]
            y[i] = y[i] - f * y[k]
    x: list = [None] * m
    for i in reversed(range(m)):
        acc = y[i]
        for j in range(i + 1, m):
            acc = acc - a[i][j] * x[j]
        x[i] = acc / a[i][i]
    return jnp.stack(x)


def small_solve(A: Float[Array, "m m"], B: Float[Array, "m k"]) -> Float[Array, "m k"]:
    """Solve `A X = B` for a small nonsingular `A`: Gaussian elimination with partial pivoting, written out for
    `m <= _UNROLL_MAX` (inside `lax.scan` loops one LAPACK call per iteration costs more than the arithmetic: the
    block elimination of 48 blocks of 2 took 155 us with it, 50 us without), `jnp.linalg.solve` above. A singular
    `A` gives non-finite entries."""
    m = A.shape[0]
    if m > _UNROLL_MAX:
        return jnp.linalg.solve(A, B)
    M = jnp.concatenate([A, B], axis=1)
    rows = jnp.arange(m)
    for k in range(m - 1):
        p = jnp.argmax(jnp.where(rows >= k, jnp.abs(M[:, k]), -1.0))  # pivot row
        row_k, row_p = M[k], M[p]
        M = jnp.where((rows == k)[:, None], row_p[None], jnp.where((rows == p)[:, None], row_k[None], M))
        f = jnp.where(rows > k, M[:, k] / M[k, k], 0.0)
        M = M - f[:, None] * M[k][None]
    X: list = [None] * m
    for i in reversed(range(m)):
        acc = M[i, m:]
        for j in range(i + 1, m):
            acc = acc - M[i, j] * X[j]
        X[i] = acc / M[i, i]
    return jnp.stack(X)


def _small_matmul(A, B):
    """`A @ B` for small matrices as a broadcast product and sum, which XLA fuses with the operations around it
    (its CPU backend runs a dot as a library call of its own): the block elimination of 480 blocks of 2 took
    0.76 ms against 0.87 ms with dots."""
    if A.shape[1] > _UNROLL_MAX:
        return A @ B
    return jnp.sum(A[:, :, None] * B[None, :, :], axis=1)


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
    silently wrong (models declare it through `jacobian_block_size`, tested against their dense Jacobians).
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
        b = b.reshape(K, m)

        def forward(carry, blocks):
            C_prev, d_prev = carry
            L_r, D_r, U_r, b_r = blocks
            S = D_r - _small_matmul(L_r, C_prev)
            rhs = b_r[:, None] - _small_matmul(L_r, d_prev[:, None])
            sol = small_solve(S, jnp.concatenate([U_r, rhs], axis=1))
            C_r, d_r = sol[:, :m], sol[:, m]
            return (C_r, d_r), (C_r, d_r)

        zero = (jnp.zeros((m, m), D.dtype), jnp.zeros(m, D.dtype))
        _, (C, d) = jax.lax.scan(forward, zero, (L, D, U, b))

        def backward(x_next, blocks):
            C_r, d_r = blocks
            x_r = d_r - _small_matmul(C_r, x_next[:, None])[:, 0]
            return x_r, x_r

        _, x = jax.lax.scan(backward, jnp.zeros(m, D.dtype), (C, d), reverse=True)
        x = x.reshape(-1)
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), in_structure)
        _, unravel = ravel_pytree(zeros)
        result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful, lx.RESULTS.singular)
        return unravel(x), result, {}

    def transpose(self, state, options):
        (L, D, U), (in_structure, out_structure) = state
        zero = jnp.zeros_like(D[:1])
        Lt = jnp.concatenate([zero, jnp.swapaxes(U[:-1], 1, 2)])
        Ut = jnp.concatenate([jnp.swapaxes(L[1:], 1, 2), zero])
        return ((Lt, jnp.swapaxes(D, 1, 2), Ut), (out_structure, in_structure)), options

    def conj(self, state, options):
        (L, D, U), structures = state
        return ((L.conj(), D.conj(), U.conj()), structures), options

    def assume_full_rank(self):
        return True


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
