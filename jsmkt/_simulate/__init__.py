"""Finite-N simulation of the physical systems (stub, being written)."""


def simulate(*args, **kwargs):
    raise NotImplementedError("jsmkt.simulate is not implemented yet")
