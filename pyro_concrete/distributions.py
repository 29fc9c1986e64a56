"""The Concrete family (Maddison, Mnih & Teh, ICLR 2017) as Pyro distributions.

All four share the constructor ``X(temperature, logits=None, probs=None, validate_args=None)``:
exactly one of ``logits`` (log alpha, unnormalized allowed) or ``probs``; ``temperature`` a Python
number or a tensor whose shape broadcasts with the batch shape and is part of it.
"""

from typing import Optional, Union, cast

import torch
from pyro.distributions import TorchDistribution
from torch import Tensor
from torch.distributions.utils import lazy_property
from torch.types import _size

from concrete_common import evaluating
from concrete_common.kinds import Kind
from concrete_common import messages
from concrete_common.messages import boundary_value_message

from . import _numerics
from . import constraints as concrete_constraints
from ._carry import carry, show
from ._checks import ArrayLike, promote_params, validation_enabled
from .limits import Bernoulli, ExpOneHotCategorical, LogitBernoulli, OneHotCategorical

__all__ = ["Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"]


class _ConcreteFamily(TorchDistribution):
    """Parameters, shapes and ``expand`` shared by the four distributions."""

    logits: Tensor  # log alpha, of shape batch_shape + event_shape
    _kernel_temperature: Union[float, Tensor]  # what the kernels read: a number given stays a float

    has_rsample = True
    _event_dim: Optional[int] = None  # 1 for the n-ary distributions, 0 for the binary ones

    def __init__(
        self,
        temperature: ArrayLike,
        logits: Optional[ArrayLike] = None,
        probs: Optional[ArrayLike] = None,
        validate_args: Optional[bool] = None,
    ) -> None:
        validate = validation_enabled(validate_args)
        self._kernel_temperature, self.logits, promoted_probs, batch_shape = promote_params(
            type(self).__name__, temperature, logits, probs, self._event_dim, validate
        )  # the temperature broadcastable to the batch shape, a float if a number was given
        if isinstance(self._kernel_temperature, Tensor):
            self.temperature = self._kernel_temperature
        if promoted_probs is not None:
            self.probs = promoted_probs
        event_shape = self.logits.shape[-1:] if self._event_dim else torch.Size()
        super().__init__(batch_shape, event_shape, validate_args=False)
        self._validate_args = validate

    def expand(self, batch_shape: _size, _instance: Optional[TorchDistribution] = None) -> TorchDistribution:
        new = self._get_checked_instance(type(self), _instance)
        batch_shape = torch.Size(batch_shape)
        new._kernel_temperature = self._kernel_temperature
        if "temperature" in self.__dict__:
            new.temperature = self.temperature
        new.logits = self.logits.expand(batch_shape + self.event_shape)
        if "probs" in self.__dict__:
            new.probs = self.probs.expand(batch_shape + self.event_shape)
        super(_ConcreteFamily, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def temperature(self) -> Tensor:
        """lambda, broadcastable to the batch shape (a number given: a 0-dim tensor, made when first asked for)."""
        number = cast(float, self._kernel_temperature)  # a tensor temperature is the attribute itself
        return torch.full((), number, dtype=self.logits.dtype, device=self.logits.device)

    def _validate(self, value):
        if self._validate_args:
            self._validate_sample(value)

    def conditional_rsample(self, hard: Tensor, sample_shape: _size = torch.Size()) -> Tensor:
        """A relaxed sample given its zero-temperature limit ``hard`` (a value of :meth:`discrete`,
        e.g. its sample): z ~ p(z | H(z) = hard), the building block of REBAR, RELAX and Gumbel-Rao --
        by the top-down Gumbel construction (n-ary) or the logistic noise truncated to the side of 0
        that ``hard`` gives (binary), in log space and exact at low temperature; reparameterized, and
        carried like any own sample. Shape ``sample_shape`` + the broadcast of ``hard`` with the batch
        and event shape. Pooled over ``hard`` drawn from :meth:`discrete`, these are samples of the
        distribution."""
        return self._show(self._conditional_coordinates(hard, sample_shape))

    def _show(self, y):
        """The value of relaxed coordinates y (log x, logit x, or the log-space node's own), carried."""
        raise NotImplementedError

    @staticmethod
    def _indicator(hard):
        """The limit's value as a boolean: the chosen category (n-ary) or the ones (binary)."""
        raise NotImplementedError

    def _conditioning(self, hard, sample_shape):
        """``hard`` (a value of the limit) as the boolean of the conditional sample's shape:
        ``sample_shape`` + its broadcast with the batch and event shape; checked under validation."""
        owner = f"{type(self).__name__}.conditional_rsample"
        hard = torch.as_tensor(hard, dtype=self.logits.dtype, device=self.logits.device)
        if self._validate_args and not torch.jit.is_tracing():
            limit = self.discrete()
            if not torch._is_all_true(limit.support.check(hard)):  # torch's own vmap-friendly check
                raise messages.not_a_limit_value(owner, type(limit).__name__)
        full = self.batch_shape + self.event_shape
        try:
            shape = torch.Size(sample_shape) + torch.broadcast_shapes(hard.shape, full)
        except RuntimeError:
            raise messages.hard_shape_mismatch(owner, hard.shape, full) from None
        return self._indicator(hard).expand(shape)

    def _refuse_boundary(self, on_boundary, log_prob, boundary):
        """``log_prob`` of a value that is not an own sample; under validation, a value with a point
        on the boundary of the support (``on_boundary``, elementwise) raises: the density there is
        only a limit, which no sample has (discrete data, a copied, underflowed or straight-through
        sample). Under ``torch.jit.trace`` (the ``Jit*`` losses) a check would be baked into the
        trace: the limit is returned."""
        if self._validate_args and not torch.jit.is_tracing() and torch._is_any_true(on_boundary):  # under vmap too
            raise ValueError(boundary_value_message(type(self).__name__, boundary, type(self.discrete()).__name__))
        return log_prob


class _NaryConcrete(_ConcreteFamily):
    arg_constraints = {
        "temperature": concrete_constraints.positive_finite,
        "logits": concrete_constraints.resolvable_real_vector,
        "probs": concrete_constraints.positive_simplex,
    }
    _event_dim = 1

    @lazy_property
    def probs(self) -> Tensor:
        return torch.softmax(self.logits, dim=-1)

    @classmethod
    def infer_shapes(  # type: ignore[override]  # Pyro's takes **arg_shapes; these are its names
        cls, temperature: _size = (), logits: Optional[_size] = None, probs: Optional[_size] = None
    ) -> tuple[torch.Size, torch.Size]:
        """(batch_shape, event_shape) of a distribution built from arguments of these shapes."""
        param = torch.Size(logits if logits is not None else probs or ())
        return torch.broadcast_shapes(torch.Size(temperature), param[:-1]), param[-1:]

    def _sample_coordinates(self, sample_shape):
        return _numerics.exp_concrete_sample(
            self.logits, self._kernel_temperature, self._extended_shape(sample_shape)
        )

    def _conditional_coordinates(self, hard, sample_shape):
        chosen = self._conditioning(hard, sample_shape)
        return _numerics.exp_concrete_conditional_sample(self.logits, self._kernel_temperature, chosen)


class Concrete(_NaryConcrete):
    r"""The Concrete distribution (paper Definition 1): a relaxed one-hot vector on the simplex.

    .. math::
        p_{\alpha,\lambda}(x) = (K-1)!\,\lambda^{K-1} \prod_{k=1}^{K}
            \frac{\alpha_k x_k^{-\lambda-1}}{\sum_{i=1}^{K} \alpha_i x_i^{-\lambda}}  \qquad (11)

    with respect to Lebesgue measure on :math:`(x_1, \dots, x_{K-1})`. Sampling is
    :math:`X = \mathrm{softmax}((\log\alpha + G)/\lambda)`, :math:`G_k` i.i.d. Gumbel (eq. 10).

    Numerics: a sample is computed in log space as an :class:`ExpConcrete` sample ``y`` and shown
    as ``x = exp(y)``, which underflows to exact zeros at low temperature; ``y`` is carried with
    ``x`` (also through ``pyro.sample``, ``poutine.trace``/``replay``, views of ``x``, and to a
    second distribution scoring it), so ``log_prob`` of a sample is finite and exact, and
    differentiable with respect to the sample as well as to the parameters. A
    :class:`ConcreteStraightThrough` sample is scored by the relaxed sample behind it. Other values
    are scored from ``log x``; at a boundary point (some ``x_k = 0``) the result is the density's
    limit, except that under validation such a value raises: the limit (+inf for a one-hot value
    at lambda < K - 1, finite at K - 1, 0 above) is the density of no sample; one-hot values are
    discrete data, scored by :meth:`discrete`.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    support = concrete_constraints.simplex

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return self._show(self._sample_coordinates(sample_shape))

    def _show(self, y):
        return show(y, Kind.LOG)

    @staticmethod
    def _indicator(hard):
        return hard > 0.5  # one-hot

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        y = carry.scoring_coordinates(value, (Kind.LOG, Kind.STRAIGHT_THROUGH_LOG), self._validate_args)
        if y is not None:  # an own sample (in the support by construction): its exact coordinates
            return _numerics.concrete_log_prob(y, self.logits, self._kernel_temperature)
        self._validate(value)
        log_x = _numerics.log(value)
        log_prob = _numerics.concrete_log_prob_at_boundary(log_x, self.logits, self._kernel_temperature)
        return self._refuse_boundary(log_x.isneginf(), log_prob, "a point of the simplex's boundary (some x_k = 0, e.g. one-hot)")

    def discrete(self) -> OneHotCategorical:
        """The zero-temperature limit (Prop. 1c) on the same sample space: a one-hot vector."""
        return OneHotCategorical(logits=self.logits, validate_args=self._validate_args)

    def log_space(self) -> "ExpConcrete":
        """The log-space node of the same variable (appendix C.3): the :class:`ExpConcrete` of
        ``log x``, with the same parameters."""
        return ExpConcrete(self._kernel_temperature, logits=self.logits, validate_args=self._validate_args)


class ExpConcrete(_NaryConcrete):
    r"""ExpConcrete (paper appendix C.3): ``Y = log X`` for ``X ~ Concrete``, a point of log Δ.

    .. math::
        \log\kappa_{\alpha,\lambda}(y) = \log (K-1)! + (K-1)\log\lambda
            + \sum_{k=1}^{K} (\log\alpha_k - \lambda y_k)
            - K \operatorname{logsumexp}_{k} (\log\alpha_k - \lambda y_k)

    Base measure: following the paper, :math:`\kappa(\log x) = p_{\mathrm{Concrete}}(x) \prod_k x_k`.
    That is the density of ``y`` with respect to the measure under which the log-ratios
    :math:`(y_1 - y_K, \dots, y_{K-1} - y_K)` are Lebesgue (equivalently
    :math:`dy_1 \cdots dy_{K-1} / x_K`, a measure symmetric in the coordinates) -- *not* a
    normalized density of the free coordinates :math:`(y_1, \dots, y_{K-1})`. KL terms and
    density ratios between ExpConcrete distributions do not depend on the base measure, which is
    why the paper uses this node as the stochastic node of a relaxed ELBO (eq. 24). The bijection
    registered for ``log_simplex`` has log-Jacobian 0 with respect to this measure, so autoguides
    are consistent with it. Points on the boundary (some ``y_k = -inf``) have log density -inf.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    support = concrete_constraints.log_simplex

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return self._show(self._sample_coordinates(sample_shape))

    def _show(self, y):
        return carry.attach(y, None, Kind.LOG_SIMPLEX)

    @staticmethod
    def _indicator(hard):
        return hard == 0  # the log of a one-hot vector

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        # an own sample is its own coordinates (NaN without validation if its memory changed): the
        # lookup spares it validation and the boundary's masks (three passes over it)
        own = carry.scoring_coordinates(value, (Kind.LOG_SIMPLEX,), self._validate_args)
        if own is not None:
            return _numerics.exp_concrete_log_prob_interior(own, self.logits, self._kernel_temperature)
        self._validate(value)
        return _numerics.exp_concrete_log_prob(value, self.logits, self._kernel_temperature)

    def discrete(self) -> ExpOneHotCategorical:
        """The zero-temperature limit on the same sample space: the log of a one-hot vector."""
        return ExpOneHotCategorical(logits=self.logits, validate_args=self._validate_args)


class _BinaryConcrete(_ConcreteFamily):
    arg_constraints = {
        "temperature": concrete_constraints.positive_finite,
        "logits": concrete_constraints.resolvable_real,
        "probs": concrete_constraints.open_unit_interval,
    }
    _event_dim = 0

    @lazy_property
    def probs(self) -> Tensor:
        return torch.sigmoid(self.logits)

    def _sample_coordinates(self, sample_shape):
        return _numerics.logit_bin_concrete_sample(
            self.logits, self._kernel_temperature, self._extended_shape(sample_shape)
        )

    def _conditional_coordinates(self, hard, sample_shape):
        ones = self._conditioning(hard, sample_shape)
        return _numerics.logit_bin_concrete_conditional_sample(self.logits, self._kernel_temperature, ones)


class BinConcrete(_BinaryConcrete):
    r"""Binary Concrete (paper Definition 2): a relaxed Bernoulli on the unit interval (0, 1).

    .. math::
        p_{\alpha,\lambda}(x) = \frac{\lambda \alpha x^{-\lambda-1} (1-x)^{-\lambda-1}}
            {(\alpha x^{-\lambda} + (1-x)^{-\lambda})^2}  \qquad (17)

    Sampling is :math:`X = \sigma((\log\alpha + L)/\lambda)`, L standard logistic (eq. 16). A
    sample is computed as its logit and shown as ``x = sigmoid(y)``, which rounds to exactly 0 or 1
    at low temperature; the logit is carried with ``x`` (see :class:`Concrete`), so ``log_prob``
    of a sample is exact. At ``x = 0`` or ``1`` exactly, other values get the density's limit
    (+inf for lambda < 1, finite at 1, 0 above), except that under validation they raise: 0/1
    values are discrete data, scored by :meth:`discrete`.
    ``cdf`` and ``icdf`` are closed form: :math:`F(x) = \sigma(\lambda\,\mathrm{logit}(x) - \log\alpha)`.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    support = concrete_constraints.unit_interval

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return self._show(self._sample_coordinates(sample_shape))

    def _show(self, y):
        return show(y, Kind.LOGIT)

    @staticmethod
    def _indicator(hard):
        return hard > 0.5  # 0 or 1

    def _logit_of(self, value):
        y = carry.scoring_coordinates(value, (Kind.LOGIT,), self._validate_args)
        return _numerics.logit(value) if y is None else y

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        y = carry.scoring_coordinates(value, (Kind.LOGIT, Kind.STRAIGHT_THROUGH_LOGIT), self._validate_args)
        if y is not None:  # an own sample (in the support by construction): its exact logit
            log_prob = _numerics.bin_concrete_log_prob(y, self.logits, self._kernel_temperature)
            # but icdf(0) and icdf(1) carry a logit of -inf / +inf: the boundary, refused as a plain 0 or 1
            return self._refuse_boundary(y.isinf(), log_prob, "an endpoint of the unit interval (x = 0 or 1)") if self._validate_args else log_prob
        self._validate(value)
        logit_x = _numerics.logit(value)
        log_prob = _numerics.bin_concrete_log_prob_at_boundary(logit_x, self.logits, self._kernel_temperature)
        return self._refuse_boundary(logit_x.isinf(), log_prob, "an endpoint of the unit interval (x = 0 or 1)")

    def cdf(self, value: Tensor) -> Tensor:
        self._validate(value)
        return torch.sigmoid(_numerics.positive(self._kernel_temperature) * self._logit_of(value) - self.logits)

    def icdf(self, value: Tensor) -> Tensor:
        y = (self.logits + _numerics.logit(value)) / _numerics.positive(self._kernel_temperature)
        return show(y, Kind.LOGIT)

    def discrete(self) -> Bernoulli:
        """The zero-temperature limit (Prop. 2c) on the same sample space: a {0, 1} Bernoulli."""
        return Bernoulli(logits=self.logits, validate_args=self._validate_args)

    def log_space(self) -> "LogitBinConcrete":
        """The logit-space node of the same variable (appendix C.3.2): the :class:`LogitBinConcrete`
        of ``logit x``, with the same parameters."""
        return LogitBinConcrete(self._kernel_temperature, logits=self.logits, validate_args=self._validate_args)


class LogitBinConcrete(_BinaryConcrete):
    r"""The logit of a BinConcrete variable (paper appendix C.3.2), a scaled logistic on R.

    .. math::
        \log g_{\alpha,\lambda}(y) = \log\lambda - \lambda y + \log\alpha
            - 2 \log(1 + \exp(-\lambda y + \log\alpha))

    Sampling is :math:`Y = (\log\alpha + L)/\lambda`; ``sigmoid(Y) ~ BinConcrete``. This is the
    node the paper recommends treating as stochastic in the binary case (eq. 27). ``cdf`` and
    ``icdf`` are closed form: :math:`G(y) = \sigma(\lambda y - \log\alpha)`.

    :param temperature: lambda > 0, a number or a tensor broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    support = concrete_constraints.real

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return self._show(self._sample_coordinates(sample_shape))

    def _show(self, y):
        return carry.attach(y, None, Kind.REAL)

    @staticmethod
    def _indicator(hard):
        return hard > 0  # -inf or +inf

    def log_prob(self, value: Tensor) -> Tensor:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        # an own sample is its own coordinates: the lookup only spares it validation
        if self._validate_args and carry.scoring_coordinates(value, (Kind.REAL,)) is None:
            self._validate(value)
        return _numerics.logit_bin_concrete_log_prob(value, self.logits, self._kernel_temperature)

    def cdf(self, value: Tensor) -> Tensor:
        self._validate(value)
        return torch.sigmoid(_numerics.positive(self._kernel_temperature) * value - self.logits)

    def icdf(self, value: Tensor) -> Tensor:
        return (self.logits + _numerics.logit(value)) / _numerics.positive(self._kernel_temperature)

    def discrete(self) -> LogitBernoulli:
        """The zero-temperature limit on the same sample space: ±inf, the logit of a Bernoulli."""
        return LogitBernoulli(logits=self.logits, validate_args=self._validate_args)
