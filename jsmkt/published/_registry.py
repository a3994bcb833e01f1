"""The as-published variants of the families, by family class: `as_published(model)` gives the papers' fixed point
(and the numbers that come with it) of any model whose family registered one with `register_as_published`.

The modules of `jsmkt.published` register jsmkt's own variants when the package is imported (`JSQd`: the classic
closed form; `JSQdPH`: Li & Lui's; `JSQdBMAP`: the framework paper's Section 3; `JSQdBatchService`: its Section 4
in the framework's fixed-point system). A family written outside jsmkt may register its own.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._choice import FixedChoice


class AsPublished(NamedTuple):
    """A model's fixed point and metrics as a paper publishes them, at the model's truncation level `K`.

    - `source`: the equations and closed forms used, in words;
    - `tail`: $s_0..s_K$ (NumPy); `mean_queue_length` is their sum from $k = 1$;
    - `mean_sojourn_time`: the paper's $E[T]$ (by Little's law where the paper gives none);
    - `phase_tails`: the per-phase tails $\\pi_1..\\pi_K$, shape `(K, m)`, for families with phases; else None;
    - `residuals`: the max-norm residual of the closed form in the published and in the exact mean-field
      equations (`{"published": r, "exact": r}`), where the paper's fixed point is a closed form; else None;
    - `published_equations`: where the closed form solves neither system, the fixed point of the published
      equations themselves (`mean_queue_length`, `tail`); else None;
    - `note`: what to keep in mind when reading the numbers, or None."""

    source: str
    tail: Any
    mean_sojourn_time: float
    phase_tails: Any = None
    residuals: dict[str, float] | None = None
    published_equations: dict[str, Any] | None = None
    note: str | None = None

    @property
    def mean_queue_length(self) -> float:
        """$E[Q] = \\sum_{k \\ge 1} s_k$."""
        import numpy as np

        return float(np.sum(self.tail[1:]))


_VARIANTS: dict[type, Callable[[Any], AsPublished]] = {}


def register_as_published(cls: type, variant: Callable[[Any], AsPublished]) -> None:
    """Make `variant(model) -> AsPublished` the as-published form of the models of class `cls` (exactly that class,
    not its subclasses: a subclass is another family)."""
    if not isinstance(cls, type):
        raise TypeError(f"cls={cls!r} must be a model class")
    _VARIANTS[cls] = variant


def has_as_published(cls: type) -> bool:
    """Whether the family `cls` has a registered as-published form."""
    return cls in _VARIANTS


def as_published(model) -> AsPublished:
    """The papers' fixed point of `model` at its truncation level `K`, by the variant its family registered
    (`register_as_published`). Variants need an integer choice number `d` (the papers have no randomised one).

    **Raises:** `ValueError` naming the family when it has no as-published form, or for parameters the published
    formulas do not cover."""
    variant = _VARIANTS.get(type(model))
    if variant is None:
        known = ", ".join(sorted(cls.__name__ for cls in _VARIANTS))
        raise ValueError(f"{type(model).__name__} has no as-published form in jsmkt (the families with one: {known}); "
                         "use the exact mean field (jsmkt.solve_fixed_point)")
    return variant(model)


def fixed_d(model) -> int:
    """The integer choice number of `model`'s `FixedChoice` (the published formulas have no randomised d)."""
    choice = model.choice
    if not isinstance(choice, FixedChoice):
        raise ValueError(f"{type(model).__name__}: the published formulas need an integer choice number d (a "
                         "FixedChoice); this model's d is randomised")
    return integer_d(choice.d)


def integer_d(d) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d={d!r}: the published formulas need an integer choice number d >= 1")
    return int(d)
