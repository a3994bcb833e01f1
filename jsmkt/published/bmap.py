r"""Li, "Super-exponential solution in Markovian supermarket models: framework and challenge", Section 3 (the
supermarket model of M/G/1 type: one BMAP $(NC, ND_1, ND_2, \ldots)$ feeding $N$ exponential servers), as
published.

- `JSQdBMAPAsPublished`: the ODE (11)–(13) on the per-phase vectors $S_k$, $k = 0..K$, with Hadamard powers,
  and so the fixed-point equations (14)–(16);
- `bmap_fixed_point`: the "super-exponential" closed form, $\pi_0 = \theta\gamma^{\odot 1/d}$,
  $\pi_k = r(k)\gamma^{\odot 1/d}$ with the recursion (35)–(36);
- `bmap_fixed_point_residuals`: its residual in (14)–(16) and in the exact equations.

Neither is the mean-field limit of the stated system (`jsmkt.JSQdBMAP`, batch-Poisson JSQ(d) with the averaged
batch rates). Equation (13) is the balance of the M/G/1-type *probabilities* $x_k$ of one BMAP/M/1 queue written
with the tails $S_k$ and Hadamard powers: already with one phase and $d = 1$ (Poisson batches, M^X/M/1 queues)
its fixed point is $s_k = P(Q = k)/P(Q = 0)$ of the M^X/M/1 queue instead of $P(Q \ge k)$; with single arrivals
and one phase both are $\rho^{(d^k-1)/(d-1)}$. The closed form assumes $\pi_k \propto \gamma^{\odot 1/d}$, which
(15) and (29) contradict unless $\gamma\sum_i D_i \propto \gamma^{\odot 1/d}$: it satisfies neither system.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import FixedChoice
from .._distributions.bmap import BMAP, stationary_vector
from .._errors import check_count
from .._models.base import AbstractSupermarketModel
from .._models.bmap import JSQdBMAP
from ._registry import AsPublished, register_as_published


def _integer_d(d) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d={d!r}: the published formulas need an integer choice number d >= 1")
    return int(d)


class JSQdBMAPAsPublished(AbstractSupermarketModel):
    r"""The framework paper's ODE (11)–(13) for JSQ(d) with BMAP arrivals, as published: with $S_k$ the row
    vector over the BMAP's phases of "the fraction of queues with at least $k$ customers and the BMAP in phase
    $i$",

    $$\dot S_0 = S_0^{\odot d}C + \mu S_1,\qquad
      \dot S_k = \sum_{l=0}^{k-1} S_l^{\odot d}D_{k-l} + S_k^{\odot d}C - \mu S_k + \mu S_{k+1}\ (k \ge 1),$$

    $S_0\mathbf1 = 1$ (11), truncated at $K$ ($S_{K+1} = 0$, batches past $K$ dropped). The system conserves
    $\sum_k S_k\mathbf1$ rather than (11), so (11) replaces one equation: the reduced state is
    $(S_0^{(1..m-1)}, S_1, \ldots, S_K)$, flat, with $S_0^{(m)} = 1 - \sum_{i<m} S_0^{(i)}$, and the vector
    field drops the last phase's component of (12) (at the fixed point it holds anyway, up to the truncation,
    since all components sum to zero). `tails` are $s_k = S_k\mathbf1$.

    Not the mean-field limit of the stated system (module docstring); that is `jsmkt.JSQdBMAP`, whose arguments
    this takes (integer `d` only). It has no `transitions` (it is stated as an ODE).
    """

    exact: JSQdBMAP
    K: int = eqx.field(static=True)

    def __init__(self, bmap: BMAP, d: int = 2, mu: ArrayLike = 1.0, K: int | None = None):
        d = _integer_d(d)
        self.exact = JSQdBMAP(bmap, d=d, mu=mu, K=K)
        self.K = self.exact.K

    def with_K(self, K):
        return JSQdBMAPAsPublished(self.bmap, self.choice.d, self.mu, K)

    @property
    def bmap(self) -> BMAP:
        """The BMAP per server."""
        return self.exact.bmap

    @property
    def mu(self):
        """Service rate per server."""
        return self.exact.mu

    @property
    def choice(self) -> FixedChoice:
        """The (integer) choice number, as a `FixedChoice`."""
        return self.exact.choice

    @property
    def m(self) -> int:
        """Number of phases of the BMAP."""
        return self.bmap.order

    @property
    def arrival_rate(self):
        return self.exact.arrival_rate

    def load(self):
        return self.exact.load()

    def rate_scale(self):
        return self.exact.rate_scale()

    def state_space(self):
        return [(k, i) for k in range(self.K + 1) for i in range(self.m)]

    def transitions(self, x):
        raise NotImplementedError("JSQdBMAPAsPublished is the published ODE; it is not derived from transitions "
                                  "(use jsmkt.JSQdBMAP for the exact population model)")

    def unknown_levels(self) -> np.ndarray:
        return np.concatenate([np.zeros(self.m - 1, int), np.repeat(np.arange(1, self.K + 1), self.m)])

    def full(self, y: Float[Array, " n"]) -> Float[Array, "K+1 m"]:
        """$S_0, \\ldots, S_K$ (rows) of the reduced state `y`."""
        m = self.m
        head = y[: m - 1]
        S0 = jnp.concatenate([head, (1.0 - jnp.sum(head))[None]])
        return jnp.concatenate([S0[None], jnp.reshape(y[m - 1:], (self.K, m))])

    def phase_tails(self, y):
        """$S_1, \\ldots, S_K$, shape `(K, m)`."""
        return self.full(y)[1:]

    def occupancy(self, y):
        S = self.full(y)
        return jnp.ravel(S - jnp.concatenate([S[1:], jnp.zeros((1, self.m))]))

    def reduce(self, x):
        S = jnp.cumsum(jnp.reshape(x, (self.K + 1, self.m))[::-1], axis=0)[::-1]
        return jnp.concatenate([S[0, :-1], jnp.ravel(S[1:])])

    def published_rhs(self, S: Float[Array, "K+1 m"]) -> Float[Array, "K+1 m"]:
        """The right-hand sides of (12)–(13) at $S_0..S_K$ (every component, the one that (11) replaces too)."""
        d, K = self.choice.d, self.K
        C, D, mu = self.bmap.C, self.bmap.D, self.mu
        Sd = S**d
        out = Sd @ C - mu * S + mu * jnp.concatenate([S[1:], jnp.zeros((1, self.m))])
        out = out.at[0].add(mu * S[0])  # level 0 has no departures: (12) is S_0^d C + mu S_1
        for b in range(1, min(D.shape[0], K) + 1):  # batches of b from level l to l + b <= K
            out = out.at[b:].add(Sd[: K + 1 - b] @ D[b - 1])
        return out

    def vector_field(self, t, y, args=None):
        del t, args
        F = self.published_rhs(self.full(y))
        return jnp.concatenate([F[0, :-1], jnp.ravel(F[1:])])

    def initial_state(self):
        """The empty system with the BMAP's phase stationary: $S_0 = \\gamma$, $S_k = 0$."""
        return jnp.concatenate([self.bmap.gamma[:-1], jnp.zeros(self.K * self.m)])

    def initial_guess(self):
        """The paper's closed form (`bmap_fixed_point`)."""
        pi = bmap_fixed_point(jax.lax.stop_gradient(self.bmap), self.choice.d, jax.lax.stop_gradient(self.mu),
                              self.K)
        return jnp.concatenate([pi[0, :-1], jnp.ravel(pi[1:])])

    def tails(self, y):
        return jnp.sum(self.full(y), axis=1)

    def value_errors(self):
        return self.exact.value_errors()

    def check_values(self) -> None:
        self.exact.check_values()


def bmap_fixed_point(bmap: BMAP, d: int, mu: ArrayLike = 1.0, K: int = 40) -> Float[Array, "K+1 m"]:
    r"""The paper's super-exponential closed form: with $\gamma$ the stationary phase vector,
    $\theta = 1/(\gamma^{\odot 1/d}\mathbf1)$, $\rho_k = \gamma\sum_{i\ge k}D_i\mathbf1/\mu$ (note: the rate of
    batches of *at least* $k$ jobs),

    $$\pi_0 = \theta\gamma^{\odot 1/d},\qquad \pi_k = r(k)\gamma^{\odot 1/d},\qquad
      r(1) = \theta^{d+1}\rho_1,\quad r(k) = \theta^{d+1}\rho_k + \theta\sum_{i=1}^{k-1} r(i)^d\rho_{k-i},$$

    eqs. (35)–(36). Returns $\pi_0, \ldots, \pi_K$ (rows); the tails are $s_k = \pi_k\mathbf1 = r(k)/\theta$."""
    d = _integer_d(d)
    K = check_count("K", K, "the largest queue length")
    if not isinstance(bmap, BMAP):
        raise ValueError(f"bmap={bmap!r} must be a jsmkt.BMAP")
    mu = jnp.asarray(mu, float)
    gamma = stationary_vector(bmap.generator)
    root = jnp.maximum(gamma, 0.0) ** (1.0 / d)
    theta = 1.0 / jnp.sum(root)
    B = bmap.max_batch
    lam_ge = jnp.cumsum(jnp.einsum("i,bij->b", gamma, bmap.D)[::-1])[::-1]  # gamma sum_{i >= k} D_i e, k = 1..B
    rho = jnp.concatenate([lam_ge / mu, jnp.zeros(max(K - B, 0))])[:K]  # rho_1..rho_K

    def step(r, k):  # r: r(1..K) filled below k; r(k) = theta^(d+1) rho_k + theta sum_{i<k} r(i)^d rho_{k-i}
        i = jnp.arange(1, K + 1)
        past = jnp.where(i < k, r**d * rho[jnp.clip(k - i - 1, 0, K - 1)], 0.0)
        rk = theta ** (d + 1) * rho[k - 1] + theta * jnp.sum(past)
        return r.at[k - 1].set(rk), None

    r, _ = jax.lax.scan(step, jnp.zeros(K), jnp.arange(1, K + 1))
    return jnp.concatenate([theta * root[None], r[:, None] * root[None]])


def bmap_fixed_point_residuals(bmap: BMAP, d: int, mu: ArrayLike = 1.0, K: int = 40) -> dict[str, Array]:
    """Max-norm residuals of the closed form `bmap_fixed_point` in the published equations (15)–(16), over the
    levels `k = 0..K-1` (at `K` the truncation cuts them), and of its tails in the exact mean-field equations of
    `jsmkt.JSQdBMAP` (levels `1..K-1`)."""
    pi = bmap_fixed_point(bmap, d, mu, K)
    pub = JSQdBMAPAsPublished(bmap, d, mu, K)
    exact = JSQdBMAP(bmap, d=d, mu=mu, K=K)
    r_pub = jnp.max(jnp.abs(pub.published_rhs(pi)[:-1]))
    r_exact = jnp.max(jnp.abs(exact.vector_field(0.0, jnp.sum(pi[1:], axis=1))[:-1]))
    return {"published": r_pub, "exact": r_exact}


def _bmap_as_published(model: JSQdBMAP) -> AsPublished:
    """`JSQdBMAP`: the super-exponential closed form (35)-(36), its residuals, and the fixed point of the published
    equations (14)-(16) themselves, which the closed form does not solve; E[T] by Little's law."""
    from .._fixed_point import solve_fixed_point
    from .._metrics import mean_queue_length, tails
    from ._registry import fixed_d as _fixed_d

    d, K = _fixed_d(model), model.K
    pi = np.asarray(bmap_fixed_point(model.bmap, d, model.mu, K))  # phase vectors from level 0 on
    tail = pi.sum(1)
    res = bmap_fixed_point_residuals(model.bmap, d, model.mu, K)
    eqs = JSQdBMAPAsPublished(model.bmap, d, model.mu, K)
    fp = solve_fixed_point(eqs, tail_tol=1.0)  # the truncation is judged on the closed form's tail
    return AsPublished(
        source="Li, Section 3: the super-exponential closed form (35)-(36); E[T] by Little's law",
        tail=tail, mean_sojourn_time=float(np.sum(tail[1:])) / float(model.arrival_rate), phase_tails=pi[1:],
        residuals={"published": float(res["published"]), "exact": float(res["exact"])},
        published_equations={"mean_queue_length": float(mean_queue_length(eqs, fp)),
                             "tail": np.asarray(tails(eqs, fp))},
        note=("the closed form solves neither the published equations (14)-(16) nor the exact ones; "
              "published_equations is the fixed point of (14)-(16) themselves"),
    )


register_as_published(JSQdBMAP, _bmap_as_published)
