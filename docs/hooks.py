"""MkDocs hooks: the pages' generated parts, written when the site is built.

A page asks for a generated part with an HTML comment on a line of its own:

- `<!-- jsmkt:cli -->`: every command's `--help`, from the CLI's argparse parser (`jsmkt.cli.build_parser`);
- `<!-- jsmkt:toml -->`: the TOML reference, from the family registry (`jsmkt._spec.FAMILIES`, made from each
  family's parameter table) and the spec parser's kinds;
- `<!-- jsmkt:families -->`: the table of families with their TOML names, classes and pages;
- `<!-- jsmkt:family NAME -->`: one family's TOML keys, named parameters, `--as-published` and example specs (every
  `examples/*.toml` whose `model` is NAME, included by `pymdownx.snippets`).

Every registered family needs its page, `families/NAME.md`; the build fails otherwise.
"""

import argparse
import os
import pathlib
import posixpath
import re
import sys
import tomllib

from mkdocs.exceptions import PluginError


ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's jsmkt, installed or not

_MARKER = re.compile(r"^<!-- jsmkt:(\w+)(?: ([\w-]+))? -->$", re.M)


def _registry():
    from jsmkt import _spec

    return _spec


def _family_page(name: str) -> str:
    return f"families/{name}.md"


def _link(page, target: str, text: str) -> str:
    """A Markdown link from `page` to the docs file `target` (a path relative to docs/)."""
    here = posixpath.dirname(page.file.src_uri)
    return f"[{text}]({posixpath.relpath(target, here or '.')})"


def _examples(name: str) -> list[str]:
    """The example specs of family `name`: `examples/*.toml` files whose `model` is `name`."""
    out = []
    for path in sorted((ROOT / "examples").glob("*.toml")):
        if tomllib.loads(path.read_text()).get("model") == name:
            out.append(path.relative_to(ROOT).as_posix())
    return out


def _cli() -> str:
    from jsmkt.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps its help at the terminal's width: one width for every build
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = ["```text", parser.format_help().rstrip(), "```", ""]
    for name, command in sub.choices.items():
        parts += [f"### `jsmkt {name}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def _families(page) -> str:
    spec = _registry()
    rows = ["| `model =` | class | page | `--as-published` |", "|---|---|---|---|"]
    for fam in spec.FAMILIES.values():
        rows.append(f"| `\"{fam.name}\"` | [`jsmkt.{fam.class_name}`][jsmkt.{fam.class_name}] "
                    f"| {_link(page, _family_page(fam.name), fam.name)} "
                    f"| {'yes' if fam.published else 'no'} |")
    return "\n".join(rows) + "\n"


def _parameters(fam) -> str:
    """The family's named parameters for sensitivities, by TOML path, with their aliases."""
    rows = ["| name | kind | meaning |", "|---|---|---|"]
    for name, p in fam.params.items():
        aliases = [a for a, n in fam.aliases.items() if n == name]
        also = f" (also `{'`, `'.join(aliases)}`)" if aliases else ""
        rows.append(f"| `{name}`{also} | {p.kind} | {p.doc} |")
    return "\n".join(rows)


def _default(p) -> str:
    spec = _registry()
    if p.default is spec.REQUIRED:
        return "required"
    if p.default is None or p.default is spec.OMIT:
        return "optional"
    if isinstance(p.default, str):
        return f'`"{p.default}"`'
    if isinstance(p.default, (tuple, list)) and not p.default:
        return "none"
    return f"`{p.default}`"


def _keys(fam) -> str:
    """The family's TOML keys, from its parameter table: kind (and the constraint checked), default, meaning."""
    spec = _registry()
    if fam.table is None:
        return ""
    rows = ["| key | kind | default | meaning |", "|---|---|---|---|"]
    for p in fam.table.parameters:
        for q, key in [(p, p.name)] + [(e, f"{p.name}.N.{e.name}") for e in p.entries]:
            kind = spec.KINDS.get(q.kind, q.kind)
            if q.choices:
                kind = "one of " + ", ".join(f'`"{c}"`' for c in q.choices)
            elif q.kind == "integer":
                kind = f"an integer >= {q.minimum}" if q.minimum > -(2**62) else "an integer"
            rows.append(f"| `{key}` | {kind} | {_default(q)} | {q.doc} |")
    return "\n".join(rows)


def _family(page, name: str) -> str:
    spec = _registry()
    if name not in spec.FAMILIES:
        raise PluginError(f"{page.file.src_uri}: no registered family {name!r} ({', '.join(spec.FAMILIES)})")
    fam = spec.FAMILIES[name]
    keys = ", ".join(f"`{k}`" for k in sorted(fam.keys, key=str.lower))
    parts = [
        "## Specification and parameters", "",
        f"TOML: `model = \"{fam.name}\"`, with the keys {keys} "
        f"({_link(page, 'toml.md', 'TOML reference')}). "
        + ("`jsmkt solve --as-published` solves the papers' published equations instead "
           f"({_link(page, 'exact-vs-published.md', 'exact versus published')})."
           if fam.published else "It has no as-published variant."), "",
        "TOML keys (from the family's parameter table; `N` indexes an array of tables, from 0 in overrides):", "",
        _keys(fam), "",
        "Named parameters, for `jsmkt.sensitivity`, `jsmkt sensitivity --wrt` and `jsmkt.optimise` "
        f"({_link(page, 'analysis.md', 'sensitivities')}):", "",
        _parameters(fam), "",
    ]
    examples = _examples(name)
    if examples:
        parts += ["## Example specifications", ""]
        for path in examples:
            parts += [f"`{path}`:", "", "```toml", f'--8<-- "{path}"', "```", ""]
    return "\n".join(parts)


def _toml(page) -> str:
    spec = _registry()
    parts = ["### Families", "", _families(page)]
    for fam in spec.FAMILIES.values():
        keys = ", ".join(f"`{k}`" for k in sorted(fam.keys, key=str.lower))
        examples = ", ".join(f"`{p}`" for p in _examples(fam.name)) or "none"
        parts += [f"### `model = \"{fam.name}\"`", "",
                  f"`jsmkt.{fam.class_name}` ({_link(page, _family_page(fam.name), 'page')}). Keys: {keys}. "
                  f"Examples: {examples}.", "", _keys(fam), "", _parameters(fam), ""]
    kinds = ", ".join(f"`{k}`" for k in spec.SERVICE_KINDS)
    sim_kinds = ", ".join(f"`{k}`" for k in spec.SIMULATION_KINDS)
    sampling = ", ".join(f"`\"{k}\"`" for k in spec.SAMPLING)
    parts += ["### Tables shared by the families", "",
              f"- `[service]` (`kind`): {kinds}.",
              f"- `[simulation]`: `sampling` = {sampling}; `[simulation.service]`: any `[service]` kind, or "
              f"{sim_kinds}.", ""]
    return "\n".join(parts)


def on_files(files, config):
    spec = _registry()
    missing = [name for name in spec.FAMILIES if files.get_file_from_path(_family_page(name)) is None]
    if missing:
        pages = ", ".join(f"{n} (docs/{_family_page(n)})" for n in missing)
        raise PluginError(f"no docs page for the families {pages}")
    return files


def on_page_markdown(markdown, page, config, files):
    def expand(match):
        what, arg = match.group(1), match.group(2)
        if what == "cli":
            return _cli()
        if what == "toml":
            return _toml(page)
        if what == "families":
            return _families(page)
        if what == "family" and arg:
            return _family(page, arg)
        raise PluginError(f"{page.file.src_uri}: unknown marker {match.group(0)}")

    return _MARKER.sub(expand, markdown)
