"""Reference values for tests/test_refined.py: the order-2 steady-state expansion of JSQ(2) by rmftool 0.5.

    E[X^N] = pi + V/N + A/N^2 + o(1/N^2)

for JSQ(2) with exponential service (rate 1), arrival rate `lam` per server and buffer K, in the tail coordinates
x_k = fraction of servers with at least k jobs, k = 1..K (the model of rmftool's supermarket/JSQ examples):
x -> x + e_k/N at rate N lam (x_{k-1}^2 - x_k^2) (x_0 = 1) and x -> x - e_k/N at rate N (x_k - x_{k+1})
(x_{K+1} = 0). Run with rmftool installed (it is not a dependency of jsmkt):

    python -m venv /tmp/rmfvenv && /tmp/rmfvenv/bin/pip install rmftool==0.5 numpy scipy sympy
    /tmp/rmfvenv/bin/python tests/data/make_rmftool_order2.py

Two numerical settings of rmftool 0.5 are replaced here, since they cap its accuracy near 1e-7: its
`symetric_tensor` accumulates in float32, and the third and fourth moment systems are solved by `lgmres` with
`atol=1e-7`. This script makes the first float64 and solves those sparse systems directly (sparse LU with
iterative refinement); the
equations themselves are rmftool's. The fixed point is the root of the drift (scipy's `fsolve`, polished by
Newton) instead of rmftool's ODE run to t = 10000. `A` is rmftool's solver `computePiVA` applied to rmftool's own
symbolic derivatives at that point; its wrapper `DDPP.meanFieldExpansionSteadyState(order=2)` (same settings)
and stock rmftool are stored too (`A_meanFieldExpansionSteadyState`, `A_stock`), to show the size of those
effects (about 5e-8 and 1e-5 relative at K = 10).
"""

import json
import pathlib
import time

import numpy as np
import rmftool
import scipy.optimize
import scipy.sparse.linalg
from rmftool import refinedRefined_fixedPoint as rr


CASES = [(0.7, 10), (0.9, 10), (0.5, 5)]


def jsq2(lam, K):
    ddpp = rmftool.DDPP()
    for k in range(K):
        up = np.zeros(K)
        up[k] = 1
        ddpp.add_transition(up, (lambda k: lambda x: lam * ((1 if k == 0 else x[k - 1]) ** 2 - x[k] ** 2))(k))
        ddpp.add_transition(-up, (lambda k: lambda x: x[k] - (x[k + 1] if k + 1 < K else 0))(k))
    ddpp.set_initial_state(np.zeros(K))
    return ddpp


def drift(x, lam):
    s = np.concatenate([[1.0], x, [0.0]])
    return lam * (s[:-2] ** 2 - s[1:-1] ** 2) - (s[1:-1] - s[2:])


def fixed_point(lam, K):
    x = scipy.optimize.fsolve(drift, lam ** (2.0 ** np.arange(1, K + 1) - 1), args=(lam,), xtol=1e-15)
    for _ in range(5):  # Newton polish with the exact Jacobian
        s = np.concatenate([[1.0], x, [0.0]])
        J = np.diag(-2 * lam * s[1:-1] - 1) + np.diag(2 * lam * s[1:-2], -1) + np.diag(np.ones(K - 1), 1)
        x = x - np.linalg.solve(J, drift(x, lam))
    return x


def symmetric_tensor64(T):
    from itertools import permutations
    from scipy.special import factorial

    out = np.zeros(T.shape)
    for sigma in permutations(range(T.ndim)):
        out += np.transpose(T, axes=list(sigma))
    return out / factorial(T.ndim)


def exact_lgmres(M, b, atol=None):
    """A direct sparse LU solve with three steps of iterative refinement, in place of `lgmres`."""
    M = scipy.sparse.csc_matrix(M)
    lu = scipy.sparse.linalg.splu(M)
    x = lu.solve(b)
    for _ in range(3):
        x = x + lu.solve(b - M @ x)
    return x, 0


def expansion(lam, K, wrapper):
    """rmftool's order-2 expansion: its `DDPP.meanFieldExpansionSteadyState(order=2)` (`wrapper`), or the same
    derivatives (rmftool's symbolic ones) passed to its solver `computePiVA` directly."""
    ddpp = jsq2(lam, K)
    pi = fixed_point(lam, K)
    ddpp.fixed_point = lambda: pi
    t = time.perf_counter()
    if wrapper:
        _, V, A, (_, W, *_) = ddpp.meanFieldExpansionSteadyState(order=2)
    else:
        Fp, Fpp, Q = ddpp.defineDriftDerivativeQ(evaluate_at=pi)
        Fppp, Fpppp, Qp, Qpp, R = ddpp.defineDriftSecondDerivativeQderivativesR(evaluate_at=pi)
        _, V, A, (_, W, *_) = rr.computePiVA(pi, Fp, Fpp, Fppp, Fpppp, Q, Qp, Qpp, R)
    return pi, V, W, A, time.perf_counter() - t


def main():
    out = {"rmftool_version": "0.5", "model": "JSQ(2), exponential service rate 1, tails x_1..x_K", "cases": []}
    for lam, K in CASES:
        stock = rr.symetric_tensor, rr.sparse.linalg.lgmres
        A_stock = expansion(lam, K, True)[3]
        rr.symetric_tensor, rr.sparse.linalg.lgmres = symmetric_tensor64, exact_lgmres
        try:
            pi, V, W, A, seconds = expansion(lam, K, False)
            A_wrapper = expansion(lam, K, True)[3]
        finally:
            rr.symetric_tensor, rr.sparse.linalg.lgmres = stock
        rel = lambda B: np.max(np.abs(B - A)) / np.max(np.abs(A))  # noqa: E731
        print(f"lam={lam} K={K}: {seconds:.1f} s; A[:4] = {A[:4]}; relative differences: stock rmftool "
              f"{rel(A_stock):.2g}, meanFieldExpansionSteadyState with the float64 settings {rel(A_wrapper):.2g}")
        out["cases"].append({"lam": lam, "K": K, "pi": list(pi), "V": list(V), "W": W.tolist(), "A": list(A),
                             "A_meanFieldExpansionSteadyState": list(A_wrapper), "A_stock": list(A_stock),
                             "seconds": seconds})
    path = pathlib.Path(__file__).with_name("rmftool_order2_jsq2.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
