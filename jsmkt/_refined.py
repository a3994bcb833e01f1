r"""Refined mean field: the $1/N$ correction of the fixed point (Gast & Van Houdt, *A Refined Mean Field
Approximation*, 2017), computed from the model contract by automatic differentiation.

With $N$ servers the reduced state $Y^N$ (tails $S_k$, per phase where relevant) of a model whose transition
rates are exactly $N\beta_c(x)$ (true for sampling with replacement) satisfies, in steady state,

$$E[\varphi(Y^N)] = \varphi(y^*) + \frac1N\Big(D\varphi\,V + \tfrac12\,D^2\varphi : W\Big) + o(1/N),
\qquad N\,\mathrm{Cov}(Y^N) \to W,$$

for smooth $\varphi$, where $y^*$ is the fixed point, $A = Df(y^*)$ the Jacobian of the drift,
$Q = \sum_{\text{jumps}} \beta\,\ell\ell^\top$ the jump covariance of the transitions at $y^*$ (`transitions`, one
server moving from `source` to `target`, jump $\ell$ = `reduce`$(e_{\text{target}} - e_{\text{source}})$),

$$A W + W A^\top + Q = 0 \qquad\text{and}\qquad A V = -\tfrac12\, D^2 f : W.$$

`W` is the covariance of the central limit theorem (linear noise approximation); `V` is the bias of the mean.
Sampling without replacement makes the finite-N rates $N\beta_c(x) + \beta_c^{(1)}(x) + O(1/N)$; their drift
$f^{(1)}$ joins the bias: $A V = -\tfrac12 D^2 f : W - f^{(1)}$. So does the $1/N$ drift of a stream that starts
at a server (a retrial, a push: `jsmkt._refined_terms.origin_drift_correction`), which samples after its
origin has moved. A modulating phase (a BMAP's, `jsmkt._models.description.Modulation`) adds its own noise to
$Q$ and a bias term (`jsmkt._refined_terms.modulation_noise`): the phase moves $N$ times faster than the occupancy, so its
correlations enter at order $1/N$, through a corrector of the averaging. The
Lyapunov equation is solved by Smith's doubling iteration on its Cayley transform (pure JAX, so everything here
is differentiable and vmappable); second derivatives enter only contracted with `W`, by nested forward-mode
products (no Hessian tensor).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, ArrayLike, Float, PyTree

from . import _maps
from ._choice import (
    _UNROLL_MAX_D,
    AbstractChoice,
    _divided_differences,
    _weighted_divided_differences,
    _weighted_pgf,
)
from ._compile import fast_jit
from ._errors import error_if, is_concrete
from ._models.base import AbstractDescribedModel, AbstractSupermarketModel
from ._models.meanfield import check_modulation
from ._refined_terms import (
    jump_second_moment,
    modulated_displacements,
    modulation_noise,
    origin_drift_correction,
    origin_shifted_moments,
    tensor_lyapunov3,
    third_jump_moment,
)
from ._solution import FixedPoint, failed, nan_where


_MAX_DENSE_BYTES = 2**33  # 8 GiB for the dense n x n matrices (about four alive at once)
_ORDER2_BYTES_PER_N3 = 160  # order 2: about ten n x n x n arrays alive at once, two of them complex
_SMITH_STEPS = 40  # doublings: sums 2**40 terms of the Stein series (contraction factor up to 1 - 2e-11 resolved)


def _check_n(n_servers: Any) -> Any:
    """A number of servers >= 1, as a float: checked in Python when concrete (Python, NumPy or JAX scalar), by
    `error_if` when traced."""
    if isinstance(n_servers, jax.core.Tracer):
        if jnp.shape(n_servers) != ():
            raise ValueError(f"n_servers must be a scalar (got shape {jnp.shape(n_servers)})")
        n = n_servers.astype(float)
        return error_if(n, ~(n >= 1.0), "n_servers must be a number of servers >= 1")
    if isinstance(n_servers, int) and not isinstance(n_servers, bool):  # any size (NumPy would make 10**30 an object)
        if n_servers < 1:
            raise ValueError(f"n_servers={n_servers!r} must be a number of servers >= 1")
        return float(n_servers)
    try:
        a = np.asarray(n_servers)
        ok = a.shape == () and a.dtype.kind in "iuf" and bool(a >= 1) and bool(np.isfinite(a))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"n_servers={n_servers!r} must be a number of servers >= 1")
    return float(a)


def lyapunov(A: Float[Array, "n n"], Q: Float[Array, "n n"]) -> Float[Array, "n n"]:
    r"""Solve $A W + W A^\top + Q = 0$ for a stable $A$ (every eigenvalue in the open left half-plane).

    Cayley transform with shift $c > 0$: $W = S W S^\top + R$, $S = (A - cI)^{-1}(A + cI)$,
    $R = 2c\,(A - cI)^{-1} Q (A - cI)^{-\top}$, whose series $\sum_j S^j R S^{j\top}$ is summed by doubling.
    $c$ is the geometric mean of estimates of the largest and smallest eigenvalue moduli of $A$."""
    n = A.shape[0]
    eye = jnp.eye(n, dtype=A.dtype)
    big = jnp.max(jnp.sum(jnp.abs(A), axis=1))
    small = 1.0 / jnp.max(jnp.sum(jnp.abs(jnp.linalg.inv(A)), axis=1))
    c = jnp.sqrt(big * small)
    lu = jax.scipy.linalg.lu_factor(A - c * eye)
    S = jax.scipy.linalg.lu_solve(lu, A + c * eye)
    M = jax.scipy.linalg.lu_solve(lu, Q)
    R = 2.0 * c * jax.scipy.linalg.lu_solve(lu, M.T).T
    R = 0.5 * (R + R.T)

    def step(_, carry):
        W, S = carry
        return W + S @ W @ S.T, S @ S

    W, S = jax.lax.fori_loop(0, _SMITH_STEPS, step, (R, S))
    return 0.5 * (W + W.T)


def _jump_covariance(model: AbstractSupermarketModel, y: PyTree[Array]) -> Float[Array, "n n"]:
    """$Q = \\sum_{\\text{jumps}} \\text{flow}\\;\\ell\\ell^\\top$ in flattened reduced coordinates: $Q = R G R^\\top$
    with $R$ the (linear) reduction and $G$ the jumps' second moment in the occupancy space
    (`jsmkt._refined_terms.jump_second_moment`: $n_{\\text{states}}^2$ floats, never the matrix of jump vectors, and
    transitions that move two servers at once with their cross term)."""
    x = model.occupancy(y)
    reduce_flat = lambda x: ravel_pytree(model.reduce(x))[0]  # noqa: E731
    Rm = jax.jacfwd(reduce_flat)(x)  # (n_reduced, n_states); reduce is linear
    G = jump_second_moment(model.transitions(x), x)
    return Rm @ G @ Rm.T


def _contract_hessian(fn: Callable, z: Float[Array, " n"], W: Float[Array, "n n"]) -> Array:
    r"""$D^2 f(z) : W = \sum_{kl} W_{kl}\, \partial_k \partial_l f(z)$ (any output shape), as
    $\sum_l \partial_l\,[Df(z)\, W e_l]$: $n$ nested forward-mode products, no Hessian tensor."""
    eye = jnp.eye(z.shape[0], dtype=z.dtype)

    def column(w, e):
        return jax.jvp(lambda u: jax.jvp(fn, (u,), (w,))[1], (z,), (e,))[1]

    return jnp.sum(jax.vmap(column, in_axes=(1, 1), out_axes=-1)(W, eye), axis=-1)


class _SampledWithoutReplacement(AbstractChoice):
    r"""The choice rule `base` with its `D` servers sampled *without* replacement from $N = 1/\varepsilon$: an
    arrival finds all of them with at least $k$ jobs with probability
    $\prod_{i<D} (s_k - i\varepsilon)/(1 - i\varepsilon)$ (exact for every $N$) instead of $s_k^D$, and joins a
    uniformly chosen server among those with the fewest jobs, as with replacement. At $\varepsilon = 0$ this is
    `base`; its $\varepsilon$-derivative is the $1/N$ term of the finite-N drift."""

    base: AbstractChoice
    eps: Float[Array, ""]

    @property
    def max_d(self) -> int:
        return self.base.max_d

    def weights(self) -> Array:
        return self.base.weights()

    def _coefficients(self) -> Array:
        r"""Coefficients (in powers $s^0..s^D$) of $\sum_j w_j \prod_{i<j} (s - i\varepsilon)/(1 - i\varepsilon)$,
        $D$ = `max_d`: the probability that all sampled servers have at least $k$ jobs, as a polynomial in $s_k$.
        One `lax.scan` over the factors (compiled size independent of $D$, $O(D^2)$ work, $O(D)$ memory)."""
        w = self.weights()

        def step(carry, xs):
            i, w_next = xs
            poly, acc = carry
            shifted = jnp.concatenate([jnp.zeros(1, poly.dtype), poly[:-1]])  # s * poly
            poly = (shifted - i * self.eps * poly) / (1.0 - i * self.eps)
            return (poly, acc + w_next * poly), None

        one = jnp.zeros(self.max_d + 1, self.eps.dtype).at[0].set(1.0)
        xs = (jnp.arange(self.max_d, dtype=self.eps.dtype), w)
        (_, coeffs), _ = jax.lax.scan(step, (one, jnp.zeros_like(one)), xs)
        return coeffs

    def pgf(self, s: ArrayLike) -> Array:
        s = jnp.asarray(s)
        coeffs = self._coefficients()
        if self.max_d > _UNROLL_MAX_D:
            return coeffs[0] + _weighted_pgf(coeffs[1:], s)
        return jnp.tensordot(coeffs, jnp.stack([s**l for l in range(self.max_d + 1)]), axes=1)

    def join_factor(self, a: ArrayLike, b: ArrayLike) -> Array:
        a, b = jnp.asarray(a), jnp.asarray(b)
        coeffs = self._coefficients()  # the constant term drops out of a divided difference
        if self.max_d > _UNROLL_MAX_D:
            return _weighted_divided_differences(coeffs[1:], a, b)
        return jnp.tensordot(coeffs[1:], _divided_differences(a, b, self.max_d), axes=1)


def _with_sampling_eps(model: AbstractSupermarketModel, eps: Array) -> AbstractSupermarketModel:
    """`model` with every choice rule sampled without replacement from $N = 1/\varepsilon$ servers."""
    is_choice = lambda x: isinstance(x, AbstractChoice)  # noqa: E731
    return jax.tree_util.tree_map(
        lambda x: _SampledWithoutReplacement(x, eps) if is_choice(x) else x, model, is_leaf=is_choice
    )


class RefinedMeanField(eqx.Module):
    r"""Refined mean field of a model at its fixed point: $E[Y^N] = y^* + V/N + A/N^2 + o(1/N^2)$ and
    $N\,\mathrm{Cov}(Y^N) \to W$.

    **Attributes:**

    - `value`: $y^*$, the mean-field fixed point (reduced state).
    - `correction`: $V$, the $1/N$ coefficient of the mean, same structure as `value`.
    - `covariance`: $W$, the limit of $N\,\mathrm{Cov}(Y^N)$ on the flattened reduced state, shape `(n, n)`.
    - `model`: the model.
    - `correction2`: $A$, the $1/N^2$ coefficient of the mean, same structure as `value` (`order=2` of
      `refined_mean_field`); `None` at order 1.
    - `sampling`: how the finite system samples (`"with_replacement"` or `"without_replacement"`), which the
      expansion was made for.

    `V` and `A` depend on how the finite system samples (`sampling` of `refined_mean_field`); `W` does not.
    """

    value: PyTree[Array]
    correction: PyTree[Array]
    covariance: Float[Array, "n n"]
    model: AbstractSupermarketModel
    correction2: PyTree[Array] | None = None
    sampling: str = eqx.field(static=True, default="with_replacement")

    @property
    def order(self) -> int:
        """1 or 2: the order in $1/N$ of `state`."""
        return 1 if self.correction2 is None else 2

    def state(self, n_servers) -> PyTree[Array]:
        """The expected reduced state with `n_servers` servers: $y^* + V/N$ at order 1, $y^* + V/N + A/N^2$ at
        order 2. Linear metrics (`tails`, `mean_queue_length`) of this state are their refined values; for other
        metrics use `expectation` (order 1)."""
        n = _check_n(n_servers)
        if self.correction2 is None:
            return jax.tree_util.tree_map(lambda a, b: a + b / n, self.value, self.correction)
        return jax.tree_util.tree_map(lambda a, b, c: a + b / n + c / (n * n), self.value, self.correction,
                                      self.correction2)

    def expectation(self, fn: Callable[[PyTree[Array]], Array], n_servers) -> Array:
        r"""$E[\varphi(Y^N)]$ to order $1/N$: $\varphi(y^*) + (D\varphi\,V + \frac12 D^2\varphi : W)/N$ for a
        smooth `fn` $= \varphi$ of the reduced state (scalar or array valued), e.g.
        `lambda y: jsmkt.prob_wait(model, y)`. Order 1 also for an order-2 expansion (the $1/N^2$ term of a
        nonlinear $\varphi$ needs the third moments and $W$'s own $1/N$ term, which are not kept); for a linear
        $\varphi$ use `fn(rmf.state(N))`, which is of order 2 there."""
        n = _check_n(n_servers)
        flat, unravel = ravel_pytree(self.value)
        phi = lambda z: fn(unravel(z))  # noqa: E731
        v, _ = ravel_pytree(self.correction)
        f0, dV = jax.jvp(phi, (flat,), (v,))
        return f0 + (dV + 0.5 * _contract_hessian(phi, flat, self.covariance)) / n

    def std(self, fn: Callable[[PyTree[Array]], Array], n_servers) -> Array:
        r"""Standard deviation of $\varphi(Y^N)$ in steady state to leading order,
        $\sqrt{D\varphi\, W\, D\varphi^\top / N}$: the spread of the time-varying occupancy around its mean, not
        a confidence interval; of order 1 at either order of the expansion. An array-valued `fn` gives the
        standard deviation of each entry (one Jacobian), e.g.
        `rmf.std(lambda y: jsmkt.tails(model, y), N)` for every level at once."""
        n = _check_n(n_servers)
        flat, unravel = ravel_pytree(self.value)
        phi = lambda z: jnp.asarray(fn(unravel(z)))  # noqa: E731
        shape = jax.eval_shape(phi, flat).shape
        jac = jax.jacrev if int(np.prod(shape)) <= flat.size else jax.jacfwd  # fewer passes
        J = jac(phi)(flat).reshape(-1, flat.size)
        var = jnp.einsum("ij,jk,ik->i", J, self.covariance, J)
        return jnp.sqrt(jnp.maximum(var, 0.0) / n).reshape(shape)


def refined_mean_field(fixed_point: FixedPoint, sampling: str = "with_replacement", order: int = 1) -> RefinedMeanField:
    r"""The refined mean field (the $1/N$ or $1/N^2$ expansion of the steady state) at a solved fixed point.

    **Arguments:**

    - `fixed_point`: from `jsmkt.solve_fixed_point` (its `model` is used).
    - `sampling`: how the finite system samples its `D` servers, as in `jsmkt.simulate`: `"with_replacement"`
      (the mean-field model: its rates are exactly $N$ times the mean-field ones) or `"without_replacement"`
      ($D$ distinct servers: all $D$ have at least $k$ jobs with probability
      $\prod_{i<D}(s_k - i/N)/(1 - i/N)$, which adds the $1/N$ term of the drift to the bias `V`).
    - `order`: 1 (`value`, `correction`, `covariance`) or 2 (also `correction2`, the $1/N^2$ term $A$ of the mean,
      and `state` includes it; the equations are in `_refine2`'s docstring). Order 2 costs $O(n^4)$ work and
      about $160\,n^3$ bytes, and is not available for a modulating phase (BMAP arrivals), whose $1/N^2$ terms
      are not derived here.

    **Returns:** a `RefinedMeanField`; e.g. `jsmkt.tails(model, rmf.state(100))` are the expected tails with 100
    servers to order $1/N$, and `rmf.expectation(fn, 100)` the expectation of any smooth function of the state.

    Differentiable with respect to the model's parameters (through the fixed point's implicit adjoint), jittable and
    vmappable. A fixed point that failed (solved with `throw=False`) gives NaN in `value`, `correction` and
    `covariance`, and in their derivatives (its `result` says why; the other entries of a `vmap` batch keep their
    values). A converged fixed point whose expansion is not finite (an unstable Jacobian) raises `ValueError`
    when concrete.

    Cost: dense $n \times n$ linear algebra ($O(n^3)$; the Lyapunov equation takes 40 doublings) and $n$ second
    directional derivatives of the drift, $n$ = size of the reduced state ($K m$).
    """
    if not isinstance(fixed_point, FixedPoint):
        raise TypeError(
            f"fixed_point must be a jsmkt.FixedPoint (from jsmkt.solve_fixed_point), got {type(fixed_point).__name__}"
        )
    fixed_point.model.check_state(fixed_point.value, "fixed_point.value", values=False)
    concrete = is_concrete(*jax.tree_util.tree_leaves(fixed_point.value))
    if sampling not in ("with_replacement", "without_replacement"):
        raise ValueError(f"sampling={sampling!r} must be 'with_replacement' or 'without_replacement'")
    n = sum(int(np.size(a)) for a in jax.tree_util.tree_leaves(fixed_point.value))
    if isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"order={order!r} must be 1 (the 1/N term) or 2 (the 1/N and 1/N^2 terms)")
    if order == 2:
        _check_order2(fixed_point.model, n)
    if 32 * n * n > _MAX_DENSE_BYTES:
        raise ValueError(
            f"the reduced state has {n} entries (K={fixed_point.model.K}): the refined mean field's dense n x n "
            f"matrices need about {32 * n * n / 2**30:.3g} GiB (limit {_MAX_DENSE_BYTES / 2**30:.3g} GiB); lower K"
        )
    bad = failed(fixed_point)
    if bad is True:  # nothing to expand around: NaN, as every metric of a failed fixed point
        y = jax.tree_util.tree_map(lambda a: jnp.full(jnp.shape(a), jnp.nan), fixed_point.value)
        return RefinedMeanField(y, y, jnp.full((n, n), jnp.nan), fixed_point.model, y if order == 2 else None,
                                sampling)
    if concrete:
        _maps.before_compiling("jsmkt.refined_mean_field",
                               ("refine" if order == 1 else "refine2", _maps.signature(fixed_point.model), sampling))
    refine = _refine if order == 1 else _refine2
    out = refine(fixed_point.model, fixed_point.value, sampling == "with_replacement")
    out = dataclasses.replace(out, sampling=sampling)
    if bad is not False:  # traced: a failed entry's expansion is NaN (the model's own leaves stay as they are)
        value, correction, covariance, correction2 = nan_where(
            bad, (out.value, out.correction, out.covariance, out.correction2))
        out = RefinedMeanField(value, correction, covariance, out.model, correction2, sampling)
    if concrete and not all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree_util.tree_leaves(out)):
        raise ValueError(
            "the refined mean field is not finite: the Jacobian of the drift at the fixed point is not stable "
            "(some eigenvalue has a non-negative real part), so the 1/N expansion does not exist"
        )
    return out


@fast_jit
def _refine(model: AbstractSupermarketModel, y: PyTree[Array], replace: bool) -> RefinedMeanField:
    flat, unravel = ravel_pytree(y)
    # Time in units of 1/model.rate_scale(): W and V do not depend on the unit of time, and rates of 1e-160 or
    # 1e160 would otherwise under- or overflow in the products below (A W, the Hessian contracted with W).
    scale = model.rate_scale()
    f = lambda z: ravel_pytree(model.vector_field(None, unravel(z)))[0] / scale  # noqa: E731
    A = jax.jacfwd(f)(flat)
    Q = _jump_covariance(model, y) / scale
    mod = None
    if isinstance(model, AbstractDescribedModel):
        desc = model.description()
        mod = check_modulation(desc)
    if mod is not None:  # a modulating phase: its noise and its bias (`jsmkt._refined_terms.modulation_noise`)
        x = model.occupancy(y)
        reduce_flat = lambda v: ravel_pytree(model.reduce(v))[0]  # noqa: E731
        Phi, sigma, kappa = modulation_noise(desc, x)
        P = jax.vmap(reduce_flat)(Phi)  # (S, n)
        Q = Q + P.T @ sigma @ P / scale
        dPhi = jax.vmap(lambda v: jax.jvp(lambda z: modulated_displacements(desc, z), (x,), (v,))[1])(Phi)
        mod_bias = reduce_flat(jnp.einsum("ab,abc->c", kappa, dPhi)) / scale
    W = lyapunov(A, Q)
    bias = 0.5 * _contract_hessian(f, flat, W)
    if not replace:  # the 1/N term of the finite-N drift itself: d/d(1/N) at 1/N = 0
        f_eps = lambda eps: ravel_pytree(_with_sampling_eps(model, eps).vector_field(None, y))[0] / scale  # noqa: E731
        zero = jnp.zeros((), flat.dtype)
        bias = bias + jax.jvp(f_eps, (zero,), (jnp.ones_like(zero),))[1]
    if isinstance(model, AbstractDescribedModel):
        desc = model.description()
        if any(d.origin is not None for d in desc.dispatches):  # streams that start at a server: see the docstring
            f1 = origin_drift_correction(desc, model.occupancy(y))
            bias = bias + ravel_pytree(model.reduce(f1))[0] / scale
    if mod is not None:
        bias = bias + mod_bias
    V = jnp.linalg.solve(A, -bias)
    return RefinedMeanField(value=y, correction=unravel(V), covariance=W, model=model)


def _check_order2(model: AbstractSupermarketModel, n: int) -> None:
    """Refuse, by name, what `_refine2` does not expand: too large a state, a modulating phase."""
    if _ORDER2_BYTES_PER_N3 * n**3 > _MAX_DENSE_BYTES:
        raise ValueError(
            f"order=2: the reduced state has {n} entries (K={model.K}); the 1/N^2 term's n x n x n arrays need about "
            f"{_ORDER2_BYTES_PER_N3 * n**3 / 2**30:.3g} GiB (limit {_MAX_DENSE_BYTES / 2**30:.3g} GiB); lower K or "
            "use order=1"
        )
    if isinstance(model, AbstractDescribedModel):
        desc = model.description()
        if check_modulation(desc) is not None:
            raise ValueError(f"order=2 is not available for {type(model).__name__}: its modulating phase's 1/N^2 "
                             "terms are not derived; use order=1")


def _contract_third(fn: Callable, z: Float[Array, " n"], M: Float[Array, "n n n"]) -> Array:
    r"""$D^3 f(z) : M = \sum_{klm} M_{klm}\,\partial_k\partial_l\partial_m f(z)$, as $\sum_k \partial_k\,
    [D^2 f(z) : M_{k\cdot\cdot}]$: $n^2$ nested forward-mode products."""
    eye = jnp.eye(z.shape[0], dtype=z.dtype)

    def slab(Mk, e):
        return jax.jvp(lambda u: _contract_hessian(fn, u, Mk), (z,), (e,))[1]

    return jnp.sum(jax.vmap(slab, in_axes=(0, 1), out_axes=-1)(M, eye), axis=-1)


@fast_jit
def _refine2(model: AbstractSupermarketModel, y: PyTree[Array], replace: bool) -> RefinedMeanField:
    r"""The expansion to order $1/N^2$ (Gast, Bortolussi & Tribastone, *Size expansions of mean field
    approximation: transient and steady-state analysis*, 2019), by the moment equations of the $N$-server chain.

    With $e = Y^N - y^*$, the finite-N drift $f + f_1/N + f_2/N^2$ ($f_1, f_2$: sampling without replacement,
    the $\varepsilon$-derivatives of the drift with $\varepsilon = 1/N$; and streams that start at a server, whose
    chooser sees the occupancy after the origin's move, `jsmkt._refined_terms.origin_shifted_moments`), the jump
    moments $Q + Q_1/N$ and $T$
    ($T = \sum \beta\,\ell^{\otimes 3}$), and the stationarity of $E[e]$, $E[e^{\otimes 2}]$ and
    $E[e^{\otimes 3}]$ under the generator, write $E[e] = V/N + A/N^2$, $E[ee^\top] = W/N + W_2/N^2$,
    $E[e^{\otimes 3}] = M/N^2$ and $E[e^{\otimes 4}] = 3\,\mathrm{sym}(W\otimes W)/N^2$ (Gaussian at leading
    order), all to the order written. With $J = Df(y^*)$, $g(z) = D^2 f(z) : W$, $B = Dg(y^*)$ and $w_a$ the
    columns of $W$:

    $$J W + W J^\top + Q = 0, \qquad J V + \tfrac12 g + f_1 = 0,$$

    $$\textstyle\sum_l (J_{il}M_{ljk} + J_{jl}M_{ilk} + J_{kl}M_{ijl}) + P_{ijk} + P_{ikj} + P_{jki} + T_{ijk} = 0,
    \quad P_{abc} = \tfrac12 W_{ab}\,g_c + D^2 f_c[w_a, w_b] + W_{ab} f_{1,c} + V_c Q_{ab} + DQ_{ab}[w_c],$$

    $$J W_2 + W_2 J^\top + H + H^\top + DQ[V] + \tfrac12 D^2Q : W + Q_1 = 0,
    \quad H_{ij} = \tfrac12 D^2 f_j : M_{i\cdot\cdot} + \tfrac12 (W B^\top)_{ij} + V_i f_{1,j} + (W Df_1^\top)_{ij},$$

    $$J A + \tfrac12 D^2 f : W_2 + \tfrac16 D^3 f : M + \tfrac18 D^2 g : W + Df_1\,V + \tfrac12 D^2 f_1 : W + f_2
    = 0.$$

    ($\tfrac18 D^2g : W$ is $\tfrac1{24} D^4 f : E[e^{\otimes 4}]$; $\tfrac12 W B^\top$ is
    $\tfrac16 D^3 f_j : E[e_i e^{\otimes 3}]$.) The Hessian of $f$ is one $n^3$ array; third and fourth
    derivatives enter only contracted ($D^3 f : M$, $D^2 g : W$, $B$), by nested forward-mode products; no array
    has $n^4$ entries. $M$ solves a three-way Lyapunov equation (`jsmkt._refined_terms.tensor_lyapunov3`).
    Time in units of `rate_scale()`, as in `_refine` (every equation is homogeneous in the rates)."""
    flat, unravel = ravel_pytree(y)
    scale = model.rate_scale()
    zero = jnp.zeros((), flat.dtype)
    one = jnp.ones((), flat.dtype)

    desc = model.description() if isinstance(model, AbstractDescribedModel) else None
    has_origin = desc is not None and any(d.origin is not None for d in desc.dispatches)
    x = model.occupancy(y)
    Rm = jax.jacfwd(lambda v: ravel_pytree(model.reduce(v))[0])(x)

    def sampled(eps):
        return model if replace else _with_sampling_eps(model, eps)

    def origin_shift(z, eps):  # the origins' chooser after the origin's move, minus its mean-field value
        m, xz = sampled(eps), model.occupancy(unravel(z))
        f_e, q_e = origin_shifted_moments(m, xz, Rm, eps)
        f_0, q_0 = origin_shifted_moments(m, xz, Rm, jnp.zeros_like(eps))
        return (f_e - f_0) / scale, (q_e - q_0) / scale

    def f_eps(z, eps):
        out = ravel_pytree(sampled(eps).vector_field(None, unravel(z)))[0] / scale
        return out + origin_shift(z, eps)[0] if has_origin else out

    def Q_eps(z, eps):
        out = _jump_covariance(sampled(eps), unravel(z)) / scale
        return out + origin_shift(z, eps)[1] if has_origin else out

    f = lambda z: f_eps(z, zero)  # noqa: E731
    Qf = lambda z: Q_eps(z, zero)  # noqa: E731
    J = jax.jacfwd(f)(flat)
    Q = Qf(flat)
    W = lyapunov(J, Q)
    g = lambda z: _contract_hessian(f, z, W)  # noqa: E731
    g0 = g(flat)
    n = flat.size
    exact = replace and not has_origin  # the finite-N rates are N times the mean-field ones
    if exact:
        f1 = lambda z: jnp.zeros_like(z)  # noqa: E731
        f2 = Q1 = 0.0
    else:
        f1 = lambda z: jax.jvp(lambda e: f_eps(z, e), (zero,), (one,))[1]  # noqa: E731
        f2 = 0.5 * jax.jvp(lambda e: jax.jvp(lambda u: f_eps(flat, u), (e,), (one,))[1], (zero,), (one,))[1]
        Q1 = jax.jvp(lambda e: Q_eps(flat, e), (zero,), (one,))[1]
    f10 = f1(flat)
    V = jnp.linalg.solve(J, -(0.5 * g0 + f10))

    T = third_jump_moment(model.transitions(x), x, Rm) / scale
    Hf = jax.jacfwd(jax.jacfwd(f))(flat)  # (n, n, n): Hf[c, k, l] = d_k d_l f_c
    DQ = jax.vmap(lambda w: jax.jvp(Qf, (flat,), (w,))[1])(W)  # DQ[c] = DQ[w_c]
    P = (W[:, :, None] * (0.5 * g0 + f10)[None, None, :] + jnp.einsum("ckl,ka,lb->abc", Hf, W, W)
         + Q[:, :, None] * V[None, None, :] + jnp.einsum("cab->abc", DQ))
    R = P + jnp.einsum("ikj->ijk", P) + jnp.einsum("jki->ijk", P) + T
    M = tensor_lyapunov3(J, R)

    B = jax.jacfwd(g)(flat)
    Df1 = jnp.zeros((n, n), flat.dtype) if exact else jax.jacfwd(f1)(flat)
    H = 0.5 * jnp.einsum("jkl,ikl->ij", Hf, M) + 0.5 * W @ B.T + jnp.outer(V, f10) + W @ Df1.T
    DQV = jax.jvp(Qf, (flat,), (V,))[1]
    S = H + H.T + DQV + 0.5 * _contract_hessian(Qf, flat, W) + Q1
    W2 = lyapunov(J, S)

    rhs = (0.5 * jnp.einsum("ckl,kl->c", Hf, W2) + _contract_third(f, flat, M) / 6.0
           + _contract_hessian(g, flat, W) / 8.0 + f2)
    if not exact:
        rhs = rhs + Df1 @ V + 0.5 * _contract_hessian(f1, flat, W)
    A2 = jnp.linalg.solve(J, -rhs)
    return RefinedMeanField(value=y, correction=unravel(V), covariance=W, model=model, correction2=unravel(A2))


class RefinedTrajectory(eqx.Module):
    r"""The transient refined mean field from a deterministic start: $E[Y^N(t)] = y(t) + V(t)/N + o(1/N)$ and
    $N\,\mathrm{Cov}(Y^N(t)) \to W(t)$ (`jsmkt.refined_transient`).

    **Attributes:**

    - `ts`: the save times, shape `(T,)`.
    - `value`: $y(t)$, the mean-field trajectory (reduced state, leading time axis).
    - `correction`: $V(t)$, the $1/N$ coefficient of the mean, shaped like `value`.
    - `covariance`: $W(t)$ on the flattened reduced state, shape `(T, n, n)`.
    - `model`: the model.
    """

    ts: Array
    value: PyTree[Array]
    correction: PyTree[Array]
    covariance: Array
    model: AbstractSupermarketModel

    def state(self, n_servers) -> PyTree[Array]:
        """$y(t) + V(t)/N$ at every save time: the expected reduced state with `n_servers` servers, to order
        $1/N$."""
        n = _check_n(n_servers)
        return jax.tree_util.tree_map(lambda a, b: a + b / n, self.value, self.correction)


def refined_transient(
    model: AbstractSupermarketModel,
    t1: float,
    x0: PyTree[Array] | None = None,
    *,
    ts: ArrayLike | None = None,
    sampling: str = "with_replacement",
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
) -> RefinedTrajectory:
    r"""The $1/N$ expansion of the transient of the $N$-server system started at the reduced state `x0` (every
    server's state given, so $V(0) = 0$ and $W(0) = 0$; default: the empty system), along the mean-field
    trajectory $y(t)$ (Gast, Bortolussi & Tribastone 2019, transient regime):

    $$\dot y = f(y),\qquad \dot V = Df(y)\,V + \tfrac12 D^2 f(y) : W + f_1(y),\qquad
    \dot W = Df(y)\,W + W\,Df(y)^\top + Q(y),$$

    with $Q$ the jump covariance and $f_1$ the $1/N$ term of the finite-N drift (as in `refined_mean_field`: sampling
    without replacement, streams that start at a server). As $t \to \infty$, $V(t)$ and $W(t)$ tend to the
    steady-state `correction` and `covariance` of `refined_mean_field`.

    **Arguments:** `model`, `t1`, `x0` and `ts` as in `jsmkt.integrate` (default `ts`: `t1` only); `sampling` as in
    `refined_mean_field`; `rtol`, `atol`, `max_steps` for the step-size controller of the explicit solver
    (`diffrax.Tsit5`: the augmented state has $n^2 + 2n$ entries, too many for an implicit solver's Jacobian).

    **Returns:** a `RefinedTrajectory`. Not available for a modulating phase (refused by name)."""
    from ._integrate import _real, _state_arg

    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if sampling not in ("with_replacement", "without_replacement"):
        raise ValueError(f"sampling={sampling!r} must be 'with_replacement' or 'without_replacement'")
    t1 = _real("t1", t1, "time")
    rtol, atol = _real("rtol", rtol), _real("atol", atol)
    x0 = _state_arg(x0)
    if x0 is not None:
        model.check_state(x0)
    model.check_values()
    if isinstance(model, AbstractDescribedModel) and check_modulation(model.description()) is not None:
        raise ValueError(f"refined_transient is not available for {type(model).__name__}: its modulating phase's "
                         "transient 1/N terms are not derived")
    ts = jnp.asarray([t1] if ts is None else ts, dtype=float)
    tc = np.asarray(ts)
    if ts.ndim != 1 or not (np.all(np.isfinite(tc)) and np.all(np.diff(tc) >= 0) and tc[0] >= 0 and tc[-1] <= t1):
        raise ValueError(f"ts={tc.tolist()!r} must be a 1-d array of finite, non-decreasing times in [0, t1={t1:g}]")
    y0 = model.initial_state() if x0 is None else x0
    n = sum(int(np.size(a)) for a in jax.tree_util.tree_leaves(y0))
    if 32 * n * n > _MAX_DENSE_BYTES:
        raise ValueError(f"the reduced state has {n} entries (K={model.K}): W(t) needs dense n x n matrices; lower K")
    out = _refined_transient(model, y0, t1, ts, sampling == "with_replacement", rtol, atol, int(max_steps))
    if not all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree_util.tree_leaves((out.value, out.covariance))):
        raise RuntimeError(f"jsmkt.refined_transient: the integration failed (t1={t1:g}, max_steps={max_steps})")
    return out


@eqx.filter_jit
def _refined_transient(model, y0, t1, ts, replace, rtol, atol, max_steps):
    import diffrax as dfx

    flat0, unravel = ravel_pytree(y0)
    n = flat0.size
    f = lambda z: ravel_pytree(model.vector_field(None, unravel(z)))[0]  # noqa: E731
    desc = model.description() if isinstance(model, AbstractDescribedModel) else None
    has_origin = desc is not None and any(d.origin is not None for d in desc.dispatches)

    def f1(z):
        out = jnp.zeros_like(z)
        if not replace:
            def f_eps(eps):
                return ravel_pytree(_with_sampling_eps(model, eps).vector_field(None, unravel(z)))[0]

            zero = jnp.zeros((), z.dtype)
            out = out + jax.jvp(f_eps, (zero,), (jnp.ones_like(zero),))[1]
        if has_origin:
            yz = unravel(z)
            out = out + ravel_pytree(model.reduce(origin_drift_correction(desc, model.occupancy(yz))))[0]
        return out

    def rhs(t, state, args):
        z, V, W = state
        fz, JV = jax.jvp(f, (z,), (V,))
        JW = jax.vmap(lambda w: jax.jvp(f, (z,), (w,))[1], in_axes=1, out_axes=1)(W)
        dW = JW + JW.T + _jump_covariance(model, unravel(z))
        dV = JV + 0.5 * _contract_hessian(f, z, W) + f1(z)
        return fz, dV, 0.5 * (dW + dW.T)

    state0 = (flat0, jnp.zeros(n, flat0.dtype), jnp.zeros((n, n), flat0.dtype))
    sol = dfx.diffeqsolve(
        dfx.ODETerm(rhs), dfx.Tsit5(), t0=0.0, t1=t1, dt0=None, y0=state0, saveat=dfx.SaveAt(ts=ts),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol), max_steps=max_steps, throw=False,
    )
    z, V, W = sol.ys
    bad = sol.result != dfx.RESULTS.successful
    z, V, W = (jnp.where(bad, jnp.nan, a) for a in (z, V, W))
    return RefinedTrajectory(ts=ts, value=jax.vmap(unravel)(z), correction=jax.vmap(unravel)(V), covariance=W,
                             model=model)
