"""The retrial supermarket model (`jsmkt.RetrialJSQ`) against independently derived results: the M/M/1 retrial
queue for own retrials with one choice, the orbit balance for re-probing retrials, central differences for the
gradients, and (slow) simulation of the N-server system."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import jsmkt


K = 40  # one truncation for most tests (one compilation per variant)


def pgf(d, z):
    """E[z^D] of a choice number `d`: an integer, or a real read as floor(d) + 1 with probability d - floor(d)."""
    lo = int(np.floor(d))
    f = d - lo
    return (1 - f) * z**lo + f * z ** (lo + 1)


# --- own retrials, one choice: the M/M/1 retrial queue -----------------------------------------------------------


@pytest.mark.parametrize("lam, theta, mu", [(0.5, 2.0, 1.3), (0.8, 0.5, 1.0)])
def test_own_d1_linear_is_the_mm1_retrial_queue(lam, theta, mu):
    """Each server is an M/M/1 retrial queue with classical (linear) retrials: mean orbit size
    rho^2/(1 - rho) + lam rho/(theta (1 - rho)) and P(busy) = rho (Falin & Templeton, Retrial Queues, 1997,
    Section 1.2)."""
    rho = lam / mu
    model = jsmkt.RetrialJSQ(lam, theta, d1=1, mu=mu, retrial="own")
    fp = jsmkt.solve_fixed_point(model)
    EO = rho**2 / (1 - rho) + lam * rho / (theta * (1 - rho))
    assert float(jsmkt.mean_orbit_size(model, fp)) == pytest.approx(EO, rel=1e-10)
    assert float(jsmkt.utilisation(model, fp)) == pytest.approx(rho, rel=1e-10)
    assert float(jsmkt.mean_sojourn_time(model, fp)) == pytest.approx((EO + rho) / lam, rel=1e-10)
    assert float(fp.tail_mass) < 1e-12


@pytest.mark.parametrize("lam, theta, mu", [(0.5, 2.0, 1.3), (0.3, 1.0, 1.0)])
def test_own_d1_constant_is_the_mm1_retrial_queue(lam, theta, mu):
    """Constant retrial policy (rate theta per non-empty orbit). With p0_j, p1_j the probabilities of an idle /
    busy server with j in orbit: the cut between j and j + 1 gives lam p1_j = theta p0_{j+1}, the idle cells
    (lam + theta 1{j>0}) p0_j = mu p1_j. So p0_j = a r^(j-1) p00 (j >= 1) with a = lam rho/theta,
    r = lam (lam + theta)/(theta mu) < 1, p1_j = b p0_j (j >= 1) with b = (lam + theta)/mu, p1_0 = rho p00, and
    E[orbit] = p00 a (1 + b)/(1 - r)^2, p00 = 1/(1 + rho + a (1 + b)/(1 - r))."""
    rho = lam / mu
    r, a, b = lam * (lam + theta) / (theta * mu), lam * rho / theta, (lam + theta) / mu
    p00 = 1 / (1 + rho + a * (1 + b) / (1 - r))
    model = jsmkt.RetrialJSQ(lam, theta, d1=1, mu=mu, retrial="own", policy="constant")
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.mean_orbit_size(model, fp)) == pytest.approx(p00 * a * (1 + b) / (1 - r) ** 2, rel=1e-10)
    x = np.asarray(model.occupancy(fp.value)).reshape(-1, 2)
    assert x[0, 0] == pytest.approx(p00, rel=1e-10)
    np.testing.assert_allclose(x[1:6, 0], a * r ** np.arange(5) * p00, rtol=1e-10)
    # P(retrial succeeds): the retrial-weighted share of non-empty orbits whose server is idle.
    idle = np.sum(x[1:, 0]) / np.sum(x[1:])
    assert float(jsmkt.prob_retrial_success(model, fp)) == pytest.approx(idle, rel=1e-10)


# --- re-probing retrials: the orbit balance ---------------------------------------------------------------------


@pytest.mark.parametrize("lam, theta, d1, d2", [(0.5, 2.0, 1, 1), (0.8, 0.5, 2, 1), (0.8, 0.5, 3, 3),
                                                (0.5, 2.0, 1.5, 2.5)])
def test_reprobe_orbit_balance(lam, theta, d1, d2):
    """Every customer is served, so the busy fraction is rho = lam/mu; a primary joins an orbit when all d1
    sampled servers are busy (probability g1(rho)), a retrial leaves it when one of d2 is idle (1 - g2(rho)), and
    orbit customers retry at rate theta each: lam g1(rho) = theta E[orbit] (1 - g2(rho))."""
    mu = 1.0
    rho = lam / mu
    model = jsmkt.RetrialJSQ(lam, theta, d1=d1, d2=d2, mu=mu, K=K)
    fp = jsmkt.solve_fixed_point(model)
    EO = lam * pgf(d1, rho) / (theta * (1 - pgf(d2, rho)))
    assert float(jsmkt.mean_orbit_size(model, fp)) == pytest.approx(EO, rel=1e-10)
    assert float(jsmkt.prob_blocked(model, fp)) == pytest.approx(pgf(d1, rho), rel=1e-10)
    assert float(jsmkt.prob_retrial_success(model, fp)) == pytest.approx(1 - pgf(d2, rho), rel=1e-10)
    # The tagged customer: served at once, or after a geometric number of retrials at rate theta.
    ET = 1 / mu + pgf(d1, rho) / (theta * (1 - pgf(d2, rho)))
    assert float(jsmkt.mean_sojourn_time(model, fp)) == pytest.approx(ET, rel=1e-10)
    assert float(jsmkt.mean_sojourn_time_tagged(model, fp)) == pytest.approx(ET, rel=1e-10)


def test_reprobe_constant_orbit_balance():
    """Constant policy: retrials at rate theta per non-empty orbit, lam g1(rho) = theta P(orbit >= 1)(1 - g2(rho))."""
    lam, theta = 0.7, 1.5
    model = jsmkt.RetrialJSQ(lam, theta, d1=2, d2=3, policy="constant", K=K)
    fp = jsmkt.solve_fixed_point(model)
    s1 = float(jsmkt.tails(model, fp)[1])
    assert theta * s1 * (1 - lam**3) == pytest.approx(lam * lam**2, rel=1e-10)


@pytest.mark.slow  # compiles several models (the suite's time budget)
def test_own_orbit_balance_and_choices_help():
    """Own retrials succeed only at an idle own server: lam g1(rho) = theta E[orbit; idle]. More choices empty the
    orbits: E[T] falls with d1 for either kind of retrial, and re-probing beats own retrials."""
    lam, theta = 0.8, 0.5
    ETs = {}
    for retrial in ("own", "reprobe"):
        for d1 in (1, 2):
            model = jsmkt.RetrialJSQ(lam, theta, d1=d1, d2=2, retrial=retrial, K=120)
            fp = jsmkt.solve_fixed_point(model)
            ETs[retrial, d1] = float(jsmkt.mean_sojourn_time(model, fp))
            if retrial == "own":
                x = np.asarray(model.occupancy(fp.value)).reshape(-1, 2)
                j = np.arange(x.shape[0])
                assert theta * np.sum(j * x[:, 0]) == pytest.approx(lam * lam**d1, rel=1e-10)
    for retrial in ("own", "reprobe"):
        assert ETs[retrial, 1] > ETs[retrial, 2]
    assert all(ETs["reprobe", d] < ETs["own", d] for d in (1, 2))


@pytest.mark.slow  # compiles several models (the suite's time budget)
def test_default_K_leaves_a_negligible_tail():
    for kw in ({"theta": 0.5, "d1": 1, "d2": 1}, {"theta": 2.0, "policy": "constant"}):
        model = jsmkt.RetrialJSQ(0.8, **kw)
        fp = jsmkt.solve_fixed_point(model)
        assert float(fp.tail_mass) < 1e-12, (kw, model.K)


# --- gradients -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("retrial", ["own"])
def test_gradients_agree_with_central_differences(retrial):
    """dE[T]/d(lam, theta, mu, d1, d2) through the fixed point, with randomised (real) choice numbers (re-probing:
    the registry's contract test on its first example, `tests/test_families.py`)."""
    base = dict(lam=0.7, theta=1.0, mu=1.0, d1=1.5, d2=2.5)

    def ET(**p):
        model = jsmkt.RetrialJSQ(p["lam"], p["theta"], d1=jnp.asarray(p["d1"]), d2=jnp.asarray(p["d2"]), mu=p["mu"],
                                 retrial=retrial, K=K, d1_max=2, d2_max=3)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    grads = jax.grad(lambda p: ET(**p))(base)  # one trace for every parameter
    for name in base:
        g = float(grads[name])
        h = 1e-5
        fd = (float(ET(**(base | {name: base[name] + h}))) - float(ET(**(base | {name: base[name] - h})))) / (2 * h)
        assert g == pytest.approx(fd, rel=1e-6, abs=1e-9), name
        if retrial == "own" and name == "d2":
            assert g == 0.0  # own retrials sample no servers


# --- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    (dict(lam=1.2, theta=1.0), r"^unstable: lam=1.2 >= mu=1 \(load rho=1.2\); the servers cannot serve"),
    (dict(lam=1.0, theta=1.0), r"^unstable: lam=1 >= mu=1"),
    (dict(lam=0.5, theta=0.0), r"theta=0.0 must be positive"),
    (dict(lam=0.5, theta=-1.0), r"theta=-1.0 must be positive"),
    (dict(lam=0.5, theta=1.0, mu=0.0), r"mu=0.0 must be positive"),
    (dict(lam=0.5, theta=1.0, d1=0), r"d1=0 must be >= 1"),
    (dict(lam=0.5, theta=1.0, d2=0), r"d2=0 must be >= 1"),
    (dict(lam=0.5, theta=1.0, d1=0.5), r"d1=0.5 must be >= 1|d=0.5 must be >= 1"),
    (dict(lam=0.5, theta=1.0, retrial="orbit"), r"retrial='orbit' is not one of 'reprobe', 'own'"),
    (dict(lam=0.5, theta=1.0, policy="classical"), r"policy='classical' is not one of 'linear', 'constant'"),
    (dict(lam=0.8, theta=0.5, d1=1, retrial="own", policy="constant"),
     r"unstable: with constant retrials the orbits fill at rate lam\*g1\(rho\)=0.64 .* theta\*\(1 - rho\)=0.1"),
    (dict(lam=0.9, theta=0.2, d1=2, d2=1, policy="constant"), r"unstable: with constant retrials"),
    (dict(lam="0.5", theta=1.0), r"lam='0.5' is not a number"),
])
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.RetrialJSQ(**kwargs)


def test_metrics_of_other_families_are_refused():
    model = jsmkt.JSQd(0.5, K=10)
    fp = jsmkt.solve_fixed_point(model)
    for f in (jsmkt.mean_orbit_size, jsmkt.prob_blocked, jsmkt.prob_retrial_success, jsmkt.orbit_size_distribution):
        with pytest.raises(ValueError, match="defined for retrial models"):
            f(model, fp)
    own = jsmkt.RetrialJSQ(0.5, 1.0, retrial="own", K=K)
    with pytest.raises(ValueError, match="tagged-customer E\\[T\\] exists for retrial='reprobe', policy='linear'"):
        jsmkt.mean_sojourn_time_tagged(own, jsmkt.solve_fixed_point(own))


def test_constant_policy_jacobian_is_banded_with_a_border():
    """The busy fraction (every idle server's chance of being chosen) and P(orbit >= 1) (the retrial stream's
    rate) couple every level: border columns, solved by the bordered solver."""
    model = jsmkt.RetrialJSQ(0.7, 1.5, d1=2, d2=3, policy="constant", K=60)
    s = model.structure()
    assert s.bandwidth == 1 and 1 <= len(s.border) <= 3
    assert isinstance(jsmkt._fixed_point.linear_solver(model), jsmkt._linalg.Bordered)


# --- simulation (slow) -------------------------------------------------------------------------------------------


# The full grid of the acceptance check (24 cases, about an hour on two cores) is experiments/retrial/validate.py;
# these are a few of its cases, one per kind of behaviour.
_SIM_CASES = [(0.8, 0.5, 2, 2, "reprobe"), (0.8, 0.5, 2, 1, "own")]


@pytest.mark.slow
@pytest.mark.parametrize("lam, theta, d1, d2, retrial", _SIM_CASES)
def test_mean_field_agrees_with_simulation_n1000(lam, theta, d1, d2, retrial):
    """E[T] of the exact mean field within 1 % of the N = 1000 simulation (Little's law), plus its 95 % CI."""
    model = jsmkt.RetrialJSQ(lam, theta, d1=d1, d2=d2, retrial=retrial)
    fp = jsmkt.solve_fixed_point(model)
    ET = float(jsmkt.mean_sojourn_time(model, fp))
    s = np.asarray(jsmkt.tails(model, fp))
    top = int(np.flatnonzero(s < 1e-9)[0]) + 6 if np.any(s < 1e-9) else model.K  # orbits N = 1000 servers reach
    t1, warmup = 1000.0, 100.0
    sim = jsmkt.simulate(model, 1000, t1, warmup=warmup, key=jr.PRNGKey(11), n_replications=4, max_queue=top)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)


def test_origin_drift_correction_is_the_finite_n_drift():
    """The refined mean field's 1/N drift of the re-probing retrials: with N servers a retrial samples after its
    origin has moved, from the occupancy x + (e_o' - e_o)/N. Summing the tail rule at each such shifted occupancy
    (the law of sampling with replacement from the N servers) gives the finite-N drift; N (drift_N - drift) tends
    to `origin_drift_correction` with an O(1/N) error."""
    from jsmkt import _refined_terms
    from jsmkt._models import meanfield

    model = jsmkt.RetrialJSQ(0.8, 0.5, d1=2, d2=3, K=8)
    desc = model.description()
    retrial = desc.dispatches[1]
    x = jr.dirichlet(jr.PRNGKey(0), jnp.ones(desc.cells.size))
    n = 1e5
    o = retrial.origin
    src, tgt = np.asarray(o.source), meanfield.clipped_targets(desc.cells, o)
    es, et = np.asarray(retrial.effect.source), meanfield.clipped_targets(desc.cells, retrial.effect)
    exact = np.zeros(desc.cells.size)
    mean_field = np.zeros(desc.cells.size)
    for i in range(src.size):
        shift = np.zeros(desc.cells.size)
        shift[tgt[i]] += 1.0
        shift[src[i]] -= 1.0
        for z, acc in ((x + shift / n, exact), (x, mean_field)):
            p = np.asarray(meanfield.chosen_factor(retrial, z))[es] * np.asarray(z)[es]
            rate = float(o.weight[i] * x[src[i]])
            np.add.at(acc, et, rate * p)
            np.add.at(acc, es, -rate * p)
    f1 = np.asarray(_refined_terms.origin_drift_correction(desc, x))
    assert np.max(np.abs(f1)) > 1e-2
    np.testing.assert_allclose(n * (exact - mean_field), f1, rtol=1e-3, atol=1e-6)


@pytest.mark.slow  # compiles several models (the suite's time budget)
def test_transient_conserves_customers():
    """The ODE from the empty system conserves customers: E[Q](t) is the integral of the primary arrival rate lam
    less the departure rate mu * busy(t) (no primary is lost at K = 40 from the empty state within t = 2; the
    integral by the trapezoid rule on a fine grid)."""
    model = jsmkt.RetrialJSQ(0.6, 1.0, d1=2, d2=2, K=K)
    ts = jnp.linspace(0.0, 2.0, 2001)
    ys = jsmkt.integrate(model, 2.0, ts=ts).ys
    EQ = np.asarray(jax.vmap(lambda y: jsmkt.mean_queue_length(model, y))(ys))
    busy = np.asarray(jax.vmap(lambda y: jsmkt.utilisation(model, y))(ys))
    inflow = 0.6 - 1.0 * busy
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (inflow[1:] + inflow[:-1]) * np.diff(np.asarray(ts)))])
    np.testing.assert_allclose(EQ[::200], cum[::200], rtol=1e-5, atol=1e-7)
