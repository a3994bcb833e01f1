"""`jsmkt plot`: a sweep's dataset (`jsmkt sweep --out`, a .zarr store or a .nc file) drawn with
`jsmkt.plotting.plot_sweep` (lines) or `plot_sweep_heatmap` (`--heatmap`), written to an image file."""

import argparse
import os
import re
import warnings

from .plots import _check_plot_path, _save_figure
from .spec import SpecError


_PLOT_DESCRIPTION = (
    "Plot a sweep written by jsmkt sweep --out (a .zarr store or a .nc file). Lines: --y (a metric such as "
    "mean_sojourn_time, a percentile such as sojourn_time_p99 (or p99) or waiting_time_p99, or a derivative such as "
    "mean_sojourn_time_grad_lam, named as the columns of jsmkt sweep's table) against the grid axis --x, one line "
    "per value of the grid axis --hue. Heatmap: --heatmap NAME colours the cells of the grid axes --x and --y by NAME. Every other grid axis of more than one "
    "value is fixed with --sel NAME=VALUE. Failed points are gaps."
)


def _sel_option(text: str) -> tuple[str, str]:
    """`--sel NAME=VALUE` (argparse's type): a grid axis and one of its values."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE with NAME a grid axis (e.g. d=2 or "
                                         "service.scv=4)")
    return name.strip(), value.strip()


def _open(path: str):
    """The dataset of a sweep written to `path` (.zarr or .nc)."""
    import xarray as xr

    ext = os.path.splitext(path.rstrip("/" + os.sep))[1].lower()
    if ext not in (".zarr", ".nc"):
        raise SpecError(f"{path}: give a sweep written by jsmkt sweep --out as .zarr or .nc (a .parquet or .csv "
                        "table is for pandas)")
    if not os.path.exists(path):
        raise SpecError(f"{path} does not exist")
    try:
        with warnings.catch_warnings():  # zarr's and xarray's notes on the store's format: nothing a user can act on
            warnings.simplefilter("ignore")
            if ext == ".zarr":
                return xr.open_zarr(path).load()
            return xr.open_dataset(path, engine="h5netcdf").load()
    except ImportError as e:  # h5netcdf, or h5py under it
        raise SpecError(f"{path}: reading netCDF needs h5netcdf and h5py ({e}): pip install 'jsmkt[export]'") \
            from None
    except Exception as e:  # not a store or file of that kind, or not readable
        raise SpecError(f"{path}: cannot read the sweep ({type(e).__name__}: {str(e).strip().splitlines()[0]})") \
            from None


def _default_axes(ds, count: int, taken: list[str | None], sel: dict[str, str]) -> list[str]:
    """The first `count` grid axes of more than one value that are not plotted otherwise or fixed."""
    grid = ds["result"].dims if "result" in ds.data_vars else ()
    return [d for d in grid if ds.sizes[d] > 1 and d not in taken and d not in sel][:count]


def _cmd_plot(args) -> int:
    from ..plotting import _draw_sweep_heatmap, _draw_sweep_lines, _sweep_select

    sel: dict[str, str] = {}
    for name, value in args.sel or []:
        if name in sel:
            raise SpecError(f"--sel {name} is given twice; fix each axis once")
        sel[name] = value
    if args.heatmap is not None and args.hue is not None:
        raise SpecError("--hue draws lines; a --heatmap colours cells of --x and --y: give one of them")
    if args.heatmap is None and args.y is None:
        raise SpecError("give --y NAME, what to plot (e.g. --y mean_sojourn_time), or --heatmap NAME")
    what = args.heatmap if args.heatmap is not None else args.y
    name = re.sub(r"[^\w.-]+", "_", what)  # a file name of letters, digits, _ . and -
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.data.rstrip("/" + os.sep))),
                                   f"{_stem(args.data)}-{name.strip('_')}.png")
    _check_plot_path(out, "--out")
    ds = _open(args.data)
    fix, hue = "--sel {name}={value}", "--hue {name}"
    try:
        if args.heatmap is None:
            x = args.x or next(iter(_default_axes(ds, 1, [args.hue], sel)), None)
            if x is None:
                raise SpecError("give --x NAME, the grid axis on the horizontal axis")
            axes = (x,) if args.hue is None else (x, args.hue)
            da, label, title = _sweep_select(ds, args.y, axes, sel, fix=fix, hue=hue)
            draw = lambda fig: _draw_sweep_lines(fig.subplots(), ds, da, x, args.hue, label, title,  # noqa: E731
                                                 args.log)
        else:
            x, y = args.x, args.y
            free = iter(_default_axes(ds, 2, [x, y], sel))
            x, y = x or next(free, None), y or next(free, None)
            if x is None or y is None:
                raise SpecError("--heatmap needs two grid axes of more than one value: give --x and --y")
            da, label, title = _sweep_select(ds, args.heatmap, (y, x), sel, fix=fix, hue="", arg="z")
            draw = lambda fig: _draw_sweep_heatmap(fig.subplots(), ds, da, x, y, label, title,  # noqa: E731
                                                   args.log)
    except ValueError as e:  # in the options' names
        option = "--heatmap" if args.heatmap is not None else "--y"
        raise SpecError(re.sub(r"^[yz]=", f"{option} ", str(e))) from None
    _save_figure(draw, out, figsize=(6.4, 4.6), option="--out")
    return 0


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/" + os.sep)))[0]


def add_parser(sub, common) -> None:
    """Add the `plot` command to the subparsers `sub` (`common`: the options every command takes; `plot` reads a
    dataset, not a spec, and takes none of them)."""
    p = sub.add_parser("plot", help="plot a sweep's dataset (jsmkt sweep --out, .zarr or .nc): lines or a heatmap",
                       description=_PLOT_DESCRIPTION)
    p.add_argument("data", help="the sweep: a .zarr store or a .nc file written by jsmkt sweep --out")
    p.add_argument("--y", metavar="NAME",
                   help="lines: what is plotted (mean_sojourn_time, prob_wait, K, sojourn_time_p99 or p99, "
                        "waiting_time_p99.9, mean_sojourn_time_grad_lam, ...); with --heatmap: the grid axis on the "
                        "vertical axis")
    p.add_argument("--x", metavar="AXIS",
                   help="the grid axis on the horizontal axis (default: the first grid axis of more than one value "
                        "that is not otherwise used)")
    p.add_argument("--hue", metavar="AXIS", help="draw one line per value of this grid axis (e.g. d)")
    p.add_argument("--heatmap", metavar="NAME",
                   help="instead of lines, colour the cells of the grid axes --x and --y by NAME (named as --y names "
                        "a line's values), with a colour bar")
    p.add_argument("--sel", metavar="NAME=VALUE", action="append", type=_sel_option, default=[],
                   help="fix the grid axis NAME at VALUE (one of its values, to 1e-9 relative); needed for every "
                        "grid axis of more than one value that is not plotted; may be given several times")
    p.add_argument("--log", action="store_true",
                   help="a logarithmic scale for the values (the y axis of lines, the colours of a heatmap)")
    p.add_argument("--out", metavar="FILE",
                   help="the image file (png, pdf, svg; default: beside the data, named after it and what is "
                        "plotted, e.g. sweep-mean_sojourn_time.png)")
    p.set_defaults(func=_cmd_plot, family=[])
