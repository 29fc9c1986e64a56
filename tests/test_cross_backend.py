"""The two backends agree: densities, CDFs and quantiles at the same points, sample laws, and the
masses of the discrete limits."""

import numpy as np
import pytest
from scipy import stats

from tests.cases import BINARY, CASES, N_ARY, NAMES
from scipy.special import log_softmax, logsumexp

from tests.helpers import ALPHA, assert_two_sample
from tests.test_test_time import DATA, trainable_mixture

# float64: both compute the same formulas; float32: torch and XLA order sums differently
RTOL = {"float32": 1e-5, "float64": 1e-12}


def _assert_agree(a, b, dtype):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert not (np.isnan(a).any() or np.isnan(b).any())
    np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b))
    finite = np.isfinite(a)
    error = np.abs(a[finite] - b[finite])
    bound = RTOL[dtype] * np.maximum(1.0, np.abs(b[finite]))
    assert np.all(error <= bound), f"max disagreement {np.max(error):.3g}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_log_prob_agrees(backend_pair, case, dtype):
    x = case.points(20, dtype)
    values = [b.numpy(case.make(b, dtype).log_prob(b.array(x, dtype))) for b in backend_pair]
    _assert_agree(*values, dtype)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in BINARY], ids=str)
def test_cdf_and_icdf_agree(backend_pair, case, dtype):
    x = case.points(20, dtype)
    q = np.broadcast_to(np.linspace(0.01, 0.99, 20).reshape((20,) + (1,) * len(case.batch_shape)), (20,) + case.batch_shape)
    cdfs = [b.numpy(case.make(b, dtype).cdf(b.array(x, dtype))) for b in backend_pair]
    icdfs = [b.numpy(case.make(b, dtype).icdf(b.array(q, dtype))) for b in backend_pair]
    _assert_agree(*cdfs, dtype)
    _assert_agree(*icdfs, dtype)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_discrete_masses_agree(backend_pair, case):
    masses = []
    for b in backend_pair:
        d = case.make(b).discrete()
        masses.append(b.numpy(d.log_prob(b.enumerate_support(d, expand=True))))
    _assert_agree(*masses, "float64")


N = 20000


@pytest.mark.parametrize("temperature", [0.1, 2 / 3, 2.0])
@pytest.mark.parametrize("name", NAMES)
def test_sample_laws_agree(backend_pair, name, temperature):
    """Two-sample KS between the backends' samples (a coordinate and a log-ratio for the n-ary
    distributions), and for the n-ary ones the argmax frequencies (chi-square contingency)."""
    logits = np.array([1.0, -0.5, 0.3, 0.0])
    samples = [b.numpy(b.sample(b.make(name, temperature, logits=logits), (N,), seed=31)) for b in backend_pair]
    if name in N_ARY:
        log_x = [np.log(s) if name == "Concrete" else s for s in samples]
        assert_two_sample(*(lx[:, 0] - lx[:, 1] for lx in log_x), f"{name} log-ratio")
        if temperature >= 2 / 3:  # below, Concrete coordinates round to exactly 0 or 1
            assert_two_sample(*(s[:, 2] for s in samples), f"{name} coordinate")
        counts = np.array([np.bincount(s.argmax(-1), minlength=4) for s in samples])
        p_value = stats.chi2_contingency(counts)[1]
        assert p_value > ALPHA, f"argmax frequencies differ: {counts}, p = {p_value:.3g}"
    else:
        for j in (0, 1):
            assert_two_sample(*(s[:, j] for s in samples), f"{name} variable {j}")


def test_discrete_graph_helpers_agree_after_training(backend_pair):
    """Train the relaxed mixture for 300 SVI steps (Pyro); with those parameters both backends give
    the same exact marginal and MAP assignment, and per-point L_m within Monte Carlo error of the
    exact log p(x_n) -- whose spread is known exactly from the trained guide's discrete limit."""
    pyro_b, numpyro_b = backend_pair
    model, guide = trainable_mixture(pyro_b)
    _, params = pyro_b.svi(model, guide, pyro_b.array(DATA), steps=300, lr=0.05, seed=0, num_particles=4)

    log_prior = log_softmax(np.array([0.3, -0.2, 0.1]))
    log_joint = log_prior[None, :] + stats.norm.logpdf(DATA[:, None], params["means"][None, :], 1.0)
    exact = logsumexp(log_joint, axis=1)
    log_q = log_softmax(params["phi"], axis=1)
    weights = np.exp(log_joint - log_q - exact[:, None])  # w / p(x) under q
    cv2 = (np.exp(log_q) * weights**2).sum(1) - 1
    m = 1000

    for b in backend_pair:
        model, guide = trainable_mixture(b)
        x, b_params = b.array(DATA), {k: b.array(v) for k, v in params.items()}
        marginal = float(b.numpy(b.lib.marginal_log_likelihood(model, x, params=b_params)))
        assert abs(marginal - exact.sum()) < 1e-8 * abs(exact.sum()), (b.name, marginal, exact.sum())
        assignment = b.numpy(b.lib.map_assignment(model, x, params=b_params)["z"])
        np.testing.assert_array_equal(assignment.argmax(-1), log_joint.argmax(1))
        bound = b.discrete_log_likelihood(model, guide, x, num_particles=m, plate="data", params=params, seed=1)
        np.testing.assert_array_less(np.abs(bound - exact + cv2 / (2 * m)), 5 * np.sqrt(cv2 / m) + 1e-12)
