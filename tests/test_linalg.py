import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jsmkt._linalg import mmatrix_solve


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 8), seed=st.integers(0, 2**31 - 1), shift=st.floats(0.0, 5.0))
def test_mmatrix_solve_matches_lapack(m, seed, shift):
    # shift*I - T for a random sub-generator T is a nonsingular M-matrix, as in the PH models.
    rng = np.random.default_rng(seed)
    off = rng.uniform(0, 2, (m, m)) * (rng.uniform(size=(m, m)) < 0.6)
    np.fill_diagonal(off, 0)
    T = off - np.diag(off.sum(1) + rng.uniform(0.05, 2, m))
    A = shift * np.eye(m) - T
    b = rng.uniform(-1, 1, m)
    for M in (A, A.T):
        x = np.asarray(mmatrix_solve(M, b))
        np.testing.assert_allclose(x, np.linalg.solve(M, b), rtol=1e-10, atol=1e-12)
