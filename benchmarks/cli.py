"""Wall times of the `jsmkt` console script, cold (an empty compilation cache) and warm (the same command again).

Each command runs as its own process, as a user runs it: `jsmkt --help`, a spec error (an unknown key), a value
error (an unstable load), `jsmkt solve` of `examples/jsq2_h2.toml`, `jsmkt solve` of a copy at another λ with K fixed
(the same model structure, new values: what a loop over λ runs), a short `jsmkt simulate`, and the floor: a process
that imports JAX and runs one function compiled and kept by an earlier one, as the warm solve does, and nothing else.
Cold: the first run, with an empty cache folder; warm: the median of `--repeats` later runs, interleaved round by round so that load from
other processes hits every command alike. The CPU column is the warm run's user + system time (JAX's compiler
threads can make it exceed the wall time; on a loaded machine it moves less than the wall time). Targets (issue
25): `--help` and a spec error under 1 s, a repeated `jsmkt solve` at most 1.5 s. A warm `jsmkt solve` loads the
solve that the cold run compiled and kept (`jsmkt._exported`) from the cache folder.
For reference, the times of `python -c 'import jax'` and of importing ml_dtypes (which JAX imports; its version
0.7.0 takes about 1.4 s, `constraints.txt`).

`--profile` breaks one warm `jsmkt solve` down: interpreter start-up, importing JAX, importing Equinox and
jsmkt's modules for the model, and the command itself (with whatever else it imports), split by a profile into
tracing (Python running jsmkt's functions under `jit`), lowering to StableHLO (for an exported function: reading
it back), loading compiled kernels from the cache, compiling, running them, and the rest (Python: spec, model
set-up, output); with the number of computations compiled (or loaded), the eager single operations among them
named. The profile's own overhead inflates Python-heavy parts; its
shares are applied to the command's unprofiled wall time.

`--baseline DIR` also runs the two warm solves with the jsmkt of another checkout (`git worktree add DIR COMMIT`) in
the same rounds, and prints the median of the rounds' ratios: on a machine whose speed drifts, the side-by-side ratio
is what compares two versions.

Run: `.venv/bin/python benchmarks/cli.py [--repeats 3] [--profile] [--baseline DIR]`.
"""

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import positive


ROOT = pathlib.Path(__file__).resolve().parents[1]
JSMKT = [sys.executable, "-m", "jsmkt.cli"]
SPEC = ROOT / "examples" / "jsq2_h2.toml"


def _run(argv: list[str], env: dict, cwd: pathlib.Path = ROOT) -> tuple[float, float, int]:
    """Wall and CPU (user + system) seconds of one process run in `cwd` (`python -m` imports jsmkt from there first),
    and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def _commands(folder: pathlib.Path, cache: pathlib.Path) -> list[tuple[str, list[str], list[str], int, float | None]]:
    """(label, argv of the cold run, argv of the warm runs, expected exit code, target wall seconds when warm)."""
    K = _solved_K()
    bad = folder / "bad_key.toml"
    bad.write_text('model = "jsq-ph"\nlam = 0.9\nspeed = 2\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n')
    unstable = folder / "unstable.toml"
    unstable.write_text('model = "jsq-ph"\nlam = 1.2\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n')
    other = folder / "other_lam.toml"
    other.write_text(f'model = "jsq-ph"\nlam = 0.85\nK = {K}\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n')
    same = folder / "same_K.toml"
    same.write_text(f'model = "jsq-ph"\nlam = 0.9\nK = {K}\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n')
    c = ["--cache-dir", str(cache)]
    simulate = [*JSMKT, "simulate", str(SPEC), "--servers", "100", "--time", "500", "--cpu-devices", "1", *c]
    return [
        ("jsmkt --help", [*JSMKT, "--help"], [*JSMKT, "--help"], 0, 1.0),
        ("spec error (unknown key)", [*JSMKT, "solve", str(bad), *c], [*JSMKT, "solve", str(bad), *c], 2, 1.0),
        ("value error (unstable lam)", [*JSMKT, "solve", str(unstable), *c], [*JSMKT, "solve", str(unstable), *c],
         2, None),
        ("solve jsq2_h2.toml", [*JSMKT, "solve", str(SPEC), *c], [*JSMKT, "solve", str(SPEC), *c], 0, 1.5),
        # cold at lam = 0.9, warm at 0.85: the same structure (K fixed), new values, as in a loop over lam
        ("solve, new lam (K fixed)", [*JSMKT, "solve", str(same), *c], [*JSMKT, "solve", str(other), *c], 0, None),
        ("simulate N=100, t=500", simulate, simulate, 0, None),
        ("floor: JAX loads, runs 1 function", [sys.executable, "-c", _FLOOR, str(cache / "floor")],
         [sys.executable, "-c", _FLOOR, str(cache / "floor")], 0, None),
    ]


# The least a process that imports JAX and runs one function that an earlier process compiled and kept can take
# here: what a warm `jsmkt solve` does besides its own work (imports of Equinox and jsmkt, the spec and the model, the
# output). It exits as the console script does (exit handlers, then no teardown), and as a warm solve whose
# executable calls LAPACK it registers JAX's LAPACK kernels first (which imports SciPy's).
_FLOOR = r"""
import atexit, os, pathlib, pickle, sys
import jax
import numpy as np
from jax.experimental import serialize_executable
jax.config.update("jax_enable_x64", True)
folder = pathlib.Path(sys.argv[1])
path = folder / "function.pickle"
if not path.exists():
    folder.mkdir(parents=True, exist_ok=True)
    compiled = jax.jit(lambda x: (2.0 * x + 1.0,)).lower(np.float64(0.0)).compile()
    path.write_bytes(pickle.dumps(serialize_executable.serialize(compiled)[0]))
jax.jit(jax.numpy.linalg.solve).lower(np.eye(2), np.ones(2))  # LAPACK's kernels, as jsmkt._exported registers them
run = serialize_executable.deserialize_and_load(pickle.loads(path.read_bytes()),
                                                jax.tree_util.tree_structure(((0,), {})),
                                                jax.tree_util.tree_structure((0,)))
print(float(run(np.float64(0.5))[0]))
sys.stdout.flush()
atexit._run_exitfuncs()
os._exit(0)
"""


_COMPARED = ("solve jsq2_h2.toml", "solve, new lam (K fixed)")  # the rows `--baseline` runs twice


def _solved_K() -> int:
    """The K that `jsmkt solve` of the example spec ends at (its default K, grown if too small)."""
    import json

    out = subprocess.run([*JSMKT, "solve", str(SPEC), "--format", "json", "--no-cache"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)["K"])


_PROFILE = r'''
import time
T0 = time.perf_counter()
import cProfile, io, logging, pstats, sys
import jsmkt.cli
T1 = time.perf_counter()
import jax
T2 = time.perf_counter()
import equinox
import jsmkt._exported, jsmkt._models.jsqd_ph
T3 = time.perf_counter()
names = []
class Names(logging.Handler):
    def emit(self, record):
        m = record.getMessage()
        if m.startswith("Compiling "):
            names.append(m.split()[1])
jax.config.update("jax_log_compiles", True)
logging.getLogger("jax").addHandler(Names())
logging.getLogger("jax").propagate = False
argv = sys.argv[1:]
if "--plain" in argv:
    argv.remove("--plain")
    out = io.StringIO(); sys.stdout, real = out, sys.stdout
    T4 = time.perf_counter(); jsmkt.cli.main(argv); T5 = time.perf_counter()
    sys.stdout = real
    print("PHASES", T1 - T0, T2 - T1, T3 - T2, T5 - T4)
    sys.exit()
pr = cProfile.Profile()
out = io.StringIO(); sys.stdout, real = out, sys.stdout
pr.enable(); jsmkt.cli.main(argv); pr.disable()
sys.stdout = real
stats = pstats.Stats(pr).stats
def cum(file, func):
    return sum(v[3] for (f, _, fn), v in stats.items() if f.endswith(file) and fn == func)
total = sum(v[2] for v in stats.values())
parts = {
    "tracing": cum("partial_eval.py", "trace_to_jaxpr"),
    "lowering": cum("pxla.py", "lower_sharding_computation"),
    "cache loads": cum("compilation_cache.py", "get_executable_and_time"),
    "compiling": cum("compiler.py", "backend_compile_and_load"),
    "running kernels": cum("pxla.py", "__call__"),
}
print("TOTAL", total)
for k, v in parts.items():
    print("PART", k, v)
eager = [n for n in names if re.match(r"jit\([a-z_]+\)$", n) and n[4:-1] in PRIMS]
print("COMPILED", len(names), len(eager))
'''


def _profile(env: dict, cache: pathlib.Path) -> None:
    argv = ["solve", str(SPEC), "--cache-dir", str(cache)]
    code = _PROFILE.replace("PRIMS", repr(_primitive_names()))
    code = "import re\n" + code
    plain = subprocess.run([sys.executable, "-c", code, *argv, "--plain"], env=env, cwd=ROOT, capture_output=True,
                           text=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    start = time.perf_counter() - t0
    phases = [float(x) for x in re.search(r"PHASES (.*)", plain.stdout).group(1).split()]
    prof = subprocess.run([sys.executable, "-c", code, *argv], env=env, cwd=ROOT, capture_output=True, text=True)
    if prof.returncode:
        sys.exit(prof.stderr)
    total = float(re.search(r"TOTAL (\S+)", prof.stdout).group(1))
    parts = {m.group(1): float(m.group(2)) for m in re.finditer(r"PART (.+) (\S+)", prof.stdout)}
    n, n_eager = map(int, re.search(r"COMPILED (\d+) (\d+)", prof.stdout).groups())
    command = phases[3]
    print(f"\nwarm `jsmkt solve {SPEC.name}`, broken down (wall seconds):")
    print(f"  {'interpreter start-up (python -c pass)':<46} {start:6.2f}")
    print(f"  {'import jsmkt.cli (no JAX)':<46} {phases[0]:6.2f}")
    print(f"  {'import JAX':<46} {phases[1]:6.2f}")
    print(f"  {'import Equinox, jsmkt models':<46} {phases[2]:6.2f}")
    print(f"  {'the command (main):':<46} {command:6.2f}")
    rest = command
    for name, t in parts.items():
        share = t / total * command
        rest -= share
        print(f"    {name:<44} {share:6.2f}")
    print(f"    {'the rest (Python: spec, models, output)':<44} {rest:6.2f}")
    print(f"  computations lowered (each a cache load when warm): {n}, of which {n_eager} single operations run "
          "eagerly")


def _primitive_names() -> list[str]:
    """Names of the single operations JAX compiles when they run outside `jit` (`jit(add)`, ...)."""
    return ["add", "sub", "subtract", "mul", "multiply", "neg", "negative", "true_divide", "div", "sqrt", "exp", "log",
            "broadcast_in_dim", "convert_element_type", "reshape", "squeeze", "concatenate", "dynamic_slice",
            "gather", "scatter", "select_n", "equal", "not_equal", "invert", "integer_pow", "reduce_sum", "stack",
            "split", "matmul", "dot_general", "_where", "_squeeze", "_diag", "_reduce_sum", "_broadcast_arrays",
            "stage", "solve", "abs", "max", "min", "maximum", "minimum", "pow", "less", "greater", "ge", "le", "lt",
            "gt", "and", "or", "not", "iota", "cumsum", "clamp", "sign", "copy", "transpose", "slice", "pad"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=positive(int), default=3, help="warm runs per command (default: 3)")
    p.add_argument("--profile", action="store_true", help="also break one warm `jsmkt solve` down")
    p.add_argument("--baseline", type=pathlib.Path, metavar="DIR",
                   help="also run the warm solves with the jsmkt of the checkout DIR (e.g. a `git worktree` of an "
                        "earlier commit), in the same rounds, and print the ratios")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JSMKT_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="jsmkt-bench-cli-"))
    try:
        cache = folder / "cache"
        commands = _commands(folder, cache)
        cold = {}
        envs = {label: (env, ROOT) for label, *_ in commands}
        if args.baseline is not None:
            # The warm solves again with the jsmkt of another checkout (its own cache folder), in the same rounds.
            where = args.baseline.resolve()
            base_env = {**env, "PYTHONPATH": str(where) + os.pathsep + env.get("PYTHONPATH", "")}
            imported = subprocess.run([sys.executable, "-c", "import jsmkt; print(jsmkt.__file__)"], env=base_env,
                                      cwd=where, capture_output=True, text=True, check=True).stdout.strip()
            if not pathlib.Path(imported).resolve().is_relative_to(where):
                sys.exit(f"--baseline {where}: the baseline's processes import jsmkt from {imported}")
            base = [(f"{label} [baseline]", *[[str(folder / "base-cache") if a == str(cache) else a for a in argv]
                                             for argv in (cold_argv, warm_argv)], code, None)
                    for label, cold_argv, warm_argv, code, _ in commands if label in _COMPARED]
            commands += base
            envs.update({label: (base_env, where) for label, *_ in base})
        cold = {}
        for label, argv, _, code, _ in commands:
            wall, cpu, rc = _run(argv, *envs[label])
            if rc != code:
                sys.exit(f"{label}: exit code {rc}, expected {code}")
            cold[label] = wall
        warm = {label: [] for label, *_ in commands}
        for _ in range(args.repeats):
            for label, _, argv, code, _ in commands:
                wall, cpu, rc = _run(argv, *envs[label])
                if rc != code:
                    sys.exit(f"{label}: exit code {rc}, expected {code}")
                warm[label].append((wall, cpu))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import jax"], env=env, check=True)
        jax_import = time.perf_counter() - t0
        t0 = time.perf_counter()
        ml_dtypes = subprocess.run([sys.executable, "-c", "import ml_dtypes; print(ml_dtypes.__version__)"], env=env,
                                   check=True, capture_output=True, text=True).stdout.strip()
        ml_dtypes_import = time.perf_counter() - t0
        load = os.getloadavg()
        print(f"jsmkt CLI wall times in seconds ({os.cpu_count()} CPUs, load average {load[0]:.1f}; cold: empty "
              f"cache; warm: median of {args.repeats})")
        print(f"  {'command':<34} {'cold':>7} {'warm':>7} {'warm CPU':>9}   target")
        for label, *_rest, target in commands:
            w = statistics.median(x[0] for x in warm[label])
            c = statistics.median(x[1] for x in warm[label])
            verdict = "" if target is None else f"<= {target:g}  {'PASS' if w <= target else 'MISS'}"
            print(f"  {label:<34} {cold[label]:7.2f} {w:7.2f} {c:9.2f}   {verdict}")
        for label in _COMPARED if args.baseline is not None else ():
            ratios = [a[0] / b[0] for a, b in zip(warm[label], warm[f"{label} [baseline]"], strict=True)]
            print(f"  {label}: this checkout / baseline, median of the rounds' ratios {statistics.median(ratios):.2f}")
        solve, floor = (statistics.median(x[0] for x in warm[k]) for k in ("solve jsq2_h2.toml",
                                                                            "floor: JAX loads, runs 1 function"))
        print(f"  warm solve - floor: {solve - floor:.2f} s (jsmkt's share: importing Equinox and jsmkt, the spec, "
              "the model, the output)")
        print(f"  (for reference: `python -c 'import jax'` takes {jax_import:.2f} s here, `python -c 'import "
              f"ml_dtypes'` {ml_dtypes_import:.2f} s with ml_dtypes {ml_dtypes}: 0.7.0 takes about 1.4 s more, see "
              "constraints.txt)")
        if args.profile:
            _profile(env, cache)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
