"""Headroom for XLA compilations under the kernel's memory-map limit.

XLA's CPU backend loads every compiled kernel as an object of its own, mapped into memory three times (code,
constants, data). A fixed point of a new model shape costs about 300 maps, a simulator configuration about 370.
Linux allows a process `vm.max_map_count` maps (65530 by default); past it, the next compilation cannot map its
code and the process dies with a segmentation fault ("LLVM compilation error: Cannot allocate memory"). A
process that compiles a few hundred distinct shapes or configurations, e.g. a sweep over `K`, `N` or the service
law, gets there. jsmkt checks before it compiles something new (`simulate` per configuration; `solve_fixed_point`,
`refined_mean_field`, `integrate` and `steady_state` per new shape of their inputs): near the limit it clears
JAX's compilation caches, with a warning, and raises a clear error if that does not free enough.
"""

import warnings
from collections.abc import Callable, Hashable

import jax


HEADROOM = 4000  # maps kept free before compiling something new (about ten simulator configurations' worth)
_MAX_SEEN = 4096

_seen: set[Hashable] = set()
_on_clear: list[Callable[[], None]] = []


def map_usage() -> tuple[int, int] | None:
    """(memory maps of this process, the kernel's limit), or None where this cannot be read (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            used = f.read().count(b"\n")
    except (OSError, ValueError):
        return None
    return used, limit


def on_clear(fn: Callable[[], None]) -> None:
    """Register `fn` to run when `make_room` clears JAX's caches (e.g. to drop a cache of jitted functions)."""
    _on_clear.append(fn)


def make_room(who: str) -> None:
    """Before compiling: if the process is within `HEADROOM` maps of the limit, clear JAX's compilation caches
    (`jax.clear_caches()`: compiled functions are recompiled when next called) with a `RuntimeWarning`; raise a
    `RuntimeError` if that does not free enough. `who` names the caller in the messages."""
    usage = map_usage()
    if usage is None or usage[0] + HEADROOM < usage[1]:
        return
    used, limit = usage
    jax.clear_caches()
    _seen.clear()
    for fn in _on_clear:
        fn()
    after = map_usage()
    warnings.warn(
        f"this process held {used} memory maps, close to the kernel's limit vm.max_map_count={limit} (XLA maps "
        "every compiled kernel separately, and past the limit the next compilation crashes the process); "
        f"{who} cleared JAX's compilation caches ({after[0] if after else '?'} maps now). To avoid it, reuse "
        "shapes and configurations, call jax.clear_caches() between them, or raise the limit "
        "(sysctl vm.max_map_count=1048576)",
        RuntimeWarning,
        stacklevel=3,
    )
    if after is not None and after[0] + HEADROOM >= after[1]:
        raise RuntimeError(
            f"this process holds {after[0]} memory maps even after clearing JAX's caches, too close to the "
            f"kernel's limit vm.max_map_count={after[1]} for {who} to compile safely; release compiled JAX "
            "functions you keep, or raise the limit (sysctl vm.max_map_count=1048576)"
        )


def signature(tree) -> Hashable:
    """What decides whether a function of `tree` compiles anew: its structure and the shapes and dtypes of its
    array leaves (other leaves by type)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((x.shape, str(x.dtype)) if hasattr(x, "shape") else type(x) for x in leaves)


def before_compiling(who: str, key: Hashable) -> None:
    """`make_room(who)` the first time `key` (e.g. a `signature`) is seen."""
    if key in _seen:
        return
    if len(_seen) >= _MAX_SEEN:
        _seen.clear()
    _seen.add(key)
    make_room(who)
