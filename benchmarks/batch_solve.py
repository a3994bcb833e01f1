"""Benchmark: the fixed point of JSQ(d) with batch arrivals, and its gradient, with the structured linear solver
against the dense one.

Model: `jsmkt.JSQdBatch(0.3, batch sizes uniform on 1..4, d=2)` (job load 0.75) at K = 200, 400, 800. Its Jacobian
is banded (bandwidth 4, the largest batch): `solve_fixed_point` picks `BlockBanded` from the family's structure.
The same solve with `linear_solver=lineax.LU()` materialises the Jacobian (K products with it) and factors it
densely. Timed side by side in one run, calls in bursts of `BURST` back-to-back calls of one function, the
functions interleaved round by round: the jitted solve (`batch_rate -> fixed point`) and the jitted `jax.grad` of
E[T] with respect to `batch_rate` (Newton from the exact forward recursion, then one adjoint solve). Both solvers'
fixed points must agree to 1e-12 (relative to s_1), and their gradients to 1e-9.

Run with `.venv/bin/python benchmarks/batch_solve.py` (add `--quick` for fewer repeats).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy/SciPy/JAX load OpenBLAS

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
from _common import interleaved_medians  # noqa: E402

import jsmkt  # noqa: E402


RATE, D = 0.3, 2
SIZES = jnp.full(4, 0.25)
TARGET = 10.0  # dense time / structured time >= 10 at K >= 200
BURST = 5


def _functions(K, linear_solver):
    def model(rate):
        return jsmkt.JSQdBatch(rate, SIZES, d=D, K=K)

    def solve(rate):
        return jsmkt.solve_fixed_point(model(rate), linear_solver=linear_solver).value

    def ET(rate):
        m = model(rate)
        return jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m, linear_solver=linear_solver))

    return jax.jit(solve), jax.jit(jax.grad(ET))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    rounds = 5 if args.quick else 15
    rate = jnp.asarray(RATE)
    print(f"benchmarks/batch_solve.py; jax {jax.__version__} on {jax.default_backend()}; JSQdBatch(batch_rate={RATE}, "
          f"sizes uniform 1..4, d={D}); medians of {rounds} interleaved rounds of {BURST} calls")
    print()
    print(f"{'K':>5}  {'solver':<14} {'solve':>10} {'dense/str.':>11} {'grad':>10} {'dense/str.':>11}   first calls (s)")
    floor_solve, _ = _functions(8, None)
    floor_rate = jnp.asarray(RATE * (8 / 200) ** 3)
    worst = float("inf")
    for K in (200, 400, 800):
        structured = jsmkt._fixed_point.linear_solver(jsmkt.JSQdBatch(RATE, SIZES, d=D, K=K))
        fns, first, out = {}, {}, {}
        for label, lin in (("structured", None), ("dense", lx.LU())):
            solve, grad = _functions(K, lin)
            start = time.perf_counter()
            out[label] = (jax.block_until_ready(solve(rate)), jax.block_until_ready(grad(rate)))
            first[label] = time.perf_counter() - start
            fns[label + " solve"] = lambda solve=solve: solve(rate)
            fns[label + " grad"] = lambda grad=grad: grad(rate)
        (ys, gs), (yd, gd) = out["structured"], out["dense"]
        assert float(jnp.max(jnp.abs(ys - yd))) <= 1e-12 * float(ys[0]), "solutions differ"
        assert abs(float(gs - gd)) <= 1e-9 * abs(float(gd)), "gradients differ"
        fns["floor"] = lambda: floor_solve(floor_rate)
        t = interleaved_medians(fns, rounds, BURST)
        r_solve = t["dense solve"] / t["structured solve"]
        r_grad = t["dense grad"] / t["structured grad"]
        worst = min(worst, r_solve, r_grad)
        name = type(structured).__name__
        print(f"{K:>5}  {name:<14} {t['structured solve'] * 1e3:>8.3f}ms {'':>11} {t['structured grad'] * 1e3:>8.3f}ms "
              f"{'':>11}   {first['structured']:.2f}")
        print(f"{'':>5}  {'LU (dense)':<14} {t['dense solve'] * 1e3:>8.3f}ms {r_solve:>10.1f}x "
              f"{t['dense grad'] * 1e3:>8.3f}ms {r_grad:>10.1f}x   {first['dense']:.2f}")
        print(f"{'':>5}  {'bound':<14} {'':>10} {t['dense solve'] / t['floor']:>10.1f}x   (dense solve / the floor, "
              f"a solve at K = 8: {t['floor'] * 1e3:.3f} ms)")
    print()
    verdict = "PASS" if worst >= TARGET else "MISS"
    print(f"structured solve and gradient >= {TARGET:g}x faster than dense at K >= 200: worst {worst:.1f}x  {verdict}")


if __name__ == "__main__":
    main()
