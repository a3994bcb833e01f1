"""`jsmkt transient`: the mean-field ODE integrated from empty servers, at the K of the fixed point it tends to
(`solving.fixed_point`), with Diffrax's progress on stderr."""

import functools
import json
import math
import sys
from typing import Any

from .output import _describe, _trim
from .plots import _check_plot_path, _fit_title, _save_figure
from .solving import _grown_by, fixed_point
from .spec import SpecError, _build, _parse, family_of


_TRANSIENT_LEVELS = 4  # the tails s_1..s_4 over time in the table and the plot


@functools.cache
def _transient_values():
    """`(model, ys, fp) ->` the tails and E[Q] at each saved time, their distance to the fixed point (the largest
    |s_k(t) - s_k*|), and the fixed point's, as one compiled function."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import jsmkt

    def values(model, ys, fp):
        tails = jax.vmap(lambda y: jsmkt.tails(model, y))(ys)
        star = jsmkt.tails(model, fp)
        return {"tails": tails, "mean_queue_length": jax.vmap(lambda y: jsmkt.mean_queue_length(model, y))(ys),
                "distance": jnp.max(jnp.abs(tails - star[None, :]), axis=1), "tail_star": star,
                "mean_queue_length_star": jsmkt.mean_queue_length(model, fp)}

    return eqx.filter_jit(values)


def _cmd_transient(args) -> int:
    parsed = _parse(args)
    if not (args.time > 0 and math.isfinite(args.time)):
        raise SpecError(f"--time={args.time} must be a positive finite time")
    if args.points < 2:
        raise SpecError(f"--points={args.points} must be >= 2 (the times 0 and --time at least)")
    if args.max_steps < 1:
        raise SpecError(f"--max-steps={args.max_steps} must be >= 1")
    if args.plot:
        _check_plot_path(args.plot)
    model = _build(parsed, args)
    import numpy as np

    import jsmkt

    # The fixed point first: its K (grown when the spec gives none) is deep enough for the whole transient, which
    # starts from empty servers and rises towards it.
    fp = fixed_point(model, _grown_by(args, parsed.K_given))
    model = fp.model
    ts = np.linspace(0.0, args.time, args.points)
    traj = _integrate_with_progress(model, ts, args)
    values = {k: np.asarray(v) for k, v in _transient_values()(model, traj.ys, fp).items()}
    for k in ("tails", "tail_star"):  # probabilities, clipped at 0 as `jsmkt solve` prints them
        values[k] = np.maximum(values[k], 0.0)
    n = len(_trim(values["tail_star"]))
    out = {
        "variant": "transient",
        "model": type(model).__name__,
        "lam": float(model.arrival_rate),
        **family_of(model).parameters(model),
        "K": model.K,
        "time": float(args.time),
        "start": "empty",
        "times": [float(t) for t in ts],
        "mean_queue_length": [float(v) for v in values["mean_queue_length"]],
        "tails": [[float(v) for v in row[:n]] for row in values["tails"]],
        "distance_to_fixed_point": [float(v) for v in values["distance"]],
        "fixed_point": {"mean_queue_length": float(values["mean_queue_length_star"]),
                        "tail": [float(v) for v in values["tail_star"][:n]]},
    }
    if args.plot:
        from ..plotting import model_title

        _plot_transient(out, args.plot, model_title(model, "transient from empty servers"),
                        family_of(model).level, args.format == "json")
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_transient(out, "jsmkt transient: from empty servers to t = " + f"{args.time:g}\n" + _describe(model),
                         family_of(model).level)
    return 0


_ODE_SOLVERS = ("kvaerno5", "tsit5")
_TRANSIENT_MAX_STEPS = 100_000  # `jsmkt.integrate`'s default


class _ProgressLines:
    """The stream Diffrax's `TextProgressMeter` prints to (lines such as `12.00%`, on stdout), redirected: each line
    goes to stderr as `jsmkt: transient: 12.00% of t = T`, rewritten in place on a terminal."""

    def __init__(self, time: float):
        self.time, self.tty, self.pending, self.shown = time, sys.stderr.isatty(), "", False

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in filter(None, map(str.strip, lines)):
            msg = f"jsmkt: transient: {line} of t = {self.time:g}"
            sys.stderr.write("\r" + msg if self.tty else msg + "\n")
            sys.stderr.flush()
            self.shown = True
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\n")


def _integrate_with_progress(model, ts, args):
    """`jsmkt.integrate` from empty servers to `--time`, saved at `ts`, with `--solver` and `--max-steps`; the
    progress (Diffrax's `TextProgressMeter`, the fraction of [0, T] done) on stderr when stderr is a terminal and the
    output a table, or with `--progress`. A run that stops at `--max-steps` is a `RuntimeError` that names it."""
    import contextlib

    import diffrax as dfx

    import jsmkt

    show = args.format == "table" and sys.stderr.isatty() or args.progress
    lines = _ProgressLines(args.time) if show else None
    meter = dfx.TextProgressMeter(minimum_increase=0.01 if sys.stderr.isatty() else 0.1) if show else None
    try:
        with contextlib.redirect_stdout(lines) if show else contextlib.nullcontext():
            traj = jsmkt.integrate(model, args.time, ts=ts, solver=_ode_solver(args.solver), max_steps=args.max_steps,
                                   throw=False, progress_meter=meter)
            ok = bool(traj.result == jsmkt.RESULTS.successful)  # waits for the solve (and its progress lines)
    finally:
        if lines is not None:
            lines.close()
    if not ok:
        if int(traj.stats["num_steps"]) >= args.max_steps:
            raise RuntimeError(
                f"the ODE solver took --max-steps={args.max_steps} steps without reaching t = {args.time:g} (a stiff "
                f"model, e.g. service phases of very different rates, takes many small steps); raise --max-steps, "
                "or ask for a shorter --time")
        raise RuntimeError(f"jsmkt.integrate: {jsmkt.RESULTS[traj.result]} (t1={args.time:g})")
    return traj


def _ode_solver(name: str):
    """`--solver`: Diffrax's Kvaerno5 (implicit, L-stable: `jsmkt.integrate`'s default, for stiff fast PH phases)
    or Tsit5 (explicit: no Jacobian to build or factor, quicker to compile and per step when the rates are of one
    scale)."""
    import diffrax as dfx

    return {"kvaerno5": dfx.Kvaerno5, "tsit5": dfx.Tsit5}[name]()


def _print_transient(out: dict[str, Any], header: str, level: str) -> None:
    print(header)
    levels = range(1, min(_TRANSIENT_LEVELS, len(out["fixed_point"]["tail"]) - 1) + 1)
    print(f"  {'t':>10}  {'E[Q](t)':>12}" + "".join(f"  {f's_{k}(t)':>12}" for k in levels)
          + f"  {'max_k |s_k(t) - s_k*|':>22}")
    for i, t in enumerate(out["times"]):
        row = out["tails"][i]
        print(f"  {t:>10.4g}  {out['mean_queue_length'][i]:>12.6g}" + "".join(f"  {row[k]:>12.6g}" for k in levels)
              + f"  {out['distance_to_fixed_point'][i]:>22.3e}")
    star = out["fixed_point"]
    print(f"  {'fixed pt':>10}  {star['mean_queue_length']:>12.6g}"
          + "".join(f"  {star['tail'][k]:>12.6g}" for k in levels))
    print(f"  (s_k(t) = P({level} >= k) at time t; E[Q] counts the jobs at a server)")


def _plot_transient(out: dict[str, Any], path: str, title: str, level: str, json_output: bool = False) -> None:
    import numpy as np

    from ..plotting import plot_trajectory

    def draw(fig):
        left, right = fig.subplots(1, 2)
        tails = np.asarray(out["tails"])
        levels = list(range(1, min(_TRANSIENT_LEVELS, tails.shape[1] - 1) + 1))
        plot_trajectory(left, out["times"], tails, levels=levels)
        for k, line in zip(levels, left.lines, strict=True):
            left.axhline(out["fixed_point"]["tail"][k], color=line.get_color(), linestyle=":", linewidth=1)
        left.set_ylabel(f"$s_k(t) = P({level} \\geq k)$ (dotted: fixed point)")
        dist = np.asarray(out["distance_to_fixed_point"])
        keep = dist > 0
        right.semilogy(np.asarray(out["times"])[keep], dist[keep], color="k")
        right.set_xlabel("time")
        right.set_ylabel(r"distance to the fixed point, $\max_k |s_k(t) - s_k^*|$")
        for ax in (left, right):  # the times integrated, without margins
            ax.set_xlim(out["times"][0], out["times"][-1])
        fig.suptitle(_fit_title(title, 10), fontsize=9)

    _save_figure(draw, path, figsize=(10, 4), json_output=json_output)


