r"""Sweeps over grids of a family's named parameters: `jsmkt.sweep`.

A grid is `{name: values}` over a family's parameters, each named by its TOML path (`lam`, `d`, `service.mean`,
`service.scv`; `mean` and `scv` are short for the service's), with values read as TOML reads them: an integer `d`
is a fixed choice number, a real one randomised. Its points are evaluated in this order:

- **Axes.** An axis is *traced* when a point's value can be written into a model inside `jax.vmap`: a real scalar
  rate or number (`lam`, `theta`, `mu`, ...), a real (randomised) choice number, and the mean and SCV of a service
  given by them (`kind = "h2"`, `"coxian2"`, `"erlang"`, `"exponential"`; the mean of any other phase-type service by
  scaling time). Every other axis (an integer `d`, `K`, a number of phases, a policy, a vector of probabilities) is
  *built*: each combination of the built axes' values is a model built from the spec as `jsmkt.load_spec` builds it.
  Each value of every axis is checked as a spec value first (`jsmkt._spec`), so that a value the spec refuses stops
  the sweep before anything is computed, with the spec's message.
- **Groups.** Built models of one static structure (the same class, phases, choice law, policies) form a group,
  whose points are traced and compiled once per truncation level.
- **Truncation.** Every point is solved at the group's `K` (the largest of its built models' `K`, from the spec or
  chosen by the family from the spec's values) and, where the fraction of servers at `K` exceeds the solver's
  `tail_tol`, again at `2K`, `4K`, ... up to `max_K`: the auto-K rule, point by point, so that a point's values do
  not depend on the chunks, devices or runs it was evaluated in. A point that needs more than `max_K` is flagged
  (`truncation_too_small`).
- **Chunks.** The points of one built model are cut into chunks, hyperrectangles of the grid (whole trailing traced
  axes, a range of one of them, single values of the others), so that a chunk is a region of the output store.
  A chunk is evaluated by one compiled function: `jsmkt.batched`, `jax.lax.map` over `jax.vmap`-ed blocks of
  points (the per-point rate of a CPU falls as a vmapped batch grows; a GPU takes the whole chunk in one block), one
  row of points per local device, placed by a `NamedSharding` (one code path for one CPU, CPU cores exposed as
  devices, one or several GPUs). `jax.shard_map` is not used: Equinox's closure conversion inside Optimistix's
  implicit derivative refuses the arguments it sees there.
- **Values.** Per point: the fixed point (`solve_fixed_point(..., throw=False)`), the metrics, their derivatives
  with respect to the parameters named in `grad` (forward mode through the implicit adjoint: one linear solve per
  parameter) and the quantiles of the sojourn and waiting times. A failed point (unstable, truncation, no
  convergence, invalid parameters) is NaN in every variable and flagged in `result`; it never stops the sweep.
- **Output.** An `xarray.Dataset` with one dimension per grid axis. With `out="....zarr"` each finished chunk is
  written to its region of the zarr store, its `result` last, so that a chunk whose `result` is written is whole:
  a rerun of the same sweep skips those chunks (after Ctrl-C, a kill, a lost machine). `.nc` (netCDF, h5netcdf),
  `.parquet` (pyarrow) and `.csv` (a tidy long table: one row per point) are written at the end.
- **Clusters.** With `client=` a Dask `distributed.Client`, chunks are Dask tasks on the cluster's workers
  (`retries` re-run a lost worker's chunks); each worker evaluates with its own devices and writes its regions of
  the store, which must be on a filesystem every worker sees. Without `out`, the workers send their values back.
"""

import dataclasses
import datetime
import functools
import hashlib
import itertools
import json
import math
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import _spec
from ._errors import percentile_label


_OUT_KINDS = (".zarr", ".nc", ".parquet", ".csv")
_CPU_BLOCK = 32  # points per vmapped block on a CPU (the per-point rate falls above this: benchmarks/sweep.py)
_CPU_CHUNK = 16384  # points per chunk and CPU device by default
_NOT_DONE = -1  # `result` of a point not yet evaluated (in a store being written)
_TERMS = (1 << 10, 1 << 13, 1 << 15)  # uniformisation steps of the time laws tried in turn (under vmap every point
# takes all of a level's steps, so the first is small; the last is `jsmkt.sojourn_time_distribution`'s default)
_TRACED_SERVICE_KINDS = {"h2": "hyperexponential2", "coxian2": "coxian2"}  # services given by (mean, scv)


class SweepInterrupted(KeyboardInterrupt):
    """Raised by `jsmkt.sweep` after Ctrl-C (SIGINT), once the chunk in flight is finished and written: a
    `KeyboardInterrupt` whose message says how to resume (the same call again, with the same `out` store)."""


# --- the plan: axes, built models, groups and chunks ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Axis:
    name: str  # as given (a dimension of the dataset)
    path: str  # the TOML path it sets
    values: tuple  # Python numbers (or other TOML values for built axes)
    traced: bool


@dataclasses.dataclass(frozen=True)
class _Traced:
    """A parameter written into the model inside the trace: `kind` is `"real"` (the field `field` set to the value),
    `"choice"` (an `InterpolatedChoice` of the value with `d_max`), `"service mean"`, `"service scv"` (the service
    rebuilt by `maker(mean, scv)`, or for the mean alone, time scaled)."""

    path: str
    kind: str
    field: str
    base: float  # the spec's value (for a parameter named in `grad` only)
    d_max: int = 0
    maker: str | None = None  # a jsmkt constructor of the service: hyperexponential2, coxian2, erlang, exponential
    k: int = 0  # erlang's number of phases


def _canonical(name: str, fam) -> str:
    """The TOML path of an axis or a `grad` name (`mean` -> `service.mean`, as in the spec's overrides)."""
    if name in fam.keys:
        return name
    return _spec._OVERRIDE_ALIASES.get(name, name)


def _as_values(name: str, values: Any) -> tuple:
    """An axis's values as a tuple of Python values (NumPy integers as `int`, floats as `float`)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = [values]
    out = []
    for v in (values.tolist() if hasattr(values, "tolist") else list(values)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out.append(v)
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"grid[{name!r}] has the value {v!r}; give finite numbers")
        else:
            out.append(v)
    if not out:
        raise ValueError(f"grid[{name!r}] has no values; give at least one")
    return tuple(out)


def _spec_table(spec_or_model) -> tuple[dict, str]:
    """`(TOML table, where)` of a spec path, a TOML table or a model."""
    if isinstance(spec_or_model, (str, os.PathLike)):
        path = str(spec_or_model)
        return _spec.read_spec_file(path), path
    if isinstance(spec_or_model, Mapping):
        import copy

        return copy.deepcopy(dict(spec_or_model)), "spec"
    try:
        return _spec.model_spec(spec_or_model), "model"
    except ValueError as e:
        raise ValueError(f"spec_or_model={type(spec_or_model).__name__}: {e}; give a spec path, a TOML table or a "
                         "model of a registered family") from None


def _check_value(spec: dict, where: str, overrides: dict) -> None:
    """Parse the spec with `overrides` set (no JAX): the spec's checks and messages, naming the grid value."""
    try:
        _spec.parse_spec(_spec.apply_overrides(spec, overrides, where), where)
    except _spec.SpecError as e:
        shown = ", ".join(f"{k}={_spec.show(v)}" for k, v in overrides.items())
        raise _spec.SpecError(f"grid value {shown}: {e}") from None


def _service_table(spec: dict, key: str) -> dict | None:
    table = spec.get(key)
    return table if isinstance(table, dict) else None


def _traced_parameter(fam, spec: dict, path: str, values: tuple | None) -> _Traced | None:
    """How `path` is written inside the trace, or None where it is built (see the module's docstring). `values`:
    the axis's values (None for a parameter named in `grad` only, at the spec's value)."""
    table = fam.table
    if table is None:
        return None
    head, _, rest = path.partition(".")
    try:
        p = table.parameter(head)
    except KeyError:
        return None
    if p.field is None:
        return None
    numbers = values is None or all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers:
        return None
    if not rest and p.kind in ("rate", "number", "fraction") and p.sensitivity == "real":
        base = spec.get(head, p.default)
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            return None
        return _Traced(path, "real", p.field, float(base))
    if not rest and p.kind == "choice" and p.sensitivity == "choice":
        base = spec.get(head, p.default)
        if values is None:
            if isinstance(base, float):
                return _Traced(path, "choice", p.field, base, d_max=int(math.floor(base)) + 1)
            return None
        if all(isinstance(v, float) for v in values):  # real values: a randomised d
            return _Traced(path, "choice", p.field, float(base) if isinstance(base, (int, float)) else 1.0,
                           d_max=int(math.floor(max(values))) + 1)
        return None
    if p.kind == "ph" and p.sensitivity == "service mean" and rest in ("mean", "scv", "rate"):
        service = _service_table(spec, head)
        if service is None:
            return None
        kind = service.get("kind")
        parsed = _spec.parse_service(service, f"[{head}]")
        if kind in _TRACED_SERVICE_KINDS and rest in ("mean", "scv"):
            mean, scv = parsed.args
            return _Traced(path, "service " + rest, p.field, mean if rest == "mean" else scv,
                           maker=_TRACED_SERVICE_KINDS[kind])
        if kind == "erlang" and rest == "mean":
            k, mean = parsed.args
            return _Traced(path, "service mean", p.field, mean, maker="erlang", k=k)
        if kind == "exponential" and rest in ("mean", "rate") and ("rate" in service) == (rest == "rate"):
            (rate,) = parsed.args
            return _Traced(path, "service " + rest, p.field, rate if rest == "rate" else 1.0 / rate,
                           maker="exponential")
        if rest == "mean" and kind not in ("exponential", "erlang"):  # any other PH: time scaled
            return _Traced(path, "service mean", p.field, float("nan"))
    return None


def _group_key(model) -> Any:
    """The static structure of `model`, less its `K`: models of one key are traced together."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(model.with_K(2))
    return treedef, tuple((np.shape(x), np.result_type(x).str) for x in leaves)


def _sweep_key(spec: dict, axes: Sequence[_Axis], metrics, grad, percentiles, max_K: int, tail_tol: float) -> str:
    """What a stored sweep must match to be resumed: everything that fixes its values and its layout."""
    text = json.dumps({"spec": spec, "axes": [(a.name, a.path, list(a.values)) for a in axes],
                       "metrics": list(metrics), "grad": list(grad), "percentiles": list(percentiles),
                       "max_K": max_K, "tail_tol": tail_tol}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass
class _Chunk:
    index: int
    built: int  # index of the built model
    region: dict[str, slice]  # dataset dimension -> slice (a hyperrectangle of the grid)


def _chunks(axes: Sequence[_Axis], chunk_size: int) -> tuple[list[_Chunk], dict[str, int], list[tuple]]:
    """The chunks of the grid, the zarr chunk shape per dimension, and the built axes' value combinations (in the
    order of the built models)."""
    built_axes = [a for a in axes if not a.traced]
    traced_axes = [a for a in axes if a.traced]
    shape = [len(a.values) for a in traced_axes]
    # The first traced axis `split` whose trailing axes fit in a chunk: chunks take a range of it, whole axes after.
    split, trailing = len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        if trailing * shape[i] > chunk_size:
            split = i
            break
        trailing *= shape[i]
    else:
        split = -1
    if split == -1:  # every traced point of a built model in one chunk
        step = None
    else:
        step = max(1, chunk_size // trailing)
    zarr_chunks = {a.name: 1 for a in built_axes}
    for i, a in enumerate(traced_axes):
        zarr_chunks[a.name] = len(a.values) if split == -1 or i > split else (step if i == split else 1)
    combos = list(itertools.product(*(range(len(a.values)) for a in built_axes)))
    outer = [range(n) for n in shape[:split]] if split >= 0 else []
    ranges = [] if split == -1 else [slice(s, min(s + step, shape[split])) for s in range(0, shape[split], step)]
    out = []
    for b, combo in enumerate(combos):
        base = {a.name: slice(i, i + 1) for a, i in zip(built_axes, combo, strict=True)}
        if split == -1:
            out.append(_Chunk(len(out), b, {**base, **{a.name: slice(0, len(a.values)) for a in traced_axes}}))
            continue
        for idx in itertools.product(*outer):
            for r in ranges:
                region = dict(base)
                for i, a in enumerate(traced_axes):
                    region[a.name] = slice(idx[i], idx[i] + 1) if i < split else r if i == split else \
                        slice(0, len(a.values))
                out.append(_Chunk(len(out), b, region))
    return out, zarr_chunks, combos


@dataclasses.dataclass
class _Plan:
    """Everything a chunk's evaluation needs, made from the sweep's arguments alone (so that a Dask worker makes
    the same plan from them)."""

    spec: dict
    where: str
    axes: list[_Axis]
    traced: list[_Traced]  # the traced parameters: the traced axes, then those named in `grad` only
    metrics: tuple[str, ...]
    grad: tuple[str, ...]  # TOML paths
    grad_names: tuple[str, ...]  # as given
    percentiles: tuple[float, ...]
    max_K: int
    tail_tol: float
    models: list[Any]  # the built models, at their group's K
    groups: list[int]  # group index per built model
    waiting: bool  # whether the family has a waiting-time law
    chunks: list[_Chunk]
    zarr_chunks: dict[str, int]
    key: str

    @property
    def dims(self) -> list[str]:
        return [a.name for a in self.axes]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a.values) for a in self.axes)


def _make_plan(spec_or_model, grid, metrics, grad, percentiles, chunk_size, max_K, tail_tol) -> _Plan:
    spec, where = _spec_table(spec_or_model)
    parsed = _spec.parse_spec(spec, where)
    fam = parsed.family
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"grid={grid!r} must be a non-empty mapping of parameter names (TOML paths: lam, d, "
                         "service.scv) to values")
    axes: list[_Axis] = []
    traced: list[_Traced] = []
    seen: dict[str, str] = {}
    for name, values in grid.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"grid key {name!r} must be a parameter name (a TOML path: lam, d, service.scv)")
        path = _canonical(name, fam)
        if path in seen:
            raise ValueError(f"grid names {seen[path]!r} and {name!r}, which are the same parameter {path}; give it "
                             "once")
        seen[path] = name
        if path == "K":
            raise ValueError("grid['K']: a sweep chooses K at each point (the auto-K rule, up to max_K); leave K out "
                             "of the grid")
        vals = _as_values(name, values)
        for v in vals:  # the spec's checks of each value (keys, types, ranges), before anything is computed
            _check_value(spec, where, {path: v})
        t = _traced_parameter(fam, spec, path, vals)
        axes.append(_Axis(name, path, vals, t is not None))
        if t is not None:
            traced.append(t)
    metrics = tuple(metrics)
    if not metrics and not percentiles:
        raise ValueError("metrics=() and percentiles=(): give at least one metric or percentile to compute")
    grad_names = (grad,) if isinstance(grad, str) else tuple(grad)
    if grad_names and not metrics:
        raise ValueError(f"grad={list(grad_names)!r} needs at least one metric to differentiate")
    grad_paths = []
    for g in grad_names:
        path = _canonical(g, fam)
        axis = next((a for a in axes if a.path == path), None)
        if axis is not None and not axis.traced:
            raise ValueError(f"grad: {g} is a grid axis whose values change the model's structure (e.g. an integer "
                             "d); only real parameters are differentiated (give d as real numbers, 2.0, for a "
                             "randomised d)")
        if axis is None:
            t = _traced_parameter(fam, spec, path, None)
            if t is None:
                raise ValueError(f"grad: {g} is not a real parameter of model = {fam.name!r} that jsmkt.sweep "
                                 f"differentiates (its parameters: {', '.join(sorted(fam.params))})")
            traced.append(t)
        grad_paths.append(path)
    pct = tuple(float(p) for p in ((percentiles,) if isinstance(percentiles, (int, float)) else percentiles))
    for p in pct:
        if not 0.0 < p < 100.0:
            raise ValueError(f"percentiles: {p:g} is not a percentile in (0, 100) (e.g. 99.9 for p99.9)")
    # The built models, one per combination of the built axes' values, then grouped by structure.
    built_axes = [a for a in axes if not a.traced]
    chunk_size = int(chunk_size) if chunk_size is not None else None
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive number of points")
    chunks, zarr_chunks, combos = _chunks(axes, chunk_size or _default_chunk_size())
    models = []
    for combo in combos:
        overrides = {a.path: a.values[i] for a, i in zip(built_axes, combo, strict=True)}
        try:
            models.append(_spec._model_from_table(_spec.apply_overrides(spec, overrides, where), where))
        except _spec.SpecError as e:
            shown = ", ".join(f"{k}={_spec.show(v)}" for k, v in overrides.items())
            raise _spec.SpecError(f"grid point {shown}: {e}") from None
    keys: list[Any] = []
    groups = []
    for m in models:
        k = _group_key(m)
        if k not in keys:
            keys.append(k)
        groups.append(keys.index(k))
    K_of = {}
    for m, g in zip(models, groups, strict=True):
        K_of[g] = max(K_of.get(g, 0), m.K)
    if max_K is not None and (isinstance(max_K, bool) or not isinstance(max_K, (int, np.integer)) or max_K < 2):
        raise ValueError(f"max_K={max_K!r} must be an integer >= 2 (the largest truncation level tried)")
    max_K = int(max_K) if max_K is not None else _solver_default("max_K")
    models = [m.with_K(min(K_of[g], max_K)) if m.K != K_of[g] else m for m, g in zip(models, groups, strict=True)]
    model = models[0]
    waiting = _checked_laws(model, metrics, bool(pct), fam)
    tail_tol = float(tail_tol) if tail_tol is not None else _solver_default("tail_tol")
    if not 0.0 < tail_tol < 1.0:
        raise ValueError(f"tail_tol={tail_tol!r} must lie in (0, 1): the largest fraction of servers allowed at K")
    key = _sweep_key(spec, axes, metrics, grad_paths, pct, max_K, tail_tol)
    return _Plan(spec, where, axes, traced, metrics, tuple(grad_paths), grad_names, pct, max_K, tail_tol, models,
                 groups, waiting, chunks, zarr_chunks, key)


def _solver_default(name: str):
    """The default of `solve_fixed_point`'s argument `name`."""
    import inspect

    from ._fixed_point import solve_fixed_point

    return inspect.signature(solve_fixed_point).parameters[name].default


def _default_chunk_size(devices=None) -> int:
    """Points per chunk over `devices` (default: the local ones): on a CPU `_CPU_CHUNK` per device; on an
    accelerator a quarter of the smallest device memory over a generous estimate of a point's working memory, in
    powers of two."""
    import jax

    devices = list(jax.local_devices() if devices is None else devices)
    if devices[0].platform == "cpu":
        return _CPU_CHUNK * len(devices)
    try:
        memory = min(d.memory_stats()["bytes_limit"] for d in devices)
    except Exception:  # noqa: BLE001  (no memory statistics: a conservative size)
        return 1 << 16
    per_point = 1 << 16  # bytes: a solve's working set at the K and phases of typical sweeps, with margin
    n = max(1024, memory // 4 // per_point) * len(devices)
    return 1 << int(math.floor(math.log2(min(n, 1 << 22))))


_CHECKED: dict[Any, bool] = {}  # `_checked_laws` by model structure and arguments (each check traces a solve)


def _checked_laws(model, metrics: tuple, percentiles: bool, fam) -> bool:
    """Check that `metrics` (and, with `percentiles`, the sojourn-time law) are defined for `model`'s structure
    (`ValueError` naming the argument otherwise); give whether the family has a waiting-time law to give
    percentiles of. Remembered per structure: a sweep's plan is made at every call."""
    key = (_group_key(model), tuple(map(repr, metrics)), percentiles)
    if key not in _CHECKED:
        _check_metrics(model, metrics, fam)
        if percentiles:
            _check_sojourn(model)
        _CHECKED[key] = percentiles and _has_waiting_time(model)
    return _CHECKED[key]


def _scalar_metric(model, name: str):
    from . import _metrics, _sensitivity

    if name in _sensitivity.METRICS:
        return lambda m, fp: getattr(_metrics, name)(m, fp)
    if name in model.observables():
        return lambda m, fp: _metrics.family_metrics(m, fp)[name]
    if name == "spectral_abscissa":  # of the drift's Jacobian at the fixed point; eigenvalues on the host CPU
        from ._stability import abscissa_metric

        return abscissa_metric
    return None


def _check_metrics(model, metrics, fam) -> None:
    import jax

    from . import _sensitivity
    from ._fixed_point import solve_fixed_point

    names = list(_sensitivity.METRICS) + [n for n in model.observables() if n not in _sensitivity.METRICS] \
        + ["spectral_abscissa"]
    for name in metrics:
        fn = _scalar_metric(model, name) if isinstance(name, str) else None
        if fn is None:
            raise ValueError(f"metrics: {name!r} is not a metric of model = {fam.name!r}; give names of "
                             f"{', '.join(names)}")
        try:
            jax.eval_shape(lambda m, fn=fn: fn(m, solve_fixed_point(m, throw=False)), model)
        except ValueError as e:
            raise ValueError(f"metrics: {name!r}: {str(e).splitlines()[0]}") from None


def _has_waiting_time(model) -> bool:
    import jax

    from ._fixed_point import solve_fixed_point
    from ._sojourn import waiting_time_distribution

    try:
        jax.eval_shape(lambda m: waiting_time_distribution(m, solve_fixed_point(m, throw=False)).quantile(0.5), model)
    except ValueError:
        return False
    return True


def _check_sojourn(model) -> None:
    import jax

    from ._fixed_point import solve_fixed_point
    from ._sojourn import sojourn_time_distribution

    try:
        jax.eval_shape(lambda m: sojourn_time_distribution(m, solve_fixed_point(m, throw=False)).quantile(0.5), model)
    except ValueError as e:
        raise ValueError(f"percentiles: {str(e).splitlines()[0]}") from None


# --- evaluating a chunk ---------------------------------------------------------------------------------------------


def _with_values(model, traced: Sequence[_Traced], values: dict[str, Any]):
    """`model` with the traced parameters set to `values` (path -> traced scalar)."""
    import equinox as eqx
    import jax.numpy as jnp

    import jsmkt
    from ._choice import InterpolatedChoice
    from ._distributions.ph import PH

    service_fields: dict[str, dict[str, Any]] = {}
    for t in traced:
        v = values[t.path]
        if t.kind == "real":
            model = eqx.tree_at(lambda m, f=t.field: getattr(m, f), model, jnp.asarray(v, dtype=float))
        elif t.kind == "choice":
            model = eqx.tree_at(lambda m, f=t.field: getattr(m, f), model, InterpolatedChoice(v, d_max=t.d_max))
        else:
            service_fields.setdefault(t.field, {})[t.kind.removeprefix("service ")] = (t, v)
    for field, given in service_fields.items():
        S = getattr(model, field)
        t = next(iter(given.values()))[0]
        if t.maker is None:  # any PH: its mean set by scaling time (shape and SCV kept)
            _, mean = given["mean"]
            new = PH(S.alpha, S.T * (S.mean / mean))
        elif t.maker == "exponential":
            _, v = given.get("rate", given.get("mean"))
            new = jsmkt.exponential(v if "rate" in given else 1.0 / v)
        elif t.maker == "erlang":
            new = jsmkt.erlang(t.k, given["mean"][1])
        else:
            mean = given["mean"][1] if "mean" in given else S.mean
            scv = given["scv"][1] if "scv" in given else S.scv
            new = getattr(jsmkt, t.maker)(mean, scv)
        model = eqx.tree_at(lambda m, f=field: getattr(m, f), model, new)
    return model


def _point_function(plan: _Plan, max_terms: int):
    """`f(model, values) -> outputs` for one point: `values` maps the traced parameters' paths to scalars;
    `max_terms`, the uniformisation steps of the sojourn- and waiting-time laws (a law that needs more is NaN:
    `throw=False`)."""
    import jax
    import jax.numpy as jnp

    from ._fixed_point import solve_fixed_point
    from ._solution import RESULTS
    from ._sojourn import sojourn_time_distribution, waiting_time_distribution

    p = jnp.asarray([q / 100.0 for q in plan.percentiles])

    def solve(model, values):
        m = _with_values(model, plan.traced, values)
        return m, solve_fixed_point(m, throw=False, tail_tol=plan.tail_tol)

    def metric_vector(model, values):
        m, fp = solve(model, values)
        vec = jnp.stack([_scalar_metric(m, name)(m, fp) for name in plan.metrics]) if plan.metrics \
            else jnp.zeros(0)
        return vec, (m, fp)

    def f(model, values):
        if plan.grad:
            def of_grad(g):
                vec, aux = metric_vector(model, {**values, **g})
                return vec, (vec, aux)

            g0 = {path: values[path] for path in plan.grad}
            # Forward mode: one tangent per parameter, one linear solve each (`optx.ImplicitAdjoint`).
            jac, (vec, (m, fp)) = jax.jacfwd(of_grad, has_aux=True)(g0)
            grads = jnp.stack([jac[path] for path in plan.grad], axis=-1)  # (metrics, wrt)
        else:
            vec, (m, fp) = metric_vector(model, values)
            grads = None
        ok = fp.result == RESULTS.successful
        nan = jnp.asarray(jnp.nan)
        out = {"metrics": jnp.where(ok, vec, nan), "result": fp.result._value.astype(jnp.int32),
               "tail_mass": fp.tail_mass}
        if grads is not None:
            out["grads"] = jnp.where(ok, grads, nan)
        if plan.percentiles:
            out["sojourn"] = jnp.where(ok, sojourn_time_distribution(m, fp, max_terms=max_terms, throw=False)
                                       .quantile(p), nan)
            if plan.waiting:
                out["waiting"] = jnp.where(ok, waiting_time_distribution(m, fp, max_terms=max_terms, throw=False)
                                           .quantile(p), nan)
        return out

    return f


@functools.lru_cache(maxsize=16)
def _compiled(key: str, devices: tuple, block: int, max_terms: int):
    """`(fn, sharding)`: the compiled evaluation of points of the plan of `key` (in `_PLANS`), `fn(model, values)`
    with every leaf of `values` of shape `(len(devices), n)`, placed by `sharding` (row i on device i): each device
    evaluates its row in vmapped blocks of `block` points (`jax.lax.map`). One code path for every number of
    devices: XLA's partitioner keeps each row on its device. (`filter_jit`: traced again for another model
    structure, `K` or number of points.)"""
    import equinox as eqx
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from ._batched import batched

    point = _point_function(_PLANS[key], max_terms)
    sharding = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec("devices"))

    def row(model, values):
        return batched(lambda v: point(model, v), block=block)(values)

    @eqx.filter_jit
    def fn(model, values):
        values = jax.lax.with_sharding_constraint(values, sharding)
        return jax.lax.with_sharding_constraint(jax.vmap(row, in_axes=(None, 0))(model, values), sharding)

    return fn, sharding


_PLANS: dict[str, _Plan] = {}  # plans by their key, for `_compiled`


def _chunk_values(plan: _Plan, chunk: _Chunk) -> dict[str, np.ndarray]:
    """The traced parameters' values at a chunk's points, flattened in C order over the chunk's region."""
    traced_axes = {a.path: a for a in plan.axes if a.traced}
    size = int(np.prod([r.stop - r.start for r in chunk.region.values()]))
    if not plan.traced:  # every axis built: the chunk is one point
        return {"": np.zeros(size)}
    grids = []
    for a in plan.axes:
        r = chunk.region[a.name]
        grids.append(np.asarray(a.values[r], dtype=float) if a.traced else np.zeros(r.stop - r.start))
    mesh = np.meshgrid(*grids, indexing="ij") if grids else []
    by_name = {a.name: g.ravel() for a, g in zip(plan.axes, mesh, strict=True)}
    out = {}
    for t in plan.traced:
        axis = traced_axes.get(t.path)
        if axis is not None:
            out[t.path] = by_name[axis.name]
        else:
            out[t.path] = np.full(size, t.base)
    return out


def _block(devices) -> int:
    return _CPU_BLOCK if devices[0].platform == "cpu" else 1 << 30


def _evaluate(plan: _Plan, model, values: dict[str, np.ndarray], devices) -> dict:
    """The outputs at the points `values` of one built model. Every point is solved at the model's `K`, and again
    at `2K`, `4K`, ... (up to `max_K`) while the fraction of servers at `K` is too large (the auto-K rule, point by
    point); its sojourn- and waiting-time laws take `_TERMS[0]` uniformisation steps, and more (`_TERMS`) where
    the law's tail outlasts them. Each `(K, steps)` compiles once; few points take the later ones."""
    import jax

    from ._solution import RESULTS

    n = len(next(iter(values.values())))
    nd, block = len(devices), _block(devices)
    truncated = int(RESULTS.truncation_too_small._value)

    def run(K, level, idx):
        m = len(idx)
        if m <= block * nd:  # a power of two per device: few distinct shapes, each compiled once
            size = nd * (1 << max(0, (-(-m // nd) - 1).bit_length()))
        else:
            size = -(-m // (nd * block)) * nd * block
        padded = {k: np.concatenate([v[idx], np.full(size - m, v[idx][-1])]).reshape(nd, -1)
                  for k, v in values.items()}
        fn, sharding = _compiled(plan.key, tuple(devices), block, _TERMS[level] if plan.percentiles else 0)
        out = fn(model.with_K(K) if K != model.K else model, jax.device_put(padded, sharding))
        return jax.tree_util.tree_map(lambda x: np.array(x).reshape(size, *x.shape[2:])[:m], out)

    Ks = np.full(n, model.K, dtype=np.int64)
    levels = np.zeros(n, dtype=np.int64)
    out = run(model.K, 0, np.arange(n))
    while True:
        short = (out["result"] == truncated) & (Ks < plan.max_K)
        steps = (out["result"] == 0) & (levels < len(_TERMS) - 1) & _laws_outlast(plan, out)
        Ks[short] = np.minimum(2 * Ks[short], plan.max_K)
        levels[steps] += 1
        again = np.flatnonzero(short | steps)
        if not len(again):
            break
        for K, level in sorted(set(zip(Ks[again].tolist(), levels[again].tolist(), strict=True))):
            idx = again[(Ks[again] == K) & (levels[again] == level)]
            sub = run(K, level, idx)
            for k in out:
                out[k][idx] = sub[k]
    # A law that outlasts the most steps: the point failed (no percentile to give), as Newton's step limit.
    over = (out["result"] == 0) & _laws_outlast(plan, out)
    out["result"][over] = int(RESULTS.max_steps_reached._value)
    for k in ("metrics", "grads", "sojourn", "waiting"):
        if k in out:
            out[k][over] = np.nan
    out["K"] = Ks
    return out


def _laws_outlast(plan: _Plan, out: dict) -> np.ndarray:
    """Per point: whether a percentile is NaN at a successful fixed point (its law outlasted the steps taken)."""
    bad = np.zeros(len(out["result"]), dtype=bool)
    for k in ("sojourn", "waiting"):
        if k in out:
            bad |= np.isnan(out[k]).any(axis=-1)
    return bad


# --- the dataset and the store -------------------------------------------------------------------------------------


def _variables(plan: _Plan) -> dict[str, tuple[tuple[str, ...], Any]]:
    """name -> (extra dimensions, dtype) of the dataset's variables."""
    out: dict[str, tuple[tuple[str, ...], Any]] = {name: ((), np.float64) for name in plan.metrics}
    if plan.grad:
        out.update({f"{name}_grad": (("wrt",), np.float64) for name in plan.metrics})
    if plan.percentiles:
        out["sojourn_time_percentiles"] = (("percentile",), np.float64)
        if plan.waiting:
            out["waiting_time_percentiles"] = (("percentile",), np.float64)
    out["K"] = ((), np.int64)
    out["result"] = ((), np.int32)  # last: a chunk whose result is written is whole
    return out


def _result_attrs() -> dict[str, Any]:
    from ._solution import RESULTS

    items = sorted((int(item._value), name) for name, item in RESULTS._name_to_item.items())
    return {"flag_values": [v for v, _ in items], "flag_meanings": " ".join(n for _, n in items),
            "long_name": "outcome of the fixed-point solve (0: successful); -1: not evaluated yet"}


def _empty_dataset(plan: _Plan, attrs: dict):
    import xarray as xr

    dims = plan.dims
    coords: dict[str, Any] = {a.name: (a.name, np.asarray(a.values)) for a in plan.axes}
    if plan.grad:
        coords["wrt"] = ("wrt", np.asarray(plan.grad_names, dtype=object))  # variable-length strings
    if plan.percentiles:
        coords["percentile"] = ("percentile", np.asarray(plan.percentiles))
    data = {}
    for name, (extra, dtype) in _variables(plan).items():
        shape = plan.shape + tuple(len(coords[e][1]) for e in extra)
        fill = np.nan if dtype == np.float64 else _NOT_DONE
        data[name] = ((*dims, *extra), np.full(shape, fill, dtype=dtype))
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["result"].attrs.update(_result_attrs())
    ds["K"].attrs["long_name"] = "truncation level of the point's solve (-1: not evaluated yet)"
    for name in plan.metrics:
        ds[name].attrs["long_name"] = name.replace("_", " ")
    return ds


def _chunk_dataset(plan: _Plan, chunk: _Chunk, out: dict):
    """The outputs of a chunk as a Dataset of its region's shape (no coordinates: `to_zarr(region=...)`)."""
    import xarray as xr

    shape = tuple(chunk.region[d].stop - chunk.region[d].start for d in plan.dims)
    data = {}
    for i, name in enumerate(plan.metrics):
        data[name] = (plan.dims, out["metrics"][:, i].reshape(shape))
        if plan.grad:
            data[f"{name}_grad"] = ((*plan.dims, "wrt"), out["grads"][:, i, :].reshape(*shape, len(plan.grad)))
    if plan.percentiles:
        data["sojourn_time_percentiles"] = ((*plan.dims, "percentile"), out["sojourn"].reshape(*shape, -1))
        if plan.waiting:
            data["waiting_time_percentiles"] = ((*plan.dims, "percentile"), out["waiting"].reshape(*shape, -1))
    data["K"] = (plan.dims, out["K"].astype(np.int64).reshape(shape))
    data["result"] = (plan.dims, out["result"].astype(np.int32).reshape(shape))
    return xr.Dataset(data)


def _zarr_encoding(plan: _Plan, ds) -> dict:
    enc = {}
    for name, var in ds.data_vars.items():
        chunks = tuple(plan.zarr_chunks.get(d, var.sizes[d]) for d in var.dims)
        enc[name] = {"chunks": chunks}
    return enc


def _write_region(path: str, plan: _Plan, chunk: _Chunk, ds_chunk) -> None:
    """Write a chunk's values to its region of the store, `result` last."""
    region = {d: chunk.region[d] for d in plan.dims}
    rest = ds_chunk.drop_vars(["result"])
    if rest.data_vars:
        rest.to_zarr(path, region=region, mode="r+", consolidated=False)
    ds_chunk[["result"]].to_zarr(path, region=region, mode="r+", consolidated=False)


def _stored_chunk_size(path: str) -> int | None:
    """The points per chunk of an existing sweep store (the product of its zarr chunks over the grid's axes that
    are cut, which `_chunks` turns back into the same chunks), or None where there is no store to resume."""
    import zarr

    try:
        result = zarr.open_group(path, mode="r")["result"]
    except Exception:  # noqa: BLE001  (no store, or not one of a sweep: `_open_store` says which)
        return None
    return int(np.prod(result.chunks))


def _done_chunks(path: str, plan: _Plan) -> set[int]:
    """The chunks whose `result` is written in the store."""
    import zarr

    result = np.asarray(zarr.open_group(path, mode="r")["result"][...])
    done = set()
    for c in plan.chunks:
        sl = tuple(c.region[d] for d in plan.dims)
        if np.all(result[sl] != _NOT_DONE):
            done.add(c.index)
    return done


def _open_store(path: str, plan: _Plan, attrs: dict, resume: bool) -> set[int]:
    """Create the store (or, resuming, check that it holds this sweep) and give the chunks already done."""
    import shutil

    import xarray as xr

    p = pathlib.Path(path)
    if p.exists() and resume:
        try:
            stored = xr.open_zarr(path).attrs.get("sweep_key")
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"out={path}: exists and is not a sweep's zarr store ({type(e).__name__}); remove it "
                             "or choose another path") from None
        if stored != plan.key:
            raise ValueError(f"out={path}: holds another sweep (its spec, grid, metrics or options differ); remove "
                             "it, choose another path, or pass resume=False to overwrite it")
        return _done_chunks(path, plan)
    if p.exists():
        if not (p / "zarr.json").exists() and not (p / ".zgroup").exists():
            raise ValueError(f"out={path}: exists and is not a zarr store; remove it or choose another path")
        shutil.rmtree(p)
    ds = _empty_dataset(plan, attrs)
    # Zarr's format 2, which every zarr reader knows, with its metadata consolidated once here (region writes leave it
    # as it is), so that `xarray.open_zarr` reads it at once.
    ds.to_zarr(path, mode="w", encoding=_zarr_encoding(plan, ds), consolidated=True, zarr_format=2)
    return set()


# --- the sweep ------------------------------------------------------------------------------------------------------


def _attrs(plan: _Plan, devices) -> dict[str, Any]:
    import jax
    import tomli_w

    from ._version import __version__

    return {"spec": tomli_w.dumps(plan.spec), "jsmkt_version": __version__, "jax_version": jax.__version__,
            "devices": ", ".join(str(d) for d in devices), "date": datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds"), "sweep_key": plan.key, "points": int(np.prod(plan.shape))}


class _Interrupt:
    """SIGINT handled as a request to stop after the chunk in flight (main thread only)."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _progress_bar(progress, total: int):
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=total, unit="pt", disable=not show, file=sys.stderr, desc="jsmkt sweep", dynamic_ncols=True)


def _worker_chunk(args: dict, chunk_indices: list[int], out: str | None):
    """A Dask task: make the plan from the sweep's arguments, evaluate the chunks, write them to the store (when
    `out` is one) and give `(index, outputs or None)` per chunk."""
    import jax

    import jsmkt  # noqa: F401  (float64)

    plan = _cached_plan(args)
    devices = jax.local_devices()
    results = []
    for i in chunk_indices:
        c = plan.chunks[i]
        values = _chunk_values(plan, c)
        outputs = _evaluate(plan, plan.models[c.built], values, devices)
        if out is not None:
            _write_region(out, plan, c, _chunk_dataset(plan, c, outputs))
            results.append((i, {"result": outputs["result"]}))
        else:
            results.append((i, outputs))
    return results


@functools.lru_cache(maxsize=4)
def _cached_plan_by_key(text: str) -> _Plan:
    args = json.loads(text)
    plan = _make_plan(args["spec"], {k: v for k, v in args["grid"]}, args["metrics"], args["grad"],
                      args["percentiles"], args["chunk_size"], args["max_K"], args["tail_tol"])
    _PLANS[plan.key] = plan
    return plan


def _cached_plan(args: dict) -> _Plan:
    return _cached_plan_by_key(json.dumps(args, sort_keys=True, default=str))


def sweep(spec_or_model, grid: Mapping[str, Any], *, metrics: Sequence[str] = ("mean_sojourn_time",),
          grad: Sequence[str] = (), percentiles: Sequence[float] = (), chunk_size: int | None = None,
          devices: Sequence | None = None, out: str | os.PathLike | None = None, resume: bool = True,
          client: Any = None, progress: bool | None = None, max_K: int | None = None,
          tail_tol: float | None = None):
    r"""Evaluate the mean field of a model over a grid of its parameters.

    **Arguments:**

    - `spec_or_model`: a TOML spec's path, a TOML table (`dict`, as `tomllib` reads a spec) or a model of a
      registered family (its spec: `jsmkt.dump_spec`).
    - `grid`: `{name: values}`, one axis per parameter, named by its TOML path (`lam`, `d`, `service.mean`,
      `service.scv`, `theta`; `mean`, `scv` short for the service's). Values are read as TOML reads them: an
      integer `d` is a fixed choice number, a real one (`2.0`, `2.5`) randomised.
    - `metrics`: names of scalar metrics (`mean_sojourn_time`, `mean_queue_length`, `mean_waiting_time`,
      `prob_wait`, `utilisation`, `throughput`, ... and the family's own: `mean_orbit_size`, `availability`, ...;
      `spectral_abscissa`, of the drift's Jacobian at the fixed point, `jsmkt.stability`: its eigenvalues are
      computed on the host CPU through `jax.pure_callback`, a batch at a time).
    - `grad`: parameters (TOML paths) to differentiate every metric by: real parameters only (a rate, a real `d`,
      a service's mean, or its SCV where the service is given by mean and SCV). A parameter not on the grid is
      differentiated at the spec's value.
    - `percentiles`: percentiles (in (0, 100)) of the sojourn time and, where the family has one, the waiting time.
    - `chunk_size`: points per chunk (default: from the devices: 16384 per CPU device; on a GPU from its memory).
    - `devices`: the JAX devices to shard each chunk over (default: every local device; see `jsmkt.use_cpu_cores`
      to expose a CPU's cores as devices).
    - `out`: where to write the results: a `.zarr` store, written chunk by chunk and resumed by the same call;
      `.nc` (netCDF, needs h5netcdf), `.parquet` (needs pyarrow) or `.csv` (one row per point), written at the end.
    - `resume`: with `out` a store of this sweep, skip its finished chunks (default); `False` overwrites it.
    - `client`: a Dask `distributed.Client`: chunks run as Dask tasks on its workers (retried if a worker is lost).
    - `progress`: a progress bar on stderr; by default when stderr is a terminal.
    - `max_K`: the largest truncation level tried (default: `solve_fixed_point`'s); a point needing more is flagged.
    - `tail_tol`: the largest fraction of servers allowed at the truncation level (default: `solve_fixed_point`'s);
      a smaller one takes a larger `K` where the tail falls slowly (near saturation with `d = 1`).

    **Returns:** an `xarray.Dataset` with one dimension per grid axis (its values as coordinates): a variable per
    metric; `{metric}_grad` with a `wrt` dimension; `sojourn_time_percentiles` and `waiting_time_percentiles` with a
    `percentile` dimension; `K`, the truncation level of each point; `result`, the solve's `jsmkt.RESULTS` code per
    point (CF `flag_values`/`flag_meanings`; 0 is successful). A failed point is NaN in every variable. Attributes:
    the spec (TOML), jsmkt's and JAX's versions, the devices, the date, the number of points and of failed points.

    **Raises:** `ValueError` (a `jsmkt.SpecError` for spec values) naming the argument, before anything is computed;
    `jsmkt.SweepInterrupted` (a `KeyboardInterrupt`) after Ctrl-C, once the chunk in flight is written.

    !!! example

        ```python
        ds = jsmkt.sweep("examples/jsq2_h2.toml", {"lam": np.linspace(0.5, 0.95, 10), "d": [1, 2, 3]},
                         metrics=["mean_sojourn_time", "prob_wait"], percentiles=[99], grad=["lam"])
        ds.mean_sojourn_time.sel(d=2)
        ```
    """
    import jax

    import jsmkt  # noqa: F401  (float64)

    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer))
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive number of points (or None: from the devices)")
    if resume not in (True, False):
        raise ValueError(f"resume={resume!r} must be True or False")
    if progress not in (None, True, False):
        raise ValueError(f"progress={progress!r} must be None (a bar when stderr is a terminal), True or False")
    grid_items = list(grid.items()) if isinstance(grid, Mapping) else grid
    out_path = None if out is None else os.fspath(out)
    if out_path is not None and not out_path.endswith(_OUT_KINDS):
        raise ValueError(f"out={out_path}: give a path ending in {', '.join(_OUT_KINDS)}")
    devices = list(jax.local_devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices=[]: give at least one JAX device (or None for every local device)")
    zarr_out = out_path if out_path is not None and out_path.endswith(".zarr") else None
    stored = _stored_chunk_size(zarr_out) if zarr_out is not None and resume else None
    # A resumed store keeps its chunks (whatever the devices now); a cluster's workers take the chunks made here.
    chunk_size = stored or chunk_size or _default_chunk_size(devices)
    plan = _make_plan(spec_or_model, grid, metrics, grad, percentiles, chunk_size, max_K, tail_tol)
    _PLANS[plan.key] = plan
    attrs = _attrs(plan, devices)
    done = _open_store(zarr_out, plan, attrs, resume) if zarr_out is not None else set()
    ds = _empty_dataset(plan, attrs)
    todo = [c for c in plan.chunks if c.index not in done]
    total = int(np.prod(plan.shape))
    failed = 0
    bar = _progress_bar(progress, total)
    bar.update(total - sum(_size(c) for c in todo))

    try:
        with _Interrupt() as interrupt:
            if client is None:
                for c in todo:
                    values = _chunk_values(plan, c)
                    outputs = _evaluate(plan, plan.models[c.built], values, devices)
                    part = _chunk_dataset(plan, c, outputs)
                    if zarr_out is not None:
                        _write_region(zarr_out, plan, c, part)
                    _assign(ds, plan, c, part)
                    failed += int(np.sum(outputs["result"] != 0))
                    bar.update(_size(c))
                    bar.set_postfix(failed=failed, refresh=False)
                    if interrupt.requested:
                        break
            else:
                failed += _run_on_cluster(client, plan, todo, grid_items, chunk_size, zarr_out, ds, bar, interrupt)
    finally:
        bar.close()
    if interrupt.requested:
        remaining = len(plan.chunks) - len(done) - sum(1 for c in todo if _assigned(ds, plan, c))
        where = f"out={zarr_out}" if zarr_out else "no out= store, so nothing was kept"
        raise SweepInterrupted(f"the sweep stopped after the chunk in flight, {remaining} of {len(plan.chunks)} chunks "
                               f"left ({where}); run the same sweep again to resume" if zarr_out else
                               f"the sweep stopped after the chunk in flight ({where}); pass out='....zarr' to keep "
                               "finished chunks and resume")
    if zarr_out is not None:
        import xarray as xr

        ds = xr.open_zarr(zarr_out).load()
        ds.attrs.update(date=attrs["date"])
    failed_total = int(np.sum(ds["result"].values != 0))
    ds.attrs["failed"] = failed_total
    if zarr_out is not None:
        import zarr

        zarr.open_group(zarr_out, mode="r+").attrs.update({"failed": failed_total, "date": attrs["date"]})
        zarr.consolidate_metadata(zarr_out)
    elif out_path is not None:
        export(ds, out_path)
    if failed_total:
        print(f"jsmkt: sweep: {failed_total} of {total} points failed (NaN; see the `result` variable: "
              f"{_failure_counts(ds)})", file=sys.stderr)
    return ds


def _size(c: _Chunk) -> int:
    return int(np.prod([r.stop - r.start for r in c.region.values()]))


def _assign(ds, plan: _Plan, c: _Chunk, part) -> None:
    sl = {d: c.region[d] for d in plan.dims}
    for name, var in part.data_vars.items():
        ds[name][sl] = var.values


def _assigned(ds, plan: _Plan, c: _Chunk) -> bool:
    sl = {d: c.region[d] for d in plan.dims}
    return bool(np.all(ds["result"][sl].values != _NOT_DONE))


def _failure_counts(ds) -> str:
    codes, counts = np.unique(ds["result"].values[ds["result"].values != 0], return_counts=True)
    names = dict(zip(ds["result"].attrs["flag_values"], ds["result"].attrs["flag_meanings"].split(), strict=True))
    return ", ".join(f"{n} {names.get(int(c), c)}" for c, n in zip(codes, counts, strict=True))


def _run_on_cluster(client, plan: _Plan, todo, grid_items, chunk_size: int, zarr_out, ds, bar, interrupt) -> int:
    """Run the chunks `todo` as Dask tasks; give the number of failed points."""
    try:
        from distributed import as_completed
    except ModuleNotFoundError:
        raise ModuleNotFoundError("client=: running a sweep on a Dask cluster needs the package distributed: pip "
                                  "install 'jsmkt[cluster]'") from None
    args = {"spec": plan.spec, "grid": [(k, list(_as_values(k, v))) for k, v in grid_items],
            "metrics": list(plan.metrics), "grad": list(plan.grad_names), "percentiles": list(plan.percentiles),
            "chunk_size": chunk_size, "max_K": plan.max_K, "tail_tol": plan.tail_tol}
    # The workers make the same plan from the same arguments (the chunks included): check it here.
    futures = [client.submit(_worker_chunk, args, [c.index], zarr_out, pure=False, retries=3) for c in todo]
    failed = 0
    for fut in as_completed(futures):
        for i, outputs in fut.result():
            c = plan.chunks[i]
            if zarr_out is None:
                part = _chunk_dataset(plan, c, outputs)
                _assign(ds, plan, c, part)
            else:
                ds["result"][{d: c.region[d] for d in plan.dims}] = outputs["result"].reshape(
                    tuple(c.region[d].stop - c.region[d].start for d in plan.dims))
            failed += int(np.sum(outputs["result"] != 0))
            bar.update(_size(c))
            bar.set_postfix(failed=failed, refresh=False)
        if interrupt.requested:
            for f in futures:
                f.cancel()
            break
    return failed


def export(ds, path: str | os.PathLike) -> None:
    """Write a sweep's dataset to `path` by its suffix: `.zarr`, `.nc` (netCDF through h5netcdf), `.parquet`
    (pyarrow) or `.csv`; the last two as a tidy long table, one row per point (a percentile or a `wrt` entry is a
    column of its own: `sojourn_time_p99`, `mean_sojourn_time_grad_lam`)."""
    path = os.fspath(path)
    if path.endswith(".zarr"):
        ds.to_zarr(path, mode="w", consolidated=True, zarr_format=2)
    elif path.endswith(".nc"):
        try:
            import h5netcdf  # noqa: F401
        except ModuleNotFoundError:
            raise ModuleNotFoundError("out=*.nc needs the package h5netcdf: pip install 'jsmkt[export]'") from None
        clean = ds.copy()
        clean.attrs = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in ds.attrs.items()}
        clean.to_netcdf(path, engine="h5netcdf")
    elif path.endswith((".parquet", ".csv")):
        table = tidy(ds)
        if path.endswith(".parquet"):
            try:
                import pyarrow  # noqa: F401
            except ModuleNotFoundError:
                raise ModuleNotFoundError("out=*.parquet needs the package pyarrow: pip install 'jsmkt[export]'") \
                    from None
            table.to_parquet(path, index=False)
        else:
            table.to_csv(path, index=False)
    else:
        raise ValueError(f"out={path}: give a path ending in {', '.join(_OUT_KINDS)}")


def tidy(ds):
    """A sweep's dataset as a `pandas.DataFrame` with one row per grid point: the grid axes, then one column per
    variable, a percentile or `wrt` entry in a column of its own (`sojourn_time_p99`, `mean_sojourn_time_grad_lam`)."""
    import xarray as xr

    flat = {}
    for name, var in ds.data_vars.items():
        if "percentile" in var.dims:
            stem = name.removesuffix("_percentiles")
            for p in var["percentile"].values:
                flat[f"{stem}_{percentile_label(float(p))}"] = var.sel(percentile=p).drop_vars("percentile")
        elif "wrt" in var.dims:
            for w in var["wrt"].values:
                flat[f"{name}_{w}"] = var.sel(wrt=w).drop_vars("wrt")
        else:
            flat[name] = var
    dims = [d for d in ds.dims if d not in ("percentile", "wrt")]
    return xr.Dataset(flat).to_dataframe().reset_index()[[*dims, *flat]]
