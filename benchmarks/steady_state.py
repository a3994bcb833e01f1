"""Benchmark: jsmkt's ODE steady state (`jsmkt.steady_state`) against SciPy's LSODA on the same equations.

Models: JSQ(2) with H2 service of SCV 4 (`jsmkt.hyperexponential2(1.0, 4.0)`), lam = 0.9, K = 48 (96 unknowns, the
target); exponential JSQ(2) at lam = 0.95, K = 60; JSQ(2) with batch arrivals of 1 to 4 jobs (`JSQdBatch`), total
load 0.8, K = 60. For each, measured in one run:

- the first call of `jsmkt.steady_state` (trace + compile + solve; the Jacobian's structure detected first), of
  the same integration in its configuration before `benchmarks/README.md`'s change (Kvaerno5 with Diffrax's default
  chord iteration at the controller's tolerances and a dense LU), and of LSODA (with the jit of the vector field
  and its Jacobian), shown apart;
- medians of interleaved repeats (each call after the others', `--repeats` rounds) of: `jsmkt.steady_state(model)`
  (the public eager call); the configuration before the change; LSODA (`scipy.integrate.solve_ivp(method="LSODA")`)
  on `jax.jit(model.vector_field)` and its `jax.jacfwd`, wrapped as NumPy callables, with a terminal event; and LSODA
  without the event, to the time at which jsmkt stopped;
- steps (accepted, rejected) of each Diffrax run, LSODA's steps and evaluations, the max-norm distance of each end
  state to `solve_fixed_point`'s, and the ratio jsmkt / LSODA with PASS/MISS (target: <= 1, with the event).

Same equations, tolerances and start: all runs use the model's own vector field, `rtol = 1e-10`, `atol = 1e-12`
(`steady_state`'s defaults), and start from the empty system. Stopping rules: jsmkt stops at the end of the first
step whose end state has `rms(f(y)) < atol + rtol * rms(y)` (`diffrax.steady_state_event` with the controller's
tolerances; `rms` over all entries). LSODA's terminal event is `rms(f(y)) - (atol + rtol * rms(y))`, whose zero
`solve_ivp` locates inside the step by root finding on the dense output: it stops where the drift reaches the
threshold, jsmkt a little beyond (at a step's end), and each LSODA step pays one more vector-field evaluation for the
event. The run to a fixed time shows LSODA's integration without that cost.

Run with `.venv/bin/python benchmarks/steady_state.py` (`--repeats` rounds, 7 by default).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy/SciPy/JAX load OpenBLAS (see fixed_point.py)

import argparse  # noqa: E402
import time  # noqa: E402

import diffrax as dfx  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402
from _common import interleaved_medians, positive  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt._integrate import _steady_state  # noqa: E402


RTOL, ATOL = 1e-10, 1e-12
MAX_STEPS = 1_000_000
MODELS = {
    "JSQ(2)-H2 K=48": lambda: jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=48),
    "JSQ(2) K=60": lambda: jsmkt.JSQd(0.95, d=2, K=60),
    "JSQ(2)-batch K=60": lambda: jsmkt.JSQdBatch(0.32, jnp.array([0.4, 0.3, 0.2, 0.1]), d=2, K=60),
}
TARGET = "JSQ(2)-H2 K=48"


@eqx.filter_jit
def _before(model, y0):
    """The integration as `steady_state` ran it before the change: Kvaerno5 with Diffrax's default root finder
    (a chord iteration at the controller's tolerances) and a dense LU."""
    sol = dfx.diffeqsolve(
        dfx.ODETerm(lambda t, y, m: m.vector_field(t, y, None)), dfx.Kvaerno5(), t0=0.0, t1=jnp.inf, dt0=1e-3, y0=y0,
        args=model, saveat=dfx.SaveAt(t1=True), stepsize_controller=dfx.PIDController(rtol=RTOL, atol=ATOL),
        event=dfx.Event(dfx.steady_state_event()), max_steps=MAX_STEPS, adjoint=dfx.ImplicitAdjoint(), throw=False,
    )
    return jax.tree_util.tree_map(lambda v: v[-1], sol.ys), sol.stats


def _first(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - t0, out


def _rms(v):
    return float(np.sqrt(np.mean(np.square(v))))


def bench(name, model, repeats):
    y0 = model.initial_state()
    flat0, unravel = ravel_pytree(y0)
    flat0 = np.asarray(flat0)
    fp = np.asarray(ravel_pytree(jsmkt.solve_fixed_point(model).value)[0])

    def public():
        return jsmkt.steady_state(model, rtol=RTOL, atol=ATOL)[0]

    t_first, _ = _first(public)
    t_first_before, (y_before, st_before) = _first(lambda: _before(model, y0))
    # The same compiled integration as `public`, with its step counts and stopping time.
    y, result, stats, t_stop = _steady_state(model, y0, jnp.asarray(RTOL), jnp.asarray(ATOL), MAX_STEPS, False)
    assert result == jsmkt.RESULTS.successful, result
    y, t_stop = np.asarray(ravel_pytree(y)[0]), float(t_stop)

    # LSODA on the model's own vector field and Jacobian, jitted, as NumPy callables.
    f = jax.jit(lambda v: ravel_pytree(model.vector_field(0.0, unravel(v), None))[0])
    jac = jax.jit(jax.jacfwd(lambda v: ravel_pytree(model.vector_field(0.0, unravel(v), None))[0]))

    def fun(t, v):
        return np.asarray(f(v))

    def jacobian(t, v):
        return np.asarray(jac(v))

    def drift(t, v):
        return _rms(fun(t, v)) - (ATOL + RTOL * _rms(v))

    drift.terminal = True

    def lsoda():
        return scipy.integrate.solve_ivp(fun, (0.0, 1e9), flat0, method="LSODA", rtol=RTOL, atol=ATOL, jac=jacobian,
                                         events=drift)

    def lsoda_to_t():
        return scipy.integrate.solve_ivp(fun, (0.0, t_stop), flat0, method="LSODA", rtol=RTOL, atol=ATOL,
                                         jac=jacobian, t_eval=[t_stop])

    t_first_lsoda, sol = _first(lsoda)  # with the compilation of the vector field and its Jacobian
    assert sol.status == 1, sol.message  # stopped by the event
    sol_t = lsoda_to_t()
    assert sol_t.status == 0, sol_t.message
    times = interleaved_medians({
        "jsmkt": public,
        "before": lambda: _before(model, y0),
        "lsoda": lsoda,
        "lsoda_t": lsoda_to_t,
    }, repeats, burst=1)

    def dist(v):
        return float(np.max(np.abs(np.asarray(v) - fp)))

    print(f"\n{name} ({flat0.size} unknowns): first calls jsmkt {t_first:.2f} s, before {t_first_before:.2f} s, "
          f"LSODA {t_first_lsoda:.2f} s (jit of f and its Jacobian)")
    print(f"  {'run':34s} {'median':>10s} {'steps':>7s} {'rejected':>8s} {'f/J evals':>10s} {'stop t':>8s} "
          f"{'|y - fp|':>9s}")
    print(f"  {'jsmkt.steady_state':34s} {times['jsmkt'] * 1e3:8.1f} ms {int(stats['num_steps']):7d} "
          f"{int(stats['num_rejected_steps']):8d} {'':>10s} {t_stop:8.1f} {dist(y):9.1e}")
    print(f"  {'before (Kvaerno5, default chord)':34s} {times['before'] * 1e3:8.1f} ms "
          f"{int(st_before['num_steps']):7d} {int(st_before['num_rejected_steps']):8d} {'':>10s} {'':>8s} "
          f"{dist(ravel_pytree(y_before)[0]):9.1e}")
    print(f"  {'LSODA, drift event':34s} {times['lsoda'] * 1e3:8.1f} ms {len(sol.t) - 1:7d} {'n/a':>8s} "
          f"{sol.nfev:5d}/{sol.njev:<4d} {sol.t[-1]:8.1f} {dist(sol.y[:, -1]):9.1e}")
    print(f"  {'LSODA to jsmkt stop t, no event':34s} {times['lsoda_t'] * 1e3:8.1f} ms {'':>7s} {'n/a':>8s} "
          f"{sol_t.nfev:5d}/{sol_t.njev:<4d} {t_stop:8.1f} {dist(sol_t.y[:, -1]):9.1e}")
    ratio = times["jsmkt"] / times["lsoda"]
    verdict = ("PASS" if ratio <= 1.0 else "MISS") if name == TARGET else "(info)"
    print(f"  jsmkt / LSODA {ratio:.2f}  {verdict}; jsmkt / LSODA without event "
          f"{times['jsmkt'] / times['lsoda_t']:.2f}; before / jsmkt {times['before'] / times['jsmkt']:.1f}")
    return ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=7, help="interleaved rounds (default 7)")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; rtol={RTOL:g}, atol={ATOL:g}; medians over "
          f"{args.repeats} interleaved rounds (one call of each per round); "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    ratios = {name: bench(name, make(), args.repeats) for name, make in MODELS.items()}
    print(f"\ntarget ({TARGET}): jsmkt / LSODA = {ratios[TARGET]:.2f} <= 1: "
          f"{'PASS' if ratios[TARGET] <= 1.0 else 'MISS'}")


if __name__ == "__main__":
    main()
