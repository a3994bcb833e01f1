"""Benchmark: Newton's structured solves across the registered families, and batched retrial solves against a
baseline commit.

Measured in one run, side by side:

1. **Every registered family at about 350 unknowns.** Each example of each registered family
   (`jsmkt._spec.FAMILIES`, the examples of `examples()`), its `K` set so that the reduced state has about 350
   unknowns: the median time of one jitted `solve_fixed_point` (after compilation; calls in bursts, interleaved
   between models), beside `JSQdPH` with H2 service (SCV 4, load 0.9, d = 2) at K = 175, 350 unknowns. Also the
   same solve with `linear_solver=lineax.LU()` (Newton on the vector field with dense LU, the tests' oracle), for
   scale, and the system Newton solves (`jsmkt._models.newton`). Target: every example within 3x `JSQdPH`.
2. **Retrial families batched on the CPU.** `jax.jit(jax.vmap(...))` of `solve_fixed_point(RetrialJSQ(lam, 1.0,
   d1=2, d2=2, retrial=kind, K=88), throw=False).value` over 64 values of lam in [0.5, 0.8], for re-probing and
   own retrials (177 unknowns), in a fresh process per version: this checkout, and a checkout of the baseline
   commit (default a2a5767, made with `git worktree add` in a temporary folder and removed afterwards), the
   processes alternating, `--rounds` each. Each process reports its first call (trace and compile) and the median
   of 5 timed calls; the fixed points of the two versions must agree to 1e-10. Target: this checkout solves at
   least 10x as many per second as the baseline, for both kinds.

Run with `.venv/bin/python benchmarks/structured.py` (`--quick`: one round, fewer bursts; `--baseline COMMIT`;
`--no-baseline` skips part 2).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as benchmarks/fixed_point.py

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402

from _common import interleaved_medians, positive  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt._models.newton import newton_system  # noqa: E402
from jsmkt._models.structure import _state_size  # noqa: E402
from jsmkt._spec import FAMILIES  # noqa: E402


ROOT = pathlib.Path(__file__).resolve().parent.parent
UNKNOWNS = 350
TARGET_FAMILIES = 3.0  # every example's solve / JSQdPH's at as many unknowns
TARGET_BATCHED = 10.0  # batched retrial solves per second / the baseline's


def _at_size(model, n: int = UNKNOWNS):
    """`model` with the K whose reduced state has the number of unknowns nearest `n`."""
    per_level = _state_size(model) / model.K
    K = max(2, round(n / per_level))
    while _state_size(model.with_K(K)) > n + per_level / 2 and K > 2:
        K -= 1
    return model.with_K(K)


def _jitted(model, lin=None):
    params, static = eqx.partition(model, eqx.is_inexact_array)
    fn = jax.jit(lambda p: jsmkt.solve_fixed_point(eqx.combine(p, static), linear_solver=lin).value)
    return lambda: fn(params)


def families(rounds: int, burst: int) -> bool:
    reference = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=UNKNOWNS // 2)
    models = {"jsq-ph (reference)": reference}
    for fam, cls in FAMILIES.items():
        for name, example in cls.examples().items():
            models[f"{fam} / {name}"] = _at_size(example)
    fns = {name: _jitted(m) for name, m in models.items()}
    dense = {name: _jitted(m, lx.LU()) for name, m in models.items()}
    for name in models:  # the structured solve and the oracle agree
        y, y0 = np.ravel(fns[name]()), np.ravel(dense[name]())
        err = np.max(np.abs(y - y0)) / np.max(np.abs(y0))
        assert err < 1e-12, (name, err)
    times = interleaved_medians(fns, rounds, burst)
    dense_times = interleaved_medians(dense, max(1, rounds // 2), max(1, burst // 5))
    ref = times["jsq-ph (reference)"]
    print(f"\n1. one jitted solve at about {UNKNOWNS} unknowns (medians of {rounds} interleaved rounds of {burst})")
    print(f"{'model':<48}{'n':>5}  {'system':<34}{'ms':>8}{'/ jsq-ph':>10}{'dense LU ms':>13}")
    worst = 0.0
    for name, m in models.items():
        s = newton_system(m)
        kind = ("occupancy, " if s.occupancy else "tails, ") + type(s.solver()).__name__
        ratio = times[name] / ref
        worst = max(worst, ratio)
        print(f"{name:<48}{_state_size(m) + len(s.streams):>5}  {kind:<34}{1e3 * times[name]:>8.3f}{ratio:>10.2f}"
              f"{1e3 * dense_times[name]:>13.2f}")
    ok = worst <= TARGET_FAMILIES
    print(f"target: every example within {TARGET_FAMILIES:g}x jsq-ph: worst {worst:.2f}x: {'PASS' if ok else 'MISS'}")
    return ok


_BATCH_SCRIPT = r"""
import json, os, statistics, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import jax
import jax.numpy as jnp
import numpy as np
import jsmkt
K, B, REPEATS = 88, 64, 5
lams = jnp.linspace(0.5, 0.8, B)
out = {}
for kind in ("reprobe", "own"):
    def solve(lam):
        model = jsmkt.RetrialJSQ(lam, 1.0, d1=2, d2=2, retrial=kind, K=K)
        return jsmkt.solve_fixed_point(model, throw=False).value
    fn = jax.jit(jax.vmap(solve))
    t0 = time.perf_counter()
    y = np.asarray(jax.block_until_ready(fn(lams)))
    first = time.perf_counter() - t0
    walls = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(lams))
        walls.append(time.perf_counter() - t0)
    out[kind] = {"first": first, "median": statistics.median(walls), "solves": B, "value": y.tolist()}
print("RESULT " + json.dumps(out))
"""


def _run_batch(path: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path), JAX_ENABLE_X64="1")
    done = subprocess.run([sys.executable, "-c", _BATCH_SCRIPT], env=env, cwd=path, capture_output=True, text=True,
                          check=False)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        raise RuntimeError(f"the batched run in {path} failed:\n{done.stderr[-2000:]}")
    return json.loads(line[0][len("RESULT "):])


def batched(baseline: str, rounds: int) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        old = pathlib.Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), baseline], check=True,
                       capture_output=True)
        try:
            runs = {"baseline": [], "this checkout": []}
            for _ in range(rounds):
                runs["baseline"].append(_run_batch(old))
                runs["this checkout"].append(_run_batch(ROOT))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False,
                           capture_output=True)
    print(f"\n2. retrials batched on the CPU: jit(vmap) of 64 solves at K = 88, against {baseline} "
          f"(a process per version and round, {rounds} rounds; medians)")
    print(f"{'retrial':<10}{'version':<16}{'first call s':>14}{'solves/s':>12}")
    ok = True
    for kind in ("reprobe", "own"):
        rate = {}
        for version, results in runs.items():
            first = statistics.median(r[kind]["first"] for r in results)
            rate[version] = statistics.median(r[kind]["solves"] / r[kind]["median"] for r in results)
            print(f"{kind:<10}{version:<16}{first:>14.2f}{rate[version]:>12.0f}")
        a = np.asarray(runs["baseline"][0][kind]["value"])
        b = np.asarray(runs["this checkout"][0][kind]["value"])
        err = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
        ratio = rate["this checkout"] / rate["baseline"]
        ok &= ratio >= TARGET_BATCHED and err < 1e-10
        print(f"{kind:<10}ratio {ratio:.1f}x (target >= {TARGET_BATCHED:g}x), fixed points agree to {err:.1e}: "
              f"{'PASS' if ratio >= TARGET_BATCHED and err < 1e-10 else 'MISS'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round each, short bursts")
    parser.add_argument("--rounds", type=positive(int), default=None, help="interleaved rounds (default 5; quick 1)")
    parser.add_argument("--baseline", default="a2a5767", help="the commit to compare batched retrials with")
    parser.add_argument("--no-baseline", action="store_true", help="skip the batched comparison with the baseline")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    ok = families(rounds, 5 if args.quick else 20)
    if not args.no_baseline:
        ok &= batched(args.baseline, min(rounds, 3))
    print("\nall targets: " + ("PASS" if ok else "MISS"))


if __name__ == "__main__":
    main()
