"""A fixed point solved with `throw=False` that failed gives NaN in everything computed from it, under any
transformation, and the other entries of a `vmap` batch keep their solo values; with `throw=True` the solve
raises, saying why.

The batch is JSQ(2) with K = 40 (the shape of tests/test_grad.py and tests/test_errors.py) at lam = 0.5, 1.2, 0.9:
the middle entry is unstable (lam >= 1 = capacity). Issue 34: a quantile of the sojourn time raised "the sojourn
time's tail outlasts max_terms" for every entry of such a batch, and `probe_rate` of the failed entry was
lam E[D] = 2.4.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


LAMS = (0.5, 1.2, 0.9)
BAD = 1  # the unstable entry
METRICS = ("tails", "phase_tails", "tail_mass_at_K", "mean_queue_length", "throughput", "mean_sojourn_time",
           "mean_waiting_time", "prob_wait", "probe_rate", "utilisation", "queue_length_distribution",
           "mean_number_waiting")
TIMES = jnp.array([-1.0, 0.0, 0.3, 2.0, 7.0])  # t < 0 too: its CDF is unknown for a failed point
PROBS = jnp.array([0.0, 0.2, 0.5, 0.99])  # 0.2 is inside the waiting time's atom at 0 for every stable entry
MAX_TERMS = 1024  # enough for lam = 0.9 (a few hundred steps); under vmap every step runs


def _model(lam):
    return jsmkt.JSQd(lam, d=2, K=40)


def _everything(lam, throw=False):
    """Every public function of a fixed point, as a dict of arrays."""
    m = _model(lam)
    fp = jsmkt.solve_fixed_point(m, throw=throw)
    out = {name: getattr(jsmkt, name)(m, fp) for name in METRICS}
    T = jsmkt.sojourn_time_distribution(m, fp, max_terms=MAX_TERMS)
    W = jsmkt.waiting_time_distribution(m, fp, max_terms=MAX_TERMS)
    for tag, law in (("sojourn", T), ("waiting", W)):
        out |= {f"{tag} cdf": law.cdf(TIMES), f"{tag} pdf": law.pdf(TIMES), f"{tag} quantile": law.quantile(PROBS),
                f"{tag} mean": law.mean, f"{tag} atom": law.atom}
    rmf = jsmkt.refined_mean_field(fp)
    out |= {"refined state": rmf.state(100), "refined covariance": rmf.covariance}
    return out


def _with_derivative(lam):
    return jax.jvp(_everything, (lam,), (jnp.ones_like(lam),))


@pytest.fixture(scope="module")
def computed():
    """Values and d/d lam: of the batch (vmap), of a batch of the same shape whose entries are all stable (the same
    compiled function), and of each point alone (jit; the failed one included, which must not raise either)."""
    batched = jax.vmap(_with_derivative)
    stable = (LAMS[0], 0.7, LAMS[2])
    alone = jax.jit(_with_derivative)
    return batched(jnp.asarray(LAMS)), batched(jnp.asarray(stable)), [alone(jnp.asarray(lam)) for lam in LAMS]


NAMES = [*METRICS] + [f"{t} {w}" for t in ("sojourn", "waiting") for w in ("cdf", "pdf", "quantile", "mean", "atom")]


@pytest.mark.parametrize("name", NAMES + ["refined state", "refined covariance"])
def test_failed_entry_is_nan_and_the_others_keep_their_solo_values(computed, name):
    """The failed entry is NaN with NaN derivatives, in the batch and alone under jit. The others are bit for bit
    what they are in a batch without a failed entry, and equal to their values alone up to the rounding in which a
    batched reduction differs from a single one: 1e-15 of a probability, which a quantile divides by the density
    (its p = 0 quantile, 0 in the batch, is 2e-15 alone, where the atom at 0 is 1 - sum(a_0) = -2e-16)."""
    (values, derivatives), (ref, dref), solo = computed
    for i, lam in enumerate(LAMS):
        v, dv = np.asarray(values[name][i]), np.asarray(derivatives[name][i])
        sv, sdv = np.asarray(solo[i][0][name]), np.asarray(solo[i][1][name])
        if i == BAD:
            assert np.all(np.isnan(v)) and np.all(np.isnan(dv)), (name, v, dv)
            assert np.all(np.isnan(sv)) and np.all(np.isnan(sdv)), (name, sv, sdv)  # under jit, alone
            continue
        assert np.all(np.isfinite(v)) and np.all(np.isfinite(dv)), (name, lam, v, dv)
        np.testing.assert_array_equal(v, np.asarray(ref[name][i]), err_msg=f"{name} at lam={lam}")
        np.testing.assert_array_equal(dv, np.asarray(dref[name][i]), err_msg=f"d {name}/d lam at lam={lam}")
        np.testing.assert_allclose(v, sv, rtol=1e-13, atol=1e-14 if "quantile" in name else 1e-15,
                                   err_msg=f"{name} at lam={lam}")
        np.testing.assert_allclose(dv, sdv, rtol=1e-12, atol=1e-14, err_msg=f"d {name}/d lam at lam={lam}")


def test_stable_entries_keep_their_eager_values(computed):
    """The stable entries of the batch against the plain eager calls (throw=True; the eager law keeps only the steps
    it needs)."""
    (values, _), _, _ = computed
    for i, lam in enumerate(LAMS):
        if i == BAD:
            continue
        m = _model(lam)
        fp = jsmkt.solve_fixed_point(m)
        T = jsmkt.sojourn_time_distribution(m, fp)
        np.testing.assert_allclose(np.asarray(values["sojourn quantile"][i]), np.asarray(T.quantile(PROBS)),
                                   rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(np.asarray(values["sojourn cdf"][i]), np.asarray(T.cdf(TIMES)), rtol=1e-13,
                                   atol=1e-15)
        assert float(values["probe_rate"][i]) == 2 * lam  # lam E[D], untouched


def test_what_does_not_read_the_state_is_nan_too():
    """probe_rate = lam E[D] and s_0 = 1 do not read the state: of the failed entry they were 2.4 and 1. They are NaN
    now, and so are their reverse-mode derivatives."""

    def read(lam):
        m = _model(lam)
        fp = jsmkt.solve_fixed_point(m, throw=False)
        return jsmkt.probe_rate(m, fp) + 10.0 * jsmkt.tails(m, fp)[0]

    v, g = map(np.asarray, jax.vmap(jax.value_and_grad(read))(jnp.asarray(LAMS)))
    assert np.isnan(v[BAD]) and np.isnan(g[BAD])
    assert v[0] == 2 * LAMS[0] + 10.0 and v[2] == 2 * LAMS[2] + 10.0 and g[0] == g[2] == 2.0


def test_failed_point_outside_transformations_is_nan_without_raising():
    """Eagerly, with throw=False: the failed point's metrics, laws and refined mean field are NaN; nothing raises
    (before, the laws raised "the sojourn time's tail outlasts max_terms" and refined_mean_field a ValueError)."""
    m = _model(1.2)
    fp = jsmkt.solve_fixed_point(m, throw=False)
    assert fp.result == jsmkt.RESULTS.unstable
    for name in METRICS:
        assert np.all(np.isnan(np.asarray(getattr(jsmkt, name)(m, fp)))), name
    for law in (jsmkt.sojourn_time_distribution(m, fp), jsmkt.waiting_time_distribution(m, fp),
                jsmkt.sojourn_time_distribution(m, fp.value)):  # its NaN value alone is as good
        for v in (law.cdf(TIMES), law.pdf(TIMES), law.quantile(PROBS), law.mean, law.atom):
            assert np.all(np.isnan(np.asarray(v))), law
    rmf = jsmkt.refined_mean_field(fp)
    for v in (rmf.value, rmf.correction, rmf.covariance, rmf.expectation(lambda y: jsmkt.prob_wait(m, y), 100)):
        assert np.all(np.isnan(np.asarray(v)))


def test_family_metrics_of_a_failed_point_are_nan():
    """The retrial and repairable families' own metrics (and their probe rates) of the NaN value of a failed fixed
    point, under jit (one compilation for both; K = 3 keeps it small)."""
    models = {"retrial": jsmkt.RetrialJSQ(0.7, 1.5, d1=2, d2=3, K=3),
              "repairable": jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R3", j=0.05, K=3)}
    names = {"retrial": ("mean_orbit_size", "prob_blocked", "prob_retrial_success", "mean_sojourn_time_tagged",
                         "orbit_size_distribution", "probe_rate"),
             "repairable": ("availability", "customers_at_failed_servers", "repairmen_utilisation",
                            "fraction_failed_waiting", "probe_rate")}
    states = {f: jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan), m.initial_guess())
              for f, m in models.items()}
    out = eqx.filter_jit(lambda ms, ys: {(f, n): getattr(jsmkt, n)(ms[f], ys[f]) for f in ms for n in names[f]})(
        models, states)
    for key, v in out.items():
        assert np.all(np.isnan(np.asarray(v))), key


def test_with_throw_true_a_failed_point_raises_saying_why():
    """The default throw=True: the solve raises with the reason (an unstable load), eagerly and under vmap with a
    sojourn-time quantile after it, not the sojourn time's "raise max_terms"."""
    with pytest.raises(ValueError, match=r"unstable: lam=1.2 >= capacity"):
        jsmkt.solve_fixed_point(_model(1.2))

    def p99(lam):
        m = _model(lam)
        return jsmkt.sojourn_time_distribution(m, jsmkt.solve_fixed_point(m), max_terms=MAX_TERMS).quantile(0.99)

    with pytest.raises(Exception, match="unstable") as info:
        jax.vmap(p99)(jnp.asarray(LAMS))
    assert "max_terms" not in str(info.value)
