"""`jsmkt._compile`: eager calls of a `fast_jit` function compile with the fast-compilation options, traced calls
(`jax.vmap`, `jax.jit`) as the enclosing computation does, and an option XLA does not know is dropped."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt
from jsmkt import _compile, _config


def test_eager_calls_compile_fast_and_traced_calls_do_not():
    f = _compile.fast_jit(lambda x: jnp.cumsum(x) * 2.0)
    x = jnp.arange(4.0)
    expected = np.cumsum(np.arange(4.0)) * 2.0
    np.testing.assert_array_equal(jax.vmap(f)(x[:, None])[:, 0], 2.0 * x)
    np.testing.assert_array_equal(jax.jit(f)(x), expected)
    assert not f._fast  # traced into the enclosing computation: XLA's defaults
    np.testing.assert_array_equal(f(x), expected)
    if jax.default_backend() == "cpu":
        assert list(f._fast) == [tuple(sorted(_compile.options().items()))]


def test_a_call_inside_a_users_jit_on_concrete_arguments_is_traced():
    """A user's `jit` of a function that closes over concrete arguments: the call is traced into the enclosing
    computation (a nested `jit` may not carry compiler options: JAX refuses it)."""
    f = _compile.fast_jit(lambda x: x * 2.0)
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(jax.jit(lambda: f(x))(), 2.0 * np.arange(3.0))
    np.testing.assert_array_equal(jax.jit(lambda y: f(x) + y)(1.0), 2.0 * np.arange(3.0) + 1.0)
    assert not f._fast


def test_an_option_xla_does_not_know_is_dropped(monkeypatch):
    if jax.default_backend() != "cpu":
        pytest.skip("the options apply on a CPU")
    monkeypatch.setitem(_compile.FAST_OPTIONS, "xla_no_such_option_in_any_xla", True)
    monkeypatch.setattr(_compile, "_refused", set())
    f = _compile.fast_jit(lambda x: x + 1.0)
    assert float(f(jnp.asarray(1.0))) == 2.0
    assert _compile._refused == {"xla_no_such_option_in_any_xla"}
    assert "xla_no_such_option_in_any_xla" not in _compile.options()


def test_use_fast_compilation(monkeypatch):
    monkeypatch.setattr(_config, "_fast_compilation", True)
    jsmkt.use_fast_compilation(False)
    assert _compile.options() is None
    f = _compile.fast_jit(lambda x: x * 3.0)
    assert float(f(jnp.asarray(2.0))) == 6.0 and not f._fast
    jsmkt.use_fast_compilation()
    assert _config.fast_compilation()
    with pytest.raises(ValueError, match=r"enabled='no' must be True or False"):
        jsmkt.use_fast_compilation("no")


def test_a_solve_is_the_same_either_way(monkeypatch):
    """The options change how XLA compiles, not what it computes: the fixed point of an eager solve (fast) and of
    one compiled with XLA's defaults agree to rounding, and both to JSQ(2)'s closed form s_k = lam^(2^k - 1)."""
    model = jsmkt.JSQdPH(0.8, jsmkt.exponential(1.0), d=2, K=24)
    fast = jsmkt.tails(model, jsmkt.solve_fixed_point(model))
    monkeypatch.setattr(_config, "_fast_compilation", False)
    default = jsmkt.tails(model, jsmkt.solve_fixed_point(model))
    np.testing.assert_allclose(fast, default, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(fast[:8], [0.8 ** (2**k - 1) for k in range(8)], rtol=1e-12)
