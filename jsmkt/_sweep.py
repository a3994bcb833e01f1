"""Sweeps over grids of a family's named parameters."""
