"""Zero-temperature limits of the Concrete family, each on the sample space of its relaxation.

=====================  ==========================  ====================================
relaxed                discrete (``.discrete()``)  values
=====================  ==========================  ====================================
Concrete               OneHotCategorical           one-hot vectors
ExpConcrete            ExpOneHotCategorical        log of a one-hot: entries 0 and -inf
BinConcrete            Bernoulli                   0 or 1
LogitBinConcrete       LogitBernoulli              -inf or +inf (the logit of 0 or 1)
=====================  ==========================  ====================================

All have a ``mode`` taken from the logits (argmax, first index on ties; ``logits > 0``), which is
never NaN. NumPyro has no OneHotCategorical; this module provides one. Values are floats of the
logits' dtype, as the relaxed samples are.

NumPyro's enumeration (``config_enumerate``, ``TraceEnum_ELBO``, ``infer_discrete``, NUTS's own)
and its Gibbs samplers (``DiscreteHMCGibbs``, ``MixedHMC``) take a discrete site's values to be
integers, one per coordinate: DiscreteHMCGibbs proposed 0..K-1 for each coordinate of a one-hot
(rows such as [2, 1, 0]) and 0/1 for LogitBernoulli's +-inf, with no error. So
``OneHotCategorical``, ``ExpOneHotCategorical`` and ``LogitBernoulli`` declare an enumerable support,
so that those ask, and refuse ``enumerate_support`` with a ValueError pointing to
``discrete(model, mode="enumerate")``, which enumerates an index in the site's place. ``Bernoulli``
(0 or 1) is enumerable by the host.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax import Array
from jax.typing import ArrayLike
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.util import lazy_property, validate_sample

from concrete_common.messages import host_enumeration_refused

from . import constraints as concrete_constraints
from ._checks import ValidatedValues

__all__ = ["OneHotCategorical", "ExpOneHotCategorical", "Bernoulli", "LogitBernoulli"]


def _exactly_one(cls_name, probs, logits):
    if (logits is None) == (probs is None):
        raise ValueError(f"{cls_name}: pass exactly one of `logits` or `probs`, got {'neither' if logits is None else 'both'}")


def _signed_infinity(zero_one):
    """0./1. -> -inf/+inf, in the dtype of the input."""
    return jnp.where(zero_one > 0, jnp.inf, -jnp.inf).astype(jnp.result_type(zero_one))


class OneHotCategorical(ValidatedValues, Distribution):
    """A categorical distribution over one-hot vectors; ``mode`` is the one-hot argmax of the logits."""

    arg_constraints = {"logits": constraints.real_vector, "probs": constraints.simplex}
    pytree_data_fields = ("logits", "probs")  # both lazy properties: named, or the pytree would hold neither
    support = concrete_constraints.one_hot
    has_enumerate_support = True  # so that the host's enumeration and Gibbs samplers ask, and are refused

    def __init__(
        self, probs: Optional[ArrayLike] = None, logits: Optional[ArrayLike] = None, validate_args: Optional[bool] = None
    ) -> None:
        _exactly_one(type(self).__name__, probs, logits)
        # the parameter given is the one validated (the other is lazy, as the host's CategoricalProbs
        # has it): probs with a 0 are logits of -inf, which the logits' constraint would refuse
        if probs is not None:
            self.probs = jnp.asarray(probs)
            shape = jnp.shape(self.probs)
        else:
            self.logits = jnp.asarray(logits)
            shape = jnp.shape(self.logits)
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)
        self.logits = self.logits  # held from here on, validated or not (the pytree's leaves)

    @lazy_property
    def probs(self) -> Array:
        return jax.nn.softmax(self.logits, axis=-1)

    @lazy_property
    def logits(self) -> Array:
        return jnp.log(self.probs)

    def expand(self, batch_shape: tuple[int, ...]) -> Distribution:
        batch_shape = tuple(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        shape = batch_shape + self.event_shape
        if "probs" in self.__dict__:
            return type(self)(probs=jnp.broadcast_to(self.probs, shape), validate_args=self._validate_args)
        return type(self)(logits=jnp.broadcast_to(self.logits, shape), validate_args=self._validate_args)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> Array:
        index = jax.random.categorical(key, self.logits, shape=sample_shape + self.batch_shape)
        return jax.nn.one_hot(index, self.event_shape[0], dtype=self.logits.dtype)

    @validate_sample
    def log_prob(self, value: ArrayLike) -> Array:
        self._check_value_shape(value)
        # a value broadcasts with the batch either way (one label for a batch, or several batches of labels)
        shape = jnp.broadcast_shapes(jnp.shape(value), self.batch_shape + self.event_shape)
        log_probs = jnp.broadcast_to(jax.nn.log_softmax(self.logits, axis=-1), shape)
        index = jnp.broadcast_to(jnp.argmax(value, -1), shape[:-1])
        return jnp.take_along_axis(log_probs, index[..., None], -1)[..., 0]

    def enumerate_support(self, expand: bool = True) -> Array:
        """Refused (see the module docstring): NumPyro's enumeration takes values to be integers."""
        raise ValueError(host_enumeration_refused(type(self).__name__))

    def _enumerated_values(self, expand: bool = True) -> Array:
        """The one-hot vectors, shaped as ``enumerate_support`` would be."""
        k = self.event_shape[0]
        values = jnp.eye(k, dtype=self.logits.dtype).reshape((k,) + (1,) * len(self.batch_shape) + (k,))
        return jnp.broadcast_to(values, (k,) + self.batch_shape + (k,)) if expand else values

    @property
    def mode(self) -> Array:
        return jax.nn.one_hot(jnp.argmax(self.logits, -1), self.event_shape[0], dtype=self.logits.dtype)

    @property
    def mean(self) -> Array:
        return self.probs

    @property
    def variance(self) -> Array:
        return self.probs * (1 - self.probs)

    def entropy(self) -> Array:
        log_probs = jax.nn.log_softmax(self.logits, axis=-1)
        return -(jnp.exp(log_probs) * log_probs).sum(-1)


class Bernoulli(ValidatedValues, dist.BernoulliLogits):
    """NumPyro's BernoulliLogits taking ``probs`` or ``logits``, with float values and enumeration
    (as BinConcrete's) and ``mode`` = ``logits > 0`` (0 at p = 1/2)."""

    arg_constraints = {"logits": constraints.real, "probs": constraints.unit_interval}

    def __init__(
        self, probs: Optional[ArrayLike] = None, logits: Optional[ArrayLike] = None, validate_args: Optional[bool] = None
    ) -> None:
        _exactly_one(type(self).__name__, probs, logits)
        if probs is not None:
            self.probs = jnp.asarray(probs)
            logits = jnp.log(self.probs) - jnp.log1p(-self.probs)
        super().__init__(jnp.asarray(logits), validate_args=validate_args)

    def expand(self, batch_shape: tuple[int, ...]) -> Distribution:
        batch_shape = tuple(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        return type(self)(logits=jnp.broadcast_to(self.logits, batch_shape), validate_args=self._validate_args)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> Array:
        u = jax.random.uniform(key, sample_shape + self.batch_shape, dtype=self.logits.dtype)
        return (u < jax.nn.sigmoid(self.logits)).astype(self.logits.dtype)

    @validate_sample
    def log_prob(self, value: ArrayLike) -> Array:
        value = jnp.asarray(value)
        self._check_value_shape(value)
        return jnp.where(value > 0, -jax.nn.softplus(-self.logits), -jax.nn.softplus(self.logits))

    def enumerate_support(self, expand: bool = True) -> Array:
        values = jnp.arange(2, dtype=self.logits.dtype).reshape((-1,) + (1,) * len(self.batch_shape))
        return jnp.broadcast_to(values, (2,) + self.batch_shape) if expand else values

    @property
    def mode(self) -> Array:
        return (self.logits > 0).astype(self.logits.dtype)


class _DiscreteInLogSpace(ValidatedValues, Distribution):
    """A discrete distribution shown through an elementwise map of its values (log or logit)."""

    arg_constraints: dict[str, Any] = {}
    pytree_data_fields = ("base",)
    has_enumerate_support = True  # so that the host's enumeration and Gibbs samplers ask, and are refused
    _base_class: Any  # the host's class of the underlying discrete distribution

    def __init__(
        self, probs: Optional[ArrayLike] = None, logits: Optional[ArrayLike] = None, validate_args: Optional[bool] = None
    ) -> None:
        self.base = self._base_class(probs=probs, logits=logits, validate_args=validate_args)
        super().__init__(self.base.batch_shape, self.base.event_shape, validate_args=validate_args)

    @property
    def has_rsample(self) -> bool:
        # discrete: no reparameterized sampler (NumPyro's default, with no parameter constraints
        # declared, would say otherwise, and score-function losses would drop the site's term)
        return False

    @property
    def logits(self) -> Array:
        return self.base.logits

    @property
    def probs(self) -> Array:
        return self.base.probs

    def expand(self, batch_shape: tuple[int, ...]) -> Distribution:
        batch_shape = tuple(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        return type(self)(logits=self.base.expand(batch_shape).logits, validate_args=self._validate_args)

    def sample(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> Array:
        return self._show(self.base.sample(key, sample_shape))

    @validate_sample
    def log_prob(self, value: ArrayLike) -> Array:
        self._check_value_shape(value)
        return self.base.log_prob(self._hide(value))

    def enumerate_support(self, expand: bool = True) -> Array:
        """Refused (see the module docstring): NumPyro's enumeration takes values to be integers."""
        raise ValueError(host_enumeration_refused(type(self).__name__))

    def _enumerated_values(self, expand: bool = True) -> Array:
        """The values (log one-hot, +-inf), shaped as ``enumerate_support`` would be."""
        return self._show(getattr(self.base, "_enumerated_values", self.base.enumerate_support)(expand))

    @property
    def mode(self) -> Array:
        return self._show(self.base.mode)

    def entropy(self) -> Array:
        return self.base.entropy()


class ExpOneHotCategorical(_DiscreteInLogSpace):
    """The zero-temperature limit of :class:`~numpyro_concrete.ExpConcrete`: ``log`` of a
    OneHotCategorical value, entries 0 (the chosen category) and -inf."""

    support = concrete_constraints.log_one_hot
    _base_class = OneHotCategorical

    @staticmethod
    def _show(one_hot):
        return jnp.log(one_hot)

    @staticmethod
    def _hide(log_one_hot):
        return (log_one_hot == 0).astype(jnp.result_type(log_one_hot))


class LogitBernoulli(_DiscreteInLogSpace):
    """The zero-temperature limit of :class:`~numpyro_concrete.LogitBinConcrete`: the logit of a
    Bernoulli value, -inf (for 0) or +inf (for 1)."""

    support = concrete_constraints.plus_minus_infinity
    _base_class = Bernoulli

    @staticmethod
    def _show(zero_one):
        return _signed_infinity(zero_one)

    @staticmethod
    def _hide(signed_infinity):
        return (signed_infinity > 0).astype(jnp.result_type(signed_infinity))
