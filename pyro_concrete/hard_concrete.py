"""Hard Concrete (Louizos, Welling & Kingma, "Learning Sparse Neural Networks through L0
Regularization", ICLR 2018): a BinConcrete stretched to (low, high) and clipped to [0, 1]."""

import math

import torch
from torch.distributions import constraints

from . import _numerics
from .discrete import Bernoulli
from .distributions import _BinaryConcrete

__all__ = ["HardConcrete"]


def check_stretch(cls_name, low, high):
    checked = []
    for name, x in (("low", low), ("high", high)):
        try:
            number = float(x)  # a Python number or a 0-dim array
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(x, bool) or not math.isfinite(number):
            raise ValueError(f"{cls_name}: {name} must be a finite number (a Python number, not traced), got {x!r}")
        checked.append(number)
    low, high = checked
    if not low < 0:
        raise ValueError(f"{cls_name}: low must be < 0 (the stretch puts mass at 0), got {low}")
    if not high > 1:
        raise ValueError(f"{cls_name}: high must be > 1 (the stretch puts mass at 1), got {high}")
    return float(low), float(high)


class HardConcrete(_BinaryConcrete):
    r"""Hard Concrete gate: ``Z = min(1, max(0, low + (high - low) S))`` with ``S ~ BinConcrete``
    (paper eq. 16; Louizos et al. eqs. 9-10), a mixed distribution on [0, 1] with point masses at
    the ends and a density inside.

    .. math::
        P(Z = 0) = \sigma\big(\lambda\,\mathrm{logit}(\tfrac{-\gamma}{\zeta-\gamma}) - \log\alpha\big),\quad
        P(Z = 1) = \sigma\big(\log\alpha - \lambda\,\mathrm{logit}(\tfrac{1-\gamma}{\zeta-\gamma})\big),\quad
        p(z) = \frac{1}{\zeta-\gamma}\, p_{\mathrm{BinConcrete}}\big(\tfrac{z-\gamma}{\zeta-\gamma}\big),\ 0<z<1

    with :math:`(\gamma, \zeta)` = ``(low, high)``. ``log_prob`` is taken with respect to the sum of
    Lebesgue measure on (0, 1) and unit masses at 0 and 1: ``log P(Z = 0)`` at 0, ``log P(Z = 1)``
    at 1, the log density inside. ``prob_nonzero`` is the expected L0 penalty in closed form,
    :math:`\sigma(\log\alpha - \lambda \log(-\gamma/\zeta))` (Louizos et al. eq. 12);
    ``deterministic_gate`` the test-time gate :math:`\min(1, \max(0, \sigma(\log\alpha)(\zeta-\gamma)+\gamma))`;
    ``discrete()`` the Bernoulli(``prob_nonzero``) of the gate being open. Samples are
    reparameterized (the clip passes no gradient at the ends, as in the paper). As the latent of an
    ELBO (model and guide both Hard Concrete), ``log q - log p`` jumps where a sample crosses 0 or 1
    (a mass against a density), so the reparameterized gradient of the KL term misses a boundary
    term and is biased; train gates with the closed-form ``prob_nonzero`` penalty instead, as
    Louizos et al. do (``examples/l0_*.py``). Off [0, 1] (validation off) ``log_prob`` is -inf.

    :param temperature: lambda > 0 (Louizos et al. use 2/3), a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha, any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    :param low: gamma < 0, the lower end of the stretch (default -0.1).
    :param high: zeta > 1, the upper end of the stretch (default 1.1).
    """

    support = constraints.unit_interval

    def __init__(self, temperature, logits=None, probs=None, low=-0.1, high=1.1, validate_args=None):
        self.low, self.high = check_stretch(type(self).__name__, low, high)
        super().__init__(temperature, logits=logits, probs=probs, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(HardConcrete, _instance)
        new.low, new.high = self.low, self.high
        return super().expand(batch_shape, _instance=new)

    def _logit_of_stretched(self, x):
        """logit((x - low) / (high - low)) for a Python number x."""
        s = (x - self.low) / (self.high - self.low)
        return math.log(s) - math.log1p(-s)

    def rsample(self, sample_shape=torch.Size()):
        s = torch.sigmoid(self._sample_logit(sample_shape))
        return (self.low + (self.high - self.low) * s).clamp(0.0, 1.0)

    def _log_mass_at_zero(self):
        return -torch.nn.functional.softplus(self.logits - self._t * self._logit_of_stretched(0.0))

    def _log_mass_at_one(self):
        return -torch.nn.functional.softplus(self._t * self._logit_of_stretched(1.0) - self.logits)

    def log_prob(self, value):
        self._validate(value)
        inside = value.clamp(0.0, 1.0)  # the stretched value stays strictly inside (0, 1): finite logit
        s = (inside - self.low) / (self.high - self.low)
        density = _numerics.bin_concrete_log_prob(torch.log(s) - torch.log1p(-s), self.logits, self._t)
        density = density - math.log(self.high - self.low)
        log_prob = torch.where(value <= 0, self._log_mass_at_zero(), torch.where(value >= 1, self._log_mass_at_one(), density))
        return log_prob.masked_fill((value < 0) | (value > 1), -math.inf)

    def cdf(self, value):
        self._validate(value)
        s = (value.clamp(0.0, 1.0) - self.low) / (self.high - self.low)
        below_one = torch.sigmoid(self._t * (torch.log(s) - torch.log1p(-s)) - self.logits)
        return torch.where(value >= 1, torch.ones_like(below_one), below_one).masked_fill(value < 0, 0.0)

    @property
    def prob_nonzero(self):
        """P(Z != 0), the expected L0 norm of the gate (Louizos et al. eq. 12)."""
        return torch.sigmoid(self.logits - self._t * self._logit_of_stretched(0.0))

    @property
    def deterministic_gate(self):
        """The test-time gate min(1, max(0, sigmoid(log alpha) (high - low) + low)) (Louizos et al. eq. 13)."""
        return (self.low + (self.high - self.low) * torch.sigmoid(self.logits)).clamp(0.0, 1.0)

    def discrete(self):
        """Whether the gate is open: Bernoulli(prob_nonzero), on {0, 1}."""
        logits = self.logits - self._t * self._logit_of_stretched(0.0)
        return Bernoulli(logits=logits, validate_args=self._validate_args)
