"""The law of a job's sojourn time with N servers to order 1/N (`jsmkt.refined_sojourn_time_distribution`): against
the exact laws of small systems, against the refined mean of Little's law (an independent route through the
occupancy's expansion), by finite differences, and through the CLI."""

import json

import jax
import numpy as np
import pytest
from test_refined import _finite_n_chain

import jsmkt


LAM, D, K_SMALL = 0.7, 2, 4


def _exact_survival(N, replace, ts):
    """P(T > t) of JSQ(2) with N exponential servers (rate 1) and buffer K_SMALL, exactly: an arrival sees the
    stationary counts (PASTA), joins a server with k jobs with probability P(all d sampled have >= k) -
    P(all d have >= k + 1), and, FCFS, stays an Erlang(k + 1) time; jobs that find a full queue are lost."""
    import scipy.sparse.linalg as spla
    from scipy.stats import gamma

    _, G, join = _finite_n_chain(N, K_SMALL, LAM, D, replace)
    G = G.T.tocsc()
    pi = np.concatenate([[1.0], spla.spsolve(G[1:, 1:], -G[1:, 0].toarray().ravel())])
    pi /= pi.sum()
    join = pi @ join
    join /= join.sum()
    return np.array([sum(join[k] * gamma.sf(t, k + 1) for k in range(K_SMALL)) for t in ts])


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_against_exact_small_systems(sampling):
    """The mean-field law is off by O(1/N), the refined one by O(1/N^2): fitted log-log slopes of the largest
    CDF error over t against N = 8, 12, 16, 24 near -1 and -2."""
    model = jsmkt.JSQd(LAM, d=D, K=K_SMALL)
    fp = jsmkt.solve_fixed_point(model, tail_tol=1.0)  # the finite systems have the same buffer
    rmf = jsmkt.refined_mean_field(fp, sampling=sampling)
    ts = np.array([0.5, 1.0, 2.0, 4.0, 7.0])
    Ns = np.array([8, 12, 16, 24])
    err_mf, err_ref = [], []
    for N in Ns:
        exact = _exact_survival(int(N), sampling == "with_replacement", ts)
        T = jsmkt.refined_sojourn_time_distribution(rmf, int(N))
        err_mf.append(np.max(np.abs(1.0 - np.asarray(T.mean_field.cdf(ts)) - exact)))
        err_ref.append(np.max(np.abs(1.0 - np.asarray(T.cdf(ts)) - exact)))
    slope_mf = np.polyfit(np.log(Ns), np.log(err_mf), 1)[0]
    slope_ref = np.polyfit(np.log(Ns), np.log(err_ref), 1)[0]
    assert -1.3 < slope_mf < -0.8, (err_mf, slope_mf)
    assert -2.6 < slope_ref < -1.7, (err_ref, slope_ref)
    assert err_ref[-1] < 0.15 * err_mf[-1]


CONSISTENT = {
    # a stay that depends on the server only: the 1/N term is the refined joining law's
    "jsq2-h2": lambda: jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=33),
    # helpers move a job forward at rates the occupancy sets: the occupancy-stay covariance enters
    "helpers": lambda: jsmkt.JSQdClasses([0.7], d=[2], helper_rates=[0.2], f=[2], K=25),
    # own-orbit retrials: random-order servers, whose new arrivals compete with the orbit for the server
    "own-retrials": lambda: jsmkt.RetrialJSQ(0.7, 1.0, retrial="own", K=30),
}


@pytest.mark.parametrize("case", sorted(CONSISTENT))
@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_mean_is_the_refined_little_law(case, sampling):
    """The refined law's mean equals E[Q]/throughput of the refined occupancy (Little's law, expanded through the
    occupancy alone), and its waiting time's mean that of the waiting jobs: two exact 1/N expansions of one
    number. Leaving out the occupancy-stay covariance breaks it for helpers by 0.5 %; starting the covariance of the
waiting jobs at the wrong positions breaks the waiting time's for helpers and retrials."""
    model = CONSISTENT[case]()
    fp = jsmkt.solve_fixed_point(model)
    rmf = jsmkt.refined_mean_field(fp, sampling=sampling)
    N = 20
    T = jsmkt.refined_sojourn_time_distribution(rmf, N)
    y = rmf.state(N)
    assert float(T.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, y)), rel=1e-11)
    assert float(T.mean_field.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-11)
    assert abs(float(T.mean) - float(T.mean_field.mean)) > 1e-3  # the test sees the correction
    W = jsmkt.refined_waiting_time_distribution(rmf, N)
    assert float(W.mean) == pytest.approx(float(jsmkt.mean_waiting_time(model, y)), rel=1e-11)
    p99 = float(T.quantile(0.99))
    assert float(T.cdf(p99)) == pytest.approx(0.99, abs=1e-12)


def test_gradient_of_the_refined_p99():
    """d p99 / d lam of the refined law with 50 servers against central differences."""
    def p99(lam):
        model = jsmkt.JSQd(lam, d=2, K=40)
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
        return jsmkt.refined_sojourn_time_distribution(rmf, 50).quantile(0.99)

    g = float(jax.grad(p99)(0.9))
    h = 1e-5
    fd = (float(p99(0.9 + h)) - float(p99(0.9 - h))) / (2 * h)
    assert g == pytest.approx(fd, rel=1e-6)


def test_refusals():
    model = jsmkt.JSQd(0.9, d=2, K=40)
    fp = jsmkt.solve_fixed_point(model)
    with pytest.raises(ValueError, match="refined must be a jsmkt.RefinedMeanField"):
        jsmkt.refined_sojourn_time_distribution(fp, 20)
    rmf = jsmkt.refined_mean_field(fp)
    with pytest.raises(ValueError, match="n_servers=0 must be a number of servers >= 1"):
        jsmkt.refined_sojourn_time_distribution(rmf, 0)
    with pytest.raises(ValueError, match=r"RefinedMeanField: .* is jsmkt.refined_sojourn_time_distribution"):
        jsmkt.sojourn_time_distribution(model, rmf)
    bmap = jsmkt.JSQdBMAP(jsmkt.BMAP([[-2.0, 1.0], [0.5, -1.0]], [[[0.5, 0.5], [0.2, 0.3]]]), d=2, K=30)
    with pytest.raises(ValueError, match="no refined sojourn time distribution: its servers share an environment"):
        jsmkt.refined_sojourn_time_distribution(jsmkt.refined_mean_field(jsmkt.solve_fixed_point(bmap)), 20)


def test_cli_servers_and_percentiles(tmp_path, capsys):
    """`jsmkt solve --servers N --percentiles`: the refined quantiles beside the mean field's, in text and JSON."""
    from jsmkt.cli import main

    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nd = 2\nK = 40\n')
    assert main(["solve", str(spec), "--servers", "50", "--percentiles", "50,99", "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    model = jsmkt.JSQd(0.9, d=2, K=40)
    T = jsmkt.refined_sojourn_time_distribution(jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model)), 50)
    r = res["refined"]
    assert r["sojourn_time_percentiles"]["p99"] == pytest.approx(float(T.quantile(0.99)), rel=1e-12)
    assert r["sojourn_time_percentiles"]["p99"] > res["sojourn_time_percentiles"]["p99"]
    assert set(r["waiting_time_percentiles"]) == {"p50", "p99"}
    assert main(["solve", str(spec), "--servers", "50", "--percentiles", "99"]) == 0
    out = capsys.readouterr().out
    assert "sojourn time percentiles   p99=" in out and "(order 1/N)" in out


def test_vmap_with_a_failed_entry():
    """Under `vmap` an unstable entry (a failed fixed point) gives NaN, the others their values."""
    def p99(lam):
        fp = jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=40), throw=False)
        return jsmkt.refined_sojourn_time_distribution(jsmkt.refined_mean_field(fp), 50, max_terms=2048).quantile(0.99)

    out = np.asarray(jax.vmap(p99)(np.array([0.9, 1.2])))
    assert out[0] == pytest.approx(float(p99(0.9)), rel=1e-10) and np.isnan(out[1])
