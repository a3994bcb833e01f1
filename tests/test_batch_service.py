"""Batch service (`JSQdBatchService`) against the bulk-service queue M/M^[B]/1 of its rule and the M/PH/1 queue."""

import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


def _bulk_root(lam, mu, p):
    """The root r in (0, 1) of lam (1 - r) = mu r (1 - E[r^B]), by bisection."""
    sizes = np.arange(1, len(p) + 1)
    lo, hi = 0.0, 1.0 - 1e-15
    for _ in range(200):
        r = 0.5 * (lo + hi)
        lo, hi = (r, hi) if lam * (1 - r) - mu * r * (1 - np.sum(np.asarray(p) * r**sizes)) > 0 else (lo, r)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("lam, p", [(1.2, [0.5, 0.5]), (1.6, [0.2, 0.3, 0.5])])
def test_d1_exponential_is_the_bulk_service_queue(lam, p):
    """d = 1, exponential epochs: each server's queue length is geometric of ratio r. That chain's balance is
    solved here independently of the model (levels up +1 at lam, down by min(l, B) at mu)."""
    mu = 1.0
    model = jsmkt.JSQdBatchService(lam, jsmkt.exponential(mu), jnp.asarray(p), d=1)
    fp = jsmkt.solve_fixed_point(model)
    r = _bulk_root(lam, mu, p)
    s = np.asarray(jsmkt.tails(model, fp))
    np.testing.assert_allclose(s, r ** np.arange(model.K + 1), rtol=1e-10, atol=1e-15)
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(r / (1 - r), rel=1e-10)


def test_single_batches_are_jsqdph():
    svc = jsmkt.erlang(2, 1.0)
    a = jsmkt.JSQdPH(0.8, svc, d=2)
    b = jsmkt.JSQdBatchService(0.8, svc, jnp.ones(1), d=2, K=a.K)
    np.testing.assert_allclose(np.asarray(jsmkt.solve_fixed_point(b).value),
                               np.asarray(jsmkt.solve_fixed_point(a).value), rtol=1e-10, atol=1e-14)


def test_the_stability_check_uses_the_batch_capacity():
    model = jsmkt.JSQdBatchService(2.1, jsmkt.exponential(1.0), jnp.array([0.0, 1.0]), d=2, K=20)
    with pytest.raises(Exception, match=r"lam=2.1 >= capacity E\[B\]/E\[S\]=2"):
        jsmkt.solve_fixed_point(model)


@pytest.mark.parametrize("build, match", [
    (lambda: jsmkt.JSQdBatchService(1.0, jsmkt.exponential(1.0), [0.5, 0.6]), "sums to"),
    (lambda: jsmkt.JSQdBatchService(1.0, jsmkt.exponential(1.0), [1.5, -0.5]), r"service_batch_sizes\[1\]=-0.5"),
    (lambda: jsmkt.JSQdBatchService(1.0, 1.0, [1.0]), "must be a jsmkt.PH"),
    (lambda: jsmkt.JSQdBatchService(-1.0, jsmkt.exponential(1.0), [1.0]), "lam=-1.0"),
])
def test_bad_input_names_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()
