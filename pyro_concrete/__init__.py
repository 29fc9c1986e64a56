"""The Concrete distribution family for Pyro, computed in log space.

Maddison, Mnih & Teh, "The Concrete Distribution: A Continuous Relaxation of Discrete Random
Variables", ICLR 2017.
"""

from concrete_common._version import __version__  # noqa: F401  (concrete-ppl's; not in __all__)

# constraints and transforms register biject_to / transform_to; limits holds the zero-temperature
# limits (limits.OneHotCategorical, limits.Bernoulli, ...), not exported here: they would shadow the host's
from . import constraints, limits, transforms  # noqa: F401
from .constraints import log_simplex
from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .estimators import REBAR, RELAX, DisARM, GumbelRao
from .evaluation import Predictive, discrete_log_likelihood, map_assignment, marginal_log_likelihood, sample_assignment
from .handlers import discrete, relax
from .hard_concrete import HardConcrete
from .losses import VIMCO, ImportanceWeightedELBO, JitImportanceWeightedELBO, JitVIMCO, L0Objective, ScoreFunctionELBO
from .reparam import LogSpaceReparam, log_space_config
from .straight_through import BinConcreteStraightThrough, ConcreteStraightThrough
from .temperature import constant, exponential_decay, linear_decay

__all__ = [
    "Concrete",
    "ExpConcrete",
    "BinConcrete",
    "LogitBinConcrete",
    "ConcreteStraightThrough",
    "BinConcreteStraightThrough",
    "HardConcrete",
    "log_simplex",
    "discrete",
    "relax",
    "LogSpaceReparam",
    "log_space_config",
    "marginal_log_likelihood",
    "discrete_log_likelihood",
    "map_assignment",
    "sample_assignment",
    "Predictive",
    "ImportanceWeightedELBO",
    "VIMCO",
    "ScoreFunctionELBO",
    "L0Objective",
    "REBAR",
    "RELAX",
    "GumbelRao",
    "DisARM",
    "JitImportanceWeightedELBO",
    "JitVIMCO",
    "exponential_decay",
    "linear_decay",
    "constant",
]
