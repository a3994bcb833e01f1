r"""`fit_ph2_three_moments`: the Telek–Heindl PH(2) fit from three moments.

The fitted moments are computed by `PH.moment` ($n!\,\alpha(-T)^{-n}\mathbf 1$, a linear solve), which is a different
formula from the fit's closed form. The feasible region used to generate test points is coded here from Table 1 of
the PH-service paper; the paper's own formulas for $(\eta, \xi_1, \xi_2)$ serve as a second, independent closed form.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jsmkt
from jsmkt import fit_ph2_three_moments as fit


MOMENT_RTOL = 1e-10


def _lower(scv):
    """Table 1 lower bound on m3/m1^3 for 1/2 <= c^2 <= 1."""
    return 3.0 * (3.0 * scv - 1.0 + math.sqrt(2.0) * (1.0 - scv) ** 1.5)


def _upper(scv):
    """Table 1 upper bound on m3/m1^3 for 1/2 <= c^2 <= 1."""
    return 6.0 * scv


def _hyper_bound(scv):
    """Table 1 (open) lower bound on m3/m1^3 for c^2 > 1."""
    return 1.5 * (1.0 + scv) ** 2


def _paper_fit(m1, m2, m3):
    """(eta, xi1, xi2) from the paper's cases c > 0 and c < 0, written as printed."""
    c = 3 * m2**2 - 2 * m1 * m3
    d = 2 * m1**2 - m2
    b = 3 * m1 * m2 - m3
    a = b**2 - 6 * c * d
    if c > 0:
        return (-b + 6 * m1 * d + math.sqrt(a)) / (b + math.sqrt(a)), (b - math.sqrt(a)) / c, (b + math.sqrt(a)) / c
    assert c < 0
    return (b - 6 * m1 * d + math.sqrt(a)) / (-b + math.sqrt(a)), (b + math.sqrt(a)) / c, (b - math.sqrt(a)) / c


def _params(ph):
    """(eta, xi1, xi2) of a fitted canonical PH(2), checking its structure."""
    alpha, T = np.asarray(ph.alpha), np.asarray(ph.T)
    assert ph.order == 2
    assert T[1, 0] == 0.0 and T[0, 1] == -T[0, 0]
    eta, xi1, xi2 = alpha[0], -T[0, 0], -T[1, 1]
    assert 0.0 <= eta <= 1.0 and alpha[1] == pytest.approx(1.0 - eta, abs=1e-15)
    assert 0.0 < xi1 <= xi2 * (1.0 + 1e-12)
    return eta, xi1, xi2


def _assert_moments(ph, m1, m2, m3, rtol=MOMENT_RTOL):
    got = np.asarray(ph.moments(3))
    np.testing.assert_allclose(got, [m1, m2, m3], rtol=rtol, atol=0.0)


# --- Moments are reproduced over the feasible region ---------------------------------------------------------------

_scale = st.floats(-3.0, 3.0).map(lambda e: 10.0**e)
# Where m3 lies between the c^2 <= 1 bounds: anywhere, on either bound, or within 1e-14 .. 1e-4 of one.
_near = st.floats(-14.0, -4.0).map(lambda e: 10.0**e)
_position = st.one_of(
    st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0]), _near, _near.map(lambda t: 1.0 - t)
)
# c^2 in [1/2, 1): anywhere, on 1/2, or close to 1/2 or 1.
_scv_low = st.one_of(
    st.floats(0.5, 0.999),
    st.just(0.5),
    st.floats(-12.0, -2.0).map(lambda e: 0.5 + 10.0**e),
    st.floats(-9.0, -3.0).map(lambda e: 1.0 - 10.0**e),
)
# c^2 > 1: from just above 1 to 100; m3 a relative gap 1e-9 .. 1e4 above the open bound.
_scv_high = st.one_of(st.floats(1.001, 100.0), st.floats(-9.0, -3.0).map(lambda e: 1.0 + 10.0**e))
_gap = st.floats(-9.0, 4.0).map(lambda e: 10.0**e)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(m1=_scale, scv=_scv_low, t=_position)
def test_moments_reproduced_low_variability(m1, scv, t):
    lo, hi = _lower(scv), _upper(scv)
    n3 = min(max(lo + t * (hi - lo), lo), hi)
    m2, m3 = (1.0 + scv) * m1**2, n3 * m1**3
    ph = fit(m1, m2, m3)
    _params(ph)
    _assert_moments(ph, m1, m2, m3)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(m1=_scale, scv=_scv_high, gap=_gap)
def test_moments_reproduced_high_variability(m1, scv, gap):
    m2, m3 = (1.0 + scv) * m1**2, _hyper_bound(scv) * (1.0 + gap) * m1**3
    ph = fit(m1, m2, m3)
    _params(ph)
    _assert_moments(ph, m1, m2, m3)


@pytest.mark.parametrize(
    "m1, m2, m3",
    [
        (1.0, 1.7, 4.1),  # c^2 < 1 (paper's case c > 0)
        (2.0, 6.8, 32.8),  # the same shape, scaled
        (0.5, 0.6, 1.2),  # c^2 = 1.4 (case c < 0)
        (1.0, 3.0, 15.0),
        (1.0, 3.0, 50.0),
        (3.0, 40.0, 2000.0),
    ],
)
def test_matches_paper_formulas(m1, m2, m3):
    eta, xi1, xi2 = _params(fit(m1, m2, m3))
    np.testing.assert_allclose([eta, xi1, xi2], _paper_fit(m1, m2, m3), rtol=1e-12)


@pytest.mark.parametrize(
    "S",
    [jsmkt.hyperexponential2(1.0, 4.0), jsmkt.coxian2(2.0, 0.8), jsmkt.coxian([1.0, 3.0], [0.4]),
     jsmkt.hyperexponential([0.2, 0.8], [0.5, 4.0])],
    ids=["H2", "C2-low-scv", "C2", "H2-unbalanced"],
)
def test_recovers_a_ph2(S):
    """Three moments determine an order-2 distribution, so refitting a PH(2) gives back the same distribution."""
    ph = fit(*(float(m) for m in S.moments(3)))
    x = jnp.array([0.0, 0.1, 0.5, 1.0, 2.0, 5.0])
    np.testing.assert_allclose(ph.cdf(x), S.cdf(x), atol=1e-12)
    np.testing.assert_allclose(ph.pdf(x), S.pdf(x), rtol=1e-10)


# --- Boundary cases -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m1", [1.0, 0.3, 7.0])
def test_erlang2(m1):
    """c^2 = 1/2 admits only the Erlang-2 (lower and upper m3 bounds meet at 3 m1^3)."""
    eta, xi1, xi2 = _params(fit(m1, 1.5 * m1**2, 3.0 * m1**3))
    assert eta == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose([xi1, xi2], [2.0 / m1, 2.0 / m1], rtol=1e-12)
    # Moments of an Erlang-2 as computed, with their rounding: still the Erlang-2, no error.
    ph = fit(*(float(m) for m in jsmkt.erlang(2, m1).moments(3)))
    np.testing.assert_allclose(ph.T, jsmkt.erlang(2, m1).T, rtol=1e-10)


@pytest.mark.parametrize("m1", [1.0, 0.1, 0.3, 25.0])
def test_exponential(m1):
    """c = 0 inside the region is the exponential, returned as the order-1 PH with rate 1/m1."""
    ph = fit(m1, 2.0 * m1**2, 6.0 * m1**3)
    assert ph.order == 1
    assert float(ph.T[0, 0]) == pytest.approx(-1.0 / m1, rel=1e-15)
    # Exponential moments with rounding errors on either side of c^2 = 1 are not rejected.
    for m2, m3 in [(2 * m1**2 * (1 + 3e-16), 6 * m1**3), (2 * m1**2 * (1 - 3e-16), 6 * m1**3 * (1 + 4e-16))]:
        ph = fit(m1, m2, m3)
        assert ph.order == 1
        _assert_moments(ph, m1, m2, m3)


def test_bounds_for_low_variability_are_attained():
    """Upper m3 bound: two phases in series (eta = 1). Lower bound: equal rates."""
    m1, scv = 2.0, 0.75
    eta, xi1, xi2 = _params(fit(m1, (1 + scv) * m1**2, _upper(scv) * m1**3))
    assert eta == pytest.approx(1.0, abs=1e-14)
    eta, xi1, xi2 = _params(fit(m1, (1 + scv) * m1**2, _lower(scv) * m1**3))
    assert xi1 == pytest.approx(xi2, rel=1e-7)
    assert 0.0 < eta < 1.0


def test_just_above_the_high_variability_bound():
    """Close to the open bound the second phase becomes fast, but the fit stays exact."""
    m1, scv = 1.5, 3.0
    m2, m3 = (1 + scv) * m1**2, _hyper_bound(scv) * (1 + 1e-9) * m1**3
    ph = fit(m1, m2, m3)
    eta, xi1, xi2 = _params(ph)
    assert xi2 * m1 > 1e8
    _assert_moments(ph, m1, m2, m3)


# --- Clipping (a.1)-(a.4) -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m1", [1.0, 2.5])
@pytest.mark.parametrize("n2", [1.2, 0.5, 1.5 * (1 - 1e-6)])
def test_clip_a1_low_scv(m1, n2):
    """(a.1) c^2 < 1/2 is raised to 1/2; the m3 bounds then force the Erlang-2."""
    ph, (c1, c2, c3) = fit(m1, n2 * m1**2, 2.0 * m1**3, clip=True)
    assert c1 == m1
    assert c2 == pytest.approx(1.5 * m1**2, rel=1e-15)
    assert c3 == pytest.approx(3.0 * m1**3, rel=1e-14)
    _assert_moments(ph, c1, c2, c3)
    np.testing.assert_allclose(ph.T, jsmkt.erlang(2, m1).T, rtol=1e-10)


@pytest.mark.parametrize("m1", [1.0, 2.5])
def test_clip_a2_a3_bounds(m1):
    scv = 0.7
    m2 = (1 + scv) * m1**2
    # (a.2) below the lower bound: onto it.
    ph, (c1, c2, c3) = fit(m1, m2, 0.5 * _lower(scv) * m1**3, clip=True)
    assert (c1, c2) == (m1, m2)
    assert c3 == pytest.approx(_lower(scv) * m1**3, rel=1e-14)
    _assert_moments(ph, c1, c2, c3)
    # (a.3) above the upper bound: onto it.
    ph, (c1, c2, c3) = fit(m1, m2, 3.0 * _upper(scv) * m1**3, clip=True)
    assert (c1, c2) == (m1, m2)
    assert c3 == pytest.approx(_upper(scv) * m1**3, rel=1e-14)
    _assert_moments(ph, c1, c2, c3)
    assert float(ph.alpha[0]) == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("m1", [1.0, 2.5])
@pytest.mark.parametrize("factor", [0.3, 1.0])
def test_clip_a4_open_bound(m1, factor):
    """(a.4) m3 at or below the unattained bound is raised just above it (relative gap 1e-6)."""
    scv = 2.0
    m2 = (1 + scv) * m1**2
    bound = _hyper_bound(scv) * m1**3
    ph, (c1, c2, c3) = fit(m1, m2, factor * bound, clip=True)
    assert (c1, c2) == (m1, m2)
    assert bound < c3 <= bound * (1 + 1e-5)
    _assert_moments(ph, c1, c2, c3)


def test_clip_at_scv_one_gives_exponential():
    for m3 in [5.0, 7.0]:
        ph, moments = fit(1.0, 2.0, m3, clip=True)
        assert ph.order == 1
        assert moments == (1.0, 2.0, 6.0)


def test_clip_leaves_feasible_moments_alone():
    for m in [(1.0, 1.7, 4.1), (2.0, 12.0, 200.0)]:
        ph, moments = fit(*m, clip=True)
        assert moments == m
        np.testing.assert_array_equal(ph.T, fit(*m).T)
        np.testing.assert_array_equal(ph.alpha, fit(*m).alpha)


def test_rounding_level_violations_are_projected_silently():
    scv = 0.7
    for n3 in [_lower(scv) * (1 - 1e-14), _upper(scv) * (1 + 1e-14)]:
        _assert_moments(fit(1.0, 1 + scv, n3), 1.0, 1 + scv, n3)
    ph = fit(1.0, 1.5 * (1 - 1e-14), 3.0)
    np.testing.assert_allclose(ph.T, jsmkt.erlang(2, 1.0).T, rtol=1e-10)


# --- Errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_invalid_moments(bad, which):
    m = [1.0, 3.0, 15.0]
    m[which] = bad
    for clip in (False, True):
        with pytest.raises(ValueError, match=f"m{which + 1}=.*finite positive"):
            fit(*m, clip=clip)
    with pytest.raises(ValueError, match="m1='a' is not a real number"):
        fit("a", 3.0, 15.0)


def test_traced_moments_are_refused():
    """The fit branches on the moments' values: under jax.grad/jit/vmap it says so (regression: it called the
    tracer "not a real number")."""
    import jax

    def msg(i):
        return rf"m{i} is traced \(inside jax.jit, jax.grad or jax.vmap\), but fit_ph2_three_moments takes concrete"

    with pytest.raises(ValueError, match=msg(1) + " moments only: .*cannot be traced or differentiated"):
        jax.grad(lambda m: fit(m, 3.0, 15.0).mean)(1.0)
    with pytest.raises(ValueError, match=msg(3)):
        jax.jit(lambda m: fit(1.0, 3.0, m).mean)(15.0)
    with pytest.raises(ValueError, match=msg(2)):
        jax.vmap(lambda m: fit(1.0, m, 15.0).mean)(jnp.array([3.0, 3.5]))
    assert float(fit(jnp.asarray(1.0), np.float64(3.0), 15).mean) == pytest.approx(1.0, rel=1e-14)


def test_infeasible_moments_name_the_range():
    with pytest.raises(ValueError, match=r"c\^2 = m2/m1\^2 - 1 = 0\.2 < 1/2.*m2 >= 1\.5\*m1\^2 = 1\.5.*clip=True"):
        fit(1.0, 1.2, 2.0)
    with pytest.raises(
        ValueError, match=r"m3=1\.0 is below the PH\(2\) bound .* for c\^2=0\.7; feasible m3 range is "
        r"\[3\.99713700232, 4\.2\]; pass clip=True"
    ):
        fit(1.0, 1.7, 1.0)
    with pytest.raises(ValueError, match=r"m3=72\.0 is above the PH\(2\) bound .*= 33\.6 .*\[31\.97709601\d*, 33\.6\]"):
        fit(2.0, 6.8, 72.0)
    with pytest.raises(ValueError, match=r"m3=13\.5 is not above .* for c\^2=2; feasible m3 range is \(13\.5, inf\)"):
        fit(1.0, 3.0, 13.5)
    with pytest.raises(ValueError, match=r"feasible m3 range is \[6, 6\]"):
        fit(1.0, 2.0, 6.5)


@pytest.mark.parametrize("moments", [(1.0, 3.0, 1e150), (1.0, 3.0, 1e200), (1.0, 1e300, 1e308), (2.0, 12.0, 8e200)])
@pytest.mark.parametrize("clip", [False, True])
def test_moments_beyond_float64_are_refused_naming_them(moments, clip):
    # Regression: m3 >= 1e155 raised ZeroDivisionError, m3 = 1e150 gave a PH whose third moment is inf, and
    # clip=True with m2 = 1e300 raised "alpha=[nan, nan] has non-finite entries".
    m1, m2, m3 = moments
    with pytest.raises(ValueError, match=re.escape(f"m1={m1!r}, m2={m2!r}, m3={m3!r}: a PH(2) with these moments has "
                                                   "rates too far apart for float64")):
        jsmkt.fit_ph2_three_moments(m1, m2, m3, clip=clip)


def test_moments_far_apart_but_representable_are_fitted():
    for m3 in (1e30, 1e100):
        np.testing.assert_allclose(jsmkt.fit_ph2_three_moments(1.0, 3.0, m3).moments(3), [1.0, 3.0, m3], rtol=1e-9)


# --- fit_ph: gradient fits of PH(m) --------------------------------------------------------------------------------
# Moment fits are checked against the Telek-Heindl closed form (order 2) and against the moments of random Coxian
# targets (order 3, feasible by construction); maximum likelihood against the exponential's closed form and the
# likelihood of the law that drew the samples; CDF fits against a target inside the fitted family. Every fit must be
# a valid PH: `jsmkt.PH` validates concrete representations (sub-generator, probability vector, reachable exit), so a
# fit that returns one is valid.


def _assert_valid(S):
    alpha, T = np.asarray(S.alpha), np.asarray(S.T)
    jsmkt.PH(alpha, T)  # raises for an invalid representation
    assert np.all(np.isfinite(np.asarray(S.moments(3))))


@pytest.mark.parametrize("m", [(1.0, 1.7, 4.1), (0.5, 0.6, 1.2), (1.0, 3.0, 15.0), (3.0, 40.0, 2000.0)])
def test_fit_ph_order_2_to_three_moments_is_the_telek_heindl_fit(m):
    """Three moments determine an order-2 distribution: the gradient fit is the closed form's distribution."""
    S = jsmkt.fit_ph(list(m), order=2, to="moments")
    _assert_valid(S)
    np.testing.assert_allclose(np.asarray(S.moments(3)), m, rtol=1e-8)
    x = m[0] * jnp.array([0.1, 0.5, 1.0, 2.0, 5.0])
    np.testing.assert_allclose(S.cdf(x), fit(*m).cdf(x), atol=1e-8)


def test_fit_ph_hits_feasible_moments_of_random_coxians():
    rng = np.random.default_rng(7)
    for _ in range(4):
        rates = np.exp(rng.normal(0.0, 1.0, 3))
        target = jsmkt.coxian(rates, rng.uniform(0.1, 0.9, 2))
        m = np.asarray(target.moments(3))
        S = jsmkt.fit_ph(m, order=3, to="moments")
        _assert_valid(S)
        np.testing.assert_allclose(np.asarray(S.moments(3)), m, rtol=1e-8)


@pytest.mark.slow
def test_fit_ph_maximum_likelihood():
    """Order 1: the exponential of rate 1/mean (the closed-form MLE). Order 2: a maximum of the likelihood over a
    family that holds the law that drew the samples is at least as likely as that law."""
    import jax.random as jr

    x = np.asarray(jsmkt.exponential(2.0).sample(jr.PRNGKey(1), 400))
    S = jsmkt.fit_ph(x, order=1, to="samples")
    assert float(S.rate) == pytest.approx(1.0 / x.mean(), rel=1e-8)
    truth = jsmkt.hyperexponential2(1.0, 4.0)
    y = np.asarray(truth.sample(jr.PRNGKey(2), 400))
    S = jsmkt.fit_ph(y, order=2, to="samples")
    _assert_valid(S)
    assert float(jnp.sum(jnp.log(S.pdf(y)))) >= float(jnp.sum(jnp.log(truth.pdf(y)))) - 1e-9


def _lognormal_target(kind, scale, scv, seed):
    import jax.random as jr

    if kind == "moments":
        sigma2 = math.log1p(scv)
        return [scale**k * math.exp(k * (k - 1) * sigma2 / 2) for k in (1, 2, 3)]
    L = jsmkt.lognormal(scale, scv)
    return np.asarray(jax.vmap(L.sample)(jr.split(jr.PRNGKey(seed), 400)))


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(scale=st.floats(-2.0, 2.0).map(lambda e: 10.0**e), scv=st.floats(0.2, 20.0), seed=st.integers(0, 2**20))
def test_fit_ph_to_moments_always_returns_a_valid_ph(scale, scv, seed):
    """Any lognormal's moments, feasible for PH(2) or not (an SCV below 1/2 is not): the fit is a valid PH(2) with
    the target's mean."""
    import jax.random as jr

    S = jsmkt.fit_ph(_lognormal_target("moments", scale, scv, seed), order=2, to="moments", starts=2,
                     key=jr.PRNGKey(seed))
    assert S.order == 2
    _assert_valid(S)
    assert float(S.mean) == pytest.approx(scale, rel=1e-10)  # the mean is matched by scaling


@pytest.mark.slow
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(scale=st.floats(-2.0, 2.0).map(lambda e: 10.0**e), scv=st.floats(0.2, 20.0), seed=st.integers(0, 2**20),
       structure=st.sampled_from(["coxian", "general"]))
def test_fit_ph_to_samples_always_returns_a_valid_ph(scale, scv, seed, structure):
    import jax.random as jr

    S = jsmkt.fit_ph(_lognormal_target("samples", scale, scv, seed), order=2, to="samples", starts=2,
                     structure=structure, key=jr.PRNGKey(seed))
    assert S.order == 2
    _assert_valid(S)


@pytest.mark.slow
def test_fit_ph_to_distributions():
    """CDF fits: a PH(2) target is recovered at order 2; lognormal, Weibull, Pareto and deterministic targets at
    orders 2..4 give valid PH whose mean is the target's, and a longer PH fits no worse."""
    import scipy.stats

    target = jsmkt.coxian([2.5, 0.7], [0.6])
    S = jsmkt.fit_ph(target, order=2)
    x = jnp.linspace(0.0, 8.0, 41)
    np.testing.assert_allclose(S.cdf(x), target.cdf(x), atol=1e-6)
    weibull = scipy.stats.weibull_min(0.6)
    pareto = scipy.stats.pareto(2.5)
    laws = {"lognormal": (jsmkt.lognormal(1.0, 4.0), None), "deterministic": (jsmkt.deterministic(2.0), None),
            "weibull": (weibull.cdf, float(weibull.mean())), "pareto": (pareto.cdf, float(pareto.mean()))}
    from jsmkt._fit import cdf_grid

    xs, w = cdf_grid()
    for name, (law, mean) in laws.items():
        m = mean if mean is not None else law.mean
        F = np.asarray(law.cdf(xs * m) if mean is None else law(xs * m))
        distances = []
        for order in (2, 3, 4):
            S = jsmkt.fit_ph(law, order=order, mean=mean)
            _assert_valid(S)
            assert float(S.mean) == pytest.approx(m, rel=1e-9), name
            distances.append(float(jnp.sum(w * (S.cdf(xs * m) - F) ** 2)))
        assert distances[2] <= distances[0] * (1 + 1e-6) + 1e-12, (name, distances)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(structure=st.sampled_from(["coxian", "general"]), order=st.integers(1, 4), seed=st.integers(0, 2**20),
       spread=st.floats(0.1, 40.0))
def test_every_unconstrained_point_is_a_valid_ph(structure, order, seed, spread):
    """The fits' parametrisations (`jsmkt._distributions.param`): any real parameters, far out included, give a
    valid PH (`jsmkt.PH` validates the concrete representation)."""
    from jsmkt._distributions.param import ph_arrays, random_params

    rng = np.random.default_rng(seed)
    shapes = {k: np.shape(v) for k, v in random_params(structure, order, rng).items()}
    params = {k: jnp.asarray(rng.normal(0.0, spread, shape)) for k, shape in shapes.items()}
    alpha, T = ph_arrays(params)
    S = jsmkt.PH(np.asarray(alpha), np.asarray(T))
    assert S.order == order and np.isfinite(float(S.mean))
