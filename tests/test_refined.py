"""Tests of the refined mean field `jsmkt.refined_mean_field` (the 1/N expansion of the steady state).

Exact references that share no code with it: for d = 1 the N servers are independent M/PH/1 queues, so
N Cov(Y^N) is the covariance of one server's indicators 1{Q >= k, phase i} and the 1/N bias is zero; work
conservation makes the utilisation s_1 = lam E[S] exact at every N, so its 1/N term is zero for every d; finite
differences for gradients; and (slow) the finite-N simulator.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt
from jsmkt._refined import lyapunov


def test_lyapunov_against_kronecker_solve():
    rng = np.random.default_rng(0)
    for n in (1, 3, 7):
        A = rng.normal(size=(n, n)) - 4.0 * np.eye(n) * (1 + np.arange(n))  # stable, non-normal, stiff-ish
        A = A * 10.0 ** rng.uniform(-2, 1, size=(n, 1))
        G = rng.normal(size=(n, n))
        Q = G @ G.T
        W = np.asarray(lyapunov(jnp.asarray(A), jnp.asarray(Q)))
        # vec(AW + WA') = (I (x) A + A (x) I) vec(W)
        K = np.kron(np.eye(n), A) + np.kron(A, np.eye(n))
        W_ref = np.linalg.solve(K, -Q.reshape(-1)).reshape(n, n)
        np.testing.assert_allclose(W, W_ref, rtol=1e-9, atol=1e-12 * np.abs(W_ref).max())


def test_d1_exponential_is_iid_mm1():
    """d = 1: servers are independent M/M/1 queues, s_k = rho^k; N Cov(s_k, s_l) = rho^max(k,l) - rho^(k+l)."""
    lam, K = 0.7, 100
    model = jsmkt.JSQd(lam, d=1, K=K)
    rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
    k = np.arange(1, K + 1)
    W_exact = lam ** np.maximum.outer(k, k) - lam ** np.add.outer(k, k)
    np.testing.assert_allclose(np.asarray(rmf.covariance), W_exact, atol=1e-12)
    np.testing.assert_allclose(np.asarray(rmf.correction), 0.0, atol=1e-12)
    # A nonlinear function: E[s_1^2] = rho^2 + rho(1 - rho)/N exactly for iid servers; sd(s_1) = sqrt(rho(1-rho)/N).
    N = 50
    e = rmf.expectation(lambda y: jsmkt.tails(model, y)[1] ** 2, N)
    assert float(e) == pytest.approx(lam**2 + lam * (1 - lam) / N, rel=1e-12)
    sd = rmf.std(lambda y: jsmkt.tails(model, y)[1], N)
    assert float(sd) == pytest.approx(math.sqrt(lam * (1 - lam) / N), rel=1e-10)
    # Array-valued: every level at once, sd(s_k) = sqrt(rho^k (1 - rho^k) / N), shaped like the output.
    sds = rmf.std(lambda y: jsmkt.tails(model, y)[1:11].reshape(2, 5), N)
    assert sds.shape == (2, 5)
    np.testing.assert_allclose(np.ravel(sds), np.sqrt(lam ** k[:10] * (1 - lam ** k[:10]) / N), rtol=1e-10)


def test_d1_ph_per_phase_covariance():
    """d = 1, Erlang-2 and H2 service: W_{(k,i),(l,j)} = delta_ij S_{max(k,l),i} - S_{k,i} S_{l,j}, where S are the
    per-phase tails of the single-server M/PH/1 queue."""
    for service in (jsmkt.erlang(2, 1.0), jsmkt.hyperexponential2(1.0, 4.0)):
        model = jsmkt.JSQdPH(0.6, service, d=1)
        fp = jsmkt.solve_fixed_point(model)
        rmf = jsmkt.refined_mean_field(fp)
        S = np.asarray(fp.value)  # (K, m)
        K, m = S.shape
        kk = np.arange(K)
        W_exact = np.zeros((K, m, K, m))
        top = np.maximum.outer(kk, kk)
        for i in range(m):
            W_exact[:, i, :, i] += S[top, i]
        W_exact -= np.einsum("ki,lj->kilj", S, S)
        np.testing.assert_allclose(np.asarray(rmf.covariance), W_exact.reshape(K * m, K * m), atol=1e-11)
        np.testing.assert_allclose(np.asarray(rmf.correction), 0.0, atol=1e-11)


@pytest.mark.parametrize("d", [2, 3, 1.5])
def test_utilisation_has_no_finite_n_correction(d):
    """Work conservation: the fraction of busy servers is lam E[S] for every N, so V_1 = 0; the 1/N corrections of
    the deeper tails are positive (a finite system is slower), as measured in experiments/verification."""
    for model in (jsmkt.JSQd(0.9, d=d), jsmkt.JSQdPH(0.85, jsmkt.coxian2(1.0, 2.0), d=d)):
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
        v = np.asarray(jsmkt.tails(model, rmf.correction))  # linear: tails of V (with a spurious s_0 = 1)
        assert abs(v[1]) < 1e-10
        assert np.all(v[2:5] > 0)


def test_gradient_of_refined_mean_queue_length():
    """d/dlam of the 1/N coefficient of E[Q] by implicit differentiation against central differences."""

    def coeff(lam):
        model = jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, 2.0), d=2, K=60)
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
        return jsmkt.mean_queue_length(model, rmf.correction)

    lam, h = 0.8, 1e-5
    g = float(jax.grad(coeff)(lam))
    fd = (float(coeff(lam + h)) - float(coeff(lam - h))) / (2 * h)
    assert g == pytest.approx(fd, rel=1e-6)


def test_vmap_over_parameters():
    lams = jnp.array([0.5, 0.7, 0.9])

    def coeff(lam):
        model = jsmkt.JSQd(lam, d=2, K=40)
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model, throw=False))
        return jsmkt.mean_queue_length(model, rmf.correction)

    batched = jax.vmap(coeff)(lams)
    one_by_one = jnp.stack([coeff(x) for x in lams])
    np.testing.assert_allclose(np.asarray(batched), np.asarray(one_by_one), rtol=1e-10)


def test_errors():
    model = jsmkt.JSQd(0.5, d=2)
    with pytest.raises(TypeError, match="fixed_point must be a jsmkt.FixedPoint"):
        jsmkt.refined_mean_field(model)
    rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
    with pytest.raises(ValueError, match=r"n_servers=0 must be a number of servers >= 1"):
        rmf.state(0)
    # Regression: a traced n <= 0 gave numbers (E[Q] below the mean field at n = -3), and 10**30 (a NumPy object
    # array) was refused as "not a number of servers >= 1".
    for f in (lambda n: rmf.state(n), lambda n: rmf.std(lambda y: jsmkt.mean_queue_length(model, y), n),
              lambda n: rmf.expectation(lambda y: jsmkt.prob_wait(model, y), n)):
        with pytest.raises(Exception, match="n_servers must be a number of servers >= 1"):
            jax.block_until_ready(eqx.filter_jit(f)(jnp.asarray(-3.0)))
    np.testing.assert_allclose(rmf.state(10**30), rmf.value, rtol=1e-15, atol=1e-25)


@pytest.mark.slow
def test_refined_against_simulation_small_n(getkey):
    """JSQ(3), exponential, lam = 0.9, N = 100: the 1/N gap between simulation and mean field is large here
    (V_3 = 2.3 and V_4 = 1.4: s_3, s_4 are 0.023 and 0.014 above their limits 0.254 and 0.015), and the refined
    mean field removes it: its tails and E[Q] agree with simulation within 4 SE plus an O(1/N^2) allowance
    (30/N^2), while the plain mean field is off by more."""
    lam, d, N = 0.9, 3, 100
    model = jsmkt.JSQd(lam, d=d)
    fp = jsmkt.solve_fixed_point(model)
    rmf = jsmkt.refined_mean_field(fp)
    mf = np.asarray(jsmkt.tails(model, fp))
    ref = np.asarray(jsmkt.tails(model, rmf.state(N)))
    res = jsmkt.simulate(model, N, 4000.0, key=getkey(), n_replications=8, warmup=200.0)
    se = lambda hw: hw / 2.3646  # 95 % half-width over 8 replications -> SE (t quantile, 7 dof)  # noqa: E731
    allowance = 30.0 / N**2
    for k in (2, 3, 4):
        assert abs(res.tails[k] - ref[k]) <= 4 * se(res.tails_ci[k]) + allowance, (k, res.tails[k], ref[k], mf[k])
    gaps = [abs(res.tails[k] - mf[k]) for k in (2, 3, 4)]
    assert max(gaps) > 4 * max(se(res.tails_ci[k]) for k in (2, 3, 4)) + allowance
    EQ_ref = float(jsmkt.mean_queue_length(model, rmf.state(N)))
    assert abs(res.mean_queue_length - EQ_ref) <= 4 * se(res.mean_queue_length_ci) + 3 * allowance


def test_failed_fixed_point_gives_nan():
    """A fixed point that failed (throw=False) gives NaN, as every metric of it does (tests/test_failed_points.py)."""
    model = jsmkt.JSQd(0.9, d=2, K=6)  # too small K: the solver reports truncation_too_small
    fp = jsmkt.solve_fixed_point(model, throw=False)
    assert fp.result == jsmkt.RESULTS.truncation_too_small
    rmf = jsmkt.refined_mean_field(fp)
    assert all(np.all(np.isnan(np.asarray(a))) for a in (rmf.value, rmf.correction, rmf.covariance))


def test_sampling_without_replacement_pgf():
    """P(all D sampled servers have >= k jobs) without replacement from N servers, m of which have >= k jobs:
    C(m, D) / C(N, D), written out here; the join factor is its divided difference."""
    from math import comb

    from jsmkt._refined import _SampledWithoutReplacement

    N = 7
    mixed20 = np.zeros(20)
    mixed20[[0, 4, 19]] = [0.3, 0.5, 0.2]  # beyond 16 choice numbers the polynomial is summed in a lax.scan
    for base in (jsmkt.FixedChoice(2), jsmkt.FixedChoice(3), jsmkt.MixedChoice([0.2, 0.3, 0.5]),
                 jsmkt.MixedChoice(mixed20)):
        if base.max_d > N:
            N = 25
        c = _SampledWithoutReplacement(base, jnp.asarray(1.0 / N))
        w = np.asarray(base.weights())
        for m in range(N + 1):
            exact = sum(w[j - 1] * comb(m, j) / comb(N, j) for j in range(1, len(w) + 1))
            # (degree 20 in the monomial basis at eps = 1/25 loses a few digits; the solver uses eps = 0 only)
            assert float(c.pgf(m / N)) == pytest.approx(exact, rel=1e-12 if N == 7 else 1e-10, abs=1e-15)
        a, b = 0.8, 0.3
        assert float(c.join_factor(a, b)) == pytest.approx(float((c.pgf(a) - c.pgf(b)) / (a - b)),
                                                           rel=1e-12 if N == 7 else 1e-9)
        # N -> infinity: sampling with replacement
        c0 = _SampledWithoutReplacement(base, jnp.asarray(0.0))
        assert float(c0.pgf(0.6)) == pytest.approx(float(base.pgf(0.6)), rel=1e-14)


def test_without_replacement_lowers_the_bias():
    """Distinct samples balance better: the 1/N excess of the tails is smaller without replacement, still zero for
    s_1 (work conservation) and for d = 1 (one sample is the same either way)."""
    model = jsmkt.JSQd(0.9, d=2)
    fp = jsmkt.solve_fixed_point(model)
    v_with = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(fp).correction))
    v_wo = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(fp, "without_replacement").correction))
    assert abs(v_wo[1]) < 1e-10
    assert np.all(v_wo[2:5] < v_with[2:5]) and np.all(v_wo[2:5] > 0)
    fp1 = jsmkt.solve_fixed_point(jsmkt.JSQd(0.7, d=1))
    assert float(jnp.max(jnp.abs(jsmkt.refined_mean_field(fp1, "without_replacement").correction))) < 1e-12
    with pytest.raises(ValueError, match="sampling='sometimes' must be"):
        jsmkt.refined_mean_field(fp, "sometimes")


def _finite_n_chain(N, K, lam, d, replace):
    """The Markov chain of JSQ(d) with N exponential servers (rate 1) on the counts c_0..c_K of servers with k jobs
    (arrivals to a queue of K jobs are lost): `(C, G, join)`, the states (rows of counts), the generator (CSR, rows
    = from) and per state the probability that an arrival joins a server with k < K jobs. It is
    `experiments/refined/compute.py`'s `jsq_chain`, written from the physical system alone (tests/test_experiments.py
    checks its d = 1 case against independent M/M/1/K queues)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "refined" / "compute.py"
    spec = importlib.util.spec_from_file_location("_exp_refined_compute", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.jsq_chain(N, K, lam, d, replace)


def _exact_finite_n_tails(N, K, lam, d, replace):
    """E[s_k], k = 0..K, from the exact stationary law of `_finite_n_chain`."""
    import scipy.sparse.linalg as spla

    C, G, _ = _finite_n_chain(N, K, lam, d, replace)
    G = G.T.tocsc()
    pi = np.concatenate([[1.0], spla.spsolve(G[1:, 1:], -G[1:, 0].toarray().ravel())])
    pi /= pi.sum()
    return pi @ (np.cumsum(C[:, ::-1], axis=1)[:, ::-1] / N)


def _exact_finite_n_transient_tails(N, K, lam, d, replace, ts):
    """E[s_k(t)], k = 0..K, at the times `ts` from N empty servers: the Kolmogorov forward equations of
    `_finite_n_chain`, p(t) = p(0) exp(G t) (SciPy's `expm_multiply`)."""
    import scipy.sparse.linalg as spla

    C, G, _ = _finite_n_chain(N, K, lam, d, replace)
    p0 = (C[:, 0] == N).astype(float)
    P = spla.expm_multiply(G.T.tocsc(), p0, start=0.0, stop=float(ts[-1]), num=len(ts), endpoint=True)
    return P @ (np.cumsum(C[:, ::-1], axis=1)[:, ::-1] / N)


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_refined_against_exact_small_systems(sampling):
    """The 1/N coefficient V against the exact stationary laws of systems of N = 5..11 servers: a fit of
    N (E[s_k] - s_k) = V_k + a/N + b/N^2 recovers V_2, V_3 to about 1e-3 (JSQ(2), lam = 0.5)."""
    lam, d, K = 0.5, 2, 6
    model = jsmkt.JSQd(lam, d=d, K=12)
    fp = jsmkt.solve_fixed_point(model)
    mf = np.asarray(jsmkt.tails(model, fp))[: K + 1]
    V = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(fp, sampling).correction))[: K + 1]
    Ns = np.arange(5, 12)
    gaps = np.stack([N * (_exact_finite_n_tails(N, K, lam, d, sampling == "with_replacement") - mf) for N in Ns])
    X = np.stack([np.ones_like(Ns, dtype=float), 1.0 / Ns, 1.0 / Ns**2], axis=1)
    fit = np.linalg.lstsq(X, gaps, rcond=None)[0][0]
    np.testing.assert_allclose(fit[2:4], V[2:4], rtol=3e-3)
    assert abs(fit[1]) < 1e-4 and abs(V[1]) < 1e-12  # s_1 = lam exactly (up to the losses at K)
    # the two sampling schemes differ by far more than this accuracy
    assert V[2] > 0.04


def test_without_replacement_at_large_d_compiles_in_bounded_size():
    """d = 300, where the without-replacement polynomial is summed in a `lax.scan`: its correction stays below the
    with-replacement one and s_1's stays zero (work conservation)."""
    model = jsmkt.JSQd(0.9, d=300, K=6)
    fp = jsmkt.solve_fixed_point(model)
    v_with = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(fp).correction))
    v_wo = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(fp, "without_replacement").correction))
    assert abs(v_wo[1]) < 1e-9 and 0 < v_wo[2] < v_with[2]


@pytest.mark.parametrize("c", [1e-200, 1e200])
def test_refined_mean_field_does_not_depend_on_the_time_unit(c):
    # Regression: with rates of 1e-160 the 1/N term underflowed to 0 silently, and with 1e160 the expansion was
    # refused as "the Jacobian ... is not stable".
    def refined(c, service):
        m = jsmkt.JSQd(0.5 * c, d=2, mu=c) if service is None else jsmkt.JSQdPH(0.5 * c, service, d=2)
        r = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(m))
        return np.array([float(jsmkt.mean_queue_length(m, r.state(10))),
                         float(r.std(lambda y: jsmkt.mean_queue_length(m, y), 10))])

    np.testing.assert_allclose(refined(c, None), refined(1.0, None), rtol=1e-8)
    c = c ** 0.7  # a PH's E[S^2] must stay inside float64
    np.testing.assert_allclose(refined(c, jsmkt.erlang(2, mean=1 / c)), refined(1.0, jsmkt.erlang(2)), rtol=1e-8)


def test_jump_covariance_memory_is_quadratic_in_the_state_size():
    # Regression: Q was built from the (n, jumps) matrix of jump vectors, about m n^2 floats for a PH of order m:
    # 1.3 GiB of temporaries for Erlang-20 at K = 60 (n = 1200), and an out-of-memory error at K = 791 that the
    # 32 n^2 size guard let through. Now a few n x n matrices.
    from jsmkt._refined import _jump_covariance

    model = jsmkt.JSQdPH(0.5, jsmkt.erlang(20), d=2, K=60)
    y = model.initial_state() + 0.01
    compiled = jax.jit(lambda y: _jump_covariance(model, y)).lower(y).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        pytest.skip("this backend gives no memory analysis")
    n = y.size
    assert analysis.temp_size_in_bytes < 8 * n * n * 8


# --- order 2: the 1/N^2 term ---------------------------------------------------------------------------------------


def test_order2_equals_rmftool_on_jsq2():
    """A (and V, W) against rmftool 0.5's order-2 expansion of JSQ(2) (tests/data/make_rmftool_order2.py: its
    symbolic derivatives and its moment solver, an implementation that shares nothing with jsmkt's)."""
    import json
    import pathlib

    ref = json.loads((pathlib.Path(__file__).parent / "data" / "rmftool_order2_jsq2.json").read_text())
    for case in ref["cases"]:
        model = jsmkt.JSQd(case["lam"], d=2, K=case["K"])
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model, tail_tol=1e-3), order=2)
        assert rmf.order == 2
        for got, want in ((rmf.value, case["pi"]), (rmf.correction, case["V"]), (rmf.covariance, case["W"]),
                          (rmf.correction2, case["A"])):
            want = np.asarray(want)
            np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-8 * np.abs(want).max())


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_order2_against_exact_small_systems(sampling):
    """The exact stationary laws of JSQ(2) with N = 5..30 servers and buffer K = 3 (lam = 0.5,
    `_exact_finite_n_tails`): the error of y* + V/N + A/N^2 falls like N^-3 (fitted log-log slope in
    [-3.5, -2.5]; about -2 at order 1), and a fit of N^2 (E[s] - y* - V/N) = A + b/N + c/N^2 over N = 20..50
    recovers A."""
    lam, d, K = 0.5, 2, 3
    model = jsmkt.JSQd(lam, d=d, K=K)
    fp = jsmkt.solve_fixed_point(model, tail_tol=1e-2)
    rmf = jsmkt.refined_mean_field(fp, sampling, order=2)
    y, V, A = (np.asarray(a) for a in (fp.value, rmf.correction, rmf.correction2))
    exact = {N: _exact_finite_n_tails(N, K, lam, d, sampling == "with_replacement")[1:]
             for N in (5, 7, 10, 14, 20, 25, 30, 40, 50)}
    Ns = np.array([5, 7, 10, 14, 20, 30])
    err1 = [np.abs(exact[N] - y - V / N).sum() for N in Ns]
    err2 = [np.abs(exact[N] - np.asarray(rmf.state(int(N)))).sum() for N in Ns]
    slope = lambda e: np.polyfit(np.log(Ns), np.log(e), 1)[0]  # noqa: E731
    assert -2.3 < slope(err1) < -1.7
    assert -3.5 < slope(err2) < -2.5
    assert np.all(np.asarray(err2) < np.asarray(err1))
    Nf = np.array([20, 25, 30, 40, 50])
    G = np.stack([N**2 * (exact[N] - y - V / N) for N in Nf])
    fit = np.linalg.lstsq(np.stack([np.ones(len(Nf)), 1 / Nf, 1 / Nf**2], 1), G, rcond=None)[0][0]
    np.testing.assert_allclose(fit, A, atol=3e-3 * np.abs(A).max())


def test_order2_state_and_arguments():
    """state(N) = y* + V/N + A/N^2 at order 2 (y* + V/N at order 1); the 1/N^2 term of the busy fraction is zero
    (work conservation) for a PH family too; bad orders and models without a derived 1/N^2 term are refused."""
    model = jsmkt.JSQdPH(0.85, jsmkt.coxian2(1.0, 2.0), d=2, K=20)
    fp = jsmkt.solve_fixed_point(model)
    r1 = jsmkt.refined_mean_field(fp)
    r2 = jsmkt.refined_mean_field(fp, order=2)
    assert r1.order == 1 and r1.correction2 is None
    y, V, A = (np.asarray(a) for a in (fp.value, r2.correction, r2.correction2))
    np.testing.assert_allclose(np.asarray(r2.state(10)), y + V / 10 + A / 100, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.asarray(r1.state(10)), y + V / 10, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(np.asarray(r1.correction), V, atol=1e-12)
    assert abs(float(jnp.sum(r2.correction2[0]))) < 1e-9 and float(jnp.max(jnp.abs(r2.correction2))) > 1e-2
    for bad in (0, 3, True, "2"):
        with pytest.raises(ValueError, match=f"order={bad!r} must be 1"):
            jsmkt.refined_mean_field(fp, order=bad)


def test_cli_solve_servers_order2(tmp_path, capsys):
    """`jsmkt solve --servers N --order 2`: the refined tails are s + V/N + A/N^2 with A from
    `refined_mean_field(fp, order=2)`; `--order 2` without `--servers` is refused by name."""
    import json

    from jsmkt.cli import main

    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nd = 2\nK = 12\n')

    def run(argv):
        code = main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run(["solve", str(spec), "--format", "json", "--servers", "10", "--order", "2"])
    assert code == 0, err
    res = json.loads(out)
    r = res["refined"]
    assert r["order"] == 2
    model = jsmkt.JSQd(0.9, d=2, K=12)
    A = np.asarray(jsmkt.tails(model, jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model), order=2).correction2))
    np.testing.assert_allclose(r["tail_correction2"][1:], A[1: len(r["tail"])], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(r["tail"], np.array(res["tail"]) + np.array(r["tail_correction"]) / 10
                               + np.array(r["tail_correction2"]) / 100, rtol=1e-12, atol=1e-300)
    code, out, _ = run(["solve", str(spec), "--servers", "10", "--order", "2"])
    assert code == 0 and "order 1/N^2" in out and "1/N^2 coefficient" in out
    code, _, err = run(["solve", str(spec), "--order", "2"])
    assert code == 2 and "--order 2" in err and "--servers" in err


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_refined_transient_against_the_kolmogorov_equations(sampling):
    """From N empty servers (JSQ(2), lam = 0.5, K = 3): N (E[s(t)] - y(t)) from the exact transient law (forward
    equations, N = 10..30), fitted as V(t) + b/N, recovers V(t) at t = 1..4; V(t) and W(t) tend to the steady
    state's V and W."""
    lam, d, K = 0.5, 2, 3
    model = jsmkt.JSQd(lam, d=d, K=K)
    ts = np.linspace(0.0, 4.0, 5)
    tr = jsmkt.refined_transient(model, 4.0, ts=ts, sampling=sampling)
    y, V = np.asarray(tr.value), np.asarray(tr.correction)
    assert np.all(V[0] == 0.0) and np.all(np.asarray(tr.covariance[0]) == 0.0)
    Ns = np.array([10, 14, 20, 30])
    gaps = np.stack([N * (_exact_finite_n_transient_tails(int(N), K, lam, d, sampling == "with_replacement", ts)[:, 1:]
                          - y) for N in Ns])  # (N, t, k)
    X = np.stack([np.ones(len(Ns)), 1.0 / Ns], axis=1)
    fit = np.linalg.lstsq(X, gaps.reshape(len(Ns), -1), rcond=None)[0][0].reshape(V.shape)
    np.testing.assert_allclose(fit[1:], V[1:], atol=0.03 * np.abs(V).max())
    assert np.abs(V).max() > 0.02
    # the order-1 transient is closer to the exact law than the mean field
    exact30 = _exact_finite_n_transient_tails(30, K, lam, d, sampling == "with_replacement", ts)[:, 1:]
    assert np.abs(exact30 - np.asarray(tr.state(30))).max() < 0.3 * np.abs(exact30 - y).max()
    late = jsmkt.refined_transient(model, 300.0, sampling=sampling)
    rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model, tail_tol=1e-2), sampling)
    np.testing.assert_allclose(np.asarray(late.correction[-1]), np.asarray(rmf.correction), atol=1e-7)
    np.testing.assert_allclose(np.asarray(late.covariance[-1]), np.asarray(rmf.covariance), atol=1e-7)


def test_order2_and_transient_refuse_what_they_do_not_expand():
    """A modulating phase (BMAP arrivals) has 1/N^2 terms that are not derived: order 2 refuses it by name (before
    any solve), and so does the transient; retrials (streams that start at a server) are expanded."""
    from jsmkt._refined import _check_order2
    from jsmkt._spec import FAMILIES

    bmap = next(iter(FAMILIES["jsq-bmap"].examples().values()))
    retrial = next(iter(FAMILIES["retrial"].examples().values()))
    with pytest.raises(ValueError, match="modulating phase"):
        _check_order2(bmap, 10)
    _check_order2(retrial, 10)
    with pytest.raises(ValueError, match="n x n x n arrays"):
        _check_order2(jsmkt.JSQd(0.5, d=2, K=10), 600)
    with pytest.raises(ValueError, match="modulating phase"):
        jsmkt.refined_transient(bmap, 1.0)


def test_three_way_lyapunov_against_kronecker_solve():
    """`tensor_lyapunov3` against the (n^3 x n^3) Kronecker-sum system; the Schur form by JAX (CPU) and by SciPy
    through the host callback (other backends) agree."""
    from jsmkt._refined_terms import _complex_schur, tensor_lyapunov3

    rng = np.random.default_rng(1)
    n = 5
    A = rng.normal(size=(n, n)) - 3.0 * np.eye(n) * (1 + np.arange(n))  # stable, non-normal
    R = rng.normal(size=(n, n, n))
    M = np.asarray(tensor_lyapunov3(jnp.asarray(A), jnp.asarray(R)))
    eye = np.eye(n)
    L = np.kron(np.kron(A, eye), eye) + np.kron(np.kron(eye, A), eye) + np.kron(np.kron(eye, eye), A)
    np.testing.assert_allclose(M, np.linalg.solve(L, -R.reshape(-1)).reshape(n, n, n), rtol=1e-10, atol=1e-13)
    for host in (False, True):
        T, U = _complex_schur(jnp.asarray(A), host)
        np.testing.assert_allclose(np.asarray(U @ T @ U.conj().T), A, atol=1e-12)
        assert float(jnp.max(jnp.abs(jnp.tril(T, -1)))) == 0.0


def test_order2_gradient_and_vmap():
    """jax.grad of the 1/N^2 term (through the fixed point's adjoint and the implicit tangent of the third-moment
    solve) against central differences; vmap over the load equals one call per load."""

    def weighted_A(lam):
        fp = jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=10))
        return jnp.sum(jsmkt.refined_mean_field(fp, order=2).correction2 * jnp.arange(1.0, 11.0))

    lam, h = 0.7, 1e-5
    fd = (weighted_A(lam + h) - weighted_A(lam - h)) / (2 * h)
    assert float(jax.grad(weighted_A)(lam)) == pytest.approx(float(fd), rel=1e-6)
    batch = jax.vmap(lambda lam: jsmkt.refined_mean_field(
        jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=10)), order=2).correction2)(jnp.array([0.5, 0.7]))
    one = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(jsmkt.JSQd(0.5, d=2, K=10)), order=2).correction2
    np.testing.assert_allclose(np.asarray(batch[0]), np.asarray(one), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_order2_retrials(sampling):
    """Streams that start at a server (a retrial family's first example): order 2's 1/N term from the shifted
    chooser (`origin_shifted_moments`) equals order 1's (`origin_drift_correction`), and the 1/N^2 term of the busy
    fraction is zero (every job is served: the utilisation is the load at every N) while A itself is not."""
    from jax.flatten_util import ravel_pytree

    from jsmkt._spec import FAMILIES

    model = next(iter(FAMILIES["retrial"].examples().values()))
    fp = jsmkt.solve_fixed_point(model)
    r1 = jsmkt.refined_mean_field(fp, sampling)
    r2 = jsmkt.refined_mean_field(fp, sampling, order=2)
    np.testing.assert_allclose(ravel_pytree(r2.correction)[0], ravel_pytree(r1.correction)[0], atol=1e-12)
    shifted = jax.tree_util.tree_map(lambda a, b: a + b, fp.value, r2.correction2)
    util = float(jsmkt.utilisation(model, fp.value))
    assert util == pytest.approx(float(model.load()), rel=1e-12)
    assert abs(float(jsmkt.utilisation(model, shifted)) - util) < 1e-12
    assert float(jnp.max(jnp.abs(ravel_pytree(r2.correction2)[0]))) > 0.1
