import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jsmkt
from jsmkt._linalg import BlockTridiagonal, mmatrix_solve, small_solve


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 8), seed=st.integers(0, 2**31 - 1), shift=st.floats(0.0, 5.0))
def test_mmatrix_solve_matches_lapack(m, seed, shift):
    # shift*I - T for a random sub-generator T is a nonsingular M-matrix, as in the PH models.
    rng = np.random.default_rng(seed)
    off = rng.uniform(0, 2, (m, m)) * (rng.uniform(size=(m, m)) < 0.6)
    np.fill_diagonal(off, 0)
    T = off - np.diag(off.sum(1) + rng.uniform(0.05, 2, m))
    A = shift * np.eye(m) - T
    b = rng.uniform(-1, 1, m)
    for M in (A, A.T):
        x = np.asarray(mmatrix_solve(M, b))
        np.testing.assert_allclose(x, np.linalg.solve(M, b), rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 8), seed=st.integers(0, 2**31 - 1), zero_pivots=st.integers(0, 3))
def test_small_solve_matches_lapack(m, seed, zero_pivots):
    # General (not M-matrix) blocks, as the Schur complements of Newton's Jacobians: zero diagonal entries need
    # row exchanges, which elimination without pivoting would turn into inf/NaN.
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, m))
    A[np.arange(min(zero_pivots, m)), np.arange(min(zero_pivots, m))] = 0.0
    A[0, :] *= 1e-3  # a small leading row: pivoting on it would lose digits
    if abs(np.linalg.det(A)) < 1e-6 or np.linalg.cond(A) > 1e8:
        return
    B = rng.standard_normal((m, m + 1))
    X = np.asarray(small_solve(jnp.asarray(A), jnp.asarray(B)))
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-9, atol=1e-9 * np.abs(np.linalg.solve(A, B)).max())


def test_small_solve_singular_is_not_finite():
    A = jnp.asarray([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]])
    assert not np.all(np.isfinite(np.asarray(small_solve(A, jnp.ones((3, 1))))))


# --- block-tridiagonal Lineax solver ------------------------------------------------------------------------------


def _random_block_tridiagonal(rng, K, m):
    n = K * m
    A = np.zeros((n, n))
    for r in range(K):
        for c in (r - 1, r, r + 1):
            if 0 <= c < K:
                A[r * m:(r + 1) * m, c * m:(c + 1) * m] = rng.normal(size=(m, m)) + (4.0 * np.eye(m) if c == r else 0)
    return A


@pytest.mark.parametrize("K, m", [(1, 3), (2, 1), (3, 2), (8, 3), (40, 2)])
def test_block_tridiagonal_solver_matches_dense(K, m):
    rng = np.random.default_rng(K * 10 + m)
    A = _random_block_tridiagonal(rng, K, m)
    b = rng.normal(size=K * m)
    # a (K, m)-shaped unknown, as the models have, through a matrix-free operator
    op = lx.FunctionLinearOperator(lambda y: (jnp.asarray(A) @ y.reshape(-1)).reshape(K, m),
                                   jax.ShapeDtypeStruct((K, m), jnp.float64))
    sol = lx.linear_solve(op, jnp.asarray(b).reshape(K, m), BlockTridiagonal(m))
    assert sol.result == lx.RESULTS.successful
    np.testing.assert_allclose(np.asarray(sol.value).ravel(), np.linalg.solve(A, b), rtol=1e-10, atol=1e-12)
    # transpose (used by reverse-mode differentiation): d/db sum(A^{-1} b) = A^{-T} 1
    g = jax.grad(lambda bb: jnp.sum(lx.linear_solve(op, bb, BlockTridiagonal(m)).value))(jnp.asarray(b).reshape(K, m))
    np.testing.assert_allclose(np.asarray(g).ravel(), np.linalg.solve(A.T, np.ones(K * m)), rtol=1e-10, atol=1e-12)


def test_block_tridiagonal_solver_reports_singular():
    A = jnp.zeros((4, 4)).at[2:, 2:].set(jnp.eye(2))  # first diagonal block singular
    sol = lx.linear_solve(lx.MatrixLinearOperator(A), jnp.ones(4), BlockTridiagonal(2), throw=False)
    assert sol.result == lx.RESULTS.singular


@pytest.mark.parametrize("model", [
    jsmkt.JSQd(0.8, d=2, K=12),
    jsmkt.JSQd(0.8, d=2.5, K=12),
    jsmkt.JSQdPH(0.8, jsmkt.coxian2(1.0, 2.0), d=3, K=10),
    jsmkt.JSQdPH(0.7, jsmkt.erlang(3, 1.0), d=jsmkt.MixedChoice([0.2, 0.3, 0.5]), K=9),
], ids=["jsqd", "jsqd-real-d", "coxian", "erlang3-mixed"])
def test_models_declare_their_jacobian_structure(model):
    """`jacobian_block_size` is a promise the solver relies on: nothing outside the block tridiagonal band."""
    m = model.jacobian_block_size
    y = model.initial_guess()
    y = y + 0.01 * jnp.abs(jax.random.normal(jax.random.PRNGKey(0), y.shape))  # a generic point, not the root
    J = np.asarray(jax.jacfwd(lambda z: model.vector_field(0.0, z.reshape(y.shape)).ravel())(y.ravel()))
    level = np.arange(J.shape[0]) // m
    assert np.all(J[np.abs(np.subtract.outer(level, level)) > 1] == 0.0)
    assert np.any(J[np.abs(np.subtract.outer(level, level)) == 1] != 0.0)


def test_large_K_d1_solve_is_fast_and_exact():
    """d = 1, H2 service at load 0.95 needs K of about 2000 levels: block elimination keeps this a few ms, and the
    result is Pollaczek-Khinchine's mean queue length."""
    S = jsmkt.hyperexponential2(1.0, 4.0)
    lam = 0.95
    model = jsmkt.JSQdPH(lam, S, d=1)
    assert model.K > 1500
    fp = jsmkt.solve_fixed_point(model)
    m2 = float(S.moment(2))
    pk = lam + lam**2 * m2 / (2 * (1 - lam))  # E[Q] of M/G/1 with E[S] = 1
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(pk, rel=1e-9)
