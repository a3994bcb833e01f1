"""Smoke tests of the experiment scripts (`experiments/`): they run, write what they promise, and say something sane.

The full `--quick` verification run takes about a minute on two cores and is marked slow; a two-case version of it
runs in the default suite.
"""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest


EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(folder: str, script: str):
    """Import `experiments/<folder>/<script>.py` as a fresh module (the scripts are not a package)."""
    path = EXPERIMENTS / folder / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"_exp_{folder}_{script}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_metadata(meta: dict, quick: bool = True):
    assert meta["quick"] is quick
    assert meta["parameters"]
    assert meta["git_sha"] is None or len(meta["git_sha"]) == 40
    assert len(meta["jsmkt_source_sha256"]) == 64
    for pkg in ("python", "jax", "jsmkt", "numpy"):
        assert meta["versions"][pkg]
    assert meta["date_utc"]
    assert meta["runtime"]["wall_s"] > 0


def _read_rows(out: Path):
    import csv

    with (out / "verification.csv").open() as f:
        return list(csv.DictReader(f))


def _verification_checks(out: Path, services: set[str], lams: set[float]):
    for name in ("verification.csv", "verification.json", "summary.md", "verification.pdf", "verification.png"):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "verification.json").read_text())
    _check_metadata(data["metadata"])
    rows = _read_rows(out)
    methods = {"simulation", "exact", "published_closed_form", "published_ode"}
    assert {r["method"] for r in rows} == methods
    assert {r["service"] for r in rows} == services
    assert {float(r["lam"]) for r in rows} == lams
    assert len(rows) == len(methods) * len(data["cases"])
    sims = {(r["d"], r["lam"], r["service"]): r for r in rows if r["method"] == "simulation"}
    for r in rows:
        if r["method"] == "simulation":
            ci_rel = float(r["ET_ci_rel"])
            assert 0 < ci_rel < 0.1
            assert int(r["n_replications"]) >= 4
            # s_1 = lam E[S] = lam (work conservation); Little's law holds inside the simulation
            assert abs(float(r["s1"]) - float(r["lam"])) < 0.02
            assert abs(float(r["little_gap"])) < 0.02
            continue
        err = float(r["relerr_ET"])
        assert math.isfinite(err)
        if r["method"] == "exact":
            # loose: the exact mean field is within a few % of N = 1000 (both the O(1/N) bias and the short runs)
            sim = sims[(r["d"], r["lam"], r["service"])]
            assert abs(err) < max(0.05, 3 * float(sim["ET_ci_rel"])), r
            for k in (1, 2):
                e = r[f"relerr_s{k}"]
                if e:
                    assert abs(float(e)) < 0.1, (k, r)
    # For exponential service the published forms are the classic closed form: all three methods agree.
    for r in rows:
        if r["service"] == "exponential" and r["method"] != "simulation":
            ex = next(
                q for q in rows
                if q["method"] == "exact" and (q["d"], q["lam"], q["service"]) == (r["d"], r["lam"], r["service"])
            )
            assert float(r["ET"]) == pytest.approx(float(ex["ET"]), rel=1e-8)
    # ...and for the other services they are far off at lam = 0.9 (this is what the study shows).
    for r in rows:
        if r["service"] == "hyperexp2" and r["method"].startswith("published") and float(r["lam"]) == 0.9:
            assert float(r["relerr_ET"]) < -0.2


def test_verification_two_cases(tmp_path):
    compute, plot = _load("verification", "compute"), _load("verification", "plot")
    argv = ["--quick", "--out", str(tmp_path), "--lams", "0.8", "--services", "exponential", "erlang2"]
    compute.main(argv)
    plot.main(["--quick", "--out", str(tmp_path)])
    _verification_checks(tmp_path, {"exponential", "erlang2"}, {0.8})
    assert not (tmp_path / "finite_n.png").exists()
    # The finite-N check (d = 3, lam = 0.8, H2; N = 125 and 500), then the refined mean field against both.
    _load("verification", "finite_n").main(["--quick", "--out", str(tmp_path)])
    fin = json.loads((tmp_path / "finite_n.json").read_text())
    _check_metadata(fin["metadata"])
    assert [(r["d"], r["lam"], r["service"], r["N"]) for r in fin["rows"]] == [
        (3, 0.8, "hyperexp2", 125), (3, 0.8, "hyperexp2", 500)]
    for r in fin["rows"]:
        assert r["n_replications"] <= 8 and 0 < r["ET_ci"] < 0.05 * r["ET_sim"]
        # s_1 = lam at every N (work conservation): its N x gap is noise, inside a few N x half-widths
        assert abs(r["N_gap_s1"]) < 4 * r["N_gap_s1_ci"] + 1e-9, r
        assert abs(r["ET_sim"] / r["ET_mf"] - 1) < 0.1, r
    _load("verification", "refined").main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "refined.json").read_text())
    _check_metadata(data["metadata"])
    assert len(data["cases"]) == 2  # d = 2, lam = 0.8, two services
    for r in data["cases"]:
        # s_1 has no 1/N term (work conservation); deeper tails and E[T] grow at finite N
        assert abs(r["V1"]) < 1e-9 and r["V2"] > 0 and r["ET_refined"] > r["ET_mf"]
        assert abs(r["ET_err_refined"]) < max(0.05, 3 * r["ET_ci"] / r["ET_sim"]), r
    assert [r["N"] for r in data["finite_n"]] == [125, 500]
    for r in data["finite_n"]:
        assert abs(r["V1"]) < 1e-9 and r["N_relgap_ET_predicted"] > 0
    assert (tmp_path / "refined.md").read_text().count("\n| ") >= 4
    plot.main(["--quick", "--out", str(tmp_path)])  # now with the finite-N figure
    assert (tmp_path / "finite_n.png").stat().st_size > 0


@pytest.mark.slow
def test_verification_quick(tmp_path):
    compute, plot = _load("verification", "compute"), _load("verification", "plot")
    compute.main(["--quick", "--out", str(tmp_path)])
    plot.main(["--quick", "--out", str(tmp_path)])
    _verification_checks(tmp_path, set(compute.SERVICES), set(compute.QUICK["lams"]))


def test_mitzenmacher_quick(tmp_path):
    compute = _load("mitzenmacher_table", "compute")
    compute.main(["--quick", "--out", str(tmp_path)])
    for name in ("mitzenmacher.csv", "mitzenmacher.json", "table.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "mitzenmacher.json").read_text())
    _check_metadata(data["metadata"])
    rows = data["rows"]
    assert len(rows) == 18  # d in {2, 3, 5} x six arrival rates
    for r in rows:
        # the mean-field column is the closed form sum_{i>=1} lam^((d^i - d)/(d - 1))
        assert abs(r["mean_field"] - r["closed_form"]) <= 1e-10, r
        assert abs(r["published_formula"] - r["closed_form"]) <= 1e-10, r
    # the d = 2 prediction column to four decimals
    pred = {r["lam"]: r["mean_field"] for r in rows if r["d"] == 2}
    for lam, v in {0.5: 1.2657, 0.7: 1.6145, 0.8: 1.9474, 0.9: 2.6141, 0.95: 3.3830, 0.99: 5.4320}.items():
        assert pred[lam] == pytest.approx(v, abs=6e-5)
    # the refined mean field beside the stored simulations: its 1/n coefficient is positive and grows with lam
    _load("mitzenmacher_table", "refined").main(["--quick", "--out", str(tmp_path)])
    refined = json.loads((tmp_path / "refined.json").read_text())["rows"]
    assert len(refined) == 18
    for d in (2, 3, 5):
        cs = [r["coefficient"] for r in refined if r["d"] == d]
        assert all(c > 0 for c in cs) and cs == sorted(cs)
    simulated = [r for r in rows if "sim_100" in r]
    assert simulated
    for r in simulated:
        for n in (100, 500):
            # loose: finite n makes E[T] a little larger than the prediction; short runs
            assert abs(r[f"sim_{n}"] / r["mean_field"] - 1) < 0.1, (n, r)
            assert 0 < r[f"sim_{n}_ci"] < 0.1 * r[f"sim_{n}"]


@pytest.mark.slow
def test_retrial_quick(tmp_path):
    """The retrial study's smoke run: its vmapped sweeps obey the orbit balance, E[T] falls with theta and with the
    choice numbers, and the short N = 200 simulation lands near the mean field."""
    _load("retrial", "compute").main(["--quick", "--out", str(tmp_path)])
    _load("retrial", "plot").main(["--quick", "--out", str(tmp_path)])
    for name in ("retrial.csv", "simulation.csv", "retrial.json", "summary.md", "retrial.pdf", "retrial.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "retrial.json").read_text())
    _check_metadata(data["metadata"])
    for r in data["rows"]:
        rho, g1, g2 = r["lam"], r["lam"] ** r["d1"], r["lam"] ** r["d2"]
        assert r["orbit"] == pytest.approx(r["lam"] * g1 / (r["theta"] * (1 - g2)), rel=1e-9), r
        assert r["EQ"] == pytest.approx(r["orbit"] + rho, rel=1e-9)
    by_theta = sorted((r["theta"], r["ET"]) for r in data["rows"] if r["sweep"] == "theta")
    assert [e for _, e in by_theta] == sorted((e for _, e in by_theta), reverse=True)
    for s in data["simulation"]:
        assert abs(s["rel_diff"]) < 0.2 and s["ET_ci"] > 0


@pytest.mark.slow
def test_repair_quick(tmp_path):
    """The repairable-server study's smoke run: R.2 (the same repair capacity, aimed at the longest failed queue)
    beats R.1, A.2 beats A.1, and the short simulations land near the mean field."""
    code = _load("repair", "compute").main(["--quick", "--out", str(tmp_path)])
    _load("repair", "plot").main(["--quick", "--out", str(tmp_path)])
    for name in ("repair.csv", "validation.csv", "repair.json", "summary.md", "repair.pdf", "repair.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "repair.json").read_text())
    _check_metadata(data["metadata"])
    for lam in (0.3, 0.6):
        et = {(r["arrival"], r["repair"]): r["ET"] for r in data["rows"] if r["sweep"] == "lam" and r["lam"] == lam}
        assert et["A1", "R2"] < et["A1", "R1"] and et["A2", "R1"] < et["A1", "R1"] and et["A2", "R2"] < et["A2", "R1"]
    assert code == 0 and all(abs(c["rel_diff"]) < 0.2 for c in data["validation"])
    # R.3 over j: grouping the capacity in the large repairman helps (E[T] grows with j while the small ones are
    # saturated), and above j* = alpha/(alpha + beta) R.3 is R.1
    r3 = {r["value"]: r for r in data["rows"] if r["sweep"] == "j" and r["arrival"] == "A1"}
    assert r3[0.02]["ET"] < r3[0.05]["ET"] < r3[0.2]["ET"] and r3[0.2]["waiting"] == 0.0
    assert abs(r3[0.2]["availability"] - 1 / 1.1) < 1e-12  # beta / (alpha + beta), as R.1


@pytest.mark.parametrize("folder, script, producer", [
    ("repair", "plot", "repair/compute.py"),
    ("retrial", "plot", "retrial/compute.py"),
    ("verification", "refined", "verification/compute.py"),
    ("verification", "plot", "verification/compute.py"),
    ("mitzenmacher_table", "refined", "mitzenmacher_table/compute.py"),
    ("choice_numbers", "plot", "choice_numbers/compute.py"),
    ("repair_allocation", "plot", "repair_allocation/compute.py"),
    ("ph_fits", "plot", "ph_fits/compute.py"),
    ("refined", "plot", "refined/compute.py"),
])
def test_reading_scripts_say_which_script_writes_their_input(tmp_path, folder, script, producer):
    # Regression: run before their compute script, these stopped with a FileNotFoundError traceback.
    with pytest.raises(SystemExit) as e:
        _load(folder, script).main(["--quick", "--out", str(tmp_path)])
    assert str(e.value).endswith(f"run `python experiments/{producer} --quick --out {tmp_path}` first (it writes it)")


@pytest.mark.slow
def test_sizing_quick(tmp_path):
    """The sizing recipe's smoke run: for d = 1 and exponential service the largest arrival rate whose p99 meets the
    bound is the M/M/1 closed form 1 + ln(0.01)/10, and at every answer the mean-field p99 is the bound."""
    _load("sizing", "compute").main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "sizing.json").read_text())
    _check_metadata(data["metadata"])
    rows = data["rows"]
    assert [r["d"] for r in rows] == [1, 2] and (tmp_path / "sizing.csv").stat().st_size > 0
    for r in rows:
        assert abs(r["p99_mean_field"] - r["bound_p99"]) < 1e-8 and 0 < r["lam_max"] < 1 and r["dp99_dlam"] > 0
    assert rows[0]["lam_max"] == pytest.approx(1 + math.log(0.01) / 10, rel=1e-9)
    assert rows[1]["lam_max"] > rows[0]["lam_max"]  # two choices carry more load at the same tail latency


@pytest.mark.slow
def test_framework_bmap_quick(tmp_path):
    """The BMAP study's smoke run (d = 2, N = 50 and 200, short runs): it writes its tables; the limit and the
    paper's forms are as solved here, the refined E[T] lies above the limit (the phase's correlation) and the
    simulated one not significantly below it."""
    assert _load("framework", "bmap").main(["--quick", "--out", str(tmp_path)]) == 0
    for name in ("bmap.csv", "bmap_fit.csv", "bmap.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "bmap.json").read_text())
    _check_metadata(data["meta"])
    assert data["batch_rates"] == pytest.approx([0.45, 0.0, 0.125])
    forms = data["forms"]["2"]
    assert forms["ET_closed_form"] < 0.5 * forms["ET_limit"] and forms["ET_published_equations"] < 0.5 * forms["ET_limit"]
    for r in data["rows"]:
        assert r["ET_sim_ci"] > 0 and abs(r["throughput_sim"] / 0.825 - 1) < 0.1, r
        if r["arrivals"] == "bmap":
            # the quick runs are short (95 % intervals of +-20..90 %): the simulation is not significantly below
            assert r["ET_refined"] > r["ET_limit"] and r["ET_sim"] + r["ET_sim_ci"] > r["ET_limit"], r
    assert {f["arrivals"] for f in data["fits"]} == {"bmap", "poisson"}


def test_refined_exact_chain_with_one_choice_is_independent_mm1k_queues():
    """The refined study's exact chain with d = 1: N independent M/M/1/K queues, whose stationary law is the
    truncated geometric pi_k = rho^k (1 - rho)/(1 - rho^(K+1)); an accepted job finds k < K jobs with probability
    pi_k/(1 - pi_K) and stays an Erlang(k + 1) time."""
    from scipy.optimize import brentq
    from scipy.special import gammaincc

    compute = _load("refined", "compute")
    lam, K = 0.7, 3
    pi = lam ** np.arange(K + 1) * (1 - lam) / (1 - lam ** (K + 1))
    w = pi[:K] / (1 - pi[K])
    p99 = brentq(lambda t: w @ gammaincc(np.arange(1, K + 1), t) - 0.01, 0.0, 100.0, xtol=1e-13)
    for n in (2, 4):
        got = compute.exact_jsq(n, K, lam, 1)
        assert got["states"] == math.comb(n + K, K)
        assert got["EQ"] == pytest.approx(pi @ np.arange(K + 1), rel=1e-12)
        assert got["loss"] == pytest.approx(pi[K], rel=1e-12)
        assert got["p99"] == pytest.approx(p99, rel=1e-10)
        assert got["ET_accepted"] == pytest.approx(w @ np.arange(1, K + 1), rel=1e-12)


@pytest.mark.slow
def test_refined_quick(tmp_path):
    """The refined study's smoke run: the exact chain, mean field, orders 1 and 2 and short simulations; order 2 of
    E[T] lies nearer the exact value than order 1 at N = 10 (lam = 0.7, buffer 3), and order 1 moves the mean
    field towards the simulation at N = 10 (a gap of 10 to 30 %)."""
    assert _load("refined", "compute").main(["--quick", "--out", str(tmp_path)]) == 0
    _load("refined", "plot").main(["--quick", "--out", str(tmp_path)])
    for name in ("refined.csv", "exact.csv", "orders.csv", "refined.json", "p99_acceptance.json",
                 "p99_acceptance.md", "summary.md", "refined.pdf", "refined.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "refined.json").read_text())
    _check_metadata(data["metadata"])
    ex = {r["N"]: r for r in data["exact"]["rows"]}[10]
    assert abs(ex["ET_order2"] - ex["ET_exact"]) < abs(ex["ET_order1"] - ex["ET_exact"])
    for case in data["cases"]:
        got = {r["method"]: r for r in data["rows"] if r["case"] == case and r["N"] == 10}
        sim = got["simulation"]["ET"]
        assert abs(got["order1"]["ET"] - sim) < abs(got["mean_field"]["ET"] - sim)
        assert got["order2"]["p99"] is None and got["order2"]["missing"]
    assert [(r["case"], r["N"]) for r in data["acceptance"]] == [("repair_I", 50)]
