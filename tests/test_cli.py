"""The `jsmkt` console script."""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jsmkt
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
# The example specs of jsmkt's families: a spec beside a Python file of its name names a family that file registers
# (`--family`), tested in test_custom_family.py.
SPECS = sorted(p for p in EXAMPLES.glob("*.toml") if not p.with_suffix(".py").exists())


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("spec", [p.name for p in SPECS])
def test_every_example_solves(spec, capsys):
    code, out, err = run(["solve", str(EXAMPLES / spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    for key in ("mean_queue_length", "mean_sojourn_time", "tail", "tail_mass_at_K"):
        assert key in res
    assert res["tail"][0] == 1.0
    # The load is against the capacity of the servers that work (repairable servers: a fraction `availability`).
    # Helpers add capacity that is not a server's own, so there the busy fraction is below the load.
    # Batch service: an epoch removes at most B jobs (fewer at short queues), so servers are busy at least the load.
    if "service_batch_sizes" in res:
        assert res["utilisation"] >= res["load"] - 1e-12
    elif not res.get("helpers"):
        assert abs(res["utilisation"] - res["load"] * res.get("availability", 1.0)) < 1e-9
    else:
        assert res["utilisation"] < res["load"] * (1 + sum(h["rate"] for h in res["helpers"]))
    # The tails count jobs at a server, or (retrial models) orbit customers, besides the one in service.
    in_service = res["utilisation"] if "mean_orbit_size" in res else 0.0
    assert abs(res["mean_queue_length"] - sum(res["tail"][1:]) - in_service) < 1e-9
    assert res["tail_mass_at_K"] < 1e-10
    # The same model from Python (`jsmkt.load_spec`), solved at the K the command reports, gives what it printed.
    import jsmkt

    model = jsmkt.load_spec(EXAMPLES / spec)
    model = model if model.K == res["K"] else model.with_K(res["K"])
    fp = jsmkt.solve_fixed_point(model)
    assert float(jsmkt.mean_sojourn_time(model, fp)) == pytest.approx(res["mean_sojourn_time"], rel=1e-10, abs=1e-14)
    tail, n = np.asarray(jsmkt.tails(model, fp)), len(res["tail"])  # the command leaves out tails below 1e-300
    np.testing.assert_allclose(tail[:n], res["tail"], rtol=1e-9, atol=1e-14)
    assert np.all(tail[n:] < 1e-299)


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
    # Every refined list is indexed by k from 0, like `tail` (before, the per-k lists started at k = 1).
    assert len(r["tail"]) == len(r["tail_correction"]) == len(r["tail_std"]) == len(r["tail_in_range"])
    assert r["tail"][0] == 1.0 and r["tail_correction"][0] == 0.0 and r["tail_std"][0] == 0.0
    np.testing.assert_allclose(r["tail"], np.array(res["tail"]) + np.array(r["tail_correction"]) / 200,
                               rtol=1e-12, atol=1e-300)
    assert abs(r["utilisation"] - res["utilisation"]) < 1e-12  # work conservation: no 1/N term in s_1
    assert r["mean_queue_length"] > res["mean_queue_length"]  # a finite system is slower
    d1 = tmp_path / "d1.toml"
    d1.write_text('model = "jsq"\nlam = 0.6\nd = 1\n')
    _, out, _ = run(["solve", str(d1), "--format", "json", "--servers", "50"], capsys)
    res = json.loads(out)
    s = np.array(res["tail"][1:6])
    np.testing.assert_allclose(res["refined"]["tail"][1:6], s, rtol=1e-10)
    np.testing.assert_allclose(res["refined"]["tail_std"][1:6], np.sqrt(s * (1 - s) / 50), rtol=1e-8)
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
    # Regression: "d" was 2.0 in the exact output and 2 in the published one.
    assert json.dumps(pub["d"]) == json.dumps(exact["d"]) == "2.0"


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
    # Regression: these said "pass clip=True", crashed the process (XLA), ran out of memory, or raised OverflowError.
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "moments"\nm1 = 1.0\nm2 = 1.5\nm3 = 1.0\n',
     "feasible m3 range is [3, 3]; set clip = true in the table to project onto it"),
    ('model = "jsq"\nlam = 0.5\nd = 9223372036854775807\n', "d=9223372036854775807 exceeds 65536, the largest "
     "number of servers an arrival samples jsmkt handles"),
    ('model = "jsq"\nlam = 0.5\nd = 1e300\n', "d=1e+300 must be below 65536"),
    # The suggested K is the one --auto-K reaches (regression: it said K=6, which is too small too).
    ('model = "jsq"\nlam = 0.9\nK = 3\n', "K=3 is too small: the fraction of servers with K jobs is 0.25 > "
     "tail_tol=1e-10; raise K in the spec (e.g. K=12) or pass --auto-K"),
    ('model = "jsq"\nlam = 0.9\nK = 6\n', "K=6 is too small: the fraction of servers with K jobs is 0.00131 > "
     "tail_tol=1e-10; raise K in the spec (e.g. K=12) or pass --auto-K"),
    ('model = "jsq"\nlam = "fast"\n', "lam="),
    ('model = "jsq"\nlam = 0.5\nspeed = 2\n', "unknown key(s) 'speed'"),
    ("model = jsq", "not valid TOML"),
    # wrong types: numbers must be TOML numbers, integer keys integers, clip a boolean
    ('model = "jsq"\nlam = "0.9"\n', "lam='0.9' must be a number"),
    ('model = "jsq"\nlam = true\nmu = 2.0\n', "lam=true must be a number"),
    ('model = "jsq"\nlam = 0.5\nmu = "1"\n', "mu='1' must be a number"),
    ('model = "jsq"\nlam = 0.5\nmu = true\n', "mu=true must be a number"),
    ('model = "jsq"\nlam = 0.5\nK = 20.0\n', "K=20.0 must be an integer"),
    ('model = "jsq"\nlam = 0.5\nd = "2"\n', "d='2' must be an integer, a real number >= 1 or a list"),
    ('model = "jsq"\nlam = 0.5\nd = {x = 1}\n', "d={x = 1} must be an integer"),
    ('model = "jsq"\nlam = 0.5\nd = ["a"]\n', "d=['a'] must be a list of numbers"),
    ('model = "jsq"\nlam = 0.5\nd = nan\n', "d=nan must be finite"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "erlang"\nk = true\n', "[service]: k=true must be an integer"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "moments"\nm1 = 1.0\nm2 = 1.5\nm3 = 1.0\nclip = "false"\n',
     "[service]: clip='false' must be true or false"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "exponential"\nmean = "1"\n', "mean='1' must be a number"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "exponential"\nmean = inf\n',
     "[service]: mean=inf must be finite"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "exponential"\nmean = 0.0\n',
     "[service]: mean=0.0 must be positive"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "exponential"\nrate = 1.0\nmean = 2.0\n',
     "rate=1.0 and mean=2.0 are both given; give one of them"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "ph"\nalpha = [1.0]\nT = [[-1.0], [0.0, 1.0]]\n',
     "T=[[-1.0], [0.0, 1.0]] must be a list of equal-length lists of numbers"),
    # the [simulation] table is checked by `solve` too
    ('model = "jsq"\nlam = 0.5\nsimulation = 3\n', "[simulation] must be a table"),
    ('model = "jsq"\nlam = 0.5\n[simulation]\nsamplng = "without_replacement"\n',
     "[simulation]: unknown key(s) 'samplng'; allowed: sampling, service"),
    ('model = "jsq"\nlam = 0.5\n[simulation]\nsampling = "bogus"\n', "sampling='bogus' is not one of"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "lognormal"\n',
     "[simulation.service]: missing key 'scv'"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "deterministic"\nscv = 1.0\n',
     "[simulation.service]: unknown key(s) 'scv'; allowed: kind, mean"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "lognormal"\nscv = "2"\n', "scv='2' must be a number"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "gamma"\n', "kind='gamma' is not one of deterministic"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "erlang"\nk = 2\nscv = 1.0\n',
     "[simulation.service]: unknown key(s) 'scv'; allowed: k, kind, mean"),
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
                          "--seed", "3", "--format", "json", "--max-queue", "120"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["max_queue"] == 120
    for key in ("mean_queue_length", "mean_sojourn_time", "mean_sojourn_time_ci", "tail", "events",
                "sojourn_time_percentiles"):
        assert key in res
    assert res["events"] > 10_000
    assert abs(res["mean_sojourn_time"] - 2.0) < 5 * res["mean_sojourn_time_ci"] + 0.02
    assert abs(res["tail"][1] - 0.5) < 0.03


def test_simulate_reports_the_service_it_simulates(tmp_path, capsys):
    # Regression: with [simulation.service] the header named the model's [service] and the JSON named none.
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq-ph"\nlam = 0.5\nd = 1\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n'
                    '[simulation.service]\nkind = "deterministic"\nmean = 1.0\n')
    args = ["simulate", str(spec), "--servers", "40", "--time", "400", "--replications", "4", "--seed", "1"]
    code, out, err = run(args + ["--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["service"] == {"kind": "deterministic", "source": "[simulation.service]", "mean": 1.0, "scv": 0.0}
    # M/D/1 (d = 1): E[T] = 1 + lam / (2 (1 - lam)) = 1.5, where the H2 of [service] gives 1 + 2.5 = 3.5.
    assert abs(res["mean_sojourn_time"] - 1.5) < 5 * res["mean_sojourn_time_ci"] + 0.02
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert "service (simulated, from [simulation.service]): deterministic, mean 1, SCV 0" in out
    assert "PH of order" not in out

    spec.write_text('model = "jsq-ph"\nlam = 0.5\nd = 1\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n')
    code, out, err = run(args[:-4] + ["--replications", "2", "--format", "json"], capsys)
    assert code == 0, err
    service = json.loads(out)["service"]
    assert service["kind"] == "h2" and service["order"] == 2 and service["source"] == "[service]"
    assert service["mean"] == pytest.approx(1.0) and service["scv"] == pytest.approx(4.0)


@pytest.mark.parametrize("args, needle", [
    (["--servers", "0", "--time", "10"], "--servers=0 must be >= 1"),
    (["--servers", "10", "--time", "-1"], "--time=-1.0 must be a positive"),
    (["--servers", "10", "--time", "10", "--cpu-devices", "0"], "--cpu-devices=0 must be >= 1"),
    (["--servers", "10", "--time", "10", "--cpu-devices", "100000"], "--cpu-devices=100000 exceeds"),
    (["--servers", "10", "--time", "10", "--warmup", "20"], "--warmup=20.0 must be finite, >= 0 and less than --time"),
    (["--servers", "10", "--time", "10", "--warmup", "-1"], "--warmup=-1.0 must be finite, >= 0"),
    (["--servers", "10", "--time", "10", "--warmup", "nan"], "--warmup=nan must be finite"),
    (["--servers", "10", "--time", "10", "--replications", "0"], "--replications=0 must be >= 1"),
    (["--servers", "10", "--time", "10", "--seed", "100000000000000000000000"],
     "--seed=100000000000000000000000 is out of range: give an integer from -9223372036854775808 to "
     "9223372036854775807"),
    (["--servers", "10", "--time", "10", "--seed", "-9223372036854775809"], "--seed=-9223372036854775809 is out"),
    (["--servers", "10", "--time", "10", "--max-queue", "0"], "--max-queue=0 must be >= 1"),
    (["--servers", "20", "--time", "300", "--max-queue", "1"],
     "--max-queue=1 is too small: "),  # simulate's own error, in the options' names
    (["--servers", "1000000", "--time", "10", "--max-queue", "10000"],
     "--replications=1 x --servers=1000000 x --max-queue=10000 ring-buffer slots"),
    # Regression: these named the Python arguments t1 and warmup.
    (["--servers", "10", "--time", "2e10"], "--time=20000000000.0 is 2e+10 mean service times"),
    (["--servers", "10", "--time", "0.001"], "during [--warmup, --time] = [0.0001, 0.001]"),
])
def test_simulate_bad_arguments(tmp_path, capsys, args, needle):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\n')
    code, _, err = run(["simulate", str(spec), *args], capsys)
    assert code == 2 and needle in err, err
    assert err.count("\n") == 1 and err.startswith("jsmkt: error:")


@pytest.mark.parametrize("text, needle", [
    ('model = "jsq"\nlam = 0.5\nsimulation = 3\n', "[simulation] must be a table"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "lognormal"\n', "missing key 'scv'"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "deterministic"\nscv = 1.0\n', "unknown key(s) 'scv'"),
    ('model = "jsq"\nlam = 0.5\nd = 5\n[simulation]\nsampling = "without_replacement"\n',
     "d=5 exceeds --servers=3: cannot sample 5 distinct servers without replacement"),
])
def test_simulate_bad_specs(tmp_path, capsys, text, needle):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    code, out, err = run(["simulate", str(spec), "--servers", "3", "--time", "10"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("jsmkt: error:") and needle in err, err


def test_unreadable_spec_files(tmp_path, capsys):
    code, _, err = run(["solve", str(tmp_path)], capsys)
    assert code == 2 and err == f"jsmkt: error: {tmp_path}: is a directory; give a TOML spec file\n"
    spec = tmp_path / "latin1.toml"
    spec.write_bytes('model = "jsq"\nlam = 0.5  # \u00e9\n'.encode("latin-1"))
    code, _, err = run(["solve", str(spec)], capsys)
    assert code == 2 and err.startswith(f"jsmkt: error: {spec}: not UTF-8 text") and err.count("\n") == 1


@pytest.mark.parametrize("name, needle", [
    ("missing/tails.png", "directory {tmp}/missing does not exist"),
    ("folder", "--plot={tmp}/folder is a directory"),
    ("tails", "--plot={tmp}/tails has no file extension; end the name with one of"),
    ("tails.xyz", "file type .xyz is not supported"),
])
def test_bad_plot_path_is_refused_before_solving(tmp_path, capsys, name, needle):
    (tmp_path / "folder").mkdir()
    code, out, err = run(["solve", str(EXAMPLES / "jsq3_exponential.toml"), "--plot", str(tmp_path / name)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle.format(tmp=tmp_path) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_solve_without_replacement_needs_enough_servers(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 2.5\n[simulation]\nsampling = "without_replacement"\n')
    code, out, err = run(["solve", str(spec), "--servers", "2"], capsys)
    assert code == 2 and out == ""
    assert "d=3 exceeds --servers=2: cannot sample 3 distinct servers without replacement" in err
    code, out, err = run(["solve", str(spec), "--servers", "3", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["refined"]["sampling"] == "without_replacement"


def test_truncation_errors_point_to_the_spec_and_auto_K(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nK = 2\n')
    code, out, err = run(["solve", str(spec), "--as-published"], capsys)
    assert code == 2 and out == ""
    assert err == ("jsmkt: error: K=2 is too small: the published s_K is 0.729 > tail_tol=1e-10; raise K in the "
                   "spec (e.g. K=8) or pass --auto-K\n")
    code, out, err = run(["solve", str(spec), "--as-published", "--auto-K", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["K"] == 8 and res["tail_mass_at_K"] <= 1e-10
    spec.write_text('model = "jsq"\nlam = 0.9\nK = 3\n')
    K = json.loads(run(["solve", str(spec), "--auto-K", "--format", "json"], capsys)[1])["K"]
    code, out, err = run(["solve", str(spec), "--auto-K"], capsys)
    assert code == 0 and K > 3 and f"K = {K} " in out  # the table describes the model solved

    import jsmkt

    def stopped(model, auto_K, max_K):
        raise jsmkt.TruncationError(4096, 1e-3, 1e-10, True, 4096)

    monkeypatch.setattr(jsmkt, "solve_fixed_point", stopped)
    code, _, err = run(["solve", str(spec), "--auto-K"], capsys)
    assert code == 2
    assert err == ("jsmkt: error: K=4096 is too small: the fraction of servers with K jobs is 0.001 > "
                   "tail_tol=1e-10; --auto-K stopped at K=4096: K would need to exceed 4096 for this model (lower "
                   "the load or the service SCV)\n")


def test_a_default_K_that_is_too_small_grows(tmp_path, capsys):
    """Issue 25: a spec without K failed with "raise K in the spec" when its default K (a heuristic) was too small;
    it now grows, as with --auto-K, above the solver's max_K too. M/M/1 at lam = 0.9999 gets a default K of 40281,
    too small (regressions: --auto-K did not grow a K above max_K = 4096, and the error suggested K=80562, too
    small too). A K given in the spec stands: too small, it is an error that suggests the K that works."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9999\nd = 1\n')
    code, out, err = run(["solve", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["K"] == 161124 and res["tail_mass_at_K"] <= 1e-10
    np.testing.assert_allclose(res["tail"][1:6], 0.9999 ** np.arange(1, 6), rtol=1e-9)  # M/M/1: s_k = lam^k
    spec.write_text('model = "jsq"\nlam = 0.9999\nd = 1\nK = 40281\n')
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 2 and err.startswith("jsmkt: error: K=40281 is too small") and "(e.g. K=161124)" in err


def test_refined_mean_field_out_of_range_is_flagged(tmp_path, capsys):
    """N = 1 is far too small for the 1/N expansion: some refined s_k exceed 1. The values are kept (a valid
    expansion) but `in_range` is false and a note names them."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nd = 2\n')
    for fmt in ("json", "table"):
        code, out, err = run(["solve", str(spec), "--servers", "1", "--format", fmt], capsys)
        assert code == 0
        assert err.count("\n") == 1 and err.startswith("jsmkt: note: N=1 servers is too small for the 1/N expansion")
        assert "s_3 = 1.137" in err and "fall outside [0, 1]" in err
    r = json.loads(run(["solve", str(spec), "--servers", "1", "--format", "json"], capsys)[1])["refined"]
    assert r["in_range"] is False and max(r["tail"]) > 1
    d1 = tmp_path / "d1.toml"
    d1.write_text('model = "jsq"\nlam = 0.6\nd = 1\n')  # independent M/M/1 queues: no 1/N term
    code, out, err = run(["solve", str(d1), "--servers", "50", "--format", "json"], capsys)
    assert code == 0 and err == "" and json.loads(out)["refined"]["in_range"] is True


def test_simulate_warnings_are_one_line_in_the_options_names(tmp_path, capsys):
    """Regression: the correlated-batch-means warning came with a file, a line of source and simulate's argument
    names (t1, n_replications)."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nd = 1\n')
    code, _, err = run(["simulate", str(spec), "--servers", "20", "--time", "3000", "--seed", "1010", "--format",
                        "json"], capsys)
    assert code == 0
    assert err.startswith("jsmkt: warning: the 30 batch means (batches of 90 time units) are correlated")
    assert err.rstrip().endswith("raise --time, or use --replications >= 2") and err.count("\n") == 1


def test_spec_files_output_and_plot_formats_edge_cases(tmp_path, capsys):
    # Regression: a UTF-8 byte-order mark was "Invalid statement"; /dev/zero was read until memory ran out; a full
    # disk gave an OSError traceback; .eps printed a bare matplotlib log line; .pgf (needs LaTeX) was offered, and
    # failed after the results were printed.
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b'\xef\xbb\xbfmodel = "jsq"\nlam = 0.5\n')
    code, out, err = run(["solve", str(bom), "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["lam"] == 0.5, err
    big = tmp_path / "big.toml"
    big.write_text("#" * 2**20 + '\nmodel = "jsq"\nlam = 0.5\n')
    code, out, err = run(["solve", str(big)], capsys)
    assert code == 2 and err == f"jsmkt: error: {big}: larger than 1 MiB; a model spec is a short TOML file\n"
    code, out, err = run(["solve", str(EXAMPLES / "jsq3_exponential.toml"), "--plot", str(tmp_path / "t.eps")], capsys)
    assert code == 0 and (tmp_path / "t.eps").stat().st_size > 0
    assert err.startswith(f"jsmkt: warning: --plot={tmp_path / 't.eps'}: The PostScript backend") and err.count("\n") == 1
    if not shutil.which("xelatex"):
        code, out, err = run(["solve", str(EXAMPLES / "jsq3_exponential.toml"), "--plot", str(tmp_path / "t.pgf")],
                             capsys)
        assert code == 2 and out == "" and "file type .pgf is not supported" in err
    if pathlib.Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "jsmkt.cli", "solve", str(EXAMPLES / "jsq3_exponential.toml")],
                               stdout=full, capture_output=False, stderr=subprocess.PIPE, text=True)
        assert r.returncode == 1
        assert r.stderr == "jsmkt: failed: cannot write the output (No space left on device)\n"


def test_float_d_and_as_published_notes(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 2.0\n')
    code, out, err = run(["solve", str(spec), "--as-published"], capsys)
    assert code == 2 and err.endswith("d = 2 is a TOML float, which the spec reads as a randomised d: write d = 2\n")
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 0 and "(from a TOML float: write d = 2 for a fixed choice number)" in out
    spec.write_text('model = "jsq"\nlam = 0.5\nd = [0.0, 1.0]\n')  # a law with mean 2 is not a float d
    code, out, err = run(["solve", str(spec), "--as-published"], capsys)
    assert code == 2 and "TOML float" not in err
    # The published PH formulas break Little's law; the output says so, with the numbers.
    code, out, err = run(["solve", str(EXAMPLES / "jsq2_h2.toml"), "--as-published", "--format", "json"], capsys)
    res = json.loads(out)
    assert code == 0 and abs(0.9 * res["mean_sojourn_time"] - res["mean_queue_length"]) > 0.5
    assert res["note"].startswith("E[T] is the paper's Section 3 formula and E[Q] the sum of its tails; they need not "
                                  "obey Little's law (here lam E[T] = 1.87265, E[Q] = 1.3259)")


def test_refined_prob_wait_follows_the_sampling(tmp_path, capsys):
    """Without replacement an arrival waits when both of its d = 2 distinct servers are busy:
    E[N s_1 (N s_1 - 1) / (N (N - 1))] = (E[s_1^2] N - s_1) / (N - 1), with E[s_1^2] = s_1^2 + W_11 / N to order 1/N
    (s_1 = lam has no 1/N term). Regression: the CLI gave E[s_1^2] (with replacement): 0.28441 at N = 10, where the
    exact stationary law of the 10-server chain (computed separately, by solving its generator) gives 0.25998."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 2\nK = 20\n[simulation]\nsampling = "without_replacement"\n')
    model = jsmkt.JSQd(0.5, d=2, K=20)
    W11 = float(jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model)).covariance[0, 0])
    for n, exact in ((6, 0.26734), (10, 0.25998)):
        code, out, err = run(["solve", str(spec), "--servers", str(n), "--format", "json"], capsys)
        assert code == 0, err
        p = json.loads(out)["refined"]["prob_wait"]
        assert p == pytest.approx(((0.25 + W11 / n) * n - 0.5) / (n - 1), rel=1e-12)
        assert abs(p - exact) < 2e-3  # O(1/N^2) from the exact value; the mean field's 0.25 is 10x further at N=10


def test_jsq_batch_solve_and_simulate(tmp_path, capsys):
    """`model = "jsq-batch"`: d = 1 is the M^X/M/1 queue, E[Q] = rho (E[X^2] + E[X]) / (2 E[X] (1 - rho)); the
    simulation runs the same batches."""
    spec = tmp_path / "b.toml"
    spec.write_text('model = "jsq-batch"\nbatch_rate = 0.3\nbatch_sizes = [0.5, 0.5]\nd = 1\nmu = 1.0\n')
    code, out, err = run(["solve", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    rho, EX, EX2 = 0.45, 1.5, 2.5
    assert res["mean_queue_length"] == pytest.approx(rho * (EX2 + EX) / (2 * EX * (1 - rho)), rel=1e-10)
    assert res["batch_sizes"] == [0.5, 0.5] and res["lam"] == pytest.approx(0.45) and res["model"] == "JSQdBatch"
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "2",
                          "--format", "json"], capsys)
    assert code == 0, err
    sim = json.loads(out)
    assert sim["model"] == "JSQdBatch" and abs(sim["mean_queue_length"] - res["mean_queue_length"]) < 0.1
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 0 and "batch_rate = 0.3   batch sizes 1..2 (mean 1.5)   d = 1" in out
    code, _, err = run(["solve", str(spec), "--as-published"], capsys)
    assert code == 2 and "has no published form" in err
    spec.write_text('model = "jsq-batch"\nbatch_rate = 0.3\nbatch_sizes = [0.5, -0.5]\n')
    code, _, err = run(["solve", str(spec)], capsys)
    assert code == 2 and "batch_sizes[1]=-0.5" in err
    spec.write_text('model = "jsq-batch"\nlam = 0.3\nbatch_sizes = [1.0]\n')
    code, _, err = run(["solve", str(spec)], capsys)
    assert code == 2 and "unknown key(s) 'lam'" in err


def test_service_table_with_alpha_and_T_alone_is_a_ph(tmp_path, capsys):
    spec = tmp_path / "p.toml"
    spec.write_text('model = "jsq-ph"\nlam = 0.5\nd = 1\n[service]\nalpha = [1.0, 0.0]\nT = [[-2.0, 2.0], [0.0, -2.0]]\n')
    code, out, err = run(["solve", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    # Erlang-2 of mean 1 at load 0.5: Pollaczek-Khinchine E[Q] = rho + rho^2 (1 + scv) / (2 (1 - rho)), scv = 1/2.
    assert json.loads(out)["mean_queue_length"] == pytest.approx(0.5 + 0.25 * 1.5 / 1.0, rel=1e-10)


def test_refined_in_range_judges_the_levels_that_carry_mass(tmp_path, capsys):
    """JSQ(2), lam = 0.9: with 10^6 servers the expansion holds wherever a level holds at least one server; the
    deep levels (s_k far below 1/N) are not judged."""
    spec = tmp_path / "j.toml"
    spec.write_text('model = "jsq"\nlam = 0.9\nd = 2\n')
    code, out, err = run(["solve", str(spec), "--format", "json", "--servers", "1000000"], capsys)
    assert code == 0, err
    r = json.loads(out)["refined"]
    assert r["in_range"] is True and r["out_of_range_levels"] == []
    assert not all(r["tail_in_range"])  # some deep level fails the 30 % test, without counting
    code, out, err = run(["solve", str(spec), "--format", "json", "--servers", "3"], capsys)
    r = json.loads(out)["refined"]
    assert r["in_range"] is False and r["out_of_range_levels"]


def test_retrial_solve_and_simulate(tmp_path, capsys):
    """`model = "retrial"`: re-probing, E[orbit] = lam g1(rho)/(theta (1 - g2(rho))); own retrials with d1 = 1 are
    the M/M/1 retrial queue; the simulation runs the same system."""
    spec = tmp_path / "r.toml"
    spec.write_text('model = "retrial"\nlam = 0.6\ntheta = 2.0\nd1 = 2\nd2 = 2\nK = 40\n')
    code, out, err = run(["solve", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["mean_orbit_size"] == pytest.approx(0.6 * 0.36 / (2.0 * 0.64), rel=1e-10)
    assert res["prob_blocked"] == pytest.approx(0.36, rel=1e-10)
    assert res["mean_sojourn_time_tagged"] == pytest.approx(res["mean_sojourn_time"], rel=1e-10)
    assert (res["d1"], res["d2"], res["retrial"], res["policy"]) == (2.0, 2.0, "reprobe", "linear")
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 0 and "P(primary blocked)" in out and "P(orbit >= k)" in out and "d2 = 2" in out
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "200", "--replications", "2",
                          "--format", "json"], capsys)
    assert code == 0, err
    assert abs(json.loads(out)["mean_queue_length"] - res["mean_queue_length"]) < 0.1
    spec.write_text('model = "retrial"\nlam = 0.5\ntheta = 1.0\nd1 = 1\nretrial = "own"\nK = 60\n')
    code, out, err = run(["solve", str(spec), "--format", "json", "--percentiles", "40,99"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["mean_orbit_size"] == pytest.approx(0.25 / 0.5 + 0.25 / 0.5, rel=1e-10)
    # Own retrials keep a customer at its server: the sojourn and waiting times have laws (P(W = 0) = 1 - lam).
    assert res["waiting_time_percentiles"]["p40"] == 0.0
    assert 0.0 < res["waiting_time_percentiles"]["p99"] < res["sojourn_time_percentiles"]["p99"]
    for text, message in (('retrial = "orbit"', "retrial='orbit' is not one of 'reprobe', 'own'"),
                          ("theta = 0.0", "theta=0.0 must be positive"), ("lam = 1.5", "unstable: lam=1.5 >= mu=1 (load rho=1.5)"),
                          ("d2 = 0", "d2=0 must be >= 1"), ('policy = "x"', "policy='x' is not one of")):
        key = text.split(" = ")[0]
        lines = [ln for ln in spec.read_text().splitlines() if not ln.startswith(key + " ")]
        spec.write_text("\n".join(lines + [text]) + "\n")
        code, _, err = run(["solve", str(spec)], capsys)
        assert code == 2 and message in err, (text, err)
        spec.write_text('model = "retrial"\nlam = 0.5\ntheta = 1.0\nd1 = 1\nretrial = "own"\nK = 60\n')


def test_repairable_solve_and_simulate(tmp_path, capsys):
    """`model = "repairable"`: R.1's availability beta/(alpha + beta), the JSON's repair metrics, a short simulation
    of the same rules, and the spec's errors."""
    spec = tmp_path / "r.toml"
    spec.write_text('model = "repairable"\nlam = 0.5\nalpha = 0.2\nbeta = 0.5\narrival = "A2"\nrepair = "R1"\nK = 40\n')
    code, out, err = run(["solve", str(spec), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["availability"] == pytest.approx(0.5 / 0.7, rel=1e-10)
    assert res["load"] == pytest.approx(0.5 / (0.5 / 0.7), rel=1e-10) and res["arrival"] == "A2"
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 0 and "repairmen utilisation" in out and "utilisation (serving)" in out
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "300", "--replications", "2",
                          "--format", "json"], capsys)
    assert code == 0, err
    assert abs(json.loads(out)["mean_queue_length"] - res["mean_queue_length"]) < 0.25
    for text, message in (('repair = "R9"', "repair='R9' is not one of"), ("alpha = -1.0", "alpha=-1.0 must be positive"),
                          ("lam = 0.9", "unstable: lam=0.9 >= mu*a=0.714286"), ('repair = "R3"', "repair='R3' needs j")):
        key = text.split(" = ")[0]
        lines = [ln for ln in spec.read_text().splitlines() if not ln.startswith(key + " ")]
        spec.write_text("\n".join(lines + [text]) + "\n")
        code, _, err = run(["solve", str(spec)], capsys)
        assert code == 2 and message in err, (text, err)
        spec.write_text('model = "repairable"\nlam = 0.5\nalpha = 0.2\nbeta = 0.5\narrival = "A2"\nK = 40\n')


def _family_specs() -> dict[str, pathlib.Path]:
    """The first example spec of each registered family (every family has one: `test_every_example_solves`)."""
    import tomllib

    from jsmkt._spec import FAMILIES

    out = {}
    for path in SPECS:
        out.setdefault(tomllib.loads(path.read_text())["model"], path)
    assert set(out) == set(FAMILIES)
    return out


FAMILY_SPECS = _family_specs()


@pytest.mark.parametrize("family", sorted(FAMILY_SPECS))
def test_transient_runs_for_every_family(family, capsys):
    """`jsmkt transient`: from empty servers at t = 0 (s_k = 0 for k >= 1, E[Q] = 0, at distance s_1* from the fixed
    point) towards the fixed point that `jsmkt solve` gives (same K). The example specs share their solves with
    `test_every_example_solves`."""
    spec = str(FAMILY_SPECS[family])
    # Tsit5 (explicit) compiles in a fraction of Kvaerno5's time; the default solver is checked against the M/M/1
    # queue below.
    code, out, err = run(["transient", spec, "--time", "3", "--points", "4", "--format", "json", "--solver", "tsit5"],
                         capsys)
    assert code == 0, err
    res = json.loads(out)
    solved = json.loads(run(["solve", spec, "--format", "json"], capsys)[1])
    assert res["K"] == solved["K"] and res["times"] == [0.0, 1.0, 2.0, 3.0]
    star = res["fixed_point"]
    np.testing.assert_allclose(star["tail"], solved["tail"], rtol=1e-12, atol=1e-300)
    assert star["mean_queue_length"] == pytest.approx(solved["mean_queue_length"], rel=1e-12)
    tails = np.array(res["tails"])
    assert tails.shape == (4, len(star["tail"])) and np.all(tails[:, 0] == 1.0)
    assert np.all(tails[0, 1:] == 0.0) and res["mean_queue_length"][0] == 0.0
    assert res["distance_to_fixed_point"][0] == pytest.approx(star["tail"][1], rel=1e-12)
    assert np.all(np.diff(tails, axis=1) <= 1e-12) and np.all(tails >= -1e-12)  # tails fall with k
    assert res["distance_to_fixed_point"][-1] < res["distance_to_fixed_point"][0]
    code, out, err = run(["transient", spec, "--time", "3", "--points", "4", "--solver", "tsit5"], capsys)
    assert code == 0 and "max_k |s_k(t) - s_k*|" in out and "fixed pt" in out, err


def test_transient_matches_the_mm1_forward_equations(tmp_path, capsys):
    """JSQ(1) is the M/M/1 queue: its mean-field transient from empty is P(Q(t) >= k) of one M/M/1 queue started
    empty, here from the matrix exponential of its generator (truncated far above the levels compared)."""
    import scipy.linalg

    spec = tmp_path / "mm1.toml"
    spec.write_text('model = "jsq"\nlam = 0.7\nd = 1\nK = 80\n')
    png = tmp_path / "transient.png"
    code, out, err = run(["transient", str(spec), "--time", "4", "--points", "5", "--format", "json", "--plot",
                          str(png)], capsys)
    assert code == 0, err
    res = json.loads(out)
    n = 200
    Q = np.diag(np.full(n - 1, 0.7), 1) + np.diag(np.full(n - 1, 1.0), -1)
    Q -= np.diag(Q.sum(axis=1))
    for t, row in zip(res["times"], res["tails"], strict=True):
        p = scipy.linalg.expm(Q.T * t)[:, 0]  # the law of Q(t) from Q(0) = 0
        tail = p[::-1].cumsum()[::-1]
        np.testing.assert_allclose(row[1:8], tail[1:8], rtol=1e-6, atol=1e-9)  # integrate's rtol is 1e-8 per step
    assert png.stat().st_size > 5000
    for args, needle in ((["--time", "0"], "--time=0.0 must be a positive finite time"),
                         (["--time", "1", "--points", "1"], "--points=1 must be >= 2")):
        code, _, err = run(["transient", str(spec), *args], capsys)
        assert code == 2 and needle in err


def _unstable_spec(path: pathlib.Path) -> str:
    """A family's example spec with its arrival rates multiplied by 4 (unstable), as TOML."""
    import tomllib

    spec = tomllib.loads(path.read_text())
    for table in [spec, *spec.get("classes", [])]:
        for key in ("lam", "batch_rate"):
            if key in table:
                table[key] *= 4
    if "arrivals" in spec:  # a BMAP: all its rates times 4
        spec["arrivals"] = {k: (np.asarray(v) * 4).tolist() for k, v in spec["arrivals"].items()}
    lines = []
    for key, v in spec.items():
        if not isinstance(v, (dict, list)) or (isinstance(v, list) and not isinstance(v[0], dict)):
            lines.append(f"{key} = {json.dumps(v)}")
    for key, v in spec.items():
        if isinstance(v, dict):
            lines.append(f"[{key}]")
            lines += [f"{k} = {json.dumps(x)}" for k, x in v.items()]
        elif isinstance(v, list) and isinstance(v[0], dict):
            for table in v:
                lines.append(f"[[{key}]]")
                lines += [f"{k} = {json.dumps(x)}" for k, x in table.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("family", sorted(FAMILY_SPECS))
def test_solve_and_simulate_word_instability_alike(family, tmp_path, capsys):
    """Issue 25: `simulate` and `solve` worded the same instability differently. Each family's example at four
    times its arrival rate: the same `jsmkt: error: unstable: ...` line from both commands."""
    spec = tmp_path / "unstable.toml"
    spec.write_text(_unstable_spec(FAMILY_SPECS[family]))
    code, out, solve_err = run(["solve", str(spec)], capsys)
    assert code == 2 and out == "" and solve_err.startswith("jsmkt: error: ") and "unstable: " in solve_err
    code, out, simulate_err = run(["simulate", str(spec), "--servers", "10", "--time", "10"], capsys)
    assert code == 2 and out == "" and simulate_err == solve_err


def test_help_spec_and_option_errors_import_no_jax(tmp_path):
    """Issue 25: `jsmkt --help` took 4.6 s, spec and option errors as long: the CLI imported every model and JAX
    first. These now answer before JAX is imported (and NumPy too, but where Matplotlib checks a --plot file)."""
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "jsq"\nlam = 0.5\nspeed = 2\n')
    ok = EXAMPLES / "jsq2_h2.toml"
    calls = [["--help"], ["solve", "--help"], ["solve", str(bad)], ["solve", str(tmp_path / "missing.toml")],
             ["solve", str(ok), "--servers", "0"],
             ["simulate", str(ok), "--servers", "10", "--time", "-1"], ["transient", str(ok), "--time", "0"],
             ["simulate", str(ok), "--servers", "10", "--time", "5", "--cpu-devices", "0"], ["solve"]]
    code = ("import sys\nfrom jsmkt.cli import main\n"
            f"for argv in {calls!r}:\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'equinox', 'numpy'}))\n"
            f"main(['solve', {str(ok)!r}, '--plot', 'x.xyz'])\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'equinox'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.stdout.splitlines()[-2:] == ["[]", "[]"], proc.stdout[-500:] + proc.stderr
    for needle in ("unknown key(s) 'speed'", "missing.toml: no such file", "--servers=0 must be >= 1",
                   "file type .xyz is not supported", "--time=-1.0 must be a positive", "--time=0.0 must be a positive",
                   "--cpu-devices=0 must be >= 1", "the following arguments are required: spec"):
        assert needle in proc.stderr, needle


def test_cache_folder_follows_the_options_and_the_environment(monkeypatch, tmp_path):
    """`--no-cache` > `--cache-dir` > `$JSMKT_CACHE_DIR` (`off` turns it off) > `$XDG_CACHE_HOME/jsmkt` >
    `~/.cache/jsmkt`; the library itself never turns JAX's compilation cache on."""
    import jax

    from jsmkt.cli import _cache_dir, build_parser

    def folder(*options):
        return _cache_dir(build_parser().parse_args(["solve", "s.toml", *options]))

    before = jax.config.jax_compilation_cache_dir
    monkeypatch.delenv("JSMKT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert folder() == str(tmp_path / "xdg" / "jsmkt")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert folder() == str(tmp_path / "home" / ".cache" / "jsmkt")
    monkeypatch.setenv("JSMKT_CACHE_DIR", str(tmp_path / "env"))
    assert folder() == str(tmp_path / "env")
    assert folder("--cache-dir", str(tmp_path / "opt")) == str(tmp_path / "opt")
    assert folder("--cache-dir", str(tmp_path / "opt"), "--no-cache") is None
    monkeypatch.setenv("JSMKT_CACHE_DIR", "off")
    assert folder() is None and folder("--cache-dir", "OFF") is None
    assert jax.config.jax_compilation_cache_dir == before  # nothing here moved it (the tests' own cache, if any)


@pytest.mark.slow
def test_compilation_cache_is_written_and_reused(tmp_path):
    """A run with the cache writes compiled kernels to DIR/jax and the exported solve to DIR/exported, and prints
    what a run without it prints (at a new λ too, from the same exported solve); a run with --no-cache or
    JSMKT_CACHE_DIR=off writes nothing."""
    import os

    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.7\nd = 2\nK = 12\n')
    env = {k: v for k, v in os.environ.items() if k != "JSMKT_CACHE_DIR"}
    cli = [sys.executable, "-m", "jsmkt.cli", "solve", str(spec), "--format", "json"]
    cache = tmp_path / "cache"
    first = subprocess.run([*cli, "--cache-dir", str(cache)], capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    written = sorted(p.name for p in (cache / "jax").iterdir())
    assert len(written) >= 3  # the value checks, the structure's probe, the solve, the metrics, ...
    assert len(list((cache / "exported").iterdir())) == 1  # the solve, traced and lowered once
    again = subprocess.run([*cli, "--cache-dir", str(cache)], capture_output=True, text=True, env=env, timeout=600)
    assert again.stdout == first.stdout
    off = tmp_path / "off"
    plain = subprocess.run([*cli, "--cache-dir", str(off), "--no-cache"], capture_output=True, text=True,
                           env={**env, "XDG_CACHE_HOME": str(off)}, timeout=600)
    assert plain.stdout == first.stdout and not off.exists()
    # A new value of the same structure loads the same exported solve, and prints what the usual path prints.
    spec.write_text('model = "jsq"\nlam = 0.6\nd = 2\nK = 12\n')
    other = subprocess.run([*cli, "--cache-dir", str(cache)], capture_output=True, text=True, env=env, timeout=600)
    plain = subprocess.run([*cli, "--no-cache"], capture_output=True, text=True, env=env, timeout=600)
    assert other.returncode == 0 and other.stdout == plain.stdout and other.stdout != first.stdout
    assert len(list((cache / "exported").iterdir())) == 1


def test_spec_words_agree_with_the_models():
    """The spec reads `retrial`, `policy`, `arrival` and `repair` without importing the models (JAX): its word lists
    must be the models' own."""
    from jsmkt import _spec
    from jsmkt._models import repairable, retrial

    assert (_spec.RETRIALS, _spec.POLICIES) == (retrial.RETRIALS, retrial.POLICIES)
    assert (_spec.ARRIVALS, _spec.REPAIRS) == (repairable.ARRIVALS, repairable.REPAIRS)


def test_percentiles(tmp_path, capsys):
    """`--percentiles`: the mean field's sojourn- and waiting-time percentiles in the JSON (M/M/1 here: the sojourn
    time is exponential of rate 1 - lam, the waiting time 0 with probability 1 - lam, else the same exponential),
    the simulation's with their half-widths; refused where no FCFS queue exists and with --as-published."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 0.5\nd = 1\n')
    code, out, err = run(["solve", str(spec), "--format", "json", "--percentiles", "50,99.9"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["sojourn_time_percentiles"] == pytest.approx({"p50": 2 * np.log(2), "p99.9": 2 * np.log(1000)},
                                                            rel=1e-9)
    assert res["waiting_time_percentiles"] == pytest.approx({"p50": 0.0, "p99.9": 2 * np.log(500)}, rel=1e-9)
    code, out, err = run(["solve", str(spec), "--percentiles", "99"], capsys)
    assert code == 0 and "sojourn time percentiles   p99=9.21" in out
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "2",
                          "--format", "json", "--percentiles", "50,99.9"], capsys)
    assert code == 0, err
    sim = json.loads(out)
    for key in ("sojourn_time_percentiles", "sojourn_time_percentiles_ci", "waiting_time_percentiles",
                "waiting_time_percentiles_ci"):
        assert set(sim[key]) == {"p50", "p99.9"}, key
    with pytest.raises(SystemExit) as e:  # argparse's usage message
        main(["solve", str(spec), "--percentiles", "50,100"])
    assert e.value.code == 2 and "100 is not a percentile in (0, 100)" in capsys.readouterr().err
    code, _, err = run(["solve", str(spec), "--percentiles", "50", "--as-published"], capsys)
    assert code == 2 and "--percentiles (sojourn-time distribution) applies to the exact mean field" in err
    code, _, err = run(["solve", str(EXAMPLES / "retrial_reprobe.toml"), "--percentiles", "50"], capsys)
    assert code == 2 and "RetrialJSQ: no sojourn time distribution" in err


def test_jsq_bmap_spec_as_published_and_bad_entries(tmp_path, capsys):
    """`jsq-bmap`: `--as-published` gives the paper's closed form (35)-(36) and the fixed point of (14)-(16); a bad
    descriptor entry is named."""
    code, out, err = run(["solve", str(EXAMPLES / "jsq_bmap.toml"), "--as-published", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    A = jsmkt.BMAP([[-0.52, 0.02], [0.0, -0.41]], [[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]])
    pi = np.asarray(jsmkt.published.bmap_fixed_point(A, 2, 0.7, res["K"]))
    np.testing.assert_allclose(res["tail"], pi.sum(1)[: len(res["tail"])], rtol=1e-12)
    assert res["lam"] == pytest.approx(0.565) and res["published_equations"]["mean_queue_length"] > 0
    spec = tmp_path / "bad.toml"
    spec.write_text('model = "jsq-bmap"\n[arrivals]\nC = [[-0.52, 0.02], [0.0, -0.41]]\n'
                    'D = [[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [-0.1, 0.35]]]\n')
    code, _, err = run(["solve", str(spec)], capsys)
    assert code == 2 and r"[arrivals]: D[1][1, 0]=-0.1 (rate of batches of 2" in err


def test_sensitivity_prints_dET_dlam_of_the_jsq2_h2_example(tmp_path, capsys):
    """`jsmkt sensitivity examples/jsq2_h2.toml --wrt lam`: dE[T]/dlam of JSQ(2) with H2 service (SCV 4) at lam = 0.9,
    against central differences of solves; the table prints it, the JSON carries it; scv goes through the spec's h2
    parametrisation; the plot is written."""
    spec = str(EXAMPLES / "jsq2_h2.toml")
    code, out, err = run(["sensitivity", spec, "--wrt", "lam,scv", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["metric"] == "mean_sojourn_time" and res["lam"] == 0.9 and res["model"] == "JSQdPH"
    dlam = res["parameters"]["lam"]["derivative"]

    def ET(lam, scv=4.0):
        m = jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, scv), d=2, K=res["K"])
        return float(jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m)))

    h = 1e-5
    assert dlam == pytest.approx((ET(0.9 + h) - ET(0.9 - h)) / (2 * h), rel=1e-6)
    assert res["value"] == pytest.approx(ET(0.9), rel=1e-12)
    assert res["parameters"]["scv"]["derivative"] == pytest.approx((ET(0.9, 4.0 + h) - ET(0.9, 4.0 - h)) / (2 * h),
                                                                   rel=1e-6)
    assert res["parameters"]["lam"]["elasticity"] == pytest.approx(dlam * 0.9 / res["value"], rel=1e-12)
    plot = tmp_path / "elasticities.png"
    code, out, err = run(["sensitivity", spec, "--wrt", "lam", "--plot", str(plot)], capsys)
    assert code == 0 and plot.stat().st_size > 0, err
    line = next(x for x in out.splitlines() if x.split()[:2] == ["lam", "0.9"])  # the table's row, not "lam = 0.9"
    assert float(line.split()[2]) == pytest.approx(dlam, rel=1e-9)
    assert "mean_sojourn_time = " in out and "d mean_sojourn_time / d parameter" in out


@pytest.mark.parametrize("args, needle", [
    (["--wrt", "lam,theta"], "wrt='theta' is not a parameter of 'jsq-ph' models (JSQdPH); its parameters are lam, "
                             "service.mean (or mean), d, service.scv (or scv)"),
    (["--wrt", "lam,"], "--wrt='lam,': give parameter names separated by commas"),
    (["--metric", "orbit"], "metric='orbit' is not a metric jsmkt knows"),
    (["--metric", "mean_orbit_size", "--wrt", "lam"], "mean_orbit_size is defined for retrial models"),
])
def test_sensitivity_bad_arguments(args, needle, capsys):
    code, out, err = run(["sensitivity", str(EXAMPLES / "jsq2_h2.toml"), *args], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"jsmkt: error: {needle}" or (err.startswith("jsmkt: error: ") and needle in err), err


def test_sensitivity_scv_needs_a_parametrised_service(capsys):
    code, out, err = run(["sensitivity", str(EXAMPLES / "jsq2_erlang2.toml"), "--wrt", "scv"], capsys)
    assert code == 2 and "the [service] of" in err and "has no scv key" in err and "'h2' or 'coxian2'" in err
