"""Finite-N simulation of the physical supermarket system (independent of the mean-field code)."""

from .result import SimulationResult as SimulationResult
from .service import GeneralService as GeneralService
from .service import deterministic as deterministic
from .service import lognormal as lognormal
from .driver import simulate as simulate
