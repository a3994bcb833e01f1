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
    assert [line.get_label() for line in ax.lines[-2:]] == ["Erlang-2, $S_k^{(1)}$, phase 1 in service",
                                                            "Erlang-2, $S_k^{(2)}$, phase 2 in service"]
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


def test_tail_plots_span_the_informative_range():
    """Issue 25: `jsmkt solve --plot` drew a y-axis from 1e-312 to 1e8, the informative range squashed into its top
    tenth. JSQ(2) at lam = 0.9 has s_k = 0.9^(2^k - 1) (Mitzenmacher): 1.4e-15 at k = 8, 1.9e-30 at k = 9, 0 in
    float64 from k = 13. The axes end at the last level above 1e-16, and span the per-phase tails drawn beside."""
    k = np.arange(31)
    s = 0.9 ** (2.0**k - 1)
    fig, ax = plt.subplots()
    plotting.plot_tails(ax, s, label="$s_k$", color="k")
    last = int(np.flatnonzero(s > 1e-16)[-1])
    assert last == 8
    bottom, top = ax.get_ylim()
    assert s[last] / 10 < bottom < s[last] and 1.0 < top <= 2.0
    assert ax.get_xlim() == (-0.5, last + 0.5)
    # Per-phase tails (here made up, smaller than s_k) widen the range and read as such: thin, not solid, S_k^(i).
    S = np.stack([0.6 * s[1:], 0.4 * s[1:] ** 2], axis=1)
    plotting.plot_phase_tails(ax, S)
    phase_lines = ax.lines[1:]
    assert [line.get_label() for line in phase_lines] == ["$S_k^{(1)}$, phase 1 in service",
                                                          "$S_k^{(2)}$, phase 2 in service"]
    assert all(line.get_linestyle() not in ("-", "None") for line in phase_lines)
    assert ax.lines[0].get_linestyle() == "-"
    assert all(line.get_linewidth() < ax.lines[0].get_linewidth() for line in phase_lines)
    smallest = min(np.min(line.get_ydata()) for line in ax.lines)
    assert smallest > 1e-16 and ax.get_ylim()[0] == pytest.approx(smallest / 3)
    # `floor` lowers the range on request.
    fig2, ax2 = plt.subplots()
    plotting.plot_tails(ax2, s, floor=1e-300)
    assert ax2.get_ylim()[0] == pytest.approx(s[12] / 3)  # 0.9^4095 = 1.4e-188; s_13 is 0 in float64
    plt.close(fig)
    plt.close(fig2)


def test_model_title_names_the_model_service_and_load():
    import jsmkt

    title = plotting.model_title(jsmkt.JSQdPH(0.9, jsmkt.hyperexponential2(1.0, 4.0), d=2, K=30), "exact mean field")
    first, second = title.split("\n")
    assert first.startswith("JSQdPH (exact mean field): lam = 0.9   d = 2   K = 30   load rho = 0.9")
    assert second == "service: PH of order 2, mean 1, SCV 4"
    title = plotting.model_title(jsmkt.JSQd(0.6, d=3, mu=2.0, K=12))
    assert title == "JSQd: lam = 0.6   d = 3   K = 12   load rho = 0.3\nservice: exponential, rate mu = 2"
