import jax
import jax.random as jr
import pytest

import jsmkt  # noqa: F401  (enables float64)


jax.config.update("jax_enable_x64", True)
# Strict promotion, as in the JAX libraries we build on: silent int/float or rank promotion hides bugs.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def getkey():
    counter = iter(range(10**9))

    def _getkey():
        return jr.PRNGKey(next(counter) + 12345)

    return _getkey


@pytest.fixture(autouse=True, scope="module")
def _fresh_compilation_caches():
    """Drop JAX's compiled executables after each test module: the suite compiles several hundred, and holding them
    all in one process coincided with rare crashes inside later XLA compilations."""
    yield
    jax.clear_caches()
