"""The `jsmkt.cli` package: no module of it names a model family (what it needs of one comes from the spec registry,
the model and `jsmkt.published.as_published`); `--set KEY=VALUE` on every command; `as_published` of every family
with an as-published form gives what `jsmkt solve --as-published` printed, and of one without, a clear error."""

import ast
import json
import pathlib

import numpy as np
import pytest

import jsmkt
from jsmkt._spec import FAMILIES, SpecError, build_model, read_spec_file, parse_spec
from jsmkt.cli import _apply_overrides, build_parser, main


ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MM1 = 'model = "jsq"\nlam = 0.5\nd = 1\n'  # tests/test_cli.py's M/M/1 spec: its compiled shapes are shared
FAMILY_CLASSES = {"JSQd", "JSQdPH", "JSQdBatch", "JSQdClasses", "JSQdBatchService", "JSQdBMAP", "RetrialJSQ",
                  "RepairableJSQ"} | {fam.class_name for fam in FAMILIES.values()}


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_no_module_of_the_cli_names_a_family_class():
    """On the AST: no name, attribute or import of a family class in jsmkt/cli/ (so no `isinstance` on one)."""
    modules = sorted((ROOT / "jsmkt" / "cli").glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "__main__.py", "parser.py", "solve.py", "transient.py",
                                         "simulate.py", "sensitivity.py", "output.py", "plots.py"}
    assert not (ROOT / "jsmkt" / "cli.py").exists()
    found = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute) else \
                [a.name.split(".")[-1] for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n in FAMILY_CLASSES]
    assert not found, found


def test_every_command_takes_set():
    sub = next(a for a in build_parser()._actions if a.choices and isinstance(a.choices, dict))
    assert {"solve", "transient", "simulate", "sensitivity", "sweep", "capacity"} <= set(sub.choices)
    for name, parser in sub.choices.items():
        if name != "plot":  # it reads a sweep's dataset, not a spec
            assert any("--set" in a.option_strings for a in parser._actions), name


def test_set_changes_the_solve_as_the_edited_spec(tmp_path, capsys):
    """`--set lam=0.8` on the M/M/1 spec at lam = 0.5 prints what the spec edited to lam = 0.8 prints: the M/M/1
    queue's E[Q] = rho/(1 - rho) = 4 and s_k = rho^k (not 1 and 0.5^k)."""
    spec, edited = tmp_path / "m.toml", tmp_path / "edited.toml"
    spec.write_text(MM1)
    edited.write_text(MM1.replace("lam = 0.5", "lam = 0.8"))
    code, out, err = run(["solve", str(spec), "--set", "lam=0.8", "--format", "json"], capsys)
    assert code == 0, err
    code, expected, err = run(["solve", str(edited), "--format", "json"], capsys)
    assert code == 0, err
    assert out == expected
    res = json.loads(out)
    assert res["lam"] == 0.8 and res["mean_queue_length"] == pytest.approx(4.0, rel=1e-9)
    np.testing.assert_allclose(res["tail"][:6], 0.8 ** np.arange(6), rtol=1e-9)
    code, out, err = run(["solve", str(spec), "--set", "lam=0.8", "--set", "lam=0.5", "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["mean_queue_length"] == pytest.approx(1.0, rel=1e-9)  # the last one wins


@pytest.mark.parametrize("argv, message", [
    (["--set", "lam"], "'lam' is not KEY=VALUE"),
    (["--set", "=0.8"], "'=0.8' is not KEY=VALUE"),
    (["--set", "service.mean=2"], "--set service.mean: 'service' is not a key of model = 'jsq'"),
    (["--set", "lam=-1"], "lam=-1 must be positive"),
    (["--set", "lam.x=1"], "--set lam.x: lam = 0.5 is a value, not a table"),
    (["--set", "d=fast"], "d='fast'"),
])
def test_set_errors_name_the_override(argv, message, tmp_path, capsys):
    """A bad `--set` is one line on stderr (argparse's usage error for a malformed one), before JAX computes."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    try:
        code = main(["solve", str(spec), *argv])
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_overrides_follow_toml_paths():
    spec = {"model": "jsq-classes", "classes": [{"lam": 0.3}, {"lam": 0.4}], "service": {"kind": "h2", "mean": 1.0}}
    out = _apply_overrides(spec, {"classes.1.lam": "0.5", "service.scv": "4", "service.kind": "coxian2",
                                  "simulation.sampling": '"without_replacement"', "K": "30",
                                  "classes.0.d": "[0.5, 0.5]"})
    assert out == {"model": "jsq-classes", "classes": [{"lam": 0.3, "d": [0.5, 0.5]}, {"lam": 0.5}],
                   "service": {"kind": "coxian2", "mean": 1.0, "scv": 4}, "simulation":
                   {"sampling": "without_replacement"}, "K": 30}
    with pytest.raises(SpecError, match=r"--set classes.2.lam: classes has 2 tables; '2' is not an index of them"):
        _apply_overrides(spec, {"classes.2.lam": "1"})


# What `jsmkt solve SPEC --as-published --format json` printed before `as_published` existed: the K it chose, E[T],
# s_1..s_3, the residuals of the closed form in the published and in the exact equations, the first row of the phase
# tails, and E[Q] of the published equations' own fixed point.
_PRINTED = {
    "jsq3_exponential.toml": (13, 2.5351334765176503, [0.95, 0.8145062499999999, 0.5133420832795048], None, None,
                              None, None),
    "jsq2_h2.toml": (33, 2.080718668086706, [0.9, 0.36450000000000005, 0.05978711250000001], 0.1411702429692604,
                     0.3234202429692603, [0.45, 0.45], None),
    "jsq2_erlang2.toml": (16, 1.371968668086706, [0.9, 0.36450000000000005, 0.05978711250000001],
                          0.18225000000000002, 0.36450000000000005, [0.45, 0.45], None),
    "jsq_batch_service.toml": (31, 1.293064630612998, [0.8889547559495209, 0.45165578547550683, 0.1639067960384604],
                               None, None, [0.5261023208903345, 0.3628524350591864], None),
    "jsq_bmap.toml": (20, 0.8782953723424224, [0.36555925538817435, 0.11583828615938088, 0.01385701172763173],
                      0.07024917923283039, 0.2388852922468653, [0.23175528132757905, 0.1338039740605953],
                      0.5038147731761484),
}


def _model(spec: str, K: int):
    return build_model(parse_spec(read_spec_file(str(EXAMPLES / spec)))).with_K(K)


@pytest.mark.parametrize("spec", sorted(_PRINTED))
def test_as_published_gives_what_solve_as_published_printed(spec):
    K, ET, tail, r_published, r_exact, phases, published_EQ = _PRINTED[spec]
    form = jsmkt.published.as_published(_model(spec, K))
    assert len(form.tail) == K + 1 and form.tail[0] == 1.0
    np.testing.assert_allclose(form.tail[1:4], tail, rtol=1e-12)
    assert form.mean_sojourn_time == pytest.approx(ET, rel=1e-12)
    assert (form.residuals is None) == (r_published is None)
    if r_published is not None:
        assert form.residuals["published"] == pytest.approx(r_published, rel=1e-12)
        assert form.residuals["exact"] == pytest.approx(r_exact, rel=1e-12)
    assert (form.phase_tails is None) == (phases is None)
    if phases is not None:
        np.testing.assert_allclose(np.asarray(form.phase_tails)[0], phases, rtol=1e-12)
        assert np.asarray(form.phase_tails).shape[0] == K
    assert (form.published_equations is None) == (published_EQ is None)
    if published_EQ is not None:
        assert form.published_equations["mean_queue_length"] == pytest.approx(published_EQ, rel=1e-12)


def test_as_published_of_jsqd_is_the_classic_closed_form():
    """JSQ(d), exponential service: s_k = rho^((d^k - 1)/(d - 1)) and Mitzenmacher's E[T] = (1/mu) sum_{k>=0}
    rho^((d^(k+1) - d)/(d - 1)), written out here."""
    model = jsmkt.JSQd(0.9, d=3, mu=1.0, K=8)
    form = jsmkt.published.as_published(model)
    k = np.arange(9)
    np.testing.assert_allclose(form.tail, 0.9 ** ((3.0**k - 1) / 2), rtol=1e-13)
    ET = sum(0.9 ** ((3.0 ** (k + 1) - 3) / 2) for k in range(40))
    assert form.mean_sojourn_time == pytest.approx(ET, rel=1e-13)
    assert form.mean_queue_length == pytest.approx(np.sum(0.9 ** ((3.0 ** k[1:] - 1) / 2)), rel=1e-13)
    assert form.phase_tails is None and form.residuals is None


def test_as_published_without_a_variant_names_the_family():
    model = jsmkt.RetrialJSQ(0.6, 2.0, d1=2, d2=2, K=40)  # tests/test_simulated_metrics.py's (shared compilations)
    with pytest.raises(ValueError, match=r"^RetrialJSQ has no as-published form in jsmkt \(the families with one: "
                                         r"JSQd, JSQdBMAP, JSQdBatchService, JSQdPH\)"):
        jsmkt.published.as_published(model)
    assert not jsmkt.published.has_as_published(type(model))


def test_the_spec_registry_and_the_published_registry_agree():
    """`jsmkt solve --as-published` refuses a family before building its model by the spec registry's `published`;
    the families it lets through are those `as_published` serves."""
    for fam in FAMILIES.values():
        assert fam.published == jsmkt.published.has_as_published(fam.model), fam.name
