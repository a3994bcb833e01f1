"""`jsmkt capacity`: the largest load (`jsmkt.max_load`) or the smallest choice number (`jsmkt.min_choice`) that
meets bounds on metrics, at every point of an optional grid over the spec's parameters."""

import argparse
import itertools
import json
import math
import re
import sys
from typing import Any

from .grid import bound_option, grid_option, grid_values
from .spec import SpecError, _apply_overrides, _parse, parse_spec


_DEFAULT_CANDIDATES = tuple(range(1, 11))

_DESCRIPTION = (
    "The largest value of a parameter (--over, default lam) at which every bound (--bound NAME=VALUE: metric <= "
    "VALUE) holds, by Newton's method on the differentiable metrics with K chosen at each iterate (jsmkt.max_load); "
    "or, for a choice number (--over d), the smallest among --candidates that meets them at the spec's load "
    "(jsmkt.min_choice). A bound names a metric (mean_sojourn_time, mean_waiting_time, prob_wait, "
    "mean_queue_length, utilisation, ...; the family's own, e.g. mean_orbit_size) or a percentile of the sojourn or "
    "waiting time (sojourn_p99, waiting_p99, sojourn_p99.9; p99 is short for sojourn_p99). With --grid, every point "
    "of the grid (the spec with those values set; an integer d is a fixed choice number, a real one randomised, as "
    "in TOML) gets its answer and the bound that binds: 'stability' where every bound holds up to the stability "
    "limit (the load 1), which is then the answer.")


def _candidate_list(text: str) -> tuple[int, ...]:
    """`--candidates 1,2,3,5` (or `1:10:10`): choice numbers, integers >= 1 (argparse's type)."""
    values = grid_values(text, "--candidates")
    bad = [v for v in values if not (isinstance(v, int) or float(v).is_integer()) or v < 1]
    if bad:
        raise argparse.ArgumentTypeError(f"--candidates: {bad[0]!r} is not a choice number (an integer >= 1)")
    return tuple(sorted({int(v) for v in values}))


def add_parser(sub, common) -> None:
    """Add the `capacity` command to the subparsers `sub` (`common`: the options every command takes)."""
    c = sub.add_parser("capacity", parents=[common], description=_DESCRIPTION,
                       help="the largest load, or the smallest choice number, that meets bounds on metrics "
                            "(mean sojourn time, p99, ...) for a model spec (TOML), per point of a grid")
    c.add_argument("spec", help="TOML model specification (see examples/)")
    c.add_argument("--bound", metavar="NAME=VALUE", action="append", type=bound_option, required=True,
                   help="a bound metric <= VALUE: a metric (mean_sojourn_time, prob_wait, ...) or a percentile "
                        "(p99, sojourn_p99.9, waiting_p99); may be given several times, every bound must hold")
    c.add_argument("--over", metavar="NAME", default="lam",
                   help="the parameter searched: a rate that raises the load (default: lam; e.g. service.mean), "
                        "its largest value meeting the bounds; or a choice number (d), its smallest value among "
                        "--candidates")
    c.add_argument("--grid", metavar="NAME=VALUES", action="append", type=grid_option, default=[],
                   help="answer at every value of the spec key NAME: START:STOP:NUM (NUM values, both ends "
                        "included) or a list (d=1,2,3,5); several --grid give their product")
    c.add_argument("--candidates", metavar="LIST", type=_candidate_list, default=None,
                   help="the choice numbers tried with --over d (default: 1 to 10)")
    c.add_argument("--max-K", type=int, default=4096, metavar="N", dest="max_K",
                   help="the largest truncation level a solve may use (default: 4096)")
    c.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    c.set_defaults(func=_cmd_capacity)


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _cmd_capacity(args) -> int:
    from .cache import _use_compilation_cache

    parsed = _parse(args)  # the spec and its --set overrides, checked without JAX
    bounds: dict[str, float] = {}
    for name, value in args.bound:
        if name in bounds:
            raise SpecError(f"--bound {name} is given twice")
        bounds[name] = value
    names = [name for name, _ in args.grid]
    if len(set(names)) != len(names):
        raise SpecError(f"--grid {next(n for n in names if names.count(n) > 1)} is given twice")
    if args.over in names:
        raise SpecError(f"--grid {args.over}: {args.over} is the parameter --over searches; grid other keys")
    if args.max_K < 2:
        raise SpecError(f"--max-K={args.max_K} must be >= 2")
    points = [dict(zip(names, values, strict=True)) for values in itertools.product(*(v for _, v in args.grid))]
    tables = []
    for point in points:  # every point's spec checked before any solve
        try:
            table = _apply_overrides(parsed.spec, point, args.spec)
            parse_spec(table, where=f"{args.spec} at {_label(point)}" if point else args.spec)
        except SpecError as e:
            raise SpecError(re.sub(r"^(--set|override) ", "--grid ", str(e))) from None
        tables.append(table)
    _use_compilation_cache(args)
    import jsmkt
    from .._capacity import _bounds, _model_of, _parameter

    model, _ = _model_of(tables[0], args.spec)
    _, p = _parameter(model, args.over, "give a rate that raises the load (lam) or a choice number (d)")
    _bounds(model, bounds)  # unknown names refused once, not at every point
    choice = p.kind == "choice"
    if args.candidates is not None and not choice:
        raise SpecError(f"--candidates: --over {args.over} is not a choice number; candidates are tried for one "
                        "(--over d)")
    args.candidates = args.candidates or _DEFAULT_CANDIDATES
    rows, errors = [], []
    for point, table in zip(points, tables, strict=True):
        try:
            if choice:
                cap = jsmkt.min_choice(table, bounds, over=args.over, candidates=args.candidates, max_K=args.max_K)
            else:
                cap = jsmkt.max_load(table, bounds, over=args.over, max_K=args.max_K)
        except (ValueError, RuntimeError) as e:
            # One point: its error is the command's. On a grid, a point without an answer (no load meets the
            # bounds, no candidate does, its metrics cannot be computed) is a row with its reason.
            if not point:
                raise
            lines = str(e).strip().splitlines()
            reason = lines[0] if lines else type(e).__name__
            errors.append(type(e)(f"at {_label(point)}: {reason}"))
            rows.append({**point, args.over: None, "binding": None, "metrics": {k: None for k in bounds},
                         "error": reason})
            continue
        d = cap.to_dict()
        rows.append({**point, args.over: d[args.over], "binding": d["binding"], "metrics": d["metrics"],
                     "K": d["K"], **({"limit": d["limit"]} if not choice else {})})
    if len(errors) == len(rows):  # no point has an answer: the first one's reason
        raise errors[0]
    if args.format == "json":
        out: dict[str, Any] = {"over": args.over, "bounds": bounds, "results": rows}
        if len(rows) == 1:
            out.update({args.over: rows[0][args.over], "binding": rows[0]["binding"], "metrics": rows[0]["metrics"]})
        print(json.dumps(out, indent=2))
    else:
        _print(args, bounds, names, rows, choice)
    if errors:
        print(f"jsmkt: note: {len(errors)} of {len(rows)} points have no answer (\"error\" in their results); "
              f"first {errors[0]}", file=sys.stderr)
    return 0


def _print(args, bounds: dict[str, float], names: list[str], rows: list[dict[str, Any]], choice: bool) -> None:
    what = f"the smallest {args.over} among {', '.join(map(str, args.candidates))}" if choice else \
        f"the largest {args.over}"
    print(f"jsmkt capacity: {what} meeting " + ", ".join(f"{k} <= {v:g}" for k, v in bounds.items()))
    print(f"spec: {args.spec}" + "".join(f" --set {k}={v}" for k, v in args.set))
    columns = [*names, args.over, "binding", *bounds]

    def cell(row, col):
        v = row[col] if col in row else row["metrics"][col]
        if v is None:
            return "-" if col != "binding" else "none"
        if isinstance(v, float):
            return "-" if not math.isfinite(v) else f"{v:.10g}" if col == args.over else f"{v:.6g}"
        return str(v)

    table = [[cell(r, c) if "error" not in r or c in names else "-" for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(columns)]
    print()
    print("  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for t in table:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())
    if any(r["binding"] == "stability" for r in rows):
        print(f"  stability: every bound holds up to the stability limit (the load 1), the {args.over} given")
    for r in rows:
        if "error" in r:
            print(f"  -: no answer at {_label({k: r[k] for k in names})}: {r['error']}")
    if choice and any(r["binding"] is None and "error" not in r for r in rows):
        print(f"  none: the smallest candidate, {args.candidates[0]}, meets every bound")
