"""A family written outside jsmkt (`examples/custom_family.py`: JSQ(d) with impatient jobs), registered at run time
with `jsmkt.register_family` and named by TOML specs through `--family FILE` or an installed package's entry point."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import jsmkt
from jsmkt import _exported, _spec
from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SCRIPT = EXAMPLES / "custom_family.py"
K = 16  # the one truncation of these tests: one compilation of the family's solve and metrics


@pytest.fixture
def registry():
    """The registry of families and the imported modules as they were before the test, restored after it."""
    families, modules = dict(_spec.FAMILIES), set(sys.modules)
    yield _spec.FAMILIES
    _spec.FAMILIES.clear()
    _spec.FAMILIES.update(families)
    for name in set(sys.modules) - modules:
        if name.startswith("jsmkt_family_") or name.startswith("custom_family"):
            del sys.modules[name]


def _import_example(name: str = "custom_family_example"):
    """The example file as a module (importing it registers its family)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mm1m_tails(lam: float, gamma: float, mu: float, n_max: int) -> np.ndarray:
    """P(Q >= k), k = 0..n_max, of the M/M/1+M queue with room for n_max jobs (an arrival finding n_max is lost, as
    at the mean field's truncation K), written here from its birth-death balance
    P(n) (mu + (n - 1) gamma) = P(n - 1) lam."""
    p = [1.0]
    for n in range(1, n_max + 1):
        p.append(p[-1] * lam / (mu + (n - 1) * gamma))
    p = np.array(p) / sum(p)
    return np.cumsum(p[::-1])[::-1]


def test_d1_fixed_point_is_the_mm1m_queue_and_the_cli_solves_the_spec(registry, tmp_path, capsys):
    """d = 1: every server is an M/M/1+M queue, so the fixed point is its stationary law (here at lam > mu, stable
    through abandonment only); `jsmkt solve --family FILE SPEC` of a spec naming the family gives the same numbers.
    E[T] = E[Q]/throughput: every job that joins (all but those lost at K) leaves, served or abandoning."""
    module = _import_example()
    jsmkt.register_family("jsq-abandon", module.JSQdAbandon)  # again, the same class: allowed
    assert registry["jsq-abandon"].model is module.JSQdAbandon
    lam, gamma, mu = 1.2, 0.8, 1.0
    model = module.JSQdAbandon(lam, gamma, d=1, mu=mu, K=K)
    fp = jsmkt.solve_fixed_point(model)
    want = mm1m_tails(lam, gamma, mu, K)
    np.testing.assert_allclose(np.asarray(jsmkt.tails(model, fp)), want, rtol=1e-11)
    EQ, accepted = float(np.sum(want[1:])), lam * (1.0 - want[K])  # jobs that join (all but those lost at K)
    assert float(jsmkt.throughput(model, fp)) == pytest.approx(accepted, rel=1e-12)
    assert float(jsmkt.mean_sojourn_time(model, fp)) == pytest.approx(EQ / accepted, rel=1e-11)

    spec = tmp_path / "abandon.toml"
    spec.write_text(f'model = "jsq-abandon"\nlam = {lam}\ngamma = {gamma}\nd = 1\nK = {K}\n')
    # With the CLI's cache of exported solves on, a family registered at run time is solved anew: the cache's keys
    # hold jsmkt's code, not the family's, so an edited family file would find its former results.
    exported = tmp_path / "exported"
    _exported.use_folder(exported)
    try:
        code = main(["solve", "--family", str(SCRIPT), str(spec), "--format", "json"])
    finally:
        _exported.use_folder(None)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert not exported.exists()
    res = json.loads(out.out)
    assert (res["model"], res["K"], res["d"], res["gamma"]) == ("JSQdAbandon", K, 1, gamma)
    np.testing.assert_allclose(res["tail"], want[: len(res["tail"])], rtol=1e-11)
    assert res["mean_sojourn_time"] == pytest.approx(EQ / accepted, rel=1e-11)
    assert res["utilisation"] == pytest.approx(want[1], rel=1e-11)

    # The description says fcfs=False (an abandoning job leaves from inside its queue): no tagged-job law is given.
    assert main(["solve", "--family", str(SCRIPT), str(spec), "--percentiles", "50"]) == 2
    assert "no FCFS queues (jobs move between servers, e.g. from orbits, or leave from inside a queue" in \
        capsys.readouterr().err

    # A spec value of the wrong type is named by the key the constructor's signature gives it.
    spec.write_text('model = "jsq-abandon"\nlam = 0.9\ngamma = 0.1\nd = 1.5\n')
    assert main(["solve", "--family", str(SCRIPT), str(spec)]) == 2
    assert "d=1.5 must be an integer" in capsys.readouterr().err


def test_register_family_refuses_bad_classes_and_taken_names(registry):
    module = _import_example()
    cls = module.JSQdAbandon
    with pytest.raises(ValueError, match=r"cls=<class 'dict'> must be a subclass of jsmkt.AbstractDescribedModel"):
        jsmkt.register_family("mine", dict)
    with pytest.raises(ValueError, match=r"cls=.* must be a subclass"):
        jsmkt.register_family("mine", cls(0.5, 0.1))  # an instance, not the class
    with pytest.raises(ValueError, match=r"name='jsq' is taken by the family jsmkt"):
        jsmkt.register_family("jsq", cls)

    class Other(cls):
        pass

    with pytest.raises(ValueError, match=r"name='jsq-abandon' is taken by the family custom_family_example"):
        jsmkt.register_family("jsq-abandon", Other)
    with pytest.raises(ValueError, match=r"name='jsq abandon' must be a TOML model name"):
        jsmkt.register_family("jsq abandon", cls)

    class Abstract(jsmkt.AbstractDescribedModel):
        K: int = 8

    with pytest.raises(ValueError, match=r"leaves abstract methods undefined \(.*description"):
        jsmkt.register_family("abstract", Abstract)
    assert set(registry) == set(_spec.MODELS) | {"jsq-abandon"}


def test_a_class_with_a_table_is_registered_by_its_table(registry):
    """`register_family` reads a class's table when it states one (keys, checks by kind, named parameters, aliases)
    and its signature otherwise (the example's `JSQdAbandon`: each argument a key, the rates for sensitivities)."""
    from jsmkt._models import parameters

    class JSQdTwin(jsmkt.JSQd):  # jsq's table under another name: `mu` a rate, `d` a choice law
        table = jsmkt.JSQd.table._replace(name="jsq-twin")

    try:
        jsmkt.register_family("jsq-twin", JSQdTwin)
        fam = registry["jsq-twin"]
        assert fam.keys == {"lam", "d", "mu", "K"} and list(fam.params) == ["lam", "d", "mu"]
        model = jsmkt.loads_spec('model = "jsq-twin"\nlam = 0.5\nd = 3\nK = 12\n', overrides={"mu": 2.0})
        assert type(model) is JSQdTwin and (float(model.lam), model.d, float(model.mu)) == (0.5, 3, 2.0)
        with pytest.raises(_spec.SpecError, match=r"d=0 must be >= 1"):  # the table's choice law, before JAX
            _spec.parse_spec({"model": "jsq-twin", "lam": 0.5, "d": 0})
        module = _import_example()
        abandon = registry["jsq-abandon"]
        assert {"lam", "gamma", "K"} <= abandon.keys and {"lam", "gamma"} <= set(abandon.params)
        assert parameters.table_of(module.JSQdAbandon).name == "jsq-abandon"
    finally:
        parameters._REGISTERED.pop(JSQdTwin, None)


def test_family_option_errors_are_one_line(registry, tmp_path, capsys):
    """`--family FILE` that does not exist, raises while imported, or registers nothing: exit 2, one line naming
    the file (and the line that raised)."""
    spec = tmp_path / "s.toml"
    spec.write_text('model = "jsq-abandon"\nlam = 0.9\ngamma = 0.1\n')
    raising = tmp_path / "raising.py"
    raising.write_text("import jsmkt\n\nx = 1 / 0\n")
    silent = tmp_path / "silent.py"
    silent.write_text("import jsmkt\n")
    for path, message in [(tmp_path / "none.py", "none.py: no such file"),
                          (raising, "raising.py: importing it raised ZeroDivisionError at line 3: division by zero"),
                          (silent, "silent.py registered no family; call jsmkt.register_family(name, cls) in it")]:
        assert main(["solve", "--family", str(path), str(spec)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert main(["solve", str(spec)]) == 2
    assert "model='jsq-abandon' is not one of 'jsq'" in capsys.readouterr().err


def test_installed_package_declares_a_family_by_entry_point(registry, tmp_path, monkeypatch):
    """An installed distribution's entry point in group `jsmkt.families` is loaded when a spec names it."""
    dist = tmp_path / "abandon_families-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: abandon-families\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[jsmkt.families]\njsq-impatient = custom_family:JSQdAbandon\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    parsed = _spec.parse_spec({"model": "jsq-impatient", "lam": 0.9, "gamma": 0.1, "d": 2}, "spec")
    model = _spec.build_model(parsed)
    assert type(model) is sys.modules["custom_family"].JSQdAbandon
    assert (model.d, model.K, float(model.gamma)) == (2, 32, 0.1)  # the constructor's defaults fill the rest
    assert _spec.family_of(model).name in ("jsq-abandon", "jsq-impatient")


def test_the_docs_page_shows_the_example_class():
    """docs/custom_family.md walks through the class of examples/custom_family.py as written there."""
    source = SCRIPT.read_text()
    cls = source[source.index("class JSQdAbandon"):source.index("jsmkt.register_family(")].rstrip()
    page = (EXAMPLES.parent / "docs" / "custom_family.md").read_text()
    assert "```python\n" + "import equinox as eqx" in page and cls + "\n```" in page
    assert "jsmkt._" not in source  # the example imports no private module


@pytest.mark.slow
def test_custom_family_script_passes_its_checks():
    """`python examples/custom_family.py`: d = 1 against the M/M/1+M queue, gradients against central differences,
    N = 1000 simulation within 1 % of the mean field, `jsmkt solve --family`; it exits 0."""
    root = str(EXAMPLES.parent)  # this checkout's jsmkt, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every check passed" in r.stdout
