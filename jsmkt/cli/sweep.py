"""`jsmkt sweep`: a spec's metrics over a grid of its named parameters (`jsmkt.sweep`), with `--set` applied to the
spec first; a summary on stdout, and without `--out` the results themselves, one row (or JSON record) per point."""

import argparse
import json
import math
import os
import re
import sys
import time
from typing import Any

from .grid import grid_option, percentile_list
from .spec import SpecError, _parse


_OUT_TYPES = (".zarr", ".nc", ".parquet", ".csv")
_DEFAULT_METRICS = ("mean_sojourn_time",)

# `jsmkt.sweep`'s argument names, as its messages write them (`chunk_size=0`, `metrics: ...`, `grid['lam']`), and
# the options that set them.
_SWEEP_OPTION_NAMES = {
    "chunk_size": "--chunk-size", "metrics": "--metric", "grad": "--grad", "percentiles": "--percentiles",
    "out": "--out", "grid": "--grid",
}
_SWEEP_OPTIONS = re.compile(r"(?<![\w.-])(" + "|".join(_SWEEP_OPTION_NAMES) + r")(?=[=:\[])")


def _in_options(message: str) -> str:
    """A message of `jsmkt.sweep` in the names of the command's options."""
    message = _SWEEP_OPTIONS.sub(lambda m: _SWEEP_OPTION_NAMES[m.group(1)], message)
    message = re.sub(r"--grid\['([^']*)'\]", r"--grid \1", message)
    message = re.sub(r"^grid (value|point) ([^:]*): (override [^:]*: |spec: )?", r"--grid \2: ", message)
    return message.replace("resume=False", "--no-resume")

_SWEEP_DESCRIPTION = (
    "Evaluate metrics of a model spec (TOML) at every point of a grid over its named parameters (jsmkt.sweep): "
    "the mean-field fixed point of each point, at a truncation K chosen per group of points, its metrics, their "
    "derivatives (--grad) and sojourn- and waiting-time percentiles (--percentiles). A parameter is named by its "
    "TOML path (lam, d, service.scv, service.mean); an integer value of d is a fixed choice number, a real one (2.5) "
    "is randomised, as in a spec. A point that fails (an unstable load, a truncation too small) is NaN in every "
    "value and flagged in its result; it never stops the sweep. With --out the dataset is written to a file: a .zarr "
    "store is written chunk by chunk, and the same command run again after an interruption (Ctrl-C, a killed "
    "process) resumes it, skipping the finished chunks; .nc (netCDF), .parquet and .csv (one row per point) are "
    "written at the end. Without --out the results are printed, one row per point."
)


def _names(values: list[str] | None, option: str) -> tuple[str, ...]:
    """The names of an option given several times and/or as a comma-separated list, each once, in order."""
    out: list[str] = []
    for value in values or []:
        for name in value.split(","):
            name = name.strip()
            if not name:
                raise SpecError(f"{option} {value!r} has an empty name; separate names by commas (e.g. lam,d)")
            if name not in out:
                out.append(name)
    return tuple(out)


def _grid(items: list[tuple[str, list]]) -> dict[str, list]:
    grid: dict[str, list] = {}
    for name, values in items:
        if name in grid:
            raise SpecError(f"--grid {name} is given twice; give each parameter once, with all its values (e.g. "
                            f"--grid {name}=1,2,3)")
        if len(set(values)) != len(values):
            raise SpecError(f"--grid {name} has a value twice ({', '.join(map(str, values))}); give each value once")
        grid[name] = values
    return grid


def _check_out(path: str) -> None:
    """Refuse an `--out PATH` that cannot be written, before any solve."""
    ext = os.path.splitext(path.rstrip("/" + os.sep))[1].lower()
    if ext not in _OUT_TYPES:
        what = f"file type {ext} is not supported" if ext else "has no file extension"
        raise SpecError(f"--out={path}: {what}; end the name with .zarr (written chunk by chunk, resumable), .nc "
                        "(netCDF), .parquet or .csv (one row per point)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SpecError(f"--out={path}: directory {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"--out={path}: directory {folder} is not writable")
    if ext != ".zarr" and os.path.isdir(path):
        raise SpecError(f"--out={path} is a directory; give a file name")


def _client(address: str):
    """A `distributed.Client` connected to the scheduler at `address`."""
    try:
        import distributed
    except ImportError:
        raise SpecError("--scheduler needs Dask's distributed package: pip install 'jsmkt[cluster]'") from None
    try:
        return distributed.Client(address)
    except (OSError, TimeoutError) as e:  # no scheduler there (distributed raises OSError after its timeout)
        raise RuntimeError(f"--scheduler {address}: cannot connect to a Dask scheduler ({e})") from None
    except ValueError as e:  # an address distributed cannot read
        raise SpecError(f"--scheduler {address}: {e} (e.g. tcp://10.0.0.5:8786)") from None


def _python(v) -> Any:
    """A NumPy scalar as the Python int, float (None for NaN: JSON has no NaN) or string it holds."""
    import numpy as np

    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _columns(ds) -> list[tuple[str, Any, dict]]:
    """The dataset's variables as columns of a table with one row per grid point: `(name, variable, selection)`,
    a variable over the grid alone as itself, one with another dimension (`wrt`, `percentile`) as one column per
    value of it, named as in the sweep's .csv and .parquet tables: `mean_sojourn_time_grad_lam`,
    `sojourn_time_p99`. The metrics first, then the derivatives, the sojourn- and waiting-time percentiles, `K` and
    `result`."""
    from .._errors import percentile_label

    dims = _grid_dims(ds)
    cols, last = [], []
    for name, var in ds.data_vars.items():
        extra = [d for d in var.dims if d not in dims]
        if not set(dims) <= set(var.dims) or len(extra) > 1:
            continue
        if not extra:
            (last if name in ("K", "result") else cols).append((name, var, {}))
            continue
        (dim,) = extra
        for value in ds[dim].values:
            if dim == "percentile":
                label = f"{name.removesuffix('_percentiles')}_{percentile_label(float(value))}"
            else:
                label = f"{name}_{_python(value)}"
            cols.append((label, var, {dim: value}))
    order = lambda c: (0 if not c[2] else 1 if "wrt" in c[2] else 2 if c[0].startswith("sojourn_") else 3)  # noqa: E731
    return sorted(cols, key=order) + sorted(last, key=lambda c: c[0] != "K")


def _grid_dims(ds) -> tuple[str, ...]:
    """The grid's axes: the dimensions of `result` (one value per point)."""
    return tuple(ds["result"].dims)


def _result_names(ds) -> dict[int, str]:
    attrs = ds["result"].attrs
    values = [int(v) for v in list(attrs.get("flag_values", []))]
    names = str(attrs.get("flag_meanings", "")).split()
    return dict(zip(values, names, strict=False))


def records(ds) -> list[dict[str, Any]]:
    """The sweep's results as a tidy table, one record per grid point (in the grid's order, the last axis varying
    fastest): the point's grid values, then its values (NaN as None), `K` and `result` (its name)."""
    import numpy as np

    dims = _grid_dims(ds)
    cols = [(label, np.asarray(var.sel(sel).transpose(*dims).values)) for label, var, sel in _columns(ds)]
    axes = [ds[d].values for d in dims]
    names = _result_names(ds)
    out = []
    for index in np.ndindex(*(len(a) for a in axes)):
        rec = {d: _python(a[i]) for d, a, i in zip(dims, axes, index, strict=True)}
        for label, values in cols:
            v = _python(values[index])
            if label in ("K", "result") and isinstance(v, float) and v.is_integer():  # integers read back as floats
                v = int(v)
            rec[label] = names.get(v, v) if label == "result" else v
        out.append(rec)
    return out


def _failures(ds) -> dict[str, int]:
    """The number of failed points by their result's name."""
    import numpy as np

    names = _result_names(ds)
    codes, counts = np.unique(np.asarray(ds["result"].values, dtype=float), return_counts=True)
    out = {}
    for c, n in zip(codes, counts, strict=True):
        name = names.get(int(c), str(int(c))) if np.isfinite(c) and c >= 0 else "not_evaluated"
        if name != "successful" and c != 0:
            out[name] = out.get(name, 0) + int(n)
    return out


def _cell(v) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


def _print_records(rows: list[dict[str, Any]]) -> None:
    """An aligned table: a header of the columns' names, one line per point; numbers to the right."""
    if not rows:
        return
    names = list(rows[0])
    cells = [[_cell(r[n]) for n in names] for r in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    right = [not isinstance(rows[0][n], str) for n in names]
    for row in [names] + cells:
        print("  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)).rstrip())


def _summary(ds, out: str | None, seconds: float) -> dict[str, Any]:
    import numpy as np

    dims = _grid_dims(ds)
    failures = _failures(ds)
    summary = {"points": int(np.prod([ds.sizes[d] for d in dims], dtype=int)), "grid": {d: ds.sizes[d] for d in dims},
               "failed": sum(failures.values()), "failed_by_result": failures, "seconds": round(seconds, 3)}
    if out is not None:
        summary["out"] = out
    return summary


def _summary_line(s: dict[str, Any]) -> str:
    shape = " x ".join(f"{n} {d}" for d, n in s["grid"].items())
    why = f" ({', '.join(f'{n} {name}' for name, n in s['failed_by_result'].items())})" if s["failed"] else ""
    where = f", wrote {s['out']}" if "out" in s else ""
    return f"jsmkt sweep: {s['points']} points ({shape}), {s['failed']} failed{why}{where} in {s['seconds']:.3g} s"


def _cmd_sweep(args) -> int:
    from .simulate import _check_cpu_devices, _use_cpu_devices

    parsed = _parse(args)  # the spec with its --set overrides, checked without JAX
    grid = _grid(args.grid)
    metrics = _names(args.metric, "--metric") or _DEFAULT_METRICS
    grad = _names(args.grad, "--grad")
    if args.chunk_size is not None and args.chunk_size < 1:
        raise SpecError(f"--chunk-size={args.chunk_size} must be >= 1 (points per chunk)")
    if args.out is not None:
        _check_out(args.out)
    _check_cpu_devices(args.cpu_devices)
    client = _client(args.scheduler) if args.scheduler else None
    try:
        _use_cpu_devices(args.cpu_devices)  # before JAX's first computation
        from .cache import _use_compilation_cache

        _use_compilation_cache(args)
        import jsmkt

        start = time.perf_counter()
        try:
            ds = jsmkt.sweep(parsed.spec, grid, metrics=metrics, grad=grad, percentiles=args.percentiles or (),
                             chunk_size=args.chunk_size, out=args.out, resume=args.resume, client=client,
                             progress=args.progress)
        except KeyboardInterrupt as e:  # jsmkt.sweep's SweepInterrupted says how to resume
            if not str(e):
                raise
            print(("\n" if sys.stderr.isatty() else "") + f"jsmkt: interrupted: {str(e).strip().splitlines()[0]}",
                  file=sys.stderr)
            return 130
        except ValueError as e:  # name jsmkt.sweep's arguments by their options
            raise SpecError(_in_options(str(e))) from None
        seconds = time.perf_counter() - start
    finally:
        if client is not None:
            client.close()
    summary = _summary(ds, args.out, seconds)
    if args.format == "json":
        if args.out is None:
            summary["results"] = records(ds)
        print(json.dumps(summary, indent=2))
        return 0
    if args.out is None:
        _print_records(records(ds))
    print(_summary_line(summary))
    return 0


def add_parser(sub, common) -> None:
    """Add the `sweep` command to the subparsers `sub` (`common`: the options every command takes)."""
    w = sub.add_parser("sweep", parents=[common], help="metrics of a model spec (TOML) over a grid of its parameters",
                       description=_SWEEP_DESCRIPTION)
    w.add_argument("spec", help="TOML model specification (see examples/); --set applies to it first")
    w.add_argument("--grid", metavar="NAME=VALUES", action="append", required=True, type=grid_option,
                   help="a grid axis: the parameter NAME (a TOML path: lam, d, service.scv, service.mean) and its "
                        "VALUES, START:STOP:NUM (NUM evenly spaced values, both ends included) or a comma-separated "
                        "list (d=1,2,3); an integer is an integer (d=2: a fixed choice number), 2.5 a real number; "
                        "give one --grid per axis (the grid is their product, in their order)")
    w.add_argument("--metric", metavar="NAME", action="append", default=None,
                   help="a metric to evaluate: mean_sojourn_time (the default), mean_waiting_time, mean_queue_length, "
                        "prob_wait, utilisation, throughput or a family's own (availability, mean_orbit_size, ...); "
                        "may be given several times or as a comma-separated list")
    w.add_argument("--grad", metavar="NAMES", action="append", default=None,
                   help="also give the derivatives of every metric with respect to these parameters (TOML paths, "
                        "comma-separated, e.g. lam,service.scv), by implicit differentiation")
    w.add_argument("--percentiles", type=percentile_list, default=None, metavar="P,P,...",
                   help="also give these percentiles of the sojourn (and waiting) time, e.g. 50,90,99 or 50 90 99")
    w.add_argument("--out", metavar="PATH",
                   help="write the dataset to PATH: .zarr (chunk by chunk; rerun the command to resume it), .nc "
                        "(netCDF), .parquet or .csv (one row per point); then only a summary is printed")
    w.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="with an existing --out .zarr store of the same sweep, skip its finished chunks (the "
                        "default); --no-resume starts over and replaces it")
    w.add_argument("--chunk-size", type=int, default=None, metavar="N",
                   help="points evaluated together (default: sized from the devices' memory)")
    w.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                   help="on a CPU, split each chunk over K cores, each a JAX device (default: all cores); GPUs are "
                        "used, all of them, where JAX finds them")
    w.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the chunks as tasks on the Dask cluster whose scheduler is at ADDRESS (e.g. "
                        "tcp://10.0.0.5:8786), each worker on its own devices; the --out store must be on a "
                        "filesystem every worker sees (needs pip install 'jsmkt[cluster]')")
    w.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")
    w.add_argument("--format", choices=("table", "json"), default="table",
                   help="output format (default: table); json: an object with the summary and, without --out, the "
                        "results as a list of records, one per point")
    w.set_defaults(func=_cmd_sweep)
