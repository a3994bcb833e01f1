"""Benchmark: per-solve rate of batched fixed-point solves as the batch grows.

Model: JSQ(2) with H2 service of SCV 4 (`jsmkt.hyperexponential2(1.0, 4.0)`), K = 48 (96 unknowns), lam spread
evenly over [0.5, 0.95] (sorted). Per batch size (64, 1,024, 4,096, 16,384; `--quick`: 64, 256, 1,024), after
compilation, timed in interleaved rounds (medians; a small batch in bursts of back-to-back calls, so that it is not
timed with the caches another function left cold), side by side:

- `vmap`: plain `jax.vmap(lambda lam: solve_fixed_point(model(lam), throw=False).value)`, jitted. Under `vmap`,
  `solve_fixed_point` runs Newton's iteration as `lax.map` over vmapped blocks (a `custom_vmap` rule on the
  primal iteration, 32 entries per block on a CPU);
- `batched`: `jsmkt.batched` of the same function (the whole solve, checks included, block by block);
- `vmap, unchunked`: the plain vmap with the default adjoint's block set larger than the batch (the solver's
  default linear solves; one vmapped while loop over the whole batch, as before the rule), for comparison.

The three agree to 1e-13. Target (issue 37): for `vmap`, the smallest over 1,024, 4,096 and 16,384 of the per-solve
rate divided by the rate at 64 is at least 0.8. The ratio is printed for each approach with PASS/MISS.

Run with `.venv/bin/python benchmarks/vmap.py` (`--quick` for small batches and few rounds; `--rounds R`). The
unchunked vmap holds every Newton temporary for the whole batch at once (the largest memory of the run).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as benchmarks/fixed_point.py

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optimistix as optx  # noqa: E402

from _common import positive  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt import _batched  # noqa: E402
from jsmkt._fixed_point import linear_solver  # noqa: E402
from jsmkt._linalg import NeverFails  # noqa: E402


K, D = 48, 2
SERVICE = jsmkt.hyperexponential2(1.0, 4.0)
TARGET = 0.8  # smallest rate over the large batches / rate at 64
BASE = 64


def _model(lam):
    return jsmkt.JSQdPH(lam, SERVICE, d=D, K=K)


def _solve(lam):
    return jsmkt.solve_fixed_point(_model(lam), throw=False).value


def _solve_unchunked(lam):
    """`_solve` with the default adjoint's rule given a block larger than any batch: one vmapped while loop over
    the whole batch (a distinct adjoint, so that no batched trace of `_solve` is reused)."""
    model = _model(lam)
    inner = optx.ImplicitAdjoint(linear_solver=NeverFails(linear_solver(model)))
    adjoint = _batched.ChunkedImplicitAdjoint(inner, block=1 << 30)
    return jsmkt.solve_fixed_point(model, throw=False, adjoint=adjoint).value


def _compiled(approach, lams):
    fn = {"vmap": jax.vmap(_solve), "batched": jsmkt.batched(_solve),
          "vmap, unchunked": jax.vmap(_solve_unchunked)}[approach]
    return jax.jit(fn).lower(lams).compile()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches 64, 256, 1024 and 3 rounds")
    parser.add_argument("--rounds", type=positive(int), default=None, help="interleaved rounds (default 7; 3 quick)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    sizes = (BASE, 256, 1024) if args.quick else (BASE, 1024, 4096, 16384)
    approaches = ("vmap", "batched", "vmap, unchunked")

    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cores); JSQ({D}), H2 service "
          f"SCV 4, K={K} ({K * SERVICE.order} unknowns), lam evenly in [0.5, 0.95]; block "
          f"{_batched.default_block(1 << 20)}; medians over {rounds} interleaved rounds")
    inputs = {n: jnp.linspace(0.5, 0.95, n) for n in sizes}
    fns, first = {}, {}
    for n in sizes:
        for a in approaches:
            t0 = time.perf_counter()
            fns[a, n] = _compiled(a, inputs[n])
            out = jax.block_until_ready(fns[a, n](inputs[n]))
            first[a, n] = time.perf_counter() - t0
            assert not np.isnan(np.asarray(out)).any(), f"{a} at {n}: a solve failed"
    for n in sizes:  # the three agree
        ref = np.asarray(fns["vmap, unchunked", n](inputs[n]))
        for a in approaches[:2]:
            err = float(np.max(np.abs(np.asarray(fns[a, n](inputs[n])) - ref)))
            assert err <= 1e-13, f"{a} at {n} differs from the unchunked vmap by {err:.2e}"

    times = {key: [] for key in fns}
    for _ in range(rounds):
        for (a, n), fn in fns.items():
            burst = max(1, 1024 // n)
            for _ in range(burst):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(inputs[n]))
                times[a, n].append(time.perf_counter() - t0)
    rate = {key: key[1] / statistics.median(ts) for key, ts in times.items()}

    print()
    print(f"{'approach':<18}" + "".join(f"{n:>14,}" for n in sizes) + "   solves/s (first call, s)")
    print("-" * (18 + 14 * len(sizes) + 28))
    for a in approaches:
        print(f"{a:<18}" + "".join(f"{rate[a, n]:>14,.0f}" for n in sizes))
        print(f"{'':<18}" + "".join(f"{'(' + format(first[a, n], '.1f') + ')':>14}" for n in sizes))
    print()
    for a in approaches:
        ratios = {n: rate[a, n] / rate[a, BASE] for n in sizes if n != BASE}
        worst = min(ratios.values())
        print(f"{a:<18} min rate / rate at {BASE} = {worst:5.2f}  target >= {TARGET:g}  "
              f"{'PASS' if worst >= TARGET else 'MISS'}   (" + ", ".join(f"{n:,}: {r:.2f}" for n, r in ratios.items())
              + ")")
    for n in sizes:
        print(f"vmap / unchunked at {n:>6,} = {rate['vmap', n] / rate['vmap, unchunked', n]:5.2f}x  (information)")


if __name__ == "__main__":
    main()
