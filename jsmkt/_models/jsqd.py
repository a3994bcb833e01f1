r"""JSQ(d) with Poisson arrivals and exponential service."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, as_choice
from .._errors import as_float_array, check_positive, concrete_array
from .base import AbstractDescribedModel, JSQFastPath, check_K, choice_text, default_K, fmt
from .description import Description, Dispatch, LocalEvent, Moves, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


class JSQd(AbstractDescribedModel):
    r"""The supermarket model: $N$ exponential servers, Poisson arrivals of rate $N\lambda$, each arrival samples
    $d$ servers with replacement and joins the shortest queue (ties uniformly).

    With $s_k$ the fraction of servers with at least $k$ jobs ($s_0 = 1$), the mean-field limit is

    $$\dot s_k = \lambda\,(g(s_{k-1}) - g(s_k)) - \mu\,(s_k - s_{k+1}), \qquad k \ge 1,$$

    with $g(s) = s^d$ (or $E[s^D]$ for a randomised choice number), whose fixed point for integer $d$ is
    $s_k = \rho^{(d^k-1)/(d-1)}$, $\rho = \lambda/\mu$.

    **Arguments:**

    - `lam`: arrival rate per server λ.
    - `d`: choice number: an integer, a real number (randomised between ⌊d⌋ and ⌊d⌋+1 with mean `d`), a
      probability vector over 1, 2, ... servers, or an `AbstractChoice`.
    - `mu`: service rate per server.
    - `K`: truncation level (largest queue length kept); chosen from the parameters when omitted.
    - `d_max`: bound on a real `d` that is traced (inside `jax.grad`), see `InterpolatedChoice`.

    The reduced state is `s_1..s_K`, shape `(K,)`.

    ??? cite "References"

        ```bibtex
        @article{mitzenmacher2001power,
          title={The power of two choices in randomized load balancing},
          author={Mitzenmacher, Michael}, journal={IEEE Trans. Parallel Distrib. Syst.},
          volume={12}, number={10}, pages={1094--1104}, year={2001}}
        @article{vvedenskaya1996queueing,
          title={Queueing system with selection of the shortest of two queues: an asymptotic approach},
          author={Vvedenskaya, N. D. and Dobrushin, R. L. and Karpelevich, F. I.},
          journal={Problems Inform. Transmission}, volume={32}, number={1}, pages={15--27}, year={1996}}
        ```
    """

    lam: Float[Array, ""]
    mu: Float[Array, ""]
    choice: AbstractChoice
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq", (
        Parameter("lam", "rate", "arrival rate per server", field="lam", sensitivity="real"),
        Parameter("d", "choice", "choice number of arrivals", default=2, field="choice", sensitivity="choice"),
        Parameter("mu", "rate", "service rate", default=1.0, field="mu", sensitivity="real"),
        TRUNCATION,
    ), specs=("examples/jsq3_exponential.toml",), published=True, simulation_service=True)

    @classmethod
    def examples(cls) -> dict:
        return {"jsq2": cls(0.7, d=2, K=14), "jsq-mixed": cls(0.8, d=[0.2, 0.3, 0.5], K=24),
                "jsq-real-d": cls(0.8, d=2.5, K=14)}

    def spec_values(self) -> dict:
        return {"lam": float(self.lam), "d": float(self.choice.mean), "mu": float(self.mu)}

    def describe_parameters(self) -> str:
        return f"lam = {float(self.lam):.6g}   d = {choice_text(self.choice)}"

    def __init__(self, lam: ArrayLike, d=2, mu: ArrayLike = 1.0, K: int | None = None, *, d_max: int | None = None):
        self.lam = as_float_array("lam", lam, ndim=0, scale=True)
        self.mu = as_float_array("mu", mu, ndim=0, scale=True)
        check_positive("lam", self.lam)
        check_positive("mu", self.mu)
        self.choice = as_choice(d, d_max)
        if K is None:
            lc, mc, wc = concrete_array(self.lam), concrete_array(self.mu), concrete_array(self.choice.weights())
            if lc is None or mc is None or wc is None:
                raise ValueError("K must be given when lam, mu or d are traced (inside jit/grad/vmap)")
            K = default_K(lc / mc, wc)
        self.K = check_K(K)

    @property
    def d(self):
        """Mean choice number E[D] (the integer d for a fixed choice)."""
        return self.choice.number

    @property
    def arrival_rate(self) -> Array:
        return self.lam

    def load(self) -> Array:
        return self.lam / self.mu

    def rate_scale(self) -> Array:
        return jnp.maximum(self.lam, self.mu)

    def jsq_fast_path(self) -> JSQFastPath | None:
        """Exponential service at rate `mu`; `None` for a subclass, which may change the physics."""
        return JSQFastPath(self.lam, self.choice, self.mu) if type(self) is JSQd else None

    def declared_structure(self):
        """Tridiagonal: level `k` exchanges servers with levels `k - 1` and `k + 1` only."""
        return 1, ()

    def description(self) -> Description:
        """Cells: one per queue length `k = 0..K`. Departures `k -> k - 1` at rate μ; arrivals at rate λ per server
        sample `d` servers and join the shortest (key: the queue length), `k -> k + 1`."""
        K = self.K
        k = np.arange(K + 1)
        cells = make_cells(k, np.zeros(K + 1, int), ("queue",))
        departure = LocalEvent("departure", Moves(k[1:], k[1:] - 1, np.zeros(K, int), jnp.broadcast_to(self.mu, (K,))))
        arrival = Dispatch("arrival", self.choice, key=k,
                           effect=Moves(k, k + 1, np.zeros(K + 1, int), jnp.ones(K + 1)), rate=self.lam)
        return Description(cells, (departure,), (arrival,))

    def occupancy(self, y):
        s = jnp.concatenate([jnp.ones(1), y, jnp.zeros(1)])
        return s[:-1] - s[1:]

    def reduce(self, x):
        return jnp.cumsum(x[::-1])[::-1][1:]

    def vector_field(self, t, y, args=None):
        del t, args
        s = jnp.concatenate([jnp.ones(1), y, jnp.zeros(1)])
        up = self.lam * self.choice.join_factor(s[:-2], s[1:-1]) * (s[:-2] - s[1:-1])
        down = self.mu * (s[1:-1] - s[2:])
        return up - down

    def initial_state(self):
        return jnp.zeros(self.K)

    def initial_guess(self):
        return exponential_tails(self.load(), self.choice, self.K)

    def tails(self, y):
        return jnp.concatenate([jnp.ones(1), y])

    def value_errors(self):
        rho = self.load()
        return [
            *self.rate_value_errors(),
            *self.choice.value_errors(),
            (~(rho < 1.0), "unstable: " + fmt("lam={lam} >= capacity mu={mu} per server (load rho={rho})",
                                              lam=self.lam, mu=self.mu, rho=rho,
                                              default="lam >= capacity mu per server (load rho = lam/mu >= 1)")
             + "; no steady state exists: lower lam or raise mu"),
        ]


def exponential_tails(rho: Array, choice: AbstractChoice, K: int) -> Array:
    r"""Tails `s_1..s_K` of the exponential-service fixed point, from the exact recursion
    $s_k = \rho\, g(s_{k-1})$ (balance of the flow across level $k$), $s_0 = 1$."""
    def level(s, _):
        s = rho * choice.pgf(s)
        return s, s

    return jax.lax.scan(level, jnp.ones_like(rho), None, length=K)[1]
