"""Log-space kernels of the Concrete family (paper appendix C.3 and the cheat sheet, appendix F).

Every density here takes log-space coordinates: ``y = log x`` on the simplex, ``y = logit x`` on
the unit interval. A Concrete sample at low temperature underflows to exact zeros in ``x`` but
never in ``y``, so nothing here takes the log of a value that could have underflowed.
``logits`` has the batch shape (plus the category axis); ``temperature`` broadcasts with it, or is
a Python float (a number given to a distribution, already rounded to the logits' dtype): the
kernels then take torch's scalar arguments, and no kernel makes or reads a temperature tensor.
Boundary branches are evaluated on inputs that are finite for them, so that ``torch.where`` never
multiplies a zero gradient by an infinite derivative (no NaN in backward).
"""

import math

import torch
import torch.nn.functional as F

from concrete_common import evaluating

from ._tracing import quiet_under_trace


def uniform(shape, like):
    """U ~ Uniform(0, 1) strictly inside (0, 1).

    ``torch.rand`` returns exact zeros (once in 2**24 float32 draws), which would make a Gumbel or
    logistic variate infinite; those are moved to the smallest normal number. Its largest value,
    ``1 - eps/2``, is already below 1.
    """
    u = torch.rand(shape, dtype=like.dtype, device=like.device)
    return u.clamp(min=torch.finfo(like.dtype).tiny)  # not clamp_: torch.func.vmap has no rule for it


def gumbel(shape, like):
    """G = -log(-log U), always finite (paper appendix F)."""
    return uniform(shape, like).log_().neg_().log_().neg_()


def logistic(shape, like):
    """L = log U - log(1 - U), always finite (paper appendix F)."""
    u = uniform(shape, like)
    return u.log() - torch.log1p(-u)


# ----------------------------------------------------------------------------- n-ary Concrete


def _per_category(temperature):
    """The temperature against the category axis."""
    return temperature if isinstance(temperature, float) or temperature.dim() == 0 else temperature.unsqueeze(-1)


def _log(temperature):
    return math.log(temperature) if isinstance(temperature, float) else temperature.log()


def _as_tensor(temperature, like):
    """A float temperature as a 0-dim tensor of ``like``'s dtype (the boundary formulas compare
    expressions of it exactly, in that dtype)."""
    if isinstance(temperature, float):
        return torch.full((), temperature, dtype=like.dtype, device=like.device)
    return temperature


@quiet_under_trace
def log_softmax(scores):
    """log_softmax along the last axis. torch's CPU kernel is vectorized along that axis only from
    16 entries on; below, the same algorithm in plain ops is faster (forward and backward).
    The shift by the maximum needs no gradient: the result does not depend on it."""
    if scores.shape[-1] >= 16 or scores.device.type != "cpu":
        return torch.log_softmax(scores, dim=-1)
    shifted = scores - scores.detach().amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def exp_concrete_sample(logits, temperature, shape):
    """Y_k = (log a_k + G_k)/t - logsumexp_i((log a_i + G_i)/t) (appendix C.3): a point of log Δ."""
    evaluating.check_no_relaxed_draw("ExpConcrete")
    scores = (logits + gumbel(shape, logits)) / _per_category(temperature)
    return log_softmax(scores)


def exp_concrete_conditional_sample(logits, temperature, chosen):
    """Y given that its limit is the one-hot ``chosen`` (a boolean mask of the chosen category,
    shaped like the sample): the top-down Gumbel construction (Tucker et al. 2017, appendix C). The
    perturbed logits z = log a + G have their maximum, distributed Gumbel(logsumexp_k log a_k),
    independent of where it is: that is z_b for the chosen b; every other z_k is Gumbel(log a_k)
    truncated below z_b, drawn by inverting its CDF: z_k = -log(exp(-z_b) + exp(-log a_k) E_k),
    E_k = -log V_k exponential. Then Y = log_softmax(z / t), as for an unconditional sample."""
    log_exponential = torch.log(-torch.log(uniform(chosen.shape, logits)))
    top = logits.logsumexp(-1, keepdim=True) - torch.where(chosen, log_exponential, 0.0).sum(-1, keepdim=True)
    below = -torch.logaddexp(-top, log_exponential - logits)
    return log_softmax(torch.where(chosen, top, below) / _per_category(temperature))


@quiet_under_trace
def exp_concrete_log_prob_interior(y, logits, temperature):
    """log κ(y) (appendix C.3) for y with finite entries: log (K-1)! + (K-1) log t + Σ_k b_k
    - K logsumexp_k b_k, with b_k = log a_k - t y_k.

    Computed centred, as log (K-1)! + (K-1) log t + Σ_k log_softmax(b)_k -- a sum of terms of one
    sign, where Σ_k b_k - K logsumexp_k b_k cancels (at K = 1e5, T = 1e3 the two can reach 1e9, where
    float32 values are 64 or 128 apart) -- and with b taken from y - min_k y_k: κ does not change when y is shifted,
    and at high temperature the y_k agree in their leading digits, which t y_k would scale up."""
    num_categories = y.shape[-1]
    centred = y - y.detach().amin(-1, keepdim=True)  # >= 0, so b <= logits: no +inf in b
    b = logits - _per_category(temperature) * centred
    return math.lgamma(num_categories) + (num_categories - 1) * _log(temperature) + log_softmax(b).sum(-1)


def exp_concrete_log_prob(y, logits, temperature):
    """log κ(y) for any y in log Δ: points on its boundary (some y_k = -inf) get -inf."""
    at_infinity = torch.isneginf(y)
    result = exp_concrete_log_prob_interior(y.masked_fill(at_infinity, 0.0), logits, temperature)
    # the density of the log-ratios vanishes at infinity
    return result.masked_fill(at_infinity.any(-1), -math.inf)


def concrete_log_prob(y, logits, temperature):
    """Concrete log density (eq. 11) at x = exp(y), for y with finite entries: log κ(y) - Σ_k y_k."""
    return exp_concrete_log_prob_interior(y, logits, temperature) - y.sum(-1)


def concrete_log_prob_at_boundary(y, logits, temperature):
    """Concrete log density (eq. 11) at x = exp(y), where y may hold -inf (x_k = 0 exactly).

    At a boundary point with m zero coordinates the density has the limit reached as those
    coordinates go to 0 together: with c = m (t + 1) - K t it is +inf for c > 0, -inf for c < 0 and
    finite for c = 0 (e.g. K = 2, t = 1, or K = 3, t = 1/2), where it is
    log (K-1)! + (K-1) log t + Σ_k log a_k - (t+1) Σ_{x_k>0} y_k - K logsumexp_{x_k=0} log a_k.
    Gradients stay finite: every branch is evaluated on inputs that are finite for it.
    """
    num_categories = y.shape[-1]
    t = _as_tensor(temperature, y)
    zero = torch.isneginf(y)
    num_zero = zero.sum(-1)
    on_boundary = num_zero > 0
    y_inside = y.masked_fill(zero, 0.0)
    interior = concrete_log_prob(y_inside, logits, t)

    # log-sum-exp of the logits of the zero coordinates, only on rows that have some
    zero_rows = zero & on_boundary.unsqueeze(-1)
    logits_of_zeros = torch.where(zero_rows, logits, -math.inf)
    logits_of_zeros = torch.where(on_boundary.unsqueeze(-1), logits_of_zeros, 0.0)
    finite_limit = (  # Σ_k log a_k - K logsumexp, centred as a sum of differences
        math.lgamma(num_categories)
        + (num_categories - 1) * t.log()
        + (logits - logits_of_zeros.logsumexp(-1, keepdim=True)).sum(-1)
        - (t + 1) * y_inside.sum(-1)
    )
    slope = num_zero * (t + 1) - num_categories * t
    limit = torch.where(slope > 0, math.inf, torch.where(slope < 0, -math.inf, finite_limit))
    return torch.where(on_boundary, limit, interior)


# ----------------------------------------------------------------------------- binary Concrete


def logit_bin_concrete_sample(logits, temperature, shape):
    """Y = (log a + L)/t (eq. 26): the logit of a BinConcrete sample."""
    evaluating.check_no_relaxed_draw("BinConcrete")
    return (logits + logistic(shape, logits)) / temperature


def logit_bin_concrete_conditional_sample(logits, temperature, ones):
    """Y given that its limit is ``ones`` (a boolean, shaped like the sample): z = log a + L with the
    logistic L conditioned on the sign of z, by inverting its CDF on U = V (1 - p) (z < 0) or
    1 - p (1 - V) (z > 0), p = sigmoid(log a); written in logs so that no probability rounds to 0
    or 1 (the logaddexp terms are log(1 - p(1 - V)) and log(1 - V(1 - p))). Then Y = z / t."""
    v = uniform(ones.shape, logits)
    log_v, log1m_v = torch.log(v), torch.log1p(-v)
    log_p, log1m_p = F.logsigmoid(logits), F.logsigmoid(-logits)
    positive = softplus(logits) - log1m_v + torch.logaddexp(log1m_p, log_p + log_v)
    negative = log_v - softplus(-logits) - torch.logaddexp(log1m_v, log_v + log_p)
    return torch.where(ones, positive, negative) / temperature


def logit_bin_concrete_log_prob(y, logits, temperature):
    """log g(y) = log t + s - 2 log(1 + exp(s)), s = log a - t y (appendix C.3.2).

    Written as log t - |s| - 2 log1p(exp(-|s|)), which is exact for every s and gives -inf (not
    inf - inf) at y = ±inf.
    """
    s = _abs(logits - temperature * y)
    return _log(temperature) - s - 2 * torch.log1p(torch.exp(-s))


def _abs(x):
    """|x| whose derivative at 0 is 1, not torch's sgn(0) = 0: the functions of |x| here are even and
    smooth at 0, and torch's 0 dropped their curvature there from second derivatives (a Hessian,
    ``AutoLaplaceApproximation``'s covariance, at a binary density's centre)."""
    return torch.where(x >= 0, x, -x)


def bin_concrete_log_prob(y, logits, temperature):
    """BinConcrete log density (eq. 17) at x = sigmoid(y), y finite: log g(y) - log x - log(1 - x),
    where -log x - log(1 - x) = |y| + 2 log1p(exp(-|y|))."""
    abs_y = _abs(y)
    return logit_bin_concrete_log_prob(y, logits, temperature) + abs_y + 2 * torch.log1p(torch.exp(-abs_y))


def bin_concrete_log_prob_at_boundary(y, logits, temperature):
    """BinConcrete log density (eq. 17) at x = sigmoid(y), where y may be ±inf (x = 0 or 1 exactly).

    Near either end the density behaves like x^(t-1) (resp. (1-x)^(t-1)): the limit is +inf for
    t < 1, -inf for t > 1, and for t = 1 it is log a at x = 1 and -log a at x = 0.
    """
    at_end = torch.isinf(y)
    temperature = _as_tensor(temperature, y)
    interior = bin_concrete_log_prob(y.masked_fill(at_end, 0.0), logits, temperature)
    finite_limit = temperature.log() + torch.sign(y) * logits
    limit = torch.where(
        temperature < 1, math.inf, torch.where(temperature > 1, -math.inf, finite_limit)
    )
    return torch.where(at_end, limit, interior)


def softplus(x):
    """log(1 + e^x), to the last bit in every dtype: torch's ``softplus`` returns x itself above its
    default threshold of 20, where log(1 + e^x) exceeds x by up to 2e-9 -- below float32's rounding
    of such x, not float64's (whose threshold here is 40, where e^-40 is below half an ulp of x)."""
    return F.softplus(x, threshold=40.0 if x.dtype == torch.float64 else 20.0)


def positive(temperature):
    """The temperature, NaN where it is not positive: a temperature that validation did not read
    (off: a learned one gone negative) makes what the cdf, icdf and Hard Concrete's point masses
    compute from it NaN, as the densities' log(temperature) does, not finite numbers of no
    distribution (P(Z = 0) + P(Z = 1) = 1.82 at temperature -1)."""
    if isinstance(temperature, torch.Tensor):
        return torch.where(temperature > 0, temperature, torch.full_like(temperature, math.nan))
    return temperature if temperature > 0 else math.nan


def log(x):
    """log x, -inf at x = 0 with a zero (not NaN) gradient there, so that a value on the boundary
    cannot poison the gradients of a batch (e.g. under a mask) through 0 * inf."""
    zero = x == 0
    return torch.log(x.masked_fill(zero, 1.0)).masked_fill(zero, -math.inf)


def logit(x):
    """log x - log(1 - x), exact for float x in [0, 1]: ±inf at the ends, with a zero gradient there."""
    end = (x == 0) | (x == 1)
    inside = x.masked_fill(end, 0.5)
    return (torch.log(inside) - torch.log1p(-inside)).masked_fill(end, math.inf).masked_fill(x == 0, -math.inf)



def floating(value, like):
    """A value of integer or bool dtype (``F.one_hot(y, K)`` as a label) in ``like``'s dtype, so that
    it meets the distributions' own checks (the boundary's message) rather than a host's error about
    its dtype; anything else as given."""
    if torch.is_tensor(value) and not value.is_floating_point() and not value.is_complex():
        return value.to(like.dtype)
    return value
