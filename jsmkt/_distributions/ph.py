r"""Phase-type distributions.

A PH distribution with representation $(\alpha, T)$ of order $m$ is the time to absorption of a Markov chain on
$m$ transient phases started in phase $i$ with probability $\alpha_i$ and moved by the sub-generator $T$; the
exit-rate vector is $T^0 = -T\mathbf{1}$.
"""

import functools
import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._dense import mmatrix_solve
from .._errors import TINY as _TINY
from .._errors import as_float_array, concrete_array


_ATOL = 1e-10
# The largest order (number of phases) of a PH representation: `T` is a dense m x m array (4096 phases: 128 MiB).
MAX_ORDER = 4096
# Squarings allowed in `jax.scipy.linalg.expm` when `T` is traced (a concrete `T` gets as many as it needs).
_MAX_SQUARINGS = 64
_MAX_MOMENT = 170  # the largest n whose n! is a finite float64

# Norm bound of `jax.scipy.linalg.expm`'s float64 Pade approximant (it squares once per doubling above it).
_EXPM_MAXNORM = 5.371920351148152


def _positive_integer(name: str, n, what: str) -> int:
    """`n` as an `int`, or `ValueError` naming `name` when it is not a positive integer (NaN, inf and strings
    included)."""
    if isinstance(n, (bool, str, bytes)):
        raise ValueError(f"{name}={n!r} must be a positive integer ({what})")
    try:
        x = float(n)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={n!r} must be a positive integer ({what})") from e
    if not (math.isfinite(x) and x == int(x) and x >= 1):
        raise ValueError(f"{name}={n!r} must be a positive integer ({what})")
    return int(x)


def _check_order(prefix: str, m: int) -> None:
    """Refuse more than `MAX_ORDER` phases before a dense sub-generator is allocated (`prefix` names the argument)."""
    if m > MAX_ORDER:
        raise ValueError(
            f"{prefix}{m} phases exceed the largest PH order {MAX_ORDER} (a dense m x m sub-generator); "
            "use fewer phases"
        )


def _check_ph_values(alpha: np.ndarray, T: np.ndarray) -> None:
    """Raise `ValueError` naming the offending entry when `(alpha, T)` is not a PH representation."""
    m = alpha.shape[0]
    for i in range(m):
        if alpha[i] < -_ATOL:
            raise ValueError(f"alpha[{i}]={float(alpha[i])!r} is negative; alpha must be a probability vector")
    total = float(alpha.sum())
    if abs(total - 1.0) > 1e-8:
        raise ValueError(
            f"alpha sums to {total!r}, not 1; alpha must be a probability vector (no mass at zero)"
        )
    # Rates carry the time unit, so tolerances on T are relative to the row's total rate |T[i,i]|. Rows are checked
    # in order, each for its diagonal, then its off-diagonal entries, then its sum (vectorised: O(m^2)).
    diag = np.diagonal(T)
    scales = np.abs(diag)
    bad_diag = ~(diag < 0)
    off = T < -_ATOL * scales[:, None]
    np.fill_diagonal(off, False)
    rows = T.sum(axis=1)
    bad_row = rows > _ATOL * scales
    bad = bad_diag | off.any(axis=1) | bad_row
    if bad.any():
        i = int(np.argmax(bad))
        if bad_diag[i]:
            raise ValueError(f"T[{i},{i}]={float(T[i, i])!r} must be negative (diagonal of a sub-generator)")
        if off[i].any():
            j = int(np.argmax(off[i]))
            raise ValueError(f"T[{i},{j}]={float(T[i, j])!r} is negative; off-diagonal rates must be >= 0")
        raise ValueError(
            f"row {i} of T sums to {float(rows[i])!r} > 0; each row of a sub-generator sums to <= 0 "
            f"(its exit rate is -sum(T[{i}]))"
        )
    # Absorption must be reachable from every phase: -T must be invertible with a non-negative inverse.
    moves = T > _ATOL * scales[:, None]
    np.fill_diagonal(moves, False)
    can_exit = -rows > _ATOL * scales
    _close_backwards(moves, can_exit)
    if not can_exit.all():
        i = int(np.argmin(can_exit))
        raise ValueError(
            f"phase {i} of T never reaches the absorbing state (no exit rate is reachable from it); "
            "give T an absorbing exit from every phase"
        )
    _check_scale(alpha, T)


_DENSE_CHECK_MAX = 64  # phases up to which `_check_scale` solves densely


def _check_scale(alpha: np.ndarray, T: np.ndarray) -> None:
    r"""Refuse a PH whose first two moments leave the normal float64 range (its SCV, variance and the solvers'
    truncation levels need them): $E[S] = \alpha(-T)^{-1}\mathbf1$ and $E[S^2] = 2\alpha(-T)^{-2}\mathbf1$ from every
    phase, so that no moment is 0 * inf (NaN)."""
    if T.shape[0] <= _DENSE_CHECK_MAX:  # NumPy's dense solve: no SciPy import for the small PHs of most specs
        solve = functools.partial(np.linalg.solve, -T)
    else:
        import scipy.linalg  # here, not at the top: only large PH constructions need it (the CLI's start-up)

        if not np.any(np.tril(T, -1)):  # Erlang, Coxian, hyperexponential: O(m^2) back substitution
            solve = functools.partial(scipy.linalg.solve_triangular, -T, check_finite=False)
        else:
            solve = functools.partial(scipy.linalg.lu_solve, scipy.linalg.lu_factor(-T, check_finite=False),
                                      check_finite=False)
    with np.errstate(all="ignore"):
        try:
            m1 = solve(np.ones(T.shape[0]))
            m2 = 2.0 * solve(m1)
        except np.linalg.LinAlgError:  # a pivot that underflowed to 0: refused below, as non-finite moments are
            m1 = m2 = np.full(T.shape[0], np.nan)
        mean, second = float(alpha @ m1), float(alpha @ m2)
    vectors_ok = np.all(np.isfinite(m1)) and np.all(np.isfinite(m2))
    if not (vectors_ok and _TINY <= mean and _TINY <= second < np.inf):
        raise ValueError(
            f"the PH's time scale leaves float64: E[S]={mean:.6g}, E[S^2]={second:.6g} (both must be finite and "
            f"at least {_TINY:.6g}, from every phase, for its SCV and the solvers); measure time in another unit"
        )


def concrete_mean_scv(service: "PH") -> tuple[float, float]:
    """$E[S]$ and the SCV of a PH with concrete parameters, in NumPy (for the models' default truncation levels and
    the simulator's set-up: the properties `mean` and `scv` would compile each of their operations on its own)."""
    alpha, T = np.asarray(service.alpha, dtype=float), np.asarray(service.T, dtype=float)
    v1 = np.linalg.solve(-T, np.ones(len(alpha)))
    v2 = np.linalg.solve(-T, v1)
    m1 = float(alpha @ v1)
    return m1, 2.0 * float(alpha @ v2) / m1**2 - 1.0


def not_a_ph(service: "PH") -> Array:
    """Whether `service` is not a PH representation (NaN entries included), as a boolean array that may be traced:
    the sign and sum tests of construction, for the public entry points' `eqx.error_if` checks when the
    representation is traced (construction has then checked nothing)."""
    alpha, T = service.alpha, service.T
    diag = jnp.diagonal(T)
    scales = jnp.abs(diag)
    off = T - jnp.diag(diag)
    valid = (
        jnp.all(jnp.isfinite(alpha)) & jnp.all(jnp.isfinite(T))
        & jnp.all(alpha >= -_ATOL) & (jnp.abs(jnp.sum(alpha) - 1.0) <= 1e-8)
        & jnp.all(diag < 0) & jnp.all(off >= -_ATOL * scales[:, None])
        & jnp.all(jnp.sum(T, axis=1) <= _ATOL * scales)
    )
    return ~valid


def _close_backwards(moves: np.ndarray, marked: np.ndarray) -> None:
    """Mark, in place, every phase from which a marked phase is reachable through `moves[i, j]` (i to j): a
    breadth-first search from the marked phases, O(m^2) in all."""
    frontier = marked.copy()
    while frontier.any():
        new = moves[:, frontier].any(axis=1) & ~marked
        marked |= new
        frontier = new


def reachable_phases(alpha, T) -> np.ndarray:
    """Boolean mask of the phases a job can visit: those with `alpha_i > 0` and those reachable from them through
    positive off-diagonal rates of `T` (concrete arrays). A phase outside the mask never holds a job."""
    alpha, T = np.asarray(alpha, float), np.asarray(T, float)
    moves = T > 0.0
    np.fill_diagonal(moves, False)
    reach = alpha > 0.0
    _close_backwards(moves.T, reach)
    return reach


class PH(eqx.Module):
    r"""Phase-type distribution $\mathrm{PH}(\alpha, T)$.

    **Arguments:**

    - `alpha`: initial phase probabilities, shape `(m,)`, summing to 1.
    - `T`: sub-generator, shape `(m, m)`: negative diagonal, non-negative off-diagonal entries, row sums
      $\le 0$, and absorption reachable from every phase.

    The order is at most `MAX_ORDER` = 4096 phases (`T` is dense).

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
        _check_order(f"alpha has {m} entries: ", m)
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
        return mmatrix_solve(-self.T, jnp.ones(self.order))

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
        n = _positive_integer("n", n, "the order of the moment")
        if n > _MAX_MOMENT:
            raise ValueError(f"n={n!r} exceeds {_MAX_MOMENT}: n! overflows float64 beyond it; ask for a lower moment")
        v = jnp.ones(self.order)
        for _ in range(n):
            v = mmatrix_solve(-self.T, v)
        return float(math.factorial(n)) * (self.alpha @ v)

    def moments(self, n: int) -> Float[Array, " n"]:
        """The first `n` raw moments $E[S], \\ldots, E[S^n]$."""
        n = _positive_integer("n", n, "the number of moments")
        if n > _MAX_MOMENT:
            raise ValueError(f"n={n!r} exceeds {_MAX_MOMENT}: n! overflows float64 beyond it; ask for fewer moments")
        return jnp.stack([self.moment(k) for k in range(1, n + 1)])

    @property
    def variance(self) -> Float[Array, ""]:
        """Var[S] = E[S^2] - E[S]^2."""
        return self.moment(2) - self.mean**2

    @property
    def scv(self) -> Float[Array, ""]:
        r"""Squared coefficient of variation $\mathrm{Var}[S]/E[S]^2$."""
        return self.moment(2) / self.mean**2 - 1.0

    @property
    def stationary_vector(self) -> Float[Array, " m"]:
        r"""Stationary vector $\omega$ of $T + T^0\alpha$: the phase seen by a server that is always busy,
        $\omega = \alpha(-T)^{-1} / E[S]$ (also the initial vector of the equilibrium residual time)."""
        v = mmatrix_solve(-self.T.T, self.alpha)
        return v / jnp.sum(v)

    def _expm(self, x: Array) -> Float[Array, "... m m"]:
        r"""$e^{Tx}$ for `x >= 0` (`inf` included), without the overflow of scaling and squaring at large `x`.

        From every phase $P(S > eM) \le 1/e$ (Markov's inequality, $M$ the largest mean time to absorption), so
        $P(S > x) \le e^{-2000}$ beyond $x_0 = 2000\,eM$: there $e^{Tx}$ is 0 in float64 (also times any exit rate).
        `x` is clamped to $x_0$ and the result set to 0 beyond it; up to $x_0$, `expm` gets enough squarings."""
        T = self.T
        horizon = 2000.0 * math.e * jnp.max(self.mean_remaining)
        norm = jnp.max(jnp.sum(jnp.abs(T), axis=0))
        c = concrete_array(norm * horizon)
        if c is None:
            squarings = _MAX_SQUARINGS
        else:
            c = min(max(float(c), 1.0), float(np.finfo(float).max))
            squarings = max(16, int(np.floor(np.log2(c / _EXPM_MAXNORM))) + 2)
        t = jnp.minimum(x, horizon).reshape(-1)
        import jax.scipy.linalg  # here: a model's construction and solve need none of it (the CLI's start-up)

        E = jax.vmap(lambda u: jax.scipy.linalg.expm(T * u, max_squarings=squarings))(t).reshape(*x.shape, *T.shape)
        return jnp.where((x >= horizon)[..., None, None], 0.0, E)  # NaN stays NaN

    def cdf(self, x: ArrayLike) -> Float[Array, "..."]:
        r"""$P(S \le x) = 1 - \alpha e^{Tx}\mathbf{1}$, for `x >= 0` (0 for `x < 0`, 1 for `x = inf`)."""
        x = _points(x)
        surv = self._expm(jnp.maximum(x, 0.0)) @ jnp.ones(self.order) @ self.alpha
        return jnp.where(x < 0, 0.0, 1.0 - surv)

    def pdf(self, x: ArrayLike) -> Float[Array, "..."]:
        r"""$f(x) = \alpha e^{Tx} T^0$ for `x >= 0` (0 for `x < 0` and `x = inf`)."""
        x = _points(x)
        dens = self._expm(jnp.maximum(x, 0.0)) @ self.exit_vector @ self.alpha
        return jnp.where(x < 0, 0.0, dens)

    def sample(self, key: PRNGKeyArray, shape: int | tuple[int, ...] = ()) -> Float[Array, "..."]:
        """Draw samples of shape `shape` (an integer or a tuple of integers) by running the phase process to
        absorption (explicit `key`)."""
        return _sample_ph(self.alpha, self.T, key, _sample_shape(shape))


def _points(x) -> Array:
    """The points `x` of `cdf` and `pdf` as a float array (infinities allowed), or a `ValueError` naming `x`."""
    if isinstance(x, jax.core.Tracer):
        return x.astype(float)
    try:
        return jnp.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"x={x!r} is not a real number or array of real numbers (the points to evaluate at)") from e


def _sample_shape(shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, numbers.Integral) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if dims is None or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in dims):
        raise ValueError(f"shape={shape!r} must be a non-negative integer or a tuple of them (the sample shape)")
    return tuple(int(n) for n in dims)


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
    rate = as_float_array("rate", rate, ndim=0, scale=True)
    r = concrete_array(rate)
    if r is not None and not r > 0:
        raise ValueError(f"rate={float(r)!r} must be positive")
    return PH(np.ones(1), -(rate if r is None else r).reshape(1, 1))


def _positive_mean(mean) -> Array:
    mean = as_float_array("mean", mean, ndim=0, scale=True)
    mc = concrete_array(mean)
    if mc is not None and not mc > 0:
        raise ValueError(f"mean={float(mc)!r} must be positive")
    return mean


def _check_rates(rates: Array, mean: Array, scv: Array | None = None) -> None:
    r"""Refuse concrete phase rates built from `mean` (and `scv`) that leave float64, naming those arguments: an
    infinite rate (a tiny mean), or, with `scv`, a slow phase whose squared mean $1/\mu^2$ overflows in the second
    moment (a huge SCV)."""
    rc, mc = concrete_array(rates), concrete_array(mean)
    if rc is None or mc is None:
        return
    if not np.all(np.isfinite(rc)):
        raise ValueError(
            f"mean={float(mc)!r} is too small to represent: the phase rates {rc.tolist()!r} overflow float64; "
            "measure time in a larger unit"
        )
    sc = None if scv is None else concrete_array(scv)
    if sc is not None:
        with np.errstate(over="ignore", divide="ignore"):
            ok = np.all(rc > 0) and np.all(np.isfinite((1.0 / rc) ** 2))
        if not ok:
            raise ValueError(
                f"scv={float(sc)!r} is too large to represent with mean={float(mc)!r}: the slow phase's rate "
                f"{float(rc.min())!r} is so small that its squared mean 1/rate^2 (in the second moment) overflows "
                "float64; use a smaller scv (or a larger time unit)"
            )


def erlang(k: int, mean: float = 1.0) -> PH:
    """Erlang distribution with `k` phases (at most `MAX_ORDER` = 4096) and mean `mean` (SCV `1/k`)."""
    k = _positive_integer("k", k, "number of phases")
    _check_order("k=", k)
    mean = _positive_mean(mean)
    mc = concrete_array(mean)
    if mc is None:
        return PH(np.eye(1, k)[0], (k / mean) * (jnp.eye(k, k=1) - jnp.eye(k)))
    with np.errstate(over="ignore"):  # an infinite rate is refused next
        r = k / mc
    _check_rates(r, mean)
    return PH(np.eye(1, k)[0], r * (np.eye(k, k=1) - np.eye(k)))


def hyperexponential(probs: ArrayLike, rates: ArrayLike) -> PH:
    """Mixture of exponentials: rate `rates[i]` with probability `probs[i]` (at most `MAX_ORDER` = 4096 phases)."""
    probs = as_float_array("probs", probs, ndim=1)
    rates = as_float_array("rates", rates, ndim=1, scale=True)
    if probs.shape != rates.shape:
        raise ValueError(f"probs has shape {probs.shape} but rates has shape {rates.shape}; they must match")
    if rates.shape[0] < 1:
        raise ValueError("probs and rates are empty; a hyperexponential distribution needs at least one phase")
    _check_order(f"rates has {rates.shape[0]} entries: ", rates.shape[0])
    rc, pc = concrete_array(rates), concrete_array(probs)
    if rc is not None:
        for i, r in enumerate(rc):
            if not r > 0:
                raise ValueError(f"rates[{i}]={float(r)!r} must be positive")
    if pc is not None:
        for i, q in enumerate(pc):
            if q < -_ATOL:
                raise ValueError(f"probs[{i}]={float(q)!r} is negative; probs must be a probability vector")
        if pc.size and abs(float(pc.sum()) - 1.0) > 1e-8:
            raise ValueError(f"probs sums to {float(pc.sum())!r}, not 1; probs must be a probability vector")
    return PH(probs, -jnp.diag(rates) if rc is None else -np.diag(rc))


def hyperexponential2(mean: float = 1.0, scv: float = 4.0) -> PH:
    r"""Two-phase hyperexponential with *balanced means* ($p_1/\mu_1 = p_2/\mu_2$), given mean and SCV $\ge 1$:
    $p_{1,2} = \tfrac12(1 \pm \sqrt{(c^2-1)/(c^2+1)})$, $\mu_i = 2p_i/m$.

    At $c^2 = 1$ (the exponential) the balanced rates vary as $\sqrt{c^2 - 1}$, so no derivative with respect to
    `scv` exists through them. There the representation is $\alpha = (1, 0)$,
    $T = \begin{pmatrix} -1 & 0 \\ 1 & -1 \end{pmatrix}/m$ (phase 2 is never entered), the value at $u = 0$ of
    $T = \begin{pmatrix} -(1+2u) & u \\ 1-4u & -(1-2u) \end{pmatrix}/m$, $u = (c^2-1)/(c^2+1)$: the same
    hyperexponential for $0 \le u < 1/4$, smooth in `scv`, so that `jax.grad` gives the one-sided derivative at 1.
    This holds for functions of the distribution (jsmkt's models, moments); the as-published formulas of
    `jsmkt.published` depend on the representation and jump at `scv = 1`.
    """
    mean = _positive_mean(mean)
    scv = as_float_array("scv", scv, ndim=0)
    sc = concrete_array(scv)
    if sc is not None and not sc >= 1:
        raise ValueError(f"scv={float(sc)!r} must be >= 1 for a hyperexponential distribution")
    mc = concrete_array(mean)
    if mc is None or sc is None:
        p, rates, smooth_alpha, smooth_T = _h2(mean, scv)
    else:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # rates out of range: refused next
            p, rates, smooth_alpha, smooth_T = _h2_terms(mc, sc, np)
    _check_rates(rates, mean, scv)
    balanced = hyperexponential(p, rates)
    if sc is not None and not sc == 1:
        return balanced
    return PH(smooth_alpha, smooth_T)


def _h2_terms(mean, scv, xp):
    """`hyperexponential2`'s probabilities and rates, and its representation smooth at `scv = 1`, computed with the
    array module `xp`: NumPy for concrete values (a model built once, by the CLI, then runs no JAX operation on its
    own), `jax.numpy` under `_h2`."""
    u = (scv - 1.0) / (scv + 1.0)
    at_one = u == 0.0
    s = xp.where(at_one, 0.0, xp.sqrt(xp.where(at_one, 1.0, u)))  # no infinite derivative at u = 0
    # p2 = (1 - s)/2 = 1/((c^2 + 1)(1 + s)), free of cancellation as c^2 grows.
    p = xp.stack([0.5 * (1.0 + s), 1.0 / ((scv + 1.0) * (1.0 + s))])
    rates = 2.0 * p / mean
    smooth_T = xp.stack([xp.stack([-(1.0 + 2.0 * u), u]), xp.stack([1.0 - 4.0 * u, -(1.0 - 2.0 * u)])]) / mean
    return (p, rates, xp.where(at_one, xp.array([1.0, 0.0]), p),
            xp.where(at_one, smooth_T, -xp.diag(rates)))


# Traced values: compiled once, where run eagerly each operation would compile on its own.
_h2 = jax.jit(functools.partial(_h2_terms, xp=jnp))


def coxian(rates: ArrayLike, probs: ArrayLike) -> PH:
    r"""Coxian distribution: phase $i$ has rate `rates[i]`; after phase $i < m$ service continues to phase
    $i+1$ with probability `probs[i]` and ends otherwise (`probs` has $m-1$ entries; at most `MAX_ORDER` = 4096
    phases)."""
    rates = as_float_array("rates", rates, ndim=1, scale=True)
    probs = as_float_array("probs", probs, ndim=1)
    m = rates.shape[0]
    if m < 1:
        raise ValueError("rates is empty; a Coxian distribution needs at least one phase")
    if probs.shape != (m - 1,):
        raise ValueError(f"probs has shape {probs.shape}; a Coxian with {m} rates needs {m - 1} continuation probabilities")
    _check_order(f"rates has {m} entries: ", m)
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
    mean = _positive_mean(mean)
    scv = as_float_array("scv", scv, ndim=0)
    sc = concrete_array(scv)
    if sc is not None and not sc >= 0.5:
        raise ValueError(f"scv={float(sc)!r} must be >= 0.5 for a two-phase Coxian")
    mu1 = 2.0 / mean
    p = 1.0 / (2.0 * scv)
    mu2 = 1.0 / (mean * scv)
    rates = jnp.stack([mu1, mu2])
    _check_rates(rates, mean, scv)
    return coxian(rates, p.reshape(1))
