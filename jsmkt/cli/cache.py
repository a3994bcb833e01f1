"""The compilation cache of the console script: JAX's persistent compilation cache and the exported solves
(`jsmkt._exported`) in one folder (`_cache_dir`), turned on before JAX's first computation
(`_use_compilation_cache`)."""

import os
import sys


CACHE_ENV = "JSMKT_CACHE_DIR"
_CACHE_OFF = "off"
# Every compilation is cached: a cached kernel loads far quicker than the CLI's kernels compile.
_CACHE_MIN_COMPILE_SECONDS = 0.0


def _cache_dir(args) -> str | None:
    """jsmkt's cache folder for this run, `None` when the cache is off: `--no-cache` turns it off; else
    `--cache-dir DIR`, else `$JSMKT_CACHE_DIR` (`off` turns it off), else the user's cache folder,
    `$XDG_CACHE_HOME/jsmkt` or `~/.cache/jsmkt`. JAX's persistent compilation cache is its subfolder `jax`."""
    if args.no_cache:
        return None
    path = args.cache_dir if args.cache_dir is not None else os.environ.get(CACHE_ENV)
    if path is not None and path.strip().lower() == _CACHE_OFF:
        return None
    if not path:
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(root, "jsmkt")
    return os.path.expanduser(path)


def _use_compilation_cache(args) -> None:
    """Turn on JAX's persistent compilation cache in `_cache_dir(args)` (the library never does: only the CLI, whose
    every run is a new process), and keep exported functions (`jsmkt._exported`: traced and lowered once) in its
    subfolder `exported`. A folder that cannot be written gives a warning, and the run goes on without the cache.
    Without a jsmkt option or variable, a cache that JAX was told to use (`JAX_COMPILATION_CACHE_DIR`) is left as
    it is."""
    import jax

    from .. import _exported

    path = _cache_dir(args)
    if path is None:
        return
    explicit = args.cache_dir is not None or os.environ.get(CACHE_ENV)
    own_jax_cache = explicit or not jax.config.jax_compilation_cache_dir
    folders = [os.path.join(path, "exported")] + ([os.path.join(path, "jax")] if own_jax_cache else [])
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
        except OSError as e:
            print(f"jsmkt: warning: cannot use the compilation cache in {folder} ({e.strerror or e}); running without "
                  f"it (pass --cache-dir DIR, or --no-cache)", file=sys.stderr)
            return
    _exported.use_folder(folders[0])
    if not own_jax_cache:
        return
    jax.config.update("jax_compilation_cache_dir", folders[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _CACHE_MIN_COMPILE_SECONDS)


