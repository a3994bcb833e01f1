r"""JSQ(d) with batch arrivals: Poisson batches, each joining the shortest of d sampled queues as a whole."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, as_choice
from .._errors import as_float_array, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, fmt
from .description import Description, Dispatch, LocalEvent, Moves, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


_MAX_BATCH = 4096  # the largest batch size a batch law may give positive probability


class JSQdBatch(AbstractDescribedModel):
    r"""Supermarket model with batch arrivals (the M/G/1-type example of the framework paper, Poisson case):
    $N$ exponential FCFS servers of rate μ; batches arrive in a Poisson process of rate $N\lambda_B$, a batch has
    $b$ jobs with probability `batch_sizes[b-1]`; each batch samples $d$ servers with replacement and joins the
    one with the fewest jobs **as a whole** (ties uniformly).

    With $s_k$ the fraction of servers with at least $k$ jobs and $g$ the pgf of the choice number, a batch joins a
    server with exactly $j$ jobs with probability $g(s_j) - g(s_{j+1})$, so the mean-field limit is

    $$\dot s_k = \lambda_B \sum_{j<k} \big(g(s_j) - g(s_{j+1})\big)\,P(B \ge k - j) - \mu\,(s_k - s_{k+1}),$$

    derived here from the description (cells `k = 0..K`, departures, one dispatch whose effect is the random
    jump `k -> k + b`). Its Jacobian is banded with the largest batch size as bandwidth. The job load is
    $\rho = \lambda_B E[B]/\mu$.

    **Arguments:**

    - `batch_rate`: batch arrival rate per server $\lambda_B$.
    - `batch_sizes`: probabilities of batch sizes 1, 2, ... (a 1-d array, differentiable).
    - `d`: choice number (integer, real, probability vector or `AbstractChoice`; see `JSQd`).
    - `mu`: service rate per server.
    - `K`: truncation level; chosen from the parameters when omitted.
    - `d_max`: bound on a real `d` that is traced (inside `jax.grad`), see `InterpolatedChoice`.

    The reduced state is `s_1..s_K`, shape `(K,)`.
    """

    batch_rate: Float[Array, ""]
    batch_sizes: Float[Array, " B"]
    mu: Float[Array, ""]
    choice: AbstractChoice
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq-batch", (
        Parameter("batch_rate", "rate", "batch arrival rate per server", field="batch_rate", sensitivity="real"),
        Parameter("batch_sizes", "probabilities", "batch-size probabilities", what="batch-size probabilities",
                  field="batch_sizes", sensitivity="probabilities"),
        Parameter("d", "choice", "choice number of arrivals", default=2, field="choice", sensitivity="choice"),
        Parameter("mu", "rate", "service rate", default=1.0, field="mu", sensitivity="real"),
        TRUNCATION,
    ), specs=("examples/jsq2_batch.toml",))

    @classmethod
    def examples(cls) -> dict:
        return {"batch-halves": cls(0.6, [0.5, 0.5], d=2, K=40), "batch-uniform4-d3": cls(0.3, [0.25] * 4, d=3, K=40)}

    def spec_values(self) -> dict:
        return {"batch_rate": float(self.batch_rate), "batch_sizes": [float(p) for p in self.batch_sizes],
                "d": float(self.choice.mean), "mu": float(self.mu), "lam": float(self.arrival_rate)}

    def describe_parameters(self) -> str:
        return (f"batch_rate = {float(self.batch_rate):.6g}   batch sizes 1..{self.batch_sizes.shape[0]} "
                f"(mean {float(self.mean_batch_size):.6g})   d = {choice_text(self.choice)}")

    def __init__(self, batch_rate: ArrayLike, batch_sizes: ArrayLike, d=2, mu: ArrayLike = 1.0,
                 K: int | None = None, *, d_max: int | None = None):
        self.batch_rate = as_float_array("batch_rate", batch_rate, ndim=0, scale=True)
        self.batch_sizes = as_float_array("batch_sizes", batch_sizes, ndim=1)
        self.mu = as_float_array("mu", mu, ndim=0, scale=True)
        B = self.batch_sizes.shape[0]
        if not 1 <= B <= _MAX_BATCH:
            raise ValueError(f"batch_sizes has {B} entries: give the probabilities of batch sizes 1..B, 1 <= B <= "
                             f"{_MAX_BATCH}")
        for name, x in (("batch_rate", self.batch_rate), ("mu", self.mu)):
            c = concrete_array(x)
            if c is not None and not c > 0:
                raise ValueError(f"{name}={float(c)!r} must be positive")
        p = concrete_array(self.batch_sizes)
        if p is not None:
            if np.any(p < 0):
                b = int(np.flatnonzero(p < 0)[0])
                raise ValueError(f"batch_sizes[{b}]={float(p[b])!r} (probability of a batch of {b + 1}) is negative")
            if abs(p.sum() - 1.0) > 1e-8:
                raise ValueError(f"batch_sizes={p.tolist()!r} sums to {float(p.sum())!r}; probabilities must sum to 1")
        self.choice = as_choice(d, d_max)
        if K is None:
            lc, mc, wc = concrete_array(self.batch_rate), concrete_array(self.mu), concrete_array(self.choice.weights())
            if lc is None or mc is None or wc is None or p is None:
                raise ValueError("K must be given when batch_rate, batch_sizes, mu or d are traced "
                                 "(inside jit/grad/vmap)")
            K = _default_K(float(lc / mc), p, wc)
        self.K = check_K(K)

    @property
    def d(self):
        """Mean choice number E[D] (the integer d for a fixed choice)."""
        return self.choice.number

    @property
    def mean_batch_size(self) -> Array:
        """$E[B]$."""
        return jnp.arange(1, self.batch_sizes.shape[0] + 1, dtype=self.batch_sizes.dtype) @ self.batch_sizes

    @property
    def arrival_rate(self) -> Array:
        """Job arrival rate per server, $\\lambda_B E[B]$."""
        return self.batch_rate * self.mean_batch_size

    def load(self) -> Array:
        return self.arrival_rate / self.mu

    def rate_scale(self) -> Array:
        return jnp.maximum(self.batch_rate, self.mu)

    def declared_structure(self):
        """Banded with the largest batch size as bandwidth: a batch moves a server up by at most that many levels,
        a departure down by one."""
        return self.batch_sizes.shape[0], ()

    def description(self) -> Description:
        """Cells: one per queue length `k = 0..K`. Departures `k -> k - 1` at rate μ; batches at rate λ_B per
        server sample `d` servers, the shortest (key: the queue length) jumping `k -> k + b` with probability
        `batch_sizes[b-1]`."""
        K, B = self.K, self.batch_sizes.shape[0]
        k = np.arange(K + 1)
        zeros = np.zeros(K + 1, int)
        cells = make_cells(k, zeros, ("queue",))
        departure = LocalEvent("departure", Moves(k[1:], k[1:] - 1, zeros[1:], jnp.broadcast_to(self.mu, (K,))))
        kk, bb = (a.ravel() for a in np.meshgrid(k, np.arange(1, B + 1), indexing="ij"))
        effect = Moves(kk, kk + bb, np.zeros_like(kk), jnp.tile(self.batch_sizes, K + 1))
        arrival = Dispatch("batch arrival", self.choice, key=k, effect=effect, rate=self.batch_rate)
        return Description(cells, (departure,), (arrival,))

    def initial_state(self):
        return jnp.zeros(self.K)

    def vector_field(self, t, y, args=None):
        r"""The drift of the tails, written out (tested equal to the one derived from the description): with
        $a_j = \lambda_B\,h(s_j, s_{j+1})(s_j - s_{j+1})$ the rate of batches joining level $j$,
        $\dot s_k = \sum_{i=1}^{B} a_{k-i} P(B \ge i) - \mu (s_k - s_{k+1})$; a batch that would pass level $K$
        leaves the server at $K$ (the jobs above are lost)."""
        del t, args
        K, B = self.K, self.batch_sizes.shape[0]
        s = jnp.concatenate([jnp.ones(1), y, jnp.zeros(1)])  # s_0..s_{K+1}
        x = s[:-1] - s[1:]  # x_0..x_K
        a = self.batch_rate * self.choice.join_factor(s[:-2], s[1:-1]) * x[:-1]  # a_0..a_{K-1}
        at_least = jnp.cumsum(self.batch_sizes[::-1])[::-1]  # P(B >= i), i = 1..B
        if B <= 16:
            up = jnp.zeros(K, y.dtype)
            for i in range(1, min(B, K) + 1):  # up_k = sum_i a_{k-i} P(B >= i), k = 1..K
                up = up.at[i - 1:].add(a[: K - i + 1] * at_least[i - 1])
        else:
            up = jnp.convolve(a, at_least, mode="full")[:K]
        return up - self.mu * x[1:]

    def initial_guess(self):
        r"""Forward recursion through the levels, exact for the untruncated system. Summing the balance of the
        flows across the cuts at levels $\ge k$ gives

        $$\mu s_k = \lambda_B\Big(E[B]\,g(s_{k-1}) + \sum_{i=1}^{B-1} \big(g(s_{k-1-i}) - g(s_{k-i})\big)\,
        E[(B - i)^+]\Big),$$

        explicit in $s_k$ ($g(s_j) = 1$ for $j \le 0$). It carries no derivatives (Newton's starting point)."""
        model = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        return _forward_tails(model.batch_rate / model.mu, model.batch_sizes, model.choice.pgf, self.K)

    def value_errors(self):
        rho = self.load()
        p = self.batch_sizes
        return [
            *self.rate_value_errors(),
            (~jnp.all(jnp.isfinite(p)) | jnp.any(p < 0) | (jnp.abs(jnp.sum(p) - 1.0) > 1e-8),
             "invalid parameters: batch_sizes must be probabilities (finite, >= 0, summing to 1)"),
            *self.choice.value_errors(),
            (~(rho < 1.0), "unstable: " + fmt("job arrival rate batch_rate*E[B]={a} >= capacity mu={b} per server "
                                              "(load rho={rho})", a=self.arrival_rate, b=self.mu, rho=rho,
                                              default="batch_rate*E[B] >= capacity mu per server (load >= 1)")
             + "; no steady state exists: lower batch_rate or the batch sizes, or raise mu"),
        ]


def _forward_tails(rho_b, p, pgf, K: int):
    """`s_1..s_K` of the recursion in `JSQdBatch.initial_guess` (`rho_b` = batch rate / μ)."""
    B = p.shape[0]
    sizes = jnp.arange(1, B + 1, dtype=p.dtype)
    c = jnp.stack([jnp.sum(jnp.maximum(sizes - i, 0.0) * p) for i in range(B)])  # c[i] = E[(B - i)^+]

    def level(G, _):  # G[i] = g(s_{k-1-i}), i = 0..B-1
        s = rho_b * (c[0] * G[0] + jnp.sum((G[1:] - G[:-1]) * c[1:]))
        return jnp.concatenate([pgf(s)[None], G[:-1]]), s

    return jax.lax.scan(level, jnp.ones(B, p.dtype), None, length=K)[1]


def _default_K(rho_b: float, p: np.ndarray, weights: np.ndarray, tol: float = 1e-14) -> int:
    """Run the forward recursion until the tail falls below `tol` (at most 100,000 levels), then widen by 25 %."""
    g = np.polynomial.Polynomial(np.concatenate([[0.0], weights]))
    B = p.size
    sizes = np.arange(1, B + 1)
    c = np.array([np.sum(np.maximum(sizes - i, 0) * p) for i in range(B)])
    if rho_b * c[0] >= 1:
        return 8  # unstable: value_errors says so at the entry points
    G = np.ones(B)
    k = 0
    s = 1.0
    while s > tol and k < 100_000:
        s = rho_b * (c[0] * G[0] + np.sum((G[1:] - G[:-1]) * c[1:]))
        G = np.concatenate([[g(s)], G[:-1]])
        k += 1
    return max(8, int(np.ceil(k * 1.25)) + 4 + B)
