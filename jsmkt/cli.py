"""`jsmkt` console script: a thin shell over the public API.

```
jsmkt solve SPEC.toml [--format table|json] [--plot FILE] [--as-published] [--auto-K] [--servers N]
            [--percentiles 50,90,99,99.9]
jsmkt transient SPEC.toml --time T [--points N] [--format table|json] [--plot FILE] [--auto-K] [--solver S]
                [--max-steps N] [--progress]
jsmkt simulate SPEC.toml --servers N --time T [--warmup W] [--replications R] [--seed S] [--format table|json]
               [--max-queue Q] [--cpu-devices K] [--progress] [--percentiles 50,90,99,99.9]
jsmkt sensitivity SPEC.toml [--wrt lam,theta] [--metric NAME] [--format table|json] [--plot FILE]
```
`--percentiles` also takes the percentiles separated by spaces (`--percentiles 50 90 99 SPEC.toml`: the first token
that is not a number ends the list). Printed numbers: the mean field's probabilities clipped at 0 (the solver's
rounding noise, far below the leading tails, has either sign); simulated estimates to the precision of their 95 %
interval (two significant digits of the half-width); derivatives as 0 below a relative threshold
(`_ZERO_DERIVATIVE`, stated by `jsmkt sensitivity --help`).
Every command also takes `--cache-dir DIR` and `--no-cache` (JAX's persistent compilation cache, `_cache_dir`), and
`--family FILE`: a Python file that registers a family written outside jsmkt (`jsmkt.register_family`), imported
before the spec is read.
Bad specifications give one error line on stderr and exit code 2; an interrupt (Ctrl-C) gives the line
`jsmkt: interrupted` and exit code 130 (128 + SIGINT), as shells report it.

JAX (about a second to import) is imported only once the spec and the options are checked (`_spec.parse_spec` reads
a spec without it), so that `--help` and those errors answer at once; its compilation cache then spares later runs
of the same model structure the compilations. The console script is `run`: `main`, then an exit without the
interpreter's teardown, which after importing JAX takes about half a second and only frees memory.
"""

import argparse
import functools
import json
import logging
import math
import os
import re
import sys
import warnings
from typing import Any

from ._spec import (
    SpecError,
    _load_and_service_dict,
    build_model,
    describe_model,
    family_of,
    load_family_file,
    load_spec,
    parse_simulation,
    parse_spec,
    simulation_from_spec,
)


_SEED_RANGE = (-(2**63), 2**63 - 1)  # what jax.random.PRNGKey accepts
_SIMULATE_OPTION_NAMES = {
    "max_queue": "--max-queue", "n_replications": "--replications", "n_servers": "--servers", "t1": "--time",
    "warmup": "--warmup",
}
_SIMULATE_OPTIONS = re.compile(r"(?<![\w-])(" + "|".join(_SIMULATE_OPTION_NAMES) + r")\b")


_REFINED_SLOW = 1000  # reduced-state size above which `solve --servers` says that the refinement takes a while


def _percentile_list(text: str) -> tuple[float, ...]:
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


def _is_number_list(token: str) -> bool:
    """Whether `token` is a number or a comma-separated list of numbers (`99`, `50,90`)."""
    try:
        [float(x) for x in token.split(",")]
    except ValueError:
        return False
    return True


def _join_percentiles(argv: list[str]) -> list[str]:
    """`argv` with the numbers after `--percentiles` (or an abbreviation argparse takes, `--perc`; or after
    `--percentiles=50`) joined with commas into its one value: `--percentiles 50 90 99 spec.toml` reads as
    `--percentiles 50,90,99 spec.toml`. The first token that is not a number ends the list (the spec path may
    follow it); `--` ends the options."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        out.append(token)
        i += 1
        if token == "--":
            return out + argv[i:]
        name, eq, value = token.partition("=")
        if len(name) < 4 or not "--percentiles".startswith(name):
            continue
        values = [value] if eq else []
        while i < len(argv) and _is_number_list(argv[i]):
            values.append(argv[i])
            i += 1
        if values:
            out[-1] = name
            out.append(",".join(values))
    return out


def _whole_float_d(model) -> int | None:
    """The integer a randomised choice number equals, e.g. 2 for `d = 2.0` (a TOML float, which the spec reads as a
    randomised d); None otherwise."""
    from ._choice import InterpolatedChoice

    choice = getattr(model, "choice", None)  # families with several choice numbers have none
    if not isinstance(choice, InterpolatedChoice):
        return None
    d = choice.number
    return int(d) if float(d).is_integer() else None


def _describe(model, simulated: dict[str, Any] | None = None, numbers: dict[str, float] | None = None) -> str:
    """The model's parameters and service in two lines (`_spec.describe_model`, with its `numbers` when they are
    known); `simulated` (from `_simulated_service`) names the service that `jsmkt simulate` runs instead of the
    model's."""
    base, service = describe_model(model, numbers).split("\n", 1)
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
    elif not hasattr(model, "mu"):  # a family registered at run time, without a service rate
        return {"kind": "the family's description", "source": "description", "mean": math.nan, "scv": math.nan}
    else:
        return {"kind": "exponential", "source": "mu", "mean": 1.0 / float(model.mu), "scv": 1.0}
    out["mean"], out["scv"] = float(service.mean), float(service.scv)
    if hasattr(service, "order"):
        out["order"] = int(service.order)
    return out


def _trim(tails, floor: float = 1e-300) -> list[float]:
    """Tails from k = 0 up to the last entry above `floor` (the rest is 0 to float64 precision)."""
    import numpy as np

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


def _too_small(K: int, found: str, suggest: int | None, grown_by: str | None, max_K: int) -> SpecError:
    """The error for a truncation level `K` that is too small; `suggest` is a larger K that works (None: none up to
    `max_K` does; 0: not known); `grown_by` says what grew K up to `max_K` (`--auto-K`, or the default K of a
    spec without one), None when K was not grown."""
    if suggest is None:
        advice = (f"{grown_by} stopped at K={max_K}: " if grown_by else "") + \
            f"K would need to exceed {max_K} for this model (lower the load or the service SCV)"
    elif suggest == 0:
        advice = "raise K in the spec or pass --auto-K"
    else:
        advice = f"raise K in the spec (e.g. K={suggest}) or pass --auto-K"
    return SpecError(f"K={K} is too small: {found}; {advice}")


def _grown_by(args, K_given: bool) -> str | None:
    """What grows K until the tail mass at K is negligible: `--auto-K`, or for a spec without K its default (a
    heuristic, which the solver's check may find too small); None when the spec's K stands."""
    return "--auto-K" if args.auto_K else None if K_given else "the default K"


def _fixed_point(model, grown_by: str | None):
    """`jsmkt.solve_fixed_point(model)`, K grown when `grown_by` says what grows it; a too small K is a `SpecError`
    that suggests the K that works."""
    import jsmkt

    auto_K = grown_by is not None
    try:
        return jsmkt.solve_fixed_point(model, auto_K=auto_K, max_K=_auto_max_K(model.K))
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
        raise _too_small(e.K, found, enough, grown_by if e.auto_K else None, _auto_max_K(model.K)) from None


def _solve_exact(
    model, grown_by: str | None, servers: int | None = None, sampling: str = "with_replacement", percentiles=None
) -> tuple[dict[str, Any], Any, dict[str, float] | None]:
    """`jsmkt solve`'s results of the exact mean field, the model at its final `K`, and the numbers of its
    description (`describe_model`) when they came with the results. With the cache on, and neither the refined mean
    field nor percentiles (the sojourn-time distribution checks its inputs with host callbacks, which `jax.export`
    cannot serialise), from the exported solve of `_exact_from_export` when it succeeds; otherwise (and after its
    failures, which then raise the usual errors) by `solve_fixed_point` and the compiled metrics."""
    import numpy as np

    # A family registered at run time (`--family`) is code outside jsmkt's, which the exported files' keys do not
    # cover: an edited family would load the results of its former code.
    exportable = servers is None and not percentiles and family_of(model).cls is None
    found = _exact_from_export(model, grown_by) if exportable else None
    described = None
    if found is not None:
        values, model = found
        described = {k: float(values.pop(f"described_{k}")) for k in _DESCRIBED}
    else:
        fp = _fixed_point(model, grown_by)
        model = fp.model
        values = {k: np.asarray(v) for k, v in _exact_values()(model, fp).items()}
        values.update(tail_mass=fp.tail_mass, num_steps=fp.stats["num_steps"], residual=fp.residual)
        if percentiles:
            values.update(_mean_field_quantiles(model, fp, percentiles))
    fam = family_of(model)
    out = {
        "variant": "exact",
        "model": type(model).__name__,
        "lam": float(values.pop("lam")),
        **fam.parameters(model),
        "K": model.K,
        "load": float(values.pop("load")),
    }
    # Probabilities are printed clipped at 0: the solver leaves rounding noise of either sign (1e-40 and below)
    # where the tails have fallen below float64's resolution relative to the leading levels.
    tail, phase_tails = values.pop("tail"), values.pop("phase_tails", None)
    tail, phase_tails = np.maximum(tail, 0.0), None if phase_tails is None else np.maximum(phase_tails, 0.0)
    numbers = {k: values.pop(k) for k in ("tail_mass", "num_steps", "residual")}
    numbers["tail_mass"] = np.maximum(numbers["tail_mass"], 0.0)
    quantiles = {k: values.pop(k) for k in _QUANTILE_KEYS if k in values}
    out.update({k: float(v) for k, v in values.items()})
    out.update({
        "tail": _trim(tail),
        "tail_mass_at_K": float(numbers["tail_mass"]),
        "newton_steps": int(numbers["num_steps"]),
        "residual": float(numbers["residual"]),
    })
    if phase_tails is not None:
        out["phase_tails"] = [[float(v) for v in row] for row in phase_tails[: max(len(out["tail"]) - 1, 0)]]
    for name, q in quantiles.items():
        from ._errors import percentile_label

        out[name] = dict(zip(map(percentile_label, percentiles), map(float, np.asarray(q)), strict=True))
    if servers is not None:
        out["refined"] = _refined(model, fp, servers, len(out["tail"]), sampling)
    return out, model, described


_DESCRIBED = ("load", "mean", "scv")  # describe_model's numbers
_QUANTILE_KEYS = ("sojourn_time_percentiles", "waiting_time_percentiles")


def _exact_outputs(model):
    """What `jsmkt solve` prints of the exact mean field at the model's `K`, as one function of the model (traced
    whole, for `jax.export`): the fixed point (`solve_fixed_point` with `throw=False`, whose failures show in
    `successful` and `truncated`), its metrics, and the numbers of the model's description (`described_load`, ...)."""
    import jsmkt

    fp = jsmkt.solve_fixed_point(model, throw=False)
    out = dict(_exact_values()(model, fp))
    out.update({f"described_{k}": v for k, v in _load_and_service_dict(model).items()})
    out.update(tail_mass=fp.tail_mass, num_steps=fp.stats["num_steps"], residual=fp.residual,
               successful=fp.result == jsmkt.RESULTS.successful,
               truncated=fp.result == jsmkt.RESULTS.truncation_too_small)
    return out


def _exact_from_export(model, grown_by: str | None):
    """`_exact_outputs` from its exported file (`jsmkt._exported`, in the cache folder), at the model's `K` and, when
    `grown_by` says that K grows, at the doubled `K`s that `solve_fixed_point(auto_K=True)` tries, until the tail
    mass at `K` is small enough. Returns `(values, model at the final K)`, or `None` when the usual path must run:
    any failure (whose error it then raises, or from which it restarts Newton), or a model too large to solve."""
    from . import _exported
    from ._models.structure import check_size, linear_solver

    def before_export(model):
        # Once per model structure, which both depend on alone: a file that exists passed them.
        check_size(model)
        linear_solver(model)

    K0 = model.K
    while True:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", _exported.CacheWarning)
                values, _ = _exported.call("jsmkt solve: exact", _exact_outputs, model, before_export=before_export)
        except ValueError:  # too large to solve, or a structure refused: the usual path raises the error
            return None
        finally:
            for w in caught:  # the cache's own (an entry replaced or not written): one line each
                if issubclass(w.category, _exported.CacheWarning):
                    print(f"jsmkt: warning: {w.message}", file=sys.stderr)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if values is None:
            return None
        if bool(values.pop("successful")):
            values.pop("truncated")
            return values, model
        if not (grown_by is not None and bool(values["truncated"]) and model.K < (max_K := _auto_max_K(K0))):
            return None
        model = model.with_K(min(2 * model.K, max_K))


def _mean_field_quantiles(model, fp, percentiles) -> dict[str, Any]:
    """The quantiles of the sojourn time (and, where the family has one, the waiting time) of the mean field at
    `percentiles`, as arrays keyed `sojourn_time_percentiles` and `waiting_time_percentiles`."""
    import jax.numpy as jnp

    import jsmkt

    p = jnp.asarray([q / 100.0 for q in percentiles])
    try:
        T = jsmkt.sojourn_time_distribution(model, fp)
    except ValueError as e:
        raise SpecError(f"--percentiles: {e}") from None
    out = {"sojourn_time_percentiles": T.quantile(p)}
    try:
        W = jsmkt.waiting_time_distribution(model, fp)
    except ValueError:  # no waiting time in this family (batch service, repairable servers)
        return out
    out["waiting_time_percentiles"] = W.quantile(p)
    return out


@functools.cache
def _exact_values():
    """The metrics `jsmkt solve` prints, as one compiled function of `(model, fp)`: computed one by one, each metric
    and its few operations would be traced, lowered and loaded from the cache on its own, in every run."""
    import equinox as eqx

    import jsmkt

    def values(model, fp):
        fam = family_of(model)
        out = {
            "lam": model.arrival_rate,
            "load": model.load(),
            "mean_queue_length": jsmkt.mean_queue_length(model, fp),
            "mean_sojourn_time": jsmkt.mean_sojourn_time(model, fp),
            "mean_waiting_time": jsmkt.mean_waiting_time(model, fp),
            "prob_wait": jsmkt.prob_wait(model, fp),
            "utilisation": jsmkt.utilisation(model, fp),
            **(fam.metrics(model, fp) if fam.metrics else {}),
            "tail": jsmkt.tails(model, fp),
        }
        if hasattr(model, "phase_tails"):
            out["phase_tails"] = jsmkt.phase_tails(model, fp)
        return out

    return eqx.filter_jit(values)


def _refined(model, fp, n: int, n_tail: int, sampling: str) -> dict[str, Any]:
    """The 1/N-refined mean field with `n` servers (expected values to order 1/N)."""
    import numpy as np

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


def _published_tails(model, K: int):
    """The published s_0..s_K and, for PH service, the phase tails pi_1..pi_K (NumPy arrays; None without
    phases)."""
    import numpy as np

    import jsmkt
    from ._models.jsqd_ph import JSQdPH

    from ._models.batch_service import JSQdBatchService
    from ._models.bmap import JSQdBMAP

    pub = jsmkt.published
    if isinstance(model, JSQdPH):
        pi = np.asarray(pub.ph_fixed_point(model.lam, model.service, model.choice.d, K))
        return np.concatenate([[1.0], pi.sum(1)]), pi
    if isinstance(model, JSQdBMAP):  # the closed form's pi_0..pi_K: phase vectors from level 0 on
        pi = np.asarray(pub.bmap_fixed_point(model.bmap, model.choice.d, model.mu, K))
        return pi.sum(1), pi[1:]
    if isinstance(model, JSQdBatchService):  # the framework's fixed point (7)-(8) with Section 4's blocks
        fw = pub.framework_batch_service(model.lam, model.service, model.service_batch_sizes, model.choice.d, K)
        fp = jsmkt.solve_fixed_point(fw, tail_tol=1.0)  # the truncation is judged by the caller
        S = np.asarray(fw.full(fp.value))
        return np.asarray(jsmkt.tails(fw, fp)), S[1:].reshape(K, -1)
    return np.asarray(pub.exponential_tails(model.lam, model.choice.d, model.mu, K)), None


def _published_K(model, grown_by: str | None) -> int:
    """The spec's K, or when `grown_by` says what grows it, K doubled until the published s_K is at most the exact
    solver's `tail_tol` (up to its `max_K`); a `SpecError` like the exact solver's when K is too small."""
    auto_K = grown_by is not None
    tol, max_K = _solver_default("tail_tol"), _auto_max_K(model.K)
    K = enough = model.K
    while (tail := float(_published_tails(model, enough)[0][-1])) > tol and enough < max_K:
        enough = min(2 * enough, max_K)
    if tail <= tol and (auto_K or enough == K):
        return enough
    found = f"the published s_K is {float(_published_tails(model, K)[0][-1]):.3g} > tail_tol={tol:.3g}"
    raise _too_small(K, found, enough if tail <= tol else None, grown_by, max_K)


def _solve_published(model, grown_by: str | None = None) -> tuple[dict[str, Any], Any]:
    import numpy as np

    import jsmkt
    from ._choice import FixedChoice
    from ._models.batch_service import JSQdBatchService
    from ._models.bmap import JSQdBMAP
    from ._models.jsqd_ph import JSQdPH

    pub = jsmkt.published
    if not isinstance(model.choice, FixedChoice):
        whole = _whole_float_d(model)
        hint = (f"; d = {float(whole):g} is a TOML float, which the spec reads as a randomised d: write d = {whole}"
                if whole is not None else "")
        raise SpecError(f"--as-published needs an integer d (the published formulas have no randomised d){hint}")
    d = model.choice.d
    K = _published_K(model, grown_by)
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
    elif isinstance(model, JSQdBMAP):
        EQ = float(np.sum(s[1:]))
        ET = EQ / float(model.arrival_rate)
        res = pub.bmap_fixed_point_residuals(model.bmap, d, model.mu, model.K)
        eqs = pub.JSQdBMAPAsPublished(model.bmap, d, model.mu, model.K)
        fp = jsmkt.solve_fixed_point(eqs, tail_tol=1.0)
        source = "Li, Section 3: the super-exponential closed form (35)-(36); E[T] by Little's law"
        extra = {"residual_in_published_equations": float(res["published"]),
                 "residual_in_exact_equations": float(res["exact"]),
                 "phase_tails": [[float(v) for v in row] for row in pi[: len(_trim(s)) - 1]],
                 "published_equations": {"mean_queue_length": float(jsmkt.mean_queue_length(eqs, fp)),
                                         "tail": _trim(np.asarray(jsmkt.tails(eqs, fp)))},
                 "note": ("the closed form solves neither the published equations (14)-(16) nor the exact ones; "
                          "published_equations is the fixed point of (14)-(16) themselves")}
    elif isinstance(model, JSQdBatchService):
        EQ = float(np.sum(s[1:]))
        ET = EQ / float(model.lam)
        source = ("Li, Section 4 in the framework's fixed-point system (7)-(8) (our copy breaks off: the blocks are "
                  "built as Section 2 sets them up); E[T] by Little's law")
        extra = {"phase_tails": [[float(v) for v in row] for row in pi[: len(_trim(s)) - 1]]}
    else:
        ET = float(pub.exponential_sojourn_time(model.lam, d, model.mu))
        source = "rho^((d^k-1)/(d-1)) and Mitzenmacher's E[T]"
        extra = {}
    return {
        "variant": "as-published",
        "source": source,
        "model": type(model).__name__,
        "lam": float(model.arrival_rate),
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
        ("residual in published eqs", "residual_in_published_equations"),
        ("residual in exact eqs", "residual_in_exact_equations"),
        ("events simulated", "events"),
    ]
    rows = [(utilisation, k) if k == "utilisation" else (label, k) for label, k in rows]
    for label, key in rows:
        if key.endswith("_ci") and key[:-3] in out:
            continue  # printed beside its estimate
        if key in out:
            v = out[key]
            if isinstance(v, float) and f"{key}_ci" in out:  # a simulated estimate, to the precision of its CI
                v, h = _with_interval(v, out[f"{key}_ci"])
                print(f"  {label:<26} {v}" + (f" ± {h} (95% CI)" if h else ""))
                continue
            print(f"  {label:<26} {v:.10g}" if isinstance(v, float) else f"  {label:<26} {v}")
    if "residual_in_published_equations" in out:
        print("  (residual: max |dx/dt| below level K of the published or the exact mean-field equations at the "
              "closed form x; 0 if x solves them)")
    if "note" in out:
        print(f"  note: {out['note']}")
    for what in ("sojourn", "waiting"):
        if out.get(f"{what}_time_percentiles"):
            p, ci = out[f"{what}_time_percentiles"], out.get(f"{what}_time_percentiles_ci")
            texts = [_with_interval(v, ci.get(k)) if ci is not None else (f"{v:.4g}", None) for k, v in p.items()]
            print(f"  {what + ' time percentiles':<26} " + "  ".join(
                f"{k}={v}" + (f"±{h}" if h else "") for k, (v, h) in zip(p, texts, strict=True)))
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
        if ci is None:
            print(f"  {k:>2}   {sk:<20.12e}  {max(sk - nxt, 0.0):<18.10e}")
            continue
        # Simulated: s_k to the precision of its interval, P(= k) = s_k - s_{k+1} to that of the wider of theirs.
        h = ci[k] if k < len(ci) else None
        h_next = ci[k + 1] if k + 1 < len(ci) else None
        s_text, h_text = _with_interval(sk, h)
        p_text = _with_interval(sk - nxt, max((x for x in (h, h_next) if x is not None), default=None))[0]
        print(f"  {k:>2}   {s_text:<20}  {p_text:<18}" + (f"  ±{h_text}" if h_text else ""))


def _with_interval(x: float, h: float | None) -> tuple[str, str | None]:
    """A simulated estimate `x` and its 95% half-width `h` as text, to the precision of the interval: `h` to two
    significant digits, `x` to the same decimal place (`2.0231`, `0.1045` -> `2.02`, `0.10`). Without a positive
    finite half-width (an exact value such as s_0 = 1, or none known), `x` to 10 significant digits and `None`."""
    if h is None or not (math.isfinite(h) and h > 0) or not math.isfinite(x):
        return f"{x:.10g}", None
    place = math.floor(math.log10(h)) - 1  # the decimal place of h's second significant digit
    if round(h, -place) >= 10 ** (place + 2):  # rounding carried into the next decade: 0.0996 -> 0.10
        place += 1
    if place < 0:
        return f"{round(x, -place) + 0.0:.{-place}f}", f"{round(h, -place):.{-place}f}"
    unit = 10**place
    return f"{round(x / unit) * unit:.0f}", f"{round(h / unit) * unit:.0f}"


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


def _plot(out: dict[str, Any], path: str, title: str, json_output: bool = False, sojourn=None,
          percentiles=None) -> None:
    """`jsmkt solve --plot`: the tails (and per-phase tails); with `sojourn` (the mean field's sojourn-time law,
    for `--percentiles`) a second panel with its complementary CDF, the `percentiles` marked."""
    from .plotting import plot_phase_tails, plot_sojourn_ccdf, plot_tails

    def draw(fig):
        if sojourn is None:
            ax = fig.subplots()
        else:
            ax, right = fig.subplots(1, 2)
            plot_sojourn_ccdf(right, sojourn, percentiles=percentiles or (), color="k")
            right.set_title("sojourn-time law, mean field", fontsize=9)
        plot_tails(ax, out["tail"], label=f"$s_k$ ({out['variant']})", color="k")
        if out.get("phase_tails"):
            plot_phase_tails(ax, out["phase_tails"])
        if sojourn is None:
            ax.set_title(_fit_title(title, 6), fontsize=9)
        else:
            fig.suptitle(_fit_title(title, 11), fontsize=9)

    _save_figure(draw, path, figsize=(6, 4.5) if sojourn is None else (11, 4.5), json_output=json_output)


def _fit_title(title: str, inches: float) -> str:
    """`title` with each of its lines broken to fit `inches` at font size 9 (about 13 characters an inch), so that
    a long model description is not cut off at the figure's edges: between its `name = value` items (separated by
    three spaces), and within an item at spaces only where the item alone is too long."""
    import textwrap

    width = int(13 * inches)
    out = []
    for line in title.split("\n"):
        row = ""
        for item in line.split("   "):
            if row and len(row) + 3 + len(item) > width:
                out.append(row)
                row = ""
            row = f"{row}   {item}" if row else item
            if len(row) > width:
                *full, row = textwrap.wrap(row, width, break_on_hyphens=False, break_long_words=False)
                out.extend(full)
        out.append(row)
    return "\n".join(out)


def _sojourn_law(model):
    """The mean field's sojourn-time law of `model` at its `K` (for `jsmkt solve --plot --percentiles`, after
    `_solve_exact` has solved it and computed its percentiles: the fixed point is solved again, its compiled
    solve reused)."""
    import jsmkt

    return jsmkt.sojourn_time_distribution(model, _fixed_point(model, None))


def _save_figure(draw, path: str, figsize: tuple[float, float], json_output: bool = False) -> None:
    """A figure drawn by `draw(fig)`, written to `path`; says `wrote PATH` on stdout (on stderr with
    `json_output`, whose stdout is the JSON alone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    try:
        draw(fig)
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
    finally:
        plt.close(fig)
    for text in [str(w.message) for w in caught] + [r.getMessage() for r in records]:
        print(f"jsmkt: warning: --plot={path}: {text.strip().splitlines()[0]}", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr if json_output else sys.stdout)


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
    import numpy as np

    from ._choice import choice_support

    if n < 1:
        raise SpecError(f"--servers={n} must be >= 1")
    max_d = max((choice_support(np.asarray(disp.choice.weights())) or (1, 1))[1]
                for disp in model.description().dispatches)
    if sampling == "without_replacement" and max_d > n:
        raise SpecError(f"d={max_d} exceeds --servers={n}: cannot sample {max_d} distinct servers without "
                        'replacement ([simulation] sampling = "without_replacement")')


def _cmd_solve(args) -> int:
    parsed = _parse(args)
    sampling = parse_simulation(parsed.spec, where=args.spec).get("sampling", "with_replacement")  # as simulate
    if args.servers is not None:
        if args.as_published:
            raise SpecError("--servers (refined mean field) applies to the exact mean field, not --as-published")
        if args.servers < 1:
            raise SpecError(f"--servers={args.servers} must be >= 1")
    if args.as_published and not parsed.family.published:
        raise SpecError(f"--as-published: model = {parsed.family.name!r} has no published form in jsmkt; solve it "
                        "without --as-published (the exact mean field)")
    if args.percentiles and args.as_published:
        raise SpecError("--percentiles (sojourn-time distribution) applies to the exact mean field, not --as-published")
    if args.plot:
        _check_plot_path(args.plot)
    model = _build(parsed, args)
    if args.servers is not None:
        _check_servers(model, args.servers, sampling)
    grown_by = _grown_by(args, parsed.K_given)
    if args.as_published:
        (out, model), described = _solve_published(model, grown_by), None
    else:
        out, model, described = _solve_exact(model, grown_by, args.servers, sampling, args.percentiles)
    if args.plot:  # before printing, so that a plot that cannot be written leaves no results behind
        from .plotting import model_title

        _plot(out, args.plot, model_title(model, "as published" if args.as_published else "exact mean field"),
              args.format == "json", _sojourn_law(model) if args.percentiles else None, args.percentiles)
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        title = "jsmkt solve: " + ("as published" if args.as_published else "exact mean field")
        fam = family_of(model)
        _print_table(out, title + "\n" + _describe(model, numbers=described), fam.level, fam.utilisation)
        if "refined" in out:
            _print_refined(out["refined"])
    if "refined" in out and (outside := _outside_unit_interval(out["refined"])):
        shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
        print(f"jsmkt: note: N={args.servers} servers is too small for the 1/N expansion: {shown} fall outside "
              '[0, 1] (refined "in_range" is false)', file=sys.stderr)
    return 0


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
    fp = _fixed_point(model, _grown_by(args, parsed.K_given))
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
        from .plotting import model_title

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

    from .plotting import plot_trajectory

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


def _check_cpu_devices(requested: int | None) -> None:
    from ._config import max_cpu_devices, too_many_cpu_devices

    if requested is not None and requested < 1:
        raise SpecError(f"--cpu-devices={requested} must be >= 1")
    if requested is not None and requested > max_cpu_devices():
        raise SpecError(f"--cpu-devices={requested} exceeds {too_many_cpu_devices()}")


def _use_cpu_devices(requested: int | None) -> None:
    """Expose the CPU's cores as `requested` JAX devices (default: all cores), so that `simulate` runs
    replications on them in parallel."""
    from ._config import use_cpu_cores

    _check_cpu_devices(requested)
    if not use_cpu_cores(requested) and requested is not None:
        print(f"jsmkt: note: --cpu-devices={requested} ignored, JAX's devices were already set up", file=sys.stderr)


def _cmd_simulate(args) -> int:
    parsed = _parse(args)
    parse_simulation(parsed.spec, where=args.spec)
    if args.servers < 1:
        raise SpecError(f"--servers={args.servers} must be >= 1")
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
    _check_cpu_devices(args.cpu_devices)
    _use_cpu_devices(args.cpu_devices)  # before JAX's first computation
    import jax.random as jr

    import jsmkt

    model = _build(parsed, args)
    kwargs = simulation_from_spec(parsed.spec, where=args.spec)
    _check_servers(model, args.servers, kwargs.get("sampling", "with_replacement"))
    options = lambda text: _SIMULATE_OPTIONS.sub(lambda m: _SIMULATE_OPTION_NAMES[m.group(1)], text)  # noqa: E731
    if args.percentiles:  # with waiting times where the family has them (simulate refuses them before running)
        kwargs |= {"percentiles": args.percentiles, "waiting_times": True}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = lambda **kw: jsmkt.simulate(  # noqa: E731
                model, args.servers, args.time, key=jr.PRNGKey(args.seed), n_replications=args.replications,
                warmup=args.warmup, max_queue=args.max_queue,
                progress=args.format == "table" and sys.stderr.isatty() or args.progress, **(kwargs | kw),
            )
            try:
                res = run()
            except ValueError as e:
                if not str(e).startswith("waiting_times=True"):
                    raise
                res = run(waiting_times=False)
    except ValueError as e:  # name simulate's arguments by their options
        raise SpecError(options(str(e))) from None
    for w in caught:  # one line each, in the options' names
        print(f"jsmkt: warning: {options(str(w.message))}", file=sys.stderr)
    service = _simulated_service(parsed.spec, model, kwargs.get("service"))
    out = res.to_dict()
    out = {"variant": "simulation", "model": type(model).__name__, "service": service, **out}
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_table(out, f"jsmkt simulate: N = {args.servers} servers, t = {args.time:g}, "
                          f"{args.replications} replication(s)\n" + _describe(model, service),
                     family_of(model).level, family_of(model).utilisation)
    return 0


CACHE_ENV = "JSMKT_CACHE_DIR"
_CACHE_OFF = "off"
# Every compilation is cached: a cached kernel loads far quicker than the CLI's kernels compile.
_CACHE_MIN_COMPILE_SECONDS = 0.0


def _cache_dir(args) -> str | None:
    """jsmkt's cache folder for this run, `None` when the cache is off: `--no-cache` turns it off; else
    `--cache-dir DIR`, else `$JSMKT_CACHE_DIR` (`off` turns it off), else the user's cache folder,
    `$XDG_CACHE_HOME/jsmkt` or `~/.cache/jsmkt`. JAX's persistent compilation cache is its subfolder `jax`."""
    if args.no_cache:
        return None
    path = args.cache_dir if args.cache_dir is not None else os.environ.get(CACHE_ENV)
    if path is not None and path.strip().lower() == _CACHE_OFF:
        return None
    if not path:
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(root, "jsmkt")
    return os.path.expanduser(path)


def _use_compilation_cache(args) -> None:
    """Turn on JAX's persistent compilation cache in `_cache_dir(args)` (the library never does: only the CLI, whose
    every run is a new process), and keep exported functions (`jsmkt._exported`: traced and lowered once) in its
    subfolder `exported`. A folder that cannot be written gives a warning, and the run goes on without the cache.
    Without a jsmkt option or variable, a cache that JAX was told to use (`JAX_COMPILATION_CACHE_DIR`) is left as
    it is."""
    import jax

    from . import _exported

    path = _cache_dir(args)
    if path is None:
        return
    explicit = args.cache_dir is not None or os.environ.get(CACHE_ENV)
    own_jax_cache = explicit or not jax.config.jax_compilation_cache_dir
    folders = [os.path.join(path, "exported")] + ([os.path.join(path, "jax")] if own_jax_cache else [])
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
        except OSError as e:
            print(f"jsmkt: warning: cannot use the compilation cache in {folder} ({e.strerror or e}); running without "
                  f"it (pass --cache-dir DIR, or --no-cache)", file=sys.stderr)
            return
    _exported.use_folder(folders[0])
    if not own_jax_cache:
        return
    jax.config.update("jax_compilation_cache_dir", folders[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _CACHE_MIN_COMPILE_SECONDS)


def _parse(args):
    """The spec file `args.spec`, read and checked (family, keys, types) without importing JAX."""
    return parse_spec(load_spec(args.spec), where=args.spec)


def _build(parsed, args):
    """The model of a checked spec. JAX is imported here: its compilation cache is set up first."""
    _use_compilation_cache(args)
    return build_model(parsed)


def _common_options() -> argparse.ArgumentParser:
    """The options every command takes."""
    c = argparse.ArgumentParser(add_help=False)
    g = c.add_argument_group("compilation cache")
    g.add_argument("--cache-dir", metavar="DIR", default=None,
                   help=f"keep JAX's compiled kernels in DIR/jax, so that later runs of the same model structure skip "
                        f"compiling (default: ${CACHE_ENV}, else $XDG_CACHE_HOME/jsmkt or ~/.cache/jsmkt; "
                        f"{CACHE_ENV}=off turns the cache off)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the compilation cache")
    c.add_argument("--family", metavar="FILE", action="append", default=[],
                   help="import the Python FILE first, which registers a model family written outside jsmkt "
                        "(jsmkt.register_family), so that the spec may name it; may be given several times")
    return c


_SERVICE_PARAMETRISATIONS = {"h2": "hyperexponential2", "coxian2": "coxian2"}  # [service] kinds with an scv key


def _service_parametrisation(spec: dict[str, Any]):
    """The two-moment constructor of the spec's `[service]` (its kind has `mean` and `scv` keys), else `None`."""
    import jsmkt

    service = spec.get("service")
    kind = service.get("kind") if isinstance(service, dict) else None
    return getattr(jsmkt, _SERVICE_PARAMETRISATIONS[kind]) if kind in _SERVICE_PARAMETRISATIONS else None


def _plot_elasticities(rows: list[dict[str, Any]], path: str, title: str, json_output: bool = False) -> None:
    def draw(fig):
        ax = fig.subplots()
        names = [r["name"] for r in rows][::-1]
        ax.barh(names, [r["elasticity"] for r in rows][::-1], color="0.35")
        ax.axvline(0.0, color="k", lw=0.8)
        ax.set_xlabel("elasticity (theta / M) dM/dtheta")
        ax.set_title(_fit_title(title, 5), fontsize=9)

    _save_figure(draw, path, figsize=(6, 1.3 + 0.35 * len(rows)), json_output=json_output)


def _cmd_sensitivity(args) -> int:
    import jsmkt

    spec = load_spec(args.spec)
    parsed = parse_spec(spec, where=args.spec)
    wrt = None
    if args.wrt is not None:
        wrt = [w.strip() for w in args.wrt.split(",")]
        if not all(wrt):
            raise SpecError(f"--wrt={args.wrt!r}: give parameter names separated by commas, e.g. --wrt lam,theta")
    if args.plot:
        _check_plot_path(args.plot)
    model = _build(parsed, args)
    service = _service_parametrisation(spec)
    if service is None and wrt is not None and "scv" in wrt and hasattr(model, "service"):
        raise SpecError(f"--wrt scv: the [service] of {args.spec} has no scv key; derivatives with respect to the "
                        f"SCV need kind = {' or '.join(map(repr, _SERVICE_PARAMETRISATIONS))} (the parametrisation "
                        "they are taken through)")
    s = jsmkt.sensitivity(model, args.metric, wrt, service=service)
    rows = s.rows()
    shown = _shown_derivative(float(s.value), [(r["value"], r["derivative"]) for r in rows])
    undefined = None if float(s.value) != 0.0 else f"{s.metric} is 0, where its elasticity (theta/M) dM/dtheta " \
        "is undefined"
    if args.plot:
        from .plotting import model_title

        _plot_elasticities(rows, args.plot, f"{model_title(model)}\nelasticities of {s.metric}", args.format == "json")
    if args.format == "json":
        out = {"variant": "sensitivity", "model": type(model).__name__, **family_of(model).parameters(model),
               "K": model.K, **s.to_dict()}
        for p in out["parameters"].values():
            p["derivative"] = _map_lists(shown, p["value"], p["derivative"])
            p["elasticity"] = _map_lists(lambda e, g: None if not math.isfinite(e) else 0.0 if g == 0.0 else e,
                                         p["elasticity"], p["derivative"])
        if undefined:
            out["note"] = f"elasticity null: {undefined}"
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
        g = shown(r["value"], r["derivative"])
        e = "-" if not math.isfinite(r["elasticity"]) else "0" if g == 0.0 else f"{r['elasticity']:.6g}"
        print(f"  {r['name']:<{width}} {r['value']:<16.10g} {format(g, '.10g') + side:<{dwidth}} {e}")
    if any(r["one_sided"] for r in rows):
        print("  (right)/(left): one-sided derivative, a choice number at an integer (the randomised rule is "
              "piecewise linear in d)")
    if undefined:
        print(f"  -: {undefined}")
    if any(shown(r["value"], r["derivative"]) != r["derivative"] for r in rows):
        print(f"  (0: |theta dM/dtheta| below {_ZERO_DERIVATIVE:g} of the metric's scale, rounding noise of a zero "
              "derivative; see --help)")
    return 0


# A derivative this small relative to the metric's scale is printed as 0 (see `_shown_derivative`).
_ZERO_DERIVATIVE = 1e-10
_SENSITIVITY_DESCRIPTION = (
    "Derivatives dM/dtheta and elasticities (theta/M) dM/dtheta of a metric M at the mean-field fixed point, by the "
    f"implicit function theorem. A derivative with |theta dM/dtheta| (|dM/dtheta| where theta = 0) below "
    f"{_ZERO_DERIVATIVE:g} times the larger of |M| and the largest such product over the parameters is printed as 0 "
    "(rounding noise of a derivative that is 0; the elasticity is then 0). Where M = 0 the elasticity is undefined: "
    "'-' in the table, null in the JSON, with a note.")


def _shown_derivative(value: float, entries: list[tuple[float, float]]):
    """`(theta, dM/dtheta) -> ` the derivative as `jsmkt sensitivity` prints it: 0 where |theta dM/dtheta| (|dM/dtheta|
    for theta = 0) is below `_ZERO_DERIVATIVE` times the scale max(|M|, that product's largest value over `entries`,
    the model's `(theta, dM/dtheta)`). The fixed point is solved to about 1e-11 relative, and a derivative that is 0
    (a metric that does not depend on the parameter, such as the availability on lam) comes out as rounding noise,
    1e-14 to 1e-18 of that scale; a -0 prints as 0."""
    def effect(theta, g):
        return abs(g) * (abs(theta) if theta != 0.0 else 1.0)

    finite = [effect(t, g) for t, g in entries if math.isfinite(t) and math.isfinite(g)]
    scale = max([abs(value)] + finite) if math.isfinite(value) else math.inf

    def shown(theta, g):
        return 0.0 if math.isfinite(g) and effect(theta, g) <= _ZERO_DERIVATIVE * scale else g

    return shown


def _map_lists(fn, a, b):
    """`fn` entry by entry over two nested lists of one shape (or two numbers); None passes through."""
    if isinstance(a, (list, tuple)):
        return [_map_lists(fn, x, y) for x, y in zip(a, b, strict=True)]
    return None if a is None or b is None else fn(a, b)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jsmkt", description="Mean-field solver and simulator for supermarket models.")
    sub = p.add_subparsers(dest="command", required=True)
    common = _common_options()

    s = sub.add_parser("solve", parents=[common], help="solve the mean-field fixed point of a model spec (TOML)")
    s.add_argument("spec", help="TOML model specification (see examples/)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    s.add_argument("--plot", metavar="FILE", help="write a plot of the tails to FILE (png, pdf, svg)")
    s.add_argument("--as-published", action="store_true", help="use the papers' published closed forms")
    s.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    s.add_argument("--servers", type=int, default=None, metavar="N",
                   help="also give the refined mean field (1/N correction) for N servers")
    s.add_argument("--percentiles", type=_percentile_list, default=None, metavar="P,P,...",
                   help="also give these percentiles of the sojourn (and waiting) time, e.g. 50,90,99,99.9 or "
                        "50 90 99 99.9")
    s.set_defaults(func=_cmd_solve)

    t = sub.add_parser("transient", parents=[common],
                       help="integrate the mean-field ODE of a model spec (TOML) from empty servers over time")
    t.add_argument("spec", help="TOML model specification (see examples/)")
    t.add_argument("--time", type=float, required=True, help="the final time T")
    t.add_argument("--points", type=int, default=11, metavar="N",
                   help="report N equally spaced times from 0 to T (default: 11)")
    t.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    t.add_argument("--plot", metavar="FILE", help="write plots of s_k(t) and of the distance to the fixed point to "
                                                  "FILE (png, pdf, svg)")
    t.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    t.add_argument("--solver", choices=_ODE_SOLVERS, default="kvaerno5",
                   help="the ODE solver: kvaerno5 (implicit, for stiff models, e.g. fast PH phases; the default) or "
                        "tsit5 (explicit: quicker when the rates are of one scale)")
    t.add_argument("--max-steps", type=int, default=_TRANSIENT_MAX_STEPS, metavar="N",
                   help=f"the most ODE solver steps; a run that needs more stops with an error (default: "
                        f"{_TRANSIENT_MAX_STEPS})")
    t.add_argument("--progress", action="store_true",
                   help="show the integration's progress on stderr (shown anyway when stderr is a terminal and the "
                        "output a table)")
    t.set_defaults(func=_cmd_transient)

    m = sub.add_parser("simulate", parents=[common], help="simulate the finite-N system of a model spec (TOML)")
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
    m.add_argument("--percentiles", type=_percentile_list, default=None, metavar="P,P,...",
                   help="percentiles of the sojourn (and waiting) time with 95%% CIs, e.g. 50,90,99,99.9 or 50 90 "
                        "99 99.9 (default: 50,90,99)")
    m.set_defaults(func=_cmd_simulate)

    n = sub.add_parser("sensitivity", parents=[common], help="derivatives and elasticities of a metric at the fixed point of a model "
                       "spec (TOML) with respect to its parameters", description=_SENSITIVITY_DESCRIPTION)
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
    args = parser.parse_args(_join_percentiles(sys.argv[1:] if argv is None else list(argv)))
    try:
        for path in args.family:  # before the spec is read: it may name the families these files register
            load_family_file(path)
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
    except KeyboardInterrupt:  # Ctrl-C: one line, and the shell's code for SIGINT (128 + 2)
        print(("\n" if sys.stderr.isatty() else "") + "jsmkt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the output cannot be written (e.g. a full disk)
        print(f"jsmkt: failed: cannot write the output ({e.strerror or e})", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1


def run() -> None:
    """The console script (and `python -m jsmkt.cli`): `main`, then exit without the interpreter's teardown.
    Once JAX is imported, that teardown (freeing its many objects and modules one by one) takes about half a
    second, and it frees only memory: every output is flushed here and every file the commands write is closed
    by then, and the exit handlers still run."""
    import atexit

    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a reader that closed the pipe: nothing more can be written
        pass
    atexit._run_exitfuncs()  # JAX's: wait for pending effects, release the backends
    os._exit(code)


if __name__ == "__main__":
    run()
