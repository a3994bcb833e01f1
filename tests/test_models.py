"""Mean-field models: closed forms, independent queueing formulas, and the model contract."""

import math

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jsmkt


# --- exponential JSQ(d): classic closed forms ------------------------------------------------------------------

@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("lam", [0.5, 0.9, 0.99])
def test_jsqd_closed_form_tails_and_mitzenmacher(d, lam):
    K = 40 if lam < 0.99 else 60
    model = jsmkt.JSQd(lam, d=d, K=K)
    fp = jsmkt.solve_fixed_point(model)
    s = np.asarray(jsmkt.tails(model, fp))
    expected = np.array([lam ** ((d**k - 1) / (d - 1)) for k in range(K + 1)])
    # s_k = rho^n_k with n_k = (d^k - 1)/(d - 1): a relative rounding error at level 1 is amplified n_k times by
    # level k (the condition number of rho^n), which matters only for tails far below 1e-100; allow for it.
    n_k = np.array([(d**k - 1) / (d - 1) for k in range(K + 1)])
    nz = expected > 1e-300  # XLA flushes subnormals to zero
    rel = np.abs(s[nz] - expected[nz]) / expected[nz]
    assert np.all(rel <= 1e-12 + 4 * np.finfo(float).eps * n_k[nz]), rel.max()
    assert np.all(s[~nz] < 1e-300)
    # Mitzenmacher: E[T] = sum_{i>=1} lam^{(d^i - d)/(d - 1)}
    ET = sum(lam ** ((d**i - d) / (d - 1)) for i in range(1, 40))
    assert abs(float(jsmkt.mean_sojourn_time(model, fp)) - ET) < 1e-12 * ET


def test_jsqd_d1_is_mm1():
    lam = 0.8
    model = jsmkt.JSQd(lam, d=1, mu=1.0)
    fp = jsmkt.solve_fixed_point(model)
    assert abs(float(jsmkt.mean_queue_length(model, fp)) - lam / (1 - lam)) < 1e-10
    assert abs(float(jsmkt.mean_sojourn_time(model, fp)) - 1 / (1 - lam)) < 1e-10


def test_jsqd_d1_near_capacity_is_mm1():
    """At load 0.99 the default K of d = 1 is about 4000 levels (a geometric tail): E[Q] = rho / (1 - rho)."""
    model = jsmkt.JSQd(0.99, d=1)
    assert model.K > 3000
    fp = jsmkt.solve_fixed_point(model)
    assert abs(float(jsmkt.mean_queue_length(model, fp)) - 99.0) < 1e-8


@pytest.mark.parametrize("d", [17, 20, 1000])
def test_jsqd_closed_form_large_d(d):
    """Beyond 16 the divided differences of s^d go by the binary expansion of d: s_k = lam^((d^k - 1)/(d - 1))."""
    lam = 0.9
    model = jsmkt.JSQd(lam, d=d, K=6)
    s = np.asarray(jsmkt.tails(model, jsmkt.solve_fixed_point(model)))
    n_k = np.array([(d**k - 1) / (d - 1) for k in range(7)])
    expected = lam**n_k
    nz = expected > 1e-300  # XLA flushes subnormals to zero
    rel = np.abs(s[nz] - expected[nz]) / expected[nz]
    assert np.all(rel <= 1e-12 + 4 * np.finfo(float).eps * n_k[nz]), rel
    assert np.all(s[~nz] < 1e-300)


def test_long_choice_laws_equal_short_ones():
    """A choice law with more than 16 entries (summed in a `lax.scan`) equals the same law written with 3 (summed
    term by term), and so do the gradients with respect to lam and to the law."""
    svc = jsmkt.hyperexponential2(1.0, 4.0)
    w = jnp.array([0.2, 0.5, 0.3])

    def ET(lam, w):
        model = jsmkt.JSQdPH(lam, svc, d=w, K=50)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    pad = lambda w: jnp.concatenate([w, jnp.zeros(17)])  # noqa: E731
    short, long = jax.value_and_grad(ET, argnums=(0, 1)), jax.value_and_grad(lambda l, w: ET(l, pad(w)), argnums=(0, 1))
    (v1, (gl1, gw1)), (v2, (gl2, gw2)) = short(0.9, w), long(0.9, w)
    np.testing.assert_allclose([v2, gl2], [v1, gl1], rtol=1e-12)
    np.testing.assert_allclose(gw2, gw1, rtol=1e-10)


@pytest.mark.parametrize("scale", [1e-3, 1e3, 1e6])
def test_fixed_point_does_not_depend_on_the_time_unit(scale):
    """The same systems with every rate multiplied by `scale`: the fixed point is the same and E[T] scales by
    1/scale (Newton's residual is measured in units of the model's rates)."""
    for lam, svc in [(0.9, lambda m: jsmkt.hyperexponential2(m, 4.0)), (0.5, lambda m: jsmkt.erlang(3, m))]:
        unit, scaled = jsmkt.JSQdPH(lam, svc(1.0)), jsmkt.JSQdPH(lam * scale, svc(1.0 / scale))
        fu, fs = jsmkt.solve_fixed_point(unit), jsmkt.solve_fixed_point(scaled)
        np.testing.assert_allclose(fs.value, fu.value, rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(float(jsmkt.mean_sojourn_time(scaled, fs)) * scale,
                                   float(jsmkt.mean_sojourn_time(unit, fu)), rtol=1e-10)


def test_jsqd_mu_scaling():
    # Time rescaling: (lam, mu) = (1.8, 2) has the same tails as (0.9, 1) and half the sojourn time.
    a = jsmkt.JSQd(0.9, d=2, mu=1.0, K=30)
    b = jsmkt.JSQd(1.8, d=2, mu=2.0, K=30)
    fa, fb = jsmkt.solve_fixed_point(a), jsmkt.solve_fixed_point(b)
    np.testing.assert_allclose(fa.value, fb.value, rtol=1e-12, atol=1e-300)
    assert abs(float(jsmkt.mean_sojourn_time(b, fb)) - 0.5 * float(jsmkt.mean_sojourn_time(a, fa))) < 1e-12


# --- PH service: independent formulas ---------------------------------------------------------------------------

def _erlang_m2(k, mean):
    r = k / mean
    return k * (k + 1) / r**2


def _h2_m2(mean, scv):
    p1 = 0.5 * (1 + math.sqrt((scv - 1) / (scv + 1)))
    p = [p1, 1 - p1]
    rates = [2 * pi / mean for pi in p]
    return sum(2 * pi / ri**2 for pi, ri in zip(p, rates))


def _coxian2_m2(mu1, mu2, p):
    return 2 / mu1**2 + p * (2 / mu2**2 + 2 / (mu1 * mu2))


SERVICES = {
    "erlang2": (lambda: jsmkt.erlang(2, mean=1.0), 1.0, _erlang_m2(2, 1.0)),
    "erlang4": (lambda: jsmkt.erlang(4, mean=0.5), 0.5, _erlang_m2(4, 0.5)),
    "h2_scv4": (lambda: jsmkt.hyperexponential2(1.0, 4.0), 1.0, _h2_m2(1.0, 4.0)),
    "coxian": (lambda: jsmkt.coxian([3.0, 0.7], [0.4]), 1 / 3 + 0.4 / 0.7, _coxian2_m2(3.0, 0.7, 0.4)),
}


@pytest.mark.parametrize("name", list(SERVICES))
@pytest.mark.parametrize("rho", [0.5, 0.85])
def test_d1_matches_pollaczek_khinchine(name, rho):
    make, ES, ES2 = SERVICES[name]
    service = make()
    lam = rho / ES
    model = jsmkt.JSQdPH(lam, service, d=1)
    fp = jsmkt.solve_fixed_point(model)
    L_pk = rho + lam**2 * ES2 / (2 * (1 - rho))
    L = float(jsmkt.mean_queue_length(model, fp))
    assert abs(L - L_pk) < 1e-9 * L_pk
    T_pk = ES + lam * ES2 / (2 * (1 - rho))
    assert abs(float(jsmkt.mean_sojourn_time(model, fp)) - T_pk) < 1e-9 * T_pk


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("lam", [0.3, 0.9])
def test_exponential_ph_equals_jsqd(d, lam):
    K = 200 if d == 1 else 30
    a = jsmkt.JSQd(lam, d=d, mu=2.0, K=K)
    b = jsmkt.JSQdPH(lam, jsmkt.exponential(2.0), d=d, K=K)
    fa, fb = jsmkt.solve_fixed_point(a), jsmkt.solve_fixed_point(b)
    np.testing.assert_allclose(jsmkt.tails(a, fa), jsmkt.tails(b, fb), rtol=1e-11, atol=1e-300)
    assert abs(float(jsmkt.mean_sojourn_time(a, fa)) - float(jsmkt.mean_sojourn_time(b, fb))) < 1e-11


@pytest.mark.parametrize("name", list(SERVICES))
@pytest.mark.parametrize("d", [2, 3, 2.5, (0.2, 0.5, 0.3)])
def test_utilisation_equals_load(name, d):
    make, ES, _ = SERVICES[name]
    lam = 0.9 / ES
    d = jnp.asarray(d) if isinstance(d, tuple) else d
    model = jsmkt.JSQdPH(lam, make(), d=d)
    fp = jsmkt.solve_fixed_point(model)
    assert abs(float(jsmkt.utilisation(model, fp)) - 0.9) < 1e-11
    s = np.asarray(jsmkt.tails(model, fp))
    assert np.all(np.diff(s) <= 1e-15) and np.all(s >= -1e-15)


def _direct_sojourn_time(model, y):
    """E[T] summed over where an arrival lands (independent of Little's law): it joins a server with exactly k
    jobs and phase i with probability h(s_k, s_{k+1}) X_{k,i}; it then waits for the residual service of phase i
    and k - 1 full services, and is served."""
    y = np.asarray(y)
    alpha, T = np.asarray(model.service.alpha), np.asarray(model.service.T)
    resid = np.linalg.solve(-T, np.ones(len(alpha)))
    ES = alpha @ resid
    s = np.concatenate([[1.0], y.sum(1), [0.0]])
    X = np.concatenate([[(1 - s[1]) * alpha], y - np.concatenate([y[1:], np.zeros((1, y.shape[1]))])])
    w = np.asarray(model.choice.weights())
    D = len(w)

    def g(x):
        return sum(w[j] * x ** (j + 1) for j in range(D))

    total, prob = 0.0, 0.0
    for k in range(model.K):
        pk = g(s[k]) - g(s[k + 1])
        if pk <= 0:
            continue
        mix = X[k] / X[k].sum()
        t_k = ES if k == 0 else mix @ resid + (k - 1) * ES + ES
        total += pk * t_k
        prob += pk
    return total / prob


@pytest.mark.parametrize("name", ["erlang2", "h2_scv4", "coxian"])
@pytest.mark.parametrize("d", [2, 3])
def test_little_law_equals_direct_sojourn(name, d):
    make, ES, _ = SERVICES[name]
    model = jsmkt.JSQdPH(0.8 / ES, make(), d=d)
    fp = jsmkt.solve_fixed_point(model)
    direct = _direct_sojourn_time(model, fp.value)
    assert abs(float(jsmkt.mean_sojourn_time(model, fp)) - direct) < 1e-10 * direct


def test_randomised_choice_recursion():
    # Exponential service with P(D=1)=0.3, P(D=2)=0.7: flow balance across level k gives s_k = rho * g(s_{k-1}).
    lam = 0.9
    w = np.array([0.3, 0.7])
    model = jsmkt.JSQd(lam, d=jnp.asarray(w), K=60)
    fp = jsmkt.solve_fixed_point(model)
    s, expected = 1.0, [1.0]
    for _ in range(60):
        s = lam * (w[0] * s + w[1] * s**2)
        expected.append(s)
    # The truncated model blocks arrivals at K; its tails differ from the infinite recursion by about
    # lam * g(s_K) ~ 1e-33 in absolute terms.
    np.testing.assert_allclose(jsmkt.tails(model, fp), expected, rtol=1e-11, atol=1e-30)


def test_real_d_is_randomised_between_neighbours():
    svc = jsmkt.hyperexponential2(1.0, 4.0)
    a = jsmkt.JSQdPH(0.9, svc, d=2.25, K=60)
    b = jsmkt.JSQdPH(0.9, svc, d=jnp.array([0.0, 0.75, 0.25]), K=60)
    np.testing.assert_allclose(jsmkt.solve_fixed_point(a).value, jsmkt.solve_fixed_point(b).value, rtol=1e-12, atol=1e-300)
    assert abs(float(a.choice.mean) - 2.25) < 1e-15
    # At an integer, the real d equals the fixed choice number.
    c, e = jsmkt.JSQdPH(0.9, svc, d=3.0, K=40), jsmkt.JSQdPH(0.9, svc, d=3, K=40)
    np.testing.assert_allclose(jsmkt.solve_fixed_point(c).value, jsmkt.solve_fixed_point(e).value, rtol=1e-12, atol=1e-300)


# --- the model contract -----------------------------------------------------------------------------------------

def _random_occupancy(key, n):
    x = jr.dirichlet(key, jnp.ones(n))
    return x


ZOO = {
    "jsqd": lambda: jsmkt.JSQd(0.7, d=2, K=6),
    "jsqd_mixed": lambda: jsmkt.JSQd(0.7, d=jnp.array([0.2, 0.3, 0.5]), K=6),
    "jsqdph_erlang": lambda: jsmkt.JSQdPH(0.7, jsmkt.erlang(3), d=2, K=5),
    "jsqdph_h2_real_d": lambda: jsmkt.JSQdPH(0.7, jsmkt.hyperexponential2(1.0, 3.0), d=2.6, K=5),
    "jsqdph_coxian_d1": lambda: jsmkt.JSQdPH(0.4, jsmkt.coxian([2.0, 1.0, 3.0], [0.5, 0.2]), d=1, K=5),
    "jsqd_d20": lambda: jsmkt.JSQd(0.7, d=20, K=6),
    "jsqdph_long_law": lambda: jsmkt.JSQdPH(0.7, jsmkt.erlang(2), d=jnp.full(20, 0.05), K=5),
    "jsqdph_real_d_18": lambda: jsmkt.JSQdPH(0.7, jsmkt.erlang(2), d=17.5, K=5),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_vector_field_equals_drift_from_transitions(name, getkey):
    model = ZOO[name]()
    n = len(model.state_space())
    for _ in range(3):
        x = _random_occupancy(getkey(), n)
        y = model.reduce(x)
        np.testing.assert_allclose(model.occupancy(y), x, rtol=1e-12, atol=1e-14)
        derived = model.reduce(model.drift(x))
        np.testing.assert_allclose(model.vector_field(0.0, y), derived, rtol=1e-11, atol=1e-13)
        assert abs(float(jnp.sum(model.drift(x)))) < 1e-13  # mass is conserved
        for tc in model.transitions(x):
            assert np.all(np.asarray(tc.rate) >= 0), tc.name


@pytest.mark.parametrize("name", list(ZOO))
def test_transitions_physical_structure(name):
    # Every transition moves one server by at most one job: queue lengths change by -1, 0 or +1.
    model = ZOO[name]()
    labels = model.state_space()
    x = jnp.ones(len(labels)) / len(labels)
    for tc in model.transitions(x):
        for a, b in zip(tc.source, tc.target):
            assert abs(labels[a][0] - labels[b][0]) <= 1


@settings(max_examples=15, deadline=None)
@given(
    rates=st.lists(st.floats(0.3, 5.0), min_size=2, max_size=3),
    cont=st.floats(0.0, 1.0),
    rho=st.floats(0.1, 0.92),
    d=st.sampled_from([1, 2, 3]),
)
# A rare slow phase: d = 1 (M/PH/1) has a geometric tail of ratio 0.80, longer than the SCV of 1.8 suggests (the
# default K was 86 before it used that ratio; the tail mass there was 2.9e-10).
@example(rates=[4.0, 0.5], cont=0.0078125, rho=0.5, d=1)
# A phase no job reaches (continuation probability 0) whose rate is the slowest: it is no pole of the service
# time's transform, and the bisection for the tail ratio once ran into it (singular matrix).
@example(rates=[3.3738009840704084, 0.3], cont=0.0, rho=0.1, d=1)
def test_property_random_coxian(rates, cont, rho, d):
    probs = [cont] * (len(rates) - 1)
    svc = jsmkt.coxian(rates, probs)
    lam = rho / float(svc.mean)
    model = jsmkt.JSQdPH(lam, svc, d=d)
    fp = jsmkt.solve_fixed_point(model)
    assert abs(float(jsmkt.utilisation(model, fp)) - rho) < 1e-10
    assert float(fp.residual) < 1e-12
    y = np.asarray(fp.value)
    assert np.all(y >= -1e-15)
    assert np.all(np.diff(y.sum(1)) <= 1e-15)
    # JSQ(d) never does worse than random routing (d = 1) for the same service.
    if d > 1:
        m1 = jsmkt.JSQdPH(lam, svc, d=1)
        assert float(jsmkt.mean_sojourn_time(model, fp)) <= float(jsmkt.mean_sojourn_time(m1, jsmkt.solve_fixed_point(m1))) + 1e-12


def test_integrate_converges_to_fixed_point():
    model = jsmkt.JSQdPH(0.8, jsmkt.erlang(2), d=2, K=20)
    traj = jsmkt.integrate(model, 200.0, ts=jnp.array([1.0, 10.0, 200.0]))
    fp = jsmkt.solve_fixed_point(model)
    np.testing.assert_allclose(traj.ys[-1], fp.value, atol=1e-8)
    s1 = traj.ys[:, 0].sum(-1)
    assert float(s1[0]) < float(s1[1])  # the empty system fills up


def test_integrate_mm1_transient_mean():
    # d = 1, exponential: d/dt E[Q] = lam - mu * P(busy); check against the ODE's own tails by conservation of work:
    # E[Q](t) = lam t - mu * int_0^t s_1. Compare with a fine quadrature of s_1.
    model = jsmkt.JSQd(0.5, d=1, K=60)
    ts = jnp.linspace(0.0, 5.0, 501)
    traj = jsmkt.integrate(model, 5.0, ts=ts, rtol=1e-10, atol=1e-12)
    q = traj.ys.sum(-1)
    s1 = traj.ys[:, 0]
    integral = np.trapezoid(np.asarray(s1), np.asarray(ts))
    assert abs(float(q[-1]) - (0.5 * 5.0 - integral)) < 1e-4


@pytest.mark.parametrize("make", [
    lambda: jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=40),
    lambda: jsmkt.JSQdPH(0.7, jsmkt.erlang(3), d=3, K=20),
    lambda: jsmkt.JSQd(0.95, d=jnp.array([0.1, 0.6, 0.3]), K=80),
    # Regression: Newton met a non-finite linear system from the initial guess (s_2..s_5 ~ 0.99 where s_2 is
    # 0.874) and `solve_fixed_point` raised instead of restarting from the ODE's steady state.
    lambda: jsmkt.JSQdPH(0.999, jsmkt.erlang(4), d=16),
])
def test_newton_agrees_with_ode_steady_state(make):
    # Oracle independent of Newton: integrate the ODE from the empty system until the drift vanishes.
    model = make()
    y_ode, result = jsmkt.steady_state(model, rtol=1e-11, atol=1e-13)
    assert result == jsmkt.RESULTS.successful
    fp = jsmkt.solve_fixed_point(model)
    np.testing.assert_allclose(jsmkt.tails(model, y_ode), jsmkt.tails(model, fp), atol=1e-8)


def test_traced_solves_need_no_ode_fallback():
    """Under `vmap` (and `jit`) there is no ODE fallback, so Newton must converge from the initial guess itself.
    Regression: for large d near saturation the guess's two plain Newton steps per level left for the wrong branch
    (s_2 = 0.979 against 0.599), and the batch entries came back failed ("maximum number of steps", "non-finite
    input"), E[T] as 1e-105 or NaN."""
    cases = [(jsmkt.erlang(8), 8, 0.99), (jsmkt.erlang(8), 16, 0.99), (jsmkt.erlang(4), 16, 0.999)]
    for service, d, lam in cases:
        K = jsmkt.JSQdPH(lam, service, d=d).K

        def solve(lam):
            m = jsmkt.JSQdPH(lam, service, d=d, K=K)
            fp = jsmkt.solve_fixed_point(m, throw=False)
            return fp.result == jsmkt.RESULTS.successful, jsmkt.tails(m, fp)

        ok, tails = jax.vmap(solve)(jnp.array([0.5, lam]))
        assert np.all(np.asarray(ok))
        y_ode, _ = jsmkt.steady_state(jsmkt.JSQdPH(lam, service, d=d, K=K), rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(tails[1], jsmkt.tails(jsmkt.JSQdPH(lam, service, d=d, K=K), y_ode), atol=1e-8)


def test_vmap_over_parameters_equals_loop():
    svc = jsmkt.hyperexponential2(1.0, 4.0)
    lams = jnp.array([0.3, 0.6, 0.9])

    def solve(lam):
        m = jsmkt.JSQdPH(lam, svc, d=2, K=40)
        return jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m, throw=False))

    batched = jax.vmap(solve)(lams)
    looped = [float(solve(lam)) for lam in lams]
    np.testing.assert_allclose(batched, looped, rtol=1e-12)


def test_mph1_tail_decay_closed_forms():
    """The M/PH/1 tail ratio that sizes the default K: the load for exponential service, and for H2 the root in
    (1, 1 + mu_2 / lam) of z = sum_i p_i mu_i / (mu_i + lam (1 - z)), here from the cubic it multiplies out to."""
    from jsmkt._models.base import mph1_tail_decay

    assert mph1_tail_decay(0.7, np.ones(1), -2.0 * np.ones((1, 1))) == pytest.approx(0.35, rel=1e-12)
    svc, lam = jsmkt.hyperexponential2(1.0, 4.0), 0.8
    p1 = 0.5 * (1 + math.sqrt(3 / 5))
    (mu1, mu2), (q1, q2) = (2 * p1, 2 * (1 - p1)), (p1, 1 - p1)
    a1, a2 = np.polynomial.Polynomial([mu1 + lam, -lam]), np.polynomial.Polynomial([mu2 + lam, -lam])
    z = np.polynomial.Polynomial([0, 1])
    cubic = z * a1 * a2 - q1 * mu1 * a2 - q2 * mu2 * a1
    roots = [r.real for r in cubic.roots() if abs(r.imag) < 1e-12 and 1 + 1e-9 < r.real < 1 + mu2 / lam]
    assert len(roots) == 1
    eta = mph1_tail_decay(lam, np.asarray(svc.alpha), np.asarray(svc.T))
    assert eta == pytest.approx(1 / roots[0], rel=1e-10)


def test_mph1_tail_decay_ignores_phases_no_job_reaches():
    """A Coxian with continuation probability 0 is exponential service, whatever the rate of its second phase:
    the tail ratio is the load (a slower unreachable phase once capped the search and made it fail)."""
    from jsmkt._models.base import mph1_tail_decay

    for mu2 in (0.3, 1.0, 20.0):
        svc = jsmkt.coxian([3.0, mu2], [0.0])
        assert mph1_tail_decay(0.6, np.asarray(svc.alpha), np.asarray(svc.T)) == pytest.approx(0.2, rel=1e-10)


def test_default_K_follows_the_geometric_tail_of_single_choice_arrivals():
    """With D = 1 the mean field is the M/PH/1 queue: its solved tail ratio s_{k+1}/s_k tends to the decay rate
    that sizes the default K, and the default K holds the tail below tail_tol."""
    from jsmkt._models.base import mph1_tail_decay

    svc = jsmkt.coxian([4.0, 0.5], [0.0078125])
    lam = 0.5 / float(svc.mean)
    model = jsmkt.JSQdPH(lam, svc, d=1)
    fp = jsmkt.solve_fixed_point(model)
    s = np.asarray(fp.value).sum(axis=1)
    eta = mph1_tail_decay(lam, np.asarray(svc.alpha), np.asarray(svc.T))
    assert s[100] / s[99] == pytest.approx(eta, rel=1e-6)
    assert s[-1] < 1e-10


def test_integrate_compiles_once_for_new_times_and_tolerances():
    """t1, rtol, atol and dt0 are values, not static arguments: a sweep over them compiles one kernel."""
    import jsmkt._integrate as integ

    model = jsmkt.JSQd(0.7, d=2, K=12)
    jsmkt.integrate(model, 1.0)
    before = integ._integrate._cached._cache_size()
    for t1, rtol in [(1.5, 1e-8), (2.5, 1e-7), (3.5, 1e-9)]:
        jsmkt.integrate(model, t1, rtol=rtol, atol=1e-11, dt0=1e-2)
    assert integ._integrate._cached._cache_size() == before


# --- the PH model's initial guess -------------------------------------------------------------------------------


@pytest.mark.parametrize("lam, service, d", [
    (0.9, jsmkt.hyperexponential2(1.0, 4.0), 2),
    (0.95, jsmkt.erlang(3, 1.0), 3),
    (0.99, jsmkt.erlang(4, 1.0), 16),
])
def test_ph_initial_guess_is_the_fixed_point(lam, service, d):
    # The level-by-level recursion is exact for the untruncated system; Newton on the truncated drift equations is
    # an independent route to the same point (the tail mass at K is negligible here).
    model = jsmkt.JSQdPH(lam, service, d=d)
    fp = jsmkt.solve_fixed_point(model)
    assert float(fp.tail_mass) < 1e-14
    np.testing.assert_allclose(np.asarray(model.initial_guess()), np.asarray(fp.value), rtol=0, atol=1e-10)


def test_ph_initial_guess_carries_no_derivatives():
    # Only Newton's starting point: the fixed point's derivatives come from the implicit function theorem. Its
    # per-level loop stops once converged (a while loop, which reverse mode could not differentiate).
    service = jsmkt.hyperexponential2(1.0, 4.0)

    def guess_sum(lam):
        return jnp.sum(jsmkt.JSQdPH(lam, service, d=2, K=30).initial_guess())

    assert float(jax.grad(guess_sum)(0.8)) == 0.0
    batched = jax.vmap(lambda lam: jsmkt.JSQdPH(lam, service, d=2, K=30).initial_guess())(jnp.array([0.5, 0.9]))
    for i, lam in enumerate((0.5, 0.9)):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(jsmkt.JSQdPH(lam, service, d=2, K=30)
                                                                      .initial_guess()), rtol=0, atol=1e-15)


# --- value checks and size checks of the eager entry points -----------------------------------------------------


@pytest.mark.parametrize("make, order", [
    (lambda lam, service, K: jsmkt.JSQdPH(lam, service, d=2, K=K), 5),
    (lambda lam, service, K: jsmkt.published.JSQdPHAsPublished(lam, service, d=2, K=K), 6),
], ids=["exact", "as-published"])
def test_value_checks_compile_once_for_every_K(monkeypatch, make, order):
    # check_values runs the checks compiled, on a copy truncated at a fixed K: sweeping K traces them once.
    traced = []
    original = jsmkt.JSQdPH.value_errors

    def counting(self):
        traced.append(self.K)
        return original(self)

    monkeypatch.setattr(jsmkt.JSQdPH, "value_errors", counting)
    service = jsmkt.erlang(order, 1.0)  # an order no other test uses, so nothing is cached yet
    for K in range(10, 20):
        make(0.7, service, K).check_values()
    assert len(traced) <= 1
    with pytest.raises(ValueError, match=r"unstable: lam=1\.3 >= capacity"):
        make(1.3, service, 12).check_values()


def test_state_size_follows_the_truncation():
    from jsmkt._models.structure import _state_size

    service = jsmkt.hyperexponential2(1.0, 4.0)
    for K in (10, 20, 10):
        assert _state_size(jsmkt.JSQdPH(0.5, service, d=2, K=K)) == 2 * K
    assert _state_size(jsmkt.JSQd(0.5, d=2, K=30)) == 30
