"""Model specs for the commands: the spec file read (`_read_spec`, the one place that calls `_spec`'s reader), its
`--set KEY=VALUE` overrides applied, checked without JAX (`_parse`), and the model built (`_build`, which sets up the
compilation cache first: JAX is imported there).

The names of `jsmkt._spec` that the commands use are re-exported here, so that the commands import the spec layer
from one module."""

import re
from typing import Any

from .._spec import (
    SpecError,
    _load_and_service_dict,
    apply_overrides,
    build_model,
    describe_model,
    family_of,
    load_family_file,
    parse_simulation,
    parse_spec,
    read_spec_file,
    simulation_from_spec,
)


__all__ = [
    "SpecError", "_load_and_service_dict", "build_model", "describe_model", "family_of", "load_family_file",
    "parse_simulation", "parse_spec", "simulation_from_spec",
]


def _apply_overrides(spec: dict[str, Any], overrides: dict[str, str] | None, where: str = "spec") -> dict[str, Any]:
    """`spec` with each `KEY=VALUE` of `overrides` (`--set`) set, as `jsmkt.load_spec(path, overrides)` sets them
    (`_spec.apply_overrides`: `KEY` a TOML path, dotted for tables and numbered from 0 for arrays of tables, `VALUE`
    TOML value text); its errors name the option as the user wrote it."""
    try:
        return apply_overrides(spec, overrides, where)
    except SpecError as e:
        raise SpecError(re.sub(r"^override ", "--set ", str(e))) from None


def _read_spec(path: str, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The TOML table of the spec file `path`, with `overrides` (`--set`) applied."""
    return _apply_overrides(read_spec_file(path), overrides, path)


def _overrides(args) -> dict[str, str]:
    """The `--set KEY=VALUE` options as a dict (a key given twice: the last value)."""
    return dict(getattr(args, "set", None) or [])


def _parse(args):
    """The spec file `args.spec` with its `--set` overrides, read and checked (family, keys, types) without
    importing JAX."""
    return parse_spec(_read_spec(args.spec, _overrides(args)), where=args.spec)


def _build(parsed, args):
    """The model of a checked spec. JAX is imported here: its compilation cache is set up first."""
    from .cache import _use_compilation_cache

    _use_compilation_cache(args)
    return build_model(parsed)


def _check_servers(model, n: int, sampling: str) -> None:
    """`--servers N` must be >= 1, and at least the largest choice number when sampling without replacement."""
    import numpy as np

    from .._choice import choice_support

    if n < 1:
        raise SpecError(f"--servers={n} must be >= 1")
    max_d = max((choice_support(np.asarray(disp.choice.weights())) or (1, 1))[1]
                for disp in model.description().dispatches)
    if sampling == "without_replacement" and max_d > n:
        raise SpecError(f"d={max_d} exceeds --servers={n}: cannot sample {max_d} distinct servers without "
                        'replacement ([simulation] sampling = "without_replacement")')
