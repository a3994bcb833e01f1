"""jsmkt: differentiable mean-field solver and finite-N simulator for supermarket (JSQ(d)) models."""

from . import _config  # noqa: F401  (float64 everywhere)
from ._config import use_cpu_cores as use_cpu_cores
from . import published as published
from ._choice import AbstractChoice as AbstractChoice
from ._choice import FixedChoice as FixedChoice
from ._choice import InterpolatedChoice as InterpolatedChoice
from ._choice import MixedChoice as MixedChoice
from ._design import Optimum as Optimum
from ._design import optimise_choice as optimise_choice
from ._design import optimise_repair as optimise_repair
from ._distributions.fit import fit_ph as fit_ph
from ._distributions.fit import fit_ph2_three_moments as fit_ph2_three_moments
from ._distributions.ph import PH as PH
from ._distributions.ph import coxian as coxian
from ._distributions.ph import coxian2 as coxian2
from ._distributions.ph import erlang as erlang
from ._distributions.ph import exponential as exponential
from ._distributions.ph import hyperexponential as hyperexponential
from ._distributions.ph import hyperexponential2 as hyperexponential2
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
from ._sensitivity import Sensitivity as Sensitivity
from ._sensitivity import sensitivity as sensitivity
from ._refined import refined_mean_field as refined_mean_field
from ._simulate import GeneralService as GeneralService
from ._simulate import SimulationResult as SimulationResult
from ._simulate import deterministic as deterministic
from ._simulate import lognormal as lognormal
from ._simulate import simulate as simulate
from ._solution import RESULTS as RESULTS
from ._solution import FixedPoint as FixedPoint
from ._solution import Trajectory as Trajectory
from ._version import __version__ as __version__


__all__ = [
    "AbstractChoice",
    "AbstractDescribedModel",
    "AbstractSupermarketModel",
    "availability",
    "coxian",
    "coxian2",
    "customers_at_failed_servers",
    "deterministic",
    "Description",
    "Dispatch",
    "erlang",
    "exponential",
    "fit_ph",
    "fit_ph2_three_moments",
    "fraction_failed_waiting",
    "FixedChoice",
    "FixedPoint",
    "GeneralService",
    "hyperexponential",
    "hyperexponential2",
    "INELIGIBLE",
    "integrate",
    "InterpolatedChoice",
    "JSQd",
    "JSQdBatch",
    "JSQdBatchService",
    "JSQdClasses",
    "JSQdPH",
    "LocalEvent",
    "lognormal",
    "make_cells",
    "mean_queue_length",
    "mean_number_waiting",
    "mean_orbit_size",
    "mean_sojourn_time",
    "mean_sojourn_time_tagged",
    "mean_waiting_time",
    "MixedChoice",
    "optimise",
    "optimise_choice",
    "optimise_repair",
    "Optimum",
    "OptimiseResult",
    "orbit_size_distribution",
    "Moves",
    "Partner",
    "PH",
    "phase_tails",
    "prob_blocked",
    "prob_wait",
    "probe_rate",
    "prob_retrial_success",
    "published",
    "queue_length_distribution",
    "refined_mean_field",
    "repairmen_utilisation",
    "RefinedMeanField",
    "RepairableJSQ",
    "RESULTS",
    "RetrialJSQ",
    "sensitivity",
    "Sensitivity",
    "simulate",
    "SimulationResult",
    "solve_fixed_point",
    "steady_state",
    "tail_mass_at_K",
    "tails",
    "throughput",
    "Trajectory",
    "TransitionClass",
    "TruncationError",
    "use_cpu_cores",
    "utilisation",
]
