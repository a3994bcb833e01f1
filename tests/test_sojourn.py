"""Sojourn- and waiting-time distributions from the mean field (`jsmkt.sojourn_time_distribution`,
`jsmkt.waiting_time_distribution`) against the M/PH/1 queue, Little's law, finite differences and simulation;
and the simulator's percentiles with confidence intervals (`simulate(..., percentiles=..., waiting_times=...)`)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import scipy.sparse
import scipy.sparse.linalg

import jsmkt
from jsmkt._spec import FAMILIES


FIRST = {fam: next(iter(FAMILIES[fam].examples().items())) for fam in FAMILIES}  # one example per family


def _mph1(lam, service):
    r"""Survival functions of the waiting and sojourn times of the M/PH/1 FCFS queue, and the sojourn time's
    density, derived here from the Pollaczek-Khinchine formula: the waiting time is a geometric sum (continuation
    probability rho) of ladder heights, which have the equilibrium law of the service, PH(alpha (-T)^{-1}/E[S], T);
    a geometric sum of PH(pi, T) is PH(rho pi, T + rho t pi), t = -T 1. The sojourn time adds an independent
    service: the block generator [[U, u alpha], [0, T]], u = -U 1 the waiting part's exit rates."""
    alpha, T = np.asarray(service.alpha), np.asarray(service.T)
    m, t = alpha.size, -T.sum(axis=1)
    a_plus = lam * alpha @ np.linalg.inv(-T)  # rho pi, of mass rho
    U = T + np.outer(t, a_plus)
    G = np.block([[U, np.outer(-U.sum(axis=1), alpha)], [np.zeros((m, m)), T]])
    start = np.concatenate([a_plus, (1.0 - a_plus.sum()) * alpha])
    exits = np.concatenate([np.zeros(m), t])

    def wait(x):
        return float(a_plus @ scipy.linalg.expm(U * x) @ np.ones(m))

    def sojourn(x):
        return float(start @ scipy.linalg.expm(G * x) @ np.ones(2 * m))

    def density(x):
        return float(start @ scipy.linalg.expm(G * x) @ exits)

    return wait, sojourn, density


def test_d1_is_the_mph1_queue():
    """d = 1: every server is an M/PH/1 queue. The sojourn and waiting times' survival functions and the sojourn
    density equal the queue's (derived independently above) to 1e-10 at several points, their means equal Little's
    law to 1e-10, and the quantiles are the roots of the queue's survival function."""
    lam, service = 0.7, jsmkt.hyperexponential2(1.0, 4.0)
    model = jsmkt.JSQdPH(lam, service, d=1)
    fp = jsmkt.solve_fixed_point(model)
    T = jsmkt.sojourn_time_distribution(model, fp)
    W = jsmkt.waiting_time_distribution(model, fp)
    wait, sojourn, density = _mph1(lam, service)
    xs = np.array([0.0, 0.2, 1.0, 3.0, 10.0, 30.0, 60.0])
    np.testing.assert_allclose(1.0 - np.asarray(T.cdf(xs)), [sojourn(x) for x in xs], rtol=0, atol=1e-10)
    np.testing.assert_allclose(1.0 - np.asarray(W.cdf(xs)), [wait(x) for x in xs], rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(T.pdf(xs[1:])), [density(x) for x in xs[1:]], rtol=0, atol=1e-10)
    assert float(W.atom) == pytest.approx(1.0 - lam, abs=1e-12)
    assert float(T.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-10)
    assert float(W.mean) == pytest.approx(float(jsmkt.mean_waiting_time(model, fp)), rel=1e-10)
    ps = np.array([0.5, 0.9, 0.99, 0.999, 0.9999])
    exact = [scipy.optimize.brentq(lambda x, p=p: sojourn(x) - (1.0 - p), 0.0, 500.0, xtol=1e-13) for p in ps]
    np.testing.assert_allclose(np.asarray(T.quantile(ps)), exact, rtol=1e-9)
    ps[0] = 0.2  # below the atom at 0 of the waiting time: P(W = 0) = 1 - rho = 0.3
    exact = [0.0] + [scipy.optimize.brentq(lambda x, p=p: wait(x) - (1.0 - p), 0.0, 500.0, xtol=1e-13)
                     for p in ps[1:]]
    np.testing.assert_allclose(np.asarray(W.quantile(ps)), exact, rtol=1e-9)


def test_families():
    """Batch service lumps to (phase, position) although an epoch removes up to B jobs at once (all of them at a short
    queue): with d = 1 and exponential epochs its fixed point is known in closed form (`initial_guess`, geometric),
    where the mean equals Little's law, and the lumped chain equals the full (cell, position) one. A repairman that
    chooses the failed server with the longest queue serves at a rate that depends on the queue behind a job: the
    lumped chain is refused there, naming the dispatch (the full chain runs, `test_helpers_against_simulation`).
    Families whose head of a queue is not always in service are refused by name."""
    model = jsmkt.JSQdBatchService(1.2, jsmkt.exponential(1.0), jnp.array([0.5, 0.5]), d=1)
    y = model.initial_guess()
    xs = jnp.array([0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
    lumped = jsmkt.sojourn_time_distribution(model, y, lumped=True)
    full = jsmkt.sojourn_time_distribution(model, y, lumped=False)
    np.testing.assert_allclose(np.asarray(lumped.cdf(xs)), np.asarray(full.cdf(xs)), rtol=0, atol=1e-13)
    assert float(lumped.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, y)), rel=1e-10)
    with pytest.raises(ValueError, match="JSQdBatchService: no waiting time distribution: a service removes several"):
        jsmkt.waiting_time_distribution(model, y)
    model = FIRST["repairable"][1]
    assert model.repair == "R2"
    with pytest.raises(ValueError, match="'repairman' moves a tagged job forward at a rate that depends on the server"):
        jsmkt.sojourn_time_distribution(model, model.initial_state(), lumped=True)
    with pytest.raises(ValueError, match="RepairableJSQ: no waiting time distribution: the job at the head of a queue"):
        jsmkt.waiting_time_distribution(model, model.initial_state())


def test_gradients_agree_with_finite_differences():
    """`jax.grad` of p99 (the quantile's implicit derivative, through the CDF's derivative at the root and the fixed
    point) with respect to the arrival rate and the service SCV, against central differences."""
    K = FIRST["jsq-ph"][1].K  # the family example's shape: its fixed point compiles once

    def p99(lam, scv):
        model = jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, scv), d=2, K=K)
        return jsmkt.sojourn_time_distribution(model, jsmkt.solve_fixed_point(model), max_terms=2048).quantile(0.99)

    x = (0.8, 4.0)
    grad = np.asarray(jax.jit(jax.grad(p99, argnums=(0, 1)))(*x))
    f, h = jax.jit(p99), 1e-5
    fd = [(f(x[0] + h, x[1]) - f(x[0] - h, x[1])) / (2 * h), (f(x[0], x[1] + h) - f(x[0], x[1] - h)) / (2 * h)]
    np.testing.assert_allclose(grad, np.asarray(fd), rtol=1e-6)


def test_quantiles_and_bad_input():
    """Quantiles invert the CDF (any shape, under vmap too), the density is the CDF's derivative; bad input is
    refused by name."""
    model = FIRST["jsq"][1]
    fp = model.initial_guess()  # exact for exponential service: s_k = rho g(s_{k-1})
    T = jsmkt.sojourn_time_distribution(model, fp)
    ps = jnp.array([[0.01, 0.5], [0.99, 0.9999]])
    q = T.quantile(ps)
    assert q.shape == (2, 2)
    np.testing.assert_allclose(np.asarray(T.cdf(q)), np.asarray(ps), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.vmap(T.quantile)(ps)), np.asarray(q), rtol=1e-14)
    t, h = jnp.ones(4) * 2.0, 1e-5
    assert float(T.pdf(t)[0]) == pytest.approx(float((T.cdf(t + h) - T.cdf(t - h))[0] / (2 * h)), rel=1e-7)
    with pytest.raises(ValueError, match=r"p=99.0 must be a probability .* give p=0.99"):
        T.quantile(99)
    with pytest.raises(ValueError, match="p=1.0 must be a probability"):
        T.quantile(jnp.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="no sojourn time distribution: stream='class 3' is not an arrival stream"):
        jsmkt.sojourn_time_distribution(model, fp, stream="class 3")
    with pytest.raises(ValueError, match=r"RefinedMeanField: .* is jsmkt.refined_waiting_time_distribution\(refined, N\)"):
        jsmkt.waiting_time_distribution(model, jsmkt.RefinedMeanField(fp, fp, jnp.zeros((fp.size, fp.size)), model))
    with pytest.raises(ValueError, match="max_terms=10 must be an integer >= 64"):
        jsmkt.sojourn_time_distribution(model, fp, max_terms=10)
    published = jsmkt.published.JSQdPHAsPublished(0.7, jsmkt.erlang(2), d=2, K=12)
    with pytest.raises(ValueError, match="has no physical description"):
        jsmkt.sojourn_time_distribution(published, published.initial_state())


# --- random-order servers: own-orbit retrials -------------------------------------------------------------------


def _mm1_retrial_tagged(lam, theta, policy, top=60):
    r"""The M/M/1 retrial queue (service rate 1, orbit truncated at `top`), derived here from one customer's view.
    Its stationary law p(n, s) (orbit n, server s idle 0 / busy 1) solves the generator's balance. A tagged customer
    is in service with n in orbit, or in orbit with m others and the server in state s. It retries at rate theta
    (linear: every orbit customer retries on its own) or theta/(m + 1) (constant: the orbit retries at theta, each
    time one of its m + 1 customers at random). By PASTA it finds (n, s) with probability p(n, s): served at once if
    s = 0, else in orbit with m = n others. Returns the survival functions of the sojourn and waiting times."""
    n = np.arange(top + 1)
    rate = theta * n if policy == "linear" else theta * (n > 0)
    size = 2 * (top + 1)
    Q = np.zeros((size, size))
    for k in n:
        idle, busy = 2 * k, 2 * k + 1
        Q[idle, busy] += lam
        if k:
            Q[idle, 2 * (k - 1) + 1] += rate[k]
        Q[busy, idle] += 1.0
        if k < top:
            Q[busy, 2 * (k + 1) + 1] += lam
    Q -= np.diag(Q.sum(axis=1))
    A = np.vstack([Q.T, np.ones(size)])
    p = np.linalg.lstsq(A, np.concatenate([np.zeros(size), [1.0]]), rcond=None)[0].reshape(top + 1, 2)
    # Tagged states: 0..top in service with n in orbit; then (m, s) in orbit, index top + 1 + 2 m + s.
    serve = n
    orbit = top + 1 + 2 * n[:, None] + np.arange(2)[None, :]
    G = np.zeros((3 * (top + 1), 3 * (top + 1)))
    for k in n:
        if k < top:
            G[serve[k], serve[k + 1]] += lam
        mine = theta if policy == "linear" else theta / (k + 1)
        others = theta * k if policy == "linear" else theta * k / (k + 1)
        G[orbit[k, 0], orbit[k, 1]] += lam
        G[orbit[k, 0], serve[k]] += mine
        if k:
            G[orbit[k, 0], orbit[k - 1, 1]] += others
        G[orbit[k, 1], orbit[k, 0]] += 1.0
        if k < top:
            G[orbit[k, 1], orbit[k + 1, 1]] += lam
    G -= np.diag(G.sum(axis=1) + (np.arange(G.shape[0]) <= top))  # in service: the service's end (rate 1) too
    start = np.zeros(G.shape[0])
    start[serve] = p[:, 0]
    start[orbit[:, 1]] = p[:, 1]
    waits = np.arange(G.shape[0]) > top  # the waiting time: service starts = leaving the orbit states
    Gw = G[np.ix_(waits, waits)]

    Gt, Gwt = scipy.sparse.csr_matrix(G.T), scipy.sparse.csr_matrix(Gw.T)

    def sojourn(t):  # start exp(G t) 1, as the sum of exp(G^T t) start
        return float(scipy.sparse.linalg.expm_multiply(Gt * t, start).sum())

    def wait(t):
        return float(scipy.sparse.linalg.expm_multiply(Gwt * t, start[waits]).sum())

    return sojourn, wait


@pytest.mark.parametrize("policy, lam", [("linear", 0.4), ("constant", 0.3)])
def test_own_retrials_d1_is_the_mm1_retrial_queue(policy, lam):
    """d1 = 1: every server is an M/M/1 retrial queue fed by Poisson(lam) (the mean field is exact). The sojourn and
    waiting times' survival functions equal those of a tagged customer of the queue (derived independently above)
    at several points, the quantiles are the roots of its survival function, and P(W = 0) is the idle fraction."""
    model = jsmkt.RetrialJSQ(lam, 1.0, d1=1, retrial="own", policy=policy, K=30)
    fp = jsmkt.solve_fixed_point(model)
    T = jsmkt.sojourn_time_distribution(model, fp)
    W = jsmkt.waiting_time_distribution(model, fp)
    sojourn, wait = _mm1_retrial_tagged(lam, 1.0, policy)
    xs = np.array([0.0, 0.3, 1.0, 3.0, 10.0, 30.0])
    np.testing.assert_allclose(1.0 - np.asarray(T.cdf(xs)), [sojourn(x) for x in xs], rtol=0, atol=1e-9)
    np.testing.assert_allclose(1.0 - np.asarray(W.cdf(xs)), [wait(x) for x in xs], rtol=0, atol=1e-9)
    assert float(W.atom) == pytest.approx(1.0 - lam, abs=1e-9)
    ps = np.array([0.5, 0.99])
    exact = [scipy.optimize.brentq(lambda x, p=p: sojourn(x) - (1.0 - p), 0.0, 200.0, xtol=1e-13) for p in ps]
    np.testing.assert_allclose(np.asarray(T.quantile(ps)), exact, rtol=1e-9)
    exact = scipy.optimize.brentq(lambda x: wait(x) - 0.01, 0.0, 200.0, xtol=1e-13)
    assert float(W.quantile(0.99)) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("policy, lam", [("linear", 0.4), ("constant", 0.3)])
def test_own_retrials_means_are_littles_law(policy, lam):
    """d1 = 2: the sojourn time's mean is Little's law for the customers at a server (`mean_sojourn_time`), the
    waiting time's is Little's law for the orbit (mean orbit size over the throughput), and its atom at 0 is the
    probability that a primary finds an idle sampled server (1 - `prob_blocked`)."""
    model = jsmkt.RetrialJSQ(lam, 1.0, d1=2, retrial="own", policy=policy, K=30)
    fp = jsmkt.solve_fixed_point(model)
    T = jsmkt.sojourn_time_distribution(model, fp)
    W = jsmkt.waiting_time_distribution(model, fp)
    assert float(T.mean) == pytest.approx(float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-9)
    orbit = float(jsmkt.mean_orbit_size(model, fp)) / float(jsmkt.throughput(model, fp))
    assert float(W.mean) == pytest.approx(orbit, rel=1e-9)
    assert float(W.atom) == pytest.approx(1.0 - float(jsmkt.prob_blocked(model, fp)), abs=1e-12)
    assert float(T.quantile(0.99)) > float(W.quantile(0.99)) > float(T.mean)


def test_own_retrials_quantile_gradient():
    """`jax.grad` of the own-retrial p99 with respect to lam (through the fixed point and the chain's rates) against
    central differences."""

    def p99(lam):
        model = jsmkt.RetrialJSQ(lam, 1.0, d1=2, retrial="own", policy="constant", K=30)
        return jsmkt.sojourn_time_distribution(model, jsmkt.solve_fixed_point(model)).quantile(0.99)

    lam, h = 0.3, 1e-5
    grad = float(jax.jit(jax.grad(p99))(lam))
    f = jax.jit(p99)
    assert grad == pytest.approx(float((f(lam + h) - f(lam - h)) / (2 * h)), rel=1e-6)


def test_reprobing_retrials_are_refused():
    """Re-probing retrials move a customer to another server: refused, saying why; the random-order chain does not
    lump."""
    retrial = FIRST["retrial"][1]
    assert retrial.retrial == "reprobe"
    for law in (jsmkt.sojourn_time_distribution, jsmkt.waiting_time_distribution):
        with pytest.raises(ValueError, match="RetrialJSQ: no .* time distribution: its servers hold no FCFS queues "
                                             "and its jobs move between servers"):
            law(retrial, retrial.initial_state())
    own = jsmkt.RetrialJSQ(0.3, 1.0, d1=2, retrial="own", policy="constant", K=30)
    with pytest.raises(ValueError, match="lumped=True: at a random-order server"):
        jsmkt.sojourn_time_distribution(own, own.initial_state(), lumped=True)


# --- simulation -------------------------------------------------------------------------------------------------


def test_simulated_percentiles_have_intervals():
    """Any percentile of the sojourn and waiting times, with 95 % half-widths from the replications (or the
    batches of one run); waiting times are refused where the head of a queue is not the job in service."""
    model = jsmkt.JSQd(0.8, d=2, K=14)
    res = jsmkt.simulate(model, 20, 300.0, key=jr.PRNGKey(0), n_replications=3, percentiles=(50, 99.9),
                         waiting_times=True)
    assert set(res.sojourn_time_percentiles) == set(res.waiting_time_percentiles) == {50, 99.9}
    for table, ci in ((res.sojourn_time_percentiles, res.sojourn_time_percentiles_ci),
                      (res.waiting_time_percentiles, res.waiting_time_percentiles_ci)):
        assert table[50] < table[99.9] and all(np.isfinite(v) and v > 0 for v in ci.values())
    assert res.sojourn_time_percentile(99.9) == (res.sojourn_time_percentiles[99.9],
                                                 res.sojourn_time_percentiles_ci[99.9])
    assert res.sojourn_time_histograms.shape[0] == 3  # one section per replication
    v, ci = res.waiting_time_percentile(10)
    assert v == 0.0  # most jobs find a server empty at load 0.8 with d = 2
    d = res.to_dict()
    assert set(d["sojourn_time_percentiles"]) == set(d["waiting_time_percentiles_ci"]) == {"p50", "p99.9"}
    with pytest.raises(ValueError, match=r"percentiles=\(50, 100\): 100.0 is not in \(0, 100\)"):
        jsmkt.simulate(model, 20, 300.0, key=jr.PRNGKey(0), percentiles=(50, 100))
    batch_service = FIRST["jsq-batch-service"][1]
    with pytest.raises(ValueError, match="waiting_times=True: a JSQdBatchService removes several jobs at once"):
        jsmkt.simulate(batch_service, 20, 300.0, key=jr.PRNGKey(0), waiting_times=True)
    repairable = FIRST["repairable"][1]
    with pytest.raises(ValueError, match="head of a RepairableJSQ's queue is not always in service"):
        jsmkt.simulate(repairable, 20, 300.0, key=jr.PRNGKey(0), waiting_times=True)


@pytest.mark.slow
@pytest.mark.parametrize("service", ["h2", "erlang2"])
@pytest.mark.parametrize("lam", [0.5, 0.9])
def test_percentiles_against_simulation(service, lam):
    """JSQ(2) at N = 1000 servers (8 replications): the mean field's p99 of the sojourn time lies within the
    simulation's 95 % interval; its p50, p90, p99.9 and the waiting time's percentiles within 4 standard errors
    plus 1 % (finite-N effects are of order 1/N)."""
    law = jsmkt.hyperexponential2(1.0, 4.0) if service == "h2" else jsmkt.erlang(2)
    model = jsmkt.JSQdPH(lam, law, d=2)
    fp = jsmkt.solve_fixed_point(model)
    qs = (50, 90, 99, 99.9)
    res = jsmkt.simulate(model, 1000, 1000.0, key=jr.PRNGKey(3), n_replications=8, percentiles=qs,
                         waiting_times=True)
    p = jnp.asarray(qs, dtype=float) / 100.0
    for what, dist, sim, ci in (
            ("sojourn", jsmkt.sojourn_time_distribution(model, fp), res.sojourn_time_percentiles,
             res.sojourn_time_percentiles_ci),
            ("waiting", jsmkt.waiting_time_distribution(model, fp), res.waiting_time_percentiles,
             res.waiting_time_percentiles_ci)):
        mf = np.asarray(dist.quantile(p))
        for q, v in zip(qs, mf, strict=True):
            gap = abs(v - sim[q])
            if what == "sojourn" and q == 99:
                assert gap <= ci[q], (what, q, v, sim[q], ci[q])
            elif sim[q] > 0:
                assert gap <= 4 * ci[q] / 2.365 + 0.01 * sim[q], (what, q, v, sim[q], ci[q])


def _laws_are_consistent(model, fp):
    """Batches: the waiting time's mean is Little's law and its atom 1 - `prob_wait` (a job waits for those ahead
    of it in its own batch). Classes: per arrival stream, the laws mix, weighted by the streams' job rates, into
    the law of all jobs."""
    if isinstance(model, jsmkt.JSQdBatch):
        W = jsmkt.waiting_time_distribution(model, fp)
        assert float(W.mean) == pytest.approx(float(jsmkt.mean_waiting_time(model, fp)), rel=1e-10)
        assert float(W.atom) == pytest.approx(1.0 - float(jsmkt.prob_wait(model, fp)), rel=1e-10)
        return
    model2 = jsmkt.JSQdClasses([0.4, 0.2], d=[1, 3], batch_sizes=[None, jnp.array([0.5, 0.5])],
                               service=model.service, helper_rates=model.helper_rates, f=[2], K=model.K)
    fp2 = jsmkt.solve_fixed_point(model2, auto_K=True)
    model2 = fp2.model
    rates = np.asarray(model2.class_arrival_rates)
    xs = jnp.array([0.5, 1.0, 3.0])
    per = [jsmkt.sojourn_time_distribution(model2, fp2, stream=f"class {j + 1} arrival") for j in range(2)]
    mixed = sum(w * np.asarray(D.cdf(xs)) for w, D in zip(rates / rates.sum(), per, strict=True))
    np.testing.assert_allclose(mixed, np.asarray(jsmkt.sojourn_time_distribution(model2, fp2).cdf(xs)), atol=1e-13)
    assert float(per[0].mean) > float(per[1].mean)  # one choice against three


@pytest.mark.slow
def test_helpers_against_simulation():
    """The generic engine's waiting times (batch arrivals: a job waits for those ahead of it in its own batch) and
    a family run on the full chain (helpers that complete the job in service at the longest of two queues):
    mean-field percentiles within 4 standard errors plus 1 % of N = 1000 simulations, the means equal to Little's
    law. Also the full chain of repairable servers with an R.2 repairman: its mean is Little's law."""
    repair = FIRST["repairable"][1]
    fp = jsmkt.solve_fixed_point(repair)
    assert float(jsmkt.sojourn_time_distribution(repair, fp).mean) == pytest.approx(
        float(jsmkt.mean_sojourn_time(repair, fp)), rel=1e-10)
    qs = (50, 90, 99)
    p = jnp.asarray(qs, dtype=float) / 100.0
    batch = jsmkt.JSQdBatch(0.3, jnp.array([0.5, 0.25, 0.25]), d=2)
    helpers = jsmkt.JSQdClasses([0.6], d=[2], service=jsmkt.hyperexponential2(1.0, 2.0), helper_rates=[0.3],
                                f=[2])
    for model, waiting in ((batch, True), (helpers, False)):
        fp = jsmkt.solve_fixed_point(model)
        _laws_are_consistent(model, fp)
        assert float(jsmkt.sojourn_time_distribution(model, fp).mean) == pytest.approx(
            float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-10)
        res = jsmkt.simulate(model, 1000, 400.0, key=jr.PRNGKey(5), n_replications=4, percentiles=qs,
                             waiting_times=waiting)
        checks = [(jsmkt.sojourn_time_distribution(model, fp), res.sojourn_time_percentiles,
                   res.sojourn_time_percentiles_ci)]
        if waiting:
            checks.append((jsmkt.waiting_time_distribution(model, fp), res.waiting_time_percentiles,
                           res.waiting_time_percentiles_ci))
        for dist, sim, ci in checks:
            for q, v in zip(qs, np.asarray(dist.quantile(p)), strict=True):
                if sim[q] > 0:
                    assert abs(v - sim[q]) <= 4 * ci[q] / 3.182 + 0.01 * sim[q], (type(model).__name__, q, v, sim[q])
