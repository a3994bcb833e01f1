"""Plot helpers shared by the commands: `--plot FILE` checked before solving (`_check_plot_path`), a figure drawn
and written with Matplotlib's warnings as one line each (`_save_figure`), and titles broken to fit (`_fit_title`).
Matplotlib is imported only when a plot is asked for."""

import logging
import os
import sys
import warnings

from .spec import SpecError


def _plot_types(types: dict[str, str]) -> dict[str, str]:
    """Matplotlib's file types less those it cannot write here: .pgf needs a LaTeX engine (xelatex by default)."""
    import shutil

    return {t: v for t, v in types.items() if t != "pgf" or shutil.which("xelatex")}


def _check_plot_path(path: str, option: str = "--plot") -> None:
    """Refuse a --plot FILE (or the `option` that names the file) that cannot be written, before solving."""
    from matplotlib.figure import Figure

    types = _plot_types(Figure().canvas.get_supported_filetypes())
    ext = os.path.splitext(path)[1][1:].lower()
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise SpecError(f"{option}={path} is a directory; give a file name, e.g. "
                        f"{option}={os.path.join(path, 'tails.png')}")
    if ext not in types:
        what = f": file type .{ext} is not supported" if ext else " has no file extension"
        raise SpecError(f"{option}={path}{what}; end the name with one of {', '.join('.' + t for t in sorted(types))}")
    if not os.path.isdir(folder):
        raise SpecError(f"{option}={path}: directory {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"{option}={path}: directory {folder} is not writable")




def _fit_title(title: str, inches: float) -> str:
    """`title` with each of its lines broken to fit `inches` at font size 9 (about 13 characters an inch), so that
    a long model description is not cut off at the figure's edges: between its `name = value` items (separated by
    three spaces), and within an item at spaces only where the item alone is too long."""
    import textwrap

    width = int(13 * inches)
    out = []
    for line in title.split("\n"):
        row = ""
        for item in line.split("   "):
            if row and len(row) + 3 + len(item) > width:
                out.append(row)
                row = ""
            row = f"{row}   {item}" if row else item
            if len(row) > width:
                *full, row = textwrap.wrap(row, width, break_on_hyphens=False, break_long_words=False)
                out.extend(full)
        out.append(row)
    return "\n".join(out)




def _save_figure(draw, path: str, figsize: tuple[float, float], json_output: bool = False,
                 option: str = "--plot") -> None:
    """A figure drawn by `draw(fig)`, written to `path` (given by `option`); says `wrote PATH` on stdout (on
    stderr with `json_output`, whose stdout is the JSON alone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    try:
        draw(fig)
        fig.tight_layout()
        # Matplotlib's warnings and log messages (e.g. "The PostScript backend does not support transparency") are
        # printed as one line each, in the CLI's format.
        log, records = logging.getLogger("matplotlib"), []
        handler = logging.Handler(logging.WARNING)
        handler.emit = records.append
        log.addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fig.savefig(path)
        except OSError as e:
            raise SpecError(f"{option}={path}: cannot write the plot ({e.strerror or e})") from None
        finally:
            log.removeHandler(handler)
    finally:
        plt.close(fig)
    for text in [str(w.message) for w in caught] + [r.getMessage() for r in records]:
        print(f"jsmkt: warning: {option}={path}: {text.strip().splitlines()[0]}", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr if json_output else sys.stdout)


