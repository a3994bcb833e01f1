"""Benchmark: how `jsmkt.simulate` scales with the number of replications on a CPU, at a fixed total of events.

Model as in `simulate.py`: JSQ(2), N = 1000 servers, lam = 0.9, H2 service (mean 1, SCV 4). Each row runs R
replications of t1 = T / R time units (warm-up 10 %), about the same number of events in all, in a fresh process
on one CPU device, and prints the wall time of the run (the compilation excluded, by a first 1-unit call), the
cost per event relative to one replication, and the process's peak resident memory per replication beside the
replication's ring buffer of arrival times (N x max_queue float64, the largest array of its state).

Many short replications are what CI-style verification runs and sensitivity sweeps use. What they cost beyond
one long run: each replication starts its chunks with its buffers out of the processor's caches, and the fixed
per-chunk work (a block of random numbers, the statistics) is shared by fewer events.

Measured on a 2-core CPU (AMD EPYC, XLA CPU, jax 0.10.2), T = 600: 55, 53, 59, 72, 130 and 264 ns per event
for R = 1, 4, 16, 64, 256 and 1024 (1.0, 0.95, 1.07, 1.31, 2.35 and 4.8 x one replication); peak memory 1.1 MB
per replication at R = 1024, for a 0.44 MB ring. Before the engine ran replications in place in the batch's
buffers, pooled the sojourn-time histogram on the device and ran one batch after the warm-up with several
replications (commit 81ee3ee, the same script in the same session): 56, 87, 1219 and 5879 ns per event for R = 1,
16, 256 and 1024, and 4.0 MB per replication at R = 1024 (8192 replications ran out of 24 GB; they now peak at
6 GB). Run: `.venv/bin/python benchmarks/replications.py` (`--quick`: T = 150).
"""

import argparse
import json
import subprocess
import sys

import _common


CHILD = r"""
import json, resource, sys, time
import jax.random as jr
import jsmkt
jsmkt.use_cpu_cores(1)
r, t1 = int(sys.argv[1]), float(sys.argv[2])
model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2)
first = jsmkt.simulate(model, 1000, 1.0, key=jr.PRNGKey(1), n_replications=r)
t0 = time.perf_counter()
res = jsmkt.simulate(model, 1000, t1, key=jr.PRNGKey(0), n_replications=r)
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "events": res.events, "max_queue": res.max_queue,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T = 150 instead of 600")
    parser.add_argument("--replications", type=_common.positive(int), nargs="+", default=[1, 4, 16, 64, 256, 1024],
                        metavar="R")
    args = parser.parse_args()
    total = 150.0 if args.quick else 600.0
    print(f"JSQ(2), N = 1000, lam = 0.9, H2 (SCV 4); R replications of {total:g} / R time units each, one CPU device")
    header = (f"{'R':>6} {'t1':>8} {'wall s':>8} {'events':>11} {'ns/event':>9} {'vs R=1':>7} {'MB/rep':>8} "
              f"{'ring MB':>8}")
    print(header)
    print("-" * len(header))
    base = None
    for r in args.replications:
        out = subprocess.run([sys.executable, "-c", CHILD, str(r), str(total / r)], capture_output=True, text=True)
        if out.returncode:
            print(f"{r:>6} failed: {out.stderr.strip()[-300:]}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        ns = row["wall"] / row["events"] * 1e9
        base = base or ns
        ring = 1000 * row["max_queue"] * 8 / 1e6
        print(f"{r:>6} {total / r:>8.3g} {row['wall']:>8.3f} {row['events']:>11.4g} {ns:>9.1f} {ns / base:>7.2f} "
              f"{row['rss'] / r / 1e6:>8.2f} {ring:>8.2f}")


if __name__ == "__main__":
    main()
