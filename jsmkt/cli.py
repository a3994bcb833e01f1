"""`jsmkt` console script: a thin shell over the public API.

```
jsmkt solve SPEC.toml [--format table|json] [--plot FILE] [--as-published] [--auto-K] [--servers N]
jsmkt simulate SPEC.toml --servers N --time T [--warmup W] [--replications R] [--seed S] [--format table|json]
               [--max-queue Q] [--cpu-devices K] [--progress]
jsmkt sensitivity SPEC.toml [--wrt lam,theta] [--metric NAME] [--format table|json] [--plot FILE]
```
Bad specifications give one error line on stderr and exit code 2.
"""

import argparse
import json
import logging
import math
import os
import re
import sys
import warnings
from typing import Any

import numpy as np

from ._choice import choice_support
from ._spec import SpecError, describe_model, family_of, load_spec, model_from_spec, simulation_from_spec


_SEED_RANGE = (-(2**63), 2**63 - 1)  # what jax.random.PRNGKey accepts
_SIMULATE_OPTION_NAMES = {
    "max_queue": "--max-queue", "n_replications": "--replications", "n_servers": "--servers", "t1": "--time",
    "warmup": "--warmup",
}
_SIMULATE_OPTIONS = re.compile(r"(?<![\w-])(" + "|".join(_SIMULATE_OPTION_NAMES) + r")\b")


_REFINED_SLOW = 1000  # reduced-state size above which `solve --servers` says that the refinement takes a while


def _whole_float_d(model) -> int | None:
    """The integer a randomised choice number equals, e.g. 2 for `d = 2.0` (a TOML float, which the spec reads as a
    randomised d); None otherwise."""
    from ._choice import InterpolatedChoice

    d = model.choice.number
    return int(d) if isinstance(model.choice, InterpolatedChoice) and float(d).is_integer() else None


def _describe(model, simulated: dict[str, Any] | None = None) -> str:
    """The model's parameters and service in two lines (`_spec.describe_model`); `simulated` (from
    `_simulated_service`) names the service that `jsmkt simulate` runs instead of the model's."""
    base, service = describe_model(model).split("\n", 1)
    if (whole := _whole_float_d(model)) is not None:
        base = base.replace(" (randomised, E[D])", f" (randomised, E[D]) (from a TOML float: write d = {whole} for a "
                            "fixed choice number)")
    if simulated is not None:
        order = f", PH of order {simulated['order']}" if "order" in simulated else ""
        return (base + f"\nservice (simulated, from {simulated['source']}): {simulated['kind']}{order}, mean "
                f"{simulated['mean']:.6g}, SCV {simulated['scv']:.6g}")
    return base + "\n" + service


def _simulated_service(spec: dict[str, Any], model, service) -> dict[str, Any]:
    """The service law `jsmkt simulate` runs: the spec's `[simulation.service]` when given, else the model's."""
    from ._models.jsqd_ph import JSQdPH

    if service is not None:
        out = {"kind": spec["simulation"]["service"]["kind"], "source": "[simulation.service]"}
    elif isinstance(model, JSQdPH) or "service" in spec:
        out = {"kind": spec["service"].get("kind", "ph"), "source": "[service]"}
        service = model.service
    elif hasattr(model, "service"):
        return {"kind": "exponential", "source": "mu", "mean": float(model.service.mean), "scv": 1.0}
    else:
        return {"kind": "exponential", "source": "mu", "mean": 1.0 / float(model.mu), "scv": 1.0}
    out["mean"], out["scv"] = float(service.mean), float(service.scv)
    if hasattr(service, "order"):
        out["order"] = int(service.order)
    return out


def _trim(tails: np.ndarray, floor: float = 1e-300) -> list[float]:
    """Tails from k = 0 up to the last entry above `floor` (the rest is 0 to float64 precision)."""
    keep = np.nonzero(tails > floor)[0]
    n = int(keep[-1]) + 1 if len(keep) else 1
    return [float(x) for x in tails[:n]]


def _solver_default(name: str):
    """The default of `solve_fixed_point`'s argument `name` (the CLI solves with the defaults)."""
    import inspect

    from ._fixed_point import solve_fixed_point

    return inspect.signature(solve_fixed_point).parameters[name].default


def _auto_max_K(K: int) -> int:
    """The largest K that `--auto-K` (and the search for a K to suggest) tries: the solver's `max_K`, or 16 times
    the spec's K when that is larger (a default K near saturation can exceed `max_K` already)."""
    return max(_solver_default("max_K"), 16 * K)


def _too_small(K: int, found: str, suggest: int | None, auto_K: bool, max_K: int) -> SpecError:
    """The error for a truncation level `K` that is too small; `suggest` is a larger K that works (None: none up to
    `max_K` does; 0: not known)."""
    if suggest is None:
        advice = (f"--auto-K stopped at K={max_K}: " if auto_K else "") + \
            f"K would need to exceed {max_K} for this model (lower the load or the service SCV)"
    elif suggest == 0:
        advice = "raise K in the spec or pass --auto-K"
    else:
        advice = f"raise K in the spec (e.g. K={suggest}) or pass --auto-K"
    return SpecError(f"K={K} is too small: {found}; {advice}")


def _solve_exact(
    model, auto_K: bool, servers: int | None = None, sampling: str = "with_replacement"
) -> tuple[dict[str, Any], Any]:
    import jsmkt

    try:
        fp = jsmkt.solve_fixed_point(model, auto_K=auto_K, max_K=_auto_max_K(model.K))
    except jsmkt.TruncationError as e:
        found = f"the fraction of servers with K jobs is {e.tail_mass:.3g} > tail_tol={e.tail_tol:.3g}"
        enough = None
        if not e.auto_K:  # suggest the K that --auto-K reaches (doubling K may not be enough)
            try:
                enough = jsmkt.solve_fixed_point(model, auto_K=True, max_K=_auto_max_K(model.K)).model.K
            except jsmkt.TruncationError:
                pass
            except (ValueError, RuntimeError):  # e.g. too large to solve: no K to suggest
                enough = 0
        raise _too_small(e.K, found, enough, e.auto_K, _auto_max_K(model.K)) from None
    model = fp.model
    s = np.asarray(jsmkt.tails(model, fp))
    out = {
        "variant": "exact",
        "model": type(model).__name__,
        "lam": float(model.arrival_rate),
        **family_of(model).parameters(model),
        "K": model.K,
        "load": float(model.load()),
        "mean_queue_length": float(jsmkt.mean_queue_length(model, fp)),
        "mean_sojourn_time": float(jsmkt.mean_sojourn_time(model, fp)),
        "mean_waiting_time": float(jsmkt.mean_waiting_time(model, fp)),
        "prob_wait": float(jsmkt.prob_wait(model, fp)),
        "utilisation": float(jsmkt.utilisation(model, fp)),
        **(family_of(model).metrics(model, fp) if family_of(model).metrics else {}),
        "tail": _trim(s),
        "tail_mass_at_K": float(fp.tail_mass),
        "newton_steps": int(fp.stats["num_steps"]),
        "residual": float(fp.residual),
    }
    if hasattr(model, "phase_tails"):
        P = np.asarray(jsmkt.phase_tails(model, fp))
        out["phase_tails"] = [[float(v) for v in row] for row in P[: max(len(out["tail"]) - 1, 0)]]
    if servers is not None:
        out["refined"] = _refined(model, fp, servers, len(out["tail"]), sampling)
    return out, model


def _refined(model, fp, n: int, n_tail: int, sampling: str) -> dict[str, Any]:
    """The 1/N-refined mean field with `n` servers (expected values to order 1/N)."""
    import jsmkt
    from ._refined import _with_sampling_eps

    size = int(np.size(fp.value))
    if size > _REFINED_SLOW:
        print(f"jsmkt: note: --servers: the refined mean field solves dense {size} x {size} systems (time O(n^3), "
              "about a minute at n = 2000 on 2 cores)", file=sys.stderr)
    rmf = jsmkt.refined_mean_field(fp, sampling)
    # P(all sampled servers busy) with N servers: E[s_1^D] with replacement, E[prod_{i<D} (s_1 - i/N)/(1 - i/N)]
    # without (`prob_wait` of the model whose choice samples without replacement from N).
    wait_model = model if sampling == "with_replacement" else _with_sampling_eps(model, np.float64(1.0 / n))
    y = rmf.state(n)
    s = np.asarray(jsmkt.tails(model, y))
    # Every list is indexed by k from 0, like `tail`; s_0 = 1 exactly (correction and spread 0).
    v = np.array(jsmkt.tails(model, rmf.correction))[:n_tail]  # 1/N coefficients (tails are linear)
    v[0] = 0.0
    s_mf = np.asarray(jsmkt.tails(model, fp))[:n_tail]
    EQ = float(jsmkt.mean_queue_length(model, y))
    out = {
        "n_servers": n,
        "sampling": sampling,
        "mean_queue_length": EQ,
        "mean_sojourn_time": EQ / float(model.arrival_rate),
        "prob_wait": float(rmf.expectation(lambda y: jsmkt.prob_wait(wait_model, y), n)),
        "utilisation": float(jsmkt.utilisation(model, y)),
        "tail": [float(x) for x in s[:n_tail]],
        "tail_correction": [float(x) for x in v],
        "tail_std": [0.0] + [float(x) for x in rmf.std(lambda y: jsmkt.tails(model, y)[1:n_tail], n)],
        # A relative correction beyond 30 % means N is too small for the expansion at this k. It is judged where the
        # level carries mass (N s_k >= 1: at least one server expected there); deeper levels, whose tails fall far
        # below 1/N, always fail it and say nothing about N.
        "tail_in_range": [bool(x) for x in np.abs(v) / n <= 0.3 * s_mf],
    }
    judged = [k for k in range(1, n_tail) if n * s_mf[k] >= 1.0]
    out["out_of_range_levels"] = [k for k in judged if not out["tail_in_range"][k]]
    out["in_range"] = not _outside_unit_interval(out) and not out["out_of_range_levels"]
    return out


def _outside_unit_interval(r: dict[str, Any]) -> list[str]:
    """The refined probabilities (P(arrival waits), s_k for k >= 1) outside [0, 1], as `name = value`."""
    values = [("P(arrival waits)", r["prob_wait"])] + [(f"s_{k}", s) for k, s in enumerate(r["tail"]) if k > 0]
    return [f"{name} = {v:.4g}" for name, v in values if not 0.0 <= v <= 1.0]


def _published_tails(model, K: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The published s_0..s_K and, for PH service, the phase tails pi_1..pi_K."""
    import jsmkt
    from ._models.jsqd_ph import JSQdPH

    pub = jsmkt.published
    if isinstance(model, JSQdPH):
        pi = np.asarray(pub.ph_fixed_point(model.lam, model.service, model.choice.d, K))
        return np.concatenate([[1.0], pi.sum(1)]), pi
    return np.asarray(pub.exponential_tails(model.lam, model.choice.d, model.mu, K)), None


def _published_K(model, auto_K: bool) -> int:
    """The spec's K, or with `auto_K` K doubled until the published s_K is at most the exact solver's `tail_tol`
    (up to its `max_K`); a `SpecError` like the exact solver's when K is too small."""
    tol, max_K = _solver_default("tail_tol"), _auto_max_K(model.K)
    K = enough = model.K
    while (tail := float(_published_tails(model, enough)[0][-1])) > tol and enough < max_K:
        enough = min(2 * enough, max_K)
    if tail <= tol and (auto_K or enough == K):
        return enough
    found = f"the published s_K is {float(_published_tails(model, K)[0][-1]):.3g} > tail_tol={tol:.3g}"
    raise _too_small(K, found, enough if tail <= tol else None, auto_K, max_K)


def _solve_published(model, auto_K: bool = False) -> tuple[dict[str, Any], Any]:
    import jsmkt
    from ._choice import FixedChoice
    from ._models.jsqd_ph import JSQdPH

    pub = jsmkt.published
    if not isinstance(model.choice, FixedChoice):
        whole = _whole_float_d(model)
        hint = (f"; d = {float(whole):g} is a TOML float, which the spec reads as a randomised d: write d = {whole}"
                if whole is not None else "")
        raise SpecError(f"--as-published needs an integer d (the published formulas have no randomised d){hint}")
    d = model.choice.d
    K = _published_K(model, auto_K)
    if K != model.K:
        model = model.with_K(K)
    s, pi = _published_tails(model, model.K)
    if isinstance(model, JSQdPH):
        ET = float(pub.ph_sojourn_time(model.lam, model.service, d))
        res = pub.ph_fixed_point_residuals(model.lam, model.service, d, model.K)
        source = "Li & Lui closed form (Theorem 1) and sojourn time (Section 3)"
        EQ = float(np.sum(s[1:]))
        extra = {"residual_in_published_equations": float(res["published"]),
                 "residual_in_exact_equations": float(res["exact"]),
                 "phase_tails": [[float(v) for v in row] for row in pi[: len(_trim(s)) - 1]],
                 "note": (f"E[T] is the paper's Section 3 formula and E[Q] the sum of its tails; they need not obey "
                          f"Little's law (here lam E[T] = {float(model.lam) * ET:.6g}, E[Q] = {EQ:.6g})")}
    else:
        ET = float(pub.exponential_sojourn_time(model.lam, d, model.mu))
        source = "rho^((d^k-1)/(d-1)) and Mitzenmacher's E[T]"
        extra = {}
    return {
        "variant": "as-published",
        "source": source,
        "model": type(model).__name__,
        "lam": float(model.lam),
        "d": float(d),
        "K": model.K,
        "load": float(model.load()),
        "mean_queue_length": float(np.sum(s[1:])),
        "mean_sojourn_time": ET,
        "prob_wait": float(s[1] ** d),
        "utilisation": float(s[1]),
        "tail": _trim(s),
        "tail_mass_at_K": float(s[-1]),
        **extra,
    }, model


def _print_table(out: dict[str, Any], header: str, level: str = "Q", utilisation: str = "utilisation s_1") -> None:
    print(header)
    rows = [
        ("mean queue length E[Q]", "mean_queue_length"),
        ("mean sojourn time E[T]", "mean_sojourn_time"),
        ("  95% CI half-width", "mean_sojourn_time_ci"),
        ("mean waiting time E[W]", "mean_waiting_time"),
        ("mean orbit size", "mean_orbit_size"),
        ("P(primary blocked)", "prob_blocked"),
        ("P(retrial succeeds)", "prob_retrial_success"),
        ("E[T], tagged customer", "mean_sojourn_time_tagged"),
        ("availability", "availability"),
        ("jobs at failed servers", "customers_at_failed_servers"),
        ("repairmen utilisation", "repairmen_utilisation"),
        ("failed servers waiting", "fraction_failed_waiting"),
        ("P(arrival waits)", "prob_wait"),
        ("utilisation s_1", "utilisation"),
        ("tail mass at K", "tail_mass_at_K"),
        ("residual (published eqs)", "residual_in_published_equations"),
        ("residual (exact eqs)", "residual_in_exact_equations"),
        ("events simulated", "events"),
    ]
    rows = [(utilisation, k) if k == "utilisation" else (label, k) for label, k in rows]
    for label, key in rows:
        if key in out:
            v = out[key]
            print(f"  {label:<26} {v:.10g}" if isinstance(v, float) else f"  {label:<26} {v}")
    if "note" in out:
        print(f"  note: {out['note']}")
    if out.get("sojourn_time_percentiles"):
        p = out["sojourn_time_percentiles"]
        print("  sojourn time percentiles   " + "  ".join(f"{k}={v:.4g}" for k, v in p.items()))
    tail = out["tail"]
    ci = out.get("tail_ci")
    print()
    q = level
    print(f"   k   s_k = P({q} >= k){' ' * (8 - len(q))}P({q} = k)" + ("             95% CI" if ci else ""))
    for k, sk in enumerate(tail):
        if k > 0 and sk < 1e-16:
            print(f"  ... (s_k < 1e-16 from k = {k}; see --format json)")
            break
        nxt = tail[k + 1] if k + 1 < len(tail) else 0.0
        line = f"  {k:>2}   {sk:<20.12e}  {sk - nxt:<18.10e}"
        if ci and k < len(ci):
            line += f"  ±{ci[k]:.2e}"
        print(line)


def _plot_types(types: dict[str, str]) -> dict[str, str]:
    """Matplotlib's file types less those it cannot write here: .pgf needs a LaTeX engine (xelatex by default)."""
    import shutil

    return {t: v for t, v in types.items() if t != "pgf" or shutil.which("xelatex")}


def _check_plot_path(path: str) -> None:
    """Refuse a --plot FILE that cannot be written, before solving."""
    from matplotlib.figure import Figure

    types = _plot_types(Figure().canvas.get_supported_filetypes())
    ext = os.path.splitext(path)[1][1:].lower()
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise SpecError(f"--plot={path} is a directory; give a file name, e.g. "
                        f"--plot={os.path.join(path, 'tails.png')}")
    if ext not in types:
        what = f": file type .{ext} is not supported" if ext else " has no file extension"
        raise SpecError(f"--plot={path}{what}; end the name with one of {', '.join('.' + t for t in sorted(types))}")
    if not os.path.isdir(folder):
        raise SpecError(f"--plot={path}: directory {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"--plot={path}: directory {folder} is not writable")


def _plot(out: dict[str, Any], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import plot_phase_tails, plot_tails

    fig, ax = plt.subplots(figsize=(6, 4))
    plot_tails(ax, out["tail"], label=f"$s_k$ ({out['variant']})", color="k")
    if out.get("phase_tails"):
        plot_phase_tails(ax, out["phase_tails"])
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    # Matplotlib's warnings and log messages (e.g. "The PostScript backend does not support transparency") are
    # printed as one line each, in the CLI's format.
    log, records = logging.getLogger("matplotlib"), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.savefig(path)
    except OSError as e:
        raise SpecError(f"--plot={path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        log.removeHandler(handler)
        plt.close(fig)
    for text in [str(w.message) for w in caught] + [r.getMessage() for r in records]:
        print(f"jsmkt: warning: --plot={path}: {text.strip().splitlines()[0]}", file=sys.stderr)


def _print_refined(r: dict[str, Any]) -> None:
    n = r["n_servers"]
    print(f"\nrefined mean field, N = {n} servers, sampling {r['sampling'].replace('_', ' ')} (expected values to "
          "order 1/N; sd = spread of the occupancy)")
    print(f"  {'mean queue length E[Q]':<26} {r['mean_queue_length']:.10g}")
    print(f"  {'mean sojourn time E[T]':<26} {r['mean_sojourn_time']:.10g}")
    print(f"  {'P(arrival waits)':<26} {r['prob_wait']:.10g}")
    print()
    print("   k   s_k (N servers)       1/N coefficient     sd of s_k")
    flagged = False
    for k in range(1, len(r["tail"])):
        if r["tail"][k] < 1e-16:
            break
        mark = "" if r["tail_in_range"][k] else "  !"
        flagged |= bool(mark)
        print(f"  {k:>2}   {r['tail'][k]:<20.12e}  {r['tail_correction'][k]:<+18.10e}  "
              f"{r['tail_std'][k]:.3e}{mark}")
    if flagged:
        print("  ! the 1/N term exceeds 30% of the mean-field s_k: beyond the range of the expansion (N too small "
              "for this k)")


def _check_servers(model, n: int, sampling: str) -> None:
    """`--servers N` must be >= 1, and at least the largest choice number when sampling without replacement."""
    if n < 1:
        raise SpecError(f"--servers={n} must be >= 1")
    max_d = max((choice_support(np.asarray(disp.choice.weights())) or (1, 1))[1]
                for disp in model.description().dispatches)
    if sampling == "without_replacement" and max_d > n:
        raise SpecError(f"d={max_d} exceeds --servers={n}: cannot sample {max_d} distinct servers without "
                        'replacement ([simulation] sampling = "without_replacement")')


def _cmd_solve(args) -> int:
    spec = load_spec(args.spec)
    model = model_from_spec(spec, where=args.spec)
    sampling = simulation_from_spec(spec, where=args.spec).get("sampling", "with_replacement")  # as simulate samples
    if args.servers is not None:
        if args.as_published:
            raise SpecError("--servers (refined mean field) applies to the exact mean field, not --as-published")
        _check_servers(model, args.servers, sampling)
    if args.plot:
        _check_plot_path(args.plot)
    if args.as_published and not family_of(model).published:
        raise SpecError(f"--as-published: model = {family_of(model).name!r} has no published form in jsmkt; solve it "
                        "without --as-published (the exact mean field)")
    out, model = (_solve_published(model, args.auto_K) if args.as_published
                  else _solve_exact(model, args.auto_K, args.servers, sampling))
    if args.plot:  # before printing, so that a plot that cannot be written leaves no results behind
        _plot(out, args.plot, f"{_describe(model).splitlines()[0]} ({out['variant']})")
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        title = "jsmkt solve: " + ("as published" if args.as_published else "exact mean field")
        _print_table(out, title + "\n" + _describe(model), family_of(model).level, family_of(model).utilisation)
        if "refined" in out:
            _print_refined(out["refined"])
    if "refined" in out and (outside := _outside_unit_interval(out["refined"])):
        shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
        print(f"jsmkt: note: N={args.servers} servers is too small for the 1/N expansion: {shown} fall outside "
              '[0, 1] (refined "in_range" is false)', file=sys.stderr)
    return 0


def _use_cpu_devices(requested: int | None) -> None:
    """Expose the CPU's cores as `requested` JAX devices (default: all cores), so that `simulate` runs
    replications on them in parallel."""
    from ._config import max_cpu_devices, too_many_cpu_devices, use_cpu_cores

    if requested is not None and requested < 1:
        raise SpecError(f"--cpu-devices={requested} must be >= 1")
    if requested is not None and requested > max_cpu_devices():
        raise SpecError(f"--cpu-devices={requested} exceeds {too_many_cpu_devices()}")
    if not use_cpu_cores(requested) and requested is not None:
        print(f"jsmkt: note: --cpu-devices={requested} ignored, JAX's devices were already set up", file=sys.stderr)


def _cmd_simulate(args) -> int:
    _use_cpu_devices(args.cpu_devices)
    import jax.random as jr

    import jsmkt

    spec = load_spec(args.spec)
    model = model_from_spec(spec, where=args.spec)
    kwargs = simulation_from_spec(spec, where=args.spec)
    _check_servers(model, args.servers, kwargs.get("sampling", "with_replacement"))
    if not (args.time > 0 and math.isfinite(args.time)):
        raise SpecError(f"--time={args.time} must be a positive finite time")
    if args.warmup is not None and not (math.isfinite(args.warmup) and 0 <= args.warmup < args.time):
        raise SpecError(f"--warmup={args.warmup} must be finite, >= 0 and less than --time={args.time}")
    if args.replications < 1:
        raise SpecError(f"--replications={args.replications} must be >= 1")
    if not _SEED_RANGE[0] <= args.seed <= _SEED_RANGE[1]:
        raise SpecError(f"--seed={args.seed} is out of range: give an integer from {_SEED_RANGE[0]} to "
                        f"{_SEED_RANGE[1]}")
    if args.max_queue is not None and args.max_queue < 1:
        raise SpecError(f"--max-queue={args.max_queue} must be >= 1")
    options = lambda text: _SIMULATE_OPTIONS.sub(lambda m: _SIMULATE_OPTION_NAMES[m.group(1)], text)  # noqa: E731
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = jsmkt.simulate(
                model, args.servers, args.time, key=jr.PRNGKey(args.seed), n_replications=args.replications,
                warmup=args.warmup, max_queue=args.max_queue,
                progress=args.format == "table" and sys.stderr.isatty() or args.progress, **kwargs,
            )
    except ValueError as e:  # name simulate's arguments by their options
        raise SpecError(options(str(e))) from None
    for w in caught:  # one line each, in the options' names
        print(f"jsmkt: warning: {options(str(w.message))}", file=sys.stderr)
    service = _simulated_service(spec, model, kwargs.get("service"))
    out = res.to_dict()
    out = {"variant": "simulation", "model": type(model).__name__, "service": service, **out}
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_table(out, f"jsmkt simulate: N = {args.servers} servers, t = {args.time:g}, "
                          f"{args.replications} replication(s)\n" + _describe(model, service),
                     family_of(model).level, family_of(model).utilisation)
    return 0


_SERVICE_PARAMETRISATIONS = {"h2": "hyperexponential2", "coxian2": "coxian2"}  # [service] kinds with an scv key


def _service_parametrisation(spec: dict[str, Any]):
    """The two-moment constructor of the spec's `[service]` (its kind has `mean` and `scv` keys), else `None`."""
    import jsmkt

    service = spec.get("service")
    kind = service.get("kind") if isinstance(service, dict) else None
    return getattr(jsmkt, _SERVICE_PARAMETRISATIONS[kind]) if kind in _SERVICE_PARAMETRISATIONS else None


def _plot_elasticities(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.8 + 0.35 * len(rows)))
    names = [r["name"] for r in rows][::-1]
    ax.barh(names, [r["elasticity"] for r in rows][::-1], color="0.35")
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel("elasticity (theta / M) dM/dtheta")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as e:
        raise SpecError(f"--plot={path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)


def _cmd_sensitivity(args) -> int:
    import jsmkt

    spec = load_spec(args.spec)
    model = model_from_spec(spec, where=args.spec)
    wrt = None
    if args.wrt is not None:
        wrt = [w.strip() for w in args.wrt.split(",")]
        if not all(wrt):
            raise SpecError(f"--wrt={args.wrt!r}: give parameter names separated by commas, e.g. --wrt lam,theta")
    if args.plot:
        _check_plot_path(args.plot)
    service = _service_parametrisation(spec)
    if service is None and wrt is not None and "scv" in wrt and hasattr(model, "service"):
        raise SpecError(f"--wrt scv: the [service] of {args.spec} has no scv key; derivatives with respect to the "
                        f"SCV need kind = {' or '.join(map(repr, _SERVICE_PARAMETRISATIONS))} (the parametrisation "
                        "they are taken through)")
    s = jsmkt.sensitivity(model, args.metric, wrt, service=service)
    rows = s.rows()
    if args.plot:
        _plot_elasticities(rows, args.plot, f"{family_of(model).describe(model)}\nelasticities of {s.metric}")
    if args.format == "json":
        out = {"variant": "sensitivity", "model": type(model).__name__, **family_of(model).parameters(model),
               "K": model.K, **s.to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    print(f"jsmkt sensitivity: derivatives of {s.metric} at the mean-field fixed point")
    print(_describe(model))
    print(f"  {s.metric} = {float(s.value):.10g}")
    print()
    width = max(12, max(len(r["name"]) for r in rows) + 2)
    header = f"d {s.metric} / d parameter"
    dwidth = max(28, len(header) + 2)
    print(f"  {'parameter':<{width}} {'value':<16} {header:<{dwidth}} elasticity")
    for r in rows:
        side = f" ({r['one_sided']})" if r["one_sided"] else ""
        print(f"  {r['name']:<{width}} {r['value']:<16.10g} {format(r['derivative'], '.10g') + side:<{dwidth}} "
              f"{r['elasticity']:.6g}")
    if any(r["one_sided"] for r in rows):
        print("  (right)/(left): one-sided derivative, a choice number at an integer (the randomised rule is "
              "piecewise linear in d)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jsmkt", description="Mean-field solver and simulator for supermarket models.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("solve", help="solve the mean-field fixed point of a model spec (TOML)")
    s.add_argument("spec", help="TOML model specification (see examples/)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    s.add_argument("--plot", metavar="FILE", help="write a plot of the tails to FILE (png, pdf, svg)")
    s.add_argument("--as-published", action="store_true", help="use the papers' published closed forms")
    s.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    s.add_argument("--servers", type=int, default=None, metavar="N",
                   help="also give the refined mean field (1/N correction) for N servers")
    s.set_defaults(func=_cmd_solve)

    m = sub.add_parser("simulate", help="simulate the finite-N system of a model spec (TOML)")
    m.add_argument("spec", help="TOML model specification (see examples/); an optional [simulation] table sets "
                   "sampling and may replace the service")
    m.add_argument("--servers", type=int, required=True, help="number of servers N")
    m.add_argument("--time", type=float, required=True, help="simulated time per replication")
    m.add_argument("--warmup", type=float, default=None, help="discarded initial time (default 10%% of --time)")
    m.add_argument("--replications", type=int, default=1, metavar="R",
                   help="independent replications, run in parallel; 95%% CIs come from them when R >= 2, from batch "
                        "means of the single run otherwise (default: 1)")
    m.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    m.add_argument("--max-queue", type=int, default=None, metavar="Q",
                   help="largest queue a server may hold (default: chosen from the load, the SCV and N)")
    m.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    m.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    m.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                   help="on a CPU, run the replications on K cores in parallel (default: all cores)")
    m.set_defaults(func=_cmd_simulate)

    n = sub.add_parser("sensitivity", help="derivatives and elasticities of a metric at the fixed point of a model "
                       "spec (TOML) with respect to its parameters")
    n.add_argument("spec", help="TOML model specification (see examples/)")
    n.add_argument("--wrt", default=None, metavar="NAMES",
                   help="parameters, separated by commas (e.g. lam,theta; default: all of the model's)")
    n.add_argument("--metric", default="mean_sojourn_time",
                   help="the metric differentiated (default: mean_sojourn_time; e.g. mean_queue_length, prob_wait, "
                        "availability, mean_orbit_size, prob_blocked)")
    n.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    n.add_argument("--plot", metavar="FILE", help="write a bar chart of the elasticities to FILE (png, pdf, svg)")
    n.set_defaults(func=_cmd_sensitivity)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a write error surfaces here, not at exit
        return code
    except (SpecError, ValueError) as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: error: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: failed: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the output cannot be written (e.g. a full disk)
        print(f"jsmkt: failed: cannot write the output ({e.strerror or e})", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1


if __name__ == "__main__":
    sys.exit(main())
