r"""JSQ with several arrival classes (the framework paper, Section 5) and helpers that serve the longest queues
(the paper's output choice numbers)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import AbstractChoice, named_choice, named_value_errors
from .._distributions.ph import PH, concrete_mean_scv, exponential, not_a_ph
from .._errors import as_float_array, check_positive, concrete_array
from .base import AbstractDescribedModel, check_K, choice_text, default_K, fmt, mph1_tail_decay
from .description import INELIGIBLE, Description, Dispatch, LocalEvent, Moves, make_cells
from .meanfield import job_flows
from .parameters import TRUNCATION, FamilyTable, Parameter


_MAX_BATCH = 4096
_GUESS_NEWTON = 10  # Newton steps per level of the initial guess with helpers


def _sequence(name: str, x) -> list:
    if isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 1:  # e.g. helper_rates as an array
        return list(x)
    if isinstance(x, (str, bytes)) or not isinstance(x, (list, tuple)):
        raise ValueError(f"{name}={x!r} must be a list with one entry per class (or per helper)")
    return list(x)


class JSQdClasses(AbstractDescribedModel):
    r"""Supermarket model with several arrival classes and optional helpers: $N$ FCFS servers with
    $\mathrm{PH}(\alpha, T)$ service (exponential of rate μ by default).

    - *Arrival class* $j = 1..v$: batches arrive in a Poisson process of rate $N\lambda_j$, a batch holds $b$ jobs
      with probability `batch_sizes[j][b-1]` (single jobs by default), samples $d_j$ servers with replacement and
      joins the one with the fewest jobs as a whole (ties uniformly). A batch that finds an empty server starts
      its first job in phase $\sim\alpha$; one joining a busy server leaves the phase in service unchanged.
    - *Helper pool* $l = 1..w$ (output choice numbers): events at rate $N\nu_l$, each samples $f_l$ servers and
      completes the job in service at the one with the **most** jobs (ties uniformly; nothing happens when every
      sampled server is empty). The next job, if any, starts its service in phase $\sim\alpha$. The helpers take the
      head of the queue, so the servers stay FCFS.

    With $s_k$ the fraction of servers with at least $k$ jobs, a class-$j$ batch joins a server with exactly $i$
    jobs with probability $g_j(s_i) - g_j(s_{i+1})$, and a helper event completes a job at a server with at
    least $k$ jobs with probability $1 - (1 - s_k)^{f_l}$. For exponential service the flows across the cut
    between levels $k-1$ and $k$ balance at the fixed point:

    $$\mu s_k + \sum_l \nu_l\big(1 - (1 - s_k)^{f_l}\big)
      = \sum_j \lambda_j \sum_{i \ge 0} \big(g_j(s_{k-1-i}) - g_j(s_{k-i})\big)\,E[(B_j - i)^+]$$

    ($g_j(s) = 1$ at levels $\le 0$), explicit in $s_k$ level by level; with single jobs and no helpers it is the
    paper's $\pi_k = \sum_j (\lambda_j/\mu)\,\pi_{k-1}^{d_j}$. The mean field itself is derived from the
    description (cells: the empty server and `(k, phase i)`), its Jacobian banded with the largest batch size as
    bandwidth. The load is $\rho = \sum_j \lambda_j E[B_j] \,/\, (1/E[S] + \sum_l \nu_l)$: at high occupancy
    every server completes jobs at rate $1/E[S]$ and each helper pool at $\nu_l$ per server.

    **Arguments:**

    - `lam`: batch arrival rates per server $\lambda_1..\lambda_v$ (a list or 1-d array, differentiable).
    - `d`: the classes' choice numbers: one for all classes, or a list (each an integer, a real number, a
      probability vector or an `AbstractChoice`, as for `JSQd`).
    - `batch_sizes`: `None` (single jobs), or a list with, per class, `None` or the probabilities of batch sizes
      1, 2, ... (differentiable).
    - `mu`: exponential service rate, when `service` is not given.
    - `service`: a `jsmkt.PH` service-time distribution (instead of `mu`).
    - `helper_rates`, `f`: helper pools' rates per server $\nu_l$ and their choice numbers $f_l$ (lists of one
      length; none by default).
    - `K`: truncation level; chosen from the parameters when omitted.
    - `d_max`: bound on real choice numbers that are traced (see `InterpolatedChoice`).

    The reduced state is the array of phase tails $S_1..S_K$, shape `(K, m)` (`m = 1` for exponential service).
    """

    lam: Float[Array, " v"]
    choices: tuple[AbstractChoice, ...]
    batch_sizes: tuple[Float[Array, " B"], ...]
    service: PH
    helper_rates: Float[Array, " w"]
    helper_choices: tuple[AbstractChoice, ...]
    K: int = eqx.field(static=True)

    table = FamilyTable("jsq-classes", (
        Parameter("classes", "tables", "arrival classes", entries=(
            Parameter("lam", "rate", "batch arrival rate per server of the class", field="lam", sensitivity="real",
                      wrt="classes.lam", aliases=("lam",)),
            Parameter("d", "choice", "choice number of the class", default=2, field="choices", sensitivity="choice",
                      wrt="classes.d", aliases=("d",)),
            Parameter("batch_sizes", "probabilities", "batch-size probabilities of the class", default=None,
                      what="batch-size probabilities", field="batch_sizes", sensitivity="probabilities",
                      wrt="classes.batch_sizes", aliases=("batch_sizes",)),
        )),
        Parameter("mu", "rate", "service rate (or a [service] table)", default=1.0, excludes=("service",)),
        Parameter("service", "ph", "service time distribution (or mu)", default=None, excludes=("mu",),
                  field="service", sensitivity="service mean", wrt="service.mean", aliases=("mean",)),
        Parameter("helpers", "tables", "helper pools: each serves the longest of f sampled queues", default=(),
                  entries=(
            Parameter("rate", "rate", "rate per server of the helper pool", arg="helper_rates", field="helper_rates",
                      sensitivity="real", wrt="helpers.rate", aliases=("helper_rates",)),
            Parameter("f", "choice", "choice number of the helper pool", default=2, field="helper_choices",
                      sensitivity="choice", wrt="helpers.f", aliases=("f",)),
        )),
        TRUNCATION,
    ), specs=("examples/jsq_classes.toml",))

    @classmethod
    def examples(cls) -> dict:
        from .._distributions.ph import hyperexponential2

        return {"classes-h2-batch-helpers": cls([0.3, 0.2], d=[2, 1.5], batch_sizes=[None, [0.5, 0.5]],
                                                service=hyperexponential2(1.0, 2.0), helper_rates=[0.2], f=[2], K=32),
                "classes-d1-d3": cls([0.3, 0.4], d=[1, 3], K=24)}

    def describe_service(self, mean: float, scv: float) -> str:
        if self.m == 1:
            return f"service: exponential, rate mu = {1.0 / mean:.6g}"
        return f"service: PH of order {self.service.order}, mean {mean:.6g}, SCV {scv:.6g}"

    def spec_values(self) -> dict:
        return {"classes": [{"lam": float(self.lam[j]), "d": float(self.choices[j].mean),
                             "batch_sizes": [float(p) for p in self.batch_sizes[j]]} for j in range(self.n_classes)],
                "helpers": [{"rate": float(r), "f": float(c.mean)}
                            for r, c in zip(self.helper_rates, self.helper_choices, strict=True)],
                "lam": float(self.arrival_rate)}

    def describe_parameters(self) -> str:
        parts = []
        for j in range(self.n_classes):
            B = self.batch_sizes[j].shape[0]
            batch = "" if B == 1 else f" batches 1..{B} (mean {float(self.mean_batch_sizes[j]):.6g})"
            parts.append(f"class {j + 1}: lam = {float(self.lam[j]):.6g} d = {choice_text(self.choices[j])}{batch}")
        parts += [f"helpers {l + 1}: rate = {float(self.helper_rates[l]):.6g} f = {choice_text(c)}"
                  for l, c in enumerate(self.helper_choices)]
        return "   ".join(parts)

    def __init__(self, lam, d=2, batch_sizes=None, mu: ArrayLike | None = None, service: PH | None = None,
                 helper_rates=(), f=(), K: int | None = None, *, d_max: int | None = None):
        if isinstance(lam, (list, tuple)) and not lam:
            raise ValueError(f"lam={lam!r} gives no arrival class: give one rate per class (e.g. lam=[0.3, 0.4])")
        if isinstance(lam, (list, tuple)):
            lam = jnp.stack([as_float_array(f"lam[{j}]", x, ndim=0, scale=True) for j, x in enumerate(lam)])
        self.lam = as_float_array("lam", lam, ndim=1, scale=True)
        v = self.lam.shape[0]
        if v < 1:
            raise ValueError(f"lam has shape {self.lam.shape}: no arrival class; give one rate per class (e.g. "
                             "lam=[0.3, 0.4])")
        if isinstance(d, (list, tuple)):
            if len(d) != v:
                raise ValueError(f"d={d!r} has {len(d)} entries for {v} classes (lam has {v} rates)")
            self.choices = tuple(named_choice(f"d[{j}]", x, d_max) for j, x in enumerate(d))
        else:
            self.choices = (named_choice("d", d, d_max),) * v
        if batch_sizes is None:
            batch_sizes = [None] * v
        batch_sizes = _sequence("batch_sizes", batch_sizes)
        if len(batch_sizes) != v:
            raise ValueError(f"batch_sizes has {len(batch_sizes)} entries for {v} classes (lam has {v} rates)")
        self.batch_sizes = tuple(jnp.ones(1) if p is None else as_float_array(f"batch_sizes[{j}]", p, ndim=1)
                                 for j, p in enumerate(batch_sizes))
        for j, p in enumerate(self.batch_sizes):
            if not 1 <= p.shape[0] <= _MAX_BATCH:
                raise ValueError(f"batch_sizes[{j}] has {p.shape[0]} entries: give the probabilities of batch "
                                 f"sizes 1..B, 1 <= B <= {_MAX_BATCH}")
            pc = concrete_array(p)
            if pc is not None:
                if np.any(pc < 0):
                    b = int(np.flatnonzero(pc < 0)[0])
                    raise ValueError(f"batch_sizes[{j}][{b}]={float(pc[b])!r} (probability of a batch of {b + 1} "
                                     f"in class {j}) is negative")
                if abs(pc.sum() - 1.0) > 1e-8:
                    raise ValueError(f"batch_sizes[{j}]={pc.tolist()!r} sums to {float(pc.sum())!r}; "
                                     "probabilities must sum to 1")
        if service is not None and mu is not None:
            raise ValueError("give the service as mu (exponential) or as service (a jsmkt.PH), not both")
        if service is None:
            mu = as_float_array("mu", 1.0 if mu is None else mu, ndim=0, scale=True)
            check_positive("mu", mu)
            service = exponential(mu)
        elif not isinstance(service, PH):
            raise ValueError(f"service={service!r} must be a jsmkt.PH distribution")
        self.service = service
        helper_rates, f = _sequence("helper_rates", helper_rates), _sequence("f", f)
        if len(helper_rates) != len(f):
            raise ValueError(f"helper_rates has {len(helper_rates)} entries and f has {len(f)}: give one choice "
                             "number f per helper pool")
        self.helper_rates = (jnp.stack([as_float_array(f"helper_rates[{l}]", x, ndim=0, scale=True)
                                        for l, x in enumerate(helper_rates)]) if helper_rates else jnp.zeros(0))
        self.helper_choices = tuple(named_choice(f"f[{l}]", x, d_max) for l, x in enumerate(f))
        for name, x in (("lam", self.lam), ("helper_rates", self.helper_rates)):
            c = concrete_array(x)
            if c is not None and np.any(~(c > 0)):
                i = int(np.flatnonzero(~(c > 0))[0])
                raise ValueError(f"{name}[{i}]={float(c[i])!r} must be positive")
        if K is None:
            K = self._default_K()
        self.K = check_K(K)

    def _default_K(self) -> int:
        conc = [concrete_array(x) for x in (self.lam, self.helper_rates, self.service.alpha, self.service.T,
                                             *self.batch_sizes, *(c.weights() for c in self.choices))]
        if any(c is None for c in conc):
            raise ValueError("K must be given when lam, batch_sizes, the service, helper_rates or d are traced "
                             "(inside jit/grad/vmap)")
        lam, nu = conc[0], conc[1]
        p = conc[4:4 + len(self.batch_sizes)]
        w = conc[4 + len(self.batch_sizes):]
        mean_b = np.array([np.arange(1, q.size + 1) @ q for q in p])
        jobs = lam * mean_b
        mean, scv = concrete_mean_scv(self.service)
        rate = 1.0 / mean + float(nu.sum())
        rho = float(jobs.sum()) / rate
        if rho >= 1.0:
            return 8  # unstable: value_errors says so at the entry points
        width = max(len(x) for x in w)
        mix = sum(np.pad(x, (0, width - len(x))) * jobs[j] for j, x in enumerate(w)) / jobs.sum()
        spread = max(float(np.arange(1, q.size + 1) ** 2 @ q) / mb for q, mb in zip(p, mean_b, strict=True))
        single = all(q.size == 1 for q in p)
        decay = None
        lam1 = float(sum(lam[j] * x[0] for j, x in enumerate(w)))
        if single and nu.size == 0 and lam1 > 0 and lam1 * mean < 1:
            decay = mph1_tail_decay(lam1, conc[2], conc[3])
        return int(np.ceil(default_K(rho, mix, scv, decay=decay) * spread))

    # --- queueing quantities --------------------------------------------------------------------------------
    @property
    def m(self) -> int:
        """Number of service phases."""
        return self.service.order

    @property
    def n_classes(self) -> int:
        """Number of arrival classes."""
        return self.lam.shape[0]

    @property
    def mean_batch_sizes(self) -> Float[Array, " v"]:
        """$E[B_j]$ per class."""
        return jnp.stack([jnp.arange(1, p.shape[0] + 1, dtype=p.dtype) @ p for p in self.batch_sizes])

    @property
    def class_arrival_rates(self) -> Float[Array, " v"]:
        """Job arrival rate per server of each class, $\\lambda_j E[B_j]$."""
        return self.lam * self.mean_batch_sizes

    @property
    def arrival_rate(self) -> Array:
        """Job arrival rate per server, $\\sum_j \\lambda_j E[B_j]$."""
        return jnp.sum(self.class_arrival_rates)

    @property
    def capacity(self) -> Array:
        """Service capacity per server, $1/E[S] + \\sum_l \\nu_l$."""
        return 1.0 / self.service.mean + jnp.sum(self.helper_rates)

    def load(self) -> Array:
        return self.arrival_rate / self.capacity

    def rate_scale(self) -> Array:
        return jnp.maximum(jnp.max(self.lam), self.capacity)

    def declared_structure(self):
        """Banded with the largest batch size as bandwidth (a batch moves a server up by at most that many levels,
        a completion down by one). With PH service and helpers, none: a helper completes the job in service at a
        rate that depends on the level, and the next job's phase is drawn afresh, so the phase tails of level 1
        (every server's phase) move with the occupancy of every level: the tails' Jacobian has dense rows, and Newton
        solves the balance of each cell instead, which is banded (`jsmkt._models.newton`)."""
        if self.m > 1 and self.helper_choices:
            return None
        return max(p.shape[0] for p in self.batch_sizes), ()

    # --- physics ----------------------------------------------------------------------------------------------
    def description(self) -> Description:
        """Cells: the empty server and `(k, phase i)`, `k = 1..K`. Local events: phase moves and completions of the
        service. Dispatches: one per class (key: the queue length; the chosen server jumps `k -> k + b`) and one
        per helper pool (key: `K - k`, empty servers ineligible; the chosen server completes its job in service,
        `arrivals=False`)."""
        K, m = self.K, self.m
        alpha, T, T0 = self.service.alpha, self.service.T, self.service.exit_vector
        k, i = (a.ravel() for a in np.meshgrid(np.arange(1, K + 1), np.arange(m), indexing="ij"))
        names = ("idle", "busy") if m == 1 else ("idle",) + tuple(f"phase {j + 1}" for j in range(m))
        cells = make_cells(np.concatenate([[0], k]), np.concatenate([[0], i + 1]), names)
        events = []
        if m > 1:
            ii, jj = np.nonzero(~np.eye(m, dtype=bool))
            kk = np.repeat(np.arange(1, K + 1), len(ii))
            events.append(LocalEvent("phase", Moves(cells.index(kk, np.tile(ii, K) + 1), kk, np.tile(jj, K) + 1,
                                                    jnp.tile(T[ii, jj], K))))
        # Completions: (k, i) -> (k - 1, j) with probability alpha[j] (the next job's phase); (1, i) -> empty.
        ci, cj = (a.ravel() for a in np.meshgrid(np.arange(m), np.arange(m), indexing="ij"))
        kk = np.repeat(np.arange(2, K + 1), m * m)
        source = np.concatenate([cells.index(np.ones(m, int), np.arange(m) + 1),
                                 cells.index(kk, np.tile(ci, K - 1) + 1)])
        level = np.concatenate([np.zeros(m, int), kk - 1])
        status = np.concatenate([np.zeros(m, int), np.tile(cj, K - 1) + 1])
        events.append(LocalEvent("completion", Moves(source, level, status,
                                                     jnp.concatenate([T0, jnp.tile(T0[ci] * alpha[cj], K - 1)]))))
        dispatches = []
        busy = cells.index(k, i + 1)
        for j, (rate, choice, p) in enumerate(zip(self.lam, self.choices, self.batch_sizes, strict=True)):
            B = p.shape[0]
            bb = np.repeat(np.arange(1, B + 1), m)  # empty server: batch b, first phase ~ alpha
            empty = Moves(np.zeros(B * m, int), bb, np.tile(np.arange(m) + 1, B), jnp.outer(p, alpha).ravel())
            src, b2 = (a.ravel() for a in np.meshgrid(busy, np.arange(1, B + 1), indexing="ij"))
            full = Moves(src, cells.level[src] + b2, cells.status[src], jnp.tile(p, K * m))
            effect = Moves(*(np.concatenate([a, b]) for a, b in zip(empty[:3], full[:3], strict=True)),
                           jnp.concatenate([empty.weight, full.weight]))
            name = "arrival" if self.n_classes == 1 else f"class {j + 1} arrival"
            dispatches.append(Dispatch(name, choice, key=cells.level, effect=effect, rate=rate))
        key = np.where(cells.level > 0, K - cells.level, INELIGIBLE)
        for l, (rate, choice) in enumerate(zip(self.helper_rates, self.helper_choices, strict=True)):
            help_ = Moves(source, level, status, jnp.concatenate([jnp.ones(m), jnp.tile(alpha[cj], K - 1)]))
            name = "helper" if len(self.helper_choices) == 1 else f"helper {l + 1}"
            dispatches.append(Dispatch(name, choice, key=key, effect=help_, rate=rate, arrivals=False))
        return Description(cells, tuple(events), tuple(dispatches))

    def observables(self):
        """With several classes, `prob_wait_class_<j>`: the fraction of class j's jobs that do not start service at
        once, the waiting flow over the offered flow of its stream (`jsmkt.prob_wait(..., stream=...)`)."""
        if self.n_classes == 1:
            return {}

        def wait(stream):
            return lambda x: (f := job_flows(self.description(), x, stream)).waiting / f.offered

        return {f"prob_wait_class_{j + 1}": wait(f"class {j + 1} arrival") for j in range(self.n_classes)}

    def initial_guess(self):
        r"""The cut balance of the class docstring solved level by level with $\mu = 1/E[S]$ (Newton's method in
        $s_k$ where there are helpers), the phase of the job in service distributed as in an M/PH/1 queue's busy
        periods ($\propto \alpha(-T)^{-1}$). Exact for exponential service. No derivatives (Newton's starting
        point)."""
        model = jax.tree_util.tree_map(lambda x: jax.lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, self)
        s = _forward_tails(model)
        return s[:, None] * model.service.stationary_vector[None, :]

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
        out = [
            (~jnp.all(jnp.isfinite(self.lam)) | jnp.any(~(self.lam > 0)),
             "invalid parameters: the class rates lam must be finite and positive"),
            (not_a_ph(self.service), "invalid parameters: the service is not a valid PH distribution"),
        ]
        for j, p in enumerate(self.batch_sizes):
            out.append((~jnp.all(jnp.isfinite(p)) | jnp.any(p < 0) | (jnp.abs(jnp.sum(p) - 1.0) > 1e-8),
                        f"invalid parameters: batch_sizes[{j}] must be probabilities (finite, >= 0, summing to 1)"))
        for j, c in enumerate(self.choices):
            out += named_value_errors(f"d[{j}]", c)
        if self.helper_rates.shape[0]:
            out.append((~jnp.all(jnp.isfinite(self.helper_rates)) | jnp.any(~(self.helper_rates > 0)),
                        "invalid parameters: helper_rates must be finite and positive"))
        for l, c in enumerate(self.helper_choices):
            out += named_value_errors(f"f[{l}]", c)
        out.append((~(rho < 1.0), "unstable: " + fmt(
            "job arrival rate sum_j lam_j E[B_j]={a} >= capacity 1/E[S] + sum of helper_rates={b} per server "
            "(load rho={rho})", a=self.arrival_rate, b=self.capacity, rho=rho,
            default="job arrival rate >= service capacity per server (load >= 1)")
            + "; no steady state exists: lower lam or the batch sizes, or raise the service or helper rates"))
        return out


def _forward_tails(model: JSQdClasses) -> Float[Array, " K"]:
    """`s_1..s_K` from the cut balance of `JSQdClasses` with `mu = 1/E[S]`."""
    mu = 1.0 / model.service.mean
    B = max(p.shape[0] for p in model.batch_sizes)
    c = []  # c[j][i] = lam_j E[(B_j - i)^+], i = 0..B-1
    for rate, p in zip(model.lam, model.batch_sizes, strict=True):
        sizes = jnp.arange(1, p.shape[0] + 1, dtype=p.dtype)
        c.append(rate * jnp.stack([jnp.sum(jnp.maximum(sizes - i, 0.0) * p) for i in range(B)]))

    def helped(s):
        return mu * s + sum(nu * (1.0 - ch.pgf(1.0 - s)) for nu, ch in zip(model.helper_rates, model.helper_choices,
                                                                           strict=True))

    def level(G, _):  # G[j, i] = g_j(s_{k-1-i}), i = 0..B-1
        rhs = sum(cj[0] * G[j, 0] + jnp.sum((G[j, 1:] - G[j, :-1]) * cj[1:]) for j, cj in enumerate(c))
        if model.helper_choices:
            # helped(s) - rhs is increasing and concave in s (a pgf is convex), so Newton's iterates from s = 0 rise
            # monotonically to the root, kept in [0, 1]
            def step(s, _):
                value, slope = jax.jvp(helped, (s,), (jnp.ones_like(s),))
                return jnp.clip(s - (value - rhs) / slope, 0.0, 1.0), None

            s, _ = jax.lax.scan(step, jnp.zeros(()), None, length=_GUESS_NEWTON)
        else:
            s = jnp.minimum(rhs / mu, 1.0)
        gs = jnp.stack([ch.pgf(s) for ch in model.choices])
        return jnp.concatenate([gs[:, None], G[:, :-1]], axis=1), s

    G0 = jnp.ones((len(model.choices), B))
    return jax.lax.scan(level, G0, None, length=model.K)[1]
