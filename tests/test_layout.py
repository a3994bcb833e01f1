"""The layout of the package, checked on its source: a family's knowledge stays in the family's file.

A family's class is named (used as a name, an attribute, an import, or a string equal to it) only in its own file,
in `__init__.py` files (the re-exports) and in `published/` (the papers' variants, registered by family). A family's
file names another family's class only to build its own limit or special case (a deliberate pair listed in
`CROSS_FAMILY`: a BMAP of one phase is a batch-Poisson model, `JSQdBMAP.limit()`). Everything else reaches a
family through its table and the base class's hooks (`jsmkt._models.parameters`, `jsmkt._models.base`).
"""

import ast
import pathlib

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jsmkt"

# Each family's class and its own file.
FAMILY_FILES = {
    "JSQd": "_models/jsqd.py", "JSQdPH": "_models/jsqd_ph.py", "JSQdBatch": "_models/batch.py",
    "JSQdClasses": "_models/classes.py", "JSQdBatchService": "_models/batch_service.py",
    "JSQdBMAP": "_models/bmap.py", "RetrialJSQ": "_models/retrial.py", "RepairableJSQ": "_models/repairable.py",
}

# (file, class) pairs where a family builds another family's model as its own limit.
CROSS_FAMILY = {("_models/bmap.py", "JSQdBatch")}

# Paths (relative to jsmkt/) exempt from the check: the re-exports, the papers' variants, and modules still being
# moved to the tables and hooks (shrink this tuple as they are).
EXEMPT = ("__init__.py", "published/")


def _exempt(rel: str) -> bool:
    return any(rel == e or rel.endswith("/" + e) or (e.endswith("/") and rel.startswith(e)) for e in EXEMPT)


def _names(tree: ast.AST) -> list[tuple[int, str]]:
    """`(line, name)` of every family class named in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.rsplit(".", 1)[-1]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        else:
            continue
        if name in FAMILY_FILES:
            out.append((getattr(node, "lineno", 0), name))
    return out


def family_references(package: pathlib.Path = PACKAGE) -> list[str]:
    """`path:line: Class` of every reference to a family class outside the places allowed (module docstring)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if _exempt(rel):
            continue
        for line, name in _names(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if FAMILY_FILES[name] == rel or (rel, name) in CROSS_FAMILY:
                continue
            out.append(f"jsmkt/{rel}:{line}: {name}")
    return out


def test_no_module_names_a_family_class_outside_its_file():
    assert family_references() == []


def test_the_check_finds_a_reference(tmp_path):
    """The check can fail: a module that names a family (an isinstance, an import, a string) is reported."""
    (tmp_path / "_models").mkdir()
    (tmp_path / "_metrics.py").write_text(
        "from ._models.retrial import RetrialJSQ\n\ndef f(m):\n    return isinstance(m, RetrialJSQ)\n")
    (tmp_path / "_spec.py").write_text('import jsmkt\nC = getattr(jsmkt, "JSQdPH")\n')
    (tmp_path / "_models" / "jsqd.py").write_text("class JSQd:\n    pass\n")
    assert family_references(tmp_path) == ["jsmkt/_metrics.py:1: RetrialJSQ", "jsmkt/_metrics.py:4: RetrialJSQ",
                                           "jsmkt/_spec.py:2: JSQdPH"]


@pytest.mark.parametrize("cls", sorted(FAMILY_FILES))
def test_every_family_file_declares_its_table(cls):
    """Each family's file holds its table (read without importing it), and the class's table is that one."""
    import importlib

    from jsmkt._models.parameters import read_table

    rel = FAMILY_FILES[cls]
    name, table = read_table(PACKAGE / rel)
    assert name == cls
    module = importlib.import_module("jsmkt." + rel.removesuffix(".py").replace("/", "."))
    assert getattr(module, cls).table == table
    for spec in table.specs:
        assert (PACKAGE.parent / spec).is_file(), spec


def test_a_table_in_another_layout_is_read_from_the_whole_file(tmp_path):
    """`read_table` parses the one `    table = ...` statement alone; a file laid out otherwise (a class body
    indented by two, a table whose statement the heuristic cannot cut out) is parsed whole, to the same table."""
    from jsmkt._models.parameters import FamilyTable, Parameter, _table_statement, read_table

    expected = FamilyTable("toy", (Parameter("lam", "rate", "arrival rate", field="lam"),))
    two = tmp_path / "two.py"
    two.write_text('class Toy:\n  table = FamilyTable("toy", (\n      Parameter("lam", "rate", "arrival rate", '
                   'field="lam"),\n  ))\n')
    assert _table_statement(two.read_text(), str(two)) is None
    assert read_table(two) == ("Toy", expected)
    four = tmp_path / "four.py"
    four.write_text('class Toy:\n    """A toy."""\n\n    table = FamilyTable("toy", (\n'
                    '        Parameter("lam", "rate", "arrival rate", field="lam"),\n    ))\n\n'
                    '    def f(self):\n        return 1\n')
    assert _table_statement(four.read_text(), str(four))[0] == "Toy"
    assert read_table(four) == ("Toy", expected)


@pytest.mark.parametrize("fam", ["jsq", "jsq-batch", "jsq-bmap", "retrial", "repairable"])
def test_rate_checks_are_generated_from_the_table(fam):
    """Every rate of a family's table (kind `rate`, with a field) is checked finite and positive by `value_errors`,
    the message naming it with its value."""
    import equinox as eqx
    import jax.numpy as jnp

    from jsmkt._spec import FAMILIES

    family = FAMILIES[fam]
    model = next(iter(family.examples().values()))
    rates = [p for p in family.table.parameters if p.kind == "rate" and p.field]
    assert rates
    for p in rates:
        bad = eqx.tree_at(lambda m, f=p.field: getattr(m, f), model, jnp.asarray(-0.25))
        with pytest.raises(ValueError, match=rf"invalid parameters: .*\b{p.name}=-0.25\b.* must be finite and "
                                             "positive"):
            bad.check_values()
