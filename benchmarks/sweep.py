"""Benchmark: `jsmkt.sweep` over a JSQ(2)-H2 grid against the raw batched solve it wraps and a loop of single solves.

Grid: λ × SCV, `--points` points in all (default 100,000: 400 λ in [0.5, 0.9] × 250 SCV in [1, 4]) of
`jsmkt.JSQdPH(λ, jsmkt.hyperexponential2(1, SCV), d=2)`, E[T] at each. The spec's values are the grid's worst point
(λ = 0.9, SCV = 4), so that its K serves every point and the sweep solves each point once, as the raw solve does.

- **sweep**: `jsmkt.sweep(spec, grid)`, in process, on this machine's default devices. "end to end" is the first call
  (plan, trace, compile, evaluate); "compiled" the median of later calls (the same call again: plan and
  evaluation, its compiled function cached).
- **raw vmap**: the same solve and metric written by hand (`JSQdPH(lam, hyperexponential2(1, scv), d=2, K=K)`,
  `solve_fixed_point(throw=False)`, `mean_sojourn_time`), `jax.jit` of `jax.lax.map` over `jax.vmap`-ed blocks of
  B points, the best B of 8, 16, 32, 64, 256, 1024, 4096 on a CPU (and the whole grid up to 16,384 points; 2^14,
  2^16, 2^18 and the whole grid on a GPU): the best raw chunked vmap, over the same points.
- **loop**: a Python loop of single jitted solves (`jax.jit` of the same per-point function), over 2,000 of the
  points; its rate is per point.

The sweep and the raw solve are timed in alternating rounds (medians of `--rounds`); the loop once. Targets (issue
36): sweep (compiled) ≥ 0.9× the raw vmap's rate and ≥ 10× the loop's; on a GPU (`benchmarks/gpu_check.sh`, 10^6
points) ≥ 0.8× the raw vmap and ≥ 5 million points/s on an H200. The sweep's values must equal the raw
solve's to 1e-12 (relative). Run: `.venv/bin/python benchmarks/sweep.py` (`--quick`: 20,000 points, 2 rounds).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402
from _common import positive  # noqa: E402


SPEC = {"model": "jsq-ph", "lam": 0.9, "d": 2, "service": {"kind": "h2", "mean": 1.0, "scv": 4.0}}


def grid(points: int) -> dict:
    n_lam = max(2, int(round(np.sqrt(points * 400 / 250))))
    n_scv = max(2, points // n_lam)
    return {"lam": np.linspace(0.5, 0.9, n_lam), "service.scv": np.linspace(1.0, 4.0, n_scv)}


def per_point(K):
    def ET(lam, scv):
        model = jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, scv), d=2, K=K)
        fp = jsmkt.solve_fixed_point(model, throw=False)
        return jsmkt.mean_sojourn_time(model, fp)

    return ET


def raw(K, block, n):
    ET = per_point(K)
    if block >= n:
        return jax.jit(jax.vmap(ET))
    return jax.jit(lambda lam, scv: jax.lax.map(lambda x: ET(*x), (lam, scv), batch_size=block))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=positive(int), default=100_000, help="grid points (default 100,000)")
    parser.add_argument("--rounds", type=positive(int), default=3, help="timed rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="20,000 points, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.points, args.rounds = 20_000, 2
    g = grid(args.points)
    lam, scv = (x.ravel() for x in np.meshgrid(g["lam"], g["service.scv"], indexing="ij"))
    n = lam.size
    K = jsmkt.loads_spec('model = "jsq-ph"\nlam = 0.9\nd = 2\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n').K
    print(f"benchmarks/sweep.py; jax {jax.__version__} on {jax.default_backend()} ({len(jax.devices())} device(s), "
          f"{os.cpu_count()} CPU cores); JSQ(2)-H2 E[T] over {len(g['lam'])} lam x {len(g['service.scv'])} SCV = "
          f"{n:,} points, K = {K}; medians of {args.rounds} rounds")

    def sweep():
        return jsmkt.sweep(SPEC, g, metrics=["mean_sojourn_time"], progress=False)

    t0 = time.perf_counter()
    ds = sweep()
    first_sweep = time.perf_counter() - t0
    assert int(ds.attrs["failed"]) == 0 and int(ds.K.max()) == K, "the spec's K should serve every point"

    # The best raw chunked vmap: every block size compiled and timed once, the best then timed with the sweep.
    blocks = {}
    lam_j, scv_j = jnp.asarray(lam), jnp.asarray(scv)
    first_raw = {}
    cpu = jax.default_backend() == "cpu"
    sizes = (8, 16, 32, 64, 256, 1024, 4096) if cpu else (1 << 14, 1 << 16, 1 << 18)
    # One batch of the whole grid too, where it fits: on a CPU a vmapped batch of 10^5 points holds its Newton
    # systems all at once (gigabytes), and is slower per point than blocks well before that.
    for block in (*[b for b in sizes if b < n], *([n] if not cpu or n <= 16384 else [])):
        fn = raw(K, block, n)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(lam_j, scv_j))
        first_raw[block] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(lam_j, scv_j))
        blocks[block] = (time.perf_counter() - t0, fn, out)
    best = min(blocks, key=lambda b: blocks[b][0])
    fn, ref = blocks[best][1], np.asarray(blocks[best][2])
    got = ds.mean_sojourn_time.values.ravel()
    err = float(np.max(np.abs(got - ref) / ref))
    assert err <= 1e-12, f"sweep and raw solve differ by {err:.3g}"

    t_sweep, t_raw = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        sweep()
        t_sweep.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(lam_j, scv_j))
        t_raw.append(time.perf_counter() - t0)
    s, r = statistics.median(t_sweep), statistics.median(t_raw)

    single = jax.jit(per_point(K))
    m = min(2000, n)
    jax.block_until_ready(single(lam_j[0], scv_j[0]))
    t0 = time.perf_counter()
    for i in range(m):
        jax.block_until_ready(single(lam_j[i], scv_j[i]))
    t_loop = (time.perf_counter() - t0) / m * n

    print()
    print(f"{'':<32}{'time (s)':>10}{'points/s':>14}")
    print(f"{'sweep, end to end (first call)':<32}{first_sweep:>10.2f}{n / first_sweep:>14,.0f}")
    print(f"{'sweep, compiled':<32}{s:>10.2f}{n / s:>14,.0f}")
    for block, (t, _, _) in blocks.items():
        label = f"raw vmap, blocks of {block}" if block < n else "raw vmap, one batch"
        print(f"{label:<32}{t:>10.2f}{n / t:>14,.0f}   (first call {first_raw[block]:.2f} s)")
    print(f"{'raw vmap, best (B = ' + str(best) + ')':<32}{r:>10.2f}{n / r:>14,.0f}")
    print(f"{'loop of jitted solves':<32}{t_loop:>10.2f}{n / t_loop:>14,.0f}   ({m} points timed)")
    print(f"sweep values = raw values to {err:.1e} (relative)")
    print()
    vs_raw, vs_loop = r / s, t_loop / s
    print(f"sweep / raw vmap rate = {vs_raw:.2f}  (target >= 0.9)  {'PASS' if vs_raw >= 0.9 else 'MISS'}")
    print(f"sweep / loop rate     = {vs_loop:.1f}  (target >= 10)  {'PASS' if vs_loop >= 10 else 'MISS'}")
    if jax.default_backend() == "gpu":
        rate = n / s
        print(f"sweep rate on the GPU = {rate:,.0f} E[T] points/s  (target >= 5,000,000 on an H200)  "
              f"{'PASS' if rate >= 5e6 else 'MISS'}")


if __name__ == "__main__":
    main()
