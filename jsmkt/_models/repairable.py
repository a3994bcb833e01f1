r"""Supermarket models with repairable servers: arrival policies A.1/A.2, repair schemes R.1/R.2/R.3."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, named_choice, named_value_errors
from .._compile import fast_jit
from .._errors import as_float_array, check_positive, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, default_K, fmt
from .description import INELIGIBLE, Description, Dispatch, LocalEvent, Moves, Pool, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


WORKING, FAILED = 0, 1  # statuses under R.1 and R.2
SMALL, WAITING = 1, 2  # R.3: failed under small repair, failed waiting for a repairman


def availability_r2(alpha, beta, pgf, j=0.0, steps: int = 60):
    r"""The availability $a$ of a super repairman of rate $(1 - j)\beta$ per server beside $jN$ busy small ones
    (R.2: $j = 0$; R.3 at saturation): the root in $(0, 1 - j]$ of
    $\phi(a) = \alpha a - \beta j - (1 - j)\beta(1 - g_2(a + j))$ ($g_2$ the pgf of $d_2$), the failure flow of the
    working servers against the small repairs and the repairman's events that find a waiting server among the
    sampled ($a + j$ of the servers are not waiting). $\phi$ is convex and increasing with $\phi(0) < 0$, and
    $\phi(1 - j) = \alpha(1 - j) - \beta j > 0$ where the small repairmen saturate (always for $j = 0$), so Newton
    from $a = 1 - j$ decreases monotonically to the root. The loop carries no derivatives; one more Newton step
    from the root gives them, $\partial a = -\partial\phi/\phi'(a)$ (the implicit function theorem)."""

    def newton(a, alpha, beta, j):
        g, dg = jax.jvp(pgf, (a + j,), (jnp.ones_like(a),))
        return a - (alpha * a - beta * j - (1.0 - j) * beta * (1.0 - g)) / (alpha + (1.0 - j) * beta * dg)

    j = jnp.asarray(j, jnp.result_type(alpha))
    sa, sb, sj = (jax.lax.stop_gradient(v) for v in (alpha, beta, j))
    a = jax.lax.fori_loop(0, steps, lambda _, a: newton(a, sa, sb, sj), jnp.ones_like(alpha) - sj)
    return newton(jax.lax.stop_gradient(a), alpha, beta, j)


@fast_jit
def _availability_r2(alpha, beta, choice2, j):
    """`availability_r2` of the pgf of `choice2`, compiled whole: run operation by operation (a model's checks, as
    it is built) its loop and Newton step would compile a dozen operations one by one."""
    return availability_r2(alpha, beta, choice2.pgf, j)


class RepairableJSQ(AbstractDescribedModel):
    r"""Supermarket models with repairable servers (N. Li, Q.-L. Li & Z. G. Zhang, *Groups of Repairmen and
    Repair-based Load Balancing in Supermarket Models with Repairable Servers*).

    **The system.**

    - $N$ servers with FCFS queues and exponential service of rate μ. A working server (busy or idle) fails at rate
      α; a failed server stops serving and, once repaired, resumes the interrupted service (service time is
      cumulative, so with exponential service the remaining work is again exponential of rate μ).
    - Poisson arrivals of total rate $N\lambda$ sample `d1` servers with replacement.
      `arrival="A1"`: join the shortest queue among them (ties uniformly, status ignored).
      `arrival="A2"`: join the shortest queue; among sampled servers tied at that length, working servers have
      priority over failed ones (then ties uniformly).
    - `repair="R1"`: every server has its own repairman, rate β.
      `repair="R2"`: one super repairman of rate $N\beta$; at each of its events it samples `d2` servers with
      replacement and repairs the failed one with the longest queue (ties uniformly), or idles if none is failed.
      `repair="R3"`: $J = jN$ small repairmen of rate β, one failed server each (a failing server takes a free
      one at once; one that finishes takes a uniformly chosen failed server not under repair), and one large
      repairman of rate $(N - J)\beta$ acting like R.2 on the failed servers not under small repair.
    - Models I = (A1, R1), II = (A1, R2), III = (A2, R1), IV = (A2, R2).

    **Cells** are (queue length $k$, status), $k = 0..K$, statuses working and failed (R.3: working, under small
    repair, waiting for a repairman). The repairman of R.2 (and R.3's large one) is a dispatch of rate β (R.3:
    $(1 - j)\beta$) per server whose key prefers the longest queue among failed (R.3: waiting) servers, the others
    ineligible. R.3's small repairmen are a `Pool` of $j$ units per server held by the servers under small repair.

    **Availability.** Failures and repairs do not depend on the queue lengths in number (R.2's choice among failed
    servers does not change how many it repairs), so the fraction $a$ of working servers follows a closed
    equation: $a = \beta/(\alpha + \beta)$ under R.1, $\alpha a = \beta(1 - g_2(a))$ under R.2 ($g_2$ the pgf of
    `d2`).

    **R.3 and its two regimes.** Below saturation ($j \ge \alpha/(\alpha + \beta)$) every failed server is under
    small repair and the large repairman idles: the mean field is R.1's (no server waits), and nothing depends on
    $j$ (its derivatives are 0). At saturation ($j < \alpha/(\alpha + \beta)$) the small repairmen are all busy:
    the mass under small repair is pinned at $j$, a failing server waits, each small repair that ends takes a
    uniformly chosen waiting server, and $a$ solves $\alpha a = \beta j + (1 - j)\beta(1 - g_2(a + j))$. The
    regime is static (`saturated`, decided from `j`, `alpha` and `beta` when they are concrete; give it when they
    are traced); the switch is at $j^* = \alpha/(\alpha+\beta)$, where $a$ and the fixed point are continuous
    in $j$ but derivatives with respect to $j$ (and α, β) are one-sided: left of $j^*$ those of the saturated
    regime, right of it those below saturation. Transients follow the regime of the model: a saturated model's
    `initial_state()` is the empty system with the $jN$ small repairmen at empty servers (from which the pool stays
    full), and a trajectory of the model below saturation stays valid while its failed fraction is below $j$.
    The simulator executes the pool's rules (a failing server takes a free small repairman or waits; one that
    finishes takes a uniformly chosen waiting server), with $J = \mathrm{round}(jN)$, in either regime.

    **Stability.** Servers serve only while working, so the load is $\rho = \lambda/(\mu a)$ and the model needs
    $\rho < 1$.

    **Arguments:** `lam` (arrival rate per server), `alpha` (failure rate), `beta` (repair rate), `d1`, `d2`
    (choice numbers of arrivals and of the repairman; integer, real or probability vector as `d` of `JSQd`), `mu`,
    `arrival` (`"A1"` or `"A2"`), `repair` (`"R1"`, `"R2"` or `"R3"`), `j` (R.3's fraction of small repairmen, in
    [0, 1)), `K` (the largest queue length kept; chosen from the parameters when omitted), `d1_max`, `d2_max`
    (bounds of traced real choice numbers), `saturated` (R.3's regime, see above).

    The reduced state is the flat vector of the per-status tails (derived coordinates).
    """

    lam: Float[Array, ""]
    alpha: Float[Array, ""]
    beta: Float[Array, ""]
    mu: Float[Array, ""]
    j: Float[Array, ""] | None
    choice1: AbstractChoice
    choice2: AbstractChoice
    arrival: str = eqx.field(static=True)
    repair: str = eqx.field(static=True)
    saturated: bool = eqx.field(static=True)
    K: int = eqx.field(static=True)

    table = FamilyTable("repairable", (
        Parameter("lam", "rate", "arrival rate per server", field="lam", sensitivity="real"),
        Parameter("alpha", "rate", "failure rate", field="alpha", sensitivity="real"),
        Parameter("beta", "rate", "repair rate", field="beta", sensitivity="real"),
        Parameter("d1", "choice", "choice number of arrivals", default=2, field="choice1", sensitivity="choice"),
        Parameter("d2", "choice", "choice number of the (large) repairman", default=2, field="choice2",
                  sensitivity="choice"),
        Parameter("mu", "rate", "service rate", default=1.0, field="mu", sensitivity="real"),
        Parameter("arrival", "policy", "where arrivals may go: A1 any sampled server, A2 working servers only",
                  default="A1", choices=("A1", "A2"), field="arrival"),
        Parameter("repair", "policy", "the repair model: R1, R2 or R3", default="R1", choices=("R1", "R2", "R3"),
                  field="repair"),
        Parameter("j", "fraction", "R.3: fraction of servers with a small repairman", default=None,
                  what="the fraction of servers with a small repairman", field="j", sensitivity="real"),
        TRUNCATION,
    ), specs=("examples/repairable_model_I.toml", "examples/repairable_model_II.toml",
              "examples/repairable_model_III.toml", "examples/repairable_model_IV.toml",
              "examples/repairable_R3.toml"), utilisation="utilisation (serving)")

    @classmethod
    def examples(cls) -> dict:
        return {"model-II-real-d": cls(0.5, 0.2, 0.5, d1=1.5, d2=2.5, repair="R2", K=48),
                "R3-saturated-A2": cls(0.5, 0.2, 0.5, arrival="A2", repair="R3", j=0.1, K=24)}

    def spec_values(self) -> dict:
        return {"lam": float(self.lam), "alpha": float(self.alpha), "beta": float(self.beta),
                "d1": float(self.choice1.mean), "d2": float(self.choice2.mean), "mu": float(self.mu),
                "arrival": self.arrival, "repair": self.repair,
                **({"j": float(self.j)} if self.j is not None else {})}

    def describe_parameters(self) -> str:
        return (f"lam = {float(self.lam):.6g}   alpha = {float(self.alpha):.6g}   beta = {float(self.beta):.6g}   "
                f"d1 = {choice_text(self.choice1)}   "
                + (f"d2 = {choice_text(self.choice2)}   " if self.repair != "R1" else "")
                + f"arrival = {self.arrival}   repair = {self.repair}"
                + (f"   j = {float(self.j):.6g}" if self.j is not None else ""))

    def supports_repair_design(self) -> bool:
        """R.3 only: a share `j` of small repairmen and a large one (`jsmkt.optimise_repair`)."""
        return self.repair == "R3"

    def repair_design(self, j, d2) -> "RepairableJSQ":
        """This R.3 model with small repairmen at a share `j` of the servers and the large repairman's choice law
        `d2`, in the saturated regime (`jsmkt.optimise_repair`)."""
        return type(self)(self.lam, self.alpha, self.beta, d1=self.choice1, d2=d2, mu=self.mu, arrival=self.arrival,
                          repair="R3", j=j, K=self.K, saturated=True)

    def __init__(self, lam: ArrayLike, alpha: ArrayLike, beta: ArrayLike, d1=2, d2=2, mu: ArrayLike = 1.0,
                 arrival: str = "A1", repair: str = "R1", j: ArrayLike | None = None, K: int | None = None, *,
                 d1_max: int | None = None, d2_max: int | None = None, saturated: bool | None = None):
        if arrival not in ARRIVALS:
            raise ValueError(f"arrival={arrival!r} is not one of {', '.join(map(repr, ARRIVALS))} (A1: shortest "
                             "queue; A2: shortest queue, working servers first among ties)")
        if repair not in REPAIRS:
            raise ValueError(f"repair={repair!r} is not one of {', '.join(map(repr, REPAIRS))} (R1: a repairman per "
                             "server; R2: one super repairman; R3: small repairmen and a large one)")
        self.arrival, self.repair = arrival, repair
        self.lam = as_float_array("lam", lam, ndim=0, scale=True)
        self.alpha = as_float_array("alpha", alpha, ndim=0, scale=True)
        self.beta = as_float_array("beta", beta, ndim=0, scale=True)
        self.mu = as_float_array("mu", mu, ndim=0, scale=True)
        for name, x in (("lam", self.lam), ("alpha", self.alpha), ("beta", self.beta), ("mu", self.mu)):
            check_positive(name, x)
        if repair == "R3":
            if j is None:
                raise ValueError("repair='R3' needs j, the fraction of servers with a small repairman (0 <= j < 1)")
            self.j = as_float_array("j", j, ndim=0)
            jc = concrete_array(self.j)
            if jc is not None and not 0.0 <= jc < 1.0:
                raise ValueError(f"j={float(jc)!r} must lie in [0, 1) (the small repairmen are J = j N < N)")
            self.saturated = self._regime(saturated)
        else:
            if j is not None:
                raise ValueError(f"j={j!r} applies to repair='R3' only (here repair={repair!r})")
            if saturated is not None:
                raise ValueError(f"saturated={saturated!r} applies to repair='R3' only (here repair={repair!r})")
            self.j, self.saturated = None, False
        self.choice1 = named_choice("d1", d1, d1_max)
        self.choice2 = named_choice("d2", d2, d2_max)
        rho = concrete_array(self.load()) if all(
            concrete_array(v) is not None for v in (self.lam, self.alpha, self.beta, self.mu, self.choice2.weights())
        ) else None
        if rho is not None and not rho < 1:
            raise ValueError(self._unstable_message())
        if K is None:
            if rho is None or concrete_array(self.choice1.weights()) is None:
                raise ValueError("K must be given when lam, alpha, beta, mu, d1 or d2 are traced (inside "
                                 "jit/grad/vmap)")
            K = _default_K(self, float(rho))
        self.K = check_K(K)

    def _regime(self, saturated: bool | None) -> bool:
        """R.3's regime: `saturated` when given (checked against concrete parameters), else from them."""
        a, b, jc = (concrete_array(v) for v in (self.alpha, self.beta, self.j))
        known = None if a is None or b is None or jc is None else bool(jc < a / (a + b))
        if saturated is None:
            if known is None:
                raise ValueError("saturated must be given (True where j < alpha/(alpha + beta)) when j, alpha or "
                                 "beta are traced (inside jit/grad/vmap): it fixes R.3's regime, in which the "
                                 "derivatives are taken")
            return known
        if not isinstance(saturated, bool):
            raise ValueError(f"saturated={saturated!r} must be True or False")
        if known is not None and known != saturated:
            raise ValueError(
                f"saturated={saturated}, but j={float(jc):.6g} is {'below' if known else 'at or above'} "
                f"alpha/(alpha + beta)={float(a / (a + b)):.6g}: the small repairmen are "
                f"{'' if known else 'not '}saturated (omit saturated to have it decided)")
        return saturated

    # --- parameters ---------------------------------------------------------------------------------------------
    @property
    def choice(self) -> AbstractChoice:
        """The arrivals' choice rule (`d1`)."""
        return self.choice1

    @property
    def arrival_rate(self) -> Array:
        return self.lam

    def availability(self) -> Array:
        """The stationary fraction of working servers (class docstring)."""
        if self.repair == "R2":
            return _availability_r2(self.alpha, self.beta, self.choice2, 0.0)
        if self.saturated:
            return _availability_r2(self.alpha, self.beta, self.choice2, self.j)
        return self.beta / (self.alpha + self.beta)

    def load(self) -> Array:
        """$\\rho = \\lambda/(\\mu a)$, $a$ the availability."""
        return self.lam / (self.mu * self.availability())

    def rate_scale(self) -> Array:
        return jnp.maximum(jnp.maximum(self.lam, self.mu), jnp.maximum(self.alpha, self.beta))

    # --- physics ------------------------------------------------------------------------------------------------
    @property
    def n_status(self) -> int:
        """Statuses per queue length: working and failed (R.3: working, under small repair, waiting)."""
        return 3 if self.repair == "R3" else 2

    def description(self) -> Description:
        r"""Cells `(k, status)`, `k = 0..K`. Local events: service `(k, working) -> (k - 1, working)` at rate μ,
        failure `(k, working) -> (k, failed)` (R.3: under small repair) at rate α, and under R.1 and R.3 repair
        `(k, failed) -> (k, working)` (R.3: from under small repair) at rate β. Arrivals at rate λ per server sample
        `d1` servers, key `k` (A.1) or `2k + (not working)` (A.2), and move the chosen one `k -> k + 1`. Under R.2
        (R.3) the repairman is a dispatch of rate β ($(1 - j)\beta$) per server sampling `d2` servers, key `K - k`
        for failed (waiting) servers, the longest queue first, the others ineligible, moving the chosen one to
        working. R.3's small repairmen are a pool of `j` units per server held under small repair, in which a
        failing server without a free one waits."""
        K, S = self.K, self.n_status
        k = np.repeat(np.arange(K + 1), S)
        s = np.tile(np.arange(S), K + 1)
        names = ("working", "under small repair", "waiting for a repairman") if S == 3 else ("working", "failed")
        cells = make_cells(k, s, names, jobs=k, in_service=((s == WORKING) & (k >= 1)).astype(int))
        kk = np.arange(K + 1)
        working, failed = S * kk, S * kk + 1
        full = lambda v: jnp.broadcast_to(v, (K + 1,))  # noqa: E731
        service = LocalEvent("service", Moves(working[1:], kk[1:] - 1, np.zeros(K, int),
                                              jnp.broadcast_to(self.mu, (K,))))
        failure = LocalEvent("failure", Moves(working, kk, np.ones(K + 1, int), full(self.alpha)))
        key = k if self.arrival == "A1" else 2 * k + (s != WORKING)
        arrival = Dispatch("arrival", self.choice1, key=key,
                           effect=Moves(np.arange(S * (K + 1)), k + 1, s, jnp.ones(S * (K + 1))), rate=self.lam)
        repaired = Moves(failed, kk, np.zeros(K + 1, int), full(self.beta))
        if self.repair == "R1":
            return Description(cells, (service, failure, LocalEvent("repair", repaired)), (arrival,))
        if self.repair == "R2":
            repairman = Dispatch("repairman", self.choice2, key=np.where(s == FAILED, K - k, INELIGIBLE),
                                 effect=repaired._replace(weight=jnp.ones(K + 1)), rate=self.beta, arrivals=False)
            return Description(cells, (service, failure), (arrival, repairman))
        waiting = S * kk + WAITING
        large = Dispatch("large repairman", self.choice2, key=np.where(s == WAITING, K - k, INELIGIBLE),
                         effect=Moves(waiting, kk, np.zeros(K + 1, int), jnp.ones(K + 1)),
                         rate=(1.0 - self.j) * self.beta, arrivals=False)
        pool = Pool(held=SMALL, waiting=WAITING, capacity=self.j, saturated=self.saturated)
        return Description(cells, (service, failure, LocalEvent("small repair", repaired)), (arrival, large), pool)

    def initial_guess(self):
        r"""Working with probability $a$ (R.3 at saturation: under small repair with probability $j$, the rest
        waiting) independently of the queue, whose tails are those of JSQ(d1) at the load $\rho$
        ($s_k = \rho\,g_1(s_{k-1})$); no derivatives (Newton's starting point)."""
        m = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        rho, a = m.load(), m.availability()

        def level(s, _):
            s = rho * m.choice1.pgf(s)
            return s, s

        s = jnp.concatenate([jnp.ones(1), jax.lax.scan(level, jnp.ones_like(rho), None, length=self.K)[1],
                             jnp.zeros(1)])
        p = s[:-1] - s[1:]
        if self.repair != "R3":
            split = [a, 1.0 - a]
        elif self.saturated:
            split = [a, m.j, 1.0 - a - m.j]
        else:
            split = [a, 1.0 - a, jnp.zeros_like(a)]
        return m.reduce(jnp.stack([w * p for w in split], axis=1).ravel())

    def _unstable_message(self) -> str:
        return "unstable: " + fmt(
            "lam={lam} >= mu*a={cap}, the service capacity per server (availability a={a}, load rho={rho})",
            lam=self.lam, cap=self.mu * self.availability(), a=self.availability(), rho=self.load(),
            default="lam >= mu*a, the service capacity per server (a the availability)",
        ) + "; lower lam or alpha, or raise mu or beta"

    def value_errors(self):
        out = [
            *self.rate_value_errors(),
            *named_value_errors("d1", self.choice1),
            *named_value_errors("d2", self.choice2),
        ]
        if self.repair == "R3":
            out.append((~(self.j >= 0.0) | ~(self.j < 1.0), "invalid parameters: j must lie in [0, 1)"))
            below = self.j < self.alpha / (self.alpha + self.beta)
            out.append((below != self.saturated, f"R.3 built with saturated={self.saturated}, but j is "
                        f"{'at or above' if self.saturated else 'below'} alpha/(alpha + beta): the other regime "
                        "(give the saturated that matches the parameters)"))
        out.append((~(self.load() < 1.0), self._unstable_message()))
        return out

    # --- named observables ----------------------------------------------------------------------------------------
    def observables(self):
        r"""Functions of the occupancy $x$ of the cells $(k, \text{status})$:

        - `availability`: the fraction of working servers;
        - `customers_at_failed_servers`: the fraction of the customers in the system held at failed servers,
          $\sum_k k\,x_{k,\text{failed}} / \sum_k k\,x_k$;
        - `repairmen_utilisation`: the fraction of the repair capacity $N\beta$ that is repairing: R.1, the failed
          fraction; R.2, the fraction of the repairman's events that find a failed server, $1 - g_2(a)$; R.3, the
          small repairmen's busy fraction of all servers plus the large one's share $(1 - j)$ times the fraction of
          its events that find a waiting server;
        - `fraction_failed_waiting` (R.3 only): the fraction of failed servers that wait for a repairman.

        On a simulated occupancy, the pgf terms of R.2 and R.3 are evaluated at the time-averaged fractions, whereas
        a finite system's repairman finds a failed server with the time average of $1 - g_2(a(t))$: the two differ
        by $\tfrac12 g_2''\,\mathrm{Var}(a(t))$, of order $1/N$."""
        out = {"availability": self._working, "customers_at_failed_servers": self._at_failed,
               "repairmen_utilisation": self._repairing}
        if self.repair == "R3":
            out["fraction_failed_waiting"] = self._waiting
        return out

    def _working(self, x) -> Array:
        return jnp.sum(x.reshape(self.K + 1, self.n_status)[:, WORKING])

    def _at_failed(self, x) -> Array:
        x = x.reshape(self.K + 1, self.n_status)
        k = jnp.arange(self.K + 1, dtype=x.dtype)
        return jnp.sum(k * x[:, WORKING + 1:].sum(axis=1)) / jnp.sum(k * x.sum(axis=1))

    def _repairing(self, x) -> Array:
        x = x.reshape(self.K + 1, self.n_status)
        failed = jnp.sum(x[:, FAILED])
        if self.repair == "R2":
            return 1.0 - self.choice2.pgf(1.0 - failed)
        if self.repair == "R3":
            return failed + (1.0 - self.j) * (1.0 - self.choice2.pgf(1.0 - jnp.sum(x[:, WAITING])))
        return failed

    def _waiting(self, x) -> Array:
        x = x.reshape(self.K + 1, self.n_status)
        return jnp.sum(x[:, WAITING]) / jnp.sum(x[:, SMALL:])

    def check_r3(self, what: str) -> None:
        """Raise `ValueError` unless the model has R.3's small repairmen (`what`: the metric asked for)."""
        if self.repair != "R3":
            raise ValueError(f"{what} is defined for repair='R3' (here repair={self.repair!r})")

    # --- the observables at a reduced state ---------------------------------------------------------------------
    def fraction_working(self, y) -> Array:
        """The fraction of working servers at the reduced state `y`."""
        return self._working(self.occupancy(y))

    def customers_at_failed(self, y) -> Array:
        """The fraction of customers held at failed servers (`observables`)."""
        return self._at_failed(self.occupancy(y))

    def repairmen_utilisation(self, y) -> Array:
        """The fraction of the repair capacity $N\\beta$ that is repairing (`observables`)."""
        return self._repairing(self.occupancy(y))

    def fraction_failed_waiting(self, y) -> Array:
        """The fraction of failed servers that wait for a repairman (R.3; 0 below saturation)."""
        self.check_r3("fraction_failed_waiting")
        return self._waiting(self.occupancy(y))


def _default_K(model: RepairableJSQ, rho: float) -> int:
    """`default_K` at the load ρ, widened for failures, a heuristic (the solvers check the tail mass at `K`).
    Arrivals that sample one server (probability `w1`) keep joining a failed server, so deep in the tail each
    server is an M/M/1 queue with breakdowns at arrival rate λ w1, whose queue-length tail decays geometrically at
    the root η in (0, 1) of det(A0 + z A1 + z² A2) = 0 for its (working, failed) quasi-birth-death blocks; under
    R.2 the repair rate is taken as the one that gives R.1 the same availability."""
    weights = np.asarray(model.choice1.weights())
    a, b, lam, mu = (float(np.asarray(v)) for v in (model.alpha, model.beta, model.lam, model.mu))
    if model.repair == "R2" or model.saturated:
        avail = float(np.asarray(model.availability()))
        b = a * avail / (1.0 - avail) if avail < 1.0 else b
    decay = None
    lam1 = lam * float(weights[0])
    if lam1 > 0:
        # (mu z^2 - (lam1 + mu + a) z + lam1)(lam1 - (lam1 + b) z) - a b z^2 = 0, a cubic in z
        p = np.polymul([mu, -(lam1 + mu + a), lam1], [-(lam1 + b), lam1]) - np.array([0.0, a * b, 0.0, 0.0])
        roots = np.roots(p)
        inside = [r.real for r in roots if abs(r.imag) < 1e-12 and 0.0 < r.real < 1.0 - 1e-12]
        decay = max(inside) if inside else None
    return default_K(rho, weights, scv=1.0 + 2.0 * a / b, decay=decay)


# The words of the family's policies, from its table (the constructor checks them).
ARRIVALS = RepairableJSQ.table.parameter("arrival").choices
REPAIRS = RepairableJSQ.table.parameter("repair").choices
