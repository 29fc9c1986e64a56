"""Hard Concrete (Louizos, Welling & Kingma, "Learning Sparse Neural Networks through L0
Regularization", ICLR 2018): a BinConcrete stretched to (low, high) and clipped to [0, 1]."""

import numbers
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike
from numpyro.distributions import Distribution, constraints
from numpyro.util import not_jax_tracer

from concrete_common import evaluating
from concrete_common import stretch

from . import _numerics
from . import constraints as concrete_constraints
from .distributions import _BinaryConcrete
from .limits import Bernoulli

__all__ = ["HardConcrete"]


def promote_end(cls_name, name, x, like, batch_shape, validate):
    """``low`` or ``high`` as an array of the logits' dtype (differentiable, traceable, not
    broadcast), and the batch shape grown to broadcast with it.

    Booleans and non-numbers, and shapes that do not broadcast with ``batch_shape``, always raise,
    inside ``jit`` too. Values (finite, < 0 for low, > 1 for high, also after rounding to the dtype:
    ``low=-1e-50`` is ``-0.0`` in float32, ``high=1e39`` is inf) are checked when ``validate`` is on
    and they are concrete -- a Python number, a NumPy array (checked before it becomes a JAX array,
    so inside ``jit`` too) or a JAX array outside ``jit`` -- and always for a Python number, which
    costs nothing (it is checked in Python, before any array exists).
    """
    dtype = like.dtype
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)):  # the common case, checked in Python
        converted = stretch.check_number(cls_name, name, x, np.dtype(dtype).type, np.dtype(dtype).name)
        return jnp.asarray(converted, dtype=dtype), tuple(batch_shape)
    traced = not not_jax_tracer(x)
    if traced or isinstance(x, jax.Array):
        given, kind = None, x.dtype
    else:
        try:
            given = np.asarray(x)
        except Exception:
            given = np.asarray(None)
        kind = given.dtype
    if kind == jnp.bool_ or not (jnp.issubdtype(kind, jnp.floating) or jnp.issubdtype(kind, jnp.integer)):
        raise ValueError(f"{cls_name}: {name} must be a finite number {stretch.BOUNDS[name]} or an array of them, got {x!r}")
    shape = tuple(jnp.shape(x)) if given is None else given.shape
    try:
        batch_shape = stretch.broadcast_shapes(batch_shape, shape)
    except ValueError:
        raise ValueError(
            f"{cls_name}: {name} of shape {shape} does not broadcast with the batch shape {tuple(batch_shape)}; "
            f"{name} is a batch parameter (one per distribution)"
        ) from None
    if not traced and validate:
        given = np.asarray(x) if given is None else given
        with np.errstate(over="ignore", invalid="ignore"):
            stretch.check_end(cls_name, name, given, given.astype(np.dtype(dtype)), np.dtype(dtype).name)
    return jnp.asarray(x, dtype=dtype), batch_shape


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

    :param temperature: lambda > 0 (Louizos et al. use 2/3), a number or an array broadcasting with the batch shape.
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
    reparametrized_params = _BinaryConcrete.reparametrized_params + ["low", "high"]
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
        low, batch_shape = promote_end(name, "low", low, self.logits, batch_shape, self._validate_args)
        high, batch_shape = promote_end(name, "high", high, self.logits, batch_shape, self._validate_args)
        if batch_shape != self.batch_shape:  # low and high may grow the batch shape
            self.temperature = jnp.broadcast_to(self.temperature, batch_shape)
            self.logits = jnp.broadcast_to(self.logits, batch_shape)
            if "probs" in self.__dict__:
                self.probs = jnp.broadcast_to(self.probs, batch_shape)
            validate = self._validate_args
            Distribution.__init__(self, batch_shape, (), validate_args=False)
            self._validate_args = validate
        self.low, self.high = jnp.broadcast_to(low, batch_shape), jnp.broadcast_to(high, batch_shape)

    def expand(self, batch_shape: tuple[int, ...]) -> Distribution:
        new = super().expand(batch_shape)
        new.low, new.high = jnp.broadcast_to(self.low, tuple(batch_shape)), jnp.broadcast_to(self.high, tuple(batch_shape))
        return new

    def _logit_at_zero(self):
        """logit((0 - low) / (high - low)) = log(-low) - log(high): where the stretched variable is 0."""
        return jnp.log(-self.low) - jnp.log(self.high)

    def _logit_at_one(self):
        """logit((1 - low) / (high - low)) = log(1 - low) - log(high - 1): where it is 1."""
        return jnp.log1p(-self.low) - jnp.log(self.high - 1)

    def _log_width(self):
        """log(high - low), without forming high - low (which overflows for huge finite ends)."""
        return jnp.logaddexp(jnp.log(-self.low), jnp.log(self.high))

    def _stretch(self, s, one_minus_s):
        """low + (high - low) s as low (1 - s) + high s: no overflow, and accurate wherever the
        result lands in [0, 1] (low + (high - low) s loses |low| ulps there)."""
        return jnp.clip(self.low * one_minus_s + self.high * s, 0.0, 1.0)

    def sample_with_intermediates(self, key: Optional[jax.Array], sample_shape: tuple[int, ...] = ()) -> tuple[Array, list[Array]]:
        y = self._sample_coordinates(key, sample_shape)
        return self._stretch(jax.nn.sigmoid(y), jax.nn.sigmoid(-y)), []

    def _log_mass_at_zero(self):
        return -jax.nn.softplus(self.logits - _numerics.positive(self.temperature) * self._logit_at_zero())

    def _log_mass_at_one(self):
        return -jax.nn.softplus(_numerics.positive(self.temperature) * self._logit_at_one() - self.logits)

    def log_prob(self, value: ArrayLike, intermediates: Optional[list[Array]] = None) -> Array:
        evaluating.check_no_relaxed_score(type(self).__name__)
        value = jnp.asarray(value)
        self._check_value_shape(value)
        inside = jnp.clip(value, 0.0, 1.0)  # z - low > 0 and high - z > 0: finite logs
        log_above, log_below = jnp.log(inside - self.low), jnp.log(self.high - inside)
        # p(z) = g(y) dy/dz with y = log(z - low) - log(high - z), g the LogitBinConcrete density
        density = _numerics.logit_bin_concrete_log_prob(log_above - log_below, self.logits, self.temperature)
        density = density + self._log_width() - log_above - log_below
        log_prob = jnp.where(value <= 0, self._log_mass_at_zero(), jnp.where(value >= 1, self._log_mass_at_one(), density))
        log_prob = jnp.where((value < 0) | (value > 1), -jnp.inf, log_prob)
        return self._validated(value, log_prob)

    def cdf(self, value: ArrayLike) -> Array:
        value = jnp.asarray(value)
        if self._validate_args:
            self._validate_sample(value)
        inside = jnp.clip(value, 0.0, 1.0)
        below_one = jax.nn.sigmoid(_numerics.positive(self.temperature) * (jnp.log(inside - self.low) - jnp.log(self.high - inside)) - self.logits)
        return jnp.where(value >= 1, 1.0, jnp.where(value < 0, 0.0, below_one))

    @property
    def prob_nonzero(self) -> Array:
        """P(Z != 0), the expected L0 norm of the gate (Louizos et al. eq. 12)."""
        # exp(log sigmoid): its gradient p (1 - p) keeps 1 - p where p rounds to 1 (sigmoid's was 0 there)
        return jnp.exp(jax.nn.log_sigmoid(self.logits - _numerics.positive(self.temperature) * self._logit_at_zero()))

    @property
    def deterministic_gate(self) -> Array:
        """The test-time gate min(1, max(0, sigmoid(log alpha) (high - low) + low)) (Louizos et al. eq. 13)."""
        return self._stretch(jax.nn.sigmoid(self.logits), jax.nn.sigmoid(-self.logits))

    def conditional_sample(self, key: Optional[jax.Array], hard: ArrayLike, sample_shape: tuple[int, ...] = ()) -> Array:
        raise NotImplementedError(f"{type(self).__name__}: no relaxed sample given a gate's discrete value (its atoms at 0 and 1 are not a relaxation's limit)")

    def discrete(self) -> Bernoulli:
        """Whether the gate is open: Bernoulli(prob_nonzero), on {0, 1}."""
        logits = self.logits - _numerics.positive(self.temperature) * self._logit_at_zero()
        return Bernoulli(logits=logits, validate_args=self._validate_args)
