"""What the `jsmkt` console script prints: percentile keys, space-separated percentiles, probabilities, derivatives,
elasticities and simulated estimates, the as-published residuals, and the numbers of error messages (issue 34)."""

import json
import math
import pathlib
import re

import numpy as np
import pytest

from jsmkt.cli import main


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
MM1 = 'model = "jsq"\nlam = 0.5\nd = 1\n'  # tests/test_cli.py's M/M/1 spec: its compiled shapes are shared


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_percentile_labels_are_exact_and_distinct():
    from jsmkt._errors import percentile_label

    assert [percentile_label(p) for p in (50, 50.0, 99.9, 99.99999, 99.9999999)] == \
        ["p50", "p50", "p99.9", "p99.99999", "p99.9999999"]
    for p in np.random.default_rng(0).uniform(0.0, 100.0, 200):
        assert float(percentile_label(p)[1:]) == p


def test_percentiles_close_to_100_keep_their_own_keys(tmp_path, capsys):
    """`--percentiles 99.99999,99.9999999` (both printed as `p100`, one dropped): both keys, each with its own value.
    M/M/1 with lam = 0.5: the sojourn time is exponential of rate 1/2, its p-th percentile -2 ln(1 - p/100)."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    code, out, err = run(["solve", str(spec), "--percentiles", "99.99999,99.9999999", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)["sojourn_time_percentiles"]
    assert res == pytest.approx({"p99.99999": -2 * math.log(1e-7), "p99.9999999": -2 * math.log(1e-9)}, rel=1e-6)
    code, out, err = run(["solve", str(spec), "--percentiles", "99.99999,99.9999999"], capsys)
    assert code == 0 and "p99.99999=32.24  p99.9999999=41.45" in out, out


def test_solve_takes_space_separated_percentiles(tmp_path, capsys):
    """`--percentiles 50 90 99` was refused with the top-level usage; a spec path after the list is the spec, and
    comma and space separated lists mix."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    code, out, err = run(["solve", "--percentiles", "50", "99.9", str(spec)], capsys)
    assert code == 0 and "p50=1.386" in out and "p99.9=13.82" in out, err
    code, out, err = run(["solve", str(spec), "--percentiles", "50,90", "99", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)["sojourn_time_percentiles"]
    assert res == pytest.approx({f"p{p}": -2 * math.log(1 - p / 100) for p in (50, 90, 99)}, rel=1e-9)


def test_simulate_percentiles_close_to_100_keep_their_own_keys(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    code, out, err = run(["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "2",
                          "--percentiles", "50,99.99999,99.9999999", "--format", "json"], capsys)
    assert code == 0, err
    sim = json.loads(out)
    for key in ("sojourn_time_percentiles", "sojourn_time_percentiles_ci", "waiting_time_percentiles",
                "waiting_time_percentiles_ci"):
        assert set(sim[key]) == {"p50", "p99.99999", "p99.9999999"}, key


def test_simulate_takes_space_separated_percentiles_before_the_spec(tmp_path, capsys):
    """`jsmkt simulate --percentiles 50 90 99 SPEC ...` was refused with the top-level usage: the list is read, the
    spec after it is read as the spec (its option errors come next)."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    argv = ["simulate", "--percentiles", "50", "90", "99.9", str(spec), "--servers", "0", "--time", "10"]
    code, out, err = run(argv, capsys)
    assert code == 2 and err == "jsmkt: error: --servers=0 must be >= 1\n", err
    from jsmkt.cli import _join_percentiles, build_parser

    args = build_parser().parse_args(_join_percentiles(argv))
    assert args.percentiles == (50, 90, 99.9) and args.spec == str(spec)
    args = build_parser().parse_args(_join_percentiles(["simulate", str(spec), "--perc=50", "99", "--servers", "3",
                                                        "--time", "1"]))
    assert args.percentiles == (50, 99) and args.servers == 3


def test_simulate_table_prints_to_the_precision_of_the_intervals(tmp_path, capsys):
    """The table prints each simulated estimate with the decimals of its 95 % half-width's two significant digits
    (it printed E[T] = 2.023114118 with a half-width 0.1044904258): equal to the JSON's estimate rounded there."""
    spec = tmp_path / "m.toml"
    spec.write_text(MM1)
    args = ["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "2", "--percentiles",
            "50,99.9"]
    code, out, err = run(args + ["--format", "json"], capsys)
    assert code == 0, err
    sim = json.loads(out)
    code, table, err = run(args, capsys)
    assert code == 0, err

    def check(text, est, ci):
        """`text` = 'x ± h' or 'x±h': h is ci to 2 significant digits, x is est at h's last decimal."""
        if "±" not in text:  # an exact estimate (all sections alike): no interval
            assert ci == 0.0 and float(text) == est, (text, est, ci)
            return
        x, h = re.split(r" ?± ?", text)
        assert float(h) == pytest.approx(float(f"{ci:.2g}"), rel=1e-9), (text, ci)
        place = math.floor(math.log10(float(h))) - 1  # the decimal place of h's second significant digit
        assert (len(x.split(".")[1]) if "." in x else 0) == max(0, -place), text
        assert abs(float(x) - est) <= 0.5 * 10**place * (1 + 1e-9), (text, est)

    for label, key in (("mean sojourn time E[T]", "mean_sojourn_time"),
                       ("mean queue length E[Q]", "mean_queue_length")):
        line = next(ln for ln in table.splitlines() if ln.strip().startswith(label))
        check(line.split(label)[1].split("(95% CI)")[0].strip(), sim[key], sim[key + "_ci"])
    for what in ("sojourn", "waiting"):
        line = next(ln for ln in table.splitlines() if f"{what} time percentiles" in ln)
        items = line.split("percentiles")[1].split()
        assert [item.split("=")[0] for item in items] == ["p50", "p99.9"]
        for item in items:
            name, text = item.split("=")
            check(text, sim[f"{what}_time_percentiles"][name], sim[f"{what}_time_percentiles_ci"][name])
    rows = [ln.split() for ln in table.splitlines() if re.match(r"^\s+\d+\s+\d", ln)]
    assert [r[0] for r in rows][:3] == ["0", "1", "2"] and len(rows) > 5
    assert rows[0][1] == "1"  # s_0 = 1 exactly: no interval
    for r in rows[1:]:
        k = int(r[0])
        check(f"{r[1]} {r[3]}", sim["tail"][k], sim["tail_ci"][k])


def test_solve_prints_probabilities_clipped_at_zero(capsys):
    """The retrial example's tails fall below 1e-40 by k = 10, where the solver's rounding noise has either sign
    (it printed s_10 = -1.1e-40): every printed probability is >= 0, and the tails do not rise above that noise."""
    code, out, err = run(["solve", str(EXAMPLES / "retrial_reprobe.toml"), "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    tail = np.array(res["tail"])
    assert np.all(tail >= 0.0) and res["tail_mass_at_K"] >= 0.0
    assert np.all(np.diff(tail)[:9] < 0) and np.all(tail[10:] < 1e-39)


def test_sensitivity_prints_zero_derivatives_as_zero(capsys):
    """JSQ(3), lam = 0.95, mu = 1: the throughput is lam, so dX/dlam = 1 and the derivatives with respect to mu and d
    are 0, which printed as rounding noise (4e-16, -2e-16)."""
    spec = str(EXAMPLES / "jsq3_exponential.toml")
    code, out, err = run(["sensitivity", spec, "--metric", "throughput", "--format", "json"], capsys)
    assert code == 0, err
    p = json.loads(out)["parameters"]
    assert p["lam"]["derivative"] == pytest.approx(1.0, rel=1e-12)
    for name in ("mu", "d"):
        assert p[name]["derivative"] == 0.0 and p[name]["elasticity"] == 0.0, p[name]
    code, out, err = run(["sensitivity", spec, "--metric", "throughput"], capsys)
    assert code == 0, err
    rows = {ln.split()[0]: ln.split()[2:] for ln in out.splitlines()
            if ln.split()[:1] in (["lam"], ["mu"], ["d"]) and " = " not in ln}
    assert rows["mu"] == ["0", "0"] and rows["d"] == ["0", "(right)", "0"], rows


def test_sensitivity_help_states_the_zero_threshold(capsys):
    with pytest.raises(SystemExit):
        main(["sensitivity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "below 1e-10 times the larger of |M| and the largest such product over the parameters is printed as 0" \
        in text, text


def test_sensitivity_gives_no_elasticity_of_a_zero_metric(capsys):
    """JSQ(3), lam = 0.95 at K = 13: the tail mass at K is 0 in float64 (the tails fall as lam^((3^k - 1)/2)), where
    the elasticities (theta/M) dM/dtheta are undefined; they printed as nan (and NaN in the JSON, which is not
    JSON)."""
    spec = str(EXAMPLES / "jsq3_exponential.toml")
    code, out, err = run(["sensitivity", spec, "--metric", "tail_mass_at_K", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert res["value"] == 0.0 and "undefined" in res["note"]
    assert all(v["elasticity"] is None and v["derivative"] == 0.0 for v in res["parameters"].values())
    code, out, err = run(["sensitivity", spec, "--metric", "tail_mass_at_K"], capsys)
    assert code == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["lam"], ["mu"], ["d"]) and " = " not in ln]
    assert [r[-1] for r in rows] == ["-", "-", "-"] and "nan" not in out
    assert "-: tail_mass_at_K is 0, where its elasticity (theta/M) dM/dtheta is undefined" in out


def test_as_published_says_what_its_residuals_are(capsys):
    code, out, err = run(["solve", str(EXAMPLES / "jsq2_erlang2.toml"), "--as-published"], capsys)
    assert code == 0, err
    assert re.search(r"residual in published eqs\s+0\.18225", out) and "residual in exact eqs" in out
    assert "(residual: max |dx/dt| below level K of the published or the exact mean-field equations at the closed " \
           "form x; 0 if x solves them)" in out


def test_messages_print_the_digits_that_tell_numbers_apart(tmp_path, capsys):
    """lam = 1 + 1e-7 was refused as 'lam=1 >= capacity mu=1 (load rho=1)'."""
    spec = tmp_path / "m.toml"
    spec.write_text('model = "jsq"\nlam = 1.0000001\n')
    code, out, err = run(["solve", str(spec)], capsys)
    assert code == 2 and "unstable: lam=1.0000001 >= capacity mu=1 per server (load rho=1.0000001)" in err, err
    from jsmkt._errors import number_texts

    assert number_texts([0.9, 5 / 7]) == ["0.9", "0.714286"]  # 6 significant digits where they suffice
    assert number_texts([1.0000000000000002, 1.0]) == ["1.0000000000000002", "1"]
    assert number_texts([0.3, 0.30000000000000004]) == ["0.3", "0.30000000000000004"]
