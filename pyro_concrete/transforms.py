"""Bijections from unconstrained space onto the Concrete supports, registered with ``biject_to``
and ``transform_to`` so that Pyro's autoguides (AutoNormal, AutoDelta, AutoMultivariateNormal, ...)
work on every site of the four distributions.

All three go through log space: the simplex and unit-interval values they produce carry their
exact log coordinates (see ``_carry``), so the model scores an autoguide's value exactly even where
it underflows.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import biject_to, constraints, transform_to
from torch.distributions.transforms import Transform

from concrete_common import messages
from concrete_common.kinds import Kind

from . import constraints as concrete_constraints
from ._carry import carry, show
from ._numerics import log, log_softmax, logit, softplus

__all__ = ["LogSimplexTransform", "SimplexTransform", "UnitIntervalTransform", "RealTransform"]


def _log_softmax_padded(u):
    return log_softmax(F.pad(u, (0, 1)))


def _interior(x, ones=False):
    """``x`` with the coordinates that rounded to 0 (and, ``ones``, to 1) moved to the nearest
    representable interior point, so that the inverse of a plain value on the boundary (no carried
    coordinates: a float32 sample whose coordinate underflowed, passed on as a tensor) is the finite
    preimage of that point, as torch's ``StickBreakingTransform`` and ``SigmoidTransform`` clamp
    theirs -- not -inf, +inf or NaN (``init_to_median`` took the median of such rows: NaN)."""
    inside = x.masked_fill(x == 0, torch.finfo(x.dtype).tiny)
    return inside.masked_fill(x == 1, torch.nextafter(x.new_ones(()), x.new_zeros(()))) if ones else inside

def _finite_logit(y):
    """Logits with the limits ±inf (LogitBinConcrete's zero-temperature values) at the logit of the
    interior point :func:`_interior` moves BinConcrete's 0 and 1 to: the inverse of ``logit x`` is
    the inverse of ``x``."""
    low, high = logit(_interior(torch.tensor([0.0, 1.0], dtype=y.dtype, device=y.device), ones=True))
    return torch.where(y == float("inf"), high, torch.where(y == -float("inf"), low, y))


def _interior_log(y):
    """Log coordinates with those at -inf (a coordinate that is 0: the boundary) at log(tiny), as
    :func:`_interior` moves a Concrete value's zeros: the inverse of ``log x`` is the inverse of ``x``."""
    return y.masked_fill(y == -float("inf"), math.log(torch.finfo(y.dtype).tiny))



class _VectorTransform(Transform):
    """Shape bookkeeping for maps R^(K-1) -> K coordinates."""

    domain = constraints.real_vector
    bijective = True

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def forward_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:-1] + (shape[-1] + 1,)

    def inverse_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:-1] + (shape[-1] - 1,)


class LogSimplexTransform(_VectorTransform):
    r"""u in R^(K-1) -> y = log_softmax([u, 0]) in log Δ^(K-1); inverse y -> y_{1:K-1} - y_K.

    Its log-Jacobian is 0: ExpConcrete's density κ is taken with respect to the image of Lebesgue
    measure under this map (the measure under which the log-ratios y_k - y_K are Lebesgue).
    """

    codomain = concrete_constraints.log_simplex

    def _call(self, u):
        return _log_softmax_padded(u)

    def _inverse(self, y):
        y = _interior_log(y)
        return y[..., :-1] - y[..., -1:]

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return x.new_zeros(x.shape[:-1])


class SimplexTransform(_VectorTransform):
    r"""u in R^(K-1) -> x = softmax([u, 0]) on the simplex, computed as exp(log_softmax) and carrying
    its log. log|det J| = Σ_k log x_k with respect to Lebesgue measure on x_1..x_{K-1}."""

    codomain = concrete_constraints.simplex

    def _call(self, u):
        y = _log_softmax_padded(u)
        return show(y, Kind.LOG)

    def _inverse(self, x):
        y = carry.recall(x, (Kind.LOG,))
        if y is None:
            y = log(_interior(x))
        return y[..., :-1] - y[..., -1:]

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        """x: the unconstrained u, y: its point of the simplex (the host's names)."""
        coordinates = carry.recall(y, (Kind.LOG,))
        if coordinates is None:
            coordinates = _log_softmax_padded(x)
        return coordinates.sum(-1)


class UnitIntervalTransform(Transform):
    r"""u in R -> x = sigmoid(u) in (0, 1), carrying its logit u.
    log|det J| = log x + log(1 - x) = -softplus(-u) - softplus(u)."""

    domain = constraints.real
    codomain = concrete_constraints.unit_interval
    bijective = True
    sign = +1

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def _call(self, u):
        return show(u, Kind.LOGIT)

    def _inverse(self, x):
        y = carry.recall(x, (Kind.LOGIT,))
        return logit(_interior(x, ones=True)) if y is None else y

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -softplus(-x) - softplus(x)


class RealTransform(Transform):
    r"""u in R -> u, LogitBinConcrete's own coordinates (log|det J| = 0), whose inverse maps the
    limits ±inf (what ``map_assignment`` returns, an ``init_to_value``) to the finite logit of
    BinConcrete's nearest interior point: the host's identity would pass them on, and an autoguide
    initialized there had a NaN loss."""

    domain = constraints.real
    codomain = concrete_constraints.real
    bijective = True
    sign = +1

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def _call(self, u):
        return u

    def _inverse(self, y):
        return _finite_logit(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.zeros_like(x)


def _no_bijection_onto_gate(constraint):
    raise messages.no_bijection_onto_gate()


for _registry in (biject_to, transform_to):
    _registry.register(concrete_constraints.gate, _no_bijection_onto_gate)
    _registry.register(concrete_constraints.log_simplex, lambda constraint: LogSimplexTransform())
    _registry.register(concrete_constraints.simplex, lambda constraint: SimplexTransform())
    _registry.register(concrete_constraints.unit_interval, lambda constraint: UnitIntervalTransform())
    _registry.register(concrete_constraints.real, lambda constraint: RealTransform())
    # the parameter constraints (a learnable parameter declared with one of them): the host's bijection
    # onto the host's constraint they narrow, whose values meet them up to rounding
    _registry.register(concrete_constraints.positive_finite, lambda constraint, r=_registry: r(constraints.positive))
    _registry.register(concrete_constraints.resolvable_real, lambda constraint, r=_registry: r(constraints.real))
    _registry.register(concrete_constraints.resolvable_real_vector, lambda constraint, r=_registry: r(constraints.real_vector))
    _registry.register(concrete_constraints.positive_simplex, lambda constraint: SimplexTransform())
    _registry.register(concrete_constraints.open_unit_interval, lambda constraint: UnitIntervalTransform())
    _registry.register(
        concrete_constraints.finite_less_than, lambda constraint, r=_registry: r(constraints.less_than(constraint.upper_bound))
    )
    _registry.register(
        concrete_constraints.finite_greater_than,
        lambda constraint, r=_registry: r(constraints.greater_than(constraint.lower_bound)),
    )
