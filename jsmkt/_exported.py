"""Compiled functions of a model kept across processes, for the CLI: a function is traced, lowered and compiled
once (for compilation speed, `jsmkt._compile.compile`), its executable serialised into a cache folder
(`jax.experimental.serialize_executable`), and later processes load and run it. A load neither traces nor lowers
the function: tracing jsmkt's solver through Optimistix, Lineax and Equinox and lowering it are most of what a
repeated `jsmkt solve` would otherwise spend after its imports, and JAX's own persistent compilation cache, which
the CLI also turns on, needs both to find its entry.

A file is keyed by jsmkt's source code, the versions of JAX, jaxlib, Equinox, Optimistix and Lineax, the backend,
the device (its model and runtime version) and the CPU it compiled for, the XLA options, the function's name and the
model's structure: its static fields and the shapes and dtypes of its arrays. The model's array values are the
arguments, so a loop over λ (or any other value) reuses one file, while a new `K`, phase count or family gets its
own. A model whose structure has no stable description (a static field printed with a memory address) is not kept.
The function must return a dict of arrays.

The file's name is a hash of its key, and the file holds the whole key too, ahead of the executable: a load checks
it, so that a file put under another file's name (the solve of another model of the same shapes, say d = 3 under
the name of d = 2) is never run in its place. Such a file, or one that is not a whole file of this format, gives a
`CacheWarning` and is compiled again and overwritten. An executable is machine code that a load runs: the cache
folder must be the user's own, as JAX's persistent compilation cache must.

An executable may call only XLA's own operations and LAPACK (whose kernels a load registers first, by lowering a
small LU factorisation); one with other custom calls (a host callback, say) is not kept, and `call` gives `None`,
as it does for a function that raises while traced: the caller then runs its usual path, which raises its usual
errors. A file that cannot be read or written only costs the time it would save (a `CacheWarning` says when an
entry cannot be written).
"""

import contextlib
import functools
import hashlib
import json
import os
import pathlib
import platform
import re
import tempfile
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import numpy as np
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from . import _compile


_SUFFIX = ".jsmkt-compiled"
# Then the key's length (8 bytes), the key, the header's length (8 bytes), the header (JSON: the output names and
# whether the executable calls LAPACK), the serialised executable.
_MAGIC = b"jsmkt compiled function, format 3\n"
_CUSTOM_CALL = re.compile(r"custom_call @([\w.]+)")
_folder: pathlib.Path | None = None


class CacheWarning(UserWarning):
    """An entry of the compiled-function cache was not used as it is: it holds another key or is damaged (it is
    compiled again and overwritten), or it cannot be written."""


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


@functools.cache
def _machine() -> str:
    """The CPU the executables are compiled for: its architecture and, where Linux says, its model and feature
    flags (XLA compiles for the host's instruction set, so a cache folder shared between machines keeps apart
    what each compiled)."""
    text = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for field in ("model name", "flags", "Features"):
        text += sorted({ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() == field})
    return hashlib.sha256("\n".join(text).encode()).hexdigest()


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
    options = repr(sorted((_compile.options() or {}).items()))
    device = jax.devices()[0]  # an accelerator's model and its runtime's version (a GPU's driver), on a CPU "cpu"
    return "\n".join([code_digest(), *versions, jax.default_backend(), device.device_kind,
                      device.client.platform_version, _machine(), options, text]).encode()


def _file_name(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest() + _SUFFIX


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=3)


def _register_lapack() -> None:
    """Register jaxlib's LAPACK kernels, as lowering a LAPACK call does: a loaded executable that calls them and
    runs before anything in the process lowered one would jump to a kernel not registered."""
    jax.jit(jax.numpy.linalg.solve).lower(np.eye(2), np.ones(2))


def _split(data: bytes, at: int) -> tuple[bytes, int]:
    """The length-prefixed field of `data` at offset `at` (8 bytes of length, then the field), and the offset after
    it; ValueError when `data` is too short."""
    size = int.from_bytes(data[at:at + 8], "little")
    if at + 8 + size > len(data) or len(data) < at + 8:
        raise ValueError("truncated")
    return data[at + 8:at + 8 + size], at + 8 + size


def _load(path: pathlib.Path, key: bytes, n_args: int):
    """`(output names, executable)` from `path` when the file holds `key`; None when there is none, or the file
    holds another key, is truncated or is foreign (it is then compiled again and overwritten: a `CacheWarning`
    says so)."""
    try:
        data = path.read_bytes()
    except OSError:  # none, or not a file (writing it will say so)
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("foreign")
        found, at = _split(data, len(_MAGIC))
    except ValueError:
        _warn(f"the cache entry {path} is not a jsmkt compiled function; computing it again (and replacing it)")
        return None
    if found != key:
        _warn(f"the cache entry {path} holds another key than its name (the compiled function of another model "
              "or jsmkt); computing it again (and replacing it)")
        return None
    try:
        header, at = _split(data, at)
        header = json.loads(header)
        names = [str(n) for n in header["outputs"]]
        if header["lapack"]:
            _register_lapack()
        in_tree = jax.tree_util.tree_structure((tuple(range(n_args)), {}))
        out_tree = jax.tree_util.tree_structure(tuple(range(len(names))))
        return names, serialize_executable.deserialize_and_load(data[at:], in_tree, out_tree)
    except Exception:
        _warn(f"the cache entry {path} is damaged; computing it again (and replacing it)")
        return None


def _store(path: pathlib.Path, key: bytes, header: dict, executable: bytes) -> None:
    """Write `key`, `header` and the serialised executable atomically (a temporary file renamed into place), so
    that a concurrent reader sees a whole file or none. Where it cannot be written (a folder that cannot be
    written, a folder in the file's place), a `CacheWarning`, and no temporary file is left behind."""
    tmp = None
    head = json.dumps(header).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + len(key).to_bytes(8, "little") + key + len(head).to_bytes(8, "little") + head
                    + executable)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        _warn(f"cannot write the cache entry {path} ({e.strerror or e}); the result is computed without it")


def _compiled(fn: Callable[..., dict], leaves) -> tuple[list[str], jax.stages.Compiled, dict] | None:
    """`fn`'s output names, executable and file header, compiled for the arguments `leaves`; None when `fn` cannot
    be traced or its executable cannot be kept (see the module's docstring)."""
    names: list[str] = []

    def flat(*args):
        out = fn(*args)
        names[:] = list(out)
        return tuple(out[k] for k in names)

    try:
        lowered = jax.jit(flat).lower(*leaves)
    except Exception:
        return None
    targets = set(_CUSTOM_CALL.findall(lowered.as_text()))
    if any(not t.startswith("lapack_") for t in targets):
        return None
    with _without_persistent_cache():
        compiled = _compile.compile(lowered)
    return names, compiled, {"outputs": names, "lapack": bool(targets)}


@contextlib.contextmanager
def _without_persistent_cache():
    """JAX's persistent compilation cache off, and back on after: an executable it gives serialises to a copy
    whose kernels are missing (jaxlib 0.10: "NOT_FOUND: Function iota.23_kernel not found" when the copy runs),
    and one kept here need not be kept twice. (JAX decides once whether it uses the cache, at the first
    compilation: `reset_cache` has it decide again.)"""
    if not jax.config.jax_enable_compilation_cache:
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


def call(name: str, fn: Callable[..., dict], model, before_export=None) -> tuple[dict | None, str]:
    """`fn(model)`, a dict of arrays, from its compiled file in the folder of `use_folder` when there is one for
    this code, machine and model structure; otherwise compiled, kept in that folder and run. `before_export(model)`,
    if given, runs before compiling, and only then (e.g. a check that depends on the model's structure alone, which
    a loaded file has passed; its exceptions propagate).

    **Returns:** the dict (NumPy arrays) and how it was obtained: `"loaded"`, `"exported"` (compiled and kept, also
    when the file cannot be written), or `"traced"` when the model's structure has no stable key (nothing is kept);
    `(None, "off")` without a folder, and `(None, "refused")` when `fn` cannot be kept (it raises while traced, or
    calls out of XLA): the caller then runs its usual path.

    **Warns:** `CacheWarning` when the file found holds another key or is damaged, or cannot be written."""
    if _folder is None:
        return None, "off"
    dynamic, static = eqx.partition(model, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    static_leaves, static_treedef = jax.tree_util.tree_flatten(static)
    key = _key(name, (treedef, static_treedef), static_leaves, leaves)
    path = None if key is None else _folder / _file_name(key)
    loaded = None if path is None else _load(path, key, len(leaves))
    if loaded is not None:
        names, executable = loaded
        try:
            return {k: np.asarray(v) for k, v in zip(names, executable(*leaves), strict=True)}, "loaded"
        except _compile.RUNTIME_ERROR:  # e.g. a kernel missing from the file (see `_compiled`)
            _warn(f"the cache entry {path} is damaged; computing it again (and replacing it)")
    if before_export is not None:
        before_export(model)
    made = _compiled(lambda *args: fn(eqx.combine(jax.tree_util.tree_unflatten(treedef, args), static)), leaves)
    if made is None:
        return None, "refused"
    names, executable, header = made
    out = {k: np.asarray(v) for k, v in zip(names, executable(*leaves), strict=True)}
    if path is None:
        return out, "traced"
    try:
        data, _, _ = serialize_executable.serialize(executable)
    except (ValueError, NotImplementedError):  # e.g. constants that an executable cannot carry
        return out, "exported"
    _store(path, key, header, data)
    return out, "exported"
