r"""The papers' equations and closed forms, *as published*, for reproduction and comparison.

A public module (`import jsmkt.published`, `from jsmkt.published import ...`); `ARCHITECTURE.md`'s layout still names
it `jsmkt/_published/`, where it lived as the attribute `jsmkt.published` only.

These are not jsmkt's defaults: the defaults (`jsmkt.JSQdPH`, ...) are the exact mean-field limits of the stated
finite-$N$ systems, checked against simulation. Each function here names the equations it reproduces.

Li & Lui, "A Matrix-Analytic Solution for Randomized Load Balancing Models with Phase-Type Service Times":

- `JSQdPHAsPublished`: the ODE system (1)–(3), arrival terms $\lambda(S_{k-1}^{\odot d} - S_k^{\odot d})$
  (Hadamard powers of phase vectors);
- `ph_fixed_point`: the "doubly exponential" closed form (Theorem 1, eq. (11)),
  $\pi_k = \theta^{(d^{k-1}-1)/(d-1)}\rho^{(d^k-1)/(d-1)}\,\omega$, $\theta = \omega^{\odot d}\mathbf{1}$;
- `ph_sojourn_time`: the expected sojourn time $E[T_d]$ of Section 3.

The closed form satisfies eq. (4) and the *sum over phases* of eq. (5)–(6), but eq. (5)–(6) themselves only when
$\omega^{\odot d}$ is proportional to $\alpha$ (since $\omega T = -\mu\alpha$): for exponential service, not for
Erlang or hyperexponential service, not even with $d = 1$ (M/PH/1 tails are not $\rho^k\omega$).
`ph_fixed_point_residuals` reports its residual in the published and in the exact equations.

The published forms depend on the representation $(\alpha, T)$, not only on the service distribution: $S_k^{\odot d}$,
$\omega^{\odot d}$ and $\theta = \sum_i \omega_i^d$ change when a phase is split into several. They are the
mean-field limit only for service written with one phase (exponential). For example
`hyperexponential([0.5, 0.5], [1, 1])` is Exp(1), yet `ph_sojourn_time(0.6, ., 2)` gives 1.18584 against
Mitzenmacher's 1.40744 (which the exact model gives for both). `hyperexponential2(mean, scv)` changes
representation at `scv = 1` (one reachable phase there, two balanced phases above), so the published forms jump
there, and their derivative with respect to `scv` at 1 is that of the one-phase branch only.

Li, "Super-exponential solution in Markovian supermarket models: framework and challenge" (`jsmkt.published.bmap`,
`jsmkt.published.framework`):

- `FrameworkAsPublished`: the general framework, eqs. (5)–(8), for truncated blocks $Q_{\rm left}(f_l)$,
  $Q_{\rm right}(d_k)$; `framework_bmap` (Section 3, M/G/1 type) and `framework_batch_service` (Section 4, GI/M/1
  type; JSQ(d) with exponential or PH service as its single-batch case) build the paper's examples;
- `JSQdBMAPAsPublished`: the ODE (11)–(13) for BMAP arrivals; `bmap_fixed_point`: its super-exponential closed
  form, $\pi_0 = \theta\gamma^{\odot 1/d}$, $\pi_k = r(k)\gamma^{\odot 1/d}$ (35)–(36);
  `bmap_fixed_point_residuals` its residuals.

Classic exponential JSQ(d) (Vvedenskaya et al. 1996; Mitzenmacher 2001):

- `exponential_tails`: $s_k = \rho^{(d^k-1)/(d-1)}$ ($\rho^k$ for $d = 1$);
- `exponential_sojourn_time`: $E[T] = \frac1\mu\sum_{k\ge0}\rho^{(d^{k+1}-d)/(d-1)}$ (Mitzenmacher, Cor. 3.8).

`as_published(model)` gives the papers' fixed point of a model of any family with an as-published form (`JSQd`,
`JSQdPH`, `JSQdBMAP`, `JSQdBatchService`; `register_as_published` adds one), as `jsmkt solve --as-published`
prints it. `published_equations(model)` gives the papers' ODE of a model of those families as a model (the one
`jsmkt stability --as-published` linearises).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import FixedChoice
from .._distributions.ph import PH, not_a_ph
from .._errors import as_float_array, check_count, concrete_array, error_if
from .._models.base import AbstractSupermarketModel, fmt
from .._models.jsqd import JSQd
from .._models.jsqd_ph import JSQdPH
from ._registry import AsPublished, as_published, has_as_published, register_as_published
from ._registry import fixed_d as _fixed_d
from ._registry import integer_d as _integer_d


__all__ = [
    "AsPublished",
    "FrameworkAsPublished",
    "JSQdBMAPAsPublished",
    "JSQdPHAsPublished",
    "as_published",
    "bmap_fixed_point",
    "bmap_fixed_point_residuals",
    "exponential_sojourn_time",
    "exponential_tails",
    "framework_batch_service",
    "framework_bmap",
    "has_as_published",
    "ph_fixed_point",
    "ph_fixed_point_residuals",
    "ph_sojourn_time",
    "published_equations",
    "register_as_published",
]


# A truncated series is accepted when the bound on its remainder is below this fraction of its sum.
_SERIES_RTOL = 1e-16


def _service(service) -> PH:
    """`service`, checked to be a PH representation (with `eqx.error_if` when traced: construction checked
    nothing then)."""
    if not isinstance(service, PH):
        raise ValueError(f"service={service!r} must be a jsmkt.PH distribution")
    return _require(
        service, not_a_ph(service),
        "invalid PH service: alpha must be a probability vector (entries >= 0, sum 1) and T a sub-generator "
        "(negative diagonal, non-negative off-diagonal entries, row sums <= 0), all finite",
    )


def _require(value, bad: Array, message: str):
    """Raise `ValueError(message)` when `bad` is concretely true; when it is traced, check it at run time
    (`eqx.error_if`) on the returned `value` (a pytree: everything computed from it carries the check)."""
    c = concrete_array(bad)
    if c is None:
        return error_if(value, bad, message)
    if bool(c):
        raise ValueError(message)
    return value


def _positive(name: str, x: Array) -> Array:
    return _require(x, ~(x > 0), fmt(f"{name}={{x}} must be positive", x=x, default=f"{name} must be positive"))


def _stable(values, rho: Array, lam: Array, load: str, remedy: str):
    """`values`, checked for a load `rho` < 1 (at loads >= 1 the formulas diverge or have no meaning)."""
    msg = "unstable: " + fmt(
        "lam={lam} gives load rho={rho} >= 1", lam=lam, rho=rho, default="the load rho is >= 1"
    ) + f" ({load}); the published formulas need rho < 1 (a stable system): {remedy}"
    return _require(values, ~(rho < 1.0), msg)


def _exponential_load(lam, mu) -> tuple[Array, Array, Array]:
    """`(lam, mu, rho)`, checked."""
    lam = _positive("lam", as_float_array("lam", lam, ndim=0, scale=True))
    mu = _positive("mu", as_float_array("mu", mu, ndim=0, scale=True))
    rho = lam / mu
    return _stable((lam, mu, rho), rho, lam, "rho = lam/mu", "lower lam or raise mu")


def _ph_load(lam, service: PH) -> Array:
    """The load `rho = lam * E[S]`, checked."""
    lam = _positive("lam", as_float_array("lam", lam, ndim=0, scale=True))
    rho = lam * service.mean
    return _stable(rho, rho, lam, "rho = lam * E[S]", "lower lam or speed up service")


def _remainder_checked(total: Array, bound: Array, terms: int) -> Array:
    """`total`, checked to leave out a remainder `bound` of at most `_SERIES_RTOL` of itself."""
    msg = fmt(
        "terms={terms} leaves out up to {bound} of the series (sum {total}); raise terms (64 suffice for any load "
        "rho < 1 and d >= 2)", terms=jnp.asarray(terms), bound=bound, total=total,
        default=f"terms={terms} leaves out a non-negligible part of the series; raise terms",
    )
    return _require(total, ~(bound <= _SERIES_RTOL * total), msg)


def _tail_bound(a_next: Array, q: Array) -> Array:
    r"""Bound on $\sum_{k>N} a_k$ for terms whose ratios $a_{k+1}/a_k$ decrease: $a_{N+1}/(1 - q)$ with $q$ the
    ratio $a_{N+2}/a_{N+1}$ (infinite when $q \ge 1$)."""
    return jnp.where(a_next == 0.0, 0.0, a_next / jnp.maximum(1.0 - q, 0.0))


def _geometric_exponent(d: int, k: Array) -> Array:
    """(d^k - 1)/(d - 1) = 1 + d + ... + d^(k-1) (= k for d = 1), capped at 1e300 (where x^e is 0 for x < 1 anyway,
    and its derivative e x^(e-1) is 0 rather than inf * 0)."""
    k = jnp.asarray(k, dtype=float)
    if d == 1:
        return k
    return jnp.minimum((float(d) ** k - 1.0) / (d - 1.0), 1e300)


def _exponent(d: int, k: Array) -> Array:
    """(d^(k+1) - d)/(d - 1) = d + d^2 + ... + d^k, capped at 1e300 (where x^e is 0 for x < 1 anyway)."""
    return jnp.minimum((float(d) ** (k + 1) - d) / (d - 1.0), 1e300)


def exponential_tails(lam: ArrayLike, d: int, mu: ArrayLike = 1.0, K: int = 20) -> Float[Array, " K+1"]:
    r"""Classic closed form $s_k = \rho^{(d^k-1)/(d-1)}$, $k = 0..K$, $\rho = \lambda/\mu < 1$ (`K >= 1`)."""
    d = _integer_d(d)
    K = check_count("K", K, "the largest queue length")
    lam, mu, rho = _exponential_load(lam, mu)
    k = jnp.arange(K + 1, dtype=float)
    return rho ** _geometric_exponent(d, k)


def exponential_sojourn_time(lam: ArrayLike, d: int, mu: ArrayLike = 1.0, terms: int = 64) -> Float[Array, ""]:
    r"""Mitzenmacher's mean time in system $E[T] = \frac1\mu\sum_{k\ge0}\rho^{(d^{k+1}-d)/(d-1)}$
    ($= \sum_{i\ge1}\lambda^{(d^i-d)/(d-1)}$ for $\mu = 1$; $1/(\mu-\lambda)$ for $d = 1$), $\rho = \lambda/\mu < 1$.

    For $d \ge 2$ the series is summed to `terms` terms, and a `ValueError` is raised (an `eqx.error_if` check when
    traced) if the bound on the rest exceeds $10^{-16}$ of the sum; the default 64 suffices for every $\rho < 1$."""
    d = _integer_d(d)
    terms = check_count("terms", terms, "the number of terms of the series")
    lam, mu, rho = _exponential_load(lam, mu)
    if d == 1:
        return 1.0 / (mu - lam)
    # Term k is rho^f_k, f_k = (d^(k+1) - d)/(d - 1); the ratios rho^(d^(k+1)) of successive terms decrease.
    a = rho ** _exponent(d, jnp.arange(terms + 2, dtype=float))
    total = _remainder_checked(jnp.sum(a[:terms]), _tail_bound(a[terms], a[terms + 1] / a[terms]), terms)
    return total / mu


def _theta(service: PH, d: int) -> Array:
    return jnp.sum(service.stationary_vector**d)


def ph_fixed_point(lam: ArrayLike, service: PH, d: int, K: int) -> Float[Array, "K m"]:
    r"""Li & Lui's closed form (Theorem 1, eq. (11)): $\pi_k = \theta^{(d^{k-1}-1)/(d-1)}\rho^{(d^k-1)/(d-1)}\omega$,
    $k = 1..K$, with $\omega$ the stationary vector of $T + T^0\alpha$ and $\theta = \sum_i \omega_i^d$
    ($\rho = \lambda E[S] < 1$, `K >= 1`)."""
    d = _integer_d(d)
    service = _service(service)
    K = check_count("K", K, "the largest queue length")
    rho = _ph_load(lam, service)
    k = jnp.arange(1, K + 1, dtype=float)
    scal = _theta(service, d) ** _geometric_exponent(d, k - 1) * rho ** _geometric_exponent(d, k)
    return scal[:, None] * service.stationary_vector[None, :]


def ph_sojourn_time(lam: ArrayLike, service: PH, d: int, terms: int = 64) -> Float[Array, ""]:
    r"""Li & Lui's expected sojourn time (Section 3):
    $E[T_d] = \rho^d\theta(\omega-\alpha)(-T)^{-1}\mathbf1
    + \alpha(-T)^{-1}\mathbf1\,\big(1 + \sum_{k\ge1}\theta^{(d^k-1)/(d-1)}\rho^{(d^{k+1}-d)/(d-1)}\big)$,
    $\rho = \lambda E[S] < 1$.

    For $d = 1$ the series is geometric and summed in closed form, $\theta\rho/(1 - \theta\rho)$. For $d \ge 2$ it
    is summed to `terms` terms, and a `ValueError` is raised (an `eqx.error_if` check when traced) if the bound on
    the rest exceeds $10^{-16}$ of the sum; the default 64 suffices for every $\rho < 1$."""
    d = _integer_d(d)
    service = _service(service)
    terms = check_count("terms", terms, "the number of terms of the series")
    rho = _ph_load(lam, service)
    theta = _theta(service, d)
    omega, alpha = service.stationary_vector, service.alpha
    resid = service.mean_remaining
    if d == 1:
        series = theta * rho / (1.0 - theta * rho)
    else:
        # Term k is theta^e_k rho^f_k, e_k = (d^k - 1)/(d - 1), f_k = d e_k; the ratios theta^(d^k) rho^(d^(k+1))
        # of successive terms decrease (theta = sum(omega^d) <= 1).
        k = jnp.arange(1, terms + 3, dtype=float)
        a = theta ** _geometric_exponent(d, k) * rho ** _exponent(d, k)
        series = _remainder_checked(jnp.sum(a[:terms]), _tail_bound(a[terms], a[terms + 1] / a[terms]), terms)
    return rho**d * theta * (omega - alpha) @ resid + service.mean * (1.0 + series)


class JSQdPHAsPublished(AbstractSupermarketModel):
    r"""Li & Lui's ODE system (1)–(3) for JSQ(d) with PH service, as published:

    $$\dot S_1 = \lambda\alpha - \lambda S_1^{\odot d} + S_1T + S_2T^0\alpha,\qquad
      \dot S_k = \lambda S_{k-1}^{\odot d} - \lambda S_k^{\odot d} + S_kT + S_{k+1}T^0\alpha\ (k\ge2).$$

    $S_k^{\odot d}$ (entrywise power of a phase vector) is not the probability that an arrival joins a server
    with at least $k$ jobs in a given phase unless $m = 1$, and eq. (2) puts the arrivals to busy servers in the
    wrong phases ($\lambda(\alpha - S_1)$ where the exact flow into level 1 is $\lambda(1 - s_1)\alpha$), so
    except for exponential service written with one phase this is not the mean-field limit of the stated system,
    not even for $d = 1$ (its fixed point then has the M/M/1 mean queue length whatever the service); with $m \ge 2$
    phases it depends on the representation, not only on the distribution. The exact one is
    `jsmkt.JSQdPH`. Same arguments as `JSQdPH`
    (integer `d` only). It has no `transitions` (the system is stated as an ODE on tails).
    """

    exact: JSQdPH
    K: int = eqx.field(static=True)

    def __init__(self, lam: ArrayLike, service: PH, d: int = 2, K: int | None = None):
        d = _integer_d(d)
        self.exact = JSQdPH(lam, service, d=d, K=K)
        self.K = self.exact.K

    def with_K(self, K):
        return JSQdPHAsPublished(self.lam, self.service, self.choice.d, K)

    @property
    def lam(self):
        """Arrival rate per server."""
        return self.exact.lam

    @property
    def service(self):
        """The PH service distribution."""
        return self.exact.service

    @property
    def choice(self) -> FixedChoice:
        """The (integer) choice number, as a `FixedChoice`."""
        return self.exact.choice

    @property
    def arrival_rate(self):
        return self.exact.lam

    def load(self):
        return self.exact.load()

    def state_space(self):
        return self.exact.state_space()

    def transitions(self, x):
        raise NotImplementedError(
            "JSQdPHAsPublished is the published ODE on tails; it is not derived from transitions "
            "(use jsmkt.JSQdPH for the exact population model)"
        )

    def occupancy(self, y):
        return self.exact.occupancy(y)

    def reduce(self, x):
        return self.exact.reduce(x)

    def vector_field(self, t, y, args=None):
        del t, args
        d = self.choice.d
        alpha, T = self.service.alpha, self.service.T
        T0 = self.service.exit_vector
        Sd = y**d
        prev = jnp.concatenate([alpha[None, :], Sd[:-1]])
        completions = jnp.concatenate([y[1:] @ T0, jnp.zeros(1)])[:, None] * alpha[None, :]
        return self.lam * (prev - Sd) + y @ T + completions

    def initial_state(self):
        return self.exact.initial_state()

    def initial_guess(self):
        return ph_fixed_point(self.lam, self.service, self.choice.d, self.K)

    def tails(self, y):
        return self.exact.tails(y)

    def phase_tails(self, y):
        """The per-phase tails $S_k$, $k = 1..K$ (the reduced state itself), shape `(K, m)`."""
        return y

    def value_errors(self):
        return self.exact.value_errors()

    def check_values(self) -> None:
        # The exact model's (its truncation changed, not this one's): one compilation of the checks for every K.
        self.exact.check_values()


def ph_fixed_point_residuals(lam: ArrayLike, service: PH, d: int, K: int) -> dict[str, Array]:
    """Max-norm residual of Li & Lui's closed form `ph_fixed_point` in the published equations (1)–(3) and in
    the exact mean-field equations of `jsmkt.JSQdPH`, over the levels `k = 1..K-1` (at `k = K` both truncated
    systems see no jobs beyond `K`, where the closed form has its own tail)."""
    pi = ph_fixed_point(lam, service, d, K)
    pub = JSQdPHAsPublished(lam, service, d, K)
    exact = JSQdPH(lam, service, d=d, K=K)
    # Drop the truncation boundary row, where both systems see S_{K+1} = 0 instead of pi_{K+1}.
    r_pub = jnp.max(jnp.abs(pub.vector_field(0.0, pi)[:-1]))
    r_exact = jnp.max(jnp.abs(exact.vector_field(0.0, pi)[:-1]))
    return {"published": r_pub, "exact": r_exact}


def _exponential_as_published(model: JSQd) -> AsPublished:
    """`JSQd`: the classic closed form $s_k = \rho^{(d^k-1)/(d-1)}$ and Mitzenmacher's $E[T]$."""
    d = _fixed_d(model)
    return AsPublished(
        source="rho^((d^k-1)/(d-1)) and Mitzenmacher's E[T]",
        tail=np.asarray(exponential_tails(model.lam, d, model.mu, model.K)),
        mean_sojourn_time=float(exponential_sojourn_time(model.lam, d, model.mu)),
    )


def _ph_as_published(model: JSQdPH) -> AsPublished:
    """`JSQdPH`: Li & Lui's closed form (Theorem 1), its residuals and their sojourn time (Section 3)."""
    d = _fixed_d(model)
    pi = np.asarray(ph_fixed_point(model.lam, model.service, d, model.K))
    tail = np.concatenate([[1.0], pi.sum(1)])
    ET = float(ph_sojourn_time(model.lam, model.service, d))
    res = ph_fixed_point_residuals(model.lam, model.service, d, model.K)
    EQ = float(np.sum(tail[1:]))
    return AsPublished(
        source="Li & Lui closed form (Theorem 1) and sojourn time (Section 3)",
        tail=tail, mean_sojourn_time=ET, phase_tails=pi,
        residuals={"published": float(res["published"]), "exact": float(res["exact"])},
        note=(f"E[T] is the paper's Section 3 formula and E[Q] the sum of its tails; they need not obey Little's law "
              f"(here lam E[T] = {float(model.lam) * ET:.6g}, E[Q] = {EQ:.6g})"),
    )


register_as_published(JSQd, _exponential_as_published)
register_as_published(JSQdPH, _ph_as_published)


from .bmap import JSQdBMAPAsPublished as JSQdBMAPAsPublished  # noqa: E402
from .bmap import bmap_fixed_point as bmap_fixed_point  # noqa: E402
from .bmap import bmap_fixed_point_residuals as bmap_fixed_point_residuals  # noqa: E402
from .framework import FrameworkAsPublished as FrameworkAsPublished  # noqa: E402
from .framework import framework_batch_service as framework_batch_service  # noqa: E402
from .framework import framework_bmap as framework_bmap  # noqa: E402


def published_equations(model) -> AbstractSupermarketModel:
    """The papers' ODE for `model`'s family, as published, at `model`'s truncation `K`: a model whose
    `vector_field` is the published right-hand side, which `jsmkt stability --as-published` linearises and searches
    for fixed points.

    - `JSQd`: the classic ODE of Vvedenskaya et al. and Mitzenmacher is the exact mean field of the stated system, so
      the model itself is returned;
    - `JSQdPH`: Li & Lui's ODE (1)–(3), `JSQdPHAsPublished`;
    - `JSQdBMAP`: the framework paper's ODE (11)–(13), `JSQdBMAPAsPublished`;
    - `JSQdBatchService`: the framework's ODE (6) with Section 4's blocks, `framework_batch_service`.

    **Raises:** `ValueError` naming the family when it has no published ODE in jsmkt, or for a randomised choice
    number (the papers have integer `d` only)."""
    from .._models.batch_service import JSQdBatchService
    from .._models.bmap import JSQdBMAP

    kind = type(model)
    if kind is JSQd:
        _fixed_d(model)
        return model
    if kind is JSQdPH:
        return JSQdPHAsPublished(model.lam, model.service, _fixed_d(model), model.K)
    if kind is JSQdBMAP:
        return JSQdBMAPAsPublished(model.bmap, _fixed_d(model), model.mu, model.K)
    if kind is JSQdBatchService:
        return framework_batch_service(model.lam, model.service, model.service_batch_sizes, _fixed_d(model), model.K)
    raise ValueError(f"{kind.__name__} has no published ODE in jsmkt (the families with one: JSQd, JSQdPH, JSQdBMAP, "
                     "JSQdBatchService); use the exact mean field")
