"""Every Python source of the project compiles without warnings, on every supported Python.

An invalid escape sequence in a string (e.g. `"\\varepsilon"` in a docstring, where `\\v` is a vertical tab) is a
DeprecationWarning on Python 3.11, which pytest's filters ignore, but a SyntaxWarning on Python 3.12 and later,
which `filterwarnings = error` turns into a failure at import time. Docstrings and comments carry no measured
durations or speed ratios (those belong to `benchmarks/README.md`)."""

import pathlib
import re
import warnings

import pytest


ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted(
    p for folder in ("jsmkt", "tests", "benchmarks", "experiments", "docs") for p in (ROOT / folder).rglob("*.py")
)


def test_sources_found():
    assert len(SOURCES) > 20 and any(p.name == "_refined.py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_compiles_without_warnings(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(), str(path), "exec", dont_inherit=True)


def test_an_invalid_escape_is_caught():
    with warnings.catch_warnings(), pytest.raises(SyntaxError):
        warnings.simplefilter("error")
        compile('x = "\\prod"\n', "<test>", "exec", dont_inherit=True)


def test_imports_from_an_uninstalled_source_tree(tmp_path):
    """`PYTHONPATH=<checkout> python -c 'import jsmkt'` works without installing jsmkt (as on a machine that only
    has the dependencies), and gives the version of the checkout's pyproject.toml."""
    import shutil
    import subprocess
    import sys
    import tomllib

    shutil.copytree(ROOT / "jsmkt", tmp_path / "jsmkt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # Hide the installed distribution's metadata: run with the copy first on the path and jsmkt's metadata lookup
    # pointed at a name that is not installed.
    code = (
        "import importlib.metadata as md; real = md.version\n"
        "def version(name):\n"
        "    if name == 'jsmkt': raise md.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "md.version = version\n"
        "import jsmkt; print(jsmkt.__file__); print(jsmkt.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    file, version = out.stdout.split()
    assert pathlib.Path(file).resolve().is_relative_to(tmp_path.resolve())
    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_public_names_are_listed_documented_and_importable():
    """`jsmkt.__all__` and `jsmkt.published.__all__` list every public name, each with a docstring; `jsmkt.published`
    is a module (regression: it was an attribute alias, so `import jsmkt.published` failed)."""
    import importlib
    import types

    import jsmkt

    published = importlib.import_module("jsmkt.published")
    from jsmkt.published import ph_fixed_point  # noqa: F401

    assert jsmkt.published is published
    for module in (jsmkt, published):
        public = {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
        if module is published:  # names it imports for its own use are not its interface
            public = {n for n in public if getattr(vars(module)[n], "__module__", None) == "jsmkt.published"}
        assert public <= set(module.__all__), sorted(public - set(module.__all__))
        for name in module.__all__:
            assert (getattr(module, name).__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"


def test_public_members_are_documented():
    """Every public method and property of a public class has a docstring, its own or the one it overrides."""
    import inspect

    import jsmkt

    missing = []
    for module in (jsmkt, jsmkt.published):
        for name in module.__all__:
            cls = getattr(module, name)
            if not inspect.isclass(cls):
                continue
            for attr in dir(cls):
                static = inspect.getattr_static(cls, attr, None)
                if attr.startswith("_") or not (isinstance(static, property) or inspect.isfunction(static)):
                    continue
                docs = [getattr(vars(c).get(attr), "__doc__", None) for c in cls.__mro__ if attr in vars(c)]
                if not any((d or "").strip() for d in docs):
                    missing.append(f"{module.__name__}.{name}.{attr}")
    assert not missing, missing


# A measured duration (a number with a unit of time, or a range of them) or a speed ratio ("1.6x faster", "12×",
# "8 times slower"). Dimensions ("2 x 2 minors") and symbolic ratios ("N times faster") are not measurements.
_NUMBER = r"(?<![\w.$^_])\d+(?:\.\d+)?"
_MEASUREMENT = re.compile(
    rf"{_NUMBER}(?:\s?[-–]\s?\d+(?:\.\d+)?)?\s?(?:s|ms|µs|us|ns|min|minutes?|seconds?)(?![\w^])"
    rf"|{_NUMBER}\s?[×x](?![\w\d])(?!\s*\d)"
    rf"|{_NUMBER}\s+times\s+(?:faster|slower|quicker)"
)


def _docstrings_and_comments(source: str):
    """`(line, text)` of every docstring (module, class, function) and comment of a Python source."""
    import ast
    import io
    import tokenize

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def test_the_measurement_pattern():
    hits = ["took 155 us with it", "0.76 ms against", "about 1.6x faster", "0.01-2 s each", "12× faster",
            "about 8 times slower", "0.05-0.09 µs per event", "40 min"]
    misses = ["the 2 x 2 minors", "N times faster", "$N$ times faster", "2 servers", "s_1..s_4", "1e-10", "x_2 s"]
    assert [t for t in hits if not _MEASUREMENT.search(t)] == []
    assert [t for t in misses if _MEASUREMENT.search(t)] == []


def test_no_measured_durations_in_docstrings_or_comments():
    """Docstrings and comments say what code does and why; measured durations and speed ratios belong to
    `benchmarks/README.md` (and commit messages), where their machine and run are named."""
    found = [f"{p.relative_to(ROOT)}:{line}: {m.group(0)!r}"
             for p in SOURCES if p.is_relative_to(ROOT / "jsmkt")
             for line, text in _docstrings_and_comments(p.read_text())
             for m in _MEASUREMENT.finditer(text)]
    assert not found, found
