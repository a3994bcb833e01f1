"""Helpers for validating inputs.

Static facts (shapes, integer structure) raise `ValueError` in Python at construction. Values are checked in Python
when they are concrete, and at the public entry points with `eqx.error_if` when they are traced (inside `jit`,
`grad`, `vmap`), so a model built from traced parameters inside a loss never fails at construction.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def all_finite(tree: Any) -> jax.Array:
    """Whether every entry of every array leaf of `tree` is finite (a traced boolean under `jit`)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def check_count(name: str, n: Any, what: str | None = None, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [`minimum`, `maximum`] (a NumPy integer too) as an `int`, or a `ValueError` naming `name`, the
    value and, when given, `what` it counts."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"{name}={n!r} must be an integer >= {minimum}" + (f" ({what})" if what else ""))
    if maximum is not None and n > maximum:
        raise ValueError(f"{name}={n!r} exceeds {maximum}, the largest {what or name} jsmkt handles")
    return int(n)


def staging() -> bool:
    """True inside a `jit` trace (or any other that stages out computations), where even operations on concrete
    arrays, such as the leaves of a model built outside the traced function, give tracers."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def is_concrete(*xs: Any) -> bool:
    """True when none of `xs` (pytrees) holds a tracer and nothing is being staged, so that values, and what
    `jax.numpy` computes from them, may be inspected in Python."""
    leaves = jax.tree_util.tree_leaves(xs)
    return not any(isinstance(x, jax.core.Tracer) for x in leaves) and not staging()


def concrete_array(x: Any) -> np.ndarray | None:
    """`x` as a NumPy array when it is concrete, else `None`."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


# The smallest positive normal float64. XLA flushes smaller (subnormal) numbers to zero, so `1e-320 > 0` is False
# inside JAX computations: scale parameters that small are refused (`as_float_array(..., scale=True)`).
TINY = float(np.finfo(np.float64).tiny)


def constant(x: Any) -> jax.Array:
    """A concrete value (a NumPy array, a number) as a JAX array, copied to the device as it is. `jnp.asarray` would
    compile and run a small computation for each new shape, which a process that builds a model once (the CLI) pays
    for every time; under a trace the copy is staged like any other operation."""
    return jax.device_put(np.asarray(x))


def _dtype_kind(x: Any) -> str | None:
    """NumPy's dtype kind of `x` ("b" for booleans), or `None` when `x` is not array-like."""
    if isinstance(x, jax.core.Tracer):
        return x.dtype.kind
    try:
        return np.asarray(x).dtype.kind
    except (TypeError, ValueError):
        return None


def as_float_array(name: str, x: Any, ndim: int | None = None, scale: bool = False) -> jax.Array:
    """Convert to a float64 JAX array, refusing booleans, wrong ranks and, when concrete, non-finite values. With
    `scale` (rates, means: quantities that carry the time unit), nonzero values below the smallest normal float64
    are refused too: XLA reads them as 0. Elsewhere (probabilities, entries of a sub-generator) they are read as 0,
    which is harmless."""
    if isinstance(x, (str, bytes)) or _dtype_kind(x) in ("U", "S", "O"):
        raise ValueError(f"{name}={x!r} is not a number; give a real number or an array of real numbers")
    if _dtype_kind(x) == "b":
        raise ValueError(f"{name}={x!r} is boolean; give a real number or an array of real numbers")
    if _dtype_kind(x) == "c" or isinstance(x, complex):
        raise ValueError(f"{name}={x!r} is complex; give a real number or an array of real numbers")
    if isinstance(x, jax.core.Tracer):
        arr = x.astype(jnp.result_type(float)) if not jnp.issubdtype(x.dtype, jnp.inexact) else x
        c = None
    else:
        try:
            c = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}={x!r} is not a real number or array of real numbers") from e
        arr = x if isinstance(x, jax.Array) and x.dtype == np.float64 and not x.weak_type else constant(c)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {arr.shape} ({name}={x!r})")
    if c is not None:
        if not np.all(np.isfinite(c)):
            raise ValueError(f"{name}={c.tolist()!r} has non-finite entries; give finite numbers")
        tiny = (c != 0) & (np.abs(c) < TINY)
        if scale and np.any(tiny):
            where = name if c.ndim == 0 else f"{name}[{', '.join(map(str, np.argwhere(tiny)[0]))}]"
            raise ValueError(
                f"{where}={float(c[tiny][0])!r} is nonzero but below {TINY:.6g}, the smallest normal float64, which "
                "JAX reads as 0; measure time in another unit"
            )
    return arr


@jax.custom_jvp
def _guard(x: Any, check: jax.Array) -> Any:
    del check
    return x


@_guard.defjvp
def _guard_jvp(primals, tangents):
    x, check = primals
    t_x, _ = tangents
    scaled = lambda t: t if t.dtype == jax.dtypes.float0 else t * (1.0 + check).astype(t.dtype)  # noqa: E731
    return x, jax.tree_util.tree_map(scaled, t_x)


def error_if(x: Any, pred: Any, msg: Any) -> Any:
    """`eqx.error_if(x, pred, msg)` (`msg` a string, or a result code such as `jsmkt.RESULTS.unstable`, whose
    message is raised), whose check also runs when only derivatives of `x` are used. The reverse pass of a function
    linear in `x` never reads `x`, and `jit` drops a check on an unused value as dead code; here the derivatives of
    `x` are scaled by `1 + z`, with `z` a zero that carries the same check, so that no derivative is computed
    without it."""
    if isinstance(msg, str):
        check = lambda v: eqx.error_if(v, pred, msg)  # noqa: E731
    else:
        check = lambda v: msg.error_if(v, pred)  # noqa: E731
    return _guard(check(x), check(jnp.zeros(())))


def check_positive(name: str, x: Any) -> None:
    """Refuse a concrete `x` that is not positive, naming `name` and the value (traced values are checked by the
    models' `value_errors` at the entry points)."""
    c = concrete_array(x)
    if c is not None and not c > 0:
        raise ValueError(f"{name}={float(c)!r} must be positive")


def number_texts(values: list[float], digits: int = 6) -> list[str]:
    """The numbers of one message as text: `digits` significant digits, or more (up to the shortest text that reads
    back as the same float64) where fewer would print two different numbers of the list, or a number and 1 (the
    bound of a load), alike. A load `rho = 1 + 1e-7` then prints as `1.0000001`, not as `1`, and
    `lam=1.0000001 >= capacity mu=1` stays true as printed: rounding to a common number of digits keeps the order of
    the numbers it tells apart."""
    xs = [float(v) for v in values]
    shown = {x for x in xs if np.isfinite(x)} | {1.0}
    for p in range(digits, 17):
        if len({f"{x:.{p}g}" for x in shown}) == len(shown):
            return [f"{x:.{p}g}" for x in xs]
    return [repr(x)[:-2] if repr(x).endswith(".0") else repr(x) for x in xs]  # the shortest that reads back


def percentile_label(p: float) -> str:
    """The key of percentile `p` (in percent) in outputs: `p` and the shortest text that reads back as the same
    float64 (`p50`, `p99.9`, `p99.9999999`), so that distinct percentiles have distinct keys."""
    text = repr(float(p))
    return "p" + (text[:-2] if text.endswith(".0") else text)
