"""`jsmkt.sweep`: values against closed forms and against points solved one by one, failed points, devices, a Dask
cluster, a killed run resumed, exports and errors.

The grids are small: each new model structure compiles its batched solve once per module (and each subprocess pays
JAX's start-up), so the tests share the JSQ(2)/JSQ(3) exponential and JSQ(2)-H2 shapes."""

import json
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import jsmkt
from jsmkt import _spec, _sweep


JSQ = {"model": "jsq", "lam": 0.9, "d": 2}
H2 = {"model": "jsq-ph", "lam": 0.8, "d": 2, "service": {"kind": "h2", "mean": 1.0, "scv": 4.0}}
H2_GRID = {"lam": [0.5, 0.8, 0.95, 1.05], "service.scv": [1.0, 4.0], "d": [2]}
REPO = pathlib.Path(__file__).resolve().parents[1]


def mean_sojourn_jsq(lam, d):
    """E[T] of JSQ(d) with exponential service of rate 1 (Mitzenmacher; Vvedenskaya et al.): the tails are
    s_k = lam^((d^k - 1)/(d - 1)) and E[T] = sum_{k>=1} s_k / lam; for d = 1, 1/(1 - lam). With its derivative."""
    lam = np.asarray(lam, dtype=float)[:, None]
    if d == 1:
        return (1 / (1 - lam) ** np.array([1, 2])).T
    e = (float(d) ** np.arange(1, 40) - d) / (d - 1)
    terms = np.where(e <= 1e6, lam ** np.minimum(e, 1e6), 0.0)
    return np.stack([terms.sum(axis=1), (e * np.where(e <= 1e6, lam ** np.maximum(np.minimum(e, 1e6) - 1, 0), 0.0)
                                          ).sum(axis=1)])


@pytest.fixture(scope="module")
def jsq_sweep():
    """The issue's grid: lam = 0.5:0.95:2000 (both ends) x d in {2, 3}, E[T] and its derivative in lam."""
    return jsmkt.sweep(JSQ, {"lam": np.linspace(0.5, 0.95, 2000), "d": [2, 3]}, metrics=["mean_sojourn_time"],
                       grad=["lam"])


def test_closed_form(jsq_sweep):
    ds = jsq_sweep
    assert ds.mean_sojourn_time.dims == ("lam", "d") and ds.sizes == {"lam": 2000, "d": 2, "wrt": 1}
    assert ds.lam.values[0] == 0.5 and ds.lam.values[-1] == 0.95
    for d in (2, 3):
        ET, dET = mean_sojourn_jsq(ds.lam.values, d)
        got = ds.mean_sojourn_time.sel(d=d).values
        assert np.max(np.abs(got - ET) / ET) < 1e-9
        g = ds.mean_sojourn_time_grad.sel(d=d, wrt="lam").values
        assert np.max(np.abs(g - dET) / dET) < 1e-6
    assert (ds.result.values == 0).all() and ds.attrs["failed"] == 0 and ds.attrs["points"] == 4000
    assert ds.result.attrs["flag_meanings"].split()[ds.result.attrs["flag_values"].index(0)] == "successful"
    for key in ("spec", "jsmkt_version", "jax_version", "devices", "date"):
        assert ds.attrs[key]


def test_percentiles_exceed_the_mean():
    """p99 of the sojourn time above its mean, and for d = 1 the M/M/1 law: P(T > t) = exp(-(1 - lam) t), so
    p99 = ln(100)/(1 - lam); the waiting time's p99: P(W > t) = lam exp(-(1 - lam) t). At lam = 0.98 the law's
    tail outlasts the first uniformisation steps tried (a law with too few is NaN, `throw=False`), and the sweep
    takes more."""
    lam = np.array([0.5, 0.65, 0.8, 0.9, 0.95, 0.98])
    ds = jsmkt.sweep(JSQ, {"lam": lam, "d": [1, 2]}, metrics=["mean_sojourn_time"], percentiles=[50, 99],
                     tail_tol=1e-13)
    p99 = ds.sojourn_time_percentiles.sel(percentile=99.0)
    assert (p99 > ds.mean_sojourn_time).all()
    np.testing.assert_allclose(p99.sel(d=1).values, np.log(100) / (1 - lam), rtol=1e-8)
    np.testing.assert_allclose(ds.waiting_time_percentiles.sel(d=1, percentile=99.0).values,
                               np.log(100 * lam) / (1 - lam), rtol=1e-8)
    np.testing.assert_allclose(ds.mean_sojourn_time.sel(d=1).values, 1 / (1 - lam), rtol=1e-9)
    model = jsmkt.JSQd(0.98, d=1, K=int(ds.K.sel(lam=0.98, d=1)))
    fp = jsmkt.solve_fixed_point(model, tail_tol=1e-13)
    assert np.isnan(float(jsmkt.sojourn_time_distribution(model, fp, max_terms=1024, throw=False).quantile(0.99)))
    with pytest.raises(ValueError, match="outlasts max_terms=1024"):
        jsmkt.sojourn_time_distribution(model, fp, max_terms=1024)


def test_points_solved_one_by_one_and_failed_points():
    """Traced axes (lam, the h2 service's SCV) give the values of each point's model built from its spec and solved
    alone; unstable points are NaN in every variable and flagged, and the sweep finishes."""
    ds = jsmkt.sweep(H2, H2_GRID, metrics=["mean_sojourn_time", "prob_wait"], grad=["lam", "service.scv"])
    unstable = int(jsmkt.RESULTS.unstable._value)
    assert (ds.result.sel(lam=1.05).values == unstable).all()
    assert ds.attrs["failed"] == 2
    for name in ("mean_sojourn_time", "prob_wait", "mean_sojourn_time_grad", "prob_wait_grad"):
        assert np.isnan(ds[name].sel(lam=1.05).values).all()
        assert np.isfinite(ds[name].sel(lam=[0.5, 0.8, 0.95]).values).all()
    for lam in (0.5, 0.95):
        for scv in (1.0, 4.0):
            model = jsmkt.loads_spec('model = "jsq-ph"\nd = 2\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n',
                                     overrides={"lam": lam, "service.scv": scv})
            fp = jsmkt.solve_fixed_point(model, auto_K=True)
            got = ds.sel(lam=lam, **{"service.scv": scv}, d=2)
            assert float(got.mean_sojourn_time) == pytest.approx(float(jsmkt.mean_sojourn_time(model, fp)), rel=1e-9)
            assert float(got.prob_wait) == pytest.approx(float(jsmkt.prob_wait(model, fp)), rel=1e-9)
    # The derivative in the SCV against a central difference of the closed values.
    h = 1e-4
    Ts = []
    for scv in (4.0 - h, 4.0 + h):
        model = jsmkt.JSQdPH(0.8, jsmkt.hyperexponential2(1.0, scv), d=2, K=64)
        Ts.append(float(jsmkt.mean_sojourn_time(model, jsmkt.solve_fixed_point(model))))
    g = float(ds.mean_sojourn_time_grad.sel(lam=0.8, **{"service.scv": 4.0}, d=2, wrt="service.scv"))
    assert g == pytest.approx((Ts[1] - Ts[0]) / (2 * h), rel=1e-6)


def test_family_metric_and_built_axis():
    """A family's own metric (the retrial orbit) over a built axis (the retrial policy's words) and a traced one."""
    spec = _spec.read_spec_file(str(REPO / "examples" / "retrial_reprobe.toml"))
    ds = jsmkt.sweep(spec, {"theta": [0.5, 2.0]}, metrics=["mean_orbit_size", "mean_sojourn_time"])
    for theta in (0.5, 2.0):
        model = jsmkt.loads_spec((REPO / "examples" / "retrial_reprobe.toml").read_text(), overrides={"theta": theta})
        fp = jsmkt.solve_fixed_point(model, auto_K=True)
        assert float(ds.mean_orbit_size.sel(theta=theta)) == pytest.approx(float(jsmkt.mean_orbit_size(model, fp)),
                                                                          rel=1e-9)


_FOUR_DEVICES = r"""
import os, sys
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
import json, jsmkt, jax
assert len(jax.devices()) == 4, jax.devices()
spec, grid = json.loads(sys.argv[1])
ds = jsmkt.sweep(spec, grid, metrics=["mean_sojourn_time", "prob_wait"], grad=["lam", "service.scv"], chunk_size=5)
ds.to_netcdf(sys.argv[2], engine="h5netcdf")
"""


def _same(a, b, rtol=1e-12):
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert np.array_equal(np.isnan(x), np.isnan(y)) if x.dtype.kind == "f" else np.array_equal(x, y), name
        if x.dtype.kind == "f":
            ok = np.isfinite(x)
            assert np.all(np.abs(x[ok] - y[ok]) <= rtol * np.maximum(np.abs(x[ok]), 1e-300)), name


def test_four_cpu_devices_match_one(tmp_path):
    import xarray as xr

    one = jsmkt.sweep(H2, H2_GRID, metrics=["mean_sojourn_time", "prob_wait"], grad=["lam", "service.scv"])
    path = tmp_path / "four.nc"
    proc = subprocess.run([sys.executable, "-c", _FOUR_DEVICES, json.dumps([H2, H2_GRID]), str(path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    four = xr.open_dataset(path, engine="h5netcdf").load()
    assert "cpu:3" in four.attrs["devices"].lower() or "id=3" in four.attrs["devices"]
    _same(one, four)


_SLOW_WRITES = r"""
import sys, time, json
import jsmkt, jsmkt._sweep as s
write = s._write_region
def slow(*args):
    write(*args)
    print("written", flush=True)
    time.sleep(float(sys.argv[3]))
s._write_region = slow
spec, grid = json.loads(sys.argv[1])
jsmkt.sweep(spec, grid, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=4, out=sys.argv[2])
"""
_KILL_GRID = {"lam": list(np.linspace(0.5, 0.95, 24)), "d": [2]}


def _points_done(path) -> int:
    import zarr

    return int(np.sum(np.asarray(zarr.open_group(str(path), mode="r")["result"][...]) != -1))


def _run_until(path, chunks, sig):
    """Run the sweep of `_KILL_GRID` in a subprocess whose chunk writes pause 2 s each; after `chunks` chunks are
    written, send it `sig`; give its stderr."""
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITES, json.dumps([JSQ, _KILL_GRID]), str(path), "2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(chunks):
        assert proc.stdout.readline().strip() == "written", proc.communicate()[1][-2000:]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_killed_sweep_resumes(tmp_path):
    """kill -9 in the middle, then the same call: the store's variables equal an uninterrupted run's."""
    import xarray as xr

    store = tmp_path / "killed.zarr"
    code, err = _run_until(store, 2, signal.SIGKILL)
    assert code == -signal.SIGKILL and _points_done(store) == 8, err[-2000:]
    # Resumed with another chunk size (as another number of devices would give): the store keeps its chunks.
    resumed = jsmkt.sweep(JSQ, _KILL_GRID, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=6, out=store)
    whole = jsmkt.sweep(JSQ, _KILL_GRID, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=4)
    stored = xr.open_zarr(store).load()
    for ds in (resumed, stored):
        assert set(ds.data_vars) == set(whole.data_vars)
        for name in whole.data_vars:
            np.testing.assert_array_equal(ds[name].values, whole[name].values)


def test_interrupted_sweep_says_how_to_resume(tmp_path):
    """Ctrl-C: the chunk in flight is written, then the sweep stops saying how to resume."""
    store = tmp_path / "interrupted.zarr"
    code, err = _run_until(store, 1, signal.SIGINT)
    assert code != 0
    assert "SweepInterrupted" in err and "run the same sweep again to resume" in err, err[-2000:]
    assert _points_done(store) == 4  # the chunk in flight, whole


def test_dask_local_cluster_matches_in_process(tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = {"lam": [0.5, 0.7, 0.9, 0.99], "d": [2, 3]}
    here = jsmkt.sweep(JSQ, grid, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            distributed.Client(cl) as client:
        there = jsmkt.sweep(JSQ, grid, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=2, client=client)
        stored = jsmkt.sweep(JSQ, grid, metrics=["mean_sojourn_time"], grad=["lam"], chunk_size=2, client=client,
                             out=tmp_path / "cluster.zarr")
    _same(here, there)
    _same(here, stored)


def test_exports(jsq_sweep, tmp_path):
    import pandas as pd
    import xarray as xr

    small = jsq_sweep.isel(lam=slice(0, 3))
    for suffix in (".nc", ".parquet", ".csv"):
        _sweep.export(small, tmp_path / f"s{suffix}")
    back = xr.open_dataset(tmp_path / "s.nc", engine="h5netcdf").load()
    np.testing.assert_array_equal(back.mean_sojourn_time.values, small.mean_sojourn_time.values)
    table = pd.read_parquet(tmp_path / "s.parquet")
    assert list(table.columns[:2]) == ["lam", "d"] and len(table) == 6
    assert "mean_sojourn_time_grad_lam" in table.columns
    csv = pd.read_csv(tmp_path / "s.csv")
    np.testing.assert_allclose(csv.mean_sojourn_time.values, table.mean_sojourn_time.values, rtol=1e-15)


@pytest.mark.parametrize("kwargs, message", [
    ({"grid": {"nope": [1.0]}}, "nope"),
    ({"grid": {"lam": []}}, "no values"),
    ({"grid": {"lam": [-0.5]}}, "lam"),
    ({"grid": {"K": [10]}}, "chooses K"),
    ({"grid": {"lam": [0.5]}, "metrics": ["mean_orbit_size"]}, "mean_orbit_size"),
    ({"grid": {"lam": [0.5], "d": [2, 3]}, "grad": ["d"]}, "real numbers"),
    ({"grid": {"lam": [0.5]}, "out": "x.txt"}, ".zarr"),
    ({"grid": {"lam": [0.5]}, "percentiles": [100]}, "percentile"),
    ({"grid": {"lam": [0.5]}, "max_K": 1}, "max_K=1 must be an integer >= 2"),
    ({"grid": {"lam": [0.5]}, "tail_tol": 2.0}, "tail_tol=2.0"),
    ({"grid": {"lam": [0.5]}, "resume": "yes"}, "resume='yes'"),
    ({"grid": {"lam": [0.5]}, "chunk_size": 0}, "chunk_size=0"),
])
def test_errors_name_the_argument(kwargs, message):
    grid = kwargs.pop("grid")
    with pytest.raises(ValueError, match=message):
        jsmkt.sweep(JSQ, grid, **kwargs)


def test_scv_out_of_range_is_the_spec_error():
    with pytest.raises(ValueError, match=r"scv=0\.5.*>= 1"):
        jsmkt.sweep(H2, {"service.scv": [0.5, 2.0]})


def test_store_of_another_sweep_is_refused(tmp_path):
    store = tmp_path / "a.zarr"
    jsmkt.sweep(JSQ, {"lam": [0.5, 0.6]}, out=store)
    with pytest.raises(ValueError, match="another sweep"):
        jsmkt.sweep(JSQ, {"lam": [0.5, 0.7]}, out=store)
    ds = jsmkt.sweep(JSQ, {"lam": [0.5, 0.7]}, out=store, resume=False)
    assert ds.lam.values.tolist() == [0.5, 0.7]
