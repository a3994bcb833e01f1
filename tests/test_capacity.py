"""Capacity planning (`jsmkt.max_load`, `jsmkt.min_choice`, `jsmkt capacity`) against closed forms: the M/M/1
sojourn time (JSQ(d) with d = 1) is exponential with rate mu - lam, so E[T] = 1/(mu - lam) and its p99 is
ln(100)/(mu - lam); JSQ(d) with exponential service has s_k = lam^((d^k - 1)/(d - 1)) and E[T] = sum_k s_k / lam
(Mitzenmacher), whose roots are found here by Brent's method."""

import json
import math

import numpy as np
import pytest
from scipy import optimize

import jsmkt
from jsmkt.cli import main


def _mean_sojourn(lam: float, d: int) -> float:
    """E[T] of JSQ(d) with exponential service of rate 1 (Mitzenmacher's closed form)."""
    if d == 1:
        return 1.0 / (1.0 - lam)
    k = np.arange(1, 80, dtype=float)
    return float(np.sum(lam ** ((d ** np.minimum(k, 60) - 1.0) / (d - 1.0)))) / lam


def _spec(tmp_path, lam: float, d: int) -> str:
    path = tmp_path / f"jsq{d}.toml"
    path.write_text(f'model = "jsq"\nlam = {lam}\nd = {d}\nmu = 1.0\n')
    return str(path)


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_max_load_of_mm1_meets_the_p99_and_mean_closed_forms_near_saturation(tmp_path, capsys):
    """d = 1: p99 <= 20 gives lam = 1 - ln(100)/20 (the p99 binds: E[T] = 1/(1 - lam) is below 100 there); the
    mean alone binds at lam = 0.99, where K must be in the thousands."""
    spec = _spec(tmp_path, 0.8, 1)
    code, out, err = _run(["capacity", spec, "--bound", "p99=20", "--bound", "mean_sojourn_time=100", "--format",
                           "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    lam = 1.0 - math.log(100.0) / 20.0
    assert abs(res["lam"] - lam) < 1e-6 and res["binding"] == "p99"
    assert [r["lam"] for r in res["results"]] == [res["lam"]] and res["results"][0]["binding"] == "p99"
    assert res["metrics"]["mean_sojourn_time"] == pytest.approx(1.0 / (1.0 - lam), rel=1e-6)
    assert res["metrics"]["p99"] == pytest.approx(20.0, rel=1e-6)
    with pytest.raises(ValueError, match=r"p99 <= 0\.5 is not met even at zero load"):
        jsmkt.max_load(spec, {"p99": 0.5, "mean_sojourn_time": 100.0})

    cap = jsmkt.max_load(spec, {"mean_sojourn_time": 100.0})
    assert (cap.over, cap.binding, cap.limit) == ("lam", "mean_sojourn_time", 1.0)
    assert abs(cap.value - 0.99) < 1e-6 and cap.K >= 1000


def test_max_load_of_jsq_d_meets_the_closed_forms_and_names_the_binding_bound(tmp_path, capsys):
    """d = 2, 3 over a --grid, E[T] <= 3 and P(wait) = lam^d <= 0.9: the largest lam is the smaller root of the
    closed forms, E[T]'s for d = 2 (0.930 < 0.949), P(wait)'s for d = 3 (0.966 < 0.972)."""
    spec = _spec(tmp_path, 0.5, 2)
    code, out, err = _run(["capacity", spec, "--bound", "mean_sojourn_time=3", "--bound", "prob_wait=0.9", "--grid",
                           "d=2,3", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert "lam" not in res and [r["d"] for r in res["results"]] == [2, 3]
    for r, binding in zip(res["results"], ["mean_sojourn_time", "prob_wait"], strict=True):
        roots = {"mean_sojourn_time": optimize.brentq(lambda lam: _mean_sojourn(lam, r["d"]) - 3.0, 0.01, 0.999999,
                                                      xtol=1e-14),
                 "prob_wait": 0.9 ** (1.0 / r["d"])}
        assert abs(r["lam"] - roots[binding]) < 1e-6 and roots[binding] < min(roots.values()) + 1e-12, (r, roots)
        assert r["binding"] == binding
    # A probability bounded by 1 holds at every load: the answer is the stability limit.
    cap = jsmkt.max_load(jsmkt.load_spec(spec), {"prob_wait": 1.0})
    assert (cap.value, cap.binding, cap.limit) == (1.0, "stability", 1.0)


def test_min_choice_is_the_smallest_d_under_the_closed_form(tmp_path, capsys):
    """At lam = 0.95, E[T] = 20 (d = 1), 3.50 (d = 2), 2.51 (d = 3): E[T] <= 3 needs d = 3, and d = 2 binds. At
    lam = 0.99 no d of 1, 2, 3 meets it (E[T] = 3.5 at d = 3): on a grid, that point is a row without an answer."""
    ET = {d: _mean_sojourn(0.95, d) for d in (1, 2, 3)}
    assert ET[3] < 3.0 < ET[2] and _mean_sojourn(0.99, 3) > 3.0
    spec = _spec(tmp_path, 0.95, 1)
    code, out, err = _run(["capacity", spec, "--over", "d", "--candidates", "1,2,3", "--bound",
                           "mean_sojourn_time=3", "--grid", "lam=0.95,0.99", "--format", "json"], capsys)
    assert code == 0, err
    first, second = json.loads(out)["results"]
    assert (first["lam"], first["d"], first["binding"]) == (0.95, 3, "mean_sojourn_time")
    assert first["metrics"]["mean_sojourn_time"] == pytest.approx(ET[3], rel=1e-9)
    assert (second["lam"], second["d"], second["binding"]) == (0.99, None, None)
    assert second["error"].startswith("no d among 1, 2, 3 meets mean_sojourn_time <= 3")
    assert err.startswith("jsmkt: note: 1 of 2 points have no answer") and err.count("\n") == 1
    with pytest.raises(ValueError, match=r"no d among 1, 2, 3 meets mean_sojourn_time <= 2\.5"):
        jsmkt.min_choice(spec, {"mean_sojourn_time": 2.5}, candidates=[3, 1, 2])


def test_capacity_errors_are_one_line(tmp_path, capsys):
    spec = _spec(tmp_path, 1.2, 2)
    code, out, err = _run(["capacity", spec, "--bound", "p99=20", "--bound", "sojourn_time=3"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "bound 'sojourn_time' is not a metric" in err and "mean_sojourn_time" in err and "waiting_p99" in err
    code, out, err = _run(["capacity", spec, "--over", "d", "--bound", "p99=20"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "unstable" in err
