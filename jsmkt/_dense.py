"""Small dense solves written out in XLA's operations, without LAPACK: for the phase counts of PH models and the
blocks of the structured Jacobians, one LAPACK call inside a `lax.scan` loop costs more than the arithmetic
(`benchmarks/README.md`), and a program without LAPACK calls spares a process importing SciPy, whose BLAS
jaxlib's LAPACK kernels take, at its first solve. Larger systems use `jnp.linalg.solve`. Utility
layer: the PH laws (`jsmkt._distributions`) use it as well as the structured solvers (`jsmkt._linalg`)."""

import jax.numpy as jnp
from jaxtyping import Array, Float


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
    `m <= _UNROLL_MAX` (inside `lax.scan` loops one LAPACK call per iteration costs more than the arithmetic;
    `benchmarks/README.md`), `jnp.linalg.solve` above. A singular
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
