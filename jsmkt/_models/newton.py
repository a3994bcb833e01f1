r"""The system of equations Newton's method solves for a model's fixed point, chosen so that its Jacobian is
structured.

**The tail system** (the default) is the vector field itself in the reduced coordinates, $F(y) = 0$. Its Jacobian
is banded in the levels for the queueing families (`jsmkt._models.structure`): a flow at a rate that does not
depend on the level, summed over every level $\ge k$, is that rate times a tail.

**The occupancy system**, for a described model whose tail system reads as dense. Two kinds of coupling make
the tail rows dense:

- a move that changes a server's status and level at a rate that grows with the level (a linear retrial
  $(j, \text{idle}) \to (j - 1, \text{busy})$ at rate $j\theta$, a helper's completion at the rate its key gives):
  the tail row of a status at level $k$ sums those flows over every level above $k$, a sum of rates times
  occupancies that no set of tails makes local;
- a stream that starts at the servers (a re-probing retrial): its rate per server, $R(x) = \sum_c w_c x_c$ (for
  linear retrials $\theta E[\text{orbit}]$), multiplies the chosen servers' moves at every level.

The occupancy system keeps the tails $y$ as unknowns but states the balance of each cell instead of each tail
(the rows $\dot x_c$, $c = 1..C-1$, a triangular recombination of the tail rows), where the first kind of
coupling is local; and it adds the rate of each stream with an origin as an unknown $c_s$, with the equation
$c_s - R_s(x) = 0$, the chosen servers' moves using $c_s$:

$$G(y, c) = \big(\dot x_{1..C-1}(y;\, c),\; c - R(x(y))\big) = 0.$$

At a root $c = R(x)$, so $\dot x = 0$ and $F(y) = 0$: the same fixed point, and (by the implicit function
theorem applied to $G$) the same derivatives. The Jacobian of $G$ is banded in the levels plus a border: the
stream rates' rows and columns and the totals a choice reads (the busy fraction). `newton_system` takes it only
when the tail system's structure would make Newton's step a dense LU and the occupancy system's would not; a
saturated pool (whose pinned tail has no occupancy row of its own) keeps the tail system. One probe Jacobian, that
of the occupancy system, gives both structures (`_detect`). `check_size` refuses a system too large for memory
before anything of its size is traced.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _maps
from .._compile import fast_jit
from .meanfield import drift, stream_rate, transitions
from .reduced import pinned_tail
from .structure import _CACHE as _STRUCTURES
from .structure import (
    _PROBE_SEED,
    _RELATIVE_ZERO,
    Structure,
    _concrete_inside_traces,
    _probe_model,
    _signature,
    _state_size,
    remember,
    structure,
)


class NewtonSystem(NamedTuple):
    """Which system Newton solves (module docstring) and the structure of its Jacobian.

    - `occupancy`: `False` for the tail system (the vector field), `True` for the occupancy system.
    - `streams`: indices, in the description's dispatches, of the streams with an origin whose rates are extra
      unknowns (occupancy system only).
    - `structure`: the structure of the system's Jacobian on its flattened unknowns (the reduced state, then the
      stream rates).
    """

    occupancy: bool
    streams: tuple[int, ...]
    structure: Structure

    def solver(self):
        """Newton's (and the implicit adjoint's) Lineax solver for this system: each Jacobian serves one solve
        (`reuse=False`)."""
        from .. import _linalg

        s = self.structure
        return _linalg.structure_solver(s.levels, s.bandwidth, s.border, reuse=False)


def _state_shape(model):
    return jax.eval_shape(model.initial_state)


def _stream_rates(desc, streams, x) -> Float[Array, " r"]:
    if not streams:
        return jnp.zeros(0, x.dtype)
    return jnp.stack([stream_rate(desc.dispatches[s], x) for s in streams]).astype(x.dtype)


def occupancy_residual(model, streams: tuple[int, ...], z: Float[Array, " n+r"]) -> Float[Array, " n+r"]:
    """$G(y, c)$ of the module docstring at the flat unknowns `z = (y, c)`."""
    shape = _state_shape(model)
    n = int(np.prod(shape.shape))
    y, c = jnp.reshape(z[:n], shape.shape), z[n:]
    desc = model.description()
    x = model.occupancy(y)
    names = {desc.dispatches[s].name: c[k] for k, s in enumerate(streams)}
    dx = drift(transitions(desc, x), x, partner_rates=names)
    return jnp.concatenate([dx[1:], c - _stream_rates(desc, streams, x)])


def residual(system: NewtonSystem, model, z):
    """The residual of `system` at its unknowns `z` (the vector field, shaped like the state, for the tail
    system)."""
    if not system.occupancy:
        return model.vector_field(0.0, z, None)
    return occupancy_residual(model, system.streams, z)


def unknowns(system: NewtonSystem, model, y):
    """The system's unknowns at the reduced state `y` (the stream rates are those of `y`)."""
    if not system.occupancy:
        return y
    desc = model.description()
    x = model.occupancy(y)
    return jnp.concatenate([jnp.ravel(y), _stream_rates(desc, system.streams, x).astype(jnp.result_type(y))])


def state(system: NewtonSystem, model, z):
    """The reduced state of the system's unknowns `z`."""
    if not system.occupancy:
        return z
    shape = _state_shape(model)
    return jnp.reshape(z[: int(np.prod(shape.shape))], shape.shape)


_CACHE: dict = {}
_maps.on_clear(_CACHE.clear)


@fast_jit
def _occupancy_jacobian(probe, streams, z):
    return jax.jacfwd(lambda u: occupancy_residual(probe, streams, u))(z)


def _tail_rows(desc, M: np.ndarray) -> np.ndarray:
    """`M`'s rows, those of the cells `1..C-1`, taken to the rows of their tails: the tail of cell `c` sums the
    cells of its status at its level and above (cell 0, the lowest of its status, is in no tail but its own, which
    is not an unknown). A reverse cumulative sum over the levels, per status."""
    status = desc.cells.status[1:]  # the cells are listed by level, then status
    out = np.empty_like(M)
    for s in np.unique(status):
        rows = np.flatnonzero(status == s)
        out[rows] = np.cumsum(M[rows][::-1], axis=0)[::-1]
    return out


def _classified(pattern, levels) -> Structure:
    from .. import _linalg

    bandwidth, border = _linalg.classify_sparsity(pattern, levels)
    return Structure(tuple(int(v) for v in levels), int(bandwidth), tuple(int(b) for b in border))


def _detect(model) -> tuple[Structure, tuple[int, ...], Structure] | None:
    """For a described model without a saturated pool: the structure of the vector field's Jacobian, and the
    streams and structure of the occupancy system, both from one probe Jacobian, that of the occupancy system at a
    generic point (random model leaves and unknowns, as `jsmkt._models.structure.sparsity`). With $G$ the
    occupancy system and $T$ the static map from cell rows to tail rows, the vector field's Jacobian is
    $T(G_y + G_c R_y)$, $R$ the stream rates. `None` for any other model."""
    from .base import AbstractDescribedModel

    if not isinstance(model, AbstractDescribedModel):
        return None
    desc = []
    jax.eval_shape(lambda: desc.append(model.description()))  # static tables only
    if pinned_tail(desc[0]) is not None:
        return None
    streams = tuple(i for i, d in enumerate(desc[0].dispatches) if d.origin is not None)
    tail_levels = np.asarray(model.unknown_levels())
    n, r = tail_levels.size, len(streams)
    levels = np.concatenate([tail_levels, np.full(r, tail_levels.max())])
    with _concrete_inside_traces():
        probe = _probe_model(model)
        z = jnp.asarray(np.random.default_rng(_PROBE_SEED + 1).uniform(0.7, 0.99, n + r), dtype=jnp.float64)
        J = np.asarray(_occupancy_jacobian(probe, streams, z))
    tails = _tail_rows(desc[0], J[:n, :n] - J[:n, n:] @ J[n:, :n])  # R_y = -(rows of c - R(x))_y
    occupancy = np.abs(J) > _RELATIVE_ZERO * np.abs(J).max(initial=0.0)
    tail_pattern = np.abs(tails) > _RELATIVE_ZERO * np.abs(tails).max(initial=0.0)
    return _classified(tail_pattern, tail_levels), streams, _classified(occupancy, levels)


def _is_dense(s: Structure) -> bool:
    import lineax as lx

    from .. import _linalg

    return isinstance(_linalg.structure_solver(s.levels, s.bandwidth, s.border), lx.LU)


def newton_system(model) -> NewtonSystem:
    """The system Newton solves for `model` (module docstring), cached per model structure: the tail system,
    unless it would be solved by dense LU and the model is described (without a saturated pool) and its occupancy
    system would not. For a described model without a declared structure, one probe finds both structures (and
    keeps the vector field's for `jsmkt._models.structure.structure`)."""
    key = _signature(model)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    tail, found = _STRUCTURES.get(key), None
    if tail is None and model.declared_structure() is None:
        found = _detect(model)
        if found is not None:
            tail = found[0]
            remember(model, tail)
    if tail is None:
        tail = structure(model)
    system = NewtonSystem(False, (), tail)
    if _is_dense(tail):
        found = _detect(model) if found is None else found
        if found is not None and not _is_dense(found[2]):
            system = NewtonSystem(True, found[1], found[2])
    if len(_CACHE) >= 1024:
        _CACHE.clear()
    _CACHE[key] = system
    return system


def linear_system_bytes(model, n: int) -> int:
    """About how many bytes Newton's linear system takes for `n` unknowns (the probes and factors of the structure,
    `2 n^2` floats when dense). A declared structure is read without building anything of size `n` (so that an
    absurd `K` is refused before it is allocated)."""
    declared = model.declared_structure()
    if declared is not None:
        bandwidth, border = declared
        m = -(-n // model.K)  # unknowns per level
    else:
        s = newton_system(model).structure  # that of the system Newton solves
        n = len(s.levels)
        bandwidth, border = s.bandwidth, s.border
        m = int(np.bincount(np.asarray(s.levels) - min(s.levels)).max())
    b, p = max(int(bandwidth), 1), len(border)
    banded = 8 * (5 * n * b * m + 2 * n * p + p * p)
    return min(banded, 8 * 2 * n * n)


_MAX_LINEAR_SYSTEM_BYTES = 2**33  # 8 GiB: Newton's linear system (block diagonals or dense matrix) and its probes


def check_size(model, x0=None) -> None:
    """Refuse, before tracing anything large, a model whose Newton linear system would not fit in memory (its
    probes and factors, by the Jacobian's structure; `2 n^2` floats for a dense one)."""
    n = _state_size(model)
    need = linear_system_bytes(model, n)
    if need > _MAX_LINEAR_SYSTEM_BYTES:
        raise ValueError(
            f"{n} unknowns (K={model.K}): Newton's linear system needs about {need / 2**30:.3g} GiB (limit "
            f"{_MAX_LINEAR_SYSTEM_BYTES / 2**30:.3g} GiB); lower K or use a service distribution with fewer phases"
        )
