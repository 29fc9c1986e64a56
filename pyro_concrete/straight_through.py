"""Straight-through Concrete estimators (Bengio et al. 2013; Jang et al. 2017, section 2.2).

The value is discrete -- the one-hot argmax (the {0, 1} rounding) of a Concrete (BinConcrete)
sample -- and its gradient is the relaxed sample's: ``value = hard + (x - x.detach())``, which is
``hard`` exactly. ``log_prob`` is the relaxed density of the sample behind the value (the value
alone does not determine it): the relaxed coordinates are carried with the value and its views
(see ``_carry``), so the sample is scored by any distribution of the family -- a ``Concrete``
(``BinConcrete``) prior included. ``sample()`` and ``rsample()`` both return the discrete value.
Any other value -- user data, or a copy (``clone()``, ``x * 1.0``): discrete values collide, so a
copy cannot be told from another sample or from data with the same content -- has no relaxed
sample behind it that can be determined for certain: ``log_prob`` raises a ValueError saying so.
"""


import torch
from torch import Tensor
from torch.types import _size

from concrete_common import evaluating
from concrete_common.kinds import Kind

from . import _numerics
from ._carry import carry
from .distributions import BinConcrete, Concrete

__all__ = ["ConcreteStraightThrough", "BinConcreteStraightThrough"]


def _straight_through(hard, relaxed):
    return hard + (relaxed - relaxed.detach())


def _relaxed_coordinates(d, value, kind):
    y = carry.scoring_coordinates(value, (kind,), d._validate_args)
    if y is None:
        raise ValueError(
            f"{type(d).__name__}.log_prob: value is not a sample of a straight-through distribution (or a view "
            f"of one), so the relaxed sample behind it cannot be determined -- a copy or user data with the same "
            f"discrete content could belong to any sample; score the sample itself, or discrete values with "
            f".discrete().log_prob(value). An autoguide's or MCMC's value (unconstrained, pushed onto "
            f"the support) is such data: a straight-through site has no density of values it did not draw; write "
            f"the site with Concrete / BinConcrete in the model (straight-through belongs in the guide)"
        )
    return y


class ConcreteStraightThrough(Concrete):
    r"""Straight-through Concrete: a one-hot value whose gradient is that of a :class:`Concrete`
    sample ``x`` (eq. 10), ``value = one_hot(argmax x) + x - stop_gradient(x)``.

    ``log_prob(value)`` is the Concrete density (eq. 11) of ``x``, computed from its exact log
    coordinates. See the module docstring for other values.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    _kind = Kind.STRAIGHT_THROUGH_LOG

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        y = self._sample_coordinates(sample_shape)
        # by a scatter: one_hot reads the indices back to check them (a wait for the device); not in
        # place: torch.func.vmap has a rule for the out-of-place one only
        hard = torch.zeros_like(y).scatter(-1, y.argmax(-1, keepdim=True), 1.0)
        return carry.attach(_straight_through(hard, torch.exp(y)), y, self._kind)

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        return _numerics.concrete_log_prob(_relaxed_coordinates(self, value, self._kind), self.logits, self._kernel_temperature)


    def conditional_rsample(self, hard: Tensor, sample_shape: _size = torch.Size()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; draw relaxed samples with Concrete(...).conditional_rsample")

class BinConcreteStraightThrough(BinConcrete):
    r"""Straight-through binary Concrete: a {0, 1} value whose gradient is that of a
    :class:`BinConcrete` sample ``x`` (eq. 16), ``value = [x > 1/2] + x - stop_gradient(x)``.

    ``log_prob(value)`` is the BinConcrete density (eq. 17) of ``x``, computed from its logit.
    See the module docstring for copies and other values.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    _kind = Kind.STRAIGHT_THROUGH_LOGIT

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        y = self._sample_coordinates(sample_shape)
        hard = (y > 0).to(y.dtype)
        return carry.attach(_straight_through(hard, torch.sigmoid(y)), y, self._kind)

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        return _numerics.bin_concrete_log_prob(_relaxed_coordinates(self, value, self._kind), self.logits, self._kernel_temperature)

    def cdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; use BinConcrete for the cdf")

    def icdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; use BinConcrete for the icdf")

    def conditional_rsample(self, hard: Tensor, sample_shape: _size = torch.Size()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has discrete values; draw relaxed samples with BinConcrete(...).conditional_rsample")
