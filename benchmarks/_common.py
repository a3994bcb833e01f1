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
