"""``.discrete()``: the zero-temperature limit on the same sample space, enumerable, with a mode."""

import numpy as np
import pytest
from scipy.special import expit, softmax

from tests import reference
from tests.cases import CASES, N_ARY, NAMES
from tests.helpers import assert_close, assert_frequencies


def _vertices(name, case):
    """The support of the limit, (n,) + batch + event, as the relaxed distribution shows it."""
    if case.n_ary:
        k = case.event_shape[0]
        one_hot = np.eye(k).reshape((k,) + (1,) * len(case.batch_shape) + (k,))
        one_hot = np.broadcast_to(one_hot, (k,) + case.batch_shape + (k,))
        with np.errstate(divide="ignore"):
            return one_hot if name == "Concrete" else np.log(one_hot)
    zero_one = np.broadcast_to(np.array([0.0, 1.0]).reshape((2,) + (1,) * len(case.batch_shape)), (2,) + case.batch_shape)
    return zero_one if name == "BinConcrete" else np.where(zero_one > 0, np.inf, -np.inf)


def _reference_log_mass(case, vertices):
    a = np.broadcast_to(case.logits_array, case.batch_shape + case.event_shape)
    if case.n_ary:
        index = np.argmax(vertices, axis=-1)
        return np.take_along_axis(np.broadcast_to(reference.categorical_log_mass(a), vertices.shape), index[..., None], -1)[..., 0]
    return reference.bernoulli_log_mass(vertices, a)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_discrete_is_enumerable_on_the_same_sample_space(backend, case):
    relaxed = case.make(backend)
    d = relaxed.discrete()
    assert tuple(d.batch_shape) == case.batch_shape
    assert tuple(d.event_shape) == case.event_shape
    support = backend.numpy(backend.enumerate_support(d, expand=True))
    expected_support = _vertices(case.name, case)
    np.testing.assert_array_equal(support, expected_support)
    compact = backend.numpy(backend.enumerate_support(d, expand=False))  # the form enumeration uses
    assert compact.shape == (len(support),) + (1,) * len(case.batch_shape) + case.event_shape
    np.testing.assert_array_equal(np.broadcast_to(compact, support.shape), support)
    log_mass = backend.numpy(d.log_prob(backend.array(support)))
    assert_close(log_mass, _reference_log_mass(case, expected_support), "float64", rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_mass).sum(0), 1.0, rtol=1e-12)
    # the limit's values lie in the relaxed distribution's support (same sample space)
    assert backend.numpy(relaxed.support.check(backend.array(support))).all()
    assert backend.numpy(d.support.check(backend.array(support))).all()


@pytest.mark.parametrize("case", [case for case in CASES if case.batch_shape], ids=str)
def test_discrete_scores_values_that_broadcast_with_the_batch(backend, case):
    """One value for the whole batch (the event alone: a label shared by a plate), and a stack of
    values each for the whole batch ((2, 1, ..., event)): each element scored as the batch-shaped
    value would be. (NumPyro's one-hot limits raised a JAX broadcasting error on both.)"""
    d = case.make(backend).discrete()
    vertices = _vertices(case.name, case)
    first = (0,) * len(case.batch_shape)
    for value in (vertices[-1][first], vertices[:2][(slice(None),) + first][(slice(None),) + (None,) * len(case.batch_shape)]):
        full = np.broadcast_to(value, np.broadcast_shapes(value.shape, case.batch_shape + case.event_shape))
        log_mass = backend.numpy(d.log_prob(backend.array(value)))
        assert_close(log_mass, _reference_log_mass(case, full), "float64", rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_discrete_mode_is_the_argmax(backend, case):
    mode = backend.numpy(case.make(backend).discrete().mode)
    a = np.broadcast_to(case.logits_array, case.batch_shape + case.event_shape)
    if case.n_ary:
        expected = np.eye(a.shape[-1])[np.argmax(a, -1)]
        if case.name == "ExpConcrete":
            with np.errstate(divide="ignore"):
                expected = np.log(expected)
    else:
        expected = (a > 0).astype(float)
        if case.name == "LogitBinConcrete":
            expected = np.where(a > 0, np.inf, -np.inf)
    np.testing.assert_array_equal(mode, expected)


@pytest.mark.parametrize("name", NAMES)
def test_mode_at_even_odds_is_never_nan(backend, name):
    """p = 1/2 (torch's Bernoulli mode is NaN there) and tied logits: the first category / 0."""
    logits = np.zeros((2, 3)) if name in N_ARY else np.zeros(3)
    mode = backend.numpy(backend.make(name, 0.5, logits=logits).discrete().mode)
    assert not np.isnan(mode).any()
    if name == "Concrete":
        np.testing.assert_array_equal(mode, np.tile([1.0, 0.0, 0.0], (2, 1)))
    elif name == "ExpConcrete":
        np.testing.assert_array_equal(mode, np.tile([0.0, -np.inf, -np.inf], (2, 1)))
    else:
        np.testing.assert_array_equal(mode, 0.0 if name == "BinConcrete" else -np.inf)


@pytest.mark.parametrize("name", NAMES)
def test_discrete_samples_follow_the_masses(backend, name):
    a = np.array([0.5, -1.0, 1.5, 0.0])
    d = backend.make(name, 0.5, logits=a).discrete()
    samples = backend.numpy(backend.sample(d, (20000,), seed=21))
    if name in N_ARY:
        index = np.argmax(samples, -1)
        assert np.all((samples == 0) | (samples == (1.0 if name == "Concrete" else -np.inf)) | (np.eye(4)[index] == 1))
        assert_frequencies(np.bincount(index, minlength=4), softmax(a))
    else:
        ones = samples == (1.0 if name == "BinConcrete" else np.inf)
        zeros = samples == (0.0 if name == "BinConcrete" else -np.inf)
        assert np.all(ones | zeros)
        for j in range(4):
            assert_frequencies([zeros[:, j].sum(), ones[:, j].sum()], [1 - expit(a[j]), expit(a[j])])
