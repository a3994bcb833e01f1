"""`python -m jsmkt.cli`: the console script."""

from . import run


run()
