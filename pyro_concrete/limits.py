"""Zero-temperature limits of the Concrete family, each on the sample space of its relaxation.

=====================  ==========================  ====================================
relaxed                discrete (``.discrete()``)  values
=====================  ==========================  ====================================
Concrete               OneHotCategorical           one-hot vectors
ExpConcrete            ExpOneHotCategorical        log of a one-hot: entries 0 and -inf
BinConcrete            Bernoulli                   0 or 1
LogitBinConcrete       LogitBernoulli              -inf or +inf (the logit of 0 or 1)
=====================  ==========================  ====================================

All are enumerable and have a ``mode`` taken from the logits (argmax, first index on ties;
``logits > 0``), which is never NaN -- torch's Bernoulli mode is NaN at p = 1/2.
"""

import math
from typing import Any, Optional

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution
from torch import Tensor
from torch.types import _size

from . import constraints as concrete_constraints
from ._checks import ArrayLike

__all__ = ["OneHotCategorical", "ExpOneHotCategorical", "Bernoulli", "LogitBernoulli"]


def _one_hot_mode(logits):
    return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)


def _signed_infinity(zero_one):
    """0./1. -> -inf/+inf, in the dtype of the input."""
    return torch.full_like(zero_one, -math.inf).masked_fill(zero_one > 0, math.inf)


class OneHotCategorical(dist.OneHotCategorical):
    """Pyro's OneHotCategorical; ``mode`` is the one-hot argmax of the logits; ``sample`` draws
    what Pyro's draws, one-hot by a scatter: ``one_hot`` reads the indices back to check them, which
    no graph tracer can (the ``torch.compile`` losses trace the discrete graph too)."""

    @property
    def mode(self) -> Tensor:
        return _one_hot_mode(self.logits)

    def sample(self, sample_shape: _size = torch.Size()) -> Tensor:
        indices = self._categorical.sample(torch.Size(sample_shape))
        probs = self._categorical.probs
        return torch.zeros(indices.shape + probs.shape[-1:], dtype=probs.dtype, device=probs.device).scatter_(
            -1, indices.unsqueeze(-1), 1.0
        )


class Bernoulli(dist.Bernoulli):
    """Pyro's Bernoulli; ``mode`` is ``logits > 0`` (0 at p = 1/2, never NaN)."""

    @property
    def mode(self) -> Tensor:
        return (self.logits > 0).to(self.logits.dtype)


class _DiscreteInLogSpace(TorchDistribution):
    """A discrete distribution shown through an elementwise map of its values (log or logit)."""

    arg_constraints: dict[str, Any] = {}
    has_enumerate_support = True
    _base_class: Any  # the host's class of the underlying discrete distribution

    def __init__(
        self, probs: Optional[ArrayLike] = None, logits: Optional[ArrayLike] = None, validate_args: Optional[bool] = None
    ) -> None:
        self.base = self._base_class(probs=probs, logits=logits, validate_args=validate_args)
        super().__init__(self.base.batch_shape, self.base.event_shape, validate_args=False)
        self._validate_args = self.base._validate_args

    @property
    def logits(self) -> Tensor:
        return self.base.logits

    @property
    def probs(self) -> Tensor:
        return self.base.probs

    def expand(self, batch_shape: _size, _instance: Optional[TorchDistribution] = None) -> TorchDistribution:
        new = self._get_checked_instance(type(self), _instance)
        new.base = self.base.expand(batch_shape)
        super(_DiscreteInLogSpace, new).__init__(new.base.batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def sample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return self._show(self.base.sample(sample_shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return self.base.log_prob(self._hide(value))

    def enumerate_support(self, expand: bool = True) -> Tensor:
        return self._show(self.base.enumerate_support(expand))

    @property
    def mode(self) -> Tensor:
        return self._show(self.base.mode)

    def entropy(self) -> Tensor:
        return self.base.entropy()


class ExpOneHotCategorical(_DiscreteInLogSpace):
    """The zero-temperature limit of :class:`~pyro_concrete.ExpConcrete`: ``log`` of a
    OneHotCategorical value, entries 0 (the chosen category) and -inf."""

    support = concrete_constraints.log_one_hot
    _base_class = OneHotCategorical

    @staticmethod
    def _show(one_hot):
        return torch.log(one_hot)

    @staticmethod
    def _hide(log_one_hot):
        return (log_one_hot == 0).to(log_one_hot.dtype)


class LogitBernoulli(_DiscreteInLogSpace):
    """The zero-temperature limit of :class:`~pyro_concrete.LogitBinConcrete`: the logit of a
    Bernoulli value, -inf (for 0) or +inf (for 1)."""

    support = concrete_constraints.plus_minus_infinity
    _base_class = Bernoulli

    @staticmethod
    def _show(zero_one):
        return _signed_infinity(zero_one)

    @staticmethod
    def _hide(signed_infinity):
        return (signed_infinity > 0).to(signed_infinity.dtype)
