"""Helpers shared by the benchmark scripts, which import it as `_common` (a script's own folder comes first on
`sys.path` when it runs as `python benchmarks/NAME.py`)."""

import argparse
import statistics
import time
import warnings


# Speed runs: short single-replication runs whose batch-means confidence intervals nobody reads, so jsmkt's warning
# about correlated batch means would only clutter the tables.
warnings.filterwarnings("ignore", message=r"the \d+ batch means", category=RuntimeWarning)


def positive(kind):
    """An argparse `type=` for numbers of `kind` (int or float) that must be > 0. Argparse then names the option
    and the value, e.g. `argument --repeats: 0 must be > 0`."""

    def parse(text: str):
        value = kind(text)  # ValueError: argparse says "invalid int value: 'x'"
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    parse.__name__ = kind.__name__
    return parse


def median_runs(repeats: int, run) -> tuple[float, int]:
    """Call `run(i)` (a `jsmkt.simulate` call with its own key) for i = 0 .. repeats - 1: the median wall time and
    the events of the last run."""
    walls, events = [], 0
    for i in range(repeats):
        t0 = time.perf_counter()
        events = run(i).events
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), events


def interleaved_medians(fns, rounds, burst=10):
    """Median wall time of each zero-argument callable in `fns` (JAX results waited for), timed in interleaved rounds,
    so that load from other processes on the machine hits every measurement alike. Each round calls each function
    `burst` times back to back (the usual way to time a call, as `timeit` does). With `burst=1` every call follows
    the other functions' calls: a jitted solve then runs with cold caches, which on a 2-core VM added about 0.3 ms
    to a 0.15-0.25 ms solve, whatever the other work (NumPy, or even `time.sleep`)."""
    import jax

    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(burst):
                t0 = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
