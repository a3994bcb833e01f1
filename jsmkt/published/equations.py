"""The papers' ODEs as published, as models (`published_equations(model)`): what `jsmkt stability --as-published`
linearises and searches for fixed points, and what `experiments/convergence/` integrates.

- `JSQd`: the classic ODE of Vvedenskaya et al. (1996) and Mitzenmacher (2001) is jsmkt's own (the exact mean field
  of the stated system), so the model itself is returned;
- `JSQdPH`: Li & Lui's ODE (1)–(3), `JSQdPHAsPublished`;
- `JSQdBMAP`: the framework paper's ODE (11)–(13), `JSQdBMAPAsPublished`;
- `JSQdBatchService`: the framework's ODE (6) with Section 4's blocks, `framework_batch_service`.
"""

from .._models.batch_service import JSQdBatchService
from .._models.bmap import JSQdBMAP
from .._models.jsqd import JSQd
from .._models.jsqd_ph import JSQdPH
from ._registry import fixed_d


def _jsqd(model):
    fixed_d(model)  # the published ODE has an integer d
    return model


def _ph(model):
    from . import JSQdPHAsPublished

    return JSQdPHAsPublished(model.lam, model.service, fixed_d(model), model.K)


def _bmap(model):
    from .bmap import JSQdBMAPAsPublished

    return JSQdBMAPAsPublished(model.bmap, fixed_d(model), model.mu, model.K)


def _batch_service(model):
    from .framework import framework_batch_service

    return framework_batch_service(model.lam, model.service, model.service_batch_sizes, fixed_d(model), model.K)


_EQUATIONS = {JSQd: _jsqd, JSQdPH: _ph, JSQdBMAP: _bmap, JSQdBatchService: _batch_service}


def published_equations(model):
    """The papers' ODE for `model`'s family, as published, at `model`'s truncation `K` (module docstring): a model
    whose `vector_field` is the published right-hand side (the model itself for `JSQd`, whose published ODE is the
    exact one).

    **Raises:** `ValueError` naming the family when it has no published ODE in jsmkt, or for a randomised choice
    number (the papers have integer `d` only)."""
    build = _EQUATIONS.get(type(model))
    if build is None:
        known = ", ".join(sorted(cls.__name__ for cls in _EQUATIONS))
        raise ValueError(f"{type(model).__name__} has no published ODE in jsmkt (the families with one: {known}); "
                         "use the exact mean field")
    return build(model)
