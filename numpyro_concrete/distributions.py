"""The Concrete family (Maddison, Mnih & Teh, ICLR 2017) as NumPyro distributions.

All four share the constructor ``X(temperature, logits=None, probs=None, validate_args=None)``:
exactly one of ``logits`` (log alpha, unnormalized allowed) or ``probs``; ``temperature`` a Python
number or an array whose shape broadcasts with the batch shape and is part of it.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike
from numpyro.distributions import Distribution
from numpyro.distributions.util import lazy_property
from numpyro.util import not_jax_tracer

from concrete_common import evaluating
from concrete_common.kinds import Kind
from concrete_common import messages
from concrete_common.messages import boundary_value_message

from . import _numerics
from . import constraints as concrete_constraints
from ._carry import carry
from ._checks import ValidatedValues, promote_params, validation_enabled
from .limits import Bernoulli, ExpOneHotCategorical, LogitBernoulli, OneHotCategorical

__all__ = ["Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"]


def _check_expand(shape, new_shape):
    """NumPyro's rule and error for expanding a batch shape (``ExpandedDistribution``'s)."""
    fits = len(new_shape) >= len(shape) and all(
        old in (1, new) for old, new in zip(reversed(shape), reversed(new_shape))
    )
    if not fits:
        raise ValueError(f"Cannot broadcast distribution of shape {shape} to shape {new_shape}")


class _ConcreteFamily(ValidatedValues, Distribution):
    """Parameters, shapes and ``expand`` shared by the four distributions."""

    temperature: Array  # lambda, broadcastable to the batch shape
    logits: Array  # log alpha, of shape batch_shape + event_shape

    reparametrized_params = ["temperature", "logits", "probs"]
    _event_dim: Optional[int] = None  # 1 for the n-ary distributions, 0 for the binary ones

    def __init__(
        self,
        temperature: ArrayLike,
        logits: Optional[ArrayLike] = None,
        probs: Optional[ArrayLike] = None,
        validate_args: Optional[bool] = None,
    ) -> None:
        validate = validation_enabled(validate_args)
        self.temperature, self.logits, promoted_probs, batch_shape = promote_params(
            type(self).__name__, temperature, logits, probs, self._event_dim, validate
        )
        if promoted_probs is not None:
            self.probs = promoted_probs
        event_shape = tuple(jnp.shape(self.logits)[-1:]) if self._event_dim else ()
        super().__init__(batch_shape, event_shape, validate_args=False)
        self._validate_args = validate

    def expand(self, batch_shape: tuple[int, ...]) -> Distribution:
        # the same class with broadcast parameters (not ExpandedDistribution), so that the sample a
        # plate draws is the very object that carries its log coordinates
        batch_shape = tuple(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        _check_expand(self.batch_shape, batch_shape)
        new = type(self).__new__(type(self))
        new.temperature = jnp.broadcast_to(self.temperature, batch_shape)
        new.logits = jnp.broadcast_to(self.logits, batch_shape + self.event_shape)
        if "probs" in self.__dict__:
            new.probs = jnp.broadcast_to(self.probs, batch_shape + self.event_shape)
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def sample(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> Array:
        return self.sample_with_intermediates(key, sample_shape)[0]

    def _check_key(self, key):
        if key is None:
            raise ValueError(
                f"{type(self).__name__}.sample: key is None; the sampler needs a PRNG key (run the model under "
                "numpyro.handlers.seed). Predictive(..., infer_discrete=True) runs the model without one and "
                "enumerates only discrete sites: to sample the discrete graph of a relaxed model from its exact "
                "posterior, pass it discrete(model, mode='enumerate') (the result holds the enumerated indices)"
            )

    @staticmethod
    def _carried(value, kinds, intermediates=None):
        """The sampler's log-space coordinates of ``value``: its ``intermediates`` where NumPyro
        passes them, else the carry's (see ``_carry``); None for a value that is not an own sample."""
        if intermediates:
            # the site's own value, scored with its intermediates (the guide's site, first in
            # Trace_ELBO): carried from here too, for the model's prior that scores the same value.
            # Inside ``scan`` this is the one route: the stacked value is not the body's sample
            carry.attach(value, intermediates[0], kinds[0])
            return intermediates[0]
        return carry.recall(value, kinds)

    def _validated(self, value, log_prob):
        """``log_prob`` of a value that is not an own sample, under validation -inf off the support
        (NumPyro's ``@validate_sample``; a concrete value off the support raises)."""
        if self._validate_args:
            return jnp.where(self._validate_sample(value), log_prob, -jnp.inf)
        return log_prob

    def conditional_sample(self, key: Optional[jax.Array], hard: ArrayLike, sample_shape: tuple[int, ...] = ()) -> Array:
        """A relaxed sample given its zero-temperature limit ``hard`` (a value of :meth:`discrete`,
        e.g. its sample): z ~ p(z | H(z) = hard), the building block of REBAR, RELAX and Gumbel-Rao --
        by the top-down Gumbel construction (n-ary) or the logistic noise truncated to the side of 0
        that ``hard`` gives (binary), in log space and exact at low temperature; reparameterized, and
        carried like any own sample. Shape ``sample_shape`` + the broadcast of ``hard`` with the batch
        and event shape. Pooled over ``hard`` drawn from :meth:`discrete`, these are samples of the
        distribution."""
        return self._show(self._conditional_coordinates(key, hard, sample_shape))

    def _show(self, y):
        """The value of relaxed coordinates y (log x, logit x, or the log-space node's own), carried."""
        raise NotImplementedError

    @staticmethod
    def _indicator(hard):
        """The limit's value as a boolean: the chosen category (n-ary) or the ones (binary)."""
        raise NotImplementedError

    def _conditioning(self, hard, sample_shape):
        """``hard`` (a value of the limit) as the boolean of the conditional sample's shape:
        ``sample_shape`` + its broadcast with the batch and event shape; checked under validation
        where its values can be read (not a tracer)."""
        owner = f"{type(self).__name__}.conditional_sample"
        hard = jnp.asarray(hard, dtype=self.logits.dtype)
        if self._validate_args and not_jax_tracer(hard):
            limit = self.discrete()
            with jax.ensure_compile_time_eval():  # a concrete value inside jit too
                in_support = np.all(np.asarray(limit.support(hard)))
            if not in_support:
                raise messages.not_a_limit_value(owner, type(limit).__name__)
        full = tuple(self.batch_shape) + tuple(self.event_shape)
        try:
            shape = tuple(sample_shape) + tuple(jnp.broadcast_shapes(jnp.shape(hard), full))
        except ValueError:
            raise messages.hard_shape_mismatch(owner, jnp.shape(hard), full) from None
        return jnp.broadcast_to(self._indicator(hard), shape)

    def _refuse_boundary(self, on_boundary, log_prob, boundary):
        """``log_prob`` of a value that is not an own sample; under validation, a concrete (not
        traced) value with a point on the boundary of the support (``on_boundary``, elementwise)
        raises: the density there is only a limit, which no sample has (discrete data, a copied,
        underflowed or straight-through sample). Under ``jit`` the value is a tracer and the limit
        is returned."""
        if self._validate_args and not_jax_tracer(on_boundary) and np.any(np.asarray(on_boundary)):
            raise ValueError(boundary_value_message(type(self).__name__, boundary, type(self.discrete()).__name__, untraced=True))
        return log_prob


class _NaryConcrete(_ConcreteFamily):
    arg_constraints = {
        "temperature": concrete_constraints.positive_finite,
        "logits": concrete_constraints.resolvable_real_vector,
        "probs": concrete_constraints.positive_simplex,
    }
    _event_dim = 1

    @lazy_property
    def probs(self) -> Array:
        return jax.nn.softmax(self.logits, axis=-1)

    @classmethod
    def infer_shapes(
        cls, temperature: tuple[int, ...] = (), logits: Optional[tuple[int, ...]] = None, probs: Optional[tuple[int, ...]] = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(batch_shape, event_shape) of a distribution built from arguments of these shapes."""
        param = tuple(logits if logits is not None else probs or ())
        return tuple(jnp.broadcast_shapes(tuple(temperature), param[:-1])), param[-1:]

    def _sample_coordinates(self, key, sample_shape):
        self._check_key(key)
        return _numerics.exp_concrete_sample(key, self.logits, self.temperature, self.shape(sample_shape))

    def _conditional_coordinates(self, key, hard, sample_shape):
        self._check_key(key)
        chosen = self._conditioning(hard, sample_shape)
        return _numerics.exp_concrete_conditional_sample(key, self.logits, self.temperature, chosen)


class Concrete(_NaryConcrete):
    r"""The Concrete distribution (paper Definition 1): a relaxed one-hot vector on the simplex.

    .. math::
        p_{\alpha,\lambda}(x) = (K-1)!\,\lambda^{K-1} \prod_{k=1}^{K}
            \frac{\alpha_k x_k^{-\lambda-1}}{\sum_{i=1}^{K} \alpha_i x_i^{-\lambda}}  \qquad (11)

    with respect to Lebesgue measure on :math:`(x_1, \dots, x_{K-1})`. Sampling is
    :math:`X = \mathrm{softmax}((\log\alpha + G)/\lambda)`, :math:`G_k` i.i.d. Gumbel (eq. 10).

    Numerics: a sample is computed in log space as an :class:`ExpConcrete` sample ``y`` and shown
    as ``x = exp(y)``, which underflows to exact zeros at low temperature; ``y`` is carried with
    ``x`` (as NumPyro ``intermediates`` for the site that drew it, and, inside a traced computation
    -- ``jit``, ``grad``, ``vmap``, every SVI step -- by identity to the model's replayed site and
    any other distribution scoring it), so ``log_prob`` of a sample is finite and exact. A
    :class:`ConcreteStraightThrough` sample is scored by the relaxed sample behind it. Other values
    (eager arrays without their intermediates included) are scored from ``log x``; at a boundary
    point (some ``x_k = 0``) the result is the density's limit, except that under validation such
    a concrete (not traced) value raises: the limit (+inf for a one-hot value at lambda < K - 1,
    finite at K - 1, 0 above) is the density of no sample; one-hot values are discrete data,
    scored by :meth:`discrete`.

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    support = concrete_constraints.simplex

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        y = self._sample_coordinates(key, sample_shape)
        return self._show(y), [y]

    def _show(self, y):
        return carry.attach(jnp.exp(y), y, Kind.LOG)

    @staticmethod
    def _indicator(hard):
        return hard > 0.5  # one-hot

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        self._check_value_shape(value)
        y = self._carried(value, (Kind.LOG, Kind.STRAIGHT_THROUGH_LOG), intermediates)
        if y is not None:  # an own sample (in the support by construction): its exact coordinates
            return _numerics.concrete_log_prob(y, self.logits, self.temperature)
        log_x = _numerics.log(value)
        log_prob = _numerics.concrete_log_prob_at_boundary(log_x, self.logits, self.temperature)
        log_prob = self._validated(value, log_prob)
        return self._refuse_boundary(log_x == -jnp.inf, log_prob, "a point of the simplex's boundary (some x_k = 0, e.g. one-hot)")

    def discrete(self) -> OneHotCategorical:
        """The zero-temperature limit (Prop. 1c) on the same sample space: a one-hot vector."""
        return OneHotCategorical(logits=self.logits, validate_args=self._validate_args)

    def log_space(self) -> "ExpConcrete":
        """The log-space node of the same variable (appendix C.3): the :class:`ExpConcrete` of
        ``log x``, with the same parameters."""
        return ExpConcrete(self.temperature, logits=self.logits, validate_args=self._validate_args)


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

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha, shape ``batch_shape + (K,)``, K >= 2; unnormalized allowed.
    :param probs: alpha / sum(alpha) instead of ``logits``; entries positive (one may round to 1).
    """

    support = concrete_constraints.log_simplex

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        return self._show(self._sample_coordinates(key, sample_shape)), []

    def _show(self, y):
        return carry.attach(y, None, Kind.LOG_SIMPLEX)

    @staticmethod
    def _indicator(hard):
        return hard == 0  # the log of a one-hot vector

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        self._check_value_shape(value)
        if self._carried(value, (Kind.LOG_SIMPLEX,)) is not None:  # an own sample: no -inf entries
            return _numerics.exp_concrete_log_prob_interior(value, self.logits, self.temperature)
        return self._validated(value, _numerics.exp_concrete_log_prob(value, self.logits, self.temperature))

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
    def probs(self) -> Array:
        return jax.nn.sigmoid(self.logits)

    def _sample_coordinates(self, key, sample_shape):
        self._check_key(key)
        return _numerics.logit_bin_concrete_sample(key, self.logits, self.temperature, self.shape(sample_shape))

    def _conditional_coordinates(self, key, hard, sample_shape):
        self._check_key(key)
        ones = self._conditioning(hard, sample_shape)
        return _numerics.logit_bin_concrete_conditional_sample(key, self.logits, self.temperature, ones)


class BinConcrete(_BinaryConcrete):
    r"""Binary Concrete (paper Definition 2): a relaxed Bernoulli on the unit interval (0, 1).

    .. math::
        p_{\alpha,\lambda}(x) = \frac{\lambda \alpha x^{-\lambda-1} (1-x)^{-\lambda-1}}
            {(\alpha x^{-\lambda} + (1-x)^{-\lambda})^2}  \qquad (17)

    Sampling is :math:`X = \sigma((\log\alpha + L)/\lambda)`, L standard logistic (eq. 16). A
    sample is computed as its logit and shown as ``x = sigmoid(y)``, which rounds to exactly 0 or 1
    at low temperature; the logit is carried with ``x`` (see :class:`Concrete`), so ``log_prob``
    of a sample is exact. At ``x = 0`` or ``1`` exactly, other values get the density's limit
    (+inf for lambda < 1, finite at 1, 0 above), except that under validation a concrete (not
    traced) one raises: 0/1 values are discrete data, scored by :meth:`discrete`.
    ``cdf`` and ``icdf`` are closed form: :math:`F(x) = \sigma(\lambda\,\mathrm{logit}(x) - \log\alpha)`.

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    support = concrete_constraints.unit_interval

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        y = self._sample_coordinates(key, sample_shape)
        return self._show(y), [y]

    def _show(self, y):
        return carry.attach(jax.nn.sigmoid(y), y, Kind.LOGIT)

    @staticmethod
    def _indicator(hard):
        return hard > 0.5  # 0 or 1

    def _logit_of(self, value):
        y = carry.recall(value, (Kind.LOGIT,))
        return _numerics.logit(value) if y is None else y

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        self._check_value_shape(value)
        y = self._carried(value, (Kind.LOGIT, Kind.STRAIGHT_THROUGH_LOGIT), intermediates)
        if y is not None:  # an own sample (in the support by construction): its exact logit
            return _numerics.bin_concrete_log_prob(y, self.logits, self.temperature)
        logit_x = _numerics.logit(value)
        log_prob = _numerics.bin_concrete_log_prob_at_boundary(logit_x, self.logits, self.temperature)
        log_prob = self._validated(value, log_prob)
        return self._refuse_boundary(jnp.isinf(logit_x), log_prob, "an endpoint of the unit interval (x = 0 or 1)")

    def cdf(self, value: ArrayLike) -> Array:
        if self._validate_args:
            self._validate_sample(value)
        return jax.nn.sigmoid(_numerics.positive(self.temperature) * self._logit_of(value) - self.logits)

    def icdf(self, value: ArrayLike) -> Array:
        y = (self.logits + _numerics.logit(value)) / _numerics.positive(self.temperature)
        return carry.attach(jax.nn.sigmoid(y), y, Kind.LOGIT)

    def discrete(self) -> Bernoulli:
        """The zero-temperature limit (Prop. 2c) on the same sample space: a {0, 1} Bernoulli."""
        return Bernoulli(logits=self.logits, validate_args=self._validate_args)

    def log_space(self) -> "LogitBinConcrete":
        """The logit-space node of the same variable (appendix C.3.2): the :class:`LogitBinConcrete`
        of ``logit x``, with the same parameters."""
        return LogitBinConcrete(self.temperature, logits=self.logits, validate_args=self._validate_args)


class LogitBinConcrete(_BinaryConcrete):
    r"""The logit of a BinConcrete variable (paper appendix C.3.2), a scaled logistic on R.

    .. math::
        \log g_{\alpha,\lambda}(y) = \log\lambda - \lambda y + \log\alpha
            - 2 \log(1 + \exp(-\lambda y + \log\alpha))

    Sampling is :math:`Y = (\log\alpha + L)/\lambda`; ``sigmoid(Y) ~ BinConcrete``. This is the
    node the paper recommends treating as stochastic in the binary case (eq. 27). ``cdf`` and
    ``icdf`` are closed form: :math:`G(y) = \sigma(\lambda y - \log\alpha)`.

    :param temperature: lambda > 0, a number or an array broadcasting with the batch shape.
    :param logits: log alpha (the log-odds), any shape.
    :param probs: alpha / (1 + alpha) instead of ``logits``, strictly inside (0, 1).
    """

    support = concrete_constraints.real

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        return self._show(self._sample_coordinates(key, sample_shape)), []

    def _show(self, y):
        return carry.attach(y, None, Kind.REAL)

    @staticmethod
    def _indicator(hard):
        return hard > 0  # -inf or +inf

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = _numerics.floating(value, self.logits)  # an integer one-hot label: the boundary's message
        self._check_value_shape(value)
        log_prob = _numerics.logit_bin_concrete_log_prob(value, self.logits, self.temperature)
        if self._carried(value, (Kind.REAL,)) is not None:  # an own sample
            return log_prob
        return self._validated(value, log_prob)

    def cdf(self, value: ArrayLike) -> Array:
        if self._validate_args:
            self._validate_sample(value)
        return jax.nn.sigmoid(_numerics.positive(self.temperature) * value - self.logits)

    def icdf(self, value: ArrayLike) -> Array:
        return (self.logits + _numerics.logit(value)) / _numerics.positive(self.temperature)

    def discrete(self) -> LogitBernoulli:
        """The zero-temperature limit on the same sample space: ±inf, the logit of a Bernoulli."""
        return LogitBernoulli(logits=self.logits, validate_args=self._validate_args)
