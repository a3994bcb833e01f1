import jax
import jax.random as jr
import pytest

import jsmkt  # noqa: F401  (enables float64)


jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    counter = iter(range(10**9))

    def _getkey():
        return jr.PRNGKey(next(counter) + 12345)

    return _getkey
