"""The guard against the kernel's memory-map limit (`jsmkt._maps`): XLA maps every compiled kernel separately, and
past `vm.max_map_count` the next compilation crashes the process, so jsmkt makes room before compiling."""

import warnings

import pytest

import jsmkt
from jsmkt import _maps


LIMIT = 65530


@pytest.fixture
def linux():
    if _maps.map_usage() is None:
        pytest.skip("no /proc/self/maps here")


def test_map_usage_reads_this_process(linux):
    used, limit = _maps.map_usage()
    assert 0 < used < limit
    assert _maps.map_usage()[0] > 0


def test_simulate_clears_the_caches_near_the_limit(linux, getkey, monkeypatch):
    usage = iter([(LIMIT - 10, LIMIT), (5000, LIMIT)])
    monkeypatch.setattr(_maps, "map_usage", lambda: next(usage))
    model = jsmkt.JSQd(0.5, d=2)
    with pytest.warns(RuntimeWarning, match=r"jsmkt.simulate cleared .*5000 maps now.*vm.max_map_count"):
        res = jsmkt.simulate(model, 23, 20.0, key=getkey(), n_replications=2)  # a configuration not compiled before
    assert res.n_jobs > 0  # and the run went on
    monkeypatch.setattr(_maps, "map_usage", lambda: (LIMIT - 10, LIMIT))
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="even after clearing JAX's caches"):
        jsmkt.simulate(model, 29, 20.0, key=getkey(), n_replications=2)
    monkeypatch.setattr(_maps, "map_usage", lambda: (3000, LIMIT))  # plenty of room: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jsmkt.simulate(model, 31, 20.0, key=getkey(), n_replications=2)


def test_solve_fixed_point_checks_once_per_new_shape(linux, monkeypatch):
    calls = []
    monkeypatch.setattr(_maps, "make_room", lambda who: calls.append(who))
    monkeypatch.setattr(_maps, "_seen", set())
    jsmkt.solve_fixed_point(jsmkt.JSQd(0.5, d=2, K=41))
    jsmkt.solve_fixed_point(jsmkt.JSQd(0.7, d=2, K=41))  # same shapes: compiled already
    jsmkt.solve_fixed_point(jsmkt.JSQd(0.7, d=2, K=43))  # new shapes: may compile
    assert calls == ["jsmkt.solve_fixed_point"] * 2


def test_solve_fixed_point_clears_the_caches_near_the_limit(linux, monkeypatch):
    usage = iter([(LIMIT - 10, LIMIT), (5000, LIMIT)])
    monkeypatch.setattr(_maps, "map_usage", lambda: next(usage))
    monkeypatch.setattr(_maps, "_seen", set())
    with pytest.warns(RuntimeWarning, match="jsmkt.solve_fixed_point cleared"):
        model = jsmkt.JSQd(0.5, d=2, K=37)
        fp = jsmkt.solve_fixed_point(model)
    # s_k = lam^(2^k - 1) (Mitzenmacher), after recompiling
    assert [float(x) for x in jsmkt.tails(model, fp)[1:4]] == pytest.approx([0.5, 0.125, 0.5**7], rel=1e-12)


def test_other_entry_points_check_once_per_new_shape(linux, monkeypatch):
    calls = []
    monkeypatch.setattr(_maps, "make_room", lambda who: calls.append(who))
    monkeypatch.setattr(_maps, "_seen", set())
    model = jsmkt.JSQd(0.6, d=2, K=45)
    fp = jsmkt.solve_fixed_point(model)
    for _ in range(2):
        jsmkt.refined_mean_field(fp)
        jsmkt.steady_state(model)
        jsmkt.integrate(model, 1.0)
    assert calls == ["jsmkt.solve_fixed_point", "jsmkt.refined_mean_field", "jsmkt.steady_state", "jsmkt.integrate"]
