"""Package-wide numerical configuration: jsmkt works in float64 throughout."""

import jax


jax.config.update("jax_enable_x64", True)
