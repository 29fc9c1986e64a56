"""Samplers against the paper: the reparameterization at fixed noise, the laws of the samples
(KS against closed-form CDFs), rounding (Prop. 1b, 2b) and the zero-temperature limit (Prop. 1c)."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, softmax

from tests import reference
from tests.cases import BINARY, CASES, N_ARY
from tests.helpers import ALPHA, assert_frequencies, assert_ks

N = 20000  # KS: detects a CDF error of 0.02 with probability > 0.99 at ALPHA


def _batch_items(case):
    """(index, logits, temperature) for every batch element of a case."""
    a = np.broadcast_to(case.logits_array, case.batch_shape + case.event_shape)
    t = np.broadcast_to(case.temperature_array, case.batch_shape)
    for index in np.ndindex(*case.batch_shape):
        yield index, a[index], float(t[index])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sample_is_the_papers_reparameterization(backend, case, dtype):
    """With the noise the sampler drew, the sample equals appendix F's formula in float64 up to
    rounding: eps * (|log a| + |noise|) / t in log space."""
    d = case.make(backend, dtype)
    value = backend.numpy(backend.sample(d, (50,), seed=3))
    u = backend.uniforms(d, (50,), seed=3)
    a, t = case.logits_array, case.temperature_array
    y_ref = reference.sample_log_coordinates(case.name, u, a, t)
    noise = reference.gumbel(u) if case.n_ary else reference.logistic(u)
    eps = np.finfo(dtype).eps
    tol = 8 * eps * (np.abs(a).max() + np.abs(noise).max() + 1) / np.min(t)
    if case.name in ("ExpConcrete", "LogitBinConcrete"):
        np.testing.assert_allclose(value, y_ref, rtol=0, atol=tol)
    elif case.name == "Concrete":  # relative error tol per coordinate, absolute where it underflows
        x_ref = np.exp(y_ref)
        assert np.all(np.abs(value - x_ref) <= tol * x_ref + 2 * np.finfo(dtype).tiny)
    else:
        np.testing.assert_allclose(value, expit(y_ref), rtol=0, atol=tol / 4 + eps)


# At logits +-50 and t = 0.1 every BinConcrete value rounds to exactly 0 or 1 (KS needs a continuous
# law); the reparameterization test above covers those parameters, LogitBinConcrete keeps them here.
CDF_CASES = [c for c in CASES if c.name == "LogitBinConcrete" or (c.name == "BinConcrete" and c.temperature != 0.1)]


@pytest.mark.parametrize("case", CDF_CASES, ids=str)
def test_binary_samples_follow_closed_form_cdf(backend, case, dtype):
    samples = backend.numpy(backend.sample(case.make(backend, dtype), (N,), seed=11))
    cdf = reference.bin_concrete_cdf if case.name == "BinConcrete" else reference.logit_bin_concrete_cdf
    for index, a, t in _batch_items(case):
        column = samples[(slice(None),) + index]
        assert_ks(column, lambda v, a=a, t=t: cdf(v, a, t), f"{case} at {index}")


# log x of a Concrete value holds log-ratios up to ~700 in float64 but only ~100 in float32, less than
# the noise alone spans at t = 0.1; ExpConcrete (the log-space node) covers every case in both dtypes.
LOG_RATIO_CASES = [(c, dt) for c in CASES if c.name == "ExpConcrete" for dt in ("float32", "float64")] + [
    (c, "float64") for c in CASES if c.name == "Concrete" and c.temperature != 0.05
]


@pytest.mark.parametrize("case, dtype", LOG_RATIO_CASES, ids=lambda x: str(x))
def test_log_ratios_are_logistic(backend, case, dtype):
    """log X_i - log X_j ~ Logistic((log a_i - log a_j)/t, 1/t) (the sampler vs the density's law)."""
    samples = backend.numpy(backend.sample(case.make(backend, dtype), (N,), seed=12))
    log_x = np.log(samples) if case.name == "Concrete" else samples
    k = case.event_shape[0]
    for index, a, t in _batch_items(case):
        for i, j in {(0, 1), (k - 1, 0)}:
            ratio = log_x[(slice(None),) + index + (i,)] - log_x[(slice(None),) + index + (j,)]
            assert_ks(ratio, reference.log_ratio_law(a[i], a[j], t).cdf, f"{case} at {index}, ({i},{j})")


@pytest.mark.parametrize("temperature", [0.5, 2 / 3, 2.0])  # lower, x_1 rounds to exactly 0 or 1
def test_two_category_concrete_follows_bin_concrete_cdf(backend, temperature):
    a = np.array([0.8, -0.4])
    samples = backend.numpy(backend.sample(backend.make("Concrete", temperature, logits=a), (N,), seed=13))
    assert_ks(samples[:, 0], lambda x: reference.bin_concrete_cdf(x, a[0] - a[1], temperature))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rounding_recovers_the_discrete_distribution(backend, case, dtype):
    """Prop. 1b: P(X_k > X_i for i != k) = a_k / sum(a); Prop. 2b: P(X > 1/2) = a / (1 + a)."""
    samples = backend.numpy(backend.sample(case.make(backend, dtype), (N,), seed=14))
    for index, a, t in _batch_items(case):
        column = samples[(slice(None),) + index]
        if case.n_ary:
            counts = np.bincount(column.argmax(-1), minlength=a.size)
            assert_frequencies(counts, softmax(a), f"{case} at {index}")
        else:
            threshold = 0.5 if case.name == "BinConcrete" else 0.0
            ones = int((column > threshold).sum())
            p_value = stats.binomtest(ones, N, float(expit(a))).pvalue
            assert p_value > ALPHA, f"{case} at {index}: {ones}/{N} above, expected p = {expit(a):.4f}"


@pytest.mark.parametrize("name", N_ARY + BINARY)
def test_zero_temperature_limit(backend, name):
    """Prop. 1c / 2c: with the noise fixed, X(t) converges to the Gumbel-max (resp. step) sample
    as t -> 0, within the exact bound 2 (K - 1) exp(-gap / t) (resp. exp(-|a + L| / t)); the limit's
    frequencies are a_k / sum(a)."""
    a = np.array([1.0, -0.5, 0.3, 0.0]) if name in N_ARY else np.array([0.7, -1.5, 0.0])
    n = 5000
    for t in (0.1, 0.01, 0.001):
        d = backend.make(name, t, logits=a)
        value = backend.numpy(backend.sample(d, (n,), seed=15))
        u = backend.uniforms(d, (n,), seed=15)
        if name in N_ARY:
            x = np.exp(value) if name == "ExpConcrete" else value
            scores = np.sort(a + reference.gumbel(u), axis=-1)
            gap = scores[:, -1] - scores[:, -2]
            limit = np.eye(a.size)[reference.gumbel_max_index(u, a)]
            distance = np.abs(x - limit).sum(-1)
            assert np.all(distance <= 2 * (a.size - 1) * np.exp(-gap / t) + 1e-12)
        else:
            x = expit(value) if name == "LogitBinConcrete" else value
            noisy_logit = a + reference.logistic(u)
            limit = (noisy_logit > 0).astype(float)
            assert np.all(np.abs(x - limit) <= np.exp(-np.abs(noisy_logit) / t) + 1e-12)
    if name in N_ARY:
        assert_frequencies(np.bincount(limit.argmax(-1), minlength=a.size), softmax(a))
    else:
        for j in range(a.size):
            assert stats.binomtest(int(limit[:, j].sum()), n, float(expit(a[j]))).pvalue > ALPHA
