"""Supports of the Concrete family and of its zero-temperature limits.

Float samples round: a float32 Concrete sample sums to 1 only up to a few ulps, and a BinConcrete
sample can be exactly 0 or 1. The checks below accept what a correct float computation produces
(tolerances from the dtype) and reject everything else; torch's ``simplex`` (tolerance 1e-6)
rejects float32 Concrete samples with many categories.
"""

import math

import torch
from torch.distributions import constraints

__all__ = ["log_simplex", "simplex", "unit_interval", "real", "one_hot", "log_one_hot", "plus_minus_infinity"]


def simplex_tolerance(value):
    """How far a correctly computed point of the simplex of ``value``'s dtype may be from it:
    |Σ x - 1| and |logsumexp y| stay within a few ulps, growing with log K through the summation."""
    num_categories = max(value.shape[-1], 2)
    return 16 * torch.finfo(value.dtype).eps * (1 + math.log2(num_categories))


class _LogSimplex(constraints.Constraint):
    """log Δ^{K-1} = {y in [-inf, 0]^K : logsumexp_k y_k = 0} (paper appendix F)."""

    event_dim = 1

    def check(self, value):
        tol = simplex_tolerance(value)
        return (value <= tol).all(-1) & (value.logsumexp(-1).abs() <= tol)

    def __repr__(self):
        return "LogSimplex()"


class _Simplex(constraints._Simplex):
    """The probability simplex, with a float tolerance from the value's dtype."""

    def check(self, value):
        tol = simplex_tolerance(value)
        return (value >= 0).all(-1) & ((value.sum(-1) - 1).abs() <= tol)


class _UnitInterval(constraints._Interval):
    """The open unit interval (0, 1), the support of BinConcrete.

    The check admits the endpoints: a float BinConcrete sample rounds to exactly 0 or 1 at low
    temperature, and the density has a limit (possibly ±inf) there.
    """

    def __init__(self):
        super().__init__(0.0, 1.0)

    def __repr__(self):
        return "UnitInterval()"


class _LogOneHot(constraints.Constraint):
    """The log of a one-hot vector: one entry 0, the others -inf."""

    is_discrete = True
    event_dim = 1

    def check(self, value):
        is_zero = value == 0
        return (is_zero | torch.isneginf(value)).all(-1) & (is_zero.sum(-1) == 1)

    def __repr__(self):
        return "LogOneHot()"


class _PlusMinusInfinity(constraints.Constraint):
    """{-inf, +inf}: the logit of a Bernoulli value."""

    is_discrete = True

    def check(self, value):
        return torch.isinf(value)

    def __repr__(self):
        return "PlusMinusInfinity()"


log_simplex = _LogSimplex()
simplex = _Simplex()
unit_interval = _UnitInterval()
real = constraints.real  # torch's check admits the limits ±inf of LogitBinConcrete
one_hot = constraints.one_hot
log_one_hot = _LogOneHot()
plus_minus_infinity = _PlusMinusInfinity()
