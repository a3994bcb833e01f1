"""How jsmkt compiles what it runs once: a solve of concrete inputs, a check of a model's values, a structure probe,
the construction of a sojourn-time law or of the refined mean field.

On a CPU, XLA's backend compilation (LLVM's optimisation passes and code generation) is most of a first solve,
and takes hundreds of times as long as the solve it compiles (`benchmarks/compile.py`). A function decorated with
`fast_jit` is `eqx.filter_jit` whose eager calls (concrete inputs, no enclosing trace) compile with `options()`,
the XLA options that make compilation fastest (`FAST_OPTIONS`: LLVM's optimisation off, XLA's loop emitters rather
than its fusion emitters, one module per executable). Those executables run somewhat slower (the benchmark's
`default ms` column), which one solve of a model never earns back.

The options are per executable (`jax.jit`'s `compiler_options`), so nothing else changes: inside a user's
`jax.jit` or `jax.vmap`, and in jsmkt's batched paths (`jsmkt.batched`, `jsmkt.sweep`), a `fast_jit` function is
traced into the enclosing computation, which XLA compiles with its defaults. On other backends, or after
`jsmkt.use_fast_compilation(False)` (for a script whose loop solves the same model structure eagerly many
thousands of times), `fast_jit` is plain `eqx.filter_jit`. An option that this jaxlib's XLA does not know is
dropped at its first refusal, and the call compiled again without it.
"""

import re
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from . import _config


FAST_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,
}
"""The XLA options of an eager call of a `fast_jit` function on a CPU (the tests' `FAST_COMPILE_FLAGS`)."""

RUNTIME_ERROR: type[Exception] = getattr(jax.errors, "JaxRuntimeError", RuntimeError)
"""XLA's runtime error (`jax.errors.JaxRuntimeError`; older JAX raises a `RuntimeError` subclass without the name)."""

_refused: set[str] = set()  # options this jaxlib's XLA refused ("No such compile option")
_REFUSAL = re.compile(r"No such compile option: '(\w+)'")


def options() -> dict[str, Any] | None:
    """The XLA options of an eager call of a `fast_jit` function now: `FAST_OPTIONS` less those refused, on a CPU
    with fast compilation on; None otherwise (XLA's defaults)."""
    if not _config.fast_compilation() or jax.default_backend() != "cpu":
        return None
    return {k: v for k, v in FAST_OPTIONS.items() if k not in _refused}


def _dropped_refused(e: Exception, opts: dict[str, Any]) -> bool:
    """Whether `e` is XLA's refusal of one of `opts` (then dropped from `options()` for good)."""
    refused = _REFUSAL.search(str(e)) if isinstance(e, RUNTIME_ERROR) else None
    if refused is None or refused.group(1) not in opts:
        return False
    _refused.add(refused.group(1))
    return True


def compile(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """`lowered.compile()` with `options()`: for a computation that a process runs once (the CLI's solve)."""
    while True:
        opts = options()
        try:
            return lowered.compile(compiler_options=opts or None)
        except RUNTIME_ERROR as e:
            if not opts or not _dropped_refused(e, opts):
                raise


def _traced(tree) -> bool:
    """Whether `tree` holds a tracer, or a trace encloses this call (a user's `jit` of a function that closes over a
    concrete model): then the call is traced into the enclosing computation, where a nested `jit` may not carry
    compiler options. A copy to the device is staged, as a tracer, exactly when a trace encloses it."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree)):
        return True
    return isinstance(jax.device_put(_ZERO), jax.core.Tracer)


_ZERO = np.zeros(())


class _FastJit:
    """`eqx.filter_jit(fn)`, whose eager calls compile with `options()` (see the module's docstring)."""

    def __init__(self, fn: Callable):
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "fast_jit")
        self.__doc__ = fn.__doc__
        self._plain = eqx.filter_jit(fn)
        self._fast: dict[tuple, Callable] = {}  # options, as sorted items -> filter_jit with those options

    def __call__(self, *args, **kwargs):
        opts = options()
        if not opts or _traced((args, kwargs)):
            return self._plain(*args, **kwargs)
        key = tuple(sorted(opts.items()))
        jitted = self._fast.get(key)
        if jitted is None:
            jitted = self._fast[key] = eqx.filter_jit(self.__wrapped__, compiler_options=dict(opts))
        try:
            return jitted(*args, **kwargs)
        except RUNTIME_ERROR as e:
            if not _dropped_refused(e, opts):
                raise
            return self(*args, **kwargs)  # compiled again without the option this XLA does not know


def fast_jit(fn: Callable) -> Callable:
    """`eqx.filter_jit(fn)`, whose eager calls compile for compilation speed (`options()`); traced calls are
    traced into the enclosing computation, as `eqx.filter_jit`'s are."""
    return _FastJit(fn)
