"""Matplotlib helpers: each takes an `ax`, draws, and returns the `ax` (no `show`, no `savefig`).

Inputs are checked before anything is drawn: a NaN or infinite value (e.g. from a failed solve) or an array of the
wrong shape is refused with a `ValueError` naming the argument. Tails fall doubly exponentially, to 1e-300 within a
few dozen levels: the tail plots leave out values at or below `floor` (1e-16 by default, the relative precision of
float64) and set the axes to the range of what they drew, so that the informative levels fill the plot.
Curves that may coincide are told apart by line style, marker shape and fill: `s_k` is a solid line with filled
circles; each phase of `plot_phase_tails` has a line style and a marker of its own, alternately hollow and larger or
filled and smaller, so that a curve drawn over another (equal phase tails, or the phase that holds nearly all of
`s_k` deep in the tail) leaves both visible, one marker inside the other.
`plot_sojourn_ccdf` draws a sojourn- or waiting-time law (`jsmkt.TimeDistribution`) with its percentiles marked.
`model_title` names a model, its service and its load, as `jsmkt solve` prints them.
`plot_sweep` and `plot_sweep_heatmap` draw a sweep's dataset (`jsmkt.sweep`): a metric against a grid axis, one line
per value of another, or over two axes as coloured cells; failed points (NaN) are gaps there, not refused.
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


def _line_kwargs(kwargs: dict) -> dict:
    """`kwargs` with matplotlib's short aliases (`lw`, `ms`, `mfc`, ...) spelled out, so that defaults set under the
    full names do not clash with them."""
    from matplotlib import cbook
    from matplotlib.lines import Line2D

    return cbook.normalize_kwargs(kwargs, Line2D)


FLOOR = 1e-16  # the tail plots leave out values at or below it by default


def _fit_log_axes(ax) -> None:
    """Limit a semilog plot of tails to what its lines show: from a third of the smallest plotted value to twice
    the largest, and the levels plotted (matplotlib's own margins on a log axis span tens of decades when values
    reach 1e-300). The caps of error bars are not data: a lower end at or near 0 would stretch the axis down by
    decades, so the bars run off the bottom of the plot instead."""
    from matplotlib.container import ErrorbarContainer

    caps = {id(cap) for c in ax.containers if isinstance(c, ErrorbarContainer) for cap in c.lines[1]}
    lines = [line for line in ax.lines if id(line) not in caps]
    ys = [np.asarray(line.get_ydata(), float) for line in lines]
    xs = [np.asarray(line.get_xdata(), float) for line in lines]
    ys = np.concatenate([y[y > 0] for y in ys]) if ys else np.zeros(0)
    xs = np.concatenate(xs) if xs else np.zeros(0)
    if ys.size:
        ax.set_ylim(ys.min() / 3.0, ys.max() * 2.0)
    if xs.size:
        ax.set_xlim(xs.min() - 0.5, xs.max() + 0.5)


def plot_tails(ax, tails: Sequence[float], *, ci: Sequence[float] | None = None, label: str | None = None,
               floor: float = FLOOR, **kwargs):
    """Semilog plot of the tail probabilities `s_k` (fraction of servers with at least `k` jobs) against `k`.

    - `tails`: `s_0, s_1, ...` (e.g. `jsmkt.tails(model, fp)` or `SimulationResult.tails`), a 1-D array.
    - `ci`: half-widths of confidence intervals (e.g. `SimulationResult.tails_ci`, 95 %), one per entry of `tails`
      (or more: the extra ones are ignored): drawn as error bars. A bar whose lower end is at or below 0 runs off
      the bottom of the plot.
    - `label`: legend entry (a legend is drawn when given).
    - `floor`: values at or below it are left out (default 1e-16; a log scale cannot show 0); the axes then span
      what is drawn, on this and the other curves of `ax`.
    - other keywords go to `ax.semilogy`, or with `ci` to `ax.errorbar` (default marker `"o"`; with `ci`, caps of
      width 2).
    """
    s = _array("tails", tails, 1, "1-D array")
    if ci is not None:
        c = _array("ci", ci, 1, "1-D array")
        if len(c) < len(s):
            raise ValueError(f"ci has {len(c)} entries but tails has {len(s)}: give one half-width per tail")
        if np.any(c < 0):
            raise ValueError(f"ci must hold half-widths >= 0 (got {float(c[c < 0][0])!r})")
        c = c[: len(s)]
    k = np.arange(len(s))
    keep = s > floor
    kwargs.setdefault("marker", "o")
    if ci is None:
        ax.semilogy(k[keep], s[keep], label=label, **kwargs)
    else:
        kwargs.setdefault("capsize", 2)
        ax.errorbar(k[keep], s[keep], yerr=c[keep], label=label, **kwargs)
        ax.set_yscale("log")
    ax.set_xlabel("queue length k")
    ax.set_ylabel(r"$s_k$ = fraction of servers with $\geq k$ jobs")
    _fit_log_axes(ax)
    if label is not None:
        ax.legend()
    return ax


# Phase i's line style and marker (cycled: 6 line styles and 7 markers give 42 distinct pairs), none of them s_k's
# solid line and filled circle; even phases (from 0) get large hollow markers, odd ones small filled markers, which
# sit inside the hollow ones (and inside s_k's circles) where the curves coincide.
_PHASE_LINESTYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))
_PHASE_MARKERS = ("s", "^", "D", "v", "p", "<", "h")


def _phase_style(i: int) -> dict[str, Any]:
    style = {"linestyle": _PHASE_LINESTYLES[i % len(_PHASE_LINESTYLES)],
             "marker": _PHASE_MARKERS[i % len(_PHASE_MARKERS)]}
    if i % 2 == 0:
        style.update(markersize=8, markerfacecolor="none", markeredgewidth=1.2)
    else:
        style.update(markersize=4)
    return style


def plot_phase_tails(ax, phase_tails, *, floor: float = FLOOR, **kwargs):
    """Semilog plot of the per-phase tails `S_k^(i)` (the fraction of servers with at least `k` jobs whose job in
    service is in phase `i`), `k = 1..K`, one line per phase, labelled `S_k^(i)`, drawn so that they are told apart
    from `s_k` (their sum) and from each other where they coincide: thin lines, each phase with its own line style
    (dashed, dotted, dash-dotted, ...) and marker shape (square, triangle, diamond, ...), alternately hollow and
    large (phases 1, 3, ...) or filled and small (phases 2, 4, ...).

    - `phase_tails`: shape `(K, m)` (e.g. `jsmkt.phase_tails(model, fp)`).
    - `floor`: values at or below it are left out (default 1e-16); the axes then span what is drawn.
    - a `label` keyword prefixes the phase names; other keywords go to `ax.semilogy` and replace the phases' own
      style (defaults: the styles above, linewidth 1).
    """
    S = _array("phase_tails", phase_tails, 2, "2-D array (levels k = 1..K by phases)")
    k = np.arange(1, S.shape[0] + 1)
    _linestyle(kwargs)
    kwargs = _line_kwargs(kwargs)
    kwargs.setdefault("linewidth", 1.0)
    label = kwargs.pop("label", None)
    for i in range(S.shape[1]):
        keep = S[:, i] > floor
        name = rf"$S_k^{{({i + 1})}}$, phase {i + 1} in service"
        style = _phase_style(i)
        if "marker" in kwargs:  # a marker of the caller's: their own size and fill
            style = {"linestyle": style["linestyle"]}
        ax.semilogy(k[keep], S[keep, i], label=name if label is None else f"{label}, {name}", **(style | kwargs))
    _fit_log_axes(ax)
    ax.legend()
    return ax


def _percentile_label(p: float) -> str:
    """`p50`, `p99.9`, `p99.99999`: the percentile `p` in its shortest exact decimal form (distinct percentiles get
    distinct labels)."""
    return "p" + np.format_float_positional(float(p), trim="-")


_CCDF_LOWEST = 1e-12  # plot_sojourn_ccdf's curve never runs below it: 1 - cdf is computed to about 1e-16 absolute


def plot_sojourn_ccdf(ax, dist, *, percentiles: Sequence[float] = (), label: str | None = None,
                      floor: float | None = None, **kwargs):
    """The complementary CDF `P(time > t)` of a sojourn- or waiting-time law against `t`, on a log y-axis, with the
    `percentiles` marked: a hollow point at each quantile `t_p` (where `P(time > t_p) = 1 - p/100`), labelled `p50`,
    `p99.9`, ..., with a dotted line down to the time axis.

    - `dist`: a `jsmkt.TimeDistribution` (`jsmkt.sojourn_time_distribution(model, fp)` or
      `jsmkt.waiting_time_distribution(model, fp)`).
    - `percentiles`: in (0, 100), e.g. `(50, 90, 99, 99.9)`.
    - `floor`: the curve runs from `t = 0` until it falls to `floor`, not below 1e-12 (default: a tenth of the
      smallest marked `1 - p/100`, at most 1e-2; 1e-6 without percentiles); the axes span what is drawn.
    - `label`: legend entry of the curve (default: the law's kind, `"sojourn time"` or `"waiting time"`).
    - other keywords go to `ax.semilogy` for the curve (the marks take its colour).
    """
    from ._sojourn import TimeDistribution

    if not isinstance(dist, TimeDistribution):
        raise ValueError(f"dist must be a jsmkt.TimeDistribution (from jsmkt.sojourn_time_distribution or "
                         f"waiting_time_distribution), not {type(dist).__name__}")
    try:
        ps = np.asarray(list(percentiles), dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"percentiles={percentiles!r} must be a sequence of numbers in (0, 100)") from None
    bad = ps[~((ps > 0) & (ps < 100))]
    if bad.size:
        raise ValueError(f"percentiles: {float(bad[0])!r} is not a percentile in (0, 100) (e.g. 99.9 for p99.9)")
    if floor is None:
        floor = min(1e-2, float(np.min(1.0 - ps / 100.0)) / 10.0) if ps.size else 1e-6
    elif not (isinstance(floor, (int, float)) and 0 < floor < 1):
        raise ValueError(f"floor={floor!r} must be a probability in (0, 1)")
    lowest = max(floor, _CCDF_LOWEST)
    tq = _array("the quantiles of dist", np.asarray(dist.quantile(ps / 100.0)), 1, "1-D array") if ps.size else ps
    end = float(np.asarray(dist.quantile(1.0 - lowest)))
    mean = float(np.asarray(dist.mean))
    if not (np.isfinite(end) and np.isfinite(mean)):
        raise ValueError("dist has non-finite values (a failed solve? Check its `result` before plotting)")
    end = max([end, mean] + [float(t) for t in tq]) or 1.0
    t = np.linspace(0.0, end, 401)
    ccdf = 1.0 - _array("dist.cdf", np.asarray(dist.cdf(t)), 1, "1-D array")
    keep = ccdf > 0
    _linestyle(kwargs)
    kwargs = _line_kwargs(kwargs)
    (line,) = ax.semilogy(t[keep], ccdf[keep], label=dist.kind if label is None else label, **kwargs)
    if ps.size:
        y = (100.0 - ps) / 100.0
        ax.vlines(tq, lowest / 2.0, y, colors=line.get_color(), linestyles=":", linewidth=0.8)
        ax.plot(tq, y, linestyle="none", marker="o", markersize=7, markerfacecolor="none", markeredgewidth=1.2,
                color=line.get_color(), label="percentiles", zorder=3)
        for p, tp, yp in zip(ps, tq, y, strict=True):
            ax.annotate(f"{_percentile_label(p)} = {tp:.4g}", (tp, yp), textcoords="offset points", xytext=(6, 2),
                        fontsize=8)
    ax.set_xlim(0.0, end)
    ax.set_ylim(min(lowest, float(ccdf[keep].min())) / 2.0, 1.5)
    ax.set_xlabel(f"{dist.kind} t")
    ax.set_ylabel(f"P({dist.kind} > t)")
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


# Sweep datasets (`jsmkt.sweep`): the labels of the usual grid axes and metrics; other names get their family's
# description (from the spec the dataset holds), or themselves.
_SWEEP_LABELS = {
    "lam": r"arrival rate per server $\lambda$",
    "mu": r"service rate $\mu$",
    "d": "choice number $d$",
    "d1": "choice number $d_1$ of arrivals",
    "d2": "choice number $d_2$",
    "theta": r"retrial rate $\theta$",
    "alpha": r"failure rate $\alpha$",
    "beta": r"repair rate $\beta$",
    "service.mean": "mean service time",
    "service.scv": "service-time SCV $c^2$",
    "mean_sojourn_time": "mean sojourn time E[T]",
    "mean_waiting_time": "mean waiting time E[W]",
    "mean_queue_length": "mean queue length E[Q] (jobs per server)",
    "mean_number_waiting": "mean number waiting (jobs per server)",
    "prob_wait": "probability of waiting P(wait)",
    "utilisation": "utilisation (fraction of servers busy)",
    "throughput": "throughput (jobs per server per unit time)",
    "availability": "availability (fraction of servers working)",
    "mean_orbit_size": "mean orbit size (jobs per server)",
    "prob_blocked": "probability of blocking",
    "K": "truncation K",
}
_SWEEP_SYMBOLS = {"mean_sojourn_time": "E[T]", "mean_waiting_time": "E[W]", "mean_queue_length": "E[Q]",
                  "prob_wait": "P(wait)", "lam": r"\lambda", "mu": r"\mu", "theta": r"\theta"}
# sojourn_time_p99, waiting_time_p99.9 (the sweep's table columns), sojourn_p99, waiting_p99, p99 (the sojourn time's)
_PERCENTILE_NAME = r"^(?:(sojourn|waiting)(?:_time)?_)?p(\d+(?:\.\d*)?)$"


def _sweep_label(ds, name: str) -> str:
    """The axis label of a grid axis or a variable `name` of a sweep dataset."""
    if name in _SWEEP_LABELS:
        return _SWEEP_LABELS[name]
    try:
        import tomllib

        from ._spec import FAMILIES

        fam = FAMILIES[tomllib.loads(str(ds.attrs["spec"]))["model"]]
        param = fam.params.get(fam.aliases.get(name, name))
    except Exception:  # a dataset without a spec, or of a family not registered here: the name alone
        param = None
    return f"{param.doc} {name}" if param is not None else name


def _sweep_values_text(values, at_most: int = 8) -> str:
    shown = [_sweep_value_text(v) for v in values[:at_most]]
    return ", ".join(shown) + (f", ... ({len(values)} values)" if len(values) > at_most else "")


def _sweep_value_text(v) -> str:
    v = v.item() if isinstance(v, np.generic) else v
    return f"{v:.10g}" if isinstance(v, float) else str(v)


def _sweep_names(ds) -> list[str]:
    """What a sweep's dataset can plot, by name: its metrics (sorted), `K`, each percentile (`sojourn_time_p99`)
    and each derivative (`mean_sojourn_time_grad_lam`)."""
    grid = set(ds["result"].dims) if "result" in ds.data_vars else set(ds.dims) - {"wrt", "percentile"}
    plain = sorted(n for n in ds.data_vars if set(ds[n].dims) <= grid and n not in ("K", "result"))
    out = plain + (["K"] if "K" in ds.data_vars else [])
    for kind in ("sojourn", "waiting"):
        if f"{kind}_time_percentiles" in ds.data_vars:
            out += [f"{kind}_time_{_percentile_label(p)}" for p in ds["percentile"].values]
    for name in sorted(n for n in ds.data_vars if "wrt" in ds[n].dims):
        out += [f"{name}_{w}" for w in ds["wrt"].values]
    return out


def _sweep_variable(ds, y: str, arg: str = "y"):
    """The variable `y` names, with the selection of its extra dimension that `y` implies, and its label: a
    variable over the grid (`mean_sojourn_time`, `K`), a percentile of `{kind}_time_percentiles`
    (`sojourn_time_p99`, `waiting_time_p99.9` as the sweep's tables name them; `sojourn_p99`, `waiting_p99`, and
    `p99` for the sojourn time, as capacity bounds name them) or a derivative `{metric}_grad_{wrt}`
    (`mean_sojourn_time_grad_lam`, also written `mean_sojourn_time_grad[lam]`). `arg` names `y` in errors."""
    import re

    if y in ds.data_vars:
        return ds[y], {}, _sweep_label(ds, y)
    if m := re.match(_PERCENTILE_NAME, y):
        kind, p = m.group(1) or "sojourn", float(m.group(2))
        var = f"{kind}_time_percentiles"
        if var not in ds.data_vars:
            raise ValueError(f"{arg}={y!r}: the sweep has no {kind}-time percentiles ({var}); it has "
                             f"{', '.join(_sweep_names(ds))}")
        have = np.asarray(ds["percentile"].values, dtype=float)
        if not np.any(np.isclose(have, p, rtol=1e-12, atol=0.0)):
            raise ValueError(f"{arg}={y!r}: the sweep has the {kind}-time percentiles "
                             f"{', '.join(_percentile_label(q) for q in have)}, not {_percentile_label(p)}")
        return ds[var], {"percentile": have[np.isclose(have, p, rtol=1e-12, atol=0.0)][0]}, \
            f"{kind} time {_percentile_label(p)}"
    grads = [n for n in ds.data_vars if "wrt" in ds[n].dims and (y.startswith(f"{n}_") or y.startswith(f"{n}["))]
    if grads:
        var = max(grads, key=len)
        wrt = y[len(var) + 1:].removesuffix("]") if y[len(var)] == "[" else y[len(var) + 1:]
        have = [str(w) for w in ds["wrt"].values]
        if wrt not in have:
            raise ValueError(f"{arg}={y!r}: {var} has derivatives with respect to {', '.join(have)}, not {wrt}")
        metric = var.removesuffix("_grad")
        num, den = _SWEEP_SYMBOLS.get(metric, metric), _SWEEP_SYMBOLS.get(wrt, wrt)
        label = (rf"$\partial\,${num} / $\partial {den}$" if den.startswith("\\") else
                 rf"$\partial\,${num} / $\partial\,${den}")
        return ds[var], {"wrt": wrt}, label
    raise ValueError(f"{arg}={y!r} is not a variable of the sweep: give one of {', '.join(_sweep_names(ds))}")


def _sweep_select(ds, y: str, axes: tuple[str, ...], sel: dict[str, Any], *, fix: str = "{name}={value}",
                  hue: str = "hue={name!r}", arg: str = "y"):
    """The values of `y` over the grid `axes` (in that order), the other axes fixed by `sel` (a value of each, to
    1e-9 relative) or of a single value, as a DataArray; its label; the title naming the fixed values. `fix` and
    `hue` word the advice of the errors (the keywords, or the command line's options), `arg` names `y` there."""
    var, implied, label = _sweep_variable(ds, y, arg)
    grid = tuple(ds["result"].dims) if "result" in ds.data_vars else tuple(d for d in var.dims if d in ds.coords)
    for name in axes:
        if name not in grid:
            raise ValueError(f"{name!r} is not an axis of the sweep: its axes are {', '.join(grid)}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"the axes {', '.join(map(repr, axes))} repeat one: give distinct axes")
    chosen: dict[str, Any] = dict(implied)
    for name, value in sel.items():
        if name not in var.dims:
            raise ValueError(f"{fix.format(name=name, value=value)}: {name!r} is not an axis of the sweep (its axes: "
                             f"{', '.join(grid)})")
        if name in axes:
            raise ValueError(f"{fix.format(name=name, value=value)}: {name!r} is plotted; fix only the other axes")
        have = ds[name].values
        if have.dtype.kind in "iuf":
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{fix.format(name=name, value=value)}: {value!r} is not a number") from None
            hit = np.flatnonzero(np.isclose(have.astype(float), v, rtol=1e-9, atol=1e-12))
        else:
            hit = np.flatnonzero(have.astype(str) == str(value))
        if not hit.size:
            raise ValueError(f"{fix.format(name=name, value=value)}: {name} has no such value; its values: "
                             f"{_sweep_values_text(have)}")
        chosen[name] = have[hit[0]]
    da = var.sel(chosen)
    free = [d for d in da.dims if d not in axes and da.sizes[d] > 1]
    if free:
        advice = " or ".join([f"fix {'each' if len(free) > 1 else 'it'} with "
                              f"{fix.format(name=free[0], value=_sweep_value_text(ds[free[0]].values[0]))}"]
                             + ([f"draw one line per value with {hue.format(name=free[0])}"] if hue else []))
        raise ValueError(f"{y} also varies along " + "; ".join(
            f"{d} ({da.sizes[d]} values: {_sweep_values_text(ds[d].values)})" for d in free) + f": {advice}")
    fixed = {d: da[d].values.item() for d in da.dims if d not in axes}
    fixed |= {k: v for k, v in chosen.items() if k not in implied and k not in fixed}
    da = da.squeeze([d for d in da.dims if d not in axes], drop=True).transpose(*axes)
    title = ", ".join(f"{k} = {_sweep_value_text(v)}" for k, v in fixed.items())
    return da, label, title


def _sweep_ticks(ax, which: str, values: np.ndarray) -> None:
    """Ticks at each value of an axis of a few integers (a choice number), not at halves."""
    if values.dtype.kind in "iu" and len(values) <= 12:
        (ax.set_xticks if which == "x" else ax.set_yticks)([int(v) for v in values])


def plot_sweep(ds, x: str, y: str, *, hue: str | None = None, ax=None, log: bool = False, **sel):
    """A metric of a sweep (`jsmkt.sweep`'s dataset) against one grid axis, one line per value of another.

    - `ds`: the `xarray.Dataset` of `jsmkt.sweep` (or read back: `xarray.open_zarr("sweep.zarr")`).
    - `x`: the grid axis on the horizontal axis (`"lam"`).
    - `y`: what is plotted: a metric of the sweep (`"mean_sojourn_time"`, `"prob_wait"`, `"K"`), a percentile
      (`"sojourn_time_p99"`, `"waiting_time_p99.9"`, as the columns of the sweep's tables; also `"sojourn_p99"`,
      and `"p99"` for the sojourn time's) or a derivative (`"mean_sojourn_time_grad_lam"`).
    - `hue`: a grid axis with one line per value (`"d"`), labelled in a legend.
    - `ax`: the axes drawn on (default: `matplotlib.pyplot.gca()`).
    - `log`: a logarithmic y axis.
    - `sel`: a value for each other grid axis of more than one value (`service_scv=...` cannot be a keyword:
      pass `**{"service.scv": 2.0}`); values match to 1e-9 relative. An axis of more than one value neither plotted
      nor fixed is refused, naming it.

    Failed points (NaN) are gaps in the lines. The axes are labelled with the names (and units where known) and the
    title names the fixed values.

    **Returns:** `ax`.
    """
    axes = (x,) if hue is None else (x, hue)
    da, label, title = _sweep_select(ds, y, axes, sel)
    return _draw_sweep_lines(ax, ds, da, x, hue, label, title, log)


def _draw_sweep_lines(ax, ds, da, x: str, hue: str | None, label: str, title: str, log: bool):
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.gca()
    xs = np.asarray(da[x].values)
    order = np.argsort(xs, kind="stable")
    values = np.asarray(da.values, dtype=float)
    style = {"marker": "o", "markersize": 3} if len(xs) <= 60 else {}
    if hue is None:
        ax.plot(xs[order], values[order], **style)
    else:
        for j, h in enumerate(da[hue].values):
            ax.plot(xs[order], values[order, j], label=f"{_sweep_value_text(h)}", **style)
        ax.legend(title=_sweep_label(ds, hue), fontsize=8, title_fontsize=8)
    if log:
        ax.set_yscale("log")
    _sweep_ticks(ax, "x", xs)
    ax.set_xlabel(_sweep_label(ds, x))
    ax.set_ylabel(label)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_sweep_heatmap(ds, x: str, y: str, z: str, *, ax=None, log: bool = False, **sel):
    """A metric of a sweep (`jsmkt.sweep`'s dataset) over two grid axes, as coloured cells with a colour bar.

    - `ds`: the `xarray.Dataset` of `jsmkt.sweep`.
    - `x`, `y`: the grid axes on the horizontal and vertical axes (`"lam"`, `"service.scv"`); each cell is centred
      on its grid point.
    - `z`: what is coloured, named as `plot_sweep`'s `y` (a metric, a percentile such as `"sojourn_p99"`, a
      derivative `"mean_sojourn_time_grad_lam"`).
    - `ax`: the axes drawn on (default: `matplotlib.pyplot.gca()`); the colour bar is added beside it.
    - `log`: a logarithmic colour scale.
    - `sel`: a value for each other grid axis of more than one value, as in `plot_sweep`.

    Failed points (NaN) are left blank.

    **Returns:** `ax`.
    """
    da, label, title = _sweep_select(ds, z, (y, x), sel, hue="", arg="z")
    return _draw_sweep_heatmap(ax, ds, da, x, y, label, title, log)


def _draw_sweep_heatmap(ax, ds, da, x: str, y: str, label: str, title: str, log: bool):
    from matplotlib.colors import LogNorm

    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.gca()
    xs, ys = np.asarray(da[x].values), np.asarray(da[y].values)
    ox, oy = np.argsort(xs, kind="stable"), np.argsort(ys, kind="stable")
    values = np.ma.masked_invalid(np.asarray(da.values, dtype=float)[np.ix_(oy, ox)])
    if log:
        values = np.ma.masked_less_equal(values, 0.0)
    mesh = ax.pcolormesh(xs[ox].astype(float), ys[oy].astype(float), values, shading="nearest",
                         norm=LogNorm() if log and values.count() else None)
    ax.figure.colorbar(mesh, ax=ax, label=label)
    _sweep_ticks(ax, "x", xs)
    _sweep_ticks(ax, "y", ys)
    ax.set_xlabel(_sweep_label(ds, x))
    ax.set_ylabel(_sweep_label(ds, y))
    if title:
        ax.set_title(title, fontsize=9)
    return ax
