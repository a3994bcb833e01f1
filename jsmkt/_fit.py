r"""Fitting PH distributions: PH(2) from three moments in closed form, and PH(m) by gradient fits of moments, a
likelihood or a distribution function with the optax loop of `jsmkt._optimise` (fitting is an analysis of the
distributions, in the layer of the optimisation it uses)."""

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from ._distributions.ph import PH


# Relative tolerance under which moments outside the feasible region are treated as rounding error: they are
# projected onto the boundary silently (also when `clip=False`), and moments this close to an exponential's are
# fitted by the exponential itself.
_RTOL = 1e-12
# Case (a.4): the bound m3 = (3/2) m1^3 (1 + c^2)^2 for c^2 > 1 is not attained by any PH, so clipping raises m3
# to (1 + _A4_GAP) times the bound. The fitted fast phase then has mean of order _A4_GAP * m1.
_A4_GAP = 1e-6
_EPS = float(np.finfo(float).eps)


def _moment(name: str, value) -> float:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"{name} is traced (inside jax.jit, jax.grad or jax.vmap), but fit_ph2_three_moments takes concrete "
            "moments only: its case analysis cannot be traced or differentiated; call it outside the transformation "
            "(with plain numbers)"
        )
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r} is boolean; give a real number (a raw moment of a service time)")
    if isinstance(value, (str, bytes, complex)) or np.iscomplexobj(value):  # float() reads "2", drops 0j
        raise ValueError(f"{name}={value!r} is not a real number")
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={value!r} is not a real number") from e
    if not math.isfinite(v) or not v > 0:
        raise ValueError(f"{name}={value!r} must be a finite positive number (a raw moment of a service time)")
    return v


def _fmt(x: float) -> str:
    return f"{x:.12g}"


def _check_moment_sequence(t: np.ndarray) -> None:
    r"""Refuse raw moments $m_k = E[S^k]$, $k = 1..n$, that no distribution on $[0, \infty)$ has: the Stieltjes
    conditions, that the Hankel matrices $[m_{i+j}]$ and $[m_{i+j+1}]$ ($m_0 = 1$) be positive semidefinite. Their
    2 x 2 cases are $E[S^2] \ge E[S]^2$ (a variance is $\ge 0$) and $E[S]E[S^3] \ge E[S^2]^2$ (Cauchy-Schwarz for
    $S^{1/2}$ and $S^{3/2}$); larger ones are checked by their eigenvalues. Moments on the boundary (a point mass,
    which PH distributions approach) pass, as do violations within rounding (relative `_RTOL`)."""
    shown = "[" + ", ".join(_fmt(x) for x in t) + "]"
    n = t.size
    u = t / t[0] ** np.arange(1, n + 1)  # in units of E[S]: u_1 = 1
    if n >= 2 and u[1] < 1.0 - _RTOL:
        raise ValueError(
            f"target={shown} (to='moments'): E[S^2]={_fmt(t[1])} < E[S]^2={_fmt(t[0] ** 2)}, so the variance "
            f"E[S^2] - E[S]^2 = {_fmt(t[1] - t[0] ** 2)} would be negative: no distribution has these moments; need "
            "E[S^2] >= E[S]^2"
        )
    if n >= 3 and u[2] < u[1] ** 2 * (1.0 - _RTOL):
        raise ValueError(
            f"target={shown} (to='moments'): E[S]*E[S^3] = {_fmt(t[0] * t[2])} < E[S^2]^2 = {_fmt(t[1] ** 2)}: no "
            f"distribution on [0, inf) has these moments; need E[S^3] >= E[S^2]^2/E[S] = {_fmt(t[1] ** 2 / t[0])}"
        )
    m = np.concatenate([[1.0], u])
    for size in range(3, n // 2 + 2):
        for shift, name in ((0, "E[S^(i+j)]"), (1, "E[S^(i+j+1)]")):
            if 2 * (size - 1) + shift > n:
                continue
            H = np.array([[m[i + j + shift] for j in range(size)] for i in range(size)])
            w = np.linalg.eigvalsh(H / np.sqrt(np.outer(np.diag(H), np.diag(H))))  # unit diagonal
            if w[0] < -1e-9:
                raise ValueError(
                    f"target={shown} (to='moments'): the {size} x {size} Hankel matrix [{name}], i, j = 0..{size - 1} "
                    "(E[S^0] = 1), is not positive semidefinite, so no distribution on [0, inf) has these moments "
                    "(the Stieltjes conditions)"
                )


def fit_ph2_three_moments(
    m1: float, m2: float, m3: float, *, clip: bool = False
) -> PH | tuple[PH, tuple[float, float, float]]:
    r"""Fit an order-2 acyclic PH distribution to three raw moments (Telek and Heindl).

    The fit is the canonical form $\alpha = (\eta, 1 - \eta)$,
    $T = \begin{pmatrix} -\xi_1 & \xi_1 \\ 0 & -\xi_2 \end{pmatrix}$ with $0 < \xi_1 \le \xi_2$, whose moments are
    exactly $m_1, m_2, m_3$. With $c^2 = m_2/m_1^2 - 1$, a PH(2) exists if and only if

    - $1/2 \le c^2 \le 1$ and $3m_1^3\bigl(3c^2 - 1 + \sqrt2\,(1 - c^2)^{3/2}\bigr) \le m_3 \le 6m_1^3c^2$, or
    - $c^2 > 1$ and $m_3 > \tfrac32 m_1^3(1 + c^2)^2$.

    With $b = 3m_1m_2 - m_3$, $c = 3m_2^2 - 2m_1m_3$, $d = 2m_1^2 - m_2$ and $a = b^2 - 6cd$, the rates
    $\xi_1 \le \xi_2$ are the roots $(b \pm \sqrt a)/c$ of $c\xi^2 - 2b\xi + 6d = 0$ and
    $\eta = (m_1 - 1/\xi_2)\xi_1$ (the paper's cases $c > 0$ and $c < 0$); they are evaluated in a cancellation-free
    form (see the code). Boundary cases:

    - the upper bound $m_3 = 6m_1^3c^2$ gives $\eta = 1$ (two phases in series); the lower bound for $c^2 \le 1$
      gives $\xi_1 = \xi_2$; $c^2 = 1/2$ is the Erlang-2.
    - $c = 0$ inside the region happens only at the exponential ($m_2 = 2m_1^2$, $m_3 = 6m_1^3$), which is returned
      as the order-1 PH with rate $1/m_1$ (the paper's case $c = 0$ leaves $\xi_1$ free). Moments within rounding
      of it (relative $10^{-12}$) are fitted by it too.
    - for $c^2 > 1$ the bound $m_3 = \tfrac32 m_1^3(1+c^2)^2$ is not attained by any PH (it is the limit of a mixture
      of an atom at zero and an exponential), so it is infeasible; `clip=True` raises $m_3$ to $(1 + 10^{-6})$ times
      the bound. The fit is then stiff: its second phase is fast, with mean of order $10^{-6}m_1$ when $c^2$ is not
      close to 1.
    - moments outside the region by at most relative $10^{-12}$ (rounding) are projected onto it silently.

    **Arguments:**

    - `m1`, `m2`, `m3`: the raw moments $E[S]$, $E[S^2]$, $E[S^3]$, finite and positive.
    - `clip`: if `True`, project moments no PH(2) matches onto the feasible region as Telek and Heindl do, and
      return the moments actually matched: (a.1) $c^2 < 1/2$ is raised to $c^2 = 1/2$ (and then $m_3 = 3m_1^3$,
      the Erlang-2); (a.2)/(a.3) for $c^2 \le 1$, $m_3$ is moved to the nearer bound; (a.4) as above.

    **Returns:**

    A [`jsmkt.PH`][] of order 2 (order 1 for the exponential). If `clip=True`, the tuple
    `(ph, (m1, m2_clipped, m3_clipped))` instead, where the clipped moments are those of `ph` (equal to the input
    moments when they were feasible).

    **Raises:**

    `ValueError` if a moment is not a finite positive number, or is traced (the fit takes concrete moments only and
    cannot be used inside `jax.jit`, `jax.grad` or `jax.vmap`), or, when `clip=False`, if no PH(2) has these
    moments; the message gives the feasible range; and when the PH(2) with these moments has rates too far apart
    for float64 (e.g. `m3/m1^3 = 1e150` with `m2/m1^2 = 3`).

    !!! example

        ```python
        S = jsmkt.fit_ph2_three_moments(1.0, 3.0, 15.0)  # c^2 = 2
        S.moments(3)  # [1.0, 3.0, 15.0]
        S, (m1, m2, m3) = jsmkt.fit_ph2_three_moments(1.0, 1.2, 2.0, clip=True)  # Erlang-2
        ```

    ??? cite "References"

        ```bibtex
        @article{telek2002matching,
            title={Matching Moments for Acyclic Discrete and Continuous Phase-Type Distributions of Second Order},
            author={Telek, Mikl{\'o}s and Heindl, Armin},
            journal={International Journal of Simulation: Systems, Science \& Technology},
            volume={3},
            number={3--4},
            pages={47--57},
            year={2002}
        }
        ```
    """
    m1 = _moment("m1", m1)
    m2 = _moment("m2", m2)
    m3 = _moment("m3", m3)
    # Work in units of m1: n2 = m2/m1^2 = 1 + c^2, n3 = m3/m1^3.
    n2 = m2 / (m1 * m1)
    n3 = m3 / (m1 * m1 * m1)
    scv = n2 - 1.0
    changed = False

    def result(ph, n2_fit, n3_fit):
        if not clip:
            return ph
        if changed:
            return ph, (m1, n2_fit * m1 * m1, n3_fit * m1 * m1 * m1)
        return ph, (m1, m2, m3)

    def exponential():
        return PH(jnp.ones(1), jnp.full((1, 1), -1.0 / m1))

    def unrepresentable():
        return ValueError(
            f"m1={m1!r}, m2={m2!r}, m3={m3!r}: a PH(2) with these moments has rates too far apart for float64 "
            f"(m2/m1^2 = {_fmt(n2)}, m3/m1^3 = {_fmt(n3)}); give moments with m2/m1^2 and m3/m1^3 nearer 1"
        )

    # c = 0 inside the region: the exponential.
    if abs(n2 - 2.0) <= 2.0 * _RTOL and abs(n3 - 6.0) <= 6.0 * _RTOL:
        changed = (n2, n3) != (2.0, 6.0)
        return result(exponential(), 2.0, 6.0)

    # (a.1): c^2 >= 1/2 (a few ulps above 1/2 is taken as 1/2, so that the Erlang-2 comes out exactly).
    if n2 < 1.5 * (1.0 + 64 * _EPS):
        if not (n2 >= 1.5 * (1.0 - _RTOL) or clip):
            raise ValueError(
                f"m2={m2!r} gives c^2 = m2/m1^2 - 1 = {_fmt(scv)} < 1/2, but every PH(2) has c^2 >= 1/2 "
                f"(the Erlang-2 attains 1/2); need m2 >= 1.5*m1^2 = {_fmt(1.5 * m1 * m1)}; "
                "pass clip=True to project onto it"
            )
        n2, scv, changed = 1.5, 0.5, changed or n2 != 1.5

    # Moment bounds, in units of m1^3.
    if n2 <= 2.0:
        lower = 3.0 * (3.0 * scv - 1.0 + math.sqrt(2.0) * (1.0 - scv) ** 1.5)
        upper = 6.0 * scv
        lower = min(lower, upper)  # equal (to rounding) at c^2 = 1/2 and c^2 = 1
        rng = f"feasible m3 range is [{_fmt(lower * m1**3)}, {_fmt(upper * m1**3)}]"
        if n3 < lower:
            if not (n3 >= lower * (1.0 - _RTOL) or clip):
                raise ValueError(
                    f"m3={m3!r} is below the PH(2) bound 3*m1^3*(3c^2 - 1 + sqrt(2)*(1 - c^2)^(3/2)) = "
                    f"{_fmt(lower * m1**3)} for c^2={_fmt(scv)}; {rng}; pass clip=True to project onto it"
                )
            n3, changed = lower, True  # (a.2)
        elif n3 > upper:
            if not (n3 <= upper * (1.0 + _RTOL) or clip):
                raise ValueError(
                    f"m3={m3!r} is above the PH(2) bound 6*m1^3*c^2 = {_fmt(upper * m1**3)} for "
                    f"c^2={_fmt(scv)}; {rng}; pass clip=True to project onto it"
                )
            n3, changed = upper, True  # (a.3)
        if abs(n2 - 2.0) <= 2.0 * _RTOL:  # c^2 = 1 (to rounding): only the exponential
            changed = changed or (n2, n3) != (2.0, 6.0)
            return result(exponential(), 2.0, 6.0)
    else:
        bound = 1.5 * n2 * n2
        if not math.isfinite(bound * (1.0 + _A4_GAP)):
            raise unrepresentable()
        if n3 <= bound:
            if not clip:
                raise ValueError(
                    f"m3={m3!r} is not above the PH(2) bound (3/2)*m1^3*(1 + c^2)^2 = {_fmt(bound * m1**3)} for "
                    f"c^2={_fmt(scv)}; feasible m3 range is ({_fmt(bound * m1**3)}, inf) (the bound itself is "
                    "attained only with an atom at zero); pass clip=True to project onto it"
                )
            n3, changed = bound * (1.0 + _A4_GAP), True  # (a.4)

    try:
        return result(*_closed_form(m1, n2, n3))
    except ArithmeticError:
        raise unrepresentable() from None


def _closed_form(m1: float, n2: float, n3: float):
    """`(ph, n2, n3)`: the canonical PH(2) with moments m1, n2 m1^2, n3 m1^3 (feasible); `ArithmeticError` when
    float64 cannot represent it."""
    # Closed form in units of m1. The reduced moments r_n = E[S^n]/n! of the canonical form with phase means
    # u1 = 1/xi1 >= u2 = 1/xi2 satisfy r_{n+1} = e1 r_n - e2 r_{n-1} (r_0 = r_1 = 1), e1 = u1 + u2, e2 = u1 u2, so
    # e1 = (r3 - r2)/y with y = r2 - 1 = (c^2 - 1)/2, and e2 = e1 - r2 = (r3 - r2^2)/y. The shifted means
    # v_i = u_i - 1 solve v^2 - h v - y = 0 with h = e1 - 2 (discriminant h^2 + 4y); the larger-magnitude root is
    # taken directly and the other from v1 v2 = -y, so nothing cancels; then eta = (1 - u2)/u1 = -v2/u1. This is
    # xi = (b +- sqrt(a))/c of Telek and Heindl (c = -12 e2 y m1^4), in a stable form.
    y = 0.5 * n2 - 1.0
    if y < 0.0:
        # Feasible region: -1 <= h <= -2 sqrt(-y) (upper m3 bound: h = -1, eta = 1; lower: zero discriminant).
        # Clamping only absorbs rounding of n3, which moves h by O(eps/|y|) but m3 by O(eps).
        h = (n3 / 6.0 - 0.5 * n2) / y - 2.0
        h_lower = -2.0 * math.sqrt(-y)
        if h >= h_lower:  # on the lower bound: a double root
            h, disc = h_lower, 0.0
        else:
            h = max(h, -1.0)
            disc = math.sqrt(max(h * h + 4.0 * y, 0.0))
        v2 = 0.5 * (h - disc)
        v1 = -y / v2
        u1, u2 = 1.0 + v1, 1.0 + v2
    else:
        # e2 = (n3 - bound)/(6y) > 0 exactly when n3 > bound, so u2 > 0 even next to the (a.4) bound.
        bound = 1.5 * n2 * n2
        e2 = (n3 - bound) / (6.0 * y)
        h = e2 - 1.0 + y
        disc = math.sqrt(h * h + 4.0 * y)
        if h >= 0.0:
            v1 = 0.5 * (h + disc)
            v2 = -y / v1
        else:
            v2 = 0.5 * (h - disc)
            v1 = -y / v2
        u1 = 1.0 + v1
        u2 = 2.0 * e2 / (2.0 + h + disc)  # = 1 + v2 without cancellation as u2 -> 0
    eta = min(max(-v2 / u1, 0.0), 1.0)
    xi1, xi2 = 1.0 / (m1 * u1), 1.0 / (m1 * u2)
    if not all(math.isfinite(x) and x > 0.0 for x in (xi1, xi2)) or not math.isfinite(eta):
        raise ArithmeticError
    alpha = jnp.array([eta, 1.0 - eta])
    T = jnp.array([[-xi1, xi1], [0.0, -xi2]])
    ph = PH(alpha, T)
    # The fit is exact in exact arithmetic; rates spanning most of float64's range lose it (e.g. m3 = inf).
    fitted = [float(x) for x in ph.moments(3)]
    want = (m1, n2 * m1 * m1, n3 * m1 * m1 * m1)
    if not all(math.isfinite(f) and abs(f - w) <= 1e-6 * w for f, w in zip(fitted, want)):
        raise ArithmeticError
    return ph, n2, n3


# --- gradient fits of PH(m) ----------------------------------------------------------------------------------------

FIT_TARGETS = ("moments", "samples", "distribution")
# The CDF distance is taken on one grid (in units of the target's mean) for every target: _PIECES pieces [0, 1/8],
# [1/8, 1/4], [1/4, 1/2], ... (widths doubling from the second on, up to 2^(_PIECES - 4) means), _STEPS equal steps
# each. The step doubles with the piece, so the PH's survival function there takes one matrix exponential (for the
# first step), a squaring per piece and a vector-matrix product per point.
_PIECES = 24
_STEPS = 32
_FIRST_EDGE = 0.125
_EXACT = 1e-22  # a moment fit whose squared log-residuals sum below this is exact: no further start is tried


def _moment_loss(params, target):
    """Squared log-ratios of the normalised moments $E[S^k]/E[S]^k$, $k \\ge 2$, to the target's (the mean is
    matched by scaling)."""
    from ._distributions.param import ph_arrays

    alpha, T = ph_arrays(params)
    v, ms = jnp.ones(alpha.shape[0]), []
    for k in range(1, target.shape[0] + 2):
        v = jnp.linalg.solve(-T, v)
        ms.append(math.factorial(k) * (alpha @ v))
    ms = jnp.stack(ms)
    n = ms[1:] / ms[0] ** jnp.arange(2, target.shape[0] + 2, dtype=ms.dtype)
    return jnp.sum((jnp.log(n) - jnp.log(target)) ** 2)


def _likelihood_loss(params, x):
    """Minus the mean log-density of the samples `x` (in units of their mean)."""
    from ._distributions.param import ph_arrays

    alpha, T = ph_arrays(params)
    return -jnp.mean(jnp.log(PH(alpha, T).pdf(x)))


def cdf_grid() -> tuple[np.ndarray, np.ndarray]:
    """`(x, w)`: the points of the CDF distance and their trapezoid weights, in units of the target's mean."""
    edges = np.concatenate([[0.0], _FIRST_EDGE * 2.0 ** np.arange(_PIECES)])
    steps = np.arange(1, _STEPS + 1) / _STEPS
    x = np.concatenate([[0.0], (edges[:-1, None] + np.diff(edges)[:, None] * steps[None, :]).ravel()])
    w = np.zeros_like(x)
    dx = np.diff(x)
    w[:-1] += dx / 2
    w[1:] += dx / 2
    return x, w


def survival_on_grid(alpha, T):
    r"""$\alpha e^{Tx}\mathbf 1$ at the points $x$ of `cdf_grid` (the time unit of `T` being the target's mean)."""
    E = jsl.expm(T * (_FIRST_EDGE / _STEPS))

    def piece(carry, p):
        v, E = carry

        def step(v, _):
            v = v @ E
            return v, jnp.sum(v)

        v, s = jax.lax.scan(step, v, None, length=_STEPS)
        return (v, jnp.where(p >= 1, E @ E, E)), s

    _, s = jax.lax.scan(piece, (alpha, E), jnp.arange(_PIECES))
    return jnp.concatenate([jnp.sum(alpha)[None], s.ravel()])


def _cdf_loss(params, w, F, match_mean):
    r"""$\int (F_{PH} - F)^2\,dx$ by the trapezoid weights `w` on `cdf_grid` (in units of the target's mean); with
    `match_mean` the PH is first scaled to mean 1."""
    from ._distributions.param import ph_arrays

    alpha, T = ph_arrays(params)
    if match_mean:
        T = T * (alpha @ jnp.linalg.solve(-T, jnp.ones(alpha.shape[0])))
    return jnp.sum(w * (1.0 - survival_on_grid(alpha, T) - F) ** 2)


def _distribution_target(target, mean):
    """`(cdf, mean)` of a distribution target: a `jsmkt.PH` or a `GeneralService` with a `cdf` (`lognormal`,
    `deterministic`), or a function `cdf(x)` with `mean` given."""
    if callable(getattr(target, "cdf", None)):
        cdf = target.cdf
        m = float(target.mean) if mean is None else mean
    elif callable(target):
        cdf, m = target, mean
    else:
        raise ValueError(f"target={target!r} is not a distribution: give a jsmkt.PH, a service with a cdf "
                         "(jsmkt.lognormal, jsmkt.deterministic) or a function cdf(x) (with mean=...), or set "
                         "to='moments' / to='samples' for an array")
    if m is None:
        raise ValueError("mean=None: a target given as a CDF function needs its mean (mean=...), which the fit "
                         "matches and in which it measures time")
    if not (math.isfinite(m) and m > 0):
        raise ValueError(f"mean={m!r} must be a finite positive number (the target's mean)")
    return lambda x: np.asarray(cdf(np.asarray(x, dtype=float)), dtype=float), m


def fit_ph(target, order: int = 2, *, to: str | None = None, structure: str = "coxian", mean: float | None = None,
           match_mean: bool = True, optimiser=None, steps: int = 400, starts: int = 4, key=None,
           progress: bool = False) -> PH:
    r"""Fit a PH distribution of order `order` by gradient descent (optax) on an unconstrained parametrisation that
    always gives a valid PH (`jsmkt._distributions.param`: a Coxian with softplus rates and sigmoid continuations,
    or a general PH with a softmax initial vector).

    **Targets** (`to`):

    - `"moments"`: `target` is a sequence of raw moments $E[S], E[S^2], \dots$. The mean is matched exactly (the
      PH is scaled to it); the others by least squares on the logarithms of $E[S^k]/E[S]^k$, so a feasible target
      is hit to rounding, an infeasible one (e.g. an SCV below $1/m$) as nearly as order `m` allows. Moments that
      no distribution on $[0, \infty)$ has are refused: $E[S^2] < E[S]^2$ (a negative variance),
      $E[S]E[S^3] < E[S^2]^2$, or another of the Stieltjes (Hankel) conditions.
    - `"samples"`: `target` is a 1-d array of positive samples: maximum likelihood.
    - `"distribution"` (the default when `target` is not an array): `target` is a `jsmkt.PH`, a service with a
      CDF (`jsmkt.lognormal`, `jsmkt.deterministic`) or a function `cdf(x)` (then give `mean`, e.g. a Weibull or
      a Pareto law). The fit minimises $\int_0^\infty (F_{PH}(x) - F(x))^2\,dx$ (trapezoid rule on a grid of
      pieces of doubling width, [0, 1/8], [1/8, 1/4], ... up to $10^6$ means, 32 steps each), with the mean
      matched exactly when `match_mean`.

    **Other arguments:**

    - `order`: the number of phases $m \ge 1$.
    - `structure`: `"coxian"` (acyclic; every acyclic PH(m) and every PH(2) has such a form) or `"general"`.
    - `optimiser`, `steps`: the optax optimiser (default `optax.lbfgs()`, with its line search) and the most steps
      of each start.
    - `starts`: how many starting points are tried (an Erlang-like one, a hyperexponential-like one, then random
      ones from `key`); a moment fit stops at the first that hits its target.
    - `progress`: log lines of the optimisation (`jsmkt.optimise`).

    **Returns:** a `jsmkt.PH` of order `order`, valid by construction (and checked as every concrete `PH` is).

    **Raises:** `ValueError` for a target or an argument that cannot be used, naming it.

    !!! example

        ```python
        S = jsmkt.fit_ph([1.0, 3.0, 15.0], order=2, to="moments")   # the Telek-Heindl PH(2) again
        L = jsmkt.fit_ph(jsmkt.lognormal(1.0, 2.0), order=4)         # CDF distance, mean 1 matched
        ```
    """
    import jax.random as jr

    from ._optimise import optimise
    from ._distributions.param import STRUCTURES, erlang_like_params, hyper_like_params, ph_arrays, random_params

    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"order={order!r} must be a positive integer (the number of phases)")
    order = int(order)
    if structure not in STRUCTURES:
        raise ValueError(f"structure={structure!r} is not one of {', '.join(map(repr, STRUCTURES))}")
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
        raise ValueError(f"starts={starts!r} must be a positive integer")
    array_like = isinstance(target, (list, tuple, np.ndarray, jax.Array))
    if to is None:
        if array_like:
            raise ValueError("target is an array: say whether it holds moments or samples (to='moments' or "
                             "to='samples')")
        to = "distribution"
    if to not in FIT_TARGETS:
        raise ValueError(f"to={to!r} is not one of {', '.join(map(repr, FIT_TARGETS))}")

    if to == "moments":
        t = np.asarray(target, dtype=float).ravel() if array_like else None
        if t is None or t.size < 1 or not np.all(np.isfinite(t)) or not np.all(t > 0):
            raise ValueError(f"target={target!r} must be a non-empty sequence of finite positive raw moments "
                             "E[S], E[S^2], ...")
        _check_moment_sequence(t)
        scale = float(t[0])
        data = (jnp.asarray(t[1:] / scale ** np.arange(2, t.size + 1)),)
        loss_fn = _moment_loss
    elif to == "samples":
        x = np.asarray(target, dtype=float).ravel() if array_like else None
        if x is None or x.size < 2 or not np.all(np.isfinite(x)) or not np.all(x > 0):
            raise ValueError("target must hold at least two finite positive samples for to='samples'")
        scale = float(np.mean(x))
        data = (jnp.asarray(x / scale),)
        loss_fn = _likelihood_loss
    else:
        cdf, scale = _distribution_target(target, mean)
        xs, w = cdf_grid()
        data = (jnp.asarray(w), jnp.asarray(cdf(xs * scale)), bool(match_mean))
        loss_fn = _cdf_loss

    seed = int(np.asarray(jr.randint(key if key is not None else jr.PRNGKey(0), (), 0, 2**31 - 1)))
    rng = np.random.default_rng(seed)
    inits = [erlang_like_params(structure, order), hyper_like_params(structure, order)]
    while len(inits) < starts:
        inits.append(random_params(structure, order, rng))
    tx = optimiser if optimiser is not None else _default_optimiser()
    best = None
    for i, init in enumerate(inits[:starts]):
        res = optimise(loss_fn, init, tx, steps=steps, args=data, rtol=0.0, atol=0.0 if to == "moments" else 1e-15,
                       patience=5, progress=progress, name=f"fit_ph start {i + 1}/{starts}",
                       callback=_stop_when_exact if to == "moments" else None)
        if best is None or float(res.loss) < float(best.loss):
            best = res
        if to == "moments" and float(best.loss) < _EXACT:
            break
    alpha, T = (np.asarray(a) for a in ph_arrays(best.params))
    S = PH(alpha, T)
    if to != "samples" and (to == "moments" or match_mean):
        T = T * float(S.mean)  # mean exactly 1
    return PH(alpha, T / scale)


def _stop_when_exact(step, params, loss, aux) -> bool:
    del step, params, aux
    return loss < _EXACT


_OPTIMISERS: dict = {}


def _default_optimiser():
    """One `optax.lbfgs()` for every fit (so that the compiled step of a loss is reused)."""
    import optax

    if "lbfgs" not in _OPTIMISERS:
        _OPTIMISERS["lbfgs"] = optax.lbfgs()
    return _OPTIMISERS["lbfgs"]
