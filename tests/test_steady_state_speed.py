"""`jsmkt.steady_state` (the ODE integrated until the drift vanishes) on `benchmarks/steady_state.py`'s target model:
its end point against Newton's fixed point at the distance its docstring promises, and the integration's step
counts well below those of its configuration before the stage iteration's tolerances and structured solve (3,366
steps, 1,656 of them rejected, on this model)."""

import jax.numpy as jnp
import numpy as np

import jsmkt
from jsmkt._integrate import _steady_state


def test_steady_state_reaches_the_fixed_point_in_few_steps():
    # JSQ(2)-H2, K = 48: the shape tests/test_grad.py compiles.
    model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=48)
    rtol, atol = 1e-10, 1e-12  # steady_state's defaults
    y, result = jsmkt.steady_state(model)
    assert result == jsmkt.RESULTS.successful
    fp = jsmkt.solve_fixed_point(model)
    # The docstring: the distance to the fixed point is about tolerance / (1 - rho), here rtol / 0.1.
    dist = float(jnp.max(jnp.abs(y - fp.value)))
    assert dist <= rtol / (1 - 0.9), dist
    # The end state meets the stopping rule, evaluated here with the vector field (root mean squares).
    f = np.asarray(model.vector_field(0.0, y, None))
    rms = lambda v: float(np.sqrt(np.mean(np.square(v))))  # noqa: E731
    assert rms(f) < atol + rtol * rms(np.asarray(y))
    # The same compiled integration (the public call's arguments), read for its step counts.
    _, result, stats, t_end = _steady_state(model, model.initial_state(), jnp.asarray(rtol), jnp.asarray(atol),
                                            1_000_000, False)
    assert result == jsmkt.RESULTS.successful
    assert int(stats["num_steps"]) < 1000, stats
    assert int(stats["num_rejected_steps"]) < 100, stats
    assert float(t_end) > 100.0  # a relaxation over hundreds of time units, not a jump to the root
