"""`jsmkt sweep`."""


def add_parser(sub, common) -> None:
    """Add the `sweep` command to the subparsers `sub` (`common`: the options every command takes)."""
