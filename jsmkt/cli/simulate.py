"""`jsmkt simulate`: the finite-N system of a spec, simulated (`jsmkt.simulate`), with the `[simulation]` table's
options and `jsmkt.simulate`'s messages in the options' names."""

import json
import math
import re
import sys
import warnings
from typing import Any

from .output import _describe, _print_table
from .spec import SpecError, _build, _check_servers, _parse, family_of, parse_simulation, simulation_from_spec


_SEED_RANGE = (-(2**63), 2**63 - 1)  # what jax.random.PRNGKey accepts
_SIMULATE_OPTION_NAMES = {
    "max_queue": "--max-queue", "n_replications": "--replications", "n_servers": "--servers", "t1": "--time",
    "warmup": "--warmup",
}
_SIMULATE_OPTIONS = re.compile(r"(?<![\w-])(" + "|".join(_SIMULATE_OPTION_NAMES) + r")\b")


def _simulated_service(spec: dict[str, Any], model, service) -> dict[str, Any]:
    """The service law `jsmkt simulate` runs: the spec's `[simulation.service]` when given, else the model's."""
    if service is not None:
        out = {"kind": spec["simulation"]["service"]["kind"], "source": "[simulation.service]"}
    elif "service" in spec:  # a family whose spec gives its service (a PH law)
        out = {"kind": spec["service"].get("kind", "ph"), "source": "[service]"}
        service = model.service
    elif hasattr(model, "service"):
        return {"kind": "exponential", "source": "mu", "mean": float(model.service.mean), "scv": 1.0}
    elif not hasattr(model, "mu"):  # a family registered at run time, without a service rate
        return {"kind": "the family's description", "source": "description", "mean": math.nan, "scv": math.nan}
    else:
        return {"kind": "exponential", "source": "mu", "mean": 1.0 / float(model.mu), "scv": 1.0}
    out["mean"], out["scv"] = float(service.mean), float(service.scv)
    if hasattr(service, "order"):
        out["order"] = int(service.order)
    return out




def _check_cpu_devices(requested: int | None) -> None:
    from .._config import max_cpu_devices, too_many_cpu_devices

    if requested is not None and requested < 1:
        raise SpecError(f"--cpu-devices={requested} must be >= 1")
    if requested is not None and requested > max_cpu_devices():
        raise SpecError(f"--cpu-devices={requested} exceeds {too_many_cpu_devices()}")


def _use_cpu_devices(requested: int | None) -> None:
    """Expose the CPU's cores as `requested` JAX devices (default: all cores), so that `simulate` runs
    replications on them in parallel."""
    from .._config import use_cpu_cores

    _check_cpu_devices(requested)
    if not use_cpu_cores(requested) and requested is not None:
        print(f"jsmkt: note: --cpu-devices={requested} ignored, JAX's devices were already set up", file=sys.stderr)


def _cmd_simulate(args) -> int:
    parsed = _parse(args)
    parse_simulation(parsed.spec, where=args.spec)
    if args.servers < 1:
        raise SpecError(f"--servers={args.servers} must be >= 1")
    if not (args.time > 0 and math.isfinite(args.time)):
        raise SpecError(f"--time={args.time} must be a positive finite time")
    if args.warmup is not None and not (math.isfinite(args.warmup) and 0 <= args.warmup < args.time):
        raise SpecError(f"--warmup={args.warmup} must be finite, >= 0 and less than --time={args.time}")
    if args.replications < 1:
        raise SpecError(f"--replications={args.replications} must be >= 1")
    if not _SEED_RANGE[0] <= args.seed <= _SEED_RANGE[1]:
        raise SpecError(f"--seed={args.seed} is out of range: give an integer from {_SEED_RANGE[0]} to "
                        f"{_SEED_RANGE[1]}")
    if args.max_queue is not None and args.max_queue < 1:
        raise SpecError(f"--max-queue={args.max_queue} must be >= 1")
    _check_cpu_devices(args.cpu_devices)
    _use_cpu_devices(args.cpu_devices)  # before JAX's first computation
    import jax.random as jr

    import jsmkt

    model = _build(parsed, args)
    kwargs = simulation_from_spec(parsed.spec, where=args.spec)
    _check_servers(model, args.servers, kwargs.get("sampling", "with_replacement"))
    options = lambda text: _SIMULATE_OPTIONS.sub(lambda m: _SIMULATE_OPTION_NAMES[m.group(1)], text)  # noqa: E731
    if args.percentiles:  # with waiting times where the family has them (simulate refuses them before running)
        kwargs |= {"percentiles": args.percentiles, "waiting_times": True}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = lambda **kw: jsmkt.simulate(  # noqa: E731
                model, args.servers, args.time, key=jr.PRNGKey(args.seed), n_replications=args.replications,
                warmup=args.warmup, max_queue=args.max_queue,
                progress=args.format == "table" and sys.stderr.isatty() or args.progress, **(kwargs | kw),
            )
            try:
                res = run()
            except ValueError as e:
                if not str(e).startswith("waiting_times=True"):
                    raise
                res = run(waiting_times=False)
    except ValueError as e:  # name simulate's arguments by their options
        raise SpecError(options(str(e))) from None
    for w in caught:  # one line each, in the options' names
        print(f"jsmkt: warning: {options(str(w.message))}", file=sys.stderr)
    service = _simulated_service(parsed.spec, model, kwargs.get("service"))
    out = res.to_dict()
    out = {"variant": "simulation", "model": type(model).__name__, "service": service, **out}
    if args.format == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_table(out, f"jsmkt simulate: N = {args.servers} servers, t = {args.time:g}, "
                          f"{args.replications} replication(s)\n" + _describe(model, service),
                     family_of(model).level, family_of(model).utilisation)
    return 0


