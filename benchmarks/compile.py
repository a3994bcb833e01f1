"""Wall time of a first solve per registered family (trace, compile, run) and of a first-ever `jsmkt solve`, beside
the floor: a process that imports JAX, jits one trivial function and calls it once.

Per family (the registry, `jsmkt._models.parameters.builtin_families()`; the class's first `examples()` model), a
fresh process times `import jsmkt` plus building the model, then the first `jsmkt.solve_fixed_point(model)` and a
second one. The first solve is split into the steps `solve_fixed_point` takes: the parameter check
(`model.check_values()`, one small compiled function), structure detection (`jsmkt._models.structure
.linear_solver`, which `solve_fixed_point` calls before compiling; its probe's own compilations included) and the
compiled solve. Across the check and the solve, JAX's monitoring events (`jax.monitoring`'s time spans of
`/jax/core/compile/...`: tracing to a jaxpr, lowering to StableHLO, XLA's backend compilation; nested spans counted
once) give trace+lower and compile; the rest (`other`) is Python, dispatch and the run itself. Target (issue 37):
the first solve of each family within 2 s in a process that has imported jsmkt. A first solve compiles for
compilation speed (`jsmkt._compile`); `again ms` is a later solve, and `default ms` the same solve compiled with XLA's
defaults (`jsmkt.use_fast_compilation(False)`): the run-time price of the faster compilation.

Then the console script: `jsmkt solve examples/jsq2_h2.toml` with an empty `--cache-dir` (cold) and the same command
again (warm), against the floor's process wall time; targets 3x the floor cold, 1.2x the floor warm. For reference,
the floor with Equinox imported as well and the console script's exit (no interpreter teardown): every jsmkt model
is an Equinox module, so a warm run takes at least that. Process wall
times as `benchmarks/cli.py` measures them (its `_run`).

jsmkt's modules are byte-compiled first (`compileall`), as an installed package's are.

`--repeats` rounds, interleaved (every family, the floor and both CLI runs in each round, each cold run with a new
cache folder), so that load from other processes hits every measurement alike; the tables give medians.

`--xla-flags fast` runs the families' processes with the tests' `FAST_COMPILE_FLAGS` (`benchmarks/compile_flags.py`
reads them from `tests/conftest.py`), or with the XLA_FLAGS given: how much of a first solve XLA's options can take.

Run: `.venv/bin/python benchmarks/compile.py [--repeats 3] [--families jsq-ph retrial ...] [--xla-flags fast]`.
"""

import argparse
import compileall
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import positive


ROOT = pathlib.Path(__file__).resolve().parents[1]
SOLVE_TARGET = 2.0  # seconds, a family's first solve after `import jsmkt`
COLD_FACTOR, WARM_FACTOR = 3.0, 1.2  # first-ever and repeated `jsmkt solve`, times the floor

CHILD = r"""
import time
T0 = time.perf_counter()
import json, sys
import jax, jax.flatten_util
from jax import monitoring

spans = []  # (event, start, end, function name): the time spans of JAX's compile path
monitoring.register_event_time_span_listener(
    lambda event, start, end, **kw: spans.append((event, start, end, kw.get("fun_name", "?"))))

import jsmkt
T_IMPORT = time.perf_counter()
from jsmkt._models.parameters import builtin_families, family_class
from jsmkt._models.structure import linear_solver as structure_solver

entry = next(e for e in builtin_families() if e.table.name == sys.argv[1])
model = next(iter(family_class(entry).examples().values()))
T1 = time.perf_counter()

def covered(events, lo, hi):
    # Seconds within [lo, hi] covered by spans of `events` (the union: a nested jit's span lies inside its caller's,
    # and a small computation compiled while a caller is traced lies inside the caller's tracing).
    ivs = sorted((max(s, lo), min(e, hi)) for ev, s, e, _ in spans if ev in events and e > lo and s < hi)
    total, end = 0.0, float("-inf")
    for s, e in ivs:
        if e > end:
            total += e - max(s, end)
            end = e
    return total

def wall(f):
    t = time.perf_counter()
    jax.block_until_ready(f())
    return time.perf_counter() - t

# time.time() bounds for the spans (JAX stamps them with time.time())
a = time.time()
t_check = wall(lambda: model.check_values())
t_structure = wall(lambda: structure_solver(model))
b = time.time()
t_solve = wall(lambda: jsmkt.solve_fixed_point(model).value)
c = time.time()
t_again = min(wall(lambda: jsmkt.solve_fixed_point(model).value) for _ in range(5))
# The price of compiling for speed: the same solve compiled with XLA's defaults (`use_fast_compilation(False)`).
jsmkt.use_fast_compilation(False)
jax.block_until_ready(jsmkt.solve_fixed_point(model).value)
t_default = min(wall(lambda: jsmkt.solve_fixed_point(model).value) for _ in range(5))
COMPILE = "/jax/core/compile/backend_compile_duration"
ALL = (COMPILE, "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
comp = sum(covered((COMPILE,), lo, hi) for lo, hi in ((a, a + t_check), (b, c)))
trace = sum(covered(ALL, lo, hi) for lo, hi in ((a, a + t_check), (b, c))) - comp  # tracing and lowering
first = t_check + t_structure + t_solve
compiles = [(e - s, name) for ev, s, e, name in spans
            if ev == COMPILE and a <= s and e <= c]
print("RESULT " + json.dumps({
    "unknowns": int(jax.flatten_util.ravel_pytree(model.initial_guess())[0].size),
    "import": T_IMPORT - T0, "model": T1 - T_IMPORT, "first": first, "structure": t_structure,
    "trace+lower": trace, "compile": comp, "other": first - t_structure - trace - comp,
    "again": t_again, "again_default": t_default, "kernels": len(compiles), "largest": max(compiles)}))
"""

# The floor: import JAX, jit one trivial function, call it once (float64, as jsmkt runs).
FLOOR = r"""
import jax
jax.config.update("jax_enable_x64", True)
print(float(jax.jit(lambda x: x + 1)(1.0)))
"""

# For reference: the floor with Equinox imported too (every jsmkt model is an Equinox module), exiting as the
# console script does (exit handlers, then no teardown): what a warm `jsmkt solve` cannot go below.
FLOOR_EQUINOX = r"""
import atexit, os, sys
import jax, equinox
jax.config.update("jax_enable_x64", True)
print(float(jax.jit(lambda x: x + 1)(1.0)))
sys.stdout.flush()
atexit._run_exitfuncs()
os._exit(0)
"""


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JSMKT_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def family(name: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, name], env=env, capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"family {name}: the child failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    from cli import JSMKT, SPEC, _run
    from compile_flags import fast_flags

    sys.path.insert(0, str(ROOT))
    from jsmkt._models.parameters import builtin_families

    names = [e.table.name for e in builtin_families()]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=positive(int), default=1, help="interleaved rounds (default: 1)")
    ap.add_argument("--xla-flags", default="", metavar="FLAGS",
                    help="XLA_FLAGS for the families' processes (not the CLI's), or `fast` for the tests' "
                         "FAST_COMPILE_FLAGS (tests/conftest.py): what XLA's options buy (default: none)")
    ap.add_argument("--families", nargs="+", metavar="NAME", choices=names, default=names,
                    help=f"restrict to these families (default: all: {' '.join(names)})")
    args = ap.parse_args(argv)
    env = _env()
    # jsmkt's modules byte-compiled, as an installed package's are (pip compiles them; the floor's JAX has its .pyc
    # files): where PYTHONDONTWRITEBYTECODE is set, a checkout's modules would otherwise be compiled from source
    # in every process, about 0.1 s of a warm `jsmkt solve`.
    compileall.compile_dir(str(ROOT / "jsmkt"), quiet=1)
    flags = fast_flags() if args.xla_flags == "fast" else args.xla_flags
    family_env = {**env, "XLA_FLAGS": flags}
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in args.families}
    floor, floor_eqx, cold, warm = [], [], [], []
    folder = pathlib.Path(tempfile.mkdtemp(prefix="jsmkt-bench-compile-"))
    try:
        for r in range(args.repeats):
            for n in args.families:
                runs[n].append(family(n, family_env))
                print(f"round {r + 1}: {n} done", file=sys.stderr, flush=True)
            wall, _, rc = _run([sys.executable, "-c", FLOOR], env)
            if rc:
                raise RuntimeError("the floor's process failed")
            floor.append(wall)
            wall, _, rc = _run([sys.executable, "-c", FLOOR_EQUINOX], env)
            if rc:
                raise RuntimeError("the floor's process with Equinox failed")
            floor_eqx.append(wall)
            cache = folder / f"cache-{r}"
            for out, label in ((cold, "cold"), (warm, "warm")):
                wall, _, rc = _run([*JSMKT, "solve", str(SPEC), "--cache-dir", str(cache)], env)
                if rc:
                    raise RuntimeError(f"`jsmkt solve {SPEC.name}` ({label}) exited with {rc}")
                out.append(wall)
            print(f"round {r + 1}: floor and CLI done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def med(n, key):
        return statistics.median(x[key] for x in runs[n])

    load = os.getloadavg()
    print(f"First solve per family, wall seconds ({os.cpu_count()} CPUs, load average {load[0]:.1f}; median of "
          f"{args.repeats} fresh processes; target {SOLVE_TARGET:g} s after `import jsmkt`; XLA_FLAGS={flags!r})")
    print(f"  {'family':<18} {'unknowns':>8} {'import':>6} {'model':>6} {'first solve':>11} {'structure':>9} "
          f"{'trace+lower':>11} {'compile':>7} {'other':>6} {'kernels':>7} {'again ms':>8} {'default ms':>10} "
          f"{'first/2s':>9}")
    for n in args.families:
        first = med(n, "first")
        ratio = first / SOLVE_TARGET
        print(f"  {n:<18} {runs[n][0]['unknowns']:8d} {med(n, 'import'):6.2f} {med(n, 'model'):6.2f} {first:11.2f} "
              f"{med(n, 'structure'):9.2f} {med(n, 'trace+lower'):11.2f} {med(n, 'compile'):7.2f} "
              f"{med(n, 'other'):6.2f} {runs[n][-1]['kernels']:7d} {1e3 * med(n, 'again'):8.2f} "
              f"{1e3 * med(n, 'again_default'):10.2f} {ratio:6.2f}  "
              f"{'PASS' if ratio <= 1 else 'MISS'}")
    print("  (import: `import jsmkt`, JAX included; model: the family's module and its first example; structure:"
          " detection, its own compilations included; kernels: XLA compilations in the first solve, structure"
          " included; again ms: a later solve, the best of 5; default ms: the same compiled with XLA's defaults,"
          " `jsmkt.use_fast_compilation(False)`)")
    print("  largest single XLA compilation in the first solve (last round):")
    for n in args.families:
        secs, name = runs[n][-1]["largest"]
        print(f"    {n:<18} {secs:5.2f} s  {name}")
    f, fe, c, w = (statistics.median(x) for x in (floor, floor_eqx, cold, warm))
    print(f"\n`jsmkt solve {SPEC.name}`, process wall seconds (median of {args.repeats}) against the floor (import JAX, "
          "jit x + 1, call it once)")
    print(f"  {'floor':<28} {f:7.2f}")
    print(f"  {'floor + Equinox, no teardown':<28} {fe:7.2f}  {fe / f:5.2f}x the floor (for reference: the least a "
          "warm run, which builds an Equinox model, can take)")
    for label, t, factor in (("cold (empty --cache-dir)", c, COLD_FACTOR), ("warm (same --cache-dir)", w, WARM_FACTOR)):
        ratio = t / f
        print(f"  {label:<28} {t:7.2f}  {ratio:5.2f}x the floor, target <= {factor:g}x  "
              f"{'PASS' if ratio <= factor else 'MISS'} (by {t / (factor * f):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
