"""jsmkt: differentiable mean-field solver and finite-N simulator for supermarket (JSQ(d)) models.

The public names are listed below, under `typing.TYPE_CHECKING`, and imported when first used (a module
`__getattr__`, PEP 562, the Scientific Python "lazy loading" pattern): `import jsmkt`, and the `jsmkt` console
script's help and spec checks, then do not wait for JAX and the libraries built on it (a second or more to import).
`import jsmkt` still switches JAX to float64 at once (`jsmkt._config.use_float64`).
"""

import ast
import importlib
import pathlib
import typing

from . import _config


if typing.TYPE_CHECKING:  # every public name; at run time each is imported on first use (`__getattr__` below)
    from ._config import use_cpu_cores as use_cpu_cores
    from ._config import use_fast_compilation as use_fast_compilation
    from . import published as published
    from ._capacity import Capacity as Capacity
    from ._capacity import max_load as max_load
    from ._capacity import min_choice as min_choice
    from ._choice import AbstractChoice as AbstractChoice
    from ._choice import FixedChoice as FixedChoice
    from ._choice import InterpolatedChoice as InterpolatedChoice
    from ._choice import MixedChoice as MixedChoice
    from ._distributions.bmap import BMAP as BMAP
    from ._design import Optimum as Optimum
    from ._design import optimise_choice as optimise_choice
    from ._design import optimise_repair as optimise_repair
    from ._fit import fit_ph as fit_ph
    from ._fit import fit_ph2_three_moments as fit_ph2_three_moments
    from ._distributions.ph import PH as PH
    from ._distributions.ph import coxian as coxian
    from ._distributions.ph import coxian2 as coxian2
    from ._distributions.ph import erlang as erlang
    from ._distributions.ph import exponential as exponential
    from ._distributions.ph import hyperexponential as hyperexponential
    from ._distributions.ph import hyperexponential2 as hyperexponential2
    from ._batched import batched as batched
    from ._fixed_point import TruncationError as TruncationError
    from ._fixed_point import solve_fixed_point as solve_fixed_point
    from ._integrate import integrate as integrate
    from ._integrate import steady_state as steady_state
    from ._metrics import mean_queue_length as mean_queue_length
    from ._metrics import mean_sojourn_time as mean_sojourn_time
    from ._metrics import mean_waiting_time as mean_waiting_time
    from ._metrics import availability as availability
    from ._metrics import customers_at_failed_servers as customers_at_failed_servers
    from ._metrics import fraction_failed_waiting as fraction_failed_waiting
    from ._metrics import mean_number_waiting as mean_number_waiting
    from ._metrics import repairmen_utilisation as repairmen_utilisation
    from ._metrics import mean_orbit_size as mean_orbit_size
    from ._metrics import mean_sojourn_time_tagged as mean_sojourn_time_tagged
    from ._metrics import orbit_size_distribution as orbit_size_distribution
    from ._metrics import phase_tails as phase_tails
    from ._metrics import prob_blocked as prob_blocked
    from ._metrics import prob_retrial_success as prob_retrial_success
    from ._metrics import prob_wait as prob_wait
    from ._metrics import probe_rate as probe_rate
    from ._metrics import queue_length_distribution as queue_length_distribution
    from ._metrics import tail_mass_at_K as tail_mass_at_K
    from ._metrics import tails as tails
    from ._metrics import throughput as throughput
    from ._metrics import utilisation as utilisation
    from ._models.base import AbstractDescribedModel as AbstractDescribedModel
    from ._models.base import AbstractSupermarketModel as AbstractSupermarketModel
    from ._models.batch import JSQdBatch as JSQdBatch
    from ._models.batch_service import JSQdBatchService as JSQdBatchService
    from ._models.bmap import JSQdBMAP as JSQdBMAP
    from ._models.classes import JSQdClasses as JSQdClasses
    from ._models.description import INELIGIBLE as INELIGIBLE
    from ._models.description import Description as Description
    from ._models.description import Dispatch as Dispatch
    from ._models.description import LocalEvent as LocalEvent
    from ._models.description import Moves as Moves
    from ._models.description import Partner as Partner
    from ._models.description import TransitionClass as TransitionClass
    from ._models.description import make_cells as make_cells
    from ._models.jsqd import JSQd as JSQd
    from ._models.jsqd_ph import JSQdPH as JSQdPH
    from ._models.repairable import RepairableJSQ as RepairableJSQ
    from ._models.retrial import RetrialJSQ as RetrialJSQ
    from ._optimise import OptimiseResult as OptimiseResult
    from ._optimise import optimise as optimise
    from ._refined import RefinedMeanField as RefinedMeanField
    from ._refined import refined_mean_field as refined_mean_field
    from ._refined import RefinedTrajectory as RefinedTrajectory
    from ._refined import refined_transient as refined_transient
    from ._sensitivity import Sensitivity as Sensitivity
    from ._sensitivity import sensitivity as sensitivity
    from ._simulate import GeneralService as GeneralService
    from ._simulate import SimulationResult as SimulationResult
    from ._simulate import deterministic as deterministic
    from ._simulate import lognormal as lognormal
    from ._simulate import simulate as simulate
    from ._sojourn import TimeDistribution as TimeDistribution
    from ._sojourn import sojourn_time_distribution as sojourn_time_distribution
    from ._sojourn import refined_sojourn_time_distribution as refined_sojourn_time_distribution
    from ._sojourn import refined_waiting_time_distribution as refined_waiting_time_distribution
    from ._sojourn import RefinedTimeDistribution as RefinedTimeDistribution
    from ._sojourn import waiting_time_distribution as waiting_time_distribution
    from ._solution import RESULTS as RESULTS
    from ._solution import FixedPoint as FixedPoint
    from ._solution import Trajectory as Trajectory
    from ._spec import SpecError as SpecError
    from ._stability import Convergence as Convergence
    from ._stability import FixedPointSearch as FixedPointSearch
    from ._stability import FoundFixedPoint as FoundFixedPoint
    from ._stability import Stability as Stability
    from ._stability import convergence as convergence
    from ._stability import find_fixed_points as find_fixed_points
    from ._stability import stability as stability
    from ._spec import dump_model_spec as dump_spec  # noqa: F401  (public under another name)
    from ._spec import load_model_spec as load_spec  # noqa: F401
    from ._spec import loads_model_spec as loads_spec  # noqa: F401
    from ._spec import register_family as register_family
    from ._sweep import SweepInterrupted as SweepInterrupted
    from ._sweep import sweep as sweep


def _public_names() -> dict[str, tuple[str, str | None]]:
    """`name -> (module, attribute)` for every import under `if typing.TYPE_CHECKING:` above (attribute `None`: the
    name is a submodule), read from this file so that those lines are the one list of public names."""
    tree = ast.parse(pathlib.Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING")
    out: dict[str, tuple[str, str | None]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.unparse(node)
        for alias in node.names:
            if node.module is None:  # `from . import published as published`
                out[alias.asname or alias.name] = ("." + alias.name, None)
            else:
                out[alias.asname or alias.name] = ("." + node.module, alias.name)
    return out


_PUBLIC = _public_names()
__all__ = sorted(_PUBLIC, key=str.lower)
_config.use_float64()


def __getattr__(name: str):
    if name == "__version__":  # on first use too: reading the installed distribution's metadata takes a while
        from ._version import __version__

        globals()[name] = __version__
        return __version__
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = importlib.import_module(module, __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    _config.use_float64()  # JAX is imported now: float64 in its config (and JAX_ENABLE_X64 as it was)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"__version__"})
