"""Compiled functions of a model kept across processes, for the CLI: a function is traced once, serialised with
`jax.export` into a cache folder, and later processes load and call it instead of tracing and lowering it again
(JAX's persistent compilation cache, which the CLI turns on, already spares them the compiling). Tracing jsmkt's
solver through Optimistix, Lineax and Equinox, and lowering it, is most of what a repeated `jsmkt solve` would
otherwise spend after its imports.

A file is keyed by jsmkt's source code, the versions of JAX, jaxlib, Equinox, Optimistix and Lineax, the backend,
the function's name and the model's structure: its static fields and the shapes and dtypes of its arrays. The model's
array values are the arguments, so a loop over λ (or any other value) reuses one file, while a new `K`, phase count
or family gets its own. A model whose structure has no stable description (a static field printed with a memory
address) is not kept. The function must return a dict of arrays (what `jax.export` serialises without help).

A file that cannot be read or written only costs the time it would save. A function that cannot be exported (one
that raises while it is traced, or holds a host callback, which `jax.export` cannot serialise) gives `None`: the
caller then runs its usual path, which raises its usual errors.
"""

import functools
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable

import equinox as eqx
import jax
import numpy as np
from jax import export as jax_export


_SUFFIX = ".jsmkt-export"
_folder: pathlib.Path | None = None


def use_folder(path: str | os.PathLike | None) -> None:
    """Keep exported functions in `path` (created when first written); `None` (the default) keeps none, and
    `call` then declines."""
    global _folder
    _folder = None if path is None else pathlib.Path(path)


@functools.cache
def code_digest() -> str:
    """SHA-256 of jsmkt's Python sources (every `.py` file of the package, by relative path and content): a change
    to any of them makes new keys, so a file never outlives the code that traced it."""
    root = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _library_versions() -> tuple[str, ...] | None:
    """The versions of the libraries whose code a trace holds: JAX, jaxlib, and those jsmkt's solves run through;
    None when one is not an installed distribution (its version unknown, nothing is kept)."""
    import importlib.metadata

    try:
        return tuple(f"{name} {importlib.metadata.version(name)}"
                     for name in ("jax", "jaxlib", "equinox", "optimistix", "lineax"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(name: str, treedef, static_leaves, leaves) -> str | None:
    """The file name of function `name` for a model of this structure, or None when the structure has no stable
    text (a memory address in it would make every process miss) or a library's version is unknown."""
    versions = _library_versions()
    if versions is None:
        return None
    avals = [(tuple(np.shape(x)), str(np.result_type(x)), bool(getattr(x, "weak_type", False))) for x in leaves]
    text = repr((name, str(treedef), static_leaves, avals))
    if " at 0x" in text:
        return None
    material = "\n".join([code_digest(), *versions, jax.default_backend(), text])
    return hashlib.sha256(material.encode()).hexdigest() + _SUFFIX


def _load(path: pathlib.Path):
    """The exported function in `path`; None when there is none, or the file is truncated or foreign (it is then
    traced again and replaced)."""
    try:
        return jax_export.deserialize(bytearray(path.read_bytes()))
    except Exception:
        return None


def _store(path: pathlib.Path, exported) -> None:
    """Write atomically (a temporary file renamed into place), so that a concurrent reader sees a whole file or
    none; a folder that cannot be written is left alone."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(exported.serialize())
        os.replace(tmp, path)
    except OSError:
        pass


def call(name: str, fn: Callable[..., dict], model, before_export=None) -> tuple[dict | None, str]:
    """`fn(model)`, a dict of arrays, from the file of its `jax.export` in the folder of `use_folder` when there is
    one for this code and this model structure; otherwise traced, exported into that folder and called.
    `before_export(model)`, if given, runs before tracing, and only then (e.g. a check that depends on the model's
    structure alone, which a loaded file has passed; its exceptions propagate).

    **Returns:** the dict (NumPy arrays) and how it was obtained: `"loaded"`, `"exported"`, or `"traced"` when the
    model's structure has no stable key (nothing is kept); `(None, "off")` without a folder, and `(None,
    "refused")` when `fn` cannot be exported: the caller then runs its usual path."""
    if _folder is None:
        return None, "off"
    dynamic, static = eqx.partition(model, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    static_leaves, static_treedef = jax.tree_util.tree_flatten(static)

    def flat(*args):
        return fn(eqx.combine(jax.tree_util.tree_unflatten(treedef, args), static))

    key = _key(name, (treedef, static_treedef), static_leaves, leaves)
    path = None if key is None else _folder / key
    exported = None if path is None else _load(path)
    how = "loaded"
    if exported is None:
        if before_export is not None:
            before_export(model)
        try:
            exported = jax_export.export(jax.jit(flat))(*leaves)
        except Exception:
            return None, "refused"
        if path is None:
            how = "traced"
        else:
            _store(path, exported)
            how = "exported"
    out = exported.call(*leaves)
    return {k: np.asarray(v) for k, v in out.items()}, how
