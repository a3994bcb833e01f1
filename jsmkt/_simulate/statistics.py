"""`simulate`'s statistics: Student-t half-widths (batch means, replications), the sojourn-time histograms and
their percentiles with sectioning intervals, and the time-average tables cut to the levels reached."""

import functools
import math
import warnings

import numpy as np

from . import core
from .limits import _real_arg


_HIST_OCTAVES = 40  # sojourn-time histogram range: E[S] * 2**-20 .. E[S] * 2**20
_N_BINS = _HIST_OCTAVES << core.HIST_SUB_BITS
_PERCENTILES = (50, 90, 99)


# Lag-1 autocorrelation of the batch means above which their confidence intervals are flagged as too narrow (the
# estimate from independent batch means exceeds it with probability 4e-5 for 30 batches, 2e-3 for 10).
_MAX_BATCH_CORRELATION = 0.6


def _t_two_sided(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with `nu` degrees of freedom (exact finite series, Abramowitz & Stegun 26.7)."""
    theta = math.atan(t / math.sqrt(nu))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if nu % 2 == 1:
        total, term = 0.0, 1.0
        if nu > 1:
            total = term
            for j in range(1, (nu - 3) // 2 + 1):
                term *= c2 * (2 * j) / (2 * j + 1)
                total += term
        return 2.0 / math.pi * (theta + s * math.cos(theta) * total)
    total, term = 1.0, 1.0
    for j in range(1, (nu - 2) // 2 + 1):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return s * total


@functools.lru_cache(maxsize=None)
def t_quantile_975(nu: int) -> float:
    """The 97.5 % quantile of Student's t with `nu >= 1` degrees of freedom (bisection on the exact CDF)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_two_sided(mid, nu) < 0.95:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _half_width(samples: np.ndarray) -> np.ndarray:
    """95 % Student-t half-width of the mean of `samples` along axis 0."""
    n = samples.shape[0]
    if n < 2:
        return np.full(samples.shape[1:], np.nan)
    return t_quantile_975(n - 1) * samples.std(axis=0, ddof=1) / math.sqrt(n)


def _percentile_args(percentiles) -> tuple[float, ...]:
    """The requested percentiles, each a real number in (0, 100) (an integral one kept as an `int`)."""
    if isinstance(percentiles, (str, bytes)) or np.ndim(percentiles) > 1:
        raise ValueError(f"percentiles={percentiles!r} must be a sequence of numbers in (0, 100), e.g. (50, 99, 99.9)")
    try:
        values = [_real_arg("percentiles", q) for q in np.atleast_1d(np.asarray(percentiles, dtype=object))]
    except ValueError as e:
        raise ValueError(f"percentiles={percentiles!r} must be a sequence of numbers in (0, 100), e.g. "
                         "(50, 99, 99.9)") from e
    for q in values:
        if not 0.0 < q < 100.0:
            raise ValueError(f"percentiles={percentiles!r}: {q!r} is not in (0, 100) (percent: 99.9 for p99.9)")
    return tuple(int(q) if float(q).is_integer() else q for q in values)


def _warn_if_correlated(means: np.ndarray, batch_len: float) -> None:
    """Warn when the batch means of the queue length are correlated: batches shorter than the system's relaxation
    time give half-widths that are too narrow (at high load, e.g. 60 % coverage instead of 95 %)."""
    x = means - means.mean()
    denom = float(x @ x)
    r1 = float(x[:-1] @ x[1:]) / denom if denom > 0 else 0.0
    if r1 > _MAX_BATCH_CORRELATION:
        warnings.warn(
            f"the {means.size} batch means (batches of {batch_len:.4g} time units) are correlated (lag-1 "
            f"autocorrelation {r1:.2f}): the batches are shorter than the system's relaxation time, so the "
            "confidence intervals are too narrow; raise t1, or use n_replications >= 2",
            RuntimeWarning,
            stacklevel=3,
        )


def _trim_cells(stats: core.Stats, group: int) -> core.Stats:
    """`stats` with the time integrals cut after the last cell some server reached (the cells above are 0); with
    cells ordered by level, `group` per level, after the highest level reached. The statistics then take memory for
    the levels reached, not for `max_queue`."""
    reached = np.flatnonzero(stats.area.any(axis=0))
    last = int(reached[-1]) if reached.size else 0
    width = (last // group + 1) * group if group else last + 1
    return stats._replace(area=stats.area[:, :width].copy())


def _pad_levels(x: np.ndarray, above: int, axis: int) -> np.ndarray:
    """`x` with `above` zero levels appended along its queue-level axis `axis`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, above)
    return np.pad(x, pad)


def _with_zero_phases(x: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """`x` (..., m') over the phases in `reach`, widened to all len(reach) phases with zeros elsewhere."""
    out = np.zeros(x.shape[:-1] + reach.shape, x.dtype)
    out[..., reach] = x
    return out


def _hist_key(x: float) -> int:
    """Histogram key of x > 0: its float64 bits without the low mantissa bits (monotone in x)."""
    return int(np.array(x, np.float64).view(np.int64)) >> (52 - core.HIST_SUB_BITS)


def _hist_edge(key: int) -> float:
    """Smallest float64 with histogram key `key`."""
    return float(np.array(key << (52 - core.HIST_SUB_BITS), np.int64).view(np.float64))


def _percentile(hist: np.ndarray, q: float, hist_lo: int, zero_below: bool = False) -> float:
    """q-th percentile from the log-linear histogram (bin 0: below the range, last bin: above), interpolated
    linearly inside its bin (relative bin width <= 2**-HIST_SUB_BITS). `zero_below`: bin 0 holds zeros (waiting
    times of jobs that did not wait)."""
    total = hist.sum()
    if total == 0:
        return math.nan
    cum = np.cumsum(hist)
    target = q / 100.0 * total
    b = int(np.searchsorted(cum, target))
    n_bins = len(hist) - 2
    if b == 0:
        return 0.0 if zero_below else _hist_edge(hist_lo)
    if b == n_bins + 1:
        return _hist_edge(hist_lo + n_bins)
    lo, hi = _hist_edge(hist_lo + b - 1), _hist_edge(hist_lo + b)
    frac = (target - cum[b - 1]) / hist[b]
    return lo + frac * (hi - lo)


def _percentiles(sections: np.ndarray, qs, hist_lo: int, zero_below: bool) -> tuple[dict, dict]:
    """Percentiles `qs` of the pooled histogram of `sections` (rows: groups of replications, or batches), and 95 %
    half-widths from their spread over the sections (sectioning: the pooled estimate, with the Student-t interval
    of the sections' own estimates; NaN with fewer than two sections that saw jobs)."""
    pooled = sections.sum(axis=0)
    used = sections[sections.sum(axis=1) > 0]
    est, ci = {}, {}
    for q in qs:
        est[q] = float(_percentile(pooled, q, hist_lo, zero_below))
        each = np.array([_percentile(h, q, hist_lo, zero_below) for h in used])
        ci[q] = float(_half_width(each[:, None])[0]) if each.size >= 2 else math.nan
    return est, ci
