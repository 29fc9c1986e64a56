"""Float64 NumPy/SciPy oracle for the Concrete family, written from the paper (appendix F and C.3)
and independent of both backends.

Conventions: ``logits`` is log alpha; ``t`` is the temperature, broadcasting with the batch shape
(for the n-ary functions ``logits`` has one more, last, axis of categories). Log densities take
log-space coordinates (``log_x`` on the simplex, the logit on the unit interval) so that they can be
evaluated at float64 samples whose ``x`` underflows.
"""

import numpy as np
from scipy import stats
from scipy.special import expit, gammaln, log_expit, logsumexp

# ----------------------------------------------------------------------------- noise (appendix F)


def gumbel(u):
    """G = -log(-log U)."""
    return -np.log(-np.log(u))


def logistic(u):
    """L = log U - log(1 - U)."""
    return np.log(u) - np.log1p(-u)


# ----------------------------------------------------------------------------- n-ary


def exp_concrete_sample(u, logits, t):
    """ExpConcrete sample from uniforms ``u`` (appendix F): (log a + G)/t minus its logsumexp."""
    z = (logits + gumbel(u)) / np.asarray(t)[..., None]
    return z - logsumexp(z, axis=-1, keepdims=True)


def concrete_log_density(log_x, logits, t):
    """Eq. (11), written with log x: density on the simplex w.r.t. Lebesgue on x_1..x_{K-1}."""
    t = np.asarray(t)[..., None]
    k = log_x.shape[-1]
    log_alpha_x = logits - t * log_x  # log(alpha_k x_k^-t)
    return (
        gammaln(k)
        + (k - 1) * np.log(t[..., 0])
        + np.sum(logits - (t + 1) * log_x, axis=-1)
        - k * logsumexp(log_alpha_x, axis=-1)
    )


def exp_concrete_log_density(y, logits, t):
    """log kappa(y) (appendix C.3 / F)."""
    t = np.asarray(t)[..., None]
    k = y.shape[-1]
    b = logits - t * y
    return gammaln(k) + (k - 1) * np.log(t[..., 0]) + np.sum(b, axis=-1) - k * logsumexp(b, axis=-1)


def gumbel_max_index(u, logits):
    """The discrete sample of the Gumbel-max trick (eq. 9) for the same uniforms."""
    return np.argmax(logits + gumbel(u), axis=-1)


def log_ratio_law(logit_i, logit_j, t):
    """log X_i - log X_j ~ Logistic((log a_i - log a_j)/t, scale 1/t) for X ~ Concrete."""
    return stats.logistic(loc=(logit_i - logit_j) / t, scale=1.0 / t)


def categorical_log_mass(logits):
    """log P(D_k = 1) = log a_k - log sum_i a_i (appendix F, Discrete)."""
    return logits - logsumexp(logits, axis=-1, keepdims=True)


def exp_concrete_conditional_sample(u, logits, t, chosen):
    """ExpConcrete sample given its limit, the one-hot mask ``chosen`` (Tucker et al. 2017, appendix C):
    the perturbed logits' maximum z_b = logsumexp(log a) + Gumbel is where ``chosen`` says; every
    other z_k is Gumbel(log a_k) conditioned below z_b, by the inverse of its CDF
    F(z) = exp(-exp(-(z - log a_k))) on u_k F(z_b): z_k = log a_k - log(-log u_k + exp(-(z_b - log a_k)))."""
    logits = np.broadcast_to(logits, chosen.shape)
    top = logsumexp(logits, axis=-1, keepdims=True) + np.where(chosen, gumbel(u), 0.0).sum(-1, keepdims=True)
    below = logits - np.log(-np.log(u) + np.exp(-(top - logits)))
    z = np.where(chosen, top, below) / np.asarray(t)[..., None]
    return z - logsumexp(z, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- binary


def logit_bin_concrete_sample(u, logits, t):
    """Y = (log a + L)/t (eq. 26); sigmoid(Y) ~ BinConcrete."""
    return (logits + logistic(u)) / t


def logit_bin_concrete_conditional_sample(u, logits, t, ones):
    """Y given its limit ``ones``: log a + L with L = logit(U') for U' uniform on the side of 1 - p
    that ``ones`` gives, U' = u (1 - p) or (1 - p) + u p, p = sigmoid(log a); with log U' and
    log(1 - U') from log_expit so that 1 - p is not rounded."""
    log_p, log1m_p = log_expit(logits), log_expit(-logits)
    log_u_prime = np.where(ones, np.logaddexp(log1m_p, np.log(u) + log_p), np.log(u) + log1m_p)
    log1m_u_prime = np.where(ones, log_p + np.log1p(-u), np.log1p(-np.exp(np.log(u) + log1m_p)))
    return (logits + log_u_prime - log1m_u_prime) / t


def bin_concrete_log_density(logit_x, logits, t):
    """Eq. (17) at x = sigmoid(logit_x), using log x and log(1 - x) from the logit."""
    log_x, log_1mx = log_expit(logit_x), log_expit(-logit_x)
    return (
        np.log(t)
        + logits
        - (t + 1) * (log_x + log_1mx)
        - 2 * np.logaddexp(logits - t * log_x, -t * log_1mx)
    )


def logit_bin_concrete_log_density(y, logits, t):
    """log g(y) = log t - t y + log a - 2 log(1 + exp(-t y + log a)) (appendix C.3.2)."""
    s = -t * y + logits
    return np.log(t) + s - 2 * np.logaddexp(0.0, s)


def bin_concrete_cdf(x, logits, t):
    """P(sigmoid((log a + L)/t) <= x) = P(L <= t logit(x) - log a)."""
    with np.errstate(divide="ignore"):
        return expit(t * (np.log(x) - np.log1p(-x)) - logits)


def bin_concrete_icdf(q, logits, t):
    with np.errstate(divide="ignore"):
        return expit((logits + np.log(q) - np.log1p(-q)) / t)


def logit_bin_concrete_cdf(y, logits, t):
    return expit(t * y - logits)


def logit_bin_concrete_icdf(q, logits, t):
    with np.errstate(divide="ignore"):
        return (logits + np.log(q) - np.log1p(-q)) / t


def bernoulli_log_mass(value, logits):
    """log P(D = value), P(D = 1) = a/(1 + a) (appendix F, Bernoulli)."""
    return np.where(value > 0, log_expit(logits), log_expit(-logits))


# ----------------------------------------------------------------------------- one entry point per distribution


def log_density(name, value, logits, t):
    """Log density of distribution ``name`` at ``value`` given in its own sample space.

    Concrete values are points of the simplex (x, not log x); BinConcrete values are in (0, 1).
    """
    value = np.asarray(value, dtype=np.float64)
    with np.errstate(divide="ignore"):
        if name == "Concrete":
            return concrete_log_density(np.log(value), logits, t)
        if name == "ExpConcrete":
            return exp_concrete_log_density(value, logits, t)
        if name == "BinConcrete":
            return bin_concrete_log_density(np.log(value) - np.log1p(-value), logits, t)
        if name == "LogitBinConcrete":
            return logit_bin_concrete_log_density(value, logits, t)
    raise KeyError(name)


def sample_log_coordinates(name, u, logits, t):
    """The float64 sample for uniforms ``u``, in log space: y = log x (n-ary) or logit x (binary)."""
    if name in ("Concrete", "ExpConcrete"):
        return exp_concrete_sample(u, logits, t)
    return logit_bin_concrete_sample(u, logits, t)


def log_density_at_log_coordinates(name, y, logits, t):
    """Log density of ``name`` at the point whose log-space coordinates are ``y``."""
    if name == "Concrete":
        return concrete_log_density(y, logits, t)
    if name == "ExpConcrete":
        return exp_concrete_log_density(y, logits, t)
    if name == "BinConcrete":
        return bin_concrete_log_density(y, logits, t)
    return logit_bin_concrete_log_density(y, logits, t)


def value_from_log_coordinates(name, y):
    """The value a distribution shows for log-space coordinates y."""
    if name == "Concrete":
        return np.exp(y)
    if name == "BinConcrete":
        return expit(y)
    return y


# ----------------------------------------------------------------------------- quadrature


def double_exponential_nodes(scale, half_width=5.0, step=0.02):
    """Nodes and weights of the trapezoid rule after u = scale * sinh(s): exact to ~1e-12 for
    smooth integrands on R decaying at least exponentially on the length scale ``scale``."""
    s = np.arange(-half_width, half_width + step / 2, step)
    return scale * np.sinh(s), step * scale * np.cosh(s)


def integrate(log_integrand, dim, scale):
    """∫_{R^dim} exp(log_integrand(u)) du, ``log_integrand`` vectorized over u of shape (n, dim)."""
    nodes, weights = double_exponential_nodes(scale)
    grids = np.meshgrid(*([nodes] * dim), indexing="ij")
    weight_grids = np.meshgrid(*([weights] * dim), indexing="ij")
    u = np.stack([g.ravel() for g in grids], axis=-1)
    w = np.prod(np.stack([g.ravel() for g in weight_grids], axis=-1), axis=-1)
    return float(np.sum(w * np.exp(log_integrand(u))))


# ----------------------------------------------------------------------------- Hard Concrete (Louizos et al. 2018)


def hard_concrete_log_prob(z, logits, t, low=-0.1, high=1.1):
    """log P(Z = 0) at 0, log P(Z = 1) at 1, the log density inside, for Z = clip(low + (high - low) S,
    0, 1) and S ~ BinConcrete: the stretched BinConcrete cdf at the ends, its density inside."""
    z, logits, t = np.broadcast_arrays(np.asarray(z, np.float64), logits, t)
    width = high - low
    s = np.clip((z - low) / width, 1e-300, 1 - 1e-16)
    lo, hi = -low / width, (1 - low) / width  # where the stretched variable reaches 0 and 1
    log_mass_zero = log_expit(t * (np.log(lo) - np.log1p(-lo)) - logits)  # log P(S <= lo), the cdf in log form
    log_mass_one = log_expit(logits - t * (np.log(hi) - np.log1p(-hi)))  # log P(S >= hi)
    density = bin_concrete_log_density(np.log(s) - np.log1p(-s), logits, t) - np.log(width)
    return np.where(z <= 0, log_mass_zero, np.where(z >= 1, log_mass_one, density))


def hard_concrete_cdf(z, logits, t, low=-0.1, high=1.1):
    z = np.asarray(z, np.float64)
    s = np.clip((z - low) / (high - low), 1e-300, 1 - 1e-16)
    return np.where(z >= 1, 1.0, bin_concrete_cdf(s, logits, t))
