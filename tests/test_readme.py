"""The README's examples run as written and print what they claim."""

import pathlib
import re

import jax
import numpy as np


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


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
