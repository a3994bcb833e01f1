"""The `jsmkt` console script."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("spec", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_every_example_solves(spec, capsys):
    code, out, err = run(["solve", str(EXAMPLES / spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    for key in ("mean_queue_length", "mean_sojourn_time", "tail", "tail_mass_at_K"):
        assert key in res
    assert res["tail"][0] == 1.0
    assert abs(res["utilisation"] - res["load"]) < 1e-9
    assert abs(res["mean_queue_length"] - sum(res["tail"][1:])) < 1e-9
    assert res["tail_mass_at_K"] < 1e-10


def test_jsq_json_matches_closed_form(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.8\nd = 3\nK = 20\n')
    code, out, _ = run(["solve", str(spec), "--format", "json"], capsys)
    res = json.loads(out)
    expected = [0.8 ** ((3**k - 1) / 2) for k in range(len(res["tail"]))]
    np.testing.assert_allclose(res["tail"], expected, rtol=1e-12)
    ET = sum(0.8 ** ((3**i - 3) / 2) for i in range(1, 30))
    assert abs(res["mean_sojourn_time"] - ET) < 1e-12


def test_solve_servers_adds_the_refined_mean_field(tmp_path, capsys):
    """`--servers N`: refined values = mean field + correction / N; d = 1 servers are independent M/M/1 queues, so
    there the correction is zero and sd(s_k) = sqrt(s_k (1 - s_k) / N)."""
    spec = str(EXAMPLES / "jsq3_exponential.toml")
    code, out, err = run(["solve", spec, "--format", "json", "--servers", "200"], capsys)
    assert code == 0, err
    res = json.loads(out)
    r = res["refined"]
    assert r["n_servers"] == 200
    np.testing.assert_allclose(r["tail"][1:], np.array(res["tail"][1:]) + np.array(r["tail_correction"]) / 200,
                               rtol=1e-12, atol=1e-300)
    assert abs(r["utilisation"] - res["utilisation"]) < 1e-12  # work conservation: no 1/N term in s_1
    assert r["mean_queue_length"] > res["mean_queue_length"]  # a finite system is slower
    d1 = tmp_path / "d1.toml"
    d1.write_text('model = "jsq"\nlam = 0.6\nd = 1\n')
    _, out, _ = run(["solve", str(d1), "--format", "json", "--servers", "50"], capsys)
    res = json.loads(out)
    s = np.array(res["tail"][1:6])
    np.testing.assert_allclose(res["refined"]["tail"][1:6], s, rtol=1e-10)
    np.testing.assert_allclose(res["refined"]["tail_std"][:5], np.sqrt(s * (1 - s) / 50), rtol=1e-8)
    code, out, _ = run(["solve", spec, "--servers", "100"], capsys)
    assert code == 0 and "refined mean field, N = 100 servers" in out
    code, _, err = run(["solve", spec, "--servers", "100", "--as-published"], capsys)
    assert code == 2 and "--servers" in err
    code, _, err = run(["solve", spec, "--servers", "0"], capsys)
    assert code == 2 and "--servers=0 must be >= 1" in err


def test_as_published_switches_equations(capsys):
    spec = str(EXAMPLES / "jsq2_erlang2.toml")
    _, out_exact, _ = run(["solve", spec, "--format", "json"], capsys)
    _, out_pub, _ = run(["solve", spec, "--format", "json", "--as-published"], capsys)
    exact, pub = json.loads(out_exact), json.loads(out_pub)
    assert pub["variant"] == "as-published" and exact["variant"] == "exact"
    assert abs(pub["tail"][2] - 0.3645) < 1e-12  # rho^(d+1) * theta, theta = 1/2
    assert abs(exact["tail"][2] - 0.668646) < 1e-6
    assert pub["residual_in_exact_equations"] > 0.1


def test_table_and_plot(tmp_path, capsys):
    png = tmp_path / "tails.png"
    code, out, _ = run(["solve", str(EXAMPLES / "jsq2_h2.toml"), "--plot", str(png)], capsys)
    assert code == 0
    assert "mean sojourn time E[T]" in out and "s_k = P(Q >= k)" in out
    assert png.stat().st_size > 5000


@pytest.mark.parametrize("text, needle", [
    ('model = "jsq"\nlam = 1.2\n', "unstable: lam=1.2"),
    ('model = "jsq"\nlam = 0.5\nd = 0\n', "d=0 must be >= 1"),
    ('model = "mm1"\nlam = 0.5\n', "model='mm1' is not one of"),
    ('model = "jsq-ph"\nlam = 0.5\n', "missing key 'service'"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "ph"\nalpha = [0.5, 0.6]\nT = [[-1.0, 0.0], [0.0, -1.0]]\n',
     "alpha sums to"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "weibull"\n', "kind='weibull' is not one of"),
    ('model = "jsq"\nlam = 0.9\nK = 3\n', "K=3 is too small"),
    ('model = "jsq"\nlam = "fast"\n', "lam="),
    ('model = "jsq"\nlam = 0.5\nspeed = 2\n', "unknown key(s) 'speed'"),
    ("model = jsq", "not valid TOML"),
])
def test_bad_specs_give_one_line_and_exit_2(tmp_path, capsys, text, needle):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("jsmkt: error:")
    assert needle in err, err


def test_console_script_entry_point(tmp_path):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 2\n')
    proc = subprocess.run([sys.executable, "-m", "jsmkt.cli", "solve", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert abs(json.loads(proc.stdout)["tail"][1] - 0.5) < 1e-12
    proc = subprocess.run([sys.executable, "-m", "jsmkt.cli", "solve", str(tmp_path / "missing.toml")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_simulate_json_keys_and_agreement(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 1\n')  # M/M/1: E[T] = 2, s_k = 0.5^k
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "4",
                          "--seed", "3", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    for key in ("mean_queue_length", "mean_sojourn_time", "mean_sojourn_time_ci", "tail", "events",
                "sojourn_time_percentiles"):
        assert key in res
    assert res["events"] > 10_000
    assert abs(res["mean_sojourn_time"] - 2.0) < 5 * res["mean_sojourn_time_ci"] + 0.02
    assert abs(res["tail"][1] - 0.5) < 0.03


@pytest.mark.parametrize("args, needle", [
    (["--servers", "0", "--time", "10"], "--servers=0 must be >= 1"),
    (["--servers", "10", "--time", "-1"], "--time=-1.0 must be a positive"),
    (["--servers", "10", "--time", "10", "--cpu-devices", "0"], "--cpu-devices=0 must be >= 1"),
])
def test_simulate_bad_arguments(tmp_path, capsys, args, needle):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\n')
    code, _, err = run(["simulate", str(spec), *args], capsys)
    assert code == 2 and needle in err
