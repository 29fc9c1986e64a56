"""Bijections from unconstrained space onto the Concrete supports, registered with ``biject_to``
so that NumPyro's autoguides (AutoNormal, AutoDelta, AutoMultivariateNormal, ...) work on every
site of the four distributions.

All three go through log space: the simplex and unit-interval values they produce carry their
exact log coordinates (see ``_carry``), so the model scores an autoguide's value exactly even where
it underflows.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax import Array
from numpyro.distributions import constraints
from numpyro.distributions.transforms import IdentityTransform, ParameterFreeTransform, biject_to

from concrete_common import messages
from concrete_common.kinds import Kind

from . import constraints as concrete_constraints
from ._carry import carry
from ._numerics import log, logit

__all__ = ["LogSimplexTransform", "SimplexTransform", "UnitIntervalTransform", "RealTransform"]


def _log_softmax_padded(u):
    return jax.nn.log_softmax(jnp.pad(u, [(0, 0)] * (jnp.ndim(u) - 1) + [(0, 1)]), axis=-1)


def _interior(x, ones=False):
    """``x`` with the coordinates that rounded to 0 (and, ``ones``, to 1) moved to the nearest
    representable interior point, so that the inverse of a plain value on the boundary (no carried
    coordinates: a float32 sample whose coordinate underflowed, passed on as an array) is the finite
    preimage of that point, as the host's ``StickBreakingTransform`` and ``SigmoidTransform`` clamp
    theirs -- not -inf, +inf or NaN (``init_to_median`` took the median of such rows: NaN)."""
    x = jnp.asarray(x)
    inside = jnp.where(x == 0, jnp.finfo(x.dtype).tiny, x)
    return jnp.where(x == 1, jnp.nextafter(jnp.ones((), x.dtype), 0), inside) if ones else inside

def _finite_logit(y):
    """Logits with the limits ±inf (LogitBinConcrete's zero-temperature values) at the logit of the
    interior point :func:`_interior` moves BinConcrete's 0 and 1 to: the inverse of ``logit x`` is
    the inverse of ``x``."""
    y = jnp.asarray(y)
    low, high = logit(_interior(jnp.array([0.0, 1.0], y.dtype), ones=True))
    return jnp.where(y == jnp.inf, high, jnp.where(y == -jnp.inf, low, y))


def _interior_log(y):
    """Log coordinates with those at -inf (a coordinate that is 0: the boundary) at log(tiny), as
    :func:`_interior` moves a Concrete value's zeros: the inverse of ``log x`` is the inverse of ``x``."""
    y = jnp.asarray(y)
    return jnp.where(y == -jnp.inf, jnp.log(jnp.finfo(y.dtype).tiny), y)



class _VectorTransform(ParameterFreeTransform):
    """Shape bookkeeping for maps R^(K-1) -> K coordinates."""

    domain = constraints.real_vector

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

    def __call__(self, u: Array) -> Array:
        return _log_softmax_padded(u)

    def _inverse(self, y):
        y = _interior_log(y)
        return y[..., :-1] - y[..., -1:]

    def log_abs_det_jacobian(self, x: Array, y: Array, intermediates: Optional[Any] = None) -> Array:
        return jnp.zeros(jnp.shape(x)[:-1], dtype=jnp.result_type(x))


class SimplexTransform(_VectorTransform):
    r"""u in R^(K-1) -> x = softmax([u, 0]) on the simplex, computed as exp(log_softmax) and carrying
    its log. log|det J| = Σ_k log x_k with respect to Lebesgue measure on x_1..x_{K-1}."""

    codomain = concrete_constraints.simplex

    def __call__(self, u: Array) -> Array:
        y = _log_softmax_padded(u)
        return carry.attach(jnp.exp(y), y, Kind.LOG)

    def _inverse(self, x):
        y = carry.recall(x, (Kind.LOG,))
        if y is None:
            y = log(_interior(x))
        return y[..., :-1] - y[..., -1:]

    def log_abs_det_jacobian(self, x: Array, y: Array, intermediates: Optional[Any] = None) -> Array:
        """x: the unconstrained u, y: its point of the simplex (the host's names). Where y carries
        nothing (eagerly) the density scores y as rounded: the Jacobian is taken there too, so that
        both halves of the potential describe one point (from u, they disagreed by up to a nat)."""
        coordinates = carry.recall(y, (Kind.LOG,))
        if coordinates is None:
            coordinates = log(y)
        return coordinates.sum(-1)


class UnitIntervalTransform(ParameterFreeTransform):
    r"""u in R -> x = sigmoid(u) in (0, 1), carrying its logit u.
    log|det J| = log x + log(1 - x) = -softplus(-u) - softplus(u)."""

    codomain = concrete_constraints.unit_interval
    sign = 1

    def __call__(self, u: Array) -> Array:
        return carry.attach(jax.nn.sigmoid(u), u, Kind.LOGIT)

    def _inverse(self, x):
        y = carry.recall(x, (Kind.LOGIT,))
        return logit(_interior(x, ones=True)) if y is None else y

    def log_abs_det_jacobian(self, x: Array, y: Array, intermediates: Optional[Any] = None) -> Array:
        # where y carries nothing (eagerly) the density scores y as rounded (1 - y within a few ulps
        # of 1 can be off by a factor of 2): the Jacobian at that point too, not at u (up to a nat apart)
        if carry.recall(y, (Kind.LOGIT,)) is None:
            return log(y) + log(1 - y)
        return -jax.nn.softplus(-x) - jax.nn.softplus(x)


class RealTransform(IdentityTransform):
    r"""u in R -> u, LogitBinConcrete's own coordinates (log|det J| = 0), whose inverse maps the
    limits ±inf (what ``map_assignment`` returns, an ``init_to_value``) to the finite logit of
    BinConcrete's nearest interior point: the host's identity would pass them on, and an autoguide
    initialized there could not find valid initial parameters."""

    codomain = concrete_constraints.real

    def _inverse(self, y):
        return _finite_logit(y)


def _no_bijection_onto_gate(constraint):
    raise messages.no_bijection_onto_gate()


biject_to.register(concrete_constraints.gate, _no_bijection_onto_gate)
biject_to.register(concrete_constraints.log_simplex, lambda constraint: LogSimplexTransform())
biject_to.register(concrete_constraints.simplex, lambda constraint: SimplexTransform())
biject_to.register(concrete_constraints.unit_interval, lambda constraint: UnitIntervalTransform())
biject_to.register(concrete_constraints.real, lambda constraint: RealTransform())
# the parameter constraints (a learnable parameter declared with one of them): the host's bijection
# onto the host's constraint they narrow, whose values meet them up to rounding
biject_to.register(type(concrete_constraints.positive_finite), lambda constraint: biject_to(constraints.positive))
biject_to.register(type(concrete_constraints.resolvable_real), lambda constraint: IdentityTransform())
biject_to.register(type(concrete_constraints.resolvable_real_vector), lambda constraint: biject_to(constraints.real_vector))
biject_to.register(type(concrete_constraints.positive_simplex), lambda constraint: SimplexTransform())
biject_to.register(type(concrete_constraints.open_unit_interval), lambda constraint: UnitIntervalTransform())
biject_to.register(
    concrete_constraints.finite_less_than, lambda constraint: biject_to(constraints.less_than(constraint.upper_bound))
)
biject_to.register(
    concrete_constraints.finite_greater_than, lambda constraint: biject_to(constraints.greater_than(constraint.lower_bound))
)
