"""`jsmkt` console script: a thin shell over the public API.

```
jsmkt solve SPEC.toml [--format table|json] [--plot FILE] [--as-published] [--auto-K] [--servers N]
jsmkt simulate SPEC.toml --servers N --time T [--warmup W] [--replications R] [--seed S] [--format table|json]
               [--cpu-devices K] [--progress]
```
Bad specifications give one error line on stderr and exit code 2.
"""

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np

from ._spec import SpecError, load_spec, model_from_spec, service_from_spec


def _describe(model) -> str:
    from ._models.jsqd_ph import JSQdPH

    d = model.choice.number
    dtxt = str(d) if isinstance(d, int) else f"{float(d):.6g} (randomised, E[D])"
    base = f"lam = {float(model.lam):.6g}   d = {dtxt}   K = {model.K}   load rho = {float(model.load()):.6g}"
    if isinstance(model, JSQdPH):
        s = model.service
        return base + f"\nservice: PH of order {s.order}, mean {float(s.mean):.6g}, SCV {float(s.scv):.6g}"
    return base + f"\nservice: exponential, rate mu = {float(model.mu):.6g}"


def _trim(tails: np.ndarray, floor: float = 1e-300) -> list[float]:
    """Tails from k = 0 up to the last entry above `floor` (the rest is 0 to float64 precision)."""
    keep = np.nonzero(tails > floor)[0]
    n = int(keep[-1]) + 1 if len(keep) else 1
    return [float(x) for x in tails[:n]]


def _solve_exact(
    model, auto_K: bool, servers: int | None = None, sampling: str = "with_replacement"
) -> dict[str, Any]:
    import jsmkt

    fp = jsmkt.solve_fixed_point(model, auto_K=auto_K)
    model = fp.model
    s = np.asarray(jsmkt.tails(model, fp))
    out = {
        "variant": "exact",
        "model": type(model).__name__,
        "lam": float(model.lam),
        "d": float(model.choice.mean),
        "K": model.K,
        "load": float(model.load()),
        "mean_queue_length": float(jsmkt.mean_queue_length(model, fp)),
        "mean_sojourn_time": float(jsmkt.mean_sojourn_time(model, fp)),
        "mean_waiting_time": float(jsmkt.mean_waiting_time(model, fp)),
        "prob_wait": float(jsmkt.prob_wait(model, fp)),
        "utilisation": float(jsmkt.utilisation(model, fp)),
        "tail": _trim(s),
        "tail_mass_at_K": float(fp.tail_mass),
        "newton_steps": int(fp.stats["num_steps"]),
        "residual": float(fp.residual),
    }
    if hasattr(model, "phase_tails"):
        P = np.asarray(jsmkt.phase_tails(model, fp))
        out["phase_tails"] = [[float(v) for v in row] for row in P[: max(len(out["tail"]) - 1, 0)]]
    if servers is not None:
        out["refined"] = _refined(model, fp, servers, len(out["tail"]), sampling)
    return out


def _refined(model, fp, n: int, n_tail: int, sampling: str) -> dict[str, Any]:
    """The 1/N-refined mean field with `n` servers (expected values to order 1/N)."""
    import jsmkt

    rmf = jsmkt.refined_mean_field(fp, sampling)
    y = rmf.state(n)
    s = np.asarray(jsmkt.tails(model, y))
    v = np.asarray(jsmkt.tails(model, rmf.correction))[1:n_tail]  # 1/N coefficients (tails are linear)
    s_mf = np.asarray(jsmkt.tails(model, fp))[1:n_tail]
    EQ = float(jsmkt.mean_queue_length(model, y))
    return {
        "n_servers": n,
        "sampling": sampling,
        "mean_queue_length": EQ,
        "mean_sojourn_time": EQ / float(model.lam),
        "prob_wait": float(rmf.expectation(lambda y: jsmkt.prob_wait(model, y), n)),
        "utilisation": float(s[1]),
        "tail": [float(x) for x in s[:n_tail]],
        "tail_correction": [float(x) for x in v],
        "tail_std": [float(rmf.std(lambda y, k=k: jsmkt.tails(model, y)[k], n)) for k in range(1, n_tail)],
        # A relative correction beyond 30 % means N is too small for the expansion at this k.
        "tail_in_range": [bool(x) for x in np.abs(v) / n <= 0.3 * s_mf],
    }


def _solve_published(model) -> dict[str, Any]:
    import jsmkt
    from ._choice import FixedChoice
    from ._models.jsqd_ph import JSQdPH

    pub = jsmkt.published
    if not isinstance(model.choice, FixedChoice):
        raise SpecError("--as-published needs an integer d (the published formulas have no randomised d)")
    d = model.choice.d
    if isinstance(model, JSQdPH):
        pi = np.asarray(pub.ph_fixed_point(model.lam, model.service, d, model.K))
        s = np.concatenate([[1.0], pi.sum(1)])
        ET = float(pub.ph_sojourn_time(model.lam, model.service, d))
        res = pub.ph_fixed_point_residuals(model.lam, model.service, d, model.K)
        source = "Li & Lui closed form (Theorem 1) and sojourn time (Section 3)"
        extra = {"residual_in_published_equations": float(res["published"]),
                 "residual_in_exact_equations": float(res["exact"]),
                 "phase_tails": [[float(v) for v in row] for row in pi[: len(_trim(s)) - 1]]}
    else:
        s = np.asarray(pub.exponential_tails(model.lam, d, model.mu, model.K))
        ET = float(pub.exponential_sojourn_time(model.lam, d, model.mu))
        source = "rho^((d^k-1)/(d-1)) and Mitzenmacher's E[T]"
        extra = {}
    return {
        "variant": "as-published",
        "source": source,
        "model": type(model).__name__,
        "lam": float(model.lam),
        "d": d,
        "K": model.K,
        "load": float(model.load()),
        "mean_queue_length": float(np.sum(s[1:])),
        "mean_sojourn_time": ET,
        "prob_wait": float(s[1] ** d),
        "utilisation": float(s[1]),
        "tail": _trim(s),
        "tail_mass_at_K": float(s[-1]),
        **extra,
    }


def _print_table(out: dict[str, Any], header: str) -> None:
    print(header)
    rows = [
        ("mean queue length E[Q]", "mean_queue_length"),
        ("mean sojourn time E[T]", "mean_sojourn_time"),
        ("  95% CI half-width", "mean_sojourn_time_ci"),
        ("mean waiting time E[W]", "mean_waiting_time"),
        ("P(arrival waits)", "prob_wait"),
        ("utilisation s_1", "utilisation"),
        ("tail mass at K", "tail_mass_at_K"),
        ("residual (published eqs)", "residual_in_published_equations"),
        ("residual (exact eqs)", "residual_in_exact_equations"),
        ("events simulated", "events"),
    ]
    for label, key in rows:
        if key in out:
            v = out[key]
            print(f"  {label:<26} {v:.10g}" if isinstance(v, float) else f"  {label:<26} {v}")
    if "sojourn_time_percentiles" in out:
        p = out["sojourn_time_percentiles"]
        print("  sojourn time percentiles   " + "  ".join(f"{k}={v:.4g}" for k, v in p.items()))
    tail = out["tail"]
    ci = out.get("tail_ci")
    print()
    print("   k   s_k = P(Q >= k)       P(Q = k)" + ("             95% CI" if ci else ""))
    for k, sk in enumerate(tail):
        if k > 0 and sk < 1e-16:
            print(f"  ... (s_k < 1e-16 from k = {k}; see --format json)")
            break
        nxt = tail[k + 1] if k + 1 < len(tail) else 0.0
        line = f"  {k:>2}   {sk:<20.12e}  {sk - nxt:<18.10e}"
        if ci and k < len(ci):
            line += f"  ±{ci[k]:.2e}"
        print(line)


def _plot(out: dict[str, Any], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import plot_phase_tails, plot_tails

    fig, ax = plt.subplots(figsize=(6, 4))
    plot_tails(ax, out["tail"], label=f"$s_k$ ({out['variant']})", color="k")
    if out.get("phase_tails"):
        plot_phase_tails(ax, out["phase_tails"])
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _print_refined(r: dict[str, Any]) -> None:
    n = r["n_servers"]
    print(f"\nrefined mean field, N = {n} servers, sampling {r['sampling'].replace('_', ' ')} (expected values to "
          "order 1/N; sd = spread of the occupancy)")
    print(f"  {'mean queue length E[Q]':<26} {r['mean_queue_length']:.10g}")
    print(f"  {'mean sojourn time E[T]':<26} {r['mean_sojourn_time']:.10g}")
    print(f"  {'P(arrival waits)':<26} {r['prob_wait']:.10g}")
    print()
    print("   k   s_k (N servers)       1/N coefficient     sd of s_k")
    flagged = False
    for k in range(1, len(r["tail"])):
        if r["tail"][k] < 1e-16:
            break
        mark = "" if r["tail_in_range"][k - 1] else "  !"
        flagged |= bool(mark)
        print(f"  {k:>2}   {r['tail'][k]:<20.12e}  {r['tail_correction'][k - 1]:<+18.10e}  "
              f"{r['tail_std'][k - 1]:.3e}{mark}")
    if flagged:
        print("  ! the 1/N term exceeds 30% of the mean-field s_k: beyond the range of the expansion (N too small "
              "for this k)")


def _cmd_solve(args) -> int:
    spec = load_spec(args.spec)
    model = model_from_spec(spec, where=args.spec)
    if args.servers is not None:
        if args.as_published:
            raise SpecError("--servers (refined mean field) applies to the exact mean field, not --as-published")
        if args.servers < 1:
            raise SpecError(f"--servers={args.servers} must be >= 1")
    sampling = spec.get("simulation", {}).get("sampling", "with_replacement")  # as `jsmkt simulate` samples
    out = (_solve_published(model) if args.as_published
           else _solve_exact(model, args.auto_K, args.servers, sampling))
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        title = "jsmkt solve: " + ("as published" if args.as_published else "exact mean field")
        _print_table(out, title + "\n" + _describe(model))
        if "refined" in out:
            _print_refined(out["refined"])
    if args.plot:
        _plot(out, args.plot, f"{out['model']}, lam={out['lam']:g}, d={out['d']:g} ({out['variant']})")
    return 0


def _use_cpu_devices(requested: int | None) -> None:
    """Expose the CPU's cores as `requested` JAX devices (default: all cores), so that `simulate` runs
    replications on them in parallel."""
    from ._config import use_cpu_cores

    if requested is not None and requested < 1:
        raise SpecError(f"--cpu-devices={requested} must be >= 1")
    if not use_cpu_cores(requested) and requested is not None:
        print(f"jsmkt: note: --cpu-devices={requested} ignored, JAX's devices were already set up", file=sys.stderr)


def _cmd_simulate(args) -> int:
    _use_cpu_devices(args.cpu_devices)
    import jax.random as jr

    import jsmkt

    spec = load_spec(args.spec)
    sim = spec.get("simulation", {})
    model = model_from_spec(spec, where=args.spec)
    kwargs: dict[str, Any] = {}
    if "service" in sim:
        svc = sim["service"]
        kind = svc.get("kind") if isinstance(svc, dict) else None
        if kind == "deterministic":
            kwargs["service"] = jsmkt.deterministic(svc.get("mean", 1.0))
        elif kind == "lognormal":
            kwargs["service"] = jsmkt.lognormal(svc.get("mean", 1.0), svc["scv"])
        else:
            kwargs["service"] = service_from_spec(svc, where="[simulation.service]")
    if "sampling" in sim:
        kwargs["sampling"] = sim["sampling"]
    if args.servers < 1:
        raise SpecError(f"--servers={args.servers} must be >= 1")
    if not (args.time > 0 and math.isfinite(args.time)):
        raise SpecError(f"--time={args.time} must be a positive finite time")
    res = jsmkt.simulate(
        model, args.servers, args.time, key=jr.PRNGKey(args.seed), n_replications=args.replications,
        warmup=args.warmup, progress=args.format == "table" and sys.stderr.isatty() or args.progress, **kwargs,
    )
    out = res.to_dict()
    out = {"variant": "simulation", "model": type(model).__name__, **out}
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_table(out, f"jsmkt simulate: N = {args.servers} servers, t = {args.time:g}, "
                          f"{args.replications} replication(s)\n" + _describe(model))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jsmkt", description="Mean-field solver and simulator for supermarket models.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("solve", help="solve the mean-field fixed point of a model spec (TOML)")
    s.add_argument("spec", help="TOML model specification (see examples/)")
    s.add_argument("--format", choices=("table", "json"), default="table")
    s.add_argument("--plot", metavar="FILE", help="write a plot of the tails to FILE (png, pdf, svg)")
    s.add_argument("--as-published", action="store_true", help="use the papers' published closed forms")
    s.add_argument("--auto-K", action="store_true", help="grow K until the tail mass at K is negligible")
    s.add_argument("--servers", type=int, default=None, metavar="N",
                   help="also give the refined mean field (1/N correction) for N servers")
    s.set_defaults(func=_cmd_solve)

    m = sub.add_parser("simulate", help="simulate the finite-N system of a model spec (TOML)")
    m.add_argument("spec")
    m.add_argument("--servers", type=int, required=True, help="number of servers N")
    m.add_argument("--time", type=float, required=True, help="simulated time per replication")
    m.add_argument("--warmup", type=float, default=None, help="discarded initial time (default 10%% of --time)")
    m.add_argument("--replications", type=int, default=1)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--format", choices=("table", "json"), default="table")
    m.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    m.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                   help="on a CPU, run the replications on K cores in parallel (default: all cores)")
    m.set_defaults(func=_cmd_simulate)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, ValueError) as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: error: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: failed: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
