"""The C reference loop of `benchmarks/simulate.py` (`benchmarks/reference/jsqd_h2.c`) simulates the stated system.

The benchmark quotes it as the native speed of jsmkt's algorithm, so it has to be that system: its mean queue length
and sojourn time must agree with jsmkt's exact mean field at N = 1000 (within 0.5 % there, see
`experiments/verification/`) and with Little's law. Skipped where no C compiler is installed."""

import pathlib
import shutil
import subprocess

import pytest

import jsmkt


ROOT = pathlib.Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("ref") / "jsqd_h2"
    src = ROOT / "benchmarks" / "reference" / "jsqd_h2.c"
    subprocess.run([CC, "-O2", "-o", str(exe), str(src), "-lm"], check=True)
    return exe


def run(exe, *args):
    out = subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True, text=True).stdout.split()
    events, _, queue, sojourn, overflow = out
    return int(events), float(queue), float(sojourn), int(overflow)


@pytest.mark.parametrize("select", ["uniform", "exact", "fcfs"])
def test_c_reference_matches_the_mean_field(reference, select):
    lam, scv = 0.9, 4.0
    model = jsmkt.JSQdPH(lam, jsmkt.hyperexponential2(1.0, scv), d=2)
    state = jsmkt.solve_fixed_point(model)
    exact_t = float(jsmkt.mean_sojourn_time(model, state))  # 4.163
    t_end, warmup = 6000.0, 300.0
    queues, sojourns = [], []
    for seed in range(4):
        events, queue, sojourn, overflow = run(reference, 1000, lam, 2, scv, t_end, warmup, seed, 55, select)
        assert overflow == 0
        # Uniformisation at rate N (lam + qbar), qbar = 2 p1 = 1.775: events counted with self-loops. Without
        # them (exact selection, completion times at arrival), arrivals and departures only: 2 N lam per unit time.
        rate = lam + 1.7745966692414834 if select == "uniform" else 2 * lam
        assert events == pytest.approx(1000 * rate * t_end, rel=0.01)
        queues.append(queue)
        sojourns.append(sojourn)
    mean_t = sum(sojourns) / len(sojourns)
    mean_q = sum(queues) / len(queues)
    # Four runs of 5700 time units: a standard error of about 0.5 %; the N = 1000 gap is below 0.5 %.
    assert mean_t == pytest.approx(exact_t, rel=0.025)
    assert mean_q == pytest.approx(lam * mean_t, rel=0.01)  # Little's law


def test_c_reference_rejects_bad_arguments(reference):
    res = subprocess.run([str(reference), "1000", "0.9"], capture_output=True, text=True)
    assert res.returncode == 2 and "usage" in res.stderr
    res = subprocess.run([str(reference), "1000", "0.9", "2", "0.5", "100", "10", "1", "55"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "bad arguments" in res.stderr and "SCV=0.5" in res.stderr
    res = subprocess.run([str(reference), "1000", "0.9", "2", "4", "100", "10", "1", "55", "fast"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "SELECT must be uniform, exact or fcfs" in res.stderr and "SELECT=fast" in res.stderr


@pytest.mark.parametrize("script, args, option", [
    ("simulate.py", ["--time", "0"], "--time: 0"),
    ("simulate.py", ["--replications", "1", "-2"], "--replications: -2"),
    ("block_size.py", ["--repeats", "0"], "--repeats: 0"),
    ("replications.py", ["--replications", "0"], "--replications: 0"),
])
def test_benchmark_scripts_reject_bad_arguments(script, args, option):
    """The benchmark scripts refuse non-positive counts and times, naming the option and the value."""
    import sys

    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True)
    assert res.returncode == 2 and f"argument {option} must be > 0" in res.stderr, res.stderr
