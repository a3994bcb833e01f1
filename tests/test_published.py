"""The papers' published forms: where they are exact, and where (with numbers) they are not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


pub = jsmkt.published


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("lam", [0.5, 0.9])
def test_published_closed_form_is_exact_for_exponential_service(d, lam):
    K = 30
    svc = jsmkt.exponential(1.0)
    pi = np.asarray(pub.ph_fixed_point(lam, svc, d, K))
    expected = np.array([lam ** ((d**k - 1) / (d - 1)) for k in range(1, K + 1)])
    np.testing.assert_allclose(pi[:, 0], expected, rtol=1e-13, atol=1e-300)
    res = pub.ph_fixed_point_residuals(lam, svc, d, K)
    assert float(res["exact"]) < 1e-15 and float(res["published"]) < 1e-15
    # Mitzenmacher's sojourn time, via both published formulas and the exact model.
    ET = sum(lam ** ((d**i - d) / (d - 1)) for i in range(1, 40))
    assert abs(float(pub.exponential_sojourn_time(lam, d)) - ET) < 1e-13 * ET
    assert abs(float(pub.ph_sojourn_time(lam, svc, d)) - ET) < 1e-13 * ET
    model = jsmkt.JSQdPH(lam, svc, d=d, K=K)
    assert abs(float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))) - ET) < 1e-12 * ET


def test_published_ode_equals_exact_for_exponential_service():
    # With m = 1 the Hadamard power is the right probability and the two ODEs coincide.
    svc = jsmkt.exponential(1.3)
    a = pub.JSQdPHAsPublished(0.6, svc, 3, K=12)
    b = jsmkt.JSQdPH(0.6, svc, d=3, K=12)
    y = jnp.linspace(0.5, 0.01, 12)[:, None]
    np.testing.assert_allclose(a.vector_field(0.0, y), b.vector_field(0.0, y), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, svc, pk", [
    ("erlang2", jsmkt.erlang(2), 0.8 + 0.64 * 1.5 / (2 * 0.2)),
    ("h2_scv4", jsmkt.hyperexponential2(1.0, 4.0), 0.8 + 0.64 * 5.0 / (2 * 0.2)),
])
def test_published_ode_misses_pollaczek_khinchine_even_for_d1(name, svc, pk):
    """For d = 1 the levels k >= 2 of eq. (3) are exact, but eq. (2) writes the flow into level 1 as
    lam * (alpha - S_1) where the exact flow is lam * (1 - s_1) * alpha: the same total, in the wrong phases.
    The published ODE then gives the M/M/1 mean queue length rho/(1 - rho) = 4 at rho = 0.8 whatever the service
    variability, where Pollaczek-Khinchine gives 3.2 (Erlang-2) and 8.8 (H2, SCV 4); the exact model gives PK."""
    a = pub.JSQdPHAsPublished(0.8, svc, 1, K=600)
    b = jsmkt.JSQdPH(0.8, svc, d=1, K=600)
    La = float(jsmkt.mean_queue_length(a, jsmkt.solve_fixed_point(a)))
    Lb = float(jsmkt.mean_queue_length(b, jsmkt.solve_fixed_point(b)))
    assert abs(Lb - pk) < 1e-9
    assert abs(La - 4.0) < 1e-9


def test_published_closed_form_differs_for_erlang2():
    """Erlang-2 service, d = 2, lam = 0.9 (all numbers float64, K = 40):

    | quantity       | exact mean field | published closed form (11) | published ODE (1)-(3) fixed point |
    | s_1            | 0.9              | 0.9                        | 0.99112                           |
    | s_2            | 0.66865          | 0.3645                     | 0.37702                           |
    | s_3            | 0.32906          | 0.05979                    | 0.04423                           |
    | E[T]           | 2.18963          | 1.37197 (Section 3)        | 1.56997 (Little)                  |

    The closed form leaves a residual of 0.3645 in the exact equations (0.18225 in its own eq. (5)), because
    omega^{(.)2} = (1/4, 1/4) is not proportional to alpha = (1, 0).
    """
    lam, d, K = 0.9, 2, 40
    svc = jsmkt.erlang(2)
    exact = jsmkt.JSQdPH(lam, svc, d=d, K=K)
    fpe = jsmkt.solve_fixed_point(exact)
    s_exact = np.asarray(jsmkt.tails(exact, fpe))
    s_pub = np.concatenate([[1.0], np.asarray(pub.ph_fixed_point(lam, svc, d, K)).sum(1)])
    published_ode = pub.JSQdPHAsPublished(lam, svc, d, K=K)
    fpp = jsmkt.solve_fixed_point(published_ode)
    s_ode = np.asarray(jsmkt.tails(published_ode, fpp))

    np.testing.assert_allclose(s_exact[1:4], [0.9, 0.668646, 0.329058], atol=1e-6)
    np.testing.assert_allclose(s_pub[1:4], [0.9, 0.3645, 0.0597871], atol=1e-6)
    np.testing.assert_allclose(s_ode[1:4], [0.991125, 0.377016, 0.0442266], atol=1e-6)
    assert abs(float(jsmkt.mean_sojourn_time(exact, fpe)) - 2.189631) < 1e-5
    assert abs(float(pub.ph_sojourn_time(lam, svc, d)) - 1.371969) < 1e-5
    assert abs(float(jsmkt.mean_sojourn_time(published_ode, fpp)) - 1.569969) < 1e-5

    res = pub.ph_fixed_point_residuals(lam, svc, d, K)
    assert abs(float(res["published"]) - 0.18225) < 1e-10
    assert abs(float(res["exact"]) - 0.3645) < 1e-10
    # The published ODE's fixed point does not even have utilisation rho: its phase dynamics are wrong.
    assert s_ode[1] - lam > 0.09


def test_published_requires_integer_d():
    with pytest.raises(ValueError, match="integer choice number"):
        pub.ph_fixed_point(0.5, jsmkt.erlang(2), 2.5, 10)
    with pytest.raises(ValueError, match="integer choice number"):
        pub.JSQdPHAsPublished(0.5, jsmkt.erlang(2), 0, K=10)


@pytest.mark.parametrize("lam", [0.5, 0.9, 0.99])
def test_published_sojourn_time_for_d1_is_mm1(lam):
    """d = 1: the M/M/1 mean sojourn time 1/(1 - lam), also through Li & Lui's series (regression: it was cut
    at 64 terms, 47.97 instead of 100 at lam = 0.99)."""
    exact = 1.0 / (1.0 - lam)
    assert float(pub.exponential_sojourn_time(lam, 1)) == pytest.approx(exact, rel=1e-13)
    assert float(pub.ph_sojourn_time(lam, jsmkt.exponential(1.0), 1)) == pytest.approx(exact, rel=1e-13)
    assert float(pub.ph_sojourn_time(2 * lam, jsmkt.exponential(2.0), 1)) == pytest.approx(exact / 2, rel=1e-13)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("lam", [0.99, 0.999999, 1 - 2**-52])
def test_published_sojourn_time_near_saturation(d, lam):
    """Mitzenmacher's series to convergence (the terms lam^((d^i - d)/(d - 1)) vanish once d^i (1 - lam) >> 1)."""
    ET, i = 0.0, 1
    while (term := lam ** ((d**i - d) / (d - 1))) > 0.0:
        ET, i = ET + term, i + 1
    assert float(pub.exponential_sojourn_time(lam, d)) == pytest.approx(ET, rel=1e-13)
    assert float(pub.ph_sojourn_time(lam, jsmkt.exponential(1.0), d)) == pytest.approx(ET, rel=1e-13)


def test_published_series_too_short_is_refused():
    with pytest.raises(ValueError, match=r"terms=5 leaves out up to .* of the series .*raise terms"):
        pub.exponential_sojourn_time(0.99, 2, terms=5)
    with pytest.raises(ValueError, match=r"terms=3 leaves out up to .* of the series .*raise terms"):
        pub.ph_sojourn_time(0.999, jsmkt.erlang(2), 2, terms=3)
    with pytest.raises((ValueError, RuntimeError), match="terms=5 leaves out a non-negligible part"):
        jax.jit(lambda lam: pub.exponential_sojourn_time(lam, 2, terms=5))(0.99)
    # Enough terms when the rest is negligible: 5 terms at lam = 0.5 leave 0.5^62.
    ET = sum(0.5 ** (2**i - 2) for i in range(1, 8))
    assert float(pub.exponential_sojourn_time(0.5, 2, terms=5)) == pytest.approx(ET, rel=1e-15)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: pub.exponential_sojourn_time(1.5, 1), r"^unstable: lam=1\.5 gives load rho=1\.5 >= 1 .*lower lam"),
        (lambda: pub.exponential_sojourn_time(1.5, 2), r"^unstable: lam=1\.5 gives load rho=1\.5 >= 1"),
        (lambda: pub.exponential_sojourn_time(1.0, 2), r"^unstable: lam=1 gives load rho=1 >= 1"),
        (lambda: pub.exponential_sojourn_time(0.5, 2, mu=0.25), r"^unstable: lam=0\.5 gives load rho=2 >= 1"),
        (lambda: pub.exponential_sojourn_time(-0.5, 2), r"^lam=-0\.5 must be positive"),
        (lambda: pub.exponential_sojourn_time(0.0, 2), r"^lam=0 must be positive"),
        (lambda: pub.exponential_sojourn_time(0.5, 2, mu=-1.0), r"^mu=-1 must be positive"),
        (lambda: pub.exponential_sojourn_time(float("nan"), 2), r"^lam=\[?nan\]? has non-finite entries"),
        (lambda: pub.exponential_sojourn_time(0.5, 2, terms=0), r"^terms=0 must be an integer >= 1"),
        (lambda: pub.exponential_tails(1.5, 2, K=5), r"^unstable: lam=1\.5"),
        (lambda: pub.exponential_tails(0.5, 2, K=-1), r"^K=-1 must be an integer >= 1"),
        (lambda: pub.exponential_tails(0.5, 2, K=0), r"^K=0 must be an integer >= 1"),
        (lambda: pub.exponential_tails(0.5, 2, K=2.0), r"^K=2\.0 must be an integer >= 1"),
        (lambda: pub.ph_sojourn_time(1.5, jsmkt.erlang(2), 2), r"^unstable: lam=1\.5 .*rho = lam \* E\[S\]"),
        (lambda: pub.ph_sojourn_time(0.6, jsmkt.erlang(2, 2.0), 2), r"^unstable: lam=0\.6 gives load rho=1\.2"),
        (lambda: pub.ph_sojourn_time(-0.5, jsmkt.erlang(2), 2), r"^lam=-0\.5 must be positive"),
        (lambda: pub.ph_sojourn_time(0.5, "erlang", 2), r"^service='erlang' must be a jsmkt\.PH distribution"),
        (lambda: pub.ph_fixed_point(1.5, jsmkt.erlang(2), 2, 10), r"^unstable: lam=1\.5"),
        (lambda: pub.ph_fixed_point(0.5, jsmkt.erlang(2), 2, 0), r"^K=0 must be an integer >= 1"),
        (lambda: pub.ph_fixed_point_residuals(1.5, jsmkt.erlang(2), 2, 10), r"^unstable: lam=1\.5"),
        (lambda: pub.exponential_sojourn_time(0.5, np.int64(0)), r"d=np\.int64\(0\): .*integer choice number"),
        (lambda: pub.exponential_sojourn_time(0.5, True), r"d=True: .*integer choice number"),
    ],
)
def test_published_input_errors(build, match):
    """Regression: these returned -2.0, inf, 1.2657, tails above 1, [] and NaN."""
    with pytest.raises(ValueError, match=match):
        build()


def test_published_accepts_numpy_integers():
    lam, d = 0.5, np.int64(2)
    ET = sum(lam ** ((2**i - 2) / 1) for i in range(1, 40))
    assert float(pub.exponential_sojourn_time(lam, d)) == pytest.approx(ET, rel=1e-14)
    np.testing.assert_allclose(pub.exponential_tails(lam, d, K=np.int64(3)), [1.0, 0.5, 0.125, 0.0078125],
                               rtol=1e-15)
    assert pub.ph_fixed_point(lam, jsmkt.erlang(2), d, np.int64(4)).shape == (4, 2)
    assert float(pub.ph_sojourn_time(lam, jsmkt.exponential(1.0), d, terms=np.int64(64))) == pytest.approx(ET)


def test_published_traced_inputs():
    """Valid traced inputs work (with the right derivative); invalid ones fail at run time."""
    f = lambda lam: pub.exponential_sojourn_time(lam, 1)  # noqa: E731
    assert float(jax.jit(f)(0.5)) == pytest.approx(2.0, rel=1e-14)
    assert float(jax.grad(f)(0.5)) == pytest.approx(4.0, rel=1e-14)  # d/dlam 1/(1 - lam)
    # d = 2: E[T] = sum_i lam^(2^i - 2); its derivative term by term.
    lam = 0.9
    dET = sum((2**i - 2) * lam ** (2**i - 3) for i in range(2, 40))
    assert float(jax.grad(lambda x: pub.exponential_sojourn_time(x, 2))(lam)) == pytest.approx(dET, rel=1e-12)
    assert float(jax.grad(lambda x: pub.ph_sojourn_time(x, jsmkt.exponential(1.0), 2))(lam)) == pytest.approx(
        dET, rel=1e-12)
    # Erlang-2, d = 1: E[T] = rho theta (omega - alpha)(-T)^{-1} 1 + E[S]/(1 - rho) with rho = lam, theta = 1,
    # omega = (1/2, 1/2), (-T)^{-1} 1 = (1, 1/2): -rho/4 + 1/(1 - rho); derivative -1/4 + 1/(1 - rho)^2.
    g = jax.grad(lambda x: pub.ph_sojourn_time(x, jsmkt.erlang(2), 1))(lam)
    assert float(g) == pytest.approx(-0.25 + 1 / (1 - lam) ** 2, rel=1e-12)
    assert float(pub.ph_sojourn_time(lam, jsmkt.erlang(2), 1)) == pytest.approx(-lam / 4 + 1 / (1 - lam), rel=1e-13)
    np.testing.assert_allclose(jax.vmap(lambda x: pub.exponential_tails(x, 2, K=2))(jnp.array([0.5, 0.9])),
                               [[1.0, 0.5, 0.125], [1.0, 0.9, 0.729]], rtol=1e-15)
    for bad, match in [(1.5, "unstable: the load rho is >= 1"), (-0.5, "lam must be positive")]:
        with pytest.raises((ValueError, RuntimeError), match=match):
            jax.jit(f)(bad)
        with pytest.raises((ValueError, RuntimeError), match=match):
            jax.jit(lambda x: pub.ph_sojourn_time(x, jsmkt.erlang(2), 2))(bad)


def test_published_gradients_survive_overflowing_exponents():
    """Regression: once d^k overflowed float64 the gradient was NaN (inf * 0) although the values were right."""
    lam = 0.6
    # sum_k lam^(2^k - 1), k = 0..1100: the derivative sum_k (2^k - 1) lam^(2^k - 2), summed where it is not 0.
    d_tails = sum((2**k - 1) * lam ** (2**k - 2) for k in range(1, 12))
    g = jax.grad(lambda x: jnp.sum(pub.exponential_tails(x, 2, K=1100)))(lam)
    assert float(g) == pytest.approx(d_tails, rel=1e-13)
    # d = 50: 1 + lam + lam^51 + ...; derivative 1 + 51 lam^50 (the rest underflows).
    g = jax.grad(lambda x: jnp.sum(pub.exponential_tails(x, 50, K=200)))(lam)
    assert float(g) == pytest.approx(1 + 51 * lam**50, rel=1e-13)
    # Erlang-2, d = 3, K = 700: central finite difference.
    f = lambda x: jnp.sum(pub.ph_fixed_point(x, jsmkt.erlang(2), 3, 700))  # noqa: E731
    h = 1e-6
    assert float(jax.grad(f)(lam)) == pytest.approx(float(f(lam + h) - f(lam - h)) / (2 * h), rel=1e-7)


@pytest.mark.parametrize(
    "make",
    [lambda s: jsmkt.coxian2(1.0, s), lambda s: jsmkt.hyperexponential2(1.0, s)],
    ids=["coxian2", "hyperexponential2"],
)
def test_published_check_a_traced_service(make):
    """Regression: a traced service that is not a PH (coxian2 with continuation probability 1/(2 scv) > 1,
    hyperexponential2 with NaN rates below scv = 1) gave numbers, or blamed the load."""
    for f in (
        lambda s: pub.ph_sojourn_time(0.5, make(s), 2),
        lambda s: pub.ph_fixed_point(0.5, make(s), 2, 5),
        lambda s: pub.ph_fixed_point_residuals(0.5, make(s), 2, 5)["published"],
    ):
        with pytest.raises((ValueError, RuntimeError), match="invalid PH service: alpha must be a probability"):
            jax.jit(f)(0.2)
    # Valid traced services still work: the balanced H2 and Marie's Coxian at scv = 2 against the eager values.
    eager = float(pub.ph_sojourn_time(0.5, make(2.0), 2))
    assert float(jax.jit(lambda s: pub.ph_sojourn_time(0.5, make(s), 2))(2.0)) == pytest.approx(eager, rel=1e-14)


def test_published_forms_depend_on_the_representation():
    """Exp(1) written with two identical phases: the exact model still gives Mitzenmacher's E[T]; the published
    closed form does not (its omega^d and theta change with the representation), and neither does the published
    ODE. hyperexponential2 switches representation at scv = 1, where the published sojourn time jumps."""
    lam = 0.6
    ET = sum(lam ** (2**i - 2) for i in range(1, 40))  # Mitzenmacher, d = 2
    split = jsmkt.hyperexponential([0.5, 0.5], [1.0, 1.0])
    exact = jsmkt.JSQdPH(lam, split, d=2)
    assert float(jsmkt.mean_sojourn_time(exact, jsmkt.solve_fixed_point(exact))) == pytest.approx(ET, rel=1e-12)
    assert float(pub.ph_sojourn_time(lam, jsmkt.exponential(1.0), 2)) == pytest.approx(ET, rel=1e-13)
    published = float(pub.ph_sojourn_time(lam, split, 2))
    assert published == pytest.approx(1.1858381222, rel=1e-9) and abs(published - ET) > 0.2
    assert float(pub.ph_sojourn_time(lam, jsmkt.hyperexponential2(1.0, 1.0), 2)) == pytest.approx(ET, rel=1e-13)
    assert float(pub.ph_sojourn_time(lam, jsmkt.hyperexponential2(1.0, 1.0 + 1e-12), 2)) == pytest.approx(
        published, rel=1e-6)

