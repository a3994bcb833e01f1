"""The CLI's exported solves (`jsmkt._exported`): what a later process loads instead of tracing must print exactly
what the usual path prints, for new values of the same model structure too, and must give way to the usual path
(and its errors) on any failure."""

import warnings

import jax
import numpy as np
import pytest

import jsmkt
from jsmkt import _exported, cli
from jsmkt._spec import SpecError, describe_model


@pytest.fixture
def folder(tmp_path):
    _exported.use_folder(tmp_path)
    yield tmp_path
    _exported.use_folder(None)


SOLVE = "jsmkt solve: exact"  # the name `jsmkt solve` keeps its exported solve under


def _usual(model, grown_by=None):
    """`jsmkt solve`'s results by the usual path (no exported files)."""
    _exported.use_folder(None)
    return cli._solve(model, grown_by)[:2]


def test_a_loaded_solve_prints_what_the_usual_path_prints(folder):
    model = jsmkt.JSQd(0.7, d=2, K=12)
    values, how = _exported.call("test", cli._exact_outputs, model)
    assert how == "exported" and len(list(folder.iterdir())) == 1
    other = jsmkt.JSQd(0.6, d=2, K=12)  # new values, same structure: the same file
    values, how = _exported.call("test", cli._exact_outputs, other)
    assert how == "loaded" and len(list(folder.iterdir())) == 1 and bool(values["successful"])
    _exported.use_folder(folder)
    fast, fast_model, described, _ = cli._solve(other, None)
    assert fast_model.K == 12
    assert fast == _usual(other)[0]
    assert describe_model(other, described) == describe_model(other)  # the numbers that came with the results
    # The mean queue length of JSQ(2) against its closed form, sum_k lam^(2^k - 1), so that the comparison above
    # cannot pass with both paths wrong alike.
    assert fast["mean_queue_length"] == pytest.approx(sum(0.6 ** (2**k - 1) for k in range(1, 12)), rel=1e-12)


def test_a_default_K_grows_as_in_the_usual_path(folder):
    model = jsmkt.JSQd(0.95, d=2, K=4)
    fast, fast_model, _, _ = cli._solve(model, "the default K")
    usual, usual_model = _usual(model, "the default K")
    assert fast_model.K == usual_model.K > 4
    assert fast == usual


def test_failures_take_the_usual_path_and_its_error(folder):
    model = jsmkt.JSQd(0.95, d=2, K=4)
    with pytest.raises(SpecError) as fast:
        cli._solve(model, None)
    with pytest.raises(SpecError) as usual:
        _usual(model)
    assert str(fast.value) == str(usual.value) and "K=4" in str(fast.value)


def test_a_foreign_file_or_new_code_is_traced_again(folder, monkeypatch):
    model = jsmkt.JSQd(0.7, d=2, K=12)
    expected, how = _exported.call("test", cli._exact_outputs, model)
    (path,) = folder.iterdir()
    path.write_bytes(b"not an exported function")
    with pytest.warns(_exported.CacheWarning, match="is not a jsmkt compiled function"):
        values, how = _exported.call("test", cli._exact_outputs, model)
    assert how == "exported" and values.keys() == expected.keys()
    assert all(np.array_equal(values[k], expected[k], equal_nan=True) for k in values)  # NaN: JSQd has no PH
    monkeypatch.setattr(_exported, "code_digest", lambda: "other code")
    _, how = _exported.call("test", cli._exact_outputs, model)
    assert how == "exported" and len(list(folder.iterdir())) == 2


def test_a_file_under_another_models_name_is_not_loaded(folder, capsys):
    """Issue 34: the exported solve of JSQ(3) put under the file name of JSQ(2) (same shapes) was loaded, and
    `jsmkt solve` printed d = 2 with the numbers of d = 3. The file holds its key: a load checks it, warns in one
    line and computes the solve again (and overwrites the file)."""
    two, three = jsmkt.JSQd(0.7, d=2, K=12), jsmkt.JSQd(0.7, d=3, K=12)
    _exported.call(SOLVE, cli._exact_outputs, two)
    (path,) = folder.iterdir()
    _exported.use_folder(folder / "other")
    _exported.call(SOLVE, cli._exact_outputs, three)
    (other,) = (folder / "other").iterdir()
    path.write_bytes(other.read_bytes())  # d = 3's solve, under d = 2's name
    _exported.use_folder(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values, how = _exported.call(SOLVE, cli._exact_outputs, two)
    # JSQ(2)'s mean queue length, sum_k lam^(2^k - 1); JSQ(3)'s would be sum_k lam^((3^k - 1)/2).
    expected = sum(0.7 ** (2**k - 1) for k in range(1, 12))
    assert float(values["mean_queue_length"]) == pytest.approx(expected, rel=1e-12)
    caught = [str(w.message) for w in caught if type(w.message).__name__ == "CacheWarning"]
    assert how == "exported" and len(caught) == 1 and "holds another key than its name" in caught[0]
    assert _exported.call(SOLVE, cli._exact_outputs, two)[1] == "loaded"  # overwritten with its own solve
    # The CLI's path: one warning line on stderr, and d = 2's numbers.
    path.write_bytes(other.read_bytes())
    capsys.readouterr()
    out = cli._solve(two, None).out
    err = capsys.readouterr().err
    assert out["mean_queue_length"] == pytest.approx(expected, rel=1e-12)
    assert err.count("\n") == 1 and err.startswith("jsmkt: warning: the cache entry ") and "computing it again" in err


def test_a_folder_in_place_of_a_file_leaves_no_temporary_file(folder, capsys):
    """A folder where a cache file should be: the solve works, one line says the entry cannot be written, and no
    temporary file is left behind (one of 34 KB was, on every run)."""
    model = jsmkt.JSQd(0.7, d=2, K=12)
    _exported.call(SOLVE, cli._exact_outputs, model)
    (path,) = folder.iterdir()
    path.unlink()
    path.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values, how = _exported.call(SOLVE, cli._exact_outputs, model)
    expected = sum(0.7 ** (2**k - 1) for k in range(1, 12))
    assert float(values["mean_queue_length"]) == pytest.approx(expected, rel=1e-12)
    assert list(folder.iterdir()) == [path] and not any(path.iterdir())
    caught = [str(w.message) for w in caught if type(w.message).__name__ == "CacheWarning"]
    assert len(caught) == 1 and "cannot write the cache entry" in caught[0]
    out = cli._solve(model.with_K(12), None).out  # the CLI: one warning line
    err = capsys.readouterr().err
    assert out["mean_queue_length"] == pytest.approx(expected, rel=1e-12)
    assert err.count("\n") == 1 and err.startswith("jsmkt: warning: cannot write the cache entry "), err
    assert list(folder.iterdir()) == [path]


def test_off_without_a_folder():
    _exported.use_folder(None)
    assert _exported.call("test", cli._exact_outputs, jsmkt.JSQd(0.7, d=2, K=12)) == (None, "off")


_COUNT_COMPUTATIONS = """
import logging, sys
import jax
from jsmkt._spec import build_model, describe_model, read_spec_file, parse_spec

compiled = []
class Count(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Compiling "):
            compiled.append(record.getMessage().split(" with ")[0])
jax.config.update("jax_log_compiles", True)
logging.getLogger("jax").addHandler(Count())
logging.getLogger("jax").propagate = False
for path in sys.argv[1:]:
    model = build_model(parse_spec(read_spec_file(path)))
    describe_model(model, {"load": 0.5, "mean": 1.0, "scv": 1.0})
    print(path, compiled)
    compiled.clear()
"""


def test_building_and_describing_a_model_from_a_spec_runs_no_jax_computation():
    # A warm `jsmkt solve` runs one computation, the loaded solve: each JAX operation run on its own while the
    # model is built would be lowered and loaded from the cache in every run (tens of milliseconds each). A fresh
    # process, so that no computation is already compiled in memory.
    import pathlib
    import subprocess
    import sys

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    specs = [str(examples / f) for f in ("jsq2_h2.toml", "jsq2_erlang2.toml", "jsq3_exponential.toml",
                                         "jsq2_coxian_explicit.toml")]
    proc = subprocess.run([sys.executable, "-c", _COUNT_COMPUTATIONS, *specs], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{s} []" for s in specs]


_LOAD_IN_A_FRESH_PROCESS = """
import sys
import jsmkt
from jsmkt import _exported, cli
_exported.use_folder(sys.argv[1])
model = jsmkt.JSQdPH(float(sys.argv[2]), jsmkt.hyperexponential2(1.0, 4.0), d=2, K=24)
values, how = _exported.call("test", cli._exact_outputs, model)
print(how, repr(float(values["mean_queue_length"])))
"""


def test_a_lapack_solve_loads_in_a_fresh_process(tmp_path):
    """A JSQ(2)-H2 solve calls LAPACK (its blocks' LU): a process that loads its executable before it has lowered
    any LAPACK call must register LAPACK's kernels first (without, the call crashes the process). A second process
    loads the file the first kept, at a new λ, and prints the numbers of the usual path."""
    import subprocess
    import sys

    def run(lam):
        proc = subprocess.run([sys.executable, "-c", _LOAD_IN_A_FRESH_PROCESS, str(tmp_path), str(lam)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        how, value = proc.stdout.split()
        return how, float(value)

    assert run(0.8)[0] == "exported"
    how, value = run(0.7)
    model = jsmkt.JSQdPH(0.7, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=24)
    usual = jsmkt.mean_queue_length(model, jsmkt.solve_fixed_point(model))
    assert how == "loaded" and value == pytest.approx(float(usual), rel=1e-12)


def test_an_entry_that_fails_to_run_is_computed_again(folder, monkeypatch):
    """A kept executable whose copy lacks a kernel fails when it runs (as one that JAX's persistent cache gave and
    that was serialised again did: "NOT_FOUND: Function iota.23_kernel not found"): the call warns, computes it
    again, and replaces the file."""
    from jax.experimental import serialize_executable

    model = jsmkt.JSQd(0.7, d=2, K=12)
    _exported.call("test", cli._exact_outputs, model)

    def broken(*args, **kwargs):
        def run(*_):
            raise jax.errors.JaxRuntimeError("NOT_FOUND: Function iota.23_kernel not found (type id: 1)")
        return run

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", broken)
    with pytest.warns(_exported.CacheWarning, match="is damaged; computing it again"):
        values, how = _exported.call("test", cli._exact_outputs, model)
    assert how == "exported"
    assert float(values["mean_queue_length"]) == pytest.approx(sum(0.7 ** (2**k - 1) for k in range(1, 12)), rel=1e-12)
    monkeypatch.undo()
    assert _exported.call("test", cli._exact_outputs, model)[1] == "loaded"


def test_a_solve_compiled_before_is_kept_whole(folder, tmp_path):
    """With JAX's persistent compilation cache on (as the CLI has it) and holding the solve already, the file kept
    is still whole: `_compiled` compiles without that cache, whose executables serialise to copies that lack
    kernels."""
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    compilation_cache.reset_cache()
    try:
        model = jsmkt.JSQd(0.7, d=2, K=12)
        for sub in ("one", "two"):  # the second compilation would come from JAX's cache
            _exported.use_folder(folder / sub)
            _exported.call("test", cli._exact_outputs, model)
            values, how = _exported.call("test", cli._exact_outputs, model.with_K(12))
            assert how == "loaded"
            assert float(values["mean_queue_length"]) == pytest.approx(
                sum(0.7 ** (2**k - 1) for k in range(1, 12)), rel=1e-12)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()
