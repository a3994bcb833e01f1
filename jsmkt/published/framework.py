r"""Li, "Super-exponential solution in Markovian supermarket models: framework and challenge", Section 2: the
general Markovian supermarket model, as published.

A block-structured generator $Q$ on levels $k = 0..K$ with $m_k$ phases each is split into input and output
parts, $Q = Q_{\rm left} + Q_{\rm right}$ (2), and these by the output choice numbers $f_l$ and input choice numbers
$d_k$, $Q_{\rm left} = \sum_l Q_{\rm left}(f_l)$, $Q_{\rm right} = \sum_k Q_{\rm right}(d_k)$ (3)–(4). The fraction
measure $S = (S_0, S_1, \ldots)$, $S_k$ a row vector of size $m_k$, follows

$$S_0 \ge 0,\ S_0\mathbf1 = 1 \ (5),\qquad
  \frac{dS}{dt} = \sum_l S^{\odot f_l}Q_{\rm left}(f_l) + \sum_k S^{\odot d_k}Q_{\rm right}(d_k)\ (6),$$

and a fixed point solves (7)–(8), the same with $dS/dt = 0$. `FrameworkAsPublished` takes the truncated blocks and
integrates / solves exactly these equations; `framework_bmap` (Section 3, M/G/1 type) and `framework_batch_service`
(Section 4, GI/M/1 type; with single batches, also JSQ(d) with exponential or PH service, Li & Lui's model) build
the paper's examples. Our copy of Section 4 breaks off after the model description, so its blocks are built here
from the framework as Section 2 sets it up and as Section 3 builds its own: $Q_{\rm right}(d)$ the arrivals (level
$k \to k + 1$ at rate λ, the first job's phase $\sim\alpha$), $Q_{\rm left}(1)$ the service (phase moves $T$, and an
epoch's end $T^0$ moving level $k$ to $\max(k - b, 0)$ with probability $b_b$, the next epoch's phase $\sim\alpha$).

Where these agree with the exact mean-field limits (jsmkt's families): with one phase per level and single
arrivals (JSQ(d) with exponential service, batch service with exponential epochs), $S^{\odot d}$ is the
probability that the best of $d$ sampled servers is at level $\ge k$, and the equations are exact. With phases
($m > 1$), the Hadamard power of a phase vector is not that probability, and with batch arrivals (M/G/1 type)
the block rows $Q_{\rm right}$ are the balance of a single queue's probabilities, not of tails
(`jsmkt.published.bmap` module docstring); `tests/test_framework.py` shows both.
"""

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._choice import FixedChoice
from .._distributions.bmap import BMAP
from .._distributions.ph import PH
from .._errors import as_float_array, check_count, concrete_array, is_concrete
from .._models.base import AbstractSupermarketModel, check_K, fmt
from .._models.batch_service import JSQdBatchService
from ._registry import AsPublished, register_as_published


def _pairs(name: str, blocks, n: int) -> tuple[tuple[int, ...], Array]:
    """`blocks` (a sequence of `(choice number, (n, n) matrix)` pairs) as static choice numbers and a stacked array."""
    if isinstance(blocks, dict):
        blocks = list(blocks.items())
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise ValueError(f"{name} must be a non-empty list of (choice number, block matrix) pairs")
    numbers, mats = [], []
    for i, pair in enumerate(blocks):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"{name}[{i}]={pair!r} must be a (choice number, block matrix) pair")
        numbers.append(check_count(f"{name}[{i}]'s choice number", pair[0], "an integer >= 1"))
        Q = as_float_array(f"{name}[{i}]'s block matrix", pair[1], ndim=2)
        if Q.shape != (n, n):
            raise ValueError(f"{name}[{i}]'s block matrix has shape {Q.shape}; the levels have {n} phases in all, "
                             f"so it must be ({n}, {n})")
        mats.append(Q)
    return tuple(numbers), jnp.stack(mats)


class FrameworkAsPublished(AbstractSupermarketModel):
    r"""The framework's ODE (5)–(6) and fixed-point system (7)–(8), as published, for truncated blocks.

    **Arguments:**

    - `levels`: $(m_0, m_1, \ldots, m_K)$, the number of phases of each level ($K \ge 2$); $n = \sum_k m_k$.
    - `right`: the input blocks, a list of `(d_k, Q_right(d_k))` pairs, each matrix `(n, n)` (the rows and
      columns level by level, phases within).
    - `left`: the output blocks, a list of `(f_l, Q_left(f_l))` pairs.
    - `arrival_rate`: jobs per unit time per server (for the metrics, by Little's law) and `capacity`, the
      service capacity per server (the load is their ratio).
    - `empty`: $S_0$ of the empty system (`initial_state`, the start of `integrate`), uniform by default.

    The unknowns are $S$ but one entry: (5) $S_0\mathbf1 = 1$ sets the last phase of level 0
    ($S_0 = 1$ when $m_0 = 1$), and the vector field drops the matching component of (6), as (7) replaces one
    equation of (8) (a generator's rows sum to 0, so the components of (6) sum to 0 but for the truncation, and the
    dropped one holds at the fixed point). `tails` reads $S$ as tails: $s_k = S_k\mathbf1$. The reduced state is
    flat, of size $n - 1$; the Jacobian is dense (`unknown_levels` are the levels, its structure detected).
    """

    levels: tuple[int, ...] = eqx.field(static=True)
    right_choices: tuple[int, ...] = eqx.field(static=True)
    left_choices: tuple[int, ...] = eqx.field(static=True)
    right: Float[Array, "v n n"]
    left: Float[Array, "w n n"]
    rate: Float[Array, ""]
    capacity: Float[Array, ""]
    empty: Float[Array, " m0"]
    K: int = eqx.field(static=True)

    def __init__(self, levels: Sequence[int], right, left, arrival_rate: ArrayLike, capacity: ArrayLike,
                 empty: ArrayLike | None = None):
        if not isinstance(levels, (list, tuple)) or len(levels) < 3:
            raise ValueError(f"levels={levels!r} must list the phases m_0, ..., m_K of each level, K >= 2")
        self.levels = tuple(check_count(f"levels[{k}]", m, "phases of the level") for k, m in enumerate(levels))
        n = sum(self.levels)
        self.right_choices, self.right = _pairs("right", right, n)
        self.left_choices, self.left = _pairs("left", left, n)
        self.rate = as_float_array("arrival_rate", arrival_rate, ndim=0, scale=True)
        self.capacity = as_float_array("capacity", capacity, ndim=0, scale=True)
        m0 = self.levels[0]
        self.empty = jnp.full(m0, 1.0 / m0) if empty is None else as_float_array("empty", empty, ndim=1)
        if self.empty.shape != (m0,):
            raise ValueError(f"empty has shape {self.empty.shape}; level 0 has {m0} phases")
        self.K = check_K(len(self.levels) - 1)

    def with_K(self, K):
        raise ValueError("FrameworkAsPublished holds blocks truncated at K; build it again for another K")

    @property
    def n(self) -> int:
        """Phases of all levels, $\\sum_k m_k$."""
        return sum(self.levels)

    @property
    def arrival_rate(self):
        return self.rate

    @property
    def choice(self) -> FixedChoice:
        r"""The first input choice number ($d_1$, the arrivals' in the paper's examples), for the JSQ formulas of the
        metrics (throughput $\lambda(1 - s_K^{d})$, P(wait) $s_1^{d}$) that jsmkt keeps for published models."""
        return FixedChoice(self.right_choices[0])

    def load(self):
        return self.rate / self.capacity

    def rate_scale(self):
        return jnp.maximum(jnp.max(jnp.abs(self.right)), jnp.max(jnp.abs(self.left)))

    @property
    def _offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.levels)])

    def state_space(self):
        return [(k, i) for k, m in enumerate(self.levels) for i in range(m)]

    def transitions(self, x):
        raise NotImplementedError("FrameworkAsPublished is the published ODE (6); it is not derived from transitions")

    def unknown_levels(self) -> np.ndarray:
        return np.delete(np.repeat(np.arange(self.K + 1), self.levels), self.levels[0] - 1)

    def full(self, y: Float[Array, " n-1"]) -> Float[Array, " n"]:
        """$S$ (all levels, flat) of the reduced state `y`: (5) sets the last phase of level 0."""
        m0 = self.levels[0]
        return jnp.insert(y, m0 - 1, 1.0 - jnp.sum(y[: m0 - 1]))

    def rhs(self, S: Float[Array, " n"]) -> Float[Array, " n"]:
        """The right-hand side of (6) at the full state `S` (every component)."""
        out = jnp.zeros_like(S)
        for f, Q in zip(self.left_choices, self.left, strict=True):
            out = out + (S**f) @ Q
        for d, Q in zip(self.right_choices, self.right, strict=True):
            out = out + (S**d) @ Q
        return out

    def vector_field(self, t, y, args=None):
        del t, args
        return jnp.delete(self.rhs(self.full(y)), self.levels[0] - 1)

    def initial_state(self):
        return jnp.concatenate([self.empty[:-1], jnp.zeros(self.n - self.levels[0])])

    def tails(self, y):
        S = self.full(y)
        off = self._offsets
        return jnp.stack([jnp.sum(S[off[k]:off[k + 1]]) for k in range(self.K + 1)])

    def occupancy(self, y):
        """Reading $S$ as tails: level $k$'s share, $S_k - S_{k+1}$ (summed over the phases of level $k + 1$ when
        level $k$ has one phase); levels with $m_{k+1} \\ne m_k > 1$ have no such reading."""
        S, off = self.full(y), self._offsets
        out = []
        for k, m in enumerate(self.levels):
            nxt = S[off[k + 1]:off[k + 2]] if k < self.K else jnp.zeros(m)
            if k < self.K and self.levels[k + 1] != m:
                if m != 1:
                    raise ValueError(f"levels {k} and {k + 1} have {m} and {self.levels[k + 1]} phases: no occupancy")
                nxt = jnp.sum(nxt)[None]
            out.append(S[off[k]:off[k + 1]] - nxt)
        return jnp.concatenate(out)

    def reduce(self, x):
        off = self._offsets
        S, below = [], None
        for k in range(self.K, -1, -1):
            xk = x[off[k]:off[k + 1]]
            if below is not None:
                xk = xk + (below if below.shape == xk.shape else jnp.sum(below)[None])
            S.insert(0, xk)
            below = xk
        return jnp.delete(jnp.concatenate(S), self.levels[0] - 1)

    def value_errors(self):
        rho = self.load()
        finite = jnp.all(jnp.isfinite(self.right)) & jnp.all(jnp.isfinite(self.left))
        return [
            (~finite | ~jnp.all(jnp.isfinite(self.empty)), "invalid parameters: the blocks must be finite"),
            (~(self.rate > 0) | ~(self.capacity > 0), "invalid parameters: arrival_rate and capacity must be "
                                                      "positive"),
            (~(rho < 1.0), "unstable: " + fmt("load arrival_rate/capacity={rho} >= 1", rho=rho,
                                              default="load arrival_rate/capacity >= 1") + "; no fixed point"),
        ]

    def check_values(self) -> None:
        for bad, msg in self.value_errors():
            if bool(bad):
                raise ValueError(msg)


def _check_K(K) -> int:
    return check_count("K", K, "the truncation level", minimum=2)


def framework_bmap(bmap: BMAP, d: int = 2, mu: ArrayLike = 1.0, K: int = 40) -> FrameworkAsPublished:
    r"""Section 3 (M/G/1 type) in the framework: levels $0..K$ of $m$ phases each,
    $Q_{\rm right}(d)$ with $C$ on the diagonal blocks and $D_j$ $j$ levels up (cut at $K$), and
    $Q_{\rm left}(1)$ with $-\mu I$ on the diagonal blocks of levels $\ge 1$ and $\mu I$ one level down; empty
    system $S_0 = \gamma$. Its equations are those of `JSQdBMAPAsPublished`."""
    if not isinstance(bmap, BMAP):
        raise ValueError(f"bmap={bmap!r} must be a jsmkt.BMAP")
    d, K = check_count("d", d, "the choice number"), _check_K(K)
    mu = as_float_array("mu", mu, ndim=0, scale=True)
    m, B = bmap.order, bmap.max_batch
    xp = np if is_concrete(bmap, mu) else jnp  # NumPy builds concrete blocks without compiling each operation
    Cm, Dm, mu_ = xp.asarray(bmap.C), xp.asarray(bmap.D), xp.asarray(mu)
    right = xp.kron(xp.eye(K + 1), Cm)
    for b in range(1, min(B, K) + 1):
        right = right + xp.kron(xp.eye(K + 1, k=b), Dm[b - 1])
    down = xp.eye(K + 1, k=-1) - xp.diag(xp.where(xp.arange(K + 1) > 0, 1.0, 0.0))  # level k -> k - 1
    left = mu_ * xp.kron(down, xp.eye(m))
    return FrameworkAsPublished((m,) * (K + 1), [(d, right)], [(1, left)], bmap.rate, mu, empty=bmap.gamma)


def framework_batch_service(lam: ArrayLike, service: PH, service_batch_sizes: ArrayLike = (1.0,), d: int = 2,
                            K: int = 40) -> FrameworkAsPublished:
    r"""Section 4 (GI/M/1 type) in the framework: level 0 one phase (the empty server), levels $1..K$ the
    service phases. $Q_{\rm right}(d)$: $-\lambda$ on the diagonal, $\lambda\alpha$ from level 0 to 1, $\lambda I$
    from level $k$ to $k + 1$ (cut at $K$). $Q_{\rm left}(1)$: $T$ on the diagonal blocks of levels $\ge 1$, and an
    epoch's end, $T^0$, takes level $k$ to $k - b$ with probability $b_b$ (the next epoch's phase $\sim\alpha$) or
    to level 0 with probability $P(B \ge k)$. With `service_batch_sizes = [1.0]` this is JSQ(d) with PH service,
    Li & Lui's ODE (1)–(3) (`JSQdPHAsPublished`), and with exponential service JSQ(d) itself."""
    if not isinstance(service, PH):
        raise ValueError(f"service={service!r} must be a jsmkt.PH distribution")
    d, K = check_count("d", d, "the choice number"), _check_K(K)
    lam = as_float_array("lam", lam, ndim=0, scale=True)
    p = as_float_array("service_batch_sizes", service_batch_sizes, ndim=1)
    pc = concrete_array(p)
    if pc is not None and (np.any(pc < 0) or abs(pc.sum() - 1) > 1e-8):
        raise ValueError(f"service_batch_sizes={pc.tolist()!r} must be probabilities summing to 1")
    m, B = service.order, p.shape[0]
    xp = np if is_concrete(lam, service, p) else jnp  # NumPy builds concrete blocks without compiling each operation
    lam_, p_ = xp.asarray(lam), xp.asarray(p)
    alpha, T = xp.asarray(service.alpha), xp.asarray(service.T)
    T0 = -T.sum(axis=1)
    top = xp.concatenate([(-lam_)[None], lam_ * alpha, xp.zeros((K - 1) * m)])  # level 0: an arrival, phase ~ alpha
    up = -lam_ * xp.eye(K * m) + lam_ * xp.eye(K * m, k=m)  # levels 1..K: k -> k + 1 (cut at K)
    right = xp.concatenate([top[None], xp.concatenate([xp.zeros((K * m, 1)), up], axis=1)])
    at_least = xp.concatenate([xp.cumsum(p_[::-1])[::-1], xp.zeros(max(K - B, 0))])[:K]  # P(B >= k), k = 1..K
    down = xp.kron(xp.eye(K), T)  # levels 1..K: phase moves, and epochs ending k -> k - b >= 1
    for b in range(1, min(B, K - 1) + 1):
        down = down + p_[b - 1] * xp.kron(xp.eye(K, k=-b), xp.outer(T0, alpha))
    left = xp.concatenate([xp.zeros((1, 1 + K * m)),
                           xp.concatenate([xp.kron(at_least, T0)[:, None], down], axis=1)])
    mean_b = jnp.arange(1, B + 1, dtype=p.dtype) @ p
    return FrameworkAsPublished((1,) + (m,) * K, [(d, right)], [(1, left)], lam, mean_b / service.mean)


def _batch_service_as_published(model: JSQdBatchService) -> AsPublished:
    """`JSQdBatchService`: the framework's fixed point (7)-(8) with Section 4's blocks (`framework_batch_service`);
    E[T] by Little's law."""
    from .._fixed_point import solve_fixed_point
    from .._metrics import tails
    from ._registry import fixed_d as _fixed_d

    K = model.K
    fw = framework_batch_service(model.lam, model.service, model.service_batch_sizes, _fixed_d(model), K)
    fp = solve_fixed_point(fw, tail_tol=1.0)  # the truncation is judged on the tail this gives
    tail = np.asarray(tails(fw, fp))
    return AsPublished(
        source=("Li, Section 4 in the framework's fixed-point system (7)-(8) (our copy breaks off: the blocks are "
                "built as Section 2 sets them up); E[T] by Little's law"),
        tail=tail, mean_sojourn_time=float(np.sum(tail[1:])) / float(model.lam),
        phase_tails=np.asarray(fw.full(fp.value))[1:].reshape(K, -1),
    )


register_as_published(JSQdBatchService, _batch_service_as_published)
