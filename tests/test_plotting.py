"""The matplotlib helpers: each takes an `ax`, draws, returns the `ax`, and passes matplotlib's keywords on."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jsmkt import plotting  # noqa: E402


def test_helpers_return_the_ax_and_take_matplotlib_keywords():
    fig, ax = plt.subplots()
    assert plotting.plot_tails(ax, [1.0, 0.9, 0.73, 0.48], marker="s", color="k", label="JSQ(2)") is ax
    assert ax.lines[-1].get_marker() == "s"
    S = np.array([[0.5, 0.3], [0.2, 0.1], [0.05, 0.01]])
    assert plotting.plot_phase_tails(ax, S, marker="o", ls=":", label="Erlang-2") is ax
    assert [line.get_label() for line in ax.lines[-2:]] == ["Erlang-2, phase 1", "Erlang-2, phase 2"]
    assert ax.lines[-1].get_marker() == "o" and ax.lines[-1].get_linestyle() == ":"
    fig2, ax2 = plt.subplots()
    ts, s = [0.0, 1.0], [[1.0, 0.5, 0.2], [1.0, 0.6, 0.3]]
    assert plotting.plot_trajectory(ax2, ts, s, levels=(1, 2), label="run", linewidth=3) is ax2
    assert [line.get_label() for line in ax2.lines] == ["run: $s_1$", "run: $s_2$"]
    assert ax2.lines[0].get_linewidth() == 3
    plt.close(fig)
    plt.close(fig2)
