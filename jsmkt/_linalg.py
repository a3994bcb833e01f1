"""Small dense linear algebra helpers."""

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
