"""The framework paper as published (`jsmkt.published.framework`, `jsmkt.published.bmap`): where its equations
agree with the exact models (one phase, single arrivals) and where not (phases, batches), with the exact models,
independent single-queue chains and (slow) simulation as referees."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jsmkt


pub = jsmkt.published
K = 24  # one truncation for every model here, so that shapes (and compilations) are shared
C = np.array([[-0.52, 0.02], [0.0, -0.41]])
D = np.array([[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])


def _tails(model):
    return np.asarray(jsmkt.tails(model, jsmkt.solve_fixed_point(model)))


def test_exponential_single_jobs_are_jsqd():
    """Framework blocks of JSQ(d) (one phase per level, single arrivals): the fixed point is JSQd's."""
    fw = pub.framework_batch_service(0.9, jsmkt.exponential(1.0), [1.0], d=2, K=K)
    np.testing.assert_allclose(_tails(fw), _tails(jsmkt.JSQd(0.9, d=2, K=K)), rtol=1e-12, atol=1e-15)


def test_ph_single_jobs_are_the_published_ph_model():
    """The GI/M/1-type blocks with single batches reproduce Li & Lui's published ODE (1)–(3), phase tails and all
    (which `tests/test_published.py` shows to differ from the exact `JSQdPH`)."""
    h2 = jsmkt.hyperexponential2(1.0, 4.0)
    fw = pub.framework_batch_service(0.8, h2, [1.0], d=2, K=K)
    fp_fw = jsmkt.solve_fixed_point(fw)
    fp_ll = jsmkt.solve_fixed_point(pub.JSQdPHAsPublished(0.8, h2, d=2, K=K))
    np.testing.assert_allclose(fw.full(fp_fw.value)[1:].reshape(K, 2), fp_ll.value, rtol=1e-11, atol=1e-15)


@pytest.mark.parametrize("epochs", [jsmkt.exponential(1.0), jsmkt.erlang(2, 1.0)])
def test_batch_service_agrees_with_the_exact_model_with_one_phase_only(epochs):
    """Section 4's blocks against `JSQdBatchService` (same rule: an epoch removes min(l, B) jobs): equal with
    exponential epochs, not with Erlang-2 epochs (Hadamard powers of phase vectors; 13 % below in E[Q])."""
    p = jnp.array([0.5, 0.5])
    fw = pub.framework_batch_service(1.2, epochs, p, d=2, K=K)
    exact = jsmkt.JSQdBatchService(1.2, epochs, p, d=2, K=K)
    a, b = _tails(fw), _tails(exact)
    assert float(fw.load()) == pytest.approx(float(exact.load()), rel=1e-14)
    if epochs.order == 1:
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-15)
    else:
        assert a[1:].sum() < 0.95 * b[1:].sum(), (a[1:].sum(), b[1:].sum())


def _mx_m1_probabilities(lam_b, mu, levels=400):
    """P(Q = k) of the M^X/M/1 queue (batches of b at rate lam_b[b-1]), from its chain truncated at `levels`, by a
    dense linear solve."""
    n = levels + 1
    Q = np.zeros((n, n))
    for k in range(n):
        for b, rate in enumerate(lam_b, start=1):
            Q[k, min(k + b, levels)] += rate
        if k:
            Q[k, k - 1] += mu
    np.fill_diagonal(Q, 0.0)
    np.fill_diagonal(Q, -Q.sum(axis=1))
    return np.linalg.solve(np.vstack([Q.T[:-1], np.ones(n)]), np.eye(n)[-1])


def test_published_bmap_equations_give_probabilities_not_tails():
    """One phase (Poisson batches of 1 or 2) and d = 1: the published (14)–(16) and the closed form (35)–(36) give
    s_k = P(Q = k) / P(Q = 0) of the M^X/M/1 queue, the balance of its probabilities written with tails; the exact
    limit gives P(Q >= k)."""
    A = jsmkt.BMAP([[-0.16]], [[[0.08]], [[0.08]]])
    p = _mx_m1_probabilities([0.08, 0.08], 1.0)
    want = p[: K + 1] / p[0]
    # (to the truncation: the published system at K loses the batches past K, 1e-11 of the mass here)
    np.testing.assert_allclose(_tails(pub.JSQdBMAPAsPublished(A, d=1, K=K)), want, rtol=1e-10, atol=1e-10)
    closed = np.asarray(pub.bmap_fixed_point(A, 1, K=K)).sum(axis=1)
    np.testing.assert_allclose(closed, want, rtol=1e-10, atol=1e-13)
    exact = _tails(jsmkt.JSQdBMAP(A, d=1, K=K))
    np.testing.assert_allclose(exact, np.cumsum(p[::-1])[::-1][: K + 1], rtol=1e-9, atol=1e-10)


def test_published_bmap_with_single_poisson_arrivals_is_jsqd():
    """One phase, single arrivals: (14)–(16) and the closed form are rho^((d^k - 1)/(d - 1))."""
    A = jsmkt.BMAP([[-0.9]], [[0.9]])
    want = np.asarray(pub.exponential_tails(0.9, 2, K=K))
    np.testing.assert_allclose(_tails(pub.JSQdBMAPAsPublished(A, d=2, K=K)), want, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(np.asarray(pub.bmap_fixed_point(A, 2, K=K)).sum(axis=1), want, rtol=1e-12, atol=1e-15)


def test_published_bmap_forms_with_phases():
    """Two phases, d = 2: the framework's M/G/1 blocks are the ODE (11)–(13) (vector fields equal at random
    states); the published fixed point is far from the exact limit, and the closed form satisfies neither."""
    A = jsmkt.BMAP(C, D)
    published = pub.JSQdBMAPAsPublished(A, d=2, K=K)
    fw = pub.framework_bmap(A, d=2, K=K)
    for key in jr.split(jr.PRNGKey(0), 2):
        y = 0.3 * jr.uniform(key, published.initial_state().shape)
        np.testing.assert_allclose(fw.vector_field(0.0, y), published.vector_field(0.0, y), rtol=1e-13, atol=1e-15)
    fp = jsmkt.solve_fixed_point(published)
    # (11) replaced the last phase's equation (12), which holds at the fixed point up to the truncation.
    assert float(jnp.max(jnp.abs(published.published_rhs(published.full(fp.value))))) < 1e-12
    exact = jsmkt.JSQdBMAP(A, d=2, K=K)
    EQ_pub = float(jsmkt.mean_queue_length(published, fp))
    EQ_exact = float(jsmkt.mean_queue_length(exact, jsmkt.solve_fixed_point(exact)))
    assert EQ_pub < 0.5 * EQ_exact, (EQ_pub, EQ_exact)  # 0.327 against 0.867
    res = pub.bmap_fixed_point_residuals(A, 2, K=K)
    assert float(res["published"]) > 1e-2 and float(res["exact"]) > 1e-2, res


def test_framework_checks_its_blocks():
    Q = np.zeros((4, 4))
    with pytest.raises(ValueError, match=r"right\[0\]'s block matrix has shape \(3, 3\).*must be \(4, 4\)"):
        pub.FrameworkAsPublished((1, 1, 2), [(2, np.zeros((3, 3)))], [(1, Q)], 0.5, 1.0)
    with pytest.raises(ValueError, match=r"left\[0\]'s choice number=0"):
        pub.FrameworkAsPublished((1, 1, 2), [(2, Q)], [(0, Q)], 0.5, 1.0)
    with pytest.raises(ValueError, match="levels=.*K >= 2"):
        pub.FrameworkAsPublished((1, 1), [(2, np.zeros((2, 2)))], [(1, np.zeros((2, 2)))], 0.5, 1.0)
    with pytest.raises(ValueError, match="unstable: load"):
        jsmkt.solve_fixed_point(pub.framework_batch_service(1.1, jsmkt.exponential(1.0), [1.0], d=2, K=10))


@pytest.mark.slow
def test_framework_integrates_to_its_fixed_point():
    """`integrate` runs the framework's ODE (6): from the empty system it reaches the fixed point (7)–(8); and
    `jax.grad` flows through the blocks."""
    fw = pub.framework_batch_service(0.7, jsmkt.erlang(2, 1.0), [0.5, 0.5], d=2, K=K)
    traj = jsmkt.integrate(fw, 200.0)
    fp = jsmkt.solve_fixed_point(fw)
    np.testing.assert_allclose(traj.ys[-1], fp.value, rtol=1e-6, atol=1e-9)
    g = jax.grad(lambda lam: jsmkt.mean_queue_length(
        m := pub.framework_batch_service(lam, jsmkt.erlang(2, 1.0), [0.5, 0.5], d=2, K=K),
        jsmkt.solve_fixed_point(m)))(0.7)
    h = 1e-5
    fd = [float(jsmkt.mean_queue_length(m := pub.framework_batch_service(0.7 + s, jsmkt.erlang(2, 1.0), [0.5, 0.5],
                                                                         d=2, K=K), jsmkt.solve_fixed_point(m)))
          for s in (h, -h)]
    assert float(g) == pytest.approx((fd[0] - fd[1]) / (2 * h), rel=1e-6)


@pytest.mark.slow
def test_simulation_referees_batch_service_with_phases():
    """N = 1000, Erlang-2 epochs removing up to 2 jobs: the simulated E[T] is the exact model's (within 1 % and
    the CI), not the framework's."""
    p = jnp.array([0.5, 0.5])
    epochs = jsmkt.erlang(2, 1.0)
    fw = pub.framework_batch_service(1.35, epochs, p, d=2, K=K)
    exact = jsmkt.JSQdBatchService(1.35, epochs, p, d=2, K=K)
    ET = float(jsmkt.mean_sojourn_time(exact, jsmkt.solve_fixed_point(exact)))
    ET_fw = float(jsmkt.mean_sojourn_time(fw, jsmkt.solve_fixed_point(fw)))
    sim = jsmkt.simulate(exact, 1000, 2000.0, key=jr.PRNGKey(4), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)
    assert abs(sim.mean_sojourn_time - ET_fw) > 0.02 * ET + 3 * sim.mean_sojourn_time_ci, (sim.mean_sojourn_time,
                                                                                           ET_fw)
