r"""Choice numbers: how many servers an arrival samples.

A choice rule is described by the law of the number $D$ of servers an arrival samples (with replacement), through
its probability generating function $g(s) = E[s^D]$. With tails $s_k$ (fraction of servers with at least $k$
jobs), an arrival joins a server with exactly $k$ jobs with probability $g(s_k) - g(s_{k+1})$. The mean-field
rates only ever need the divided difference

$$h(a, b) = \frac{g(a) - g(b)}{a - b} = E\Big[\sum_{j<D} a^j b^{D-1-j}\Big],$$

which stays finite where $a = b$ (deep in the tail), so nothing divides by a vanishing difference.

Three rules are provided:

- `FixedChoice(d)`: $D = d$ always (integer, static);
- `MixedChoice(weights)`: $P(D = j) = $ `weights[j-1]`, $j = 1..D_{\max}$ (differentiable weights);
- `InterpolatedChoice(d)`: a real $d \ge 1$ read as the randomised rule $D = \lfloor d\rfloor + 1$ with probability
  $d - \lfloor d\rfloor$ and $D = \lfloor d\rfloor$ otherwise, so $E[D] = d$. This is a physical system (each
  arrival flips a coin for its choice number), so simulation can check it, and the mean field is piecewise linear
  in $d$: `jax.grad` with respect to `d` gives the right derivative at integers.
"""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._errors import as_float_array, check_count, concrete_array, constant


_UNROLL_MAX_D = 16  # up to this many choice numbers the sums over them are written out; beyond, a `lax.scan`
# The largest choice number: a choice law is a dense vector of P(D = j), j = 1..max_d.
MAX_CHOICE = 2**16
_MAX_WHAT = "number of servers an arrival samples"


def _divided_differences(a: Array, b: Array, n: int) -> Array:
    """`h_j(a, b) = sum_{i<j} a^i b^(j-1-i)` for j = 1..n, stacked on a new leading axis."""
    hs = [jnp.ones_like(a + b)]
    bp = jnp.ones_like(b)
    for _ in range(1, n):
        bp = bp * b
        hs.append(a * hs[-1] + bp)
    return jnp.stack(hs)


def _divided_difference(a: Array, b: Array, n: int) -> Array:
    """`h_n(a, b) = sum_{i<n} a^i b^(n-1-i)` for a static integer n >= 1, in O(log n) operations by the binary
    expansion of n: `h_{2m} = h_m (a^m + b^m)` and `h_{m+1} = a h_m + b^m` (sums and products only, no division)."""
    h, pa, pb = jnp.ones_like(a + b), a, b  # h_m, a^m, b^m for m = 1
    for bit in bin(n)[3:]:
        h, pa, pb = h * (pa + pb), pa * pa, pb * pb
        if bit == "1":
            h, pa, pb = a * h + pb, pa * a, pb * b
    return h


def _weighted_pgf(w: Array, s: Array) -> Array:
    """`sum_j w[j-1] s^j` by Horner's rule in a `lax.scan` (any number of weights)."""
    p, _ = jax.lax.scan(lambda p, wj: (p * s + wj, None), jnp.zeros_like(s) + w[-1], w[:-1], reverse=True)
    return p * s


def _weighted_divided_differences(w: Array, a: Array, b: Array) -> Array:
    """`sum_j w[j-1] h_j(a, b)` by the recursion `h_{j+1} = a h_j + b^j` in a `lax.scan`."""

    def step(carry, wj):
        h, bp, acc = carry
        h = a * h + bp
        return (h, bp * b, acc + wj * h), None

    one = jnp.ones_like(a + b)
    (_, _, acc), _ = jax.lax.scan(step, (one, b * one, w[0] * one), w[1:])
    return acc


class AbstractChoice(eqx.Module):
    """Law of the number of servers sampled by an arrival."""

    @property
    @abc.abstractmethod
    def max_d(self) -> int:
        """Largest choice number with possibly positive probability (static)."""

    @abc.abstractmethod
    def weights(self) -> Float[Array, " max_d"]:
        """`P(D = j)` for `j = 1..max_d`."""

    def pgf(self, s: ArrayLike) -> Array:
        r"""$g(s) = E[s^D]$."""
        weights = self.weights()
        w, sc = concrete_array(weights), concrete_array(s)
        if w is not None and sc is not None:  # concrete (a model's checks): on the host, nothing to compile
            return constant(np.tensordot(w, np.stack([sc ** (j + 1) for j in range(self.max_d)]), axes=1))
        s = jnp.asarray(s)
        if self.max_d > _UNROLL_MAX_D:
            return _weighted_pgf(weights, s)
        powers = jnp.stack([s ** (j + 1) for j in range(self.max_d)])
        return jnp.tensordot(weights, powers, axes=1)

    def join_factor(self, a: ArrayLike, b: ArrayLike) -> Array:
        r"""Divided difference $h(a, b) = (g(a) - g(b))/(a - b)$, computed without division."""
        a, b = jnp.asarray(a), jnp.asarray(b)
        if self.max_d > _UNROLL_MAX_D:
            return _weighted_divided_differences(self.weights(), a, b)
        return jnp.tensordot(self.weights(), _divided_differences(a, b, self.max_d), axes=1)

    @property
    def mean(self) -> Array:
        """Mean choice number `E[D]`."""
        w = self.weights()
        return jnp.arange(1, self.max_d + 1, dtype=w.dtype) @ w

    @property
    def number(self):
        """The choice number: the integer `d` of a fixed choice, else the mean `E[D]`."""
        return self.mean

    def value_errors(self) -> list[tuple[Array, str]]:
        """Value checks for the entry points: list of `(bad, message)`."""
        return []

    def generic(self, draw: Callable[[tuple[int, ...], float, float], Array]) -> "AbstractChoice":
        """A copy at a generic point of its parameters' domain, where the choice couples the servers as it does for
        almost every value (the Jacobian structure probes, `jsmkt._models.structure`). `draw(shape, low, high)`
        gives random entries in `[low, high]`; by default every inexact array leaf is drawn in [0.5, 1.5]."""
        return jax.tree_util.tree_map(lambda x: draw(jnp.shape(x), 0.5, 1.5) if _inexact(x) else x, self)


def _inexact(x) -> bool:
    return eqx.is_inexact_array(x) or (isinstance(x, jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact))


class FixedChoice(AbstractChoice):
    """Every arrival samples exactly `d` servers."""

    d: int = eqx.field(static=True)

    def __init__(self, d: int):
        self.d = check_count("d", d, _MAX_WHAT, maximum=MAX_CHOICE)

    @property
    def max_d(self) -> int:
        return self.d

    def weights(self) -> Array:
        return constant(np.eye(1, self.d, self.d - 1)[0])  # a constant, not operations run one by one

    def pgf(self, s: ArrayLike) -> Array:
        sc = concrete_array(s)
        return jnp.asarray(s) ** self.d if sc is None else constant(sc**self.d)

    def join_factor(self, a: ArrayLike, b: ArrayLike) -> Array:
        a, b = jnp.asarray(a), jnp.asarray(b)
        if self.d > _UNROLL_MAX_D:
            return _divided_difference(a, b, self.d)
        return _divided_differences(a, b, self.d)[-1]

    @property
    def mean(self) -> Array:
        return constant(float(self.d))

    @property
    def number(self) -> int:
        return self.d


class MixedChoice(AbstractChoice):
    """An arrival samples `j` servers with probability `weights[j-1]`, `j = 1..len(weights)`."""

    probs: Float[Array, " max_d"]

    def __init__(self, weights: ArrayLike):
        self.probs = as_float_array("d", weights, ndim=1)

    def __check_init__(self):
        if self.probs.shape[0] < 1:
            raise ValueError("d=[] is empty; give probabilities of sampling 1, 2, ... servers")
        if self.probs.shape[0] > MAX_CHOICE:
            raise ValueError(
                f"d has {self.probs.shape[0]} probabilities: more than {MAX_CHOICE}, the largest {_MAX_WHAT} jsmkt "
                "handles"
            )
        w = concrete_array(self.probs)
        if w is not None:
            for j, p in enumerate(w):
                if p < -1e-12:
                    servers = "1 server" if j == 0 else f"{j + 1} servers"
                    raise ValueError(f"d[{j}]={float(p)!r} (probability of sampling {servers}) is negative")
            if abs(w.sum() - 1.0) > 1e-8:
                raise ValueError(f"d={w.tolist()!r} sums to {float(w.sum())!r}; choice-number probabilities must sum to 1")

    @property
    def max_d(self) -> int:
        return self.probs.shape[0]

    def weights(self) -> Array:
        return self.probs

    def value_errors(self):
        w = self.probs
        return [
            (jnp.any(w < -1e-12) | (jnp.abs(jnp.sum(w) - 1.0) > 1e-8), "choice-number probabilities `d` must be >= 0 and sum to 1"),
        ]


class InterpolatedChoice(AbstractChoice):
    r"""A real choice number $d \ge 1$: sample $\lfloor d\rfloor + 1$ servers with probability
    $d - \lfloor d\rfloor$, else $\lfloor d\rfloor$ (so $E[D] = d$).

    `d_max` bounds the support (static); it defaults to $\lfloor d\rfloor + 1$ when `d` is concrete.
    """

    d: Float[Array, ""]
    d_max: int = eqx.field(static=True)

    def __init__(self, d: ArrayLike, d_max: int | None = None):
        self.d = as_float_array("d", d, ndim=0)
        dc = concrete_array(self.d)
        if d_max is None:
            if dc is None:
                raise ValueError(
                    "d is traced (inside jit/grad) and no d_max was given; pass d_max, the largest choice "
                    "number the optimisation may reach, e.g. JSQd(lam, d=d, d_max=8)"
                )
            if not dc >= 1:
                raise ValueError(f"d={float(dc)!r} must be >= 1 (the mean number of servers sampled)")
            if dc >= MAX_CHOICE:
                raise ValueError(
                    f"d={float(dc)!r} must be below {MAX_CHOICE}: its law samples up to floor(d) + 1 servers, and "
                    f"{MAX_CHOICE} is the largest {_MAX_WHAT} jsmkt handles (d = {MAX_CHOICE} itself needs "
                    f"d_max={MAX_CHOICE})"
                )
            d_max = int(np.floor(dc)) + 1
        self.d_max = check_count("d_max", d_max, _MAX_WHAT, maximum=MAX_CHOICE)

    def __check_init__(self):
        dc = concrete_array(self.d)
        if dc is not None:
            if not dc >= 1:
                raise ValueError(f"d={float(dc)!r} must be >= 1 (the mean number of servers sampled)")
            if dc > self.d_max:
                raise ValueError(f"d={float(dc)!r} exceeds d_max={self.d_max}; raise d_max")

    @property
    def max_d(self) -> int:
        return self.d_max

    def weights(self) -> Array:
        # Out-of-range d is reported by `value_errors` at the entry points; keep the weights a probability
        # vector regardless. At d = d_max the derivative is the left one (lo = d_max - 1, frac = 1).
        if self.d_max == 1:  # the only law is D = 1, whatever d (its tangent too)
            return jnp.ones(1, dtype=self.d.dtype)
        dc = concrete_array(self.d)
        xp, d = (jnp, self.d) if dc is None else (np, dc)  # a concrete d (a model's checks): on the host
        d = xp.where(d > self.d_max, float(self.d_max), xp.where(d < 1.0, 1.0, d))
        lo = xp.minimum(xp.floor(d), float(max(self.d_max - 1, 1)))
        frac = d - lo
        j = xp.arange(1, self.d_max + 1, dtype=d.dtype)
        w = xp.where(j == lo, 1.0 - frac, 0.0) + xp.where(j == lo + 1, frac, 0.0)
        return w if dc is None else constant(w)

    def value_errors(self):
        return [(~(self.d >= 1.0) | (self.d > self.d_max), f"choice number `d` must lie in [1, d_max={self.d_max}]")]

    def generic(self, draw):
        """`d` drawn inside $(1, d_{max})$: a `d` at or below 1 samples one server, which couples nothing."""
        if self.d_max == 1:
            return self
        d = 1.0 + (self.d_max - 1) * np.asarray(draw((), 0.25, 0.75))  # on the host: no operation to compile
        return eqx.tree_at(lambda c: c.d, self, jnp.asarray(d, dtype=jnp.result_type(self.d)))


def choice_support(weights) -> tuple[int, int] | None:
    """`(d_min, d_max)`, the smallest and largest choice numbers with positive probability in the concrete
    `weights` (`P(D = j)` for `j = 1, 2, ...`); `None` when no weight is positive."""
    support = np.nonzero(np.asarray(weights) > 0)[0]
    return (int(support[0]) + 1, int(support[-1]) + 1) if support.size else None


def as_choice(d, d_max: int | None = None) -> AbstractChoice:
    """Convert a user's `d` into a choice rule.

    - a Python/NumPy integer → `FixedChoice(d)`;
    - a real scalar (Python float, 0-d array) → `InterpolatedChoice(d)`;
    - a 1-d array → `MixedChoice(d)` (probabilities of sampling 1, 2, ... servers);
    - an `AbstractChoice` is returned unchanged.
    """
    if isinstance(d, AbstractChoice):
        return d
    if isinstance(d, (bool, str, bytes)) or d is None:
        raise ValueError(f"d={d!r} is not a choice number; give an integer, a real number >= 1 or probabilities")
    if isinstance(d, (int, np.integer)):
        if d < 1:
            raise ValueError(f"d={int(d)!r} must be >= 1 (the number of servers sampled)")
        return FixedChoice(int(d))
    # Anything else must be a real number or a vector of them (strings, objects, complex numbers are refused, naming d).
    arr = d if isinstance(d, jax.core.Tracer) else as_float_array("d", d)
    if arr.ndim == 0:
        return InterpolatedChoice(arr, d_max=d_max)
    if arr.ndim == 1:
        return MixedChoice(arr)
    raise ValueError(f"d has shape {arr.shape}; give an integer, a real number or a 1-d probability vector")


def named_choice(name: str, d, d_max: int | None = None) -> AbstractChoice:
    """`as_choice(d, d_max)` for a model with several choice numbers: its messages name the argument `name` (e.g.
    `d1`, `d2`) instead of `d`."""
    try:
        return as_choice(d, d_max)
    except ValueError as e:
        raise ValueError(str(e).replace("d=", f"{name}=").replace("d has", f"{name} has")) from None


def named_value_errors(name: str, choice: AbstractChoice) -> list[tuple]:
    """`choice.value_errors()` with the messages naming the argument `name` instead of `d`."""
    return [(bad, msg.replace("`d`", f"`{name}`")) for bad, msg in choice.value_errors()]
