r"""`jsmkt.sensitivity` against closed forms and independent recursions (the contract test over every registered
family, against central differences, is in `test_families.py`).

JSQ(d) with exponential service: $E[T] = \sum_{k\ge1} s_k/\lambda$ with $s_k = \rho\,g(s_{k-1})$, $s_0 = 1$ (the
balance of the flow across level $k$), so for $d = 2$, $E[T] = \sum_{k\ge1}\rho^{2^k-2}/\mu$. E[T] is a time: it is
homogeneous of degree $-1$ in the rates $(\lambda, \mu)$, so its elasticities in them sum to $-1$.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


K = 40


def _jsq2_ET(lam, mu=1.0):
    k = np.arange(1, 40)
    return np.sum((lam / mu) ** (2.0**k - 2)) / mu


def _recursion_ET(lam, weights, K=K):
    """E[T] of JSQ with a choice law (P(D = j) = weights[j-1]) and mu = 1, from s_k = lam g(s_{k-1})."""
    s, total = 1.0, 0.0
    for _ in range(K):
        s = lam * sum(w * s ** (j + 1) for j, w in enumerate(weights))
        total += s
    return total / lam


def test_jsqd_derivatives_match_the_closed_form():
    model = jsmkt.JSQd(0.9, d=2, K=K)
    s = jsmkt.sensitivity(model, "mean_sojourn_time", wrt=["lam", "mu", "d"])
    k = np.arange(1, 40)
    dlam = np.sum((2.0**k - 2) * 0.9 ** (2.0**k - 3))
    assert float(s.value) == pytest.approx(_jsq2_ET(0.9), rel=1e-12)
    assert float(s.derivatives["lam"]) == pytest.approx(dlam, rel=1e-9)
    h = 1e-6
    assert float(s.derivatives["mu"]) == pytest.approx((_jsq2_ET(0.9, 1 + h) - _jsq2_ET(0.9, 1 - h)) / (2 * h),
                                                        rel=1e-7)
    # degree -1 in the rates
    assert float(s.elasticities["lam"] + s.elasticities["mu"]) == pytest.approx(-1.0, rel=1e-10)
    # d = 2 is read as the randomised rule's real d: the right derivative, toward sampling 3 servers
    right = (_recursion_ET(0.9, [0.0, 1 - h, h]) - _jsq2_ET(0.9)) / h
    assert s.one_sided["d"] == "right" and float(s.derivatives["d"]) == pytest.approx(right, rel=1e-5)
    rows = {r["name"]: r for r in s.rows()}
    assert rows["lam"]["value"] == 0.9 and rows["d"]["one_sided"] == "right" and rows["lam"]["one_sided"] is None
    assert s.to_dict()["parameters"]["lam"]["derivative"] == pytest.approx(dlam, rel=1e-9)


def test_choice_law_derivatives_keep_the_sum_and_match_the_recursion():
    w = np.array([0.2, 0.3, 0.5])
    model = jsmkt.JSQd(0.8, d=jnp.asarray(w), K=K)
    s = jsmkt.sensitivity(model, "mean_sojourn_time", wrt="d")
    g = np.asarray(s.derivatives["d"])
    assert abs(g.sum()) < 1e-12  # directions that keep the law a probability vector
    h = 1e-6
    for i, j in ((0, 1), (2, 0)):  # move mass h from entry j to entry i
        u = np.zeros(3)
        u[i], u[j] = 1.0, -1.0
        fd = (_recursion_ET(0.8, w + h * u) - _recursion_ET(0.8, w - h * u)) / (2 * h)
        assert g @ u == pytest.approx(fd, rel=1e-6)


def test_grid_is_vmapped_and_flags_failed_entries():
    model = jsmkt.JSQd(0.9, d=2, K=K)
    lams = jnp.array([[0.5, 0.7], [0.9, 1.1]])
    s = jsmkt.sensitivity(model, "mean_sojourn_time", wrt=["lam", "mu"], grid={"lam": lams})
    assert s.value.shape == (2, 2) and s.derivatives["mu"].shape == (2, 2)
    assert np.asarray(s.ok).tolist() == [[True, True], [True, False]]  # lam = 1.1 is unstable
    assert np.isnan(float(s.derivatives["lam"][1, 1]))
    ok = np.asarray(s.ok)
    np.testing.assert_allclose(np.asarray(s.value)[ok], [_jsq2_ET(x) for x in np.asarray(lams)[ok]], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(s.elasticities["lam"] + s.elasticities["mu"])[ok], -1.0, rtol=1e-9)
    with pytest.raises(ValueError, match="rows.. describes a sensitivity at a point"):
        s.rows()


def test_scv_through_the_service_parametrisation():
    service = jsmkt.hyperexponential2(1.0, 4.0)
    model = jsmkt.JSQdPH(0.8, service, d=2, K=24)
    s = jsmkt.sensitivity(model, "mean_queue_length", wrt=["scv", "mean", "lam"], service=jsmkt.hyperexponential2)

    def EQ(scv):
        m = jsmkt.JSQdPH(0.8, jsmkt.hyperexponential2(1.0, scv), d=2, K=24)
        return float(jsmkt.mean_queue_length(m, jsmkt.solve_fixed_point(m)))

    h = 1e-5
    assert float(s.derivatives["scv"]) == pytest.approx((EQ(4.0 + h) - EQ(4.0 - h)) / (2 * h), rel=1e-6)
    # E[Q] counts jobs: scaling every service time by c is scaling lam by c, so the two elasticities agree
    assert float(s.elasticities["mean"]) == pytest.approx(float(s.elasticities["lam"]), rel=1e-10)


def test_bad_names_are_refused_naming_the_valid_ones():
    model = jsmkt.JSQd(0.9, d=2, K=K)
    with pytest.raises(ValueError, match=r"wrt='theta' is not a parameter of 'jsq' models \(JSQd\); its parameters "
                                         r"are lam, d, mu"):
        jsmkt.sensitivity(model, wrt=["lam", "theta"])
    with pytest.raises(ValueError, match="metric='mean_sojourn' is not a metric.*mean_sojourn_time"):
        jsmkt.sensitivity(model, "mean_sojourn", wrt="lam")
    ph = jsmkt.JSQdPH(0.8, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=24)
    with pytest.raises(ValueError, match="scv needs a parametrisation of the service: pass service="):
        jsmkt.sensitivity(ph, wrt="scv")
    with pytest.raises(ValueError, match=r"coxian2\(mean=1, scv=4\) is not the model's service distribution"):
        jsmkt.sensitivity(ph, wrt="scv", service=jsmkt.coxian2)
    with pytest.raises(ValueError, match="has no PH service to parametrise"):
        jsmkt.sensitivity(model, wrt="lam", service=jsmkt.hyperexponential2)
    with pytest.raises(ValueError, match="names a parameter twice"):
        jsmkt.sensitivity(model, wrt=["lam", "lam"])
    with pytest.raises(ValueError, match="not a registered model family"):
        jsmkt.sensitivity(jsmkt.published.JSQdPHAsPublished(0.8, jsmkt.erlang(2), d=2, K=20), wrt="lam")
    with pytest.raises(ValueError, match=r"unstable: lam=1.2 >= capacity mu=1"):
        jsmkt.sensitivity(jsmkt.JSQd(1.2, d=2, K=K), wrt="lam")
