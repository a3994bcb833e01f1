r"""JSQ(d) with BMAP arrivals (the framework paper's M/G/1-type example): one global BMAP feeds the N servers."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, as_choice
from .._distributions.bmap import BMAP, not_a_bmap
from .._errors import as_float_array, check_positive, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, fmt
from .batch import JSQdBatch, _default_K
from .description import Description, Dispatch, LocalEvent, Modulation, Moves, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


class JSQdBMAP(AbstractDescribedModel):
    r"""Supermarket model with BMAP arrivals (Li, *Super-exponential solution in Markovian supermarket models*,
    Section 3): $N$ exponential FCFS servers of rate μ fed by **one** BMAP of descriptor
    $(NC, ND_1, ND_2, \ldots)$; each batch samples $d$ servers with replacement and joins the one with the fewest
    jobs as a whole (ties uniformly).

    **The limit.** The BMAP's phase $J$ moves at rate $O(N)$ while the occupancy moves by $1/N$ per event, so the
    phase is a fast variable: over the time the occupancy takes to change, $J$ has visited its phases in the
    proportions of its stationary law $\gamma$, independently of the occupancy. Averaging, the $N$-server system
    converges to JSQ(d) with *Poisson* batches, of size $b$ at rate $\lambda_b = \gamma D_b\mathbf1$ per server:

    $$\dot s_k = \sum_{j<k} \big(g(s_j) - g(s_{j+1})\big) \sum_{b \ge k - j} \lambda_b - \mu\,(s_k - s_{k+1}),$$

    the model `JSQdBatch` with batch rate $\sum_b\lambda_b$ and batch law $\lambda_b/\sum_{b'}\lambda_{b'}$ (for
    $d = 1$: M^X/M/1 queues, not BMAP/M/1). The phase's correlations change only the $O(1/N)$ terms and the
    fluctuations (`jsmkt.refined_mean_field` includes them), which `experiments/framework/` measures.

    The description states the physics itself: cells `k = 0..K`, departures, and one dispatch per batch size $b$
    whose rate is set by a `Modulation` environment (the BMAP's phase, its moves with a batch of $b$ at the rates
    $D_b$ and without at $C$'s off-diagonal rates); the mean field is derived by averaging over $\gamma$, the
    simulator runs the phase. The paper's equations (11)–(16) and closed form are
    `jsmkt.published.JSQdBMAPAsPublished` and `jsmkt.published.bmap_fixed_point`.

    **Arguments:**

    - `bmap`: the arrival process per server, a `jsmkt.BMAP` (the system's is $N$ times faster).
    - `d`: choice number (integer, real, probability vector or `AbstractChoice`; see `JSQd`).
    - `mu`: service rate per server.
    - `K`: truncation level; chosen from the parameters when omitted.
    - `d_max`: bound on a real `d` that is traced (see `InterpolatedChoice`).

    The reduced state is `s_1..s_K`, shape `(K,)`; the load is $\rho = \sum_b b\lambda_b/\mu$.
    """

    bmap: BMAP
    mu: Float[Array, ""]
    choice: AbstractChoice
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq-bmap", (
        Parameter("arrivals", "bmap", "the BMAP of arrivals per server", arg="bmap", field="bmap",
                  sensitivity="bmap rates", wrt="arrivals.rates", aliases=("rates",)),
        Parameter("d", "choice", "choice number of arrivals", default=2, field="choice", sensitivity="choice"),
        Parameter("mu", "rate", "service rate", default=1.0, field="mu", sensitivity="real"),
        TRUNCATION,
    ), specs=("examples/jsq_bmap.toml",), published=True)

    @classmethod
    def examples(cls) -> dict:
        bmap = BMAP([[-0.52, 0.02], [0.0, -0.41]], [[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])
        return {"bmap-mmpp-pairs": cls(bmap, d=2, K=40), "bmap-real-d": cls(bmap, d=1.5, mu=0.8, K=40)}

    def spec_values(self) -> dict:
        return {"arrivals": {"C": self.bmap.C.tolist(), "D": self.bmap.D.tolist()}, "d": float(self.choice.mean),
                "mu": float(self.mu), "lam": float(self.arrival_rate),
                "batch_rates": [float(x) for x in self.batch_rates]}

    def describe_parameters(self) -> str:
        B, order = self.bmap.max_batch, self.bmap.order
        return (f"BMAP of order {order}, batches 1..{B} (rates "
                f"{', '.join(f'{float(x):.6g}' for x in self.batch_rates)})   d = {choice_text(self.choice)}")

    def __init__(self, bmap: BMAP, d=2, mu: ArrayLike = 1.0, K: int | None = None, *, d_max: int | None = None):
        if not isinstance(bmap, BMAP):
            raise ValueError(f"bmap={bmap!r} must be a jsmkt.BMAP")
        self.bmap = bmap
        self.mu = as_float_array("mu", mu, ndim=0, scale=True)
        check_positive("mu", self.mu)
        self.choice = as_choice(d, d_max)
        if K is None:
            conc = [concrete_array(x) for x in (bmap.C, bmap.D, self.mu, self.choice.weights())]
            if any(c is None for c in conc):
                raise ValueError("K must be given when the BMAP, mu or d are traced (inside jit/grad/vmap)")
            rates = np.asarray(bmap.batch_rates)
            K = _default_K(float(rates.sum() / conc[2]), rates / rates.sum(), conc[3])
        self.K = check_K(K)

    @property
    def d(self):
        """Mean choice number E[D] (the integer d for a fixed choice)."""
        return self.choice.number

    @property
    def batch_rates(self) -> Float[Array, " B"]:
        r"""$\lambda_b = \gamma D_b\mathbf1$ per server, $b = 1..B$: the batch-Poisson limit's rates."""
        return self.bmap.batch_rates

    @property
    def arrival_rate(self) -> Array:
        """Job arrival rate per server, $\\sum_b b\\lambda_b$."""
        return self.bmap.rate

    def load(self) -> Array:
        return self.arrival_rate / self.mu

    def rate_scale(self) -> Array:
        return jnp.maximum(self.bmap.batch_rate, self.mu)

    def declared_structure(self):
        """Banded with the largest batch size as bandwidth (as `JSQdBatch`)."""
        return self.bmap.max_batch, ()

    def limit(self) -> JSQdBatch:
        """The batch-Poisson model this system converges to: `JSQdBatch` with the averaged batch rates (same `d`,
        `mu`, `K`; differentiable in the BMAP)."""
        rates = self.batch_rates
        total = jnp.sum(rates)
        return JSQdBatch(total, rates / total, d=self.choice, mu=self.mu, K=self.K)

    def description(self) -> Description:
        """Cells: one per queue length `k = 0..K`. Departures `k -> k - 1` at rate μ. Dispatch `b` (a batch of `b`
        jobs, `b = 1..B`): samples `d` servers, the shortest (key: the queue length) jumps `k -> k + b`; its rate is
        the BMAP phase's, `D[b-1]`, under a `Modulation` whose silent moves are `C`'s off-diagonal rates."""
        K, B = self.K, self.bmap.max_batch
        k = np.arange(K + 1)
        zeros = np.zeros(K + 1, int)
        cells = make_cells(k, zeros, ("queue",))
        departure = LocalEvent("departure", Moves(k[1:], k[1:] - 1, zeros[1:], jnp.broadcast_to(self.mu, (K,))))
        dispatches = tuple(
            Dispatch(f"batch of {b}", self.choice, key=k, effect=Moves(k, k + b, zeros, jnp.ones(K + 1)))
            for b in range(1, B + 1)
        )
        env = Modulation(tuple(range(B)), self.bmap.D, self.bmap.C)
        return Description(cells, (departure,), dispatches, environment=env)

    def initial_state(self):
        return jnp.zeros(self.K)

    def vector_field(self, t, y, args=None):
        """The drift of the tails, that of `limit()` (tested equal to the one derived from the description)."""
        return self.limit().vector_field(t, y, args)

    def initial_guess(self):
        """The exact forward recursion of `limit()` (no derivatives: Newton's starting point)."""
        return self.limit().initial_guess()

    def value_errors(self):
        rho = self.load()
        return [
            (not_a_bmap(self.bmap), "invalid parameters: the BMAP is not a descriptor (C's off-diagonal and D's "
                                    "entries >= 0, rows of C + sum_b D[b] summing to 0, some arrivals)"),
            *self.rate_value_errors(),
            *self.choice.value_errors(),
            (~(rho < 1.0), "unstable: " + fmt(
                "job arrival rate {a} >= capacity mu={b} per server (load rho={rho})", a=self.arrival_rate,
                b=self.mu, rho=rho, default="job arrival rate >= capacity mu per server (load >= 1)")
             + "; no fixed point exists: lower the BMAP's rates or raise mu"),
        ]
