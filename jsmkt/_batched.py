r"""Batched evaluation in blocks: `jax.lax.map` over `jax.vmap`-ed blocks of a batch.

A vmapped `while` loop (Newton's iteration) runs every lane of the batch until the slowest lane has converged, and
every intermediate of its body is as large as the whole batch. On a CPU the per-solve rate then falls as the batch
grows (the loop's working set leaves the caches); evaluated as a sequential `lax.map` over vmapped blocks of a few
dozen entries, each block stops at its own slowest lane and works in cache. A GPU wants the whole batch at once.

- `batched(fn, block=None)`: like `jax.vmap(fn)`, evaluated block by block.
- `ChunkedImplicitAdjoint`: wraps an `optx.ImplicitAdjoint` so that a plain `jax.vmap` of the solve evaluates the
  nonlinear iteration block by block (a `jax.custom_batching.custom_vmap` rule on the primal iteration only: the
  implicit derivatives are linear solves at the root, outside it, so `jvp`, `grad` and `vmap` compose in any
  order).
"""

import functools as ft
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx


CPU_BLOCK = 32  # entries per vmapped block on a CPU (the per-solve rate falls above this: benchmarks/vmap.py)


def default_block(axis_size: int) -> int:
    """Entries per block: `CPU_BLOCK` when JAX's default backend is a CPU, the whole batch otherwise (a GPU or TPU
    keeps its rate on large batches)."""
    return CPU_BLOCK if jax.default_backend() == "cpu" else max(int(axis_size), 1)


def _check_block(block) -> None:
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block={block!r} must be a positive int (entries per vmapped block), or None for the "
                         f"backend's default ({CPU_BLOCK} on a CPU, the whole batch on a GPU)")


def batched(fn: Callable, *, block: int | None = None) -> Callable:
    r"""`jax.vmap(fn)`, evaluated as `jax.lax.map` over vmapped blocks of `block` entries.

    **Arguments:**

    - `fn`: a function of JAX arrays (or PyTrees of them), e.g. `lambda lam: metric(model(lam))` with a
      `solve_fixed_point(..., throw=False)` inside.
    - `block`: entries per vmapped block; by default 32 on a CPU and the whole batch on a GPU. A batch of at most
      `block` entries is one plain `jax.vmap`.

    **Returns:** `g(*args)`, mapping `fn` over the leading axis of every array leaf of `args` (close over anything
    that is not batched), with the outputs of `jax.vmap(fn)(*args)`: the same values, stacked the same way. `g`
    composes with `jax.jit`, `jax.grad`, `jax.jacfwd` and `jax.vmap` as `jax.vmap(fn)` does.

    A vmapped `while` loop (Newton's iteration in `solve_fixed_point`, the sojourn laws' series) runs every lane
    until the slowest one stops, and holds temporaries as large as the whole batch: on a CPU the per-entry rate
    falls as the batch grows. Block by block, each block stops at its own slowest lane and works in cache; a
    sorted batch (neighbouring parameters together) takes fewer steps per block still.

    **Raises:** `ValueError` for a `fn` that is not callable or a `block` that is not a positive int; at call
    time, for arguments with no array leaf or leading axes of different sizes.
    """
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not callable: pass the function to evaluate per entry, e.g. "
                         "jsmkt.batched(lambda lam: ...)")
    _check_block(block)

    @ft.wraps(fn)
    def g(*args):
        leaves = jax.tree_util.tree_leaves(args)
        if not leaves:
            raise ValueError("jsmkt.batched: the arguments have no array leaf to map over")
        sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(f"jsmkt.batched: every array leaf of the arguments needs the same leading axis (the "
                             f"batch); found leading sizes {sorted(s for s in sizes if s is not None)}"
                             f"{' and scalars' if None in sizes else ''}")
        (n,) = sizes
        b = default_block(n) if block is None else block
        if n <= b:
            return jax.vmap(fn)(*args)
        return jax.lax.map(lambda a: fn(*a), args, batch_size=b)

    return g


def _chunked_call(f: Callable, x, block: int | None):
    """`f(x)`, with a `custom_vmap` rule: under `jax.vmap` over a batch larger than the block, `lax.map` over
    vmapped blocks (the unbatched leaves of `x` closed over). `f` is never differentiated through this rule's
    caller (`ChunkedImplicitAdjoint` calls it for the primal iteration only)."""
    dyn, static = eqx.partition(x, eqx.is_array)
    out_static = []

    def call(d):
        out = f(eqx.combine(d, static))
        out_dyn, out_st = eqx.partition(out, eqx.is_array)
        out_static.append(out_st)
        return out_dyn

    chunked = jax.custom_batching.custom_vmap(call)

    @chunked.def_vmap
    def rule(axis_size, in_batched, d):
        b = default_block(axis_size) if block is None else block
        (in_batched,) = in_batched  # one entry per positional argument
        mapped, fixed = eqx.partition(d, in_batched)

        def one(m):
            return call(eqx.combine(m, fixed))

        if axis_size <= b:
            out = jax.vmap(one)(mapped)
        else:
            out = jax.lax.map(one, mapped, batch_size=b)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    out_dyn = chunked(dyn)
    return eqx.combine(out_dyn, out_static[0])


def _chunked_primal(inputs):
    primal_fn, _, block, inner, *extra = inputs
    return _chunked_call(primal_fn, (*inner, *extra), block)


def _chunked_rewrite(root, residual, inputs):
    _, rewrite_fn, _, inner, *extra = inputs
    return rewrite_fn(root, residual, (*inner, *extra))


class ChunkedImplicitAdjoint(optx.AbstractAdjoint):
    """`inner` (an `optx.ImplicitAdjoint`: its linear solver, its derivatives), with the primal nonlinear
    iteration evaluated in vmapped blocks of `block` entries under `jax.vmap` (`_chunked_call`). The iteration is
    only ever called on primal values (the implicit function theorem differentiates at the root), so the
    `custom_vmap` rule never meets a tangent."""

    inner: optx.ImplicitAdjoint
    block: int | None = eqx.field(static=True, default=None)

    def apply(self, primal_fn, rewrite_fn, inputs, tags):
        packed = (primal_fn, rewrite_fn, self.block, tuple(inputs))
        return self.inner.apply(_chunked_primal, _chunked_rewrite, packed, tags)
