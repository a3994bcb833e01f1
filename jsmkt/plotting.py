"""Matplotlib helpers: each takes an `ax`, draws, and returns the `ax` (no `show`, no `savefig`).

Inputs are checked before anything is drawn: a NaN or infinite value (e.g. from a failed solve) or an array of the
wrong shape is refused with a `ValueError` naming the argument. Zero and negative values, which a log scale cannot
show, are left out of the curves (`floor`).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np


def _array(name: str, x: Any, ndim: int, what: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a {what} of numbers (got {type(x).__name__})") from None
    if a.ndim != ndim or a.size == 0:
        raise ValueError(f"{name} must be a non-empty {what} (got shape {a.shape})")
    bad = np.argwhere(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{name} has {len(bad)} non-finite entries (first at index {tuple(int(i) for i in bad[0])}: "
                         f"{a[tuple(bad[0])]}); a failed solve? Check its `result` before plotting")
    return a


def _linestyle(kwargs: dict) -> None:
    if "ls" in kwargs:
        if "linestyle" in kwargs:
            raise ValueError("give ls or linestyle, not both")
        kwargs["linestyle"] = kwargs.pop("ls")


def plot_tails(ax, tails: Sequence[float], *, label: str | None = None, floor: float = 1e-300, **kwargs):
    """Semilog plot of the tail probabilities `s_k` (fraction of servers with at least `k` jobs) against `k`.

    - `tails`: `s_0, s_1, ...` (e.g. `jsmkt.tails(model, fp)` or `SimulationResult.tails`), a 1-D array.
    - `label`: legend entry (a legend is drawn when given).
    - `floor`: values at or below it are left out (a log scale cannot show 0).
    - other keywords go to `ax.semilogy` (default marker `"o"`).
    """
    s = _array("tails", tails, 1, "1-D array")
    k = np.arange(len(s))
    keep = s > floor
    kwargs.setdefault("marker", "o")
    ax.semilogy(k[keep], s[keep], label=label, **kwargs)
    ax.set_xlabel("queue length k")
    ax.set_ylabel(r"$s_k$ = fraction of servers with $\geq k$ jobs")
    if label is not None:
        ax.legend()
    return ax


def plot_phase_tails(ax, phase_tails, *, floor: float = 1e-300, **kwargs):
    """Semilog plot of the per-phase tails `S_k^(i)`, `k = 1..K`, one line per phase.

    - `phase_tails`: shape `(K, m)` (e.g. `jsmkt.phase_tails(model, fp)`).
    - `floor`: values at or below it are left out.
    - a `label` keyword prefixes the phase names; other keywords go to `ax.semilogy` (defaults: marker `"."`,
      linestyle `"--"`).
    """
    S = _array("phase_tails", phase_tails, 2, "2-D array (levels k = 1..K by phases)")
    k = np.arange(1, S.shape[0] + 1)
    _linestyle(kwargs)
    kwargs.setdefault("marker", ".")
    kwargs.setdefault("linestyle", "--")
    label = kwargs.pop("label", None)
    for i in range(S.shape[1]):
        keep = S[:, i] > floor
        name = f"phase {i + 1}" if label is None else f"{label}, phase {i + 1}"
        ax.semilogy(k[keep], S[keep, i], label=name, **kwargs)
    ax.legend()
    return ax


def plot_trajectory(ax, ts, tails_over_time, *, levels: Sequence[int] = (1, 2, 3, 4), **kwargs):
    """Transient tails `s_k(t)` for the given levels.

    - `ts`: the times, 1-D.
    - `tails_over_time`: shape `(len(ts), K + 1)`, row `i` holding `s_0 = 1, s_1, ..., s_K` at `ts[i]`. From a
      `jsmkt.integrate` trajectory: `jax.vmap(lambda y: jsmkt.tails(model, y))(traj.ys)` (`traj.ys` itself holds
      reduced states without `s_0`, and per phase for PH service, so it is refused).
    - `levels`: the `k` to plot, each from 1 to `K`.
    - a `label` keyword prefixes the level names; other keywords go to `ax.plot`.
    """
    t = _array("ts", ts, 1, "1-D array")
    S = _array("tails_over_time", tails_over_time, 2, "2-D array (times by levels k = 0..K)")
    if S.shape[0] != len(t):
        raise ValueError(f"tails_over_time has {S.shape[0]} rows but ts has {len(t)} times")
    if not np.all(S[:, 0] == 1.0):
        raise ValueError(
            "tails_over_time must hold s_0 = 1, s_1, ..., s_K in each row (its first column is not 1): for a "
            "jsmkt.integrate trajectory pass jax.vmap(lambda y: jsmkt.tails(model, y))(traj.ys)"
        )
    K = S.shape[1] - 1
    levels = list(levels)
    bad = [k for k in levels if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= K]
    if bad:
        raise ValueError(f"levels={bad!r}: each level must be an integer from 1 to K={K}")
    label = kwargs.pop("label", None)
    for k in levels:
        ax.plot(t, S[:, k], label=f"$s_{k}$" if label is None else f"{label}: $s_{k}$", **kwargs)
    ax.set_xlabel("time")
    ax.set_ylabel("tail fraction")
    ax.legend()
    return ax
