"""CPU time to compile, and to run again, jsmkt's main entry points under three sets of XLA flags.

Compilation dominates the test suite and a first call of a new model shape, so the tests run XLA with flags that
compile faster (`tests/conftest.py`, `FAST_COMPILE_FLAGS`). This script measures what they buy and what they cost:
each flag set runs in a fresh process, which calls, for a model shape not seen before, `solve_fixed_point`, a
metric, `jax.grad` of E[T], a `vmap`-ed solve, `refined_mean_field`, `integrate` and a short `simulate`, each twice:
the first call compiles, the second runs the compiled code. Flag sets:

- `default`: XLA's own settings;
- `opt0`: `--xla_backend_optimization_level=0`;
- `emitters`: the elemental emitters instead of the fusion emitters, and one LLVM module per kernel (XLA's own
  optimisation level);
- `fast`: the tests' `FAST_COMPILE_FLAGS` (`emitters` at optimisation level 0).

CPU seconds are the process's user + system time (XLA's compiler threads included). Processes run one after the
other, `--repeats` rounds interleaved; the table gives medians and the ratios to `default`.

Run: `.venv/bin/python benchmarks/compile_flags.py [--repeats 3]`.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

from _common import positive


ROOT = pathlib.Path(__file__).resolve().parents[1]

FLAG_SETS = {
    "default": "",
    "opt0": "--xla_backend_optimization_level=0",
    "emitters": "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1",
    "fast": None,  # from tests/conftest.py
}

CHILD = r"""
import json, resource, sys, time
import jax, jax.numpy as jnp, jax.random as jr
import jsmkt

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

out = {}
def timed(name, f):
    for which in ("first", "again"):
        t = cpu()
        jax.block_until_ready(f())
        out[f"{name} {which}"] = cpu() - t

warm = jsmkt.JSQdPH(0.7, jsmkt.erlang(3), d=3, K=20)  # import, float64, and the first compilations of JAX itself
jsmkt.solve_fixed_point(warm)
svc = jsmkt.erlang(3)
model = jsmkt.JSQdPH(0.7, svc, d=3, K=24)

def ET(lam):
    m = jsmkt.JSQdPH(lam, svc, d=3, K=24)
    return jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m))

grad = jax.jit(jax.grad(ET))
timed("solve_fixed_point", lambda: jsmkt.solve_fixed_point(model).value)
fp = jsmkt.solve_fixed_point(model)
timed("mean_sojourn_time", lambda: jsmkt.mean_sojourn_time(model, fp))
timed("jit(grad(E[T]))", lambda: grad(0.7))
vsolve = jax.jit(jax.vmap(ET))
timed("jit(vmap(E[T])), 4 entries", lambda: vsolve(jnp.array([0.5, 0.6, 0.7, 0.8])))
timed("refined_mean_field", lambda: jsmkt.refined_mean_field(fp).state(100))
timed("integrate, t = 20", lambda: jsmkt.integrate(model, 20.0, ts=jnp.linspace(0.0, 20.0, 5)).ys)
timed("simulate, N = 200, t = 200", lambda: jsmkt.simulate(model, 200, 200.0, key=jr.PRNGKey(0),
                                                             n_replications=2).mean_sojourn_time)
print("RESULT " + json.dumps(out))
"""


def fast_flags() -> str:
    """`FAST_COMPILE_FLAGS` of `tests/conftest.py`, read from its source (importing it would set up the tests)."""
    import ast

    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAST_COMPILE_FLAGS":
            return " ".join(ast.literal_eval(node.value))
    raise RuntimeError("tests/conftest.py has no FAST_COMPILE_FLAGS")


def run(flags: str) -> dict[str, float]:
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"XLA_FLAGS={flags!r}: the child failed:\n{proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive(int), default=3)
    args = ap.parse_args(argv)
    sets = dict(FLAG_SETS, fast=fast_flags())
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sets}
    for r in range(args.repeats):
        for name, flags in sets.items():
            runs[name].append(run(flags))
            print(f"round {r + 1}: {name} done", file=sys.stderr, flush=True)
    keys = list(runs["default"][0])
    med = {name: {k: statistics.median(x[k] for x in rs) for k in keys} for name, rs in runs.items()}
    print(f"XLA flags: fast = {sets['fast']}")
    print(f"CPU seconds, median of {args.repeats} processes per flag set (ratio to default)")
    print(f"{'':36s}" + "".join(f"{name:>20s}" for name in sets))
    for k in keys:
        cells = "".join(f"{med[n][k]:10.3f} ({med[n][k] / med['default'][k]:5.2f}x)" for n in sets)
        print(f"{k:36s}{cells}")
    for which in ("first", "again"):
        tot = {n: sum(v for k, v in med[n].items() if k.endswith(which)) for n in sets}
        cells = "".join(f"{tot[n]:10.3f} ({tot[n] / tot['default']:5.2f}x)" for n in sets)
        print(f"{'total, ' + which:36s}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
