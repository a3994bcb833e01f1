"""The families' own metrics estimated by simulation (`SimulationResult.metrics`): the named observables that the
mean-field metrics evaluate, on the simulated occupancy. Checked against the same quantities computed here from the
simulation's raw cell fractions, against R.1's availability beta/(alpha + beta) (each server's working status is
a two-state chain of its own, at any N), in the CLI's table and JSON under the names `jsmkt solve` uses, and (slow)
against the mean field at N = 1000."""

import json
import pathlib

import jax.random as jr
import numpy as np
import pytest

import jsmkt
from jsmkt._spec import family_of
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
RETRIAL = dict(lam=0.6, theta=2.0, d1=2, d2=2, K=40)  # tests/test_cli.py's retrial spec (shared compilations)
REPAIRABLE = dict(lam=0.5, alpha=0.2, beta=0.5, arrival="A2", repair="R1", K=40)  # and its repairable one


def solve_names(model) -> set[str]:
    """The family metrics `jsmkt solve` prints for `model` (its family's `metrics`)."""
    return set(family_of(model).metrics(model, model.initial_guess()))


def test_retrial_metrics_are_those_of_the_simulated_occupancy():
    """One replication: each metric is the function of the whole run's time-averaged occupancy, computed here
    from the raw cell fractions for d1 = d2 = 2 (blocked: both samples busy, rho^2), near the mean field at
    N = 50; the metric functions take the simulated occupancy (or the result) and give the same numbers."""
    model = jsmkt.RetrialJSQ(**RETRIAL)
    sim = jsmkt.simulate(model, 50, 200.0, key=jr.PRNGKey(7))
    assert set(sim.metrics) == set(sim.metrics_ci) == solve_names(model) == {
        "mean_orbit_size", "prob_blocked", "prob_retrial_success", "mean_sojourn_time_tagged"}
    x = sim.cell_fractions
    rho = x[sim.cell_status == sim.status_names.index("busy")].sum()
    raw = {"mean_orbit_size": x @ sim.cell_level, "prob_blocked": rho**2, "prob_retrial_success": 1 - rho**2,
           "mean_sojourn_time_tagged": 1.0 + rho**2 / (2.0 * (1 - rho**2))}
    fp = jsmkt.solve_fixed_point(model)
    for name, f in (("mean_orbit_size", jsmkt.mean_orbit_size), ("prob_blocked", jsmkt.prob_blocked),
                    ("prob_retrial_success", jsmkt.prob_retrial_success),
                    ("mean_sojourn_time_tagged", jsmkt.mean_sojourn_time_tagged)):
        value, ci = sim.metrics[name], sim.metrics_ci[name]
        assert value == pytest.approx(raw[name], rel=1e-12), name
        assert float(f(model, sim.occupancy)) == pytest.approx(value, rel=1e-12), name
        assert float(f(model, sim)) == pytest.approx(value, rel=1e-12), name
        assert getattr(sim, name) == value and getattr(sim, f"{name}_ci") == ci
        assert sim.to_dict()[name] == value and sim.to_dict()[f"{name}_ci"] == ci
        assert 0 < ci < 0.2 * abs(value), (name, ci)
        mean_field = float(f(model, fp))
        assert abs(value - mean_field) < 3 * ci + 0.05 * abs(mean_field), (name, value, mean_field, ci)
    with pytest.raises(ValueError, match=r"for a simulation, pass its occupancy \(res.occupancy, or res itself\)"):
        jsmkt.mean_orbit_size(model, sim.tails)
    with pytest.raises(ValueError, match=r"level \d+ > K=2: evaluate it with model.with_K\(\d+\)"):
        jsmkt.mean_orbit_size(model.with_K(2), sim.occupancy)
    with pytest.raises(ValueError, match=r"statuses \['busy', 'idle'\] that a RepairableJSQ's cells do not have"):
        jsmkt.availability(jsmkt.RepairableJSQ(**REPAIRABLE), sim.occupancy)


def test_repairable_availability_under_r1_is_the_closed_form():
    """Under R.1 a server's working status is a two-state chain (fail at alpha, repaired at beta) whatever the
    queues, so the simulated availability lies within its interval of beta/(alpha + beta) at N = 50; the other
    metrics are the replications' ratios of the raw cell fractions."""
    model = jsmkt.RepairableJSQ(**REPAIRABLE)
    sim = jsmkt.simulate(model, 50, 300.0, key=jr.PRNGKey(3), n_replications=4)
    assert set(sim.metrics) == solve_names(model) == {"availability", "customers_at_failed_servers",
                                                     "repairmen_utilisation"}
    a, beta, alpha = sim.availability, REPAIRABLE["beta"], REPAIRABLE["alpha"]
    assert abs(a - beta / (alpha + beta)) < 2 * sim.availability_ci, (a, sim.availability_ci)
    assert 0 < sim.availability_ci < 0.05
    x, level = sim.cell_fractions, sim.cell_level
    working = sim.cell_status == sim.status_names.index("working")
    assert a == pytest.approx(x[working].sum(), rel=1e-12)  # linear: the mean of the replications' is the mean's
    assert sim.repairmen_utilisation == pytest.approx(1 - a, rel=1e-12)  # R.1: the failed fraction
    assert float(jsmkt.availability(model, sim.occupancy)) == pytest.approx(a, rel=1e-12)
    at_failed = (level * x)[~working].sum() / (level * x).sum()  # the ratio of the replications' means
    assert float(jsmkt.customers_at_failed_servers(model, sim.occupancy)) == pytest.approx(at_failed, rel=1e-12)
    assert abs(sim.customers_at_failed_servers - at_failed) < sim.customers_at_failed_servers_ci


def test_classes_wait_as_often_as_the_servers_are_busy_with_one_choice():
    """Two classes that each sample one server (d = 1): by PASTA a job of either class waits with the probability
    that a server is busy, rho = 0.5 here, at any N; the simulated per-class P(wait) lie within their intervals
    of it."""
    model = jsmkt.JSQdClasses([0.6, 0.4], d=[1, 1], mu=2.0, K=40)
    sim = jsmkt.simulate(model, 50, 400.0, key=jr.PRNGKey(5), n_replications=4)
    assert set(sim.metrics) == solve_names(model) == {"prob_wait_class_1", "prob_wait_class_2"}
    for name in ("prob_wait_class_1", "prob_wait_class_2"):
        assert abs(sim.metrics[name] - 0.5) < 2 * sim.metrics_ci[name] < 0.1, (name, sim.metrics[name])


def test_every_family_names_the_metrics_solve_prints():
    """The named observables, which `simulate` estimates, are the family metrics `jsmkt solve` prints, in every
    registered family's examples."""
    from jsmkt._spec import FAMILIES

    for fam in FAMILIES.values():
        for label, model in fam.examples().items():
            assert set(model.observables()) == (solve_names(model) if fam.metrics else set()), label


@pytest.mark.parametrize("spec", ["retrial_reprobe.toml", "repairable_model_I.toml"])
def test_cli_simulate_prints_the_family_metrics(spec, capsys):
    """`jsmkt simulate` of an example: every family metric `jsmkt solve` prints, with its half-width, in the JSON
    (as `name` and `name_ci`) and in the table (`value ± half-width` on the row `solve` prints)."""
    args = ["simulate", str(EXAMPLES / spec), "--servers", "20", "--time", "60", "--replications", "2"]
    assert main([*args, "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert main(["solve", str(EXAMPLES / spec), "--format", "json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    labels = {"mean_orbit_size": "mean orbit size", "prob_blocked": "P(primary blocked)",
              "prob_retrial_success": "P(retrial succeeds)", "mean_sojourn_time_tagged": "E[T], tagged customer",
              "availability": "availability", "customers_at_failed_servers": "jobs at failed servers",
              "repairmen_utilisation": "repairmen utilisation"}  # the table's rows of the families' metrics
    names = {name for name in labels if name in solved}
    assert len(names) == 3 + spec.startswith("retrial")
    for name in names:
        assert res[f"{name}_ci"] > 0 and res[name] > 0, (name, res)
    assert main(args) == 0
    out = capsys.readouterr().out
    for name in names:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(labels[name]))
        value, ci = line[len(labels[name]) + 2:].split("±")
        value, ci = value.strip(), ci.split()[0]
        digits = len(value.partition(".")[2])  # the estimate is printed to the decimal place of its half-width
        assert abs(float(value) - res[name]) <= 0.5 * 10.0**-digits * (1 + 1e-9), (name, value, res[name])
        assert len(ci.partition(".")[2]) == digits and float(ci) == pytest.approx(res[f"{name}_ci"], rel=0.05)


# --- the mean field at N = 1000 (slow) -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    pytest.param(lambda: jsmkt.RetrialJSQ(0.8, 0.5, d1=2, d2=2), id="retrial-reprobe-example"),
    pytest.param(lambda: jsmkt.RepairableJSQ(0.5, 0.2, 0.5, repair="R2"), id="repairable-model-II"),
    pytest.param(lambda: jsmkt.RepairableJSQ(0.7, 0.1, 1.0, repair="R3", j=0.05), id="repairable-R3-example"),
])
def test_simulated_metrics_agree_with_the_mean_field_n1000(model):
    """Every family metric of the N = 1000 simulation within its 95 % interval plus 1 % of the mean field's."""
    model = model()
    fp = jsmkt.solve_fixed_point(model)
    sim = jsmkt.simulate(model, 1000, 500.0, warmup=50.0, key=jr.PRNGKey(11), n_replications=4)
    assert set(sim.metrics) == solve_names(model)
    for name, value in sim.metrics.items():
        mean_field = float(getattr(jsmkt, name)(model, fp))
        assert abs(value - mean_field) < sim.metrics_ci[name] + 0.01 * abs(mean_field), (name, value, mean_field)
