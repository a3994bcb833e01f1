r"""Phase-type distributions.

A PH distribution with representation $(\alpha, T)$ of order $m$ is the time to absorption of a Markov chain on
$m$ transient phases started in phase $i$ with probability $\alpha_i$ and moved by the sub-generator $T$; the
exit-rate vector is $T^0 = -T\mathbf{1}$.
"""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._errors import as_float_array, concrete_array


_ATOL = 1e-10


def _check_ph_values(alpha: np.ndarray, T: np.ndarray) -> None:
    """Raise `ValueError` naming the offending entry when `(alpha, T)` is not a PH representation."""
    m = alpha.shape[0]
    for i in range(m):
        if alpha[i] < -_ATOL:
            raise ValueError(f"alpha[{i}]={alpha[i]!r} is negative; alpha must be a probability vector")
    total = float(alpha.sum())
    if abs(total - 1.0) > 1e-8:
        raise ValueError(
            f"alpha sums to {total!r}, not 1; alpha must be a probability vector (no mass at zero)"
        )
    # Rates carry the time unit, so tolerances on T are relative to the row's total rate |T[i,i]|.
    for i in range(m):
        if not T[i, i] < 0:
            raise ValueError(f"T[{i},{i}]={T[i, i]!r} must be negative (diagonal of a sub-generator)")
        scale = abs(T[i, i])
        for j in range(m):
            if i != j and T[i, j] < -_ATOL * scale:
                raise ValueError(f"T[{i},{j}]={T[i, j]!r} is negative; off-diagonal rates must be >= 0")
        row = float(T[i].sum())
        if row > _ATOL * scale:
            raise ValueError(
                f"row {i} of T sums to {row!r} > 0; each row of a sub-generator sums to <= 0 "
                f"(its exit rate is -sum(T[{i}]))"
            )
    # Absorption must be reachable from every phase: -T must be invertible with a non-negative inverse.
    scales = np.abs(np.diagonal(T))
    reach = (T > _ATOL * scales[:, None]).astype(int) + np.eye(m, dtype=int)
    exits = -T.sum(axis=1) > _ATOL * scales
    can_exit = exits.copy()
    for _ in range(m):
        can_exit = can_exit | ((reach @ can_exit.astype(int)) > 0)
    for i in range(m):
        if not can_exit[i]:
            raise ValueError(
                f"phase {i} of T never reaches the absorbing state (no exit rate is reachable from it); "
                "give T an absorbing exit from every phase"
            )


def reachable_phases(alpha, T) -> np.ndarray:
    """Boolean mask of the phases a job can visit: those with `alpha_i > 0` and those reachable from them through
    positive off-diagonal rates of `T` (concrete arrays). A phase outside the mask never holds a job."""
    alpha, T = np.asarray(alpha, float), np.asarray(T, float)
    moves = (T - np.diag(np.diag(T))) > 0.0
    reach = alpha > 0.0
    while True:
        more = reach | (moves & reach[:, None]).any(axis=0)
        if (more == reach).all():
            return reach
        reach = more


class PH(eqx.Module):
    r"""Phase-type distribution $\mathrm{PH}(\alpha, T)$.

    **Arguments:**

    - `alpha`: initial phase probabilities, shape `(m,)`, summing to 1.
    - `T`: sub-generator, shape `(m, m)`: negative diagonal, non-negative off-diagonal entries, row sums
      $\le 0$, and absorption reachable from every phase.

    Values are validated when they are concrete; under `jit`/`grad` the public solvers check them instead.

    !!! example

        ```python
        S = jsmkt.PH(jnp.array([1.0, 0.0]), jnp.array([[-2.0, 2.0], [0.0, -2.0]]))  # Erlang-2, mean 1
        S.mean, S.scv  # (1.0, 0.5)
        ```
    """

    alpha: Float[Array, " m"]
    T: Float[Array, "m m"]

    def __init__(self, alpha: ArrayLike, T: ArrayLike):
        self.alpha = as_float_array("alpha", alpha, ndim=1)
        self.T = as_float_array("T", T, ndim=2)

    def __check_init__(self):
        m = self.alpha.shape[0]
        if m < 1:
            raise ValueError("alpha is empty; a PH distribution needs at least one phase")
        if self.T.shape != (m, m):
            raise ValueError(
                f"T has shape {self.T.shape} but alpha has {m} phase(s); T must be ({m}, {m})"
            )
        a, t = concrete_array(self.alpha), concrete_array(self.T)
        if a is not None and t is not None:
            _check_ph_values(a, t)

    @property
    def order(self) -> int:
        """Number of phases m."""
        return self.alpha.shape[0]

    @property
    def exit_vector(self) -> Float[Array, " m"]:
        r"""Exit rates $T^0 = -T\mathbf{1}$."""
        return -jnp.sum(self.T, axis=1)

    @property
    def mean_remaining(self) -> Float[Array, " m"]:
        r"""Mean time to absorption from each phase, $(-T)^{-1}\mathbf{1}$."""
        return jnp.linalg.solve(-self.T, jnp.ones(self.order))

    @property
    def mean(self) -> Float[Array, ""]:
        r"""$E[S] = \alpha(-T)^{-1}\mathbf{1}$."""
        return self.alpha @ self.mean_remaining

    @property
    def rate(self) -> Float[Array, ""]:
        r"""Service rate $\mu = 1/E[S]$."""
        return 1.0 / self.mean

    def moment(self, n: int) -> Float[Array, ""]:
        r"""$E[S^n] = n!\,\alpha(-T)^{-n}\mathbf{1}$."""
        if int(n) != n or n < 1:
            raise ValueError(f"n={n!r} must be a positive integer")
        v = jnp.ones(self.order)
        for _ in range(int(n)):
            v = jnp.linalg.solve(-self.T, v)
        return math.factorial(int(n)) * (self.alpha @ v)

    def moments(self, n: int) -> Float[Array, " n"]:
        """The first `n` raw moments $E[S], \\ldots, E[S^n]$."""
        return jnp.stack([self.moment(k) for k in range(1, n + 1)])

    @property
    def variance(self) -> Float[Array, ""]:
        return self.moment(2) - self.mean**2

    @property
    def scv(self) -> Float[Array, ""]:
        r"""Squared coefficient of variation $\mathrm{Var}[S]/E[S]^2$."""
        return self.moment(2) / self.mean**2 - 1.0

    @property
    def stationary_vector(self) -> Float[Array, " m"]:
        r"""Stationary vector $\omega$ of $T + T^0\alpha$: the phase seen by a server that is always busy,
        $\omega = \alpha(-T)^{-1} / E[S]$ (also the initial vector of the equilibrium residual time)."""
        v = jnp.linalg.solve(-self.T.T, self.alpha)
        return v / jnp.sum(v)

    def cdf(self, x: ArrayLike) -> Float[Array, "..."]:
        r"""$P(S \le x) = 1 - \alpha e^{Tx}\mathbf{1}$, for `x >= 0` (0 for `x < 0`)."""
        x = jnp.asarray(x, dtype=float)
        surv = jnp.vectorize(lambda t: self.alpha @ jsl.expm(self.T * jnp.maximum(t, 0.0)) @ jnp.ones(self.order))(x)
        return jnp.where(x < 0, 0.0, 1.0 - surv)

    def pdf(self, x: ArrayLike) -> Float[Array, "..."]:
        r"""$f(x) = \alpha e^{Tx} T^0$ for `x >= 0` (0 for `x < 0`)."""
        x = jnp.asarray(x, dtype=float)
        dens = jnp.vectorize(lambda t: self.alpha @ jsl.expm(self.T * jnp.maximum(t, 0.0)) @ self.exit_vector)(x)
        return jnp.where(x < 0, 0.0, dens)

    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...] = ()) -> Float[Array, "..."]:
        """Draw samples of shape `shape` by running the phase process to absorption (explicit `key`)."""
        return _sample_ph(self.alpha, self.T, key, tuple(shape))


def _sample_one(alpha, T, key):
    m = alpha.shape[0]
    exit_rates = -jnp.sum(T, axis=1)
    out_rates = -jnp.diagonal(T)
    # Jump probabilities: to phase j (j < m) or to absorption (index m).
    jumps = jnp.concatenate([T - jnp.diag(jnp.diagonal(T)), exit_rates[:, None]], axis=1)
    jumps = jumps / out_rates[:, None]
    k0, key = jr.split(key)
    phase = jr.choice(k0, m, p=alpha)

    def cond(carry):
        return carry[0] < m

    def body(carry):
        phase, t, key = carry
        key, k1, k2 = jr.split(key, 3)
        t = t + jr.exponential(k1) / out_rates[phase]
        phase = jr.choice(k2, m + 1, p=jumps[phase])
        return phase, t, key

    _, t, _ = jax.lax.while_loop(cond, body, (phase, jnp.zeros(()), key))
    return t


# Jitted at module level so that repeated calls reuse the compiled while-loop (shape is static).
@functools.partial(jax.jit, static_argnums=3)
def _sample_ph(alpha, T, key, shape):
    n = int(np.prod(shape)) if shape else 1
    keys = jr.split(key, n)
    out = jax.vmap(lambda k: _sample_one(alpha, T, k))(keys)
    return out.reshape(shape)


def exponential(rate: float = 1.0) -> PH:
    """Exponential distribution with rate `rate` (mean `1/rate`)."""
    rate = as_float_array("rate", rate, ndim=0)
    r = concrete_array(rate)
    if r is not None and not r > 0:
        raise ValueError(f"rate={float(r)!r} must be positive")
    return PH(jnp.ones(1), -rate.reshape(1, 1))


def erlang(k: int, mean: float = 1.0) -> PH:
    """Erlang distribution with `k` phases and mean `mean` (SCV `1/k`)."""
    if int(k) != k or k < 1:
        raise ValueError(f"k={k!r} must be a positive integer (number of phases)")
    k = int(k)
    mean = as_float_array("mean", mean, ndim=0)
    mc = concrete_array(mean)
    if mc is not None and not mc > 0:
        raise ValueError(f"mean={float(mc)!r} must be positive")
    r = k / mean
    T = -r * jnp.eye(k) + r * jnp.eye(k, k=1)
    return PH(jnp.zeros(k).at[0].set(1.0), T)


def hyperexponential(probs: ArrayLike, rates: ArrayLike) -> PH:
    """Mixture of exponentials: rate `rates[i]` with probability `probs[i]`."""
    probs = as_float_array("probs", probs, ndim=1)
    rates = as_float_array("rates", rates, ndim=1)
    if probs.shape != rates.shape:
        raise ValueError(f"probs has shape {probs.shape} but rates has shape {rates.shape}; they must match")
    rc = concrete_array(rates)
    if rc is not None:
        for i, r in enumerate(rc):
            if not r > 0:
                raise ValueError(f"rates[{i}]={float(r)!r} must be positive")
    return PH(probs, -jnp.diag(rates))


def hyperexponential2(mean: float = 1.0, scv: float = 4.0) -> PH:
    r"""Two-phase hyperexponential with *balanced means* ($p_1/\mu_1 = p_2/\mu_2$), given mean and SCV $\ge 1$."""
    mean = as_float_array("mean", mean, ndim=0)
    scv = as_float_array("scv", scv, ndim=0)
    sc = concrete_array(scv)
    if sc is not None and not sc >= 1:
        raise ValueError(f"scv={float(sc)!r} must be >= 1 for a hyperexponential distribution")
    p1 = 0.5 * (1.0 + jnp.sqrt((scv - 1.0) / (scv + 1.0)))
    p = jnp.stack([p1, 1.0 - p1])
    rates = 2.0 * p / mean
    return hyperexponential(p, rates)


def coxian(rates: ArrayLike, probs: ArrayLike) -> PH:
    r"""Coxian distribution: phase $i$ has rate `rates[i]`; after phase $i < m$ service continues to phase
    $i+1$ with probability `probs[i]` and ends otherwise (`probs` has $m-1$ entries)."""
    rates = as_float_array("rates", rates, ndim=1)
    probs = as_float_array("probs", probs, ndim=1)
    m = rates.shape[0]
    if probs.shape != (m - 1,):
        raise ValueError(f"probs has shape {probs.shape}; a Coxian with {m} rates needs {m - 1} continuation probabilities")
    rc, pc = concrete_array(rates), concrete_array(probs)
    if rc is not None:
        for i, r in enumerate(rc):
            if not r > 0:
                raise ValueError(f"rates[{i}]={float(r)!r} must be positive")
    if pc is not None:
        for i, q in enumerate(pc):
            if not 0 <= q <= 1:
                raise ValueError(f"probs[{i}]={float(q)!r} must lie in [0, 1]")
    T = -jnp.diag(rates) + jnp.diag(rates[:-1] * probs, k=1)
    return PH(jnp.zeros(m).at[0].set(1.0), T)


def coxian2(mean: float = 1.0, scv: float = 2.0) -> PH:
    r"""Two-phase Coxian with given mean and SCV $\ge 1/2$ (Marie's parametrisation:
    $\mu_1 = 2/m$, $p = 1/(2c^2)$, $\mu_2 = 1/(m c^2)$)."""
    mean = as_float_array("mean", mean, ndim=0)
    scv = as_float_array("scv", scv, ndim=0)
    sc = concrete_array(scv)
    if sc is not None and not sc >= 0.5:
        raise ValueError(f"scv={float(sc)!r} must be >= 0.5 for a two-phase Coxian")
    mu1 = 2.0 / mean
    p = 1.0 / (2.0 * scv)
    mu2 = 1.0 / (mean * scv)
    return coxian(jnp.stack([mu1, mu2]), p.reshape(1))
