"""Relaxed samples given their zero-temperature limit (issue 15's building block): z ~ p(z | H(z) = b).
Each conditional sample has b as its limit (its support), the samples pooled over b drawn from the
discrete limit follow the distribution's own law (KS against the closed-form laws of the reference),
they are reparameterized (pathwise gradients against finite differences at a fixed b), and bad b
raise."""

import numpy as np
import pytest

from tests import reference
from tests.cases import CASES, N_ARY
from tests.helpers import assert_ks
from tests.test_sampling import _batch_items

N = 20000  # KS: detects a CDF error of 0.02 with probability > 0.99 at ALPHA


def _limit_index(name, values):
    """The limit of relaxed values: the category (n-ary) or the bit (binary)."""
    if name in N_ARY:
        return values.argmax(-1)
    return (values > (0.5 if name == "BinConcrete" else 0.0)).astype(int)


def _as_limit_value(name, zero_one):
    """A 0/1 array (one-hot rows, n-ary) as a value of the class's limit: log for ExpConcrete, +-inf
    for LogitBinConcrete."""
    if name == "ExpConcrete":
        with np.errstate(divide="ignore"):
            return np.log(zero_one)
    if name == "LogitBinConcrete":
        return np.where(zero_one > 0, np.inf, -np.inf)
    return zero_one


def _pooled(backend, case, dtype, n, seed):
    """(hard values drawn from the limit, the conditional samples given them), as NumPy."""
    d = case.make(backend, dtype)
    hard = backend.sample(d.discrete(), (n,), seed=seed)
    return backend.numpy(hard), backend.numpy(backend.conditional_sample(d, hard, seed=seed + 1))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_conditional_sample_has_the_given_limit(backend, case, dtype):
    """The limit of z given b is b: the chosen category holds the largest coordinate (ties only
    where float rounding makes two equal), the bit is on its side of 1/2 (0)."""
    hard, z = _pooled(backend, case, dtype, 500, seed=3)
    if case.n_ary:
        chosen = hard.argmax(-1) if case.name == "Concrete" else (hard == 0).argmax(-1)
        at_chosen = np.take_along_axis(z, chosen[..., None], -1)[..., 0]
        assert np.all(at_chosen >= z.max(-1))
        assert np.mean(at_chosen > np.sort(z, -1)[..., -2]) > 0.99  # a strict maximum but for rounding
    else:
        ones = hard > 0.5 if case.name == "BinConcrete" else hard > 0
        threshold = 0.5 if case.name == "BinConcrete" else 0.0
        assert np.all(np.where(ones, z >= threshold, z <= threshold))


POOLED_CASES = [c for c in CASES if c.name in ("ExpConcrete", "LogitBinConcrete")] + [
    c for c in CASES if c.name == "BinConcrete" and c.temperature != 0.1  # at +-50, t = 0.1 every value rounds to 0 or 1
]


@pytest.mark.parametrize("case", POOLED_CASES, ids=str)
def test_pooled_conditional_samples_follow_the_distribution(backend, case):
    """b from the limit, then z given b: together, samples of the distribution (Tucker et al.'s
    identity behind REBAR), by KS against the reference's closed-form laws -- the log-ratios
    (logistic) of the n-ary family, the CDF of the binary one. float64; both conditional branches
    are exercised at every batch element (the limit's probabilities are in (0, 1))."""
    _, z = _pooled(backend, case, "float64", N, seed=21)
    k = case.event_shape[0] if case.n_ary else None
    for index, a, t in _batch_items(case):
        column = z[(slice(None),) + index]
        if case.n_ary:
            for i, j in {(0, 1), (k - 1, 0)}:
                ratio = column[:, i] - column[:, j]
                assert_ks(ratio, reference.log_ratio_law(a[i], a[j], t).cdf, f"{case} at {index}, ({i},{j})")
        else:
            cdf = reference.bin_concrete_cdf if case.name == "BinConcrete" else reference.logit_bin_concrete_cdf
            assert_ks(column, lambda v, a=a, t=t: cdf(v, a, t), f"{case} at {index}")


@pytest.mark.parametrize("name", ["Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"])
def test_conditional_samples_are_reparameterized(backend, name):
    """At a fixed b and common random numbers, E[f(z) | b] is smooth in the logits and the
    temperature: its autodiff gradient equals central finite differences."""
    n_ary = name in N_ARY
    logits, t = (np.array([0.4, -1.0, 1.3]), np.array(0.7)) if n_ary else (np.array([0.4, -1.0]), np.array(0.7))
    hard_np = _as_limit_value(name, np.eye(3)[[0, 2, 1, 2]] if n_ary else np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    weights = backend.array(np.random.default_rng(0).normal(size=hard_np.shape))

    def expectation(logits, temperature):
        d = getattr(backend.lib, name)(temperature, logits=logits)
        z = backend.conditional_sample(d, backend.array(hard_np), (50,), seed=5)
        if name in ("ExpConcrete", "LogitBinConcrete"):
            z = z / (1 + z * z)
        return (weights * z * z).sum() / 50

    _, (grad_logits, grad_t) = backend.value_and_grad(expectation, logits, t)
    h = 1e-5
    for params, grad, which in ((logits, grad_logits, 0), (t, grad_t, 1)):
        for index in np.ndindex(*params.shape):
            step = np.zeros(params.shape)
            step[index] = h
            plus, minus = [logits, t], [logits, t]
            plus[which], minus[which] = params + step, params - step
            fd = (backend.value_and_grad(expectation, *plus)[0] - backend.value_and_grad(expectation, *minus)[0]) / (2 * h)
            np.testing.assert_allclose(np.reshape(grad, params.shape)[index], fd, rtol=1e-5, atol=1e-8)
    assert np.abs(grad_logits).max() > 1e-3


@pytest.mark.parametrize("name", ["Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"])
def test_conditional_sample_refuses_what_is_not_a_value_of_the_limit(backend, name):
    n_ary = name in N_ARY
    d = backend.make(name, 0.5, logits=np.array([0.1, 0.2, 0.3]) if n_ary else np.array([0.1, 0.2]), validate_args=True)
    not_a_limit = np.array([0.5, 0.5, 0.0]) if n_ary else np.array([0.3, 1.0])
    with pytest.raises(ValueError, match=rf"{name}\.conditional_r?sample: hard must be a value of the zero-temperature limit"):
        backend.conditional_sample(d, backend.array(not_a_limit))
    wrong_shape = _as_limit_value(name, np.eye(3)[:2, :2] if n_ary else np.zeros(3))
    with pytest.raises(ValueError, match=r"hard of shape .* does not broadcast"):
        backend.conditional_sample(d, backend.array(wrong_shape))


def test_straight_through_distributions_have_no_conditional_sample(backend):
    d = backend.make("ConcreteStraightThrough", 0.5, logits=np.array([0.1, 0.2, 0.3]))
    with pytest.raises(NotImplementedError, match="has discrete values"):
        backend.conditional_sample(d, backend.array(np.eye(3)[0]))


# the grid's edges: t = 0.01, 1000 categories, logits over [-50, 50]; and moderate cases
EDGE_CASES = [("Concrete", 0.01, np.linspace(-50, 50, 1000)), ("ExpConcrete", 0.01, np.linspace(-50, 50, 1000)),
              ("ExpConcrete", 2.0, np.array([0.3, -1.2, 2.0])), ("BinConcrete", 0.01, np.linspace(-50, 50, 11)),
              ("LogitBinConcrete", 0.01, np.linspace(-50, 50, 11)), ("LogitBinConcrete", 2.0, np.array([0.3, -1.2]))]


@pytest.mark.parametrize("name, t, logits", EDGE_CASES, ids=lambda x: str(x)[:12])
def test_conditional_sample_is_the_truncated_construction_in_float64(backend, name, t, logits, dtype):
    """With the uniforms the sampler drew, the conditional sample equals the reference's float64
    construction up to rounding in log space (16 eps (|log a| + |noise| + 1) / t: twice the
    unconditional sampler's allowance, for its softplus and logaddexp terms), exact where its value
    underflows (the log coordinates are carried): scored by its own density, finite."""
    d = backend.make(name, t, logits=logits, dtype=dtype)
    hard = backend.sample(d.discrete(), (200,), seed=7)
    z = backend.conditional_sample(d, hard, seed=8)
    u = backend.uniforms(d, (200,), seed=8)
    hard_np, a = backend.numpy(hard), logits
    if name in N_ARY:
        chosen = hard_np > 0.5 if name == "Concrete" else hard_np == 0
        y_ref = reference.exp_concrete_conditional_sample(u, a, np.asarray(t), chosen)
        noise = np.abs(reference.gumbel(u)).max()
    else:
        ones = hard_np > 0.5 if name == "BinConcrete" else hard_np > 0
        y_ref = reference.logit_bin_concrete_conditional_sample(u, a, t, ones)
        noise = np.abs(reference.logistic(u)).max() + np.abs(a).max()
    tol = 16 * np.finfo(dtype).eps * (np.abs(a).max() + noise + 1) / t
    value = backend.numpy(z)
    if name in ("ExpConcrete", "LogitBinConcrete"):
        np.testing.assert_allclose(value, y_ref, rtol=0, atol=tol)
    elif name == "Concrete":
        x_ref = np.exp(y_ref)
        assert np.all(np.abs(value - x_ref) <= tol * x_ref + 2 * np.finfo(dtype).tiny)
    else:
        from scipy.special import expit

        np.testing.assert_allclose(value, expit(y_ref), rtol=0, atol=tol / 4 + np.finfo(dtype).eps)
    log_prob = backend.numpy(backend.in_trace(lambda: d.log_prob(backend.conditional_sample(d, hard, seed=8))))
    assert np.all(np.isfinite(log_prob))
