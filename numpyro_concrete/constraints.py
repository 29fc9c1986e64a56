"""Supports of the Concrete family and of its zero-temperature limits, and the constraints on its
parameters (``arg_constraints``), which validation checks.

Float samples round: a float32 Concrete sample sums to 1 only up to a few ulps, and a BinConcrete
sample can be exactly 0 or 1. The checks below accept what a correct float computation produces
(tolerances from the dtype) and reject everything else; NumPyro's ``simplex`` (tolerance 1e-6)
rejects float32 Concrete samples with many categories.

The parameter constraints say exactly what validation accepts (``_checks`` decides with them and
only adds the reason to the error): a positive finite temperature, logits the dtype resolves,
probabilities strictly positive (n-ary: summing to 1 within the simplex tolerance; binary: strictly
inside (0, 1)), Hard Concrete's finite stretch ends. One condition ties two parameters and is
checked beside them: ``|logits| / temperature`` at most ``concrete_common.floats.logits_bounds``' second
bound (the sample's coordinates must stay finite). Like NumPyro's own constraints they check NumPy
inputs with NumPy and JAX arrays with JAX.
"""

import math
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp
from jax.typing import ArrayLike, DTypeLike
from numpyro.distributions import constraints

from concrete_common import floats

__all__ = [
    "log_simplex", "simplex", "unit_interval", "real", "one_hot", "log_one_hot", "plus_minus_infinity",
    "positive_finite", "resolvable_real", "resolvable_real_vector", "positive_simplex", "open_unit_interval",
    "finite_less_than", "finite_greater_than", "gate",
]


Values = Union[jax.Array, np.ndarray]  # what a constraint checks: JAX or NumPy arrays


def simplex_tolerance(value: Values) -> float:
    """How far a correctly computed point of the simplex of ``value``'s dtype may be from it."""
    return floats.simplex_tolerance(float(jnp.finfo(jnp.result_type(value)).eps), jnp.shape(value)[-1])


def _namespace(x: Values) -> Any:
    """NumPy for NumPy inputs and numbers, JAX for JAX arrays (NumPyro's own constraints' rule)."""
    return jnp if isinstance(x, jax.Array) else np


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

    def __call__(self, value: Values) -> Values:
        return _in_log_simplex(value)

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.full_like(prototype, -math.log(jnp.shape(prototype)[-1]))

    def __repr__(self) -> str:
        return "LogSimplex()"


class _KeepsValues:
    """No ``feasible_like``, on purpose: NumPyro's MaskedDistribution (``.mask()``,
    ``handlers.mask``) would swap masked entries for it with ``jnp.where``, a new array that no
    longer carries the log coordinates of the unmasked entries; without it, the value is scored as
    it is and the masked entries are discarded."""

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        raise NotImplementedError


class _Simplex(_KeepsValues, constraints._Simplex):
    """The probability simplex, with a float tolerance from the value's dtype."""

    def __call__(self, value: Values) -> Values:
        return _in_simplex(value)


class _UnitInterval(_KeepsValues, constraints._UnitInterval):
    """The open unit interval (0, 1), the support of BinConcrete.

    The check admits the endpoints: a float BinConcrete sample rounds to exactly 0 or 1 at low
    temperature, and the density has a limit (possibly ±inf) there.
    """

    def __repr__(self) -> str:
        return "UnitInterval()"


class _Real(constraints._Real):
    """The real line, the support of LogitBinConcrete; the check admits the limits ±inf (as torch's
    ``real`` does), where the zero-temperature limit puts its values."""

    def __call__(self, value: Values) -> Values:
        return value == value


class _OneHot(constraints._SingletonConstraint):
    """One-hot vectors."""

    is_discrete = True
    event_dim = 1

    def __call__(self, value: Values) -> Values:
        return ((value == 0) | (value == 1)).all(-1) & (value.sum(-1) == 1)

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.zeros_like(prototype).at[..., 0].set(1)


class _LogOneHot(constraints._SingletonConstraint):
    """The log of a one-hot vector: one entry 0, the others -inf."""

    is_discrete = True
    event_dim = 1

    def __call__(self, value: Values) -> Values:
        is_zero = value == 0
        return (is_zero | jnp.isneginf(value)).all(-1) & (is_zero.sum(-1) == 1)

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.full_like(prototype, -jnp.inf).at[..., 0].set(0)

    def __repr__(self) -> str:
        return "LogOneHot()"


class _PlusMinusInfinity(constraints._SingletonConstraint):
    """{-inf, +inf}: the logit of a Bernoulli value."""

    is_discrete = True

    def __call__(self, value: Values) -> Values:
        return jnp.isinf(value)

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.full_like(prototype, -jnp.inf)

    def __repr__(self) -> str:
        return "PlusMinusInfinity()"


# ----------------------------------------------------------------------------- parameters


class _PositiveFinite(constraints._Positive):
    """(0, inf), a temperature: positive and finite (NumPyro's ``positive`` admits +inf)."""

    def __call__(self, x: Values) -> Values:
        xp = _namespace(x)
        return (x > 0) & xp.isfinite(x)

    def __repr__(self) -> str:
        return "PositiveFinite()"


class _ResolvableReal(constraints._SingletonConstraint):
    """Logits the dtype resolves against the sampler's noise: finite, with ``|x|`` at most the first of
    ``concrete_common.floats.logits_bounds`` (16384 in float32, 8.8e12 in float64)."""

    event_dim = 0

    @staticmethod
    def bound(dtype: DTypeLike) -> float:
        info = jnp.finfo(dtype)
        return floats.logits_bounds(float(info.eps), float(info.max))[0]

    def __call__(self, x: Values) -> Values:
        xp = _namespace(x)
        ok = xp.abs(x) <= self.bound(xp.result_type(x))  # False for NaN and infinities
        return ok.all(-1) if self.event_dim else ok

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.zeros_like(prototype)

    def __repr__(self) -> str:
        return "ResolvableReal()"


class _ResolvableRealVector(_ResolvableReal):
    """Vectors of logits, each entry resolvable (:class:`_ResolvableReal`)."""

    event_dim = 1

    def __repr__(self) -> str:
        return "ResolvableRealVector()"


class _PositiveSimplex(constraints._Simplex):
    """Probabilities of a categorical: positive entries summing to 1 within the simplex tolerance
    (one may round to 1 beside positive ones: a float vector of finite logits)."""

    def __call__(self, x: Values) -> Values:
        xp = _namespace(x)
        return (x > 0).all(-1) & (xp.abs(x.sum(-1) - 1) <= simplex_tolerance(x))

    def __repr__(self) -> str:
        return "PositiveSimplex()"


class _OpenUnitInterval(constraints._SingletonConstraint):
    """(0, 1), endpoints excluded: a binary probability (0 and 1 are infinite logits)."""

    def __call__(self, x: Values) -> Values:
        return (x > 0) & (x < 1)

    def feasible_like(self, prototype: ArrayLike) -> ArrayLike:
        return jnp.full_like(prototype, 0.5)

    def __repr__(self) -> str:
        return "OpenUnitInterval()"


class _FiniteLessThan(constraints._LessThan):
    """(-inf, upper_bound), finite: Hard Concrete's lower stretch end."""

    def __call__(self, x: Values) -> Values:
        return (x < self.upper_bound) & _namespace(x).isfinite(x)


class _FiniteGreaterThan(constraints._GreaterThan):
    """(lower_bound, inf), finite: Hard Concrete's upper stretch end."""

    def __call__(self, x: Values) -> Values:
        return (x > self.lower_bound) & _namespace(x).isfinite(x)


class _Gate(constraints._UnitInterval):
    """[0, 1] with point masses at 0 and 1, the support of Hard Concrete: a mixed measure, which
    no bijection from the real line reaches (``biject_to`` raises), so that HMC, NUTS and the
    autoguides, which would see only the density inside and drop the masses, refuse it."""

    def __repr__(self) -> str:
        return "Gate()"

    # not the unit interval (whose equality, inherited, compares the ends): a support compared with
    # ``==`` must not take the gate for it
    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


log_simplex = _LogSimplex()
simplex = _Simplex()
unit_interval = _UnitInterval()
real = _Real()
one_hot = _OneHot()
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
