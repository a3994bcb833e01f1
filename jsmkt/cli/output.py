"""Printed output shared by the commands: the results table (`_print_table`), the model's description
(`_describe`), tails trimmed where they fall below float64's range (`_trim`), and simulated estimates to the precision
of their 95 % interval (`_with_interval`). JSON output is `json.dumps(out, indent=2)` of the same dict."""

import math
from typing import Any

from .spec import describe_model


def _whole_float_d(model) -> int | None:
    """The integer a randomised choice number equals, e.g. 2 for `d = 2.0` (a TOML float, which the spec reads as a
    randomised d); None otherwise."""
    from .._choice import InterpolatedChoice

    choice = getattr(model, "choice", None)  # families with several choice numbers have none
    if not isinstance(choice, InterpolatedChoice):
        return None
    d = choice.number
    return int(d) if float(d).is_integer() else None


def _describe(model, simulated: dict[str, Any] | None = None, numbers: dict[str, float] | None = None) -> str:
    """The model's parameters and service in two lines (`_spec.describe_model`, with its `numbers` when they are
    known); `simulated` (from `_simulated_service`) names the service that `jsmkt simulate` runs instead of the
    model's."""
    base, service = describe_model(model, numbers).split("\n", 1)
    if (whole := _whole_float_d(model)) is not None:
        base = base.replace(" (randomised, E[D])", f" (randomised, E[D]) (from a TOML float: write d = {whole} for a "
                            "fixed choice number)")
    if simulated is not None:
        order = f", PH of order {simulated['order']}" if "order" in simulated else ""
        return (base + f"\nservice (simulated, from {simulated['source']}): {simulated['kind']}{order}, mean "
                f"{simulated['mean']:.6g}, SCV {simulated['scv']:.6g}")
    return base + "\n" + service




def _trim(tails, floor: float = 1e-300) -> list[float]:
    """Tails from k = 0 up to the last entry above `floor` (the rest is 0 to float64 precision)."""
    import numpy as np

    keep = np.nonzero(tails > floor)[0]
    n = int(keep[-1]) + 1 if len(keep) else 1
    return [float(x) for x in tails[:n]]




def _print_table(out: dict[str, Any], header: str, level: str = "Q", utilisation: str = "utilisation s_1") -> None:
    print(header)
    rows = [
        ("mean queue length E[Q]", "mean_queue_length"),
        ("mean sojourn time E[T]", "mean_sojourn_time"),
        ("  95% CI half-width", "mean_sojourn_time_ci"),
        ("mean waiting time E[W]", "mean_waiting_time"),
        ("mean orbit size", "mean_orbit_size"),
        ("P(primary blocked)", "prob_blocked"),
        ("P(retrial succeeds)", "prob_retrial_success"),
        ("E[T], tagged customer", "mean_sojourn_time_tagged"),
        ("availability", "availability"),
        ("jobs at failed servers", "customers_at_failed_servers"),
        ("repairmen utilisation", "repairmen_utilisation"),
        ("failed servers waiting", "fraction_failed_waiting"),
        ("P(arrival waits)", "prob_wait"),
        ("utilisation s_1", "utilisation"),
        ("tail mass at K", "tail_mass_at_K"),
        ("residual in published eqs", "residual_in_published_equations"),
        ("residual in exact eqs", "residual_in_exact_equations"),
        ("events simulated", "events"),
    ]
    rows = [(utilisation, k) if k == "utilisation" else (label, k) for label, k in rows]
    for label, key in rows:
        if key.endswith("_ci") and key[:-3] in out:
            continue  # printed beside its estimate
        if key in out:
            v = out[key]
            if isinstance(v, float) and f"{key}_ci" in out:  # a simulated estimate, to the precision of its CI
                v, h = _with_interval(v, out[f"{key}_ci"])
                print(f"  {label:<26} {v}" + (f" ± {h} (95% CI)" if h else ""))
                continue
            print(f"  {label:<26} {v:.10g}" if isinstance(v, float) else f"  {label:<26} {v}")
    if "residual_in_published_equations" in out:
        print("  (residual: max |dx/dt| below level K of the published or the exact mean-field equations at the "
              "closed form x; 0 if x solves them)")
    if "note" in out:
        print(f"  note: {out['note']}")
    for what in ("sojourn", "waiting"):
        if out.get(f"{what}_time_percentiles"):
            p, ci = out[f"{what}_time_percentiles"], out.get(f"{what}_time_percentiles_ci")
            texts = [_with_interval(v, ci.get(k)) if ci is not None else (f"{v:.4g}", None) for k, v in p.items()]
            print(f"  {what + ' time percentiles':<26} " + "  ".join(
                f"{k}={v}" + (f"±{h}" if h else "") for k, (v, h) in zip(p, texts, strict=True)))
    tail = out["tail"]
    ci = out.get("tail_ci")
    print()
    q = level
    print(f"   k   s_k = P({q} >= k){' ' * (8 - len(q))}P({q} = k)" + ("             95% CI" if ci else ""))
    for k, sk in enumerate(tail):
        if k > 0 and sk < 1e-16:
            print(f"  ... (s_k < 1e-16 from k = {k}; see --format json)")
            break
        nxt = tail[k + 1] if k + 1 < len(tail) else 0.0
        if ci is None:
            print(f"  {k:>2}   {sk:<20.12e}  {max(sk - nxt, 0.0):<18.10e}")
            continue
        # Simulated: s_k to the precision of its interval, P(= k) = s_k - s_{k+1} to that of the wider of theirs.
        h = ci[k] if k < len(ci) else None
        h_next = ci[k + 1] if k + 1 < len(ci) else None
        s_text, h_text = _with_interval(sk, h)
        p_text = _with_interval(sk - nxt, max((x for x in (h, h_next) if x is not None), default=None))[0]
        print(f"  {k:>2}   {s_text:<20}  {p_text:<18}" + (f"  ±{h_text}" if h_text else ""))


def _with_interval(x: float, h: float | None) -> tuple[str, str | None]:
    """A simulated estimate `x` and its 95% half-width `h` as text, to the precision of the interval: `h` to two
    significant digits, `x` to the same decimal place (`2.0231`, `0.1045` -> `2.02`, `0.10`). Without a positive
    finite half-width (an exact value such as s_0 = 1, or none known), `x` to 10 significant digits and `None`."""
    if h is None or not (math.isfinite(h) and h > 0) or not math.isfinite(x):
        return f"{x:.10g}", None
    place = math.floor(math.log10(h)) - 1  # the decimal place of h's second significant digit
    if round(h, -place) >= 10 ** (place + 2):  # rounding carried into the next decade: 0.0996 -> 0.10
        place += 1
    if place < 0:
        return f"{round(x, -place) + 0.0:.{-place}f}", f"{round(h, -place):.{-place}f}"
    unit = 10**place
    return f"{round(x / unit) * unit:.0f}", f"{round(h / unit) * unit:.0f}"


