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

The file's name is a hash of its key, and the file holds the whole key too, ahead of the exported function: a load
checks it, so that a file put under another file's name (the solve of another model of the same shapes, say
d = 3 under the name of d = 2) is never called in its place. Such a file, or one that is not a whole file of this
format, gives a `CacheWarning` and is traced again and overwritten.

A file that cannot be read or written only costs the time it would save (a `CacheWarning` says when an entry
cannot be written). A function that cannot be exported (one that raises while it is traced, or holds a host
callback, which `jax.export` cannot serialise) gives `None`: the caller then runs its usual path, which raises its
usual errors.
"""

import functools
import hashlib
import os
import pathlib
import tempfile
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import numpy as np
from jax import export as jax_export


_SUFFIX = ".jsmkt-export"
_MAGIC = b"jsmkt exported function, format 2\n"  # then the key's length (8 bytes), the key, the export
_folder: pathlib.Path | None = None


class CacheWarning(UserWarning):
    """An entry of the exported-function cache was not used as it is: it holds another key or is damaged (it is
    traced again and overwritten), or it cannot be written."""


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


def _key(name: str, treedef, static_leaves, leaves) -> bytes | None:
    """The key of function `name` for a model of this structure (the text that `_file_name` hashes and the file
    holds), or None when the structure has no stable text (a memory address in it would make every process miss)
    or a library's version is unknown."""
    versions = _library_versions()
    if versions is None:
        return None
    avals = [(tuple(np.shape(x)), str(np.result_type(x)), bool(getattr(x, "weak_type", False))) for x in leaves]
    text = repr((name, str(treedef), static_leaves, avals))
    if " at 0x" in text:
        return None
    return "\n".join([code_digest(), *versions, jax.default_backend(), text]).encode()


def _file_name(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest() + _SUFFIX


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=3)


def _load(path: pathlib.Path, key: bytes):
    """The exported function in `path` when the file holds `key`; None when there is none, or the file holds
    another key, is truncated or is foreign (it is then traced again and overwritten: a `CacheWarning` says so)."""
    try:
        data = path.read_bytes()
    except OSError:  # none, or not a file (writing it will say so)
        return None
    n = len(_MAGIC)
    if not data.startswith(_MAGIC) or len(data) < n + 8:
        _warn(f"the cache entry {path} is not a jsmkt exported function; computing it again (and replacing it)")
        return None
    size = int.from_bytes(data[n:n + 8], "little")
    if data[n + 8:n + 8 + size] != key:
        _warn(f"the cache entry {path} holds another key than its name (the exported function of another model "
              "or jsmkt); computing it again (and replacing it)")
        return None
    try:
        return jax_export.deserialize(bytearray(data[n + 8 + size:]))
    except Exception:
        _warn(f"the cache entry {path} is damaged; computing it again (and replacing it)")
        return None


def _store(path: pathlib.Path, key: bytes, exported) -> None:
    """Write `key` and the exported function atomically (a temporary file renamed into place), so that a concurrent
    reader sees a whole file or none. Where it cannot be written (a folder that cannot be written, a folder in the
    file's place), a `CacheWarning`, and no temporary file is left behind."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + len(key).to_bytes(8, "little") + key + exported.serialize())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        _warn(f"cannot write the cache entry {path} ({e.strerror or e}); the result is computed without it")


def call(name: str, fn: Callable[..., dict], model, before_export=None) -> tuple[dict | None, str]:
    """`fn(model)`, a dict of arrays, from the file of its `jax.export` in the folder of `use_folder` when there is
    one for this code and this model structure; otherwise traced, exported into that folder and called.
    `before_export(model)`, if given, runs before tracing, and only then (e.g. a check that depends on the model's
    structure alone, which a loaded file has passed; its exceptions propagate).

    **Returns:** the dict (NumPy arrays) and how it was obtained: `"loaded"`, `"exported"` (also when the file
    cannot be written), or `"traced"` when the model's structure has no stable key (nothing is kept); `(None,
    "off")` without a folder, and `(None, "refused")` when `fn` cannot be exported: the caller then runs its usual
    path.

    **Warns:** `CacheWarning` when the file found holds another key or is damaged, or cannot be written."""
    if _folder is None:
        return None, "off"
    dynamic, static = eqx.partition(model, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    static_leaves, static_treedef = jax.tree_util.tree_flatten(static)

    def flat(*args):
        return fn(eqx.combine(jax.tree_util.tree_unflatten(treedef, args), static))

    key = _key(name, (treedef, static_treedef), static_leaves, leaves)
    path = None if key is None else _folder / _file_name(key)
    exported = None if path is None else _load(path, key)
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
            _store(path, key, exported)
            how = "exported"
    out = exported.call(*leaves)
    return {k: np.asarray(v) for k, v in out.items()}, how
