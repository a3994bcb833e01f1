r"""Gradients through `solve_fixed_point`.

Strongest checks first (STYLE.md §7.5): the analytic derivative of the exponential closed form
$s_k = \rho^{(d^k-1)/(d-1)}$ and of Mitzenmacher's $E[T] = \sum_{i\ge1} \lambda^{(d^i-d)/(d-1)}$; then central finite
differences along tangents of every kind of model leaf (λ, the PH initial vector α, entries of T, choice-number
weights, a real d); then cross-checks between transformations (`vmap` of `grad`, `jacfwd` against `grad`, the
implicit adjoint against the unrolled one); and finite gradients near ρ → 1.

Finite differences of a nonlinear solve are only as good as the solve. Newton converges quadratically, so the
solve error after termination at `rtol=1e-12` is ~1e-15; central differences with ε = 1e-5·scale then carry a
truncation error ~ε² ≈ 1e-10 and a round-off error ~1e-15/ε ≈ 1e-10, four orders below the 1e-6 tolerance.
`_central_difference` checks that budget itself: the ε and ε/2 differences must agree to 1e-8.

Everything is jitted with `eqx.filter_jit` on module-level functions, so that each model structure compiles once
(the perturbed models of a finite difference share the structure of the base model).
"""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jsmkt


RTOL, ATOL = 1e-12, 1e-15  # solve tolerance for every check below
GRAD_RTOL = 1e-6  # acceptance tolerance against finite differences and closed forms


def _solve(model, **kwargs):
    return jsmkt.solve_fixed_point(model, rtol=RTOL, atol=ATOL, **kwargs)


# Metrics as functions of the model alone (module-level, so jit caches see the same function each time).


def sojourn(model):
    return jsmkt.mean_sojourn_time(model, _solve(model))


def queue(model):
    return jsmkt.mean_queue_length(model, _solve(model))


def tail2(model):
    return jsmkt.tails(model, _solve(model))[2]


METRICS = (sojourn, queue, tail2)


@eqx.filter_jit
def _values(model):
    fp = _solve(model)
    return jnp.stack([jsmkt.mean_sojourn_time(model, fp), jsmkt.mean_queue_length(model, fp),
                      jsmkt.tails(model, fp)[2]])


@eqx.filter_jit
def _model_grads(model):
    """`eqx.filter_grad` of each metric with respect to every array leaf of `model`."""
    return [eqx.filter_grad(metric)(model) for metric in METRICS]


def _central_difference(where, model, direction, scale=1.0):
    """Central differences of the metrics along `model → where(model) + ε·direction`, at ε and ε/2."""
    outs = []
    for eps in (1e-5 * scale, 0.5e-5 * scale):
        plus = eqx.tree_at(where, model, replace_fn=lambda x: x + eps * direction)
        minus = eqx.tree_at(where, model, replace_fn=lambda x: x - eps * direction)
        outs.append((_values(plus) - _values(minus)) / (2 * eps))
    fd, fd_half = map(np.asarray, outs)
    # The finite difference itself must be accurate far beyond GRAD_RTOL, or the check below means nothing.
    np.testing.assert_allclose(fd_half, fd, rtol=1e-8, atol=1e-12)
    return fd


def _assert_grad(grad, fd, atol=1e-12):
    grad, fd = np.asarray(grad), np.asarray(fd)
    assert np.all(np.isfinite(grad)), grad
    np.testing.assert_allclose(grad, fd, rtol=GRAD_RTOL, atol=atol)


# A dense order-3 PH (every T entry non-zero, so off-diagonal entries can move both ways), plus standard ones.
DENSE_ALPHA = np.array([0.5, 0.3, 0.2])
DENSE_T = np.array([[-3.0, 1.0, 0.5], [0.4, -2.0, 0.6], [0.2, 0.3, -1.5]])


DENSE_LAM = 0.75 / float(jsmkt.PH(DENSE_ALPHA, DENSE_T).mean)  # load 0.75


def _dense_model():
    return jsmkt.JSQdPH(DENSE_LAM, jsmkt.PH(DENSE_ALPHA, DENSE_T), d=2, K=24)


SERVICES = {
    "h2_scv4": (lambda: jsmkt.hyperexponential2(1.0, 4.0), 0.85, 40),
    "erlang2": (lambda: jsmkt.erlang(2), 0.85, 24),
    "dense3": (lambda: jsmkt.PH(DENSE_ALPHA, DENSE_T), DENSE_LAM, 24),
}


@eqx.filter_jit
def _lam_grads(lam, service, K):
    """`jax.grad` of each metric as a function of λ alone (λ is traced, so K must be given)."""
    fns = [lambda lam, metric=metric: metric(jsmkt.JSQdPH(lam, service, d=2, K=K)) for metric in METRICS]
    return jnp.stack([jax.grad(f)(lam) for f in fns])


# ---------------------------------------------------------------------------------------------------------------
# Closed forms (exponential service): s_k = rho^{(d^k - 1)/(d - 1)}, E[T] = (1/mu) sum_i rho^{(d^i - d)/(d - 1)}.


def _exponent(d, k):
    """(d^k - 1)/(d - 1) (= k for d = 1)."""
    return k if d == 1 else (d**k - 1) // (d - 1)


def _closed_form_dtails(rho, mu, d, ks):
    """d s_k / d lam, with rho = lam / mu."""
    return np.array([_exponent(d, k) * rho ** (_exponent(d, k) - 1) / mu for k in ks])


def _closed_form_dsojourn(lam, d, n_terms=400):
    """d/d lam of Mitzenmacher's E[T] = sum_{i>=1} lam^{e_i}, e_i = (d^i - d)/(d - 1), mu = 1."""
    total = 0.0
    for i in range(2, n_terms):  # the i = 1 term is lam^0 = 1
        e = _exponent(d, i) - 1
        term = e * lam ** (e - 1)
        total += term
        if e > 1 and term < 1e-300:
            break
    return total


def tails_at(model, k):
    return jsmkt.tails(model, _solve(model))[k]


@eqx.filter_jit
def _jsqd_grads(lam, d, K):
    def model(lam):
        return jsmkt.JSQd(lam, d=d, mu=1.0, K=K)

    dtails = [jax.grad(lambda lam, k=k: tails_at(model(lam), k))(lam) for k in (1, 2, 3)]
    return jnp.stack(dtails), jax.grad(lambda lam: sojourn(model(lam)))(lam)


@pytest.mark.parametrize("d, lam, K", [(1, 0.5, 64), (2, 0.5, 12), (2, 0.9, 16), (3, 0.9, 12), (2, 0.99, 24)])
def test_jsqd_closed_form(d, lam, K):
    dtails, dsojourn = _jsqd_grads(jnp.asarray(lam), d, K)
    _assert_grad(dtails, _closed_form_dtails(lam, 1.0, d, (1, 2, 3)))
    _assert_grad(dsojourn, _closed_form_dsojourn(lam, d))


@eqx.filter_jit
def _exp_ph_dtails(lam, mu, d, K):
    service = jsmkt.exponential(mu)

    def tails(lam):
        model = jsmkt.JSQdPH(lam, service, d=d, K=K)
        return jsmkt.tails(model, _solve(model))

    return jax.jacfwd(tails)(lam)


@pytest.mark.parametrize("d", [2, 3])
def test_jsqdph_exponential_closed_form(d):
    """The PH model with one phase (rate mu = 2) reproduces the closed-form derivative in lam."""
    lam, mu = 1.5, 2.0
    dtails = _exp_ph_dtails(jnp.asarray(lam), jnp.asarray(mu), d, 16)
    _assert_grad(dtails[1:5], _closed_form_dtails(lam / mu, mu, d, (1, 2, 3, 4)))


# ---------------------------------------------------------------------------------------------------------------
# Finite differences along tangents of each kind of leaf.


@pytest.mark.parametrize("name", list(SERVICES))
def test_grad_lam_matches_fd(name):
    make_service, lam, K = SERVICES[name]
    service = make_service()
    model = jsmkt.JSQdPH(lam, service, d=2, K=K)
    assert float(_solve(model).tail_mass) < 1e-12
    grads = _lam_grads(jnp.asarray(lam), service, K)
    fd = _central_difference(lambda m: m.lam, model, 1.0)
    _assert_grad(grads, fd)


# Tangents of the PH leaves of the dense model: (where, direction, what it changes).
E = np.eye(3)
PH_TANGENTS = {
    "lam": (lambda m: m.lam, np.asarray(1.0)),
    "alpha_0_minus_1": (lambda m: m.service.alpha, E[0] - E[1]),  # keeps sum(alpha) = 1
    "alpha_2_minus_1": (lambda m: m.service.alpha, E[2] - E[1]),
    "T01_offdiag": (lambda m: m.service.T, np.outer(E[0], E[1]) - np.outer(E[0], E[0])),  # exit rate unchanged
    "T20_offdiag": (lambda m: m.service.T, np.outer(E[2], E[0]) - np.outer(E[2], E[2])),
    "T11_exit_rate": (lambda m: m.service.T, -np.outer(E[1], E[1])),  # diagonal alone: raises phase 1's exit rate
    "T_random_generator": (lambda m: m.service.T, np.array([[-0.3, 0.1, 0.2], [0.5, -0.7, 0.2], [0.0, 0.4, -0.4]])),
}


@pytest.mark.parametrize("name", list(PH_TANGENTS))
def test_filter_grad_ph_leaves_match_fd(name):
    where, direction = PH_TANGENTS[name]
    model = _dense_model()
    grads = _model_grads(model)
    directional = [np.sum(np.asarray(where(g)) * direction) for g in grads]
    fd = _central_difference(where, model, direction)
    _assert_grad(directional, fd)


MIXED_TANGENTS = {"1_minus_2": np.array([1.0, -1.0, 0.0]), "curvature": np.array([1.0, -2.0, 1.0])}


@pytest.mark.parametrize("name", list(MIXED_TANGENTS))
def test_filter_grad_mixed_choice_weights_match_fd(name):
    direction = MIXED_TANGENTS[name]
    model = jsmkt.JSQdPH(0.85, jsmkt.hyperexponential2(1.0, 4.0), d=jnp.array([0.2, 0.5, 0.3]), K=48)
    assert isinstance(model.choice, jsmkt.MixedChoice)
    assert float(_solve(model).tail_mass) < 1e-12
    grads = _model_grads(model)
    directional = [np.sum(np.asarray(g.choice.probs) * direction) for g in grads]
    fd = _central_difference(lambda m: m.choice.probs, model, direction)
    _assert_grad(directional, fd)


@eqx.filter_jit
def _d_grads(d, service, lam, K):
    return jnp.stack([jax.grad(lambda d, metric=metric: metric(jsmkt.JSQdPH(lam, service, d=d, d_max=3, K=K)))(d)
                      for metric in METRICS])


@pytest.mark.parametrize("d", [2.3, 2.7])
def test_grad_real_d_matches_fd(d):
    """A real d (InterpolatedChoice), away from integers where the mean field is smooth in d."""
    service, lam, K = jsmkt.hyperexponential2(1.0, 4.0), 0.85, 48
    model = jsmkt.JSQdPH(lam, service, d=d, d_max=3, K=K)
    assert isinstance(model.choice, jsmkt.InterpolatedChoice)
    grads = _d_grads(jnp.asarray(d), service, lam, K)
    fd = _central_difference(lambda m: m.choice.d, model, 1.0)
    _assert_grad(grads, fd)


# ---------------------------------------------------------------------------------------------------------------
# Transformations and adjoints.


H2 = jsmkt.hyperexponential2(1.0, 4.0)


def _h2_sojourn(lam, adjoint=optx.ImplicitAdjoint(), K=40, throw=True):
    model = jsmkt.JSQdPH(lam, H2, d=2, K=K)
    fp = jsmkt.solve_fixed_point(model, rtol=RTOL, atol=ATOL, adjoint=adjoint, throw=throw)
    return jsmkt.mean_sojourn_time(model, fp)


_h2_grad = jax.jit(jax.grad(_h2_sojourn))  # shared by the tests below: compiled once


@pytest.mark.parametrize("throw", [True, False])
def test_vmap_of_grad_equals_per_element_grad(throw):
    lams = jnp.linspace(0.3, 0.95, 5)
    batched = jax.jit(jax.vmap(jax.grad(lambda lam: _h2_sojourn(lam, throw=throw))))(lams)
    looped = jnp.stack([_h2_grad(lam) for lam in lams])
    assert np.all(np.isfinite(batched))
    np.testing.assert_allclose(batched, looped, rtol=1e-10, atol=0)


def test_jacfwd_agrees_with_grad():
    lam = jnp.asarray(0.8)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(_h2_sojourn))(lam), _h2_grad(lam), rtol=1e-10)


def test_recursive_checkpoint_adjoint_agrees_with_implicit():
    """Differentiating through the unrolled Newton iterations gives the implicit-function gradient."""
    lam = jnp.asarray(0.9)
    unrolled = jax.jit(jax.grad(lambda lam: _h2_sojourn(lam, adjoint=optx.RecursiveCheckpointAdjoint())))(lam)
    np.testing.assert_allclose(unrolled, _h2_grad(lam), rtol=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# Edges.


def test_no_nan_gradients_near_rho_one():
    """lam = 0.99 with H2 service (SCV 4), gradients w.r.t. every model leaf are finite and lam's matches FD."""
    model = jsmkt.JSQdPH(0.99, H2, d=2, K=48)
    assert float(_solve(model).tail_mass) < 1e-12
    grads = _model_grads(model)
    for g in grads:
        for leaf in jax.tree_util.tree_leaves(g):
            assert np.all(np.isfinite(np.asarray(leaf)))
    fd = _central_difference(lambda m: m.lam, model, 1.0, scale=0.1)
    _assert_grad([g.lam for g in grads], fd)
    # Sanity: E[T] is steep here (a few hundred per unit of lam) but finite.
    assert 1.0 < float(grads[0].lam) < 1e4


def test_interpolated_choice_weights_derivative_stays_on_simplex():
    # At d = d_max the derivative is the left one; everywhere the weights' tangent sums to zero.
    for d, d_max in [(3.0, 3), (2.0, 3), (2.5, 3), (1.0, 4)]:
        t = jax.jacfwd(lambda x: jsmkt.InterpolatedChoice(x, d_max=d_max).weights())(jnp.asarray(d))
        assert abs(float(jnp.sum(t))) < 1e-15
        assert abs(float(jnp.arange(1, d_max + 1, dtype=float) @ t) - 1.0) < 1e-15  # d E[D] / d d = 1


# Failed entries of a batch (throw=False) and the limit of float64 near saturation.


def _jsqd_queue(lam, throw):
    model = jsmkt.JSQd(lam, d=2, K=40)
    return jsmkt.mean_queue_length(model, jsmkt.solve_fixed_point(model, throw=throw))


def test_throw_false_batch_with_an_unstable_entry_keeps_the_others_gradients():
    """One unstable lam in a vmapped batch: the other entries' derivatives are the closed form's (forward and
    reverse mode), the bad entry's are NaN, and its `result` says why; nothing raises."""
    lams = jnp.array([0.5, 0.9, 1.2])
    f = ft.partial(_jsqd_queue, throw=False)
    exact = [sum((2**k - 1) * lam ** (2**k - 2) for k in range(1, 12)) for lam in (0.5, 0.9)]
    for grads in (jax.vmap(jax.grad(f))(lams), jax.vmap(jax.jacfwd(f))(lams),
                  jax.vmap(lambda lam: jax.jvp(f, (lam,), (1.0,))[1])(lams)):
        _assert_grad(grads[:2], exact)
        assert np.isnan(grads[2])
    unstable = jax.vmap(
        lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=40), throw=False).result == jsmkt.RESULTS.unstable
    )(lams)
    assert unstable.tolist() == [False, False, True]


def test_saturation_converges_under_jit_and_grad():
    """1 - rho = 1e-7: rounding keeps Newton's steps above rtol after the residual is at float64's floor; the
    iterate counts as converged (eagerly, under jit and under grad), against the closed form of JSQ(2)."""
    lam = 1.0 - 1e-7
    closed = sum(lam ** (2**k - 1) for k in range(1, 40))
    dclosed = sum((2**k - 1) * lam ** (2**k - 2) for k in range(1, 40))
    f = ft.partial(_jsqd_queue, throw=True)
    assert float(f(lam)) == pytest.approx(closed, rel=1e-9)
    assert float(jax.jit(f)(lam)) == pytest.approx(closed, rel=1e-9)
    assert float(jax.jit(jax.grad(f))(lam)) == pytest.approx(dclosed, rel=1e-6)


@pytest.mark.parametrize(
    "loss",
    [
        # Metrics linear in the state: their reverse pass never reads the checked value itself.
        lambda lam: jsmkt.mean_queue_length(m := jsmkt.JSQd(lam, d=1, K=40), jsmkt.solve_fixed_point(m)),
        lambda lam: jsmkt.utilisation(m := jsmkt.JSQd(lam, d=1, K=40), jsmkt.solve_fixed_point(m)),
        lambda lam: jnp.sum(jsmkt.integrate(jsmkt.JSQd(lam, d=2, K=20), 10.0, max_steps=2).ys),
        lambda lam: jnp.sum(jsmkt.steady_state(jsmkt.JSQd(lam, d=2, K=20), max_steps=3)[0]),
        lambda lam: jsmkt.published.exponential_sojourn_time(lam, 2, terms=2),
    ],
    ids=["truncation-mean_queue_length", "truncation-utilisation", "integrate", "steady_state", "published"],
)
def test_jit_of_grad_keeps_the_failure_checks(loss):
    """Regression: under `jit(grad(...))` a failed solve (truncation level too small: the fraction of servers at
    K = 40 is 0.9^40 = 0.015; an integration or steady state cut short; a series cut short) returned a gradient
    (74.48 for E[Q], 0.951 for the utilisation, whose true derivative is 1), because `jit` dropped the check on a
    value that the reverse pass does not read."""
    with jax.numpy_dtype_promotion("standard"):  # diffrax's implicit adjoint multiplies float t by an int
        with pytest.raises((ValueError, RuntimeError), match="K is too small|did not reach|leaves out"):
            jax.block_until_ready(jax.jit(jax.grad(loss))(0.9))


def test_grad_of_steady_state():
    """Regression: `jax.grad` through `steady_state` failed ('No constant handler for type DynamicJaxprTracer').
    Exponential JSQ(2): s_k = lam^(2^k - 1), so d/dlam sum_k s_k = sum_k (2^k - 1) lam^(2^k - 2)."""
    lam, K = 0.7, 20
    expected = sum((2**k - 1) * lam ** (2**k - 2) for k in range(1, K + 1))
    loss = lambda x: jnp.sum(jsmkt.steady_state(jsmkt.JSQd(x, d=2, K=K))[0])  # noqa: E731
    with jax.numpy_dtype_promotion("standard"):  # diffrax's implicit adjoint multiplies float t by an int
        assert float(jax.grad(loss)(lam)) == pytest.approx(expected, rel=1e-7)
        assert float(jax.jit(jax.grad(loss))(lam)) == pytest.approx(expected, rel=1e-7)


def test_real_d_with_d_max_1_has_zero_derivative():
    """Regression: with d_max = 1 the only law is D = 1, yet the weights' tangent was [-1] and d E[Q]/dd = -2.0."""
    def loss(d):
        model = jsmkt.JSQd(0.5, d=d, d_max=1)
        return jsmkt.mean_queue_length(model, jsmkt.solve_fixed_point(model))

    assert float(loss(1.0)) == pytest.approx(1.0, rel=1e-12)  # M/M/1 at rho = 1/2
    assert float(jax.grad(loss)(1.0)) == 0.0
    np.testing.assert_array_equal(jax.jacfwd(lambda d: jsmkt.InterpolatedChoice(d, d_max=1).weights())(1.0), [0.0])


def test_checked_values_keep_their_derivatives():
    """The checks that guard derivatives (`jsmkt._errors.error_if`) leave them unchanged: float32 stays float32
    under `jit(grad)` (it failed: the factor promoted the tangent to float64), and an infinite tangent stays
    infinite (t + 0 * inf was NaN)."""
    from jsmkt._errors import error_if

    f = lambda lam: jsmkt.published.exponential_sojourn_time(lam, 1)  # noqa: E731  1/(1 - lam)
    with jax.numpy_dtype_promotion("standard"):  # float32 lam meets float64 mu
        g = jax.jit(jax.grad(f))(jnp.float32(0.5))
    assert g.dtype == jnp.float32 and float(g) == pytest.approx(4.0, rel=1e-6)
    _, t = jax.jvp(lambda x: error_if(x, x < 0, "x < 0"), (1.0,), (jnp.inf,))
    assert float(t) == np.inf
