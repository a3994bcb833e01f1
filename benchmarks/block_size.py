"""Benchmark: events per loop iteration of the speculative-block PH engine, against the number of replications.

Model: as `benchmarks/simulate.py` (JSQ(2), N = 1000, lam = 0.9, H2 service with mean 1 and SCV 4). For each
number of replications R and block size B (events evaluated per loop iteration and replication), times
`jsmkt.simulate` (medians of interleaved repeats, after a first call that compiles) and prints the events per
second, the best B for each R and the B that `jsmkt.simulate` picks (`plan._markov_block_size`).

A larger block shares an iteration's fixed cost (on a GPU: kernel launches and the loop condition read back by the
host) among more events, but more of its events read a server changed by an earlier event of the block and are
evaluated again at the next iteration. The block engine is the one a GPU runs; on a CPU `jsmkt.simulate` uses
the sequential engine, and `--engine block` times the block engine there.

Run with `.venv/bin/python benchmarks/block_size.py [--quick] [--engine block]`.
"""

import argparse
import time

import jax
import jax.random as jr

import _common
import jsmkt
from jsmkt._simulate import plan


N, LAM, D, SCV = 1000, 0.9, 2, 4.0
GRID = {  # R -> block sizes tried
    1: (32, 64, 128, 256),
    16: (16, 32, 64, 128),
    256: (8, 16, 32, 64),
    1024: (8, 16, 32, 64, 128),
    4096: (8, 16, 32, 64, 128),
    16384: (8, 16, 32, 64),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="R <= 256 only, one repeat, shorter runs")
    parser.add_argument("--engine", choices=("auto", "block"), default="auto",
                        help="block: time the block engine also on a CPU (auto: it runs only off-CPU)")
    parser.add_argument("--replications", type=_common.positive(int), nargs="+", default=None, metavar="R",
                        help=f"replication counts (default: {sorted(GRID)})")
    parser.add_argument("--repeats", type=_common.positive(int), default=None, metavar="K",
                        help="default 2 (--quick: 1)")
    args = parser.parse_args(argv)
    reps = args.replications or [r for r in sorted(GRID) if not args.quick or r <= 256]
    if any(r not in GRID for r in reps):
        parser.error(f"--replications={reps}: each must be one of {sorted(GRID)}")
    repeats = args.repeats or (1 if args.quick else 2)
    if args.engine == "block":
        plan._sequential_engine = lambda max_d: False
    elif plan._sequential_engine(D):
        parser.error("on a CPU jsmkt.simulate runs the sequential engine: pass --engine block to time the block one")
    chosen = {r: plan._markov_block_size(N, r) for r in reps}
    model = jsmkt.JSQdPH(LAM, jsmkt.hyperexponential2(1.0, SCV), d=D)
    dev = jax.devices()[0]
    print(f"JSQ({D}), N = {N}, lam = {LAM}, H2 (SCV {SCV}); block PH engine on 1 {dev.platform} device "
          f"({dev.device_kind}), jax {jax.__version__}; medians of {repeats} repeat(s)\n")
    print(f"{'R':>6} {'B':>5} {'t per rep.':>10} {'first call s':>13} {'wall s':>8} {'events/s':>11}")
    best = {}
    for r in reps:
        t_sim = (20.0 if args.quick else 100.0) if r <= 16 else (4.0 if args.quick else 40.0)
        for b in GRID[r]:
            plan._markov_block_size = lambda n, n_rep, b=b: b
            t0 = time.perf_counter()
            jsmkt.simulate(model, N, 1.0, key=jr.PRNGKey(0), n_replications=r)
            first = time.perf_counter() - t0
            wall, events = _common.median_runs(
                repeats, lambda i: jsmkt.simulate(model, N, t_sim, key=jr.PRNGKey(1 + i), n_replications=r)
            )
            eps = events / wall
            print(f"{r:6d} {b:5d} {t_sim:10g} {first:13.2f} {wall:8.3f} {eps:11.3e}", flush=True)
            if eps > best.get(r, (0, 0))[1]:
                best[r] = (b, eps)
    print()
    for r in reps:
        b, eps = best[r]
        print(f"R = {r:5d}: best B = {b:4d} ({eps:.3e} events/s); jsmkt.simulate picks B = {chosen[r]}")


if __name__ == "__main__":
    main()
