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
        abandon = jsmkt.LocalEvent("abandonment", jsmkt.Moves(k[2:], k[2:] - 1, queue[2:], self.gamma * (k[2:] - 1.0)))
        arrival = jsmkt.Dispatch("arrival", jsmkt.FixedChoice(self.d), key=k,
                                 effect=jsmkt.Moves(k, k + 1, queue, jnp.ones(K + 1)), rate=self.lam)
        return jsmkt.Description(cells, (service, abandon), (arrival,), fcfs=False)


jsmkt.register_family("jsq-abandon", JSQdAbandon)


# --- the checks ----------------------------------------------------------------------------------------------------

SPEC = pathlib.Path(__file__).resolve().with_suffix(".toml")  # model = "jsq-abandon", lam 0.9, gamma 0.2, d 2, K 24


class CheckFailed(Exception):
    """A check that did not pass; the message says which and by how much."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def mm1m_law(lam: float, gamma: float, mu: float, n_max: int = 400) -> np.ndarray:
    """The stationary law P(Q = n), n = 0..n_max, of the M/M/1+M queue: a birth-death chain with birth rate λ and
    death rate μ + (n - 1)γ at n >= 1, so P(n) ∝ prod_{j=1..n} λ / (μ + (j - 1)γ) (truncated at n_max, far out:
    the terms fall faster than geometrically)."""
    n = np.arange(1, n_max + 1)
    log_p = np.concatenate([[0.0], np.cumsum(np.log(lam) - np.log(mu + (n - 1) * gamma))])
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def check_mm1m() -> None:
    """d = 1: each server is on its own an M/M/1+M queue, so the mean field's fixed point is its stationary law.
    At λ > μ: stable only through abandonment."""
    lam, gamma, mu, K = 1.2, 0.3, 1.0, 40
    model = JSQdAbandon(lam, gamma, d=1, mu=mu, K=K)
    fp = jsmkt.solve_fixed_point(model)
    p = mm1m_law(lam, gamma, mu)
    n = np.arange(p.size)
    tails = np.cumsum(p[::-1])[::-1]  # P(Q >= k)
    err = float(np.max(np.abs(np.asarray(jsmkt.tails(model, fp)) - tails[: K + 1])))
    check(err < 1e-12, f"d = 1: the tails differ from the M/M/1+M law by {err:.3g}")
    EQ, EQ_wait = float(n @ p), float(np.maximum(n - 1, 0) @ p)
    # Every arriving job joins (throughput λ); its mean time in system, served or abandoning, is E[Q]/λ.
    for name, got, want in [("E[Q]", jsmkt.mean_queue_length(model, fp), EQ),
                            ("E[T] = E[Q]/lam", jsmkt.mean_sojourn_time(model, fp), EQ / lam),
                            ("E[Q waiting]", jsmkt.mean_number_waiting(model, fp), EQ_wait),
                            ("throughput", jsmkt.throughput(model, fp), lam),
                            ("P(busy)", jsmkt.utilisation(model, fp), 1.0 - p[0])]:
        rel = abs(float(got) / want - 1.0)
        check(rel < 1e-11, f"d = 1: {name} = {float(got):.12g}, the M/M/1+M queue's is {want:.12g} (rel {rel:.2g})")
    # Every job leaves served or abandoning: mu P(busy) + gamma E[Q waiting] = lam.
    served, abandoned = mu * float(jsmkt.utilisation(model, fp)), gamma * float(jsmkt.mean_number_waiting(model, fp))
    check(abs(served + abandoned - lam) < 1e-12, f"d = 1: services {served} + abandonments {abandoned} != lam {lam}")
    print(f"d = 1 vs M/M/1+M (lam = {lam}, gamma = {gamma}): tails to {err:.1e}; E[T] = {EQ / lam:.10g}, "
          f"P(abandon) = {abandoned / lam:.6g}")


def mean_sojourn_time(lam, gamma, d: int = 2, K: int = 24):
    model = JSQdAbandon(lam, gamma, d=d, K=K)
    return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))


def check_gradients() -> None:
    """jax.grad of E[T] (through the fixed point's implicit adjoint) against central differences."""
    lam, gamma = 0.9, 0.2
    grad = jax.grad(mean_sojourn_time, argnums=(0, 1))(lam, gamma)
    for i, (name, x) in enumerate((("lam", lam), ("gamma", gamma))):
        h = 1e-5 * x
        up = mean_sojourn_time(*[(v + h if j == i else v) for j, v in enumerate((lam, gamma))])
        down = mean_sojourn_time(*[(v - h if j == i else v) for j, v in enumerate((lam, gamma))])
        fd = float(up - down) / (2 * h)
        rel = abs(float(grad[i]) / fd - 1.0)
        check(rel < 1e-6, f"dE[T]/d{name}: jax.grad {float(grad[i]):.10g}, central difference {fd:.10g} "
                          f"(rel {rel:.2g})")
        print(f"dE[T]/d{name} = {float(grad[i]):.10g} (central difference {fd:.10g})")


def check_simulation() -> None:
    """N = 1000 servers against the mean field: E[T] within 1 %, its 95 % half-width under 0.5 %. Both are
    E[Q]/(accepted job rate), by Little's law (the description says `fcfs=False`: module docstring)."""
    model = JSQdAbandon(0.9, 0.2, d=2, K=24)
    ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    # max_queue: a server of the 1000 holds at most a handful of jobs (s_7 is about 1e-15); a deeper truncation only
    # raises the uniformisation rate, mu + (max_queue - 1) gamma. A move beyond it would raise a ValueError.
    res = jsmkt.simulate(model, 1000, 1000.0, key=jax.random.key(0), n_replications=8, max_queue=12)
    sim, hw = res.mean_sojourn_time, res.mean_sojourn_time_ci
    rel = abs(sim / ET - 1.0)
    print(f"N = 1000: E[T] = {sim:.6g} ± {hw:.2g} (95 %), mean field {ET:.6g} (rel. difference {rel:.2%})")
    check(hw / sim < 0.005, f"simulation: the 95 % half-width of E[T] is {hw / sim:.2%} of it (>= 0.5 %)")
    check(rel < 0.01, f"simulation: E[T] = {sim:.6g} ± {hw:.2g}, the mean field's {ET:.6g} (rel {rel:.2%} >= 1 %)")


def check_cli() -> None:
    """`jsmkt solve --family examples/custom_family.py examples/custom_family.toml` equals the solve above."""
    from jsmkt.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["solve", "--family", __file__, str(SPEC), "--format", "json", "--no-cache"])
    check(code == 0, f"jsmkt solve --family ... exited {code}")
    res = json.loads(out.getvalue())
    ET = float(mean_sojourn_time(0.9, 0.2, d=2, K=res["K"]))
    check(res["model"] == "JSQdAbandon" and abs(res["mean_sojourn_time"] - ET) < 1e-12 * ET,
          f"jsmkt solve: {res['model']} E[T] = {res['mean_sojourn_time']!r}, solve_fixed_point's {ET!r}")
    print(f"jsmkt solve --family {pathlib.Path(__file__).name} {SPEC.name}: E[T] = {res['mean_sojourn_time']:.10g}")


def main() -> int:
    try:
        check_mm1m()
        check_gradients()
        check_simulation()
        check_cli()
    except CheckFailed as e:
        print(f"custom_family.py: check failed: {e}", file=sys.stderr)
        return 1
    print("custom_family.py: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
