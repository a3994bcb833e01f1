"""Specs from Python: `jsmkt.load_spec`, `jsmkt.loads_spec` (with overrides, by TOML path) and `jsmkt.dump_spec`.

The models are compared leaf by leaf (`eqx.tree_equal`) with models built by the constructors directly; nothing is
solved here."""

import equinox as eqx
import numpy as np
import pytest

import jsmkt
from jsmkt._spec import FAMILIES


EXAMPLES = sorted(p for fam in FAMILIES.values() for p in fam.specs)


def _same(a, b) -> bool:
    return type(a) is type(b) and bool(eqx.tree_equal(a, b))


@pytest.mark.parametrize("path", EXAMPLES)
def test_every_example_spec_round_trips(path):
    model = jsmkt.load_spec(path)
    text = jsmkt.dump_spec(model)
    assert _same(jsmkt.loads_spec(text), model), text


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_every_registry_example_round_trips(fam):
    """The families' small instances too: real and randomised choice numbers, helpers, batches, R.3."""
    for label, model in FAMILIES[fam].examples().items():
        assert _same(jsmkt.loads_spec(jsmkt.dump_spec(model)), model), label


def test_loads_spec_builds_what_the_constructor_builds():
    text = 'model = "jsq-ph"\nlam = 0.7\nd = 3\nK = 20\n[service]\nkind = "h2"\nmean = 1.0\nscv = 4.0\n'
    want = jsmkt.JSQdPH(0.7, jsmkt.hyperexponential2(1.0, 4.0), d=3, K=20)
    assert _same(jsmkt.loads_spec(text), want)


def test_overrides_change_the_model():
    base = jsmkt.load_spec("examples/jsq2_h2.toml")
    lam = jsmkt.load_spec("examples/jsq2_h2.toml", overrides={"lam": 0.8})
    assert float(lam.lam) == 0.8 and _same(lam.service, base.service)
    mean = float(base.service.mean)
    scv = jsmkt.load_spec("examples/jsq2_h2.toml", overrides={"service.scv": 3})
    assert _same(scv, jsmkt.JSQdPH(base.lam, jsmkt.hyperexponential2(mean, 3.0), d=base.choice))  # K from them
    short = jsmkt.load_spec("examples/jsq2_h2.toml", overrides={"scv": "3", "mean": 2.0})  # aliases, TOML text
    assert float(short.service.scv) == pytest.approx(3.0) and float(short.service.mean) == pytest.approx(2.0)
    classes = jsmkt.load_spec("examples/jsq_classes.toml", overrides={"classes.0.lam": 0.2})
    before = jsmkt.load_spec("examples/jsq_classes.toml")
    np.testing.assert_array_equal(np.asarray(classes.lam), [0.2, float(before.lam[1])])
    mixed = jsmkt.loads_spec('model = "jsq"\nlam = 0.5\n', overrides={"d": "[0.5, 0.5]", "K": 12})
    assert _same(mixed, jsmkt.JSQd(0.5, d=[0.5, 0.5], K=12))
    words = jsmkt.load_spec("examples/retrial_reprobe.toml", overrides={"retrial": "own", "policy": '"constant"',
                                                                                  "theta": 5.0})
    assert (words.retrial, words.policy) == ("own", "constant")


@pytest.mark.parametrize("overrides, needle", [
    ({"lamda": 0.8}, "override lamda: 'lamda' is not a key of model = 'jsq-ph'"),
    ({"lam": -0.5}, "lam=-0.5 must be positive"),
    ({"lam": "0.5 0.6"}, "override lam=0.5 0.6: the value is not a TOML value"),
    ({"service.scv": 0.5}, "[service]: scv=0.5 must be >= 1"),
    ({"service.rate": 2.0}, "[service]: unknown key(s) 'rate'"),
    ({"lam.x": 1.0}, "override lam.x: lam = 0.9 is a value, not a table"),
])
def test_bad_overrides_name_the_key(overrides, needle):
    with pytest.raises(jsmkt.SpecError) as e:
        jsmkt.load_spec("examples/jsq2_h2.toml", overrides=overrides)
    assert needle in str(e.value)


def test_bad_override_of_an_array_of_tables_names_the_key():
    with pytest.raises(jsmkt.SpecError, match=r"override classes.5.lam: classes has 2 tables; '5' is not an index"):
        jsmkt.load_spec("examples/jsq_classes.toml", overrides={"classes.5.lam": 0.1})
    with pytest.raises(jsmkt.SpecError, match=r"\[\[classes\]\] 1: lam=0.0 must be positive"):
        jsmkt.load_spec("examples/jsq_classes.toml", overrides={"classes.0.lam": 0.0})


def test_load_spec_refuses_what_the_cli_refuses(tmp_path):
    with pytest.raises(jsmkt.SpecError, match="no such file"):
        jsmkt.load_spec(tmp_path / "missing.toml")
    with pytest.raises(jsmkt.SpecError, match="not valid TOML"):
        jsmkt.loads_spec("model = ")
    with pytest.raises(jsmkt.SpecError, match=r"sampling='sometimes' is not one of"):
        jsmkt.loads_spec('model = "jsq"\nlam = 0.5\n[simulation]\nsampling = "sometimes"\n')
    with pytest.raises(jsmkt.SpecError, match=r"^\[service\]: alpha sums to 1.1"):  # the PH's check
        jsmkt.loads_spec('model = "jsq-ph"\nlam = 0.5\n[service]\nalpha = [0.5, 0.6]\nT = [[-1.0, 0.0], [0.0, -1.0]]\n')
