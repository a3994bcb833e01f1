import functools

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree

import jsmkt
from jsmkt import _linalg
from jsmkt._dense import mmatrix_solve, small_solve
from jsmkt._linalg import (
    BlockBanded,
    BlockTridiagonal,
    Bordered,
    classify_sparsity,
    structure_solver,
    structure_violations,
)


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


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 8), seed=st.integers(0, 2**31 - 1), zero_pivots=st.integers(0, 4),
       kind=st.sampled_from(["pivoted", "cofactors"]))
def test_small_solves_match_lapack(m, seed, zero_pivots, kind):
    # General (not M-matrix) blocks, as the Schur complements of Newton's Jacobians: zero diagonal entries need
    # row exchanges in elimination, which without pivoting would turn them into inf/NaN; the cofactor inverse of
    # the block elimination (blocks of up to 4 rows) divides by the determinant alone.
    if kind == "cofactors" and m > _linalg._CLOSED_FORM_MAX:
        return
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, m))
    A[np.arange(min(zero_pivots, m)), np.arange(min(zero_pivots, m))] = 0.0
    A[0, :] *= 1e-3  # a small leading row: pivoting on it would lose digits
    if abs(np.linalg.det(A)) < 1e-6 or np.linalg.cond(A) > (1e8 if kind == "pivoted" else 1e6):
        return
    B = rng.standard_normal((m, m + 1))
    if kind == "pivoted":
        X = np.asarray(small_solve(jnp.asarray(A), jnp.asarray(B)))
    else:
        X = np.asarray(jax.jit(_linalg._cofactor_inverse)(jnp.asarray(A))) @ B
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


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_block_elimination_of_rows_scaled_far_from_one(m):
    # Rows multiplied by 1e-150 .. 1e150: the cofactor inverse's determinant (degree m in the entries) would leave
    # float64 without the equilibration by powers of two; the solution is that of the dense solve.
    K = 6
    rng = np.random.default_rng(m)
    A = _random_block_tridiagonal(rng, K, m)
    row_scale = 10.0 ** rng.choice([-150.0, 0.0, 150.0], size=K * m)
    A = A * row_scale[:, None]
    b = rng.normal(size=K * m) * row_scale
    sol = lx.linear_solve(lx.MatrixLinearOperator(jnp.asarray(A)), jnp.asarray(b), BlockTridiagonal(m), throw=False)
    assert sol.result == lx.RESULTS.successful
    np.testing.assert_allclose(np.asarray(sol.value), np.linalg.solve(A, b), rtol=1e-10, atol=1e-12)


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
    """The model's Jacobian structure is a promise the solver relies on: nothing outside the block tridiagonal band,
    which picks today's `BlockTridiagonal` elimination."""
    s = model.structure()
    y = model.initial_guess()
    y = y + 0.01 * jnp.abs(jax.random.normal(jax.random.PRNGKey(0), y.shape))  # a generic point, not the root
    J = np.asarray(jax.jacfwd(lambda z: model.vector_field(0.0, z.reshape(y.shape)).ravel())(y.ravel()))
    assert (s.bandwidth, s.border) == (1, ())
    assert structure_violations(J != 0.0, s.levels, s.bandwidth, s.border).shape == (0, 2)
    level = np.asarray(s.levels)
    assert np.any(J[np.abs(np.subtract.outer(level, level)) == 1] != 0.0)
    assert structure_solver(s.levels, s.bandwidth, s.border) == BlockTridiagonal(y.shape[1] if y.ndim > 1 else 1)


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


# --- block-banded and bordered Lineax solvers ----------------------------------------------------------------------


def _levels(sizes, first=0):
    """Levels of the flattened unknowns for levels holding `sizes[k]` unknowns each."""
    return tuple(np.repeat(np.arange(first, first + len(sizes)), sizes).tolist())


def _allowed(levels, bandwidth, border=()):
    lv = np.asarray(levels)
    allowed = np.abs(np.subtract.outer(lv, lv)) <= bandwidth
    allowed[list(border), :] = True
    allowed[:, list(border)] = True
    return allowed


def _structured(rng, levels, bandwidth, border=()):
    """A random matrix that is nonzero exactly on the structure, row diagonally dominant; and a second one on the
    same pattern for the nonlinear part of `_nonlinear`."""
    allowed = _allowed(levels, bandwidth, border)
    A = rng.normal(size=allowed.shape) * allowed
    np.fill_diagonal(A, 0.0)
    A += np.diag(1.3 * np.abs(A).sum(axis=1) + 1.0)
    C = 0.1 * rng.normal(size=allowed.shape) * allowed
    return A, C


def _unknown(sizes, flat):
    """The flattened unknown as a PyTree: a (K, m) array for uniform levels, {"head": first level, "tail":
    (K - 1, m)} when the levels after the first all hold m unknowns, else the flat vector."""
    if len(set(sizes)) == 1:
        return flat.reshape(len(sizes), sizes[0])
    if len(set(sizes[1:])) == 1:
        return {"head": flat[:sizes[0]], "tail": flat[sizes[0]:].reshape(len(sizes) - 1, sizes[1])}
    return flat


def _nonlinear(y, A, C):
    """`f(y) = A y + C sin(y) + y^2 / 10` on the flattened PyTree `y`: a Jacobian with the pattern of A."""
    flat, unravel = ravel_pytree(y)
    return unravel(A @ flat + C @ jnp.sin(flat) + 0.1 * flat**2)


def _operators(A, C, y0):
    return (lx.MatrixLinearOperator(A),
            lx.JacobianLinearOperator(lambda y, args: _nonlinear(y, *args), y0, args=(A, C)))


@functools.partial(jax.jit, static_argnums=0)
def _solves(solver, A, C, y0, b):
    """The solutions with the matrix and with the Jacobian of `_nonlinear` at `y0` (a PyTree unknown)."""
    matrix, jac = _operators(A, C, y0)
    x_jac = lx.linear_solve(jac, ravel_pytree(y0)[1](b), solver).value
    return lx.linear_solve(matrix, b, solver).value, ravel_pytree(x_jac)[0]


@functools.partial(jax.jit, static_argnums=0)
def _transposed_solves(solver, A, C, y0, b):
    """The solutions with the transposes of both operators, and `jax.grad` of sum(solution) with respect to the
    right-hand side (through the Jacobian operator) and to the matrix: reverse mode solves with the transpose."""
    matrix, jac = _operators(A, C, y0)
    unravel = ravel_pytree(y0)[1]
    x_matrix_t = lx.linear_solve(matrix.transpose(), b, solver).value
    x_jac_t = ravel_pytree(lx.linear_solve(jac.transpose(), unravel(b), solver).value)[0]
    grad_b = jax.grad(lambda bb: jnp.sum(ravel_pytree(lx.linear_solve(jac, unravel(bb), solver).value)[0]))(b)
    grad_A = jax.grad(lambda AA: jnp.sum(lx.linear_solve(lx.MatrixLinearOperator(AA), b, solver).value))(A)
    return x_matrix_t, x_jac_t, grad_b, grad_A


def _assert_close(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    err = np.max(np.abs(x - ref)) / np.max(np.abs(ref))
    assert err <= 1e-12, f"relative error {err:.1e}"


def _problem(solver, sizes, bandwidth, border, seed):
    """A random structured matrix A, the Jacobian J of `_nonlinear` at a random point y0, and a right-hand side."""
    rng = np.random.default_rng(seed)
    n = len(solver.levels)
    A, C = _structured(rng, solver.levels, bandwidth, border)
    flat0 = rng.uniform(-1, 1, n)
    J = A + C * np.cos(flat0)[None, :] + np.diag(0.2 * flat0)
    args = (jnp.asarray(A), jnp.asarray(C), _unknown(sizes, jnp.asarray(flat0)), jnp.asarray(rng.normal(size=n)))
    return A, J, args


def _check_against_dense(solver, sizes, bandwidth, border, seed):
    A, J, args = _problem(solver, sizes, bandwidth, border, seed)
    b = np.asarray(args[-1])
    x_matrix, x_jac = _solves(solver, *args)
    _assert_close(x_matrix, np.linalg.solve(A, b))
    _assert_close(x_jac, np.linalg.solve(J, b))


BANDED_CASES = [  # (level sizes, first level, bandwidth)
    ([1] * 12, 0, 1),
    ([1] + [2] * 10, 0, 3),  # a first level of one unknown
    ([3] * 7, 0, 3),  # super-blocks of 9 > _UNROLL_MAX: LAPACK for the blocks
    ([1] + [2] * 11, 1, 5),
    ([2] * 6, 0, 4),  # 6 levels padded to 8
    ([1] * 9, 0, 0),  # diagonal
    ([2, 1, 3, 2, 1, 2, 2], 2, 2),  # uneven levels
]


@pytest.mark.parametrize("sizes, first, bandwidth", BANDED_CASES)
def test_block_banded_matches_dense(sizes, first, bandwidth):
    solver = BlockBanded(_levels(sizes, first), bandwidth)
    _check_against_dense(solver, sizes, bandwidth, (), seed=len(sizes) * 10 + bandwidth)


BORDERED_CASES = [  # (level sizes, bandwidth, border)
    ([1] * 12, 1, (0,)),  # start
    ([2] * 9, 2, (8, 9)),  # middle
    ([1] * 14, 3, (13,)),  # end
    ([1] + [2] * 10, 1, (0, 10, 20)),  # start, middle and end
    ([3] * 6, 1, (17, 15, 16)),  # the last level (given in any order)
    ([2] * 8, 5, (3, 4)),  # two levels of 5 padded to 10
    ([1, 2, 1, 2, 2, 1, 1, 2], 4, (5,)),  # uneven levels
]


@pytest.mark.parametrize("sizes, bandwidth, border, reuse", [case + (True,) for case in BORDERED_CASES]
                         + [case + (False,) for case in BORDERED_CASES[3:6]])
def test_bordered_matches_dense(sizes, bandwidth, border, reuse):
    """Both ways of `Bordered`: W formed in `init` (reuse) or with each right-hand side."""
    solver = Bordered(_levels(sizes), bandwidth, border, reuse=reuse)
    assert solver.border == tuple(sorted(border))
    _check_against_dense(solver, sizes, bandwidth, border, seed=len(sizes) * 10 + bandwidth + 100)


@pytest.mark.parametrize("total_level", ["own", "last"])
def test_bordered_with_a_total_takes_no_grid_slot(total_level):
    """A total appended after K levels of one unknown, on a level of its own or on the last level: the grid stays
    one slot per level (the border unknown is not padded into every level)."""
    K = 15
    levels = tuple(range(K)) + ((K,) if total_level == "own" else (K - 1,))
    solver = Bordered(levels, 2, (K,))
    assert _linalg._grid(solver.levels, solver.bandwidth, solver.border).m == 1
    rng = np.random.default_rng(5)
    A, _ = _structured(rng, levels, 2, (K,))
    b = rng.normal(size=K + 1)
    x = jax.jit(lambda A, b: lx.linear_solve(lx.MatrixLinearOperator(A), b, solver).value)(jnp.asarray(A),
                                                                                           jnp.asarray(b))
    _assert_close(x, np.linalg.solve(A, b))


@pytest.mark.parametrize("sizes, bandwidth, border, reuse", [
    ([1] + [2] * 8, 2, (), True),
    ([1] + [2] * 8, 1, (0, 8, 16), True),
    ([1] + [2] * 8, 1, (0, 8, 16), False),
])
def test_transposed_solves_and_gradients_match_dense(sizes, bandwidth, border, reuse):
    levels = _levels(sizes)
    solver = Bordered(levels, bandwidth, border, reuse=reuse) if border else BlockBanded(levels, bandwidth)
    A, J, args = _problem(solver, sizes, bandwidth, border, seed=len(sizes) + bandwidth)
    b = np.asarray(args[-1])
    x_matrix_t, x_jac_t, grad_b, grad_A = _transposed_solves(solver, *args)
    n = b.size
    _assert_close(x_matrix_t, np.linalg.solve(A.T, b))
    _assert_close(x_jac_t, np.linalg.solve(J.T, b))
    _assert_close(grad_b, np.linalg.solve(J.T, np.ones(n)))  # d/db sum(J^-1 b) = J^-T 1
    _assert_close(grad_A, -np.outer(np.linalg.solve(A.T, np.ones(n)), np.linalg.solve(A, b)))


def test_banded_and_bordered_under_vmap():
    rng = np.random.default_rng(7)
    sizes = [1] + [2] * 7
    levels = _levels(sizes)
    n = len(levels)
    for solver, border in ((BlockBanded(levels, 2), ()), (Bordered(levels, 2, (0, 7)), (0, 7))):
        As = np.stack([_structured(rng, levels, 2, border)[0] for _ in range(3)])
        bs = rng.normal(size=(3, n))
        xs = jax.jit(jax.vmap(lambda A, b: lx.linear_solve(lx.MatrixLinearOperator(A), b, solver).value))(
            jnp.asarray(As), jnp.asarray(bs))
        for x, A, b in zip(xs, As, bs):
            _assert_close(x, np.linalg.solve(A, b))


@pytest.mark.parametrize("sizes, bandwidth", [([1] * 10, 2), ([3] * 6, 3)])  # blocks by cofactors, LAPACK
def test_block_banded_reports_singular(sizes, bandwidth):
    levels = _levels(sizes)
    A, _ = _structured(np.random.default_rng(3), levels, bandwidth)
    A[len(levels) // 2] = 0.0
    sol = lx.linear_solve(lx.MatrixLinearOperator(jnp.asarray(A)), jnp.ones(len(levels)),
                          BlockBanded(levels, bandwidth), throw=False)
    assert sol.result == lx.RESULTS.singular


def test_bordered_reports_singular():
    levels = _levels([1] * 10)
    rng = np.random.default_rng(4)
    solve = jax.jit(lambda A: lx.linear_solve(lx.MatrixLinearOperator(A), jnp.ones(10), Bordered(levels, 2, (0,)),
                                              throw=False).result)
    for row in (5, 0):  # an interior row (J_II singular), the border row (the Schur complement singular)
        A, _ = _structured(rng, levels, 2, (0,))
        A[row] = 0.0
        assert solve(jnp.asarray(A)) == lx.RESULTS.singular


def test_block_banded_never_materialises_the_matrix():
    """`init` reads the band through products with the operator: nothing of the dense matrix's size appears."""
    K, b = 60, 2
    levels = _levels([1] * K)

    def stencil(y):  # bandwidth 2
        pad = jnp.concatenate([jnp.zeros(2), y, jnp.zeros(2)])
        return 4.0 * y + pad[:-4] - pad[1:-3] + 0.5 * pad[3:-1] + 0.25 * pad[4:]

    def largest(solver):
        op = lx.FunctionLinearOperator(stencil, jax.ShapeDtypeStruct((K,), jnp.float64))
        jaxpr = jax.make_jaxpr(lambda: jax.tree_util.tree_leaves(solver.init(op, {})[0]))()
        return max(int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars)

    assert largest(BlockBanded(levels, b)) < K * K // 4
    assert largest(lx.LU()) >= K * K  # the check can fail
    x = lx.linear_solve(lx.FunctionLinearOperator(stencil, jax.ShapeDtypeStruct((K,), jnp.float64)), jnp.ones(K),
                        BlockBanded(levels, b)).value
    np.testing.assert_allclose(np.asarray(stencil(x)), np.ones(K), rtol=0, atol=1e-13)


def test_structured_solvers_refuse_bad_structures():
    with pytest.raises(ValueError, match="consecutive"):
        BlockBanded((0, 0, 2, 3), 1)
    with pytest.raises(ValueError, match="consecutive"):
        BlockBanded((1, 0), 1)
    with pytest.raises(ValueError, match="bandwidth"):
        BlockBanded((0, 1), -1)
    with pytest.raises(ValueError, match="border"):
        Bordered((0, 1, 2), 1, (3,))
    with pytest.raises(ValueError, match="distinct"):
        Bordered((0, 1, 2), 1, (1, 1))
    with pytest.raises(ValueError, match="BlockBanded"):
        Bordered((0, 1, 2), 1, ())
    with pytest.raises(ValueError, match="levels for 3 unknowns"):
        lx.linear_solve(lx.MatrixLinearOperator(jnp.eye(4)), jnp.ones(4), BlockBanded((0, 1, 2), 1))


def test_structure_solver_picks_each_branch():
    uniform = _levels([2] * 50)
    assert structure_solver(uniform, 1) == BlockTridiagonal(2)  # exactly today's solver
    assert structure_solver(uniform, 0) == BlockTridiagonal(2)
    assert structure_solver(_levels([2] * 2), 1) == BlockTridiagonal(2)  # whatever the size
    assert structure_solver(uniform, 4) == BlockBanded(uniform, 4)
    first_one = _levels([1] + [2] * 49)
    assert structure_solver(first_one, 1) == BlockBanded(first_one, 1)
    assert structure_solver(uniform, 2, (99, 0)) == Bordered(uniform, 2, (0, 99))
    assert isinstance(structure_solver(_levels([2] * 6), 4), lx.LU)  # two super-blocks: the band is the matrix
    assert isinstance(structure_solver(_levels([1] * 50), 1, tuple(range(0, 50, 5))), lx.LU)  # a border of 10/50
    assert isinstance(structure_solver(_levels([1] * 50), 1, tuple(range(0, 50, 10))), Bordered)  # 5/50


# --- sparsity classification ---------------------------------------------------------------------------------------


def _band_pattern(levels, bandwidth):
    return _allowed(levels, bandwidth)


@pytest.mark.parametrize("name, pattern, levels, expected", [
    ("diagonal", np.eye(9, dtype=bool), _levels([1] * 9), (0, ())),
    ("block diagonal", _band_pattern(_levels([2] * 6), 0), _levels([2] * 6), (0, ())),
    ("tridiagonal", _band_pattern(_levels([1] * 12), 1), _levels([1] * 12), (1, ())),
    ("block tridiagonal", _band_pattern(_levels([1] + [2] * 9), 1), _levels([1] + [2] * 9), (1, ())),
    ("banded 3", _band_pattern(_levels([1] * 20), 3), _levels([1] * 20), (3, ())),
    ("banded 2 + dense column", _allowed(_levels([1] * 20), 2) & ~np.eye(20, k=0, dtype=bool)[:, [5]].T.repeat(20, 0)
     | (np.arange(20) == 5)[None, :], _levels([1] * 20), (2, (5,))),
    ("arrowhead", np.eye(16, dtype=bool) | (np.arange(16) == 0)[None, :] | (np.arange(16) == 0)[:, None],
     _levels([1] * 16), (0, (0,))),
    ("tridiagonal + a total", _allowed(_levels([1] + [2] * 15), 1, (30,)), _levels([1] + [2] * 15), (1, (30,))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_classify_sparsity_hand_made(name, pattern, levels, expected):
    assert classify_sparsity(pattern, levels) == expected
    assert structure_violations(pattern, levels, *expected).shape == (0, 2)


def test_classify_sparsity_of_a_jacobian():
    """The pattern of `jax.jacfwd` of a batch-arrival-like drift (batches of up to 3 jobs) plus a total."""
    K = 30

    def f(y):
        x, total = y[:K], y[K]
        pad = jnp.concatenate([jnp.ones(3), x, jnp.zeros(1)])
        drift = sum(0.2 * (pad[3 - j:3 - j + K] ** 2 - x**2) for j in (1, 2, 3)) + pad[4:] - x
        return jnp.concatenate([drift - 0.1 * total * x, jnp.sum(x)[None] - total])

    y = jnp.asarray(np.random.default_rng(0).uniform(0.1, 0.9, K + 1))
    pattern = np.asarray(jax.jacfwd(f)(y)) != 0.0
    levels = tuple(range(K)) + (K - 1,)  # the total sits on the last level
    assert classify_sparsity(pattern, levels) == (3, (K,))


def test_classify_sparsity_takes_a_large_dense_pattern_as_dense():
    """Above 512 unknowns a pattern with a quarter of its entries nonzero is dense: its largest level distance and
    no border, at once (the greedy search would pass over its million nonzeros once per border unknown), which
    `structure_solver` solves by LU. Below, the same kind of pattern is searched: a border covers its dense rows."""
    for K, expect_border in ((300, False), (200, True)):
        levels = _levels([2] * K)
        n = len(levels)
        pattern = _allowed(levels, 1) | (np.arange(n) < n // 2)[:, None]  # half of the rows dense
        bandwidth, border = classify_sparsity(pattern, levels)
        assert structure_violations(pattern, levels, bandwidth, border).shape == (0, 2)
        assert bool(border) == expect_border
        if not expect_border:
            assert bandwidth == K - 1 and isinstance(structure_solver(levels, bandwidth, border), lx.LU)


@settings(max_examples=40, deadline=None)
@given(K=st.integers(3, 14), m=st.integers(1, 2), first_one=st.booleans(), bandwidth=st.integers(0, 4),
       n_border=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_classify_sparsity_always_covers(K, m, first_one, bandwidth, n_border, seed):
    rng = np.random.default_rng(seed)
    sizes = ([1] if first_one else [m]) + [m] * (K - 1)
    levels = _levels(sizes)
    n = len(levels)
    border = tuple(rng.choice(n, size=min(n_border, n), replace=False).tolist())
    pattern = _allowed(levels, bandwidth, border) & (rng.uniform(size=(n, n)) < 0.7)
    np.fill_diagonal(pattern, True)
    found_bandwidth, found_border = classify_sparsity(pattern, levels)
    assert structure_violations(pattern, levels, found_bandwidth, found_border).shape == (0, 2)
    # the bandwidth is the largest level distance of the nonzeros the border leaves
    if found_bandwidth > 0:
        assert structure_violations(pattern, levels, found_bandwidth - 1, found_border).size > 0
    assert found_border == tuple(sorted(set(found_border)))


def test_structure_violations_names_the_offending_entries():
    levels = _levels([1] * 6)
    pattern = _band_pattern(levels, 1)
    bad = structure_violations(pattern, levels, 0)
    assert bad.shape == (10, 2)
    assert tuple(bad[0]) == (0, 1)  # the first in row-major order
    assert np.all(np.abs(bad[:, 0] - bad[:, 1]) == 1)
    assert structure_violations(pattern, levels, 1).shape == (0, 2)
    pattern[0, 5] = True
    assert structure_violations(pattern, levels, 1).tolist() == [[0, 5]]
    assert structure_violations(pattern, levels, 1, border=(5,)).shape == (0, 2)
    with pytest.raises(ValueError, match=r"\(6, 6\)"):
        structure_violations(pattern[:5], levels, 1)
