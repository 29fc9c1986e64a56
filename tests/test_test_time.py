"""Test-time modes: the discrete graph of a relaxed model, by sampling, enumeration and argmax;
``relax``; the log-space reparametrizer; and the evaluation helpers -- checked against brute-force
enumeration on small mixtures."""

import re
import threading
import warnings

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, log_expit, logsumexp, softmax

from tests.cases import N_ARY, NAMES
from tests.helpers import assert_frequencies

N = 50
RNG = np.random.default_rng(0)
DATA = np.concatenate([RNG.normal(-3, 1, 20), RNG.normal(0, 1, 15), RNG.normal(3.5, 1, 15)])
MEANS = {True: np.array([-3.0, 0.0, 3.5]), False: np.array([-3.0, 3.5])}  # n-ary: 3 components, binary: 2
LOGITS = {True: np.array([0.3, -0.2, 0.1]), False: np.array(0.4)}


def _component_weights(backend, name, z):
    """The mixture weights a relaxed value stands for: one-hot (n-ary) or P(component 1) (binary)."""
    if name == "ExpConcrete":
        return backend.exp(z)
    if name == "LogitBinConcrete":
        return backend.sigmoid(z)
    return z


def mixture(backend, name, temperature=0.5, data_size=N, observed=True):
    """x_n ~ Normal(mean of component z_n, 1), z_n a relaxed assignment of distribution ``name``."""
    n_ary = name in N_ARY
    means, logits = backend.array(MEANS[n_ary]), backend.array(LOGITS[n_ary])

    def model(x=None):
        with backend.plate("data", data_size):
            z = backend.site("z", getattr(backend.lib, name)(temperature, logits=logits))
            w = _component_weights(backend, name, z)
            loc = (w * means).sum(-1) if n_ary else means[0] + w * (means[1] - means[0])
            if observed:
                backend.site("x", backend.normal(loc, 1.0), obs=x)

    return model


def _brute_force(name):
    """log p(z_n = k) + log p(x_n | k) for every point and component (n, K)."""
    n_ary = name in N_ARY
    log_prior = np.log(softmax(LOGITS[True])) if n_ary else np.array([log_expit(-LOGITS[False]), log_expit(LOGITS[False])])
    return log_prior[None, :] + stats.norm.logpdf(DATA[:, None], MEANS[n_ary][None, :], 1.0)


def _as_index(name, value):
    """The component index of a value in the discrete graph's sample space."""
    value = np.asarray(value)
    return value.argmax(-1) if name in N_ARY else (value > 0.5 if name == "BinConcrete" else value > 0).astype(int)


@pytest.mark.parametrize("name", NAMES)
def test_marginal_log_likelihood_is_the_brute_force_sum(backend, name):
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(mixture(backend, name), backend.array(DATA))))
    expected = logsumexp(_brute_force(name), axis=1).sum()
    assert abs(actual - expected) < 1e-6, (actual, expected)


@pytest.mark.parametrize("dtype,gap,x", [("float32", 20.0, 4.5), ("float32", 100.0, 10.0), ("float64", 45.0, 10.0), ("float64", 800.0, 100.0)])
def test_marginal_log_likelihood_gradient_where_the_prior_and_the_likelihood_disagree(backend, dtype, gap, x):
    """A two-component mixture whose second component has prior mass e^-gap and holds the point x:
    the gradient of log p(x) by the mixture logits and means, against the exact one. Pyro's sum over
    the enumerated values takes the log of a sum of terms shifted by each factor's own maximum, and
    its gradient is 1 / max(sum, eps): with the prior's and the likelihood's maxima at different
    values the sum is about e^-gap, below eps at the first and third gap, and the gradient came out
    scaled down by sum / eps; at the second and fourth the sum underflows (the value was -inf in
    float32). The value to a few float32 ulps, the gradient to 1e-4 of its size (2 at most, 4x
    larger by the means). NumPyro's sum (funsor's) had the exact gradient but gave -inf where the
    sum underflows; both now sum again past underflow (docs/numerics.rst)."""
    means, sigma = np.array([0.0, 5.0]), 0.5
    data = backend.array([x], dtype)

    def log_marginal(logits, mu):
        def model(data):
            with backend.plate("data", 1):
                z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
                backend.site("x", backend.normal((z * mu).sum(-1), sigma), obs=data)

        return backend.lib.marginal_log_likelihood(model, data)

    value, (by_logits, by_means) = backend.value_and_grad(log_marginal, [0.0, -gap], means, dtype=dtype)
    joint = log_softmax_2([0.0, -gap]) + stats.norm.logpdf(x, means, sigma)
    posterior = softmax(joint)
    np.testing.assert_allclose(value, logsumexp(joint), rtol=1e-6)
    np.testing.assert_allclose(by_logits, posterior - softmax([0.0, -gap]), rtol=0, atol=1e-4)
    np.testing.assert_allclose(by_means, posterior * (x - means) / sigma**2, rtol=1e-4, atol=1e-4)


def test_marginal_log_likelihood_with_a_value_ruled_out(backend):
    """A site that rules out a value (``Delta(1 - z_3)`` observed at 1: log density -inf at the third
    category, as a structural zero of a left-to-right HMM's emissions): Pyro's sum takes products of
    factors without a summed dimension, where the -inf makes a term 0; summed again over the
    broadcast terms, such a step reduced over every dimension and raised a RuntimeError about
    shapes. Now the brute-force sum."""
    emissions = np.log(np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6]]))
    log_em = backend.array(emissions)
    observed = np.array([[0, 2], [1, 1]])

    def model(y1, y2):
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(np.zeros(3))))
            backend.site("allowed", backend.delta(1.0 - z[..., 2]), obs=backend.array([1.0, 1.0]))
            backend.site("y1", backend.categorical(log_em[z.argmax(-1)]), obs=y1)
            backend.site("y2", backend.categorical(log_em[z.argmax(-1)]), obs=y2)

    expected = sum(logsumexp(np.log(1 / 3) + emissions[:2, a] + emissions[:2, b]) for a, b in zip(*observed))
    y1, y2 = (backend.array(row, "int64") for row in observed)
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, y1, y2)))
    assert abs(actual - expected) < 1e-9 * abs(expected), (actual, expected)


def log_softmax_2(logits):
    return np.asarray(logits) - logsumexp(logits)


@pytest.mark.parametrize("name", NAMES)
def test_map_assignment_is_the_brute_force_argmax(backend, name):
    assignment = backend.lib.map_assignment(mixture(backend, name), backend.array(DATA))
    value = backend.numpy(assignment["z"])
    np.testing.assert_array_equal(_as_index(name, value), _brute_force(name).argmax(1))
    # in the site's own sample space
    index = _brute_force(name).argmax(1)
    if name == "Concrete":
        np.testing.assert_array_equal(value, np.eye(3)[index])
    elif name == "ExpConcrete":
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(value, np.log(np.eye(3)[index]))
    elif name == "BinConcrete":
        np.testing.assert_array_equal(value, index.astype(float))
    else:
        np.testing.assert_array_equal(value, np.where(index > 0, np.inf, -np.inf))


@pytest.mark.parametrize("name", NAMES)
def test_sample_mode_draws_the_discrete_prior(backend, name):
    """discrete(mode="sample"): values on the vertices, frequencies of the discrete prior."""
    model = backend.lib.discrete(mixture(backend, name, data_size=20000, observed=False), mode="sample")
    site = backend.run(model, seed=3).sites["z"]
    index = _as_index(name, site.value)
    probs = softmax(LOGITS[True]) if name in N_ARY else np.array([1 - expit(LOGITS[False]), expit(LOGITS[False])])
    assert_frequencies(np.bincount(index, minlength=len(probs)), probs)
    # scored with the discrete mass
    np.testing.assert_allclose(site.log_prob, np.log(probs)[index], rtol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_argmax_mode_takes_the_mode_and_scores_it(backend, name):
    model = backend.lib.discrete(mixture(backend, name), mode="argmax")
    sites = backend.run(model, backend.array(DATA), seed=4).sites
    probs = softmax(LOGITS[True]) if name in N_ARY else np.array([1 - expit(LOGITS[False]), expit(LOGITS[False])])
    index = _as_index(name, sites["z"].value)
    np.testing.assert_array_equal(index, np.argmax(probs))
    np.testing.assert_allclose(sites["z"].log_prob, np.log(probs[np.argmax(probs)]), rtol=1e-10)


def test_infer_discrete_samples_the_exact_posterior(backend):
    """discrete(mode="enumerate") under the PPL's own infer_discrete (temperature 1): 4000 points
    all observed at x = 0.5 share one posterior, which the sampled assignments follow."""
    model = backend.lib.discrete(mixture(backend, "Concrete", data_size=4000), mode="enumerate")
    run = backend.infer_discrete(model, backend.array(np.full(4000, 0.5)), temperature=1, first_available_dim=-2, seed=5)
    value = run.sites["z"].value
    assert value.shape == (4000,)  # the trace holds the enumerated index; the model saw one-hot values
    log_posterior = np.log(softmax(LOGITS[True])) + stats.norm.logpdf(0.5, MEANS[True], 1.0)
    assert_frequencies(np.bincount(value.astype(int), minlength=3), softmax(log_posterior))


def test_wrappers_are_kept(backend):
    """Independent (to_event), masks and an explicit ExpandedDistribution survive the swap: shapes,
    masked entries and the event sum of the discrete masses."""
    logits = np.array([[0.3, -0.2, 0.1], [1.0, 0.0, -1.0]])
    keep = np.array([True, False, True])

    def model():
        backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(logits)).to_event(1))
        binary = backend.lib.BinConcrete(0.5, logits=backend.array([0.2, -0.4, 0.0]))
        backend.site("b", binary.mask(backend.array(keep, "bool")))
        backend.site("e", backend.expanded(backend.lib.ExpConcrete(0.5, logits=backend.array(logits[0])), (4,)))

    sites = backend.run(backend.lib.discrete(model, mode="argmax")).sites
    np.testing.assert_array_equal(sites["z"].value, np.eye(3)[logits.argmax(1)])
    np.testing.assert_allclose(sites["z"].log_prob, np.sum(np.log(softmax(logits, axis=1)).max(1)), rtol=1e-12)
    np.testing.assert_array_equal(sites["b"].value, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(sites["b"].log_prob, np.where(keep, log_expit(np.abs([0.2, -0.4, 0.0])), 0.0), rtol=1e-12)
    assert sites["e"].value.shape == (4, 3) and sites["e"].fn == "ExpOneHotCategorical"
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(sites["e"].value, np.log(np.eye(3)[[0] * 4]))


def two_site_mixture(backend, validate_args=None):
    """Two discrete sites per point: a 3-way Concrete and a BinConcrete shift."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits, validate_args=validate_args))
            b = backend.site("b", backend.lib.BinConcrete(0.5, logits=backend.array(-0.3), validate_args=validate_args))
            backend.site("x", backend.normal((z * means).sum(-1) + 2.0 * b, 1.0), obs=x)

    return model


def test_two_discrete_sites_in_one_model(backend):
    log_prior = np.log(softmax(LOGITS[True]))[:, None] + np.array([log_expit(0.3), log_expit(-0.3)])[None, :]
    loc = MEANS[True][:, None] + 2.0 * np.array([0.0, 1.0])[None, :]
    joint = log_prior[None] + stats.norm.logpdf(DATA[:, None, None], loc[None], 1.0)  # (n, 3, 2)
    model = two_site_mixture(backend)
    marginal = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(DATA))))
    assert abs(marginal - logsumexp(joint.reshape(N, -1), axis=1).sum()) < 1e-6
    assignment = backend.lib.map_assignment(model, backend.array(DATA))
    best = joint.reshape(N, -1).argmax(1)
    np.testing.assert_array_equal(backend.numpy(assignment["z"]).argmax(-1), best // 2)
    np.testing.assert_array_equal(backend.numpy(assignment["b"]), (best % 2).astype(float))


def _in_sample_space(name, index):
    """The discrete graph's value of component ``index`` (n,) in site ``name``'s sample space."""
    with np.errstate(divide="ignore"):
        return {"Concrete": np.eye(3)[index], "ExpConcrete": np.log(np.eye(3)[index]),
                "BinConcrete": index.astype(float), "LogitBinConcrete": np.where(index > 0, np.inf, -np.inf)}[name]


@pytest.mark.filterwarnings("ignore:TraceEnum_ELBO found no sample sites")  # Pyro's: nothing left to enumerate
@pytest.mark.parametrize("name", NAMES)
def test_a_site_conditioned_outside_the_enumerate_mode_is_scored_by_its_limit(backend, name):
    """condition(discrete(model, mode="enumerate"), {"z": value}): the condition sets the value after
    the mode made the site an index. Before, Pyro scored the one-hot as three indices under the
    index distribution (a wrong finite log joint) and NumPyro crashed; now the site is scored by its
    discrete limit, as in sample mode, and the rest of the model is still enumerated."""
    index = np.random.default_rng(1).integers(0, 3 if name in N_ARY else 2, N)
    conditioned = backend.condition(backend.lib.discrete(mixture(backend, name), mode="enumerate"), {"z": _in_sample_space(name, index)})
    loss = float(backend.numpy(backend.enum_loss(conditioned, lambda x=None: None, backend.array(DATA))))
    np.testing.assert_allclose(-loss, _brute_force(name)[np.arange(N), index].sum(), rtol=1e-9)


def test_one_enumerate_mode_over_labelled_and_unlabelled_runs(backend):
    """One ``discrete(model, mode="enumerate")`` run with the label observed, then latent, then
    observed again (a semi-supervised model): an observed run left the previous run's index decoding
    in place, which then raised (or, before, decoded the observed one-hot once more)."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x, y=None):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(logits=logits), obs=y)
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    enumerated, x = backend.lib.discrete(model, mode="enumerate"), backend.array(DATA)
    labels = np.random.default_rng(4).integers(0, 3, N)
    observed = _brute_force("Concrete")[np.arange(N), labels].sum()
    for y, expected in ((labels, observed), (None, logsumexp(_brute_force("Concrete"), axis=1).sum()), (labels, observed)):
        loss = float(backend.numpy(backend.enum_loss(enumerated, lambda x, y=None: None, x, None if y is None else backend.array(np.eye(3)[y]))))
        np.testing.assert_allclose(-loss, expected, rtol=1e-9)


def test_a_site_conditioned_outside_the_enumerate_mode_beside_an_enumerated_one(backend):
    """z conditioned outside the mode, b summed out: sum_n log sum_b p(z_n, b, x_n)."""
    log_prior = np.log(softmax(LOGITS[True]))[:, None] + np.array([log_expit(0.3), log_expit(-0.3)])[None, :]
    joint = log_prior[None] + stats.norm.logpdf(DATA[:, None, None], (MEANS[True][:, None] + 2.0 * np.array([0.0, 1.0]))[None], 1.0)
    index = np.random.default_rng(2).integers(0, 3, N)
    conditioned = backend.condition(backend.lib.discrete(two_site_mixture(backend), mode="enumerate"), {"z": np.eye(3)[index]})
    loss = float(backend.numpy(backend.enum_loss(conditioned, lambda x=None: None, backend.array(DATA))))
    np.testing.assert_allclose(-loss, logsumexp(joint[np.arange(N), index], axis=1).sum(), rtol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_an_autoguide_initialized_at_the_map_assignment_trains(backend, name):
    """AutoNormal with init_to_value at map_assignment's values (one-hot, log one-hot, 0/1, ±inf),
    a user's warm start: each starts at the preimage of the nearest interior point, and training
    runs. LogitBinConcrete's ±inf went through the identity: a NaN loss in Pyro, "Cannot find valid
    initial parameters" in NumPyro (tests/test_constraints.py checks the preimages' values)."""
    model, x = mixture(backend, name), backend.array(DATA)
    guide = backend.autoguide("AutoNormal", model, init_values=backend.lib.map_assignment(model, x))
    losses, params = backend.svi(model, guide, x, steps=3, lr=0.01)
    assert np.isfinite(losses).all() and all(np.isfinite(value).all() for value in params.values()), (losses, params)


def test_a_relaxed_site_given_at_a_discrete_value(backend):
    """``given={"b": 0/1 values}`` holds the BinConcrete site at discrete values, its own density left
    out: p(x | b) and the MAP of z given b, as brute force gives them. Pyro scored the given value
    with the BinConcrete density before masking it, a ValueError (under validation) about discrete
    data that the user could not act on."""
    log_b = np.array([log_expit(0.3), log_expit(-0.3)])
    joint = (np.log(softmax(LOGITS[True]))[:, None] + log_b[None, :])[None] + stats.norm.logpdf(
        DATA[:, None, None], (MEANS[True][:, None] + 2.0 * np.array([0.0, 1.0]))[None], 1.0)
    b = np.random.default_rng(3).integers(0, 2, N)
    given_joint = joint[np.arange(N), :, b] - log_b[b][:, None]  # (n, 3): z given b, b's density left out
    model, x, given = two_site_mixture(backend), backend.array(DATA), {"b": backend.array(b.astype(float))}
    marginal = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x, given=given)))
    np.testing.assert_allclose(marginal, logsumexp(given_joint, axis=1).sum(), rtol=1e-9)
    best = backend.lib.map_assignment(model, x, given=given)
    np.testing.assert_array_equal(backend.numpy(best["z"]).argmax(-1), given_joint.argmax(1))


@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment"])
@pytest.mark.parametrize("handler", ["condition", "hold"])
def test_a_relaxed_site_conditioned_inside_at_a_discrete_value_raises(backend, helper, handler):
    """``condition(model, {"b": 0/1 values})``: the relaxed site is observed data where its density
    is +inf, so the log joint is +inf for every assignment. NumPyro's map_assignment, compiled,
    returned the argmax of those ties (index 0) with no error; each helper now raises (NumPyro's
    compiled decoding from a callback, whose error carries the message). A value held by the host's
    own handler inside the model (``hold``: NumPyro's ``substitute``, Pyro's ``replay``) is
    conditioned alike: the helpers enumerated the held site as if it were free (log p(x), and the
    decoding's own b), with no error."""
    b = np.random.default_rng(3).integers(0, 2, N).astype(float)
    model = getattr(backend, handler)(two_site_mixture(backend, validate_args=False), {"b": b})  # the density's own check off
    with pytest.raises(ValueError, match=rf"{helper}: site 'b' \(BinConcrete\) is observed at a point of its support's boundary"):
        getattr(backend.lib, helper)(model, backend.array(DATA))


# (class, temperature, a discrete value of its sample space, the logits): the density's limit there is
# finite (BinConcrete at T = 1, Concrete K = 3 at T = 2) or 0 (T above those), or the log-space nodes' ±inf
OBSERVED_AT_THE_BOUNDARY = [
    ("BinConcrete", 1.0, 1.0, 0.8),
    ("BinConcrete", 1.5, 0.0, 0.8),
    ("Concrete", 2.0, [1.0, 0.0, 0.0], [0.3, -0.2, 0.5]),
    ("ExpConcrete", 0.5, [0.0, -np.inf, -np.inf], [0.3, -0.2, 0.5]),
    ("LogitBinConcrete", 0.5, np.inf, 0.8),
]


@pytest.mark.parametrize("name, t, value, logits", OBSERVED_AT_THE_BOUNDARY, ids=[f"{c[0]}-T{c[1]}" for c in OBSERVED_AT_THE_BOUNDARY])
@pytest.mark.parametrize("validate", [True, False])
def test_a_relaxed_site_observed_at_a_discrete_value_raises_whatever_its_limit(backend, name, t, value, logits, validate):
    """A discrete label observed at a relaxed site (an SS-VAE's y, written with the relaxed prior):
    where the boundary limit of the density is finite or 0, ``marginal_log_likelihood`` returned it
    as the label's log-likelihood (BinConcrete at T = 1: a finite number, not the Bernoulli's) or
    -inf. Every helper raises now, with validation on or off; elements masked out (padding) are left
    alone, and the discrete counterpart scores the same data exactly. ``discrete_log_likelihood``
    refuses it too."""
    x = np.array([0.4, -1.1])

    def model(x, kept=(True, True), site=None):
        d = site or backend.make(name, t, logits=np.asarray(logits), validate_args=validate)
        with backend.plate("data", 2):
            s = backend.site("s", backend.lib.BinConcrete(0.5, logits=backend.array(0.2)))
            with backend.mask(np.array(kept)):
                backend.site("y", d, obs=backend.array(np.stack([value, value])))
            backend.site("x", backend.normal(2.0 * s, 1.0), obs=x)

    # under validation the density's own check may refuse the value first, eagerly (its message: test_errors.py)
    refused = rf"site 'y' \({name}\) is observed at a point of its support's boundary|{name}\.log_prob: .* density is only a limit"
    for helper in ("marginal_log_likelihood", "map_assignment"):
        with pytest.raises(ValueError, match=refused):
            getattr(backend.lib, helper)(model, backend.array(x))

    def guide(x, kept=(True, True), site=None):
        with backend.plate("data", 2):
            backend.site("s", backend.lib.BinConcrete(0.5, logits=backend.array(0.1)))

    with pytest.raises(ValueError, match=refused):  # the bound scored the label by the limit too
        backend.discrete_log_likelihood(model, guide, backend.array(x), num_particles=2)
    mixture = np.logaddexp(log_expit(0.2) + stats.norm.logpdf(x, 2.0, 1.0), log_expit(-0.2) + stats.norm.logpdf(x, 0.0, 1.0)).sum()
    if not validate:  # both elements masked out: the boundary values are padding, and the model is the mixture over s
        padded = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(x), (False, False))))
        np.testing.assert_allclose(padded, mixture, rtol=1e-9)
    # the discrete counterpart of the relaxed class, observed at the same value (log-space: its limit's value)
    limit = backend.make(name, t, logits=np.asarray(logits)).discrete()
    exact = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(x), (True, True), limit)))
    data_log_prob = float(backend.numpy(limit.log_prob(backend.array(np.asarray(value))))) * 2
    np.testing.assert_allclose(exact, mixture + data_log_prob, rtol=1e-9)


def trainable_mixture(backend):
    """The Concrete mixture with learned component means, and a guide with local logits."""
    logits = backend.array(LOGITS[True])

    def model(x):
        means = backend.param("means", np.array([-1.0, 0.0, 1.0]))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", np.zeros((N, 3)))
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(2 / 3, logits=phi))

    return model, guide


def _posterior_guide(backend, name):
    """A Concrete-family guide whose discrete limit is the exact posterior of each point."""
    log_joint = _brute_force(name)
    posterior_logits = log_joint if name in N_ARY else log_joint[:, 1] - log_joint[:, 0]

    def guide(x=None):
        phi = backend.param("phi", posterior_logits)
        with backend.plate("data", N):
            backend.site("z", getattr(backend.lib, name)(2 / 3, logits=phi))

    return guide


@pytest.mark.parametrize("name", NAMES)
def test_discrete_log_likelihood_with_the_exact_posterior_is_the_marginal(backend, name):
    """With the guide's discrete limit equal to the posterior every importance weight is p(x):
    L_m equals log p(x) for any m, jointly and per data point."""
    model, guide, x = mixture(backend, name), _posterior_guide(backend, name), backend.array(DATA)
    expected = logsumexp(_brute_force(name), axis=1)
    joint = backend.discrete_log_likelihood(model, guide, x, num_particles=3, seed=0)
    per_point = backend.discrete_log_likelihood(model, guide, x, num_particles=3, plate="data", seed=1)
    assert abs(float(joint) - expected.sum()) < 1e-6
    np.testing.assert_allclose(per_point, expected, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sites", [None, "z"])
def test_the_helpers_inside_a_relax_block_evaluate_the_discrete_graph(backend, name, sites):
    """A training loop under ``with relax(...)`` that evaluates now and then: the relax outside the
    helper turned the discrete graph's limits relaxed again, and discrete_log_likelihood gave a bound
    above log p(x) (z = +9 over 30 runs); with ``sites`` named, the exact helpers refused the
    enumerated index. The helpers' runs are hidden from the handlers outside the call."""
    model, guide, x = mixture(backend, name), _posterior_guide(backend, name), backend.array(DATA)
    expected = logsumexp(_brute_force(name), axis=1)
    with backend.lib.relax(temperature=0.5, sites=sites):
        per_point = backend.discrete_log_likelihood(model, guide, x, num_particles=3, plate="data", seed=1)
        marginal = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x)))
        best = backend.lib.map_assignment(model, x)
    np.testing.assert_allclose(per_point, expected, atol=1e-8)
    np.testing.assert_allclose(marginal, expected.sum(), rtol=1e-9)
    np.testing.assert_array_equal(_as_index(name, backend.numpy(best["z"])), _brute_force(name).argmax(1))


def test_a_helper_inside_a_model_leaves_its_sites_out_of_the_callers_trace(backend):
    """A model that calls a helper (the exact log-likelihood of a sub-model as a term): the helper's
    own runs of its model reached the caller's trace, whose log joint then held them too (Pyro:
    -41.2 for -9.1); a condition around the call held the helper's sites at the caller's values."""
    sub, x = mixture(backend, "Concrete"), backend.array(DATA)
    expected = logsumexp(_brute_force("Concrete"), axis=1).sum()
    values = []

    def model():
        backend.site("mu", backend.normal(0.0, 1.0))
        values.append(float(backend.numpy(backend.lib.marginal_log_likelihood(sub, x))))
        values.append(_as_index("Concrete", backend.numpy(backend.lib.map_assignment(sub, x)["z"])))

    run = backend.run(model)
    assert set(run.sites) == {"mu"}
    np.testing.assert_allclose(values[0], expected, rtol=1e-9)
    np.testing.assert_array_equal(values[1], _brute_force("Concrete").argmax(1))
    held = np.eye(3)[np.zeros(N, dtype=int)]  # every point in component 0: not the helper's model
    values.clear()
    backend.run(backend.condition(model, {"z": held}))
    np.testing.assert_allclose(values[0], expected, rtol=1e-9)
    np.testing.assert_array_equal(values[1], _brute_force("Concrete").argmax(1))


def test_a_helper_inside_the_callers_plate_allocates_its_own_plates(backend):
    """A helper called inside the caller's plate (a per-group term, or ``Trace_ELBO``'s vectorized
    particles): Pyro's allocator of plate dimensions is global, so the helper's plate took the next
    dimension, left of its data, and the host raised "Invalid tensor shape" (ninth round of user
    trials). The helper's plates start afresh; the caller's are back after it."""
    sub, x = mixture(backend, "Concrete"), backend.array(DATA)
    values = []

    def model():
        with backend.plate("groups", 2):
            values.append(float(backend.numpy(backend.lib.marginal_log_likelihood(sub, x))))
            values.append(_as_index("Concrete", backend.numpy(backend.lib.map_assignment(sub, x)["z"])))
            return backend.site("mu", backend.normal(0.0, 1.0))

    mu = backend.run(model).sites["mu"].value
    assert backend.numpy(mu).shape == (2,)  # the caller's plate, still at its dimension
    np.testing.assert_allclose(values[0], logsumexp(_brute_force("Concrete"), axis=1).sum(), rtol=1e-9)
    np.testing.assert_array_equal(values[1], _brute_force("Concrete").argmax(1))


def test_a_helper_inside_a_model_the_host_enumerates(backend):
    """A helper called inside a model whose own discrete sites the host enumerates (its value a term
    of the model): the hosts keep enumeration dimensions in global state, and the helper's run reset
    them under the caller (Pyro: "Invalid tensor shape"; NumPyro: funsor's KeyError 'data'). The
    caller's enumeration is exact around the call, with the helper's value as a factor."""
    sub, x = mixture(backend, "Concrete"), backend.array(DATA)

    def model():
        y = backend.site("y", backend.bernoulli(backend.array(0.3)), infer={"enumerate": "parallel"})
        backend.factor("sub", backend.lib.marginal_log_likelihood(sub, x))
        w = backend.site("w", backend.bernoulli(backend.array(0.6)), infer={"enumerate": "parallel"})
        backend.site("o", backend.normal(y + 2.0 * w, 1.0), obs=backend.array(1.7))

    exact = logsumexp([np.log(py * pw) + stats.norm.logpdf(1.7, y + 2.0 * w, 1.0) for y, py in ((0, 0.7), (1, 0.3)) for w, pw in ((0, 0.4), (1, 0.6))])
    exact += logsumexp(_brute_force("Concrete"), axis=1).sum()
    np.testing.assert_allclose(-backend.enum_loss(model, lambda: None), exact, rtol=1e-9)


def test_the_helpers_arguments_that_name_the_wrong_thing_raise(backend):
    """``given`` naming an observed site left it out of the log joint (marginal_log_likelihood 0.0
    for a model with no other observation), ``params`` of another type than a dict was taken, and a
    misspelled ``plate`` was reported as a latent outside it, to be conditioned on a value; NumPy's
    integers were refused for ``num_particles``."""
    model, guide, x = mixture(backend, "Concrete"), _posterior_guide(backend, "Concrete"), backend.array(DATA)
    with pytest.raises(ValueError, match=r"^marginal_log_likelihood: given names the observed site 'x'"):
        backend.lib.marginal_log_likelihood(model, x, given={"x": x})
    with pytest.raises(ValueError, match=r"^map_assignment: params must be None or a dict from parameter name to value, got list"):
        backend.lib.map_assignment(model, x, params=[1.0])
    with pytest.raises(ValueError, match=r"^discrete_log_likelihood: plate 'dat' is not a plate of the model \(its plates: \['data'\]\)"):
        backend.discrete_log_likelihood(model, guide, x, plate="dat")
    bound = backend.discrete_log_likelihood(model, guide, x, num_particles=np.int64(2), plate="data")
    np.testing.assert_allclose(bound, logsumexp(_brute_force("Concrete"), axis=1), atol=1e-8)


def test_a_name_in_sites_that_no_site_of_the_model_has_raises(backend):
    """``sites="Z"`` for a site named "z": the site was left as it was, with no error --
    ``discrete(model, mode="argmax", sites="Z")`` returned relaxed values as the mode, and ``relax``
    left a discrete site discrete. A run whose sites all miss the names raises, as a wrapper or as
    a ``with`` block; a block that no site reaches names nothing wrongly."""
    model, x = mixture(backend, "Concrete"), backend.array(DATA)
    logits = backend.array(LOGITS[True])

    def discrete_model(x=None):
        with backend.plate("data", N):
            backend.site("z", backend.lib.limits.OneHotCategorical(logits=logits))

    message = r"sites= names \['Z'\], none of which is a sample site of the model \(its sites: \['x', 'z'\]\)"
    with pytest.raises(ValueError, match="discrete: " + message):
        backend.run(backend.lib.discrete(model, mode="argmax", sites="Z"), x)
    with pytest.raises(ValueError, match="discrete: " + message):
        with backend.lib.discrete(mode="argmax", sites=["Z"]):
            backend.run(model, x)
    with pytest.raises(ValueError, match=r"relax: sites= names \['Z'\], none of which is a sample site of the model \(its sites: \['z'\]\)"):
        backend.run(backend.lib.relax(discrete_model, temperature=0.5, sites=["Z"]))
    run = backend.run(backend.lib.discrete(model, mode="argmax", sites="z"), x)
    np.testing.assert_array_equal(run.sites["z"].value, np.eye(3)[np.full(N, LOGITS[True].argmax())])
    with backend.lib.discrete(mode="argmax", sites="Z"):
        pass


def test_sites_naming_a_site_that_only_some_runs_draw_is_no_error(backend):
    """Names of sites that a run does not draw (``z_2`` beyond a minibatch's chain of two steps): the
    eighth round's check raised on every run that missed any name, so training stopped at random
    steps (ninth round of user trials); a run that has one of the names is left alone, and the
    named sites it has are relaxed or swapped."""
    logits = backend.array(LOGITS[True])

    def chain(steps):
        for t in range(steps):
            backend.site(f"z_{t}", backend.lib.limits.OneHotCategorical(logits=logits))

    names = ["z_0", "z_1", "z_2"]
    relaxed = backend.run(backend.lib.relax(chain, temperature=0.5, sites=names), 2)
    assert set(relaxed.sites) == {"z_0", "z_1"}
    assert not set(np.unique(backend.numpy(relaxed.sites["z_1"].value))) <= {0.0, 1.0}  # a relaxed draw
    mode = backend.run(backend.lib.discrete(backend.lib.relax(chain, temperature=0.5), mode="argmax", sites=names), 2)
    np.testing.assert_array_equal(mode.sites["z_1"].value, np.eye(3)[LOGITS[True].argmax()])
    with pytest.raises(ValueError, match=r"relax: sites= names \['z_2', 'z_3'\], none of which is a sample site of the model \(its sites: \['z_0', 'z_1'\]\)"):
        backend.run(backend.lib.relax(chain, temperature=0.5, sites=["z_2", "z_3"]), 2)


@pytest.mark.parametrize("name", NAMES)
def test_a_plate_of_size_one_keeps_its_dimension_in_the_decodings(backend, name):
    """A last minibatch of one point: the hosts' ``infer_discrete`` drops a plate dimension of size 1,
    and the decodings returned (K,) for the trace's (1, K) (NumPyro's map_assignment only on a tie,
    x = 0 here, where it falls back to infer_discrete; Predictive (4, K) for (4, 1, K))."""
    n_ary, means = name in N_ARY, backend.array([-2.0, 2.0])
    event = (2,) if n_ary else ()

    def model(x):
        with backend.plate("data", 1):
            z = backend.site("z", getattr(backend.lib, name)(0.5, logits=backend.array(np.zeros(2) if n_ary else 0.0)))
            w = _component_weights(backend, name, z)
            backend.site("x", backend.normal((w * means).sum(-1) if n_ary else -2.0 + 4.0 * w, 1.0), obs=x)

    for point in (-1.5, 0.0):  # component 0; a tie
        x = backend.array([point])
        best = backend.numpy(backend.lib.map_assignment(model, x)["z"])
        drawn = backend.numpy(backend.sample_assignment(model, x, seed=1)["z"])
        draws = backend.numpy(backend.predictive(model, x, num_samples=4, infer_discrete=True, seed=2)["z"])
        assert best.shape == drawn.shape == (1,) + event and draws.shape == (4, 1) + event, (best.shape, drawn.shape, draws.shape)
        if point < 0:
            assert _as_index(name, best)[0] == 0


def test_a_host_site_of_a_probability_of_exactly_one_is_exact_in_the_helpers_and_refused_by_relax(backend):
    """``Bernoulli(probs=1.0)``, a certain coin: the hosts turn the probability into logits of
    log(1 - eps) - log(eps), a mass of 1.2e-7 in float32 at the impossible value, so the exact sum
    was not the model's (-16.86 for -61.42 where only the impossible value explains x = 9). The
    helpers enumerate it by its probabilities' own logarithms (it was refused: tenth round of user
    trials); ``relax`` refuses it, since no Concrete distribution has a probability of 0
    (``BinConcrete(probs=1.0)`` itself refuses it)."""
    x = backend.array([9.0], "float32")

    def model(x):
        with backend.plate("data", 1):
            z = backend.site("z", backend.bernoulli(backend.array(1.0, "float32")))
            backend.site("x", backend.normal(9.0 - 11.0 * z, 1.0), obs=x)

    expected = stats.norm.logpdf(9.0, -2.0, 1.0)
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x)))
    assert abs(actual - expected) < 1e-5 * abs(expected), (actual, expected)
    assert backend.numpy(backend.lib.map_assignment(model, x)["z"]).tolist() == [1]
    assert backend.numpy(backend.sample_assignment(model, x, seed=0)["z"]).tolist() == [1]
    message = r"site 'z' is \w+\(probs=\.\.\.\) with a probability that the host clamps before using it"
    with pytest.raises(ValueError, match="relax: " + message):
        backend.run(backend.lib.relax(model, temperature=0.5), x)


@pytest.mark.parametrize("kind", ["bernoulli", "one_hot_categorical"])
def test_a_host_site_of_a_probability_below_eps_is_exact(backend, kind):
    """A probability of 1e-30 in float32, as a network's sigmoid or softmax gives: Pyro clamps every
    probability below eps = 1.2e-7 (``probs_to_logits``), NumPyro a Bernoulli's below its smallest
    normal number, and the exact sum, where only that value explains x = 9, was -16.86 for -69.99
    (ninth round of user trials; then Pyro's Bernoulli was refused). The helpers enumerate a site
    given probabilities by their own logarithms."""
    x = backend.array([9.0], "float32")

    def model(x):
        with backend.plate("data", 1):
            if kind == "bernoulli":
                z = backend.site("z", backend.bernoulli(backend.array(1e-30, "float32")))
            else:
                one_hot = backend.site("z", backend.one_hot_categorical(backend.array([1.0, 1e-30], "float32")))
                z = one_hot[..., 1]
            backend.site("x", backend.normal(-11.0 + 20.0 * z, 1.0), obs=x)

    expected = logsumexp([np.log(1e-30) + stats.norm.logpdf(9.0, 9.0, 1.0), np.log1p(-1e-30) + stats.norm.logpdf(9.0, -11.0, 1.0)])
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x)))
    assert abs(actual - expected) < 1e-5 * abs(expected), (actual, expected)


@pytest.mark.parametrize("kind", ["bernoulli", "bernoulli_of_zero", "one_hot_categorical"])
def test_an_observed_host_site_given_a_probability_the_host_clamps_is_exact(backend, kind):
    """An observation given a probability below eps, or of exactly 0: the hosts' log densities clamp
    it (Pyro every probability to [eps, 1 - eps]: -15.94 for log(.5e-30 + .5e-20) = -46.74, and for
    an impossible observation, whose log p(x) is -inf; NumPyro a Bernoulli's to [tiny, 1 - eps]:
    log tiny). The earlier rounds made the latent sites exact; the observed ones are scored by their
    probabilities' own logarithms now (eleventh round of user trials)."""
    low = {"bernoulli": (1e-30, 1e-20), "bernoulli_of_zero": (0.0, 0.0)}.get(kind)

    def model():
        z = backend.site("z", backend.bernoulli(backend.array(0.5, "float32")))
        if kind == "one_hot_categorical":
            backend.site("x", backend.one_hot_categorical(backend.array([1.0, 1e-30], "float32")), obs=backend.array([0.0, 1.0], "float32"))
        else:
            probs = low[0] + (low[1] - low[0]) * z  # the observation's probability given z
            backend.site("x", backend.bernoulli(probs), obs=backend.array(1.0, "float32"))

    with np.errstate(divide="ignore"):
        expected = np.log(1e-30) if low is None else np.logaddexp(np.log(0.5 * low[0]), np.log(0.5 * low[1]))
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model)))
    assert actual == expected or abs(actual - expected) < 1e-5 * abs(expected), (actual, expected)


@pytest.mark.parametrize("kind", ["bernoulli", "bin_concrete"])
def test_a_latent_masked_out_where_an_unmasked_site_reads_it_is_refused_by_the_sums(backend, kind):
    """NumPyro's discrete-imputation idiom: the latent masked out (``.mask(False)``), its prior added
    back by a factor, its children unmasked. The helpers sum a masked-out latent with its prior masses
    (a padded data point, its children masked too, contributes 0), which counted the prior twice here:
    -10.917 for -6.870, and draws from the wrong posterior (eleventh round of user trials). Where an
    unmasked site reads a masked-out latent the sums and draws raise; the MAP, which leaves a
    masked-out site out as the host does, is the host's: brute force per element. (The bounds of
    ``discrete_log_likelihood`` weigh such a site by its masses too, and raise alike.)"""
    x = backend.array([1.9, 0.1, 1.2])  # the first element's MAP is 1 by the prior once, 0 by the prior twice
    prior = 0.3

    def model(x):
        with backend.plate("data", 3):
            with backend.mask(backend.array([False, False, False], "bool")):
                if kind == "bernoulli":
                    a = backend.site("a", backend.bernoulli(backend.array(prior)))
                else:
                    a = backend.site("a", backend.make("BinConcrete", 0.5, probs=backend.array(prior)))
            backend.factor("a_prior", a * np.log(prior) + (1 - a) * np.log1p(-prior))
            backend.site("x", backend.normal(a, 1.0), obs=x)

    def guide(x):
        with backend.plate("data", 3):
            proposal = backend.bernoulli(backend.array(0.5)) if kind == "bernoulli" else backend.make("BinConcrete", 0.5, probs=0.5)
            backend.site("a", proposal)

    for helper in (
        backend.lib.marginal_log_likelihood,
        lambda model, x: backend.sample_assignment(model, x, seed=0),
        lambda model, x: backend.discrete_log_likelihood(model, guide, x),
    ):
        with pytest.raises(ValueError, match="site 'a' is masked out where the unmasked site 'a_prior' reads its value"):
            helper(model, x)
    scores = np.log([1 - prior, prior])[:, None] + stats.norm.logpdf(np.array([1.9, 0.1, 1.2])[None, :], np.array([[0.0], [1.0]]), 1.0)
    assert backend.numpy(backend.lib.map_assignment(model, x)["a"]).tolist() == np.argmax(scores, 0).tolist()


def test_a_missing_step_masked_with_its_child_is_summed_under_markov(backend):
    """Independent mixtures per step under ``markov``, step 0 missing (its latent masked with its child):
    a valid padding. A first version of the eleventh round's masked-latent check crashed on the
    enumeration dimensions ``markov`` reuses (a chain of 3 or more steps) and took step 2, which
    reuses step 0's dimension, for a reader of step 0. Closed form over the kept steps."""
    x = [0.3, -1.2, 2.0, 0.7]
    weights, means = np.array([0.4, 0.6]), np.array([-1.0, 1.0])

    def model():
        for t in backend.markov(range(4)):
            with backend.mask(backend.array(t > 0, "bool")):
                z = backend.site(f"z{t}", backend.categorical(backend.array(np.log(weights))))
                backend.site(f"x{t}", backend.normal(backend.array(means)[z], 1.0), obs=backend.array(x[t]))

    expected = sum(np.logaddexp.reduce(np.log(weights) + stats.norm.logpdf(x[t], means, 1.0)) for t in range(1, 4))
    assert float(backend.numpy(backend.lib.marginal_log_likelihood(model))) == pytest.approx(expected, rel=1e-10)
    assert sorted(backend.sample_assignment(model, seed=0)) == ["z0", "z1", "z2", "z3"]


def test_the_gradient_beside_a_probability_of_zero_is_exact(backend):
    """A learnable probability q in a row [1 - q, q, 0] with a structural 0 (a left-to-right chain's):
    Pyro's logarithm of the 0 had a NaN gradient, which the Categorical's normalization spread to q
    (eleventh round of user trials). The exact gradient: d/dq log((1 - q) N(x; 0, 1) + q N(x; 1, 1))."""
    x = backend.array([1.3])

    def log_marginal(q):
        def model():
            with backend.plate("data", 1):
                z = backend.site("z", backend.one_hot_categorical(q * backend.array([-1.0, 1.0, 0.0]) + backend.array([1.0, 0.0, 0.0])))
                backend.site("x", backend.normal((z * backend.array([0.0, 1.0, 2.0])).sum(-1), 1.0), obs=x)

        return backend.lib.marginal_log_likelihood(model)

    value, (grad,) = backend.value_and_grad(log_marginal, 0.3)
    likelihoods = stats.norm.pdf(1.3, [0.0, 1.0], 1.0)
    assert value == pytest.approx(np.log(0.7 * likelihoods[0] + 0.3 * likelihoods[1]), rel=1e-12)
    assert float(grad) == pytest.approx((likelihoods[1] - likelihoods[0]) / (0.7 * likelihoods[0] + 0.3 * likelihoods[1]), rel=1e-10)


@pytest.mark.parametrize("kind", ["bernoulli", "one_hot_categorical"])
def test_padding_of_probability_one_masked_out_is_summed_exactly(backend, kind):
    """A padded element whose probability is 1 (or a row [1, 0]), masked out with its child, as padded
    data is: the whole model was refused for a clamped probability, though the padding affects
    nothing (tenth round of user trials). The real element's sum over z decides alone:
    log(0.7 N(1.5; 0, 1) + 0.3 N(1.5; 2, 1))."""
    x = backend.array([1.5, 0.0])

    def model(x):
        with backend.plate("data", 2), backend.mask(backend.array([True, False], "bool")):
            if kind == "bernoulli":
                z = backend.site("z", backend.bernoulli(backend.array([0.3, 1.0])))
            else:
                z = backend.site("z", backend.one_hot_categorical(backend.array([[0.7, 0.3], [0.0, 1.0]])))[..., 1]
            backend.site("x", backend.normal(2.0 * z, 1.0), obs=x)

    expected = np.log(0.7 * stats.norm.pdf(1.5, 0.0, 1.0) + 0.3 * stats.norm.pdf(1.5, 2.0, 1.0))
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x)))
    assert abs(actual - expected) < 1e-10, (actual, expected)
    best = backend.numpy(backend.lib.map_assignment(model, x)["z"])
    assert np.reshape(best, (2, -1))[0, -1] == 1  # 0.3 N(1.5; 2, 1) = 0.106 > 0.7 N(1.5; 0, 1) = 0.091


def test_the_map_of_padded_chains_leaves_the_padding_out(backend):
    """Chains of lengths 1, 2 and 1 padded to 2 (``mask=(t < lengths)``, as the hosts' HMM examples):
    the MAP decoding summed a masked-out state with its prior masses, and in max-product that
    contributes max_k p(x1 = k | x0), not 1, biasing x0 -- the MAP of a padded chain was 1 where it is
    0, in both packages, while the hosts' own infer_discrete was right. The padding contributes
    nothing now; the brute force over every chain's states decides."""
    prior, trans, locs = np.array([0.55, 0.45]), np.array([[0.5, 0.5], [0.99, 0.01]]), np.array([-1.0, 1.0])
    y0, y1, padded = np.array([0.0, 0.3, 0.0]), np.array([0.0, 1.2, 0.0]), np.array([True, False, True])

    def model():
        with backend.plate("chains", 3):
            x0 = backend.site("x0", backend.lib.Concrete(0.5, probs=backend.array(prior)))
            backend.site("y0", backend.normal((x0 * backend.array(locs)).sum(-1), 1.0), obs=backend.array(y0))
            with backend.mask(~padded):
                x1 = backend.site("x1", backend.lib.Concrete(0.5, probs=x0 @ backend.array(trans)))
                backend.site("y1", backend.normal((x1 * backend.array(locs)).sum(-1), 1.0), obs=backend.array(y1))

    best = backend.lib.map_assignment(model)
    x0, x1 = backend.numpy(best["x0"]).argmax(-1), backend.numpy(best["x1"]).argmax(-1)
    for n in range(3):
        head = np.log(prior) + stats.norm.logpdf(y0[n], locs, 1.0)
        if padded[n]:
            assert x0[n] == head.argmax(), (n, x0, head)
        else:
            joint = head[:, None] + np.log(trans) + stats.norm.logpdf(y1[n], locs, 1.0)[None, :]
            assert (x0[n], x1[n]) == np.unravel_index(joint.argmax(), joint.shape), (n, x0, x1, joint)
    assert x0[0] == 0  # the case the bias got wrong: 0.55 * 0.5 against 0.45 * 0.99


def test_the_map_of_a_masked_out_latent_is_decided_by_its_children(backend):
    """A latent masked out (its own density left out) whose observed child is not: its value still
    matters through the child, z = 1 (log joint -0.92) against z = 0 (-13.42) at every point.
    NumPyro's max-product gradient put each site's potential inside its mask, so a masked-out site
    had no gradient and was decoded as the first value, 0 (before the ninth round of user trials)."""

    def model():
        with backend.plate("points", 3):
            with backend.mask(np.array([False, False, True])):
                z = backend.site("z", backend.lib.BinConcrete(0.5, probs=backend.array(np.full(3, 0.9))))
            backend.site("x", backend.normal(5.0 * z, 1.0), obs=backend.array(np.array([5.0, 0.0, 2.4])))

    decoded = backend.numpy(backend.lib.map_assignment(model)["z"])
    # points 0 and 1 masked: the child alone decides (5.0 -> 1, 0.0 -> 0); point 2 keeps its prior:
    # 0.9 N(2.4 | 5) = e^-4.40 against 0.1 N(2.4 | 0) = e^-6.10
    np.testing.assert_array_equal(decoded, [1.0, 0.0, 1.0])


def test_an_index_decoded_under_a_plate_outside_the_enumerate_mode_is_an_index(backend):
    """S decodings at once, a plate around ``discrete(model, mode="enumerate")`` under the host's
    infer_discrete: the replayed index (S, N) was counted against the site's batch shape inside the
    mode alone, and where N equals K it passed for a one-hot -- the site held at it, not enumerated,
    so the MAP was thrown away (Pyro: prior draws; NumPyro: (3, 3) for (3, 3, 3), or a broadcasting
    error). The plates outside the mode count too."""
    means, data = backend.array([-5.0, 0.0, 5.0]), backend.array([-5.0, 0.0, -5.0])  # N = K = 3

    def model():
        with backend.plate("data", 3):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(np.zeros(3))))
            backend.site("x", backend.normal((z * means).sum(-1), 0.3), obs=data)

    enumerated = backend.lib.discrete(model, mode="enumerate")

    def batched():
        with backend.plate("samples", 2, dim=-2):
            enumerated()

    run = backend.infer_discrete(batched, temperature=0, first_available_dim=-3)
    value = run.sites["z"].value
    decoded = value.argmax(-1) if value.shape[-1:] == (3,) and value.ndim == 3 else value
    np.testing.assert_array_equal(np.asarray(decoded).reshape(2, 3), [[0, 1, 0], [0, 1, 0]])


def test_a_one_hot_site_of_a_probability_of_exactly_zero_is_summed_exactly(backend):
    """``OneHotCategorical(probs=[0, .5, .5])`` and one observation that only the impossible category
    explains: Pyro summed the category with the host's clamped logit log(eps), -16.86 for the model's
    -26.11; the index it enumerates has the probability's own -inf now (NumPyro's had)."""
    means = backend.array([9.0, -2.0, 2.0], "float32")

    def model(x):
        with backend.plate("data", 1):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(probs=backend.array([0.0, 0.5, 0.5], "float32")))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    expected = logsumexp(np.log(0.5) + stats.norm.logpdf(9.0, [-2.0, 2.0], 1.0))
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array([9.0], "float32"))))
    np.testing.assert_allclose(actual, expected, rtol=1e-5)


def test_a_helper_in_one_thread_leaves_another_threads_samples_alone(backend):
    """One thread evaluates the discrete graph while another draws and scores relaxed samples (a
    Gumbel-softmax layer trained beside an evaluation thread): the other thread's sampler and
    log_prob raised, as if they ran inside the helper. The guard's state is per thread."""
    d = backend.make("Concrete", 0.5, logits=LOGITS[True], dtype="float32")  # JAX's x64 mode is per thread
    sub, x = mixture(backend, "Concrete"), backend.array(DATA)
    started, finished, outcome, calls = threading.Event(), threading.Event(), [], []

    def model(x=None):
        calls.append(None)
        if len(calls) == last:  # the last run, the discrete graph's sum, waits for the other thread
            started.set()
            finished.wait(60)
        sub(x)

    last = 0
    backend.lib.marginal_log_likelihood(model, x)  # counts the helper's runs of the model
    last, calls[:] = len(calls), []

    def other():
        started.wait(60)
        try:
            value, (log_prob,) = backend.score_samples(d, sample_shape=(7,), seed=3)
            outcome.append((value, log_prob))
        except Exception as error:  # noqa: BLE001 -- reported below
            outcome.append(error)
        finally:
            finished.set()

    thread = threading.Thread(target=other)
    thread.start()
    marginal = float(backend.numpy(backend.lib.marginal_log_likelihood(model, x)))
    thread.join(60)
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    value, log_prob = outcome[0]
    assert value.shape == (7, 3) and np.isfinite(log_prob).all()
    np.testing.assert_allclose(marginal, logsumexp(_brute_force("Concrete"), axis=1).sum(), rtol=1e-9)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_discrete_log_likelihood_hides_autoguide_sites(backend, name):
    """An AutoNormal guide cannot be discretized: its site and the auxiliary ``z_unconstrained``
    are hidden, the model draws z from its discrete prior, and L_m (per point, m = 4000) is then the
    prior-proposal bound: within Monte Carlo error of log p(x) -- hiding only the main site would
    leave log q of the auxiliary site in the weights, off by tens of nats."""
    model, x = mixture(backend, name), backend.array(DATA)
    guide = backend.autoguide("AutoNormal", model)
    _, params = backend.svi(model, guide, x, steps=1, lr=0.0, seed=0)  # initialize its parameters
    m = 4000
    bound = backend.discrete_log_likelihood(model, guide, x, num_particles=m, plate="data", params=params, seed=2)
    expected = logsumexp(_brute_force(name), axis=1)
    # the weights are w = p(x | z), z from the prior: the log of their mean has standard error
    # CV / sqrt(m) and bias -CV^2 / (2m), with CV^2 = E[w^2] / E[w]^2 - 1 known exactly here
    prior = np.exp(_brute_force(name) - stats.norm.logpdf(DATA[:, None], MEANS[name in N_ARY][None, :], 1.0))
    likelihood = stats.norm.pdf(DATA[:, None], MEANS[name in N_ARY][None, :], 1.0)
    cv2 = (prior * likelihood**2).sum(1) / (prior * likelihood).sum(1) ** 2 - 1
    np.testing.assert_array_less(bound, expected + 5 * np.sqrt(cv2 / m))  # 5 standard errors per point
    total_error = abs(bound.sum() - expected.sum() + np.sum(cv2) / (2 * m))
    assert total_error < 5 * np.sqrt(np.sum(cv2) / m), (bound.sum(), expected.sum())


def test_masked_points_contribute_nothing(backend):
    """Enumerated sites under a mask: the masked points are summed out with their prior masses and
    contribute 0, in both backends (NumPyro's TraceEnum_ELBO drops the mask on the enumerated
    site; Pyro's would add log K per point)."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])
    keep = np.arange(N) >= 10

    def model(x):
        with backend.plate("data", N), backend.mask(keep):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(DATA))))
    expected = logsumexp(_brute_force("Concrete"), axis=1)[keep].sum()
    assert abs(actual - expected) < 1e-6, (actual, expected)


# ----------------------------------------------------------------------------- relax and discrete


def written_discrete(backend):
    """A model written with discrete distributions, with an observed discrete site, a scaled site,
    a masked site and a subsampled plate."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        label = backend.site("label", backend.lib.limits.OneHotCategorical(logits=logits), obs=backend.array([0.0, 1.0, 0.0]))
        with backend.scale(2.0):
            flip = backend.site("flip", backend.lib.limits.Bernoulli(logits=backend.array(0.2)))
        with backend.plate("data", N, subsample_size=20):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(logits=logits))
            with backend.mask(np.arange(20) % 3 > 0):
                backend.site("w", backend.lib.limits.Bernoulli(logits=backend.array(-0.5)))
            backend.site("x", backend.normal((z * means).sum(-1) + flip + 0 * label.sum(), 1.0), obs=x[:20])

    return model


def _scaled_mixture(backend, z_scale, x_scale, data_size, deterministic=False):
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        if deterministic:
            backend.deterministic("total", x.sum())
        with backend.plate("data", data_size):
            with backend.scale(z_scale):
                z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            with backend.scale(x_scale):
                backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    return model


def test_a_common_scale_weighs_the_marginal_and_leaves_the_posterior_alone(backend):
    """``scale(s)`` around the latent and the observations weighs the log joint: the marginal is
    s log p(x) (as Pyro's TraceEnum_ELBO sums it), the MAP and the posterior draws are those of
    p(z | x). NumPyro's funsor ``log_density`` scaled each factor before the sum out (sum_n log sum_z
    p(x_n, z)^s) and its ``infer_discrete`` drew from p(z | x)^s normalized: both failed this test.
    Different scales on z and x are refused, as Pyro refuses them."""
    s = 3.0
    expected = s * logsumexp(_brute_force("Concrete"), axis=1).sum()
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(_scaled_mixture(backend, s, s, N), backend.array(DATA))))
    assert abs(actual - expected) < 1e-5 * abs(expected), (actual, expected)
    best = backend.lib.map_assignment(_scaled_mixture(backend, s, s, N), backend.array(DATA))
    np.testing.assert_array_equal(backend.numpy(best["z"]), np.eye(3)[_brute_force("Concrete").argmax(1)])
    draws = backend.sample_assignment(_scaled_mixture(backend, s, s, 4000), backend.array(np.full(4000, 0.5)), seed=5)
    log_posterior = np.log(softmax(LOGITS[True])) + stats.norm.logpdf(0.5, MEANS[True], 1.0)
    assert_frequencies(np.bincount(backend.numpy(draws["z"]).argmax(-1), minlength=3), softmax(log_posterior))
    for z_scale, x_scale in ((s, 1.0), (1.0, s), (2.0, s)):  # 1.0: a scale of one, as none
        # named, in both (Pyro passed on the host's error, which named neither the helper nor the sites)
        with pytest.raises(ValueError, match=r"^marginal_log_likelihood: sites '\w+' and '\w+' have different scales"):
            backend.lib.marginal_log_likelihood(_scaled_mixture(backend, z_scale, x_scale, N), backend.array(DATA))


def _scaled_guide(backend, scale):
    def guide(x):
        phi = backend.param("phi", np.zeros((N, 3)))
        with backend.plate("data", N), backend.scale(scale):
            backend.site("z", backend.lib.Concrete(2 / 3, logits=phi))

    return guide


@pytest.mark.parametrize("plate", [None, "data"])
def test_a_common_scale_weighs_the_discrete_log_likelihood(backend, plate):
    """``scale(s)`` on every site of the model and the guide: the bound is s L_m (the same draws, so
    exactly s times the unscaled bound), whose mean is below s log p(x), ``marginal_log_likelihood``'s
    value. It was log (1/m) sum_i w_i^s, whose mean can exceed s log p(x). Different scales are refused."""
    s, x, m = 3.0, backend.array(DATA), 50
    unscaled = backend.discrete_log_likelihood(_scaled_mixture(backend, 1.0, 1.0, N), _scaled_guide(backend, 1.0), x, num_particles=m, plate=plate, seed=4)
    scaled = backend.discrete_log_likelihood(_scaled_mixture(backend, s, s, N), _scaled_guide(backend, s), x, num_particles=m, plate=plate, seed=4)
    np.testing.assert_allclose(scaled, s * unscaled, rtol=1e-9)
    # a deterministic site outside the scale holds no density: it does not count (Pyro counted it)
    with_deterministic = _scaled_mixture(backend, s, s, N, deterministic=True)
    np.testing.assert_allclose(backend.discrete_log_likelihood(with_deterministic, _scaled_guide(backend, s), x, num_particles=m, plate=plate, seed=4),
                               scaled, rtol=1e-9)
    # each site named with its owner: the model's z and the guide's z (it said "sites 'z' and 'z'")
    for z_scale, x_scale, guide_scale, sites in ((s, s, 1.0, "'z' of the model and 'z' of the guide"), (s, 1.0, s, "'z' and 'x'")):
        with pytest.raises(ValueError, match=f"sites {sites} have different scales"):
            backend.discrete_log_likelihood(_scaled_mixture(backend, z_scale, x_scale, N), _scaled_guide(backend, guide_scale), x, num_particles=m, plate=plate)


@pytest.mark.parametrize("name", ["Concrete", "LogitBinConcrete"])
def test_a_value_set_from_outside_the_enumerate_mode_is_read_in_the_sites_own_space(backend, name):
    """Posterior samples handed back to the host's own tools with the model in the enumerate mode
    (NumPyro's log_likelihood and Predictive substitute them, Pyro's Importance replays them): the
    value, one-hot (or +-inf), as the helpers and Predictive return it, was read as an index --
    the one-hot scored as three indices, and the model given a (K, K) one-hot of it: log-likelihoods of
    shape (3, 3) for (3,), Importance's log normalizer -10.9 for -1.56. It is now scored by the
    site's limit at that value, as condition is; a relaxed value (a guide that draws the site)
    raises, naming the site."""
    logits = np.array([0.3, -0.5, 0.8]) if name == "Concrete" else np.array([0.4, -1.2, 2.0])
    locs = np.array([-1.0, 0.5, 2.0])
    data = np.array([0.3, 2.5, -0.4])

    def model(x):
        with backend.plate("data", 3):
            if name == "Concrete":
                z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(logits)))
                mean = (z * backend.array(locs)).sum(-1)
            else:
                z = backend.site("z", backend.lib.LogitBinConcrete(0.5, logits=backend.array(logits)))
                mean = 2.0 * (z > 0)
            backend.site("x", backend.normal(mean, 1.0), obs=x)

    if name == "Concrete":
        index = np.array([2, 0, 1])
        value, log_prior = np.eye(3)[index], np.log(softmax(logits))[index]
        mean = locs[index]
    else:
        index = np.array([1, 0, 1])
        value, log_prior = np.where(index, np.inf, -np.inf), np.where(index, log_expit(logits), log_expit(-logits))
        mean = 2.0 * index
    run = backend.run(backend.hold(backend.lib.discrete(model, mode="enumerate"), {"z": value}), backend.array(data))
    np.testing.assert_allclose(run.sites["x"].log_prob, stats.norm.logpdf(data, mean, 1.0), rtol=1e-12)
    np.testing.assert_allclose(run.sites["z"].log_prob, log_prior, rtol=1e-12)
    relaxed = np.full((3, 3), 1 / 3) if name == "Concrete" else np.array([0.3, -1.0, 2.0])
    with pytest.raises(ValueError, match="site 'z' is given a value from outside discrete.* not on its discrete support"):
        backend.run(backend.hold(backend.lib.discrete(model, mode="enumerate"), {"z": relaxed}), backend.array(data))


def test_relax_then_discrete_gives_back_the_log_joint(backend):
    model, x = written_discrete(backend), backend.array(DATA)
    original = backend.run(model, x, seed=5)
    relaxed = backend.lib.relax(model, temperature=lambda site: {"flip": 0.5, "z": 2 / 3}.get(site["name"], 0.4))
    relaxed_run = backend.run(relaxed, x, seed=5)
    assert {n: s.fn for n, s in relaxed_run.sites.items() if not s.is_observed} == {"flip": "BinConcrete", "z": "Concrete", "w": "BinConcrete"}
    assert relaxed_run.sites["label"].fn == "OneHotCategorical"  # observed: untouched
    assert relaxed_run.sites["flip"].scale == 2.0
    back = backend.run(backend.lib.discrete(relaxed), x, seed=6, replay=original)
    for name, site in original.sites.items():
        np.testing.assert_allclose(back.sites[name].log_prob, site.log_prob, rtol=1e-12)
    assert abs(back.log_joint - original.log_joint) < 1e-9


def test_sites_filter(backend):
    model, x = written_discrete(backend), backend.array(DATA)
    relaxed = backend.run(backend.lib.relax(model, temperature=0.5, sites=["z"]), x, seed=7)
    assert relaxed.sites["z"].fn == "Concrete" and relaxed.sites["flip"].fn == "Bernoulli"
    half_back = backend.lib.discrete(backend.lib.relax(model, temperature=0.5), mode="argmax", sites="flip")
    sites = backend.run(half_back, x, seed=8).sites
    assert sites["flip"].fn == "Bernoulli" and sites["z"].fn == "Concrete"
    assert float(sites["flip"].value) == 1.0  # logits 0.2 > 0: the mode


def test_relax_takes_any_real_number_or_array_as_temperature(backend):
    """NumPy's float32 and 0-d arrays are numbers too (they were refused as "not a number"); a bool
    is not a temperature."""
    model, x = written_discrete(backend), backend.array(DATA)
    reference = backend.run(backend.lib.relax(model, temperature=0.5, sites=["z"]), x, seed=7).sites
    for temperature in (np.float32(0.5), np.float64(0.5), np.array(0.5), backend.array(0.5)):
        sites = backend.run(backend.lib.relax(model, temperature=temperature, sites=["z"]), x, seed=7).sites
        assert sites["z"].fn == "Concrete" and sites["flip"].fn == "Bernoulli", temperature
        np.testing.assert_allclose(sites["z"].log_prob, reference["z"].log_prob, rtol=1e-6)  # the same draw, at 0.5
    with pytest.raises(ValueError, match="relax: temperature must be a number"):
        backend.lib.relax(model, temperature=True)


def test_relax_leaves_an_integer_categorical_alone_and_refuses_it_by_name(backend):
    """The hosts' ``Categorical`` (integer values, which index arrays: NumPyro's examples write their
    mixtures so) has no relaxation. Left alone among the sites relax takes by default, as before;
    named in ``sites=``, it raised nothing and trained with the integer site unchanged, where the user
    had asked for it to be relaxed: now a ValueError pointing to the one-hot form."""
    logits = backend.array(LOGITS[True])

    def model():
        backend.site("c", backend.categorical(logits))
        backend.site("flip", backend.lib.limits.Bernoulli(logits=backend.array(0.2)))

    sites = backend.run(backend.lib.relax(model, temperature=0.5)).sites
    assert sites["c"].fn.startswith("Categorical") and sites["flip"].fn == "BinConcrete"
    with pytest.raises(ValueError, match="relax: site 'c' is Categorical.*, whose values are integers .*OneHotCategorical"):
        backend.run(backend.lib.relax(model, temperature=0.5, sites=["c", "flip"]))


@pytest.mark.parametrize("helper", ["map_assignment", "sample_assignment", "Predictive"])
def test_decoding_refuses_a_scale_on_the_observations_alone(backend, helper):
    """``infer_discrete`` applies masks, not scales: Pyro's MAP and posterior draws of a model whose
    observations alone are scaled (``scale(6)``) were those of the unscaled model, with no error
    (the docs, and NumPyro's helpers, refuse two scales). Now a ValueError naming both sites; a scale
    common to every site passes (the same posterior, and MAP)."""
    data = backend.array(DATA[:4])

    def model(x, observed_scale, latent_scale=1.0):
        with backend.plate("data", 4), backend.scale(latent_scale):
            z = backend.site("z", backend.lib.BinConcrete(0.5, logits=backend.array(1.5)))
            with backend.scale(observed_scale / latent_scale):
                backend.site("obs", backend.normal(3.0 * z, 1.0), obs=x)

    def run(*args):
        if helper == "Predictive":
            return backend.predictive(model, data, *args, num_samples=1, infer_discrete=True)["z"]
        if helper == "sample_assignment":
            return backend.sample_assignment(model, data, *args)["z"]
        return backend.lib.map_assignment(model, data, *args)["z"]

    with pytest.raises(ValueError, match="sites 'z' and 'obs' have different scales"):
        run(6.0)
    if helper == "map_assignment":
        expected = (log_expit(1.5) + stats.norm.logpdf(DATA[:4], 3.0, 1.0) > log_expit(-1.5) + stats.norm.logpdf(DATA[:4], 0.0, 1.0))
        np.testing.assert_array_equal(backend.numpy(run(6.0, 6.0)), expected.astype(float))
    else:
        assert set(np.unique(backend.numpy(run(6.0, 6.0)))) <= {0.0, 1.0}


def test_misuse_raises_a_clear_error(backend):
    model, x = mixture(backend, "Concrete"), backend.array(DATA)
    with pytest.raises(ValueError, match="outside the inference handlers"):
        with backend.lib.discrete(mode="enumerate"):
            backend.enum_loss(model, lambda x=None: None, x)

    def binary_event(x=None):
        backend.site("b", backend.lib.BinConcrete(0.5, logits=backend.array([0.1, 0.2])).to_event(1))

    with pytest.raises(ValueError, match="plate instead of .to_event"):
        backend.lib.marginal_log_likelihood(binary_event)
    with pytest.raises(ValueError, match="mode must be one of"):
        backend.lib.discrete(model, mode="max")
    with pytest.raises(ValueError, match="no temperature given for site 'flip'"):
        backend.run(backend.lib.relax(written_discrete(backend), temperature={"z": 0.5}), x)
    with pytest.raises(ValueError, match="site 'w' holds"):

        def continuous(x=None):
            backend.site("w", backend.normal(0.0, 1.0))

        backend.lib.marginal_log_likelihood(continuous)


# ----------------------------------------------------------------------------- reparametrizer


def _relaxed_pair(backend, k, temperature, dtype):
    logits = backend.array(np.linspace(-50, 50, k), dtype)

    def model():
        backend.site("z", backend.lib.Concrete(temperature, logits=logits))
        backend.site("b", backend.lib.BinConcrete(temperature, logits=backend.array(np.linspace(-50, 50, 7), dtype)).to_event(1))

    def guide():
        phi = backend.param("phi", np.linspace(1, -1, k), dtype)
        psi = backend.param("psi", np.linspace(-1, 1, 7), dtype)
        backend.site("z", backend.lib.Concrete(temperature * 1.5, logits=phi))
        backend.site("b", backend.lib.BinConcrete(temperature * 1.5, logits=psi).to_event(1))

    return model, guide


@pytest.mark.parametrize("k, temperature, dtype", [(4, 0.5, "float64"), (100, 0.01, "float32")])
def test_log_space_reparam_gives_the_same_elbo(backend, k, temperature, dtype):
    """The ELBO with LogSpaceReparam on model and guide equals the ELBO without it -- draw by draw,
    since KL terms are invariant under exp / sigmoid -- and is finite at t = 0.01, K = 100 in float32
    (where x = exp(y) underflows)."""
    model, guide = _relaxed_pair(backend, k, temperature, dtype)
    config = backend.lib.log_space_config
    plain = backend.elbo_loss(model, guide, seed=9, num_particles=8)
    reparametrized = backend.elbo_loss(backend.reparam(model, config), backend.reparam(guide, config), seed=9, num_particles=8)
    assert np.isfinite(plain) and np.isfinite(reparametrized)
    assert abs(plain - reparametrized) <= 1e-4 * max(1.0, abs(plain)), (plain, reparametrized)
    run = backend.run(backend.reparam(guide, config), seed=10)
    assert {"z_log", "b_logit"} <= set(run.sites)


@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment", "sample_assignment"])
def test_a_site_marked_for_sequential_enumeration_is_refused(backend, helper):
    """The helpers sum and decode in parallel; Pyro's ``infer_discrete`` draws a site marked
    ``infer={"enumerate": "sequential"}`` from its prior, so ``map_assignment`` and
    ``sample_assignment`` returned draws that ignored the data (the marginal raised Pyro's
    NotImplementedError). Each helper refuses it, naming the site."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        flip = backend.site("flip", backend.lib.limits.Bernoulli(logits=backend.array(0.2)), infer={"enumerate": "sequential"})
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1) + flip, 1.0), obs=x)

    run = backend.sample_assignment if helper == "sample_assignment" else getattr(backend.lib, helper)
    with pytest.raises(ValueError, match=rf"{helper}: site 'flip' asks for sequential enumeration"):
        run(model, backend.array(DATA))


def test_a_model_written_with_the_discrete_one_hot_is_evaluated_as_written(backend):
    """The discrete counterpart ``limits.OneHotCategorical`` (what ``relax`` relaxes) in the model
    itself: NumPyro's enumeration of one-hot values failed on their shapes (a ValueError about
    event shapes, or about broadcasting), so the helpers enumerate it as an index, as a Concrete site;
    the marginal and the MAP are the brute-force ones, as for the relaxed model."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    data = backend.array(DATA)
    expected = logsumexp(_brute_force("Concrete"), axis=1).sum()
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, data)))
    assert abs(actual - expected) < 1e-6 * abs(expected), (actual, expected)
    best = backend.lib.map_assignment(model, data)
    np.testing.assert_array_equal(backend.numpy(best["z"]), np.eye(3)[_brute_force("Concrete").argmax(1)])


def test_a_masked_discrete_latent_of_the_model_is_summed_with_its_prior_masses(backend):
    """The model's own Bernoulli, masked with its observation: a data point masked out entirely
    contributes 0, as the same point of a Concrete-family site does, so that a model and its
    ``discrete(relax(model))`` agree. The host's enumeration gave the masked latent mass 1 at each
    value (log 2 per masked point), and the two disagreed."""
    keep = np.arange(N) % 3 > 0
    means = backend.array(MEANS[False])

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(LOGITS[False])).mask(backend.array(keep, "bool")))
            with backend.mask(keep):
                backend.site("x", backend.normal(means[0] + z * (means[1] - means[0]), 1.0), obs=x)

    expected = logsumexp(_brute_force("BinConcrete")[keep], axis=1).sum()
    x = backend.array(DATA)
    for fn in (model, backend.lib.relax(model, temperature=0.5)):
        actual = float(backend.numpy(backend.lib.marginal_log_likelihood(fn, x)))
        np.testing.assert_allclose(actual, expected, rtol=1e-9)
    best = backend.numpy(backend.lib.map_assignment(model, x)["z"])
    np.testing.assert_array_equal(best[keep], _brute_force("BinConcrete")[keep].argmax(1))


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_discrete_log_likelihood_of_the_model_as_written_with_its_relaxed_guide(backend, name):
    """The model written with discrete sites (a one-hot categorical, a Bernoulli: the host's), trained
    as relax(model) with a guide of Concrete / BinConcrete sites, and evaluated as written: the guide's
    sites are discretized as for the relaxed model. With the guide at the exact posterior every
    weight is p(x_n). Its relaxed draws were scored by the discrete densities instead: Pyro's bound
    1.4 nats low with validation off (a host error with it on), NumPyro's -inf, with no error."""
    n_ary = name in N_ARY
    joint = _brute_force(name)
    posterior = joint - logsumexp(joint, axis=1, keepdims=True)
    means = backend.array(MEANS[n_ary])

    def model(x):
        with backend.plate("data", N):
            if n_ary:
                z = backend.site("z", backend.lib.limits.OneHotCategorical(logits=backend.array(LOGITS[True])))
                loc = (z * means).sum(-1)
            else:
                z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(LOGITS[False])))
                loc = means[0] + z * (means[1] - means[0])
            backend.site("x", backend.normal(loc, 1.0), obs=x)

    def guide(x):
        logits = posterior if n_ary else posterior[:, 1] - posterior[:, 0]
        with backend.plate("data", N):
            backend.site("z", getattr(backend.lib, name)(0.5, logits=backend.array(logits)))

    bounds = backend.discrete_log_likelihood(model, guide, backend.array(DATA), num_particles=2, plate="data")
    np.testing.assert_allclose(bounds, logsumexp(joint, axis=1), rtol=1e-9)


@pytest.mark.parametrize("hold", ["given", "condition"])
def test_discrete_log_likelihood_proposes_given_the_held_value(backend, hold):
    """A global g held at a value (``given=``, or ``condition`` with the guide drawing g too) and a
    guide q(g) q(z | g) whose q(z | g) is the exact conditional posterior: each weight is then
    p(x | g = v) (given) or p(x, g = v) (condition), so every bound is exact. The guide's z read its
    own draw of g, not v: the bounds were ten nats low, noisy, and not the one documented."""
    shift = np.array([0.0, 4.0])  # x_n ~ N(MEANS[z_n] + shift[g], 1)
    log_prior_g = np.log(softmax([0.3, -0.3]))
    log_lik = np.log(softmax(LOGITS[True]))[None, None] + stats.norm.logpdf(
        DATA[None, :, None], MEANS[True][None, None] + shift[:, None, None], 1.0)  # (g, n, z)
    posterior_logits = log_lik - logsumexp(log_lik, axis=-1, keepdims=True)

    def model(x):
        prior = backend.array([0.3, -0.3])  # a conditioned g is discrete data: written with the discrete one-hot
        g = backend.site("g", backend.lib.Concrete(0.5, logits=prior) if hold == "given" else backend.lib.limits.OneHotCategorical(logits=prior))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(LOGITS[True])))
            backend.site("x", backend.normal((z * backend.array(MEANS[True])).sum(-1) + (g * backend.array(shift)).sum(-1), 1.0), obs=x)

    def guide(x):
        g = backend.site("g", backend.lib.Concrete(0.5, logits=backend.array([0.0, 0.0])))
        logits = (g[..., :, None, None] * backend.array(posterior_logits)).sum(-3)  # q(z | g) at the one-hot g
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=logits))

    value = np.array([1.0, 0.0])
    per_point = logsumexp(log_lik[0], axis=-1)
    if hold == "given":
        fn, kwargs, expected = model, {"given": {"g": backend.array(value)}}, per_point.sum()
    else:
        fn, kwargs, expected = backend.condition(model, {"g": value}), {}, per_point.sum() + log_prior_g[0]
    for seed in range(3):
        bound = backend.discrete_log_likelihood(fn, guide, backend.array(DATA), num_particles=1, seed=seed, **kwargs)
        np.testing.assert_allclose(float(bound), expected, rtol=1e-9)


def test_a_discrete_latent_held_inside_the_model_is_scored_at_its_value(backend):
    """The model's own Bernoulli b (a global shift of every mean), held at 1 by the host's handler
    inside the model (NumPyro's ``substitute``, Pyro's ``replay`` of a partial trace): the exact
    helpers give log p(x, b = 1) and decode z given b, as ``condition`` makes them. They summed b
    out as if it were free -- log p(x), and b decoded -- with no error."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        b = backend.site("b", backend.lib.limits.Bernoulli(logits=backend.array(0.3)))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1) + 2.0 * b, 1.0), obs=x)

    per_point = np.log(softmax(LOGITS[True]))[None] + stats.norm.logpdf(DATA[:, None], MEANS[True][None] + 2.0, 1.0)
    expected = log_expit(0.3) + logsumexp(per_point, axis=1).sum()
    x = backend.array(DATA)
    for fn in (backend.hold(model, {"b": 1.0}), backend.condition(model, {"b": 1.0})):
        np.testing.assert_allclose(float(backend.numpy(backend.lib.marginal_log_likelihood(fn, x))), expected, rtol=1e-9)
        best = backend.lib.map_assignment(fn, x)
        assert set(best) == {"z"}
        np.testing.assert_array_equal(backend.numpy(best["z"]).argmax(-1), per_point.argmax(1))


def test_discrete_log_likelihood_weighs_a_masked_point_by_its_prior_masses(backend):
    """Data points masked out in the model (latent and observation alike), the guide unmasked and
    equal to the prior: each masked point's weight p(z) / q(z) is 1 whatever the draw, so its bound
    is 0, as ``marginal_log_likelihood`` sums it. The host's mask made the weight 1 / q(z): the
    masked points' bounds averaged log K, above the exact 0, and the joint bound with them."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])
    keep = np.arange(N) % 4 > 0

    def model(x):
        with backend.plate("data", N), backend.mask(keep):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    def guide(x):
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=logits))

    x = backend.array(DATA)
    bounds = backend.discrete_log_likelihood(model, guide, x, num_particles=3, plate="data")
    np.testing.assert_array_equal(bounds[~keep], 0.0)
    assert np.all(bounds[keep] < 0)
    # m = 1: the joint bound is the sum of the points' log weights, the masked ones 0
    per_point = backend.discrete_log_likelihood(model, guide, x, num_particles=1, plate="data", seed=1)
    np.testing.assert_array_equal(per_point[~keep], 0.0)
    np.testing.assert_allclose(float(backend.discrete_log_likelihood(model, guide, x, num_particles=1, seed=1)), per_point.sum(), rtol=1e-9)


@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment"])
def test_a_relaxed_site_hidden_from_the_helper_raises(backend, helper):
    """``block(model, hide=["z"])``: the helper's swap to the discrete limit never sees z, which drew
    a relaxed sample: the marginal was log p(x | one random relaxed z), a different value at every
    seed, and Pyro's MAP an empty dict, with no error."""
    model = backend.block(mixture(backend, "Concrete"), hide=["z"])
    with pytest.raises(ValueError, match=rf"{helper}: a Concrete-family distribution drew a relaxed sample .* while the model's discrete graph"):
        backend.in_seed(lambda: getattr(backend.lib, helper)(model, backend.array(DATA)))


@pytest.mark.parametrize("marked", [False, True])
@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment", "sample_assignment"])
def test_a_discrete_site_of_the_host_hidden_from_the_helper_raises(backend, helper, marked):
    """The model's own discrete site (a one-hot categorical, as the host's would be) hidden by
    ``block``: the helper could not enumerate it and the host drew it at random -- the marginal was
    log p(x | one random z), a different value at every call, and the decodings left z out, with
    no error (NumPyro without a seed: a bare AssertionError). Marked for enumeration by the model
    itself (``marked``) it is drawn all the same."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(logits=logits), infer={"enumerate": "parallel"} if marked else None)
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    hidden = backend.block(model, hide=["z"])
    with pytest.raises(ValueError, match=rf"{helper}: site 'z' \(OneHotCategorical\w*\) drew a value while the model's discrete graph"):
        backend.in_seed(lambda: getattr(backend.lib, helper)(hidden, backend.array(DATA)))
    expected = logsumexp(_brute_force("Concrete"), axis=1).sum()  # unhidden, the same model is summed
    np.testing.assert_allclose(float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(DATA)))), expected, rtol=1e-9)


@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment"])
def test_crossed_plates_are_refused_naming_the_cause(backend, helper):
    """Relaxed latents on the rows and on the columns of a table (crossed plates: a bicluster): the
    hosts' enumeration contracts nested plates only, and the helpers passed on its errors -- Pyro's
    about dimension symbols ("[a, c]") the model never named, funsor's "intractable!". They now say
    the plates are crossed and point to discrete_log_likelihood, which bounds such a model."""

    def model(x):
        rows, cols = backend.plate("rows", 2, dim=-2), backend.plate("cols", 2, dim=-1)  # each entered twice
        with rows:
            r = backend.site("r", backend.lib.Concrete(0.5, logits=backend.array(np.zeros(2))))
        with cols:
            c = backend.site("c", backend.lib.Concrete(0.5, logits=backend.array(np.zeros(2))))
        with rows, cols:
            backend.site("x", backend.normal(2.0 * r[..., 0] + c[..., 1], 1.0), obs=x)

    with pytest.raises(ValueError, match=rf"^{helper}: the model's discrete latent sites lie in plates that are not nested"):
        backend.in_seed(lambda: getattr(backend.lib, helper)(model, backend.array([[1.0, -2.0], [0.5, 3.0]])))


def test_a_discrete_one_hot_with_a_category_of_probability_zero(backend):
    """``limits.OneHotCategorical(probs=[0, p, 1 - p])``: the category of probability 0 is never
    chosen. NumPyro's checked the logits it derived, log 0 = -inf, and refused the user's probs
    ("invalid logits parameter")."""
    means = backend.array(MEANS[True])
    probs = np.array([0.0, 0.4, 0.6])

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.limits.OneHotCategorical(probs=backend.array(probs)))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    joint = np.log(probs[1:])[None, :] + stats.norm.logpdf(DATA[:, None], MEANS[True][None, 1:], 1.0)
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, backend.array(DATA))))
    np.testing.assert_allclose(actual, logsumexp(joint, axis=1).sum(), rtol=1e-9)
    best = backend.lib.map_assignment(model, backend.array(DATA))
    np.testing.assert_array_equal(backend.numpy(best["z"]), np.eye(3)[1 + joint.argmax(1)])


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_the_exact_helpers_on_a_log_space_reparametrized_model(backend, name):
    """``reparam(model, log_space_config)`` leaves a deterministic site (a masked Delta) where the
    relaxed one was; under enumeration its value holds only the enumeration's dimensions, and Pyro's
    shape check refused the Delta without the plate's ("Expected [50], actual [1]"). The marginal and
    the MAP are the plain model's."""
    model = mixture(backend, name)
    reparametrized = backend.reparam(model, backend.lib.log_space_config)
    data = backend.array(DATA)
    expected = logsumexp(_brute_force(name), axis=1).sum()
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(reparametrized, data)))
    assert abs(actual - expected) < 1e-6 * abs(expected), (actual, expected)
    best = backend.lib.map_assignment(reparametrized, data)
    coordinates = backend.numpy(best["z_log" if name == "Concrete" else "z_logit"])
    index = coordinates.argmax(-1) if name == "Concrete" else (coordinates > 0).astype(int)
    np.testing.assert_array_equal(index, _brute_force(name).argmax(1))


@pytest.mark.parametrize("helper", ["marginal_log_likelihood", "map_assignment", "discrete_log_likelihood"])
def test_helpers_evaluate_the_whole_data_and_refuse_a_subsampled_plate(backend, helper):
    """The helpers are evaluation: a model whose plate subsamples (as in stochastic training) would be
    a random, rescaled subsample, so it raises naming the plate; with the full plate the same
    model gives the whole data's exact value."""
    means, logits = backend.array(MEANS[True]), backend.array(LOGITS[True])
    data = backend.array(DATA)

    def model(x, subsample_size):
        with backend.plate("data", N, subsample_size=subsample_size) as index:
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x[index])

    def guide(x, subsample_size):  # discrete limit: the exact posterior, so every weight is p(x)
        with backend.plate("data", N, subsample_size=subsample_size) as index:
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(_brute_force("Concrete"))[index]))

    run = getattr(backend.lib, helper)
    call = (lambda size: run(model, guide, data, size)) if helper == "discrete_log_likelihood" else (lambda size: run(model, data, size))
    with pytest.raises(ValueError, match=rf"{helper}: the whole data set is evaluated, but plate 'data' subsamples 20 of its 50"):
        call(20)
    if helper == "map_assignment":
        np.testing.assert_array_equal(backend.numpy(call(None)["z"]), np.eye(3)[_brute_force("Concrete").argmax(1)])
    else:
        assert abs(float(backend.numpy(call(None))) - logsumexp(_brute_force("Concrete"), axis=1).sum()) < 1e-6


def test_predictive_with_infer_discrete_refuses_a_subsampled_plate(backend):
    """``Predictive(infer_discrete=True)`` draws from the exact posterior of the whole data set, as
    the helpers above: a subsampled plate raises naming it (NumPyro's gave the host's message about
    a missing key for subsample indices, pointing to HMCECS)."""
    logits, means = backend.array(LOGITS[True]), backend.array(MEANS[True])

    def model(x):
        with backend.plate("data", N, subsample_size=20) as index:
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x[index])

    def guide(x):
        with backend.plate("data", N, subsample_size=20):
            backend.site("z", backend.lib.Concrete(0.5, logits=logits))

    with pytest.raises(ValueError, match="the whole data set is evaluated, but plate 'data' subsamples 20 of its 50"):
        backend.predictive(model, backend.array(DATA), guide=guide, num_samples=2, infer_discrete=True)


def test_discrete_log_likelihood_with_particles_on_a_model_written_for_one_draw(backend):
    """A mixture with a global latent ``locs`` used as ``z @ locs`` (written for one draw: with m
    particles ``locs`` is batched and the product does not broadcast). Pyro falls back to one
    particle at a time with a warning, NumPyro maps over particles; both give the exact value: the
    guide is a point mass at ``locs`` = MEANS and, for z, the exact posterior given it, so every
    weight is p(x, locs) and L_m = log p(x | locs) + log p(locs) for any m."""
    means, logits = MEANS[True], backend.array(LOGITS[True])

    def model(x):
        locs = backend.site("locs", backend.normal(backend.array(np.zeros(3)), 5.0).to_event(1))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    def guide(x):
        backend.site("locs", backend.delta(backend.array(means), event_dim=1))
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(_brute_force("Concrete"))))

    expected = logsumexp(_brute_force("Concrete"), axis=1).sum() + stats.norm.logpdf(means, 0.0, 5.0).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = float(backend.discrete_log_likelihood(model, guide, backend.array(DATA), num_particles=3))
    assert abs(actual - expected) < 1e-6, (actual, expected)
    fell_back = [w for w in caught if "one at a time" in str(w.message)]
    assert len(fell_back) == (0 if backend.particles_by_vmap else 1)


def test_discrete_log_likelihood_with_particles_on_a_model_whose_global_gains_a_dimension(backend):
    """A global ``shift`` given a trailing dimension where it is batched (``shift[..., None]``, written
    for one draw): with m particles drawn in a plate left of the data plate the observations' log_prob
    gains a dimension left of the particles', which Pyro's shape check ignores; summed over, it would
    give each particle the others' weights too (the bound then fell as m grew; this test failed).
    Pyro draws the particles one at a time instead, NumPyro maps over them; both give the exact value:
    the guide is a point mass at ``shift`` and the exact posterior of z given it, so every weight is
    p(x, shift) and L_m = log p(x | shift) + log p(shift) for any m."""
    means, logits, shift = MEANS[True], backend.array(LOGITS[True]), 0.7
    log_joint = np.log(softmax(LOGITS[True]))[None, :] + stats.norm.logpdf(DATA[:, None], means[None, :] + shift, 1.0)

    def model(x):
        s = backend.site("shift", backend.normal(0.0, 2.0))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * backend.array(means)).sum(-1) + (s[..., None] if s.ndim else s), 1.0), obs=x)

    def guide(x):
        backend.site("shift", backend.delta(backend.array(shift)))
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(log_joint)))

    expected = logsumexp(log_joint, axis=1).sum() + stats.norm.logpdf(shift, 0.0, 2.0)
    for m in (1, 4):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            actual = float(backend.discrete_log_likelihood(model, guide, backend.array(DATA), num_particles=m))
        assert abs(actual - expected) < 1e-6, (m, actual, expected)
        fell_back = [w for w in caught if "one at a time" in str(w.message)]
        assert len(fell_back) == (0 if backend.particles_by_vmap or m == 1 else 1)


def test_an_event_site_after_the_plate_holding_its_values_is_exact_or_refused(backend):
    """z in plate("data"), then x ~ Normal(z @ locs, 1).to_event(1) after the plate: valid in both
    hosts (their ELBOs are right on it). With several particles Pyro aligned the site's batch (m,) to
    the data plate's dimension and the particle plate expanded it to (m, m): every weight summed every
    particle's likelihood (discrete_log_likelihood -249 for an exact -28.6). Pyro now draws the
    particles one at a time there (discrete_log_likelihood, ImportanceWeightedELBO, with a warning) or
    refuses, naming the dimension (VIMCO); NumPyro maps over the particles. Guide: the exact
    posterior, so that every bound is log p(x) exactly."""
    means, logits = MEANS[True], LOGITS[True]
    log_joint = np.log(softmax(logits))[None, :] + stats.norm.logpdf(DATA[:, None], means, 1.0)

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(logits)))
        backend.site("x", backend.normal((z * backend.array(means)).sum(-1), 1.0).to_event(1), obs=x)

    def guide(x):
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(log_joint)))

    expected = logsumexp(log_joint, axis=1).sum()
    for m in (1, 4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            actual = float(backend.discrete_log_likelihood(model, guide, backend.array(DATA), num_particles=m))
        assert abs(actual - expected) < 1e-6, (m, actual, expected)
    discrete_model, discrete_guide = backend.lib.discrete(model), backend.lib.discrete(guide)
    try:
        losses, _ = backend.loss_samples(discrete_model, discrete_guide, backend.array(DATA), loss=backend.lib.VIMCO(4), seeds=[1, 2])
    except ValueError as error:
        assert not backend.particles_by_vmap, error
        assert "site 'x' has log_prob of shape (4, 4): dim -1, right of the particles' dim -2" in str(error), error
    else:
        assert backend.particles_by_vmap
        np.testing.assert_allclose(-np.asarray(losses), expected, rtol=1e-9)


def test_a_batch_dimension_outside_the_plates_is_summed_or_refused(backend):
    """Observations of shape (2, N) in a plate of size N only, the left dimension no plate's: Pyro's
    shape check with an inferred ``max_plate_nesting`` ignores it, and the particle dimension was read
    there (the rows taken for particles, at m = 1 too, and data whose size matched m broadcast
    silently: this test failed). Pyro now refuses it, at every m, naming the site; NumPyro, which maps
    over particles, sums it as its ELBOs do: the exact L_m (guide: the exact posterior of z)."""
    means, logits = MEANS[True], backend.array(LOGITS[True])
    data = np.stack([DATA, DATA[::-1]])
    log_joint = np.log(softmax(LOGITS[True]))[None, :] + stats.norm.logpdf(data[:, :, None], means, 1.0).sum(0)

    def model(x):
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * backend.array(means)).sum(-1), 1.0), obs=x)

    def guide(x):
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(log_joint)))

    expected = logsumexp(log_joint, axis=1).sum()
    for m in (1, 2, 3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                actual = float(backend.discrete_log_likelihood(model, guide, backend.array(data), num_particles=m))
            except ValueError as error:
                assert not backend.particles_by_vmap, error
                assert "site 'x' has log_prob of shape (2, 50)" in str(error) and "plate" in str(error), error
                continue
        assert backend.particles_by_vmap
        assert abs(actual - expected) < 1e-6, (m, actual, expected)


# ----------------------------------------------------------------------------- sequential models

HMM_RNG = np.random.default_rng(7)
HMM_INIT = softmax(HMM_RNG.normal(size=3))
HMM_TRANS = softmax(HMM_RNG.normal(size=(3, 3)), axis=-1)
HMM_LOCS = np.array([-2.0, 0.0, 2.0])
HMM_DATA = 2 * HMM_RNG.normal(size=6)


def hmm(backend, steps=len(HMM_DATA)):
    """A hidden Markov model over 3 relaxed states, written as users write it in both hosts: a
    Python loop under ``markov`` (Pyro's ``pyro.markov``, NumPyro's ``contrib.funsor.markov``)."""
    init, trans, locs = (backend.array(a) for a in (HMM_INIT, HMM_TRANS, HMM_LOCS))

    def model(y):
        x = backend.site("x_0", backend.lib.Concrete(0.5, probs=init))
        backend.site("y_0", backend.normal(x @ locs, 1.0), obs=y[0])
        for t in backend.markov(range(1, steps)):
            x = backend.site(f"x_{t}", backend.lib.Concrete(0.5, probs=x @ trans))
            backend.site(f"y_{t}", backend.normal(x @ locs, 1.0), obs=y[t])

    return model


def _hmm_paths():
    """(log p(x, path) for every path, the paths), by brute force over all 3^6 state paths."""
    paths = np.array(list(np.ndindex(*(3,) * len(HMM_DATA))))
    log_joint = np.log(HMM_INIT[paths[:, 0]]) + np.log(HMM_TRANS[paths[:, :-1], paths[:, 1:]]).sum(1)
    log_joint += stats.norm.logpdf(HMM_DATA[None, :], HMM_LOCS[paths], 1.0).sum(1)
    return log_joint, paths


def test_hmm_marginal_is_the_brute_force_sum_and_map_is_the_viterbi_path(backend):
    log_joint, paths = _hmm_paths()
    data = backend.array(HMM_DATA)
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(hmm(backend), data)))
    assert abs(actual - logsumexp(log_joint)) < 1e-6, (actual, logsumexp(log_joint))
    assignment = backend.lib.map_assignment(hmm(backend), data)
    decoded = [int(backend.numpy(assignment[f"x_{t}"]).argmax()) for t in range(len(HMM_DATA))]
    assert decoded == paths[log_joint.argmax()].tolist()
    for t in range(len(HMM_DATA)):  # one-hot values, the site's own sample space
        np.testing.assert_array_equal(backend.numpy(assignment[f"x_{t}"]), np.eye(3)[decoded[t]])


def _viterbi(log_init, log_trans, log_emit):
    """The most probable state path of a chain (log_emit: (steps, states)), by dynamic programming."""
    best, back = log_init + log_emit[0], []
    for emit in log_emit[1:]:
        scores = best[:, None] + log_trans
        back.append(scores.argmax(0))
        best = scores.max(0) + emit
    path = [int(best.argmax())]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return path[::-1], best.max()


def test_map_of_a_long_chain_is_the_viterbi_path(backend):
    """40 steps, out of reach of brute force and of funsor's infer_discrete (NumPyro's decoding took
    time exponential in the length: 10 s at 16 steps, more than ten minutes at 20): the Viterbi
    path, by dynamic programming here; it is now the gradient of the max-product log density."""
    data = np.random.default_rng(11).normal(size=40) * 2
    log_init, log_trans = np.log(HMM_INIT), np.log(HMM_TRANS)
    log_emit = stats.norm.logpdf(data[:, None], HMM_LOCS[None], 1.0)
    expected, _ = _viterbi(log_init, log_trans, log_emit)
    assignment = backend.lib.map_assignment(hmm(backend, steps=len(data)), backend.array(data))
    decoded = [int(backend.numpy(assignment[f"x_{t}"]).argmax()) for t in range(len(data))]
    assert decoded == expected
    np.testing.assert_array_equal(backend.numpy(assignment["x_7"]), np.eye(3)[expected[7]])


def _forward_backward(log_init, log_trans, log_emit):
    """(the posterior marginals (steps, states), the pairwise ones of steps (t, t + 1): (steps - 1,
    states, states)) of a chain, by the forward-backward recursions in log space."""
    steps = len(log_emit)
    alpha, beta = np.zeros_like(log_emit), np.zeros_like(log_emit)
    alpha[0] = log_init + log_emit[0]
    for t in range(1, steps):
        alpha[t] = logsumexp(alpha[t - 1][:, None] + log_trans, 0) + log_emit[t]
    for t in range(steps - 2, -1, -1):
        beta[t] = logsumexp(log_trans + (log_emit[t + 1] + beta[t + 1])[None], 1)
    log_evidence = logsumexp(alpha[-1])
    pairs = alpha[:-1, :, None] + log_trans[None] + (log_emit[1:] + beta[1:])[:, None, :]
    return np.exp(alpha + beta - log_evidence), np.exp(pairs - log_evidence)


def test_sample_assignment_of_a_long_chain_draws_the_exact_posterior(backend):
    """40 steps (NumPyro drew with funsor's infer_discrete before the ninth round of user trials,
    in time exponential in the length; here it crashed inside funsor): 2000 copies of one sequence in a
    plate are 2000 independent draws of its path, whose marginals at a step and pairs of successive
    steps follow the forward-backward posterior."""
    data, copies = np.random.default_rng(11).normal(size=40) * 2, 2000
    log_init, log_trans = np.log(HMM_INIT), np.log(HMM_TRANS)
    marginals, pairs = _forward_backward(log_init, log_trans, stats.norm.logpdf(data[:, None], HMM_LOCS[None], 1.0))
    init, trans, locs = (backend.array(a) for a in (HMM_INIT, HMM_TRANS, HMM_LOCS))

    def model(y):
        with backend.plate("copies", copies):
            x = backend.site("x_0", backend.lib.Concrete(0.5, probs=init))
            backend.site("y_0", backend.normal(x @ locs, 1.0), obs=y[0])
            for t in backend.markov(range(1, len(data))):
                x = backend.site(f"x_{t}", backend.lib.Concrete(0.5, probs=x @ trans))
                backend.site(f"y_{t}", backend.normal(x @ locs, 1.0), obs=y[t])

    draw = backend.sample_assignment(model, backend.array(np.repeat(data[:, None], copies, 1)), seed=5)
    paths = np.stack([backend.numpy(draw[f"x_{t}"]).argmax(-1) for t in range(len(data))], 1)  # (copies, steps)
    np.testing.assert_array_equal(backend.numpy(draw["x_30"]), np.eye(3)[paths[:, 30]])
    for t in (0, 20, 39):
        assert_frequencies(np.bincount(paths[:, t], minlength=3), marginals[t], f"step {t}")
    assert_frequencies(np.bincount(paths[:, 19] * 3 + paths[:, 20], minlength=9), pairs[19].ravel(), "steps 19, 20")


def test_sample_assignment_of_a_chain_with_structural_zeros_draws_only_possible_paths(backend):
    """A left-to-right chain (transitions of probability exactly 0): NumPyro's site-by-site draw took
    each site's posterior marginals from the gradient of funsor's log-space sum, whose log(0) at a
    state no parent reaches has gradient NaN, and drew impossible paths (0 -> 2 -> 1). Draws of 2000
    copies follow the forward-backward posterior, and never take an impossible step; observations
    that every path rules out raise."""
    trans = np.array([[0.6, 0.4, 0.0], [0.0, 0.7, 0.3], [0.0, 0.0, 1.0]])
    data, locs, copies = np.array([-1.0, -0.5, 0.2, 0.9, 1.1, 2.2]), np.array([-1.0, 0.5, 2.0]), 2000
    with np.errstate(divide="ignore"):
        log_init, log_trans = np.log([1.0, 0.0, 0.0]), np.log(trans)
    marginals, pairs = _forward_backward(log_init, log_trans, stats.norm.logpdf(data[:, None], locs[None], 0.5))

    def model(y):
        with backend.plate("copies", copies):
            x = backend.site("x_0", backend.lib.limits.OneHotCategorical(probs=backend.array(np.array([1.0, 0.0, 0.0]))))
            backend.site("y_0", backend.normal(x @ backend.array(locs), 0.5), obs=y[0])
            for t in backend.markov(range(1, len(data))):
                x = backend.site(f"x_{t}", backend.lib.limits.OneHotCategorical(probs=x @ backend.array(trans)))
                backend.site(f"y_{t}", backend.normal(x @ backend.array(locs), 0.5), obs=y[t])

    draw = backend.sample_assignment(model, backend.array(np.repeat(data[:, None], copies, 1)), seed=2)
    paths = np.stack([backend.numpy(draw[f"x_{t}"]).argmax(-1) for t in range(len(data))], 1)
    assert np.all(trans[paths[:, :-1], paths[:, 1:]] > 0) and np.all(paths[:, 0] == 0)
    for t in (1, 3):
        assert_frequencies(np.bincount(paths[:, t], minlength=3), marginals[t], f"step {t}")
    assert_frequencies(np.bincount(paths[:, 2] * 3 + paths[:, 3], minlength=9), pairs[2].ravel(), "steps 2, 3")

    def ruled_out():
        z = backend.site("z", backend.lib.BinConcrete(0.5, probs=backend.array(0.3)))
        backend.factor("never", 0.0 * z - np.inf)

    with pytest.raises(ValueError, match=r"^sample_assignment: the posterior of the discrete sites \['z'\] is not defined"):
        backend.sample_assignment(ruled_out, seed=2)


def test_map_with_tied_maximizers_is_one_of_them_jointly(backend):
    """a ~ Bernoulli(1/2), b | a favours 1 - a: (0, 1) and (1, 0) are both most probable, per data
    point. The decoding is one of them, never a mix of the two such as (0, 0) -- what taking each
    site's best value apart gives, where the gradient of the max splits between the maximizers."""
    n = 4

    def model(x):
        with backend.plate("data", n):
            a = backend.site("a", backend.lib.BinConcrete(0.5, logits=backend.array(np.zeros(n))))
            b = backend.site("b", backend.lib.BinConcrete(0.5, logits=3.0 - 6.0 * a))
            backend.site("x", backend.normal(0.0 * b, 1.0), obs=x)

    assignment = backend.lib.map_assignment(model, backend.array(np.zeros(n)))
    a, b = (backend.numpy(assignment[name]) for name in ("a", "b"))
    assert set(np.unique(a)) <= {0.0, 1.0}
    np.testing.assert_array_equal(a + b, np.ones(n))


def _mixture_with_global_locs(backend):
    logits = backend.array(LOGITS[True])

    def model(x):
        locs = backend.site("locs", backend.normal(backend.array(np.zeros(3)), 5.0).to_event(1))
        with backend.plate("data", N):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    return model


def test_per_point_bounds_are_conditional_on_conditioned_globals(backend):
    """A mixture with a global latent ``locs``: per-point bounds (``plate="data"``) of the model
    conditioned on ``locs`` are log p(x_n | locs) (the observed global conditions every point alike),
    exact with the guide's discrete limit the posterior; left unconditioned and drawn by the guide,
    the global raises with what the per-point bound needs."""
    model = _mixture_with_global_locs(backend)

    def guide(x):
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(_brute_force("Concrete"))))

    conditioned = backend.condition(model, {"locs": MEANS[True]})
    per_point = backend.discrete_log_likelihood(conditioned, guide, backend.array(DATA), num_particles=2, plate="data")
    np.testing.assert_allclose(per_point, logsumexp(_brute_force("Concrete"), axis=1), atol=1e-8)

    def guide_with_global(x):
        backend.site("locs", backend.delta(backend.array(MEANS[True]), event_dim=1))
        guide(x)

    with pytest.raises(ValueError, match=r"site 'locs' is a latent outside plate 'data': per-element bounds need .* Condition it on a value"):
        backend.discrete_log_likelihood(model, guide_with_global, backend.array(DATA), plate="data")


def test_helpers_evaluate_the_discrete_graph_given_latent_globals(backend):
    """``given`` holds latent globals at values and leaves their prior out: the helpers give
    log p(x | locs), the MAP assignment given locs, and the bound given locs (the guide's own locs
    site not proposed), all exact against brute force; without it the error names the user's
    distribution (Normal, not NumPyro's ExpandedDistribution) and points to ``given``."""
    model, data, given = _mixture_with_global_locs(backend), backend.array(DATA), {"locs": MEANS[True]}
    expected = logsumexp(_brute_force("Concrete"), axis=1)
    actual = float(backend.numpy(backend.lib.marginal_log_likelihood(model, data, given=given)))
    assert abs(actual - expected.sum()) < 1e-6, (actual, expected.sum())
    assignment = backend.lib.map_assignment(model, data, given=given)
    assert set(assignment) == {"z"}
    np.testing.assert_array_equal(backend.numpy(assignment["z"]), np.eye(3)[_brute_force("Concrete").argmax(1)])

    def guide(x):  # draws locs too (far from the given values): not proposed under given
        backend.site("locs", backend.normal(backend.array(np.full(3, 9.0)), 1.0).to_event(1))
        with backend.plate("data", N):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(_brute_force("Concrete"))))

    bound = backend.discrete_log_likelihood(model, guide, data, num_particles=2, plate="data", given=given)
    np.testing.assert_allclose(bound, expected, atol=1e-8)
    with pytest.raises(ValueError, match=r"site 'locs' holds Normal, which is neither .* given=\{'locs': value\}"):
        backend.lib.marginal_log_likelihood(model, data)
    with pytest.raises(ValueError, match=r"given names site\(s\) \['loc'\] that the model does not sample"):
        backend.lib.marginal_log_likelihood(model, data, given={"loc": MEANS[True]})


def test_sample_assignment_draws_the_exact_posterior_given_the_globals(backend):
    """sample_assignment (infer_discrete at temperature 1, values one-hot): 4000 points observed at
    x = 0.5 with the global locs given share one posterior, which the draws follow -- for two values
    of locs, so the draw is conditional on ``given`` (Pyro's infer_discrete under Predictive is not:
    its enumeration pass draws the globals from the prior)."""

    def model(x):
        locs = backend.site("locs", backend.normal(backend.array(np.zeros(3)), 5.0).to_event(1))
        with backend.plate("data", 4000):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(LOGITS[True])))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    data = backend.array(np.full(4000, 0.5))
    for locs in (MEANS[True], np.array([0.5, -6.0, 7.0])):
        draw = backend.sample_assignment(model, data, given={"locs": locs}, seed=3)
        assert set(draw) == {"z"}
        z = backend.numpy(draw["z"])
        assert z.shape == (4000, 3) and set(np.unique(z)) <= {0.0, 1.0}
        np.testing.assert_array_equal(z.sum(-1), 1.0)
        log_posterior = np.log(softmax(LOGITS[True])) + stats.norm.logpdf(0.5, locs, 1.0)
        assert_frequencies(z.sum(0), softmax(log_posterior), f"locs {locs}")


def test_predictive_with_infer_discrete_draws_the_exact_posterior_in_the_sites_space(backend):
    """Predictive(model, guide=..., infer_discrete=True) on the relaxed model itself: per draw of
    the guide's locs, the Concrete site from its exact posterior given them, as one-hot values (not
    enumerated indices); the guide's own relaxed z is hidden. The guide's locs are drawn from a
    Normal whose two modes of draws give two posteriors, so the draws must follow each draw's locs."""

    def model(x):
        locs = backend.site("locs", backend.normal(backend.array(np.zeros(3)), 5.0).to_event(1))
        with backend.plate("data", 4000):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(LOGITS[True])))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    def guide(x):
        backend.site("locs", backend.normal(backend.array(MEANS[True]), 1.0).to_event(1))
        with backend.plate("data", 4000):
            backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(np.zeros(3))))

    data = backend.array(np.full(4000, 0.5))
    draws = backend.predictive(model, data, guide=guide, num_samples=3, return_sites=["locs", "z"], infer_discrete=True, seed=2)
    z, locs = backend.numpy(draws["z"]), backend.numpy(draws["locs"])
    assert z.shape == (3, 4000, 3) and set(np.unique(z)) <= {0.0, 1.0}
    np.testing.assert_array_equal(z.sum(-1), 1.0)
    assert np.ptp(locs, axis=0).max() > 0.5  # the draws' locs differ, and so do their posteriors
    for z_i, locs_i in zip(z, locs):
        log_posterior = np.log(softmax(LOGITS[True])) + stats.norm.logpdf(0.5, locs_i, 1.0)
        assert_frequencies(z_i.sum(0), softmax(log_posterior), f"locs {locs_i}")


def _mixture_with_latent_locs(backend, n):
    """x_n ~ Normal(z_n @ locs, 1), z_n Concrete, locs ~ Normal(MEANS, 1) a latent global."""

    def model(x):
        locs = backend.site("locs", backend.normal(backend.array(MEANS[True]), 1.0).to_event(1))
        with backend.plate("data", n):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(LOGITS[True])))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    return model


def _assert_exact_posterior_draws(z, locs, n):
    """Two draws of z (one-hot, (2, n, 3)) for n points all at x = 0.5, each from the exact
    posterior given its draw's locs."""
    assert z.shape == (2, n, 3) and set(np.unique(z)) <= {0.0, 1.0}
    np.testing.assert_array_equal(z.sum(-1), 1.0)
    for z_i, locs_i in zip(z, locs):
        log_posterior = np.log(softmax(LOGITS[True])) + stats.norm.logpdf(0.5, locs_i, 1.0)
        assert_frequencies(z_i.sum(0), softmax(log_posterior), f"locs {locs_i}")


@pytest.mark.parametrize("kind", ["AutoNormal", "AutoDiagonalNormal"])
def test_predictive_with_infer_discrete_and_an_autoguide(backend, kind):
    """An autoguide draws the relaxed z as a transformed Normal (NumPyro's AutoNormal) or a Delta fed
    by an auxiliary site (``z_unconstrained``, a joint ``_AutoDiagonalNormal_latent``): Pyro once
    passed those on as held values (a ValueError about ``given``, which the user never passed), and
    NumPyro left z out of the default return sites. z is drawn from its exact posterior given each
    draw's locs and returned by default, one-hot."""
    n = 2000
    model = _mixture_with_latent_locs(backend, n)
    guide, data = backend.autoguide(kind, model), backend.array(np.full(n, 0.5))
    backend.run(guide, data)  # set up (NumPyro's autoguide cannot set itself up inside Predictive's vmap)
    assert "z" in backend.predictive(model, data, guide=guide, num_samples=2, infer_discrete=True, seed=1)
    draws = backend.predictive(model, data, guide=guide, num_samples=2, return_sites=["locs", "z"], infer_discrete=True, seed=2)
    _assert_exact_posterior_draws(backend.numpy(draws["z"]), backend.numpy(draws["locs"]), n)


def test_predictive_with_infer_discrete_and_posterior_samples_of_the_relaxed_sites(backend):
    """Posterior samples of the relaxed model (NUTS's, which hold the relaxed z) are held for the
    other latents only: z is drawn from its exact posterior given each draw's locs, one-hot, not the
    relaxed values passed in (NumPyro conditioned the enumerated index site on them: a broadcasting
    error)."""
    n = 2000
    model = _mixture_with_latent_locs(backend, n)
    locs = MEANS[True] + np.array([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5]])
    posterior = {"locs": locs, "z": np.full((2, n, 3), 1 / 3)}
    draws = backend.predictive(model, backend.array(np.full(n, 0.5)), posterior_samples=posterior, return_sites=["z"], infer_discrete=True, seed=3)
    _assert_exact_posterior_draws(backend.numpy(draws["z"]), locs, n)


def test_predictive_with_infer_discrete_and_params_without_a_guide(backend):
    """The model's logits a parameter, passed in ``params`` beside posterior samples and no guide:
    NumPyro took the first row of every parameter (as if batched, which the host does only with a
    guide), and the logits became a scalar: a ValueError about the user's logits."""
    n = 2000

    def model(x):
        logits = backend.param("logits", np.zeros(3))
        locs = backend.site("locs", backend.normal(backend.array(MEANS[True]), 1.0).to_event(1))
        with backend.plate("data", n):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal(z @ locs, 1.0), obs=x)

    locs = MEANS[True] + np.array([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5]])
    draws = backend.predictive(model, backend.array(np.full(n, 0.5)), posterior_samples={"locs": locs}, params={"logits": LOGITS[True]},
                               return_sites=["z"], infer_discrete=True, seed=3)
    _assert_exact_posterior_draws(backend.numpy(draws["z"]), locs, n)


def test_a_point_mass_guide_on_a_concrete_latent_has_no_optimum(backend):
    """Issue 13 item 9, documented in the README (API, autoguides), checked here: a MAP guide
    (Delta, as AutoDelta draws) on a Concrete site maximizes log p(x, z), which is unbounded at the
    simplex's vertices for temperature < K - 1. On a mixture-shaped model, the loss at
    z = (1 - 2 eps, eps, eps) falls like -(K - 1 - temperature) log(1 / eps) as eps -> 0."""
    temperature, eps = 0.5, np.array([1e-6, 1e-9, 1e-12])

    def model(x):
        z = backend.site("z", backend.lib.Concrete(temperature, logits=backend.array(LOGITS[True])))
        backend.site("x", backend.normal(z @ backend.array(MEANS[True]), 1.0), obs=x)

    losses = []
    for e in eps:
        point = backend.array(np.array([1 - 2 * e, e, e]))
        losses.append(float(backend.elbo_loss(model, lambda x, point=point: backend.site("z", backend.delta(point, event_dim=1)),
                                              backend.array(np.array(-2.9)))))
    slopes = np.diff(losses) / np.diff(np.log(1 / eps))
    np.testing.assert_allclose(slopes, -(3 - 1 - temperature), rtol=1e-3)


@pytest.mark.filterwarnings("ignore:TraceEnum_ELBO found no sample sites configured for enumeration")  # none left: the point
def test_relax_unmarks_a_site_marked_for_enumeration(backend):
    """``relax(config_enumerate(model))``: the mark for enumeration that ``config_enumerate`` (inside)
    set on the Bernoulli stayed on the relaxed BinConcrete site, and Pyro's ``TraceEnum_ELBO`` failed
    on it with an empty NotImplementedError (enumerate_support). The relaxed site is unmarked: the
    loss is that of the model written with BinConcrete, draw for draw, and the user's ``infer`` dict
    is left as given."""
    y = backend.array([1.0, -0.5, 2.5])
    infer = {"enumerate": "parallel"}

    def model(y, written_relaxed=False):
        with backend.plate("data", 3):
            logits = backend.array(0.3)
            d = backend.lib.BinConcrete(0.5, logits=logits) if written_relaxed else backend.lib.limits.Bernoulli(logits=logits)
            b = backend.site("b", d, infer=None if written_relaxed else infer)
            backend.site("y", backend.normal(2 * b, 0.5), obs=y)

    def guide(y, written_relaxed=False):
        with backend.plate("data", 3):
            backend.site("b", backend.lib.BinConcrete(0.7, logits=backend.array([0.8, -0.4, 1.5])))

    relaxed = backend.lib.relax(model, temperature=0.5, sites="b")
    loss = backend.in_seed(lambda: backend.enum_loss(relaxed, guide, y), seed=3)
    expected = backend.in_seed(lambda: backend.enum_loss(model, guide, y, True), seed=3)
    assert np.isfinite(loss) and loss == pytest.approx(expected, rel=1e-12)
    assert infer == {"enumerate": "parallel"}


def test_a_transformed_concrete_site_is_refused_unless_a_reparametrizer_splits_it(backend):
    """A ±1 spin written as the host's TransformedDistribution of BinConcrete: the handler has no
    limit for it, and left relaxed it made discrete_log_likelihood a bound above the discrete graph's
    own and argmax a relaxed value; it is refused. Split by the host's TransformReparam (outside the
    mode or inside it), the base site is discretized and the marginal is exact."""
    x = backend.array([0.3, -1.2, 0.8])
    logit = 0.4

    def model(x):
        with backend.plate("data", 3):
            s = backend.site("s", backend.affine_transformed(backend.lib.BinConcrete(0.5, logits=backend.array(logit)), -1.0, 2.0))
            backend.site("x", backend.normal(s, 1.0), obs=x)

    def guide(x):
        with backend.plate("data", 3):
            backend.site("s", backend.affine_transformed(backend.lib.BinConcrete(0.5, logits=backend.array([0.1, -0.3, 0.2])), -1.0, 2.0))

    refusal = "site 's' is a TransformedDistribution of BinConcrete"
    for mode in ("sample", "argmax", "enumerate"):
        with pytest.raises(ValueError, match=refusal):
            backend.run(backend.lib.discrete(model, mode=mode), x)
    with pytest.raises(ValueError, match=refusal):
        backend.discrete_log_likelihood(model, guide, x, num_particles=2, plate="data")
    with pytest.raises(ValueError, match=f"{refusal}|drew a relaxed sample"):  # the exact helpers' own guard first
        backend.lib.map_assignment(model, x)

    p = expit(logit)
    data = backend.numpy(x)
    exact = logsumexp([np.log1p(-p) + stats.norm.logpdf(data, -1, 1), np.log(p) + stats.norm.logpdf(data, 1, 1)], axis=0).sum()
    config = {"s": backend.transform_reparam()}
    split = backend.reparam(model, config)
    assert float(backend.numpy(backend.lib.marginal_log_likelihood(split, x))) == pytest.approx(exact, rel=1e-12)
    run = backend.run(backend.reparam(backend.lib.discrete(model, mode="argmax"), config), x)
    np.testing.assert_array_equal(run.sites["s_base"].value, np.ones(3))  # the base's mode: P = 0.6


def test_a_relaxed_density_evaluated_while_the_discrete_graph_runs_is_refused(backend):
    """NeuTraReparam makes a Concrete-family site a deterministic function of its shared latent,
    scored by the relaxed density during the run: the helpers' advice (given= the shared latent)
    gave log p(x | mu) of the relaxed model (-10.15 for -5.40). Any relaxed density evaluated while
    discrete(model) runs the model is refused; one of an observed site, computed after the run, is not."""
    x = backend.array([0.3, 2.5, -1.0])

    def model(x):
        mu = backend.site("mu", backend.normal(0.0, 1.0))
        with backend.plate("data", 3):
            b = backend.site("b", backend.lib.BinConcrete(0.5, logits=backend.array(0.4)))
            backend.site("x", backend.normal(mu + 3 * b - 1, 1.0), obs=x)

    reparametrized = backend.neutra(model, x)
    with pytest.raises(ValueError, match="BinConcrete.log_prob was evaluated while discrete"):
        backend.lib.marginal_log_likelihood(reparametrized, x, given={"mu_shared_latent": backend.array([0.1, 0.0, 0.0, 0.0])})
    with pytest.raises(ValueError, match="BinConcrete.log_prob was evaluated while discrete"):
        backend.run(backend.lib.discrete(reparametrized, mode="argmax"), x)

    def observed(x):  # relaxed data, scored by the host's trace after the run: not refused
        with backend.plate("data", 3):
            backend.site("b", backend.lib.BinConcrete(0.5, logits=backend.array(0.4)), obs=x)

    data = backend.array([0.2, 0.7, 0.5])
    expected = backend.numpy(backend.lib.BinConcrete(0.5, logits=backend.array(0.4)).log_prob(data))
    run = backend.run(backend.lib.discrete(observed, mode="sample"), data)
    np.testing.assert_allclose(run.sites["b"].log_prob, expected, rtol=1e-12)
    with backend.lib.discrete(mode="argmax"):  # as a context manager: the densities are computed inside it
        run = backend.run(observed, data)
    np.testing.assert_allclose(run.sites["b"].log_prob, expected, rtol=1e-12)
