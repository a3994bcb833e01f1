"""TOML model specifications (used by the CLI).

```toml
model = "jsq-ph"      # "jsq" (exponential service), "jsq-ph", "jsq-batch" (batch_rate, batch_sizes, d, mu, K),
                      # "jsq-classes" ([[classes]] tables of lam, d, batch_sizes; mu or [service]; optional
                      # [[helpers]] tables of rate and f, helpers that serve the longest of f queues; K),
                      # "jsq-batch-service" (lam, d, [service] epochs, service_batch_sizes, K) or
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

[simulation]          # optional, read by `jsmkt simulate` (and by `jsmkt solve --servers` for `sampling`)
sampling = "with_replacement"   # or "without_replacement"
[simulation.service]  # optional service for the simulation: any [service] kind, or
kind = "lognormal"    # deterministic (mean) | lognormal (mean, scv)
mean = 1.0
scv = 2.0
```
Numbers are TOML integers or floats (finite), integer keys (`K`, `k`, an integer `d`) TOML integers, `clip` a
boolean.
"""

import math
import tomllib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from ._distributions.fit import fit_ph2_three_moments
from ._distributions.ph import PH, coxian, coxian2, erlang, exponential, hyperexponential, hyperexponential2
from ._models.batch import JSQdBatch
from ._models.batch_service import JSQdBatchService
from ._models.classes import JSQdClasses
from ._models.jsqd import JSQd
from ._models.jsqd_ph import JSQdPH
from ._models.repairable import ARRIVALS, REPAIRS, RepairableJSQ
from ._models.retrial import POLICIES, RETRIALS, RetrialJSQ
from ._simulate.service import GeneralService, deterministic, lognormal


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


def load_spec(path: str) -> dict[str, Any]:
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


def service_from_spec(table: dict[str, Any], where: str = "[service]") -> PH:
    """Build a PH distribution from a `[service]` table."""
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table (got {show(table)})")
    if "kind" not in table and "alpha" in table and "T" in table:
        kind = "ph"  # the explicit form, `alpha` and `T`, needs no kind
    else:
        kind = _require(table, "kind", where)
    try:
        if kind == "exponential":
            _allowed(table, {"kind", "mean", "rate"}, where)
            if "rate" in table and "mean" in table:
                raise SpecError(f"{where}: rate={show(table['rate'])} and mean={show(table['mean'])} are both "
                                "given; give one of them (rate = 1 / mean)")
            if "rate" in table:
                return exponential(_number(table, "rate", where))
            return exponential(1.0 / _number(table, "mean", where, 1.0, positive=True))
        if kind == "erlang":
            _allowed(table, {"kind", "k", "mean"}, where)
            return erlang(_integer(table, "k", where), _number(table, "mean", where, 1.0))
        if kind == "h2":
            _allowed(table, {"kind", "mean", "scv"}, where)
            return hyperexponential2(_number(table, "mean", where, 1.0), _number(table, "scv", where))
        if kind == "hyperexponential":
            _allowed(table, {"kind", "probs", "rates"}, where)
            return hyperexponential(_numbers(table, "probs", where), _numbers(table, "rates", where))
        if kind == "coxian":
            _allowed(table, {"kind", "rates", "probs"}, where)
            return coxian(_numbers(table, "rates", where), _numbers(table, "probs", where))
        if kind == "coxian2":
            _allowed(table, {"kind", "mean", "scv"}, where)
            return coxian2(_number(table, "mean", where, 1.0), _number(table, "scv", where))
        if kind == "ph":
            _allowed(table, {"kind", "alpha", "T"} if "kind" in table else {"alpha", "T"}, where)
            return PH(_numbers(table, "alpha", where), _numbers(table, "T", where, matrix=True))
        if kind == "moments":
            _allowed(table, {"kind", "m1", "m2", "m3", "clip"}, where)
            m = [_number(table, k, where) for k in ("m1", "m2", "m3")]
            clip = table.get("clip", False)
            if not isinstance(clip, bool):
                raise SpecError(f"{where}: clip={show(clip)} must be true or false")
            if clip:
                return fit_ph2_three_moments(*m, clip=True)[0]
            try:
                return fit_ph2_three_moments(*m)
            except ValueError as e:
                raise SpecError(f"{where}: {e}".replace("pass clip=True", "set clip = true in the table")) from None
    except SpecError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:
        raise SpecError(f"{where}: {e}") from None
    raise SpecError(f"{where}: kind={show(kind)} is not one of {', '.join(SERVICE_KINDS)}")


def _choice_number(spec: dict[str, Any], where: str, key: str = "d"):
    d = spec.get(key, 2)
    if isinstance(d, list):
        return jnp.asarray(_numbers(spec, key, where), dtype=float)
    if not _is_number(d):
        raise SpecError(f"{where}: {key}={show(d)} must be an integer, a real number >= 1 or a list of probabilities "
                        "of sampling 1, 2, ... servers")
    if isinstance(d, float):
        return _number(spec, key, where)
    return d


def _word(spec: dict[str, Any], key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    v = spec.get(key, default)
    if v not in choices:
        raise SpecError(f"{where}: {key}={show(v)} is not one of {', '.join(map(show, choices))}")
    return v


def _jsq(spec: dict[str, Any], where: str):
    lam, d, K = _number(spec, "lam", where), _choice_number(spec, where), _integer(spec, "K", where, None)
    return JSQd(lam, d=d, mu=_number(spec, "mu", where, 1.0), K=K)


def _jsq_ph(spec: dict[str, Any], where: str):
    lam, d, K = _number(spec, "lam", where), _choice_number(spec, where), _integer(spec, "K", where, None)
    return JSQdPH(lam, service_from_spec(_require(spec, "service", where)), d=d, K=K)


def _jsq_batch(spec: dict[str, Any], where: str):
    return JSQdBatch(_number(spec, "batch_rate", where), jnp.asarray(_numbers(spec, "batch_sizes", where), dtype=float),
                     d=_choice_number(spec, where), mu=_number(spec, "mu", where, 1.0),
                     K=_integer(spec, "K", where, None))


def _table_list(spec: dict[str, Any], key: str, where: str, required: bool) -> list[dict]:
    """An array of tables (`[[key]]`)."""
    if key not in spec and not required:
        return []
    v = _require(spec, key, where)
    if not (isinstance(v, list) and v and all(isinstance(t, dict) for t in v)):
        raise SpecError(f"{where}: {key}={show(v)} must be an array of tables ([[{key}]] sections)")
    return v


def _jsq_classes(spec: dict[str, Any], where: str):
    lam, d, batches = [], [], []
    for j, table in enumerate(_table_list(spec, "classes", where, True)):
        at = f"[[classes]] {j + 1}"
        _allowed(table, {"lam", "d", "batch_sizes"}, at)
        lam.append(_number(table, "lam", at))
        d.append(_choice_number(table, at))
        batches.append(jnp.asarray(_numbers(table, "batch_sizes", at), dtype=float) if "batch_sizes" in table
                       else None)
    rates, f = [], []
    for l, table in enumerate(_table_list(spec, "helpers", where, False)):
        at = f"[[helpers]] {l + 1}"
        _allowed(table, {"rate", "f"}, at)
        rates.append(_number(table, "rate", at))
        f.append(_choice_number(table, at, "f"))
    if "service" in spec and "mu" in spec:
        raise SpecError(f"{where}: mu={show(spec['mu'])} and [service] are both given; give one of them")
    service = service_from_spec(spec["service"]) if "service" in spec else None
    return JSQdClasses(lam, d=d, batch_sizes=batches, mu=None if service is not None else _number(spec, "mu", where, 1.0),
                       service=service, helper_rates=rates, f=f, K=_integer(spec, "K", where, None))


def _classes_metrics(model, fp) -> dict[str, float]:
    import jsmkt

    if model.n_classes == 1:
        return {}
    return {f"prob_wait_class_{j + 1}": float(jsmkt.prob_wait(model, fp, stream=f"class {j + 1} arrival"))
            for j in range(model.n_classes)}


def _classes_text(m) -> str:
    parts = []
    for j in range(m.n_classes):
        B = m.batch_sizes[j].shape[0]
        batch = "" if B == 1 else f" batches 1..{B} (mean {float(m.mean_batch_sizes[j]):.6g})"
        parts.append(f"class {j + 1}: lam = {float(m.lam[j]):.6g} d = {_choice_text(m, m.choices[j])}{batch}")
    parts += [f"helpers {l + 1}: rate = {float(m.helper_rates[l]):.6g} f = {_choice_text(m, c)}"
              for l, c in enumerate(m.helper_choices)]
    return "   ".join(parts)


def _jsq_batch_service(spec: dict[str, Any], where: str):
    return JSQdBatchService(_number(spec, "lam", where), service_from_spec(_require(spec, "service", where)),
                            jnp.asarray(_numbers(spec, "service_batch_sizes", where), dtype=float),
                            d=_choice_number(spec, where), K=_integer(spec, "K", where, None))


def _retrial(spec: dict[str, Any], where: str):
    return RetrialJSQ(_number(spec, "lam", where), _number(spec, "theta", where),
                      d1=_choice_number(spec, where, "d1"), d2=_choice_number(spec, where, "d2"),
                      mu=_number(spec, "mu", where, 1.0), retrial=_word(spec, "retrial", where, RETRIALS, "reprobe"),
                      policy=_word(spec, "policy", where, POLICIES, "linear"), K=_integer(spec, "K", where, None))


def _repairable(spec: dict[str, Any], where: str):
    return RepairableJSQ(_number(spec, "lam", where), _number(spec, "alpha", where), _number(spec, "beta", where),
                         d1=_choice_number(spec, where, "d1"), d2=_choice_number(spec, where, "d2"),
                         mu=_number(spec, "mu", where, 1.0), arrival=_word(spec, "arrival", where, ARRIVALS, "A1"),
                         repair=_word(spec, "repair", where, REPAIRS, "R1"), j=_number(spec, "j", where, None),
                         K=_integer(spec, "K", where, None))


def _repairable_metrics(model, fp) -> dict[str, float]:
    import jsmkt

    out = {"availability": float(jsmkt.availability(model, fp)),
           "customers_at_failed_servers": float(jsmkt.customers_at_failed_servers(model, fp)),
           "repairmen_utilisation": float(jsmkt.repairmen_utilisation(model, fp))}
    if model.repair == "R3":
        out["fraction_failed_waiting"] = float(jsmkt.fraction_failed_waiting(model, fp))
    return out


def _choice_text(model, choice=None) -> str:
    d = (model.choice if choice is None else choice).number
    return str(d) if isinstance(d, int) else f"{float(d):.6g} (randomised, E[D])"


def _retrial_metrics(model, fp) -> dict[str, float]:
    import jsmkt

    out = {"mean_orbit_size": float(jsmkt.mean_orbit_size(model, fp)),
           "prob_blocked": float(jsmkt.prob_blocked(model, fp)),
           "prob_retrial_success": float(jsmkt.prob_retrial_success(model, fp))}
    if model.retrial == "reprobe" and model.policy == "linear":
        out["mean_sojourn_time_tagged"] = float(jsmkt.mean_sojourn_time_tagged(model, fp))
    return out


def _service_text(model) -> str:
    if isinstance(model, JSQdBatchService) and model.m == 1:
        return f"service epochs: exponential, rate mu = {1.0 / float(model.service.mean):.6g}"
    if isinstance(model, JSQdBatchService):
        s = model.service
        return f"service epochs: PH of order {s.order}, mean {float(s.mean):.6g}, SCV {float(s.scv):.6g}"
    if isinstance(model, JSQdClasses) and model.m == 1:
        return f"service: exponential, rate mu = {1.0 / float(model.service.mean):.6g}"
    if isinstance(model, (JSQdPH, JSQdClasses)):
        s = model.service
        return f"service: PH of order {s.order}, mean {float(s.mean):.6g}, SCV {float(s.scv):.6g}"
    return f"service: exponential, rate mu = {float(model.mu):.6g}"


class Parameter(NamedTuple):
    """A named parameter of a family, for sensitivities and optimisation (`jsmkt.sensitivity`): `where` picks the
    model's field it sets (an array leaf, a choice rule, the service `PH`, or a tuple of them), `kind` how its value
    reads and how a new value is written (`jsmkt._sensitivity`):

    - `"real"`: the array itself (a rate, or a vector of rates);
    - `"probabilities"`: a probability vector (or a tuple of them); its derivatives are taken along directions that
      keep the sum 1;
    - `"choice"`: a choice rule (or a tuple of them): a fixed integer `d` reads as the real `d` of
      `InterpolatedChoice` (a right derivative), a real `d` as itself, probabilities over 1, 2, ... servers as a
      probability vector;
    - `"service mean"`: the mean of the service `PH`, moved by scaling time (`T / c`: every moment scales, the SCV
      and the shape stay)."""

    where: Callable[[Any], Any]
    kind: str = "real"
    doc: str = ""


class Family(NamedTuple):
    """A registered model family: its TOML name, class, spec keys and builder, how the CLI describes it, small
    instances (`examples`) that the contract tests run on every family, and its named parameters (`params`: name ->
    `Parameter`, for sensitivities and optimisation; a parameter the model lacks, e.g. `j` outside R.3, is left out
    by `parameters_of`)."""

    name: str
    model: type
    keys: frozenset[str]
    build: Callable[[dict[str, Any], str], Any]
    parameters: Callable[[Any], dict[str, Any]]  # the model's parameters for the JSON output
    describe: Callable[[Any], str]  # one line of parameters (the CLI's header)
    examples: Callable[[], dict[str, Any]]
    params: dict[str, Parameter]
    published: bool = False  # `jsmkt solve --as-published` applies
    metrics: Callable[[Any, Any], dict[str, float]] | None = None  # the family's own metrics at a fixed point
    level: str = "Q"  # what a level counts, for the tables: "Q" (jobs at a server) or "orbit"
    utilisation: str = "utilisation s_1"  # the tables' label of the fraction of servers serving


_LAM = Parameter(lambda m: m.lam, doc="arrival rate per server")
_MU = Parameter(lambda m: m.mu, doc="service rate")
_D = Parameter(lambda m: m.choice, "choice", "choice number of arrivals")
_MEAN = Parameter(lambda m: m.service, "service mean", "mean service time (time scaled, shape kept)")


FAMILIES: dict[str, Family] = {
    "jsq": Family(
        "jsq", JSQd, frozenset({"lam", "d", "K", "mu"}), _jsq,
        parameters=lambda m: {"lam": float(m.lam), "d": float(m.choice.mean), "mu": float(m.mu)},
        describe=lambda m: f"lam = {float(m.lam):.6g}   d = {_choice_text(m)}",
        examples=lambda: {"jsq2": JSQd(0.7, d=2, K=14), "jsq-mixed": JSQd(0.8, d=jnp.array([0.2, 0.3, 0.5]), K=24),
                          "jsq-real-d": JSQd(0.8, d=2.5, K=14)},
        params={"lam": _LAM, "mu": _MU, "d": _D},
        published=True,
    ),
    "jsq-ph": Family(
        "jsq-ph", JSQdPH, frozenset({"lam", "d", "K", "service"}), _jsq_ph,
        parameters=lambda m: {"lam": float(m.lam), "d": float(m.choice.mean)},
        describe=lambda m: f"lam = {float(m.lam):.6g}   d = {_choice_text(m)}",
        examples=lambda: {"jsq2-h2": JSQdPH(0.8, hyperexponential2(1.0, 4.0), d=2, K=24),
                          "jsq-erlang-real-d": JSQdPH(0.7, erlang(3), d=2.5, K=12)},
        params={"lam": _LAM, "mean": _MEAN, "d": _D},
        published=True,
    ),
    "jsq-batch": Family(
        "jsq-batch", JSQdBatch, frozenset({"batch_rate", "batch_sizes", "d", "K", "mu"}), _jsq_batch,
        parameters=lambda m: {"batch_rate": float(m.batch_rate),
                              "batch_sizes": [float(p) for p in m.batch_sizes], "d": float(m.choice.mean),
                              "mu": float(m.mu), "lam": float(m.arrival_rate)},
        describe=lambda m: (f"batch_rate = {float(m.batch_rate):.6g}   batch sizes 1..{m.batch_sizes.shape[0]} "
                            f"(mean {float(m.mean_batch_size):.6g})   d = {_choice_text(m)}"),
        examples=lambda: {"batch-halves": JSQdBatch(0.6, jnp.array([0.5, 0.5]), d=2, K=40),
                          "batch-uniform4-d3": JSQdBatch(0.3, jnp.full(4, 0.25), d=3, K=40)},
        params={"batch_rate": Parameter(lambda m: m.batch_rate, doc="batch arrival rate per server"),
                "batch_sizes": Parameter(lambda m: m.batch_sizes, "probabilities", "batch-size probabilities"),
                "mu": _MU, "d": _D},
    ),
    "jsq-classes": Family(
        "jsq-classes", JSQdClasses, frozenset({"classes", "helpers", "mu", "service", "K"}), _jsq_classes,
        parameters=lambda m: {"classes": [{"lam": float(m.lam[j]), "d": float(m.choices[j].mean),
                                           "batch_sizes": [float(p) for p in m.batch_sizes[j]]}
                                          for j in range(m.n_classes)],
                              "helpers": [{"rate": float(r), "f": float(c.mean)}
                                          for r, c in zip(m.helper_rates, m.helper_choices, strict=True)],
                              "lam": float(m.arrival_rate)},
        describe=_classes_text,
        examples=lambda: {"classes-h2-batch-helpers": JSQdClasses(
                              [0.3, 0.2], d=[2, 1.5], batch_sizes=[None, jnp.array([0.5, 0.5])],
                              service=hyperexponential2(1.0, 2.0), helper_rates=[0.2], f=[2], K=32),
                          "classes-d1-d3": JSQdClasses([0.3, 0.4], d=[1, 3], K=24)},
        params={"lam": Parameter(lambda m: m.lam, doc="batch arrival rate per server of each class"),
                "mean": _MEAN,
                "batch_sizes": Parameter(lambda m: m.batch_sizes, "probabilities",
                                         "batch-size probabilities of each class"),
                "d": Parameter(lambda m: m.choices, "choice", "choice number of each class"),
                "helper_rates": Parameter(lambda m: m.helper_rates, doc="rate per server of each helper pool"),
                "f": Parameter(lambda m: m.helper_choices, "choice", "choice number of each helper pool")},
        metrics=_classes_metrics,
    ),
    "jsq-batch-service": Family(
        "jsq-batch-service", JSQdBatchService, frozenset({"lam", "d", "K", "service", "service_batch_sizes"}),
        _jsq_batch_service,
        parameters=lambda m: {"lam": float(m.lam), "d": float(m.choice.mean),
                              "service_batch_sizes": [float(p) for p in m.service_batch_sizes]},
        describe=lambda m: (f"lam = {float(m.lam):.6g}   d = {_choice_text(m)}   service batches "
                            f"1..{m.service_batch_sizes.shape[0]} (mean {float(m.mean_service_batch_size):.6g})"),
        examples=lambda: {"batch-service-h2": JSQdBatchService(1.2, hyperexponential2(1.0, 2.0), jnp.array([0.5, 0.5]),
                                                               d=2, K=32),
                          "batch-service-exp-d3": JSQdBatchService(1.4, exponential(1.0), jnp.full(3, 1 / 3), d=3,
                                                                   K=24)},
        params={"lam": _LAM, "mean": _MEAN,
                "service_batch_sizes": Parameter(lambda m: m.service_batch_sizes, "probabilities",
                                                 "service batch-size probabilities"),
                "d": _D},
    ),
    "retrial": Family(
        "retrial", RetrialJSQ, frozenset({"lam", "theta", "d1", "d2", "mu", "retrial", "policy", "K"}), _retrial,
        parameters=lambda m: {"lam": float(m.lam), "theta": float(m.theta), "d1": float(m.choice1.mean),
                              "d2": float(m.choice2.mean), "mu": float(m.mu), "retrial": m.retrial,
                              "policy": m.policy},
        describe=lambda m: (f"lam = {float(m.lam):.6g}   theta = {float(m.theta):.6g}   d1 = {_choice_text(m)}   "
                            + (f"d2 = {_choice_text(m, m.choice2)}   " if m.retrial == "reprobe" else "")
                            + f"retrial = {m.retrial}   policy = {m.policy}"),
        examples=lambda: {"retrial-reprobe-real-d": RetrialJSQ(0.7, 1.0, d1=1.5, d2=2.5, K=16),
                          "retrial-own-constant-real-d": RetrialJSQ(0.6, 2.0, d1=2.5, retrial="own",
                                                                    policy="constant", K=16)},
        params={"lam": _LAM, "theta": Parameter(lambda m: m.theta, doc="retrial rate"), "mu": _MU,
                "d1": Parameter(lambda m: m.choice1, "choice", "choice number of primary arrivals"),
                "d2": Parameter(lambda m: m.choice2, "choice", "choice number of retrials")},
        metrics=_retrial_metrics, level="orbit", utilisation="utilisation (busy)",
    ),
    "repairable": Family(
        "repairable", RepairableJSQ,
        frozenset({"lam", "mu", "alpha", "beta", "d1", "d2", "arrival", "repair", "j", "K"}), _repairable,
        parameters=lambda m: {"lam": float(m.lam), "alpha": float(m.alpha), "beta": float(m.beta),
                              "d1": float(m.choice1.mean), "d2": float(m.choice2.mean), "mu": float(m.mu),
                              "arrival": m.arrival, "repair": m.repair,
                              **({"j": float(m.j)} if m.j is not None else {})},
        describe=lambda m: (f"lam = {float(m.lam):.6g}   alpha = {float(m.alpha):.6g}   beta = {float(m.beta):.6g}   "
                            f"d1 = {_choice_text(m)}   "
                            + (f"d2 = {_choice_text(m, m.choice2)}   " if m.repair != "R1" else "")
                            + f"arrival = {m.arrival}   repair = {m.repair}"
                            + (f"   j = {float(m.j):.6g}" if m.j is not None else "")),
        examples=lambda: {"model-II-real-d": RepairableJSQ(0.5, 0.2, 0.5, d1=1.5, d2=2.5, repair="R2", K=48),
                          "R3-saturated-A2": RepairableJSQ(0.5, 0.2, 0.5, arrival="A2", repair="R3", j=0.1,
                                                           K=24)},
        params={"lam": _LAM, "alpha": Parameter(lambda m: m.alpha, doc="failure rate"),
                "beta": Parameter(lambda m: m.beta, doc="repair rate"), "mu": _MU,
                "d1": Parameter(lambda m: m.choice1, "choice", "choice number of arrivals"),
                "d2": Parameter(lambda m: m.choice2, "choice", "choice number of the (large) repairman"),
                "j": Parameter(lambda m: m.j, doc="R.3: fraction of servers with a small repairman")},
        metrics=_repairable_metrics, utilisation="utilisation (serving)",
    ),
}
MODELS = tuple(FAMILIES)


def family_of(model) -> Family:
    """The registered family of `model` (by its exact type); `ValueError` otherwise."""
    for fam in FAMILIES.values():
        if type(model) is fam.model:
            return fam
    raise ValueError(f"{type(model).__name__} is not a registered model family ({', '.join(MODELS)})")


def describe_model(model) -> str:
    """The CLI's two-line description of a model: its parameters, truncation and load; its service."""
    fam = family_of(model)
    return (f"{fam.describe(model)}   K = {model.K}   load rho = {float(model.load()):.6g}\n{_service_text(model)}")


def model_from_spec(spec: dict[str, Any], where: str = "spec"):
    """Build a model from a parsed TOML spec (`model` names a registered family)."""
    name = _require(spec, "model", where)
    if name not in FAMILIES:
        raise SpecError(f"{where}: model={show(name)} is not one of {', '.join(map(show, MODELS))}")
    fam = FAMILIES[name]
    _allowed(spec, set(fam.keys) | {"model", "simulation"}, where)
    try:
        return fam.build(spec, where)
    except SpecError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:
        raise SpecError(f"{where}: {e}") from None


def _simulation_service(table: Any, where: str) -> PH | GeneralService:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table (got {show(table)})")
    kind = _require(table, "kind", where)
    if kind not in SIMULATION_KINDS + SERVICE_KINDS:
        raise SpecError(f"{where}: kind={show(kind)} is not one of {', '.join(SIMULATION_KINDS + SERVICE_KINDS)}")
    try:
        if kind == "deterministic":
            _allowed(table, {"kind", "mean"}, where)
            return deterministic(_number(table, "mean", where, 1.0))
        if kind == "lognormal":
            _allowed(table, {"kind", "mean", "scv"}, where)
            return lognormal(_number(table, "mean", where, 1.0), _number(table, "scv", where))
    except SpecError:
        raise
    except ValueError as e:
        raise SpecError(f"{where}: {e}") from None
    return service_from_spec(table, where)


def simulation_from_spec(spec: dict[str, Any], where: str = "spec") -> dict[str, Any]:
    """Keyword arguments for `jsmkt.simulate` (`sampling`, `service`) from the optional `[simulation]` table."""
    sim = spec.get("simulation", {})
    if not isinstance(sim, dict):
        raise SpecError(f"{where}: [simulation] must be a table (got simulation = {show(sim)})")
    _allowed(sim, {"sampling", "service"}, "[simulation]")
    kwargs: dict[str, Any] = {}
    if "sampling" in sim:
        if sim["sampling"] not in SAMPLING:
            raise SpecError(f"[simulation]: sampling={show(sim['sampling'])} is not one of "
                            f"{', '.join(map(show, SAMPLING))}")
        kwargs["sampling"] = sim["sampling"]
    if "service" in sim:
        kwargs["service"] = _simulation_service(sim["service"], "[simulation.service]")
    return kwargs
