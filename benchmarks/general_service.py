"""Benchmark: the general-service engine of `jsmkt.simulate` (`jsmkt.deterministic`, `jsmkt.lognormal`, any
sampler), in its two forms.

Model: JSQ(d), lam = 0.9, deterministic service of mean 1 (M/D/1 queues behind JSQ(d)), N = 100 and N = 1000
servers, one replication of 400 000 / N time units (about 720 000 events), on one CPU device. The engine fixes each
job's completion time when it arrives (FCFS) and brings a server up to date only when an arrival samples it, so an
event costs O(d) whatever N. The rows compare, side by side in one run:

- "one at a time": replications in turn, unbatched loops; the CPU default. XLA's CPU backend compiles them into
  single kernels up to d = 13 (`plan._SEQUENTIAL_GENERAL_MAX_D`); above, they run op by op;
- "vmapped": the loops vmapped over replications, run op by op on a CPU; the default on a GPU.

`--previous DIR` adds an older form of the engine, from a checkout of an older commit (e.g.
`git worktree add /tmp/prev 9e2cdf8`), run the same way in a subprocess.

Measured on a 2-core CPU (AMD EPYC, XLA CPU, jax 0.10.2), two full runs, medians of 3 runs per row, microseconds
per event; `--previous` at 9e2cdf8, whose arrival loop carried every field of every sampled server through the
choice and fitted one kernel only up to d = 3 (the engine now reads the next completion time of each server from
an array of its own and chooses server numbers only):

| N | d | one at a time | vmapped | previous (9e2cdf8) | previous / one at a time |
|---|---|---|---|---|---|
| 100 | 2 | 0.049-0.052 | 0.91-0.98 | 0.045-0.049 | 0.9x |
| 100 | 3 | 0.051-0.055 | 0.95-1.02 | 0.055 | 1.0-1.1x |
| 100 | 5 | 0.057-0.058 | 1.38 (4.3 once) | 0.90-0.97 | 15.8-16.7x |
| 100 | 10 | 0.074-0.088 | 1.56-1.61 | 1.83 (4.6 once) | 24.7x (52x once) |
| 1000 | 2 | 0.053-0.059 | 0.91-0.93 | 0.055-0.072 | 1.0-1.2x |
| 1000 | 3 | 0.082-0.084 | 1.01-1.02 | 0.056-0.057 | 0.7x |
| 1000 | 5 | 0.057-0.059 | 1.34-1.39 | 0.90-0.93 | 15.8-15.9x |
| 1000 | 10 | 0.075-0.076 | 1.52 | 1.82-1.84 | 24.0-24.5x |

The timings of one row vary by up to 1.5x between runs on this machine: N = 1000, d = 3 alone, five runs in a row,
gave 0.054-0.074 us (previous: 0.057-0.060), so d = 2 and 3 are unchanged within that noise. The engine before
(e6faa85) searched the N servers for the next completion: 0.98-1.04 us per event at N = 100, 1.83-2.03 at N = 1000.

Run: `.venv/bin/python benchmarks/general_service.py [--previous DIR]` (about 3 minutes, 6 with `--previous`).
"""

import argparse
import json
import os
import subprocess
import sys

import _common


LAM, SPAN, REPEATS = 0.9, 400_000.0, 3

# One timing row, run in this process (jsmkt from this checkout) or in a subprocess against another checkout.
_ROW = """
import json, sys
import jax.random as jr
sys.path.insert(0, sys.argv[1])
import _common
import jsmkt
jsmkt.use_cpu_cores(1)
try:
    from jsmkt._simulate import plan
except ImportError:  # an older checkout, whose driver holds the plan
    from jsmkt._simulate import driver as plan
n, d, vmapped, span, lam, repeats = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", float(sys.argv[5]), \\
    float(sys.argv[6]), int(sys.argv[7])
plan._sequential_general_engine = lambda max_d: not vmapped  # (no such switch in the previous engine)
model, service = jsmkt.JSQd(lam, d=d), jsmkt.deterministic(1.0)
t1 = span / n
jsmkt.simulate(model, n, t1 / 20, key=jr.PRNGKey(0), service=service)  # compile
wall, events = _common.median_runs(
    repeats, lambda i: jsmkt.simulate(model, n, t1, key=jr.PRNGKey(1 + i), service=service))
print(json.dumps({"wall": wall, "events": events}))
"""


def driver_max_d() -> int:
    from jsmkt._simulate import plan

    return plan._SEQUENTIAL_GENERAL_MAX_D


def row(checkout, n, d, vmapped, span, repeats):
    env = dict(os.environ, PYTHONPATH=checkout)
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    args = [sys.executable, "-c", _ROW, bench_dir, str(n), str(d), "1" if vmapped else "0", str(span), str(LAM),
            str(repeats)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=checkout, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"timing run failed (checkout {checkout}, n={n}, d={d}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["wall"] / out["events"] * 1e6, out["events"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--previous", metavar="DIR", help="a checkout of an older commit to time beside this one")
    parser.add_argument("--span", type=_common.positive(float), default=SPAN,
                        help="N x simulated time per run (default %(default)g: about 1.8 N events per unit)")
    parser.add_argument("--repeats", type=_common.positive(int), default=REPEATS, help="runs per row (median)")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.previous and not os.path.isdir(os.path.join(args.previous, "jsmkt")):
        raise SystemExit(f"--previous {args.previous!r}: no jsmkt package there; give a checkout of this repository")
    print(f"JSQ(d), lam = {LAM}, deterministic service; one replication of {args.span:g} / N time units, one CPU "
          f"device; microseconds per event, median of {args.repeats}")
    cols = ["one at a time", "vmapped"] + (["previous"] if args.previous else [])
    header = f"{'N':>6} {'d':>3} {'events':>8} " + " ".join(f"{c:>14}" for c in cols) + f" {'vmapped / one':>14}"
    if args.previous:
        header += f" {'previous / one':>15}"
    print(header)
    print("-" * len(header))
    for n in (100, 1000):
        for d in (2, 3, 5, 10):
            one, events = row(here, n, d, False, args.span, args.repeats)
            vm, _ = row(here, n, d, True, args.span, args.repeats)
            cells = [one, vm]
            if args.previous:
                cells.append(row(args.previous, n, d, False, args.span, args.repeats)[0])
            line = f"{n:>6} {d:>3} {events:>8} " + " ".join(f"{c:>14.3f}" for c in cells) + f" {vm / one:>13.1f}x"
            if args.previous:
                line += f" {cells[2] / one:>14.1f}x"
            print(line, flush=True)
    print("(the CPU default is 'one at a time'; XLA compiles its loops into single kernels up to "
          f"d = {driver_max_d()})")


if __name__ == "__main__":
    main()
