"""The CLI's one solve path: `solve(model, grown_by, ...)` chooses the truncation level `K` and gives what `jsmkt
solve` reports, of the exact mean field or (`published=True`) of the papers' as-published form
(`jsmkt.published.as_published`); `fixed_point` is the same for the fixed point alone (`jsmkt transient`).

`K` is chosen by one loop, `_choose_K`, over attempts at one `K` each: the spec's `K`, then doubled while the tail
mass at `K` is too large and something grows it (`--auto-K`, or the default K of a spec without one). When the
spec's `K` stands and is too small, the loop goes on growing it to find the `K` to suggest in the error. An exact
attempt is the exported solve (`jsmkt._exported`, in the cache folder) when it can be, else `solve_fixed_point`.
"""

import functools
import sys
import warnings
from typing import Any, NamedTuple

from .output import _trim, _whole_float_d
from .spec import SpecError, _load_and_service_dict, family_of


_REFINED_SLOW = 1000  # reduced-state size above which `solve --servers` says that the refinement takes a while
_DESCRIBED = ("load", "mean", "scv")  # describe_model's numbers
_QUANTILE_KEYS = ("sojourn_time_percentiles", "waiting_time_percentiles")
_EXPORT_NAME = "jsmkt solve: exact"  # the name the exported solve is kept under


def _solver_default(name: str):
    """The default of `solve_fixed_point`'s argument `name` (the CLI solves with the defaults)."""
    import inspect

    from .._fixed_point import solve_fixed_point

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


def _choose_K(model, attempt, grown_by: str | None):
    """`(result, model at the chosen K)`. `attempt(model) -> (result, found)` solves at the model's `K`, `found`
    None when the tail mass at `K` is small enough, else what was found (for the error). K is doubled (up to
    `_auto_max_K`) while it is too small: when `grown_by` says what grows it, to give the result there; otherwise
    only to suggest a K in the error about the spec's K (0, "not known", when an attempt at a larger K fails)."""
    max_K = functools.partial(_auto_max_K, model.K)  # the solver's default, read (imported) only when needed
    first = None  # (K, found) of the spec's K, when it stands and is too small
    while True:
        try:
            result, found = attempt(model)
        except (ValueError, RuntimeError):
            if first is None:
                raise
            raise _too_small(*first, 0, None, max_K()) from None  # e.g. too large to solve: no K to suggest
        if found is None:
            if first is None:
                return result, model
            raise _too_small(*first, model.K, None, max_K())
        if grown_by is None and first is None:
            first = (model.K, found)
        if model.K >= max_K():
            raise (_too_small(*first, None, None, max_K()) if first
                   else _too_small(model.K, found, None, grown_by, max_K()))
        model = model.with_K(min(2 * model.K, max_K()))


def _solved(model):
    """`solve_fixed_point(model)` at the model's `K` and `(fp, found)`: `found` says how large the tail mass at `K`
    is when it is too large (`fp` None then)."""
    import jsmkt

    max_K = _auto_max_K(model.K)
    try:
        return jsmkt.solve_fixed_point(model, auto_K=False, max_K=max_K), None
    except jsmkt.TruncationError as e:
        return None, f"the fraction of servers with K jobs is {e.tail_mass:.3g} > tail_tol={e.tail_tol:.3g}"


def fixed_point(model, grown_by: str | None):
    """`jsmkt.solve_fixed_point(model)` at the K that `_choose_K` chooses (its `model` is at that K)."""
    fp, _ = _choose_K(model, _solved, grown_by)
    return fp


class Solved(NamedTuple):
    """What `solve` gives: the results `jsmkt solve` prints (`out`), the model at the chosen `K`, the numbers of its
    description (`describe_model`) when they came with the results, and the fixed point when it was solved here
    (not loaded from an exported solve, nor as published)."""

    out: dict[str, Any]
    model: Any
    described: dict[str, float] | None = None
    fp: Any = None


def solve(model, grown_by: str | None, *, published: bool = False, servers: int | None = None,
          sampling: str = "with_replacement", percentiles=None, order: int = 1) -> Solved:
    """`jsmkt solve`'s results at the K chosen (`_choose_K`): as published (`jsmkt.published.as_published`), or of the
    exact mean field with, for `servers`, the refined mean field (of `order` 1 or 2) and the `percentiles` of the
    sojourn time."""
    if published:
        return _solve_published(model, grown_by)
    return _solve_exact(model, grown_by, servers, sampling, percentiles, order)


def _exact_attempt(model, exportable: bool, percentiles):
    """`(values, found)` of the exact mean field at the model's `K`: from the exported solve when `exportable` and
    it succeeds (or finds K too small), else by `solve_fixed_point` and the compiled metrics."""
    import numpy as np

    if exportable:
        values = _from_export(model)
        if values is not None:
            if bool(values.pop("successful")):
                values.pop("truncated")
                values["described"] = {k: float(values.pop(f"described_{k}")) for k in _DESCRIBED}
                return values, None
            if bool(values["truncated"]):
                tol = _solver_default("tail_tol")
                return None, f"the fraction of servers with K jobs is {float(values['tail_mass']):.3g} > " \
                    f"tail_tol={tol:.3g}"
            # other failures: the usual path raises their error (or restarts Newton)
    fp, found = _solved(model)
    if fp is None:
        return None, found
    values = {k: np.asarray(v) for k, v in _exact_values()(model, fp).items()}
    values.update(tail_mass=fp.tail_mass, num_steps=fp.stats["num_steps"], residual=fp.residual, fp=fp)
    if percentiles:
        values.update(_mean_field_quantiles(model, fp, percentiles))
    return values, None


def _solve_exact(model, grown_by, servers, sampling, percentiles, order=1) -> Solved:
    """The exact mean field. With the cache on, and neither the refined mean field nor percentiles (the
    sojourn-time distribution checks its inputs with host callbacks, which a kept executable cannot carry), from the
    exported solve when it succeeds; otherwise (and after its failures, which then raise the usual errors) by
    `solve_fixed_point` and the compiled metrics."""
    import numpy as np

    # A family registered at run time (`--family`) is code outside jsmkt's, which the exported files' keys do not
    # cover: an edited family would load the results of its former code.
    exportable = servers is None and not percentiles and family_of(model).cls is None
    values, model = _choose_K(model, lambda m: _exact_attempt(m, exportable, percentiles), grown_by)
    described, fp = values.pop("described", None), values.pop("fp", None)
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
        from .._errors import percentile_label

        out[name] = dict(zip(map(percentile_label, percentiles), map(float, np.asarray(q)), strict=True))
    if servers is not None:
        out["refined"] = _refined(model, fp, servers, len(out["tail"]), sampling, order, percentiles)
    return Solved(out, model, described, fp)


def _exact_outputs(model):
    """What `jsmkt solve` prints of the exact mean field at the model's `K`, as one function of the model (traced
    whole, to be compiled and kept by `jsmkt._exported`): the fixed point (`solve_fixed_point` with `throw=False`,
    whose failures show in `successful` and `truncated`), its metrics, and the numbers of the model's description
    (`described_load`, ...)."""
    import jsmkt

    fp = jsmkt.solve_fixed_point(model, throw=False)
    out = dict(_exact_values()(model, fp))
    out.update({f"described_{k}": v for k, v in _load_and_service_dict(model).items()})
    out.update(tail_mass=fp.tail_mass, num_steps=fp.stats["num_steps"], residual=fp.residual,
               successful=fp.result == jsmkt.RESULTS.successful,
               truncated=fp.result == jsmkt.RESULTS.truncation_too_small)
    return out


def _from_export(model) -> dict[str, Any] | None:
    """`_exact_outputs(model)` from its exported file (`jsmkt._exported`, in the cache folder; the cache's own
    warnings as one line each on stderr), or None when the usual path must run: no cache folder, a function that
    cannot be exported, or a model too large to solve or of a structure refused (whose error the usual path
    raises)."""
    from .. import _exported

    def before_export(model):
        # Once per model structure, which both depend on alone: a file that exists passed them.
        from .._models.newton import check_size, newton_system

        check_size(model)
        newton_system(model)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", _exported.CacheWarning)
            values, _ = _exported.call(_EXPORT_NAME, _exact_outputs, model, before_export=before_export)
    except ValueError:
        return None
    finally:
        for w in caught:
            if issubclass(w.category, _exported.CacheWarning):
                print(f"jsmkt: warning: {w.message}", file=sys.stderr)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return values


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
        if model.has_phase_tails():
            out["phase_tails"] = jsmkt.phase_tails(model, fp)
        return out

    return eqx.filter_jit(values)


def _refined(model, fp, n: int, n_tail: int, sampling: str, order: int = 1, percentiles=None) -> dict[str, Any]:
    """The refined mean field with `n` servers: expected tails, E[Q], E[T] and utilisation to order 1/N (`order`
    1) or 1/N^2 (`order` 2, with `tail_correction2`, the 1/N^2 coefficients); P(arrival waits), the spreads and
    the `percentiles` of the sojourn (and waiting) time to order 1/N."""
    import numpy as np

    import jsmkt
    from .._refined import _with_sampling_eps

    size = int(np.size(fp.value))
    if size > _REFINED_SLOW:
        print(f"jsmkt: note: --servers: the refined mean field solves dense {size} x {size} systems (time O(n^3), "
              "about a minute at n = 2000 on 2 cores)", file=sys.stderr)
    rmf = jsmkt.refined_mean_field(fp, sampling, order=order)
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
        "order": order,
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
    if order == 2:
        v2 = np.array(jsmkt.tails(model, rmf.correction2))[:n_tail]
        v2[0] = 0.0
        out["tail_correction2"] = [float(x) for x in v2]
    if percentiles:
        out.update(_refined_quantiles(model, rmf, n, percentiles))
    judged = [k for k in range(1, n_tail) if n * s_mf[k] >= 1.0]
    out["out_of_range_levels"] = [k for k in judged if not out["tail_in_range"][k]]
    out["in_range"] = not _outside_unit_interval(out) and not out["out_of_range_levels"]
    return out


def _refined_quantiles(model, rmf, n: int, percentiles) -> dict[str, Any]:
    """The quantiles of the sojourn time (and, where the family has one, the waiting time) with `n` servers to
    order 1/N (`jsmkt.refined_sojourn_time_distribution`), keyed by percentile label."""
    import jax.numpy as jnp
    import numpy as np

    import jsmkt
    from .._errors import percentile_label

    p = jnp.asarray([q / 100.0 for q in percentiles])
    labels = list(map(percentile_label, percentiles))
    try:
        T = jsmkt.refined_sojourn_time_distribution(rmf, n)
    except ValueError as e:
        raise SpecError(f"--percentiles with --servers: {e}") from None
    out = {"sojourn_time_percentiles": dict(zip(labels, map(float, np.asarray(T.quantile(p))), strict=True))}
    try:
        W = jsmkt.refined_waiting_time_distribution(rmf, n)
    except ValueError:  # no waiting time in this family (batch service, repairable servers)
        return out
    out["waiting_time_percentiles"] = dict(zip(labels, map(float, np.asarray(W.quantile(p))), strict=True))
    return out


def _outside_unit_interval(r: dict[str, Any]) -> list[str]:
    """The refined probabilities (P(arrival waits), s_k for k >= 1) outside [0, 1], as `name = value`."""
    values = [("P(arrival waits)", r["prob_wait"])] + [(f"s_{k}", s) for k, s in enumerate(r["tail"]) if k > 0]
    return [f"{name} = {v:.4g}" for name, v in values if not 0.0 <= v <= 1.0]


def _published_attempt(model):
    """`(form, found)`: `jsmkt.published.as_published` at the model's `K`, `found` saying how large its s_K is when
    it exceeds the exact solver's `tail_tol`."""
    from ..published import as_published

    form = as_published(model)
    tol, tail = _solver_default("tail_tol"), float(form.tail[-1])
    return form, None if tail <= tol else f"the published s_K is {tail:.3g} > tail_tol={tol:.3g}"


def _integer_d(model) -> int:
    """The integer choice number that the published formulas need; a `SpecError` for a randomised one."""
    from .._choice import FixedChoice

    choice = getattr(model, "choice", None)  # families with several choice numbers have none
    if not isinstance(choice, FixedChoice):
        whole = _whole_float_d(model)
        hint = (f"; d = {float(whole):g} is a TOML float, which the spec reads as a randomised d: write d = {whole}"
                if whole is not None else "")
        raise SpecError(f"--as-published needs an integer d (the published formulas have no randomised d){hint}")
    return choice.d


def _solve_published(model, grown_by: str | None) -> Solved:
    """The papers' fixed point (`jsmkt.published.as_published`) at the K chosen, as `jsmkt solve` reports it."""
    import numpy as np

    d = _integer_d(model)
    form, model = _choose_K(model, _published_attempt, grown_by)
    s = np.asarray(form.tail)
    shown = len(_trim(s)) - 1  # the levels k >= 1 printed
    out = {
        "variant": "as-published",
        "source": form.source,
        "model": type(model).__name__,
        "lam": float(model.arrival_rate),
        "d": float(d),
        "K": model.K,
        "load": float(model.load()),
        "mean_queue_length": float(np.sum(s[1:])),
        "mean_sojourn_time": float(form.mean_sojourn_time),
        "prob_wait": float(s[1] ** d),
        "utilisation": float(s[1]),
        "tail": _trim(s),
        "tail_mass_at_K": float(s[-1]),
    }
    if form.residuals is not None:
        out["residual_in_published_equations"] = float(form.residuals["published"])
        out["residual_in_exact_equations"] = float(form.residuals["exact"])
    if form.phase_tails is not None:
        out["phase_tails"] = [[float(v) for v in row] for row in np.asarray(form.phase_tails)[:shown]]
    if form.published_equations is not None:
        out["published_equations"] = {"mean_queue_length": float(form.published_equations["mean_queue_length"]),
                                      "tail": _trim(np.asarray(form.published_equations["tail"]))}
    if form.note is not None:
        out["note"] = form.note
    return Solved(out, model)
