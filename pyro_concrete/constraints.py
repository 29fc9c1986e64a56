"""Supports of the Concrete family and of its zero-temperature limits, and the constraints on its
parameters (``arg_constraints``), which validation checks.

Float samples round: a float32 Concrete sample sums to 1 only up to a few ulps, and a BinConcrete
sample can be exactly 0 or 1. The checks below accept what a correct float computation produces
(tolerances from the dtype) and reject everything else; torch's ``simplex`` (tolerance 1e-6)
rejects float32 Concrete samples with many categories.

The parameter constraints say exactly what validation accepts (``_checks`` decides with them and
only adds the reason to the error): a positive finite temperature, logits the dtype resolves,
probabilities strictly positive (n-ary: summing to 1 within the simplex tolerance; binary: strictly
inside (0, 1)), Hard Concrete's finite stretch ends. One condition ties two parameters and is
checked beside them: ``|logits| / temperature`` at most ``concrete_common.floats.logits_bounds``' second
bound (the sample's coordinates must stay finite).
"""

import torch
from torch import Tensor
from torch.distributions import constraints

from concrete_common import floats

__all__ = [
    "log_simplex", "simplex", "unit_interval", "real", "one_hot", "log_one_hot", "plus_minus_infinity",
    "positive_finite", "resolvable_real", "resolvable_real_vector", "positive_simplex", "open_unit_interval",
    "finite_less_than", "finite_greater_than", "gate",
]


def simplex_tolerance(value: Tensor) -> float:
    """How far a correctly computed point of the simplex of ``value``'s dtype may be from it."""
    return floats.simplex_tolerance(torch.finfo(value.dtype).eps, value.shape[-1])


class _LogSimplex(constraints.Constraint):
    """log Δ^{K-1} = {y in [-inf, 0]^K : logsumexp_k y_k = 0} (paper appendix F)."""

    event_dim = 1

    def check(self, value: Tensor) -> Tensor:
        tol = simplex_tolerance(value)
        return (value <= tol).all(-1) & (value.logsumexp(-1).abs() <= tol)

    def __repr__(self) -> str:
        return "LogSimplex()"


class _Simplex(constraints._Simplex):
    """The probability simplex, with a float tolerance from the value's dtype."""

    def check(self, value: Tensor) -> Tensor:
        tol = simplex_tolerance(value)
        return (value >= 0).all(-1) & ((value.sum(-1) - 1).abs() <= tol)


class _UnitInterval(constraints._Interval):
    """The open unit interval (0, 1), the support of BinConcrete.

    The check admits the endpoints: a float BinConcrete sample rounds to exactly 0 or 1 at low
    temperature, and the density has a limit (possibly ±inf) there.
    """

    def __init__(self) -> None:
        super().__init__(0.0, 1.0)

    def __repr__(self) -> str:
        return "UnitInterval()"


class _LogOneHot(constraints.Constraint):
    """The log of a one-hot vector: one entry 0, the others -inf."""

    is_discrete = True
    event_dim = 1

    def check(self, value: Tensor) -> Tensor:
        is_zero = value == 0
        return (is_zero | torch.isneginf(value)).all(-1) & (is_zero.sum(-1) == 1)

    def __repr__(self) -> str:
        return "LogOneHot()"


class _PlusMinusInfinity(constraints.Constraint):
    """{-inf, +inf}: the logit of a Bernoulli value."""

    is_discrete = True

    def check(self, value: Tensor) -> Tensor:
        return torch.isinf(value)

    def __repr__(self) -> str:
        return "PlusMinusInfinity()"


# ----------------------------------------------------------------------------- parameters


class _PositiveFinite(constraints._GreaterThan):
    """(0, inf), a temperature: positive and finite (torch's ``positive`` admits +inf)."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def check(self, value: Tensor) -> Tensor:
        return (value > 0) & torch.isfinite(value)

    def __repr__(self) -> str:
        return "PositiveFinite()"


class _ResolvableReal(constraints.Constraint):
    """Logits the dtype resolves against the sampler's noise: finite, with ``|x|`` at most the first of
    ``concrete_common.floats.logits_bounds`` (16384 in float32, 8.8e12 in float64)."""

    is_discrete = False
    event_dim = 0

    @staticmethod
    def bound(dtype: torch.dtype) -> float:
        info = torch.finfo(dtype)
        return floats.logits_bounds(info.eps, info.max)[0]

    @staticmethod
    def largest(value: Tensor) -> float:
        """max |x| by one reduction: NaN if an entry is NaN, +inf if one is infinite."""
        return torch.stack(torch.aminmax(value.detach())).abs().max().item() if value.numel() else 0.0

    def check(self, value: Tensor) -> Tensor:
        ok = value.abs() <= self.bound(value.dtype)  # False for NaN and infinities
        return ok.all(-1) if self.event_dim else ok

    def __repr__(self) -> str:
        return "ResolvableReal()"


class _ResolvableRealVector(_ResolvableReal):
    """Vectors of logits, each entry resolvable (:class:`_ResolvableReal`)."""

    event_dim = 1

    def __repr__(self) -> str:
        return "ResolvableRealVector()"


class _PositiveSimplex(_Simplex):
    """Probabilities of a categorical: positive entries summing to 1 within the simplex tolerance
    (one may round to 1 beside positive ones: a float vector of finite logits)."""

    def check(self, value: Tensor) -> Tensor:
        return (value > 0).all(-1) & ((value.sum(-1) - 1).abs() <= simplex_tolerance(value))

    def __repr__(self) -> str:
        return "PositiveSimplex()"


class _OpenUnitInterval(constraints._Interval):
    """(0, 1), endpoints excluded: a binary probability (0 and 1 are infinite logits)."""

    def __init__(self) -> None:
        super().__init__(0.0, 1.0)

    def check(self, value: Tensor) -> Tensor:
        return (value > 0) & (value < 1)

    def __repr__(self) -> str:
        return "OpenUnitInterval()"


class _FiniteLessThan(constraints._LessThan):
    """(-inf, upper_bound), finite: Hard Concrete's lower stretch end."""

    def check(self, value: Tensor) -> Tensor:
        return (value < self.upper_bound) & torch.isfinite(value)


class _Real(constraints._Real):
    """The real line, the support of LogitBinConcrete; the check admits the limits ±inf (as torch's
    ``real`` does), where the zero-temperature limit puts its values. A constraint of its own so
    that its bijection (``transforms.RealTransform``) can give those limits a finite preimage."""

    def __repr__(self) -> str:
        return "Real()"


class _FiniteGreaterThan(constraints._GreaterThan):
    """(lower_bound, inf), finite: Hard Concrete's upper stretch end."""

    def check(self, value: Tensor) -> Tensor:
        return (value > self.lower_bound) & torch.isfinite(value)


class _Gate(constraints._Interval):
    """[0, 1] with point masses at 0 and 1, the support of Hard Concrete: a mixed measure, which
    no bijection from the real line reaches (``biject_to`` raises), so that HMC, NUTS and the
    autoguides, which would see only the density inside and drop the masses, refuse it."""

    def __init__(self) -> None:
        super().__init__(0.0, 1.0)

    def __repr__(self) -> str:
        return "Gate()"


log_simplex = _LogSimplex()
simplex = _Simplex()
unit_interval = _UnitInterval()
real = _Real()
one_hot = constraints.one_hot
log_one_hot = _LogOneHot()
plus_minus_infinity = _PlusMinusInfinity()
positive_finite = _PositiveFinite()
resolvable_real = _ResolvableReal()
resolvable_real_vector = _ResolvableRealVector()
positive_simplex = _PositiveSimplex()
open_unit_interval = _OpenUnitInterval()
gate = _Gate()
finite_less_than = _FiniteLessThan
finite_greater_than = _FiniteGreaterThan
