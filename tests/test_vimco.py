"""VIMCO (Mnih & Rezende 2016), the paper's multi-sample score-function baseline: its loss is an
unbiased estimate of -L_m and its gradient an unbiased estimate of the gradient of -E[L_m], checked
against the exact expectation by enumerating every particle configuration of a small model."""

import itertools

import numpy as np
import pytest
from scipy import stats
from scipy.special import log_expit, logsumexp

DATA = np.array([0.4, 2.5])
PRIOR_LOGITS = np.array([0.3, 0.3])
PHI = np.array([1.5, -1.5])  # the guide's initial logits, away from the optimum
M = 3
SEEDS = 2000


def _problem(backend):
    """z_n ~ Bernoulli(sigmoid 0.3), x_n ~ Normal(2 z_n, 1); guide z_n ~ Bernoulli(sigmoid phi_n)."""

    def model(x):
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(2.0 * z, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi))

    return model, guide


def _expected_bound(phi):
    """E_q[L_m] summed over the data, by enumerating the 2^m particle configurations per point."""
    total = 0.0
    for n in range(2):
        def log_q(z):
            return log_expit(phi[n]) if z else log_expit(-phi[n])

        def log_w(z):
            log_p = (log_expit(PRIOR_LOGITS[n]) if z else log_expit(-PRIOR_LOGITS[n])) + stats.norm.logpdf(DATA[n], 2.0 * z, 1.0)
            return log_p - log_q(z)

        for zs in itertools.product((0, 1), repeat=M):
            prob = np.exp(sum(log_q(z) for z in zs))
            total += prob * (logsumexp([log_w(z) for z in zs]) - np.log(M))
    return total


def _z_scores(samples, expected):
    samples = np.asarray(samples, np.float64)
    return np.abs(samples.mean(0) - expected) / (samples.std(0, ddof=1) / np.sqrt(len(samples)))


def test_vimco_is_unbiased_for_the_bound_and_its_gradient(backend):
    """2000 seeds: the mean loss and mean gradient within 5 standard errors of -E[L_3] and its exact
    gradient (finite differences of the enumeration); |z| > 5 has probability 6e-7 per check."""
    model, guide = _problem(backend)
    values, grads = backend.loss_samples(model, guide, backend.array(DATA), loss=backend.lib.VIMCO(M, plate="data"),
                                         seeds=range(1, SEEDS + 1))
    assert _z_scores(values, -_expected_bound(PHI)).max() < 5
    h = 1e-6
    exact = np.array([-(_expected_bound(PHI + h * e) - _expected_bound(PHI - h * e)) / (2 * h) for e in np.eye(2)])
    assert np.abs(exact).min() > 0.05  # a gradient with signal in both coordinates
    assert _z_scores(grads["phi"], exact).max() < 5


def test_vimco_needs_two_particles(backend):
    with pytest.raises(ValueError, match="num_particles must be an integer >= 2"):
        backend.lib.VIMCO(1)


def test_vimco_on_a_global_reshaped_for_one_draw_is_the_broadcast_models_or_refused(backend):
    """A global ``shift`` given a trailing dimension where it is batched (``shift[..., None]``, written
    for one draw). Pyro draws the particles in a plate left of the data plate, where the reshape puts
    a dimension left of the particles' in the observations' log_prob: summed, it gave each particle the
    others' weights (a wrong finite loss); now a ValueError naming the site. NumPyro maps over the
    particles: the loss and gradients of the model written to broadcast, seed for seed."""

    def problem(reshaped):
        def model(x):
            s = backend.site("shift", backend.normal(0.0, 1.0))
            with backend.plate("data", 2):
                z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)))
                backend.site("x", backend.normal(2.0 * z + (s[..., None] if reshaped and s.ndim else s), 1.0), obs=x)

        def guide(x):
            backend.site("shift", backend.normal(backend.param("mu", 0.3), 1.0))
            with backend.plate("data", 2):
                backend.site("z", backend.lib.limits.Bernoulli(logits=backend.param("phi", PHI)))

        return model, guide

    broadcast = backend.loss_samples(*problem(False), backend.array(DATA), loss=backend.lib.VIMCO(M), seeds=range(1, 4))
    try:
        values, grads = backend.loss_samples(*problem(True), backend.array(DATA), loss=backend.lib.VIMCO(M), seeds=range(1, 4))
    except ValueError as error:
        assert not backend.particles_by_vmap, error
        assert str(error).startswith("VIMCO: site 'x' has log_prob of shape (3, 3, 2)"), error
        return
    assert backend.particles_by_vmap
    np.testing.assert_allclose(values, broadcast[0], rtol=1e-12)
    for name in ("mu", "phi"):
        np.testing.assert_allclose(grads[name], broadcast[1][name], rtol=1e-12)
