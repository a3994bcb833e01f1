"""Package-wide configuration: jsmkt works in float64 throughout; `use_cpu_cores` exposes a CPU's cores as JAX
devices, over which `jsmkt.simulate` splits its replications."""

import numbers
import os

import jax


jax.config.update("jax_enable_x64", True)


def use_cpu_cores(n: int | None = None) -> bool:
    """Expose `n` CPU cores (default: all of them) as JAX CPU devices, so that `jsmkt.simulate` runs its
    replications on them in parallel. JAX allows this only before its first computation in the process: call it
    right after `import jsmkt`.

    **Returns:** `True` if the setting took effect, `False` if JAX had computed something already (its devices
    then stay as they are).

    **Raises:** `ValueError` if `n` is not an integer >= 1.
    """
    if n is None:
        n = os.cpu_count() or 1
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n={n!r} must be an integer >= 1 (the number of CPU cores to use)")
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:  # the backends are initialised already
        return False
    return True
