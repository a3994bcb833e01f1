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


def assert_mm1(res, lam, levels, rel_percentile, rel_p99, mean_queue=False):
    """A simulation of independent M/M/1 queues (load `lam`, service rate 1) against the closed forms: E[T] =
    1/(1 - lam), s_k = lam^k for k = 1..`levels` (and E[Q] = lam/(1 - lam) with `mean_queue`) in standard errors,
    and the sojourn-time percentiles -log(1 - p)/(1 - lam) to the relative tolerances given (sojourn times are
    correlated, so their percentiles are looser than the mean)."""
    import math

    if mean_queue:
        assert_close(res, res.mean_queue_length, res.mean_queue_length_ci, lam / (1 - lam), what="E[Q]")
    assert_close(res, res.mean_sojourn_time, res.mean_sojourn_time_ci, 1 / (1 - lam), what="E[T]")
    for k in range(1, levels + 1):
        assert_close(res, res.tails[k], res.tails_ci[k], lam**k, what=f"s_{k}")
    for p, v in res.sojourn_time_percentiles.items():
        exact = math.log(1.0 / (1.0 - p / 100.0)) / (1.0 - lam)
        rel = rel_p99 if p == 99 else rel_percentile
        assert abs(v - exact) <= rel * abs(exact), (p, v, exact)
