r"""Batch Markovian arrival processes.

A BMAP with descriptor $(C, D_1, \ldots, D_B)$ of order $m$ is a Markov chain on $m$ phases whose moves from
phase $i$ to phase $j$ happen at rate $C_{ij}$ ($i \neq j$) without an arrival and at rate $(D_b)_{ij}$ with the
arrival of a batch of $b$ jobs ($j = i$ included). $C + \sum_b D_b$ is the phase's generator, $\gamma$ its
stationary vector; batches of size $b$ arrive at rate $\lambda_b = \gamma D_b\mathbf1$ and jobs at rate
$\sum_b b\,\lambda_b$.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._dense import small_solve
from .._errors import as_float_array, check_count, concrete_array
from .._graph import reachable


_ATOL = 1e-10  # relative rounding allowed in row sums and signs (relative to the phase's total rate)
MAX_ORDER = 1024  # phases of a BMAP (dense m x m matrices)
MAX_BATCH = 4096  # the largest batch size


def _where(index) -> str:
    return ", ".join(str(int(i)) for i in index)


def _check_bmap_values(C: np.ndarray, D: np.ndarray) -> None:
    """Raise `ValueError` naming the offending entry when `(C, D)` is not a BMAP descriptor."""
    scale = np.abs(np.diagonal(C))  # the total rate out of each phase
    off = C - np.diag(np.diagonal(C))
    bad = off < -_ATOL * scale[:, None]
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"C[{i}, {j}]={float(C[i, j])!r} is negative; the off-diagonal entries of C (phase moves "
                         "without an arrival) are rates >= 0")
    bad = D < -_ATOL * scale[None, :, None]
    if bad.any():
        b, i, j = np.argwhere(bad)[0]
        raise ValueError(f"D[{b}][{i}, {j}]={float(D[b, i, j])!r} (rate of batches of {b + 1} moving the phase "
                         f"{i} -> {j}) is negative; the entries of D are rates >= 0")
    rows = C.sum(axis=1) + D.sum(axis=(0, 2))
    bad = np.abs(rows) > _ATOL * np.maximum(scale, 1e-300)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i} of C + sum_b D[b] sums to {float(rows[i])!r}, not 0: set C[{i}, {i}] = "
                         f"{float(C[i, i] - rows[i])!r} (minus the total rate out of phase {i})")
    if not D.any():
        raise ValueError("D is zero: a BMAP needs some arrivals (a positive entry of D)")
    moves = (off + D.sum(axis=0)) > 0
    np.fill_diagonal(moves, False)
    for direction, adj in (("reach", moves), ("be reached from", moves.T)):
        seen = reachable(adj)
        if not seen.all():
            j = int(np.argmin(seen))
            raise ValueError(f"C + sum_b D[b] is reducible: phase 0 cannot {direction} phase {j}; a BMAP's phase "
                             "chain must be irreducible (one stationary law)")


class BMAP(eqx.Module):
    r"""Batch Markovian arrival process $\mathrm{BMAP}(C, D_1, \ldots, D_B)$ of order $m$.

    In phase $i$ the process moves to phase $j \ne i$ at rate $C_{ij}$ without an arrival, and to phase $j$
    ($j = i$ allowed) at rate $(D_b)_{ij}$ with the arrival of a batch of $b$ jobs; $-C_{ii}$ is the total rate out
    of phase $i$, so the rows of $C + \sum_b D_b$ sum to 0. With $\gamma$ the stationary vector of that generator,
    batches of size $b$ arrive at rate $\lambda_b = \gamma D_b\mathbf1$ and jobs at rate $\sum_b b\lambda_b$.
    A Poisson process of rate λ is `BMAP([[-lam]], [[[lam]]])`; an MMPP has diagonal $D_1$.

    **Arguments:**

    - `C`: `(m, m)`: rates of phase moves without an arrival off the diagonal, minus the total rate out of each
      phase on it.
    - `D`: `(B, m, m)` (or a list of `B` matrices, or one `(m, m)` matrix for single arrivals, a MAP): `D[b-1]`
      holds the rates of batches of `b` jobs.

    Values are checked when concrete (the message names the entry: a negative off-diagonal entry of `C` or entry
    of `D`, a row of $C + \sum_b D_b$ that does not sum to 0, a reducible phase chain, no arrivals); array leaves,
    so gradients flow through `gamma`, `batch_rates` and `rate`.

    !!! example

        ```python
        # MMPP-like: phase 0 sends single jobs at rate 0.4, phase 1 pairs at rate 0.5; switching at rate 0.1
        A = jsmkt.BMAP([[-0.5, 0.1], [0.1, -0.6]], [[[0.4, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.5]]])
        A.gamma, A.batch_rates, A.rate   # [0.5, 0.5], [0.2, 0.25], 0.7
        ```
    """

    C: Float[Array, "m m"]
    D: Float[Array, "B m m"]

    def __init__(self, C: ArrayLike, D: ArrayLike):
        self.C = as_float_array("C", C, ndim=2, scale=True)
        if isinstance(D, (list, tuple)) and D and all(np.ndim(x) == 2 for x in D):
            D = jnp.stack([as_float_array(f"D[{b}]", x, ndim=2, scale=True) for b, x in enumerate(D)])
        D = as_float_array("D", D, scale=True)
        if D.ndim == 2:
            D = D[None]
        self.D = D

    def __check_init__(self):
        m = self.C.shape[0]
        if self.C.shape != (m, m) or m < 1:
            raise ValueError(f"C has shape {self.C.shape}; it must be a square (m, m) matrix, m >= 1")
        if m > MAX_ORDER:
            raise ValueError(f"C has {m} phases, more than {MAX_ORDER}; use fewer phases")
        if self.D.ndim != 3 or self.D.shape[1:] != (m, m) or not 1 <= self.D.shape[0] <= MAX_BATCH:
            raise ValueError(f"D has shape {self.D.shape} but C has {m} phase(s); D must be (B, {m}, {m}): D[b-1] "
                             f"the rates of batches of b jobs, 1 <= B <= {MAX_BATCH}")
        c, d = concrete_array(self.C), concrete_array(self.D)
        if c is not None and d is not None:
            _check_bmap_values(c, d)

    @property
    def order(self) -> int:
        """Number of phases m."""
        return self.C.shape[0]

    @property
    def max_batch(self) -> int:
        """B, the largest batch size with a rate matrix (`D.shape[0]`)."""
        return self.D.shape[0]

    @property
    def generator(self) -> Float[Array, "m m"]:
        r"""The phase's generator $C + \sum_b D_b$."""
        return self.C + jnp.sum(self.D, axis=0)

    @property
    def gamma(self) -> Float[Array, " m"]:
        r"""Stationary phase vector $\gamma$: $\gamma(C + \sum_b D_b) = 0$, $\gamma\mathbf1 = 1$ (one linear solve,
        the normalisation replacing the last balance equation)."""
        return stationary_vector(self.generator)

    @property
    def batch_rates(self) -> Float[Array, " B"]:
        r"""$\lambda_b = \gamma D_b\mathbf1$, the rate of batches of $b$ jobs, $b = 1..B$."""
        return jnp.einsum("i,bij->b", self.gamma, self.D)

    @property
    def batch_rate(self) -> Float[Array, ""]:
        r"""Rate of batches, $\sum_b \lambda_b$."""
        return jnp.sum(self.batch_rates)

    @property
    def batch_sizes(self) -> Float[Array, " B"]:
        r"""Law of the size of a batch, $\lambda_b / \sum_{b'} \lambda_{b'}$ (time-stationary, over all batches)."""
        r = self.batch_rates
        return r / jnp.sum(r)

    @property
    def rate(self) -> Float[Array, ""]:
        r"""Job arrival rate $\sum_b b\,\lambda_b$."""
        return jnp.arange(1, self.max_batch + 1, dtype=self.D.dtype) @ self.batch_rates

    def sample(self, key: PRNGKeyArray, n: int, phase: int | None = None
               ) -> tuple[Float[Array, " n"], Int[Array, " n"], Int[Array, " n"]]:
        r"""The first `n` batches of the process started at time 0 in `phase` (drawn from $\gamma$ when `None`):
        their arrival times, sizes and the phase after each arrival (explicit `key`; the phase chain is run move by
        move)."""
        n = check_count("n", n, "the number of batches", minimum=0)
        m = self.order
        if phase is None:
            k0, key = jr.split(key)
            start = jr.choice(k0, m, p=self.gamma)
        else:
            start = jnp.asarray(check_count("phase", phase, f"a phase 0..{m - 1}", minimum=0, maximum=m - 1))
        return _sample(self.C, self.D, key, start, n)


def stationary_vector(G: Float[Array, "m m"]) -> Float[Array, " m"]:
    r"""Stationary vector of the irreducible generator `G`: $\gamma G = 0$, $\gamma\mathbf1 = 1$ (one linear solve,
    the normalisation replacing the last balance equation; differentiable)."""
    m = G.shape[0]
    A = jnp.concatenate([G[:, :-1], jnp.ones((m, 1), G.dtype)], axis=1)
    return small_solve(A.T, jnp.zeros((m, 1), G.dtype).at[-1, 0].set(1.0))[:, 0]


@functools.partial(jax.jit, static_argnums=4)
def _sample(C, D, key, start, n):
    m, B = C.shape[0], D.shape[0]
    out = -jnp.diagonal(C)
    # Outcomes of a move from phase i: silent move to j (index j), or a batch of b + 1 to phase j (m + b m + j).
    silent = C - jnp.diag(jnp.diagonal(C))
    probs = jnp.concatenate([silent[:, None], jnp.transpose(D, (1, 0, 2))], axis=1).reshape(m, (B + 1) * m)
    probs = probs / out[:, None]

    def one_batch(carry, _):
        phase, t, key = carry

        def cond(c):
            return c[3] < m  # outcome index < m: a silent move, keep going

        def body(c):
            phase, t, key, _ = c
            key, k1, k2 = jr.split(key, 3)
            t = t + jr.exponential(k1) / out[phase]
            o = jr.choice(k2, (B + 1) * m, p=probs[phase]).astype(jnp.int32)
            return o % m, t, key, o

        phase, t, key, o = jax.lax.while_loop(cond, body, (phase, t, key, jnp.zeros((), jnp.int32)))
        return (phase, t, key), (t, o // m, phase)

    start = jnp.asarray(start, jnp.int32)
    _, (times, size, phases) = jax.lax.scan(one_batch, (start, jnp.zeros(()), key), None, length=n)
    return times, size, phases


def not_a_bmap(bmap: BMAP) -> Array:
    """Whether `bmap` is not a BMAP descriptor (NaN entries included), as a boolean array that may be traced: the
    sign and row-sum tests of construction, for the entry points' `eqx.error_if` checks when it is traced."""
    C, D = bmap.C, bmap.D
    diag = jnp.diagonal(C)
    scale = jnp.abs(diag)
    off = C - jnp.diag(diag)
    rows = jnp.sum(C, axis=1) + jnp.sum(D, axis=(0, 2))
    valid = (
        jnp.all(jnp.isfinite(C)) & jnp.all(jnp.isfinite(D))
        & jnp.all(off >= -_ATOL * scale[:, None]) & jnp.all(D >= -_ATOL * scale[None, :, None])
        & jnp.all(jnp.abs(rows) <= _ATOL * jnp.maximum(scale, 1e-300)) & jnp.any(D > 0)
    )
    return ~valid
