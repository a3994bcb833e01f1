r"""The Jacobian structure of a model's reduced vector field, detected from `jax.jacfwd`, and the linear solver
it calls for.

Newton's method and the implicit adjoint solve with the Jacobian of `vector_field` on the flattened reduced state.
Each unknown has a *level* (`model.unknown_levels()`); the structure is a `bandwidth` in levels, beyond which
only a few dense `border` rows and columns (unknowns that couple to every level, such as a total busy fraction)
have nonzeros. It is read off the sparsity of the Jacobian at a generic point: random entries for the state and
for every inexact array leaf of the model (and a generic law for every choice number), so that it depends only on
the model's structure (its static fields and shapes), never on parameter values, and is the same inside and outside
`jit`. It is computed once per model structure. Newton solves the vector field itself unless its structure calls for
a dense LU; `jsmkt._models.newton` then looks for an equivalent system with a banded Jacobian.

A family may declare its structure (`declared_structure`), which spares the detection (a compilation of
`jax.jacfwd` of all `n` columns per model structure). It is never trusted silently: the first time a model
structure is met, its Jacobian at the generic point is checked against the declaration (`probe_violation`: the
entries inside the structure are read by `(2b + 1) m` coloured products, and one more product with a random vector
must agree with them, so an entry outside shows up), and the model is refused when some entry lies outside;
`check_declared` compares a declaration with the full detected sparsity, as the contract tests do for every
registered family.
"""

import contextlib
from typing import TYPE_CHECKING, Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _maps
from .._compile import fast_jit
from .._choice import AbstractChoice
from .._errors import staging


if TYPE_CHECKING:
    import lineax as lx


class Structure(NamedTuple):
    """`levels[i]`: level of flattened unknown `i`; `J[i, j] = 0` unless `|levels[i] - levels[j]| <= bandwidth` or
    `i` or `j` is in `border`."""

    levels: tuple[int, ...]
    bandwidth: int
    border: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return len(self.levels)

    def describe(self) -> str:
        border = f", border unknowns {list(self.border)}" if self.border else ""
        return f"bandwidth {self.bandwidth} in levels{border}"


_PROBE_SEED = 20261201
_CACHE: dict = {}
_MAX_PATTERN = 2**14  # unknowns up to which the dense sparsity pattern is formed (n^2 booleans)


def _probe_model(model):
    """`model` with every inexact array leaf replaced by seeded random entries in [0.5, 1.5] (same shapes), and
    every choice law by a generic one of its kind (`AbstractChoice.generic`: a real choice number drawn in
    [0.5, 1.5] would sample one server half the time, and couple nothing)."""
    rng = np.random.default_rng(_PROBE_SEED)

    def draw(shape, low, high):
        return jnp.asarray(rng.uniform(low, high, shape), dtype=jnp.float64)

    def generic(x):
        if isinstance(x, AbstractChoice):
            return x.generic(draw)
        if eqx.is_inexact_array(x) or (isinstance(x, jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)):
            return jnp.asarray(draw(np.shape(x), 0.5, 1.5), dtype=x.dtype)
        return x

    return jax.tree_util.tree_map(generic, model, is_leaf=lambda x: isinstance(x, AbstractChoice))


@fast_jit
def _jacobian(probe, z):
    _, unravel = ravel_pytree(probe.initial_state())
    f = lambda u: ravel_pytree(probe.vector_field(0.0, unravel(u), None))[0]  # noqa: E731
    return jax.jacfwd(f)(z)


# Entries below this fraction of the largest are rounding residues (sums of flows that cancel exactly in exact
# arithmetic, such as a departure's outflow and inflow within one tail), not couplings.
_RELATIVE_ZERO = 1e-11


def sparsity(model) -> np.ndarray:
    """Boolean `(n, n)` sparsity pattern of the Jacobian of `model.vector_field` on the flattened reduced state, at
    a generic point (module docstring)."""
    with _concrete_inside_traces():
        probe = _probe_model(model)
        leaves = jax.tree_util.tree_leaves(jax.eval_shape(probe.initial_state))
        n = sum(int(np.prod(a.shape)) for a in leaves)
        if n > _MAX_PATTERN:
            raise ValueError(f"{n} unknowns: too many to detect the Jacobian's structure; lower K")
        rng = np.random.default_rng(_PROBE_SEED + 1)
        z = jnp.asarray(rng.uniform(0.7, 0.99, n), dtype=leaves[0].dtype)
        J = np.abs(np.asarray(_jacobian(probe, z)))
    return J > _RELATIVE_ZERO * J.max(initial=0.0)


def _concrete_inside_traces():
    """`jax.ensure_compile_time_eval()` when called inside a trace (a solve under `jit`), so that the probes give
    concrete answers there too; else nothing. (Under it a jitted probe runs operation by operation, each compiled
    on its own: about 40 small compilations instead of one.)"""
    return jax.ensure_compile_time_eval() if staging() else contextlib.nullcontext()


def _signature(model) -> Any:
    return (type(model), _maps.signature(model))


def structure(model) -> Structure:
    """The structure of `model`'s Jacobian: detected (module docstring), or the family's `declared_structure()`
    after checking that it covers the detected sparsity. Cached per model structure."""
    key = _signature(model)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    levels = tuple(int(v) for v in model.unknown_levels())
    declared = model.declared_structure()
    if declared is None:
        pattern = sparsity(model)
        if pattern.shape[0] != len(levels):
            raise ValueError(
                f"{type(model).__name__}.unknown_levels() gives {len(levels)} levels for {pattern.shape[0]} unknowns"
            )
        from .. import _linalg  # Lineax, imported where a structure is first found: not by a loaded solve

        bandwidth, border = _linalg.classify_sparsity(pattern, np.asarray(levels))
    else:
        bandwidth, border = declared
    found = Structure(levels, int(bandwidth), tuple(int(b) for b in border))
    if declared is not None:
        _verify(model, found)
    remember(model, found)
    return found


def remember(model, found: Structure) -> None:
    """Keep `found` as the structure of `model`'s Jacobian (detected another way, e.g. with its Newton system's by
    `jsmkt._models.newton`)."""
    if len(_CACHE) >= 1024:
        _CACHE.clear()
    _CACHE[_signature(model)] = found


_maps.on_clear(_CACHE.clear)


def check_declared(model) -> Structure:
    """The declared structure of `model`, after checking that it covers the sparsity detected from `jax.jacfwd`
    (a `ValueError` names the first entry outside it)."""
    declared = model.declared_structure()
    if declared is None:
        return structure(model)
    levels = np.asarray(model.unknown_levels())
    bandwidth, border = declared
    from .. import _linalg

    bad = _linalg.structure_violations(sparsity(model), levels, bandwidth, tuple(border))
    if len(bad):
        raise ValueError(violation_message(model, Structure(tuple(levels), bandwidth, tuple(border)), *bad[0]))
    return structure(model)


@fast_jit
def _probe_at(s: Structure, probe, z):
    _, unravel = ravel_pytree(probe.initial_state())
    return probe_violation(s, lambda u: ravel_pytree(probe.vector_field(0.0, unravel(u), None))[0], z)


_VERIFIED: set = set()


def _verify(model, s: Structure) -> None:
    """Refuse a declared structure that `probe_violation` finds wrong. The probe runs on a copy of the model
    truncated at a few levels more than three bandwidths, when the family declares the same structure there (a
    banded structure does not depend on `K`), so one compilation serves every `K`; else on the model itself."""
    probe_K = max(8, 3 * s.bandwidth + 3)
    target = model
    if model.K > probe_K:
        small = model.with_K(probe_K)
        bandwidth, border = small.declared_structure()
        if (int(bandwidth), tuple(int(b) for b in border)) == (s.bandwidth, s.border):
            target = small
    key = _signature(target)
    if key in _VERIFIED:
        return
    checked = s if target is model else Structure(tuple(int(v) for v in target.unknown_levels()), s.bandwidth,
                                                  s.border)
    if _violates(target, checked):
        raise ValueError(violation_message(model, s))
    _VERIFIED.add(key)


_maps.on_clear(_VERIFIED.clear)


def _violates(model, s: Structure) -> bool:
    """Whether the Jacobian of `model` has entries outside `s` at a generic point (`probe_violation` on the probe
    model of `sparsity`): one compiled call of a few products, once per model structure."""
    with _concrete_inside_traces():
        probe = _probe_model(model)
        z = jnp.asarray(np.random.default_rng(_PROBE_SEED + 1).uniform(0.7, 0.99, s.n), dtype=jnp.float64)
        return bool(_probe_at(s, probe, z))


def violation_message(model, s: Structure, i=None, j=None) -> str:
    where = "" if i is None else (f": d(vector_field)[{int(i)}]/d(y)[{int(j)}] is nonzero (levels "
                                  f"{s.levels[int(i)]} and {s.levels[int(j)]})")
    return (f"{type(model).__name__} declares a Jacobian of {s.describe()}, but its Jacobian has entries outside "
            f"that structure{where}; fix declared_structure(), or return None from it to use the detected structure")


def _colour_tables(s: Structure):
    """Colours of the unknowns for the structure check, and per row and colour the column read."""
    levels = np.asarray(s.levels)
    b = max(s.bandwidth, 1)
    base = levels - levels.min()
    pos = np.arange(levels.size) - np.searchsorted(levels, levels)  # position within its level
    m = int(pos.max()) + 1
    colour = (base % (2 * b + 1)) * m + pos
    border = np.zeros(levels.size, bool)
    border[list(s.border)] = True
    n_colours = (2 * b + 1) * m
    index = -np.ones((base.max() + 1, m), int)
    index[base, pos] = np.arange(levels.size)
    # Row i reads colour c = (r, p) from the column at the level l with |l - level_i| <= b and l = r (mod 2b + 1).
    cols = -np.ones((levels.size, n_colours), int)
    for c in range(n_colours):
        r, p = divmod(c, m)
        l = base + ((r - base) % (2 * b + 1))  # the first level >= base with that residue
        l = np.where(l - base > b, l - (2 * b + 1), l)
        ok = (l >= 0) & (l <= base.max())
        j = np.where(ok, index[np.clip(l, 0, base.max()), p], -1)
        j = np.where((j >= 0) & ~border[np.maximum(j, 0)], j, -1)
        cols[:, c] = j
    return colour, border, n_colours, cols


def probe_violation(s: Structure, fn, y):
    """Whether the Jacobian of `fn` (flat to flat) at `y` has entries outside the structure `s`, beyond rounding:
    `(2b + 1) m` coloured products read the entries inside the band, `|border|` unit products the border columns,
    and one product with a random vector `r` must equal their sum over `r` (rows of the border excepted, which may
    hold anything)."""
    colour, border, n_colours, cols = _colour_tables(s)
    n = len(s.levels)
    probes = np.zeros((n_colours + len(s.border), n))
    probes[colour[~border], np.flatnonzero(~border)] = 1.0
    for q, j in enumerate(s.border):
        probes[n_colours + q, j] = 1.0
    r = np.random.default_rng(_PROBE_SEED).uniform(0.5, 1.5, n)
    V = jnp.asarray(np.concatenate([probes, r[None]]), dtype=y.dtype)
    _, jvp = jax.linearize(fn, y)
    Y = jax.vmap(jvp)(V)  # (probes + 1, n)
    Yc, Yb, Jr = Y[:n_colours], Y[n_colours:-1], Y[-1]
    rr = jnp.asarray(r, y.dtype)
    picked = jnp.where(jnp.asarray(cols >= 0), rr[np.maximum(cols, 0)], 0.0)  # (n, colours)
    inside = jnp.sum(Yc.T * picked, axis=1) + (Yb.T @ rr[np.asarray(s.border, int)] if s.border else 0.0)
    scale = jnp.sum(jnp.abs(Yc.T) * picked, axis=1) + (jnp.abs(Yb.T) @ rr[np.asarray(s.border, int)]
                                                          if s.border else 0.0)
    gap = jnp.abs(Jr - inside) > 1e-9 * scale + 1e-300
    return jnp.any(gap & ~jnp.asarray(border))


def linear_solver(model) -> "lx.AbstractLinearSolver":
    """Newton's (and the implicit adjoint's) linear solver, chosen from the structure."""
    from .. import _linalg

    s = structure(model)
    return _linalg.structure_solver(s.levels, s.bandwidth, s.border)


_STATE_SIZES: dict = {}  # unknowns of the reduced state, by `_maps.signature` of the model


def _state_size(model) -> int:
    """Number of unknowns of `model`'s reduced state. `initial_state` has the structure and shapes of every reduced
    state (the contract), and unlike `initial_guess` (a scan through the levels for PH service) it costs nothing to
    trace; still, tracing it on every eager call is not free, so the size is kept per model structure."""
    key = _maps.signature(model)
    n = _STATE_SIZES.get(key)
    if n is None:
        n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(jax.eval_shape(model.initial_state)))
        if len(_STATE_SIZES) >= 1024:
            _STATE_SIZES.clear()
        _STATE_SIZES[key] = n
    return n
