"""Statistical helpers of the simulation tests: comparisons of estimates with exact values in standard errors."""

import numpy as np
import scipy.stats


def standard_error(res, half_width):
    """Standard error behind a reported 95 % half-width."""
    dof = res.n_replications - 1 if res.ci_method == "replications" else res.n_batches - 1
    return half_width / scipy.stats.t.ppf(0.975, dof)


def assert_close(res, estimate, half_width, exact, *, n_se=4.0, allowance=0.0, what=""):
    """`estimate` (with its 95 % `half_width` from `res`) within `n_se` standard errors plus `allowance` of
    `exact`."""
    se = standard_error(res, half_width)
    assert np.isfinite(se) and se > 0, f"{what}: no standard error ({half_width!r})"
    assert abs(estimate - exact) <= n_se * se + allowance, (
        f"{what}: simulated {estimate:.6g} ± {half_width:.2g} (95 %), exact {exact:.6g}, "
        f"|diff| = {abs(estimate - exact):.3g} > {n_se} SE ({n_se * se:.3g}) + allowance {allowance:.3g}"
    )
