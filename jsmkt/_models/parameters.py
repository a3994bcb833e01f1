"""The declarative table of a model family: its TOML name, named parameters and example specs.

A family's class states, next to its physics, one `FamilyTable` as its class attribute `table`:

```python
table = FamilyTable("jsq", (
    Parameter("lam", "rate", "arrival rate per server", field="lam"),
    Parameter("d", "choice", "choice number of arrivals", default=2, field="choice"),
    ...
), specs=("examples/jsq3_exponential.toml",))
```

The table is data only: every value is a literal or a `Parameter`/`FamilyTable` of this module, so that
`jsmkt._spec` reads it from the family's file (`read_table`) without importing the family's module, which imports
JAX: a spec is checked before JAX is imported. From the table are generated the TOML parser and its value checks
(`jsmkt._spec`), the overrides (`key=value`, by TOML path), the parameters named by `jsmkt.sensitivity`, the CLI's keys and
the TOML reference of the documentation.

One naming rule for every consumer: a parameter is named by its TOML path, dotted for tables (`lam`, `d`,
`service.mean`, `arrivals.rates`, `classes.0.lam`); `aliases` are other names a consumer accepts (`mean` for
`service.mean` in `jsmkt.sensitivity`). This module imports nothing but the standard library.
"""

import ast
import pathlib
import re
import textwrap
from typing import Any, NamedTuple


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a key a spec must give


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()  # the default of a key whose absence leaves the constructor's default

KINDS = {
    "rate": "a positive finite number",
    "number": "a finite number",
    "fraction": "a number in [0, 1)",
    "probabilities": "a probability vector (entries >= 0 summing to 1)",
    "choice": "a choice law: an integer >= 1, a real number >= 1 (randomised) or probabilities over 1, 2, ... servers",
    "ph": "a [service] table (a phase-type distribution)",
    "bmap": "an [arrivals] table (C and D of a BMAP)",
    "integer": "a TOML integer",
    "policy": "one of a few words",
    "boolean": "true or false",
    "string": "a string",
    "tables": "an array of tables ([[key]] sections)",
}
"""The kinds of parameter, and the constraint each states (checked by the TOML parser, `jsmkt._spec`)."""


class Parameter(NamedTuple):
    """One named parameter of a family.

    - `name`: the TOML key (the constructor's argument `arg` unless given).
    - `kind`: one of `KINDS`; it fixes the constraint checked, and what the error message says.
    - `doc`: what the parameter is (the documentation's and the sensitivities' description).
    - `default`: the value when the key is left out; `REQUIRED` for a key a spec must give; `None` leaves the
      constructor's default (e.g. `K`, chosen from the parameters) where it is `None`; `OMIT` passes nothing.
    - `what`: the constraint's words in messages (`"batch-size probabilities"`, `"the number of phases"`).
    - `minimum`: the least value of an `integer`.
    - `choices`: the words of a `policy`.
    - `excludes`: keys that cannot be given with this one (`mu` or `[service]`); where one is given, `default`
      does not apply.
    - `entries`: the keys of each table of a `tables` parameter; each entry's `arg` is the constructor's argument
      that takes the list of its values over the tables.
    - `field`: the model's attribute holding the value (`lam`, `choice`, `service`); `None` where there is none.
    - `sensitivity`: how `jsmkt.sensitivity` reads and moves the field (`jsmkt._sensitivity`): `"real"`,
      `"probabilities"`, `"choice"`, `"service mean"`, `"bmap rates"`; `None`: not a parameter for
      derivatives.
    - `wrt`: the parameter's name for `jsmkt.sensitivity` where it differs from `name` (`service.mean`);
    - `aliases`: other names accepted for it (`mean`).
    """

    name: str
    kind: str
    doc: str = ""
    default: Any = REQUIRED
    arg: str | None = None
    what: str = ""
    minimum: int = 1
    choices: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    entries: tuple["Parameter", ...] = ()
    field: str | None = None
    sensitivity: str | None = None
    wrt: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def argument(self) -> str:
        """The constructor's argument that takes the value."""
        return self.arg or self.name

    @property
    def sensitivity_name(self) -> str:
        """The name of the parameter for `jsmkt.sensitivity` (its TOML path)."""
        return self.wrt or self.name


class FamilyTable(NamedTuple):
    """All a family states besides its physics: its TOML name (`model = "name"`), parameters (`Parameter`, in the
    order of the constructor's arguments), example specs (paths under the repository, `examples/*.toml`),
    whether `jsmkt solve --as-published` applies (`published`), what a level counts for the CLI's tables (`level`:
    `"Q"` jobs at a server, `"orbit"`), the tables' label of the fraction of servers serving (`utilisation`),
    and whether `[simulation.service]` applies (`simulation_service`: the simulator can run the family with another
    service law)."""

    name: str
    parameters: tuple[Parameter, ...]
    specs: tuple[str, ...] = ()
    published: bool = False
    level: str = "Q"
    utilisation: str = "utilisation s_1"
    simulation_service: bool = False

    def parameter(self, name: str) -> Parameter:
        """The parameter of TOML key `name` (`KeyError` where there is none)."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)


TRUNCATION = Parameter("K", "integer", "truncation level (largest queue length kept); chosen from the parameters "
                       "when left out", default=None, minimum=2, what="the largest queue length kept")
"""The truncation level `K`, a key of every family."""


def read_table(path: str | pathlib.Path) -> tuple[str, FamilyTable] | None:
    """`(class name, table)` of the family defined in the Python file `path` (the class whose body assigns `table`),
    read from its source without importing it; `None` where the file defines no family. The table's expression is
    evaluated with this module's names alone: a table that uses anything else is refused (`ValueError`)."""
    source = pathlib.Path(path).read_text(encoding="utf-8")
    found = _table_statement(source, str(path))
    if found is None:  # not in the usual layout: the whole file
        found = next(((node.name, stmt) for node in ast.parse(source, str(path)).body if isinstance(node, ast.ClassDef)
                      for stmt in node.body
                      if isinstance(stmt, ast.Assign) and [ast.unparse(t) for t in stmt.targets] == ["table"]), None)
    if found is None:
        return None
    name, stmt = found
    code = compile(ast.Expression(stmt.value), str(path), "eval")
    names = {"Parameter": Parameter, "FamilyTable": FamilyTable, "REQUIRED": REQUIRED, "TRUNCATION": TRUNCATION}
    try:
        table = eval(code, {"__builtins__": {}}, names)  # noqa: S307  (literals and this module's types)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{path}: the table of {name} is not plain data ({type(e).__name__}: {e}); use literals, "
                         "Parameter and FamilyTable only") from None
    if not isinstance(table, FamilyTable):
        raise ValueError(f"{path}: {name}.table must be a FamilyTable")
    return name, table


_CLASS = re.compile(r"^class (\w+)\b", re.MULTILINE)
_TABLE = re.compile(r"^    table = ", re.MULTILINE)
_BODY_STATEMENT = re.compile(r"^(?: {4})?[^\s)\]}]")  # a line that starts a statement of a class body or module


def _table_statement(source: str, where: str) -> tuple[str, ast.Assign] | None:
    """`(class name, the assignment)` of the one `    table = ...` of a class body, parsed alone (parsing a whole
    family file costs several milliseconds, which every command start-up would pay per family); None where the
    file is not laid out so (no such line or several, a class body not at 4 spaces): `read_table` then parses the
    whole file."""
    starts = [m.start() for m in _TABLE.finditer(source)]
    classes = [m for m in _CLASS.finditer(source) if starts and m.start() < starts[0]]
    if len(starts) != 1 or not classes:
        return None
    lines = source[starts[0]:].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if _BODY_STATEMENT.match(line)), len(lines))
    try:
        tree = ast.parse(textwrap.dedent("\n".join(lines[:end])), where)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return None
    return classes[-1].group(1), tree.body[0]


FAMILY_MODULES = ("jsqd", "jsqd_ph", "batch", "classes", "batch_service", "bmap", "retrial", "repairable")
"""The modules of `jsmkt._models` that define jsmkt's families, in the order the registry lists them."""


class FamilyEntry(NamedTuple):
    """Where a built-in family lives: `jsmkt._models.<module>`, its class's name, and its table."""

    module: str
    class_name: str
    table: FamilyTable


_BUILTIN: list[FamilyEntry] = []


def builtin_families() -> list[FamilyEntry]:
    """jsmkt's families, read from their files' tables (`read_table`) without importing them."""
    if not _BUILTIN:
        here = pathlib.Path(__file__).resolve().parent
        for module in FAMILY_MODULES:
            found = read_table(here / f"{module}.py")
            if found is None:
                raise ValueError(f"jsmkt._models.{module} defines no family table")
            _BUILTIN.append(FamilyEntry(f"jsmkt._models.{module}", *found))
    return list(_BUILTIN)


def family_class(entry: FamilyEntry) -> type:
    """The class of a built-in family (its module imported)."""
    import importlib

    return getattr(importlib.import_module(entry.module), entry.class_name)


def families_with_observable(name: str) -> list[str]:
    """The TOML names of jsmkt's families some of whose examples name the observable `name`."""
    out = []
    for entry in builtin_families():
        cls = family_class(entry)
        if any(name in m.observables() for m in cls.examples().values()):
            out.append(entry.table.name)
    return out


# --- named parameters for derivatives ---------------------------------------------------------------------------


def _attribute(name: str, model):
    """`model.<name>` (a picklable `NamedParameter.where`)."""
    return getattr(model, name)


class NamedParameter(NamedTuple):
    """A named parameter of a family, for sensitivities and optimisation (`jsmkt.sensitivity`), made from its
    table's `field` and `sensitivity`: `where` picks the model's field it sets (an array leaf, a choice rule, the
    service `PH`, a `BMAP`, or a tuple of them), `kind` how its value reads and how a new value is written
    (`jsmkt._sensitivity`):

    - `"real"`: the array itself (a rate, or a vector of rates);
    - `"probabilities"`: a probability vector (or a tuple of them); its derivatives are taken along directions that
      keep the sum 1;
    - `"choice"`: a choice rule (or a tuple of them): a fixed integer `d` reads as the real `d` of
      `InterpolatedChoice` (a right derivative), a real `d` as itself, probabilities over 1, 2, ... servers as a
      probability vector;
    - `"service mean"`: the mean of the service `PH`, moved by scaling time (`T / c`: every moment scales, the SCV
      and the shape stay);
    - `"bmap rates"`: the rates of a `BMAP`, one array `[C off its diagonal, D_1, ..., D_B]`; C's diagonal follows
      (the rows of C + sum D sum to 0), so that every value is a BMAP of the same order and largest batch."""

    where: Any
    kind: str = "real"
    doc: str = ""


_SENSITIVITY_DOCS = {"service mean": "mean service time (time scaled, shape kept)",
                     "bmap rates": "the BMAP's rates: [0] C off its diagonal (silent phase changes), [b] D[b - 1] "
                                   "(batches of b); C's diagonal follows (rows of C + sum D sum to 0)"}


def sensitivity_parameters(table: FamilyTable) -> tuple[dict[str, NamedParameter], dict[str, str]]:
    """The named parameters of a family for `jsmkt.sensitivity`, by TOML path (`service.mean`), and their aliases
    (`mean -> service.mean`): the table's parameters (and their tables' entries) that name a field and a
    sensitivity kind."""
    import functools

    params: dict[str, NamedParameter] = {}
    aliases: dict[str, str] = {}
    for p in table.parameters:
        for q in (p, *p.entries):
            if q.field is not None and q.sensitivity is not None:
                doc = _SENSITIVITY_DOCS.get(q.sensitivity, q.doc)
                params[q.sensitivity_name] = NamedParameter(functools.partial(_attribute, q.field), q.sensitivity, doc)
                aliases.update({a: q.sensitivity_name for a in q.aliases})
    return params, aliases


# --- families registered at run time ------------------------------------------------------------------------------

_REGISTERED: dict[type, FamilyTable] = {}


def register_table(cls: type, table: FamilyTable) -> None:
    """Record the table of a family registered at run time (`jsmkt.register_family`), so that the library's
    consumers (`jsmkt.sensitivity`) read it as they read a built-in family's `table`."""
    _REGISTERED[cls] = table


def table_of(cls: type) -> FamilyTable | None:
    """The table of the family class `cls`: its own `table`, or the one recorded when it was registered; `None`
    for a class that is no registered family (e.g. a model as published)."""
    own = getattr(cls, "table", None)
    if isinstance(own, FamilyTable):
        return own
    return _REGISTERED.get(cls)


def family_names() -> list[str]:
    """The TOML names of jsmkt's families and of those registered at run time."""
    return [e.table.name for e in builtin_families()] + [t.name for t in _REGISTERED.values()]


def signature_table(cls: type, name: str) -> FamilyTable:
    """The table of a family class that states none, read from its constructor's signature: an argument annotated
    `int` (or whose default is an integer) is an `integer`, `bool` a `boolean`, `str` a `string`, `service` a `ph`
    (a `[service]` table), anything else a `number`; an argument without a default is required, one with a default
    may be left out (the constructor's default applies). Each argument names the model's attribute of the same name
    (the CLI's output); a `number` that is an array field of the model is a parameter for `jsmkt.sensitivity`.
    `ValueError` for a signature with `*args`/`**kwargs`, an argument named `model` or `simulation`, or no `K`."""
    import dataclasses
    import inspect

    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cls={cls.__qualname__}: its constructor's signature cannot be read ({e})") from None
    leaves = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("static", False)}
    params = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"cls={cls.__qualname__}: its constructor takes {p}; name every argument (they are "
                             "the TOML keys)")
        if p.name in ("model", "simulation"):
            raise ValueError(f"cls={cls.__qualname__}: its constructor's argument {p.name!r} clashes with the "
                             f"spec's key {p.name!r}; rename it")
        if p.name == "K":
            params.append(TRUNCATION._replace(default=OMIT if p.default is not p.empty else REQUIRED))
            continue
        hint = _hint(p.annotation) if p.annotation is not p.empty else \
            type(p.default).__name__ if p.default is not p.empty else ""
        kind = {"bool": "boolean", "int": "integer", "str": "string"}.get(hint, "number")
        if p.name == "service":  # a `[service]` table, as jsmkt's families read it
            kind = "ph"
        params.append(Parameter(p.name, kind, f"{cls.__name__}'s argument {p.name}",
                                default=REQUIRED if p.default is p.empty else OMIT, minimum=-(2**63),
                                field=p.name,
                                sensitivity="real" if kind == "number" and p.name in leaves else None))
    if not any(p.name == "K" for p in params):
        raise ValueError(f"cls={cls.__qualname__}: its constructor takes no K (the truncation level), which every "
                         "family has; add it (an integer, with a default)")
    return FamilyTable(name, tuple(params))


def _hint(annotation: Any) -> str:
    """The name of an annotation's type, `None` left out of a union (`int | None` is `int`); a string annotation
    (`from __future__ import annotations`) is read as written. `""` for a union of several types."""
    import typing

    if isinstance(annotation, str):
        names = [t.strip() for t in annotation.replace("Optional[", "").rstrip("]").split("|")]
    else:
        names = [getattr(t, "__name__", "") for t in (typing.get_args(annotation) or (annotation,))]
    names = [n for n in names if n not in ("None", "NoneType")]
    return names[0] if len(names) == 1 else ""
