"""Capacity planning: the largest load, the smallest choice number that meet bounds on metrics."""
