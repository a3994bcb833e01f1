"""Matplotlib helpers: each takes an `ax`, draws, and returns the `ax` (no `show`, no `savefig`)."""

from collections.abc import Sequence

import numpy as np


def plot_tails(ax, tails: Sequence[float], *, label: str | None = None, floor: float = 1e-300, **kwargs):
    """Semilog plot of the tail probabilities `s_k` (fraction of servers with at least `k` jobs) against `k`."""
    s = np.asarray(tails, dtype=float)
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
    """Semilog plot of the per-phase tails `S_k^(i)`, `k = 1..K`, one line per phase (a `label` prefixes the
    phase names; other keywords go to `ax.semilogy`)."""
    S = np.asarray(phase_tails, dtype=float)
    k = np.arange(1, S.shape[0] + 1)
    if "ls" in kwargs:
        kwargs["linestyle"] = kwargs.pop("ls")
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
    """Transient tails `s_k(t)` for the given levels, from `integrate(...)` output reduced to tails (a `label`
    prefixes the level names; other keywords go to `ax.plot`)."""
    S = np.asarray(tails_over_time, dtype=float)
    label = kwargs.pop("label", None)
    for k in levels:
        if k < S.shape[1]:
            ax.plot(np.asarray(ts), S[:, k], label=f"$s_{k}$" if label is None else f"{label}: $s_{k}$", **kwargs)
    ax.set_xlabel("time")
    ax.set_ylabel("tail fraction")
    ax.legend()
    return ax
