"""The readers of the grid options of `jsmkt sweep` and `jsmkt capacity` (`--grid NAME=VALUES`), of
`--bound NAME=VALUE` and of `--percentiles` (`percentile_list`, for every command that takes it): argparse types that
check the text without JAX.

`--grid lam=0.5:0.98:50` is 50 evenly spaced values from 0.5 to 0.98, both ends included (`numpy.linspace`);
`--grid d=1,2,3` a list. A value is read as TOML reads it: `2` is an integer (for `d`: a fixed choice number) and
`2.0` or `2.5` a real number (a randomised one), so that a grid means what the same value means in a spec.
"""

import argparse
import math


def _number(text: str, where: str) -> int | float:
    """A TOML number: an integer where the text is one (`2`, `-3`), else a float (`2.0`, `1e-3`, `0.5`)."""
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{where}: {t!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{where}: {t!r} is not a finite number")
    return v


def grid_values(text: str, where: str) -> list[int | float]:
    """The values of one axis: `START:STOP:NUM` (NUM evenly spaced floats, both ends included), or numbers
    separated by commas (`1,2,3`, `0.5,0.9`)."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"{where}: {text!r} is not START:STOP:NUM (e.g. 0.5:0.98:50)")
        start, stop = (float(_number(p, where)) for p in parts[:2])
        num = _number(parts[2], where)
        if not isinstance(num, int) or num < 1:
            raise argparse.ArgumentTypeError(f"{where}: NUM={parts[2].strip()!r} in {text!r} must be a positive "
                                             "integer (the number of values)")
        if num == 1:
            return [start]
        step = (stop - start) / (num - 1)
        # numpy.linspace's values, computed here so that reading options does not import NumPy's first call cost
        return [start + i * step if i < num - 1 else stop for i in range(num)]
    values = [v for v in text.split(",")]
    if not all(v.strip() for v in values):
        raise argparse.ArgumentTypeError(f"{where}: {text!r} has an empty value; separate numbers by commas "
                                         "(e.g. 1,2,3)")
    return [_number(v, where) for v in values]


def grid_option(text: str) -> tuple[str, list[int | float]]:
    """`--grid NAME=VALUES` (argparse's type): the parameter's name (a TOML path, e.g. `lam`, `service.scv`) and its
    values (`grid_values`)."""
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or not name or not all(name.split(".")) or not values.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUES with NAME a spec key, dotted for tables, and "
                                         "VALUES START:STOP:NUM or a list (e.g. lam=0.5:0.98:50 or d=1,2,3)")
    return name, grid_values(values, f"--grid {name}")


def bound_option(text: str) -> tuple[str, float]:
    """`--bound NAME=VALUE` (argparse's type): a metric or a percentile (`p99`, `sojourn_p99.9`, `waiting_p99`,
    `mean_sojourn_time`) and the largest value allowed."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not name or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. p99=20 or mean_sojourn_time=3)")
    v = _number(value, f"--bound {name}")
    return name, float(v)


def percentile_list(text: str) -> tuple[float, ...]:
    """`--percentiles 50,90,99,99.9`: comma-separated percentiles in (0, 100) (argparse's type; `_join_percentiles`
    has joined a space-separated list with commas)."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers (e.g. 50,90,99,99.9)")
    bad = [v for v in values if not 0.0 < v < 100.0]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]:g} is not a percentile in (0, 100) (e.g. 99.9 for p99.9)")
    return tuple(int(v) if v.is_integer() else v for v in values)
