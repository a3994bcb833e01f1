"""The package's layers (ARCHITECTURE.md, the import-linter contract in pyproject.toml) and its import graph.

A module imports only from its own layer or below, inside functions too, and no two modules import each other,
directly or through others. Both are read from the source by grimp (import-linter's graph), without importing
jsmkt's modules."""

import pathlib

import grimp
from importlinter.cli import lint_imports


ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_layers_contract_is_kept():
    """`lint-imports` on pyproject.toml's contract: every module of jsmkt in a layer, no import upwards."""
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0, (
        "an import goes up the layers of pyproject.toml's [tool.importlinter] contract: see the report above"
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycles_are_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    """No cycle among jsmkt's modules, function-level imports included. The package itself (`jsmkt/__init__.py`,
    which names every public name for lazy loading) is left out: the modules that import it are the top layer's,
    and the contract checks that nothing below reaches the names it re-exports."""
    graph = grimp.build_graph("jsmkt", include_external_packages=False, cache_dir=None)
    modules = graph.modules - {"jsmkt"}
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    cycles = _cycles(edges)
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"
