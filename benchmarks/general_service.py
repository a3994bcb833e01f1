"""Benchmark: the general-service engine of `jsmkt.simulate` (per-server completion times, `jsmkt.deterministic`,
`jsmkt.lognormal`, any sampler), and how it selects the next completion.

Model: JSQ(2), lam = 0.9, deterministic service of mean 1 (M/D/1 queues behind JSQ(2)), N = 100 and N = 1000
servers, one replication of 20 000 / N time units (about 36 000 events), on one CPU device. Each event of this
engine looks for the earliest completion among the N servers, an O(N) reduction. The rows compare, side by side
in one run, jsmkt's `_first_min` (a plain min, then the first index holding it: two vectorised reductions) with
`jnp.argmin` (XLA's CPU backend runs its joint value-and-index reduction element by element), swapped in for the
comparison. Medians of 5 repeats, compilation excluded.

Measured on a 2-core CPU (AMD EPYC, XLA CPU, jax 0.10.2): N = 1000: 2.2 us per event against 6.2 us with argmin
(2.7x); N = 100: 1.35 against 1.78 us (1.3x). Run: `.venv/bin/python benchmarks/general_service.py`.

Tried and not adopted: a tournament tree of first-minimum indices (O(log N) per event, rebuilt per block of 64
events), with the events of each replication applied by a loop of single-element reads and writes as in the
sequential PH engine. It gave the same runs, but the tree's update path makes the loop body too large for XLA to
compile the event loop into one kernel, so the loop still ran op by op: 1.5 against 2.2 us per event at N = 1000,
1.3 against 1.35 us at N = 100 (one prototype run), not worth a second general-service engine.
"""

import jax
import jax.numpy as jnp
import jax.random as jr

import _common
import jsmkt
from jsmkt._simulate import core, driver


def argmin_select(x):
    i = jnp.argmin(x).astype(jnp.int32)
    return i, x[i]


def timed(model, n, service, repeats=5):
    t1 = 20000.0 / n
    jsmkt.simulate(model, n, t1, key=jr.PRNGKey(0), service=service)  # compile
    return _common.median_runs(repeats, lambda i: jsmkt.simulate(model, n, t1, key=jr.PRNGKey(1 + i), service=service))


def main():
    jsmkt.use_cpu_cores(1)
    model, service = jsmkt.JSQd(0.9, d=2), jsmkt.deterministic(1.0)
    print("JSQ(2), lam = 0.9, deterministic service; one replication of 20 000 / N time units, one CPU device")
    header = f"{'N':>6} {'selection':>12} {'events':>8} {'wall s':>8} {'us/event':>9} {'vs argmin':>10}"
    print(header)
    print("-" * len(header))
    ours = core._first_min
    for n in (100, 1000):
        rows = {}
        for name, select in (("argmin", argmin_select), ("_first_min", ours)):
            core._first_min = select
            driver._compiled.cache_clear()
            jax.clear_caches()
            try:
                rows[name] = timed(model, n, service)
            finally:
                core._first_min = ours
        for name, (wall, events) in rows.items():
            us = wall / events * 1e6
            ratio = rows["argmin"][0] / wall
            print(f"{n:>6} {name:>12} {events:>8} {wall:>8.3f} {us:>9.2f} {ratio:>9.2f}x")
    driver._compiled.cache_clear()


if __name__ == "__main__":
    main()
