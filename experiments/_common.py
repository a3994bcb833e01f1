"""Shared helpers for the experiment scripts: arguments, output folders, run metadata, JSON/CSV writing.

Every `compute.py` builds its arguments with `parser` (which adds `--quick` and `--out`) and calls `output_dir`,
`run_metadata` and `write_json` / `write_csv`; simulations go through `simulate_adaptive`, which pools
replications with `Pool`. Every `plot.py` calls `plot_style` and reads what `compute.py` wrote. Import it from a
script with

```python
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
```
"""

import argparse
import csv
import datetime
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


EXPERIMENTS = Path(__file__).resolve().parent
REPO = EXPERIMENTS.parent
_PACKAGES = ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax", "numpy", "matplotlib")


# --- arguments and output folders -------------------------------------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the two flags every experiment has: `--quick` and `--out`."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="few cases, short runs, loose CI (CI smoke test)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: <experiment>/results for full runs, out/experiments/<experiment>-quick "
        "for --quick)",
    )
    return p


def output_dir(name: str, out: Path | None, quick: bool) -> Path:
    """The folder to write to (created): `out` if given, else the default for experiment `name`."""
    if out is None:
        out = REPO / "out" / "experiments" / f"{name}-quick" if quick else EXPERIMENTS / name / "results"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


# --- run metadata -----------------------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.rstrip("\n")


def source_hash(package: str = "jsmkt") -> str:
    """SHA-256 over the package's `.py` files (path and content), so that runs from a dirty tree stay traceable."""
    h = hashlib.sha256()
    root = REPO / package
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def versions() -> dict[str, str | None]:
    import jsmkt

    # jsmkt's own version also when it runs from a source tree that is not installed
    out: dict[str, str | None] = {"python": platform.python_version(), "jsmkt": jsmkt.__version__}
    for pkg in _PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def run_metadata(experiment: str, parameters: Mapping[str, Any], *, quick: bool) -> dict[str, Any]:
    """Everything needed to reproduce a run: parameters, git SHA (and whether the tree was dirty, with a hash of
    the package source), package versions, date, machine and command line."""
    import jax

    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "experiment": experiment,
        "quick": quick,
        "parameters": dict(parameters),
        "git_sha": (_git("rev-parse", "HEAD") or "").strip() or None,
        "git_dirty": None if dirty is None else bool(dirty),
        "git_dirty_files": None if not dirty else [line[3:] for line in dirty.splitlines()],
        "jsmkt_source_sha256": source_hash(),
        "versions": versions(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "jax_backend": jax.default_backend(),
            "jax_devices": [str(d) for d in jax.devices()],
        },
        "command": [Path(sys.executable).name, *sys.argv],
    }


class Clock:
    """Wall-clock and process CPU time since construction."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def wall(self) -> float:
        return time.perf_counter() - self.wall0

    def cpu(self) -> float:
        return time.process_time() - self.cpu0

    def runtime(self, **extra: float) -> dict[str, float]:
        """The run metadata's `runtime` record: `wall_s`, `cpu_s` and any `extra` timings."""
        return {"wall_s": self.wall(), "cpu_s": self.cpu(), **extra}


# --- writing ----------------------------------------------------------------------------------------------------


def jsonable(x: Any) -> Any:
    """Python scalars, lists and dicts from NumPy/JAX values; non-finite floats become `None` (valid JSON)."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (str, bool)) or x is None:
        return x
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "shape") and getattr(x, "shape", None) != ():
        return [jsonable(v) for v in np.asarray(x).tolist()]
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


def write_json(path: Path, obj: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps(jsonable(obj), indent=1) + "\n")
    return path


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def require_input(path: Path, producer: str, quick: bool, out: Path | None) -> Path:
    """`path` if it exists, else exit with one line saying which script writes it (e.g. a `--quick` plot run
    before its `--quick` compute run)."""
    path = Path(path)
    if not path.exists():
        flags = (" --quick" if quick else "") + (f" --out {out}" if out is not None else "")
        raise SystemExit(f"{path.name} not found in {path.parent}: run `python experiments/{producer}{flags}` "
                         "first (it writes it)")
    return path


def _cell(v: Any) -> Any:
    v = jsonable(v)
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.10g}"
    return v


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], fieldnames: Iterable[str] | None = None) -> Path:
    """Rows of dicts to CSV (missing or non-finite values as empty cells, floats with 10 significant digits); the
    columns are every key of the rows, in order of first appearance, unless `fieldnames` are given."""
    path = Path(path)
    fieldnames = list(fieldnames) if fieldnames is not None else list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fieldnames, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: _cell(row.get(k)) for k in fieldnames})
    return path


def read_csv(path: Path) -> list[dict[str, Any]]:
    """CSV rows with numbers parsed (empty cells as NaN)."""

    def parse(v: str) -> Any:
        if v == "":
            return math.nan
        try:
            return int(v)
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            return v

    with Path(path).open(newline="") as f:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


# --- statistics -------------------------------------------------------------------------------------------------


def t975(nu: int) -> float:
    """97.5 % quantile of Student's t with `nu >= 1` degrees of freedom (95 % two-sided); the simulator's own."""
    from jsmkt._simulate.statistics import t_quantile_975

    return t_quantile_975(nu)


class Pool:
    """Pools replication statistics from several `jsmkt.simulate` calls of the same run length.

    Each call reports, per quantity, the mean over its `R` replications and a 95 % Student-t half-width (from
    which the sample standard deviation is recovered); the pooled mean, standard deviation and half-width are
    then exactly those of all replications together (one-way ANOVA decomposition). Calls with `R = 1` contribute
    their single replication value.
    """

    def __init__(self) -> None:
        self.n = 0
        self.mean: dict[str, np.ndarray] = {}
        self.m2: dict[str, np.ndarray] = {}  # sum of squared deviations from the pooled mean

    def add(self, r: int, values: Mapping[str, Any], half_widths: Mapping[str, Any]) -> None:
        for k, v in values.items():
            v = np.asarray(v, dtype=float)
            if r >= 2:
                sd = np.nan_to_num(np.asarray(half_widths[k], dtype=float)) * math.sqrt(r) / t975(r - 1)
                within = (r - 1) * sd**2
            else:
                within = np.zeros_like(v)
            if self.n == 0:
                self.mean[k], self.m2[k] = v, within
                continue
            m0, n0 = self.mean[k], self.n
            if m0.shape != v.shape:  # tails of different lengths: pad with zeros
                size = max(m0.size, v.size)
                m0, v = np.pad(m0, (0, size - m0.size)), np.pad(v, (0, size - v.size))
                self.m2[k] = np.pad(self.m2[k], (0, size - self.m2[k].size))
                within = np.pad(within, (0, size - within.size))
            n = n0 + r
            delta = v - m0
            self.mean[k] = m0 + delta * r / n
            self.m2[k] = self.m2[k] + within + delta**2 * n0 * r / n
        self.n += r

    def sd(self, k: str) -> np.ndarray:
        return np.sqrt(self.m2[k] / (self.n - 1)) if self.n >= 2 else np.full_like(self.mean[k], np.nan)

    def half_width(self, k: str) -> np.ndarray:
        return t975(self.n - 1) * self.sd(k) / math.sqrt(self.n) if self.n >= 2 else self.sd(k)


# --- simulation -----------------------------------------------------------------------------------------------


def relaxation_time(model, fp) -> float:
    """1 / spectral gap of the mean-field Jacobian at the fixed point (slowest linear relaxation rate)."""
    import jax

    y = fp.value
    J = jax.jacfwd(lambda v: model.vector_field(0.0, v, None))(y)
    J = np.asarray(J).reshape(y.size, y.size)
    gap = -float(np.max(np.linalg.eigvals(J).real))
    return 1.0 / gap


def vmapped_solve(build, metrics, values, what: str = "value") -> list[dict]:
    """The mean field at every entry of `values`, one `jax.vmap`-ed solve: `build(v)` makes the model (one shape for
    every `v`), `metrics(model, fp)` returns a dict of scalars, to which `ok` (the solve succeeded) and `tail_mass`
    are added. A failed point, or one whose tail mass at K exceeds 1e-10, stops the run naming it."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import jsmkt

    @eqx.filter_jit
    def solve(v):
        def one(x):
            model = build(x)
            fp = jsmkt.solve_fixed_point(model, throw=False)
            return {**metrics(model, fp), "ok": fp.result == jsmkt.RESULTS.successful, "tail_mass": fp.tail_mass}

        return jax.vmap(one)(v)

    out = jax.tree_util.tree_map(np.asarray, solve(jnp.asarray(values, float)))
    rows = []
    for i, v in enumerate(values):
        row = {k: out[k][i].item() for k in out}
        if not row["ok"] or not row["tail_mass"] < 1e-10:
            raise RuntimeError(f"{what}={v}: the solve failed or K is too small (tail mass {row['tail_mass']:.3g})")
        rows.append(row)
    return rows


def simulate_adaptive(model, p: dict, *, warmup: float, length: float, key, budget: float) -> dict:
    """Replications of length `warmup + length`, `p["reps_per_call"]` per `jsmkt.simulate` call (fewer when the
    budget runs short), until the 95 % half-width of E[T] is at most `p["target"] * E[T]` (with at least
    `p["min_reps"]` replications), `p["max_reps"]` replications are pooled (when given: a stop that does not
    depend on the machine's speed) or `budget` CPU seconds are spent; `p["n_servers"]` servers. Returns the pooled
    statistics (E[T], E[Q], tails s_0..s_max_queue, their 95 % half-widths), how the run stopped, and a record of
    every call."""
    import jax.random as jr

    import jsmkt

    pool = Pool()
    calls = []
    clock = Clock()
    max_queue = None
    per_rep_cpu = None
    stop_reason = None
    while True:
        r = p["reps_per_call"]
        if pool.n >= p["min_reps"]:
            rel = float(pool.half_width("ET")) / float(pool.mean["ET"])
            if rel <= p["target"]:
                stop_reason = "target"
                break
            if p.get("max_reps") is not None and pool.n >= p["max_reps"]:
                stop_reason = "max_reps"
                break
            left = budget - clock.cpu()
            affordable = int(left // per_rep_cpu)
            if affordable < 2:
                stop_reason = "budget"
                break
            r = min(r, affordable, p["max_reps"] - pool.n) if p.get("max_reps") is not None else min(r, affordable)
        key, sub = jr.split(key)
        c0 = clock.cpu()
        try:
            res = jsmkt.simulate(
                model, p["n_servers"], warmup + length, key=sub, n_replications=r, warmup=warmup,
                max_queue=max_queue,
            )
        except ValueError as e:  # a queue overflowed its ring buffer: rerun this call with a larger one
            if "max_queue" not in str(e):
                raise
            max_queue = 256 if max_queue is None else 2 * max_queue
            calls.append({"n_replications": r, "error": str(e)})
            continue
        c1 = clock.cpu()
        per_rep_cpu = (c1 - c0) / r if per_rep_cpu is None else max(per_rep_cpu, (c1 - c0) / r)
        pool.add(
            r,
            {"ET": res.mean_sojourn_time, "EQ": res.mean_queue_length, "tails": res.tails},
            {"ET": res.mean_sojourn_time_ci, "EQ": res.mean_queue_length_ci, "tails": res.tails_ci},
        )
        d = res.to_dict()
        for k in ("sojourn_time_percentiles", "sojourn_time_percentiles_ci", "tail", "tail_ci"):  # tails: below
            d.pop(k, None)
        d["cpu_s"] = c1 - c0
        calls.append(d)
    return {
        "ET": float(pool.mean["ET"]),
        "ET_ci": float(pool.half_width("ET")),
        "EQ": float(pool.mean["EQ"]),
        "EQ_ci": float(pool.half_width("EQ")),
        "tails": pool.mean["tails"],
        "tails_ci": pool.half_width("tails"),
        "n_replications": pool.n,
        "t1": warmup + length,
        "warmup": warmup,
        "events": int(sum(c.get("events", 0) for c in calls)),
        "cpu_s": clock.cpu(),
        "wall_s": clock.wall(),
        "stop_reason": stop_reason,
        "target_met": stop_reason == "target",
        "calls": calls,
    }


# --- plotting ---------------------------------------------------------------------------------------------------


def plot_style() -> None:
    """Matplotlib defaults for all figures (non-interactive backend, small serif fonts, vector-friendly)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "axes.titlesize": 9,
            "axes.labelsize": 9,
            "legend.fontsize": 8,
            "xtick.labelsize": 8,
            "ytick.labelsize": 8,
            "figure.dpi": 150,
            "savefig.bbox": "tight",
            "axes.grid": True,
            "grid.alpha": 0.3,
            "pdf.fonttype": 42,
        }
    )


def save_figure(fig, out: Path, name: str) -> None:
    """Write `fig` to `out` as `name.pdf` and `name.png`, and say so."""
    for ext in ("pdf", "png"):
        fig.savefig(out / f"{name}.{ext}")
    print(f"wrote {out / (name + '.pdf')} and {out / (name + '.png')}")
