"""Sojourn- and waiting-time laws of `JSQdBMAP` (one BMAP feeds all servers): with d = 1 against the M^X/M/1 FCFS
queue of the averaged batch rates, derived here independently; their means against Little's law for several
two-phase BMAPs; the CLI's percentiles; and (slow) the mean-field p99 against an N = 1000 simulation."""

import json
import pathlib

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.optimize
import scipy.stats

import jsmkt
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# The example's BMAP (examples/jsq_bmap.toml, tests/test_bmap.py): phase 0 sends single jobs, phase 1 pairs and
# single jobs that switch it back; slow switching.
C = np.array([[-0.52, 0.02], [0.0, -0.41]])
D = np.array([[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])
K_EXAMPLE = 20  # the example's K (d = 2, mu = 0.7): every d = 2 model here has its shapes


def _batch_rates(C, D):
    """lambda_b = gamma D_b 1, gamma from the left null vector of C + sum_b D_b by an eigendecomposition."""
    w, v = np.linalg.eig((C + D.sum(axis=0)).T)
    g = np.real(v[:, np.argmin(np.abs(w))])
    return np.einsum("i,bij->b", g / g.sum(), D)


def _mx_m1_laws(lam_b, mu, levels=400):
    r"""Survival functions of the sojourn and waiting times of a job in the M^X/M/1 FCFS queue (batches of b at
    rate lam_b[b-1]), and the law of its position. A batch sees the stationary number n in system (PASTA), here
    from the generator truncated at `levels` by a dense linear solve; the tagged job is in a batch of b with
    probability b lam_b / sum(b lam_b) and is its j-th job, j uniform on 1..b, so it has n + j - 1 jobs ahead and
    P(position = k) = sum_n pi_n P(B >= k - n) / E[B]. Its sojourn time is Erlang(k, mu) given k (exponential,
    memoryless services), its waiting time Erlang(k - 1, mu) (0 for k = 1): mixtures of Erlang laws."""
    lam_b = np.asarray(lam_b, float)
    B = lam_b.size
    Q = np.zeros((levels + 1, levels + 1))
    for n in range(levels + 1):
        for b in range(1, B + 1):
            Q[n, min(n + b, levels)] += lam_b[b - 1]
        if n:
            Q[n, n - 1] += mu
    np.fill_diagonal(Q, 0.0)
    np.fill_diagonal(Q, -Q.sum(axis=1))
    pi = np.linalg.solve(np.vstack([Q.T[:-1], np.ones(levels + 1)]), np.eye(levels + 1)[-1])
    p = lam_b / lam_b.sum()
    at_least = np.cumsum(p[::-1])[::-1]  # P(B >= i), i = 1..B
    EB = p @ np.arange(1, B + 1)
    pos = np.convolve(pi, np.concatenate([[0.0], at_least])) / EB  # pos[k] = P(position = k)
    k = np.arange(pos.size)

    def sojourn(t):
        return float(pos[1:] @ scipy.stats.gamma.sf(t, a=k[1:], scale=1.0 / mu))

    def wait(t):
        return float(pos[2:] @ scipy.stats.gamma.sf(t, a=k[2:] - 1, scale=1.0 / mu))

    return sojourn, wait, pos


@pytest.mark.parametrize("which", ["one phase", "two phases"])
def test_d1_is_the_mx_m1_fcfs_queue(which):
    """d = 1: each server is the M^X/M/1 FCFS queue of the averaged batch rates. One phase is batch Poisson; with
    two phases the BMAP's phase moves and correlations average out in the limit, so only lambda_b = gamma D_b 1
    matters (here from an eigenvector). The sojourn and waiting times' survival functions equal the queue's (above)
    to 1e-10, the waiting time's atom is P(position 1), quantiles are the roots of the queue's survival functions,
    and the means are the queue's mean position (and one less) over mu."""
    if which == "one phase":
        A = jsmkt.BMAP([[-0.48]], [[[0.24]], [[0.14]], [[0.10]]])  # batches of 1, 2, 3: load 0.82
        lam_b, mu = np.array([0.24, 0.14, 0.10]), 1.0
    else:
        A, lam_b, mu = jsmkt.BMAP(C, D), _batch_rates(C, D), 0.9  # the shapes of tests/test_bmap.py's d = 1 model
    model = jsmkt.JSQdBMAP(A, d=1, mu=mu)
    fp = jsmkt.solve_fixed_point(model)
    T = jsmkt.sojourn_time_distribution(model, fp)
    W = jsmkt.waiting_time_distribution(model, fp)
    sojourn, wait, pos = _mx_m1_laws(lam_b, mu)
    xs = np.array([0.0, 0.3, 1.0, 3.0, 8.0, 20.0, 40.0])
    np.testing.assert_allclose(1.0 - np.asarray(T.cdf(xs)), [sojourn(x) for x in xs], rtol=0, atol=1e-10)
    np.testing.assert_allclose(1.0 - np.asarray(W.cdf(xs)), [wait(x) for x in xs], rtol=0, atol=1e-10)
    assert float(W.atom) == pytest.approx(pos[1], abs=1e-12)
    mean_pos = pos @ np.arange(pos.size)
    assert float(T.mean) == pytest.approx(mean_pos / mu, rel=1e-10)
    assert float(W.mean) == pytest.approx((mean_pos - 1.0) / mu, rel=1e-10)
    ps = np.array([0.5, 0.9, 0.99, 0.9999])
    exact = [scipy.optimize.brentq(lambda x, p=p: sojourn(x) - (1.0 - p), 0.0, 500.0, xtol=1e-13) for p in ps]
    np.testing.assert_allclose(np.asarray(T.quantile(ps)), exact, rtol=1e-9)
    exact = [scipy.optimize.brentq(lambda x, p=p: wait(x) - (1.0 - p), 0.0, 500.0, xtol=1e-13) for p in ps]
    np.testing.assert_allclose(np.asarray(W.quantile(ps)), exact, rtol=1e-9)


def test_means_are_littles_law_for_two_phase_bmaps():
    """d = 2, several two-phase BMAPs (slow and fast switching, batches of 1 and 2 from either phase): the
    sojourn and waiting laws' means equal Little's law (`mean_sojourn_time`, `mean_waiting_time`) and the waiting
    time's atom is 1 - `prob_wait`; the phase matters through the size-biased batch law of arriving jobs only, so
    the laws equal those of the batch-Poisson limit (`JSQdBMAP.limit()`, a different description: one dispatch
    with random jumps)."""
    bmaps = [
        (C, D, 0.7),  # examples/jsq_bmap.toml: load 0.807
        (np.array([[-3.0, 1.0], [2.0, -3.5]]), np.array([[[1.5, 0.2], [0.1, 0.6]], [[0.1, 0.2], [0.2, 0.6]]]), 2.6),
        (np.array([[-0.36, 0.01], [0.03, -0.93]]), np.array([[[0.05, 0.0], [0.4, 0.1]], [[0.3, 0.0], [0.0, 0.4]]]),
         1.1),
    ]
    xs = jnp.array([0.5, 2.0, 6.0])
    for C_, D_, mu in bmaps:
        A = jsmkt.BMAP(C_, D_)
        model = jsmkt.JSQdBMAP(A, d=2, mu=mu, K=K_EXAMPLE)
        fp = jsmkt.solve_fixed_point(model)
        assert float(jsmkt.tail_mass_at_K(model, fp)) < 1e-13
        T = jsmkt.sojourn_time_distribution(model, fp)
        W = jsmkt.waiting_time_distribution(model, fp)
        assert float(T.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-10)
        assert float(W.mean) == pytest.approx(float(jsmkt.mean_waiting_time(model, fp)), rel=1e-10)
        assert float(W.atom) == pytest.approx(1.0 - float(jsmkt.prob_wait(model, fp)), rel=1e-10)
        limit = model.limit()
        fp_limit = jsmkt.solve_fixed_point(limit)
        np.testing.assert_allclose(np.asarray(T.cdf(xs)),
                                   np.asarray(jsmkt.sojourn_time_distribution(limit, fp_limit).cdf(xs)), atol=1e-12)
        np.testing.assert_allclose(np.asarray(W.cdf(xs)),
                                   np.asarray(jsmkt.waiting_time_distribution(limit, fp_limit).cdf(xs)), atol=1e-12)


def test_probe_rate_counts_the_batches():
    """`probe_rate`: each batch samples d servers, at the BMAP's batch rate sum_b gamma D_b 1 per server (its
    modulated streams at their mean-field rates)."""
    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=2, mu=0.7, K=K_EXAMPLE)
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.probe_rate(model, fp)) == pytest.approx(2 * _batch_rates(C, D).sum(), rel=1e-12)
    assert float(jsmkt.probe_rate(model, fp, stream="batch of 2")) == pytest.approx(2 * 0.0875, rel=1e-12)


def test_cli_prints_the_percentiles(capsys):
    """`jsmkt solve examples/jsq_bmap.toml --percentiles 50,90,99` prints the sojourn- and waiting-time percentiles
    (in JSON those of `jsmkt.sojourn_time_distribution` and `jsmkt.waiting_time_distribution`)."""
    spec = str(EXAMPLES / "jsq_bmap.toml")
    code = main(["solve", spec, "--percentiles", "50,90,99"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "sojourn time percentiles" in out.out and "waiting time percentiles" in out.out
    assert "Traceback" not in out.err
    code = main(["solve", spec, "--percentiles", "50,90,99", "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    res = json.loads(out.out)
    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=2, mu=0.7, K=res["K"])
    fp = jsmkt.solve_fixed_point(model)
    p = jnp.array([0.5, 0.9, 0.99])
    for key, dist in (("sojourn_time_percentiles", jsmkt.sojourn_time_distribution(model, fp)),
                      ("waiting_time_percentiles", jsmkt.waiting_time_distribution(model, fp))):
        assert len(res[key]) == 3
        np.testing.assert_allclose(sorted(res[key].values()), np.asarray(dist.quantile(p)), rtol=1e-9)


@pytest.mark.slow
def test_p99_against_simulation():
    """N = 1000 servers fed by the example's BMAP (slow switching, load 0.807): the mean-field p99 of the sojourn
    time lies within the 95 % interval of the simulated one, and the mean-field p99 of the waiting time within it
    plus 1 %."""
    model = jsmkt.JSQdBMAP(jsmkt.BMAP(C, D), d=2, mu=0.7)
    assert model.K == K_EXAMPLE
    fp = jsmkt.solve_fixed_point(model)
    T99 = float(jsmkt.sojourn_time_distribution(model, fp).quantile(0.99))
    W99 = float(jsmkt.waiting_time_distribution(model, fp).quantile(0.99))
    sim = jsmkt.simulate(model, 1000, 1000.0, warmup=100.0, key=jr.PRNGKey(7), n_replications=4,
                         percentiles=(99,), waiting_times=True)
    v, ci = sim.sojourn_time_percentile(99)
    assert abs(T99 - v) <= ci, (T99, v, ci)
    v, ci = sim.waiting_time_percentile(99)
    assert abs(W99 - v) <= ci + 0.01 * v, (W99, v, ci)
