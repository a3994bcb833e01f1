r"""Existence, uniqueness, local stability and convergence of a mean-field model's fixed point.

- `stability(model, fixed_point)`: the Jacobian $J$ of the drift at the fixed point, in the reduced coordinates
  (conservation of mass eliminated, so a stable fixed point has no zero eigenvalue), by `jax.jacfwd` of
  `model.vector_field` on the flattened reduced state, as `jsmkt._models.structure` detects the Jacobian's structure;
  its spectrum, the spectral abscissa $\alpha(J) = \max_i \mathrm{Re}\,\lambda_i$, the relaxation time $-1/\alpha$
  and a verdict.
- `find_fixed_points(model, n_starts, key=...)`: many starts, each integrated to a steady state and polished by
  Newton, and solved by Newton directly (which finds unstable fixed points too); the distinct fixed points found,
  each with its stability.
- `convergence(model, t1)`: the distance to the fixed point along the transient from the empty system, the fitted
  exponential rate beside the spectral abscissa, and the check of the monotone bound $S_k(t) \le S_k^*$.

The eigenvalues of the nonsymmetric Jacobian are computed on the host CPU with LAPACK (`scipy.linalg.eig`, left
and right eigenvectors): JAX's `jnp.linalg.eig` runs on CPUs only, so a GPU's Jacobian is copied to the host. The
sweep metric `spectral_abscissa` (`abscissa_metric`) does the same through `jax.pure_callback`.
"""

import math
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from ._errors import is_concrete
from ._models.base import AbstractSupermarketModel
from ._solution import RESULTS, FixedPoint


_EPS = float(np.finfo(np.float64).eps)
_ROUNDING_FACTOR = 16.0  # the backward error of LAPACK's QR algorithm, in units of n * eps * max(||J||_F, rate scale)
_CLUSTER_TOL = 1e-8  # fixed points closer than this (max-norm, reduced coordinates) are one
_STATE_TOL = 1e-9  # an occupancy entry below -_STATE_TOL (or a total off 1 by more) is outside the state space


class Stability(NamedTuple):
    r"""The linear stability of a fixed point (`jsmkt.stability`).

    **Attributes:**

    - `fixed_point`: the reduced state at which the Jacobian was taken.
    - `jacobian`: $J = \partial f / \partial y$ of the drift $f$ on the flattened reduced state, shape `(n, n)`
      (NumPy).
    - `eigenvalues`: its `n` eigenvalues (complex NumPy array), by decreasing real part.
    - `spectral_abscissa`: $\alpha = \max_i \mathrm{Re}\,\lambda_i$, the asymptotic exponential rate of the
      linearised drift ($\|y(t) - y^*\| \sim e^{\alpha t}$).
    - `relaxation_time`: $-1/\alpha$ when the verdict is `stable`, else `inf`.
    - `verdict`: `"stable"` ($\alpha < -\tau$), `"unstable"` ($\alpha > \tau$) or `"inconclusive"`
      ($|\alpha| \le \tau$).
    - `tolerance`: $\tau$, the uncertainty of $\alpha$ (see `jsmkt.stability`).
    - `margin`: $|\alpha| / \tau$: the verdict is decided when it exceeds 1.
    - `condition`: the condition number $\kappa = \|w\|\|v\| / |w^H v|$ of the eigenvalue with the largest real
      part ($v$, $w$ its right and left eigenvectors).
    - `residual`: the max-norm of the drift at `fixed_point`.
    """

    fixed_point: Any
    jacobian: np.ndarray
    eigenvalues: np.ndarray
    spectral_abscissa: float
    relaxation_time: float
    verdict: str
    tolerance: float
    margin: float
    condition: float
    residual: float

    def __repr__(self) -> str:
        return (f"Stability({self.verdict}: spectral_abscissa={self.spectral_abscissa:.6g}, relaxation_time="
                f"{self.relaxation_time:.6g}, tolerance={self.tolerance:.3g}, margin={self.margin:.3g}, "
                f"n={len(self.eigenvalues)})")


@eqx.filter_jit
def _jacobian(model, y):
    """`(J, f(y))`: the Jacobian of `model.vector_field` on the flattened reduced state at `y`, and the drift."""
    flat, unravel = ravel_pytree(y)
    f = lambda u: ravel_pytree(model.vector_field(0.0, unravel(u), None))[0]  # noqa: E731
    return jax.jacfwd(f)(flat), f(flat)


def _state(model, fixed_point, name: str = "fixed_point"):
    """The reduced state of `fixed_point` (a `FixedPoint`, or a state), checked."""
    if isinstance(fixed_point, FixedPoint):
        if bool(np.any(np.asarray(fixed_point.result._value) != np.asarray(RESULTS.successful._value))):
            raise ValueError(f"{name} is a failed solve ({RESULTS[fixed_point.result]}): solve the fixed point "
                             "first (jsmkt.solve_fixed_point with throw=True says what failed)")
        fixed_point = fixed_point.value
    if isinstance(fixed_point, (list, tuple)):
        fixed_point = jnp.asarray(fixed_point, dtype=float)
    model.check_state(fixed_point, name, values=False)
    if not is_concrete(fixed_point):
        raise ValueError(f"{name} is traced: jsmkt.stability works outside jit/vmap (its eigenvalues are computed "
                         "on the host); use the sweep metric 'spectral_abscissa' inside a sweep")
    if not all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree_util.tree_leaves(fixed_point)):
        raise ValueError(f"{name} has non-finite entries (a failed solve?); give a fixed point")
    return fixed_point


def _spectrum(J: np.ndarray):
    """Eigenvalues (by decreasing real part) and the condition number of the first, by LAPACK on the host."""
    import scipy.linalg

    if J.shape[0] == 0:
        return np.zeros(0, complex), 1.0
    w, vl, vr = scipy.linalg.eig(J, left=True, right=True)
    order = np.lexsort((-w.imag, -w.real))
    w, vl, vr = w[order], vl[:, order], vr[:, order]
    v, u = vr[:, 0], vl[:, 0]
    overlap = abs(np.vdot(u, v))
    cond = float(np.linalg.norm(u) * np.linalg.norm(v) / overlap) if overlap > 0 else math.inf
    return w, cond


def stability(model: AbstractSupermarketModel, fixed_point: FixedPoint | PyTree[Array] | None = None) -> Stability:
    r"""The local stability of a fixed point of `model`'s mean-field ODE.

    **Arguments:**

    - `model`: any jsmkt model, the papers' ODEs as published (`jsmkt.published`) included.
    - `fixed_point`: a `jsmkt.FixedPoint` or a reduced state; `jsmkt.solve_fixed_point(model)` by default.

    The Jacobian $J$ of `model.vector_field` is taken by `jax.jacfwd` on the flattened reduced state (tails, in
    which conservation of mass is eliminated: a fixed point of the full occupancy has a zero eigenvalue for the
    conserved total, which the reduced coordinates do not have). Its eigenvalues are computed on the host CPU by
    LAPACK's nonsymmetric QR algorithm (`scipy.linalg.eig`; JAX's `jnp.linalg.eig` is CPU-only, so the Jacobian
    is copied to the host wherever it was computed), with the left and right eigenvectors of the eigenvalue of
    largest real part, whose condition number $\kappa = \|w\|\|v\|/|w^H v|$ bounds how far rounding can move it.

    **The verdict.** The spectral abscissa $\alpha$ is known to within
    $\tau = \kappa\,(16\,n\,\varepsilon\,\max(\|J\|_F, r) + \|f(y)\|_\infty)$: the first term is the backward error
    of the QR algorithm ($\varepsilon$ the float64 unit roundoff, $n$ the number of unknowns; $r$ =
    `model.rate_scale()`, the model's unit of rates, so that a zero Jacobian still has a tolerance) turned into an
    error of the eigenvalue by its condition number; the second, the residual of the drift at the given point, is
    how far the Jacobian's point is from a true fixed point (a fixed point solved to rounding has a residual near
    $\varepsilon$; at a point that is no fixed point the verdict is that of the linearisation there). The verdict is `stable` when $\alpha < -\tau$, `unstable` when $\alpha > \tau$, and
    `inconclusive` otherwise (a zero eigenvalue to working accuracy: a bifurcation point, a conservation law left
    in the state, or an eigenvalue too ill-conditioned to place). `margin` is $|\alpha|/\tau$. The verdict is
    that of the linearisation: for a hyperbolic fixed point (no eigenvalue on the imaginary axis) it decides
    local asymptotic stability (Hartman–Grobman); it says nothing of the basin, which `jsmkt.find_fixed_points`
    and `jsmkt.convergence` probe.

    **Returns:** a `jsmkt.Stability` (`jacobian`, `eigenvalues`, `spectral_abscissa`, `relaxation_time`,
    `verdict`, `tolerance`, `margin`, `condition`, `residual`).

    **Raises:** `ValueError` for a model that is not a jsmkt model, a failed or non-finite fixed point, or one of
    the wrong shape.

    !!! example

        ```python
        model = jsmkt.JSQd(0.9, d=2, K=20)
        st = jsmkt.stability(model)
        st.verdict, st.spectral_abscissa, st.relaxation_time
        ```
    """
    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if fixed_point is None:
        from ._fixed_point import solve_fixed_point

        fixed_point = solve_fixed_point(model)
        model = fixed_point.model
    y = _state(model, fixed_point)
    J, f = _jacobian(model, y)
    J, f = np.asarray(J, dtype=float), np.asarray(f, dtype=float)
    if not np.all(np.isfinite(J)):
        raise ValueError("the Jacobian of the drift at fixed_point has non-finite entries; check the model's "
                         "parameters and the point")
    eigenvalues, cond = _spectrum(J)
    n = J.shape[0]
    abscissa = float(eigenvalues[0].real) if n else -math.inf
    residual = float(np.max(np.abs(f), initial=0.0))
    scale = max(float(np.linalg.norm(J)), float(model.rate_scale()))
    tol = cond * (_ROUNDING_FACTOR * n * _EPS * scale + residual)
    verdict = "stable" if abscissa < -tol else "unstable" if abscissa > tol else "inconclusive"
    return Stability(
        fixed_point=y, jacobian=J, eigenvalues=eigenvalues, spectral_abscissa=abscissa,
        relaxation_time=-1.0 / abscissa if verdict == "stable" else math.inf, verdict=verdict, tolerance=tol,
        margin=abs(abscissa) / tol if tol > 0 else math.inf, condition=cond, residual=residual,
    )


# --- the sweep metric ------------------------------------------------------------------------------------------------


def _host_abscissa(J: np.ndarray):
    """`(alpha, w, v)` for each Jacobian of a batch `(..., n, n)`: the spectral abscissa and the left and right
    eigenvectors of the eigenvalue of largest real part, scaled so that `w^H v = 1` (NaN for a non-finite
    Jacobian)."""
    import scipy.linalg

    J = np.asarray(J, dtype=float)
    batch, n = J.shape[:-2], J.shape[-1]
    flat = J.reshape((-1, n, n))
    alpha = np.full(flat.shape[0], np.nan)
    W = np.full((flat.shape[0], n), np.nan + 0j)
    V = np.full((flat.shape[0], n), np.nan + 0j)
    for i, Ji in enumerate(flat):
        if not np.all(np.isfinite(Ji)):
            continue
        lam, vl, vr = scipy.linalg.eig(Ji, left=True, right=True)
        j = int(np.lexsort((-lam.imag, -lam.real))[0])
        v, w = vr[:, j], vl[:, j]
        overlap = np.vdot(w, v)
        alpha[i] = lam[j].real
        if overlap != 0:
            W[i], V[i] = w / np.conj(overlap), v
    return alpha.reshape(batch), W.reshape(batch + (n,)), V.reshape(batch + (n,))


def _callback(J):
    n = J.shape[-1]
    shapes = (jax.ShapeDtypeStruct(J.shape[:-2], jnp.float64),
              jax.ShapeDtypeStruct(J.shape[:-2] + (n,), jnp.complex128),
              jax.ShapeDtypeStruct(J.shape[:-2] + (n,), jnp.complex128))
    return jax.pure_callback(_host_abscissa, shapes, J, vmap_method="broadcast_all")


@jax.custom_jvp
def spectral_abscissa_of(J: Array) -> Array:
    r"""$\max_i \mathrm{Re}\,\lambda_i(J)$ of a square matrix, traceable: the eigenvalues by LAPACK on the host
    (`jax.pure_callback`; under `vmap` the batch goes to the host in one call). Its derivative is that of a
    simple eigenvalue, $\dot\alpha = \mathrm{Re}(w^H \dot J v)$ with $w^H v = 1$ (not defined where the
    eigenvalue of largest real part is multiple, or where two eigenvalues tie for it)."""
    return _callback(J)[0]


@spectral_abscissa_of.defjvp
def _spectral_abscissa_jvp(primals, tangents):
    (J,), (dJ,) = primals, tangents
    alpha, w, v = _callback(J)
    dJ = jnp.asarray(dJ).astype(jnp.complex128)
    dalpha = jnp.real(jnp.einsum("...i,...ij,...j->...", jnp.conj(w), dJ, v))
    return alpha, dalpha


def abscissa_metric(model: AbstractSupermarketModel, fixed_point) -> Array:
    """The sweep metric `spectral_abscissa`: the spectral abscissa of the Jacobian of the drift at
    `fixed_point` (a `FixedPoint`, or a reduced state), traceable under `jit`, `vmap` and forward-mode
    derivatives (`spectral_abscissa_of`: the eigenvalues are computed on the host CPU)."""
    y = fixed_point.value if isinstance(fixed_point, FixedPoint) else fixed_point
    flat, unravel = ravel_pytree(y)
    f = lambda u: ravel_pytree(model.vector_field(0.0, unravel(u), None))[0]  # noqa: E731
    return spectral_abscissa_of(jax.jacfwd(f)(flat))


# --- the search for fixed points ---------------------------------------------------------------------------------------


class FoundFixedPoint(NamedTuple):
    """One distinct fixed point found by `jsmkt.find_fixed_points`.

    - `value`: its reduced state (the Newton solve of the first start that reached it);
    - `stability`: its `jsmkt.Stability`;
    - `tails`: $s_0..s_K$ (NumPy);
    - `hits`: how many solves reached it, `by_ode` of them through the ODE's steady state (then Newton) and
      `by_newton` by Newton from the raw start;
    - `min_occupancy`: the smallest entry of its occupancy vector (`model.occupancy`), negative for a root of the
      drift outside the state space."""

    value: Any
    stability: Stability
    tails: np.ndarray
    hits: int
    by_ode: int
    by_newton: int
    min_occupancy: float


class FixedPointSearch(NamedTuple):
    """What `jsmkt.find_fixed_points` found.

    - `fixed_points`: the distinct fixed points inside the state space, clustered to 1e-8 (max-norm), by
      increasing mean queue length (sum of the tails);
    - `n_starts`: starts tried (random ones, the empty and the full system), each by both routes;
    - `outside`: the distinct roots of the drift outside the state space (an occupancy below -1e-9, or one
      that does not sum to 1), which are not states of the model: spurious roots of the truncated polynomial
      system, or the fixed point of published equations whose solution is no distribution (`min_occupancy` says
      by how much);
    - `n_failed`: solves that reached no root (no convergence, or a truncation too small)."""

    fixed_points: tuple[FoundFixedPoint, ...]
    outside: tuple[FoundFixedPoint, ...]
    n_starts: int
    n_failed: int

    @property
    def n_fixed_points(self) -> int:
        """The number of distinct fixed points found inside the state space."""
        return len(self.fixed_points)


def _levels_of_cells(model) -> np.ndarray:
    return np.asarray([label[0] for label in model.state_space()], dtype=int)


def random_starts(model: AbstractSupermarketModel, n: int, key) -> list:
    """`n` random reduced states (occupancies drawn uniformly from the simplex of cells, Dirichlet(1), mapped by
    `model.reduce`), then the empty system (`model.initial_state()`) and the full one (every server at level `K`,
    spread evenly over the cells of that level)."""
    levels = _levels_of_cells(model)
    c = levels.shape[0]
    x = np.asarray(jax.random.dirichlet(key, jnp.ones(c), (n,)))
    full = (levels == levels.max()).astype(float)
    x = np.concatenate([x, full[None] / full.sum()])
    ys = _reduce_all(model, jnp.asarray(x))
    return [model.initial_state()] + [jax.tree_util.tree_map(lambda a, i=i: a[i], ys) for i in range(n + 1)]


@eqx.filter_jit
def _reduce_all(model, x):
    return jax.vmap(model.reduce)(x)


@eqx.filter_jit
def _occupancy_all(model, y):
    return jax.vmap(model.occupancy)(y)


@eqx.filter_jit
def _ode_route(model, starts, max_steps: int):
    """Route (a) before Newton: each start integrated to a steady state (`jsmkt.steady_state`, vmapped)."""
    from ._integrate import steady_state

    return jax.vmap(lambda y: steady_state(model, y, rtol=1e-8, atol=1e-10, max_steps=max_steps, throw=False)[0])(
        starts)


@eqx.filter_jit
def _newton_route(model, starts, tail_tol):
    """Newton (`jsmkt.solve_fixed_point`, vmapped, `throw=False`) from each start: `(values, result codes)`."""
    from ._fixed_point import solve_fixed_point

    fp = jax.vmap(lambda y: solve_fixed_point(model, y, throw=False, tail_tol=tail_tol))(starts)
    return fp.value, fp.result._value


def _stack(states):
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *states)


def find_fixed_points(
    model: AbstractSupermarketModel,
    n_starts: int = 32,
    *,
    key,
    tail_tol: float | None = None,
    max_steps: int = 20_000,
    cluster_tol: float = _CLUSTER_TOL,
) -> FixedPointSearch:
    r"""Search the state space of `model` for its fixed points, so that non-uniqueness is detected, not assumed.

    **Arguments:**

    - `model`: any jsmkt model (the papers' ODEs as published included).
    - `n_starts`: random starts: occupancies drawn uniformly from the simplex of the model's cells (Dirichlet(1)),
      mapped to reduced coordinates by `model.reduce`; the empty and the full system (every server at level `K`)
      are added.
    - `key`: a `jax.random` key.
    - `tail_tol`: the largest fraction of servers at `K` a fixed point may have (`solve_fixed_point`'s default when
      None); a solve beyond it counts as failed.
    - `max_steps`: the ODE solver's step limit per start.
    - `cluster_tol`: fixed points closer than this (max-norm, reduced coordinates) are one.

    Each start is solved by two routes, both `jax.vmap`-ed over the starts with `throw=False`: (a) integrated by
    Diffrax to a steady state (`jsmkt.steady_state`) and polished by Newton (`jsmkt.solve_fixed_point` from
    there), which finds the attracting fixed points and their basins; (b) Newton from the raw start, which also
    converges to unstable fixed points (saddles, repellers) whose basin of Newton's iteration holds a start.
    There is no deflation: a fixed point is found when some start lies in its basin of Newton's iteration, which
    the random starts make likely for isolated roots, not certain. Converged solves are clustered and returned
    with their `jsmkt.stability`: those inside the state space (every occupancy at least -1e-9, summing to 1) as
    `fixed_points`, the others as `outside`.

    **Returns:** a `jsmkt.FixedPointSearch` (`fixed_points`, `outside`, `n_starts`, `n_failed`).
    """
    from ._fixed_point import solve_fixed_point

    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if isinstance(n_starts, bool) or not isinstance(n_starts, (int, np.integer)) or n_starts < 0:
        raise ValueError(f"n_starts={n_starts!r} must be an integer >= 0 (random starts; the empty and the full "
                         "system are added)")
    if isinstance(cluster_tol, bool) or not (isinstance(cluster_tol, (int, float)) and cluster_tol > 0):
        raise ValueError(f"cluster_tol={cluster_tol!r} must be a positive number")
    try:
        jax.random.key_data(key)
    except (TypeError, ValueError):
        raise ValueError(f"key={key!r} must be a JAX random key, e.g. jax.random.key(0)") from None
    model.check_values()
    if tail_tol is None:
        import inspect

        tail_tol = inspect.signature(solve_fixed_point).parameters["tail_tol"].default
    starts = _stack(random_starts(model, int(n_starts), key))

    ode_ends = _ode_route(model, starts, max_steps)
    # A start whose integration failed (non-finite end) is polished from the start itself instead (its Newton solve
    # is then that of route (b), counted once more).
    finite = jnp.all(jnp.isfinite(jnp.reshape(ode_ends, (ode_ends.shape[0], -1))), axis=1)
    ode_ends = jnp.where(jnp.reshape(finite, (-1,) + (1,) * (ode_ends.ndim - 1)), ode_ends, starts)
    values, codes = _newton_route(model, jnp.concatenate([ode_ends, starts]), tail_tol)
    values, codes = np.asarray(values), np.asarray(codes)
    n_total = starts.shape[0]
    ok = codes == int(RESULTS.successful._value)
    flat = values.reshape(values.shape[0], -1)
    safe = np.where(ok.reshape((-1,) + (1,) * (values.ndim - 1)), values, 0.0)
    occupancy = np.asarray(_occupancy_all(model, jnp.asarray(safe)))
    low = np.min(occupancy, axis=1)
    inside = (low >= -_STATE_TOL) & (np.abs(occupancy.sum(axis=1) - 1.0) <= 1e-8)

    def distinct(members) -> list[FoundFixedPoint]:
        clusters: list[list[int]] = []
        for i in members:
            for cl in clusters:
                if np.max(np.abs(flat[i] - flat[cl[0]])) <= cluster_tol:
                    cl.append(i)
                    break
            else:
                clusters.append([i])
        out = []
        for cl in clusters:
            y = jnp.asarray(values[cl[0]])
            out.append(FoundFixedPoint(
                value=y, stability=stability(model, y), tails=np.asarray(model.tails(y)), hits=len(cl),
                by_ode=int(sum(i < n_total for i in cl)), by_newton=int(sum(i >= n_total for i in cl)),
                min_occupancy=float(low[cl[0]])))
        out.sort(key=lambda p: float(np.sum(p.tails[1:])))
        return out

    return FixedPointSearch(fixed_points=tuple(distinct(np.flatnonzero(ok & inside))),
                            outside=tuple(distinct(np.flatnonzero(ok & ~inside))), n_starts=n_total,
                            n_failed=int(np.sum(~ok)))


# --- convergence ---------------------------------------------------------------------------------------------------------


class Convergence(NamedTuple):
    r"""The transient's approach to the fixed point (`jsmkt.convergence`).

    - `ts`, `distance`: save times and $\max_i |y_i(t) - y_i^*|$ over the reduced state (NumPy);
    - `fitted_rate`: $-$ the slope of a least-squares line through $\log$ `distance` over `fit_window` (times),
      the observed exponential rate;
    - `spectral_abscissa`, `stability`: of the fixed point (`jsmkt.stability`); the asymptotic rate of the
      linearisation is $-\alpha$;
    - `rate_ratio`: `fitted_rate / -spectral_abscissa`;
    - `bound_held`: whether every entry of the reduced state stayed at or below its fixed-point value,
      $S_k(t) \le S_k^* + \delta$ at every saved time ($\delta$ = `bound_tol`), from the empty start;
    - `bound_excess`: the largest $S_k(t) - S_k^*$ (negative or zero when the bound holds), with
      `bound_where` = `(time, flat index, level)` of it;
    - `tails_bound_held`, `tails_excess`: the same for the tails $s_k(t) \le s_k^*$."""

    ts: np.ndarray
    distance: np.ndarray
    fitted_rate: float
    fit_window: tuple[float, float]
    spectral_abscissa: float
    rate_ratio: float
    stability: Stability
    bound_held: bool
    bound_excess: float
    bound_where: tuple[float, int, int]
    bound_tol: float
    tails_bound_held: bool
    tails_excess: float


def fit_rate(ts: np.ndarray, distance: np.ndarray, high: float = 1e-3, low: float = 1e-9) -> tuple[float, tuple]:
    """`(rate, (t_start, t_end))`: the exponential rate of `distance`, the least-squares slope of its logarithm
    over the last stretch of times where it lies in `[low, high]` (past the initial transient, above the
    integration's error), at least 3 points; NaN when there are fewer."""
    ts, distance = np.asarray(ts, float), np.asarray(distance, float)
    inside = (distance <= high) & (distance >= low)
    idx = np.flatnonzero(inside)
    if idx.size < 3:
        return math.nan, (math.nan, math.nan)
    # The last run of consecutive indices inside the window.
    breaks = np.flatnonzero(np.diff(idx) > 1)
    run = idx[breaks[-1] + 1:] if breaks.size else idx
    if run.size < 3:
        return math.nan, (math.nan, math.nan)
    slope = np.polyfit(ts[run], np.log(distance[run]), 1)[0]
    return float(-slope), (float(ts[run[0]]), float(ts[run[-1]]))


def convergence(
    model: AbstractSupermarketModel,
    t1: float,
    *,
    x0: PyTree[Array] | None = None,
    fixed_point: FixedPoint | PyTree[Array] | None = None,
    n_times: int = 400,
    rtol: float = 1e-12,
    atol: float = 1e-15,
    fit_high: float = 1e-3,
    fit_low: float = 1e-9,
    bound_tol: float = 1e-9,
    max_steps: int = 200_000,
) -> Convergence:
    r"""How the mean-field transient of `model` approaches its fixed point.

    **Arguments:**

    - `model`: any jsmkt model; `t1`: the final time.
    - `x0`: the start (default: the empty system, where the monotone bound applies).
    - `fixed_point`: the fixed point approached (`jsmkt.solve_fixed_point(model)` by default).
    - `n_times`: equally spaced save times in `[0, t1]`.
    - `rtol`, `atol`, `max_steps`: `jsmkt.integrate`'s (tight by default: the fit reads the distance down to
      `fit_low`, where the integration's error must be far smaller).
    - `fit_high`, `fit_low`: the band of distances over which the rate is fitted (the last stretch of saved times
      inside it).
    - `bound_tol`: the slack of the monotone-bound check (integration error).

    The distance is the max-norm of $y(t) - y^*$ over the reduced state. Its fitted exponential rate is set
    beside the spectral abscissa $\alpha$ of the Jacobian at $y^*$ (`jsmkt.stability`): near a stable fixed point
    the distance falls like $e^{\alpha t}$, so the two agree when the fitting band is in the asymptotic regime
    (choose `t1` a few tens of relaxation times long). The monotone bound (the PH paper's claim that the fixed
    point bounds the transient from the empty system) is checked entry by entry of the reduced state,
    $S_k(t) \le S_k^*$ (phase by phase where the state holds phase vectors), and on the tails $s_k$; where it fails
    the largest excess and where it occurred are reported.

    **Returns:** a `jsmkt.Convergence`.
    """
    from ._fixed_point import solve_fixed_point
    from ._integrate import integrate

    if not isinstance(model, AbstractSupermarketModel):
        raise ValueError(f"model={model!r} is not a jsmkt model (JSQd, JSQdPH, ...)")
    if isinstance(n_times, bool) or not isinstance(n_times, (int, np.integer)) or n_times < 3:
        raise ValueError(f"n_times={n_times!r} must be an integer >= 3")
    if fixed_point is None:
        fixed_point = solve_fixed_point(model, x0=None)
        model = fixed_point.model
    star = _state(model, fixed_point)
    st = stability(model, star)
    ts = np.linspace(0.0, float(t1), int(n_times))
    traj = integrate(model, t1, x0, ts=ts, rtol=rtol, atol=atol, max_steps=max_steps)
    ys = np.asarray(traj.ys).reshape(len(ts), -1)
    flat_star = np.asarray(ravel_pytree(star)[0])
    diff = ys - flat_star[None, :]
    distance = np.max(np.abs(diff), axis=1)
    rate, window = fit_rate(ts, distance, fit_high, fit_low)
    levels = np.asarray(model.unknown_levels())
    i_t, i_x = np.unravel_index(int(np.argmax(diff)), diff.shape)
    excess = float(diff[i_t, i_x])
    tails = np.asarray(jax.vmap(model.tails)(traj.ys))
    tails_star = np.asarray(model.tails(star))
    tails_excess = float(np.max(tails - tails_star[None, :]))
    return Convergence(
        ts=ts, distance=distance, fitted_rate=rate, fit_window=window, spectral_abscissa=st.spectral_abscissa,
        rate_ratio=rate / -st.spectral_abscissa if st.spectral_abscissa != 0 else math.nan, stability=st,
        bound_held=excess <= bound_tol, bound_excess=excess,
        bound_where=(float(ts[i_t]), int(i_x), int(levels[i_x]) if levels.size == ys.shape[1] else -1),
        bound_tol=bound_tol, tails_bound_held=tails_excess <= bound_tol, tails_excess=tails_excess,
    )
