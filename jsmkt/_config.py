"""Package-wide configuration: jsmkt works in float64 throughout (`use_float64`); `use_cpu_cores` exposes a CPU's
cores as JAX devices, over which `jsmkt.simulate` splits its replications; `use_fast_compilation` says whether
what jsmkt compiles for one eager call is compiled for compilation speed (`jsmkt._compile`).

Nothing here imports JAX at import time: `import jsmkt` and the console script's help and spec checks stay fast.
"""

import numbers
import os
import sys


_X64_ENV = "JAX_ENABLE_X64"
_UNSET = object()
_env_before: object = _UNSET  # JAX_ENABLE_X64 before `use_float64` set it (None: it was not set)
_fast_compilation = True


def use_float64() -> None:
    """Make JAX compute in float64. Once JAX is imported, this is `jax.config.update("jax_enable_x64", True)`, and
    the environment variable below is put back as it was. Before, it sets `JAX_ENABLE_X64=1`, which JAX reads
    when it is imported, so that arrays made before jsmkt's first public name is used are float64 too."""
    global _env_before
    if "jax" not in sys.modules:
        if _env_before is _UNSET:
            _env_before = os.environ.get(_X64_ENV)
        os.environ[_X64_ENV] = "1"
        return
    import jax

    jax.config.update("jax_enable_x64", True)
    if _env_before is not _UNSET:
        if _env_before is None:
            os.environ.pop(_X64_ENV, None)
        else:
            os.environ[_X64_ENV] = _env_before  # type: ignore[assignment]
        _env_before = _UNSET


def max_cpu_devices() -> int:
    """The most CPU devices `use_cpu_cores` sets up: the number of cores, or 8 on smaller machines (more devices
    than cores run, but only add overhead)."""
    return max(os.cpu_count() or 1, 8)


def too_many_cpu_devices() -> str:
    """The end of the error message for too many CPU devices."""
    return (f"{max_cpu_devices()} devices, the most allowed (this machine has {os.cpu_count() or 1} CPU cores; more "
            "devices than cores only add overhead)")


def use_cpu_cores(n: int | None = None) -> bool:
    """Expose `n` CPU cores (default: all of them) as JAX CPU devices, so that `jsmkt.simulate` runs its
    replications on them in parallel. JAX allows this only before its first computation in the process: call it
    right after `import jsmkt`.

    **Returns:** `True` if the setting took effect, `False` if JAX had computed something already (its devices
    then stay as they are).

    **Raises:** `ValueError` if `n` is not an integer from 1 to the larger of the number of CPU cores and 8.
    """
    if n is None:
        n = os.cpu_count() or 1
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n={n!r} must be an integer >= 1 (the number of CPU cores to use)")
    if n > max_cpu_devices():
        raise ValueError(f"n={n!r} exceeds {too_many_cpu_devices()}")
    import jax

    use_float64()
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:  # the backends are initialised already
        return False
    return True


def use_fast_compilation(enabled: bool = True) -> None:
    """Whether jsmkt compiles what it runs once for compilation speed (the default) or with XLA's defaults.

    On a CPU, a solve of concrete inputs (`jsmkt.solve_fixed_point(model)` outside `jit` and `vmap`), a check of a
    model's values, a structure probe, and the construction of a sojourn-time law or of the refined mean field are
    compiled with LLVM's optimisation off and XLA's simpler emitters (`jsmkt._compile.FAST_OPTIONS`): a family's
    first solve compiles in a fraction of the time, and runs somewhat slower (`benchmarks/compile.py`).
    `use_fast_compilation(False)` suits a script whose Python loop solves one model structure eagerly many thousands
    of times; `jax.vmap`, `jax.jit` and jsmkt's batched paths (`jsmkt.batched`, `jsmkt.sweep`) are compiled with
    XLA's defaults either way. Other backends always use XLA's defaults. It applies from the next call on.

    **Raises:** `ValueError` if `enabled` is not a bool."""
    global _fast_compilation
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled={enabled!r} must be True or False")
    _fast_compilation = enabled


def fast_compilation() -> bool:
    """Whether `use_fast_compilation` is on (the default)."""
    return _fast_compilation
