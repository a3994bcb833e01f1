"""jsmkt's version: the installed distribution's, or, from a source tree that is not installed (the repository on
`PYTHONPATH`), the one in its `pyproject.toml`."""

import importlib.metadata
import pathlib
import tomllib


def _version() -> str:
    try:
        return importlib.metadata.version("jsmkt")
    except importlib.metadata.PackageNotFoundError:
        pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file():
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        return "unknown"


__version__ = _version()
