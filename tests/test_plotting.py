"""The matplotlib helpers: each takes an `ax`, draws, returns the `ax`, and passes matplotlib's keywords on."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

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


def test_trajectory_refuses_reduced_states_and_levels_out_of_range():
    # Regression: `plot_trajectory(ax, traj.ts, traj.ys)` (reduced states s_1..s_K, no s_0) plotted s_2 labelled
    # s_1; levels beyond K plotted nothing and level -1 plotted s_K, silently.
    import jax
    import jax.numpy as jnp

    import jsmkt

    model = jsmkt.JSQd(0.7, d=2, K=10)
    traj = jsmkt.integrate(model, 2.0, ts=jnp.linspace(0.0, 2.0, 5))
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=r"first column is not 1\): for a jsmkt.integrate trajectory pass"):
        plotting.plot_trajectory(ax, traj.ts, traj.ys)
    S = jax.vmap(lambda y: jsmkt.tails(model, y))(traj.ys)
    for levels in [(11,), (-1,), (0,), (1.5,)]:
        with pytest.raises(ValueError, match=r"each level must be an integer from 1 to K=10"):
            plotting.plot_trajectory(ax, traj.ts, S, levels=levels)
    with pytest.raises(ValueError, match="tails_over_time has 5 rows but ts has 4 times"):
        plotting.plot_trajectory(ax, traj.ts[:4], S)
    assert not ax.lines  # nothing was drawn
    plotting.plot_trajectory(ax, traj.ts, S, levels=(1, 10))
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), np.asarray(traj.ys[:, 0]))  # s_1
    plt.close(fig)


@pytest.mark.parametrize("call, needle", [
    (lambda ax: plotting.plot_tails(ax, [1.0, np.nan, 0.1]), r"tails has 1 non-finite entries \(first at index \(1,\)"),
    (lambda ax: plotting.plot_tails(ax, [1.0, np.inf]), "tails has 1 non-finite entries"),
    (lambda ax: plotting.plot_tails(ax, [[1.0, 0.5]]), r"tails must be a non-empty 1-D array \(got shape \(1, 2\)\)"),
    (lambda ax: plotting.plot_tails(ax, []), r"got shape \(0,\)"),
    (lambda ax: plotting.plot_tails(ax, None), r"tails must be a non-empty 1-D array \(got shape \(\)\)"),
    (lambda ax: plotting.plot_phase_tails(ax, [0.5, 0.2]), r"phase_tails must be a non-empty 2-D array"),
    (lambda ax: plotting.plot_phase_tails(ax, [[0.5, 0.2], [0.1]]), "phase_tails must be a 2-D array .* of numbers"),
    (lambda ax: plotting.plot_phase_tails(ax, [[0.5, 0.2]], ls=":", linestyle="-"), "give ls or linestyle, not both"),
    (lambda ax: plotting.plot_trajectory(ax, [0.0], [1.0, 0.5]), "tails_over_time must be a non-empty 2-D array"),
])
def test_bad_inputs_are_refused_naming_the_argument(call, needle):
    # Regression: NaN tails (a failed solve) plotted as a clean curve; odd shapes gave IndexError or "tuple index
    # out of range"; ls and linestyle together let ls win.
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=needle):
        call(ax)
    assert not ax.lines
    plt.close(fig)
