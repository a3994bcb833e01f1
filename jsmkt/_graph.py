"""Reachability in small directed graphs given as boolean adjacency matrices (NumPy, at set-up time)."""

import numpy as np


def reachable(adjacency: np.ndarray, start: int = 0) -> np.ndarray:
    """The nodes reachable from `start` (itself included) along the edges `adjacency[i, j]` (`i -> j`), by
    breadth-first search over whole frontiers."""
    adjacency = np.asarray(adjacency, dtype=bool)
    seen = np.zeros(adjacency.shape[0], bool)
    seen[start] = True
    frontier = seen.copy()
    while frontier.any():
        new = adjacency[frontier].any(axis=0) & ~seen
        seen |= new
        frontier = new
    return seen
