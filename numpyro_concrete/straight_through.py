"""Straight-through Concrete estimators (Bengio et al. 2013; Jang et al. 2017, section 2.2).

The value is discrete -- the one-hot argmax (the {0, 1} rounding) of a Concrete (BinConcrete)
sample -- and its gradient is the relaxed sample's: ``value = hard + (x - stop_gradient(x))``,
which is ``hard`` exactly. ``log_prob`` is the relaxed density of the sample behind the value (the
value alone does not determine it): the relaxed coordinates are the site's ``intermediates``, and
inside a traced computation they are carried with the value by identity (see ``_carry``), so the
sample is scored by any distribution of the family -- a ``Concrete`` (``BinConcrete``) prior
included. ``sample`` returns the discrete value. Any other value -- user data, a copy (``x * 1.0``),
or an eager sample without its intermediates: discrete values collide, so such a value cannot be
told from another sample or from data with the same content -- has no relaxed sample behind it
that can be determined for certain: ``log_prob`` raises a ValueError saying so.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from concrete_common import evaluating
from concrete_common.kinds import Kind

from . import _numerics
from ._carry import carry
from .distributions import BinConcrete, Concrete

__all__ = ["ConcreteStraightThrough", "BinConcreteStraightThrough"]


def _straight_through(hard, relaxed):
    return hard + (relaxed - jax.lax.stop_gradient(relaxed))


def _relaxed_coordinates(d, value, kind, intermediates):
    d._check_value_shape(value)
    y = d._carried(value, (kind,), intermediates)
    if y is None:
        raise ValueError(
            f"{type(d).__name__}.log_prob: value is not a sample of a straight-through distribution within the "
            f"traced computation that drew it, and no intermediates were given, so the relaxed sample behind it "
            f"cannot be determined -- a copy or user data with the same discrete content could belong to any "
            f"sample; score the sample where it was drawn, pass its intermediates (sample_with_intermediates), "
            f"or score discrete values with .discrete().log_prob(value). An autoguide's or MCMC's value (unconstrained, pushed onto "
            f"the support) is such data: a straight-through site has no density of values it did not draw; write "
            f"the site with Concrete / BinConcrete in the model (straight-through belongs in the guide)"
        )
    return y


class ConcreteStraightThrough(Concrete):
    r"""Straight-through Concrete: a one-hot value whose gradient is that of a :class:`Concrete`
    sample ``x`` (eq. 10), ``value = one_hot(argmax x) + x - stop_gradient(x)``.

    ``log_prob(value)`` is the Concrete density (eq. 11) of ``x``, computed from its exact log
    coordinates. See the module docstring for other values.

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    _kind = Kind.STRAIGHT_THROUGH_LOG

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        y = self._sample_coordinates(key, sample_shape)
        hard = jax.nn.one_hot(jnp.argmax(y, -1), y.shape[-1], dtype=y.dtype)
        return carry.attach(_straight_through(hard, jnp.exp(y)), y, self._kind), [y]

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        y = _relaxed_coordinates(self, value, self._kind, intermediates)
        return _numerics.concrete_log_prob(y, self.logits, self.temperature)


    def conditional_sample(self, key: Optional[jax.Array], hard: ArrayLike, sample_shape: tuple[int, ...] = ()) -> Array:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; draw relaxed samples with Concrete(...).conditional_sample")

class BinConcreteStraightThrough(BinConcrete):
    r"""Straight-through binary Concrete: a {0, 1} value whose gradient is that of a
    :class:`BinConcrete` sample ``x`` (eq. 16), ``value = [x > 1/2] + x - stop_gradient(x)``.

    ``log_prob(value)`` is the BinConcrete density (eq. 17) of ``x``, computed from its logit.
    See the module docstring for copies and other values.

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    _kind = Kind.STRAIGHT_THROUGH_LOGIT

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        y = self._sample_coordinates(key, sample_shape)
        hard = (y > 0).astype(y.dtype)
        return carry.attach(_straight_through(hard, jax.nn.sigmoid(y)), y, self._kind), [y]

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        y = _relaxed_coordinates(self, value, self._kind, intermediates)
        return _numerics.bin_concrete_log_prob(y, self.logits, self.temperature)

    def cdf(self, value: ArrayLike) -> Array:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; use BinConcrete for the cdf")

    def icdf(self, value: ArrayLike) -> Array:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; use BinConcrete for the icdf")

    def conditional_sample(self, key: Optional[jax.Array], hard: ArrayLike, sample_shape: tuple[int, ...] = ()) -> Array:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; draw relaxed samples with BinConcrete(...).conditional_sample")
