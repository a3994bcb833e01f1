"""`main(argv)`: the command line parsed and its command run, with the CLI's errors as one line on stderr and an
exit code; `run`: the console script."""

import os
import sys

from .parser import _join_percentiles, build_parser
from .spec import SpecError, load_family_file


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_percentiles(sys.argv[1:] if argv is None else list(argv)))
    try:
        for path in args.family:  # before the spec is read: it may name the families these files register
            load_family_file(path)
        code = args.func(args)
        sys.stdout.flush()  # a write error surfaces here, not at exit
        return code
    except (SpecError, ValueError) as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: error: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        msg = str(e).strip().splitlines()
        print(f"jsmkt: failed: {msg[0] if msg else type(e).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, and the shell's code for SIGINT (128 + 2)
        print(("\n" if sys.stderr.isatty() else "") + "jsmkt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the output cannot be written (e.g. a full disk)
        print(f"jsmkt: failed: cannot write the output ({e.strerror or e})", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1


def run() -> None:
    """The console script (and `python -m jsmkt.cli`): `main`, then exit without the interpreter's teardown.
    Once JAX is imported, that teardown (freeing its many objects and modules one by one) takes about half a
    second, and it frees only memory: every output is flushed here and every file the commands write is closed
    by then, and the exit handlers still run."""
    import atexit

    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a reader that closed the pipe: nothing more can be written
        pass
    atexit._run_exitfuncs()  # JAX's: wait for pending effects, release the backends
    os._exit(code)
