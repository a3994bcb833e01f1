"""Tests of the generic simulation engine (`jsmkt._simulate.generic`): models given as `SimTables`.

The checks compare with exact results written out here (M/M/1, M/E2/1 by Pollaczek-Khinchine, M^X/M/1, the
Erlang loss formula, symmetry of labels under a uniform tie-break), with the fast JSQ engines (the same path for
exponential service, the same statistics otherwise), and with the batch model's mean-field fixed point at
N = 1000. Tolerances are about 4 standard errors, read off the reported 95 % half-widths; no RNG stream is pinned.
"""

import json
import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jsmkt
from _stats import assert_close, assert_mm1, standard_error
from jsmkt._simulate import driver, generic, jsq_tables, plan
from jsmkt._simulate.described import model_tables
from jsmkt._simulate import tables as tm
from jsmkt._simulate.tables import INELIGIBLE, OVERFLOW, SimTables


cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA's CPU backend")


# --- helpers ----------------------------------------------------------------------------------------------------


_se, _assert_close = standard_error, assert_close


def _assert_agree(a, b, xa, xb, hwa, hwb, what, n_se=4.0, allowance=0.0):
    se = math.hypot(_se(a, hwa), _se(b, hwb))
    assert abs(xa - xb) <= n_se * se + allowance, f"{what}: {xa:.6g} vs {xb:.6g}, {n_se} SE = {n_se * se:.3g}"


def _tables(C, *, u, act_prob, act_target, key, eff_prob, eff_target, rate, choice, level=None, jobs=None,
            status=None, names=("idle", "busy"), fcfs=True, act_stream=None, arrivals=(True,)):
    """SimTables with the defaults of a queue: level = jobs = the cell, status idle/busy."""
    cells = np.arange(C)
    level = cells if level is None else np.asarray(level)
    return SimTables(
        level=level, status=(level > 0).astype(int) if status is None else np.asarray(status), status_names=names,
        jobs=level if jobs is None else np.asarray(jobs), empty_cell=0, fcfs=fcfs, u=u,
        act_prob=np.asarray(act_prob, float), act_target=np.asarray(act_target),
        act_stream=np.full(np.shape(act_prob), -1) if act_stream is None else np.asarray(act_stream),
        stream_rate=np.asarray(rate, float), choice=np.asarray(choice, float), key=np.asarray(key),
        eff_prob=np.asarray(eff_prob, float), eff_target=np.asarray(eff_target), arrivals=np.asarray(arrivals),
    )


def _model(make, load, name="Model"):
    return jsq_tables.TablesModel(make, load, name)


def _erlang_loss_tables(lam, mu=1.0):
    """Servers without queues: cell 0 idle, cell 1 busy, which an arrival may not choose (key INELIGIBLE)."""
    return _tables(2, u=mu, act_prob=[[0.0], [1.0]], act_target=[[0], [0]], key=[[0, INELIGIBLE]],
                   eff_prob=[[[1.0], [0.0]]], eff_target=[[[1], [1]]], rate=[lam], choice=[[0.0, 0.0, 1.0]])


def _erlang_b(servers, a):
    terms = [a**k / math.factorial(k) for k in range(servers + 1)]
    return terms[-1] / sum(terms)


# --- the same path as the fast engines, exact results -----------------------------------------------------------


@pytest.mark.parametrize(("n", "d", "sampling"), [(12, 2, "with_replacement"), (3, 3, "without_replacement")])
def test_same_path_as_the_fast_engine_for_exponential_jsq(getkey, n, d, sampling):
    """With exponential service the generic engine (on the tables of `jsq_tables`) draws the same random words as
    the fast PH engine and makes the same choices from them, so the same key gives the same run: the same events,
    real events, jobs, cells and statistics (to rounding), with and without replacement."""
    model = jsmkt.JSQd(0.8, d=d)
    kw = dict(key=getkey(), n_replications=2, sampling=sampling, max_queue=30)
    fast = jsmkt.simulate(model, n, 300.0, engine="fast", **kw)
    gen = jsmkt.simulate(model, n, 300.0, engine="generic", service=jsmkt.exponential(1.0), **kw)
    assert (fast.engine, gen.engine) == ("fast", "generic")
    assert (fast.events, fast.real_events, fast.n_jobs) == (gen.events, gen.real_events, gen.n_jobs)
    assert fast.real_events < fast.events
    np.testing.assert_allclose(gen.tails, fast.tails, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(gen.cell_fractions, fast.cell_fractions, rtol=1e-10, atol=1e-14)
    assert gen.mean_sojourn_time == pytest.approx(fast.mean_sojourn_time, rel=1e-12)
    assert gen.throughput == pytest.approx(fast.throughput, rel=1e-12)
    assert gen.sojourn_time_percentiles == pytest.approx(fast.sojourn_time_percentiles, rel=1e-3)
    assert gen.status_names == fast.status_names == ("idle", "busy")
    assert gen.phase_tails is None and fast.phase_tails is not None


def test_mm1_generic(getkey):
    """d = 1 through the generic engine (the tables of `jsq_tables`): N = 10 M/M/1 queues, E[Q] = rho / (1 - rho),
    s_k = rho^k, and the FCFS sojourn time Exp(mu - lam), whose percentiles come from the engine's histogram."""
    lam = 0.7
    res = jsmkt.simulate(jsmkt.JSQd(lam, d=1), 10, 4000.0, key=getkey(), n_replications=16, engine="generic",
                         service=jsmkt.exponential(1.0))
    # A queue's sojourn times are strongly correlated: percentiles are off by a few % (more at 99).
    assert_mm1(res, lam, 5, 0.06, 0.12, mean_queue=True)


def test_m_erlang2_1_both_engines(getkey):
    """N = 3, d = 1: three M/E2/1 queues (Pollaczek-Khinchine, E[S^2] = 1.5), through both engines with the same
    key (different paths: the phases are drawn differently); the phase occupancy is lam E[time in phase i]."""
    lam, key = 0.6, getkey()
    model = jsmkt.JSQdPH(lam, jsmkt.erlang(2, 1.0), d=1)
    ET = 1.0 + lam * 1.5 / (2.0 * (1.0 - lam))
    for engine in ("fast", "generic"):
        res = jsmkt.simulate(model, 3, 5000.0, key=key, n_replications=16, engine=engine,
                             service=jsmkt.erlang(2, 1.0) if engine == "generic" else None)
        _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, ET, what=f"{engine} E[T]")
        _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam * ET, what=f"{engine} E[Q]")
        _assert_close(res, res.throughput, res.throughput_ci, lam, what=f"{engine} throughput")
        busy = res.cell_fractions.reshape(-1, 2)[1:].sum(axis=0)  # cells k * 2 + phase, k >= 1
        for i in range(2):
            hw = math.sqrt(np.sum(res.cell_fractions_ci.reshape(-1, 2)[1:, i] ** 2))
            _assert_close(res, busy[i], hw, lam * 0.5, what=f"{engine} phase {i}", n_se=6)
        assert res.status_names == ("idle", "phase 1", "phase 2")


def test_batch_arrivals_mx_m_1(getkey):
    """N = 3, d = 1: three M^X/M/1 queues, batches of 1 or 2 jobs (probability 1/2 each) at rate lam_b, service
    rate mu = 1. With L = E[jobs], the drift of N^2 vanishes in steady state: batches add
    E[(N + X)^2 - N^2] = 2 L E[X] + E[X^2] at rate lam_b, departures add (N - 1)^2 - N^2 = 1 - 2N at rate mu while
    N > 0 (probability rho = lam_b E[X] / mu), so lam_b (2 L E[X] + E[X^2]) + mu (rho - 2 L) = 0, i.e.
    L = rho (E[X^2] + E[X]) / (2 E[X] (1 - rho)). The per-job FCFS sojourn time is L / (lam_b E[X]) by Little's
    law, and the throughput lam_b E[X]."""
    lam_b, EX, EX2 = 0.4, 1.5, 2.5
    rho = lam_b * EX
    L = rho * (EX2 + EX) / (2 * EX * (1 - rho))
    res = jsmkt.simulate(jsq_tables.BatchJSQ(lam_b, [0.5, 0.5], d=1), 3, 5000.0, key=getkey(), n_replications=16)
    assert res.engine == "generic" and res.max_queue >= 2 * 64  # the default allows for batches
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, L, what="L")
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, L / (lam_b * EX), what="E[T]")
    _assert_close(res, res.throughput, res.throughput_ci, lam_b * EX, what="throughput")
    _assert_close(res, res.tails[1], res.tails_ci[1], rho, what="busy fraction")
    assert res.sojourn_time_percentiles[50] < res.sojourn_time_percentiles[90] < res.sojourn_time_percentiles[99]


def test_ineligible_servers_are_never_chosen_erlang_loss(getkey):
    """Servers without queues whose busy cell is ineligible: with d = N = 3 distinct samples an arrival takes an
    idle server if any, and when all three are busy nothing happens (the job is lost, no overflow, no real
    event). This is the Erlang loss system M/M/3/3: blocking B(3, a) with a = N lam / mu, throughput
    lam (1 - B), busy fraction lam (1 - B) / mu, sojourn time Exp(mu). From an empty start (warmup 0), the real
    events are exactly the accepted arrivals and the departures."""
    lam, N = 0.8, 3
    B = _erlang_b(N, N * lam)
    model = _model(lambda top: _erlang_loss_tables(lam), lam, "ErlangLoss")
    res = jsmkt.simulate(model, N, 5000.0, key=getkey(), n_replications=16, warmup=0.0,
                         sampling="without_replacement", max_queue=1)
    _assert_close(res, res.throughput, res.throughput_ci, lam * (1 - B), what="throughput")
    _assert_close(res, res.tails[1], res.tails_ci[1], lam * (1 - B), what="busy fraction")
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1.0, what="E[T]")
    accepted = round(res.throughput * N * res.t1 * res.n_replications)
    assert res.real_events == accepted + res.n_jobs and res.overflow == 0
    # The blocked arrivals are events but not real ones: about N lam B t1 per replication of them, and the
    # clock events of idle servers, about N u (1 - busy) t1.
    selfloops = res.events - res.real_events
    expected = N * res.t1 * res.n_replications * (lam * B + (1 - lam * (1 - B)))
    assert selfloops == pytest.approx(expected, rel=0.03)


def test_ties_are_broken_uniformly(getkey):
    """Two idle cells `a` and `b` share key 0 (a departure leaves its server in `a` with probability 0.3, else
    in `b`), the busy cell is ineligible. The label is then carried without effect on the dynamics when the
    chosen server among tied ones is uniform: the fraction of idle servers labelled `a` is exactly 0.3, whatever
    N and d. Preferring one cell among tied ones (a first-minimum over cells, say) would make `a` servers leave
    idleness sooner and their fraction smaller."""
    q = 0.3
    tables = _tables(3, u=1.0, act_prob=[[0.0, 0.0], [0.0, 0.0], [q, 1 - q]], act_target=[[0, 0], [1, 1], [0, 1]],
                     level=[0, 0, 1], key=[[0, 0, INELIGIBLE]], eff_prob=[[[1.0], [1.0], [0.0]]],
                     eff_target=[[[2], [2], [2]]], rate=[0.6], choice=[[0.0, 1.0]], names=("idle", "busy"))
    res = jsmkt.simulate(_model(lambda top: tables, 0.6, "Ties"), 10, 1500.0, key=getkey(), n_replications=16,
                         max_queue=1)
    a, b = res.cell_fractions[:2]
    se_a, se_idle = _se(res, res.cell_fractions_ci[0]), _se(res, res.tails_ci[1])
    assert abs(a - q * (a + b)) <= 4 * (se_a + q * se_idle), (a, b, a / (a + b))
    assert res.cell_fractions.sum() == pytest.approx(1.0, abs=1e-12)
    assert list(res.cell_level) == [0, 0, 1] and list(res.cell_status) == [0, 0, 1]


def test_streams_started_by_servers_little(getkey):
    """Arrivals as streams that servers start (`act_stream`): each server's clock fires at rate lam and starts a
    dispatch (its own move keeps its cell), which joins a random server (d = 1). The superposition is Poisson of
    rate N lam, so every queue is M/M/1: L = rho / (1 - rho); without FCFS queues the mean sojourn time comes
    from Little's law, 1 / (mu - lam), with no percentiles."""
    lam, K = 0.6, 40
    k = np.arange(K + 1)
    u = lam + 1.0
    act_prob = np.stack([np.full(K + 1, lam / u), np.where(k > 0, 1.0 / u, 0.0)], axis=1)
    act_target = np.stack([k, np.maximum(k - 1, 0)], axis=1)
    act_stream = np.stack([np.zeros(K + 1, int), np.full(K + 1, -1)], axis=1)
    tables = _tables(K + 1, u=u, act_prob=act_prob, act_target=act_target, act_stream=act_stream, key=[k],
                     eff_prob=np.ones((1, K + 1, 1)), eff_target=np.where(k < K, k + 1, OVERFLOW)[None, :, None],
                     rate=[0.0], choice=[[1.0]], fcfs=False)
    res = jsmkt.simulate(_model(lambda top: tables, lam, "Origins"), 10, 1250.0, key=getkey(), n_replications=16,
                         max_queue=K)
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam / (1 - lam), what="L")
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1 / (1 - lam), what="E[T] (Little)")
    _assert_close(res, res.throughput, res.throughput_ci, lam, what="throughput")
    assert res.sojourn_time_percentiles is None and res.n_jobs == 0
    assert res.to_dict()["sojourn_time_percentiles"] == {}
    json.dumps(res.to_dict())


# --- behaviour --------------------------------------------------------------------------------------------------


def test_chunking_does_not_change_the_run(getkey):
    """Pending events keep their times and random numbers across chunk boundaries: the whole-run averages depend
    neither on n_batches nor on the progress bar's sub-chunks (batch arrivals, so moves of two jobs too)."""
    model = jsq_tables.BatchJSQ(0.5, [0.5, 0.5], d=2)
    kw = dict(key=getkey(), max_queue=40)
    pairs = [
        (jsmkt.simulate(model, 30, 300.0, n_batches=5, **kw), jsmkt.simulate(model, 30, 300.0, n_batches=13, **kw)),
        (jsmkt.simulate(model, 30, 300.0, n_replications=2, **kw),
         jsmkt.simulate(model, 30, 300.0, n_replications=2, progress=True, **kw)),
    ]
    for a, b in pairs:
        assert (a.events, a.real_events, a.n_jobs) == (b.events, b.real_events, b.n_jobs)
        np.testing.assert_allclose(a.tails, b.tails, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(a.cell_fractions, b.cell_fractions, rtol=1e-9, atol=1e-12)
        assert a.mean_sojourn_time == pytest.approx(b.mean_sojourn_time, rel=1e-12)
        assert a.throughput == pytest.approx(b.throughput, rel=1e-12)


def test_without_replacement_is_better_at_small_n(getkey):
    """N = 3, d = 3, Erlang-2 service: without replacement an arrival sees all three queues, with replacement
    fewer distinct ones 7 times in 9, so its sojourn time is longer (the generic engine on the tables of
    `jsq_tables`)."""
    e2 = jsmkt.erlang(2, 1.0)
    model = jsmkt.JSQdPH(0.7, e2, d=3)
    key = getkey()
    w = jsmkt.simulate(model, 3, 60000.0, key=key, engine="generic", service=e2)
    wo = jsmkt.simulate(model, 3, 60000.0, key=key, engine="generic", service=e2, sampling="without_replacement")
    se = math.hypot(_se(w, w.mean_sojourn_time_ci), _se(wo, wo.mean_sojourn_time_ci))
    assert w.mean_sojourn_time - wo.mean_sojourn_time > 4 * se, (w, wo)


def test_real_events_of_exponential_jsq(getkey):
    """Exponential JSQ(2) with u = mu: the only self-loops of uniformisation are the clock events of empty
    servers (rate mu per idle server), so the real events are the accepted arrivals and the departures: exactly
    so from an empty start, for both engines, and the self-loops are the clock events in the servers' idle
    time."""
    lam, N = 0.7, 50
    model = jsmkt.JSQd(lam, d=2)
    for engine, service in (("fast", None), ("generic", jsmkt.exponential(1.0))):
        res = jsmkt.simulate(model, N, 400.0, key=getkey(), n_replications=2, warmup=0.0, engine=engine,
                             service=service)
        accepted = round(res.throughput * N * res.t1 * res.n_replications)
        assert res.real_events == accepted + res.n_jobs, engine
        # Given the servers' idle time, the clock events of idle servers are Poisson with mean mu times it.
        idle_time = N * res.t1 * res.n_replications * (1.0 - res.tails[1])
        assert abs(res.events - res.real_events - idle_time) <= 5 * math.sqrt(idle_time), engine


def test_overflow_raises_naming_max_queue(getkey):
    with pytest.raises(ValueError, match=r"max_queue=3 is too small: \d+ move\(s\) beyond the truncation.*"
                                         r"raise max_queue \(e\.g\. max_queue=6\)"):
        jsmkt.simulate(jsq_tables.BatchJSQ(0.45, [0.5, 0.5], d=1), 20, 300.0, key=getkey(), max_queue=3)


class _NoTables:
    lam = 0.5


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        (_NoTables(), {}, r"must be a jsmkt.JSQd or jsmkt.JSQdPH, or a model with simulation tables: a _NoTables "
                          r"has no simulation tables"),
        (jsq_tables.BatchJSQ(0.3, [1.0]), dict(engine="fast"), r"engine='fast' runs jsmkt.JSQd and jsmkt.JSQdPH "
                                                               r"only, not a BatchJSQ"),
        (jsmkt.JSQd(0.5), dict(engine="warp"), r"engine='warp' is not one of \('auto', 'fast', 'generic'\)"),
        (jsmkt.JSQd(0.5), dict(engine=None), r"engine=None is not one of"),
        (jsq_tables.BatchJSQ(0.3, [1.0]), dict(service=jsmkt.exponential(1.0)), r"a BatchJSQ simulates its own "
                                                                                 r"service"),
        (jsmkt.JSQd(0.5), dict(engine="generic", service=jsmkt.deterministic(1.0)), r"general distribution: the "
                                                                                    r"generic engine executes"),
        (jsmkt.JSQd(1.2), dict(engine="generic"), r"^unstable: lam=1.2 >= capacity mu=1 per server"),
        (jsq_tables.BatchJSQ(0.3, [1.0], d=3), dict(sampling="without_replacement"), r"d=3 exceeds n_servers=2"),
        (_model(lambda top: "tables", 0.5, "Bad"), {}, r"simulation_tables returned str"),
        (_model(lambda top: jsq_tables.batch_jsq_tables(0.3, [1.0], [1.0], 1.0, top + 1), 0.5, "Deep"),
         dict(max_queue=5), r"simulation_tables\(5\) has cells of level 6 > 5"),
    ],
)
def test_refused_models_and_arguments(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.simulate(model, 2, 50.0, key=jr.PRNGKey(0), **kwargs)


class _SubJSQd(jsmkt.JSQd):
    """A subclass, which might change the physics: the fast engines do not take it for JSQ(d)."""


def test_the_engine_and_truncation_follow_the_models_hooks():
    """The plan of a run (no run): the fast JSQ engines for a model whose `jsq_fast_path()` says it is JSQ(d), the
    generic one for a subclass and for another family; a retrial model with linear retrials (its rates grow with
    the orbit) is truncated 4 levels above the first orbit size whose mean-field tail is below 1e-12 / N, computed
    here from `solve_fixed_point`, and the other policy by the rule for its load."""
    keys = jr.split(jr.PRNGKey(0), 1)

    def planned(model, n=50):
        return plan.plan_run(model, None, n, 1, True, None, keys, 100.0, False, "auto")

    assert planned(jsmkt.JSQd(0.5)).engine == "fast"
    assert planned(jsmkt.JSQdPH(0.5, jsmkt.erlang(2, 1.0))).engine == "fast"
    assert planned(_SubJSQd(0.5)).engine == "generic"
    assert planned(jsmkt.JSQdBatch(0.3, [0.5, 0.5])).engine == "generic"
    linear = jsmkt.RetrialJSQ(0.6, 0.5, d1=2, d2=2, K=60)
    s = np.asarray(linear.tails(jsmkt.solve_fixed_point(linear).value))
    top = int(np.flatnonzero(s < 1e-12 / 50)[0]) + 4
    assert top < linear.K
    p = planned(linear)
    assert (p.engine, p.max_queue, p.default_note) == ("generic", top, " (from the model's mean-field tail)")
    assert "for load" in planned(jsmkt.RetrialJSQ(0.6, 0.5, policy="constant", K=60)).default_note


def _good(**change):
    t = jsq_tables.batch_jsq_tables(0.3, [0.5, 0.5], [0.0, 1.0], 1.0, 6)
    return t._replace(**change)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(act_prob=np.full((7, 1), 1.5)), r"act_prob: cell 0's actions have total probability 1.5 > 1"),
        (dict(act_prob=np.full((7, 2), 0.1)), r"act_target has shape \(7, 1\); expected \(7, 2\)"),
        (dict(eff_target=np.full((1, 7, 2), 9)), r"eff_target\(0, 0, 0\) = 9 is neither a cell 0..6 nor OVERFLOW"),
        (dict(choice=np.array([[0.5, 0.4]])), r"choice\[0\] sums to 0.9"),
        (dict(eff_prob=np.full((1, 7, 2), 0.4)), r"eff_prob\[0, 0\] sums to 0.8; the effect on an eligible cell"),
        (dict(act_stream=np.zeros((7, 1), int)), r"fcfs is True but some act_stream >= 0"),
        (dict(status=np.full(7, 2)), r"status must index tables.status_names \(2 names\); got 2"),
        (dict(key=np.full((1, 7), -1)), r"key\(0, 0\) is outside 0..INELIGIBLE"),
        (dict(stream_rate=np.array([np.nan])), r"stream_rate holds non-finite entries"),
        (dict(level=np.arange(7.0)), r"tables.level must hold integers, got dtype float64"),
        (dict(empty_cell=7), r"empty_cell=7 is not a cell 0..6"),
    ],
)
def test_bad_tables_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        tm.check_tables(_good(**change))


def test_structure_is_hashed_by_its_integer_tables():
    """One compilation per structure: new rates and probabilities keep it, other targets or keys do not."""
    a = tm.Structure(tm.check_tables(_good()))
    b = tm.Structure(tm.check_tables(_good(stream_rate=np.array([0.4]), eff_prob=np.tile([0.3, 0.7], (1, 7, 1)))))
    c = tm.Structure(tm.check_tables(_good(key=np.zeros((1, 7), int))))
    assert a == b and hash(a) == hash(b) and a != c
    assert (a.up, a.down, a.queue, a.width, a.origins) == (2, 1, 6, 2, False)


def test_new_parameter_values_reuse_the_compilation(getkey):
    jsmkt.simulate(jsq_tables.BatchJSQ(0.3, [0.5, 0.5], d=2), 30, 50.0, key=getkey(), max_queue=40)
    misses = driver._compiled.cache_info().misses
    jsmkt.simulate(jsq_tables.BatchJSQ(0.35, [0.4, 0.6], d=2), 30, 50.0, key=getkey(), max_queue=40)
    assert driver._compiled.cache_info().misses == misses


def test_vmapped_form_follows_the_same_path(getkey, monkeypatch):
    """The generic engine vmapped over replications with loops of a fixed length (the form run off a CPU) applies
    the same events as the one-event-at-a-time form: the same run, up to the rounding of sums."""
    model = jsq_tables.BatchJSQ(0.5, [0.5, 0.5], d=2)
    kw = dict(key=getkey(), n_replications=2, max_queue=40)
    runs = []
    for sequential in (True, False):
        monkeypatch.setattr(plan, "_generic_sequential", lambda s=sequential: s)
        runs.append(jsmkt.simulate(model, 30, 200.0, **kw))
    a, b = runs
    assert (a.events, a.real_events, a.n_jobs) == (b.events, b.real_events, b.n_jobs)
    np.testing.assert_allclose(a.tails, b.tails, rtol=1e-9, atol=1e-12)
    assert a.mean_sojourn_time == pytest.approx(b.mean_sojourn_time, rel=1e-12)
    assert a.sojourn_time_percentiles == pytest.approx(b.sojourn_time_percentiles, rel=1e-12)


def _run_hlo(tables, max_d_replace=True, sequential=True) -> str:
    tables = tm.check_tables(tables)
    structure = tm.Structure(tables)
    cfg = generic.Config(n=97, structure=structure, replace=max_d_replace, block=16, n_bins=64,
                         sequential=sequential, exact=plan._exact_selection(structure))
    params = generic.params_of(structure, tables, 0, 97)
    init, run = driver._compiled(cfg)
    states = init(params, jr.split(jr.PRNGKey(0), 3))
    return run.lower(params, states, jnp.asarray(1.0)).compile().as_text()


@pytest.mark.default_xla
@cpu_only
def test_event_loop_is_one_kernel():
    """Performance guard: XLA compiles the generic engine's event loop into a single kernel (a "small call") for
    JSQ(d) with PH service up to `_GENERIC_ONE_KERNEL_MAX_D` sampled servers (here H2, a random choice number,
    distinct samples), for batches of up to 3 jobs, and for those batches from a BMAP's global phase."""
    d = plan._GENERIC_ONE_KERNEL_MAX_D
    h2 = jsmkt.hyperexponential2(1.0, 4.0)
    jsq = jsq_tables.jsq_tables(0.9, np.ones(d) / d, h2.alpha, h2.T, 13)
    assert 'xla_cpu_small_call="true"' in _run_hlo(jsq, max_d_replace=False)
    batch = jsq_tables.batch_jsq_tables(0.3, [0.4, 0.3, 0.3], [0.0, 1.0], 1.0, 13)
    assert 'xla_cpu_small_call="true"' in _run_hlo(batch)
    # A global phase (a BMAP, batches of up to 3 from two phases and its silent moves): one read more per event.
    bmap = jsmkt.BMAP([[-0.61, 0.01], [0.03, -0.53]], [np.diag([0.6, 0.0]), np.zeros((2, 2)), np.diag([0.0, 0.5])])
    assert 'xla_cpu_small_call="true"' in _run_hlo(model_tables(jsmkt.JSQdBMAP(bmap, d=2, K=13), 13))


@pytest.mark.parametrize("sequential", [True, False])
def test_event_loop_does_not_copy_buffers(sequential):
    """Performance guard: the per-server arrays are updated in place (a copy of one inside the loop costs O(N)
    per event)."""
    hlo = _run_hlo(jsq_tables.batch_jsq_tables(0.3, [0.5, 0.5], [0.0, 1.0], 1.0, 13), sequential=sequential)
    big = [line for line in hlo.splitlines() if re.search(rf"\[((3,)?({97 * 13}|97)|{3 * 97 * 13}|{3 * 97})\]\S* copy\(",
                                                          line)]
    bodies = re.split(r"\n(?=%\S+ )|\nENTRY", hlo)
    in_loops = [b for b in bodies if ("while" in b.split("\n", 1)[0] or "region" in b.split("\n", 1)[0])]
    loop_copies = [line for b in in_loops for line in b.splitlines() if line in big]
    assert not loop_copies, loop_copies


_SHARDED_SCRIPT = """
import json
import jax
import jax.random as jr
import jsmkt
assert jsmkt.use_cpu_cores(2)
from jsmkt._simulate import jsq_tables
res = jsmkt.simulate(jsq_tables.BatchJSQ(0.5, [0.5, 0.5], d=2), 30, 200.0, key=jr.PRNGKey(7), n_replications=4)
print(json.dumps({"devices": len(jax.devices()), "events": res.events, "real": res.real_events,
                  "tails": res.tails.tolist(), "soj": res.mean_sojourn_time}))
"""


@pytest.mark.slow
@cpu_only
def test_replications_sharded_over_devices_give_the_same_run():
    proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    res = jsmkt.simulate(jsq_tables.BatchJSQ(0.5, [0.5, 0.5], d=2), 30, 200.0, key=jr.PRNGKey(7), n_replications=4)
    assert (out["events"], out["real"]) == (res.events, res.real_events)
    np.testing.assert_allclose(out["tails"], res.tails, rtol=1e-12, atol=1e-15)
    assert out["soj"] == pytest.approx(res.mean_sojourn_time, rel=1e-12)


def test_result_fields_and_to_dict(getkey):
    res = jsmkt.simulate(jsq_tables.BatchJSQ(0.4, [0.5, 0.5], d=2), 30, 200.0, key=getkey(), max_queue=40)
    assert res.tails.shape == (41,) and res.cell_fractions.shape == res.cell_fractions_ci.shape == (41,)
    assert res.tails[0] == 1.0 and np.all(np.diff(res.tails) <= 1e-15)
    np.testing.assert_allclose(res.tails[1:], np.cumsum(res.cell_fractions[::-1])[::-1][1:], rtol=1e-10, atol=1e-14)
    assert res.mean_queue_length == pytest.approx(float(np.arange(41) @ res.cell_fractions), rel=1e-10)
    assert res.events > res.real_events > res.n_jobs > 0 and res.phase_tails is None
    d = res.to_dict()
    json.dumps(d)
    assert d["engine"] == "generic" and d["real_events"] == res.real_events and set(d["sojourn_time_percentiles"]) == {
        "p50", "p90", "p99"}


def test_fast_engine_cell_fractions_with_a_phase_no_job_visits(getkey):
    """The fast PH engine leaves out a phase no job enters; its cells are still reported for every phase (zeros
    for the one left out), so that they line up with the generic engine's cells `k * m + i`."""
    model = jsmkt.JSQd(0.6, d=2)
    S = jsmkt.PH(jnp.array([1.0, 0.0]), jnp.array([[-1.0, 0.0], [0.0, -1000.0]]))
    key = getkey()
    a = jsmkt.simulate(model, 10, 100.0, key=key, service=S, max_queue=20)
    b = jsmkt.simulate(model, 10, 100.0, key=key, max_queue=20)
    assert a.cell_fractions.shape == (42,) and a.status_names == ("idle", "phase 1", "phase 2")
    np.testing.assert_array_equal(a.cell_fractions[0::2], b.cell_fractions)
    assert not a.cell_fractions[1::2].any() and not a.cell_fractions_ci[1::2].any()
    assert list(a.cell_status[:6]) == [0, 0, 1, 2, 1, 2] and list(a.cell_level[:6]) == [0, 0, 1, 1, 2, 2]


# --- long statistical checks ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("service", ["exponential", "h2"])
def test_generic_agrees_with_fast_n1000(getkey, service):
    """JSQ(2), N = 1000, lam = 0.9, exponential and H2 (SCV 4) service: the generic engine (on the model's own
    tables where it has them, and on those of `jsq_tables`) and the fast engine agree on E[T], E[Q], the
    throughput and the tails within their confidence intervals (independent keys)."""
    lam, N = 0.9, 1000
    model = (jsmkt.JSQd(lam, d=2) if service == "exponential" else
             jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, 4.0), d=2))
    svc = jsmkt.exponential(1.0) if service == "exponential" else jsmkt.hyperexponential2(1.0, 4.0)
    kw = dict(n_replications=16)
    fast = jsmkt.simulate(model, N, 600.0, key=getkey(), engine="fast", **kw)
    for gen in (jsmkt.simulate(model, N, 600.0, key=getkey(), engine="generic", **kw),
                jsmkt.simulate(model, N, 600.0, key=getkey(), engine="generic", service=svc, **kw)):
        _assert_agree(fast, gen, fast.mean_sojourn_time, gen.mean_sojourn_time, fast.mean_sojourn_time_ci,
                      gen.mean_sojourn_time_ci, "E[T]")
        _assert_agree(fast, gen, fast.mean_queue_length, gen.mean_queue_length, fast.mean_queue_length_ci,
                      gen.mean_queue_length_ci, "E[Q]")
        _assert_agree(fast, gen, fast.throughput, gen.throughput, fast.throughput_ci, gen.throughput_ci, "X")
        for k in range(1, 6):
            _assert_agree(fast, gen, fast.tails[k], gen.tails[k], fast.tails_ci[k], gen.tails_ci[k], f"s_{k}")


@pytest.mark.slow
def test_batch_jsq_mean_field_n1000(getkey):
    """Batch arrivals (sizes 1, 2 with probability 1/2 at rate 0.6 per server), d = 2, mu = 1, N = 1000: the
    tails and E[Q] against the mean-field fixed point, within 4 SE plus an O(1/N) allowance (3/N on s_k, 5/N
    relative on E[Q]). At the fixed point the flow across the cut between levels k and k + 1 balances: batches
    that find the best of two sampled servers at j <= k jobs (probability s_j^2 - s_{j+1}^2) and hold more than
    k - j jobs cross it upwards, departures from servers with k + 1 jobs downwards:
    mu (s_{k+1} - s_{k+2}) = lam_b sum_{j<=k} (s_j^2 - s_{j+1}^2) P(B > k - j) = F_k. Summed over the cuts above,
    mu s_{k+1} = sum_{i>=k} F_i, which is iterated to its fixed point (from s_1 = lam_b E[B] / mu = 0.9)."""
    lam_b, N, K = 0.6, 1000, 40
    tail_b = np.array([1.0, 0.5, 0.0])  # P(B > i), i = 0, 1, 2
    s = np.concatenate([[1.0], 0.9 ** np.arange(1, K + 1)])
    for _ in range(10_000):
        flow = np.array([lam_b * np.sum((s[: k + 1] ** 2 - s[1 : k + 2] ** 2) * tail_b[np.minimum(k - np.arange(k + 1),
                                                                                                  2)])
                         for k in range(K)])
        new = np.concatenate([[1.0], np.cumsum(flow[::-1])[::-1]])
        done = np.max(np.abs(new - s)) < 1e-15
        s = new
        if done:
            break
    assert done and s[1] == pytest.approx(0.9, rel=1e-12)  # the busy fraction is the load
    EQ = s[1:].sum()
    res = jsmkt.simulate(jsq_tables.BatchJSQ(lam_b, [0.5, 0.5], d=2), N, 600.0, key=getkey(), n_replications=16)
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, EQ, allowance=5 / N * EQ, what="E[Q]")
    for k in range(1, 7):
        _assert_close(res, res.tails[k], res.tails_ci[k], s[k], allowance=3 / N, what=f"s_{k}")


# --- the exact engine (tables without FCFS queues: the retrial families) ----------------------------------------


def _mm1_retrial_law(lam, theta, mu, top, policy="linear"):
    """Stationary law of one M/M/1 retrial queue, from its generator on the states (orbit j, busy b), j <= top,
    solved numerically: (j, 0) -> (j, 1) at rate lam, (j, 1) -> (j + 1, 1) at lam (a blocked arrival joins the
    orbit), (j, 1) -> (j, 0) at mu, (j, 0) -> (j - 1, 1) at j theta (linear retrials; theta for constant ones: a
    retrial served)."""
    size = 2 * (top + 1)
    Q = np.zeros((size, size))
    for j in range(top + 1):
        idle, busy = 2 * j, 2 * j + 1
        Q[idle, busy] += lam
        Q[busy, idle] += mu
        if j < top:
            Q[busy, busy + 2] += lam
        if j > 0:
            Q[idle, idle - 1] += j * theta if policy == "linear" else theta
    Q -= np.diag(Q.sum(axis=1))
    A = np.vstack([Q.T, np.ones(size)])
    p = np.linalg.lstsq(A, np.concatenate([np.zeros(size), [1.0]]), rcond=None)[0]
    return p.reshape(top + 1, 2)


def test_exact_engine_m_m_1_retrial_queues(getkey):
    """Own-orbit retrials with d1 = 1: each server is an M/M/1 retrial queue with linear retrials (rate j theta
    for an orbit of j), whose rates grow with the orbit: the engine draws each server's events from the sum tree
    of their rate bounds. The mean orbit, busy fraction and orbit tails agree with the stationary law of one
    queue's generator, and (almost) every event is real."""
    lam, theta = 0.6, 1.0
    model = jsmkt.RetrialJSQ(lam, theta, d1=1, retrial="own", K=30)
    p = _mm1_retrial_law(lam, theta, 1.0, 80)
    res = jsmkt.simulate(model, 20, 1500.0, key=getkey(), n_replications=8, max_queue=30)
    orbit = p.sum(axis=1)
    _assert_close(res, res.metrics["mean_orbit_size"], res.metrics_ci["mean_orbit_size"],
                  float(np.arange(orbit.size) @ orbit), what="E[orbit]")
    _assert_close(res, res.mean_queue_length, res.mean_queue_length_ci,
                  float(np.arange(orbit.size) @ orbit + p[:, 1].sum()), what="E[customers]")
    _assert_close(res, res.throughput, res.throughput_ci, lam, what="throughput")
    for k in (1, 2, 4):
        _assert_close(res, res.tails[k], res.tails_ci[k], float(orbit[k:].sum()), what=f"P(orbit >= {k})")
    assert res.real_events >= 0.875 * res.events, (res.real_events, res.events)


def _mm1_retrial_tagged(lam, theta, mu, top, policy):
    """A tagged job of one M/M/1 retrial queue whose orbit's retrials pick one of its jobs uniformly: the laws of
    its sojourn and waiting times as phase-type laws of an absorbing chain, written out here. By PASTA it finds
    (orbit m, busy b) with the stationary probabilities; if the server is idle it starts service at once (a
    waiting time of 0), else it joins the orbit and waits in the states (m other orbit jobs, b): busy, the service
    ends at mu and arrivals join the orbit at lam; idle, an arrival takes the server at lam, the tagged job
    retries successfully at theta (linear retrials; theta / (m + 1) for constant ones, the orbit's retrial picking
    it among m + 1) and another orbit job at m theta (theta m / (m + 1)). Once in service it leaves at rate mu.
    Returns the survival functions of the sojourn and waiting times (on a grid of times), their mean sojourn time
    and the law."""
    import scipy.linalg

    p = _mm1_retrial_law(lam, theta, mu, top, policy)
    size = 2 * (top + 1)
    served = size  # the tagged job in service
    T = np.zeros((size + 1, size + 1))
    for m in range(top + 1):
        idle, busy = 2 * m, 2 * m + 1
        T[busy, idle] += mu
        if m < top:
            T[busy, busy + 2] += lam
        T[idle, busy] += lam
        T[idle, served] += theta if policy == "linear" else theta / (m + 1)
        if m > 0:
            T[idle, idle - 1] += m * theta if policy == "linear" else theta * m / (m + 1)
    T -= np.diag(T.sum(axis=1) + np.eye(size + 1)[served] * mu)
    alpha = np.zeros(size + 1)
    alpha[1:size:2] = p[:, 1]
    alpha[served] = p[:, 0].sum()

    def survival(states, h=0.01, t_max=100.0):  # alpha exp(T t) 1 over the transient `states`, t = 0, h, 2h, ...
        step = scipy.linalg.expm(T[:states, :states] * h)
        v, out = alpha[:states], []
        for _ in range(int(round(t_max / h)) + 1):
            out.append(v.sum())
            v = v @ step
        return np.arange(len(out)) * h, np.asarray(out)

    mean = float(alpha @ np.linalg.solve(-T, np.ones(size + 1)))
    return survival(size + 1), survival(size), mean, p


def _quantile(survival, q):
    """The q-th percentile of a law given by its survival function on a fine grid `(t, sf)`, interpolated linearly
    (0 where an atom at 0 holds q % or more)."""
    t, sf = survival
    k = int(np.argmax(sf <= 1.0 - q / 100.0))
    assert sf[k] <= 1.0 - q / 100.0, "the grid ends before the percentile"
    if k == 0:
        return 0.0
    return float(t[k - 1] + (t[k] - t[k - 1]) * (sf[k - 1] - (1.0 - q / 100.0)) / (sf[k - 1] - sf[k]))


@pytest.mark.parametrize(("policy", "lam", "theta"), [("linear", 0.6, 1.0), ("constant", 0.6, 4.0)])
def test_own_orbit_sojourn_and_waiting_percentiles_m_m_1_retrial(getkey, policy, lam, theta):
    """Own-orbit retrials with d1 = 1 and any N: every server is an M/M/1 retrial queue with Poisson(lam)
    arrivals whose orbit's retrials pick one of its jobs uniformly. Each job's sojourn and waiting times are
    recorded (not Little's law): their percentiles, the waiting time's atom at 0 (1 - rho by PASTA) and the mean
    sojourn time agree with the tagged job's absorbing chain, solved here (`_mm1_retrial_tagged`); the chain's
    own mean agrees with Little's law on the stationary law."""
    top, mu = 50, 1.0
    soj_sf, wait_sf, mean, p = _mm1_retrial_tagged(lam, theta, mu, 80, policy)
    jobs = np.arange(p.shape[0])[:, None] + np.array([0, 1])[None, :]
    assert mean == pytest.approx(float((jobs * p).sum()) / lam, rel=1e-8)  # the chain against Little's law
    no_wait = 1.0 - wait_sf[1][0]
    assert no_wait == pytest.approx(1.0 - lam / mu, rel=1e-9)  # and the busy fraction against the load
    model = jsmkt.RetrialJSQ(lam, theta, d1=1, retrial="own", policy=policy, K=top)
    res = jsmkt.simulate(model, 20, 1500.0, key=getkey(), n_replications=8, max_queue=top, waiting_times=True,
                         percentiles=(50, 90, 99))
    assert res.n_jobs > 0.9 * 20 * lam * 1350
    _assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, mean, what="E[T] per job")
    for what, pct, ci, sf in (("sojourn", res.sojourn_time_percentiles, res.sojourn_time_percentiles_ci, soj_sf),
                              ("waiting", res.waiting_time_percentiles, res.waiting_time_percentiles_ci, wait_sf)):
        for q in (50, 90, 99):
            exact = _quantile(sf, q)
            # the histogram's bins are at most 0.4 % wide
            _assert_close(res, pct[q], ci[q], exact, allowance=0.004 * exact, what=f"{what} p{q} ({policy})")
    hist = res.waiting_time_histograms  # one row per replication: the fraction of jobs that did not wait
    zero = hist[:, 0] / hist.sum(axis=1)
    _assert_close(res, zero.mean(), driver._half_width(zero[:, None])[0], no_wait, what="P(wait = 0)")


def test_own_orbit_per_job_mean_agrees_with_littles_law(getkey, monkeypatch):
    """Own-orbit retrials with d1 = 2 (primaries join the idle or shortest-orbit sampled server): the per-job mean
    sojourn time agrees with Little's law's, mean jobs over throughput, and as many jobs leave as arrive (to
    those in the system at the ends). Recording the jobs changes nothing else: the same tables without random
    order (Little's law, no per-job times) run along the same path. The jobs' times depend neither on the chunks
    (the progress bar's) nor on the engine's form (the vmapped loop of a fixed length, run off a CPU, updates the
    stores as the sequential one)."""
    model = jsmkt.RetrialJSQ(0.7, 1.0, d1=2, retrial="own", K=12)
    kw = dict(key=getkey(), max_queue=12, waiting_times=True, n_replications=4)
    a = jsmkt.simulate(model, 30, 400.0, **kw)
    unordered = _model(lambda top: model_tables(model, top)._replace(random_order=False), 0.7, "Unordered")
    u = jsmkt.simulate(unordered, 30, 400.0, **(kw | dict(waiting_times=False)))
    assert (u.events, u.real_events, u.n_jobs, u.sojourn_time_percentiles) == (a.events, a.real_events, 0, None)
    np.testing.assert_array_equal(u.cell_fractions, a.cell_fractions)
    # Little's law (each replication's mean jobs over its throughput) against the jobs' own times
    _assert_close(a, a.mean_sojourn_time, a.mean_sojourn_time_ci, u.mean_sojourn_time, what="E[T] per job vs Little")
    assert abs(a.n_jobs - a.throughput * 30 * 360 * 4) <= 30 * 4 * 14  # at most 13 jobs per server at either end
    assert a.waiting_time_percentiles[50] < a.sojourn_time_percentiles[50]
    b = jsmkt.simulate(model, 30, 400.0, progress=True, **kw)
    monkeypatch.setattr(plan, "_generic_sequential", lambda: False)
    c = jsmkt.simulate(model, 30, 400.0, **kw)
    for r in (b, c):
        assert (r.events, r.n_jobs) == (a.events, a.n_jobs)
        assert r.mean_sojourn_time == pytest.approx(a.mean_sojourn_time, rel=1e-9)
        np.testing.assert_array_equal(r.sojourn_time_histograms, a.sojourn_time_histograms)
        np.testing.assert_array_equal(r.waiting_time_histograms, a.waiting_time_histograms)


def test_reprobing_retrials_have_no_per_job_times(getkey):
    """Re-probing retrials move jobs between servers: no per-job times, the mean sojourn time by Little's law, no
    percentiles, and waiting times refused, each saying why."""
    model = jsmkt.RetrialJSQ(0.7, 1.0, d1=2, d2=2, K=12)
    res = jsmkt.simulate(model, 30, 150.0, key=getkey(), max_queue=12, n_batches=5)
    assert res.sojourn_time_percentiles is None and res.sojourn_time_histograms is None and res.n_jobs == 0
    assert res.mean_sojourn_time == pytest.approx(res.mean_queue_length / res.throughput, rel=1e-12)
    assert res.to_dict()["sojourn_time_percentiles"] == {}
    with pytest.raises(ValueError, match="no sojourn-time percentiles: the model's jobs move between servers"):
        res.sojourn_time_percentile(99)
    with pytest.raises(ValueError, match="waiting_times=True: a RetrialJSQ holds no FCFS queues"):
        jsmkt.simulate(model, 30, 150.0, key=getkey(), max_queue=12, waiting_times=True)


def test_random_order_tables_are_checked():
    """Tables whose waiting jobs start in random order: a move that is none of the random-order moves, and
    in-service counts that are not 0 or 1, are refused naming the entry."""
    base = model_tables(jsmkt.RetrialJSQ(0.6, 1.0, d1=1, retrial="own", K=4), 4)
    assert base.random_order and list(base.in_service[:4]) == [0, 1, 0, 1]
    tm.check_tables(base)
    target = base.act_target.copy()
    target[3, 0] = 4  # (1, busy) -> (2, idle): the job in service would go back to waiting
    with pytest.raises(ValueError, match=r"tables.act_target\(3, 0\): the move from cell 3 .* is none of those"):
        tm.check_tables(base._replace(act_target=target))
    with pytest.raises(ValueError, match=r"tables.in_service\[1\] = 2 must be 0 or 1"):
        tm.check_tables(base._replace(in_service=np.where(np.arange(base.level.size) == 1, 2, base.in_service)))
    with pytest.raises(ValueError, match="random_order needs tables.in_service"):
        tm.check_tables(base._replace(in_service=None))


def test_exact_engine_agrees_with_uniformisation(getkey, monkeypatch):
    """Re-probing retrials (a dispatch started by the retrying server, real choice numbers): the exact engine and
    uniformisation at the largest rate of a cell, the engine's other path, give the same occupancy within their
    confidence intervals; uniformisation spends most of its events on self-loops, the exact engine (almost)
    none."""
    model = jsmkt.RetrialJSQ(0.7, 1.0, d1=1.5, d2=2.5, K=16)  # an example of the family
    runs = {}
    for exact in (True, False):
        monkeypatch.setattr(plan, "_exact_selection", lambda s, e=exact: e and not (s.fcfs or s.pool or s.phases))
        runs[exact] = jsmkt.simulate(model, 20, 800.0, key=getkey(), n_replications=4, max_queue=16)
    a, b = runs[True], runs[False]
    _assert_agree(a, b, a.mean_queue_length, b.mean_queue_length, a.mean_queue_length_ci, b.mean_queue_length_ci,
                  "L")
    for k in (1, 2, 3):
        _assert_agree(a, b, a.tails[k], b.tails[k], a.tails_ci[k], b.tails_ci[k], f"s_{k}")
    for name in ("prob_blocked", "mean_orbit_size"):
        _assert_agree(a, b, a.metrics[name], b.metrics[name], a.metrics_ci[name], b.metrics_ci[name], name)
    assert a.real_events >= 0.875 * a.events and b.real_events < 0.5 * b.events, (a, b)


def test_retrial_examples_events_are_real(getkey):
    """At least 7 events in 8 of the retrial family's examples are real: the exact engine draws a server's clock
    at an integer multiple of a quantum at most an eighth of the smallest positive rate of a cell (at most one in
    eight clock events a self-loop), and every stream event of a retrial model moves a server."""
    for name, model in jsmkt.RetrialJSQ.examples().items():
        res = jsmkt.simulate(model, 50, 100.0, key=getkey(), n_replications=2, max_queue=model.K)
        assert res.real_events >= 0.875 * res.events, (name, res.real_events, res.events)


def test_exact_engine_runs_do_not_depend_on_chunks_or_form(getkey, monkeypatch):
    """The exact engine's event times depend on the state (the total rate bound after the last event): a pending
    event keeps its time across chunk boundaries, so the whole-run averages depend neither on n_batches nor on the
    progress bar's sub-chunks, and the vmapped form (a loop of fixed length per block, run off a CPU) applies the
    same events as the one-event-at-a-time form."""
    model = jsmkt.RetrialJSQ(0.7, 1.0, d1=2, d2=2, K=12)
    kw = dict(key=getkey(), max_queue=12)
    runs = [jsmkt.simulate(model, 30, 150.0, n_batches=5, **kw), jsmkt.simulate(model, 30, 150.0, n_batches=13, **kw),
            jsmkt.simulate(model, 30, 150.0, n_batches=5, progress=True, **kw)]
    monkeypatch.setattr(plan, "_generic_sequential", lambda: False)
    runs.append(jsmkt.simulate(model, 30, 150.0, n_batches=5, **kw))
    a = runs[0]
    for b in runs[1:]:
        assert (a.events, a.real_events) == (b.events, b.real_events)
        np.testing.assert_allclose(a.cell_fractions, b.cell_fractions, rtol=1e-9, atol=1e-12)
        assert a.throughput == pytest.approx(b.throughput, rel=1e-12)


@pytest.mark.default_xla
@cpu_only
def test_exact_event_loop_is_one_kernel_without_copies():
    """Performance guard: the exact engine's event loop (the retrial family's examples: own retrials, and
    re-probing ones, whose retrial starts a dispatch, both with up to 3 sampled servers) compiles into a single
    kernel, and copies neither the server array nor the sum tree."""
    for name, model in jsmkt.RetrialJSQ.examples().items():
        hlo = _run_hlo(model_tables(model, model.K))
        small = [line for line in hlo.splitlines() if 'xla_cpu_small_call="true"' in line and " call(" in line]
        assert any("s32[97]" in line.split(" call(")[0] for line in small), f"{name}: the event loop is not one kernel"
        bodies = re.split(r"\n(?=%\S+ )|\nENTRY", hlo)
        in_loops = [b for b in bodies if ("while" in b.split("\n", 1)[0] or "region" in b.split("\n", 1)[0])]
        copies = [line for b in in_loops for line in b.splitlines()
                  if re.search(r"s32\[(97|128)\]\S* copy\(", line)]
        assert not copies, (name, copies)
