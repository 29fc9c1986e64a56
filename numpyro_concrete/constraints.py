"""Supports of the Concrete family and of its zero-temperature limits.

Float samples round: a float32 Concrete sample sums to 1 only up to a few ulps, and a BinConcrete
sample can be exactly 0 or 1. The checks below accept what a correct float computation produces
(tolerances from the dtype) and reject everything else; NumPyro's ``simplex`` (tolerance 1e-6)
rejects float32 Concrete samples with many categories.
"""

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from numpyro.distributions import constraints

__all__ = ["log_simplex", "simplex", "unit_interval", "real", "one_hot", "log_one_hot", "plus_minus_infinity"]


def simplex_tolerance(value):
    """How far a correctly computed point of the simplex of ``value``'s dtype may be from it:
    |Σ x - 1| and |logsumexp y| stay within a few ulps, growing with log K through the summation."""
    num_categories = max(jnp.shape(value)[-1], 2)
    return 16 * float(jnp.finfo(jnp.result_type(value)).eps) * (1 + math.log2(num_categories))


@jax.jit
def _in_log_simplex(value):
    tol = simplex_tolerance(value)
    return (value <= tol).all(-1) & (jnp.abs(logsumexp(value, axis=-1)) <= tol)


@jax.jit
def _in_simplex(value):
    tol = simplex_tolerance(value)
    return (value >= 0).all(-1) & (jnp.abs(value.sum(-1) - 1) <= tol)


class _LogSimplex(constraints._SingletonConstraint):
    """log Δ^{K-1} = {y in [-inf, 0]^K : logsumexp_k y_k = 0} (paper appendix F)."""

    event_dim = 1

    def __call__(self, value):
        return _in_log_simplex(value)

    def feasible_like(self, prototype):
        return jnp.full_like(prototype, -math.log(jnp.shape(prototype)[-1]))

    def __repr__(self):
        return "LogSimplex()"


class _KeepsValues:
    """No ``feasible_like``, on purpose: NumPyro's MaskedDistribution (``.mask()``,
    ``handlers.mask``) would swap masked entries for it with ``jnp.where``, a new array that no
    longer carries the log coordinates of the unmasked entries; without it, the value is scored as
    it is and the masked entries are discarded."""

    def feasible_like(self, prototype):
        raise NotImplementedError


class _Simplex(_KeepsValues, constraints._Simplex):
    """The probability simplex, with a float tolerance from the value's dtype."""

    def __call__(self, value):
        return _in_simplex(value)


class _UnitInterval(_KeepsValues, constraints._UnitInterval):
    """The open unit interval (0, 1), the support of BinConcrete.

    The check admits the endpoints: a float BinConcrete sample rounds to exactly 0 or 1 at low
    temperature, and the density has a limit (possibly ±inf) there.
    """

    def __repr__(self):
        return "UnitInterval()"


class _Real(constraints._Real):
    """The real line, the support of LogitBinConcrete; the check admits the limits ±inf (as torch's
    ``real`` does), where the zero-temperature limit puts its values."""

    def __call__(self, value):
        return value == value


class _OneHot(constraints._SingletonConstraint):
    """One-hot vectors."""

    is_discrete = True
    event_dim = 1

    def __call__(self, value):
        return ((value == 0) | (value == 1)).all(-1) & (value.sum(-1) == 1)

    def feasible_like(self, prototype):
        return jnp.zeros_like(prototype).at[..., 0].set(1)


class _LogOneHot(constraints._SingletonConstraint):
    """The log of a one-hot vector: one entry 0, the others -inf."""

    is_discrete = True
    event_dim = 1

    def __call__(self, value):
        is_zero = value == 0
        return (is_zero | jnp.isneginf(value)).all(-1) & (is_zero.sum(-1) == 1)

    def feasible_like(self, prototype):
        return jnp.full_like(prototype, -jnp.inf).at[..., 0].set(0)

    def __repr__(self):
        return "LogOneHot()"


class _PlusMinusInfinity(constraints._SingletonConstraint):
    """{-inf, +inf}: the logit of a Bernoulli value."""

    is_discrete = True

    def __call__(self, value):
        return jnp.isinf(value)

    def feasible_like(self, prototype):
        return jnp.full_like(prototype, -jnp.inf)

    def __repr__(self):
        return "PlusMinusInfinity()"


log_simplex = _LogSimplex()
simplex = _Simplex()
unit_interval = _UnitInterval()
real = _Real()
one_hot = _OneHot()
log_one_hot = _LogOneHot()
plus_minus_infinity = _PlusMinusInfinity()
