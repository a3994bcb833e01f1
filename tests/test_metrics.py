"""Metrics against their definitions on the occupancy vector, and against M/M/1 and M/G/1 formulas."""

import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


@pytest.fixture(scope="module")
def solved():
    model = jsmkt.JSQdPH(0.85, jsmkt.coxian([3.0, 0.8], [0.6]), d=jnp.array([0.1, 0.6, 0.3]))
    return model, jsmkt.solve_fixed_point(model)


def test_definitions_on_occupancy(solved):
    model, fp = solved
    x = np.asarray(model.occupancy(fp.value))  # fraction of servers in each local state
    labels = model.state_space()
    jobs = np.array([lab[0] for lab in labels])
    assert abs(x.sum() - 1.0) < 1e-13 and np.all(x >= -1e-15)
    # mean queue length = sum_k k P(Q = k)
    assert abs(float(jsmkt.mean_queue_length(model, fp)) - float(jobs @ x)) < 1e-12
    # utilisation = fraction of non-empty servers
    assert abs(float(jsmkt.utilisation(model, fp)) - float(x[jobs > 0].sum())) < 1e-13
    # queue-length distribution = occupancy aggregated over phases
    dist = np.asarray(jsmkt.queue_length_distribution(model, fp))
    np.testing.assert_allclose(dist, [x[jobs == k].sum() for k in range(model.K + 1)], atol=1e-14)
    # phase tails: servers with >= k jobs in phase i
    P = np.asarray(jsmkt.phase_tails(model, fp))
    for k in (1, 2, 5):
        for i in range(model.m):
            want = sum(x[j] for j, lab in enumerate(labels) if lab[0] >= k and lab[1] == i + 1)  # status i+1: phase i
            assert abs(P[k - 1, i] - want) < 1e-14
    # P(wait) = P(every sampled server busy) = sum_j P(D = j) s_1^j
    w = np.asarray(model.choice.weights())
    s1 = x[jobs > 0].sum()
    assert abs(float(jsmkt.prob_wait(model, fp)) - sum(w[j] * s1 ** (j + 1) for j in range(len(w)))) < 1e-13
    # E[W] = E[T] - E[S]
    ES = 1 / 3.0 + 0.6 / 0.8
    assert abs(float(jsmkt.mean_waiting_time(model, fp)) - (float(jsmkt.mean_sojourn_time(model, fp)) - ES)) < 1e-12
    assert abs(float(jsmkt.tail_mass_at_K(model, fp)) - float(fp.tail_mass)) == 0.0
    assert abs(float(jsmkt.throughput(model, fp)) - 0.85) < 1e-12


def test_mm1_metrics():
    lam, mu = 0.6, 1.5
    model = jsmkt.JSQd(lam, d=1, mu=mu)
    fp = jsmkt.solve_fixed_point(model)
    rho = lam / mu
    assert abs(float(jsmkt.prob_wait(model, fp)) - rho) < 1e-13  # PASTA
    assert abs(float(jsmkt.mean_waiting_time(model, fp)) - rho / (mu - lam)) < 1e-11
    dist = np.asarray(jsmkt.queue_length_distribution(model, fp))
    np.testing.assert_allclose(dist[:20], (1 - rho) * rho ** np.arange(20), rtol=1e-11)


def test_mg1_waiting_probability_and_mean_wait():
    # M/PH/1 (d = 1): P(wait) = rho and Pollaczek-Khinchine E[W] = lam E[S^2] / (2 (1 - rho)).
    svc = jsmkt.erlang(3, mean=0.5)
    lam = 1.2
    model = jsmkt.JSQdPH(lam, svc, d=1)
    fp = jsmkt.solve_fixed_point(model)
    ES, ES2 = 0.5, 3 * 4 / 6.0**2
    rho = lam * ES
    assert abs(float(jsmkt.prob_wait(model, fp)) - rho) < 1e-12
    assert abs(float(jsmkt.mean_waiting_time(model, fp)) - lam * ES2 / (2 * (1 - rho))) < 1e-10


def test_light_load_waiting_time_keeps_its_relative_precision():
    """JSQ(2) at lam = 1e-8: E[W] = lam^2 + lam^6 + ... = 1e-16, far below the rounding of E[T] - E[S]."""
    import jax

    lam = 1e-8
    model = jsmkt.JSQd(lam, d=2, K=8)
    assert float(jsmkt.mean_waiting_time(model, jsmkt.solve_fixed_point(model))) == pytest.approx(lam**2, rel=1e-12)
    dW = jax.grad(lambda x: jsmkt.mean_waiting_time(m := jsmkt.JSQd(x, d=2, K=8), jsmkt.solve_fixed_point(m)))
    assert float(dW(lam)) == pytest.approx(2 * lam, rel=1e-10)


def test_metrics_refuse_trajectories_and_states_of_another_shape():
    model = jsmkt.JSQd(0.9, d=2, K=20)
    tr = jsmkt.integrate(model, 5.0, ts=[1.0, 5.0])
    with pytest.raises(ValueError, match=r"state is a jsmkt.Trajectory.*one snapshot"):
        jsmkt.mean_queue_length(model, tr)
    with pytest.raises(ValueError, match=r"state has shape \(3,\), but the reduced state of this model \(K=20\)"):
        jsmkt.mean_queue_length(model, 0.5 * jnp.ones(3))
