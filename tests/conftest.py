import os

import jax
import jax.random as jr
import pytest

import jsmkt  # noqa: F401  (enables float64)


# The CLI's persistent compilation cache stays off in the tests (they call `jsmkt.cli.main` in this process, where it
# would turn on JAX's cache for every later test); tests of the cache run the console script in a subprocess.
os.environ["JSMKT_CACHE_DIR"] = "off"


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
    """Drop JAX's compiled executables after each test module. XLA's CPU backend maps every compiled kernel into
    memory separately (three maps each); holding all of the suite's executables took the process to about 64,300
    memory maps, just under Linux's default limit of 65,530 (`vm.max_map_count`), past which the next compilation
    crashes the process (`jsmkt._maps`). That was the rare crash of full test runs. Cleared per module, the suite
    stays far below the limit."""
    yield
    jax.clear_caches()
