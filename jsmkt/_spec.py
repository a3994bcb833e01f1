"""TOML model specifications (used by the CLI).

```toml
model = "jsq-ph"      # "jsq" (exponential service), "jsq-ph", "jsq-batch" (batch_rate, batch_sizes, d, mu, K),
                      # "jsq-classes" ([[classes]] tables of lam, d, batch_sizes; mu or [service]; optional
                      # [[helpers]] tables of rate and f, helpers that serve the longest of f queues; K),
                      # "jsq-batch-service" (lam, d, [service] epochs, service_batch_sizes, K),
                      # "jsq-bmap" ([arrivals] table of C and D, the BMAP per server; d, mu, K) or
                      # "retrial" (lam, theta, d1, d2, mu, retrial = "reprobe"|"own", policy = "linear"|"constant", K)
                      # or "repairable" (lam, alpha, beta, d1, d2, mu, arrival = "A1"|"A2", repair = "R1"|"R2"|"R3",
                      # j for R3, K)
lam = 0.9             # arrival rate per server
d = 2                 # integer, real (randomised choice number) or list of probabilities over 1, 2, ... servers
K = 48                # optional truncation level (integer)
mu = 1.0              # "jsq" only: service rate

[service]             # "jsq-ph" only
kind = "erlang"       # exponential | erlang | hyperexponential | h2 | coxian | coxian2 | ph | moments (alpha and T
                      # alone, without kind, are a ph)
k = 2                 # erlang: phases;  mean = 1.0 for erlang / h2 / coxian2 / exponential (or rate, not both)
# h2, coxian2: mean, scv;  hyperexponential: probs, rates;  coxian: rates, probs;  ph: alpha, T
# moments: m1, m2, m3 (Telek-Heindl PH(2) fit; clip = true projects infeasible moments onto the PH(2) range)

[arrivals]            # "jsq-bmap" only: the BMAP (C, D_1, D_2, ...) per server
C = [[-0.52, 0.02], [0.0, -0.41]]                    # phase moves without arrivals; diagonal: minus the total rate
D = [[[0.5, 0.0], [0.06, 0.0]], [[0.0, 0.0], [0.0, 0.35]]]   # D[b-1]: rates of batches of b (one matrix: a MAP)

[simulation]          # optional, read by `jsmkt simulate` (and by `jsmkt solve --servers` for `sampling`)
sampling = "with_replacement"   # or "without_replacement"
[simulation.service]  # optional service for the simulation: any [service] kind, or
kind = "lognormal"    # deterministic (mean) | lognormal (mean, scv)
mean = 1.0
scv = 2.0
```
Numbers are TOML integers or floats (finite), integer keys (`K`, `k`, an integer `d`) TOML integers, `clip` a
boolean.

A spec is read in two steps: `parse_spec` checks its family, keys, value types and scalar constraints (rates > 0,
probabilities in [0, 1] summing to 1, d >= 1, K >= 2, a service's parameters) and gives the constructor's
arguments, without importing JAX (the CLI answers a bad spec at once), then `build_model` builds the model (the
constructor checks the values again, and what needs JAX: stability, a PH's or a BMAP's matrices).
`model_from_spec` does both. A family written outside jsmkt joins `FAMILIES` at run time (`register_family`,
below).

The registry `FAMILIES` is generated from the families' tables (`table` of each family's class,
`jsmkt._models.parameters`), read from their files without importing them: the keys, the checks by kind, the
named parameters for sensitivities, the example specs. What runs on a built model comes from the class: its
examples, its description line and JSON parameters (`describe_parameters`, `spec_values`) and its own metrics
(its observables). This module names no family's class.

From Python, `load_model_spec` and `loads_model_spec` (`jsmkt.load_spec`, `jsmkt.loads_spec`) build the model of a
spec with overrides by TOML path (`apply_overrides`, as the CLI's `key=value` overrides), and `dump_model_spec`
(`jsmkt.dump_spec`) writes the spec of a model; `read_spec_file` reads a spec file's TOML table.
"""

import functools
import math
import tomllib
from collections.abc import Callable
from typing import Any, NamedTuple

import jsmkt

from ._models.parameters import (
    KINDS,
    OMIT,
    REQUIRED,
    FamilyTable,
    NamedParameter,
    builtin_families,
    register_table,
    sensitivity_parameters,
    signature_table,
)
from ._models.parameters import Parameter as TableParameter


class SpecError(ValueError):
    """A model specification that cannot be used; the message names the key and the value."""


SERVICE_KINDS = ("exponential", "erlang", "hyperexponential", "h2", "coxian", "coxian2", "ph", "moments")
SIMULATION_KINDS = ("deterministic", "lognormal")
SAMPLING = ("with_replacement", "without_replacement")
_MISSING = object()


def show(value: Any) -> str:
    """`value` for an error message: plain numbers, quoted strings, `true`/`false` as in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(show, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    return str(value)


_MAX_SPEC_BYTES = 2**20  # a model spec is a few lines; refuse to read /dev/zero or a huge file whole


def read_spec_file(path: str) -> dict[str, Any]:
    """The TOML table of the spec file `path` (UTF-8, a leading byte-order mark allowed); `SpecError` naming the
    file otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_SPEC_BYTES + 1)
        if len(data) > _MAX_SPEC_BYTES:
            raise SpecError(f"{path}: larger than {_MAX_SPEC_BYTES // 2**20} MiB; a model spec is a short TOML file")
        return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory; give a TOML spec file") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start}); a TOML spec must be UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None


def read_spec_text(text: str, where: str = "spec") -> dict[str, Any]:
    """The TOML table of the spec text `text`; `SpecError` naming `where` when it is not valid TOML."""
    if not isinstance(text, str):
        raise SpecError(f"{where}: text={text!r} must be a string of TOML")
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{where}: not valid TOML ({e})") from None


def _require(table: dict, key: str, where: str):
    if key not in table:
        raise SpecError(f"{where}: missing key {key!r}")
    return table[key]


def _allowed(table: dict, keys: set[str], where: str):
    unknown = sorted(set(table) - keys)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(keys))}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x: int | float) -> bool:
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer beyond the float range
        return False


def _number(table: dict, key: str, where: str, default: Any = _MISSING, *, positive: bool = False) -> float:
    """A finite TOML integer or float (not a boolean or a string)."""
    if key not in table and default is not _MISSING:
        return default
    v = _require(table, key, where)
    if not _is_number(v):
        raise SpecError(f"{where}: {key}={show(v)} must be a number (a TOML integer or float)")
    if not _finite(v):
        raise SpecError(f"{where}: {key}={show(v)} must be finite")
    if positive and not v > 0:
        raise SpecError(f"{where}: {key}={show(v)} must be positive")
    return float(v)


def _integer(table: dict, key: str, where: str, default: Any = _MISSING) -> int:
    if key not in table and default is not _MISSING:
        return default
    v = _require(table, key, where)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(f"{where}: {key}={show(v)} must be an integer")
    return v


def _numbers(table: dict, key: str, where: str, *, matrix: bool = False) -> list:
    """A list of finite numbers, or (`matrix`) a list of equal-length lists of them."""
    v = _require(table, key, where)
    rows = v if matrix and isinstance(v, list) else [v]
    if not (isinstance(v, list) and all(isinstance(r, list) and all(map(_is_number, r)) for r in rows)
            and len({len(r) for r in rows}) <= 1):
        what = "a list of equal-length lists of numbers (a matrix)" if matrix else "a list of numbers"
        raise SpecError(f"{where}: {key}={show(v)} must be {what}")
    if not all(_finite(x) for r in rows for x in r):
        raise SpecError(f"{where}: {key}={show(v)} must have finite entries")
    return v


def _probabilities(table: dict, key: str, where: str, what: str = "a probability vector") -> list[float]:
    """A non-empty list of probabilities (entries >= 0, summing to 1 within 1e-8, as the constructors check)."""
    v = [float(x) for x in _numbers(table, key, where)]
    if not v:
        raise SpecError(f"{where}: {key}=[] is empty; give {what}")
    for i, x in enumerate(v):
        if x < -1e-12:  # the constructors' tolerance for rounding below 0
            raise SpecError(f"{where}: {key}[{i}]={show(table[key][i])} is negative; {key} must be {what}")
    if abs(sum(v) - 1.0) > 1e-8:
        raise SpecError(f"{where}: {key}={show(table[key])} sums to {sum(v)!r}, not 1; {key} must be {what}")
    return v


def _count(table: dict, key: str, where: str, minimum: int, what: str, default: Any = _MISSING) -> int:
    """A TOML integer >= `minimum` (`what` it counts)."""
    v = _integer(table, key, where, default)
    if v is not None and v is not default and v < minimum:
        raise SpecError(f"{where}: {key}={v} must be an integer >= {minimum} ({what})")
    return v


def _in_range(table: dict, key: str, where: str, low: float, high: float, what: str, default: Any = _MISSING,
              high_open: bool = False) -> float:
    """A finite number in [low, high] ([low, high) with `high_open`)."""
    v = _number(table, key, where, default)
    if v is not None and v is not default and not (low <= v and (v < high if high_open else v <= high)):
        raise SpecError(f"{where}: {key}={show(table[key])} must lie in [{low:g}, {high:g}{')' if high_open else ']'} "
                        f"({what})")
    return v


def _rates(table: dict, key: str, where: str) -> list:
    """A list of positive rates."""
    v = _numbers(table, key, where)
    for i, x in enumerate(v):
        if not x > 0:
            raise SpecError(f"{where}: {key}[{i}]={show(x)} must be positive")
    return v


class ServiceSpec(NamedTuple):
    """A checked `[service]` (or `[simulation.service]`, or `[arrivals]`: kind `bmap`) table: the jsmkt constructor
    `kind` calls for, with its arguments. `build()` makes the distribution (it imports JAX, which checking the table
    does not)."""

    kind: str
    args: tuple
    where: str
    clip: bool = False

    def build(self):
        """The distribution (a `jsmkt.PH`, a `jsmkt.GeneralService` for the simulation-only kinds, a `jsmkt.BMAP`); a
        `SpecError` naming the table when the values are not a valid distribution."""
        make = {"exponential": "exponential", "erlang": "erlang", "h2": "hyperexponential2",
                "hyperexponential": "hyperexponential", "coxian": "coxian", "coxian2": "coxian2", "ph": "PH",
                "moments": "fit_ph2_three_moments", "deterministic": "deterministic", "lognormal": "lognormal",
                "bmap": "BMAP"}
        try:
            if self.kind == "moments" and self.clip:
                return jsmkt.fit_ph2_three_moments(*self.args, clip=True)[0]
            return getattr(jsmkt, make[self.kind])(*self.args)
        except (ValueError, TypeError, ArithmeticError) as e:
            raise SpecError(f"{self.where}: {e}".replace("pass clip=True", "set clip = true in the table")) from None


def parse_service(table: Any, where: str = "[service]") -> ServiceSpec:
    """Check a `[service]` table (keys, types; without JAX) and say how to build its PH distribution."""
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table (got {show(table)})")
    if "kind" not in table and "alpha" in table and "T" in table:
        kind = "ph"  # the explicit form, `alpha` and `T`, needs no kind
    else:
        kind = _require(table, "kind", where)
    if kind == "exponential":
        _allowed(table, {"kind", "mean", "rate"}, where)
        if "rate" in table and "mean" in table:
            raise SpecError(f"{where}: rate={show(table['rate'])} and mean={show(table['mean'])} are both "
                            "given; give one of them (rate = 1 / mean)")
        if "rate" in table:
            return ServiceSpec(kind, (_number(table, "rate", where, positive=True),), where)
        return ServiceSpec(kind, (1.0 / _number(table, "mean", where, 1.0, positive=True),), where)
    if kind == "erlang":
        _allowed(table, {"kind", "k", "mean"}, where)
        return ServiceSpec(kind, (_count(table, "k", where, 1, "the number of phases"),
                                  _number(table, "mean", where, 1.0, positive=True)), where)
    if kind in ("h2", "coxian2"):
        _allowed(table, {"kind", "mean", "scv"}, where)
        least, what = (1.0, "for a hyperexponential distribution") if kind == "h2" else (0.5, "for a two-phase Coxian")
        scv = _number(table, "scv", where)
        if not scv >= least:
            raise SpecError(f"{where}: scv={show(table['scv'])} must be >= {least:g} {what}")
        return ServiceSpec(kind, (_number(table, "mean", where, 1.0, positive=True), scv), where)
    if kind == "hyperexponential":
        _allowed(table, {"kind", "probs", "rates"}, where)
        return ServiceSpec(kind, (_probabilities(table, "probs", where), _rates(table, "rates", where)), where)
    if kind == "coxian":
        _allowed(table, {"kind", "rates", "probs"}, where)
        rates, probs = _rates(table, "rates", where), _numbers(table, "probs", where)
        for i, q in enumerate(probs):
            if not 0 <= q <= 1:
                raise SpecError(f"{where}: probs[{i}]={show(q)} must lie in [0, 1] (a continuation probability)")
        return ServiceSpec(kind, (rates, probs), where)
    if kind == "ph":
        _allowed(table, {"kind", "alpha", "T"} if "kind" in table else {"alpha", "T"}, where)
        return ServiceSpec(kind, (_numbers(table, "alpha", where), _numbers(table, "T", where, matrix=True)), where)
    if kind == "moments":
        _allowed(table, {"kind", "m1", "m2", "m3", "clip"}, where)
        m = tuple(_number(table, k, where, positive=True) for k in ("m1", "m2", "m3"))
        clip = table.get("clip", False)
        if not isinstance(clip, bool):
            raise SpecError(f"{where}: clip={show(clip)} must be true or false")
        return ServiceSpec(kind, m, where, clip)
    raise SpecError(f"{where}: kind={show(kind)} is not one of {', '.join(SERVICE_KINDS)}")


def service_from_spec(table: dict[str, Any], where: str = "[service]"):
    """Build a PH distribution from a `[service]` table."""
    return parse_service(table, where).build()


def _choice_number(spec: dict[str, Any], where: str, key: str = "d"):
    d = spec.get(key, 2)
    if isinstance(d, list):
        return _probabilities(spec, key, where, "probabilities of sampling 1, 2, ... servers")
    if not _is_number(d):
        raise SpecError(f"{where}: {key}={show(d)} must be an integer, a real number >= 1 or a list of probabilities "
                        "of sampling 1, 2, ... servers")
    if isinstance(d, float):
        d = _number(spec, key, where)
        if not d >= 1:
            raise SpecError(f"{where}: {key}={show(d)} must be >= 1 (the mean number of servers sampled)")
        return d
    if d < 1:
        raise SpecError(f"{where}: {key}={d} must be >= 1 (the number of servers sampled)")
    return d


def _word(spec: dict[str, Any], key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    v = spec.get(key, default)
    if v not in choices:
        raise SpecError(f"{where}: {key}={show(v)} is not one of {', '.join(map(show, choices))}")
    return v


# --- each family's keys, generated from its table (`jsmkt._models.parameters`), checked without JAX --------------
# The scalar constraints (rates > 0, probabilities, d >= 1, K >= 2, a service's parameters) are checked here, by the
# kind of each parameter of the family's table, so that a bad value is answered before JAX is imported; the
# constructors check them again, and what needs JAX (stability, a PH's matrices, a BMAP).


def _table_list(spec: dict[str, Any], key: str, where: str, required: bool) -> list[dict]:
    """An array of tables (`[[key]]`)."""
    if key not in spec and not required:
        return []
    v = _require(spec, key, where)
    if not (isinstance(v, list) and v and all(isinstance(t, dict) for t in v)):
        raise SpecError(f"{where}: {key}={show(v)} must be an array of tables ([[{key}]] sections)")
    return v


def _bmap_from_spec(table: Any, where: str = "[arrivals]") -> ServiceSpec:
    """An `[arrivals]` table, checked: `C` a matrix, `D` a list of matrices (the rates of batches of 1, 2, ...) or
    one matrix (single arrivals, a MAP); built as `jsmkt.BMAP(C, D)`, which checks the values."""
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table with C and D (got {show(table)})")
    _allowed(table, {"C", "D"}, where)
    C = _numbers(table, "C", where, matrix=True)
    D = _require(table, "D", where)
    if isinstance(D, list) and D and all(isinstance(x, list) and x and isinstance(x[0], list) for x in D):
        D = [_numbers({"D": x}, "D", f"{where} D[{b}]", matrix=True) for b, x in enumerate(D)]
    else:
        D = [_numbers(table, "D", where, matrix=True)]
    return ServiceSpec("bmap", (C, D), where)


def _shown(p: TableParameter, table: dict) -> str:
    """A key and its value as a message names them: `[service]` for a table, `mu=1.0` for a value."""
    return f"[{p.name}]" if p.kind in ("ph", "bmap", "tables") else f"{p.name}={show(table[p.name])}"


def parse_value(p: TableParameter, table: dict[str, Any], where: str, params: tuple = ()) -> Any:
    """The value of parameter `p` in the TOML table `table` (the spec, or one of an array of tables), checked by its
    kind (`jsmkt._models.parameters.KINDS`); its default where the key is left out, `None` where a key it
    excludes is given. `params`: the other parameters of the table (for `excludes`)."""
    key = p.name
    if key not in table:
        if any(e in table for e in p.excludes):
            return None
        if p.default is REQUIRED:
            raise SpecError(f"{where}: missing key {key!r}")
        if p.kind == "tables":
            return {e.argument: [] for e in p.entries}
        return p.default
    for e in p.excludes:
        if e in table:
            other = next((q for q in params if q.name == e), None)
            them = _shown(other, table) if other is not None else e
            raise SpecError(f"{where}: {_shown(p, table)} and {them} are both given; give one of them")
    if p.kind == "rate":
        return _number(table, key, where, positive=True)
    if p.kind == "number":
        return _number(table, key, where)
    if p.kind == "fraction":
        return _in_range(table, key, where, 0.0, 1.0, p.what, high_open=True)
    if p.kind == "probabilities":
        return _probabilities(table, key, where, p.what or "a probability vector")
    if p.kind == "choice":
        return _choice_number(table, where, key)
    if p.kind == "ph":
        return parse_service(table[key], f"[{key}]")
    if p.kind == "bmap":
        return _bmap_from_spec(table[key], f"[{key}]")
    if p.kind == "integer":
        return _count(table, key, where, p.minimum, p.what)
    if p.kind == "policy":
        return _word(table, key, where, p.choices, p.default)
    if p.kind == "boolean":
        if not isinstance(table[key], bool):
            raise SpecError(f"{where}: {key}={show(table[key])} must be true or false")
        return table[key]
    if p.kind == "string":
        if not isinstance(table[key], str):
            raise SpecError(f"{where}: {key}={show(table[key])} must be a string")
        return table[key]
    if p.kind == "tables":
        out: dict[str, list] = {e.argument: [] for e in p.entries}
        for j, t in enumerate(_table_list(table, key, where, p.default is REQUIRED)):
            at = f"[[{key}]] {j + 1}"
            _allowed(t, {e.name for e in p.entries}, at)
            for e in p.entries:
                out[e.argument].append(parse_value(e, t, at, p.entries))
        return out
    raise SpecError(f"{where}: {key}: a parameter of unknown kind {p.kind!r} (one of {', '.join(KINDS)})")


def parse_table(table: FamilyTable, spec: dict[str, Any], where: str) -> dict[str, Any]:
    """The constructor's keyword arguments of a spec of the family of `table` (services unbuilt): each parameter
    checked by `parse_value`; a `tables` parameter gives one list per entry."""
    out: dict[str, Any] = {}
    for p in table.parameters:
        v = parse_value(p, spec, where, table.parameters)
        if v is OMIT:  # left to the constructor's default
            continue
        if p.kind == "tables":
            out.update(v)
        else:
            out[p.argument] = v
    return out


# --- what the CLI shows of a model (these run on built models, JAX imported) ----------------------------------------


def _family_metrics(model, fp) -> dict[str, Any]:
    """The family's own metrics at a fixed point: its observables (`jsmkt._metrics.family_metrics`)."""
    from ._metrics import family_metrics

    return family_metrics(model, fp)


@functools.cache
def _load_and_service():
    """`model -> (load, E[S], SCV)` (NaN moments without a PH service), compiled: computed one operation at a
    time, each would compile on its own in every run of the CLI."""
    import equinox as eqx
    import jax.numpy as jnp

    def numbers(model):
        if "service" not in family_of(model).keys:
            return model.load(), jnp.nan, jnp.nan
        return model.load(), model.service.mean, model.service.scv

    return eqx.filter_jit(numbers)


def _load_and_service_dict(model) -> dict:
    """`_load_and_service` as a dict, for `jsmkt._exported`."""
    return dict(zip(("load", "mean", "scv"), _load_and_service()(model), strict=True))


def _service_text(model, mean: float, scv: float) -> str:
    """The CLI's line on the model's service (the family's `describe_service`)."""
    return model.describe_service(mean, scv)


Parameter = NamedParameter  # a named parameter for `jsmkt.sensitivity` (`jsmkt._models.parameters`)


class Family(NamedTuple):
    """A registered model family: its TOML name, the name of its class (`model` is the class itself, imported on
    first use), spec keys and their parser (the constructor's arguments, checked without JAX), how the CLI describes
    it, small instances (`examples`) that the contract tests run on every family, and its named parameters
    (`params`: name -> `Parameter`, for sensitivities and optimisation, by TOML path; `aliases`: other names of
    them; a parameter the model lacks, e.g. `j` outside R.3, is left out by `parameters_of`). jsmkt's families are
    made from their tables (`family_from_table`)."""

    name: str
    class_name: str
    keys: frozenset[str]
    parse: Callable[[dict[str, Any], str], dict[str, Any]]  # the constructor's keyword arguments (services unbuilt)
    parameters: Callable[[Any], dict[str, Any]]  # the model's parameters for the JSON output
    describe: Callable[[Any], str]  # one line of parameters (the CLI's header)
    examples: Callable[[], dict[str, Any]]
    params: dict[str, Parameter]
    published: bool = False  # `jsmkt solve --as-published` applies
    metrics: Callable[[Any, Any], dict[str, Any]] | None = None  # the family's own metrics at a fixed point (arrays;
    # traceable: the CLI computes them with the others in one compiled call)
    level: str = "Q"  # what a level counts, for the tables: "Q" (jobs at a server) or "orbit"
    utilisation: str = "utilisation s_1"  # the tables' label of the fraction of servers serving
    simulation_service: bool = False  # `[simulation.service]` applies: `jsmkt.simulate(..., service=...)` can run
    # the family with another service law
    cls: type | None = None  # the class of a family registered at run time (`register_family`)
    module: str | None = None  # the module of a built-in family's class
    table: FamilyTable | None = None  # the family's table, where it has one
    aliases: dict[str, str] = {}  # other names of `params` (`mean` for `service.mean`)

    @property
    def model(self) -> type:
        """The family's class (imported from its module, or the class given to `register_family`)."""
        if self.cls is not None:
            return self.cls
        import importlib

        return getattr(importlib.import_module(self.module), self.class_name)

    @property
    def specs(self) -> tuple[str, ...]:
        """The family's example specs (paths under the repository, from its table)."""
        return self.table.specs if self.table is not None else ()

    def metric_names(self, model) -> list[str]:
        """The names of the family's own metrics of `model` (its observables), which the CLI shows with the generic
        ones."""
        from ._models.base import AbstractDescribedModel

        return list(model.observables()) if isinstance(model, AbstractDescribedModel) else []


def family_from_table(table: FamilyTable, class_name: str, *, module: str | None = None, cls: type | None = None,
                      name: str | None = None, examples: Callable[[], dict[str, Any]] | None = None,
                      metrics: Callable[[Any, Any], dict[str, Any]] | None = None) -> Family:
    """The registry's `Family` of a family's table: keys, parser, named parameters, flags; the class (`cls`, or
    `class_name` in `module`) gives the examples, the CLI's description and the metrics (its observables)."""
    params, aliases = sensitivity_parameters(table)
    fam = Family(
        name or table.name, class_name, frozenset(p.name for p in table.parameters),
        functools.partial(parse_table, table), parameters=lambda m: m.spec_values(),
        describe=lambda m: m.describe_parameters(), examples=lambda: {}, params=params,
        published=table.published, metrics=metrics or _family_metrics, level=table.level,
        utilisation=table.utilisation, simulation_service=table.simulation_service, cls=cls, module=module,
        table=table, aliases=aliases,
    )
    return fam._replace(examples=examples or (lambda: fam.model.examples()))


FAMILIES: dict[str, Family] = {
    entry.table.name: family_from_table(entry.table, entry.class_name, module=entry.module)
    for entry in builtin_families()
}
MODELS = tuple(FAMILIES)

# The words of the retrial and repairable families, from their tables.
RETRIALS = FAMILIES["retrial"].table.parameter("retrial").choices
POLICIES = FAMILIES["retrial"].table.parameter("policy").choices
ARRIVALS = FAMILIES["repairable"].table.parameter("arrival").choices
REPAIRS = FAMILIES["repairable"].table.parameter("repair").choices


def family_of(model) -> Family:
    """The registered family of `model` (by its exact type); `ValueError` otherwise."""
    for fam in FAMILIES.values():
        if type(model).__name__ == fam.class_name and type(model) is fam.model:
            return fam
    raise ValueError(f"{type(model).__name__} is not a registered model family ({', '.join(MODELS)})")


def describe_model(model, numbers: dict | None = None) -> str:
    """The CLI's two-line description of a model: its parameters, truncation and load; its service. `numbers`, the
    model's `_load_and_service_dict` when the caller has it, spares computing it."""
    from . import _exported

    fam = family_of(model)
    if numbers is None:
        numbers, _ = _exported.call("jsmkt: load and service", _load_and_service_dict, model)
    if numbers is None:  # no cache folder (the library, the tests), or not exportable
        numbers = _load_and_service_dict(model)
    load, mean, scv = (float(numbers[k]) for k in ("load", "mean", "scv"))
    return f"{fam.describe(model)}   K = {model.K}   load rho = {load:.6g}\n{_service_text(model, mean, scv)}"


class ParsedSpec(NamedTuple):
    """A spec whose keys and types are checked (without JAX): its family, the constructor's arguments (`[service]`
    tables as `ServiceSpec`s, `K` None when the spec gives none), where it comes from and the TOML table itself."""

    family: Family
    kwargs: dict[str, Any]
    where: str
    spec: dict[str, Any]

    @property
    def K_given(self) -> bool:
        """Whether the spec sets the truncation level `K`."""
        return self.kwargs.get("K") is not None


def parse_spec(spec: dict[str, Any], where: str = "spec") -> ParsedSpec:
    """Check a parsed TOML spec's family, keys and value types (no JAX is imported): a `SpecError` names the key."""
    name = _require(spec, "model", where)
    if isinstance(name, str) and name not in FAMILIES:
        _entry_point_family(name)
    if not isinstance(name, str) or name not in FAMILIES:
        raise SpecError(f"{where}: model={show(name)} is not one of {', '.join(map(show, FAMILIES))} (a family "
                        "written outside jsmkt: pass --family FILE, the Python file that registers it)")
    fam = FAMILIES[name]
    _allowed(spec, set(fam.keys) | {"model", "simulation"}, where)
    return ParsedSpec(fam, fam.parse(spec, where), where, spec)


def build_model(parsed: ParsedSpec):
    """The model of a checked spec (imports JAX); a `SpecError` for values the constructor refuses."""
    kwargs = {k: v.build() if isinstance(v, ServiceSpec) else v for k, v in parsed.kwargs.items()}
    try:
        return parsed.family.model(**kwargs)
    except (ValueError, TypeError, ArithmeticError) as e:
        raise SpecError(f"{parsed.where}: {e}") from None


def model_from_spec(spec: dict[str, Any], where: str = "spec"):
    """Build a model from a parsed TOML spec (`model` names a registered family)."""
    return build_model(parse_spec(spec, where))


def _simulation_service(table: Any, where: str) -> ServiceSpec:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table (got {show(table)})")
    kind = _require(table, "kind", where)
    if kind not in SIMULATION_KINDS + SERVICE_KINDS:
        raise SpecError(f"{where}: kind={show(kind)} is not one of {', '.join(SIMULATION_KINDS + SERVICE_KINDS)}")
    if kind == "deterministic":
        _allowed(table, {"kind", "mean"}, where)
        return ServiceSpec(kind, (_number(table, "mean", where, 1.0, positive=True),), where)
    if kind == "lognormal":
        _allowed(table, {"kind", "mean", "scv"}, where)
        return ServiceSpec(kind, (_number(table, "mean", where, 1.0, positive=True),
                                  _number(table, "scv", where, positive=True)), where)
    return parse_service(table, where)


def parse_simulation(spec: dict[str, Any], where: str = "spec") -> dict[str, Any]:
    """The optional `[simulation]` table, checked without JAX: `sampling` and, unbuilt, `service`."""
    sim = spec.get("simulation", {})
    if not isinstance(sim, dict):
        raise SpecError(f"{where}: [simulation] must be a table (got simulation = {show(sim)})")
    _allowed(sim, {"sampling", "service"}, "[simulation]")
    out: dict[str, Any] = {}
    if "sampling" in sim:
        if sim["sampling"] not in SAMPLING:
            raise SpecError(f"[simulation]: sampling={show(sim['sampling'])} is not one of "
                            f"{', '.join(map(show, SAMPLING))}")
        out["sampling"] = sim["sampling"]
    if "service" in sim:
        fam = FAMILIES.get(spec.get("model"))
        if fam is not None and not fam.simulation_service:
            takes = " and ".join(f"model = {show(f.name)}" for f in FAMILIES.values() if f.simulation_service)
            raise SpecError(f"{where}: [simulation.service] is not supported for model = {show(fam.name)}: the "
                            f"simulation runs the {fam.name} family's own service (its parameters in the spec); "
                            f"remove [simulation.service] (it applies to {takes})")
        out["service"] = _simulation_service(sim["service"], "[simulation.service]")
    return out


def simulation_from_spec(spec: dict[str, Any], where: str = "spec") -> dict[str, Any]:
    """Keyword arguments for `jsmkt.simulate` (`sampling`, `service`) from the optional `[simulation]` table."""
    return {k: v.build() if isinstance(v, ServiceSpec) else v for k, v in parse_simulation(spec, where).items()}


# --- families registered at run time ------------------------------------------------------------------------------

ENTRY_POINT_GROUP = "jsmkt.families"  # installed packages declare families here: `name = "module:Class"`
_TOML_NAME = "letters, digits, '-' and '_', starting with a letter"


def register_family(name: str, cls: type, *, examples: Callable[[], dict[str, Any]] | None = None,
                    metrics: Callable[[Any, Any], dict[str, Any]] | None = None) -> None:
    r"""Register the model family `cls` under the TOML name `name`, so that a spec with `model = "name"` builds it
    (`jsmkt solve`, `simulate`, `transient` and `sensitivity`, and every function that reads specs).

    `cls` is a subclass of `jsmkt.AbstractDescribedModel` that states its physics in `description()` (the recipe:
    `jsmkt.Description`, `jsmkt.make_cells`, `jsmkt.LocalEvent`, `jsmkt.Dispatch`, `jsmkt.Moves`;
    `examples/custom_family.py` is a complete family). Its spec keys, their checks and its named parameters are
    those of its table when it states one (the class attribute `table`, a `FamilyTable` of
    `jsmkt._models.parameters`, as jsmkt's families do); without one, they are the arguments of its constructor,
    read from its signature: an argument annotated `int` (or whose default is an integer) is a TOML integer, `bool` a boolean,
    `str` a string, `service` a `[service]` table (built as a `jsmkt.PH`), anything else (a rate) a finite number;
    an argument without a default is a required key, one with a default may be left out (the constructor's default
    applies). The arguments that are array fields of the model of the same name are its parameters for
    `jsmkt.sensitivity` (`--wrt`); the CLI shows each argument's value read from the attribute of that name.

    **Arguments:**

    - `name`: the TOML name (`model = "name"`): letters, digits, `-` and `_`, starting with a letter. A name taken by
      jsmkt's families or by another class is refused; the same class, or a class of the same qualified name from
      the same file (the file imported again, a notebook cell run again), is registered again in its place.
    - `cls`: the family's class.
    - `examples`: optional, a function returning small instances by name (for tests over every family).
    - `metrics`: optional, `(model, fixed_point) -> dict` of the family's own metrics (arrays; traceable), which
      `jsmkt solve` shows with the generic ones.

    An installed package may instead declare its families in the entry-point group `jsmkt.families`
    (`[project.entry-points."jsmkt.families"]`, `name = "module:Class"`): the first spec that names an unknown
    model loads the entry point of that name, and registers the class it gives under that name (unless importing
    its module registered it already).

    **Raises:** `ValueError` naming the argument: `cls` is not a concrete subclass of `jsmkt.AbstractDescribedModel`,
    `name` is not a TOML name or is taken, or the constructor's signature has `*args`/`**kwargs` or no `K`.
    """
    import inspect

    from ._models.base import AbstractDescribedModel

    if not isinstance(name, str) or not name[:1].isascii() or not name[:1].isalpha() or \
            not all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        raise ValueError(f"name={name!r} must be a TOML model name: {_TOML_NAME}")
    if not (isinstance(cls, type) and issubclass(cls, AbstractDescribedModel)):
        raise ValueError(f"cls={cls!r} must be a subclass of jsmkt.AbstractDescribedModel (a family stated by its "
                         "physics, description()); see examples/custom_family.py")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise ValueError(f"cls={cls.__qualname__} leaves abstract methods undefined ({missing}); define them")
    old = FAMILIES.get(name)
    if old is not None and old.model is not cls and (old.cls is None or _origin(old.cls) != _origin(cls)):
        owner = f"jsmkt.{old.class_name}" if old.cls is None else f"{old.cls.__module__}.{old.cls.__qualname__}"
        raise ValueError(f"name={name!r} is taken by the family {owner}; choose another name for "
                         f"{cls.__qualname__}")
    if examples is not None and not callable(examples):
        raise ValueError(f"examples={examples!r} must be a function returning a dict of models")
    if metrics is not None and not callable(metrics):
        raise ValueError(f"metrics={metrics!r} must be a function (model, fixed_point) -> dict of arrays")
    table = cls.table if cls.table is not None else signature_table(cls, name)  # its own, or its signature's
    register_table(cls, table._replace(name=name))
    FAMILIES[name] = family_from_table(table, cls.__name__, cls=cls, name=name, examples=examples or dict,
                                       metrics=metrics)


def _origin(cls: type) -> tuple[str, str]:
    """Where a class is defined: its module's file (resolved) or, without one, the module's name; and its
    qualified name. A class of one origin is the same family defined again."""
    import os
    import sys

    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return (os.path.realpath(file) if file else cls.__module__), cls.__qualname__


def _entry_point_family(name: str) -> None:
    """Register the family `name` from the installed packages' entry points (`ENTRY_POINT_GROUP`), if one declares
    it: its object is a family class (registered under `name` unless importing its module registered it)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001  (any error of the package's code)
            raise SpecError(f"model={show(name)}: the entry point {ep.name} = {ep.value!r} of group "
                            f"{ENTRY_POINT_GROUP!r} cannot be loaded ({type(e).__name__}: {e})") from None
        if name not in FAMILIES:
            try:
                register_family(name, obj)
            except ValueError as e:
                raise SpecError(f"model={show(name)}: the entry point {ep.name} = {ep.value!r}: {e}") from None
        return


def load_family_file(path: str) -> None:
    """Import the Python file `path`, which registers families (`register_family`); a file already imported (as a
    module or as the running script) is not run again. A `SpecError` names the file when it cannot be imported,
    raises, or registers nothing."""
    import importlib.util
    import os
    import sys
    import traceback

    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise SpecError(f"--family={path}: no such file" if not os.path.exists(real) else
                        f"--family={path}: not a file; give the Python file that registers the family")
    if any(os.path.realpath(f) == real for m in list(sys.modules.values())
           if isinstance(f := getattr(m, "__file__", None), str)):
        return
    before = {k: v.model if v.cls is not None else None for k, v in FAMILIES.items()}
    module = "jsmkt_family_" + "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(real))[0])
    spec = importlib.util.spec_from_file_location(module, real)
    if spec is None or spec.loader is None:
        raise SpecError(f"--family={path}: not a Python file (give a .py file that calls jsmkt.register_family)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException as e:
        del sys.modules[module]
        if isinstance(e, KeyboardInterrupt):
            raise
        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.realpath(f.filename) == real]
        at = f" at line {frames[-1].lineno}" if frames else ""
        raise SpecError(f"--family={path}: importing it raised {type(e).__name__}{at}: {e}") from None
    after = {k: v.model if v.cls is not None else None for k, v in FAMILIES.items()}
    if after == before:
        raise SpecError(f"--family={path} registered no family; call jsmkt.register_family(name, cls) in it")


# --- specs from Python: overrides, models from specs and specs from models ------------------------------------------

_OVERRIDE_ALIASES = {"mean": "service.mean", "scv": "service.scv"}  # short names of the service's keys


def _override_value(key: str, value: Any) -> Any:
    """An override's value as a TOML value: a string is read as TOML value text (`0.8`, `[0.5, 0.5]`, `"own"`), a
    bare word that is no TOML value (`own`) as that string; a Python value as it is (tuples as lists, NumPy scalars
    and arrays as numbers and lists)."""
    if isinstance(value, str):
        try:
            return tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            if value and all(c.isalnum() or c in "-_" for c in value):
                return value
            raise SpecError(f"override {key}={value}: the value is not a TOML value (a number, a string in quotes, a "
                            "list, a boolean)") from None
    if isinstance(value, (bool, int, float, dict)):
        return value
    if isinstance(value, (list, tuple)):
        return [_override_value(key, v) for v in value]
    tolist = getattr(value, "tolist", None)  # a NumPy or JAX value
    if callable(tolist):
        return tolist()
    raise SpecError(f"override {key}={value!r}: give a number, a string, a boolean, a list or a table")


def apply_overrides(spec: dict[str, Any], overrides: Any, where: str = "spec") -> dict[str, Any]:
    """A copy of the TOML table `spec` with `overrides` set: a mapping of TOML paths (`lam`, `service.scv`,
    `classes.0.lam`, `arrivals.C`; `mean` and `scv` short for the service's) to values (`_override_value`), as
    the CLI's overrides (key=value). The first part of a path must be a key of the spec's family, a table's index an index of
    its array of tables; `SpecError` naming the key otherwise. The values are checked when the spec is parsed."""
    import copy

    if overrides is None:
        return spec
    if not hasattr(overrides, "items"):
        raise SpecError(f"overrides={overrides!r} must be a mapping of keys (TOML paths, e.g. 'lam', "
                        "'service.scv') to values")
    out = copy.deepcopy(spec)
    fam = FAMILIES.get(out.get("model"))
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise SpecError(f"override {key!r}: a key is a TOML path such as lam, service.scv or classes.0.lam")
        parts = _OVERRIDE_ALIASES.get(key, key).split(".") if fam is None or key not in fam.keys else [key]
        if fam is not None and parts[0] not in (*fam.keys, "simulation"):
            raise SpecError(f"override {key}: {parts[0]!r} is not a key of model = {show(fam.name)} (its keys: "
                            f"{', '.join(sorted(fam.keys, key=str.lower))})")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not (part.isdigit() and int(part) < len(node)):
                    raise SpecError(f"override {key}: {'.'.join(parts[:i])} has {len(node)} tables; {part!r} is not "
                                    f"an index of them (0 to {len(node) - 1})")
                node = node[int(part)]
            elif isinstance(node, dict):
                if part not in node:
                    node[part] = {}
                elif not isinstance(node[part], (dict, list)):
                    raise SpecError(f"override {key}: {'.'.join(parts[:i + 1])} = {show(node[part])} is a value, not a "
                                    "table")
                node = node[part]
        last = parts[-1]
        if isinstance(node, list):
            raise SpecError(f"override {key}: {'.'.join(parts)} sets a whole table of an array of tables; set one of "
                            "its keys (e.g. classes.0.lam)")
        node[last] = _override_value(key, value)
    return out


def _model_from_table(spec: dict[str, Any], where: str):
    """The model of a TOML table, checked as the CLI checks a spec (its `[simulation]` table too)."""
    parsed = parse_spec(spec, where)
    parse_simulation(spec, where)
    return build_model(parsed)


def loads_model_spec(text: str, overrides: Any = None):
    """The model of the TOML spec text `text` (`jsmkt.loads_spec`), with `overrides` set (a mapping of TOML paths
    to values, as the CLI's overrides (key=value)): the CLI's checks and messages, `SpecError` naming the key."""
    return _model_from_table(apply_overrides(read_spec_text(text), overrides), "spec")


def load_model_spec(path, overrides: Any = None):
    r"""The model of the TOML spec file `path` (`jsmkt.load_spec`), with `overrides` set.

    **Arguments:**

    - `path`: a spec file (`examples/*.toml`; the TOML reference lists its keys).
    - `overrides`: optional, a mapping of keys to values, as the CLI's overrides (key=value): a key is the TOML path of
      a value (`lam`, `d`, `service.mean`, `service.scv`, `arrivals.C`, `classes.0.lam`; `mean` and `scv` short
      for the service's), a value TOML value text (`"0.8"`, `"[0.5, 0.5]"`) or a Python value.

    **Returns:** the model (e.g. a `jsmkt.JSQdPH`), built as `jsmkt solve` builds it.

    **Raises:** `jsmkt._spec.SpecError` (a `ValueError`) naming the file and the key: no such file, not TOML, an
    unknown key, a value out of range, a model the constructor refuses.

    !!! example

        ```python
        model = jsmkt.load_spec("examples/jsq2_h2.toml", overrides={"lam": 0.8, "service.scv": 3})
        ```
    """
    path = str(path)
    return _model_from_table(apply_overrides(read_spec_file(path), overrides), path)


def _choice_value(c) -> Any:
    """A choice law as the TOML value that builds it: an integer, a real number, or probabilities."""
    from ._choice import FixedChoice, InterpolatedChoice, MixedChoice

    if isinstance(c, FixedChoice):
        return int(c.d)
    if isinstance(c, InterpolatedChoice):
        return float(c.d)
    if isinstance(c, MixedChoice):
        return [float(p) for p in c.probs]
    raise ValueError(f"a choice law of type {type(c).__name__} has no TOML form; use an integer, a real number or "
                     "probabilities")


def _dump_value(p: TableParameter, value: Any) -> Any:
    """The TOML value of a parameter's field."""
    import numpy as np

    if p.kind == "choice":
        return _choice_value(value)
    if p.kind == "ph":
        return {"alpha": np.asarray(value.alpha, float).tolist(), "T": np.asarray(value.T, float).tolist()}
    if p.kind == "bmap":
        return {"C": np.asarray(value.C, float).tolist(), "D": np.asarray(value.D, float).tolist()}
    if p.kind in ("policy", "string", "boolean"):
        return value
    if p.kind == "integer":
        return int(value)
    return np.asarray(value, float).tolist()


def model_spec(model) -> dict[str, Any]:
    """The TOML table of a spec that builds `model` (its registered family's table read from the model's fields);
    `ValueError` for a model outside the registry or a parameter without a TOML form (e.g. a traced value)."""
    fam = family_of(model)
    table = fam.table
    out: dict[str, Any] = {"model": fam.name}
    for p in table.parameters:
        if p.kind == "tables":
            rows: list[dict[str, Any]] = []
            for e in p.entries:
                values = getattr(model, e.field)
                for j in range(len(values)):
                    if len(rows) <= j:
                        rows.append({})
                    if values[j] is not None:
                        rows[j][e.name] = _dump_value(e, values[j])
            if rows:
                out[p.name] = rows
            continue
        if p.name == "K":
            out["K"] = int(model.K)
            continue
        if p.field is None:
            continue
        value = getattr(model, p.field)
        if value is not None:
            out[p.name] = _dump_value(p, value)
    return out


def dump_model_spec(model) -> str:
    """The TOML text of a spec that builds `model` (`jsmkt.dump_spec`): `jsmkt.loads_spec` of it gives a model
    equal to `model` (same class, every leaf equal). A service is written as its `alpha` and `T`, a BMAP as its
    `C` and `D`, a choice law as the integer, the real number or the probabilities it was built from."""
    try:
        import tomli_w
    except ModuleNotFoundError:
        raise ModuleNotFoundError("jsmkt.dump_spec writes TOML with the package tomli-w, a dependency of jsmkt: "
                                  "pip install tomli-w") from None
    return tomli_w.dumps(model_spec(model))
