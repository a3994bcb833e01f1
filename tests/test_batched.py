"""Batched solves in vmapped blocks: `jax.vmap` of `solve_fixed_point` (Newton's iteration as `lax.map` over blocks,
`jsmkt._batched.ChunkedImplicitAdjoint`) and `jsmkt.batched`, against one vmapped while loop over the whole batch.

JSQ(2)-H2 at K = 48 (the shape of `benchmarks/fixed_point.py` and test_sojourn.py); 36 loads, so that the CPU's
blocks of 32 leave a remainder, one of them unstable (a failed entry among good ones).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import jsmkt
from jsmkt._batched import CPU_BLOCK, ChunkedImplicitAdjoint
from jsmkt._fixed_point import linear_solver
from jsmkt._linalg import NeverFails


SERVICE = jsmkt.hyperexponential2(1.0, 4.0)
LAMS = np.concatenate([np.linspace(0.5, 0.95, 35)[:7], [1.2], np.linspace(0.5, 0.95, 35)[7:]])  # 36, one unstable
BAD = 7


def _model(lam):
    return jsmkt.JSQdPH(lam, SERVICE, d=2, K=48)


def _solve(lam):
    return jsmkt.solve_fixed_point(_model(lam), throw=False)


def _solve_whole(lam):
    """The same solve with one vmapped while loop over the whole batch (the rule's block above any batch)."""
    model = _model(lam)
    adjoint = ChunkedImplicitAdjoint(optx.ImplicitAdjoint(linear_solver=NeverFails(linear_solver(model))),
                                     block=1 << 30)
    return jsmkt.solve_fixed_point(model, throw=False, adjoint=adjoint)


def _sojourn(solve):
    def f(lam):
        return jsmkt.mean_sojourn_time(_model(lam), solve(lam))

    return f


def test_vmap_in_blocks_equals_one_vmapped_loop():
    assert len(LAMS) > CPU_BLOCK
    lams = jnp.asarray(LAMS)
    whole = jax.jit(jax.vmap(_solve_whole))(lams)
    ok = np.arange(len(LAMS)) != BAD
    assert np.all(np.asarray(whole.result == jsmkt.RESULTS.successful) == ok)
    y = np.asarray(whole.value)
    for name, fn in (("vmap", jax.vmap(_solve)), ("batched", jsmkt.batched(_solve, block=5)),
                     ("nested vmap", lambda x: jax.tree_util.tree_map(
                         lambda v: v.reshape(-1, *v.shape[2:]), jax.vmap(jax.vmap(_solve))(x.reshape(2, -1))))):
        fp = jax.jit(fn)(lams)
        assert np.array_equal(np.asarray(fp.result._value), np.asarray(whole.result._value)), name
        v = np.asarray(fp.value)
        assert np.isnan(v[BAD]).all(), name  # the failed entry is NaN, the others keep their values
        np.testing.assert_allclose(v[ok], y[ok], rtol=1e-13, atol=1e-13, err_msg=name)
    # The default vmap runs Newton on blocks of CPU_BLOCK states, one vmapped loop on all 36.
    if jax.default_backend() == "cpu":
        block_shape = f"f64[{CPU_BLOCK},48,2]"
        assert block_shape in str(jax.make_jaxpr(jax.vmap(lambda lam: _solve(lam).value))(lams))
        assert block_shape not in str(jax.make_jaxpr(jax.vmap(lambda lam: _solve_whole(lam).value))(lams))


def test_gradients_through_blocks_equal_one_vmapped_loop():
    lams = jnp.asarray(LAMS)
    ok = np.arange(len(LAMS)) != BAD
    whole = np.asarray(jax.jit(jax.vmap(jax.grad(_sojourn(_solve_whole))))(lams))
    assert np.isnan(whole[BAD]) and np.isfinite(whole[ok]).all()
    # Reverse mode outside the vmap (the rule's blocks are differentiated as a scan) and inside it (the rule sees
    # primal values only), forward mode inside, and through jsmkt.batched.
    mask = jnp.asarray(ok)
    grads = {
        "grad of sum(vmap)": jax.grad(lambda x: jnp.sum(jnp.where(mask, jax.vmap(_sojourn(_solve))(x), 0.0))),
        "vmap(grad)": jax.vmap(jax.grad(_sojourn(_solve))),
        "vmap(jacfwd)": jax.vmap(jax.jacfwd(_sojourn(_solve))),
        "grad of sum(batched)": jax.grad(lambda x: jnp.sum(jnp.where(mask, jsmkt.batched(_sojourn(_solve))(x), 0.0))),
    }
    for name, fn in grads.items():
        g = np.asarray(jax.jit(fn)(lams))
        np.testing.assert_allclose(g[ok], whole[ok], rtol=1e-10, err_msg=name)
        if "sum" not in name:
            assert np.isnan(g[BAD]), name
    # and the derivative itself, by central differences of the solve at one load
    lam, h = float(LAMS[3]), 1e-5
    fd = (float(_sojourn(_solve)(lam + h)) - float(_sojourn(_solve)(lam - h))) / (2 * h)
    np.testing.assert_allclose(whole[3], fd, rtol=1e-6)


@pytest.mark.parametrize("block", [0, -3, 2.5, True, "32"])
def test_batched_refuses_bad_block(block):
    with pytest.raises(ValueError, match=rf"block={block!r}.*positive int"):
        jsmkt.batched(_solve, block=block)


def test_batched_refuses_bad_fn_and_arguments():
    with pytest.raises(ValueError, match=r"fn=3 is not callable"):
        jsmkt.batched(3)
    g = jsmkt.batched(lambda a, b: a + b)
    with pytest.raises(ValueError, match=r"same leading axis.*\[2, 3\]"):
        g(jnp.zeros(2), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"no array leaf"):
        jsmkt.batched(lambda: 0.0)()
