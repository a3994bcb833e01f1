"""Contract tests, parametrised over the registry of model families (`jsmkt._spec.FAMILIES`): a family is tested
here as soon as it is registered.

- its hand-written fast paths (reduced coordinates, vector field, initial guess) equal the forms derived from its
  description, and so do the fixed points and gradients solved with either;
- its declared Jacobian structure covers the sparsity of `jax.jacfwd`, and equals the detected one;
- sensitivities (`jsmkt.sensitivity`) with respect to each of its named parameters agree with central differences;
- its simulator tables pass the engine's checks, and (slow) simulation agrees with the mean field.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import lineax as lx
import numpy as np
import pytest

import jsmkt
from jsmkt import _refined_terms
from jsmkt._models import meanfield, reduced
from jsmkt._models import structure as S
from jsmkt._models.base import AbstractDescribedModel
from jsmkt._fixed_point import linear_solver
from jsmkt._sensitivity import _value_and_grad, parameter_value, parameters_of, simplex_leaves, with_parameter
from jsmkt._spec import FAMILIES


CASES = [(fam, name) for fam in FAMILIES for name in FAMILIES[fam].examples()]
FIRST = [(fam, next(iter(FAMILIES[fam].examples()))) for fam in FAMILIES]  # one case per family: compiles the most
_EXAMPLES = {fam: FAMILIES[fam].examples() for fam in FAMILIES}


def _example(fam, name):
    return _EXAMPLES[fam][name]


def derived_only(model):
    """`model` with its fast paths replaced by the forms derived from its description (flat tails as the reduced
    state)."""
    cls = type(model)
    methods = {n: getattr(AbstractDescribedModel, n) for n in ("occupancy", "reduce", "vector_field",
                                                               "initial_state", "tails")}
    methods["initial_guess"] = lambda self: jnp.ravel(cls.initial_guess(self))
    if hasattr(cls, "phase_tails"):
        methods["phase_tails"] = lambda self, y: cls.phase_tails(self, jnp.reshape(y, (self.K, -1)))
    derived = type("Derived" + cls.__name__, (cls,), methods)
    out = object.__new__(derived)
    for f in dataclasses.fields(cls):  # the same fields, unchanged
        object.__setattr__(out, f.name, getattr(model, f.name))
    return out


@pytest.mark.parametrize("fam, name", CASES)
def test_fast_paths_equal_the_derived_forms(fam, name, getkey):
    model = _example(fam, name)
    desc = model.description()
    n = desc.cells.size
    pool = meanfield.saturated_pool(desc)
    for _ in range(2):
        x = jr.dirichlet(getkey(), jnp.ones(n))
        if pool is not None:  # a state of the saturated regime: the holding status's mass is the pool's size
            held = jnp.asarray(desc.cells.status == pool.held)
            mass = jnp.sum(jnp.where(held, x, 0.0))
            x = jnp.where(held, x * pool.capacity / mass, x * (1 - pool.capacity) / (1 - mass))
        y = model.reduce(x)
        yd = reduced.derived_reduce(desc, x)
        np.testing.assert_allclose(np.ravel(y), yd, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(model.occupancy(y), x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(reduced.derived_occupancy(desc, yd), x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.ravel(model.vector_field(0.0, y)), reduced.derived_vector_field(desc, yd),
                                   rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(model.tails(y), reduced.derived_tails(desc, yd), rtol=1e-13, atol=1e-15)
        dx = model.drift(x)
        assert abs(float(jnp.sum(dx))) < 1e-13  # mass is conserved
        for tc in model.transitions(x):
            assert np.all(np.asarray(tc.rate) >= 0), tc.name
    assert np.array_equal(np.ravel(model.initial_state()), reduced.derived_reduce(desc, jnp.eye(n)[0]))


@pytest.mark.parametrize("fam, name", FIRST)
def test_fixed_points_and_gradients_of_fast_and_derived_forms_agree(fam, name):
    model = _example(fam, name)
    fast = ("occupancy", "reduce", "vector_field", "initial_state", "tails")
    if not any(n in vars(c) for c in type(model).__mro__[:-1] if c is not AbstractDescribedModel
               and issubclass(c, AbstractDescribedModel) for n in fast):
        pytest.skip(f"{type(model).__name__} has no hand-written fast paths: its forms are the derived ones")
    derived = derived_only(model)
    fp, fpd = jsmkt.solve_fixed_point(model), jsmkt.solve_fixed_point(derived)
    np.testing.assert_allclose(np.ravel(fp.value), fpd.value, rtol=1e-12, atol=1e-15)
    # E[T] and its gradient with respect to every named parameter, in one compiled solve and adjoint per form
    # (`jsmkt.sensitivity`'s own: the model's is shared with `test_sensitivities_agree_with_central_differences`).
    params = parameters_of(model)
    base = {what: parameter_value(p, model) for what, p in params.items()}
    value, ok, g = _value_and_grad(model, params, jsmkt.mean_sojourn_time, base, {}, True)
    valued, okd, gd = _value_and_grad(derived, params, jsmkt.mean_sojourn_time, base, {}, True)
    assert bool(ok) and bool(okd)
    assert float(value) == pytest.approx(float(valued), rel=1e-12)
    for what in params:
        for a, b in zip(jax.tree_util.tree_leaves(g[what]), jax.tree_util.tree_leaves(gd[what]), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=what)


def _direction(model, what):
    """A direction for parameter `what`: along every nonzero rate (unequal weights for vectors), mass from the first
    entry of a probability vector to the second (none in a vector of one entry), +1 for a choice number."""
    p = parameters_of(model)[what]
    simplex = simplex_leaves(p, model)

    def leaf(v, s):
        v = np.asarray(v, dtype=float)
        if s:
            return np.zeros_like(v) if v.size < 2 else np.eye(v.size)[0] - np.eye(v.size)[1]
        if not v.ndim:
            return np.ones(())
        u = np.linspace(1.0, 0.5, v.size).reshape(v.shape)
        return np.where(v != 0, u, 0.0) if np.any(v != 0) else u  # rates at 0 (a BMAP's) stay: central differences

    value = parameter_value(p, model)
    if isinstance(value, tuple):
        return tuple(leaf(v, s) for v, s in zip(value, simplex, strict=True))
    return leaf(value, simplex)


def moved(model, hs, target=None):
    """`target` (default `model`) with each of `model`'s parameters `what` moved by `hs[what]` along
    `_direction`."""
    out = model if target is None else target
    for what, (p, value, direction) in _moves(model, tuple(hs)).items():
        out = with_parameter(p, out, jax.tree_util.tree_map(lambda v, u: v + hs[what] * u, value, direction))
    return out


def _moves(model, names):
    """Per parameter: the `Parameter`, its value in `model` and `_direction` (concrete: computed outside any trace
    and kept)."""
    key = (id(model), frozenset(names))
    if key not in _MOVES:
        params = parameters_of(model)
        _MOVES[key] = (model, {what: (params[what], jax.tree_util.tree_map(np.asarray, parameter_value(params[what],
                                                                                                    model)),
                                      _direction(model, what)) for what in names})
    return _MOVES[key][1]


_MOVES: dict = {}


@pytest.mark.parametrize("fam, name", FIRST + [pytest.param(*c, marks=pytest.mark.slow) for c in CASES
                                               if c not in FIRST and c[0] in ("jsq-batch", "repairable")])
def test_sensitivities_agree_with_central_differences(fam, name):
    """`jsmkt.sensitivity` with respect to every named parameter of the family (one solve and one adjoint for all),
    against differences of solves along each parameter's direction: central,
    or one-sided of second order where the derivative is (a choice number at an integer, whose randomised rule is
    piecewise linear in d)."""
    model = _example(fam, name)
    s = jsmkt.sensitivity(model, "mean_sojourn_time")
    names = list(parameters_of(model))
    assert set(s.derivatives) == set(names) and bool(s.ok)
    h = 1e-5
    side = {}
    for what in names:
        sides = {x for x in jax.tree_util.tree_leaves(s.one_sided[what]) if x}
        assert len(sides) <= 1, (what, sides)
        side[what] = 0.0 if not sides else 1.0 if sides == {"right"} else -1.0
    steps = [{n: 0.0 for n in names}]
    for what in names:  # central: -h, +h; one-sided (towards `side`): h, 2h
        hs = (-h, h) if side[what] == 0 else (side[what] * h, 2 * side[what] * h)
        steps += [{n: x if n == what else 0.0 for n in names} for x in hs]

    def ET(hs):  # concrete solves, all of one model structure (a fixed d read as the real d of its randomised rule)
        m = moved(model, hs)
        return float(jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m)))

    values = np.array([ET(st) for st in steps])
    assert float(s.value) == pytest.approx(values[0], rel=1e-12)
    for i, what in enumerate(names):
        lo, hi = values[1 + 2 * i], values[2 + 2 * i]
        fd = (hi - lo) / (2 * h) if side[what] == 0 else side[what] * (-3 * values[0] + 4 * lo - hi) / (2 * h)
        u = _direction(model, what)
        dd = sum(float(np.sum(np.asarray(g) * w)) for g, w in zip(jax.tree_util.tree_leaves(s.derivatives[what]),
                                                                   jax.tree_util.tree_leaves(u), strict=True))
        assert dd == pytest.approx(fd, rel=1e-6, abs=1e-9), what
        # the elasticity is the derivative in units of the parameter and of the metric
        for g, e, v in zip(*(jax.tree_util.tree_leaves(x) for x in (s.derivatives[what], s.elasticities[what],
                                                                  s.parameters[what])), strict=True):
            np.testing.assert_allclose(e, np.asarray(g) * np.asarray(v) / float(s.value), rtol=1e-12)


SPECS = [(fam, path) for fam in FAMILIES for path in FAMILIES[fam].specs]


@pytest.mark.parametrize("fam, path", SPECS)
def test_example_specs_build_the_family_and_name_its_keys(fam, path):
    """A family's example specs (its table's `specs`) build a model of its class, use only its table's keys, and
    its observables are the metrics the CLI shows for it."""
    import pathlib
    import tomllib

    model = jsmkt.load_spec(path)
    family = FAMILIES[fam]
    assert type(model) is family.model
    spec = tomllib.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    assert spec["model"] == fam and set(spec) - {"model", "simulation"} <= family.keys
    assert family.metric_names(model) == list(model.observables())


def test_every_example_spec_is_listed_by_its_family():
    """Every `examples/*.toml` of a jsmkt family is one of its table's `specs` (a spec of a family written outside
    jsmkt sits next to the Python file that registers it)."""
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    listed = {path for fam in FAMILIES.values() for path in fam.specs}
    for path in sorted((root / "examples").glob("*.toml")):
        if path.with_suffix(".py").exists():
            continue
        rel = path.relative_to(root).as_posix()
        assert rel in listed, (rel, tomllib.loads(path.read_text())["model"])


@pytest.mark.parametrize("fam, name", CASES)
def test_declared_structure_covers_jacfwd_and_equals_the_detected_one(fam, name):
    model = _example(fam, name)
    declared = S.check_declared(model)  # raises if some Jacobian entry lies outside
    pattern = S.sparsity(model)
    levels = np.asarray(declared.levels)
    bandwidth, border = jsmkt._linalg.classify_sparsity(pattern, levels)
    assert (bandwidth, tuple(border)) == (declared.bandwidth, declared.border)
    # The band is used: some entry outside the border sits at the declared distance.
    i, j = np.nonzero(pattern)
    inner = ~np.isin(i, declared.border) & ~np.isin(j, declared.border)
    assert np.max(np.abs(levels[i] - levels[j])[inner]) == declared.bandwidth


@pytest.mark.parametrize("fam, name", CASES)
def test_moves_stay_within_the_declared_bandwidth(fam, name):
    """A transition moves a server by at most the structure's bandwidth in levels (the band comes from the jumps)."""
    model = _example(fam, name)
    level = model.description().cells.level
    b = model.structure().bandwidth
    x = jnp.ones(level.size) / level.size
    for tc in model.transitions(x):
        assert np.all(np.abs(level[tc.target] - level[tc.source]) <= b), tc.name


@pytest.mark.parametrize("fam, name", CASES)
def test_newton_agrees_with_the_dense_oracle(fam, name):
    """Newton's system and its structured solve (`jsmkt._models.newton`) against Newton on the vector field with
    dense LU: the fixed point to 1e-12 (relative, max norm) and the gradient of E[T] with respect to every array
    leaf to 1e-9; and no registered example needs a dense LU."""
    model = _example(fam, name)
    assert not isinstance(linear_solver(model), lx.LU), model.structure().describe()
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def ET(p, lin):
        m = eqx.combine(p, static)
        fp = jsmkt.solve_fixed_point(m, linear_solver=lin)
        return jsmkt.mean_sojourn_time(m, fp), fp.value

    (e, y), g = jax.value_and_grad(ET, has_aux=True)(params, None)
    (e0, y0), g0 = jax.value_and_grad(ET, has_aux=True)(params, lx.LU())
    scale = float(jnp.max(jnp.abs(y0)))
    assert float(jnp.max(jnp.abs(y - y0))) <= 1e-12 * scale
    gl, g0l = jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g0)
    gscale = max(float(jnp.max(jnp.abs(a))) for a in g0l if jnp.size(a))
    for a, b in zip(gl, g0l, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9 * gscale)


def test_batch_initial_guess_is_the_fixed_point():
    """The forward recursion of `JSQdBatch.initial_guess` is exact for the untruncated system: at a K where the
    truncation is negligible it is the fixed point to rounding."""
    for d in (1, 2, 3):
        model = jsmkt.JSQdBatch(0.3, jnp.array([0.4, 0.3, 0.2, 0.1]), d=d)
        fp = jsmkt.solve_fixed_point(model)
        np.testing.assert_allclose(model.initial_guess(), fp.value, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("fam, name", CASES)
def test_simulation_tables_pass_the_engine_checks(fam, name):
    from jsmkt._simulate.described import model_tables
    from jsmkt._simulate.tables import check_tables

    model = _example(fam, name)
    t = check_tables(model_tables(model, 8))
    assert t.level.max() == 8 and t.empty_cell == 0
    # Every eligible cell's effect is a probability law.
    for s in range(t.eff_prob.shape[0]):
        eligible = t.key[s] != jsmkt._simulate.tables.INELIGIBLE
        np.testing.assert_allclose(t.eff_prob[s].sum(axis=1)[eligible], 1.0, rtol=1e-12)


def test_a_wrongly_declared_structure_is_refused():
    """A batch model that declares a tridiagonal Jacobian while its batches jump by up to 4 levels: Newton would
    converge slowly and `jax.grad` would be wrong (a block-tridiagonal solve of a banded Jacobian)."""

    class Tridiagonal(jsmkt.JSQdBatch):
        def declared_structure(self):
            return 1, ()

    model = Tridiagonal(0.3, jnp.full(4, 0.25), d=2, K=30)
    with pytest.raises(ValueError, match=r"declares a Jacobian of bandwidth 1 in levels.*outside"):
        jsmkt.solve_fixed_point(model)
    with pytest.raises(ValueError, match=r"outside that structure: d\(vector_field\)\[\d+\]/d\(y\)\[\d+\] is nonzero"):
        S.check_declared(model)
    # Inside jit too (the structure is static: it is checked when the solve is traced).
    with pytest.raises(ValueError, match=r"declares a Jacobian of bandwidth 1 in levels.*outside"):
        eqx.filter_jit(lambda m: jsmkt.solve_fixed_point(m, throw=False))(model)


def test_undeclared_structure_is_detected():
    class Undeclared(jsmkt.JSQdBatch):
        def declared_structure(self):
            return None

    model = Undeclared(0.3, jnp.full(3, 1 / 3), d=2, K=30)
    assert model.structure().bandwidth == 3 and model.structure().border == ()
    fp = jsmkt.solve_fixed_point(model)
    ref = jsmkt.solve_fixed_point(jsmkt.JSQdBatch(0.3, jnp.full(3, 1 / 3), d=2, K=30))
    np.testing.assert_allclose(fp.value, ref.value, rtol=1e-13, atol=1e-300)


# --- JSQdBatch ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate, sizes", [(0.6, [0.5, 0.5]), (0.3, [0.25, 0.25, 0.25, 0.25]), (0.2, [0.1, 0.0, 0.9])])
def test_batch_d1_is_the_mx_m1_queue(rate, sizes):
    """With d = 1 every server is an M^X/M/1 queue: E[N] = rho (E[X^2] + E[X]) / (2 E[X] (1 - rho)), rho = lam E[X]
    / mu (e.g. Gross & Harris, bulk-arrival queue; from the pgf P(z) = mu (1 - rho)(1 - z) / (mu (1 - z) - lam z
    (1 - X(z))))."""
    p = np.asarray(sizes)
    x = np.arange(1, p.size + 1)
    mu = 1.3
    EX, EX2 = p @ x, p @ x**2
    rho = rate * EX / mu
    EN = rho * (EX2 + EX) / (2 * EX * (1 - rho))
    model = jsmkt.JSQdBatch(rate, p, d=1, mu=mu)
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(EN, rel=1e-10)
    assert float(jsmkt.utilisation(model, fp)) == pytest.approx(rho, rel=1e-10)
    assert float(jsmkt.mean_sojourn_time(model, fp)) == pytest.approx(EN / (rate * EX), rel=1e-10)


def test_batch_of_ones_is_jsqd():
    a = jsmkt.JSQdBatch(0.9, jnp.ones(1), d=3, K=20)
    b = jsmkt.JSQd(0.9, d=3, K=20)
    np.testing.assert_allclose(jsmkt.solve_fixed_point(a).value, jsmkt.solve_fixed_point(b).value, rtol=1e-12,
                               atol=1e-300)


def test_batch_metrics_count_jobs_not_batches():
    """Throughput in jobs (batch rate times the mean batch size), P(wait) per job: the first job of a batch waits
    if its server is busy, the others always do."""
    model = jsmkt.JSQdBatch(0.6, jnp.array([0.5, 0.5]), d=2, K=40)
    fp = jsmkt.solve_fixed_point(model)
    s = np.asarray(jsmkt.tails(model, fp))
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(0.9, rel=1e-10)
    g1 = s[1] ** 2  # the chosen server is busy
    assert float(jsmkt.prob_wait(model, fp)) == pytest.approx((g1 * 1.5 + (1 - g1) * 0.5) / 1.5, rel=1e-12)
    ET, EW = float(jsmkt.mean_sojourn_time(model, fp)), float(jsmkt.mean_waiting_time(model, fp))
    assert ET == pytest.approx(float(np.sum(s[1:])) / 0.9, rel=1e-12) and ET - EW == pytest.approx(1.0, rel=1e-9)


def test_banded_solve_of_the_batch_jacobian_equals_dense():
    model = jsmkt.JSQdBatch(0.3, jnp.full(4, 0.25), d=2, K=200)
    fp = jsmkt.solve_fixed_point(model)
    op = lx.JacobianLinearOperator(lambda y, m: m.vector_field(0.0, y), fp.value, args=model)
    b = jnp.asarray(np.random.default_rng(0).normal(size=model.K))
    banded = lx.linear_solve(op, b, jsmkt._fixed_point.linear_solver(model)).value
    dense = lx.linear_solve(op, b, lx.LU()).value
    np.testing.assert_allclose(banded, dense, rtol=1e-12, atol=1e-12 * float(jnp.max(jnp.abs(dense))))


def test_batch_refined_mean_field_at_d1_matches_the_jump_covariance():
    """Refined mean field from the description: with d = 1 the servers are independent, so N Var(s_1) is the
    variance of the indicator of a busy server, rho (1 - rho)."""
    model = jsmkt.JSQdBatch(0.2, jnp.full(4, 0.25), d=1, K=80)
    rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
    rho = 0.5
    assert float(rmf.covariance[0, 0]) == pytest.approx(rho * (1 - rho), rel=1e-9)
    np.testing.assert_allclose(rmf.correction, 0.0, atol=1e-9)  # independent servers: no 1/N bias


def test_simulate_refuses_models_it_cannot_run():
    pub = jsmkt.published.JSQdPHAsPublished(0.8, jsmkt.erlang(2), d=2, K=20)
    with pytest.raises(ValueError, match="JSQdPHAsPublished"):
        jsmkt.simulate(pub, 10, 10.0, key=jr.PRNGKey(0))


# --- simulation (slow) --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("rate, sizes", [(0.6, [0.5, 0.5]), (0.3, [0.25, 0.25, 0.25, 0.25])])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_batch_mean_field_agrees_with_simulation_n1000(rate, sizes, d):
    model = jsmkt.JSQdBatch(rate, jnp.asarray(sizes), d=d)
    ET = float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model)))
    # d = 1 relaxes slowly at load 0.9 (each server an M^X/M/1 queue): a longer run and warm-up.
    t1, warmup = (20000.0, 4000.0) if d == 1 else (2000.0, 200.0)
    sim = jsmkt.simulate(model, 1000, t1, warmup=warmup, key=jr.PRNGKey(d), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)


# Simulated time per case: 1500 unless the case's simulation is slow. Retrials that re-probe move two servers per
# event, and the generic engine then runs its event loop operation by operation (about 6,000 real events/s at
# N = 1000 against 350,000 for retrials to the own server).
_SIM_T1 = {"retrial-reprobe-real-d": 120.0}


@pytest.mark.slow
@pytest.mark.parametrize("fam, name", CASES)
def test_registered_families_agree_with_simulation_n1000(fam, name):
    model = _example(fam, name)
    fp = jsmkt.solve_fixed_point(model)
    ET = float(jsmkt.mean_sojourn_time(model, fp))
    sim = jsmkt.simulate(model, 1000, _SIM_T1.get(name, 1500.0), key=jr.PRNGKey(7), n_replications=4)
    assert abs(sim.mean_sojourn_time - ET) < 0.01 * ET + sim.mean_sojourn_time_ci, (sim.mean_sojourn_time, ET)


# --- a family with a stream that starts at the servers: two servers move at once ---------------------------------


class PushJSQ(AbstractDescribedModel):
    """JSQ(d) with job pushing: besides arrivals, a server holding k >= 2 jobs pushes one waiting job at rate theta
    to the shortest of d sampled servers (ties uniform), which receives it whatever its length. Each push moves two
    servers (origin k -> k - 1, target j -> j + 1), and its stream's rate theta s_2 couples every level: the
    Jacobian gets a border column."""

    lam: jax.Array
    theta: jax.Array
    choice: jsmkt.AbstractChoice
    K: int = eqx.field(static=True)

    def __init__(self, lam, theta, d=2, K=20):
        self.lam, self.theta = jnp.asarray(lam, float), jnp.asarray(theta, float)
        self.choice, self.K = jsmkt.FixedChoice(d), K

    @property
    def arrival_rate(self):
        return self.lam

    def load(self):
        return self.lam

    def description(self):
        K = self.K
        k = np.arange(K + 1)
        zeros = np.zeros(K + 1, int)
        cells = jsmkt.make_cells(k, zeros, ("queue",))
        dep = jsmkt.LocalEvent("departure", jsmkt.Moves(k[1:], k[1:] - 1, zeros[1:], jnp.ones(K)))
        join = jsmkt.Moves(k, k + 1, zeros, jnp.ones(K + 1))
        arrival = jsmkt.Dispatch("arrival", self.choice, key=k, effect=join, rate=self.lam)
        origin = jsmkt.Moves(k[2:], k[2:] - 1, zeros[2:], jnp.broadcast_to(self.theta, (K - 1,)))
        push = jsmkt.Dispatch("push", self.choice, key=k, effect=join, origin=origin, arrivals=False)
        return jsmkt.Description(cells, (dep,), (arrival, push))


def test_two_server_moves_have_the_pair_covariance(getkey):
    """The jump second moment of a stream with an origin, accumulated from its two sides and their cross term,
    equals the sum over every (origin, target) pair of flow * l l^T with l = e_o' - e_o + e_t' - e_t."""
    model = PushJSQ(0.8, 0.5, d=2, K=8)
    x = jr.dirichlet(getkey(), jnp.ones(model.K + 1))
    classes = model.transitions(x)
    G = np.asarray(_refined_terms.jump_second_moment(classes, x))
    n = x.shape[0]
    want = np.zeros((n, n))
    e = np.eye(n)
    for tc in classes:
        a = np.asarray(tc.rate * x[tc.source])
        if tc.partner is None:
            for s, t, w in zip(tc.source, tc.target, a):
                ell = e[t] - e[s]
                want += w * np.outer(ell, ell)
            continue
        p = tc.partner
        for s, t, w in zip(tc.source, tc.target, a):
            for ps, pt, b in zip(p.source, p.target, np.asarray(p.prob)):
                ell = e[t] - e[s] + e[pt] - e[ps]
                want += w * b * np.outer(ell, ell)
    np.testing.assert_allclose(G, want, rtol=1e-12, atol=1e-15)
    assert abs(float(jnp.sum(model.drift(x)))) < 1e-14


def test_a_border_column_is_detected_and_solved():
    model = PushJSQ(0.8, 0.5, d=2, K=20)
    s = model.structure()
    assert s.bandwidth == 1 and s.border == (1,)  # s_2, the pushing servers, couples every level
    assert isinstance(jsmkt._fixed_point.linear_solver(model), jsmkt._linalg.Bordered)
    fp = jsmkt.solve_fixed_point(model)
    assert float(fp.residual) < 1e-14
    # Pushing moves jobs, it creates none: the throughput is the arrival rate and the utilisation the load.
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(0.8, rel=1e-12)
    assert float(jsmkt.utilisation(model, fp)) == pytest.approx(0.8, rel=1e-12)
    plain = jsmkt.JSQd(0.8, d=2, K=20)
    assert float(jsmkt.mean_queue_length(model, fp)) < float(jsmkt.mean_queue_length(plain, jsmkt.solve_fixed_point(plain)))
    g = jax.grad(lambda th: jsmkt.mean_queue_length(m := PushJSQ(0.8, th, K=20), jsmkt.solve_fixed_point(m)))(0.5)
    h = 1e-5
    fd = (float(jsmkt.mean_queue_length(m1 := PushJSQ(0.8, 0.5 + h, K=20), jsmkt.solve_fixed_point(m1)))
          - float(jsmkt.mean_queue_length(m2 := PushJSQ(0.8, 0.5 - h, K=20), jsmkt.solve_fixed_point(m2)))) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=1e-6)
    rmf = jsmkt.refined_mean_field(fp)
    assert np.all(np.isfinite(np.asarray(rmf.covariance)))


@pytest.mark.slow
def test_two_server_moves_agree_with_simulation_n1000():
    model = PushJSQ(0.9, 0.5, d=2, K=24)
    fp = jsmkt.solve_fixed_point(model)
    EQ = float(jsmkt.mean_queue_length(model, fp))
    sim = jsmkt.simulate(model, 1000, 2000.0, key=jr.PRNGKey(3), n_replications=4)
    assert abs(sim.mean_queue_length - EQ) < 0.01 * EQ + sim.mean_queue_length_ci, (sim.mean_queue_length, EQ)


@pytest.mark.parametrize("make, name", [
    (lambda v: jsmkt.JSQdBatch(v, [1.0]), "batch_rate"),
    (lambda v: jsmkt.JSQdBatch(0.3, [v]), "batch_sizes"),
    (lambda v: jsmkt.JSQdBatch(0.3, [1.0], mu=v), "mu"),
    (lambda v: jsmkt.JSQd(v), "lam"),
])
def test_strings_are_not_numbers(make, name):
    with pytest.raises(ValueError, match=rf"{name}=.*'0.3'.* is not a number"):
        make("0.3")
