"""Errors a new user met (issue 34, point 9): an interrupt, a key that does not apply, an empty argument, moments no
distribution has, a retrial rate too slow to truncate, a transient without progress or a step limit, and spec values
that were found only after JAX was imported."""

import ast
import importlib
import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

import jsmkt
import jsmkt.cli
from jsmkt.cli import build_parser, main


ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run(argv, capsys):
    try:
        code = main(argv)
    except KeyboardInterrupt:  # kept from pytest, which would stop the session
        pytest.fail("KeyboardInterrupt escaped jsmkt.cli.main")
    out = capsys.readouterr()
    return code, out.out, out.err


# --- Ctrl-C -------------------------------------------------------------------------------------------------------

_ARGS = {"solve": [], "transient": ["--time", "1"], "simulate": ["--servers", "10", "--time", "10"],
         "sensitivity": []}


@pytest.mark.parametrize("command", sorted(_ARGS))
def test_an_interrupt_is_one_line_and_exit_130(command, monkeypatch, capsys):
    """Ctrl-C printed a KeyboardInterrupt traceback; every command now ends with one line and 128 + SIGINT."""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(f"jsmkt.cli.{command}"), f"_cmd_{command}", interrupted)
    code, out, err = run([command, str(EXAMPLES / "jsq3_exponential.toml"), *_ARGS[command]], capsys)
    assert (code, out, err) == (130, "", "jsmkt: interrupted\n")


def test_sigint_ends_the_console_script_with_130(tmp_path):
    """A real SIGINT, raised inside a command of the console script (`run`, as `python -m jsmkt.cli`)."""
    # SIGINT's handler as a shell starts the command with it (a test runner's worker may ignore SIGINT, which its
    # children would inherit).
    code = ("import signal, jsmkt.cli, jsmkt.cli.solve\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "def command(args):\n    signal.raise_signal(signal.SIGINT)\n    return 0\n"
            "jsmkt.cli.solve._cmd_solve = command\njsmkt.cli.run()\n")
    proc = subprocess.run([sys.executable, "-c", code, "solve", str(EXAMPLES / "jsq3_exponential.toml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "jsmkt: interrupted\n")


# --- keys, arguments and moments that cannot be used ------------------------------------------------------------


def test_simulation_service_of_a_retrial_spec_names_the_key(tmp_path, capsys):
    """`[simulation.service]` on a retrial spec said `service=GeneralService(sampler=functools.partial(<function
    ...>)...): ... give service=None`, an API message with a function's repr."""
    spec = tmp_path / "r.toml"
    spec.write_text('model = "retrial"\nlam = 0.7\ntheta = 1.0\nK = 16\n'
                    '[simulation.service]\nkind = "lognormal"\nmean = 1.0\nscv = 2.0\n')
    code, out, err = run(["simulate", str(spec), "--servers", "10", "--time", "10"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "[simulation.service] is not supported for model = 'retrial'" in err, err
    assert "remove [simulation.service]" in err and "model = 'jsq'" in err
    assert "function" not in err and "GeneralService" not in err and "service=None" not in err


@pytest.mark.parametrize("lam", [[], ()])
def test_classes_without_a_class_name_lam(lam):
    """`JSQdClasses([], d=[])` said "Need at least one array to stack."."""
    with pytest.raises(ValueError, match=r"^lam=(\[\]|\(\)) gives no arrival class: give one rate per class"):
        jsmkt.JSQdClasses(lam, d=[])


@pytest.mark.parametrize("target, match", [
    ([1, 0.5, 1], r"E\[S\^2\]=0\.5 < E\[S\]\^2=1, so the variance E\[S\^2\] - E\[S\]\^2 = -0\.5 .*need E\[S\^2\] >= "
                  r"E\[S\]\^2"),
    ([2.0, 3.0], r"E\[S\^2\]=3 < E\[S\]\^2=4"),
    # Cauchy-Schwarz: E[S^2]^2 = E[S^(1/2) S^(3/2)]^2 <= E[S] E[S^3]
    ([1.0, 2.0, 3.0], r"E\[S\]\*E\[S\^3\] = 3 < E\[S\^2\]\^2 = 4: .*need E\[S\^3\] >= E\[S\^2\]\^2/E\[S\] = 4"),
    # the 3 x 3 Hankel matrix [[1, 1, 2], [1, 2, 6], [2, 6, 10]] has determinant -10 < 0
    ([1.0, 2.0, 6.0, 10.0], r"3 x 3 Hankel matrix \[E\[S\^\(i\+j\)\]\]"),
])
def test_fit_ph_refuses_moments_that_no_distribution_has(target, match):
    """`fit_ph([1, 0.5, 1], to="moments")` fitted a target with a negative variance without a word, where the
    three-moment fit refuses it."""
    with pytest.raises(ValueError, match=match):
        jsmkt.fit_ph(target, to="moments")


@pytest.mark.parametrize("moments", [
    [1.0, 1.0, 1.0, 1.0],  # a point mass at 1 (every Hankel matrix singular)
    [2.0, 5.0, 14.0, 41.0, 122.0],  # P(S = 1) = P(S = 3) = 1/2: E[S^k] = (1 + 3^k)/2, a singular 3 x 3 Hankel matrix
    [1.0, 2.0, 6.0, 24.0, 120.0, 720.0],  # the exponential, E[S^k] = k!
])
def test_moments_of_distributions_pass_the_check(moments):
    import numpy as np

    from jsmkt._fit import _check_moment_sequence

    _check_moment_sequence(np.asarray(moments))


# --- retrial models whose orbits no K holds -----------------------------------------------------------------------


def test_a_retrial_rate_too_slow_for_any_K_is_refused_at_once():
    """`RetrialJSQ(0.8, theta=1e-9)` picked K = 4096 and ran for minutes, then advised K = 8192. Linear re-probing
    retrials balance the blocked primaries, lam g1(rho) = theta E[orbit] (1 - g2(rho)), so with d1 = d2 = 2 and
    rho = 0.8 the mean orbit is 0.8 * 0.64 / (1e-9 * 0.36) = 1.42e9 customers per server."""
    mean_orbit = 0.8 * 0.8**2 / (1e-9 * (1 - 0.8**2))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^theta=1e-09 is too slow a retrial rate.* {re.escape(f'{mean_orbit:.3g}')} customers "
                                         r"per server, so K would need to be about 1\.42e\+09, above 4096"):
        jsmkt.RetrialJSQ(0.8, theta=1e-9)
    with pytest.raises(ValueError, match=rf"^K=100 cannot hold the orbits: with theta=1e-09 their mean is .* = "
                                         rf"{re.escape(f'{mean_orbit:.3g}')} customers per server"):
        jsmkt.RetrialJSQ(0.8, theta=1e-9, K=100)
    assert time.perf_counter() - start < 30
    # A slow rate whose orbits fit is sized from the same balance: E[orbit] = 142, and the default K holds it.
    model = jsmkt.RetrialJSQ(0.8, theta=0.01)
    assert 0.8 * 0.64 / (0.01 * 0.36) + 8 * (0.8 * 0.64 / (0.01 * 0.36)) ** 0.5 < model.K <= 4096


# --- transient: progress and --max-steps --------------------------------------------------------------------------


def test_transient_takes_max_steps_and_shows_progress(capsys):
    """A stiff transient ran for minutes without output, and `jsmkt transient` had no step limit."""
    spec = str(EXAMPLES / "jsq3_exponential.toml")
    base = ["transient", spec, "--time", "3", "--points", "4", "--solver", "tsit5"]
    code, out, err = run([*base, "--max-steps", "3"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith("jsmkt: failed: the ODE solver took --max-steps=3 steps without reaching t = 3") and \
        "raise --max-steps" in err
    code, out, err = run([*base, "--max-steps", "0"], capsys)
    assert code == 2 and "--max-steps=0 must be >= 1" in err
    code, out, err = run([*base, "--progress", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["times"] == [0.0, 1.0, 2.0, 3.0]
    lines = err.splitlines()
    assert lines[0] == "jsmkt: transient: 0.00% of t = 3" and lines[-1] == "jsmkt: transient: 100.00% of t = 3"
    assert all(re.fullmatch(r"jsmkt: transient: \d+\.\d\d% of t = 3", ln) for ln in lines), lines


def _parser_options() -> dict[str, set[str]]:
    """Each command's options (the top level's under "")."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    top = {o for a in parser._actions for o in a.option_strings}
    return {"": top} | {name: top | {o for a in p._actions for o in a.option_strings}
                        for name, p in sub.choices.items()}


def _option_names(node) -> set[str]:
    """The `--option` names in the string constants (f-string parts too) under an AST node."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            names |= set(re.findall(r"(?<![\w-])--[A-Za-z][A-Za-z0-9-]*", n.value))
    return names


def test_no_message_names_an_option_the_cli_lacks():
    """Every `--option` that a string in jsmkt names (messages, advice, help, docstrings) is an option of some
    command, and every one that a command's own function (`_cmd_NAME` in jsmkt/cli/NAME.py) names is an option of
    that command."""
    options = _parser_options()
    every = set().union(*options.values())
    missing = {}
    for path in sorted((ROOT / "jsmkt").rglob("*.py")):
        for name in _option_names(ast.parse(path.read_text())) - every:
            missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, missing
    commands = [f for path in sorted((ROOT / "jsmkt" / "cli").glob("*.py")) for f in ast.parse(path.read_text()).body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("_cmd_")]
    assert {f.name.removeprefix("_cmd_") for f in commands} == set(options) - {""}
    for f in commands:
        name = f.name.removeprefix("_cmd_")
        assert _option_names(f) <= options[name], (name, _option_names(f) - options[name])
    assert "--max-steps" in options["transient"] and "--progress" in options["transient"]


# --- spec values before JAX -------------------------------------------------------------------------------------

_BAD_VALUES = [
    ('model = "jsq"\nlam = 0.5\nmu = -1.0\n', "mu=-1.0 must be positive"),
    ('model = "jsq"\nlam = 0.0\n', "lam=0.0 must be positive"),
    ('model = "jsq"\nlam = 0.5\nd = 0\n', "d=0 must be >= 1"),
    ('model = "jsq"\nlam = 0.5\nd = 0.5\n', "d=0.5 must be >= 1"),
    ('model = "jsq"\nlam = 0.5\nd = [0.5, 0.6]\n', "d=[0.5, 0.6] sums to 1.1, not 1"),
    ('model = "jsq"\nlam = 0.5\nK = 1\n', "K=1 must be an integer >= 2"),
    ('model = "retrial"\nlam = 0.5\ntheta = -1.0\n', "theta=-1.0 must be positive"),
    ('model = "repairable"\nlam = 0.5\nalpha = 0.2\nbeta = 0.5\nrepair = "R3"\nj = 1.5\n', "j=1.5 must lie in [0, 1)"),
    ('model = "jsq-batch"\nbatch_rate = 0.3\nbatch_sizes = [-0.5, 1.5]\n', "batch_sizes[0]=-0.5 is negative"),
    ('model = "jsq-classes"\n[[classes]]\nlam = 0.3\n[[helpers]]\nrate = 0.0\nf = 2\n',
     "[[helpers]] 1: rate=0.0 must be positive"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "h2"\nscv = 0.5\n', "[service]: scv=0.5 must be >= 1"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "erlang"\nk = 0\n', "[service]: k=0 must be an integer >= 1"),
    ('model = "jsq-ph"\nlam = 0.5\n[service]\nkind = "coxian"\nrates = [1.0, 2.0]\nprobs = [1.5]\n',
     "[service]: probs[0]=1.5 must lie in [0, 1]"),
    ('model = "jsq"\nlam = 0.5\n[simulation.service]\nkind = "lognormal"\nscv = -2.0\n',
     "[simulation.service]: scv=-2.0 must be positive"),
]


def test_spec_value_errors_are_found_before_jax_is_imported(tmp_path):
    """A negative `mu` was found by the model's constructor, after importing JAX (1.5 s instead of 0.4 s); the scalar
    constraints (rates > 0, probabilities, d >= 1, K >= 2, a service's parameters) are now checked with the keys."""
    for i, (text, _) in enumerate(_BAD_VALUES):
        (tmp_path / f"bad{i}.toml").write_text(text)
    code = ("import sys\nfrom jsmkt.cli import main\n"
            f"codes = [main(['solve', f'bad{{i}}.toml']) for i in range({len(_BAD_VALUES)})]\n"
            "print(codes, 'jax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.stdout.strip() == f"{[2] * len(_BAD_VALUES)} False", proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == len(_BAD_VALUES)
    for line, (_, needle) in zip(lines, _BAD_VALUES, strict=True):
        assert line.startswith("jsmkt: error: ") and needle in line, (needle, line)


def test_every_example_passes_the_value_checks():
    """The checks refuse no spec the constructors accept: every example spec passes them."""
    from jsmkt._spec import read_spec_file, parse_simulation, parse_spec

    for path in sorted(EXAMPLES.glob("*.toml")):
        if path.with_suffix(".py").exists():  # a family written outside jsmkt (its own test registers it)
            continue
        spec = read_spec_file(str(path))
        parse_spec(spec, str(path))
        parse_simulation(spec, str(path))
