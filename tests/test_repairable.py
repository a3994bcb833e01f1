"""Supermarket models with repairable servers (`jsmkt.RepairableJSQ`) against independent derivations: JSQ(d) as
failures vanish, the availability of each repair scheme, central differences for the gradients, and (slow)
simulation of the N-server system."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jsmkt


K = 24  # one truncation for most tests (one compilation per variant)
MODELS = {"I": ("A1", "R1"), "II": ("A1", "R2"), "III": ("A2", "R1"), "IV": ("A2", "R2")}


def bisect(f, lo, hi, steps=200):
    """The root of an increasing `f` in [lo, hi]."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("name", ["I", pytest.param("II", marks=pytest.mark.slow),
                                  pytest.param("III", marks=pytest.mark.slow), "IV"])
def test_without_failures_every_model_is_jsqd(name):
    arrival, repair = MODELS[name]
    lam, d = 0.8, 2
    plain = jsmkt.JSQd(lam, d=d, K=K)
    ref = np.asarray(jsmkt.tails(plain, jsmkt.solve_fixed_point(plain)))
    model = jsmkt.RepairableJSQ(lam, 1e-12, 1.0, d1=d, arrival=arrival, repair=repair, K=K)
    fp = jsmkt.solve_fixed_point(model)
    np.testing.assert_allclose(jsmkt.tails(model, fp), ref, rtol=1e-9, atol=1e-15)
    assert float(jsmkt.availability(model, fp)) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("arrival", ["A1", "A2"])
@pytest.mark.parametrize("alpha, beta", [(0.1, 1.0), (0.2, 0.5)])
def test_r1_failed_fraction(arrival, alpha, beta):
    """Each server alternates independently between working (exponential of rate alpha) and under repair
    (exponential of rate beta): the failed fraction is alpha/(alpha + beta), whatever the queues."""
    model = jsmkt.RepairableJSQ(0.5, alpha, beta, arrival=arrival, K=K)
    fp = jsmkt.solve_fixed_point(model)
    assert 1 - float(jsmkt.availability(model, fp)) == pytest.approx(alpha / (alpha + beta), rel=1e-10)
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(0.5, rel=1e-10)


@pytest.mark.parametrize("arrival, alpha, beta, d2", [
    ("A1", 0.1, 1.0, 2), ("A2", 0.2, 0.5, 3),
    pytest.param("A2", 0.2, 0.5, 2, marks=pytest.mark.slow), pytest.param("A1", 0.3, 1.0, 1, marks=pytest.mark.slow),
])
def test_r2_availability(arrival, alpha, beta, d2):
    """The super repairman's events (rate beta per server) repair a server when one of the d2 sampled is failed:
    the availability x solves alpha x = beta (1 - x^d2) (found here by bisection)."""
    x = bisect(lambda a: alpha * a - beta * (1 - a**d2), 1e-12, 1.0)
    model = jsmkt.RepairableJSQ(0.5, alpha, beta, d2=d2, arrival=arrival, repair="R2", K=K)
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.availability(model, fp)) == pytest.approx(x, rel=1e-10)
    assert float(model.availability()) == pytest.approx(x, rel=1e-12)
    assert float(jsmkt.repairmen_utilisation(model, fp)) == pytest.approx(1 - x**d2, rel=1e-9)


def test_information_and_repair_grouping_help():
    """A.2 (status seen) beats A.1, R.2 (the longest failed queue repaired first, at the same total repair rate)
    beats R.1: E[T] of Model IV < III, II < I; with d1 = 1, A.1 and A.2 coincide (one sampled server)."""
    ET = {}
    for name, (arrival, repair) in MODELS.items():
        model = jsmkt.RepairableJSQ(0.7, 0.2, 0.5, arrival=arrival, repair=repair, K=K)
        ET[name] = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    assert ET["III"] < ET["I"] and ET["IV"] < ET["II"] and ET["II"] < ET["I"] and ET["IV"] < ET["III"]
    one = [jsmkt.RepairableJSQ(0.5, 0.2, 0.5, d1=1, arrival=a, K=120) for a in ("A1", "A2")]
    a, b = (float(jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m))) for m in one)
    assert a == pytest.approx(b, rel=1e-12)


def test_d1_r1_is_a_queue_with_server_breakdowns():
    """With d1 = 1 and R.1 each server is an M/M/1 queue with exponential breakdowns (preemptive-resume): its mean
    queue length from the quasi-birth-death process with phases (working, failed), solved here by truncation with
    NumPy's dense linear algebra. Its tail decays geometrically at the root in (0, 1) of the QBD's
    det(A0 + z A1 + z^2 A2) = 0, which the default K uses."""
    lam, alpha, beta, mu = 0.5, 0.2, 0.5, 1.0
    n = 400
    Q = np.zeros((2 * n, 2 * n))
    for k in range(n):
        for s in (0, 1):
            i = 2 * k + s
            if k + 1 < n:
                Q[i, 2 * (k + 1) + s] += lam
            if s == 0 and k > 0:
                Q[i, 2 * (k - 1)] += mu
            Q[i, 2 * k + 1 - s] += alpha if s == 0 else beta
    np.fill_diagonal(Q, -Q.sum(axis=1))
    A = np.vstack([Q.T, np.ones(2 * n)])
    p = np.linalg.lstsq(A, np.concatenate([np.zeros(2 * n), [1.0]]), rcond=None)[0]
    EQ = float(np.sum(np.repeat(np.arange(n), 2) * p))
    model = jsmkt.RepairableJSQ(lam, alpha, beta, d1=1, mu=mu)  # the default K follows the geometric tail
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(EQ, rel=1e-9)
    assert float(fp.tail_mass) < 1e-15


def test_r3_below_saturation_is_r1():
    """With j >= alpha/(alpha + beta) every failed server has a small repairman and the large one idles: R.1, and
    nothing depends on j."""
    r1 = jsmkt.RepairableJSQ(0.7, 0.1, 1.0, K=K)
    r3 = jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R3", j=0.5, K=K)
    assert not r3.saturated
    fp1, fp3 = jsmkt.solve_fixed_point(r1), jsmkt.solve_fixed_point(r3)
    np.testing.assert_allclose(jsmkt.tails(r3, fp3), jsmkt.tails(r1, fp1), rtol=1e-12, atol=1e-16)
    assert float(jsmkt.availability(r3, fp3)) == pytest.approx(1.0 / 1.1, rel=1e-12)
    assert float(jsmkt.fraction_failed_waiting(r3, fp3)) == 0.0
    assert float(jsmkt.repairmen_utilisation(r3, fp3)) == pytest.approx(0.1 / 1.1, rel=1e-10)


@pytest.mark.parametrize("arrival, alpha, beta, j, d2", [
    ("A1", 0.1, 1.0, 0.05, 2), pytest.param("A2", 0.2, 0.5, 0.1, 3, marks=pytest.mark.slow)])
def test_r3_at_saturation(arrival, alpha, beta, j, d2):
    """All J = jN small repairmen are busy and failed servers wait; the large repairman (rate (1 - j) beta per
    server) repairs when one of its d2 sampled servers waits, so the availability a solves
    alpha a = beta j + (1 - j) beta (1 - (a + j)^d2) (found here by bisection), a fraction 1 - a - j of the
    servers waits, and the repair capacity N beta does the failure flow: its utilisation is alpha a / beta."""
    a = bisect(lambda a: alpha * a - beta * j - (1 - j) * beta * (1 - (a + j) ** d2), 1e-12, 1.0 - j)
    model = jsmkt.RepairableJSQ(0.5, alpha, beta, d2=d2, arrival=arrival, repair="R3", j=j, K=K)
    assert model.saturated
    fp = jsmkt.solve_fixed_point(model)
    x = np.asarray(model.occupancy(fp.value)).reshape(K + 1, 3).sum(axis=0)
    np.testing.assert_allclose(x, [a, j, 1 - a - j], rtol=1e-10)
    assert float(jsmkt.availability(model, fp)) == pytest.approx(a, rel=1e-10)
    assert float(jsmkt.fraction_failed_waiting(model, fp)) == pytest.approx((1 - a - j) / (1 - a), rel=1e-10)
    assert float(jsmkt.repairmen_utilisation(model, fp)) == pytest.approx(alpha * a / beta, rel=1e-10)
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(0.5, rel=1e-10)


def test_r3_is_continuous_at_the_switch():
    """At j* = alpha/(alpha + beta) the saturated regime meets the one below saturation: the fixed points from
    either side agree (the one-sided derivatives differ)."""
    alpha, beta = 0.2, 0.5
    js = alpha / (alpha + beta)
    ET = [float(jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m))) for m in (
        jsmkt.RepairableJSQ(0.5, alpha, beta, repair="R3", j=js - 1e-9, K=K),
        jsmkt.RepairableJSQ(0.5, alpha, beta, repair="R3", j=js + 1e-9, K=K))]
    assert ET[0] == pytest.approx(ET[1], rel=1e-7)


@pytest.mark.slow  # one trace and ten solves of a 3-status model (the suite's time budget)
def test_r3_gradients_at_saturation_agree_with_central_differences():
    base = dict(lam=0.5, alpha=0.2, beta=0.5, mu=1.0, j=0.1)

    def ET(**p):
        model = jsmkt.RepairableJSQ(p["lam"], p["alpha"], p["beta"], mu=p["mu"], arrival="A2", repair="R3", j=p["j"],
                                    K=2 * K, saturated=True)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    grads = jax.grad(lambda p: ET(**p))(base)  # one trace for every parameter
    # more small repairmen leave less of the capacity to the large one, whose d2 samples find waiting servers more
    # often than a busy fraction 1 - a would: lower availability, longer sojourns
    assert float(grads["j"]) > 0
    for what in base:
        h = 1e-5
        fd = (float(ET(**(base | {what: base[what] + h}))) - float(ET(**(base | {what: base[what] - h})))) / (2 * h)
        assert float(grads[what]) == pytest.approx(fd, rel=1e-6, abs=1e-9), what
    # below saturation nothing depends on j
    g = jax.grad(lambda j: jsmkt.mean_sojourn_time(
        m := jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R3", j=j, K=K, saturated=False), jsmkt.solve_fixed_point(m)
    ))(0.5)
    assert float(g) == 0.0


def test_r3_saturated_transient_with_one_sample():
    """From the saturated pool's initial state (the jN small repairmen at empty servers, the others working), with
    d2 = 1 the waiting fraction w follows dw/dt = alpha (1 - j - w) - beta j - (1 - j) beta w, so
    w(t) = w_inf (1 - exp(-(alpha + (1 - j) beta) t))."""
    alpha, beta, j = 0.2, 0.5, 0.1
    model = jsmkt.RepairableJSQ(0.3, alpha, beta, d2=1, repair="R3", j=j, K=K)
    ts = jnp.array([0.5, 2.0, 8.0])
    traj = jsmkt.integrate(model, 8.0, ts=ts)
    w_inf = (alpha * (1 - j) - beta * j) / (alpha + (1 - j) * beta)
    for t, y in zip(np.asarray(ts), traj.ys, strict=True):
        w = float(np.asarray(model.occupancy(y)).reshape(K + 1, 3)[:, 2].sum())
        assert w == pytest.approx(w_inf * (1 - np.exp(-(alpha + (1 - j) * beta) * t)), rel=1e-6)


@pytest.mark.parametrize("name", ["III"])  # Model II: the registry's contract test on its first example
def test_gradients_agree_with_central_differences(name):
    arrival, repair = MODELS[name]
    base = dict(lam=0.5, alpha=0.2, beta=0.5, mu=1.0, d1=1.5, d2=2.5)

    def ET(**p):
        model = jsmkt.RepairableJSQ(p["lam"], p["alpha"], p["beta"], d1=jnp.asarray(p["d1"]), d2=jnp.asarray(p["d2"]),
                                    mu=p["mu"], arrival=arrival, repair=repair, K=2 * K, d1_max=2, d2_max=3)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    grads = jax.grad(lambda p: ET(**p))(base)  # one trace for every parameter
    for what in base:
        g = float(grads[what])
        h = 1e-5
        fd = (float(ET(**(base | {what: base[what] + h}))) - float(ET(**(base | {what: base[what] - h})))) / (2 * h)
        assert g == pytest.approx(fd, rel=1e-6, abs=1e-9), what


@pytest.mark.parametrize("kwargs, match", [
    (dict(lam=0.95, alpha=0.1, beta=1.0), r"unstable: lam=0.95 >= mu\*a=0.909091"),
    (dict(lam=0.5, alpha=-0.1, beta=1.0), r"alpha=-0.1 must be positive"),
    (dict(lam=0.5, alpha=0.1, beta=0.0), r"beta=0.0 must be positive"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, arrival="A3"), r"arrival='A3' is not one of 'A1', 'A2'"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, repair="R4"), r"repair='R4' is not one of 'R1', 'R2', 'R3'"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, repair="R3"), r"repair='R3' needs j"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, repair="R3", j=1.0), r"j=1.0 must lie in \[0, 1\)"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, repair="R3", j=-0.1), r"j=-0.1 must lie in \[0, 1\)"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, repair="R3", j=0.05, saturated=False), r"saturated=False, but j=0.05 is "
     r"below alpha/\(alpha \+ beta\)=0.0909091"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, saturated=True), r"saturated=True applies to repair='R3' only"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, j=0.5), r"j=0.5 applies to repair='R3' only"),
    (dict(lam=0.5, alpha=0.1, beta=1.0, d2=0), r"d2=0 must be >= 1"),
])
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.RepairableJSQ(**kwargs)


# --- simulation (slow) -------------------------------------------------------------------------------------------

# The full grid of the acceptance check is experiments/repair/validate.py; these are a few of its cases.
_SIM = [("II", 0.5, 0.2, 0.5), ("III", 0.7, 0.1, 1.0)]


@pytest.mark.slow
@pytest.mark.parametrize("name, lam, alpha, beta", _SIM)
def test_mean_field_agrees_with_simulation_n1000(name, lam, alpha, beta):
    arrival, repair = MODELS[name]
    model = jsmkt.RepairableJSQ(lam, alpha, beta, arrival=arrival, repair=repair)
    ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    sim = jsmkt.simulate(model, 1000, 2000.0, warmup=200.0, key=jr.PRNGKey(3), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)


@pytest.mark.slow  # compiles several models (the suite's time budget)
def test_transient_and_refined_mean_field():
    """From the empty system the ODE reaches the fixed point, and under R.1 the failed fraction follows
    alpha/(alpha + beta) (1 - exp(-(alpha + beta) t)) (each server's two-state chain). With d1 = 1 the servers are
    independent: the refined mean field has no 1/N bias and N Var(s_1) = s_1 (1 - s_1)."""
    alpha, beta = 0.2, 0.5
    model = jsmkt.RepairableJSQ(0.3, alpha, beta, d1=1, K=60)
    traj = jsmkt.integrate(model, 5.0, ts=jnp.array([1.0, 5.0]))
    for t, y in zip((1.0, 5.0), traj.ys, strict=True):
        failed = 1 - float(jsmkt.availability(model, y))
        assert failed == pytest.approx(alpha / (alpha + beta) * (1 - np.exp(-(alpha + beta) * t)), rel=1e-7)
    fp = jsmkt.solve_fixed_point(model)
    y_ode, _ = jsmkt.steady_state(model)
    np.testing.assert_allclose(y_ode, fp.value, rtol=1e-6, atol=1e-9)
    rmf = jsmkt.refined_mean_field(fp)
    np.testing.assert_allclose(rmf.correction, 0.0, atol=1e-9)
    s1 = float(jsmkt.tails(model, fp)[1])
    var = float(rmf.std(lambda y: jsmkt.tails(model, y)[1], 1)) ** 2
    assert var == pytest.approx(s1 * (1 - s1), rel=1e-8)


def test_r2_with_one_sample_is_r1():
    """With d2 = 1 the super repairman's event hits a uniformly chosen server, so each failed server is repaired
    at rate beta, whatever its queue: R.2 is R.1."""
    r1 = jsmkt.RepairableJSQ(0.7, 0.2, 0.5, K=K)
    r2 = jsmkt.RepairableJSQ(0.7, 0.2, 0.5, d2=1, repair="R2", K=K)
    np.testing.assert_allclose(jsmkt.solve_fixed_point(r2).value, jsmkt.solve_fixed_point(r1).value, rtol=1e-11,
                               atol=1e-15)


def test_the_pool_of_small_repairmen_is_the_machine_repair_chain():
    """At N = 20 servers with J = 2 small repairmen the number n of failed servers is a birth-death chain: up at
    alpha (N - n), down at beta min(n, J) plus the large repairman's N (1 - j) beta times the chance that one of
    its d2 samples (with replacement) waits, 1 - (1 - w/N)^d2 with w = (n - J)^+. The simulator, which executes
    the pool's rules server by server, must give its stationary law's waiting and under-repair fractions."""
    N, J, alpha, beta, d2 = 20, 2, 0.2, 0.5, 2
    j = J / N
    n = np.arange(N + 1)
    w = np.maximum(n - J, 0)
    up = alpha * (N - n)
    down = beta * np.minimum(n, J) + N * (1 - j) * beta * (1 - (1 - w / N) ** d2)
    pi = np.concatenate([[1.0], np.cumprod(up[:-1] / down[1:])])
    pi /= pi.sum()
    expect = np.array([pi @ (N - n), pi @ np.minimum(n, J), pi @ w]) / N
    model = jsmkt.RepairableJSQ(0.05, alpha, beta, d2=d2, repair="R3", j=j)
    sim = jsmkt.simulate(model, N, 4000.0, warmup=100.0, key=jr.PRNGKey(5), n_replications=8)
    got = np.array([sim.cell_fractions[sim.cell_status == s].sum() for s in range(3)])
    ci = np.array([sim.cell_fractions_ci[sim.cell_status == s].sum() for s in range(3)])  # a bound on the sum's
    assert np.all(np.abs(got - expect) < ci), (got, expect, ci)


@pytest.mark.slow
@pytest.mark.parametrize("arrival", ["A1"])  # A2: the registry's example (test_families); all: experiments/repair
def test_r3_at_saturation_agrees_with_simulation_n1000(arrival):
    model = jsmkt.RepairableJSQ(0.7, 0.1, 1.0, arrival=arrival, repair="R3", j=0.05)
    ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    sim = jsmkt.simulate(model, 1000, 2000.0, warmup=200.0, key=jr.PRNGKey(4), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)
