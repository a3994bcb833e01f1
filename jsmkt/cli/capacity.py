"""`jsmkt capacity`."""


def add_parser(sub, common) -> None:
    """Add the `capacity` command to the subparsers `sub` (`common`: the options every command takes)."""
