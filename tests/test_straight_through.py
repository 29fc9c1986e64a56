"""Straight-through Concrete (ConcreteStraightThrough, BinConcreteStraightThrough): values exactly
discrete, gradients those of the relaxed sample, log_prob the relaxed density of the sample behind
the value -- for the sample itself, never for a copy or user data, which raise -- a Concrete prior
scoring the sample by that relaxed sample, and SVI recovering a known probability (pyro#2629)."""

import numpy as np
import pytest
from scipy.special import expit, softmax

from tests.cases import BINARY_SPECS, N_ARY_SPECS
from tests.helpers import assert_close

# (straight-through name, the log-space node drawing the same sample, the relaxed distribution)
PAIRS = {
    "ConcreteStraightThrough": ("ExpConcrete", "Concrete"),
    "BinConcreteStraightThrough": ("LogitBinConcrete", "BinConcrete"),
}
CASES = [("ConcreteStraightThrough", t, logits) for t, logits in N_ARY_SPECS] + [
    ("BinConcreteStraightThrough", t, logits) for t, logits in BINARY_SPECS
]


# Same problem and tolerance as tests/test_svi.py: the guide's logits reach the prior's
PRIOR_LOGITS = np.array([1.0, -0.5, 0.3, -1.0])
RECOVERY_TOLERANCE = 0.05


def _id(case):
    name, t, logits = case
    return f"{name}-T{t if np.isscalar(t) else 'batch'}-{np.size(logits)}"


def _make(backend, name, t, logits, dtype="float64"):
    t = t if np.isscalar(t) else np.asarray(t, np.float64)
    return backend.make(name, t, logits=np.asarray(logits, np.float64), dtype=dtype)


def _hard(name, y):
    if name == "ConcreteStraightThrough":
        return np.eye(y.shape[-1])[np.argmax(y, -1)]
    return (y > 0).astype(np.float64)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_values_are_exactly_the_hardened_relaxed_sample(backend, case, dtype):
    name, t, logits = case
    value = backend.numpy(backend.sample(_make(backend, name, t, logits, dtype), (500,), seed=3))
    y = backend.numpy(backend.sample(_make(backend, PAIRS[name][0], t, logits, dtype), (500,), seed=3))
    np.testing.assert_array_equal(value, _hard(name, y))  # exactly 0/1 (and one-hot), no residue
    assert set(np.unique(value)) <= {0.0, 1.0}
    if name == "ConcreteStraightThrough":
        np.testing.assert_array_equal(value.sum(-1), 1.0)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_log_prob_is_the_relaxed_density_of_the_sample(backend, case, dtype):
    """Scored where it was drawn (NumPyro: inside the jitted computation), by the straight-through
    distribution and by its relaxed parent, the value gets the relaxed density of the relaxed sample
    drawn with the same noise."""
    name, t, logits = case
    d, relaxed = _make(backend, name, t, logits, dtype), _make(backend, PAIRS[name][1], t, logits, dtype)
    _, (own, by_relaxed) = backend.score_samples(d, [relaxed], (200,), seed=5)
    _, (expected,) = backend.score_samples(relaxed, (), (200,), seed=5)
    assert np.isfinite(expected).all()
    assert_close(own, expected, dtype)
    assert_close(by_relaxed, expected, dtype)


@pytest.mark.parametrize("name", list(PAIRS))
def test_log_prob_of_a_value_that_is_no_sample_raises(backend, name):
    logits = np.array([0.3, -1.0, 2.0])
    d = _make(backend, name, 0.5, logits)
    value = backend.numpy(backend.sample(d, (10,), seed=1))
    other = np.roll(value, 1, axis=-1) if name == "ConcreteStraightThrough" else 1.0 - value
    with pytest.raises(ValueError, match="not a sample"):
        d.log_prob(backend.array(other))


@pytest.mark.parametrize("name", list(PAIRS))
def test_an_autoguide_over_a_straight_through_site_is_refused_saying_why(backend, name):
    """A model written with a straight-through latent under an autoguide (as under NUTS): the
    autoguide's value, pushed onto the support, is no sample of the site, which has no density of
    values it did not draw. The error said only that the value was a copy or user data; it now says
    that an autoguide's or MCMC's value is such data, and to write the site with Concrete /
    BinConcrete in the model."""
    logits = np.array([0.3, -1.0, 2.0]) if name == "ConcreteStraightThrough" else np.array(0.3)

    def model(x):
        with backend.plate("data", 2):
            backend.site("z", _make(backend, name, 0.5, logits))
            backend.site("x", backend.normal(backend.array(np.zeros(2)), 1.0), obs=x)

    guide = backend.autoguide("AutoNormal", model)
    with pytest.raises(ValueError, match="An autoguide's or MCMC's value .* write the site with Concrete / BinConcrete in the model"):
        backend.elbo_loss(model, guide, backend.array(np.zeros(2)))


@pytest.mark.parametrize("name", list(PAIRS))
def test_copies_and_equal_user_data_raise_while_the_sample_lives(backend, name):
    """The sample's discrete content alone cannot say which relaxed sample is behind a value: a copy
    of a live sample, and user data equal to exactly one live sample, raise instead of borrowing
    that sample's density (formerly a copy was matched by content)."""
    d = _make(backend, name, 0.5, np.array([2.0, -1.0, 0.5, 0.0]))
    content = backend.numpy(backend.sample(d, (), seed=4))  # user data equal to the sample drawn below
    for make_value in [*(lambda x, i=i: backend.copies(x)[i] for i in range(3)), lambda x: backend.array(content)]:

        def score_a_value_like_the_sample():
            sample = backend.sample(d, (), seed=4)
            d.log_prob(sample)  # the sample itself is scored
            return d.log_prob(make_value(sample))

        with pytest.raises(ValueError, match="not a sample"):
            backend.in_trace(score_a_value_like_the_sample)


@pytest.mark.parametrize("dtype", ["float32"])  # where a relaxed sample sits on a vertex: the hard case
@pytest.mark.parametrize("case", [c for c in CASES if np.isscalar(c[1])], ids=_id)
def test_a_concrete_prior_scores_the_sample_by_the_relaxed_sample_behind_it(backend, case, dtype):
    """A relaxed prior (Concrete, BinConcrete) with a straight-through guide: the prior scores the
    discrete value by the relaxed sample behind it -- finite, as the guide's own log_prob -- where
    the discrete value itself is a vertex of the simplex (or 0/1), where the density is only a limit."""
    name, t, logits = case
    prior_logits = np.linspace(-1.0, 1.0, np.size(logits)).reshape(np.shape(logits))
    d = _make(backend, name, t, logits, dtype)
    prior = _make(backend, PAIRS[name][1], 2 * t, prior_logits, dtype)
    relaxed = _make(backend, PAIRS[name][1], t, logits, dtype)
    _, (_, by_prior) = backend.score_samples(d, [prior], (100,), seed=2)
    _, (_, expected) = backend.score_samples(relaxed, [prior], (100,), seed=2)
    assert np.isfinite(expected).all()
    assert_close(by_prior, expected, dtype)


@pytest.mark.parametrize("name", list(PAIRS))
def test_svi_with_a_relaxed_prior_and_a_straight_through_guide_has_finite_losses(backend, name):
    event = 1 if name == "BinConcreteStraightThrough" else 0

    def model():
        backend.site("z", _make(backend, PAIRS[name][1], 0.5, PRIOR_LOGITS).to_event(event))

    def guide():
        phi = backend.param("phi", 5 * PRIOR_LOGITS)  # confident: the relaxed sample is near a vertex
        backend.site("z", getattr(backend.lib, name)(0.1, logits=phi).to_event(event))

    losses, _ = backend.svi(model, guide, steps=20, lr=0.01, seed=0)
    assert np.all(np.isfinite(losses))


def _objective(backend, cls_name, logits, t, weights):
    d = getattr(backend.lib, cls_name)(t, logits=logits)
    value = backend.sample(d, (50,), seed=7)
    return ((weights * value).sum() + d.log_prob(value).sum()) / 50


@pytest.mark.parametrize("case", [c for c in CASES if min(np.ravel(c[1])) >= 0.1], ids=_id)
def test_gradients_are_those_of_the_relaxed_sample(backend, case):
    """d/d(logits, t) of E[w . value] + E[log_prob(value)] equals that of the relaxed sample."""
    name, t, logits = case
    weights = np.random.default_rng(0).normal(size=np.shape(_hard(name, np.asarray(logits, float))))
    args = (np.asarray(logits, np.float64), np.asarray(t, np.float64), weights)
    _, straight_through = backend.value_and_grad(_objective, *args, static=(backend, name))
    _, relaxed = backend.value_and_grad(_objective, *args, static=(backend, PAIRS[name][1]))
    for g_st, g_relaxed in zip(straight_through[:2], relaxed[:2]):  # logits, temperature
        np.testing.assert_allclose(g_st, g_relaxed, rtol=1e-10, atol=1e-12)
        assert np.abs(g_st).max() > 1e-4




@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", list(PAIRS))
def test_svi_recovers_a_known_probability(backend, name, jit):
    event = 1 if name == "BinConcreteStraightThrough" else 0

    def model():
        backend.site("z", _make(backend, name, 2 / 3, PRIOR_LOGITS).to_event(event))

    def guide():
        phi = backend.param("phi", np.zeros(4))
        backend.site("z", getattr(backend.lib, name)(2 / 3, logits=phi).to_event(event))

    losses, params = backend.svi(model, guide, steps=800, lr=0.02, seed=0, num_particles=32, jit=jit)
    probs = expit if event else softmax
    assert np.abs(probs(params["phi"]) - probs(PRIOR_LOGITS)).max() < RECOVERY_TOLERANCE
    assert np.all(np.isfinite(losses))


@pytest.mark.parametrize("name", list(PAIRS))
def test_test_time_limit_is_the_discrete_distribution(backend, name):
    logits = np.array([0.3, -1.0, 2.0])
    limit = _make(backend, name, 0.5, logits).discrete()
    expected = softmax(logits) if name == "ConcreteStraightThrough" else expit(logits)
    np.testing.assert_allclose(backend.numpy(limit.probs), expected, rtol=1e-12)
