"""TOML model specifications (used by the CLI).

```toml
model = "jsq-ph"      # "jsq" (exponential service) or "jsq-ph"
lam = 0.9             # arrival rate per server
d = 2                 # integer, real (randomised choice number) or list of probabilities over 1, 2, ... servers
K = 48                # optional truncation level
mu = 1.0              # "jsq" only: service rate

[service]             # "jsq-ph" only
kind = "erlang"       # exponential | erlang | hyperexponential | h2 | coxian | coxian2 | ph | moments
k = 2                 # erlang: phases;  mean = 1.0 for erlang / h2 / coxian2 / exponential
# h2, coxian2: mean, scv;  hyperexponential: probs, rates;  coxian: rates, probs;  ph: alpha, T
# moments: m1, m2, m3 (Telek-Heindl PH(2) fit; clip = true projects infeasible moments onto the PH(2) range)
```
"""

import tomllib
from typing import Any

import jax.numpy as jnp

from ._distributions.fit import fit_ph2_three_moments
from ._distributions.ph import PH, coxian, coxian2, erlang, exponential, hyperexponential, hyperexponential2
from ._models.jsqd import JSQd
from ._models.jsqd_ph import JSQdPH


class SpecError(ValueError):
    """A model specification that cannot be used; the message names the key and the value."""


MODELS = ("jsq", "jsq-ph")
SERVICE_KINDS = ("exponential", "erlang", "hyperexponential", "h2", "coxian", "coxian2", "ph", "moments")


def load_spec(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
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


def service_from_spec(table: dict[str, Any], where: str = "[service]") -> PH:
    """Build a PH distribution from a `[service]` table."""
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table")
    kind = _require(table, "kind", where)
    try:
        if kind == "exponential":
            _allowed(table, {"kind", "mean", "rate"}, where)
            rate = table.get("rate", 1.0 / table.get("mean", 1.0))
            return exponential(rate)
        if kind == "erlang":
            _allowed(table, {"kind", "k", "mean"}, where)
            return erlang(_require(table, "k", where), table.get("mean", 1.0))
        if kind == "h2":
            _allowed(table, {"kind", "mean", "scv"}, where)
            return hyperexponential2(table.get("mean", 1.0), _require(table, "scv", where))
        if kind == "hyperexponential":
            _allowed(table, {"kind", "probs", "rates"}, where)
            return hyperexponential(_require(table, "probs", where), _require(table, "rates", where))
        if kind == "coxian":
            _allowed(table, {"kind", "rates", "probs"}, where)
            return coxian(_require(table, "rates", where), _require(table, "probs", where))
        if kind == "coxian2":
            _allowed(table, {"kind", "mean", "scv"}, where)
            return coxian2(table.get("mean", 1.0), _require(table, "scv", where))
        if kind == "ph":
            _allowed(table, {"kind", "alpha", "T"}, where)
            return PH(_require(table, "alpha", where), _require(table, "T", where))
        if kind == "moments":
            _allowed(table, {"kind", "m1", "m2", "m3", "clip"}, where)
            m = [_require(table, k, where) for k in ("m1", "m2", "m3")]
            if table.get("clip", False):
                return fit_ph2_three_moments(*m, clip=True)[0]
            return fit_ph2_three_moments(*m)
    except SpecError:
        raise
    except (ValueError, TypeError) as e:
        raise SpecError(f"{where}: {e}") from None
    raise SpecError(f"{where}: kind={kind!r} is not one of {', '.join(SERVICE_KINDS)}")


def model_from_spec(spec: dict[str, Any], where: str = "spec"):
    """Build a model from a parsed TOML spec."""
    model = _require(spec, "model", where)
    if model not in MODELS:
        raise SpecError(f"{where}: model={model!r} is not one of {', '.join(map(repr, MODELS))}")
    lam = _require(spec, "lam", where)
    d = spec.get("d", 2)
    if isinstance(d, list):
        d = jnp.asarray(d, dtype=float)
    K = spec.get("K")
    try:
        if model == "jsq":
            _allowed(spec, {"model", "lam", "d", "K", "mu", "simulation"}, where)
            return JSQd(lam, d=d, mu=spec.get("mu", 1.0), K=K)
        _allowed(spec, {"model", "lam", "d", "K", "service", "simulation"}, where)
        service = service_from_spec(_require(spec, "service", where))
        return JSQdPH(lam, service, d=d, K=K)
    except SpecError:
        raise
    except (ValueError, TypeError) as e:
        raise SpecError(f"{where}: {e}") from None
