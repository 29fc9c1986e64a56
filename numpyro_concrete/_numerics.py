"""Log-space kernels of the Concrete family (paper appendix C.3 and the cheat sheet, appendix F).

Every density here takes log-space coordinates: ``y = log x`` on the simplex, ``y = logit x`` on
the unit interval. A Concrete sample at low temperature underflows to exact zeros in ``x`` but
never in ``y``, so nothing here takes the log of a value that could have underflowed.
``logits`` has the batch shape (plus the category axis); ``temperature`` broadcasts with it. (The
NumPyro distributions give it the whole batch shape, as batch parameters of a pytree.)
Boundary branches are evaluated on inputs that are finite for them, so that ``jnp.where`` never
multiplies a zero cotangent by an infinite derivative (no NaN under ``jax.grad``). The kernels are
jitted: an eager call compiles one program per shape instead of one per primitive, and inside an
outer ``jit`` they are inlined.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from concrete_common import evaluating


def uniform(key, shape, dtype):
    """U ~ Uniform(0, 1) strictly inside (0, 1).

    ``jax.random.uniform`` returns exact zeros (once in 2**23 float32 draws), which would make a
    Gumbel or logistic variate infinite; those are moved to the smallest normal number. Its largest
    value, ``1 - eps``, is already below 1.
    """
    return jnp.maximum(jax.random.uniform(key, shape, dtype), jnp.finfo(dtype).tiny)


def gumbel(key, shape, dtype):
    """G = -log(-log U), always finite (paper appendix F)."""
    return -jnp.log(-jnp.log(uniform(key, shape, dtype)))


def logistic(key, shape, dtype):
    """L = log U - log(1 - U), always finite (paper appendix F)."""
    u = uniform(key, shape, dtype)
    return jnp.log(u) - jnp.log1p(-u)


# ----------------------------------------------------------------------------- n-ary Concrete


def exp_concrete_sample(key, logits, temperature, shape):
    """:func:`_exp_concrete_sample`, refused where an exact helper runs the discrete graph."""
    evaluating.check_no_relaxed_draw("ExpConcrete")
    return _exp_concrete_sample(key, logits, temperature, shape)


@functools.partial(jax.jit, static_argnums=3)
def _exp_concrete_sample(key, logits, temperature, shape):
    """Y_k = (log a_k + G_k)/t - logsumexp_i((log a_i + G_i)/t) (appendix C.3): a point of log Δ."""
    scores = (logits + gumbel(key, shape, logits.dtype)) / temperature[..., None]
    return jax.nn.log_softmax(scores, axis=-1)


@jax.jit
def exp_concrete_conditional_sample(key, logits, temperature, chosen):
    """Y given that its limit is the one-hot ``chosen`` (a boolean mask of the chosen category,
    shaped like the sample): the top-down Gumbel construction (Tucker et al. 2017, appendix C). The
    perturbed logits z = log a + G have their maximum, distributed Gumbel(logsumexp_k log a_k),
    independent of where it is: that is z_b for the chosen b; every other z_k is Gumbel(log a_k)
    truncated below z_b, drawn by inverting its CDF: z_k = -log(exp(-z_b) + exp(-log a_k) E_k),
    E_k = -log V_k exponential. Then Y = log_softmax(z / t), as for an unconditional sample."""
    log_exponential = jnp.log(-jnp.log(uniform(key, chosen.shape, logits.dtype)))
    top = logsumexp(logits, axis=-1, keepdims=True) - jnp.where(chosen, log_exponential, 0.0).sum(-1, keepdims=True)
    below = -jnp.logaddexp(-top, log_exponential - logits)
    return jax.nn.log_softmax(jnp.where(chosen, top, below) / temperature[..., None], axis=-1)


@jax.jit
def exp_concrete_log_prob_interior(y, logits, temperature):
    """log κ(y) (appendix C.3) for y with finite entries: log (K-1)! + (K-1) log t + Σ_k b_k
    - K logsumexp_k b_k, with b_k = log a_k - t y_k.

    Computed centred, as log (K-1)! + (K-1) log t + Σ_k log_softmax(b)_k -- a sum of terms of one
    sign, where Σ_k b_k - K logsumexp_k b_k cancels (at K = 1e5, T = 1e3 the two can reach 1e9, where
    float32 values are 64 or 128 apart) -- and with b taken from y - min_k y_k: κ does not change when y is shifted,
    and at high temperature the y_k agree in their leading digits, which t y_k would scale up."""
    num_categories = y.shape[-1]
    centred = y - jax.lax.stop_gradient(y.min(-1, keepdims=True))  # >= 0, so b <= logits: no +inf in b
    b = logits - temperature[..., None] * centred
    return (
        math.lgamma(num_categories)
        + (num_categories - 1) * jnp.log(temperature)
        + jax.nn.log_softmax(b, axis=-1).sum(-1)
    )


@jax.jit
def exp_concrete_log_prob(y, logits, temperature):
    """log κ(y) for any y in log Δ: points on its boundary (some y_k = -inf) get -inf."""
    at_infinity = jnp.isneginf(y)
    result = exp_concrete_log_prob_interior(jnp.where(at_infinity, 0.0, y), logits, temperature)
    # the density of the log-ratios vanishes at infinity
    return jnp.where(at_infinity.any(-1), -jnp.inf, result)


@jax.jit
def concrete_log_prob(y, logits, temperature):
    """Concrete log density (eq. 11) at x = exp(y), for y with finite entries: log κ(y) - Σ_k y_k."""
    return exp_concrete_log_prob_interior(y, logits, temperature) - y.sum(-1)


@jax.jit
def concrete_log_prob_at_boundary(y, logits, temperature):
    """Concrete log density (eq. 11) at x = exp(y), where y may hold -inf (x_k = 0 exactly).

    At a boundary point with m zero coordinates the density has the limit reached as those
    coordinates go to 0 together: with c = m (t + 1) - K t it is +inf for c > 0, -inf for c < 0 and
    finite for c = 0 (e.g. K = 2, t = 1, or K = 3, t = 1/2), where it is
    log (K-1)! + (K-1) log t + Σ_k log a_k - (t+1) Σ_{x_k>0} y_k - K logsumexp_{x_k=0} log a_k.
    Gradients stay finite: every branch is evaluated on inputs that are finite for it.
    """
    num_categories = y.shape[-1]
    t = temperature
    zero = jnp.isneginf(y)
    num_zero = zero.sum(-1)
    on_boundary = num_zero > 0
    y_inside = jnp.where(zero, 0.0, y)
    interior = concrete_log_prob(y_inside, logits, t)

    # log-sum-exp of the logits of the zero coordinates, only on rows that have some
    logits_of_zeros = jnp.where(zero, logits, -jnp.inf)
    logits_of_zeros = jnp.where(on_boundary[..., None], logits_of_zeros, 0.0)
    finite_limit = (  # Σ_k log a_k - K logsumexp, centred as a sum of differences
        math.lgamma(num_categories)
        + (num_categories - 1) * jnp.log(t)
        + (logits - logsumexp(logits_of_zeros, axis=-1, keepdims=True)).sum(-1)
        - (t + 1) * y_inside.sum(-1)
    )
    slope = num_zero * (t + 1) - num_categories * t
    limit = jnp.where(slope > 0, jnp.inf, jnp.where(slope < 0, -jnp.inf, finite_limit))
    return jnp.where(on_boundary, limit, interior)


# ----------------------------------------------------------------------------- binary Concrete


def logit_bin_concrete_sample(key, logits, temperature, shape):
    """:func:`_logit_bin_concrete_sample`, refused where an exact helper runs the discrete graph."""
    evaluating.check_no_relaxed_draw("BinConcrete")
    return _logit_bin_concrete_sample(key, logits, temperature, shape)


@functools.partial(jax.jit, static_argnums=3)
def _logit_bin_concrete_sample(key, logits, temperature, shape):
    """Y = (log a + L)/t (eq. 26): the logit of a BinConcrete sample."""
    return (logits + logistic(key, shape, logits.dtype)) / temperature


@jax.jit
def logit_bin_concrete_conditional_sample(key, logits, temperature, ones):
    """Y given that its limit is ``ones`` (a boolean, shaped like the sample): z = log a + L with the
    logistic L conditioned on the sign of z, by inverting its CDF on U = V (1 - p) (z < 0) or
    1 - p (1 - V) (z > 0), p = sigmoid(log a); written in logs so that no probability rounds to 0
    or 1 (the logaddexp terms are log(1 - p(1 - V)) and log(1 - V(1 - p))). Then Y = z / t."""
    v = uniform(key, ones.shape, logits.dtype)
    log_v, log1m_v = jnp.log(v), jnp.log1p(-v)
    log_p, log1m_p = jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)
    positive = jax.nn.softplus(logits) - log1m_v + jnp.logaddexp(log1m_p, log_p + log_v)
    negative = log_v - jax.nn.softplus(-logits) - jnp.logaddexp(log1m_v, log_v + log_p)
    return jnp.where(ones, positive, negative) / temperature

@jax.jit
def logit_bin_concrete_log_prob(y, logits, temperature):
    """log g(y) = log t + s - 2 log(1 + exp(s)), s = log a - t y (appendix C.3.2).

    Written as log t - |s| - 2 log1p(exp(-|s|)), which is exact for every s and gives -inf (not
    inf - inf) at y = ±inf.
    """
    s = jnp.abs(logits - temperature * y)
    return jnp.log(temperature) - s - 2 * jnp.log1p(jnp.exp(-s))


@jax.jit
def bin_concrete_log_prob(y, logits, temperature):
    """BinConcrete log density (eq. 17) at x = sigmoid(y), y finite: log g(y) - log x - log(1 - x),
    where -log x - log(1 - x) = |y| + 2 log1p(exp(-|y|))."""
    abs_y = jnp.abs(y)
    return logit_bin_concrete_log_prob(y, logits, temperature) + abs_y + 2 * jnp.log1p(jnp.exp(-abs_y))


@jax.jit
def bin_concrete_log_prob_at_boundary(y, logits, temperature):
    """BinConcrete log density (eq. 17) at x = sigmoid(y), where y may be ±inf (x = 0 or 1 exactly).

    Near either end the density behaves like x^(t-1) (resp. (1-x)^(t-1)): the limit is +inf for
    t < 1, -inf for t > 1, and for t = 1 it is log a at x = 1 and -log a at x = 0.
    """
    at_end = jnp.isinf(y)
    interior = bin_concrete_log_prob(jnp.where(at_end, 0.0, y), logits, temperature)
    finite_limit = jnp.log(temperature) + jnp.sign(y) * logits
    limit = jnp.where(temperature < 1, jnp.inf, jnp.where(temperature > 1, -jnp.inf, finite_limit))
    return jnp.where(at_end, limit, interior)


def positive(temperature):
    """The temperature, NaN where it is not positive: a temperature that validation could not read
    (traced: a learned one gone negative inside ``jit``) makes what the cdf, icdf and Hard Concrete's
    point masses compute from it NaN, as the densities' log(temperature) does, not finite numbers of
    no distribution (P(Z = 0) + P(Z = 1) = 1.83 at temperature -1)."""
    return jnp.where(temperature > 0, temperature, jnp.nan)


@jax.jit
def log(x):
    """log x, -inf at x = 0 with a zero (not NaN) gradient there, so that a value on the boundary
    cannot poison the gradients of a batch (e.g. under a mask) through 0 * inf."""
    zero = x == 0
    return jnp.where(zero, -jnp.inf, jnp.log(jnp.where(zero, 1.0, x)))


@jax.jit
def logit(x):
    """log x - log(1 - x), exact for float x in [0, 1]: ±inf at the ends, with a zero gradient there."""
    end = (x == 0) | (x == 1)
    inside = jnp.where(end, 0.5, x)
    return jnp.where(end, jnp.where(x == 0, -jnp.inf, jnp.inf), jnp.log(inside) - jnp.log1p(-inside))


def floating(value, like):
    """A value of integer or bool dtype (``jax.nn.one_hot``'s of an int dtype, a label) in ``like``'s
    dtype, so that it meets the distributions' own checks (the boundary's message) rather than a
    host's error about its dtype; anything else as given."""
    if hasattr(value, "dtype") and not jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.asarray(value, like.dtype)
    return value
