"""The command line's parser (`build_parser`: the commands, their options and help, which `docs/hooks.py` renders
into the CLI reference) and the reader of `--set`; `--percentiles`' reader is `grid.percentile_list`, with the other
option readers."""

import argparse

from . import capacity, plot, sensitivity, simulate, solve, stability, sweep, transient
from .cache import CACHE_ENV
from .grid import percentile_list as _percentile_list


def _is_number_list(token: str) -> bool:
    """Whether `token` is a number or a comma-separated list of numbers (`99`, `50,90`)."""
    try:
        [float(x) for x in token.split(",")]
    except ValueError:
        return False
    return True


def _join_percentiles(argv: list[str]) -> list[str]:
    """`argv` with the numbers after `--percentiles` (or an abbreviation argparse takes: its first four letters or
    more; or after `--percentiles=50`) joined with commas into its one value: `--percentiles 50 90 99 spec.toml`
    reads as `--percentiles 50,90,99 spec.toml`. The first token that is not a number ends the list (the spec path may
    follow it); `--` ends the options."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        out.append(token)
        i += 1
        if token == "--":
            return out + argv[i:]
        name, eq, value = token.partition("=")
        if len(name) < 4 or not "--percentiles".startswith(name):
            continue
        values = [value] if eq else []
        while i < len(argv) and _is_number_list(argv[i]):
            values.append(argv[i])
            i += 1
        if values:
            out[-1] = name
            out.append(",".join(values))
    return out


def _key_value(text: str) -> tuple[str, str]:
    """`--set KEY=VALUE` (argparse's type): the key (a TOML path, dotted for tables) and the value's text."""
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq or not key or not all(key.split(".")):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE with KEY a spec key, dotted for tables (e.g. "
                                         "lam=0.8 or service.mean=2)")
    return key, value.strip()


def _common_options() -> argparse.ArgumentParser:
    """The options every command takes."""
    c = argparse.ArgumentParser(add_help=False)
    g = c.add_argument_group("compilation cache")
    g.add_argument("--cache-dir", metavar="DIR", default=None,
                   help=f"keep JAX's compiled kernels in DIR/jax, so that later runs of the same model structure skip "
                        f"compiling (default: ${CACHE_ENV}, else $XDG_CACHE_HOME/jsmkt or ~/.cache/jsmkt; "
                        f"{CACHE_ENV}=off turns the cache off)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the compilation cache")
    c.add_argument("--family", metavar="FILE", action="append", default=[],
                   help="import the Python FILE first, which registers a model family written outside jsmkt "
                        "(jsmkt.register_family), so that the spec may name it; may be given several times")
    c.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], type=_key_value,
                   help="set the spec's KEY to VALUE (a TOML value, or a bare word for a string), KEY dotted for "
                        "tables and numbered from 0 for arrays of tables (lam=0.8, service.scv=4, classes.0.lam=0.3); "
                        "may be given several times")
    return c


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jsmkt", description="Mean-field solver and simulator for supermarket models.")
    sub = p.add_subparsers(dest="command", required=True)
    common = _common_options()

    s = sub.add_parser("solve", parents=[common], help="solve the mean-field fixed point of a model spec (TOML)")
    s.add_argument("spec", help="TOML model specification (see examples/)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    s.add_argument("--plot", metavar="FILE", help="write a plot of the tails to FILE (png, pdf, svg)")
    s.add_argument("--as-published", action="store_true", help="use the papers' published closed forms")
    s.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    s.add_argument("--servers", type=int, default=None, metavar="N",
                   help="also give the refined mean field (1/N correction) for N servers")
    s.add_argument("--order", type=int, choices=(1, 2), default=1,
                   help="order of the refined mean field with --servers: 1 (the 1/N term, default) or 2 (also the "
                        "1/N^2 term)")
    s.add_argument("--percentiles", type=_percentile_list, default=None, metavar="P,P,...",
                   help="also give these percentiles of the sojourn (and waiting) time, e.g. 50,90,99,99.9 or "
                        "50 90 99 99.9")
    s.set_defaults(func=solve._cmd_solve)

    t = sub.add_parser("transient", parents=[common],
                       help="integrate the mean-field ODE of a model spec (TOML) from empty servers over time")
    t.add_argument("spec", help="TOML model specification (see examples/)")
    t.add_argument("--time", type=float, required=True, help="the final time T")
    t.add_argument("--points", type=int, default=11, metavar="N",
                   help="report N equally spaced times from 0 to T (default: 11)")
    t.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    t.add_argument("--plot", metavar="FILE", help="write plots of s_k(t) and of the distance to the fixed point to "
                                                  "FILE (png, pdf, svg)")
    t.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    t.add_argument("--solver", choices=transient._ODE_SOLVERS, default="kvaerno5",
                   help="the ODE solver: kvaerno5 (implicit, for stiff models, e.g. fast PH phases; the default) or "
                        "tsit5 (explicit: quicker when the rates are of one scale)")
    t.add_argument("--max-steps", type=int, default=transient._TRANSIENT_MAX_STEPS, metavar="N",
                   help=f"the most ODE solver steps; a run that needs more stops with an error (default: "
                        f"{transient._TRANSIENT_MAX_STEPS})")
    t.add_argument("--progress", action="store_true",
                   help="show the integration's progress on stderr (shown anyway when stderr is a terminal and the "
                        "output a table)")
    t.set_defaults(func=transient._cmd_transient)

    m = sub.add_parser("simulate", parents=[common], help="simulate the finite-N system of a model spec (TOML)")
    m.add_argument("spec", help="TOML model specification (see examples/); an optional [simulation] table sets "
                   "sampling and may replace the service")
    m.add_argument("--servers", type=int, required=True, help="number of servers N")
    m.add_argument("--time", type=float, required=True, help="simulated time per replication")
    m.add_argument("--warmup", type=float, default=None, help="discarded initial time (default 10%% of --time)")
    m.add_argument("--replications", type=int, default=1, metavar="R",
                   help="independent replications, run in parallel; 95%% CIs come from them when R >= 2, from batch "
                        "means of the single run otherwise (default: 1)")
    m.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    m.add_argument("--max-queue", type=int, default=None, metavar="Q",
                   help="largest queue a server may hold (default: chosen from the load, the SCV and N)")
    m.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    m.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    m.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                   help="on a CPU, run the replications on K cores in parallel (default: all cores)")
    m.add_argument("--percentiles", type=_percentile_list, default=None, metavar="P,P,...",
                   help="percentiles of the sojourn (and waiting) time with 95%% CIs, e.g. 50,90,99,99.9 or 50 90 "
                        "99 99.9 (default: 50,90,99)")
    m.set_defaults(func=simulate._cmd_simulate)

    n = sub.add_parser("sensitivity", parents=[common], help="derivatives and elasticities of a metric at the fixed "
                       "point of a model spec (TOML) with respect to its parameters",
                       description=sensitivity._SENSITIVITY_DESCRIPTION)
    n.add_argument("spec", help="TOML model specification (see examples/)")
    n.add_argument("--wrt", default=None, metavar="NAMES",
                   help="parameters, separated by commas (e.g. lam,theta; default: all of the model's)")
    n.add_argument("--metric", default="mean_sojourn_time",
                   help="the metric differentiated (default: mean_sojourn_time; e.g. mean_queue_length, prob_wait, "
                        "availability, mean_orbit_size, prob_blocked)")
    n.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    n.add_argument("--plot", metavar="FILE", help="write a bar chart of the elasticities to FILE (png, pdf, svg)")
    n.set_defaults(func=sensitivity._cmd_sensitivity)

    sweep.add_parser(sub, common)
    plot.add_parser(sub, common)
    capacity.add_parser(sub, common)
    stability.add_parser(sub, common)
    return p

