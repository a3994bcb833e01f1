"""`jsmkt sweep` and `jsmkt plot`, and the plotting helpers of sweep datasets (`jsmkt.plotting.plot_sweep`,
`plot_sweep_heatmap`).

The command's parsing and output are tested against a stand-in for `jsmkt.sweep` (`fake_sweep`: the dataset layout of
`jsmkt.sweep`, with the M/M/1 queue's closed forms as values, whatever d); the end-to-end runs call the real one on
tiny grids and compare with JSQ(d)'s closed form."""

import json
import math
import pathlib
import warnings

import numpy as np
import pytest

import jsmkt
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
JSQ = 'model = "jsq"\nlam = 0.5\nd = 2\n'
RESULTS = "successful unstable truncation_too_small"


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


class FakeInterrupt(KeyboardInterrupt):
    """What `jsmkt.sweep` raises on Ctrl-C (`SweepInterrupted`): a KeyboardInterrupt saying how to resume."""


def fake_sweep(spec, grid, *, metrics=("mean_sojourn_time",), grad=(), percentiles=(), chunk_size=None,
               devices=None, out=None, resume=True, client=None, progress=None, calls=None):
    """A dataset laid out as `jsmkt.sweep`'s, of the M/M/1 queue at each point (d ignored): E[T] = 1/(1 - lam),
    dE[T]/dlam = 1/(1 - lam)^2, P(wait) = lam, the sojourn time exponential of rate 1 - lam; lam >= 1 unstable."""
    import xarray as xr

    if calls is not None:
        calls.append(dict(spec=spec, grid=grid, metrics=metrics, grad=grad, percentiles=percentiles,
                          chunk_size=chunk_size, out=out, resume=resume, client=client, progress=progress))
    names = list(grid)
    shape = tuple(len(v) for v in grid.values())
    mesh = dict(zip(names, np.meshgrid(*[np.asarray(v) for v in grid.values()], indexing="ij"), strict=True))
    lam = np.broadcast_to(np.asarray(mesh.get("lam", spec.get("lam")), float), shape)
    ok = lam < 1
    nan = lambda a: np.where(ok, a, np.nan)  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        values = {"mean_sojourn_time": nan(1 / (1 - lam)), "prob_wait": nan(lam)}
        grads = {"mean_sojourn_time": {"lam": nan(1 / (1 - lam) ** 2)}, "prob_wait": {"lam": nan(np.ones(shape))}}
        for m in metrics:
            if m not in values:
                raise ValueError(f"metrics={m!r}: not a metric of model = 'jsq'\n(a second line)")
        data = {m: (names, values[m]) for m in metrics}
        for m in metrics if grad else ():
            data[f"{m}_grad"] = (names + ["wrt"], np.stack([grads[m].get(w, np.zeros(shape)) for w in grad], -1))
        if percentiles:
            ps = np.asarray(percentiles, float)
            data["sojourn_time_percentiles"] = (names + ["percentile"],
                                                nan(1 / (1 - lam))[..., None] * -np.log1p(-ps / 100))
    data["result"] = (names, np.where(ok, 0, 1).astype(np.int32),
                      {"flag_values": [0, 1, 2], "flag_meanings": RESULTS})
    data["K"] = (names, np.full(shape, 40, np.int32))
    coords = {n: np.asarray(v) for n, v in grid.items()} | ({"wrt": list(grad)} if grad else {}) | \
        ({"percentile": [float(p) for p in percentiles]} if percentiles else {})
    ds = xr.Dataset(data, coords=coords, attrs={"spec": "".join(f"{k} = {json.dumps(v)}\n" for k, v in spec.items()),
                                                "failed": int((~ok).sum()), "points": int(lam.size)})
    if out is not None:
        write(ds, out)
    return ds


def write(ds, path) -> None:
    """`ds` written to a .zarr store (zarr's warning about the string coordinate `wrt` under its format 3 left out)
    or a .nc file."""
    if str(path).endswith(".zarr"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The data type .* does not have a Zarr V3 specification")
            ds.to_zarr(path, mode="w", consolidated=False)
    else:
        ds.to_netcdf(path, engine="h5netcdf")


@pytest.fixture
def fake(monkeypatch):
    calls = []
    monkeypatch.setattr(jsmkt, "sweep", lambda *a, **k: fake_sweep(*a, **k, calls=calls), raising=False)
    return calls


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "jsq.toml"
    path.write_text(JSQ)
    return str(path)


def test_sweep_passes_the_options_and_prints_records(spec, fake, capsys):
    code, out, err = run(["sweep", spec, "--set", "d=3", "--grid", "lam=0.5:0.9:3", "--grid", "d=1,2",
                          "--metric", "mean_sojourn_time,prob_wait", "--metric", "prob_wait", "--grad", "lam",
                          "--percentiles", "50", "99", "--chunk-size", "4", "--no-progress", "--format", "json"],
                         capsys)
    assert code == 0, err
    (call,) = fake
    assert call["spec"] == {"model": "jsq", "lam": 0.5, "d": 3}  # --set applied to the TOML table
    assert call["grid"] == {"lam": [0.5, 0.7, 0.9], "d": [1, 2]}
    assert [type(v) for v in call["grid"]["d"]] == [int, int]  # integers stay integers: fixed choice numbers
    assert call["metrics"] == ("mean_sojourn_time", "prob_wait") and call["grad"] == ("lam",)
    assert call["percentiles"] == (50, 99) and call["chunk_size"] == 4 and call["progress"] is False
    assert call["out"] is None and call["resume"] is True and call["client"] is None
    res = json.loads(out)
    assert res["points"] == 6 and res["failed"] == 0 and res["grid"] == {"lam": 3, "d": 2}
    recs = res["results"]
    assert [(r["lam"], r["d"]) for r in recs] == [(lam, d) for lam in (0.5, 0.7, 0.9) for d in (1, 2)]
    for r in recs:  # M/M/1: E[T] = 1/(1 - lam), its sojourn time exponential of rate 1 - lam
        assert list(r) == ["lam", "d", "mean_sojourn_time", "prob_wait", "mean_sojourn_time_grad_lam",
                           "prob_wait_grad_lam", "sojourn_time_p50", "sojourn_time_p99", "K", "result"]
        assert r["mean_sojourn_time"] == pytest.approx(1 / (1 - r["lam"]), rel=1e-12)
        assert r["mean_sojourn_time_grad_lam"] == pytest.approx(1 / (1 - r["lam"]) ** 2, rel=1e-12)
        assert r["sojourn_time_p99"] == pytest.approx(math.log(100) / (1 - r["lam"]), rel=1e-12)
        assert r["sojourn_time_p50"] == pytest.approx(math.log(2) / (1 - r["lam"]), rel=1e-12)
        assert r["result"] == "successful" and r["K"] == 40


def test_sweep_table_shows_failed_points(spec, fake, capsys):
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5,1.25"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["lam", "mean_sojourn_time", "K", "result"]
    assert lines[1].split() == ["0.5", "2", "40", "successful"]
    assert lines[2].split() == ["1.25", "nan", "40", "unstable"]
    assert lines[3].startswith("jsmkt sweep: 2 points (2 lam), 1 failed (1 unstable) in ")
    assert len(lines) == 4 and err == ""


def test_sweep_out_prints_a_summary(spec, fake, tmp_path, capsys):
    path = str(tmp_path / "s.zarr")
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5,0.6", "--grid", "d=1,2,3", "--out", path,
                          "--no-resume"], capsys)
    assert code == 0, err
    assert fake[0]["out"] == path and fake[0]["resume"] is False
    assert out.startswith(f"jsmkt sweep: 6 points (2 lam x 3 d), 0 failed, wrote {path} in ")
    assert len(out.splitlines()) == 1
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5,1.5", "--out", path, "--format", "json"], capsys)
    res = json.loads(out)
    assert code == 0 and res["out"] == path and res["failed_by_result"] == {"unstable": 1} and "results" not in res


@pytest.mark.parametrize("args, message", [
    (["--grid", "lam=0.5,0.6", "--grid", "lam=0.7"], "--grid lam is given twice"),
    (["--grid", "lam=0.5,0.5"], "--grid lam has a value twice"),
    (["--grid", "lam=0.5", "--out", "s.txt"], "--out=s.txt: file type .txt is not supported"),
    (["--grid", "lam=0.5", "--out", "nowhere/s.zarr"], "does not exist"),
    (["--grid", "lam=0.5", "--chunk-size", "0"], "--chunk-size=0 must be >= 1"),
    (["--grid", "lam=0.5", "--cpu-devices", "0"], "--cpu-devices=0 must be >= 1"),
    (["--grid", "lam=0.5", "--metric", "nope"], "--metric='nope': not a metric of model = 'jsq'"),
    (["--grid", "lam=0.5", "--metric", "a,,b"], "--metric 'a,,b' has an empty name"),
    (["--grid", "lam=0.5", "--set", "lam=-1"], "lam=-1 must be positive"),
])
def test_sweep_errors_are_one_line(spec, fake, capsys, args, message):
    code, out, err = run(["sweep", spec, *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith("jsmkt: error: ") and message in err and len(err.splitlines()) == 1, err


def test_sweep_needs_a_grid_and_reads_it(spec, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", spec])
    assert e.value.code == 2 and "--grid" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", spec, "--grid", "lam=0.5:0.9:0"])
    assert "NUM='0' in '0.5:0.9:0' must be a positive integer" in capsys.readouterr().err


def test_sweep_interrupted_says_how_to_resume(spec, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise FakeInterrupt("3 of 8 chunks written to s.zarr; run the same command again to resume")

    monkeypatch.setattr(jsmkt, "sweep", interrupted, raising=False)
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5,0.6"], capsys)
    assert code == 130 and out == ""
    assert err == "jsmkt: interrupted: 3 of 8 chunks written to s.zarr; run the same command again to resume\n"


def test_sweep_scheduler_connects_and_closes(spec, fake, monkeypatch, capsys):
    import distributed

    clients = []

    class Client:
        def __init__(self, address):
            self.address, self.closed = address, False
            clients.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(distributed, "Client", Client)
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5", "--scheduler", "tcp://10.0.0.5:8786"], capsys)
    assert code == 0, err
    (client,) = clients
    assert fake[0]["client"] is client and client.address == "tcp://10.0.0.5:8786" and client.closed


# --- jsmkt plot and the plotting helpers -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset():
    """lam x d x service.scv, lam = 1.2 unstable (NaN), with percentiles and derivatives."""
    return fake_sweep({"model": "jsq-ph", "lam": 0.5}, {"lam": [0.3, 0.6, 0.9, 1.2], "d": [1, 2, 3],
                                                        "service.scv": [1.0, 4.0]},
                      metrics=("mean_sojourn_time", "prob_wait"), grad=("lam",), percentiles=(99,))


def test_plot_sweep_lines_labels_and_gaps(dataset):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jsmkt.plotting import plot_sweep

    fig, ax = plt.subplots()
    try:
        assert plot_sweep(dataset, "lam", "mean_sojourn_time", hue="d", ax=ax, **{"service.scv": 4}) is ax
        assert len(ax.lines) == 3 and ax.get_legend().get_title().get_text() == "choice number $d$"
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1", "2", "3"]
        assert "arrival rate per server" in ax.get_xlabel() and ax.get_ylabel() == "mean sojourn time E[T]"
        assert ax.get_title() == "service.scv = 4"
        y = ax.lines[0].get_ydata()
        np.testing.assert_allclose(y[:3], 1 / (1 - np.array([0.3, 0.6, 0.9])), rtol=1e-12)
        assert np.isnan(y[3])  # the unstable point is a gap
        ax.clear()
        plot_sweep(dataset, "d", "p99", ax=ax, lam=0.6, **{"service.scv": 1.0})
        assert ax.get_ylabel() == "sojourn time p99" and list(ax.get_xticks()) == [1, 2, 3]
        np.testing.assert_allclose(ax.lines[0].get_ydata(), [math.log(100) / 0.4] * 3, rtol=1e-12)
        ax.clear()
        plot_sweep(dataset, "lam", "mean_sojourn_time_grad_lam", ax=ax, d=2, **{"service.scv": 1.0})
        assert "partial" in ax.get_ylabel()
        np.testing.assert_allclose(ax.lines[0].get_ydata()[:3], 1 / (1 - np.array([0.3, 0.6, 0.9])) ** 2, rtol=1e-12)
        with pytest.raises(ValueError, match=r"also varies along d \(3 values: 1, 2, 3\); service.scv "
                                             r"\(2 values: 1, 4\): fix each with d=1 or draw one line per value"):
            plot_sweep(dataset, "lam", "mean_sojourn_time", ax=ax)
        with pytest.raises(ValueError, match=r"d=5: d has no such value; its values: 1, 2, 3"):
            plot_sweep(dataset, "lam", "mean_sojourn_time", ax=ax, d=5, **{"service.scv": 1.0})
        with pytest.raises(ValueError, match=r"y='sojourn_p50'.* p99, not p50"):
            plot_sweep(dataset, "lam", "sojourn_p50", ax=ax, d=2, **{"service.scv": 1.0})
        with pytest.raises(ValueError, match=r"y='nope' is not a variable of the sweep: give one of "
                                             r"mean_sojourn_time, prob_wait, K, sojourn_time_p99, "
                                             r"mean_sojourn_time_grad_lam, prob_wait_grad_lam$"):
            plot_sweep(dataset, "lam", "nope", ax=ax)
        with pytest.raises(ValueError, match=r"'mu' is not an axis of the sweep: its axes are lam, d, service.scv"):
            plot_sweep(dataset, "mu", "prob_wait", ax=ax)
    finally:
        plt.close(fig)


def test_plot_sweep_heatmap_blank_cells(dataset):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jsmkt.plotting import plot_sweep_heatmap

    fig, ax = plt.subplots()
    try:
        assert plot_sweep_heatmap(dataset, "lam", "d", "mean_sojourn_time", ax=ax, **{"service.scv": 1.0}) is ax
        (mesh,) = ax.collections
        z = mesh.get_array()
        assert z.shape == (3, 4) and np.ma.is_masked(z) and z.mask[:, 3].all() and not z.mask[:, :3].any()
        np.testing.assert_allclose(z[0, :3], 1 / (1 - np.array([0.3, 0.6, 0.9])), rtol=1e-12)
        assert ax.get_ylabel() == "choice number $d$" and list(ax.get_yticks()) == [1, 2, 3]
        assert fig.axes[1].get_ylabel() == "mean sojourn time E[T]"  # the colour bar
    finally:
        plt.close(fig)


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_plot_command_writes_the_file(dataset, tmp_path, capsys, suffix):
    if suffix == ".nc":
        pytest.importorskip("h5py")  # h5netcdf's HDF5 library
    data = str(tmp_path / f"sweep{suffix}")
    write(dataset, data)
    png = tmp_path / "lines.png"
    code, out, err = run(["plot", data, "--x", "lam", "--y", "mean_sojourn_time", "--hue", "d", "--sel",
                          "service.scv=4", "--out", str(png)], capsys)
    assert code == 0, err
    assert out == f"wrote {png}\n" and png.stat().st_size > 0
    code, out, err = run(["plot", data, "--heatmap", "sojourn_time_p99", "--x", "lam", "--y", "service.scv", "--sel",
                          "d=2", "--log"], capsys)
    default = tmp_path / "sweep-sojourn_time_p99.png"
    assert code == 0 and out == f"wrote {default}\n" and default.stat().st_size > 0, err


@pytest.mark.parametrize("args, message", [
    (["--y", "mean_sojourn_time", "--hue", "d"],
     "mean_sojourn_time also varies along service.scv (2 values: 1, 4): fix it with --sel service.scv=1 or draw "
     "one line per value with --hue service.scv"),
    (["--y", "mean_sojourn_time", "--sel", "d=2", "--sel", "service.scv=2"],
     "--sel service.scv=2: service.scv has no such value; its values: 1, 4"),
    (["--y", "mean_sojourn_time", "--sel", "d=2", "--sel", "scv=1"],
     "--sel scv=1: 'scv' is not an axis of the sweep (its axes: lam, d, service.scv)"),
    (["--y", "waiting_p99", "--sel", "d=2", "--sel", "service.scv=1"],
     "--y 'waiting_p99': the sweep has no waiting-time percentiles"),
    (["--heatmap", "prob_wait", "--hue", "d"], "--hue draws lines"),
    (["--heatmap", "nope", "--x", "lam", "--y", "d", "--sel", "service.scv=1"],
     "--heatmap 'nope' is not a variable of the sweep: give one of mean_sojourn_time, prob_wait, K, sojourn_time_p99, "
     "mean_sojourn_time_grad_lam, prob_wait_grad_lam\n"),
    (["--heatmap", "prob_wait", "--x", "lam", "--y", "d"],
     "prob_wait also varies along service.scv (2 values: 1, 4): fix it with --sel service.scv=1"),
    (["--x", "lam"], "give --y NAME"),
    (["--y", "prob_wait", "--out", "p.txt"], "--out=p.txt: file type .txt is not supported"),
])
def test_plot_command_errors(dataset, tmp_path, capsys, args, message):
    data = str(tmp_path / "sweep.zarr")
    write(dataset, data)
    code, out, err = run(["plot", data, *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith("jsmkt: error: ") and message in err and len(err.splitlines()) == 1, err


def test_plot_command_refuses_other_files(tmp_path, capsys):
    code, _, err = run(["plot", str(tmp_path / "missing.zarr"), "--y", "prob_wait"], capsys)
    assert code == 2 and "missing.zarr does not exist" in err
    code, _, err = run(["plot", str(tmp_path / "table.csv"), "--y", "prob_wait"], capsys)
    assert code == 2 and "give a sweep written by jsmkt sweep --out as .zarr or .nc" in err


# --- end to end, with jsmkt.sweep ----------------------------------------------------------------------------------

E2E_GRID = ["--grid", "lam=0.5,0.7,0.9,1.1", "--grid", "d=2,3", "--grad", "lam", "--percentiles", "99",
            "--no-progress"]


def _jsq_mean_sojourn_time(lam: float, d: int) -> tuple[float, float]:
    """JSQ(d), exponential service of rate 1 (Mitzenmacher; Vvedenskaya et al.): E[T] = sum_{k>=1} lam^e_k with
    e_k = (d^k - d)/(d - 1), and its derivative in lam, sum_k e_k lam^(e_k - 1)."""
    e = np.array([(d**k - d) // (d - 1) for k in range(1, 40)], dtype=float)
    return float(np.sum(lam**e)), float(np.sum(e[1:] * lam ** (e[1:] - 1)))


def test_sweep_end_to_end_matches_the_closed_form(spec, capsys):
    code, out, err = run(["sweep", spec, *E2E_GRID, "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["points"] == 8 and res["failed"] == 2 and res["failed_by_result"] == {"unstable": 2}
    for r in res["results"]:
        if r["lam"] > 1:  # unstable: null (NaN) values, flagged
            assert r["result"] == "unstable" and r["mean_sojourn_time"] is None
            assert r["mean_sojourn_time_grad_lam"] is None
            continue
        ET, dET = _jsq_mean_sojourn_time(r["lam"], r["d"])
        assert r["result"] == "successful" and isinstance(r["K"], int)
        assert r["mean_sojourn_time"] == pytest.approx(ET, rel=1e-10)
        assert r["mean_sojourn_time_grad_lam"] == pytest.approx(dET, rel=1e-7)
        assert r["waiting_time_p99"] < r["sojourn_time_p99"] and r["mean_sojourn_time"] < r["sojourn_time_p99"]


def test_sweep_end_to_end_store_and_plot(spec, tmp_path, capsys):
    import xarray as xr

    store = str(tmp_path / "sweep.zarr")
    code, out, err = run(["sweep", spec, *E2E_GRID, "--out", store], capsys)
    assert code == 0 and out.startswith(f"jsmkt sweep: 8 points (4 lam x 2 d), 2 failed (2 unstable), wrote {store}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's notes on its format
        ds = xr.open_zarr(store).load()
    ET = ds["mean_sojourn_time"].sel(d=3).values
    np.testing.assert_allclose(ET[:3], [_jsq_mean_sojourn_time(lam, 3)[0] for lam in (0.5, 0.7, 0.9)], rtol=1e-10)
    assert np.isnan(ET[3])
    png = tmp_path / "et.png"
    code, out, err = run(["plot", store, "--x", "lam", "--y", "mean_sojourn_time", "--hue", "d", "--out", str(png)],
                         capsys)
    assert code == 0 and out == f"wrote {png}\n" and png.stat().st_size > 0, err


@pytest.mark.parametrize("args, message", [
    (["--grid", "foo=1"], "--grid foo=1: 'foo' is not a key of model = 'jsq'"),
    (["--grid", "lam=0.5,-1"], "--grid lam=-1: lam=-1 must be positive"),
    (["--grid", "lam=0.5", "--metric", "nope"], "--metric: 'nope' is not a metric of model = 'jsq'"),
    (["--grid", "d=1,2", "--grad", "d"], "--grad: d is a grid axis whose values change the model's structure"),
])
def test_sweep_errors_name_the_options(spec, capsys, args, message):
    """jsmkt.sweep's refusals, before anything is solved, in the options' names."""
    code, out, err = run(["sweep", spec, *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"jsmkt: error: {message}") and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_sigint_stops_the_sweep_and_the_same_command_resumes(spec, tmp_path):
    """A real Ctrl-C (SIGINT) during `jsmkt sweep --out S.zarr`: one line saying how to resume and exit code 130;
    the same command then finishes the store, whose values are JSQ(d)'s closed form."""
    import signal
    import subprocess
    import sys
    import time

    import xarray as xr

    store = tmp_path / "s.zarr"
    argv = ["sweep", spec, "--grid", "lam=0.5:0.9:30", "--grid", "d=2,3,4,5", "--chunk-size", "10", "--out",
            str(store), "--no-progress"]
    # SIGINT's handler as a shell starts the command with it (a test runner's worker may ignore SIGINT)
    code = "import signal, jsmkt.cli\nsignal.signal(signal.SIGINT, signal.default_int_handler)\njsmkt.cli.run()\n"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not (store / "result").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and out == "", err
    assert err.startswith("jsmkt: interrupted: ") and len(err.splitlines()) == 1 and "resume" in err, err
    assert main(argv) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(store).load()
    for d in (2, 3, 4, 5):
        expected = [_jsq_mean_sojourn_time(lam, d)[0] for lam in ds["lam"].values]
        np.testing.assert_allclose(ds["mean_sojourn_time"].sel(d=d).values, expected, rtol=1e-10)
    assert np.all(ds["result"].values == 0)


def test_sweep_acceptance_grid(spec, tmp_path, capsys):
    """The issue's grid: lam = 0.5:0.95:2000 (both ends) x d in {2, 3}, JSQ(d) with exponential service, into a
    store: E[T] equals the closed form to 1e-9, dE[T]/dlam its derivative to 1e-6, p99 exceeds the mean."""
    import xarray as xr

    store = str(tmp_path / "acceptance.zarr")
    code, out, err = run(["sweep", spec, "--grid", "lam=0.5:0.95:2000", "--grid", "d=2,3", "--metric",
                          "mean_sojourn_time", "--grad", "lam", "--percentiles", "99", "--out", store,
                          "--no-progress"], capsys)
    assert code == 0, err
    ds = xr.open_zarr(store).load()
    assert ds.sizes["lam"] == 2000 and ds.lam.values[0] == 0.5 and ds.lam.values[-1] == 0.95
    assert (ds.result.values == 0).all()
    for d in (2, 3):
        exact = np.array([_jsq_mean_sojourn_time(lam, d) for lam in ds.lam.values])
        sel = ds.sel(d=d)
        np.testing.assert_allclose(sel.mean_sojourn_time.values, exact[:, 0], rtol=1e-9, atol=0)
        np.testing.assert_allclose(sel.mean_sojourn_time_grad.sel(wrt="lam").values, exact[:, 1], rtol=1e-6, atol=0)
        assert (sel.sojourn_time_percentiles.sel(percentile=99.0) > sel.mean_sojourn_time).all()
