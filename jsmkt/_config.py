"""Package-wide configuration: jsmkt works in float64 throughout; `use_cpu_cores` exposes a CPU's cores as JAX
devices, over which `jsmkt.simulate` splits its replications."""

import numbers
import os

import jax


jax.config.update("jax_enable_x64", True)


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
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:  # the backends are initialised already
        return False
    return True
