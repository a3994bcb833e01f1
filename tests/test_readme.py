"""The README's examples run as written and print what they claim."""

import pathlib
import re

import jax
import numpy as np
from scipy import optimize, stats


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str | None = "python") -> list[str]:
    """The README's fenced code blocks of one language (`None`: those without one)."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)
            if lang == (language or "")]


def test_every_code_block_names_its_language():
    """Only ```python blocks run here, so a block without a language would be skipped unseen."""
    assert _blocks(None) == []
    assert {lang for lang, _ in re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)} \
        <= {"python", "sh"}


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    printed = capsys.readouterr().out.split()
    # Independent check of the first example: E[Q] = sum_k 0.9^(2^k - 1) and its derivative in lam.
    k = np.arange(1, 40)
    EQ = np.sum(0.9 ** (2.0**k - 1))
    dEQ = np.sum((2.0**k - 1) * 0.9 ** (2.0**k - 2))
    assert abs(float(printed[0]) - EQ) < 1e-12
    assert abs(float(printed[1]) - dEQ) < 1e-9 * dEQ
    assert "2.35265" in README.read_text() and "11.9876" in README.read_text()
    assert jax.config.jax_enable_x64


def test_readme_sweep_example_flags_the_unstable_entries():
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "throw=False" in b]
    assert len(blocks) == 1
    namespace: dict = {"jax": jax, "jsmkt": __import__("jsmkt")}
    exec(compile(blocks[0], str(README), "exec"), namespace)
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
    (block,) = [b for b in _blocks() if "def lam_max" in b]
    namespace: dict = {}
    exec(compile(block.replace("lam_max(2)", "pass"), str(README), "exec"), namespace)
    import jsmkt

    for d in (1, 2, 3, 5):
        expected = optimize.brentq(_jsq_exponential_p99_excess, 0.01, 0.9 if d == 1 else 0.9999, args=(d, 10.0),
                                   xtol=1e-15)
        got = float(namespace["lam_max"](d, 10.0, jsmkt.exponential(1.0)))
        assert abs(got - expected) < 1e-10, (d, got, expected)
    # d = 1: the root is the M/M/1 closed form.
    assert abs(optimize.brentq(_jsq_exponential_p99_excess, 0.01, 0.9, args=(1, 10.0), xtol=1e-15)
               - (1 - np.log(100) / 10)) < 1e-12
