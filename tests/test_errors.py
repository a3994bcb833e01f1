"""Bad input gets a clear error naming the argument and value; never a silent NaN."""

import math
import re

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt
from jsmkt._spec import FAMILIES


def test_unstable_load_python():
    with pytest.raises(ValueError, match=r"unstable: lam=1.2 >= capacity mu=1 .*load rho=1.2"):
        jsmkt.solve_fixed_point(jsmkt.JSQd(1.2, d=2, K=20))
    with pytest.raises(ValueError, match=r"unstable: lam=0.6 >= capacity 1/E\[S\]=0.5 .*rho=lam\*E\[S\]=1.2"):
        jsmkt.solve_fixed_point(jsmkt.JSQdPH(0.6, jsmkt.erlang(2, mean=2.0), d=2, K=20))
    with pytest.raises(ValueError, match="unstable"):
        jsmkt.integrate(jsmkt.JSQd(1.0, d=2, K=20), 10.0)


def test_unstable_under_jit_and_result_code():
    f = eqx.filter_jit(lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=20)).value)
    with pytest.raises((ValueError, RuntimeError), match="unstable"):
        jax.block_until_ready(f(jnp.asarray(1.5)))
    ok, unstable = jax.vmap(
        lambda lam: (lambda r: (r == jsmkt.RESULTS.successful, r == jsmkt.RESULTS.unstable))(
            jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=20), throw=False).result)
    )(jnp.array([0.5, 1.2, 0.9]))
    assert ok.tolist() == [True, False, True] and unstable.tolist() == [False, True, False]


def test_invalid_ph_traced_is_caught_at_entry_point():
    def solve(scale):
        T = jnp.array([[-1.0, 2.0], [0.0, -1.0]]) * scale  # row 0 sums to +1: not a sub-generator
        svc = jsmkt.PH(jnp.array([1.0, 0.0]), T)  # traced: no construction-time check
        return jsmkt.solve_fixed_point(jsmkt.JSQdPH(0.3, svc, d=2, K=10)).value

    with pytest.raises((ValueError, RuntimeError), match="invalid PH service"):
        jax.block_until_ready(eqx.filter_jit(solve)(jnp.asarray(1.0)))


@pytest.mark.parametrize("make, match", [
    (lambda: jsmkt.JSQd(0.5, d=0), r"d=0 must be an integer >= 1|d=0 must be >= 1"),
    (lambda: jsmkt.JSQd(0.5, d=0.5), r"d=0.5 must be >= 1"),
    (lambda: jsmkt.JSQd(0.5, d=-1.5), r"d=-1.5 must be >= 1"),
    (lambda: jsmkt.JSQd(0.5, d="2"), r"d='2' is not a choice number"),
    (lambda: jsmkt.JSQdPH(0.5, jsmkt.erlang(2), d=None), r"d=None is not a choice number"),
    (lambda: jsmkt.JSQd(0.5, d=jnp.array([0.5, 0.6])), r"sums to 1.1"),
    (lambda: jsmkt.JSQd(0.5, d=jnp.array([1.2, -0.2])), r"d\[1\]=-0.2"),
    (lambda: jsmkt.JSQd(float("nan")), r"lam=nan has non-finite"),
    (lambda: jsmkt.JSQd(float("inf")), r"lam=inf has non-finite"),
    (lambda: jsmkt.JSQd(-0.5), r"lam=-0.5 must be positive"),
    (lambda: jsmkt.JSQd(0.5, mu=0.0), r"mu=0.0 must be positive"),
    (lambda: jsmkt.JSQd(0.5, K=1), r"K=1 must be an integer >= 2"),
    (lambda: jsmkt.JSQd(0.5, K=2.5), r"K=2.5 must be an integer"),
    (lambda: jsmkt.JSQdPH(0.5, "erlang"), r"service='erlang' must be a jsmkt.PH"),
    (lambda: jsmkt.JSQdPH(0.5, jsmkt.erlang(2), d=[1, 2, 3], K=5), r"d=\[1.0, 2.0, 3.0\] sums to 6.0"),
    (lambda: jsmkt.PH([0.5, 0.5], [[-1.0]]), r"T must be \(2, 2\)"),
    (lambda: jsmkt.PH([1.0, 0.0], [[-1.0, 2.0], [0.0, -1.0]]), r"row 0 of T sums to 1.0"),
    (lambda: jsmkt.PH([1.0, 0.0], [[-1.0, 1.0], [1.0, -1.0]]), r"phase 0 of T never reaches the absorbing"),
])
def test_construction_errors_name_argument_and_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_truncation_too_small_and_auto_K():
    model = jsmkt.JSQdPH(0.95, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=8)
    with pytest.raises(ValueError, match=r"K=8 is too small: .* raise K \(e.g. K=16, or more\) or .*auto_K=True\), which doubles K") as e:
        jsmkt.solve_fixed_point(model)
    assert isinstance(e.value, jsmkt.TruncationError) and (e.value.K, e.value.auto_K) == (8, False)
    assert e.value.tail_mass > e.value.tail_tol == 1e-10
    # auto_K that stops at max_K does not advise auto_K.
    with pytest.raises(jsmkt.TruncationError, match=r"K=10 is too small: .*; auto_K stopped at max_K=10; raise max_K"):
        jsmkt.solve_fixed_point(model, auto_K=True, max_K=10)
    # Regression: a K that starts above max_K is not grown, and the error said "auto_K stopped at max_K".
    with pytest.raises(jsmkt.TruncationError, match=r"K=8 is too small: .*; auto_K did not grow K, which starts "
                                                     r"above max_K=4; raise max_K \(e.g. max_K=128\) or K"):
        jsmkt.solve_fixed_point(model, auto_K=True, max_K=4)
    fp = jsmkt.solve_fixed_point(model, throw=False)
    assert fp.result == jsmkt.RESULTS.truncation_too_small
    fp = jsmkt.solve_fixed_point(model, auto_K=True)
    assert fp.result == jsmkt.RESULTS.successful and fp.model.K > 8 and float(fp.tail_mass) < 1e-10
    # The grown K agrees with a generous explicit K.
    big = jsmkt.JSQdPH(0.95, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=120)
    np.testing.assert_allclose(jsmkt.mean_sojourn_time(fp.model, fp),
                               jsmkt.mean_sojourn_time(big, jsmkt.solve_fixed_point(big)), rtol=1e-10)


def test_truncation_under_jit():
    f = eqx.filter_jit(lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=1, K=10)).value)
    with pytest.raises((ValueError, RuntimeError), match="truncation level K is too small"):
        jax.block_until_ready(f(jnp.asarray(0.9)))


def test_non_convergence_is_reported():
    model = jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=40)
    fp = jsmkt.solve_fixed_point(model, x0=jnp.full((40, 2), 0.3), max_steps=1, throw=False)
    assert fp.result != jsmkt.RESULTS.successful
    with pytest.raises(RuntimeError, match=r"did not converge .*max_steps=1"):
        jsmkt.solve_fixed_point(model, x0=jnp.full((40, 2), 0.3), max_steps=1)


def test_auto_K_refused_under_jit():
    with pytest.raises(ValueError, match="auto_K=True works outside jit"):
        jax.jit(lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=20), auto_K=True).value)(0.5)


def test_traced_d_needs_d_max():
    with pytest.raises(ValueError, match="pass d_max"):
        jax.grad(lambda d: jsmkt.mean_queue_length(m := jsmkt.JSQd(0.9, d=d, K=30), jsmkt.solve_fixed_point(m)))(2.5)
    g = jax.grad(lambda d: jsmkt.mean_queue_length(m := jsmkt.JSQd(0.9, d=d, K=30, d_max=4), jsmkt.solve_fixed_point(m)))(2.5)
    assert np.isfinite(float(g)) and float(g) < 0  # more choices, shorter queues


def test_integrate_bad_time():
    with pytest.raises(ValueError, match=r"t1=-1.0 must be a positive finite time"):
        jsmkt.integrate(jsmkt.JSQd(0.5, K=10), -1.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: jsmkt.solve_fixed_point(m, x0=0.5 ** jnp.arange(1.0, 31.0)), r"x0 has shape \(30,\), but .* \(20,\)"),
        (lambda m: jsmkt.integrate(m, 1.0, x0=jnp.zeros(5)), r"x0 has shape \(5,\), but .* \(20,\)"),
        (lambda m: jsmkt.steady_state(m, x0=jnp.zeros(5)), r"x0 has shape \(5,\), but .* \(20,\)"),
        (lambda m: jsmkt.solve_fixed_point(jsmkt.JSQdPH(0.5, jsmkt.erlang(2), K=20), x0=jnp.zeros((30, 2))),
         r"x0 has shape \(30, 2\), but .* \(20, 2\)"),
        (lambda m: jax.jit(lambda x: jsmkt.solve_fixed_point(m, x0=x).value)(jnp.zeros(3)), r"x0 has shape \(3,\)"),
        (lambda m: jsmkt.integrate(m, jnp.array([1.0, 2.0])), r"t1=.* must be a positive finite time"),
        (lambda m: jsmkt.solve_fixed_point(jsmkt.JSQd(0.5, d=2, K=10**11)),
         r"100000000000 unknowns \(K=100000000000\): Newton's linear system needs about .* GiB \(limit 8 GiB\)"),
    ],
)
def test_states_of_the_wrong_shape_and_oversized_systems_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call(jsmkt.JSQd(0.5, K=20))


@pytest.mark.parametrize("n", [np.int64(0), jnp.array(-5.0), np.float64(np.nan), "3", True])
def test_refined_state_refuses_bad_server_counts(n):
    rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(jsmkt.JSQd(0.5, K=20)))
    with pytest.raises(ValueError, match=r"n_servers=.* must be a number of servers >= 1"):
        rmf.state(n)
    np.testing.assert_allclose(rmf.state(np.int64(10)), rmf.state(10.0), rtol=1e-15)


def test_refined_mean_field_refuses_oversized_dense_matrices():
    fp = jsmkt.solve_fixed_point(jsmkt.JSQd(0.5, d=2, K=20000))
    with pytest.raises(ValueError, match=r"20000 entries \(K=20000\): .* 11.9 GiB \(limit 8 GiB\); lower K"):
        jsmkt.refined_mean_field(fp)


@pytest.mark.parametrize(
    ("x0", "match"),
    [
        (jnp.full(20, jnp.nan), r"x0 has non-finite entries"),
        (-0.5 * jnp.ones(20), r"x0 has a negative entry \(-0.5\)"),
        (jnp.zeros(20).at[0].set(2.0), r"x0 puts a fraction s_1=2 > 1"),
        (jnp.zeros(20).at[3].set(0.5), r"x0 has s_4=0.5 > s_3=0, but the fraction"),
    ],
)
@pytest.mark.parametrize("entry", ["integrate", "steady_state", "solve_fixed_point"])
def test_starting_states_that_are_not_states_are_refused(entry, x0, match):
    model = jsmkt.JSQd(0.5, d=2, K=20)
    call = {"integrate": lambda: jsmkt.integrate(model, 1.0, x0=x0),
            "steady_state": lambda: jsmkt.steady_state(model, x0=x0),
            "solve_fixed_point": lambda: jsmkt.solve_fixed_point(model, x0=x0)}[entry]
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(t1="5"), r"t1='5' must be a positive finite time \(a real number\)"),
        (dict(t1=True), r"t1=True must be a positive finite time \(a real number\)"),
        (dict(t1=5.0, ts=[1.0, float("nan")]), r"ts=\[1.0, nan\] must be finite, non-decreasing times in \[0, t1=5\]"),
        (dict(t1=5.0, ts=[3.0, 1.0]), r"ts=\[3.0, 1.0\] must be finite, non-decreasing"),
        (dict(t1=5.0, ts=[1.0, 10.0]), r"ts=\[1.0, 10.0\] must be .* in \[0, t1=5\]"),
        (dict(t1=5.0, rtol=-1.0), r"rtol=-1.0 must be a positive finite number"),
        (dict(t1=5.0, max_steps=2.5), r"max_steps=2.5 must be an integer >= 1"),
        # Regression: these were accepted silently (ts) or failed inside diffrax (solver).
        (dict(t1=5.0, ts=["1", "2"]), r"ts=\['1', '2'\] must hold real numbers \(times\), not string values"),
        (dict(t1=5.0, ts=[True]), r"ts=\[True\] must hold real numbers \(times\), not boolean values"),
        (dict(t1=5.0, solver=dfx.Euler()), r"solver=Euler\(\) must be a diffrax solver instance with error estimates"),
        (dict(t1=5.0, solver="tsit5"), r"solver='tsit5' must be a diffrax solver instance"),
        (dict(t1=5.0, solver=dfx.Tsit5), r"solver=<class .*Tsit5'> must be a diffrax solver instance"),
    ],
)
def test_integrate_refuses_bad_times_and_tolerances(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jsmkt.integrate(jsmkt.JSQd(0.9, d=2, K=20), **kwargs)


def test_transients_start_from_a_fixed_point_or_a_list():
    # Regression: a FixedPoint was refused with a repr dump, a list with "x0 has shape [(), (), ...]".
    model = jsmkt.JSQd(0.7, d=2, K=12)
    fp = jsmkt.solve_fixed_point(model)
    for x0 in (fp, [float(v) for v in fp.value]):
        np.testing.assert_allclose(jsmkt.integrate(model, 1.0, x0=x0).ys[-1], fp.value, atol=1e-12)
        np.testing.assert_allclose(jsmkt.steady_state(model, x0=x0)[0], fp.value, atol=1e-12)


def test_ode_failures_are_python_errors_with_the_right_advice():
    model = jsmkt.JSQd(0.9, d=2, K=20)
    with pytest.raises(RuntimeError, match=r"did not reach a steady state within `max_steps` steps; raise `max_st"):
        jsmkt.steady_state(model, max_steps=5)
    with pytest.raises(RuntimeError, match=r"did not reach t1 .*raise `max_steps`, or integrate to a smaller `t1`"):
        jsmkt.integrate(model, 100.0, max_steps=3)


def test_steady_state_under_jit_and_vmap_checks_the_load():
    code = jax.vmap(lambda lam: jsmkt.steady_state(jsmkt.JSQd(lam, d=2, K=20), throw=False)[1] == jsmkt.RESULTS.unstable)
    assert code(jnp.array([0.5, 1.2])).tolist() == [False, True]
    with pytest.raises(Exception, match="unstable"):
        jax.block_until_ready(jax.jit(lambda lam: jsmkt.steady_state(jsmkt.JSQd(lam, d=2, K=20))[0])(1.2))


def test_jit_of_a_function_that_closes_over_a_concrete_model():
    """A model built outside `jit` and used inside it: its leaves are concrete, but what is computed from them is
    staged, so the entry points take their traced paths."""
    model = jsmkt.JSQd(0.9, d=2, K=20)
    eager = float(jsmkt.integrate(model, 2.0).ys[-1, 0])
    assert float(jax.jit(lambda t: jsmkt.integrate(model, t).ys[-1, 0])(2.0)) == pytest.approx(eager, rel=1e-12)
    assert float(jax.jit(lambda: jsmkt.steady_state(model)[0][0])()) == pytest.approx(0.9, rel=1e-8)
    fp = jsmkt.solve_fixed_point(model)
    assert float(jax.jit(lambda: jsmkt.mean_queue_length(model, jsmkt.solve_fixed_point(model)))()) == pytest.approx(
        float(jsmkt.mean_queue_length(model, fp)), rel=1e-12)
    np.testing.assert_allclose(jax.jit(lambda: jsmkt.refined_mean_field(fp).correction)(),
                               jsmkt.refined_mean_field(fp).correction, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: jsmkt.JSQd(0.5, d=2.5, d_max=2.7), r"d_max=2.7 must be an integer >= 1"),
    (lambda: jsmkt.InterpolatedChoice(2.5, d_max="3"), r"d_max='3' must be an integer >= 1"),
    (lambda: jsmkt.FixedChoice(2.0), r"d=2.0 must be an integer >= 1"),
])
def test_choice_arguments_are_integers(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    assert jsmkt.FixedChoice(np.int64(3)).d == 3 and jsmkt.InterpolatedChoice(2.5, d_max=np.int64(4)).d_max == 4


def test_batches_outside_vmap_are_refused_with_advice():
    import equinox as eqx

    lams = jnp.array([0.5, 0.9])
    fps = jax.vmap(lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, K=20), throw=False))(lams)
    with pytest.raises(ValueError, match=r"fixed_point.value has shape \(2, 20\).*a batch of states"):
        jsmkt.refined_mean_field(fps)
    with pytest.raises(ValueError, match=r"the model holds a batch of parameters"):
        jsmkt.solve_fixed_point(eqx.filter_vmap(lambda lam: jsmkt.JSQd(lam, K=20))(lams))
    assert jax.vmap(jsmkt.refined_mean_field)(fps).correction.shape == (2, 20)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: jsmkt.exponential(True), "rate"),
        (lambda: jsmkt.erlang(2, mean=True), "mean"),
        (lambda: jsmkt.hyperexponential2(1.0, scv=True), "scv"),
        (lambda: jsmkt.hyperexponential([True, False], [1.0, 2.0]), "probs"),
        (lambda: jsmkt.JSQd(True, d=2), "lam"),
        (lambda: jsmkt.JSQdPH(0.5, jsmkt.exponential(), d=np.bool_(True)), "d"),
        (lambda: jsmkt.published.exponential_sojourn_time(0.5, 2, mu=True), "mu"),
        (lambda: jsmkt.fit_ph2_three_moments(True, 3.0, 15.0), "m1"),
    ],
)
def test_booleans_are_not_numbers(call, name):
    """Regression: True was read as 1.0 (integer arguments already refused it)."""
    with pytest.raises(ValueError, match=rf"^{name}=(np\.)?(True|\[True, False\]).* (is boolean|must be)"):
        call()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: jsmkt.published.exponential_sojourn_time(1e-320, 2), "lam"),
        (lambda: jsmkt.exponential(1e-320), "rate"),
        (lambda: jsmkt.JSQd(1e-320, d=2), "lam"),
    ],
)
def test_subnormal_numbers_are_refused(call, name):
    """Regression: 'lam=9.99989e-321 must be positive', since JAX reads numbers below the smallest normal float64 as
    0; or, for a rate, an infinite mean."""
    with pytest.raises(ValueError, match=rf"^{name}=1e-320 is nonzero but below 2\.22507e-308, the smallest"):
        call()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jsmkt.JSQd(0.5, d=2**63 - 1), r"^d=9223372036854775807 exceeds 65536, the largest number of servers"),
        (lambda: jsmkt.JSQd(0.5, d=10**11), r"^d=100000000000 exceeds 65536"),
        (lambda: jsmkt.JSQd(0.5, d=1e300), r"^d=1e\+300 must be below 65536"),
        (lambda: jsmkt.JSQd(0.5, d=2.5, d_max=10**11), r"^d_max=100000000000 exceeds 65536"),
        (lambda: jsmkt.JSQd(0.5, d=jnp.full(70000, 1 / 70000)), r"^d has 70000 probabilities: more than 65536"),
        (lambda: jsmkt.JSQd(0.5, d=jnp.array([-0.5, 1.5])),
         r"^d\[0\]=-0\.5 \(probability of sampling 1 server\) is negative$"),
        (lambda: jsmkt.MixedChoice([True]), r"^d=\[True\] is boolean"),
        (lambda: jsmkt.InterpolatedChoice(True), r"^d=True is boolean"),
    ],
)
def test_choice_numbers_are_bounded_real_numbers(make, match):
    """Regression: d = 2^63 - 1 aborted the process inside XLA, d = 1e11 ran out of memory, d = 1e300 raised
    OverflowError (the choice law is a dense vector of P(D = j)); booleans were read as 1.0."""
    with pytest.raises(ValueError, match=match):
        make()


def test_subnormal_probabilities_are_read_as_zero():
    """Regression (of the subnormal refusal): a choice law from a Poisson pmf has subnormal entries far in its tail,
    and a PH's alpha may too; they are probabilities, not scales, so they are accepted and read as 0."""
    j = np.arange(250)
    w = np.exp(j * np.log(3.0) - 3.0 - np.array([math.lgamma(k + 1) for k in j]))
    w /= w.sum()
    assert np.any((w > 0) & (w < np.finfo(float).tiny))
    a, b = jsmkt.JSQd(0.9, d=w, K=30), jsmkt.JSQd(0.9, d=np.where(w < 1e-300, 0.0, w), K=30)
    assert float(jsmkt.mean_queue_length(a, jsmkt.solve_fixed_point(a))) == pytest.approx(
        float(jsmkt.mean_queue_length(b, jsmkt.solve_fixed_point(b))), rel=1e-14)
    assert float(jsmkt.PH([1.0, 1e-310], [[-1.0, 0.0], [0.0, -1.0]]).mean) == pytest.approx(1.0, rel=1e-15)
    # Rates are scales: the offending entry is named.
    with pytest.raises(ValueError, match=r"^rates\[1\]=1e-310 is nonzero but below 2\.22507e-308"):
        jsmkt.hyperexponential([0.5, 0.5], [1.0, 1e-310])


# --- issue 25: consistent results ---------------------------------------------------------------------------------


def test_failed_entries_have_nan_metrics():
    """Issue 25: in a vmapped sweep with throw=False, an entry flagged as failed (lam = 1.0) still returned
    E[T] = 35.01 (Newton's last iterate). Its value, hence every metric, is NaN now; the result code says why, and
    the stable entries keep Mitzenmacher's E[T] = sum_k lam^(2^k - 2). A K that is too small gives NaN too (also
    outside jit), its tail mass at K is still reported."""

    def solve(lam):
        m = jsmkt.JSQd(lam, d=2, K=40)
        fp = jsmkt.solve_fixed_point(m, throw=False)
        return jsmkt.mean_sojourn_time(m, fp), jsmkt.tails(m, fp), fp.result == jsmkt.RESULTS.unstable

    lams = np.array([0.5, 0.9, 1.0, 1.1])
    ET, s, unstable = map(np.asarray, jax.vmap(solve)(jnp.asarray(lams)))
    assert unstable.tolist() == [False, False, True, True]
    assert np.all(np.isnan(ET[2:])) and np.all(np.isnan(s[2:, 1:]))
    k = np.arange(1, 40)
    np.testing.assert_allclose(ET[:2], [np.sum(lam ** (2.0**k - 2)) for lam in lams[:2]], rtol=1e-10)
    fp = jsmkt.solve_fixed_point(jsmkt.JSQd(0.9, d=2, K=4), throw=False)
    assert fp.result == jsmkt.RESULTS.truncation_too_small and float(fp.tail_mass) > 1e-10
    assert math.isnan(float(jsmkt.mean_sojourn_time(fp.model, fp)))


def _first_numbers(kwargs):
    """(argument name, a copy of `kwargs` with that number or list of numbers given as text) for each number."""
    for key, v in kwargs.items():
        if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and key != "K"):
            yield key, {**kwargs, key: str(v)}
        elif isinstance(v, list) and v and all(isinstance(x, float) for x in v):
            yield key, {**kwargs, key: [str(x) for x in v]}
            yield f"{key}[0]", {**kwargs, key: [str(v[0]), *v[1:]]}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_constructors_refuse_text_naming_the_argument(family):
    """Issue 25: `JSQd('0.9')` and the like: every number a family's constructor takes, given as a string (or a list
    of strings), is refused with a ValueError naming the argument. The arguments come from the family's example spec
    (its TOML parser), so every registered family is covered."""
    import pathlib
    import tomllib

    from jsmkt._spec import ServiceSpec, parse_spec

    examples = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
    spec = next(s for p in examples if (s := tomllib.loads(p.read_text()))["model"] == family)
    kwargs = {k: v.build() if isinstance(v, ServiceSpec) else v for k, v in parse_spec(spec).kwargs.items()}
    cls = FAMILIES[family].model
    cls(**kwargs)  # the example itself is fine
    cases = list(_first_numbers(kwargs))
    assert cases
    for name, bad in cases:
        with pytest.raises(ValueError, match=rf"{re.escape(name.split('[')[0])}(\[\d+\])?=\[?'"):
            cls(**bad)
    if "service" in kwargs:
        with pytest.raises(ValueError, match=r"service='h2' must be a jsmkt.PH"):
            cls(**{**kwargs, "service": "h2"})


@pytest.mark.parametrize("call, name", [
    (lambda v: jsmkt.PH(v, [[-1.0]]), "alpha"),
    (lambda v: jsmkt.PH([1.0], v), "T"),
    (lambda v: jsmkt.exponential(v), "rate"),
    (lambda v: jsmkt.erlang(v), "k"),
    (lambda v: jsmkt.erlang(2, v), "mean"),
    (lambda v: jsmkt.hyperexponential2(1.0, v), "scv"),
    (lambda v: jsmkt.hyperexponential([1.0], v), "rates"),
    (lambda v: jsmkt.coxian2(v, 2.0), "mean"),
    (lambda v: jsmkt.fit_ph2_three_moments(1.0, v, 6.0), "m2"),
    (lambda v: jsmkt.deterministic(v), "mean"),
    (lambda v: jsmkt.lognormal(1.0, v), "scv"),
    (lambda v: jsmkt.FixedChoice(v), "d"),
    (lambda v: jsmkt.InterpolatedChoice(v), "d"),
    (lambda v: jsmkt.MixedChoice(v), "d"),
    (lambda v: jsmkt.JSQd(0.5, d=v), "d"),
    (lambda v: jsmkt.JSQdClasses([0.3], mu=v), "mu"),
    (lambda v: jsmkt.JSQdClasses([0.3], helper_rates=v, f=[2]), "helper_rates"),
])
@pytest.mark.parametrize("value", ["2", b"2", ["2"], object(), 2 + 1j, np.array([2 + 0j]), {"d": 2}])
def test_distribution_and_choice_constructors_refuse_non_numbers(call, name, value):
    """Issue 25: strings, bytes, objects, complex numbers and dicts are refused by name (regressions: `d=object()`
    gave JAX's TypeError, `deterministic('0.9')` and `lognormal(1, '4')` were read as numbers, a complex array was
    cast to its real part with a ComplexWarning, JSQdClasses' `mu` errors named `rate`, `helper_rates=b'12'`
    was read as [49, 50])."""
    with pytest.raises(ValueError, match=rf"\b{name}(\[\d+\])?="):
        call(value)


def test_results_print_readably():
    """Issue 25: `jsmkt.RESULTS.successful` printed as `jsmkt._solution.RESULTS<>`, a FixedPoint as shapes only."""
    assert repr(jsmkt.RESULTS.successful) == "jsmkt.RESULTS<successful>"
    assert repr(jsmkt.RESULTS.unstable).startswith("jsmkt.RESULTS<the model is unstable")
    model = jsmkt.JSQd(0.5, d=2, K=12)
    text = repr(jsmkt.solve_fixed_point(model))
    assert text.startswith("FixedPoint(JSQd(lam=0.5, mu=1, choice=FixedChoice(d=2), K=12): jsmkt.RESULTS<successful>, "
                           "newton_steps=")
    assert "residual=" in text and "tail_mass=" in text and text.endswith("value=f64[12])")
    text = repr(jsmkt.integrate(model, 1.0, ts=jnp.linspace(0.0, 1.0, 3)))
    assert text == ("Trajectory(JSQd(lam=0.5, mu=1, choice=FixedChoice(d=2), K=12): jsmkt.RESULTS<successful>, "
                    "ts=[0, 0.5, 1], ys=f64[3,12])")
    batch = jax.vmap(lambda lam: jsmkt.solve_fixed_point(jsmkt.JSQd(lam, d=2, K=12), throw=False))(jnp.array([0.5, 2.0]))
    assert "value=f64[2,12]" in repr(batch) and "'successful'" in repr(batch)
