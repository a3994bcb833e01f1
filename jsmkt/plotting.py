"""Matplotlib helpers: each takes an `ax`, draws, and returns the `ax` (no `show`, no `savefig`).

Inputs are checked before anything is drawn: a NaN or infinite value (e.g. from a failed solve) or an array of the
wrong shape is refused with a `ValueError` naming the argument. Tails fall doubly exponentially, to 1e-300 within a
few dozen levels: the tail plots leave out values at or below `floor` (1e-16 by default, the relative precision of
float64) and set the axes to the range of what they drew, so that the informative levels fill the plot.
`model_title` names a model, its service and its load, as `jsmkt solve` prints them.
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


FLOOR = 1e-16  # the tail plots leave out values at or below it by default


def _fit_log_axes(ax) -> None:
    """Limit a semilog plot of tails to what its lines show: from a third of the smallest plotted value to twice
    the largest, and the levels plotted (matplotlib's own margins on a log axis span tens of decades when values
    reach 1e-300)."""
    ys = [np.asarray(line.get_ydata(), float) for line in ax.lines]
    xs = [np.asarray(line.get_xdata(), float) for line in ax.lines]
    ys = np.concatenate([y[y > 0] for y in ys]) if ys else np.zeros(0)
    xs = np.concatenate(xs) if xs else np.zeros(0)
    if ys.size:
        ax.set_ylim(ys.min() / 3.0, ys.max() * 2.0)
    if xs.size:
        ax.set_xlim(xs.min() - 0.5, xs.max() + 0.5)


def plot_tails(ax, tails: Sequence[float], *, label: str | None = None, floor: float = FLOOR, **kwargs):
    """Semilog plot of the tail probabilities `s_k` (fraction of servers with at least `k` jobs) against `k`.

    - `tails`: `s_0, s_1, ...` (e.g. `jsmkt.tails(model, fp)` or `SimulationResult.tails`), a 1-D array.
    - `label`: legend entry (a legend is drawn when given).
    - `floor`: values at or below it are left out (default 1e-16; a log scale cannot show 0); the axes then span
      what is drawn, on this and the other curves of `ax`.
    - other keywords go to `ax.semilogy` (default marker `"o"`).
    """
    s = _array("tails", tails, 1, "1-D array")
    k = np.arange(len(s))
    keep = s > floor
    kwargs.setdefault("marker", "o")
    ax.semilogy(k[keep], s[keep], label=label, **kwargs)
    ax.set_xlabel("queue length k")
    ax.set_ylabel(r"$s_k$ = fraction of servers with $\geq k$ jobs")
    _fit_log_axes(ax)
    if label is not None:
        ax.legend()
    return ax


def plot_phase_tails(ax, phase_tails, *, floor: float = FLOOR, **kwargs):
    """Semilog plot of the per-phase tails `S_k^(i)` (the fraction of servers with at least `k` jobs whose job in
    service is in phase `i`), `k = 1..K`, one line per phase, drawn so that they are told apart from `s_k` (their
    sum): thin dashed lines with small markers, labelled `S_k^(i)`.

    - `phase_tails`: shape `(K, m)` (e.g. `jsmkt.phase_tails(model, fp)`).
    - `floor`: values at or below it are left out (default 1e-16); the axes then span what is drawn.
    - a `label` keyword prefixes the phase names; other keywords go to `ax.semilogy` (defaults: marker `"."`,
      linestyle `"--"`, linewidth 1).
    """
    S = _array("phase_tails", phase_tails, 2, "2-D array (levels k = 1..K by phases)")
    k = np.arange(1, S.shape[0] + 1)
    _linestyle(kwargs)
    kwargs.setdefault("marker", ".")
    kwargs.setdefault("linestyle", "--")
    if "lw" not in kwargs:
        kwargs.setdefault("linewidth", 1.0)
    label = kwargs.pop("label", None)
    for i in range(S.shape[1]):
        keep = S[:, i] > floor
        name = rf"$S_k^{{({i + 1})}}$, phase {i + 1} in service"
        ax.semilogy(k[keep], S[keep, i], label=name if label is None else f"{label}, {name}", **kwargs)
    _fit_log_axes(ax)
    ax.legend()
    return ax


def model_title(model, what: str | None = None) -> str:
    """A title naming `model` (its class and parameters, truncation `K` and load) and its service, in two lines, as
    `jsmkt solve` prints them (for the registered families; another model gets its class name and load); `what`
    (e.g. `"exact mean field"`) is added to the first line."""
    from ._spec import describe_model, family_of

    try:
        family_of(model)
    except ValueError:
        text = f"load rho = {float(model.load()):.6g}"
    else:
        text = describe_model(model)
    first, _, rest = text.partition("\n")
    head = f"{type(model).__name__}" + (f" ({what})" if what else "")
    return f"{head}: {first}" + (f"\n{rest}" if rest else "")


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
