"""`jsmkt.optimise` (the shared optax loop) and its two design uses: the choice-number law under a probing cost
against exhaustive search over integer d and two-point mixtures, and R.3's repair allocation against a grid."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jsmkt


def _quadratic(p, target):
    return jnp.sum((p["x"] - target) ** 2) + 0.0 * jnp.sum(p["frozen"]), jnp.sum(p["x"])


def test_optimise_converges_keeps_frozen_leaves_and_the_history():
    target = jnp.array([1.0, -2.0, 3.0])
    start = {"x": jnp.zeros(3), "frozen": jnp.ones(2)}
    spec = {"x": True, "frozen": False}
    res = jsmkt.optimise(_quadratic, start, optax.adam(0.1), steps=2000, filter_spec=spec, args=(target,),
                         has_aux=True, rtol=0.0, atol=1e-14, progress=False)
    assert res.stop_reason == "converged" and res.converged
    np.testing.assert_allclose(res.params["x"], target, atol=1e-5)
    np.testing.assert_array_equal(res.params["frozen"], jnp.ones(2))
    assert res.history.shape == (res.steps,) and float(res.history[0]) == pytest.approx(14.0)
    assert float(res.loss) == float(jnp.min(res.history)) and float(res.aux) == pytest.approx(2.0, abs=1e-4)


def test_the_step_compiles_once():
    """A start from Python scalars (weakly typed arrays) and L-BFGS, whose state starts weakly typed too: one
    compilation of the step for the whole run. Each leaf that turned strongly typed after an update used to compile
    the step again (three times for `optimise_repair`, most of its time)."""
    from jsmkt import _optimise

    loss = lambda p: (p["x"] - 1.0) ** 2 + p["y"] ** 4  # noqa: E731
    before = _optimise._step._cached._cache_size()
    res = jsmkt.optimise(loss, {"x": jnp.asarray(0.3), "y": jnp.asarray(0.2)}, optax.lbfgs(), steps=6, rtol=0.0,
                         progress=False)
    assert res.steps == 6 and _optimise._step._cached._cache_size() == before + 1


def test_ctrl_c_stops_cleanly_with_the_best_point_so_far(capsys):
    """A KeyboardInterrupt (here raised by the callback, as Ctrl-C would be) ends the loop: the result holds the
    best point met, and a last log line says why it stopped."""
    seen = []

    def callback(step, params, loss, aux):
        seen.append((step, float(loss), np.asarray(params["x"])))
        if step == 5:
            raise KeyboardInterrupt

    # a step too long for this loss (lr 1.5 on x^2: x -> -2x): the loss grows, so the best point is the start
    res = jsmkt.optimise(lambda p: jnp.sum(p["x"] ** 2), {"x": jnp.array([1.0, 2.0])}, optax.sgd(1.5), steps=100,
                         callback=callback, log_every=0.0)
    assert res.stop_reason == "interrupted" and res.steps == 5 and len(seen) == 5
    assert res.best_step == 0 and float(res.loss) == pytest.approx(5.0)
    np.testing.assert_allclose(res.params["x"], [1.0, 2.0])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("optimise: step 1/100  loss 5") and len(err) == 6
    assert err[-1].startswith("optimise: stopped (interrupted) after 5 steps") and "best loss 5 at step 0" in err[-1]


def test_nonfinite_loss_stops_and_keeps_the_best():
    def loss(p):  # finite down to x = 0.5, NaN beyond: sgd walks x from 2 towards 0
        return jnp.where(p["x"] > 0.5, p["x"] ** 2, jnp.nan)

    res = jsmkt.optimise(loss, {"x": jnp.asarray(2.0)}, optax.sgd(0.1), steps=100, progress=False)
    assert res.stop_reason == "nonfinite" and 0.5 < float(res.params["x"]) < 0.7
    assert float(res.loss) == pytest.approx(float(res.params["x"]) ** 2)
    with pytest.raises(ValueError, match="filter_spec selects no leaf"):
        jsmkt.optimise(loss, {"x": jnp.asarray(2.0)}, filter_spec=False)
    with pytest.raises(ValueError, match="optimiser=.* must be an optax GradientTransformation"):
        jsmkt.optimise(loss, {"x": jnp.asarray(2.0)}, optimiser="adam")


# --- choice numbers under a probing cost ----------------------------------------------------------------------------

LAM, D_MAX, K = 0.9, 3, 240


@eqx.filter_jit
def _objectives(weights, c):
    """E[T] + c E[D] of JSQ with each choice law in `weights` (one vmapped solve)."""
    def one(w):
        m = jsmkt.JSQd(LAM, d=w, K=K)
        fp = jsmkt.solve_fixed_point(m, throw=False)
        return jsmkt.mean_sojourn_time(m, fp) + c * (jnp.arange(1.0, D_MAX + 1) @ w), fp.result == jsmkt.RESULTS.successful

    return jax.vmap(one)(weights)


def _grid(n=201):
    """Every integer d and every two-point mixture on a grid of n weights."""
    laws = [np.eye(D_MAX)[i] for i in range(D_MAX)]
    for i in range(D_MAX):
        for j in range(i + 1, D_MAX):
            for p in np.linspace(0.0, 1.0, n)[1:-1]:
                laws.append(p * np.eye(D_MAX)[i] + (1 - p) * np.eye(D_MAX)[j])
    return jnp.asarray(np.array(laws))


@pytest.mark.parametrize("c", [pytest.param(0.05, marks=pytest.mark.slow), 0.5, pytest.param(1.0, marks=pytest.mark.slow)])
def test_optimal_choice_law_is_no_worse_than_exhaustive_search(c):
    """The optimised law over d = 1..3 against integer d and two-point mixtures: c = 0.05 takes d = 3, c = 1 d = 2
    (vertices, reached as the logits diverge), c = 0.5 mixes 2 and 3 (E[T] is not linear in the law, so the
    optimum of E[T] + c E[D] need not be a vertex)."""
    best = jsmkt.optimise_choice(jsmkt.JSQd(LAM, d=2, K=K), c, d_max=D_MAX, K=K, progress=False)
    grid = _grid()
    values, ok = _objectives(grid, c)
    assert bool(jnp.all(ok))
    g = int(jnp.argmin(values))
    assert float(best.objective) <= float(values[g]) * (1 + 1e-6), (best.model.choice.probs, grid[g])
    # the objective is what it says: E[T] at the optimum's law plus c times its E[D]
    w = best.model.choice.probs
    again, _ = _objectives(w[None], c)
    assert float(best.objective) == pytest.approx(float(again[0]), rel=1e-12)
    assert float(best.probes) == pytest.approx(float(jnp.arange(1.0, D_MAX + 1) @ w), rel=1e-12)
    if c == 0.5:
        assert 0.05 < float(w[1]) < 0.95 and 0.05 < float(w[2]) < 0.95  # a mixture of d = 2 and d = 3


# --- repair allocation --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("metric, c", [("mean_sojourn_time", 0.0), ("mean_sojourn_time", 0.2), ("availability", 0.05)])
def test_optimal_repair_allocation_is_no_worse_than_grid_search(metric, c):
    """R.3 at lam = 0.7, alpha = 0.1, beta = 1: E[T] + c (1 - j) beta E[D2] (or minus the availability plus it) over
    j in [0, j*) and d2 in [1, 3] against a 41 x 41 grid. E[T] at c = 0: the corner j = 0, d2 = 3, reached as the
    logits diverge; at c = 0.2 an interior d2. The availability at c = 0.05 has a local maximum at each end of
    [0, j*) (j = 0, d2 = 1.29 and j -> j*, d2 = 1, the better): the starts across [0, j*) find the better one."""
    from jsmkt._design import _repair_model

    model = jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R3", j=0.05, K=20)
    j_star = 0.1 / 1.1
    J, D = (a.ravel() for a in np.meshgrid(np.linspace(0.0, j_star * (1 - 1e-9), 41), np.linspace(1.0, 3.0, 41)))
    best = jsmkt.optimise_repair(model, c, metric=metric, d2_max=3, K=20, progress=False)
    sign = -1.0 if metric == "availability" else 1.0

    @eqx.filter_jit
    def objective(j, d):
        m = _repair_model(best.model, j, d, 3)
        fp = jsmkt.solve_fixed_point(m, throw=False)
        return sign * getattr(jsmkt, metric)(m, fp) + c * jsmkt.probe_rate(m, fp, stream="large repairman")

    values = np.asarray(jax.vmap(objective)(jnp.asarray(J), jnp.asarray(D)))
    assert np.all(np.isfinite(values))
    assert float(best.objective) <= values.min() + 1e-6 * abs(values.min()), (float(best.model.j),
                                                                             float(best.model.choice2.d))
    assert 0.0 <= float(best.model.j) < j_star and 1.0 <= float(best.model.choice2.d) <= 3.0
    assert float(best.probes) == pytest.approx((1 - float(best.model.j)) * float(best.model.choice2.d), rel=1e-9)


def test_optimise_repair_refuses_other_models():
    with pytest.raises(ValueError, match="needs a RepairableJSQ with repair='R3'"):
        jsmkt.optimise_repair(jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R2", K=20))
    with pytest.raises(ValueError, match=r"wrt='theta' is not a choice number of JSQd; its choice numbers are d"):
        jsmkt.optimise_choice(jsmkt.JSQd(0.9, d=2, K=K), 0.1, wrt="theta")
