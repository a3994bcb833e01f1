"""The examples of the README and of the documentation pages (`docs/**/*.md`) run as written and print what they
claim.

Each page's ```python blocks run in order in one namespace of their own, so that a page's first block states
whatever the others need (imports, the model they work on): every page is self-contained. Blocks of other
languages (```sh, ```toml, ```text) are shown, not run, and so is a block that only includes a file of the
repository (`--8<-- "examples/demo.py"`, pymdownx.snippets): such a file is run by its own tests."""

import pathlib
import re

import jax
import numpy as np
import pytest
from scipy import optimize, stats


ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
_LANGUAGES = {"python", "sh", "toml", "text"}


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(path: pathlib.Path, language: str | None = "python") -> list[str]:
    """The page's fenced code blocks of one language (`None`: those without one)."""
    return [body for lang, body in _FENCE.findall(path.read_text()) if lang == (language or "")]


def _included(block: str) -> bool:
    """Whether a block only includes files (`--8<-- "path"` lines, resolved when the site is built)."""
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("--8<--") for line in lines)


def _code(path: pathlib.Path) -> list[str]:
    """The page's ```python blocks that run: all but those that only include files."""
    return [b for b in _blocks(path) if not _included(b)]


def _run(path: pathlib.Path, blocks: list[str], namespace: dict | None = None) -> dict:
    """Run a page's blocks in order in one namespace. A family that a page registers (`jsmkt.register_family`) is
    forgotten afterwards, so that the test of its example file registers it as a user would."""
    from jsmkt import _spec

    namespace = {} if namespace is None else namespace
    families = dict(_spec.FAMILIES)
    try:
        for block in blocks:
            exec(compile(block, _name(path), "exec"), namespace)
    finally:
        _spec.FAMILIES.clear()
        _spec.FAMILIES.update(families)
    return namespace


def _the_block(marker: str) -> tuple[pathlib.Path, str]:
    """The one ```python block, on any page, that contains `marker`."""
    found = [(path, b) for path in PAGES for b in _code(path) if marker in b]
    assert len(found) == 1, [_name(p) for p, _ in found]
    return found[0]


def test_pages_found():
    names = {_name(p) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/getting-started.md", "docs/tail-latency.md"} <= names
    assert sum(bool(_code(p)) for p in PAGES) >= 10
    assert _included('--8<-- "examples/demo.py"\n') and not _included('import jsmkt\n--8<-- "examples/demo.py"\n')


def test_readme_is_an_entry_point():
    """The README stays short (at most 15,000 bytes); what it leaves out is in the documentation pages, which it
    links."""
    text = README.read_text()
    assert len(text.encode()) <= 15_000
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), page


def test_readme_says_how_to_install():
    """A user who does not use the Makefile learns how to install jsmkt, and how to run it on a GPU."""
    text = README.read_text()
    assert re.search(r"^pip install .*-c constraints\.txt \.", text, flags=re.M)
    assert re.search(r'^pip install -U "jax\[cuda\d+\]"', text, flags=re.M)


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_pages_speak_of_jsmkt_not_of_its_issues(path):
    """The pages say what jsmkt does, not where a name came from ("carries the issue's `mean_queue_length`")."""
    assert not re.search(r"\bthe issue'?s?\b", path.read_text(), flags=re.I)


def test_every_experiment_folder_has_a_readme_listed_in_the_index():
    experiments = ROOT / "experiments"
    index = (experiments / "README.md").read_text()
    for folder in sorted(p for p in experiments.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        assert (folder / "README.md").is_file(), folder.name
        assert f"[`{folder.name}/`]({folder.name}/)" in index, folder.name


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_every_code_block_names_its_language(path):
    """Only ```python blocks run here, so a block without a language would be skipped unseen."""
    assert _blocks(path, None) == []
    assert {lang for lang, _ in _FENCE.findall(path.read_text())} <= _LANGUAGES


@pytest.mark.parametrize("path", [p for p in PAGES if _code(p)], ids=_name)
def test_readme_python_blocks_run(path, capsys):
    _run(path, _code(path))
    assert jax.config.jax_enable_x64
    if path == README:
        # Independent check of the first example: E[Q] = sum_k 0.9^(2^k - 1) and its derivative in lam.
        printed = capsys.readouterr().out.split()
        k = np.arange(1, 40)
        EQ = np.sum(0.9 ** (2.0**k - 1))
        dEQ = np.sum((2.0**k - 1) * 0.9 ** (2.0**k - 2))
        assert abs(float(printed[0]) - EQ) < 1e-12
        assert abs(float(printed[1]) - dEQ) < 1e-9 * dEQ
        assert "2.35265" in README.read_text() and "11.9876" in README.read_text()


def test_api_pages_document_every_public_name():
    """Every public name of `jsmkt` and `jsmkt.published` has its mkdocstrings entry (`::: jsmkt.NAME`), on an API
    page or its family's page, once."""
    import jsmkt

    entries = [m for p in DOCS.rglob("*.md") for m in re.findall(r"^::: ([\w.]+)$", p.read_text(), flags=re.M)]
    assert len(entries) == len(set(entries)), sorted(e for e in entries if entries.count(e) > 1)
    missing = [f"jsmkt.{n}" for n in jsmkt.__all__ if f"jsmkt.{n}" not in entries and n != "published"]
    assert not missing, missing
    assert {"jsmkt.published", "jsmkt.plotting"} <= set(entries)


def test_readme_sweep_example_flags_the_unstable_entries():
    path, block = _the_block("throw=False")
    namespace = _run(path, [block], {"jax": jax, "jsmkt": __import__("jsmkt")})
    assert list(np.asarray(namespace["ok"])) == [True] * 5 + [False] * 2
    assert np.all(np.isnan(np.asarray(namespace["ET"])[5:]))  # a failed entry's metrics are NaN
    # Mitzenmacher's E[T] = sum_k lam^(2^k - 2) for the stable entries.
    lams = np.linspace(0.5, 1.1, 7)[:5]
    expected = [np.sum(lam ** (2.0 ** np.arange(1, 40) - 2)) for lam in lams]
    np.testing.assert_allclose(np.asarray(namespace["ET"])[:5], expected, rtol=1e-10)


def _jsq_exponential_p99_excess(lam: float, d: int, bound: float) -> float:
    """P(T > bound) - 0.01 for JSQ(d) with exponential service of rate 1, from the closed form: an arrival finds
    k jobs ahead with probability s_k^d - s_{k+1}^d, s_k = lam^((d^k - 1)/(d - 1)) (lam^k for d = 1), and then
    stays an Erlang(k + 1) time."""
    k = np.arange(0, 3000)
    s = lam ** (k.astype(float) if d == 1 else (float(d) ** np.minimum(k, 60) - 1) / (d - 1))
    return float(np.sum((s[:-1] ** d - s[1:] ** d) * stats.gamma.sf(bound, k[:-1] + 1)) - 0.01)


def test_readme_sizing_example_matches_the_closed_form_for_d_1_2_3_5():
    """The sizing snippet, as written, for exponential service and p99 <= 10 E[S], against the largest rate of the
    closed form (d = 1: the M/M/1 answer 1 - ln(100)/10)."""
    path, block = _the_block("def lam_max")
    namespace = _run(path, [block.replace("lam_max(2)", "pass")])
    import jsmkt

    for d in (1, 2, 3, 5):
        expected = optimize.brentq(_jsq_exponential_p99_excess, 0.01, 0.9 if d == 1 else 0.9999, args=(d, 10.0),
                                   xtol=1e-15)
        got = float(namespace["lam_max"](d, 10.0, jsmkt.exponential(1.0)))
        assert abs(got - expected) < 1e-10, (d, got, expected)
    # d = 1: the root is the M/M/1 closed form.
    assert abs(optimize.brentq(_jsq_exponential_p99_excess, 0.01, 0.9, args=(1, 10.0), xtol=1e-15)
               - (1 - np.log(100) / 10)) < 1e-12
