r"""The retrial supermarket model: bufferless servers, one orbit per server, choice numbers d1 and d2."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, FixedChoice, named_choice, named_value_errors
from .._errors import as_float_array, check_positive, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, fmt
from .description import Description, Dispatch, LocalEvent, Moves, make_cells
from .meanfield import job_flows
from .parameters import TRUNCATION, FamilyTable, Parameter


IDLE, BUSY = 0, 1
_MAX_DEFAULT_K = 4096  # the default truncation never exceeds the solvers' largest `max_K`


class RetrialJSQ(AbstractDescribedModel):
    r"""The retrial supermarket model (Li, Wang, Lui & Wang, *The Chaos of Propagation in a Retrial Supermarket
    Model*): $N$ identical single-server nodes without waiting room, each with its own orbit.

    **The system.**

    - Primary customers arrive in a Poisson process of rate $N\lambda$; service times are exponential of rate μ;
      a server holds at most one customer.
    - A primary arrival samples `d1` servers with replacement. If one of them is idle it is served there (uniformly
      among the idle sampled); otherwise it joins the orbit of the sampled server with the fewest orbit customers
      (ties uniformly).
    - Orbit customers retry: an orbit of $j \ge 1$ customers emits retrials at rate $j\theta$ (`policy="linear"`,
      each customer independently at rate θ) or θ (`policy="constant"`).
    - `retrial="reprobe"` (the paper's model): the retrying customer leaves its orbit and samples `d2` servers
      with replacement (its old server possibly among them); if one is idle it is served there, otherwise it joins
      the shortest orbit among the sampled (possibly its old one).
      `retrial="own"`: the customer retries its own server only; it is served if that server is idle, else it
      stays in the orbit (`d2` is unused).

    **Cells** are (orbit size $j$, idle/busy), $j = 0..K$; the level of a cell is its orbit size. A server holds
    $j + 1_{\rm busy}$ customers, of whom $1_{\rm busy}$ is in service, so `mean_queue_length` is the mean number
    per server in the system, `mean_number_waiting` (`mean_orbit_size`) the mean orbit size, `mean_sojourn_time`
    $E[T]$ by Little's law, `prob_blocked` the probability that a primary customer finds all `d1` sampled servers
    busy, and `tails` the orbit-size tails $P(\text{orbit} \ge k)$.

    **The mean field** is derived from the description (`jsmkt._models.description`, the tail rule). Every
    customer is eventually served, so at the fixed point the busy fraction is $\rho = \lambda/\mu$, a primary is
    blocked with probability $g_1(\rho)$ ($g_i$ the pgf of $d_i$) and a re-probing retrial succeeds with
    probability $1 - g_2(\rho)$; the balance of the orbits gives, for linear re-probing retrials,
    $E[\text{orbit}] = \lambda g_1(\rho)/(\theta(1 - g_2(\rho)))$. The re-probing retrial stream moves two servers
    per event (a `Partner`: the origin's orbit shrinks, the chosen server gains the customer). Its rate is a
    functional of the whole occupancy ($\theta E[\text{orbit}]$ for linear retrials, $\theta P(\text{orbit} \ge 1)$
    for constant ones), as is the probability of finding an idle server. With the constant policy the Jacobian is
    banded in the orbit levels plus border columns. With the linear policy it is dense in the tails: an own retrial
    changes a server's status at a rate $j\theta$ that grows with the orbit, and the re-probing stream's rate
    $\theta E[\text{orbit}]$ depends on every tail; Newton then solves the balance of each cell with the stream's
    rate as an unknown of its own, a banded system plus a border (`jsmkt._models.newton`).

    **Stability.** The mean field needs $\lambda < \mu$. With the constant policy the orbits must also empty
    faster than blocked primaries fill them: $\lambda g_1(\rho) < \theta(1 - g_2(\rho))$ for re-probing
    retrials, $\lambda g_1(\rho) < \theta(1 - \rho)$ for own retrials (necessary; for `d1 = 1` it is the M/M/1
    retrial queue's condition $\lambda(\lambda + \theta) < \theta\mu$).

    **Arguments:**

    - `lam`: primary arrival rate per server λ.
    - `theta`: retrial rate θ (per orbit customer for `policy="linear"`, per non-empty orbit for `"constant"`).
    - `d1`, `d2`: choice numbers of primary arrivals and of retrials (integer, real or probability vector, as `d`
      of `JSQd`).
    - `mu`: service rate.
    - `retrial`: `"reprobe"` (default) or `"own"`.
    - `policy`: `"linear"` (default) or `"constant"`.
    - `K`: the largest orbit size kept; chosen from the parameters when omitted (the solvers report the fraction
      of servers at orbit size `K`, `FixedPoint.tail_mass`, and refuse a `K` where it exceeds `tail_tol`). Orbits
      that need a `K` above 4096 (a slow retrial rate θ: linear retrials keep about $\lambda g_1(\rho)/(\theta(1 -
      g_2(\rho)))$ customers per orbit) are refused at once, as is a `K` below a mean orbit of more than 4096.
    - `d1_max`, `d2_max`: bounds on real choice numbers that are traced (inside `jax.grad`).

    The reduced state is the flat vector of the per-status tails (derived coordinates), shape `(2K + 1,)`.
    """

    lam: Float[Array, ""]
    theta: Float[Array, ""]
    mu: Float[Array, ""]
    choice1: AbstractChoice
    choice2: AbstractChoice
    retrial: str = eqx.field(static=True)
    policy: str = eqx.field(static=True)
    K: int = eqx.field(static=True)

    table = FamilyTable("retrial", (
        Parameter("lam", "rate", "arrival rate per server", field="lam", sensitivity="real"),
        Parameter("theta", "rate", "retrial rate", field="theta", sensitivity="real"),
        Parameter("d1", "choice", "choice number of primary arrivals", default=2, field="choice1",
                  sensitivity="choice"),
        Parameter("d2", "choice", "choice number of retrials", default=2, field="choice2", sensitivity="choice"),
        Parameter("mu", "rate", "service rate", default=1.0, field="mu", sensitivity="real"),
        Parameter("retrial", "policy", "who retries: a re-probing orbit or each server's own orbit",
                  default="reprobe", choices=("reprobe", "own"), field="retrial"),
        Parameter("policy", "policy", "retrial rate of an orbit: linear in its size or constant", default="linear",
                  choices=("linear", "constant"), field="policy"),
        TRUNCATION,
    ), specs=("examples/retrial_reprobe.toml",), level="orbit", utilisation="utilisation (busy)")

    @classmethod
    def examples(cls) -> dict:
        return {"retrial-reprobe-real-d": cls(0.7, 1.0, d1=1.5, d2=2.5, K=16),
                "retrial-own-constant-real-d": cls(0.6, 2.0, d1=2.5, retrial="own", policy="constant", K=16)}

    def spec_values(self) -> dict:
        return {"lam": float(self.lam), "theta": float(self.theta), "d1": float(self.choice1.mean),
                "d2": float(self.choice2.mean), "mu": float(self.mu), "retrial": self.retrial, "policy": self.policy}

    def describe_parameters(self) -> str:
        return (f"lam = {float(self.lam):.6g}   theta = {float(self.theta):.6g}   d1 = {choice_text(self.choice1)}   "
                + (f"d2 = {choice_text(self.choice2)}   " if self.retrial == "reprobe" else "")
                + f"retrial = {self.retrial}   policy = {self.policy}")

    def __init__(self, lam: ArrayLike, theta: ArrayLike, d1=2, d2=2, mu: ArrayLike = 1.0, retrial: str = "reprobe",
                 policy: str = "linear", K: int | None = None, *, d1_max: int | None = None,
                 d2_max: int | None = None):
        if retrial not in RETRIALS:
            raise ValueError(f"retrial={retrial!r} is not one of {', '.join(map(repr, RETRIALS))} (re-probe d2 "
                             "servers, or retry the customer's own server)")
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not one of {', '.join(map(repr, POLICIES))} (retrial rate j*theta "
                             "for an orbit of j customers, or theta per non-empty orbit)")
        self.retrial, self.policy = retrial, policy
        self.lam = as_float_array("lam", lam, ndim=0, scale=True)
        self.theta = as_float_array("theta", theta, ndim=0, scale=True)
        self.mu = as_float_array("mu", mu, ndim=0, scale=True)
        for name, x in (("lam", self.lam), ("theta", self.theta), ("mu", self.mu)):
            check_positive(name, x)
        self.choice1 = named_choice("d1", d1, d1_max)
        self.choice2 = named_choice("d2", d2, d2_max)
        lc, mc = concrete_array(self.lam), concrete_array(self.mu)
        if lc is not None and mc is not None and not lc < mc:
            raise ValueError(self._unstable_message())  # the words of `value_errors`, as `solve` and `simulate` say
        tc = concrete_array(self.theta)
        if policy == "constant" and lc is not None and mc is not None and tc is not None:
            rho = lc / mc  # on the host: a model built once (the CLI) compiles nothing for its checks
            g1, g2 = (concrete_array(c.pgf(rho)) for c in (self.choice1, self.choice2))
            if g1 is not None and g2 is not None:
                flag, msg = _orbit_balance(lc, tc, g1, g2, rho, retrial)
                if bool(flag):
                    raise ValueError(msg)
        if K is None:
            if not all(concrete_array(a) is not None for a in (self.lam, self.theta, self.mu,
                                                                self.choice1.weights(), self.choice2.weights())):
                raise ValueError("K must be given when lam, theta, mu, d1 or d2 are traced (inside jit/grad/vmap)")
            K = _default_K(self.lam, self.theta, self.mu, self.choice1, self.choice2, retrial, policy)
        self.K = check_K(K)
        if policy == "linear" and all(concrete_array(a) is not None for a in (
                self.lam, self.theta, self.mu, self.choice1.weights(), self.choice2.weights())):
            m, what = _mean_orbit_bound(self.lam, self.theta, self.mu, self.choice1, self.choice2, retrial)
            if m > max(self.K, _MAX_DEFAULT_K):  # the truncated orbits' mean is at most K
                raise ValueError(
                    f"K={self.K} cannot hold the orbits: with theta={float(self.theta):.6g} their mean is {what} = "
                    f"{m:.3g} customers per server, above K (and above {_MAX_DEFAULT_K}, solve_fixed_point's default "
                    "max_K); "
                    f"raise theta (theta >= {float(self.theta) * m / (_MAX_DEFAULT_K / 2):.3g} keeps the mean orbit "
                    f"below {_MAX_DEFAULT_K // 2}) or lower lam, or give K well above {m:.3g}")

    # --- parameters -------------------------------------------------------------------------------------------
    @property
    def choice(self) -> AbstractChoice:
        """The primary arrivals' choice rule (`d1`)."""
        return self.choice1

    @property
    def d1(self):
        """Mean choice number of primary arrivals, E[D1] (the integer d1 for a fixed choice)."""
        return self.choice1.number

    @property
    def d2(self):
        """Mean choice number of retrials, E[D2] (the integer d2 for a fixed choice)."""
        return self.choice2.number

    @property
    def arrival_rate(self) -> Array:
        return self.lam

    def load(self) -> Array:
        return self.lam / self.mu

    def rate_scale(self) -> Array:
        return jnp.maximum(jnp.maximum(self.lam, self.mu), self.theta)

    def retrial_rates(self, j: np.ndarray) -> Array:
        """The rate at which an orbit of `j >= 1` customers emits retrials."""
        if self.policy == "linear":
            return self.theta * jnp.asarray(j, float)
        return jnp.broadcast_to(self.theta, np.shape(j))

    # --- physics ----------------------------------------------------------------------------------------------
    def description(self) -> Description:
        """Cells `(j, idle)` and `(j, busy)`, `j = 0..K`. Service `(j, busy) -> (j, idle)` at rate μ. Primary
        arrivals at rate λ per server sample `d1` servers; the key prefers idle servers (key 0, whatever their
        orbit), then busy ones by orbit size (key `1 + j`); the chosen one moves `(j, idle) -> (j, busy)` or
        `(j, busy) -> (j + 1, busy)`. Re-probing retrials: a stream with an origin, each `(j, s)`, `j >= 1`,
        starting it at the retrial rate and moving to `(j - 1, s)`, whose customer then samples `d2` servers with
        the same key and effect. Own retrials: a local event `(j, idle) -> (j - 1, busy)` at the retrial rate (a
        retrial at a busy server changes nothing)."""
        K = self.K
        j = np.repeat(np.arange(K + 1), 2)
        s = np.tile([IDLE, BUSY], K + 1)
        cells = make_cells(j, s, ("idle", "busy"), jobs=j + s, in_service=s)
        jj = np.arange(K + 1)
        ones = np.ones(K + 1, int)
        service = LocalEvent("service", Moves(2 * jj + 1, jj, 0 * ones, jnp.broadcast_to(self.mu, (K + 1,))))
        key = np.where(s == IDLE, 0, 1 + j)
        effect = Moves(np.arange(2 * (K + 1)), j + s, ones.repeat(2), jnp.ones(2 * (K + 1)))
        primary = Dispatch("primary", self.choice1, key=key, effect=effect, rate=self.lam)
        rates = self.retrial_rates(jj[1:])
        if self.retrial == "own":
            retry = LocalEvent("retrial", Moves(2 * jj[1:], jj[1:] - 1, ones[1:], rates))
            return Description(cells, (service, retry), (primary,), fcfs=False, random_order=True)
        origin = Moves(np.arange(2, 2 * (K + 1)), j[2:] - 1, s[2:], jnp.repeat(rates, 2))
        retrial = Dispatch("retrial", self.choice2, key=key, effect=effect, origin=origin, arrivals=False)
        return Description(cells, (service,), (primary, retrial), fcfs=False)

    def initial_guess(self):
        r"""Busy with probability ρ independently of the orbit, whose size is Poisson (linear policy) or geometric
        (constant policy) with the mean (or $P(\ge 1)$) the orbit balance gives with the mean-field success
        probabilities; for own retrials with `d1 = 1` the exact M/M/1 retrial queue. No derivatives (Newton's
        starting point)."""
        m = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        return m.reduce(_guess_occupancy(m.lam, m.theta, m.mu, m.choice1, m.choice2, m.retrial, m.policy, m.K))

    def value_errors(self):
        rho = self.load()
        out = [
            *self.rate_value_errors(),
            *named_value_errors("d1", self.choice1),
            *named_value_errors("d2", self.choice2),
            (~(rho < 1.0), self._unstable_message()),
        ]
        if self.policy == "constant":
            out.append(_orbit_balance(self.lam, self.theta, self.choice1.pgf(rho), self.choice2.pgf(rho), rho,
                                      self.retrial))
        return out

    def _unstable_message(self) -> str:
        return "unstable: " + fmt("lam={a} >= mu={b} (load rho={rho})", a=self.lam, b=self.mu, rho=self.load(),
                                  default="lam >= mu (load rho = lam/mu >= 1)") + \
            "; the servers cannot serve the primary arrivals: lower lam or raise mu"

    def rates_grow_with_level(self) -> bool:
        """Linear retrials: a cell's retrial rate is proportional to its orbit size (the simulator then keeps the
        orbit sizes the mean field gives mass). The constant policy keeps the simulator's default."""
        return self.policy == "linear"

    # --- named observables --------------------------------------------------------------------------------------
    def observables(self):
        r"""Functions of the occupancy $x$ of the cells $(j, \text{idle}|\text{busy})$:

        - `mean_orbit_size`: $\sum_j j\,x_j$;
        - `prob_blocked`: the fraction of primary customers that find every sampled server busy, the waiting flow
          over the offered flow of the primary stream ($g_1(\text{busy fraction})$);
        - `prob_retrial_success`: re-probing, $1 - g_2(\text{busy fraction})$; own retrials, the retrials that find
          their server idle over all retrials, $\sum_j r_j x_{j,\text{idle}} / \sum_j r_j x_j$;
        - `mean_sojourn_time_tagged` (linear re-probing only): $1/\mu + g_1(\rho)/(\theta(1 - g_2(\rho)))$, ρ the
          busy fraction (`sojourn_time_tagged`).

        On a simulated occupancy, the pgf terms are evaluated at the time-averaged busy fraction, whereas a finite
        system's blocking is the time average of $g(\text{busy fraction}(t))$: the two differ by
        $\tfrac12 g''\,\mathrm{Var}(\text{busy fraction}(t))$, of order $1/N$."""
        out = {"mean_orbit_size": self._mean_orbit, "prob_blocked": self._blocked,
               "prob_retrial_success": self._retrial_success}
        if self.retrial == "reprobe" and self.policy == "linear":
            out["mean_sojourn_time_tagged"] = self._tagged
        return out

    def _mean_orbit(self, x) -> Array:
        x = x.reshape(self.K + 1, 2)
        return jnp.sum(jnp.arange(self.K + 1, dtype=x.dtype) * x.sum(axis=1))

    def _blocked(self, x) -> Array:
        f = job_flows(self.description(), x, "primary")
        return f.waiting / f.offered

    def _retrial_success(self, x) -> Array:
        x = x.reshape(self.K + 1, 2)
        if self.retrial == "reprobe":
            return 1.0 - self.choice2.pgf(jnp.sum(x[:, BUSY]))
        r = self.retrial_rates(np.arange(1, self.K + 1))
        return jnp.sum(r * x[1:, IDLE]) / jnp.sum(r * x[1:].sum(axis=1))

    def _tagged(self, x) -> Array:
        rho = jnp.sum(x.reshape(self.K + 1, 2)[:, BUSY])
        return 1.0 / self.mu + self.choice1.pgf(rho) / (self.theta * (1.0 - self.choice2.pgf(rho)))

    def check_tagged(self) -> None:
        """Raise `ValueError` unless the tagged-customer E[T] exists (linear re-probing retrials)."""
        if not (self.retrial == "reprobe" and self.policy == "linear"):
            raise ValueError(f"the tagged-customer E[T] exists for retrial='reprobe', policy='linear' only (here "
                             f"retrial={self.retrial!r}, policy={self.policy!r}): a customer's retrials then succeed "
                             "independently of its orbit; use mean_sojourn_time (Little's law)")

    # --- metrics the description does not name ------------------------------------------------------------------
    def retrial_attempt_rate(self, y) -> Array:
        """Retrials per unit time per server, $\\sum_{j\\ge1} r_j x_j$ ($r_j$ the retrial rate of an orbit of
        `j`)."""
        x = self.occupancy(y).reshape(self.K + 1, 2)
        return jnp.sum(self.retrial_rates(np.arange(1, self.K + 1)) * x[1:].sum(axis=1))

    def prob_retrial_success(self, y) -> Array:
        """Probability that a retrial is served at the reduced state `y` (`observables`)."""
        return self._retrial_success(self.occupancy(y))

    def sojourn_time_tagged(self, y) -> Array:
        r"""$E[T]$ of a tagged customer, for linear re-probing retrials: served at once with probability
        $1 - g_1(\rho)$; otherwise each of its retrials (rate θ) succeeds independently with probability
        $1 - g_2(\rho)$, so $E[T] = 1/\mu + g_1(\rho)/(\theta(1 - g_2(\rho)))$, ρ the busy fraction."""
        self.check_tagged()
        return self._tagged(self.occupancy(y))


def _guess_occupancy(lam, theta, mu, choice1, choice2, retrial: str, policy: str, K: int) -> Float[Array, " C"]:
    """The occupancy of `RetrialJSQ.initial_guess`."""
    lam, theta, mu = (jnp.asarray(v, float) for v in (lam, theta, mu))  # stop_gradient may hand back Python floats
    rho = lam / mu
    j = jnp.arange(K + 1, dtype=rho.dtype)
    if retrial == "own" and isinstance(choice1, FixedChoice) and choice1.d == 1:
        return _mm1_retrial_occupancy(lam, theta, mu, policy, K)
    success = 1.0 - (choice2.pgf(rho) if retrial == "reprobe" else rho)
    inflow = lam * choice1.pgf(rho)
    if policy == "linear":
        m = inflow / (theta * success)
        p = jnp.exp(-m + j * jnp.log(m) - gammaln(j + 1.0))
    else:
        q = jnp.minimum(inflow / (theta * success), 0.999)
        p = (1.0 - q) * q**j
    p = p / jnp.sum(p)
    return jnp.stack([(1.0 - rho) * p, rho * p], axis=1).ravel()


def _mm1_retrial_occupancy(lam, theta, mu, policy: str, K: int) -> Float[Array, " C"]:
    r"""The M/M/1 retrial queue (own retrials, one server sampled) at orbit sizes `0..K`, from the balance of the
    cut between orbit sizes $j$ and $j+1$, $\lambda p_{1,j} = r_{j+1} p_{0,j+1}$, and of the cell $(j, \text{idle})$,
    $(\lambda + r_j) p_{0,j} = \mu p_{1,j}$ ($r_j$ the retrial rate, $r_0 = 0$), normalised over `0..K`."""
    j = jnp.arange(K + 1, dtype=jnp.result_type(lam))
    r = theta * j if policy == "linear" else jnp.where(j > 0, theta, 0.0)
    log_ratio = jnp.log(lam) + jnp.log(lam + r[:-1]) - jnp.log(mu) - jnp.log(r[1:])  # p0[j+1] / p0[j]
    log_p0 = jnp.concatenate([jnp.zeros(1, j.dtype), jnp.cumsum(log_ratio)])
    log_p1 = log_p0 + jnp.log(lam + r) - jnp.log(mu)
    logs = jnp.stack([log_p0, log_p1], axis=1).ravel()
    p = jnp.exp(logs - jnp.max(logs))
    return p / jnp.sum(p)


def _orbit_balance(lam, theta, g1, g2, rho, retrial: str) -> tuple:
    """`(flag, message)`: whether constant retrials cannot empty the orbits, whose inflow `lam*g1(rho)` (blocked
    primaries) must stay below the most they empty, `theta*(1 - g2(rho))` (re-probing) or `theta*(1 - rho)` (own);
    NumPy or JAX values alike (`g1`, `g2` the pgfs of d1 and d2 at rho)."""
    inflow = lam * g1
    if retrial == "reprobe":
        cap, what = theta * (1.0 - g2), "theta*(1 - g2(rho))"
    else:
        cap, what = theta * (1.0 - rho), "theta*(1 - rho)"
    return (~(inflow < cap), "unstable: " + fmt(
        f"with constant retrials the orbits fill at rate lam*g1(rho)={{a}} (blocked primaries) but empty at "
        f"most at rate {what}={{b}}", a=inflow, b=cap,
        default=f"with constant retrials lam*g1(rho) >= {what}: the orbits fill faster than they empty")
        + "; raise theta, d1 or d2, or lower lam")


def _mean_orbit_bound(lam, theta, mu, choice1, choice2, retrial: str) -> tuple[float, str]:
    r"""For linear retrials, a lower bound on the mean orbit size at the fixed point, and its formula. Every blocked
    primary (rate $\lambda g_1(\rho)$) joins an orbit, and each orbit customer retries at rate θ: re-probing
    retrials succeed with probability $1 - g_2(\rho)$, so the balance gives the mean exactly,
    $\lambda g_1(\rho)/(\theta(1 - g_2(\rho)))$; own retrials succeed at most at every retrial, so the mean is at
    least $\lambda g_1(\rho)/\theta$."""
    lam, theta, mu = (float(np.asarray(v)) for v in (lam, theta, mu))
    rho = lam / mu
    inflow = lam * float(choice1.pgf(rho))
    if retrial == "reprobe":
        return inflow / (theta * (1.0 - float(choice2.pgf(rho)))), "lam*g1(rho)/(theta*(1 - g2(rho)))"
    return inflow / theta, "at least lam*g1(rho)/theta"


def _default_K(lam, theta, mu, choice1, choice2, retrial: str, policy: str, tol: float = 1e-14) -> int:
    """The smallest orbit size whose tail in the initial guess's law is below `tol`, widened by half and 8 levels
    (within 8.._MAX_DEFAULT_K); the solvers check the actual tail mass at `K`. A `ValueError` when that orbit size
    exceeds `_MAX_DEFAULT_K` (a slow retrial rate: orbits of thousands of customers or more), before any solve.

    The guess's law has the mean orbit of the balance (linear retrials: Poisson; constant: geometric of ratio q), so
    its tail point is estimated first (mean + 8 standard deviations; log(tol)/log(q)) and only an estimate within
    twice the largest K is refined on the law itself."""
    lt, tt, mt = (float(np.asarray(v)) for v in (lam, theta, mu))
    rho = lt / mt
    success = 1.0 - (float(choice2.pgf(rho)) if retrial == "reprobe" else rho)
    ratio = lt * float(choice1.pgf(rho)) / (tt * success)  # the guess's mean orbit, or its q
    formula = "lam*g1(rho)/(theta*" + ("(1 - g2(rho)))" if retrial == "reprobe" else "(1 - rho))")
    if policy == "linear":
        estimate = ratio + 8.0 * math.sqrt(ratio)
        scale = f"the mean orbit is about {formula} = {ratio:.3g} customers per server"
        advice = f"raise theta (theta >= {tt * ratio / (_MAX_DEFAULT_K / 2):.3g} keeps it below {_MAX_DEFAULT_K // 2})"
    else:
        estimate = math.log(tol) / math.log(ratio) if ratio < 1.0 else math.inf
        scale = f"the orbits' tails fall like q^k, q = {formula} = {ratio:.6g}"
        advice = "raise theta"
    k = estimate
    if estimate <= 2 * _MAX_DEFAULT_K:
        K = 64
        while True:
            x = np.asarray(_guess_occupancy(lam, theta, mu, choice1, choice2, retrial, policy, K)).reshape(K + 1, 2)
            tail = np.cumsum(x.sum(1)[::-1])[::-1]
            below = np.flatnonzero(tail < tol)
            if below.size and below[0] < K // 2 or K >= 2 * _MAX_DEFAULT_K:
                k = int(below[0]) if below.size else max(K, estimate)
                break
            K *= 2
    if k > _MAX_DEFAULT_K:
        raise ValueError(
            f"theta={tt:.6g} is too slow a retrial rate for the mean field's truncation: {scale}, so K would need to "
            f"be about {k:.3g}, above {_MAX_DEFAULT_K}, the largest K chosen by default (and solve_fixed_point's "
            f"default max_K); {advice} or lower lam, or give K (2K + 1 unknowns)")
    return int(min(max(8, int(np.ceil(1.5 * k)) + 8), _MAX_DEFAULT_K))


# The words of the family's policies, from its table (the constructor checks them).
RETRIALS = RetrialJSQ.table.parameter("retrial").choices
POLICIES = RetrialJSQ.table.parameter("policy").choices
