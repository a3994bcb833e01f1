"""Existence, uniqueness, stability and convergence of fixed points (`jsmkt.stability`, `jsmkt.find_fixed_points`,
`jsmkt.convergence`, `jsmkt stability`), against references written here: the JSQ(d) tail ODE's Jacobian by hand,
and a bistable model whose fixed points and their derivatives are known in closed form."""

import json
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
LAM, D, K = 0.9, 2, 20  # JSQ(2) at load 0.9, truncated as other tests truncate it (one compilation shared)


def jsqd_tail_jacobian(lam: float, d: int, mu: float, K: int) -> tuple[np.ndarray, np.ndarray]:
    """`(s, J)`: the fixed point s_1..s_K = rho^((d^k - 1)/(d - 1)) and the Jacobian of the tail ODE
    ds_k/dt = lam (s_{k-1}^d - s_k^d) - mu (s_k - s_{k+1}), s_0 = 1, s_{K+1} = 0, written out by hand:
    dF_k/ds_{k-1} = lam d s_{k-1}^(d-1), dF_k/ds_k = -lam d s_k^(d-1) - mu, dF_k/ds_{k+1} = mu."""
    rho = lam / mu
    s = np.array([rho ** ((d**k - 1) / (d - 1)) for k in range(K + 1)])  # s_0 .. s_K
    J = np.zeros((K, K))
    for k in range(1, K + 1):
        J[k - 1, k - 1] = -lam * d * s[k] ** (d - 1) - mu
        if k > 1:
            J[k - 1, k - 2] = lam * d * s[k - 1] ** (d - 1)
        if k < K:
            J[k - 1, k] = mu
    return s[1:], J


class Bistable(jsmkt.AbstractSupermarketModel):
    r"""A two-state population (a server is `healthy` or `infected`), the fraction infected following
    $\dot x = x\,(b\,x(1 - x) - a)$: for $b > 4a$ three fixed points, $0$ (stable, slope $-a$) and the roots
    $x_\pm = (1 \pm \sqrt{1 - 4a/b})/2$ of $b\,x(1 - x) = a$, with slopes $b\,x_\pm(1 - 2x_\pm)$: $x_-$ unstable,
    $x_+$ stable. Written against `AbstractSupermarketModel`'s contract: the reduced state is $(x,)$, level 1 the
    infected servers; nobody is at level 2 (= K)."""

    a: jax.Array
    b: jax.Array
    K: int = eqx.field(static=True, default=2)

    def __init__(self, a, b):
        self.a, self.b = jnp.asarray(a, dtype=float), jnp.asarray(b, dtype=float)

    def state_space(self):
        return [(0, 0), (1, 0)]

    def transitions(self, x):
        raise NotImplementedError("stated as an ODE")

    def occupancy(self, y):
        return jnp.concatenate([1.0 - y, y])

    def reduce(self, x):
        return x[1:]

    def vector_field(self, t, y, args=None):
        return y * (self.b * y * (1.0 - y) - self.a)

    def initial_state(self):
        return jnp.zeros(1)

    @property
    def arrival_rate(self):
        return self.b

    def load(self):
        return jnp.asarray(0.5)

    def rate_scale(self):
        return self.b

    def tails(self, y):
        return jnp.concatenate([jnp.ones(1), y, jnp.zeros(1)])


def test_jsqd_spectral_abscissa_is_that_of_the_hand_written_tail_jacobian():
    model = jsmkt.JSQd(LAM, d=D, K=K)
    st = jsmkt.stability(model)
    s, J = jsqd_tail_jacobian(LAM, D, 1.0, K)
    np.testing.assert_allclose(np.asarray(st.fixed_point), s, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(st.jacobian, J, rtol=1e-12, atol=1e-14)
    want = np.linalg.eigvals(J)
    assert st.spectral_abscissa == pytest.approx(float(np.max(want.real)), abs=1e-8)
    np.testing.assert_allclose(np.sort(st.eigenvalues.real), np.sort(want.real), atol=1e-6)
    assert st.verdict == "stable" and st.margin > 1
    assert st.relaxation_time == pytest.approx(-1.0 / st.spectral_abscissa, rel=1e-15)
    assert st.tolerance < 1e-9  # the rule's tolerance: far below |abscissa| = 0.075


def test_jsqd_convergence_rate_and_monotone_bound():
    """From empty servers the distance to the fixed point falls at the rate -abscissa (within 5 %), and every tail
    stays below its fixed-point value (JSQ(d)'s drift is cooperative: its Jacobian's off-diagonal entries are >= 0)."""
    model = jsmkt.JSQd(LAM, d=D, K=K)
    c = jsmkt.convergence(model, 200.0)
    _, J = jsqd_tail_jacobian(LAM, D, 1.0, K)
    abscissa = float(np.max(np.linalg.eigvals(J).real))
    assert c.fitted_rate == pytest.approx(-abscissa, rel=0.05)
    assert c.spectral_abscissa == pytest.approx(abscissa, abs=1e-8)
    assert c.fit_window[1] > c.fit_window[0]
    assert c.bound_held and c.tails_bound_held and c.bound_excess <= c.bound_tol
    assert c.distance[0] == pytest.approx(LAM, rel=1e-12)  # s_1: 0 -> rho
    assert c.distance[-1] < 1e-6


def test_jsqd_search_finds_one_fixed_point_from_100_starts():
    model = jsmkt.JSQd(LAM, d=D, K=K)
    found = jsmkt.find_fixed_points(model, 100, key=jax.random.key(0))
    assert found.n_starts == 102 and found.n_fixed_points == 1
    (p,) = found.fixed_points
    s, _ = jsqd_tail_jacobian(LAM, D, 1.0, K)
    np.testing.assert_allclose(np.asarray(p.value), s, rtol=1e-10, atol=1e-300)
    assert p.stability.verdict == "stable" and p.by_ode >= 100  # every integrated start reaches it
    assert p.hits + found.n_failed + sum(q.hits for q in found.outside) == 2 * found.n_starts


def test_bistable_model_search_finds_all_three_fixed_points_and_labels_them():
    a, b = 1.0, 5.0
    model = Bistable(a, b)
    found = jsmkt.find_fixed_points(model, 50, key=jax.random.key(1))
    root = np.sqrt(1.0 - 4.0 * a / b)
    want = [0.0, (1.0 - root) / 2.0, (1.0 + root) / 2.0]
    assert found.n_fixed_points == 3 and not found.outside
    got = [float(p.value[0]) for p in found.fixed_points]
    np.testing.assert_allclose(got, want, atol=1e-12)
    slopes = [-a] + [b * x * (1.0 - 2.0 * x) for x in want[1:]]  # f'(x) at each root
    assert [p.stability.verdict for p in found.fixed_points] == ["stable", "unstable", "stable"]
    np.testing.assert_allclose([p.stability.spectral_abscissa for p in found.fixed_points], slopes, rtol=1e-12)
    assert found.fixed_points[1].by_newton >= 1  # the unstable one: found by Newton from the raw starts
    assert found.fixed_points[1].stability.relaxation_time == np.inf


def test_verdict_is_inconclusive_at_a_zero_eigenvalue():
    """At the saddle-node b = 4a the two roots merge at x = 1/2, where f'(x) = 0: neither verdict is warranted. Off
    it, the rule decides by the sign once |f'| exceeds the tolerance, which holds the drift's residual there."""
    st = jsmkt.stability(Bistable(1.0, 4.0), jnp.array([0.5]))
    assert st.spectral_abscissa == 0.0 and st.verdict == "inconclusive" and st.margin == 0.0
    assert 0 < st.tolerance < 1e-13
    x = 0.5 + 1e-3  # no fixed point: the drift there, 2.004e-6, enters the tolerance; the slope -4.012e-3 exceeds it
    st = jsmkt.stability(Bistable(1.0, 4.0), jnp.array([x]))
    assert st.residual == pytest.approx(abs(x * (4 * x * (1 - x) - 1)), rel=1e-9) and st.tolerance >= st.residual
    assert st.spectral_abscissa == pytest.approx(4 * x * (1 - x) - 1 + 4 * x * (1 - 2 * x), rel=1e-9)
    assert st.verdict == "stable"


def test_stability_refuses_failed_and_misshapen_fixed_points():
    model = jsmkt.JSQd(LAM, d=D, K=K)
    with pytest.raises(ValueError, match=r"fixed_point has shape \(5,\)"):
        jsmkt.stability(model, jnp.zeros(5))
    with pytest.raises(ValueError, match=r"non-finite"):
        jsmkt.stability(model, jnp.full(K, jnp.nan))
    with pytest.raises(ValueError, match=r"n_starts=-1 must be an integer >= 0"):
        jsmkt.find_fixed_points(model, -1, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"key=3 must be a JAX random key"):
        jsmkt.find_fixed_points(model, 4, key=3)
    with pytest.raises(ValueError, match=r"has no published ODE in jsmkt"):
        jsmkt.published.published_equations(next(iter(jsmkt.RetrialJSQ.examples().values())))


def test_spectral_abscissa_sweep_metric_and_its_derivative():
    """The sweep metric equals `jsmkt.stability`'s abscissa, and its derivative (the simple eigenvalue's, through
    the callback's custom JVP) matches central differences of it."""
    ds = jsmkt.sweep({"model": "jsq", "lam": LAM, "d": D, "K": K}, {"lam": [0.5, LAM]}, metrics=["spectral_abscissa"],
                     grad=["lam"], progress=False)
    for i, lam in enumerate([0.5, LAM]):
        alpha = lambda x: jsmkt.stability(jsmkt.JSQd(x, d=D, K=K)).spectral_abscissa  # noqa: E731
        assert float(ds["spectral_abscissa"].values[i]) == pytest.approx(alpha(lam), abs=1e-12)
        h = 1e-5
        fd = (alpha(lam + h) - alpha(lam - h)) / (2 * h)
        assert float(ds["spectral_abscissa_grad"].values[i, 0]) == pytest.approx(fd, rel=1e-6)


def test_cli_stability_text_and_json(tmp_path, capsys):
    spec = tmp_path / "jsq.toml"
    spec.write_text(f'model = "jsq"\nlam = {LAM}\nd = {D}\nK = {K}\n')
    want = jsmkt.stability(jsmkt.JSQd(LAM, d=D, K=K))
    assert main(["stability", str(spec), "--starts", "4", "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert f"spectral abscissa  {want.spectral_abscissa:.10g}" in text
    assert "verdict            stable" in text and "fixed points found: 1 from 6 starts" in text
    assert main(["stability", str(spec), "--starts", "4", "--format", "json", "--no-cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spectral_abscissa"] == pytest.approx(want.spectral_abscissa, abs=1e-12)
    assert out["relaxation_time"] == pytest.approx(want.relaxation_time, rel=1e-12)
    assert out["verdict"] == "stable" and out["n_fixed_points"] == 1
    (p,) = out["fixed_points"]
    assert p["verdict"] == "stable" and p["spectral_abscissa"] == pytest.approx(want.spectral_abscissa, abs=1e-10)
    assert p["tail"][1] == pytest.approx(LAM, rel=1e-12)


@pytest.mark.parametrize("spec, argv, message", [
    (None, ["--starts", "-1"], "--starts=-1 must be >= 0"),
    ("retrial_reprobe.toml", ["--as-published"], "model = 'retrial' has no published form in jsmkt"),
    (None, ["--set", "lam=1.5"], "unstable"),
])
def test_cli_stability_errors_are_one_line(tmp_path, capsys, spec, argv, message):
    if spec is None:
        spec = tmp_path / "jsq.toml"
        spec.write_text(f'model = "jsq"\nlam = {LAM}\nd = {D}\n')
    else:
        spec = EXAMPLES / spec
    assert main(["stability", str(spec), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


@pytest.mark.slow
def test_convergence_experiment_quick(tmp_path):
    """`experiments/convergence/compute.py --quick` and `plot.py --quick`: JSQ(2) unique and stable with the fitted
    rate within 1 % of -abscissa and the bound held; every case has one fixed point inside the state space."""
    import importlib.util
    import sys

    folder = EXAMPLES.parent / "experiments" / "convergence"
    sys.path.insert(0, str(folder.parent))
    modules = {}
    for name in ("compute", "plot"):
        spec = importlib.util.spec_from_file_location(f"convergence_{name}", folder / f"{name}.py")
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    assert modules["compute"].main(["--quick", "--out", str(tmp_path)]) == 0
    assert modules["plot"].main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "convergence.json").read_text())["rows"]
    assert {(r["family"], r["variant"]) for r in rows} >= {("jsq", "exact"), ("jsq-ph", "published")}
    for r in rows:
        assert r["n_fixed_points"] == 1 and r["verdict"] == "stable", r
        assert abs(r["rate_ratio"] - 1.0) < 0.01, r
    assert all(r["bound_held"] for r in rows if r["family"] == "jsq")
    for name in ("spectra", "distance", "rates"):
        assert (tmp_path / f"{name}.png").is_file()
