r"""JSQ(d) with batch PH service (the GI/M/1-type example of the framework paper): each service epoch ends by
removing a batch of jobs."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, as_choice
from .._distributions.ph import PH, concrete_mean_scv, not_a_ph
from .._errors import as_float_array, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, default_K, fmt
from .description import Description, Dispatch, LocalEvent, Moves, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


_MAX_BATCH = 4096


class JSQdBatchService(AbstractDescribedModel):
    r"""Supermarket model with batch service: $N$ servers, Poisson arrivals of rate $N\lambda$ of single jobs, each
    joining the shortest of $d$ sampled queues (ties uniformly). A server works in *service epochs* of length
    $\mathrm{PH}(\alpha, T)$; an epoch that ends while the server holds $l$ jobs removes the first
    $\min(l, B)$ of them (FCFS), $B$ drawn afresh with $P(B = b) = $ `service_batch_sizes[b-1]`. Jobs that
    arrive during an epoch are part of the queue when it ends. If jobs remain, the next epoch starts at once (phase
    $\sim\alpha$); a server that empties starts its next epoch when a job joins it.

    With exponential epochs (rate μ) and $d = 1$ each server is the bulk-service queue M/M$^{[B]}$/1 of this rule,
    whose queue length is geometric, $P(Q = n) = (1 - r) r^n$ with $r$ the root in $(0, 1)$ of
    $\lambda(1 - r) = \mu r\,(1 - E[r^B])$ (tests). The mean field is derived from the description (cells: the
    empty server and `(k, phase i)`); its Jacobian is banded with the largest batch size as bandwidth. The load is
    $\rho = \lambda E[S] / E[B]$: when queues are long every epoch removes $B$ jobs.

    **Arguments:**

    - `lam`: arrival rate per server λ.
    - `service`: the epoch length, a `jsmkt.PH` (`jsmkt.exponential(mu)` for rate μ).
    - `service_batch_sizes`: probabilities of service batch sizes 1, 2, ... (a 1-d array, differentiable).
    - `d`: choice number (integer, real, probability vector or `AbstractChoice`; see `JSQd`).
    - `K`: truncation level; chosen from the parameters when omitted.
    - `d_max`: bound on a real `d` that is traced (see `InterpolatedChoice`).

    The reduced state is the array of phase tails $S_1..S_K$, shape `(K, m)`.
    """

    lam: Float[Array, ""]
    service: PH
    service_batch_sizes: Float[Array, " B"]
    choice: AbstractChoice
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq-batch-service", (
        Parameter("lam", "rate", "arrival rate per server", field="lam", sensitivity="real"),
        Parameter("service", "ph", "service epoch distribution", field="service", sensitivity="service mean",
                  wrt="service.mean", aliases=("mean",)),
        Parameter("service_batch_sizes", "probabilities", "service batch-size probabilities",
                  what="service batch-size probabilities", field="service_batch_sizes", sensitivity="probabilities"),
        Parameter("d", "choice", "choice number of arrivals", default=2, field="choice", sensitivity="choice"),
        TRUNCATION,
    ), specs=("examples/jsq_batch_service.toml",), published=True)

    @classmethod
    def examples(cls) -> dict:
        from .._distributions.ph import exponential, hyperexponential2

        return {"batch-service-h2": cls(1.2, hyperexponential2(1.0, 2.0), [0.5, 0.5], d=2, K=32),
                "batch-service-exp-d3": cls(1.4, exponential(1.0), [1 / 3] * 3, d=3, K=24)}

    def describe_service(self, mean: float, scv: float) -> str:
        if self.m == 1:
            return f"service epochs: exponential, rate mu = {1.0 / mean:.6g}"
        return f"service epochs: PH of order {self.service.order}, mean {mean:.6g}, SCV {scv:.6g}"

    def spec_values(self) -> dict:
        return {"lam": float(self.lam), "d": float(self.choice.mean),
                "service_batch_sizes": [float(p) for p in self.service_batch_sizes]}

    def describe_parameters(self) -> str:
        return (f"lam = {float(self.lam):.6g}   d = {choice_text(self.choice)}   service batches "
                f"1..{self.service_batch_sizes.shape[0]} (mean {float(self.mean_service_batch_size):.6g})")

    def __init__(self, lam: ArrayLike, service: PH, service_batch_sizes: ArrayLike, d=2, K: int | None = None, *,
                 d_max: int | None = None):
        self.lam = as_float_array("lam", lam, ndim=0, scale=True)
        if not isinstance(service, PH):
            raise ValueError(f"service={service!r} must be a jsmkt.PH distribution (jsmkt.exponential(mu) for "
                             "exponential epochs)")
        self.service = service
        self.service_batch_sizes = as_float_array("service_batch_sizes", service_batch_sizes, ndim=1)
        B = self.service_batch_sizes.shape[0]
        if not 1 <= B <= _MAX_BATCH:
            raise ValueError(f"service_batch_sizes has {B} entries: give the probabilities of batch sizes 1..B, "
                             f"1 <= B <= {_MAX_BATCH}")
        lc = concrete_array(self.lam)
        if lc is not None and not lc > 0:
            raise ValueError(f"lam={float(lc)!r} must be positive")
        p = concrete_array(self.service_batch_sizes)
        if p is not None:
            if np.any(p < 0):
                b = int(np.flatnonzero(p < 0)[0])
                raise ValueError(f"service_batch_sizes[{b}]={float(p[b])!r} (probability of a batch of {b + 1}) is "
                                 "negative")
            if abs(p.sum() - 1.0) > 1e-8:
                raise ValueError(f"service_batch_sizes={p.tolist()!r} sums to {float(p.sum())!r}; probabilities "
                                 "must sum to 1")
        self.choice = as_choice(d, d_max)
        if K is None:
            wc = concrete_array(self.choice.weights())
            if lc is None or wc is None or p is None or concrete_array(service.T) is None:
                raise ValueError("K must be given when lam, service, service_batch_sizes or d are traced "
                                 "(inside jit/grad/vmap)")
            mean_b = float(np.arange(1, B + 1) @ p)
            mean, scv = concrete_mean_scv(service)
            rho = float(lc) * mean / mean_b
            # In jobs, a server drains up to B at a time: scale the JSQ(d) rule's levels by the mean batch.
            K = int(np.ceil(default_K(rho, wc, scv) * max(1.0, mean_b))) + B
        self.K = check_K(K)

    @property
    def m(self) -> int:
        """Number of phases of a service epoch."""
        return self.service.order

    @property
    def d(self):
        """Mean choice number E[D] (the integer d for a fixed choice)."""
        return self.choice.number

    @property
    def mean_service_batch_size(self) -> Array:
        """$E[B]$."""
        p = self.service_batch_sizes
        return jnp.arange(1, p.shape[0] + 1, dtype=p.dtype) @ p

    @property
    def arrival_rate(self) -> Array:
        return self.lam

    def load(self) -> Array:
        return self.lam * self.service.mean / self.mean_service_batch_size

    def rate_scale(self) -> Array:
        return jnp.maximum(self.lam, jnp.max(-jnp.diagonal(self.service.T)))

    def declared_structure(self):
        """Banded with the largest batch size as bandwidth: an epoch moves a server down by at most that many
        levels, an arrival up by one."""
        return self.service_batch_sizes.shape[0], ()

    def description(self) -> Description:
        """Cells: the empty server and `(k, phase i)`. Local events: phase moves; epoch ends `(k, i) -> (k - b, j)`
        with probability `P(B = b) alpha[j]` for `b < k`, and to the empty server with `P(B >= k)`. Arrivals at rate
        λ join the shortest of `d` (an empty server starts an epoch in phase `j ~ alpha`)."""
        K, m = self.K, self.m
        alpha, T, T0 = self.service.alpha, self.service.T, self.service.exit_vector
        p = self.service_batch_sizes
        B = p.shape[0]
        at_least = jnp.cumsum(p[::-1])[::-1]  # P(B >= b), b = 1..B
        k, i = (a.ravel() for a in np.meshgrid(np.arange(1, K + 1), np.arange(m), indexing="ij"))
        names = ("idle", "busy") if m == 1 else ("idle",) + tuple(f"phase {j + 1}" for j in range(m))
        cells = make_cells(np.concatenate([[0], k]), np.concatenate([[0], i + 1]), names)
        busy = cells.index(k, i + 1)
        events = []
        if m > 1:
            ii, jj = np.nonzero(~np.eye(m, dtype=bool))
            kk = np.repeat(np.arange(1, K + 1), len(ii))
            events.append(LocalEvent("phase", Moves(cells.index(kk, np.tile(ii, K) + 1), kk, np.tile(jj, K) + 1,
                                                    jnp.tile(T[ii, jj], K))))
        # Epoch ends. To the empty server: from (k, i) with P(B >= k) (k <= B).
        kb = k[k <= B]
        src0 = busy[k <= B]
        to_empty = (src0, np.zeros(src0.size, int), np.zeros(src0.size, int),
                    T0[i[k <= B]] * at_least[kb - 1])
        # Partial: (k, i) -> (k - b, j), b < k, b <= B.
        rows = [(s, kk, ii, b, j) for s, kk, ii in zip(busy, k, i, strict=True) for b in range(1, min(B, kk - 1) + 1)
                for j in range(m)]
        if rows:
            s_, k_, i_, b_, j_ = (np.array(c) for c in zip(*rows, strict=True))
            partial = (s_, k_ - b_, j_ + 1, T0[i_] * p[b_ - 1] * alpha[j_])
        else:
            partial = (np.zeros(0, int),) * 3 + (jnp.zeros(0),)
        events.append(LocalEvent("epoch end", Moves(*(np.concatenate([a, b]) for a, b in
                                                      zip(to_empty[:3], partial[:3], strict=True)),
                                                    jnp.concatenate([to_empty[3], partial[3]]))))
        effect = Moves(np.concatenate([np.zeros(m, int), busy]), np.concatenate([np.ones(m, int), k + 1]),
                       np.concatenate([np.arange(m) + 1, i + 1]), jnp.concatenate([alpha, jnp.ones(K * m)]))
        arrival = Dispatch("arrival", self.choice, key=cells.level, effect=effect, rate=self.lam)
        return Description(cells, tuple(events), (arrival,))

    def initial_guess(self):
        r"""Tails $s_k = r^{e_k}$, $r$ the tail ratio of the M/M$^{[B]}$/1 queue of the rule with μ = 1/E[S] (the
        root of the class docstring, by bisection), and the JSQ(d) rule's doubly exponential decay with levels
        counted in mean batches, $e_k = E[B]\,(\delta^{k/E[B]} - 1)/(\delta - 1)$ for $\delta = E[D] > 1$ ($e_k = k$
        for $\delta = 1$: the geometric tails of that queue, exact for exponential epochs and `d = 1`); the phase
        mix $\propto \alpha(-T)^{-1}$. No derivatives (Newton's starting point)."""
        m = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        mu, p = 1.0 / m.service.mean, m.service_batch_sizes
        sizes = jnp.arange(1, p.shape[0] + 1, dtype=p.dtype)

        def excess(r):  # lam (1 - r) - mu r (1 - E[r^B]): positive on (0, r*), negative on (r*, 1) when stable
            return m.lam * (1.0 - r) - mu * r * (1.0 - jnp.sum(p * r**sizes))

        def step(bounds, _):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            up = excess(mid) > 0
            return (jnp.where(up, mid, lo), jnp.where(up, hi, mid)), None

        (lo, hi), _ = jax.lax.scan(step, (jnp.zeros(()), jnp.ones(()) - 1e-12), None, length=60)
        r = 0.5 * (lo + hi)
        k = jnp.arange(1, self.K + 1, dtype=p.dtype)
        mean_b, delta = m.mean_service_batch_size, m.choice.mean
        several = delta > 1.0 + 1e-9
        safe = jnp.where(several, delta, 2.0)
        e = jnp.where(several, mean_b * jnp.expm1(k / mean_b * jnp.log(safe)) / (safe - 1.0), k)
        s = r**e
        return s[:, None] * m.service.stationary_vector[None, :]

    def occupancy(self, y):
        X = y - jnp.concatenate([y[1:], jnp.zeros((1, self.m))])
        return jnp.concatenate([1.0 - jnp.sum(y[0])[None], X.ravel()])

    def reduce(self, x):
        X = x[1:].reshape(self.K, self.m)
        return jnp.cumsum(X[::-1], axis=0)[::-1]

    def initial_state(self):
        return jnp.zeros((self.K, self.m))

    def tails(self, y):
        return jnp.concatenate([jnp.ones(1), jnp.sum(y, axis=1)])

    def value_errors(self):
        rho = self.load()
        p = self.service_batch_sizes
        return [
            (~jnp.isfinite(self.lam) | ~(self.lam > 0), "invalid parameters: lam must be finite and positive"),
            (not_a_ph(self.service), "invalid parameters: the service is not a valid PH distribution"),
            (~jnp.all(jnp.isfinite(p)) | jnp.any(p < 0) | (jnp.abs(jnp.sum(p) - 1.0) > 1e-8),
             "invalid parameters: service_batch_sizes must be probabilities (finite, >= 0, summing to 1)"),
            *self.choice.value_errors(),
            (~(rho < 1.0), "unstable: " + fmt("lam={a} >= capacity E[B]/E[S]={b} jobs per server (load rho={rho})",
                                              a=self.lam, b=self.mean_service_batch_size / self.service.mean,
                                              rho=rho, default="lam >= capacity E[B]/E[S] (load >= 1)")
             + "; no steady state exists: lower lam, or raise the service rate or batch sizes"),
        ]
