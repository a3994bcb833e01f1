"""Issue 34, plots: curves that coincide stay visible, simulated points carry error bars, axes fit their data,
`--plot --percentiles` draws the sojourn-time law, every file written is announced, and the sensitivity chart
names the service. The figures the CLI writes are inspected through their matplotlib Axes."""

import json
import pathlib

import matplotlib


matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from jsmkt import plotting  # noqa: E402
from jsmkt.cli import main  # noqa: E402


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
MM1 = 'model = "jsq"\nlam = 0.5\nd = 1\n'  # M/M/1 queues: the sojourn time is exponential of rate 1 - lam


@pytest.fixture
def figures(monkeypatch):
    """The figures `savefig` writes (the CLI closes them after writing)."""
    saved = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _style(line):
    """What tells a curve apart where it lies on another: line style, marker shape, marker size and fill."""
    return (line.get_linestyle(), line.get_marker(), line.get_markersize(), line.get_markerfacecolor())


def _tail_lines(ax):
    s_k = [line for line in ax.lines if line.get_label().startswith("$s_k$")]
    phases = [line for line in ax.lines if line.get_label().startswith("$S_k^")]
    return s_k, phases


def _assert_x_fits(ax, pad):
    """The x-axis holds every x drawn, and reaches at most `pad` beyond them on each side."""
    xs = np.concatenate([np.asarray(line.get_xdata(), float) for line in ax.lines])
    lo, hi = ax.get_xlim()
    assert lo <= xs.min() and xs.max() <= hi
    assert xs.min() - lo <= pad and hi - xs.max() <= pad, (ax.get_xlim(), xs.min(), xs.max())


def test_h2_plot_phase_curves_are_distinct_from_s_k(tmp_path, capsys, figures):
    """`jsmkt solve examples/jsq2_h2.toml --plot`: the phase-2 tail of H2 service (SCV 4) holds nearly all of s_k
    deep in the tail, and was drawn over it in the same style and marker (only the colour differed, hidden under
    s_k's markers). Each curve now has its own (line style, marker) pair, and the phase drawn on s_k has a smaller
    marker, visible inside s_k's."""
    png = tmp_path / "h2.png"
    code, out, err = run(["solve", str(EXAMPLES / "jsq2_h2.toml"), "--plot", str(png)], capsys)
    assert code == 0, err
    assert f"wrote {png}\n" in out and png.stat().st_size > 5000
    (ax,) = figures[-1].axes
    (s_k,), phases = _tail_lines(ax)
    assert len(phases) == 2
    pairs = [(line.get_linestyle(), line.get_marker()) for line in (s_k, *phases)]
    assert len(set(pairs)) == 3, pairs
    # Deep in the tail the phase-2 curve lies on s_k (within 5 % at k = 10..12) ...
    k = np.asarray(phases[1].get_xdata())
    deep = k >= 10
    s = np.asarray(s_k.get_ydata())[k[deep].astype(int)]
    np.testing.assert_allclose(np.asarray(phases[1].get_ydata())[deep], s, rtol=0.05)
    # ... and its markers sit inside s_k's: smaller, or hollow and larger.
    over = phases[1]
    assert over.get_markersize() < s_k.get_markersize() or (over.get_markerfacecolor() == "none"
                                                             and over.get_markersize() > s_k.get_markersize())
    _assert_x_fits(ax, 0.5)


def test_as_published_phase_curves_coincide_yet_both_show(tmp_path, capsys, figures):
    """`jsmkt solve examples/jsq2_erlang2.toml --as-published --plot`: the published closed form gives the two
    Erlang phases nearly equal tails, and the two curves, drawn alike, showed as one. They now differ in line
    style, marker shape and fill (one hollow and large, one filled and small). With --format json, `wrote PATH`
    goes to stderr, and stdout stays JSON."""
    png = tmp_path / "pub.png"
    code, out, err = run(["solve", str(EXAMPLES / "jsq2_erlang2.toml"), "--as-published", "--format", "json",
                          "--plot", str(png)], capsys)
    assert code == 0, err
    assert json.loads(out)["variant"] == "as-published"
    assert f"wrote {png}\n" in err and png.exists()
    (ax,) = figures[-1].axes
    (s_k,), (one, two) = _tail_lines(ax)
    np.testing.assert_allclose(one.get_ydata(), two.get_ydata(), rtol=0.6)  # they do coincide on a log plot
    assert one.get_linestyle() != two.get_linestyle() and one.get_marker() != two.get_marker()
    fills = {str(line.get_markerfacecolor()) == "none" for line in (one, two)}
    assert fills == {True, False}  # one hollow, one filled
    assert len({_style(line) for line in (s_k, one, two)}) == 3
    _assert_x_fits(ax, 0.5)


def test_solve_plot_with_percentiles_draws_the_sojourn_ccdf(tmp_path, capsys, figures):
    """`--plot` with `--percentiles` adds a panel: P(T > t) on a log scale, the percentiles marked at their
    quantiles. M/M/1 (lam = 0.5): T is exponential of rate 1/2, P(T > t) = exp(-t/2), t_p = 2 ln(1/(1-p))."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    png = tmp_path / "t.png"
    code, out, err = run(["solve", str(spec), "--percentiles", "50,99,99.99", "--plot", str(png)], capsys)
    assert code == 0, err
    assert f"wrote {png}\n" in out
    tails, ccdf = figures[-1].axes
    assert ccdf.get_yscale() == "log"
    curve = next(line for line in ccdf.lines if line.get_label() == "sojourn time")
    t, y = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata())
    assert t[0] == 0.0 and y[0] == pytest.approx(1.0)
    np.testing.assert_allclose(y, np.exp(-t / 2), rtol=1e-8, atol=1e-15)
    marks = next(line for line in ccdf.lines if line.get_label() == "percentiles")
    p = np.array([0.5, 0.99, 0.9999])
    np.testing.assert_allclose(marks.get_xdata(), 2 * np.log(1 / (1 - p)), rtol=1e-8)
    np.testing.assert_allclose(marks.get_ydata(), [0.5, 1e-2, 1e-4], rtol=1e-12)
    assert [a.get_text().split(" =")[0] for a in ccdf.texts] == ["p50", "p99", "p99.99"]
    # The time axis runs from 0 to where the curve ends, which is past the last mark and not far beyond it.
    assert ccdf.get_xlim() == (0.0, pytest.approx(t[-1]))
    assert marks.get_xdata()[-1] < t[-1] < 2 * marks.get_xdata()[-1]
    bottom, top = ccdf.get_ylim()
    assert bottom < 1e-4 < 1 < top <= 2  # the p99.99 mark is inside
    assert tails.get_yscale() == "log" and _tail_lines(tails)[0]
    # Without --percentiles the figure has the tails alone.
    code, out, err = run(["solve", str(spec), "--plot", str(png)], capsys)
    assert code == 0 and len(figures[-1].axes) == 1


def test_simulated_tails_get_error_bars_and_the_axes_fit():
    """`plot_tails(..., ci=...)` (the demo's simulated points: `SimulationResult.tails_ci`) draws 95 % error bars;
    the axes fit the points, not the bars whose lower end reaches 0 (which run off the bottom)."""
    s = np.array([1.0, 0.5, 0.2, 0.05, 1e-3, 2e-5])
    ci = np.array([0.0, 0.01, 0.01, 0.004, 5e-4, 3e-5])  # the last reaches below 0
    fig, ax = plt.subplots()
    assert plotting.plot_tails(ax, s, ci=ci, label="simulation", linestyle="none", marker="s") is ax
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars.has_yerr and not bars.has_xerr
    segments = bars.lines[2][0].get_segments()
    np.testing.assert_allclose([seg[:, 1] for seg in segments], np.stack([s - ci, s + ci], axis=1))
    np.testing.assert_allclose([seg[0, 0] for seg in segments], np.arange(6))
    assert ax.get_yscale() == "log"
    bottom, top = ax.get_ylim()
    assert bottom == pytest.approx(s.min() / 3) and top == pytest.approx(2.0)
    assert ax.get_xlim() == (-0.5, 5.5)
    assert ax.get_legend() is not None
    with pytest.raises(ValueError, match="ci has 2 entries but tails has 6"):
        plotting.plot_tails(ax, s, ci=ci[:2])
    with pytest.raises(ValueError, match="ci must hold half-widths >= 0"):
        plotting.plot_tails(ax, s, ci=-ci)
    with pytest.raises(ValueError, match="ci has 2 non-finite entries"):
        plotting.plot_tails(ax, s, ci=np.where(ci > 0.005, np.nan, ci))
    plt.close(fig)


def test_plot_sojourn_ccdf_against_the_mm1_law_and_bad_inputs():
    """The helper on its own: JSQ(1) at lam = 0.5 is M/M/1, T ~ Exp(1/2), and W = 0 with probability 1/2, else
    Exp(1/2): P(W > t) = exp(-t/2) / 2."""
    import jsmkt

    model = jsmkt.JSQd(0.5, d=1)
    fp = jsmkt.solve_fixed_point(model)
    fig, (left, right) = plt.subplots(1, 2)
    T = jsmkt.sojourn_time_distribution(model, fp)
    assert plotting.plot_sojourn_ccdf(left, T, percentiles=(90, 99.9), color="C3", lw=2) is left
    curve, marks = left.lines
    assert curve.get_color() == "C3" and curve.get_linewidth() == 2 and marks.get_color() == "C3"
    np.testing.assert_allclose(marks.get_xdata(), 2 * np.log([10, 1000]), rtol=1e-8)
    assert left.get_xlabel() == "sojourn time t" and left.get_ylabel() == "P(sojourn time > t)"
    W = jsmkt.waiting_time_distribution(model, fp)
    plotting.plot_sojourn_ccdf(right, W, percentiles=(99,), label="W")
    curve, marks = right.lines
    y = np.asarray(curve.get_ydata())
    assert curve.get_label() == "W" and y[0] == pytest.approx(0.5)  # P(wait) = lam
    np.testing.assert_allclose(marks.get_xdata(), [2 * np.log(50)], rtol=1e-8)
    assert right.get_yscale() == "log"
    for kwargs, needle in [({"percentiles": (50, 100)}, r"percentiles: 100.0 is not a percentile in \(0, 100\)"),
                           ({"percentiles": (np.nan,)}, "percentiles: nan is not a percentile"),
                           ({"floor": 0.0}, r"floor=0.0 must be a probability in \(0, 1\)")]:
        with pytest.raises(ValueError, match=needle):
            plotting.plot_sojourn_ccdf(right, T, **kwargs)
    with pytest.raises(ValueError, match="dist must be a jsmkt.TimeDistribution"):
        plotting.plot_sojourn_ccdf(right, [0.5, 0.1])
    plt.close(fig)


def test_transient_plot_says_wrote_and_fits_the_times(tmp_path, capsys, figures):
    """`jsmkt transient --plot` said nothing of the file it wrote, and its time axes ran 5 % past both ends."""
    spec = tmp_path / "mm1.toml"
    spec.write_text('model = "jsq"\nlam = 0.7\nd = 1\nK = 80\n')  # as tests/test_cli.py's transient test
    png = tmp_path / "transient.png"
    code, out, err = run(["transient", str(spec), "--time", "4", "--points", "5", "--plot", str(png)], capsys)
    assert code == 0, err
    assert f"wrote {png}\n" in out and png.stat().st_size > 5000
    for ax in figures[-1].axes:
        assert ax.get_xlim() == (0.0, 4.0)


def test_sensitivity_chart_names_the_service_and_says_wrote(tmp_path, capsys, figures):
    """The elasticity chart's title named lam and d only: the service law (H2, SCV 4 here), on which every
    elasticity depends, was missing. It now has `jsmkt solve`'s two-line description."""
    png = tmp_path / "elasticities.png"
    code, out, err = run(["sensitivity", str(EXAMPLES / "jsq2_h2.toml"), "--wrt", "lam", "--plot", str(png)],
                         capsys)
    assert code == 0, err
    assert f"wrote {png}\n" in out and png.stat().st_size > 0
    (ax,) = figures[-1].axes
    title = ax.get_title()
    assert "service: PH of order 2, mean 1, SCV 4" in title  # the line `jsmkt solve` prints
    assert "lam = 0.9" in title and title.endswith("elasticities of mean_sojourn_time")


def test_long_titles_are_broken_between_items_not_cut_off():
    """The BMAP example's title (`jsmkt solve examples/jsq_bmap.toml --as-published --plot`) ran past both edges
    of the 6-inch figure, its load cut off. Titles are now broken between the description's items."""
    from jsmkt.cli import _fit_title

    first = ("JSQdBMAP (as published): BMAP of order 2, batches 1..2 (rates 0.39, 0.0875)   d = 2   K = 20   "
             "load rho = 0.807143")
    title = first + "\nservice: exponential, rate mu = 0.7"
    fitted = _fit_title(title, 6).split("\n")
    assert all(len(line) <= 78 for line in fitted)
    assert fitted[-1] == "service: exponential, rate mu = 0.7"
    assert "   ".join(fitted[:-1]) == first  # every item kept whole, in order
    assert _fit_title(title, 20) == title
