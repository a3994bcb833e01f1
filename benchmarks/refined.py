"""Time the order-2 refined mean field, `jsmkt.refined_mean_field(fp, order=2)` (the 1/N and 1/N^2 terms of the
steady state), after compilation: JSQ(2) at load 0.9 with K = 30 (30 unknowns; target 0.1 s) and JSQ(2) with H2
service (SCV 4) at load 0.85 with K = 50 (K m = 100 unknowns; target 5 s). Order 1 is timed beside it. Each
order-2 result is checked: its 1/N^2 term of the busy fraction is zero (work conservation), to 1e-9.

Run: `.venv/bin/python benchmarks/refined.py` (`--repeats N`, default 5).
"""

import argparse
import os
import statistics
import time


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _common import positive  # noqa: E402

import jsmkt  # noqa: E402


CASES = [
    ("JSQ(2), lam 0.9, K 30 (n = 30)", lambda: jsmkt.JSQd(0.9, d=2, K=30), 0.1),
    ("JSQ(2)-H2 SCV 4, lam 0.85, K 50 (n = K m = 100)",
     lambda: jsmkt.JSQdPH(0.85, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=50), 5.0),
]


def timed(fn, repeats):
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=5)
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, median of {args.repeats} jitted calls")
    ok = True
    for label, make, target in CASES:
        model = make()
        fp = jsmkt.solve_fixed_point(model)
        t1 = timed(lambda: jsmkt.refined_mean_field(fp).correction, args.repeats)
        t2 = timed(lambda: jsmkt.refined_mean_field(fp, order=2).correction2, args.repeats)
        A = jsmkt.refined_mean_field(fp, order=2).correction2
        busy = float(jnp.sum(jnp.reshape(A, (model.K, -1))[0]))
        good = t2 <= target and abs(busy) < 1e-9
        ok &= good
        print(f"{label}: order 1 {t1 * 1e3:.1f} ms, order 2 {t2 * 1e3:.1f} ms (target {target * 1e3:.0f} ms), "
              f"1/N^2 term of the busy fraction {busy:.1e}: {'ok' if good else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
