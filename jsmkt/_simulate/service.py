r"""General (non-phase-type) service-time distributions for the simulator.

The mean-field models need phase-type service; the simulator also accepts any distribution that can be sampled,
so that a PH fit can be judged against the physical system it approximates.
"""

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray


class GeneralService:
    r"""A service-time distribution given by a sampler.

    **Arguments:**

    - `sampler`: a JAX-traceable function `sampler(key) -> float` returning one finite, non-negative service time
      per key (it is `vmap`ped over keys inside the simulator, so it must not call Python-side randomness;
      `jsmkt.simulate` refuses a run in which it returned a negative, infinite or NaN time).
    - `mean`: its mean $E[S] > 0$ (used for the load check $\lambda E[S] < 1$ and to size the sojourn-time
      histogram).
    - `scv`: its squared coefficient of variation, if known; only used to choose a default `max_queue`.
    - `cdf`: its distribution function `cdf(x)` (NumPy arrays in and out), if known; `jsmkt.fit_ph` fits a PH to
      it.

    The sampler is part of the compiled program: pass the same function object again to reuse the compilation.

    !!! example

        ```python
        S = jsmkt.GeneralService(lambda key: 0.5 + jax.random.exponential(key) * 0.5, mean=1.0, scv=0.25)
        jsmkt.simulate(jsmkt.JSQd(0.9, d=2), 100, 1e3, key=jax.random.key(0), service=S)
        ```
    """

    def __init__(self, sampler: Callable[[PRNGKeyArray], Float[Array, ""]], mean: float, *, scv: float = 1.0,
                 cdf: Callable | None = None):
        if not callable(sampler):
            raise ValueError(f"sampler={sampler!r} must be a function key -> service time")
        mean, scv = _real("mean", mean), _real("scv", scv)
        if not (math.isfinite(mean) and mean > 0):
            raise ValueError(f"mean={mean!r} must be a positive, finite mean service time")
        if not (math.isfinite(scv) and scv >= 0):
            raise ValueError(f"scv={scv!r} must be a non-negative, finite squared coefficient of variation")
        if cdf is not None and not callable(cdf):
            raise ValueError(f"cdf={cdf!r} must be a function x -> P(S <= x)")
        self.sampler = sampler
        self.mean = mean
        self.scv = scv
        self.cdf = cdf

    def sample(self, key: PRNGKeyArray) -> Float[Array, ""]:
        """One service time."""
        return jnp.asarray(self.sampler(key), dtype=float)

    def __repr__(self) -> str:
        return f"GeneralService(sampler={self.sampler!r}, mean={self.mean!r}, scv={self.scv!r})"


def _deterministic_sample(value: float, key: PRNGKeyArray) -> Float[Array, ""]:
    del key
    return jnp.asarray(value, dtype=float)


def _lognormal_sample(mu: float, sigma: float, key: PRNGKeyArray) -> Float[Array, ""]:
    return jnp.exp(mu + sigma * jr.normal(key, dtype=float))


@functools.lru_cache(maxsize=256)
def _deterministic_sampler(value: float) -> Callable:
    return functools.partial(_deterministic_sample, value)


def _real(name: str, x) -> float:
    """`x` as a Python float, or a `ValueError` naming `name` (a simulation's parameters are concrete numbers)."""
    if isinstance(x, jax.core.Tracer):
        raise ValueError(
            f"{name} is traced (inside jit/grad/vmap); a simulated service takes concrete numbers: build it, and "
            "call jsmkt.simulate, outside JAX transformations"
        )
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(f"{name}={x!r} is boolean; give a real number")
    if isinstance(x, (str, bytes, complex)) or np.iscomplexobj(x):  # float() reads "0.9", drops 0j
        raise ValueError(f"{name}={x!r} is not a real number")
    try:
        return float(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={x!r} is not a real number") from e


@functools.lru_cache(maxsize=256)
def _lognormal_sampler(mu: float, sigma: float) -> Callable:
    return functools.partial(_lognormal_sample, mu, sigma)


def deterministic(mean: float = 1.0) -> GeneralService:
    """Constant service time `mean` (SCV 0)."""
    mean = _real("mean", mean)
    if not (math.isfinite(mean) and mean > 0):
        raise ValueError(f"mean={mean!r} must be a positive, finite service time")
    return GeneralService(_deterministic_sampler(mean), mean, scv=0.0,
                          cdf=functools.partial(_deterministic_cdf, mean))


def lognormal(mean: float = 1.0, scv: float = 1.0) -> GeneralService:
    r"""Lognormal service time with mean `mean` and squared coefficient of variation `scv`:
    $S = e^{\mu + \sigma Z}$ with $\sigma^2 = \log(1 + c^2)$ and $\mu = \log m - \sigma^2/2$."""
    mean, scv = _real("mean", mean), _real("scv", scv)
    if not (math.isfinite(mean) and mean > 0):
        raise ValueError(f"mean={mean!r} must be a positive, finite mean service time")
    if not (math.isfinite(scv) and scv > 0):
        raise ValueError(f"scv={scv!r} must be positive and finite (use deterministic() for scv=0)")
    sigma2 = math.log1p(scv)
    mu = math.log(mean) - 0.5 * sigma2
    return GeneralService(_lognormal_sampler(mu, math.sqrt(sigma2)), mean, scv=scv,
                          cdf=functools.partial(_lognormal_cdf, mu, math.sqrt(sigma2)))


def _deterministic_cdf(value: float, x) -> np.ndarray:
    return (np.asarray(x, dtype=float) >= value).astype(float)


def _lognormal_cdf(mu: float, sigma: float, x) -> np.ndarray:
    import scipy.special

    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(x > 0, scipy.special.ndtr((np.log(np.maximum(x, 0.0)) - mu) / sigma), 0.0)
