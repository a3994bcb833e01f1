"""`jsmkt solve`: the mean-field fixed point of a spec, exact or as published, at the K that `solving.solve`
chooses and reports; with `--servers N` the refined mean field, with `--percentiles` the sojourn-time law's."""

import json
import sys
from typing import Any

from .output import _describe, _print_table
from .plots import _check_plot_path, _fit_title, _save_figure
from .solving import _grown_by, _outside_unit_interval, solve
from .spec import SpecError, _build, _check_servers, _parse, family_of, parse_simulation


def _cmd_solve(args) -> int:
    parsed = _parse(args)
    sampling = parse_simulation(parsed.spec, where=args.spec).get("sampling", "with_replacement")  # as simulate
    if args.servers is not None:
        if args.as_published:
            raise SpecError("--servers (refined mean field) applies to the exact mean field, not --as-published")
        if args.servers < 1:
            raise SpecError(f"--servers={args.servers} must be >= 1")
    elif args.order != 1:
        raise SpecError(f"--order {args.order} is the order of the refined mean field: give --servers N with it")
    if args.as_published and not parsed.family.published:
        raise SpecError(f"--as-published: model = {parsed.family.name!r} has no published form in jsmkt; solve it "
                        "without --as-published (the exact mean field)")
    if args.percentiles and args.as_published:
        raise SpecError("--percentiles (sojourn-time distribution) applies to the exact mean field, not --as-published")
    if args.plot:
        _check_plot_path(args.plot)
    model = _build(parsed, args)
    if args.servers is not None:
        _check_servers(model, args.servers, sampling)
    grown_by = _grown_by(args, parsed.K_given)
    out, model, described, fp = solve(model, grown_by, published=args.as_published, servers=args.servers,
                                      sampling=sampling, percentiles=args.percentiles, order=args.order)
    if args.plot:  # before printing, so that a plot that cannot be written leaves no results behind
        import jsmkt
        from ..plotting import model_title

        law = jsmkt.sojourn_time_distribution(model, fp) if args.percentiles else None
        _plot(out, args.plot, model_title(model, "as published" if args.as_published else "exact mean field"),
              args.format == "json", law, args.percentiles)
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        title = "jsmkt solve: " + ("as published" if args.as_published else "exact mean field")
        fam = family_of(model)
        _print_table(out, title + "\n" + _describe(model, numbers=described), fam.level, fam.utilisation)
        if "refined" in out:
            _print_refined(out["refined"])
    if "refined" in out and (outside := _outside_unit_interval(out["refined"])):
        shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
        print(f"jsmkt: note: N={args.servers} servers is too small for the 1/N expansion: {shown} fall outside "
              '[0, 1] (refined "in_range" is false)', file=sys.stderr)
    return 0


def _plot(out: dict[str, Any], path: str, title: str, json_output: bool = False, sojourn=None,
          percentiles=None) -> None:
    """`jsmkt solve --plot`: the tails (and per-phase tails); with `sojourn` (the mean field's sojourn-time law,
    for `--percentiles`) a second panel with its complementary CDF, the `percentiles` marked."""
    from ..plotting import plot_phase_tails, plot_sojourn_ccdf, plot_tails

    def draw(fig):
        if sojourn is None:
            ax = fig.subplots()
        else:
            ax, right = fig.subplots(1, 2)
            plot_sojourn_ccdf(right, sojourn, percentiles=percentiles or (), color="k")
            right.set_title("sojourn-time law, mean field", fontsize=9)
        plot_tails(ax, out["tail"], label=f"$s_k$ ({out['variant']})", color="k")
        if out.get("phase_tails"):
            plot_phase_tails(ax, out["phase_tails"])
        if sojourn is None:
            ax.set_title(_fit_title(title, 6), fontsize=9)
        else:
            fig.suptitle(_fit_title(title, 11), fontsize=9)

    _save_figure(draw, path, figsize=(6, 4.5) if sojourn is None else (11, 4.5), json_output=json_output)




def _print_refined(r: dict[str, Any]) -> None:
    n = r["n_servers"]
    order2 = r.get("order", 1) == 2
    print(f"\nrefined mean field, N = {n} servers, sampling {r['sampling'].replace('_', ' ')} (expected values to "
          f"order {'1/N^2' if order2 else '1/N'}; P(arrival waits) to order 1/N; sd = spread of the occupancy)")
    print(f"  {'mean queue length E[Q]':<26} {r['mean_queue_length']:.10g}")
    print(f"  {'mean sojourn time E[T]':<26} {r['mean_sojourn_time']:.10g}")
    print(f"  {'P(arrival waits)':<26} {r['prob_wait']:.10g}")
    for what in ("sojourn", "waiting"):  # beside the mean field's, printed above
        if r.get(f"{what}_time_percentiles"):
            p = r[f"{what}_time_percentiles"]
            print(f"  {what + ' time percentiles':<26} " + "  ".join(f"{k}={v:.4g}" for k, v in p.items())
                  + "  (order 1/N)")
    print()
    print("   k   s_k (N servers)       1/N coefficient     " + ("1/N^2 coefficient   " if order2 else "")
          + "sd of s_k")
    flagged = False
    for k in range(1, len(r["tail"])):
        if r["tail"][k] < 1e-16:
            break
        mark = "" if r["tail_in_range"][k] else "  !"
        flagged |= bool(mark)
        second = f"{r['tail_correction2'][k]:<+18.10e}  " if order2 else ""
        print(f"  {k:>2}   {r['tail'][k]:<20.12e}  {r['tail_correction'][k]:<+18.10e}  {second}"
              f"{r['tail_std'][k]:.3e}{mark}")
    if flagged:
        print("  ! the 1/N term exceeds 30% of the mean-field s_k: beyond the range of the expansion (N too small "
              "for this k)")


