"""Tests of the finite-N simulator `jsmkt.simulate`.

Statistical checks compare with exact results that share no code with the simulator (M/M/1, Pollaczek-Khinchine
for M/G/1, the JSQ(d) closed form with an O(1/N) allowance, Little's law), written out here from their textbook
forms. Tolerances are about 4 standard errors, with the standard error read off the reported 95 % half-width.
No RNG stream is pinned: every check must hold for any key.
"""

import json
import math
import re
import warnings

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.stats

import jsmkt
from _stats import assert_close, assert_mm1, standard_error
from jsmkt._simulate import core, plan
from jsmkt._simulate.driver import _compiled
from jsmkt._simulate.plan import _SEQUENTIAL_MAX_D
from jsmkt._simulate.statistics import t_quantile_975


# Checks of XLA's CPU backend and of CPU cores as devices; elsewhere (`benchmarks/gpu_check.sh`) they do not apply.
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA's CPU backend")


# --- helpers ----------------------------------------------------------------------------------------------------


_se, _assert_close = standard_error, assert_close


def _h2(mean, scv):
    """Balanced-means H2 written out: probabilities and rates (independent of jsmkt's construction)."""
    p1 = 0.5 * (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0)))
    return np.array([p1, 1.0 - p1]), np.array([2.0 * p1 / mean, 2.0 * (1.0 - p1) / mean])


def _pk_sojourn(lam, m1, m2):
    """Pollaczek-Khinchine: E[T] = E[S] + lam E[S^2] / (2 (1 - rho)) for M/G/1 FCFS."""
    return m1 + lam * m2 / (2.0 * (1.0 - lam * m1))


def _jsqd_exp(lam, d, kmax=60):
    """JSQ(d) exponential mean field (mu = 1): s_k = lam^((d^k - 1)/(d - 1)), E[T] = sum_{i>=1} lam^((d^i-d)/(d-1))."""
    tails = np.array([lam ** ((d**k - 1) / (d - 1)) for k in range(kmax)])
    ET = sum(lam ** ((d**i - d) / (d - 1)) for i in range(1, kmax))
    return tails, ET


# --- exact results, fast ----------------------------------------------------------------------------------------


def test_mm1(getkey):
    """d = 1: N independent M/M/1 queues."""
    lam = 0.7
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 100, 3000.0, key=getkey())
    rho = lam
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, rho / (1 - rho), what="E[Q]")
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1 / (1 - lam), what="E[T]")
    for k in range(1, 6):
        _assert_close(res, res.tails[k], res.tails_ci[k], rho**k, what=f"s_{k}")
    assert res.tails[0] == pytest.approx(1.0, abs=1e-12)
    # Sojourn time of M/M/1 FCFS is Exp(mu - lam): percentiles log(1/(1-p)) / (mu - lam).
    for p, v in res.sojourn_time_percentiles.items():
        exact = math.log(1.0 / (1.0 - p / 100.0)) / (1.0 - lam)
        assert v == pytest.approx(exact, rel=0.06), (p, v, exact)


def test_m_erlang_1_pollaczek_khinchine_and_phase_occupancy(getkey):
    """d = 1, Erlang-2 service: PK formula; and the fraction of servers busy in phase i is lam * E[time in i]."""
    lam = 0.6
    res = jsmkt.simulate(jsmkt.JSQdPH(lam, jsmkt.erlang(2, 1.0), d=1), 100, 2000.0, key=getkey())
    m1, m2 = 1.0, 1.5  # Erlang-2 with mean 1: E[S^2] = (1 + 1/2) E[S]^2
    ET = _pk_sojourn(lam, m1, m2)
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, what="E[T]")
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam * ET, what="E[Q]")
    for i in range(2):
        _assert_close(res, res.phase_tails[0, i], res.phase_tails_ci[0, i], lam * 0.5, what=f"S_1 phase {i}")


def test_phase_occupancy_jsq2_h2(getkey):
    """Any JSQ(d): a job spends E[S_i] = (alpha (-T)^-1)_i in phase i, so by Little's law the fraction of servers
    in phase i is lam * E[S_i] (here H2: p_i / mu_i), whatever the queue lengths."""
    lam = 0.85
    p, mu = _h2(1.0, 4.0)
    res = jsmkt.simulate(jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, 4.0), d=2), 200, 600.0, key=getkey())
    for i in range(2):
        _assert_close(res, res.phase_tails[0, i], res.phase_tails_ci[0, i], lam * p[i] / mu[i], what=f"phase {i}")
    # The phase tails add up to the tails.
    np.testing.assert_allclose(res.phase_tails.sum(axis=1), res.tails[1:], rtol=1e-10, atol=1e-14)


def test_md1_general_service(getkey):
    """d = 1, deterministic service through the general-service engine: PK with E[S^2] = 1."""
    lam = 0.5
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 50, 2000.0, key=getkey(), service=jsmkt.deterministic(1.0))
    ET = _pk_sojourn(lam, 1.0, 1.0)
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, what="E[T]")
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam * ET, what="E[Q]")
    assert res.phase_tails is None
    # No job leaves before its service time 1; half of the jobs find the server idle (P(wait) = rho).
    assert res.sojourn_time_percentiles[50] >= 1.0 - 1e-9
    assert res.sojourn_time_percentiles[50] == pytest.approx(1.0, rel=0.05)


def test_single_server_with_random_choice_is_mm1(getkey):
    """N = 1: whatever the choice number, every job joins the one server, so this is M/M/1 exactly; this runs the
    randomised-choice code path (D drawn per arrival from [0.3, 0.7])."""
    lam = 0.6
    model = jsmkt.JSQd(lam, d=jnp.array([0.3, 0.7]))
    res = jsmkt.simulate(model, 1, 20000.0, key=getkey(), n_replications=4)
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1 / (1 - lam), what="E[T]")
    _assert_close(res, res.tails[2], res.tails_ci[2], lam**2, what="s_2")


def test_littles_law(getkey):
    """The direct per-job mean sojourn time against the time-averaged queue length, L = lam T."""
    lam = 0.9
    res = jsmkt.simulate(jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, 4.0), d=2), 300, 500.0, key=getkey())
    L, T = res.mean_queue_length, res.mean_sojourn_time
    tol = 4 * (_se(res, res.mean_queue_length_ci) + lam * _se(res, res.mean_sojourn_time_ci))
    assert abs(L - lam * T) <= tol, (L, lam * T, tol)
    # The two estimates are strongly correlated, so in practice they agree much more closely than that.
    assert abs(L - lam * T) <= 0.02 * L


def test_without_replacement_is_better_at_small_n(getkey):
    """N = 3, d = 3: without replacement an arrival sees all three queues (JSQ); with replacement it sees fewer
    distinct ones 7 times in 9, so its sojourn time is measurably longer (about 7 standard errors here)."""
    model = jsmkt.JSQd(0.7, d=3)
    key = getkey()
    w = jsmkt.simulate(model, 3, 60000.0, key=key)
    wo = jsmkt.simulate(model, 3, 60000.0, key=key, sampling="without_replacement")
    se = math.hypot(_se(w, w.mean_sojourn_time_ci), _se(wo, wo.mean_sojourn_time_ci))
    assert w.mean_sojourn_time - wo.mean_sojourn_time > 4 * se, (w, wo)


# --- behaviour --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", [None, "lognormal"])
def test_chunking_does_not_change_the_run(getkey, service):
    """Chunk boundaries only split the statistics: pending events keep their times and random numbers, so the
    whole-run averages depend neither on n_batches (one replication) nor on the progress bar's sub-chunks (several
    replications, whose run after the warm-up is one batch), for both engines."""
    svc = jsmkt.lognormal(1.0, 2.0) if service else None
    model = jsmkt.JSQd(0.8, d=2)
    kw = dict(key=getkey(), service=svc)
    pairs = [
        (jsmkt.simulate(model, 40, 300.0, n_batches=5, **kw), jsmkt.simulate(model, 40, 300.0, n_batches=13, **kw)),
        (jsmkt.simulate(model, 40, 300.0, n_replications=2, **kw),
         jsmkt.simulate(model, 40, 300.0, n_replications=2, progress=True, **kw)),
    ]
    assert [r.n_batches for pair in pairs for r in pair] == [5, 13, 1, 1]
    for a, b in pairs:
        assert a.events == b.events and a.n_jobs == b.n_jobs
        np.testing.assert_allclose(a.tails, b.tails, rtol=1e-9, atol=1e-12)
        assert a.mean_sojourn_time == pytest.approx(b.mean_sojourn_time, rel=1e-12)


@pytest.mark.filterwarnings("ignore:the 30 batch means")  # short batches on purpose
def test_reproducible_and_key_dependent(getkey, capsys):
    model = jsmkt.JSQdPH(0.8, jsmkt.coxian2(1.0, 2.0), d=2)
    key = getkey()
    a = jsmkt.simulate(model, 20, 200.0, key=key)
    b = jsmkt.simulate(model, 20, 200.0, key=key, progress=True)
    c = jsmkt.simulate(model, 20, 200.0, key=getkey())
    # progress=True runs each batch in sub-chunks: the same run, up to the rounding of the sums.
    assert a.events == b.events and a.n_jobs == b.n_jobs
    assert a.mean_sojourn_time == pytest.approx(b.mean_sojourn_time, rel=1e-12)
    np.testing.assert_allclose(a.tails, b.tails, rtol=1e-10, atol=1e-14)
    assert a.mean_sojourn_time != c.mean_sojourn_time
    err = capsys.readouterr().err
    assert "simulate [" in err and "100.0%" in err


def test_result_fields_and_to_dict(getkey):
    res = jsmkt.simulate(jsmkt.JSQdPH(0.7, jsmkt.erlang(3, 1.0), d=2), 30, 200.0, key=getkey(), warmup=50.0)
    assert isinstance(res, jsmkt.SimulationResult)
    assert res.tails.shape == (res.max_queue + 1,) and res.phase_tails.shape == (res.max_queue, 3)
    assert np.all(np.diff(res.tails) <= 1e-15) and res.overflow == 0
    assert res.events > res.n_jobs > 0 and res.ci_method == "batch_means"
    d = res.to_dict()
    json.dumps(d)
    for key in ("mean_queue_length", "mean_queue_length_ci", "mean_sojourn_time", "mean_sojourn_time_ci", "tail",
                "tail_ci", "sojourn_time_percentiles", "events", "n_servers", "t1", "warmup", "n_replications"):
        assert key in d, key
    assert set(d["sojourn_time_percentiles"]) == {"p50", "p90", "p99"}
    assert d["tail"][0] == pytest.approx(1.0) and d["tail"][-1] > 0 and len(d["tail"]) == len(d["tail_ci"])
    assert len(d["tail"]) < res.max_queue + 1  # trimmed where s_k is 0 for good
    assert (d["n_servers"], d["t1"], d["warmup"], d["n_replications"], d["n_batches"]) == (30, 200.0, 50.0, 1, 30)
    p = res.sojourn_time_percentiles
    assert 0 < p[50] < p[90] < p[99]


@pytest.mark.parametrize("service", [None, "deterministic"])
def test_overflow_raises(getkey, service):
    svc = jsmkt.deterministic(1.0) if service else None
    with pytest.raises(ValueError, match=r"max_queue=3 is too small.*raise max_queue"):
        jsmkt.simulate(jsmkt.JSQd(0.95, d=1), 20, 300.0, key=getkey(), max_queue=3, service=svc)


def _rarely_nan(key):
    u = jr.uniform(key, dtype=float)
    return jnp.where(u < 1e-4, jnp.nan, -jnp.log(u))


@pytest.mark.parametrize(
    ("sampler", "count"),
    [
        (lambda k: -jr.exponential(k, dtype=float), None),
        (lambda k: jnp.inf * jr.exponential(k, dtype=float), None),
        (_rarely_nan, "[1-9]"),  # about 2 of the 20 000 arrivals, at any place of a block
    ],
)
def test_bad_service_times_are_refused(getkey, sampler, count):
    """A general sampler's negative, infinite or NaN service times would give meaningless statistics (negative
    sojourn times, NaN means): the run is refused, with the count, in both forms of the engine."""
    svc = jsmkt.GeneralService(sampler, mean=1.0)
    match = rf"service=GeneralService.*returned {count or '[0-9]+'} service time\(s\) that are negative, infinite or NaN"
    for sequential in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plan, "_sequential_general_engine", lambda max_d, s=sequential: s)
            with pytest.raises(ValueError, match=match):
                jsmkt.simulate(jsmkt.JSQd(0.5, d=2), 20, 500.0, key=getkey(), n_replications=2, service=svc)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n_servers=0), r"n_servers=0 must be an integer >= 1"),
        (dict(n_servers=2.5), r"n_servers=2.5 must be an integer"),
        (dict(t1=-1.0), r"t1=-1.0 must be positive"),
        (dict(t1=10.0, warmup=10.0), r"t1=10.0 must exceed warmup=10.0"),
        (dict(warmup=-1.0), r"warmup=-1.0 must be >= 0"),
        (dict(sampling="stratified"), r"sampling='stratified' is not one of"),
        (dict(n_replications=0), r"n_replications=0 must be an integer >= 1"),
        (dict(n_batches=1), r"n_batches=1 must be an integer >= 2"),
        (dict(max_queue=0), r"max_queue=0 must be an integer >= 1"),
        (dict(service="exp"), r"service='exp' must be a jsmkt.PH"),
        (dict(key=3), r"key=3 is not a JAX PRNG key"),
        # Instability in solve_fixed_point's words (the model's value checks), also for a simulated service.
        (dict(model=jsmkt.JSQd(1.2, d=2)), r"^unstable: lam=1.2 >= capacity mu=1 per server \(load rho=1.2\); no "
                                           r"steady state exists: lower lam or raise mu$"),
        (dict(model=jsmkt.JSQd(0.6, d=2), service=jsmkt.deterministic(2.0)),
         r"^unstable: lam=0.6 >= capacity 1/E\[S\]=0.5 per server \(load rho=lam\*E\[S\]=1.2, with the service "
         r"simulated instead of the model's\); no steady state exists"),
        (dict(n_servers=2, sampling="without_replacement"), r"d=3 exceeds n_servers=2"),
        (dict(model="JSQd"), r"model='JSQd' must be a jsmkt.JSQd or jsmkt.JSQdPH"),
        (dict(n_servers=10**6, max_queue=10**4), r"ring-buffer slots \(74.5 GiB\) exceed the limit"),
        (dict(n_servers=2 * 10**5, max_queue=10**4, service=jsmkt.deterministic(1.0)), r"slots \(29.8 GiB\) exceed"),
        (dict(n_servers=1, max_queue=10**7, n_replications=20), r"time-average cells exceed the limit"),
        (dict(t1="100"), r"t1='100' must be a real number"),
        (dict(t1=True), r"t1=True must be a real number"),
        (dict(warmup=True), r"warmup=True must be a real number"),
        (dict(n_servers=True), r"n_servers=True must be an integer"),
        (dict(service=jsmkt.deterministic(1e-9), t1=1e2), r"t1=100.0 is 1e\+11 mean service times .* t1 / E\[S\] <="),
        (dict(n_servers=1, t1=1e-3), r"no job left during \[warmup, t1\] = \[0.0001, 0.001\].*raise t1"),
        (dict(n_servers=1, t1=1e-3, n_replications=3), r"in 3 of n_replications=3 replications no job left"),
        (dict(n_servers=1, max_queue=1, n_replications=300_000), r"n_replications=300000 exceeds 209\d+, the most"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(model=jsmkt.JSQd(0.5, d=3), n_servers=10, t1=100.0, key=jr.PRNGKey(0))
    args.update(kwargs)
    model, n, t1 = args.pop("model"), args.pop("n_servers"), args.pop("t1")
    with pytest.raises(ValueError, match=match):
        jsmkt.simulate(model, n, t1, **args)


def test_integer_arguments_may_be_numpy_or_jax_integers():
    res = jsmkt.simulate(jsmkt.JSQd(0.5, d=2), np.int64(5), 50.0, key=jr.PRNGKey(0), n_replications=jnp.asarray(2))
    assert (res.n_servers, res.n_replications) == (5, 2)


def test_traced_key_is_refused():
    """simulate vmaps over replications itself; called under vmap/jit it must say so instead of failing inside."""
    model = jsmkt.JSQd(0.5, d=2)
    with pytest.raises(ValueError, match=r"key is traced: simulate was called inside jit/grad/vmap"):
        jax.vmap(lambda k: jsmkt.simulate(model, 5, 10.0, key=k).mean_queue_length)(jr.split(jr.PRNGKey(0), 2))


@pytest.mark.parametrize("d", [jnp.array([0.3, 0.7]), 2.5, 3])
@pytest.mark.parametrize("service", [None, jsmkt.deterministic(1.0)], ids=["markov", "general"])
def test_simulate_inside_jit_is_refused(d, service):
    """Regression: with a concrete key and model closed over by `jit`, a randomised choice rule failed inside JAX
    ('`compiler_options` can only be passed to top-level `jax.jit`', or TracerArrayConversionError)."""
    model, key = jsmkt.JSQd(0.5, d=d), jr.PRNGKey(0)
    with pytest.raises(ValueError, match=r"^simulate was called inside jit/grad/vmap; call it outside JAX"):
        jax.jit(lambda: jsmkt.simulate(model, 20, 20.0, key=key, service=service).mean_queue_length)()


@pytest.mark.parametrize("scv", [1e12, 1e308])
def test_default_max_queue_too_large_says_it_is_the_default(scv):
    """Regression: a huge service SCV crashed with OverflowError (`math.ceil(inf)`) or named a max_queue the user
    never gave."""
    service = jsmkt.lognormal(1.0, scv)
    with pytest.raises(ValueError, match=r"max_queue=\d+ \(the default for load 0\.5 and service SCV .*give a "
                                         r"smaller max_queue"):
        jsmkt.simulate(jsmkt.JSQd(0.5, d=2), 5, 20.0, key=jr.PRNGKey(0), service=service)


@pytest.mark.parametrize(
    ("sampler", "match"),
    [
        (lambda k: jr.exponential(k, (1,), dtype=float), r"returned shape \(1,\) and dtype float64"),
        (lambda k: None, r"returned None"),
        (lambda k: jnp.asarray(1.0 + 0.5j), r"returned shape \(\) and dtype complex128"),
        (lambda k, x: 1.0, r"calling its sampler on one JAX key failed \(TypeError"),
    ],
)
def test_sampler_output_is_checked_before_the_run(sampler, match):
    svc = jsmkt.GeneralService(sampler, mean=1.0)
    with pytest.raises(ValueError, match=r"service=GeneralService.*" + match):
        jsmkt.simulate(jsmkt.JSQd(0.5, d=2), 5, 50.0, key=jr.PRNGKey(0), service=svc)


def test_sojourn_ci_with_batches_that_no_job_left(getkey):
    """One M/M/1 queue at load 0.1, 30 batches of 12 time units: about 0.3 of the batches see no job leave (all but
    surely some). The batch-means half-width of E[T] (a ratio of sums) stays defined; E[T] = 1 / (1 - lam)."""
    lam = 0.1
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 1, 400.0, key=getkey(), warmup=40.0)
    assert res.ci_method == "batch_means" and res.n_jobs < 100
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1 / (1 - lam), what="E[T]")


def test_few_servers_get_a_deep_enough_default_queue(getkey):
    """With N = 1 every job joins the one server whatever d, so the queue is M/M/1 with its geometric tail (at load
    0.8, P(Q >= 36) = 3e-4), not JSQ(3)'s doubly exponential one: the default max_queue must allow for it."""
    lam = 0.8
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=3), 1, 20000.0, key=getkey(), n_replications=4)
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam / (1 - lam), what="L")


def test_unreachable_phases_are_left_out(getkey):
    """A PH whose second phase no job enters is exponential(1): the same key gives the same run (same events, so
    the uniformisation rate ignores the fast unreachable phase) and a zero phase column."""
    model = jsmkt.JSQd(0.6, d=2)
    S = jsmkt.PH(jnp.array([1.0, 0.0]), jnp.array([[-1.0, 0.0], [0.0, -1000.0]]))
    key = getkey()
    a = jsmkt.simulate(model, 10, 200.0, key=key, service=S)
    b = jsmkt.simulate(model, 10, 200.0, key=key, service=jsmkt.exponential(1.0))
    assert a.events == b.events and a.n_jobs == b.n_jobs
    np.testing.assert_array_equal(a.tails, b.tails)
    assert a.mean_sojourn_time == b.mean_sojourn_time
    np.testing.assert_array_equal(a.phase_tails, np.stack([b.phase_tails[:, 0], 0.0 * b.phase_tails[:, 0]], 1))
    assert a.phase_tails_ci.shape == a.phase_tails.shape and not a.phase_tails_ci[:, 1].any()


def test_service_constructors():
    with pytest.raises(ValueError, match=r"mean=-1.0 must be a positive"):
        jsmkt.deterministic(-1.0)
    with pytest.raises(ValueError, match=r"scv=0.0 must be positive"):
        jsmkt.lognormal(1.0, 0.0)
    with pytest.raises(ValueError, match=r"must be a function"):
        jsmkt.GeneralService(1.0, mean=1.0)
    S = jsmkt.lognormal(2.0, 0.5)
    x = jax.vmap(S.sample)(jr.split(jr.PRNGKey(0), 200_000))
    assert float(jnp.mean(x)) == pytest.approx(2.0, rel=0.01)
    assert float(jnp.var(x) / jnp.mean(x) ** 2) == pytest.approx(0.5, rel=0.05)


def test_student_t_quantiles():
    for nu in (1, 2, 3, 5, 10, 29, 30, 101):
        assert t_quantile_975(nu) == pytest.approx(scipy.stats.t.ppf(0.975, nu), rel=1e-9)


def _run_hlo(cfg: core.Config) -> str:
    weights = jnp.zeros(cfg.max_d).at[-1].set(1.0) if cfg.fixed_d else jnp.ones(cfg.max_d) / cfg.max_d
    params = core.Params(lam=jnp.asarray(0.5), alpha=jnp.ones(cfg.m) / cfg.m, T=-jnp.eye(cfg.m), weights=weights,
                         hist_lo=jnp.asarray(0, jnp.int64))
    init, run = _compiled(cfg)
    states = init(params, jr.split(jr.PRNGKey(0), 3))
    return run.lower(params, states, jnp.asarray(1.0)).compile().as_text()


_ENGINES = ["block", "sequential", "general", "general_sequential"]


@pytest.mark.parametrize("engine", _ENGINES)
def test_event_loop_does_not_copy_buffers(engine):
    """Performance guard: XLA must update the per-server arrays in place. A copy of a server-sized or
    ring-buffer-sized array inside the loop costs O(N) per iteration (it made the loop 10x slower once)."""
    sampler = jsmkt.deterministic(1.0).sampler if engine.startswith("general") else None
    cfg = core.Config(n=97, max_queue=13, m=1 if sampler else 2, max_d=2, fixed_d=True, replace=True, block=16,
                      n_bins=64, sampler=sampler, sequential=engine.endswith("sequential"))
    hlo = _run_hlo(cfg)
    big = [line for line in hlo.splitlines()
           if re.search(rf"\[((3,)?({97 * 13}|97)|{3 * 97 * 13}|{3 * 97})\]\S* copy\(", line)]
    # One copy of each donated input at entry is fine; none may sit in a loop body.
    bodies = re.split(r"\n(?=%\S+ )|\nENTRY", hlo)
    in_loops = [b for b in bodies if ("while" in b.split("\n", 1)[0] or "region" in b.split("\n", 1)[0])]
    loop_copies = [line for b in in_loops for line in b.splitlines() if line in big]
    assert not loop_copies, loop_copies


@pytest.mark.default_xla
@cpu_only
@pytest.mark.parametrize("m", [1, 8])
def test_sequential_event_loop_is_one_kernel(m):
    """Performance guard: XLA compiles the sequential engine's event loop into a single kernel (a "small call",
    ~50 ns per event instead of several hundred) as long as its body is small in XLA's cost model; the driver
    counts on it up to `_SEQUENTIAL_MAX_D` sampled servers, here with a random choice number and distinct samples."""
    cfg = core.Config(n=97, max_queue=13, m=m, max_d=_SEQUENTIAL_MAX_D, fixed_d=False, replace=False, block=16,
                      n_bins=64, sampler=None, sequential=True)
    assert 'xla_cpu_small_call="true"' in _run_hlo(cfg)


@pytest.mark.default_xla
@cpu_only
def test_sequential_general_event_loops_are_kernels():
    """Performance guard: the general-service engine's two event loops (arrivals with the completions they reveal,
    and the catch-up at the end of a chunk) each compile into a single kernel, unbatched, up to
    `_SEQUENTIAL_GENERAL_MAX_D` sampled servers (here with a random choice number and distinct samples); with one
    more sampled server the arrival loop no longer does."""
    def small_calls(max_d):
        cfg = core.Config(n=97, max_queue=13, m=1, max_d=max_d, fixed_d=False, replace=False, block=16, n_bins=64,
                          sampler=jsmkt.deterministic(1.0).sampler, sequential=True)
        return _run_hlo(cfg).count('xla_cpu_small_call="true"')

    assert small_calls(plan._SEQUENTIAL_GENERAL_MAX_D) == 2
    assert small_calls(plan._SEQUENTIAL_GENERAL_MAX_D + 1) == 1


@pytest.mark.parametrize(
    ("model", "sampling"),
    [
        (jsmkt.JSQd(0.8, d=1), "with_replacement"),
        (jsmkt.JSQdPH(0.85, jsmkt.hyperexponential2(1.0, 4.0), d=2), "with_replacement"),
        (jsmkt.JSQdPH(0.8, jsmkt.erlang(3, 1.0), d=jnp.array([0.2, 0.3, 0.5])), "without_replacement"),
        (jsmkt.JSQd(0.9, d=jnp.array([0.0, 0.5, 0.5])), "general"),
        (jsmkt.JSQd(0.9, d=5), "general"),
    ],
)
def test_sequential_and_block_engines_follow_the_same_path(getkey, monkeypatch, model, sampling):
    """The sequential PH engine (CPU) applies the events of the block engine (GPU) one by one, with the same random
    numbers: the same key gives the same run, up to the rounding of event times summed from other block starts.
    Likewise the general-service engine run one replication at a time (CPU) and vmapped (GPU)."""
    service = jsmkt.lognormal(1.0, 2.0) if sampling == "general" else None
    sampling = "with_replacement" if service else sampling
    kw = dict(key=getkey(), n_replications=2, sampling=sampling, max_queue=40, service=service)
    runs = []
    for sequential in (True, False):
        monkeypatch.setattr(plan, "_sequential_engine", lambda max_d, s=sequential: s)
        monkeypatch.setattr(plan, "_sequential_general_engine", lambda max_d, s=sequential: s)
        runs.append(jsmkt.simulate(model, 12, 300.0, **kw))
    a, b = runs
    assert a.events == b.events and a.n_jobs == b.n_jobs
    np.testing.assert_allclose(a.tails, b.tails, rtol=1e-9, atol=1e-12)
    if not service:
        np.testing.assert_allclose(a.phase_tails, b.phase_tails, rtol=1e-9, atol=1e-12)
    assert a.mean_sojourn_time == pytest.approx(b.mean_sojourn_time, rel=1e-12)
    assert a.sojourn_time_percentiles == pytest.approx(b.sojourn_time_percentiles, rel=1e-12)


_SHARDED_SCRIPT = """
import json, sys
import jax
import jax.random as jr
import jsmkt
assert jsmkt.use_cpu_cores(2)
from jsmkt._simulate import plan
if sys.argv[1] == "block":
    plan._sequential_engine = lambda max_d: False
if sys.argv[1] == "general_vmapped":
    plan._sequential_general_engine = lambda max_d: False
service = jsmkt.lognormal(1.0, 2.0) if sys.argv[1].startswith("general") else None
model = jsmkt.JSQdPH(0.85, jsmkt.hyperexponential2(1.0, 4.0), d=2)
res = jsmkt.simulate(model, 30, 200.0, key=jr.PRNGKey(7), n_replications=4, service=service)
print(json.dumps({"devices": len(jax.devices()), "events": res.events, "n_jobs": res.n_jobs,
                  "tails": res.tails.tolist(), "soj": res.mean_sojourn_time}))
"""


@cpu_only
@pytest.mark.parametrize("service", ["ph", "block", "general", "general_vmapped"])
def test_replications_sharded_over_devices_give_the_same_run(monkeypatch, service):
    """With several devices (here 2 CPU devices, in a subprocess) the replications are split among them; each
    replication keeps its key, so the results equal those of one device (each engine)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT, service], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    model = jsmkt.JSQdPH(0.85, jsmkt.hyperexponential2(1.0, 4.0), d=2)
    svc = jsmkt.lognormal(1.0, 2.0) if service.startswith("general") else None
    if service == "block":  # the speculative-block engine (the GPU default)
        monkeypatch.setattr(plan, "_sequential_engine", lambda max_d: False)
    if service == "general_vmapped":  # the general-service engine vmapped over replications (the GPU default)
        monkeypatch.setattr(plan, "_sequential_general_engine", lambda max_d: False)
    res = jsmkt.simulate(model, 30, 200.0, key=jr.PRNGKey(7), n_replications=4, service=svc)
    assert (out["events"], out["n_jobs"]) == (res.events, res.n_jobs)
    np.testing.assert_allclose(out["tails"], res.tails, rtol=1e-12, atol=1e-15)
    assert out["soj"] == pytest.approx(res.mean_sojourn_time, rel=1e-12)


@pytest.mark.parametrize("engine", _ENGINES)
def test_state_holds_no_zero_sized_arrays(engine):
    """Fields an engine does not use are None, not empty arrays: with jax 0.11 a `shard_map` (replications split
    over devices) whose arguments hold a zero-sized array beside others crashes XLA's CPU compiler."""
    sampler = jsmkt.deterministic(1.0).sampler if engine.startswith("general") else None
    cfg = core.Config(n=7, max_queue=5, m=1 if sampler else 2, max_d=2, fixed_d=True, replace=True, block=8,
                      n_bins=16, sampler=sampler, sequential=engine.endswith("sequential"))
    params = core.Params(lam=jnp.asarray(0.5), alpha=jnp.ones(cfg.m) / cfg.m, T=-jnp.eye(cfg.m),
                         weights=jnp.asarray([0.0, 1.0]), hist_lo=jnp.asarray(0, jnp.int64))
    init, _ = _compiled(cfg)
    leaves = jax.tree_util.tree_leaves(init(params, jr.split(jr.PRNGKey(0), 2)))
    assert leaves and all(leaf.size > 0 for leaf in leaves), [leaf.shape for leaf in leaves]


def test_use_cpu_cores_after_the_first_computation_and_bad_input():
    jnp.ones(2).block_until_ready()
    assert jsmkt.use_cpu_cores() is False  # JAX's devices are set up already in this process
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"n=.* must be an integer >= 1"):
            jsmkt.use_cpu_cores(bad)
    with pytest.raises(ValueError, match=r"n=100000 exceeds \d+ devices, the most allowed \(this machine has"):
        jsmkt.use_cpu_cores(100_000)


def test_shard_counts():
    assert [plan._n_shards(r, 2) for r in (1, 2, 3, 16)] == [1, 2, 1, 2]
    assert [plan._n_shards(r, 8) for r in (6, 12, 7, 1024)] == [6, 6, 7, 8]


# --- long statistical checks ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3])
def test_jsqd_closed_form_n1000(getkey, d):
    """JSQ(d), exponential, N = 1000: tails and E[T] against the mean-field closed form, within 4 SE plus an
    O(1/N) allowance (3/N on the fractions s_k, 5/N relative on E[T]; the finite-N bias measured at N = 1000 is
    about 1.5/N and 1.3/N)."""
    lam, N = 0.9, 1000
    tails, ET = _jsqd_exp(lam, d)
    for _ in range(2):
        res = jsmkt.simulate(jsmkt.JSQd(lam, d=d), N, 1500.0, key=getkey(), n_replications=6)
        _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, allowance=5 / N * ET, what="E[T]")
        for k in range(1, 6):
            _assert_close(res, res.tails[k], res.tails_ci[k], tails[k], allowance=3 / N, what=f"s_{k}")


@pytest.mark.slow
def test_randomised_choice_n1000(getkey):
    """D = 1 or 2 with probability 1/2 (d = 1.5): the mean-field fixed point with pgf g(s) = (s + s^2)/2 satisfies
    s_k = lam g(s_{k-1}), s_0 = 1 (flow balance across the cut between k-1 and k jobs, mu = 1)."""
    lam, N = 0.9, 1000
    s = [1.0]
    for _ in range(80):
        s.append(lam * 0.5 * (s[-1] + s[-1] ** 2))
    EQ = sum(s[1:])
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1.5), N, 1500.0, key=getkey(), n_replications=6)
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, EQ, allowance=5 / N * EQ, what="E[Q]")
    for k in range(1, 6):
        _assert_close(res, res.tails[k], res.tails_ci[k], s[k], allowance=3 / N, what=f"s_{k}")


@pytest.mark.slow
@pytest.mark.parametrize("scv", [2.0, 4.0])
def test_m_h2_1_pollaczek_khinchine(getkey, scv):
    """d = 1, H2 service. With heavy-tailed sojourn times the replication means are skewed (rare long busy
    periods), so a few replications understate the spread: use 8 long ones."""
    lam = 0.5
    p, mu = _h2(1.0, scv)
    m1, m2 = float(np.sum(p / mu)), float(np.sum(2 * p / mu**2))
    assert m2 == pytest.approx(1.0 + scv)
    ET = _pk_sojourn(lam, m1, m2)
    res = jsmkt.simulate(jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, scv), d=1), 200, 15000.0,
                         key=getkey(), n_replications=8)
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, what="E[T]")
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam * ET, what="E[Q]")


@pytest.mark.slow
def test_mm1_long(getkey):
    lam = 0.8
    for _ in range(3):
        res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 500, 4000.0, key=getkey())
        # Percentiles of correlated sojourn times: about twice the relative error of the mean (~1 %) and more at 99.
        assert_mm1(res, lam, 9, 0.03, 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("scv", [0.5, 2.0])
def test_m_lognormal_1_pollaczek_khinchine(getkey, scv):
    """d = 1, lognormal service through the general-service engine (subexponential: long queues are rarer than
    with exponential tails but not negligible, hence the generous max_queue)."""
    lam = 0.6
    ET = _pk_sojourn(lam, 1.0, 1.0 + scv)
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 100, 10000.0, key=getkey(), n_replications=8,
                         service=jsmkt.lognormal(1.0, scv), max_queue=1000)
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, what="E[T]")


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 5])
def test_engines_agree_on_jsqd(getkey, d):
    """The same physical system through both engines: exponential service as a PH (uniformisation) and as a
    general sampler (completion times). No closed form at N = 20; the two estimates must agree. d = 5 checks the
    general engine's choice among more sampled servers than its loop once fitted in one kernel."""
    model = jsmkt.JSQd(0.9, d=d)
    expo = jsmkt.GeneralService(lambda k: jr.exponential(k, dtype=float), mean=1.0)
    a = jsmkt.simulate(model, 20, 20000.0, key=getkey(), n_replications=4)
    b = jsmkt.simulate(model, 20, 20000.0, key=getkey(), n_replications=4, service=expo)
    se = math.hypot(_se(a, a.mean_sojourn_time_ci), _se(b, b.mean_sojourn_time_ci))
    assert abs(a.mean_sojourn_time - b.mean_sojourn_time) <= 4 * se
    for k in range(1, 5):
        se = math.hypot(_se(a, a.tails_ci[k]), _se(b, b.tails_ci[k]))
        assert abs(a.tails[k] - b.tails[k]) <= 4 * se, k


@pytest.mark.slow
def test_replacement_n10_differs_n1000_agrees(getkey):
    """N = 10, d = 2: without replacement is strictly better (an arrival never wastes its second sample on the
    same server); at N = 1000 the two agree within the statistical error and the O(1/N) allowance.

    At N = 10 the pairs of runs share their keys (common random numbers: the same arrival and service events), so
    the paired differences of independent pairs give a much sharper test than two independent estimates."""
    model = jsmkt.JSQd(0.9, d=2)
    diffs = []
    for _ in range(6):
        key = getkey()
        w = jsmkt.simulate(model, 10, 30000.0, key=key)
        wo = jsmkt.simulate(model, 10, 30000.0, key=key, sampling="without_replacement")
        diffs.append(w.mean_sojourn_time - wo.mean_sojourn_time)
    mean, se = np.mean(diffs), np.std(diffs, ddof=1) / math.sqrt(len(diffs))
    assert mean > 4 * se, diffs
    key = getkey()
    w = jsmkt.simulate(model, 1000, 1000.0, key=key, n_replications=4)
    wo = jsmkt.simulate(model, 1000, 1000.0, key=key, n_replications=4, sampling="without_replacement")
    se = math.hypot(_se(w, w.mean_sojourn_time_ci), _se(wo, wo.mean_sojourn_time_ci))
    assert abs(w.mean_sojourn_time - wo.mean_sojourn_time) <= 4 * se + 5 / 1000 * w.mean_sojourn_time



@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_block_size_follows_the_measured_optima(monkeypatch, backend):
    """The block PH engine's events per iteration: powers of 2 in [8, 1024], never growing with the replications,
    and at N = 1000 the sizes measured best (`benchmarks/block_size.py`): on a GPU 64 up to R = 4096 and 32 at
    R = 16384 (H200); on a CPU 64 for R = 1 and 16 for R = 16."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    for n in (10, 100, 1000, 10**4, 10**6):
        sizes = [plan._markov_block_size(n, r) for r in (1, 2, 16, 256, 4096, 16384, 65536)]
        assert all(8 <= b <= 1024 and b & (b - 1) == 0 for b in sizes), (n, sizes)
        assert sizes == sorted(sizes, reverse=True), (n, sizes)
    measured = {"gpu": {1: 64, 16: 64, 1024: 64, 4096: 64, 16384: 32}, "cpu": {1: 64, 16: 16}}[backend]
    assert {r: plan._markov_block_size(1000, r) for r in measured} == measured


_BIG_MAX_QUEUE_SCRIPT = """
import json, resource, sys
import jax.random as jr
import jsmkt
res = jsmkt.simulate(jsmkt.JSQd(0.5, d=2), 2, 50.0, key=jr.PRNGKey(0), max_queue=int(sys.argv[1]))
print(json.dumps({"rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "n_tails": len(res.tails), "tails": res.tails[:65].tolist(), "ci": res.tails_ci[:65].tolist(),
                  "soj": res.mean_sojourn_time}))
"""


def test_statistics_memory_follows_the_levels_reached_not_max_queue():
    """Regression: the batch statistics took about 7 x n_batches x (max_queue + 1) floats, so a large max_queue
    (the default near rho = 1: 17 million levels at lam = 0.999999) took 8.5 GiB here against 0.6 GiB for
    max_queue = 64, and was killed at 24 GiB. They now keep only the levels some server reached (0.1 GiB more:
    ring buffers of 80 MB, a cell array of 40 MB, the padded results); the results still have max_queue + 1 levels
    and equal those of a small max_queue."""
    import subprocess
    import sys

    def run(max_queue):
        proc = subprocess.run([sys.executable, "-c", _BIG_MAX_QUEUE_SCRIPT, str(max_queue)], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    big, small = run(5_000_000), run(64)
    assert big["rss_gib"] - small["rss_gib"] < 1.0, (big["rss_gib"], small["rss_gib"])
    assert big["n_tails"] == 5_000_001 and small["n_tails"] == 65
    assert big["tails"] == small["tails"] and big["ci"] == small["ci"] and big["soj"] == small["soj"]
    assert small["tails"][0] == 1.0 and small["ci"][0] == 0.0


def test_correlated_batch_means_are_flagged():
    """Regression: at high load one replication's batch-means confidence intervals covered E[Q] 60 % of the time
    (M/M/1 queues, lam = 0.9, t1 = 3000: batches of 90 time units against a relaxation time 2(1 + rho)/(1 - rho)^2
    = 380) without a word. Batch means whose lag-1 autocorrelation exceeds 0.6 now give a RuntimeWarning (7 of
    seeds 1000-1011 here); long batches, a lower load and independent replications do not."""
    model = jsmkt.JSQd(0.9, d=1)
    with pytest.warns(RuntimeWarning, match=r"batch means \(batches of 90 time units\) are correlated .*raise t1"):
        jsmkt.simulate(model, 20, 3000.0, key=jr.PRNGKey(1010))  # 0.79
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jsmkt.simulate(model, 20, 3000.0, key=jr.PRNGKey(1001), n_replications=2)
        jsmkt.simulate(model, 20, 30000.0, key=jr.PRNGKey(1001))
        jsmkt.simulate(jsmkt.JSQd(0.7, d=1), 20, 4000.0, key=jr.PRNGKey(1001))


@pytest.mark.parametrize(
    "make",
    [lambda m: jsmkt.deterministic(m), lambda m: jsmkt.lognormal(m, 1.0), lambda m: jsmkt.GeneralService(
        lambda k: jr.exponential(k), mean=m)],
    ids=["deterministic", "lognormal", "GeneralService"],
)
def test_service_parameters_must_be_concrete_real_numbers(make):
    """Regression: a traced mean was 'mean=JitTracer(~float64[]) ... must be real numbers'; True was read as 1.0."""
    with pytest.raises(ValueError, match=r"^mean is traced \(inside jit/grad/vmap\); a simulated service takes "):
        jax.jit(lambda m: make(m).mean)(1.0)
    with pytest.raises(ValueError, match=r"^mean=True is boolean; give a real number$"):
        make(True)
    with pytest.raises(ValueError, match=r"^mean='a' is not a real number$"):
        make("a")
