r"""A model family written outside jsmkt: JSQ(d) with impatient jobs, with the public API alone.

`JSQdAbandon` is $N$ exponential servers (rate $\mu$) with Poisson arrivals of rate $N\lambda$; each arrival samples
$d$ servers and joins the shortest queue, and each job that waits (not the one in service) abandons at rate
$\gamma$. The class states the physics once, as a `jsmkt.Description`; jsmkt derives the mean field, its fixed
point and gradients, the metrics and the simulation from it. `jsmkt.register_family` then makes it a TOML family,
so that `jsmkt solve --family examples/custom_family.py examples/custom_family.toml` solves a spec that names it.

**What E[T] means here.** jsmkt's generic metrics count a job in the throughput when it joins a server (the accepted
arrivals, $\lambda$ up to the truncation error), whether it is later served or abandons. So
`jsmkt.mean_sojourn_time` $= E[Q]/\lambda$ is, by Little's law, the mean time in system of an arriving job, served
or not. The rate of abandonments is $\gamma\,E[Q_{\text{wait}}]$ (`jsmkt.mean_number_waiting`), the rate of
services $\mu$ times the busy fraction, and they add up to $\lambda$. The description declares `fcfs=False`: an
abandoning job leaves from the middle of its queue, so the simulator's FCFS queues (which remove the oldest job)
would time the wrong jobs; the simulation then reports its mean sojourn time by the same Little's law, its time
average of $Q$ over its count of accepted jobs, so the two are compared like with like.

Run `python examples/custom_family.py`: it checks the family against the M/M/1+M queue (d = 1), its gradients
against central differences, an N = 1000 simulation against the mean field, and the CLI, and exits 0 when every
check passes (1, with the failed check's message, otherwise).
"""

import contextlib
import io
import json
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jsmkt


# --- the family (what a user writes) -----------------------------------------------------------------------------


class JSQdAbandon(jsmkt.AbstractDescribedModel):
    r"""JSQ(d) with exponential service and impatient jobs: a job that waits abandons at rate $\gamma$.

    **Arguments:** `lam` (arrival rate per server), `gamma` (abandonment rate of each waiting job), `d` (servers
    sampled per arrival, an integer), `mu` (service rate), `K` (truncation: the most jobs a server holds).

    The mean field is $\dot s_k = \lambda(s_{k-1}^d - s_k^d) - (\mu + (k-1)\gamma)(s_k - s_{k+1})$. Abandonment makes
    it stable at any load when $\gamma > 0$.
    """

    lam: jax.Array
    gamma: jax.Array
    mu: jax.Array
    d: int = eqx.field(static=True)
    K: int = eqx.field(static=True)

    def __init__(self, lam, gamma, d: int = 2, mu=1.0, K: int = 32):
        self.lam, self.gamma, self.mu = (jnp.asarray(v, dtype=float) for v in (lam, gamma, mu))
        for name, v in (("lam", self.lam), ("gamma", self.gamma), ("mu", self.mu)):
            if v.shape != ():
                raise ValueError(f"{name}={v!r} must be a scalar")
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"d={d!r} must be an integer >= 1 (the servers an arrival samples)")
        if isinstance(K, bool) or not isinstance(K, int) or K < 2:
            raise ValueError(f"K={K!r} must be an integer >= 2 (the most jobs a server holds)")
        self.d, self.K = d, K

    @property
    def arrival_rate(self):
        return self.lam

    def load(self):
        """The offered load λ/μ (the system is stable above 1 too when γ > 0)."""
        return self.lam / self.mu

    def value_errors(self):
        return [
            (~(self.lam > 0) | ~(self.mu > 0) | ~jnp.isfinite(self.lam) | ~jnp.isfinite(self.mu),
             "lam and mu must be finite and positive"),
            (~(self.gamma >= 0) | ~jnp.isfinite(self.gamma), "gamma must be finite and >= 0"),
            ((self.gamma == 0) & ~(self.lam < self.mu),
             "unstable: lam >= mu without abandonment (gamma = 0); lower lam or give gamma > 0"),
        ]

    def description(self) -> jsmkt.Description:
        """One cell per queue length k = 0..K. Service k -> k - 1 at rate μ; abandonment k -> k - 1 at rate
        (k - 1)γ (each of the k - 1 waiting jobs); arrivals sample d servers and join the shortest, k -> k + 1."""
        K = self.K
        k = np.arange(K + 1)
        queue = np.zeros(K + 1, int)  # every cell has the one status "queue"
        cells = jsmkt.make_cells(k, queue, ("queue",))
        service = jsmkt.LocalEvent("service", jsmkt.Moves(k[1:], k[1:] - 1, queue[1:], jnp.full(K, self.mu)))
        abandon = jsmkt.LocalEvent("abandonment", jsmkt.Moves(k[2:], k[2:] - 1, queue[2:], self.gamma * (k[2:] - 1)))
        arrival = jsmkt.Dispatch("arrival", jsmkt.FixedChoice(self.d), key=k,
                                 effect=jsmkt.Moves(k, k + 1, queue, jnp.ones(K + 1)), rate=self.lam)
        return jsmkt.Description(cells, (service, abandon), (arrival,), fcfs=False)


jsmkt.register_family("jsq-abandon", JSQdAbandon)
