"""Shapes, checked together with values: sample shapes, batch shapes, batched temperatures (which
torch's relaxed distributions get wrong), expand, to_event and mask."""

import numpy as np
import pytest

from tests import reference
from tests.cases import CASES, N_ARY, NAMES
from tests.helpers import assert_close

SAMPLE_SHAPES = [(), (2, 3)]  # (5,) adds nothing to (2, 3)


def _reference_at_noise(backend, d, name, logits, t, sample_shape, seed):
    """(value, log density) of the reference sampler for the noise ``d`` draws with ``seed``."""
    y = reference.sample_log_coordinates(name, backend.uniforms(d, sample_shape, seed), logits, t)
    return reference.value_from_log_coordinates(name, y), reference.log_density_at_log_coordinates(name, y, logits, t)


@pytest.mark.parametrize("sample_shape", SAMPLE_SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_sample_and_log_prob_shapes_and_values(backend, case, sample_shape):
    d = case.make(backend)
    assert tuple(d.batch_shape) == case.batch_shape
    assert tuple(d.event_shape) == case.event_shape
    value, (log_prob,) = backend.score_samples(d, (), sample_shape, seed=1)
    assert value.shape == sample_shape + case.batch_shape + case.event_shape
    assert log_prob.shape == sample_shape + case.batch_shape
    ref_value, ref_log_prob = _reference_at_noise(
        backend, d, case.name, case.logits_array, case.temperature_array, sample_shape, seed=1
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-8, atol=1e-12)
    assert_close(log_prob, ref_log_prob, "float64", rtol=1e-8)


def _batched_temperature_layouts(name):
    """(temperature, logits) pairs whose rows must behave like separate distributions:
    temperature (B,) against logits of batch shape (B,), and (B, 1) against batch shape (B, M)."""
    rng = np.random.default_rng(0)
    t = np.array([0.3, 1.0, 2.5])
    k = (4,) if name in N_ARY else ()
    return [(t, rng.normal(0, 2, (3,) + k)), (t[:, None], rng.normal(0, 2, (3, 2) + k))]


@pytest.mark.parametrize("name", NAMES)
def test_batched_temperatures_equal_per_row_distributions(backend, name):
    for t, logits in _batched_temperature_layouts(name):
        d = backend.make(name, t, logits=logits)
        batch_shape = logits.shape[:-1] if name in N_ARY else logits.shape
        assert tuple(d.batch_shape) == batch_shape
        value = backend.sample(d, (50,), seed=2)
        ref_value, ref_log_prob = _reference_at_noise(backend, d, name, logits, t, (50,), seed=2)
        np.testing.assert_allclose(backend.numpy(value), ref_value, rtol=1e-8, atol=1e-12)
        log_prob = backend.numpy(d.log_prob(value))
        assert_close(log_prob, ref_log_prob, "float64", rtol=1e-8)
        for row in range(3):  # the row's own distribution, with a scalar temperature
            row_dist = backend.make(name, float(np.ravel(t)[row]), logits=logits[row])
            # a copy of the row carries no log coordinates: scored from x, where 1 - x near 1
            # costs digits; a misplaced temperature (torch's bug) is off by O(1)
            row_value = backend.array(backend.numpy(value)[:, row])
            assert_close(log_prob[:, row], backend.numpy(row_dist.log_prob(row_value)), "float64", rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_expand(backend, case):
    d = case.make(backend)
    new_batch = (4,) + case.batch_shape
    expanded = d.expand(new_batch)
    assert tuple(expanded.batch_shape) == new_batch
    assert tuple(expanded.event_shape) == case.event_shape
    value, (expanded_log_prob, original_log_prob) = backend.score_samples(expanded, [d], (3,), seed=4)
    ref_value, ref_log_prob = _reference_at_noise(
        backend, expanded, case.name, case.logits_array, case.temperature_array, (3,), seed=4
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-8, atol=1e-12)
    assert_close(expanded_log_prob, ref_log_prob, "float64", rtol=1e-8)
    assert_close(original_log_prob, ref_log_prob, "float64", rtol=1e-8)


@pytest.mark.parametrize("case", [c for c in CASES if c.batch_shape], ids=str)
def test_to_event(backend, case):
    # without validation: eager NumPyro samples that round to 0/1 are scored from their values,
    # whose +inf limit validation refuses (test_errors.py)
    d = case.make(backend, validate_args=False)
    independent = d.to_event(1)
    assert tuple(independent.batch_shape) == case.batch_shape[:-1]
    assert tuple(independent.event_shape) == case.batch_shape[-1:] + case.event_shape
    value = backend.sample(independent, (5,), seed=6)
    expected = backend.numpy(d.log_prob(value)).sum(-1)
    assert_close(backend.numpy(independent.log_prob(value)), expected, "float64", rtol=1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if c.batch_shape], ids=str)
def test_mask(backend, case):
    d = case.make(backend)
    mask = np.arange(np.prod(case.batch_shape)).reshape(case.batch_shape) % 2 == 0
    masked = d.mask(backend.array(mask, "bool"))
    _, (log_prob, masked_log_prob) = backend.score_samples(d, [masked], (5,), seed=8)
    np.testing.assert_array_equal(masked_log_prob, np.where(mask, log_prob, 0.0))
    # the masked distribution scores the sample itself (its carried log coordinates included)
    _, ref_log_prob = _reference_at_noise(backend, d, case.name, case.logits_array, case.temperature_array, (5,), seed=8)
    assert_close(masked_log_prob, np.where(mask, ref_log_prob, 0.0), "float64", rtol=1e-8)


@pytest.mark.parametrize("name", ["BinConcrete", "LogitBinConcrete", "HardConcrete"])
def test_a_scalar_probs_makes_a_scalar_distribution(backend, name):
    d = backend.make(name, 0.5, probs=np.array(0.3), validate_args=True)
    assert tuple(d.batch_shape) == ()
    np.testing.assert_allclose(backend.numpy(d.logits), np.log(0.3 / 0.7), rtol=1e-12)
