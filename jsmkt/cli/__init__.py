"""`jsmkt` console script: a thin shell over the public API.

```
jsmkt solve SPEC.toml [--format table|json] [--plot FILE] [--as-published] [--auto-K] [--servers N]
            [--percentiles 50,90,99,99.9]
jsmkt transient SPEC.toml --time T [--points N] [--format table|json] [--plot FILE] [--auto-K] [--solver S]
                [--max-steps N] [--progress]
jsmkt simulate SPEC.toml --servers N --time T [--warmup W] [--replications R] [--seed S] [--format table|json]
               [--max-queue Q] [--cpu-devices K] [--progress] [--percentiles 50,90,99,99.9]
jsmkt sensitivity SPEC.toml [--wrt lam,theta] [--metric NAME] [--format table|json] [--plot FILE]
jsmkt sweep SPEC.toml --grid NAME=VALUES ... [--metric NAME] [--grad NAMES] [--percentiles P,...] [--out PATH]
            [--scheduler ADDRESS] [--chunk-size N] [--cpu-devices K] [--progress] [--format table|json]
jsmkt stability SPEC.toml [--starts N] [--seed S] [--as-published] [--auto-K] [--format table|json]
jsmkt plot SWEEP.zarr --y NAME [--x AXIS] [--hue AXIS] [--heatmap NAME] [--sel NAME=VALUE] [--log] [--out FILE]
```
The package has one module per command (`solve`, `transient`, `simulate`, `sensitivity`, `sweep`, `plot`, `stability`, each with
its `_cmd_NAME`), the parser (`parser`), the one solve path that chooses K (`solving`), the spec and its overrides
(`spec`), the grid options (`grid`), printed output (`output`), plots (`plots`), the compilation cache (`cache`) and
`main`/`run` (`app`). No module here names
a model family: what the commands need of one comes from the spec registry (`jsmkt._spec`), the model's
attributes, and `jsmkt.published.as_published`.
`--percentiles` also takes the percentiles separated by spaces (`--percentiles 50 90 99 SPEC.toml`: the first token
that is not a number ends the list). Printed numbers: the mean field's probabilities clipped at 0 (the solver's
rounding noise, far below the leading tails, has either sign); simulated estimates to the precision of their 95 %
interval (two significant digits of the half-width); derivatives as 0 below a relative threshold
(`_ZERO_DERIVATIVE`, stated by `jsmkt sensitivity --help`).
Every command that reads a spec (all but `plot`) also takes `--cache-dir DIR` and `--no-cache` (JAX's persistent
compilation cache, `_cache_dir`),
`--family FILE`: a Python file that registers a family written outside jsmkt (`jsmkt.register_family`), imported
before the spec is read, and `--set KEY=VALUE` (repeatable): the spec's value at the TOML path KEY replaced.
Bad specifications give one error line on stderr and exit code 2; an interrupt (Ctrl-C) gives the line
`jsmkt: interrupted` and exit code 130 (128 + SIGINT), as shells report it (`jsmkt sweep` first finishes the chunk
in flight and says how to resume: `jsmkt: interrupted: ...`).

JAX (about a second to import) is imported only once the spec and the options are checked (`_spec.parse_spec` reads
a spec without it), so that `--help` and those errors answer at once: the modules of this package import JAX, NumPy
and Matplotlib inside functions only. JAX's compilation cache then spares later runs of the same model structure the
compilations. The console script is `run`: `main`, then an exit without the
interpreter's teardown, which after importing JAX takes about half a second and only frees memory.
"""

from .app import main, run
from .cache import CACHE_ENV, _cache_dir, _use_compilation_cache
from .output import _describe, _print_table, _trim, _with_interval
from .parser import _join_percentiles, _percentile_list, build_parser
from .plots import _check_plot_path, _fit_title, _save_figure
from .sensitivity import _cmd_sensitivity, _shown_derivative
from .simulate import _cmd_simulate
from .solve import _cmd_solve
from .solving import _exact_outputs, solve as _solve
from .spec import _apply_overrides, _read_spec
from .transient import _cmd_transient


__all__ = ["build_parser", "main", "run"]
