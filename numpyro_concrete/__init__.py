"""The Concrete distribution family for NumPyro, computed in log space.

Maddison, Mnih & Teh, "The Concrete Distribution: A Continuous Relaxation of Discrete Random
Variables", ICLR 2017.
"""

from . import constraints, transforms  # noqa: F401  (registers biject_to)
from .constraints import log_simplex
from .discrete import Bernoulli, ExpOneHotCategorical, LogitBernoulli, OneHotCategorical
from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .handlers import discrete, relax
from .infer import ImportanceWeightedELBO, discrete_log_likelihood, map_assignment, marginal_log_likelihood
from .reparam import LogSpaceReparam, log_space_config

__all__ = [
    "Concrete",
    "ExpConcrete",
    "BinConcrete",
    "LogitBinConcrete",
    "OneHotCategorical",
    "ExpOneHotCategorical",
    "Bernoulli",
    "LogitBernoulli",
    "log_simplex",
    "discrete",
    "relax",
    "LogSpaceReparam",
    "log_space_config",
    "marginal_log_likelihood",
    "discrete_log_likelihood",
    "map_assignment",
    "ImportanceWeightedELBO",
]
