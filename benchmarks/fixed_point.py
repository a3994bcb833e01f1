"""Benchmark: jsmkt's fixed-point solve (Newton, jitted) against itself differentiated, batched, and against SciPy.

Model: JSQ(2) with H2 service of SCV 4 (`jsmkt.hyperexponential2(1.0, 4.0)`), lam = 0.9, truncation K = 48
(K*m = 96 unknowns). Measured in one run, side by side:

- first-call time (trace + compile) of the jitted solve and of the jitted gradient;
- median latency of one jitted solve, of the jitted primal `lam -> E[T]`, and of `jax.grad` of it;
- `scipy.optimize.fsolve` (MINPACK hybrd) on the same exact mean-field equations written in NumPy below, from the
  same initial guess; both solutions must agree to 1e-8;
- batched throughput: `jax.vmap` over 64 values of lam;
- how the solve scales with K (dense LU on the (K*m)^2 Jacobian is O((K*m)^3) per Newton step).

Run with `.venv/bin/python benchmarks/fixed_point.py` (add `--quick` for fewer repeats).
"""

import argparse
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

import jsmkt


LAM, K, D = 0.9, 48, 2
SERVICE = jsmkt.hyperexponential2(1.0, 4.0)
TARGET_GRAD_RATIO = 2.0  # grad time / primal time <= 2
TARGET_SCIPY_SPEEDUP = 10.0  # fsolve time / jsmkt time >= 10


# ---------------------------------------------------------------------------------------------------------------
# The same exact mean-field equations in NumPy (JSQdPH's vector field, written independently from its docstring):
#   dS_1 = lam (1 - s_1^d) alpha + S_1 T + S_2 T0 alpha,
#   dS_k = lam h(s_{k-1}, s_k) (S_{k-1} - S_k) + S_k T + S_{k+1} T0 alpha,   k = 2..K,   S_{K+1} = 0,
# with s_k = S_k 1 and h(a, b) = (a^d - b^d)/(a - b) = sum_{j<d} a^j b^{d-1-j}.


def numpy_vector_field(flat, lam, alpha, T, d, K):
    m = alpha.shape[0]
    S = flat.reshape(K, m)
    T0 = -T.sum(axis=1)
    s = np.concatenate([[1.0], S.sum(axis=1)])  # s_0..s_K
    a, b = s[:-1], s[1:]  # (s_{k-1}, s_k), k = 1..K
    h = sum(a**j * b ** (d - 1 - j) for j in range(d))
    X_prev = np.concatenate([((1.0 - s[1]) * alpha)[None], S[:-1] - S[1:]])  # (1 - s_1) h(1, s_1) = 1 - s_1^d
    completions = np.concatenate([S[1:] @ T0, [0.0]])[:, None] * alpha[None, :]
    return (lam * h[:, None] * X_prev + S @ T + completions).ravel()


# ---------------------------------------------------------------------------------------------------------------


def _median_time(fn, repeats, *args):
    """Median wall time of `fn(*args)` (blocking on its outputs), after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _first_call(fn, *args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def _model(lam, K=K):
    return jsmkt.JSQdPH(lam, SERVICE, d=D, K=K)


def _make_fns(K):
    def solve(lam):
        return jsmkt.solve_fixed_point(_model(lam, K))

    def sojourn(lam):
        model = _model(lam, K)
        return jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))

    return jax.jit(solve), jax.jit(sojourn), jax.jit(jax.grad(sojourn))


def _verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (20 if args.quick else 200)
    scipy_repeats = max(5, repeats // 10)

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; JSQ({D}), H2 service SCV 4, lam={LAM}, K={K}, "
          f"m={SERVICE.order} ({K * SERVICE.order} unknowns); medians over {repeats} repeats")
    lam = jnp.asarray(LAM)
    solve, sojourn, grad = _make_fns(K)

    compile_solve, fp = _first_call(solve, lam)
    compile_grad, _ = _first_call(grad, lam)
    model = _model(LAM)
    assert fp.result == jsmkt.RESULTS.successful, fp.result
    tail_mass = float(fp.tail_mass)
    assert tail_mass < 1e-12, f"K={K} too small: tail mass {tail_mass}"
    t_solve = _median_time(solve, repeats, lam)
    t_primal = _median_time(sojourn, repeats, lam)
    t_grad = _median_time(grad, repeats, lam)

    # SciPy on the same equations, from the same initial guess.
    alpha, T = np.asarray(SERVICE.alpha), np.asarray(SERVICE.T)
    x0 = np.asarray(model.initial_guess()).ravel()
    f_np = (lambda x: numpy_vector_field(x, LAM, alpha, T, D, K))
    np.testing.assert_allclose(f_np(np.asarray(fp.value).ravel()), np.asarray(model.vector_field(0.0, fp.value)).ravel(),
                               rtol=0, atol=1e-13, err_msg="NumPy vector field differs from jsmkt's")
    band = 2 * SERVICE.order - 1  # row (k, i) depends on levels k-1, k, k+1 only

    def fsolve_dense():
        return scipy.optimize.fsolve(f_np, x0, xtol=1e-13, full_output=True)

    def fsolve_banded():
        return scipy.optimize.fsolve(f_np, x0, xtol=1e-13, band=(band, band), full_output=True)

    rows_scipy = {}
    for name, fn in (("scipy fsolve", fsolve_dense), ("scipy fsolve band", fsolve_banded)):
        x, info, ier, msg = fn()
        assert ier == 1, msg
        err = np.max(np.abs(x - np.asarray(fp.value).ravel()))
        assert err < 1e-8, f"{name} and jsmkt disagree by {err:.2e}"
        rows_scipy[name] = (_median_time(fn, scipy_repeats), info["nfev"], err)

    # Batched throughput: vmap over 64 values of lam.
    lams = jnp.linspace(0.5, 0.95, 64)
    batched = jax.jit(jax.vmap(lambda lam: solve(lam).value))
    compile_batched, _ = _first_call(batched, lams)
    t_batched = _median_time(batched, max(5, repeats // 10), lams)

    # Scaling in K (one jitted solve each).
    scaling = []
    for k in (K, 2 * K, 4 * K):
        s_k, _, _ = _make_fns(k)
        fp_k = s_k(lam)
        scaling.append((k, int(fp_k.stats["num_steps"]), _median_time(s_k, max(5, repeats // 10), lam)))

    num_steps = int(fp.stats["num_steps"])
    print()
    print(f"{'measurement':<34}{'time':>12}  notes")
    print("-" * 86)
    print(f"{'first call: solve (trace+compile)':<34}{compile_solve:>10.3f} s")
    print(f"{'first call: grad  (trace+compile)':<34}{compile_grad:>10.3f} s")
    print(f"{'first call: vmap(64) solve':<34}{compile_batched:>10.3f} s")
    print(f"{'jsmkt solve':<34}{1e3 * t_solve:>10.3f} ms  {num_steps} Newton steps, tail mass s_K = {tail_mass:.1e}")
    print(f"{'jsmkt lam -> E[T]':<34}{1e3 * t_primal:>10.3f} ms  E[T] = {float(sojourn(lam)):.10f}")
    print(f"{'jsmkt grad E[T] wrt lam':<34}{1e3 * t_grad:>10.3f} ms  dE[T]/dlam = {float(grad(lam)):.8f}")
    for name, (t, nfev, err) in rows_scipy.items():
        print(f"{name:<34}{1e3 * t:>10.3f} ms  {nfev} evaluations, max |x - x_jsmkt| = {err:.1e}")
    print(f"{'jsmkt vmap(64) solve':<34}{1e3 * t_batched:>10.3f} ms  {64 / t_batched:,.0f} solves/s "
          f"(single: {1 / t_solve:,.0f} solves/s)")
    for k, steps, t in scaling:
        print(f"{f'jsmkt solve, K={k} ({k * SERVICE.order} unknowns)':<34}{1e3 * t:>10.3f} ms  {steps} Newton steps, "
              f"{1e3 * t / steps:.3f} ms/step")
    print()
    grad_ratio = t_grad / t_primal
    speedup = rows_scipy["scipy fsolve"][0] / t_solve
    speedup_band = rows_scipy["scipy fsolve band"][0] / t_solve
    print(f"grad / primal time         = {grad_ratio:6.2f}   (target <= {TARGET_GRAD_RATIO:g})   {_verdict(grad_ratio <= TARGET_GRAD_RATIO)}")
    print(f"fsolve / jsmkt solve time  = {speedup:6.1f}x  (target >= {TARGET_SCIPY_SPEEDUP:g}x)  "
          f"{_verdict(speedup >= TARGET_SCIPY_SPEEDUP)}")
    print(f"fsolve(band) / jsmkt time  = {speedup_band:6.1f}x  (information: a banded finite-difference Jacobian)")
    print(f"vmap(64) speed-up per solve = {64 * t_solve / t_batched:5.1f}x over one-at-a-time")


if __name__ == "__main__":
    main()
