"""The `BMAP` arrival process and `JSQdBMAP` (one BMAP for the whole system): the stationary phase against an
eigenvector, sampling against the rates, the d = 1 limit against M^X/M/1, gradients against central differences,
the simulator's phase against the process, and N = 1000 simulation (slow)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jsmkt


# Phase 0 sends single jobs; phase 1 batches of 2, and single jobs that switch it back; slow switching.
C = np.array([[-0.52, 0.02], [0.0, -0.41]])
D = np.array([[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])


def _independent_rates(C, D):
    """Batch rates from the left null vector of the generator by an eigendecomposition (not a linear solve)."""
    G = C + D.sum(axis=0)
    w, v = np.linalg.eig(G.T)
    g = np.real(v[:, np.argmin(np.abs(w))])
    g = g / g.sum()
    return g, np.einsum("i,bij->b", g, D)


def test_stationary_phase_and_rates():
    A = jsmkt.BMAP(C, D)
    g, lam = _independent_rates(C, D)
    np.testing.assert_allclose(A.gamma, g, rtol=1e-13)
    np.testing.assert_allclose(A.batch_rates, lam, rtol=1e-13)
    assert float(A.rate) == pytest.approx(lam @ np.arange(1, 3), rel=1e-13)
    assert A.order == 2 and A.max_batch == 2
    # A single (m, m) matrix is a MAP (batches of 1); a Poisson process has one phase.
    P = jsmkt.BMAP([[-0.7]], [[0.7]])
    assert P.D.shape == (1, 1, 1) and float(P.rate) == pytest.approx(0.7)


def test_sampling_gives_the_rates(getkey):
    """Over n batches from the stationary phase: the batch frequencies against lambda_b / sum(lambda) and the
    batch rate against n / (time of the last batch), within 5 standard errors (the counts of a correlated process:
    the error is taken from 20 independent runs)."""
    A = jsmkt.BMAP(C, D)
    _, lam = _independent_rates(C, D)
    runs = [A.sample(k, 2000) for k in jr.split(getkey(), 20)]
    rate = np.array([2000 / float(t[-1]) for t, _, _ in runs])
    frac2 = np.array([float(np.mean(np.asarray(b) == 2)) for _, b, _ in runs])
    for est, exact in ((rate, lam.sum()), (frac2, lam[1] / lam.sum())):
        assert abs(est.mean() - exact) < 5 * est.std(ddof=1) / np.sqrt(est.size), (est.mean(), exact)
    t, b, ph = runs[0]
    assert np.all(np.diff(np.asarray(t)) >= 0) and set(np.unique(b).tolist()) <= {1, 2}
    # A batch of 2 comes from phase 1 and leaves it there.
    assert np.all(np.asarray(ph)[np.asarray(b) == 2] == 1)


@pytest.mark.parametrize("C_, D_, match", [
    (np.array([[-0.49, -0.03], [0.0, -0.41]]), D, r"C\[0, 1\]=-0.03 is negative"),
    (C, D + np.array([[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [-0.1, 0.0]]]), r"D\[1\]\[1, 0\]=-0.1 .*batches of 2"),
    (C + np.array([[0.1, 0.0], [0.0, 0.0]]), D, r"row 0 of C \+ sum_b D\[b\] sums to 0.(1|09)\d*, not 0: set C\[0, 0\] = -0.52"),
    (np.array([[-0.5, 0.0], [0.0, -0.35]]), np.array([[[0.5, 0.0], [0.0, 0.35]]]), "reducible"),
    (C, D[:, :1, :1], r"D has shape \(2, 1, 1\) but C has 2 phase"),
    (C[:1], D, r"C has shape \(1, 2\)"),
    ([[0.0]], [[0.0]], "D is zero"),
    ("x", D, "C='x' is not a number"),
])
def test_bad_descriptors_name_the_entry(C_, D_, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.BMAP(C_, D_)


def test_traced_bad_descriptors_are_caught_at_the_entry_points():
    @jax.jit
    def ET(c01):
        A = jsmkt.BMAP(jnp.array([[-0.52, 0.0], [0.0, -0.41]]).at[0, 1].set(c01), D)
        m = jsmkt.JSQdBMAP(A, d=2, K=30)
        return jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m))

    assert np.isfinite(float(ET(0.02)))
    with pytest.raises((ValueError, RuntimeError), match="the BMAP is not a descriptor"):
        ET(0.05)  # row 0 sums to 0.03
    with pytest.raises(ValueError, match="must be a jsmkt.BMAP"):
        jsmkt.JSQdBMAP((C, D))


def test_d1_is_the_mx_m1_queue():
    """The phase averages out: with d = 1 each server is the M^X/M/1 queue of the averaged batch rates (not a
    BMAP/M/1 queue). From the pgf P(z) = mu (1 - rho)(1 - z) / (mu (1 - z) - z sum_b lam_b (1 - z^b)):
    E[N] = P'(1) = (sum_b lam_b b (b + 1) / 2) / (mu - sum_b b lam_b). (The averaged drift itself, derived from
    the description's `Modulation`, is checked against the hand-written one by `tests/test_families.py`, and the
    gradients with respect to entries of C and D against central differences there.)"""
    A = jsmkt.BMAP(C, D)
    _, lam = _independent_rates(C, D)
    mu = 0.9
    b = np.arange(1, lam.size + 1)
    model = jsmkt.JSQdBMAP(A, d=1, mu=mu)
    fp = jsmkt.solve_fixed_point(model)
    EN = float(lam @ (b * (b + 1) / 2)) / (mu - float(lam @ b))
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(EN, rel=1e-10)
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(float(lam @ b), rel=1e-10)


def _bmap_m1_mean_queue(C, D, mu, levels=300):
    """E[Q] of the BMAP/M/1 queue (one server fed by the BMAP itself), from the stationary law of its
    (level, phase) chain truncated at `levels` (batches that would pass it are cut), by a dense linear solve."""
    m, B = C.shape[0], D.shape[0]
    n = (levels + 1) * m
    Q = np.zeros((n, n))
    for k in range(levels + 1):
        rows = slice(k * m, (k + 1) * m)
        Q[rows, rows] += C
        for b in range(1, B + 1):
            t = min(k + b, levels)
            Q[rows, t * m:(t + 1) * m] += D[b - 1]
        if k:
            Q[rows, (k - 1) * m:k * m] += mu * np.eye(m)
    np.fill_diagonal(Q, 0.0)
    np.fill_diagonal(Q, -Q.sum(axis=1))
    A = np.vstack([Q.T[:-1], np.ones(n)])
    pi = np.linalg.solve(A, np.eye(n)[-1])
    return float(np.repeat(np.arange(levels + 1), m) @ pi)


@pytest.mark.slow
def test_simulated_phase_with_one_server_is_the_bmap_m1_queue():
    """N = 1, d = 1: the simulator's global phase drives one queue, a BMAP/M/1 queue (whose mean differs from the
    M^X/M/1 limit's: the phase's correlation is not averaged out with one server)."""
    mu = 0.9
    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=1, mu=mu)
    exact = _bmap_m1_mean_queue(C, D, mu)
    mx = float(jsmkt.mean_queue_length(model, jsmkt.solve_fixed_point(model)))
    sim = jsmkt.simulate(model, 1, 6e5, key=jr.PRNGKey(5), n_replications=8, max_queue=300)
    se = sim.mean_queue_length_ci / 2.365  # 95 % half-width of 8 replications -> standard error
    assert abs(sim.mean_queue_length - exact) < 4 * se, (sim.mean_queue_length, sim.mean_queue_length_ci, exact)
    assert abs(exact - mx) > 8 * se  # the test tells BMAP/M/1 (2.135) from M^X/M/1 (1.948)


@pytest.mark.slow
def test_agrees_with_simulation_n1000_at_load_09():
    """A strongly correlated BMAP at load 0.9: E[T] of N = 1000 servers within 1 % (plus the 95 % CI) of the
    batch-Poisson limit, and the job throughput within its CI of the BMAP's rate; the paper's closed form (35)-(36)
    is far from it (E[T] by Little's law)."""
    A = jsmkt.BMAP(C, D)
    mu = float(A.rate) / 0.9
    model = jsmkt.JSQdBMAP(A, d=2, mu=mu)
    ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    sim = jsmkt.simulate(model, 1000, 3000.0, warmup=300.0, key=jr.PRNGKey(11), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)
    assert abs(sim.throughput - float(A.rate)) < 2 * sim.throughput_ci + 1e-3 * float(A.rate)
    closed = float(np.sum(np.asarray(jsmkt.published.bmap_fixed_point(A, 2, mu, model.K))[1:])) / float(A.rate)
    assert abs(sim.mean_sojourn_time - closed) > 0.3 * ET, (sim.mean_sojourn_time, closed)


def test_the_phase_noise_is_the_bmap_counting_variance():
    """`modulation_noise`'s Sigma, for the job count (Phi_s = the batch size s + 1), with the Poisson part
    sum_b lam_b b^2 gives the asymptotic variance rate of the BMAP's job count, lim Var N(t) / t. Independently:
    the second derivative at 0 of the Perron eigenvalue of C + sum_b D_b e^(theta b) (its cumulant rate), by
    finite differences of `numpy.linalg.eigvals`."""
    from jsmkt._refined_terms import modulation_noise

    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=2, K=8)
    x = jnp.full(model.K + 1, 1.0 / (model.K + 1))
    Phi, sigma, _ = modulation_noise(model.description(), x)
    assert Phi.shape == (2, model.K + 1) and np.allclose(np.sum(Phi, axis=1), 0.0, atol=1e-15)
    _, lam = _independent_rates(C, D)
    b = np.arange(1, 3)
    var = lam @ b**2 + b @ np.asarray(sigma) @ b

    def perron(t):
        return np.max(np.linalg.eigvals(C + sum(D[k] * np.exp(t * (k + 1)) for k in range(2))).real)

    h = 1e-2
    curv = (-perron(2 * h) + 16 * perron(h) - 30 * perron(0.0) + 16 * perron(-h) - perron(-2 * h)) / (12 * h * h)
    assert var == pytest.approx(curv, rel=1e-6)
    assert var > 1.25 * (lam @ b**2)  # the phase's correlation adds 30 % to the Poisson part here


@pytest.mark.slow
def test_refined_mean_field_predicts_the_finite_n_gap():
    """N = 100, slow switching: the simulated E[Q] within 4 standard errors of the refined mean field with the
    phase's noise and bias, and not of the refined mean field of the batch-Poisson limit (which misses the phase's
    correlation)."""
    A = jsmkt.BMAP([[-0.502, 0.002], [0.0, -0.356]], [[[0.5, 0.0], [0.006, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])
    model = jsmkt.JSQdBMAP(A, d=2, mu=float(A.rate) / 0.8)
    limit = model.limit()
    refined = float(jsmkt.mean_queue_length(
        model, jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model)).state(100)))
    poisson = float(jsmkt.mean_queue_length(
        limit, jsmkt.refined_mean_field(jsmkt.solve_fixed_point(limit)).state(100)))
    sim = jsmkt.simulate(model, 100, 20000.0, key=jr.PRNGKey(1), n_replications=4)
    se = sim.mean_queue_length_ci / 3.182  # 95 % half-width of 4 replications -> standard error
    assert abs(sim.mean_queue_length - refined) < 4 * se, (sim.mean_queue_length, sim.mean_queue_length_ci, refined)
    assert abs(sim.mean_queue_length - poisson) > 8 * se, (sim.mean_queue_length, poisson)


def test_refined_bias_is_the_exact_finite_n_slope_at_d1():
    """d = 1: server i of the N-server system is exactly a BMAP/M/1 queue, fed by the batches sent to it (D_b) while
    the global phase also moves at N C and with the batches sent elsewhere ((N - 1) D_b). The slope
    N (E[Q]_N - E[Q]_inf) of that exact solution (Richardson-extrapolated from N = 500, 1000, 2000, which removes its
    1/N and 1/N^2 terms; larger N make the chain stiff) is the refined mean field's 1/N coefficient (the phase's
    bias: d = 1 has a linear drift, so this is all of V)."""
    mu = 0.9
    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=1, mu=mu)
    fp = jsmkt.solve_fixed_point(model)
    EQ = float(jsmkt.mean_queue_length(model, fp))
    rmf = jsmkt.refined_mean_field(fp)
    slope_refined = float(jsmkt.mean_queue_length(model, rmf.state(1.0))) - EQ
    slopes = [n * (_bmap_m1_mean_queue(n * C + (n - 1) * D.sum(axis=0), D, mu) - EQ) for n in (500, 1000, 2000)]
    slope_exact = (slopes[0] - 6 * slopes[1] + 8 * slopes[2]) / 3
    assert slope_refined == pytest.approx(slope_exact, rel=1e-5), (slope_refined, slopes)
    assert slope_refined > 0.3  # the phase's correlation gives a 1/N term (none for Poisson batches, d = 1)
