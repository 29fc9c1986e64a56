"""Device and dtype follow the user's arrays (issue 30): what the library makes -- samples,
densities, gradients, the losses' and estimators' own parameters and networks, baselines, the
test-time helpers' results, ``Predictive``'s draws -- lives on the device of the model's data and
parameters and has their dtype.

Two places, both float64: the CPU, the stand-in that runs everywhere (an object made in torch's
default float32 shows there as a float32 array, as one made on the CPU shows on a GPU; Pyro only:
JAX makes every array in the precision mode's dtype, on the default device or the inputs', so NumPyro
has nothing to stand in for, and its float64 runs are the rest of the suite), and a GPU (marker
``gpu``: run where CUDA or a JAX GPU is present, skipped with the reason elsewhere), where values
are also checked against the CPU's: densities and gradients at given values, the helpers' exact
results, and the unbiased estimators' mean loss against the exact ELBO. CI has no GPU: the ``gpu``
cases run by hand (``pytest -m gpu tests/test_devices.py``) or from ``python -m bench.gpu``."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import log_expit, logsumexp

from tests.cases import NAMES

PLACES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
LOGITS = np.array([[0.3, -1.2, 2.0], [-0.5, 0.0, 0.7]])
BINARY_LOGITS = np.array([0.4, -1.3])
DATA = np.array([0.7, -0.4])
PRIOR_LOGITS = np.array([0.3, -0.2])
PHI = np.array([0.5, -0.8])
SEEDS = 400  # the GPU's unbiasedness check: |z| < 5 of a mean of 400 draws (false failure 6e-7)


@pytest.fixture(params=PLACES)
def place(request, backend):
    """(kind, device) where this test's arrays live."""
    if request.param == "cpu" and not backend.cpu_stand_in:
        pytest.skip(f"{backend.name}: every array takes the precision mode's dtype and the default or the inputs' device; the CPU stands in for nothing")
    device = backend.device(request.param)
    if device is None:
        pytest.skip(f"no {request.param} device for {backend.name} on this machine")
    return request.param, device


def _assert_placed(backend, kind, arrays):
    placements = {name: backend.placement(value) for name, value in arrays.items()}
    assert placements == {name: (kind, "float64") for name in arrays}


def _value(name, n_ary_value, binary_value):
    return n_ary_value if name in ("Concrete", "ExpConcrete") else binary_value


def _given_value(name):
    """A value in the distribution's support, the same on every device."""
    simplex = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    return {
        "Concrete": simplex,
        "ExpConcrete": np.log(simplex),
        "BinConcrete": np.array([0.3, 0.9]),
        "LogitBinConcrete": np.array([-0.8, 2.2]),
        "HardConcrete": np.array([0.3, 0.9]),
    }[name]


DENSITIES = [*NAMES, "HardConcrete"]


@pytest.mark.parametrize("name", DENSITIES)
def test_a_distribution_samples_and_scores_where_its_parameters_are(backend, place, name):
    kind, device = place
    logits = backend.array(_value(name, LOGITS, BINARY_LOGITS), device=device)
    d = getattr(backend.lib, name)(0.5, logits=logits)
    sample = backend.sample(d, (4,), seed=1)
    _assert_placed(backend, kind, {"sample": sample, "log_prob": d.log_prob(sample)})
    assert np.all(np.isfinite(backend.numpy(d.log_prob(sample))))


@pytest.mark.parametrize("name", DENSITIES)
def test_a_density_and_its_gradient_are_the_cpus(backend, place, name):
    """log_prob at a given value and its gradient in the logits and the temperature: the CPU's."""
    kind, device = place
    value, logits = _given_value(name), _value(name, LOGITS, BINARY_LOGITS)

    def log_density(temperature, logits):
        d = getattr(backend.lib, name)(temperature, logits=logits)
        return d.log_prob(backend.array(value, device=device)).sum()

    cpu = backend.value_and_grad(log_density, 0.5, logits, device=backend.device("cpu"))
    here = backend.value_and_grad(log_density, 0.5, logits, device=device)
    np.testing.assert_allclose(here[0], cpu[0], rtol=1e-12)
    for a, b in zip(here[1], cpu[1]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["ConcreteStraightThrough", "BinConcreteStraightThrough"])
def test_a_straight_through_sample_and_its_score_are_where_its_parameters_are(backend, place, name):
    kind, device = place
    logits = backend.array(LOGITS if name == "ConcreteStraightThrough" else BINARY_LOGITS, device=device)
    d = getattr(backend.lib, name)(0.5, logits=logits)
    sample = backend.sample(d, (4,), seed=1)
    _assert_placed(backend, kind, {"sample": sample})
    assert set(np.unique(backend.numpy(sample))) <= {0.0, 1.0}  # exactly discrete
    _, (log_prob,) = backend.score_samples(d, (), (4,), seed=1)  # scored where it is drawn (NumPyro: in a trace)
    assert np.all(np.isfinite(log_prob))


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_a_conditional_sample_is_where_its_parameters_are(backend, place, name):
    kind, device = place
    logits = backend.array(_value(name, LOGITS, BINARY_LOGITS), device=device)
    d = getattr(backend.lib, name)(0.5, logits=logits)
    hard = backend.sample(d.discrete(), (4,), seed=2)
    relaxed = backend.conditional_sample(d, hard, (), seed=3)
    _assert_placed(backend, kind, {"hard": hard, "relaxed": relaxed})
    limit = backend.numpy(relaxed).argmax(-1) if name == "Concrete" else backend.numpy(relaxed) > 0.5
    expected = backend.numpy(hard).argmax(-1) if name == "Concrete" else backend.numpy(hard) > 0.5
    np.testing.assert_array_equal(limit, expected)


# ---------------------------------------------------------------- losses and estimators

# loss: (its arguments, whether it runs on the discrete graph, whether its mean is the ELBO)
LOSSES = {
    "ScoreFunctionELBO": ({"plate": "data"}, True, True),
    "VIMCO": ({"num_particles": 3, "plate": "data"}, True, False),
    "ImportanceWeightedELBO": ({"num_particles": 3, "plate": "data"}, False, False),
    "REBAR": ({"plate": "data"}, False, True),
    "RELAX": ({"plate": "data"}, False, True),
    "DisARM": ({"plate": "data"}, False, True),
    "GumbelRao": ({"plate": "data"}, False, False),
}


def _binary(backend, device):
    """z_n ~ BinConcrete(1/2, PRIOR_LOGITS) relaxed, x_n ~ Normal(scale z_n, 1), ``scale`` the model's
    parameter; guide z_n ~ BinConcrete(2/3, phi_n) with a learned baseline of the plate's shape (read
    by the score-function losses). Every array made on ``device``."""
    prior_logits = backend.array(PRIOR_LOGITS, device=device)

    def model(x):
        scale = backend.param("scale", 2.0, like=x)
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.BinConcrete(0.5, logits=prior_logits))
            backend.site("x", backend.normal(scale * z, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI, like=x)
        baseline = backend.param("baseline", np.zeros(2), like=x)
        with backend.plate("data", 2):
            backend.site("z", backend.lib.BinConcrete(2 / 3, logits=phi), infer={"baseline": {"baseline_value": baseline}})

    return model, guide


def _binary_elbo(phi=PHI, scale=2.0):
    """The discrete graph's ELBO, by enumerating z_n (as tests/test_estimators.py)."""
    total = 0.0
    for z in (0, 1):
        log_q = log_expit(phi) if z else log_expit(-phi)
        log_p = (log_expit(PRIOR_LOGITS) if z else log_expit(-PRIOR_LOGITS)) + stats.norm.logpdf(DATA, scale * z, 1.0)
        total = total + np.exp(log_q) * (log_p - log_q)
    return total.sum()


def _versions(backend, loss_name, device):
    model, guide = _binary(backend, device)
    kwargs, discrete, _ = LOSSES[loss_name]
    loss = getattr(backend.lib, loss_name)(**kwargs)
    if discrete:
        return loss, backend.lib.discrete(model), backend.lib.discrete(guide)
    return loss, model, loss.guide(guide) if hasattr(loss, "guide") else guide


@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_a_loss_trains_where_the_model_is(backend, place, loss_name):
    """Two SVI steps: finite losses, and every parameter -- the model's, the guide's and the loss's
    own (eta, the temperature scale, RELAX's network) -- on the data's device, in its dtype."""
    kind, device = place
    x = backend.array(DATA, device=device)
    loss, model, guide = _versions(backend, loss_name, device)
    losses, params = backend.svi(model, guide, x, steps=2, lr=0.01, loss=loss, raw=True)
    assert np.all(np.isfinite([float(value) for value in losses]))
    _assert_placed(backend, kind, params)
    assert {"scale", "phi"} <= set(params)


def test_the_hard_concrete_objective_trains_where_the_model_is(backend, place):
    kind, device = place
    x = backend.array(DATA, device=device)

    def model(x):
        weight = backend.param("weight", 1.0, like=x)
        with backend.plate("data", 2):
            gate = backend.site("gate", backend.lib.HardConcrete(2 / 3, logits=backend.array(PRIOR_LOGITS, device=device)))
            backend.site("x", backend.normal(weight * gate, 1.0), obs=x)

    def guide(x):
        log_alpha = backend.param("log_alpha", PHI, like=x)
        with backend.plate("data", 2):
            backend.site("gate", backend.lib.HardConcrete(2 / 3, logits=log_alpha))

    losses, params = backend.svi(model, guide, x, steps=2, lr=0.01, loss=backend.lib.L0Objective(0.1), raw=True)
    assert np.all(np.isfinite([float(value) for value in losses]))
    _assert_placed(backend, kind, params)


@pytest.mark.gpu
@pytest.mark.parametrize("loss_name", [name for name, (_, _, elbo) in LOSSES.items() if elbo])
def test_the_unbiased_losses_estimate_the_elbo_on_a_gpu(backend, loss_name):
    """The mean of the loss over 400 draws on the GPU: -ELBO of the discrete graph within 5 standard
    errors (the CPU's is tested by tests/test_estimators.py and tests/test_score_function.py)."""
    device = backend.device("gpu")
    if device is None:
        pytest.skip(f"no gpu device for {backend.name} on this machine")
    x = backend.array(DATA, device=device)
    loss, model, guide = _versions(backend, loss_name, device)
    values, _ = backend.loss_samples(model, guide, x, loss=loss, seeds=range(1, SEEDS + 1))
    z = (values.mean() + _binary_elbo()) / (values.std(ddof=1) / np.sqrt(len(values)))
    assert abs(z) < 5, (values.mean(), -_binary_elbo())


# ---------------------------------------------------------------- test-time helpers

MEANS = np.array([-3.0, 0.0, 3.5])
MIXTURE_LOGITS = np.array([0.3, -0.2, 0.1])
POINTS = np.array([-2.5, 0.3, 3.0, 1.4])


def _mixture(backend, device):
    means, logits = backend.array(MEANS, device=device), backend.array(MIXTURE_LOGITS, device=device)

    def model(x=None):
        with backend.plate("data", len(POINTS)):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=logits))
            backend.site("x", backend.normal((z * means).sum(-1), 1.0), obs=x)

    return model


def _brute_force():
    return np.log(np.exp(MIXTURE_LOGITS) / np.exp(MIXTURE_LOGITS).sum())[None] + stats.norm.logpdf(POINTS[:, None], MEANS[None], 1.0)


def test_the_test_time_helpers_answer_where_the_data_are(backend, place):
    """marginal_log_likelihood, map_assignment, discrete_log_likelihood (the exact posterior as the
    guide: the marginal) and Predictive with infer_discrete: on the data's device, and exact."""
    kind, device = place
    model, x = _mixture(backend, device), backend.array(POINTS, device=device)
    marginal = backend.lib.marginal_log_likelihood(model, x)
    assignment = backend.lib.map_assignment(model, x)
    _assert_placed(backend, kind, {"marginal": marginal, "map": assignment["z"]})
    np.testing.assert_allclose(float(backend.numpy(marginal)), logsumexp(_brute_force(), 1).sum(), rtol=1e-12)
    np.testing.assert_array_equal(backend.numpy(assignment["z"]).argmax(-1), _brute_force().argmax(1))

    posterior = _brute_force() - logsumexp(_brute_force(), 1, keepdims=True)
    posterior_logits = backend.array(posterior, device=device)

    def guide(x=None):
        with backend.plate("data", len(POINTS)):
            backend.site("z", backend.lib.Concrete(0.5, logits=posterior_logits))

    bound = backend.discrete_log_likelihood(model, guide, x, raw=True)
    _assert_placed(backend, kind, {"bound": bound})
    np.testing.assert_allclose(float(backend.numpy(bound)), logsumexp(_brute_force(), 1).sum(), rtol=1e-10)

    draws = backend.predictive(model, x, guide=guide, num_samples=3, infer_discrete=True)
    _assert_placed(backend, kind, {"z": draws["z"]})
    assert set(np.unique(backend.numpy(draws["z"]))) <= {0.0, 1.0}
