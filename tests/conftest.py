import os
import pathlib
import subprocess
import sys

import pytest


# XLA flags that make CPU compilation faster: the elemental IR emitters instead of the fusion emitters and one LLVM
# module per kernel instead of several compiled on threads (the kernels run about as fast), and optimisation level
# 0 (they run about twice as slowly). A new model shape's solve then compiles in about a quarter of the CPU time
# (`benchmarks/compile_flags.py`). The slow suite, whose simulations run long, leaves the optimisation level alone.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                      "--xla_cpu_parallel_codegen_split_count=1")
RUNTIME_FLAGS = ("--xla_backend_optimization_level",)  # left out for `-m slow`


def _accepted(flags: list[str]) -> bool:
    """Whether this jaxlib's XLA knows `flags`: XLA aborts a process on an unknown flag, so a small JAX program
    runs with them in a subprocess first."""
    env = {**os.environ, "XLA_FLAGS": " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip(),
           "JAX_PLATFORMS": "cpu"}
    try:
        run = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(2).block_until_ready()"],
                             env=env, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


def pytest_configure(config):
    """Compilation dominates the suite, so the tests compile for speed of compilation: `FAST_COMPILE_FLAGS`, each
    only where this jaxlib knows it, checked once in the first pytest process (before JAX starts its backend;
    xdist's workers inherit the environment). Flags the caller put in `XLA_FLAGS` win;
    `JSMKT_TEST_XLA_OPT=default` keeps XLA's own settings."""
    if os.environ.get("JSMKT_TEST_XLA_OPT", "0") == "default" or os.environ.get("JSMKT_TEST_XLA_CHECKED"):
        return
    current = os.environ.get("XLA_FLAGS", "")
    slow = (config.getoption("markexpr", "") or "").strip() == "slow"
    flags = [f for f in FAST_COMPILE_FLAGS if f.split("=")[0] not in current
             and not (slow and f.split("=")[0] in RUNTIME_FLAGS)]
    if flags and not _accepted(flags):
        flags = [f for f in flags if _accepted([f])]
    os.environ["JSMKT_TEST_XLA_CALLER_FLAGS"] = current  # for `default_xla` tests
    os.environ["XLA_FLAGS"] = " ".join([current, *flags]).strip()
    os.environ["JSMKT_TEST_XLA_CHECKED"] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `default_xla` checks what XLA's default code generation makes of a program (a performance
    guard), which the fast-compile flags change: where they are on, it runs in a pytest subprocess without them."""
    if pyfuncitem.get_closest_marker("default_xla") is None or "JSMKT_TEST_XLA_CALLER_FLAGS" not in os.environ \
            or os.environ["XLA_FLAGS"] == os.environ["JSMKT_TEST_XLA_CALLER_FLAGS"]:
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("JSMKT_TEST_XLA_CALLER_FLAGS", "PYTEST_XDIST_WORKER")}
    env.update(XLA_FLAGS=os.environ["JSMKT_TEST_XLA_CALLER_FLAGS"], JSMKT_TEST_XLA_CHECKED="1",
               JSMKT_TEST_JAX_CACHE="off")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "",
                          pyfuncitem.nodeid], env=env, capture_output=True, text=True,
                         cwd=str(pyfuncitem.config.rootpath))
    if run.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid}, run with XLA's default flags in a subprocess, failed:\n"
                    f"{run.stdout[-4000:]}{run.stderr[-2000:]}", pytrace=False)
    return True


def _test_compiler_settings():
    """JAX's persistent compilation cache, so that a function compiled again after `jax.clear_caches` (below), or
    by the slow suite after the default one, is read back instead. Each pytest-xdist worker has a cache of its own
    (no two processes write one entry). `JSMKT_TEST_JAX_CACHE` moves the caches (`off`: none)."""
    root = os.environ.get("JSMKT_TEST_JAX_CACHE", str(pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax"))
    if root.lower() in ("off", "0", "none", ""):
        return None
    return pathlib.Path(root) / os.environ.get("PYTEST_XDIST_WORKER", "main")


_CACHE = _test_compiler_settings()

import jax  # noqa: E402
import jax.random as jr  # noqa: E402

import jsmkt  # noqa: E402, F401  (enables float64)
from jsmkt import _maps  # noqa: E402


# The CLI's own compilation cache stays off in the tests (they call `jsmkt.cli.main` in this process, where it would
# move JAX's cache to the user's folder for every later test); tests of the cache run the console script in a
# subprocess.
os.environ["JSMKT_CACHE_DIR"] = "off"


jax.config.update("jax_enable_x64", True)
# Strict promotion, as in the JAX libraries we build on: silent int/float or rank promotion hides bugs.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
if _CACHE is not None:
    jax.config.update("jax_compilation_cache_dir", str(_CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture
def getkey():
    counter = iter(range(10**9))

    def _getkey():
        return jr.PRNGKey(next(counter) + 12345)

    return _getkey


@pytest.fixture(autouse=True)
def _bounded_compilation_caches():
    """Drop JAX's compiled executables after a test when the process holds more than a third of its memory-map
    limit. XLA's CPU backend maps every compiled kernel into memory separately (three maps each);
    holding all of the suite's executables took a process to about 64,300 memory maps, just under Linux's
    default limit of 65,530 (`vm.max_map_count`), past which the next compilation crashes the process
    (`jsmkt._maps`). Below a third of the limit the executables are kept, so that the next tests reuse them; a
    module that compiles many shapes (`test_families.py`) is cleared between its tests before it nears the limit.
    Where the maps cannot be counted (not Linux), there is no such limit to keep under."""
    yield
    usage = _maps.map_usage()
    if usage is not None and 3 * usage[0] > usage[1]:
        jax.clear_caches()


_CPU_LOG = os.environ.get("JSMKT_TEST_CPU_LOG")  # a file: each test's CPU seconds (user + system, this process's
# threads, setup to teardown), one `seconds<TAB>test id` line per test; what the suite's budget is measured in


if _CPU_LOG:
    import resource

    def _cpu_seconds() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = _cpu_seconds()
        yield
        with open(_CPU_LOG, "a", encoding="utf-8") as f:
            f.write(f"{_cpu_seconds() - start:.2f}\t{item.nodeid}\n")
