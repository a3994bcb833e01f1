"""`jsmkt plot`."""


def add_parser(sub, common) -> None:
    """Add the `plot` command to the subparsers `sub` (`common`: the options every command takes)."""
