"""Numerics: own samples are scored finitely and correctly over the whole grid -- by the object that
drew them, by a second distribution of the family, and after the PPL's sample/trace/replay --
gradients stay finite, arbitrary values never give NaN, and boundary values get their limit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import reference
from tests.cases import BINARY, N_ARY, NAMES
from tests.helpers import assert_close

TEMPERATURES = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0)
SIZES = (2, 10, 100, 1000)
DTYPES = ("float32", "float64")
GRID = [(name, t, k, dt) for name in NAMES for t in TEMPERATURES for k in SIZES for dt in DTYPES]
# the paths that do not depend on the temperature's value (the PPL's trace and replay, gradients
# being finite): its ends and an inner point
SPOT_GRID = [params for params in GRID if params[1] in (0.01, 0.5, 2.0)]


# The envelope beyond the grid: high temperatures and many categories, where Σ b - K logsumexp b
# cancels in float32 (K = 1e5, T = 1e3: both terms near 1e9) unless computed centred.
EDGE_TEMPERATURES = (10.0, 100.0, 1000.0)
EDGE_POINTS = [(t, k) for t in EDGE_TEMPERATURES for k in (10, 1000)] + [(0.01, 100000), (1000.0, 100000)]
EDGE = [(name, t, k, dt) for name in NAMES for t, k in EDGE_POINTS for dt in DTYPES]


def _grid_id(params):
    name, t, k, dt = params
    return f"{name}-T{t}-K{k}-{dt}"


def _logits(k, seed):
    """Half of the entries spread over [-50, 50] (the extremes included), half moderate."""
    rng = np.random.default_rng(seed)
    logits = np.where(rng.random(k) < 0.5, rng.uniform(-50, 50, k), rng.normal(0, 3, k))
    logits[0], logits[-1] = 50.0, -50.0
    return logits


def _second_scorer(name, t, k):
    """Another distribution of the same family: other logits and temperature (a prior scoring a
    posterior sample, as in the paper's relaxed ELBO with distinct temperatures)."""
    return 0.75 * t, _logits(k, seed=k + 1) / 2


def _assert_scores(actual, expected, what):
    """Finite and within 0.01 nats + 1e-4 relative of the float64 reference at the same noise."""
    assert np.all(np.isfinite(actual)), f"{what}: {np.mean(~np.isfinite(actual)):.1%} non-finite"
    error = np.abs(actual - expected)
    bound = 0.01 + 1e-4 * np.abs(expected)
    assert np.all(error <= bound), f"{what}: worst error {np.max(error - bound) + 0.01:.3g} nats"


def _n(k):
    return max(16, 4096 // k)


@pytest.mark.parametrize("name, t, k, dtype", GRID + EDGE, ids=[_grid_id(p) for p in GRID + EDGE])
def test_own_samples_are_scored_exactly_by_the_sampler_and_a_second_distribution(backend, name, t, k, dtype):
    """The distribution that drew the sample, and another one of the family (other logits and
    temperature), both score it within tolerance of the float64 reference at the same noise."""
    logits = _logits(k, seed=k)
    t2, logits2 = _second_scorer(name, t, k)
    d = backend.make(name, t, logits=logits, dtype=dtype, validate_args=True)
    scorer = backend.make(name, t2, logits=logits2, dtype=dtype, validate_args=True)
    _, (own, second) = backend.score_samples(d, [scorer], (_n(k),), seed=0)
    y_ref = reference.sample_log_coordinates(name, backend.uniforms(d, (_n(k),), seed=0), logits, t)
    _assert_scores(own, reference.log_density_at_log_coordinates(name, y_ref, logits, t), "own samples")
    _assert_scores(second, reference.log_density_at_log_coordinates(name, y_ref, logits2, t2), "second scorer")


@pytest.mark.parametrize("name, t, k, dtype", SPOT_GRID, ids=[_grid_id(p) for p in SPOT_GRID])
def test_scores_survive_sample_trace_and_replay(backend, name, t, k, dtype):
    """The guide draws site "z"; the model (other parameters) scores the replayed value."""
    n = _n(k)
    logits = _logits(k, seed=k)
    t2, logits2 = _second_scorer(name, t, k)
    batch = (n, k) if name in BINARY else (n,)
    guide_dist = backend.make(name, t, logits=logits, dtype=dtype, validate_args=True).expand(batch)
    model_dist = backend.make(name, t2, logits=logits2, dtype=dtype, validate_args=True).expand(batch)
    value, u, guide_lp, model_lp = backend.trace_guide_then_model(guide_dist, model_dist, seed=5)
    y_ref = reference.sample_log_coordinates(name, u, logits, t)
    _assert_scores(guide_lp, reference.log_density_at_log_coordinates(name, y_ref, logits, t), "guide site")
    _assert_scores(model_lp, reference.log_density_at_log_coordinates(name, y_ref, logits2, t2), "model site")


def _relaxed_kl_estimate(backend, name, num_draws, logits, temperature, prior_logits, prior_temperature):
    """sum of log q(z) - log p(z) over z ~ q (reparameterized): the KL term of a relaxed ELBO."""
    q = getattr(backend.lib, name)(temperature, logits=logits)
    p = getattr(backend.lib, name)(prior_temperature, logits=prior_logits)
    z = backend.sample(q, (num_draws,), seed=7)
    return (q.log_prob(z) - p.log_prob(z)).sum()


@pytest.mark.parametrize("name, t, k, dtype", SPOT_GRID, ids=[_grid_id(p) for p in SPOT_GRID])
def test_gradients_of_scores_are_finite(backend, name, t, k, dtype):
    """Gradients w.r.t. logits and temperature of both densities in log q(z) - log p(z): finite."""
    t2, logits2 = _second_scorer(name, t, k)
    args = (_logits(k, seed=k), np.asarray(t), logits2, np.asarray(t2))
    value, grads = backend.value_and_grad(_relaxed_kl_estimate, *args, dtype=dtype, static=(backend, name, _n(k)))
    assert np.isfinite(value)
    for grad in grads:
        assert np.all(np.isfinite(grad))


# ----------------------------------------------------------------------------- values we did not draw


def _limit(name, y, logits, t):
    """The reference density's limit at log-space coordinates ``y`` holding ±inf, taken along
    y -> ±inf (all infinite coordinates together): finite if it has converged, else ±inf."""
    far, farther = (reference.log_density_at_log_coordinates(name, np.where(np.isinf(y), s * np.sign(y), y), logits, t) for s in (1e6, 2e6))
    diverging = np.abs(farther - far) > 1e-6
    return np.where(diverging, np.copysign(np.inf, farther - far), farther)


@pytest.mark.parametrize("t", [0.1, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("name", NAMES)
def test_boundary_values_get_the_limit(backend, name, t, dtype):
    """Values on the boundary of the support (x_k = 0, x in {0, 1}, y = ±inf) get the density's
    limit (+inf, -inf, or finite as for K = 2, t = 1), never NaN -- without validation (under
    validation such values raise: test_errors.py, discrete data under a relaxed site)."""
    if name in N_ARY:  # K = 2 at t = 1 and K = 3 at t = 1/2 have finite limits
        x = np.array([[0.0, 1.0], [1.0, 0.0]]) if t == 1.0 else np.array([[0.0, 0.3, 0.7], [0.0, 0.0, 1.0], [0.2, 0.8, 0.0]])
        logits = np.linspace(-1, 1, x.shape[-1])
        with np.errstate(divide="ignore"):
            y = np.log(x)
        value = x if name == "Concrete" else y
    else:
        logits = np.array([-1.5, 0.0, 2.0])
        y = np.array([[-np.inf, np.inf, -np.inf], [np.inf, -np.inf, np.inf]])
        value = np.where(y > 0, 1.0, 0.0) if name == "BinConcrete" else y
    d = backend.make(name, t, logits=logits, dtype=dtype, validate_args=False)
    actual = backend.numpy(d.log_prob(backend.array(value, dtype)))
    expected = _limit(name, y, logits, t)
    assert not np.isnan(actual).any()
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    np.testing.assert_array_equal(np.sign(actual), np.sign(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_masked_boundary_values_do_not_poison_gradients(backend, name):
    """A value with exact zeros (or ones), masked out, contributes zero gradient, not NaN (without
    validation, which refuses a 0/1 BinConcrete value, masked or not: its density is +inf)."""
    if name == "Concrete":
        logits, value = np.array([0.3, -0.2, 1.0]), np.array([[0.2, 0.3, 0.5], [0.0, 0.4, 0.6]])
    else:
        logits, value = np.array([0.3, -0.2]), np.array([[0.2, 0.7], [0.0, 1.0]])
    mask = np.array([True, False])[:, None] if name == "BinConcrete" else np.array([True, False])

    def masked_score(logits, value):
        d = getattr(backend.lib, name)(0.5, logits=logits, validate_args=False)
        return d.mask(backend.array(mask, "bool")).log_prob(value).sum()

    total, grads = backend.value_and_grad(masked_score, logits, value)
    assert np.isfinite(total)
    for grad in grads:
        assert np.all(np.isfinite(grad)), grad
    np.testing.assert_array_equal(grads[1][1], 0.0)  # the masked boundary row


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_tiny_interior_values_are_finite_and_exact(backend, name, dtype):
    """Interior points down to the smallest normal number are scored from log x exactly.
    (XLA on CPU flushes subnormals to zero, so below that JAX sees the boundary point 0.)"""
    tiny = np.finfo(dtype).tiny
    if name == "Concrete":
        value = np.array([[tiny, 0.5 - tiny, 0.5], [tiny, tiny, 1.0 - 2 * tiny]])
        logits = np.array([0.3, -0.2, 1.0])
    else:
        value = np.array([tiny, 0.5, 1 - 1e-7 if dtype == "float32" else 1 - 1e-16])
        logits = np.array([0.3])
    value = value.astype(dtype).astype(np.float64)
    for t in (0.01, 0.5, 2.0):
        actual = backend.numpy(backend.make(name, t, logits=logits, dtype=dtype).log_prob(backend.array(value, dtype)))
        expected = reference.log_density(name, value, logits, t)
        assert np.all(np.isfinite(actual))
        assert_close(actual, expected, dtype)


# ----------------------------------------------------------------------------- property-based fuzz


def _score_own_sample(backend, name, logits, temperature):
    q = getattr(backend.lib, name)(temperature, logits=logits)
    return q.log_prob(backend.sample(q, (8,), seed=0)).sum()


# (name, K): every new pair is a new JAX compilation, so five fixed pairs, every name and
# K from 2 to 64 among them; the values (logits, temperature, seed) are what is fuzzed
FUZZ_SHAPES = [("Concrete", 2), ("Concrete", 64), ("ExpConcrete", 13), ("BinConcrete", 5), ("LogitBinConcrete", 64)]


@settings(max_examples=10)  # per dtype: 20 in all (the grids above are exhaustive)
@given(name_k=st.sampled_from(FUZZ_SHAPES), t=st.floats(0.01, 10.0), data=st.data())
@pytest.mark.parametrize("dtype", DTYPES)  # a parameter, so that float32 runs with JAX's x64 mode off
def test_fuzz_scores_and_gradients(backend, name_k, t, dtype, data):
    """Logits in [-50, 50], t in [0.01, 10], K in [2, 64]: own samples scored within tolerance,
    interior points we did not draw scored finitely and accurately, gradients finite."""
    name, k = name_k
    logits = np.array(data.draw(st.lists(st.floats(-50, 50), min_size=k, max_size=k)))
    seed = data.draw(st.integers(0, 2**16))
    d = backend.make(name, t, logits=logits, dtype=dtype, validate_args=True)
    _, (own,) = backend.score_samples(d, (), (8,), seed)
    y_ref = reference.sample_log_coordinates(name, backend.uniforms(d, (8,), seed), logits, t)
    _assert_scores(own, reference.log_density_at_log_coordinates(name, y_ref, logits, t), "own samples")

    # interior points not drawn by us (only their float value, no carried coordinates)
    rng = np.random.default_rng(seed)
    y = rng.normal(0, 3, (8, k))
    if name in N_ARY:
        y = y - np.logaddexp.reduce(y, axis=-1, keepdims=True)
    points = reference.value_from_log_coordinates(name, y).astype(dtype).astype(np.float64)
    actual = backend.numpy(d.log_prob(backend.array(points, dtype)))
    _assert_scores(actual, reference.log_density(name, points, logits, t), "interior points")

    _, grads = backend.value_and_grad(_score_own_sample, logits, np.asarray(t), dtype=dtype, static=(backend, name))
    assert all(np.all(np.isfinite(g)) for g in grads)
