"""Benchmark: jsmkt's fixed-point solve (Newton, jitted) against itself differentiated, batched, and against SciPy.

Model: JSQ(2) with H2 service of SCV 4 (`jsmkt.hyperexponential2(1.0, 4.0)`), lam = 0.9, truncation K = 48
(K*m = 96 unknowns). Measured in one run, side by side:

- first-call time (trace + compile) of the jitted solve and of the jitted gradient;
- median latency of one jitted solve, of the jitted primal `lam -> E[T]`, and of `jax.grad` of it (calls timed in
  bursts of `BURST` back-to-back calls of one function, interleaved between functions; see `_interleaved_medians`);
- `scipy.optimize.fsolve` (MINPACK hybrd) on the same exact mean-field equations written in NumPy below, from the
  same initial guess; both solutions must agree to 1e-8. The target ratio is taken over five loads around
  lam (0.88 to 0.92): hybrd's path at xtol = 1e-13 depends on the last bits of the inputs (with the initial guess
  of before 25fc516 it took 200 evaluations at lam = 0.9, and 105 after a one-ulp change in the H2 phase
  probabilities), so the ratio at one load can be partly luck. Since 25fc516 the initial guess is within rounding
  of the root at these loads: fsolve takes 100 evaluations (one finite-difference Jacobian) and jsmkt one Newton
  step at each. The ratio with calls alternating one by one (cold caches) is printed for information;
- batched throughput: `jax.vmap` over 64 values of lam;
- how the solve scales with K (Newton eliminates the block-tridiagonal Jacobian block by block: O(K m^3) per step;
  a dense LU, shown for comparison, would be O((K m)^3));
- the first call of `jsmkt.solve_fixed_point` (trace + compile + solve) of exponential JSQ(d) as K and d grow: loops
  over levels and choice numbers are `lax.scan`s or O(log d) products, so the trace does not grow with K or d.

Run with `.venv/bin/python benchmarks/fixed_point.py` (add `--quick` for fewer repeats).

OpenBLAS (which serves JAX's CPU LU through SciPy's LAPACK) is limited to one thread unless `OPENBLAS_NUM_THREADS`
is set: these matrices are small, and on a loaded 2-core machine its threads made the medians of the larger LUs
4-10x slower and erratic.
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy/SciPy/JAX load OpenBLAS

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

from _common import interleaved_medians  # noqa: E402

import jsmkt  # noqa: E402


LAM, K, D = 0.9, 48, 2
LOADS = (0.88, 0.89, 0.9, 0.91, 0.92)  # the fsolve ratio's target is its median over these loads
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
    return _interleaved_medians({"fn": lambda: fn(*args)}, repeats)["fn"]


BURST = 10  # back-to-back calls of one function per round


def _interleaved_medians(fns, rounds, burst=BURST):
    """`_common.interleaved_medians`, in bursts of `BURST` calls by default."""
    return interleaved_medians(fns, rounds, burst)


def _first_call(fn, *args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def _model(lam, K=K):
    return jsmkt.JSQdPH(lam, SERVICE, d=D, K=K)


def _make_fns(K):
    def solve(lam):
        return jsmkt.solve_fixed_point(_model(lam, K)).value

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

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; JSQ({D}), H2 service SCV 4, lam={LAM}, K={K}, "
          f"m={SERVICE.order} ({K * SERVICE.order} unknowns); medians over {repeats} "
          f"interleaved repeats; OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    lam = jnp.asarray(LAM)
    solve, sojourn, grad = _make_fns(K)

    compile_solve, _ = _first_call(solve, lam)
    fp = jax.jit(lambda lam: jsmkt.solve_fixed_point(_model(lam)))(lam)  # the full FixedPoint, for the checks
    compile_grad, _ = _first_call(grad, lam)
    model = _model(LAM)
    assert fp.result == jsmkt.RESULTS.successful, fp.result
    tail_mass = float(fp.tail_mass)
    assert tail_mass < 1e-12, f"K={K} too small: tail mass {tail_mass}"

    # SciPy on the same equations, from the same initial guess.
    alpha, T = np.asarray(SERVICE.alpha), np.asarray(SERVICE.T)
    x0 = np.asarray(model.initial_guess()).ravel()
    x_jsmkt = np.asarray(fp.value).ravel()

    def f_np(x):
        return numpy_vector_field(x, LAM, alpha, T, D, K)

    # Same equations: compare the two vector fields away from the root (at the initial guess and a perturbation).
    rng = np.random.default_rng(0)
    for x in (x0, x0 * (1.0 + 0.1 * rng.standard_normal(x0.shape))):
        np.testing.assert_allclose(f_np(x), np.asarray(model.vector_field(0.0, jnp.asarray(x).reshape(K, -1))).ravel(),
                                   rtol=1e-12, atol=1e-15, err_msg="the NumPy vector field differs from jsmkt's")
    band = 2 * SERVICE.order - 1  # row (k, i) depends on levels k-1, k, k+1 only

    def fsolve_dense():
        return scipy.optimize.fsolve(f_np, x0, xtol=1e-13, full_output=True)

    def fsolve_banded():
        return scipy.optimize.fsolve(f_np, x0, xtol=1e-13, band=(band, band), full_output=True)

    scipy_info = {}
    for name, fn in (("scipy fsolve", fsolve_dense), ("scipy fsolve band", fsolve_banded)):
        x, info, ier, msg = fn()
        assert ier == 1, msg
        err = np.max(np.abs(x - x_jsmkt))
        assert err < 1e-8, f"{name} and jsmkt disagree by {err:.2e}"
        scipy_info[name] = (info["nfev"], err)

    # Batched throughput: vmap over 64 values of lam.
    lams = jnp.linspace(0.5, 0.95, 64)
    batched = jax.jit(jax.vmap(solve))
    compile_batched, _ = _first_call(batched, lams)

    num_steps = int(fp.stats["num_steps"])
    n = K * SERVICE.order
    jac = jax.jacfwd(lambda z: model.vector_field(0.0, z.reshape(K, -1)).ravel())(fp.value.ravel())
    # The Jacobian's structure, which Newton's block-tridiagonal elimination relies on.
    outside = np.abs(np.asarray(jac)) * (np.abs(np.subtract.outer(np.arange(n) // SERVICE.order,
                                                                np.arange(n) // SERVICE.order)) > 1)
    assert outside.max() == 0.0, "the Jacobian is not block tridiagonal"

    # For comparison: a dense LU of the same Jacobian, as many times as Newton takes steps.
    @jax.jit
    def dense_lu_only(J):
        def body(_, acc):
            lu = jax.scipy.linalg.lu_factor(J + acc * 1e-300)
            return acc + jax.scipy.linalg.lu_solve(lu, jnp.ones(n))[0]

        return jax.lax.fori_loop(0, num_steps, body, jnp.zeros(()))

    t = _interleaved_medians({
        "solve": lambda: solve(lam),
        "primal": lambda: sojourn(lam),
        "grad": lambda: grad(lam),
        "lu": lambda: dense_lu_only(jac),
        "scipy fsolve": fsolve_dense,
        "scipy fsolve band": fsolve_banded,
        "batched": lambda: batched(lams),
        "public": lambda: jsmkt.solve_fixed_point(model).value,
    }, max(2, repeats // BURST))
    t_solve, t_primal, t_grad, t_batched = t["solve"], t["primal"], t["grad"], t["batched"]
    # For information: the same pair timed one call at a time, alternating (each call after the other's).
    t_cold = _interleaved_medians({"solve": lambda: solve(lam), "fsolve": fsolve_dense}, max(5, repeats // 4), burst=1)

    # The fsolve ratio over five loads (the same jitted solve; fsolve on the NumPy equations from the same guess).
    by_load = []
    for lam_i in LOADS:
        x0_i = np.asarray(_model(lam_i).initial_guess()).ravel()

        def fsolve_i(lam_i=lam_i, x0_i=x0_i):
            return scipy.optimize.fsolve(lambda x: numpy_vector_field(x, lam_i, alpha, T, D, K), x0_i, xtol=1e-13,
                                         full_output=True)

        x, info, ier, msg = fsolve_i()
        assert ier == 1, msg
        err = np.max(np.abs(x - np.asarray(solve(jnp.asarray(lam_i))).ravel()))
        assert err < 1e-8, f"fsolve and jsmkt disagree by {err:.2e} at lam={lam_i}"
        ti = _interleaved_medians({"jsmkt": lambda lam_i=lam_i: solve(jnp.asarray(lam_i)), "fsolve": fsolve_i},
                                  max(3, repeats // (4 * BURST)))
        by_load.append((lam_i, info["nfev"], ti["fsolve"] / ti["jsmkt"]))

    # Scaling in K (one jitted solve each).
    scaling = []
    for k in (K, 2 * K, 4 * K):
        s_k, _, _ = _make_fns(k)
        steps = int(jsmkt.solve_fixed_point(_model(LAM, k)).stats["num_steps"])
        scaling.append((k, steps, _median_time(s_k, max(5, repeats // 10), lam)))

    # First calls as K and d grow (each a new shape, so each compiles anew).
    first_calls = []
    for k, d in ((100, 2), (400, 2), (1600, 2), (10, 20), (10, 1000), (10, 2**16)):  # 2**16: the largest d jsmkt takes
        t_first, _ = _first_call(lambda: jsmkt.solve_fixed_point(jsmkt.JSQd(LAM, d=d, K=k)).value)
        first_calls.append((k, d, t_first))

    def row(name, seconds, note="", unit="ms"):
        value = 1e3 * seconds if unit == "ms" else seconds
        print(f"{name:<40}{value:>10.3f} {unit:<3} {note}")

    print()
    print(f"{'measurement':<40}{'time':>10}     notes")
    print("-" * 100)
    row("first call: solve (trace+compile)", compile_solve, unit="s")
    row("first call: grad  (trace+compile)", compile_grad, unit="s")
    row("first call: vmap(64) solve", compile_batched, unit="s")
    row("jsmkt solve", t_solve, f"{num_steps} Newton steps, tail mass s_K = {tail_mass:.1e}")
    row(f"  (a dense LU instead: {num_steps}x {n}x{n})", t["lu"],
        f"information: Newton eliminates block by block ({K} blocks of {SERVICE.order}), O(K m^3)")
    row("jsmkt.solve_fixed_point(model) eagerly", t["public"],
        "from Python with concrete values: value checks, cached compilation, Python errors")
    row("jsmkt lam -> E[T] (solve + metric)", t_primal, f"E[T] = {float(sojourn(lam)):.10f}")
    row("jsmkt grad of E[T] wrt lam", t_grad, f"dE[T]/dlam = {float(grad(lam)):.8f}")
    for name, (nfev, err) in scipy_info.items():
        row(name, t[name], f"{nfev} evaluations, max |x - x_jsmkt| = {err:.1e}")
    row("jsmkt vmap(64) solve", t_batched, f"{64 / t_batched:,.0f} solves/s (one at a time: {1 / t_solve:,.0f} solves/s)")
    for k, steps, tk in scaling:
        row(f"jsmkt solve, K={k} ({k * SERVICE.order} unknowns)", tk, f"{steps} Newton steps, {1e3 * tk / steps:.3f} ms/step")
    for k, d, tf in first_calls:
        row(f"first call: JSQd, K={k}, d={d}", tf, "trace + compile + solve, eagerly", unit="s")
    print()
    grad_ratio = t_grad / t_solve
    speedup = statistics.median(r for _, _, r in by_load)
    print(f"grad / solve time             = {grad_ratio:6.2f}   target <= {TARGET_GRAD_RATIO:g}    "
          f"{_verdict(grad_ratio <= TARGET_GRAD_RATIO)}   (grad / (solve + metric) = {t_grad / t_primal:.2f})")
    print(f"fsolve / jsmkt solve time     = {speedup:6.1f}x  target >= {TARGET_SCIPY_SPEEDUP:g}x  "
          f"{_verdict(speedup >= TARGET_SCIPY_SPEEDUP)}   (median over lam = "
          f"{', '.join(f'{lam_i:g}' for lam_i in LOADS)}: " + ", ".join(f"{r:.1f}x ({nfev} evaluations)"
                                                                   for _, nfev, r in by_load) + ")")
    print(f"fsolve / jsmkt at lam={LAM:g}     = {t['scipy fsolve'] / t_solve:6.1f}x  (information: one load)")
    print(f"fsolve / jsmkt, alternating   = {t_cold['fsolve'] / t_cold['solve']:6.1f}x  (information, lam={LAM:g}: "
          f"each call after the other's, cold caches: jsmkt {1e3 * t_cold['solve']:.3f} ms, "
          f"fsolve {1e3 * t_cold['fsolve']:.3f} ms)")
    print(f"fsolve(band) / jsmkt time     = {t['scipy fsolve band'] / t_solve:6.1f}x  (information: banded finite-difference Jacobian)")
    print(f"vmap(64) gain per solve       = {64 * t_solve / t_batched:6.1f}x  (information)")
    print(f"first call K=1600 / K=100     = {first_calls[2][2] / first_calls[0][2]:6.2f}   (information: 16x the levels)")
    print(f"first call d=65536 / d=20     = {first_calls[5][2] / first_calls[3][2]:6.2f}   (information)")


if __name__ == "__main__":
    main()
