"""Hard Concrete (Louizos, Welling & Kingma, "Learning Sparse Neural Networks through L0
Regularization", ICLR 2018): a BinConcrete stretched to (low, high) and clipped to [0, 1]."""

import math
import numbers
from typing import Optional

import numpy as np
import torch
from pyro.distributions import TorchDistribution
from torch import Tensor
from torch.distributions import constraints
from torch.types import _size

from concrete_common import evaluating
from concrete_common import stretch

from . import _numerics
from . import constraints as concrete_constraints
from ._checks import ArrayLike, _in_transform
from .distributions import _BinaryConcrete
from .limits import Bernoulli

__all__ = ["HardConcrete"]

# the rounding checked for each dtype (bfloat16: float32, which has its range)
_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def promote_end(cls_name, name, x, like, batch_shape, validate):
    """``low`` or ``high`` as a tensor of the logits' dtype and device (differentiable, not expanded),
    and the batch shape grown to broadcast with it.

    Booleans and non-numbers, and shapes that do not broadcast with ``batch_shape``, always raise.
    Values (finite, < 0 for low, > 1 for high, also after rounding to the dtype: ``low=-1e-50`` is
    ``-0.0`` in float32, ``high=1e39`` is inf) are checked when ``validate`` is on, and always for a
    Python number, which costs nothing (it is checked in Python, before any tensor exists).
    """
    dtype, device = like.dtype, like.device
    dtype_name = str(dtype).replace("torch.", "")
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)):  # the common case, checked in Python
        converted = stretch.check_number(cls_name, name, x, _NUMPY_DTYPES.get(dtype, np.float32), dtype_name)
        # a fill, not torch.tensor: on a GPU that is a copy from the host, which waits for the device
        return torch.full((), converted, dtype=dtype, device=device), batch_shape
    if isinstance(x, torch.Tensor):
        given = None
        number_like = not (x.dtype == torch.bool or x.is_complex())
    else:
        try:
            given = np.asarray(x)
        except Exception:
            given = np.asarray(None)
        number_like = given.dtype.kind in "iuf"
    if not number_like:
        raise ValueError(f"{cls_name}: {name} must be a finite number {stretch.BOUNDS[name]} or a tensor of them, got {x!r}")
    shape = tuple(x.shape) if given is None else given.shape
    try:
        batch_shape = torch.Size(stretch.broadcast_shapes(batch_shape, shape))
    except ValueError:
        raise ValueError(
            f"{cls_name}: {name} of shape {shape} does not broadcast with the batch shape {tuple(batch_shape)}; "
            f"{name} is a batch parameter (one per distribution)"
        ) from None
    if given is None:
        converted = x.to(dtype=dtype, device=device)
        if validate and _in_transform():  # a torch.func transform: decided by torch's vmap-friendly check
            x = converted.detach()
            if not torch._is_all_true(torch.isfinite(x) & ((x < 0) if name == "low" else (x > 1))):
                raise ValueError(f"{cls_name}: {name} must be a finite number {stretch.BOUNDS[name]} (inside a torch.func transform: the values are not shown)")
        elif validate:
            # exactly, in float64 (every float dtype converts to it without rounding)
            stretch.check_end(cls_name, name, *(t.detach().cpu().double().numpy() for t in (x, converted)), dtype_name)
        return converted, batch_shape
    if validate:
        with np.errstate(over="ignore", invalid="ignore"):
            stretch.check_end(cls_name, name, given, given.astype(_NUMPY_DTYPES.get(dtype, np.float32)), dtype_name)
    return torch.as_tensor(given, dtype=dtype, device=device), batch_shape


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

    Numerics: the stretch enters through logs only, :math:`\mathrm{logit}(\tfrac{z-\gamma}{\zeta-\gamma})
    = \log(z-\gamma) - \log(\zeta-z)` and :math:`\log(\zeta-\gamma)` as a log-sum-exp, and samples
    and the test-time gate are :math:`\gamma\,(1-s) + \zeta\,s`, so any finite ends work (``low=-1e17``
    too) and gradients with respect to ``low`` and ``high`` are exact.

    :param temperature: lambda > 0 (Louizos et al. use 2/3), a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha, any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    :param low: gamma < 0, the lower end of the stretch (default -0.1), a number or a tensor
        broadcasting with the batch shape (and part of it), in the logits' dtype; differentiable.
    :param high: zeta > 1, the upper end of the stretch (default 1.1), a number or a tensor
        broadcasting with the batch shape (and part of it), in the logits' dtype; differentiable.
    """

    arg_constraints = {
        **_BinaryConcrete.arg_constraints,
        "low": concrete_constraints.finite_less_than(0.0),
        "high": concrete_constraints.finite_greater_than(1.0),
    }
    support = concrete_constraints.gate

    def __init__(
        self,
        temperature: ArrayLike,
        logits: Optional[ArrayLike] = None,
        probs: Optional[ArrayLike] = None,
        low: ArrayLike = -0.1,
        high: ArrayLike = 1.1,
        validate_args: Optional[bool] = None,
    ) -> None:
        super().__init__(temperature, logits=logits, probs=probs, validate_args=validate_args)
        name, batch_shape = type(self).__name__, self.batch_shape
        self._low, batch_shape = promote_end(name, "low", low, self.logits, batch_shape, self._validate_args)
        self._high, batch_shape = promote_end(name, "high", high, self.logits, batch_shape, self._validate_args)
        if batch_shape != self.batch_shape:  # low and high may grow the batch shape
            self.logits = self.logits.expand(batch_shape)
            if "probs" in self.__dict__:
                self.probs = self.probs.expand(batch_shape)
            validate = self._validate_args
            TorchDistribution.__init__(self, batch_shape, torch.Size(), validate_args=False)
            self._validate_args = validate
        self.low, self.high = self._low.expand(batch_shape), self._high.expand(batch_shape)

    def expand(self, batch_shape: _size, _instance: Optional[TorchDistribution] = None) -> TorchDistribution:
        new = self._get_checked_instance(HardConcrete, _instance)
        batch_shape = torch.Size(batch_shape)
        new._low, new._high = self._low, self._high  # broadcastable to the batch shape; what the kernels read
        new.low, new.high = self._low.expand(batch_shape), self._high.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)

    def _logit_at_zero(self):
        """logit((0 - low) / (high - low)) = log(-low) - log(high): where the stretched variable is 0."""
        return torch.log(-self._low) - torch.log(self._high)

    def _logit_at_one(self):
        """logit((1 - low) / (high - low)) = log(1 - low) - log(high - 1): where it is 1."""
        return torch.log1p(-self._low) - torch.log(self._high - 1)

    def _log_width(self):
        """log(high - low), without forming high - low (which overflows for huge finite ends)."""
        return torch.logaddexp(torch.log(-self._low), torch.log(self._high))

    def _stretch(self, s, one_minus_s):
        """low + (high - low) s as low (1 - s) + high s: no overflow, and accurate wherever the
        result lands in [0, 1] (low + (high - low) s loses |low| ulps there)."""
        return (self._low * one_minus_s + self._high * s).clamp(0.0, 1.0)

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        y = self._sample_coordinates(sample_shape)
        return self._stretch(torch.sigmoid(y), torch.sigmoid(-y))

    def _log_mass_at_zero(self):
        return -_numerics.softplus(self.logits - _numerics.positive(self._kernel_temperature) * self._logit_at_zero())

    def _log_mass_at_one(self):
        return -_numerics.softplus(_numerics.positive(self._kernel_temperature) * self._logit_at_one() - self.logits)

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        self._validate(value)
        inside = value.clamp(0.0, 1.0)  # z - low > 0 and high - z > 0: finite logs
        log_above, log_below = torch.log(inside - self._low), torch.log(self._high - inside)
        # p(z) = g(y) dy/dz with y = log(z - low) - log(high - z), g the LogitBinConcrete density
        density = _numerics.logit_bin_concrete_log_prob(log_above - log_below, self.logits, self._kernel_temperature)
        density = density + self._log_width() - log_above - log_below
        log_prob = torch.where(value <= 0, self._log_mass_at_zero(), torch.where(value >= 1, self._log_mass_at_one(), density))
        return log_prob.masked_fill((value < 0) | (value > 1), -math.inf)

    def cdf(self, value: Tensor) -> Tensor:
        self._validate(value)
        inside = value.clamp(0.0, 1.0)
        below_one = torch.sigmoid(_numerics.positive(self._kernel_temperature) * (torch.log(inside - self._low) - torch.log(self._high - inside)) - self.logits)
        return torch.where(value >= 1, torch.ones_like(below_one), below_one).masked_fill(value < 0, 0.0)

    @property
    def prob_nonzero(self) -> Tensor:
        """P(Z != 0), the expected L0 norm of the gate (Louizos et al. eq. 12)."""
        # exp(log sigmoid): its gradient p (1 - p) keeps 1 - p where p rounds to 1 (sigmoid's was 0 there)
        return torch.exp(torch.nn.functional.logsigmoid(self.logits - _numerics.positive(self._kernel_temperature) * self._logit_at_zero()))

    @property
    def deterministic_gate(self) -> Tensor:
        """The test-time gate min(1, max(0, sigmoid(log alpha) (high - low) + low)) (Louizos et al. eq. 13)."""
        return self._stretch(torch.sigmoid(self.logits), torch.sigmoid(-self.logits))

    def conditional_rsample(self, hard: Tensor, sample_shape: _size = torch.Size()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}: no relaxed sample given a gate's discrete value (its atoms at 0 and 1 are not a relaxation's limit)")

    def discrete(self) -> Bernoulli:
        """Whether the gate is open: Bernoulli(prob_nonzero), on {0, 1}."""
        logits = self.logits - _numerics.positive(self._kernel_temperature) * self._logit_at_zero()
        return Bernoulli(logits=logits, validate_args=self._validate_args)
