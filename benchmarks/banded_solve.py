"""Benchmark: the block-banded linear solve (`jsmkt._linalg.BlockBanded`) against dense LU (`lx.LU()`).

System: the Newton matrix of an implicit Euler step, `X - h * drift(X)` with h = 0.5, of an illustrative
mean-field drift of a supermarket model with batch arrivals, JSQ(2) for whole batches of 1 to 4 jobs
(probabilities 0.4, 0.3, 0.2, 0.1), and service of m phases (m = 1: exponential; m = 2: a two-phase Coxian),
linearised at a generic point. Level k (the tail of queues with at least k jobs, one entry per phase) receives
batches from levels k - 4 .. k - 1 and completions from level k + 1, so the Jacobian has bandwidth 4 in the
levels. It is given to Lineax as the
`lx.FunctionLinearOperator` of `jax.linearize`: `BlockBanded(levels, 4)` reads its band off 9 m products with it,
`lx.LU()` materialises the dense matrix (K m products) and factors it. Each is one jitted `lx.linear_solve` from the
point and the right-hand side, at K = 200, 400, 800 levels with m = 1 and 2; both solutions must agree to 1e-12
(relative to the largest entry). Calls are timed in bursts of `BURST` back-to-back calls of one function, the
functions interleaved round by round, so that load from other processes hits both alike; the ratio of the medians is
taken within one run. Before timing, `classify_sparsity` of the Jacobian's pattern (K = 200) must give (4, ()).
The target (issue 20): 10x at every K >= 200 for m = 1, the Jacobian of `JSQdBatch` (exponential service); the
m = 2 rows are printed beside it (their super-blocks of 8 unknowns are eliminated with LAPACK, not by cofactors).

Two references bound what any banded solve can gain here. *One product*: a jitted call that linearises the
residual and applies it to one vector, the least work of a matrix-free solve of this operator (the banded solve
does that and 2b m - 1 more products, batched, and then eliminates); dense / one product is the largest speed-up
any solver given this operator could show. *LAPACK*: `dgbsv` (banded LU) against `dgesv` (dense LU) on the
materialised matrix, through `scipy.linalg.lapack` (native code, no JAX).

Run with `.venv/bin/python benchmarks/banded_solve.py` (add `--quick` for fewer repeats). OpenBLAS is limited to one
thread unless `OPENBLAS_NUM_THREADS` is set, as in `fixed_point.py`.
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy/SciPy/JAX load OpenBLAS

import argparse  # noqa: E402
import functools  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402

from _common import interleaved_medians  # noqa: E402

import jsmkt  # noqa: E402, F401  (enables float64)
from jsmkt._linalg import BlockBanded, classify_sparsity  # noqa: E402


SIZES = ((200, 1), (400, 1), (800, 1), (200, 2), (400, 2), (800, 2))  # (levels K, phases m)
BANDWIDTH = 4
BATCH = np.array([0.4, 0.3, 0.2, 0.1])  # P(batch of j jobs), j = 1..4
LAM, H = 0.2, 0.5  # arrival rate of batches (load 0.4 for mean service time 1), Euler step
TARGET_SPEEDUP = 10.0  # dense time / banded time >= 10 at every K >= 200 for m = 1 (JSQdBatch's Jacobian, issue 20)
BURST = 10  # back-to-back calls of one function per round


def _service(m):
    """(alpha, T) of the service: exponential (m = 1) or a Coxian with phases of rates 2 and 1 (mean 1)."""
    if m == 1:
        return np.array([1.0]), np.array([[-1.0]])
    return np.array([1.0, 0.0]), np.array([[-2.0, 1.0], [0.0, -1.0]])


def residual(X, alpha, T):
    """`X - H * drift(X)` for tails `X` (K, m): X[k-1, i] is the fraction of queues with at least k jobs whose
    service is in phase i, s_k = sum_i X[k-1, i] (s_k = 1 for k <= 0). A batch joins the shorter of two sampled
    queues, one with exactly i jobs with probability s_i^2 - s_{i+1}^2, and lifts it past level k if it holds at
    least k - i jobs; service completions at level k + 1 bring queues down to level k:

        drift_k = LAM sum_{i = k-4}^{k-1} (s_i^2 - s_{i+1}^2) P(batch >= k - i) alpha + X_k T + X_{k+1} T0 alpha.
    """
    K, m = X.shape
    T0 = -jnp.sum(T, axis=1)
    s = jnp.concatenate([jnp.ones(BANDWIDTH), jnp.sum(X, axis=1)])  # s_i for i = 1 - BANDWIDTH .. K
    joins = s[:-1] ** 2 - s[1:] ** 2  # a batch joins a queue of exactly i jobs, i = 1 - BANDWIDTH .. K - 1
    at_least = np.cumsum(BATCH[::-1])[::-1]  # P(batch >= j), j = 1..4
    arrivals = sum(p * joins[BANDWIDTH - j:BANDWIDTH - j + K] for j, p in enumerate(at_least, start=1))  # (K,)
    completions = jnp.concatenate([X[1:] @ T0, jnp.zeros(1)])  # (K,)
    drift = (LAM * arrivals + completions)[:, None] * alpha[None, :] + X @ T
    return X - H * drift


def _point(K, m, alpha):
    """A generic point: geometric tails 0.97^k, perturbed (decaying slowly enough not to underflow at K = 800)."""
    k = np.arange(1, K + 1)
    tails = 0.97**k * (1.0 + 0.2 * np.sin(k))
    return jnp.asarray(tails[:, None] * (np.full((1, m), 0.5 / m) + 0.5 * alpha[None, :]))


@jax.jit
def one_product(X, v, alpha, T):
    """The floor of a matrix-free solve: linearise the residual at `X` and apply it to one vector."""
    _, lin = jax.linearize(lambda Y: residual(Y, alpha, T), X)
    return lin(v)


def _lapack(X, alpha, T):
    """`dgbsv` and `dgesv` calls on the materialised matrix (band storage for the former)."""
    import scipy.linalg.lapack as lapack

    n = X.size
    J = np.asarray(jax.jacfwd(lambda Y: residual(Y.reshape(X.shape), alpha, T).reshape(-1))(X.reshape(-1)))
    lv = np.repeat(np.arange(X.shape[0]), X.shape[1])
    kl = ku = int(max(np.abs(lv[:, None] - lv[None, :])[J != 0].max(), 1) + 1) * X.shape[1] - 1  # in unknowns
    ab = np.zeros((2 * kl + ku + 1, n))
    for i in range(n):
        lo, hi = max(0, i - kl), min(n, i + ku + 1)
        ab[kl + ku + i - np.arange(lo, hi), np.arange(lo, hi)] = J[i, lo:hi]
    return (lambda b: lapack.dgbsv(kl, ku, ab, b)[2]), (lambda b: lapack.dgesv(J, b)[2]), J


@functools.partial(jax.jit, static_argnums=(4,))
def solve(X, rhs, alpha, T, solver):
    _, lin = jax.linearize(lambda Y: residual(Y, alpha, T), X)
    op = lx.FunctionLinearOperator(lin, jax.ShapeDtypeStruct(X.shape, X.dtype))
    return lx.linear_solve(op, rhs, solver).value


def _interleaved_medians(fns, rounds, burst=BURST):
    """`_common.interleaved_medians`, in bursts of `BURST` calls by default."""
    return interleaved_medians(fns, rounds, burst)


def _first_call(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - t0, out


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of bursts per size")
    args = parser.parse_args()
    rounds = args.repeats or (3 if args.quick else 20)

    print(f"benchmarks/banded_solve.py at {_commit()}; jax {jax.__version__} on {jax.devices()[0].platform}; "
          f"bandwidth {BANDWIDTH}; medians of {rounds} interleaved rounds of {BURST} calls; "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the start")

    # The structure the banded solver is given, found from the Jacobian's pattern.
    alpha, T = (jnp.asarray(a) for a in _service(1))
    X = _point(200, 1, np.asarray(alpha))
    J = jax.jacfwd(lambda Y: residual(Y.reshape(X.shape), alpha, T).reshape(-1))(X.reshape(-1))
    found = classify_sparsity(np.asarray(J) != 0.0, tuple(range(200)))
    assert found == (BANDWIDTH, ()), f"classify_sparsity gave {found}"

    rows = []
    for K, m in SIZES:
        a_np, T_np = _service(m)
        alpha, T = jnp.asarray(a_np), jnp.asarray(T_np)
        X = _point(K, m, a_np)
        rhs = jnp.asarray(np.random.default_rng(K + m).standard_normal((K, m)))
        levels = tuple(np.repeat(np.arange(1, K + 1), m).tolist())
        banded_solver = BlockBanded(levels, BANDWIDTH)
        compile_banded, x_banded = _first_call(lambda: solve(X, rhs, alpha, T, banded_solver))
        compile_dense, x_dense = _first_call(lambda: solve(X, rhs, alpha, T, lx.LU()))
        err = float(jnp.max(jnp.abs(x_banded - x_dense)) / jnp.max(jnp.abs(x_dense)))
        assert err < 1e-12, f"K={K}, m={m}: banded and dense solutions differ by {err:.1e} (relative)"
        gbsv, gesv, J = _lapack(X, alpha, T)
        b_np = np.asarray(rhs).reshape(-1)
        assert np.allclose(gbsv(b_np), gesv(b_np), rtol=1e-10, atol=1e-12 * np.abs(gesv(b_np)).max())
        t = _interleaved_medians({
            "banded": lambda: solve(X, rhs, alpha, T, banded_solver),
            "dense": lambda: solve(X, rhs, alpha, T, lx.LU()),
            "product": lambda: one_product(X, rhs, alpha, T),
            "gbsv": lambda: gbsv(b_np),
            "gesv": lambda: gesv(b_np),
        }, rounds)
        rows.append((K, m, t["banded"], t["dense"], err, compile_banded, compile_dense, t["product"], t["gbsv"],
                     t["gesv"]))

    print()
    print(f"{'K':>5} {'m':>2} {'n':>5} {'banded':>10} {'dense LU':>10} {'dense/banded':>13} {'rel. diff':>9}"
          f" {'first calls (s): banded, dense':>32} {'one product':>12} {'dense/product':>14}"
          f" {'dgbsv':>9} {'dgesv':>9} {'dgesv/dgbsv':>12}")
    print("-" * 168)
    for K, m, tb, td, err, cb, cd, tp, tgb, tge in rows:
        print(f"{K:>5} {m:>2} {K * m:>5} {1e3 * tb:>7.3f} ms {1e3 * td:>7.3f} ms {td / tb:>12.1f}x {err:>9.1e}"
              f" {cb:>23.2f}, {cd:.2f} {1e3 * tp:>9.3f} ms {td / tp:>13.1f}x {1e3 * tgb:>6.3f} ms"
              f" {1e3 * tge:>6.3f} ms {tge / tgb:>11.1f}x")
    print()
    worst = min(td / tb for _, m, tb, td, *_ in rows if m == 1)
    print(f"banded >= {TARGET_SPEEDUP:g}x faster than dense at K >= 200, m = 1 (exponential service, as JSQdBatch): "
          f"worst {worst:.1f}x  {_verdict(worst >= TARGET_SPEEDUP)}")
    phases = min(td / tb for _, m, tb, td, *_ in rows if m > 1)
    print(f"with phases (m = 2, super-blocks of 8 unknowns, solved by LAPACK; not part of the target): worst "
          f"{phases:.1f}x")


if __name__ == "__main__":
    main()
