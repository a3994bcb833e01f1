r"""JSQ(d) with Poisson arrivals and phase-type service: the exact mean-field limit."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, as_choice
from .._dense import mmatrix_solve
from .._distributions.ph import PH, concrete_mean_scv, not_a_ph
from .._errors import as_float_array, concrete_array
from .base import AbstractDescribedModel, JSQFastPath, check_K, choice_text, default_K, fmt, mph1_tail_decay
from .description import Description, Dispatch, LocalEvent, Moves, make_cells
from .parameters import TRUNCATION, FamilyTable, Parameter


_GUESS_STEPS = 16  # safeguarded Newton steps per level of the initial guess (bisection alone: 2^-16 of s_{k-1})


class JSQdPH(AbstractDescribedModel):
    r"""Supermarket model with PH service: $N$ FCFS servers, Poisson arrivals of rate $N\lambda$, each arrival
    samples $d$ servers with replacement and joins the shortest queue (ties uniformly); service times are
    $\mathrm{PH}(\alpha, T)$ of order $m$.

    Let $S_k \in \mathbb{R}^m$ hold the fraction of servers with at least $k$ jobs whose job in service is in
    phase $i$, $s_k = S_k\mathbf{1}$ ($s_0 = 1$), and $X_k = S_k - S_{k+1}$ the servers with exactly $k$ jobs.
    An arrival joins a server with exactly $k$ jobs with probability $g(s_k) - g(s_{k+1})$ ($g(s) = s^d$), and
    that server's phase is distributed as the phase mix $X_k / (s_k - s_{k+1})$ of such servers (α for an empty
    server). The exact mean-field limit is therefore

    $$\dot S_1 = \lambda\,(1 - g(s_1))\,\alpha + S_1 T + S_2 T^0\alpha,$$
    $$\dot S_k = \lambda\, h(s_{k-1}, s_k)\, X_{k-1} + S_k T + S_{k+1} T^0 \alpha, \qquad k \ge 2,$$

    with $h(a, b) = (g(a) - g(b))/(a - b)$. The published system (Li & Lui, eq. (1)–(3)) writes
    $\lambda(S_{k-1}^{\odot d} - S_k^{\odot d})$ instead, which is not this probability unless $m = 1$ or
    $d = 1$; it is kept as `jsmkt.published.JSQdPHAsPublished`.

    **Arguments:**

    - `lam`: arrival rate per server λ.
    - `service`: the service-time distribution, a `jsmkt.PH`.
    - `d`: choice number (integer, real, probability vector or `AbstractChoice`; see `JSQd`).
    - `K`: truncation level; chosen from the parameters when omitted.
    - `d_max`: bound on a real `d` that is traced (inside `jax.grad`), see `InterpolatedChoice`.

    The reduced state is the array of phase tails $S_1..S_K$, shape `(K, m)`.
    """

    lam: Float[Array, ""]
    service: PH
    choice: AbstractChoice
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq-ph", (
        Parameter("lam", "rate", "arrival rate per server", field="lam", sensitivity="real"),
        Parameter("service", "ph", "service time distribution", field="service", sensitivity="service mean",
                  wrt="service.mean", aliases=("mean",)),
        Parameter("d", "choice", "choice number of arrivals", default=2, field="choice", sensitivity="choice"),
        TRUNCATION,
    ), specs=("examples/jsq2_h2.toml", "examples/jsq2_erlang2.toml", "examples/jsq2_coxian_explicit.toml",
              "examples/jsq2_moments.toml", "examples/jsq_randomised_d.toml"),
        published=True, simulation_service=True)

    @classmethod
    def examples(cls) -> dict:
        from .._distributions.ph import erlang, hyperexponential2

        return {"jsq2-h2": cls(0.8, hyperexponential2(1.0, 4.0), d=2, K=24),
                "jsq-erlang-real-d": cls(0.7, erlang(3), d=2.5, K=12)}

    def describe_service(self, mean: float, scv: float) -> str:
        return f"service: PH of order {self.service.order}, mean {mean:.6g}, SCV {scv:.6g}"

    def spec_values(self) -> dict:
        return {"lam": float(self.lam), "d": float(self.choice.mean)}

    def describe_parameters(self) -> str:
        return f"lam = {float(self.lam):.6g}   d = {choice_text(self.choice)}"

    def __init__(self, lam: ArrayLike, service: PH, d=2, K: int | None = None, *, d_max: int | None = None):
        if not isinstance(service, PH):
            raise ValueError(f"service={service!r} must be a jsmkt.PH distribution")
        self.lam = as_float_array("lam", lam, ndim=0, scale=True)
        lc = concrete_array(self.lam)
        if lc is not None and not lc > 0:
            raise ValueError(f"lam={float(lc)!r} must be positive")
        self.service = service
        self.choice = as_choice(d, d_max)
        if K is None:
            wc = concrete_array(self.choice.weights())
            if lc is None or wc is None or concrete_array(service.T) is None:
                raise ValueError("K must be given when lam, service or d are traced (inside jit/grad/vmap)")
            mean, scv = concrete_mean_scv(service)
            rho = float(lc) * mean
            w1 = float(wc[0])  # P(D = 1): those arrivals leave a geometric tail (M/PH/1 at rate lam w1)
            decay = None
            if w1 > 0 and rho * w1 < 1:
                decay = mph1_tail_decay(float(lc) * w1, concrete_array(service.alpha), concrete_array(service.T))
            K = default_K(rho, wc, scv, decay=decay)
        self.K = check_K(K)

    @property
    def m(self) -> int:
        """Number of service phases (the order of `service`)."""
        return self.service.order

    @property
    def d(self):
        """Mean choice number E[D] (the integer d for a fixed choice)."""
        return self.choice.number

    @property
    def arrival_rate(self) -> Array:
        return self.lam

    def load(self) -> Array:
        return self.lam * self.service.mean

    def rate_scale(self) -> Array:
        return jnp.maximum(self.lam, jnp.max(-jnp.diagonal(self.service.T)))

    def jsq_fast_path(self) -> JSQFastPath | None:
        """PH service `service`; `None` for a subclass, which may change the physics."""
        return JSQFastPath(self.lam, self.choice, self.service) if type(self) is JSQdPH else None

    def declared_structure(self):
        """Block tridiagonal (blocks of the phases): level `k` exchanges servers with levels `k - 1` and `k + 1`
        only."""
        return 1, ()

    def description(self) -> Description:
        """Cells: the empty server (status `idle`) and `(k, phase i)` for `k = 1..K` jobs, `i` the phase of the job
        in service. Local events: phase moves `i -> j` at rate `T[i, j]`; completions at rate `T0[i]`, the next job
        starting in phase `j ~ alpha` (or the server emptying). Arrivals at rate λ per server sample `d` servers
        and join the shortest (key: the queue length); a job joining an empty server starts in phase `j ~ alpha`,
        one joining a busy server leaves its phase unchanged."""
        K, m = self.K, self.m
        alpha, T, T0 = self.service.alpha, self.service.T, self.service.exit_vector
        k, i = (a.ravel() for a in np.meshgrid(np.arange(1, K + 1), np.arange(m), indexing="ij"))
        cells = make_cells(np.concatenate([[0], k]), np.concatenate([[0], i + 1]),
                           ("idle",) + tuple(f"phase {j + 1}" for j in range(m)))
        busy = cells.index(k, i + 1)
        # Phase moves within a level: rows (k, i) -> (k, j), i != j.
        ii, jj = np.nonzero(~np.eye(m, dtype=bool))
        kk = np.repeat(np.arange(1, K + 1), len(ii))
        phase = Moves(cells.index(kk, np.tile(ii, K) + 1), kk, np.tile(jj, K) + 1, jnp.tile(T[ii, jj], K))
        # Completions: (k, i) -> (k - 1, j) at T0[i] alpha[j]; (1, i) -> empty at T0[i].
        ci, cj = (a.ravel() for a in np.meshgrid(np.arange(m), np.arange(m), indexing="ij"))
        kk = np.repeat(np.arange(2, K + 1), m * m)
        done = Moves(
            np.concatenate([cells.index(np.ones(m, int), np.arange(m) + 1), cells.index(kk, np.tile(ci, K - 1) + 1)]),
            np.concatenate([np.zeros(m, int), kk - 1]),
            np.concatenate([np.zeros(m, int), np.tile(cj, K - 1) + 1]),
            jnp.concatenate([T0, jnp.tile(T0[ci] * alpha[cj], K - 1)]),
        )
        # Arrivals: the empty server starts the job in phase j ~ alpha; a busy one keeps its phase.
        effect = Moves(np.concatenate([np.zeros(m, int), busy]), np.concatenate([np.ones(m, int), k + 1]),
                       np.concatenate([np.arange(m) + 1, i + 1]), jnp.concatenate([alpha, jnp.ones(K * m)]))
        arrival = Dispatch("arrival", self.choice, key=cells.level, effect=effect, rate=self.lam)
        return Description(cells, (LocalEvent("phase", phase), LocalEvent("completion", done)), (arrival,))

    def occupancy(self, y):
        X = y - jnp.concatenate([y[1:], jnp.zeros((1, self.m))])
        return jnp.concatenate([1.0 - jnp.sum(y[0])[None], X.ravel()])

    def reduce(self, x):
        X = x[1:].reshape(self.K, self.m)
        return jnp.cumsum(X[::-1], axis=0)[::-1]

    def vector_field(self, t, y, args=None):
        del t, args
        alpha, T = self.service.alpha, self.service.T
        T0 = self.service.exit_vector
        s = jnp.concatenate([jnp.ones(1), jnp.sum(y, axis=1)])  # s_0..s_K
        h = self.choice.join_factor(s[:-1], s[1:])  # h(s_{k-1}, s_k), k = 1..K
        X_prev = jnp.concatenate([((1.0 - s[1]) * alpha)[None], y[:-1] - y[1:]])  # X_{k-1}, k = 1..K
        arrivals = self.lam * h[:, None] * X_prev
        completions = jnp.concatenate([y[1:] @ T0, jnp.zeros(1)])[:, None] * alpha[None, :]
        return arrivals + y @ T + completions

    def initial_state(self):
        return jnp.zeros((self.K, self.m))

    def initial_guess(self):
        r"""Forward recursion through the levels, exact for the untruncated system.

        Summing the drift over levels $\ge k+1$ gives $S_{k+1}T^0 = \lambda g(s_k)$ at the fixed point (the
        completions out of levels $\ge k+1$ balance the arrivals into them), so level 1 gives $S_1 = \rho\,\omega$
        and level $k \ge 2$ gives
        $S_k(\lambda h_k I - T) = \lambda h_k S_{k-1} + \lambda g(s_k)\alpha$, $h_k = h(s_{k-1}, s_k)$: one scalar
        equation for $s_k = S_k\mathbf 1$ per level, solved by Newton's method safeguarded by bisection on
        $[0, s_{k-1}]$ (until a step moves $s_k$ by less than a few ulps of $s_{k-1}$, at most `_GUESS_STEPS`
        steps). Forward recursions amplify rounding errors, so this is only Newton's starting point (typically 1-2
        steps from the root). It carries no derivatives: the fixed point's come from the implicit function theorem.
        """
        model = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        lam, alpha, T = model.lam, model.service.alpha, model.service.T
        T0 = model.service.exit_vector
        choice = model.choice
        shift = jnp.eye(self.m)
        S1 = model.load() * model.service.stationary_vector

        def level(S_prev, _):
            s_prev = jnp.sum(S_prev)
            phase_mix = S_prev / jnp.maximum(s_prev, 1e-300)
            s = jnp.clip(lam * choice.pgf(s_prev) / jnp.maximum(phase_mix @ T0, 1e-300), 0.0, s_prev)

            def S_of(s):
                h = choice.join_factor(s_prev, s)
                return mmatrix_solve((lam * h * shift - T).T, lam * h * S_prev + lam * choice.pgf(s) * alpha)

            # F(s) = sum(S_of(s)) - s has F(0) >= 0 and its root in [0, s_prev]; F need not be monotone there
            # (for large d it turns back up below zero), so Newton alone can leave for the wrong branch from a poor
            # start. Safeguarded Newton: keep a bracket [lo, hi] by the sign of F and bisect whenever a Newton step
            # leaves it.
            def step(carry):
                i, s, lo, hi, _ = carry
                F, dF = jax.jvp(lambda s: jnp.sum(S_of(s)) - s, (s,), (jnp.ones_like(s),))
                lo, hi = jnp.where(F > 0, s, lo), jnp.where(F > 0, hi, s)
                newton = s - F / jnp.where(dF == 0, -1.0, dF)
                inside = (newton > lo) & (newton < hi) & jnp.isfinite(newton)
                s_new = jnp.where(inside, newton, 0.5 * (lo + hi))
                return i + 1, s_new, lo, hi, jnp.abs(s_new - s)

            def going(carry):
                i, _, _, _, moved = carry
                return (i < _GUESS_STEPS) & (moved > tol)

            zero = jnp.zeros_like(s)
            tol = 4 * jnp.finfo(s.dtype).eps * s_prev
            _, s, _, _, _ = jax.lax.while_loop(going, step, (0, s, zero, s_prev + zero, s_prev + 1.0))
            S = S_of(s)
            return S, S

        _, rest = jax.lax.scan(level, S1, None, length=self.K - 1)
        return jnp.concatenate([S1[None], rest])

    def tails(self, y):
        return jnp.concatenate([jnp.ones(1), jnp.sum(y, axis=1)])

    def has_phase_tails(self) -> bool:
        return True

    def phase_tails(self, y):
        """`S_k` per phase, `k = 1..K`, shape `(K, m)`."""
        return y

    def value_errors(self):
        alpha, T = self.service.alpha, self.service.T
        bad_ph = not_a_ph(self.service)
        bad_num = ~jnp.isfinite(self.lam) | ~jnp.all(jnp.isfinite(alpha)) | ~jnp.all(jnp.isfinite(T))
        return [
            (bad_num | ~(self.lam > 0),
             "invalid parameters: " + fmt("lam={lam}", lam=self.lam, default="lam")
             + " must be finite and positive and the PH entries finite"),
            (bad_ph, "invalid PH service: alpha must be a probability vector (entries >= 0, sum 1) and T a "
                     "sub-generator (negative diagonal, non-negative off-diagonal entries, row sums <= 0)"),
            *self.choice.value_errors(),
            (~(self.load() < 1.0),
             "unstable: " + fmt("lam={lam} >= capacity 1/E[S]={cap} per server (load rho=lam*E[S]={rho})",
                                lam=self.lam, cap=1.0 / self.service.mean, rho=self.load(),
                                default="lam >= capacity 1/E[S] per server (load rho = lam*E[S] >= 1)")
             + "; no steady state exists: lower lam or speed up service"),
        ]
