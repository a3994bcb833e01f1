r"""The `PH` class and its constructors.

Moments are checked against closed forms (Erlang, exponential mixtures, a two-phase Coxian written as $X_1 + BX_2$),
never against the implementation's $n!\,\alpha(-T)^{-n}\mathbf 1$; CDFs and PDFs against `scipy.stats`; the
stationary vector against its defining equation; samples against the exact mean, variance and CDF; gradients
against central finite differences.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import jsmkt


# A general PH: three phases, transitions back and forth, mass on every phase, exits from every phase.
CYCLIC_ALPHA = np.array([0.5, 0.3, 0.2])
CYCLIC_T = np.array([[-3.0, 1.0, 1.0], [0.5, -2.0, 0.5], [0.2, 0.3, -1.0]])


def _zoo():
    return {
        "exponential": jsmkt.exponential(2.0),
        "erlang3": jsmkt.erlang(3, 2.0),
        "hyperexp": jsmkt.hyperexponential([0.3, 0.7], [0.5, 3.0]),
        "hyperexp2": jsmkt.hyperexponential2(1.0, 4.0),
        "coxian2": jsmkt.coxian2(1.0, 2.0),
        "coxian3": jsmkt.coxian([2.0, 1.0, 4.0], [0.5, 0.9]),
        "fitted": jsmkt.fit_ph2_three_moments(1.0, 1.7, 4.1),
        "cyclic": jsmkt.PH(CYCLIC_ALPHA, CYCLIC_T),
    }


ZOO = _zoo()


@pytest.fixture(params=list(ZOO), ids=list(ZOO))
def ph(request):
    return ZOO[request.param]


# --- Moments against closed forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("mean", [0.5, 2.0])
def test_erlang_moments(k, mean):
    S = jsmkt.erlang(k, mean)
    r = k / mean
    for n in range(1, 5):
        expected = math.gamma(k + n) / (math.gamma(k) * r**n)
        assert float(S.moment(n)) == pytest.approx(expected, rel=1e-12)
    assert float(S.mean) == pytest.approx(mean, rel=1e-14)
    assert float(S.rate) == pytest.approx(1 / mean, rel=1e-14)
    assert float(S.scv) == pytest.approx(1 / k, rel=1e-12)
    assert float(S.variance) == pytest.approx(mean**2 / k, rel=1e-12)
    assert S.order == k


def test_exponential_moments():
    S = jsmkt.exponential(2.5)
    np.testing.assert_allclose(S.moments(4), [math.factorial(n) / 2.5**n for n in range(1, 5)], rtol=1e-14)
    assert float(S.scv) == pytest.approx(1.0, rel=1e-14)


def test_hyperexponential_moments():
    p, lam = np.array([0.2, 0.5, 0.3]), np.array([0.5, 2.0, 7.0])
    S = jsmkt.hyperexponential(p, lam)
    for n in range(1, 5):
        assert float(S.moment(n)) == pytest.approx(np.sum(p * math.factorial(n) / lam**n), rel=1e-13)


@pytest.mark.parametrize("mean, scv", [(1.0, 4.0), (2.0, 1.5), (0.3, 20.0), (1.0, 1.0 + 1e-12), (1.0, 1e12),
                                       (2.0, 1e15), (1.0, 1e17), (0.5, 1e100)])
def test_hyperexponential2(mean, scv):
    """Also for huge SCVs, where p2 = (1 - sqrt((c^2-1)/(c^2+1)))/2 cancels (regression: SCV 1e15 came out 12 %
    too large, 1e17 was refused)."""
    S = jsmkt.hyperexponential2(mean, scv)
    assert float(S.mean) == pytest.approx(mean, rel=1e-13)
    assert float(S.scv) == pytest.approx(scv, rel=1e-12)
    assert float(S.moment(2)) == pytest.approx(mean**2 * (1 + scv), rel=1e-12)
    p, lam = np.asarray(S.alpha), -np.diagonal(np.asarray(S.T))
    assert p[0] / lam[0] == pytest.approx(p[1] / lam[1], rel=1e-13)  # balanced means
    np.testing.assert_array_equal(np.asarray(S.T), np.diag(-lam))


@pytest.mark.parametrize("mean", [1.0, 2.5])
def test_hyperexponential2_at_scv_one_is_the_exponential(mean):
    S = jsmkt.hyperexponential2(mean, 1.0)
    x = np.array([0.0, 0.3, 1.0, 4.0])
    np.testing.assert_allclose(S.cdf(x), 1 - np.exp(-x / mean), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(S.moments(4), [math.factorial(n) * mean**n for n in range(1, 5)], rtol=1e-13)


def _one_sided_derivative(f, x, h):
    """Second-order forward difference (-3 f(x) + 4 f(x+h) - f(x+2h)) / 2h."""
    return (-3 * f(x) + 4 * f(x + h) - f(x + 2 * h)) / (2 * h)


@pytest.mark.parametrize("mean", [1.0, 2.0])
def test_hyperexponential2_derivative_at_scv_one(mean):
    """E[S^2] = m^2 (1 + c^2) and E[S^3] = 3 m^3 c^2 (1 + c^2) for the balanced H2: finite derivatives at c^2 = 1,
    although the balanced rates vary as sqrt(c^2 - 1) (regression: jax.grad gave NaN)."""
    m2 = lambda c: jsmkt.hyperexponential2(mean, c).moment(2)  # noqa: E731
    m3 = lambda c: jsmkt.hyperexponential2(mean, c).moment(3)  # noqa: E731
    assert float(jax.grad(m2)(1.0)) == pytest.approx(mean**2, rel=1e-12)
    assert float(jax.grad(m3)(1.0)) == pytest.approx(9 * mean**3, rel=1e-12)
    assert float(jax.jit(jax.grad(m3))(1.0)) == pytest.approx(9 * mean**3, rel=1e-12)
    assert float(_one_sided_derivative(m3, 1.0, 1e-5)) == pytest.approx(9 * mean**3, rel=1e-8)
    # vmap over c across 1, and the derivative with respect to the mean there.
    c = jnp.array([1.0, 1.0 + 1e-9, 1.5, 4.0])
    np.testing.assert_allclose(jax.vmap(jax.grad(m3))(c), 3 * (2 * c + 1) * mean**3, rtol=1e-6)
    dm = jax.grad(lambda m: jsmkt.hyperexponential2(m, 1.0).moment(2))(mean)
    assert float(dm) == pytest.approx(4 * mean, rel=1e-12)
    # Second derivative: d^2 E[S^3]/dc^2 = 6 m^3.
    assert float(jax.grad(jax.grad(m3))(1.0)) == pytest.approx(6 * mean**3, rel=1e-10)


def test_hyperexponential2_metric_derivative_at_scv_one():
    """d E[T]/d c^2 through the mean-field model at c^2 = 1 equals the one-sided finite difference (0.6173)."""

    def sojourn(c):
        model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, c), d=2, K=80)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    g = float(jax.grad(sojourn)(1.0))
    assert math.isfinite(g)
    assert g == pytest.approx(float(_one_sided_derivative(sojourn, 1.0, 1e-4)), rel=1e-6)
    assert g == pytest.approx(0.61729, abs=1e-5)


def _coxian2_moments(mu1, mu2, p):
    """E[S], E[S^2] of S = X1 + B X2, X_i ~ Exp(mu_i), B ~ Bernoulli(p), all independent."""
    m1 = 1 / mu1 + p / mu2
    m2 = 2 / mu1**2 + p * (2 / (mu1 * mu2) + 2 / mu2**2)
    return m1, m2


@pytest.mark.parametrize("mean, scv", [(1.0, 2.0), (3.0, 0.5), (0.5, 0.8), (1.0, 10.0)])
def test_coxian2(mean, scv):
    """Marie's parametrisation as the docstring states it: mu1 = 2/m, p = 1/(2c^2), mu2 = 1/(m c^2)."""
    S = jsmkt.coxian2(mean, scv)
    mu1, p, mu2 = 2 / mean, 1 / (2 * scv), 1 / (mean * scv)
    np.testing.assert_allclose(S.T, [[-mu1, p * mu1], [0.0, -mu2]], rtol=1e-14)
    np.testing.assert_array_equal(S.alpha, [1.0, 0.0])
    m1, m2 = _coxian2_moments(mu1, mu2, p)
    assert (m1, m2 / m1**2 - 1) == pytest.approx((mean, scv), rel=1e-12)
    assert float(S.mean) == pytest.approx(mean, rel=1e-13)
    assert float(S.scv) == pytest.approx(scv, rel=1e-12)


def test_coxian_moments():
    mu1, mu2, p = 2.0, 0.7, 0.35
    S = jsmkt.coxian([mu1, mu2], [p])
    m1, m2 = _coxian2_moments(mu1, mu2, p)
    np.testing.assert_allclose(S.moments(2), [m1, m2], rtol=1e-13)


def test_named_examples():
    S = jsmkt.hyperexponential2(1, 4)
    assert (float(S.mean), float(S.scv)) == pytest.approx((1.0, 4.0), rel=1e-12)
    S = jsmkt.coxian2(1, 2)
    assert (float(S.mean), float(S.scv)) == pytest.approx((1.0, 2.0), rel=1e-12)


def test_moment_order_must_be_positive_integer():
    S = jsmkt.erlang(2)
    for n in [0, -1, 1.5, float("nan"), float("inf"), "a", "2", None]:
        with pytest.raises(ValueError, match=f"n={re.escape(repr(n))} must be a positive integer"):
            S.moment(n)
        with pytest.raises(ValueError, match=f"n={re.escape(repr(n))} must be a positive integer"):
            S.moments(n)
    assert float(S.moment(np.int64(2))) == pytest.approx(1.5, rel=1e-14)  # E[S^2] = k(k+1)/r^2
    assert float(S.moment(2.0)) == pytest.approx(1.5, rel=1e-14)
    for n in [171, 1e300]:  # n! overflows float64 beyond 170 (1e300 looped for ever)
        with pytest.raises(ValueError, match=r"n=.* exceeds 170: n! overflows float64"):
            S.moment(n)
        with pytest.raises(ValueError, match=r"n=.* exceeds 170: n! overflows float64"):
            S.moments(n)
    # E[S^n] = n! for exponential(1): finite up to n = 170.
    assert float(jsmkt.exponential(1.0).moment(170)) == pytest.approx(math.factorial(170), rel=1e-12)


# --- CDF and PDF ---------------------------------------------------------------------------------------------------

X = np.array([0.0, 0.05, 0.3, 1.0, 2.5, 7.0])


@pytest.mark.parametrize("k, mean", [(1, 1.0), (2, 1.0), (3, 3.0)])
def test_erlang_cdf_pdf(k, mean):
    S = jsmkt.erlang(k, mean)
    ref = scipy.stats.gamma(a=k, scale=mean / k)
    np.testing.assert_allclose(S.cdf(X), ref.cdf(X), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(S.pdf(X), ref.pdf(X), rtol=1e-10, atol=1e-14)


def test_exponential_mixture_cdf_pdf():
    p, lam = np.array([0.2, 0.5, 0.3]), np.array([0.5, 2.0, 7.0])
    S = jsmkt.hyperexponential(p, lam)
    cdf = sum(pi * scipy.stats.expon(scale=1 / li).cdf(X) for pi, li in zip(p, lam))
    pdf = sum(pi * scipy.stats.expon(scale=1 / li).pdf(X) for pi, li in zip(p, lam))
    np.testing.assert_allclose(S.cdf(X), cdf, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(S.pdf(X), pdf, rtol=1e-10)


def test_hypoexponential_cdf():
    """Coxian with p = 1 and rates a != b: 1 - (b e^{-ax} - a e^{-bx})/(b - a)."""
    a, b = 1.0, 3.0
    S = jsmkt.coxian([a, b], [1.0])
    np.testing.assert_allclose(S.cdf(X), 1 - (b * np.exp(-a * X) - a * np.exp(-b * X)) / (b - a), atol=1e-14)


def test_cdf_pdf_outside_support(ph):
    x = jnp.array([-1.0, -0.5, 0.0, 200.0, 500.0, 1e-300])
    F, f = np.asarray(ph.cdf(x)), np.asarray(ph.pdf(x))
    assert F[0] == F[1] == f[0] == f[1] == 0.0
    np.testing.assert_allclose(F[[2, 5]], 0.0, atol=1e-15)
    np.testing.assert_allclose(F[3:5], 1.0, atol=1e-12)


def test_cdf_pdf_at_large_and_infinite_x(ph):
    """Regression: e^{Tx} overflowed in scaling and squaring (NaN from x ~ 1e5 on)."""
    x = jnp.array([1e5, 3e5, 1e6, 1e300, jnp.inf])
    np.testing.assert_array_equal(ph.cdf(x), 1.0)
    np.testing.assert_array_equal(ph.pdf(x), 0.0)
    assert float(jax.grad(ph.cdf)(jnp.inf)) == 0.0
    assert np.isnan(ph.cdf(jnp.nan)) and np.isnan(ph.pdf(jnp.nan))


def test_exponential_erlang_cdf_at_large_x():
    x = np.array([30.0, 700.0, 1e6])
    np.testing.assert_allclose(jsmkt.exponential(1.0).cdf(x), 1 - np.exp(-x), rtol=1e-14)
    np.testing.assert_allclose(jsmkt.exponential(1.0).pdf(x), np.exp(-x), rtol=1e-10, atol=1e-300)
    # Erlang-2 with rate 2: P(S > x) = e^{-2x} (1 + 2x).
    np.testing.assert_allclose(jsmkt.erlang(2).cdf(x), 1 - np.exp(-2 * x) * (1 + 2 * x), rtol=1e-14)
    np.testing.assert_array_equal(jsmkt.erlang(2).cdf(np.array([3e5, np.inf])), 1.0)


def test_stiff_cdf_at_large_x():
    """Rates 1e3 and 1e-4: at x = 1e4, |T| x = 1e7 is far beyond 16 squarings, yet the slow phase survives."""
    x = np.array([1.0, 1e3, 1e4, 5e4, 3e5])
    p, lam = np.array([0.5, 0.5]), np.array([1e3, 1e-4])
    S = jsmkt.hyperexponential(p, lam)
    surv = p[0] * np.exp(-lam[0] * x) + p[1] * np.exp(-lam[1] * x)
    np.testing.assert_allclose(S.cdf(x), 1 - surv, rtol=1e-9)  # ~25 squarings, each doubling rounding
    np.testing.assert_allclose(S.pdf(x), p[1] * lam[1] * np.exp(-lam[1] * x), rtol=1e-8)
    # Hypoexponential a = 1e3, b = 1e-3: 1 - (b e^{-ax} - a e^{-bx})/(b - a).
    a, b = 1e3, 1e-3
    H = jsmkt.coxian([a, b], [1.0])
    np.testing.assert_allclose(H.cdf(x), 1 - (b * np.exp(-a * x) - a * np.exp(-b * x)) / (b - a), rtol=1e-9)
    # The same inside jit (T traced) and under grad (the density).
    F = jax.jit(lambda T, t: jsmkt.PH(jnp.array([0.5, 0.5]), T).cdf(t))(S.T, jnp.asarray(x))
    np.testing.assert_allclose(F, 1 - surv, rtol=1e-9)
    np.testing.assert_allclose(jax.vmap(jax.grad(S.cdf))(jnp.asarray(x[1:])), S.pdf(x[1:]), rtol=1e-9)


def test_cdf_pdf_shapes():
    S = ZOO["coxian2"]
    F = S.cdf(jnp.full((2, 3), 0.7))
    assert F.shape == (2, 3) and S.pdf(0.7).shape == ()
    np.testing.assert_allclose(F, float(S.cdf(jnp.full(6, 0.7))[0]), rtol=1e-14)


def test_pdf_is_derivative_of_cdf(ph):
    x = jnp.array([0.2, 0.7, 1.5, 3.0, 4.0, 6.0])
    h = 1e-5
    fd = (ph.cdf(x + h) - ph.cdf(x - h)) / (2 * h)
    np.testing.assert_allclose(ph.pdf(x), fd, rtol=1e-7, atol=1e-10)


# --- Stationary vector ---------------------------------------------------------------------------------------------


def test_stationary_vector(ph):
    omega = np.asarray(ph.stationary_vector)
    alpha, T = np.asarray(ph.alpha), np.asarray(ph.T)
    generator = T + np.outer(-T.sum(axis=1), alpha)
    np.testing.assert_allclose(omega @ generator, 0.0, atol=1e-12)
    assert omega.sum() == pytest.approx(1.0, abs=1e-14)
    assert np.all(omega >= 0)


def test_stationary_vector_closed_forms():
    np.testing.assert_allclose(jsmkt.erlang(4, 2.0).stationary_vector, np.full(4, 0.25), rtol=1e-13)
    p, lam = np.array([0.2, 0.5, 0.3]), np.array([0.5, 2.0, 7.0])
    np.testing.assert_allclose(
        jsmkt.hyperexponential(p, lam).stationary_vector, (p / lam) / np.sum(p / lam), rtol=1e-13
    )


# --- Sampling ------------------------------------------------------------------------------------------------------

N_SAMPLES = 4000


@pytest.mark.parametrize("name", ["erlang3", "hyperexp2", "coxian3", "cyclic"])
def test_sample_statistics(name, getkey):
    """Mean and variance within 4 standard errors of the exact values, and a KS test against the CDF."""
    S = ZOO[name]
    m = [float(S.moment(n)) for n in range(1, 5)]
    mean, var = m[0], m[1] - m[0] ** 2
    mu4 = m[3] - 4 * m[0] * m[2] + 6 * m[0] ** 2 * m[1] - 3 * m[0] ** 4  # central fourth moment
    for _ in range(2):
        x = np.asarray(S.sample(getkey(), (N_SAMPLES,)))
        assert x.shape == (N_SAMPLES,) and np.all(x > 0)
        assert abs(x.mean() - mean) < 4 * math.sqrt(var / N_SAMPLES)
        assert abs(x.var(ddof=1) - var) < 4 * math.sqrt((mu4 - var**2) / N_SAMPLES)
        p = scipy.stats.kstest(x, lambda t: np.asarray(S.cdf(jnp.asarray(t)))).pvalue
        assert p > 1e-4


def test_sample_keys_and_shapes(getkey):
    S = ZOO["coxian2"]
    key = getkey()
    a = S.sample(key, (2, 3))
    assert a.shape == (2, 3)
    np.testing.assert_array_equal(a, S.sample(key, (2, 3)))
    assert not np.array_equal(a, S.sample(getkey(), (2, 3)))
    assert S.sample(key).shape == ()
    # An integer shape (regression: TypeError 'int' object is not iterable).
    np.testing.assert_array_equal(S.sample(key, 5), S.sample(key, (5,)))
    assert S.sample(key, np.int64(3)).shape == (3,) and S.sample(key, 0).shape == (0,)
    for bad in [-1, 2.5, (2, -1), (2.0,), "5", None]:
        with pytest.raises(ValueError, match=rf"shape={re.escape(repr(bad))} must be a non-negative integer"):
            S.sample(key, bad)


# --- Validation ----------------------------------------------------------------------------------------------------

T2 = np.array([[-2.0, 1.0], [0.0, -1.0]])


@pytest.mark.parametrize(
    "alpha, T, match",
    [
        ([-0.5, 1.5], T2, r"alpha\[0\]=.*-0\.5.* is negative"),
        ([0.5, 0.4], T2, r"alpha sums to 0\.9.*not 1"),
        ([0.5, 0.5], [[0.0, 0.0], [0.0, -1.0]], r"T\[0,0\]=.*0\.0.* must be negative"),
        ([0.5, 0.5], [[-1.0, 0.0], [0.0, 2.0]], r"T\[1,1\]=.*2\.0.* must be negative"),
        ([0.5, 0.5], [[-1.0, -0.5], [0.0, -1.0]], r"T\[0,1\]=.*-0\.5.* is negative"),
        ([0.5, 0.5], [[-1.0, 0.0], [1.5, -1.0]], r"row 1 of T sums to 0\.5.* > 0"),
        ([1.0, 0.0, 0.0], [[-1.0, 1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 0.0, -1.0]],
         r"phase 0 of T never reaches the absorbing state"),
        ([0.0, 0.0, 1.0], [[-1.0, 0.5, 0.5], [0.0, -1.0, 1.0], [0.0, 1.0, -1.0]],
         r"phase 0 of T never reaches the absorbing state"),
        ([0.5, 0.5], np.eye(3) * -1.0, r"T has shape \(3, 3\) but alpha has 2 phase\(s\); T must be \(2, 2\)"),
        ([0.5, 0.5], [[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]], r"T has shape \(2, 3\) but alpha has 2 phase"),
        ([[1.0]], [[-1.0]], r"alpha must have 1 dimension"),
        ([1.0], [-1.0], r"T must have 2 dimension"),
        (np.zeros(0), np.zeros((0, 0)), r"alpha is empty"),
        ([float("nan"), 1.0], T2, r"alpha=.* has non-finite entries"),
        ([1.0, 0.0], [[-1.0, float("inf")], [0.0, -1.0]], r"T=.* has non-finite entries"),
    ],
)
def test_ph_validation_errors(alpha, T, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.PH(alpha, T)


@pytest.mark.parametrize("scale", [1e-12, 1.0, 1e12])
def test_validation_is_scale_free(scale):
    """Rates carry the time unit: validity must not depend on it (regression: absolute tolerances)."""
    S = jsmkt.PH(CYCLIC_ALPHA, CYCLIC_T * scale)
    assert float(S.mean) == pytest.approx(float(ZOO["cyclic"].mean) / scale, rel=1e-12)
    assert float(jsmkt.exponential(scale).mean) == pytest.approx(1 / scale, rel=1e-14)
    with pytest.raises(ValueError, match="row 1 of T sums"):
        jsmkt.PH([0.5, 0.5], np.array([[-1.0, 0.0], [1.5, -1.0]]) * scale)
    with pytest.raises(ValueError, match=r"T\[0,1\]=.* is negative"):
        jsmkt.PH([0.5, 0.5], np.array([[-1.0, -0.5], [0.0, -1.0]]) * scale)
    with pytest.raises(ValueError, match="never reaches the absorbing state"):
        jsmkt.PH([1.0, 0.0], np.array([[-1.0, 1.0], [1.0, -1.0]]) * scale)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: jsmkt.exponential(0.0), r"rate=0\.0 must be positive"),
        (lambda: jsmkt.exponential(-1.0), r"rate=-1\.0 must be positive"),
        (lambda: jsmkt.erlang(0), r"k=0 must be a positive integer"),
        (lambda: jsmkt.erlang(1.5), r"k=1\.5 must be a positive integer"),
        (lambda: jsmkt.erlang(2, -1.0), r"mean=-1\.0 must be positive"),
        (lambda: jsmkt.hyperexponential([0.5, 0.5], [1.0]), r"probs has shape \(2,\) but rates has shape \(1,\)"),
        (lambda: jsmkt.hyperexponential([0.5, 0.5], [1.0, 0.0]), r"rates\[1\]=0\.0 must be positive"),
        (lambda: jsmkt.hyperexponential([1.5, -0.5], [1.0, 2.0]),
         r"^probs\[1\]=-0\.5 is negative; probs must be a probability vector"),
        (lambda: jsmkt.hyperexponential2(1.0, 0.5), r"scv=0\.5 must be >= 1"),
        (lambda: jsmkt.coxian([1.0, 2.0], [0.5, 0.5]), r"probs has shape \(2,\); a Coxian with 2 rates needs 1"),
        (lambda: jsmkt.coxian([1.0, -2.0], [0.5]), r"rates\[1\]=-2\.0 must be positive"),
        (lambda: jsmkt.coxian([1.0, 2.0], [1.5]), r"probs\[0\]=1\.5 must lie in \[0, 1\]"),
        (lambda: jsmkt.coxian2(1.0, 0.4), r"scv=0\.4 must be >= 0\.5"),
        # Arguments the user passed are named, not the rates built from them.
        (lambda: jsmkt.hyperexponential2(-1.0, 4.0), r"^mean=-1\.0 must be positive"),
        (lambda: jsmkt.hyperexponential2(0.0, 4.0), r"^mean=0\.0 must be positive"),
        (lambda: jsmkt.coxian2(-1.0, 2.0), r"^mean=-1\.0 must be positive"),
        (lambda: jsmkt.coxian2(0.0, 2.0), r"^mean=0\.0 must be positive"),
        (lambda: jsmkt.hyperexponential2(1.0, 1e160), r"^scv=1e\+160 is too large to represent with mean=1\.0"),
        (lambda: jsmkt.coxian2(1.0, 1e200), r"^scv=1e\+200 is too large to represent with mean=1\.0"),
        (lambda: jsmkt.hyperexponential2(5e-324, 4.0),
         r"^mean=5e-324 is nonzero but below 2\.22507e-308, the smallest normal float64"),
        (lambda: jsmkt.erlang(2, 1e-320), r"^mean=1e-320 is nonzero but below 2\.22507e-308"),
        (lambda: jsmkt.erlang(100, 1e-307), r"^mean=1e-307 is too small to represent"),
        (lambda: jsmkt.erlang(float("nan")), r"^k=nan must be a positive integer"),
        (lambda: jsmkt.erlang(float("inf")), r"^k=inf must be a positive integer"),
        (lambda: jsmkt.erlang("a"), r"^k='a' must be a positive integer"),
        (lambda: jsmkt.erlang("2"), r"^k='2' must be a positive integer"),
        (lambda: jsmkt.erlang(None), r"^k=None must be a positive integer"),
        # Orders above MAX_ORDER are refused before the dense m x m sub-generator is allocated.
        (lambda: jsmkt.erlang(100_000), r"^k=100000 phases exceed the largest PH order 4096 .*use fewer phases"),
        (lambda: jsmkt.erlang(4097), r"^k=4097 phases exceed the largest PH order 4096"),
        (lambda: jsmkt.hyperexponential(np.full(5000, 2e-4), np.ones(5000)),
         r"^rates has 5000 entries: 5000 phases exceed the largest PH order 4096"),
        (lambda: jsmkt.coxian(np.ones(5000), np.ones(4999)),
         r"^rates has 5000 entries: 5000 phases exceed the largest PH order 4096"),
        (lambda: jsmkt.PH(np.full(5000, 2e-4), [[-1.0]]),
         r"^alpha has 5000 entries: 5000 phases exceed the largest PH order 4096"),
    ],
)
def test_constructor_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_largest_order():
    assert jsmkt._distributions.ph.MAX_ORDER == 4096
    S = jsmkt.erlang(1500, 3.0)  # validated in O(m^2) (regression: O(m^3), ~1 minute at the largest order)
    assert S.order == 1500 and float(S.mean) == pytest.approx(3.0, rel=1e-12)


# --- Under jit, grad and vmap --------------------------------------------------------------------------------------


@jax.jit
def _mean_of(alpha, T):
    return jsmkt.PH(alpha, T).mean


def test_build_inside_jit():
    """Values are checked only when concrete: traced values (even invalid ones) do not raise."""
    assert float(_mean_of(jnp.array([1.0, 0.0]), jnp.array([[-2.0, 2.0], [0.0, -2.0]]))) == pytest.approx(1.0)
    _mean_of(jnp.array([0.5, 0.4]), jnp.array([[-2.0, 3.0], [0.0, -2.0]]))  # invalid, but traced
    with pytest.raises(ValueError, match=r"T has shape \(3, 3\) but alpha has 2"):
        _mean_of(jnp.array([0.5, 0.5]), -jnp.eye(3))  # shapes are static: still an error


def test_constructors_inside_jit():
    @jax.jit
    def means(x):
        return jnp.stack(
            [
                jsmkt.exponential(1 / x).mean,
                jsmkt.erlang(3, x).mean,
                jsmkt.hyperexponential2(x, 4.0 * x).mean,
                jsmkt.coxian2(x, 2.0).mean,
                jsmkt.hyperexponential(jnp.stack([0.5, 0.5]), jnp.stack([1 / x, 1 / x])).mean,
                jsmkt.coxian(jnp.stack([1 / x, 1 / x]), jnp.stack([0.0 * x])).mean,
            ]
        )

    np.testing.assert_allclose(means(2.0), np.full(6, 2.0), rtol=1e-13)
    scvs = jax.vmap(lambda s: jsmkt.hyperexponential2(1.0, s).scv)(jnp.array([1.5, 4.0, 10.0]))
    np.testing.assert_allclose(scvs, [1.5, 4.0, 10.0], rtol=1e-12)


def _central_difference(f, T, i, j, h=1e-6):
    E = np.zeros_like(T)
    E[i, j] = h
    return (f(T + E) - f(T - E)) / (2 * h)


@pytest.mark.parametrize("quantity", ["mean", "second_moment", "scv"])
def test_grad_wrt_T_matches_finite_differences(quantity):
    alpha = jnp.asarray(CYCLIC_ALPHA)

    def f(T):
        S = jsmkt.PH(alpha, T)
        return {"mean": S.mean, "second_moment": S.moment(2), "scv": S.scv}[quantity]

    g = np.asarray(jax.grad(f)(jnp.asarray(CYCLIC_T)))
    fd = np.array([[float(_central_difference(f, CYCLIC_T, i, j)) for j in range(3)] for i in range(3)])
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)


def test_grad_through_constructors():
    k, mean = 3, 2.0
    # E[S^2] = k(k+1)/r^2 = (k+1) mean^2 / k for the Erlang-k.
    d2 = jax.grad(lambda m: jsmkt.erlang(k, m).moment(2))(mean)
    assert float(d2) == pytest.approx(2 * (k + 1) * mean / k, rel=1e-12)
    assert float(jax.grad(lambda s: jsmkt.hyperexponential2(1.0, s).scv)(4.0)) == pytest.approx(1.0, rel=1e-10)


@pytest.mark.parametrize(
    "build",
    [
        lambda: jsmkt.exponential(1e-160),  # E[S^2] = 2e320 overflows
        lambda: jsmkt.exponential(1e300),  # E[S^2] = 2e-600 underflows
        lambda: jsmkt.erlang(2, mean=1e160),
        lambda: jsmkt.hyperexponential([0.5, 0.5], [1e-160, 1.0]),
        lambda: jsmkt.PH([1.0], [[-1e-155]]),
    ],
)
def test_time_scales_outside_float64_are_refused(build):
    """Regression: these were accepted, and their SCV, variance or second moment was NaN."""
    with pytest.raises(ValueError, match=r"^the PH's time scale leaves float64: E\[S\]=.*measure time in another unit"):
        build()


def test_wide_but_representable_time_scales_are_kept():
    # E[S^2] = 2e300 and 2e-300: finite and normal. Exponential SCV 1, hyperexponential SCV by hand.
    assert float(jsmkt.exponential(1e-150).scv) == pytest.approx(1.0, rel=1e-12)
    assert float(jsmkt.exponential(1e150).scv) == pytest.approx(1.0, rel=1e-12)
    h = jsmkt.hyperexponential([0.5, 0.5], [1e-100, 1.0])
    m1, m2 = 0.5e100 + 0.5, 1e200 + 1.0
    assert float(h.scv) == pytest.approx(m2 / m1**2 - 1.0, rel=1e-12)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: jsmkt.coxian([], []), r"^rates is empty; a Coxian distribution needs at least one phase$"),
        (lambda: jsmkt.erlang(2).pdf("a"), r"^x='a' is not a real number"),
        (lambda: jsmkt.erlang(2).cdf("a"), r"^x='a' is not a real number"),
        (lambda: jsmkt.hyperexponential([0.5, 0.4], [1.0, 2.0]), r"^probs sums to 0\.9, not 1"),
    ],
)
def test_messages_name_the_argument(build, match):
    """Regression: these said 'a Coxian with 0 rates needs -1 continuation probabilities', 'could not convert
    string to float' and 'alpha sums to 0.9'."""
    with pytest.raises(ValueError, match=match):
        build()
