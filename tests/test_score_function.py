"""The score-function losses of the package beside VIMCO: ``ScoreFunctionELBO`` (REINFORCE with a
learned baseline, the paper's m = 1 baseline estimator) is an unbiased estimate of the ELBO and of
its gradient, checked against the exact expectation by enumerating a small model, its baseline
fitted by the exact gradient of the squared error; ``L0Objective`` is Louizos et al.'s objective,
value and gradient in closed form."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, log_expit

from tests.test_vimco import DATA, PHI, PRIOR_LOGITS, _z_scores

SEEDS = 2000
BASELINE = np.array([-3.0, -1.0])  # the guide's initial baselines, one per data point


def _problem(backend, baseline):
    """z_n ~ Bernoulli(sigmoid 0.3), x_n ~ Normal(2 z_n, 1); guide z_n ~ Bernoulli(sigmoid phi_n),
    with a learned baseline b_n given as Pyro's TraceGraph_ELBO reads it (or none)."""

    def model(x):
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(2.0 * z, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI)
        infer = {"baseline": {"baseline_value": backend.param("b", BASELINE)}} if baseline else None
        with backend.plate("data", 2):
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi), infer=infer)

    return model, guide


def _expected_elbo(phi):
    """E_q[log p(x_n, z_n) - log q(z_n)] per data point, by enumerating z_n."""
    q1 = expit(phi)
    terms = []
    for z, q in ((1, q1), (0, 1 - q1)):
        log_p = np.where(z, log_expit(PRIOR_LOGITS), log_expit(-PRIOR_LOGITS)) + stats.norm.logpdf(DATA, 2.0 * z, 1.0)
        terms.append(q * (log_p - np.log(q)))
    return terms[0] + terms[1]


@pytest.mark.parametrize("plate, baseline", [("data", True), (None, False)], ids=["per-point-with-baseline", "joint-without"])
def test_score_function_elbo_is_unbiased_for_the_elbo_and_its_gradient(backend, plate, baseline):
    """2000 seeds: the mean loss and mean gradient within 5 standard errors of -sum E[elbo_n] and its
    exact gradient (finite differences of the enumeration); the baselines' mean gradient within 5
    standard errors of the exact gradient of sum_n E[(elbo_n - b_n)^2], -2 (E[elbo_n] - b_n).
    |z| > 5 has probability 6e-7 per check."""
    model, guide = _problem(backend, baseline)
    loss = backend.lib.ScoreFunctionELBO(plate=plate)
    values, grads = backend.loss_samples(model, guide, backend.array(DATA), loss=loss, seeds=range(1, SEEDS + 1))
    assert _z_scores(values, -_expected_elbo(PHI).sum()).max() < 5
    h = 1e-6
    exact = np.array([-(_expected_elbo(PHI + h * e) - _expected_elbo(PHI - h * e)).sum() / (2 * h) for e in np.eye(2)])
    assert np.abs(exact).min() > 0.05  # a gradient with signal in both coordinates
    assert _z_scores(grads["phi"], exact).max() < 5
    if baseline:
        fit = -2 * (_expected_elbo(PHI) - BASELINE)
        assert np.abs(fit).min() > 0.5 and _z_scores(grads["b"], fit).max() < 5
    else:
        assert set(grads) == {"phi"}


LOC, C = np.array([0.2, -0.5]), 1.0


def _expected_elbo_with_a_gaussian(loc, phi):
    """y_n ~ N(0, 1), z_n as above, x_n ~ N(2 z_n + y_n, 1); guide y_n ~ N(loc_n, 1), z_n ~ q: the
    ELBO per data point in closed form over y and by enumerating z."""
    elbo = -0.5 * (loc**2 + 1) + 0.5
    for z, q in ((1, expit(phi)), (0, expit(-phi))):
        log_p = np.where(z, log_expit(PRIOR_LOGITS), log_expit(-PRIOR_LOGITS))
        elbo = elbo + q * (log_p - np.log(q) - 0.5 * np.log(2 * np.pi) - 0.5 * ((DATA - 2 * z - loc) ** 2 + 1))
    return elbo


def _expected_fit_gradient(loc, phi, c):
    """d/dc sum_n E[(elbo_n - c y_n)^2] = sum_n E[-2 y_n (elbo_n - c y_n)], over y_n by Gauss-Hermite
    quadrature and z_n by enumeration, elbo_n the one-draw ELBO of data point n."""
    t, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / np.sqrt(2 * np.pi)
    total = 0.0
    for z, q in ((1, expit(phi)), (0, expit(-phi))):
        y = loc[:, None] + t[None, :]
        log_p = np.where(z, log_expit(PRIOR_LOGITS), log_expit(-PRIOR_LOGITS))[:, None]
        elbo = (stats.norm.logpdf(y) - stats.norm.logpdf(y, loc[:, None], 1.0) + log_p - np.log(q)[:, None]
                + stats.norm.logpdf(DATA[:, None], 2 * z + y, 1.0))
        total = total + (q[:, None] * w * (-2 * y * (elbo - c * y))).sum()
    return total


def test_a_baselines_fit_trains_its_own_parameters_only(backend):
    """A baseline computed from an earlier reparameterized draw of the guide, b_n = c y_n (NVIL's
    baselines read upstream latents; a head on a shared trunk is the same): its squared error's
    gradient reached loc through y -- d/d loc -3.78 for -0.10 (z = -113). The ELBO's gradient is now
    unbiased for loc and phi, and c, the baseline's own parameter, gets the fit's gradient, whose
    mean is E[-2 y (elbo - c y)] (quadrature). 2000 seeds, |z| > 5: 6e-7 per check."""

    def model(x):
        with backend.plate("data", 2):
            y = backend.site("y", backend.normal(backend.array(np.zeros(2)), 1.0))
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(2.0 * z + y, 1.0), obs=x)

    def guide(x):
        loc, phi, c = backend.param("loc", LOC), backend.param("phi", PHI), backend.param("c", np.array(C))
        with backend.plate("data", 2):
            y = backend.site("y", backend.normal(loc, 1.0))
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi), infer={"baseline": {"baseline_value": c * y}})

    loss = backend.lib.ScoreFunctionELBO(plate="data")
    values, grads = backend.loss_samples(model, guide, backend.array(DATA), loss=loss, seeds=range(1, SEEDS + 1))
    assert _z_scores(values, -_expected_elbo_with_a_gaussian(LOC, PHI).sum()).max() < 5
    h = 1e-6
    for name, at in (("loc", LOC), ("phi", PHI)):
        shifted = lambda e: _expected_elbo_with_a_gaussian(LOC + e if name == "loc" else LOC, PHI + e if name == "phi" else PHI)  # noqa: E731
        exact = np.array([-(shifted(h * e) - shifted(-h * e)).sum() / (2 * h) for e in np.eye(2)])
        assert _z_scores(grads[name], exact).max() < 5, name
    fit = _expected_fit_gradient(LOC, PHI, C)
    assert abs(fit) > 0.5 and _z_scores(grads["c"], fit) < 5


def test_score_function_elbo_refuses_baseline_options_it_does_not_implement(backend):
    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi), infer={"baseline": {"use_decaying_avg_baseline": True}})

    model, _ = _problem(backend, baseline=False)
    with pytest.raises(ValueError, match=r"ScoreFunctionELBO: site 'z': infer\['baseline'\] holds \['use_decaying_avg_baseline'\]"):
        backend.loss_samples(model, guide, backend.array(DATA), loss=backend.lib.ScoreFunctionELBO(plate="data"), seeds=[1])


LOG_ALPHA = np.array([0.3, -1.0, 2.0])


def test_l0_objective_is_the_scaled_likelihood_plus_the_expected_l0_norm(backend):
    """The observations do not depend on the gates, so the objective is exact at every seed: minus the
    log-likelihood of the subsample, scaled to the plate's size (4 of 8), plus l0 times the closed-form
    expected number of open gates (Louizos et al. eq. 12); its gradient in log alpha is l0 times that
    of the expected L0 norm."""
    temperature, l0, low, high = 2 / 3, 0.7, -0.1, 1.1
    y = backend.array(np.full(4, 0.5))

    def model(y):
        with backend.plate("units", 3):
            backend.site("gates", backend.lib.HardConcrete(temperature, logits=backend.array(np.zeros(3))))
        with backend.plate("data", 8, subsample_size=4):
            backend.site("y", backend.normal(0.0, 1.0), obs=y)

    def guide(y):
        log_alpha = backend.param("log_alpha", LOG_ALPHA)
        with backend.plate("units", 3):
            backend.site("gates", backend.lib.HardConcrete(temperature, logits=log_alpha))

    values, grads = backend.loss_samples(model, guide, y, loss=backend.lib.L0Objective(l0), seeds=range(1, 4))
    shift = temperature * np.log(-low / high)
    expected = -2 * stats.norm.logpdf(0.5, 0.0, 1.0) * 4 + l0 * expit(LOG_ALPHA - shift).sum()
    np.testing.assert_allclose(values, expected, rtol=1e-10)
    slope = expit(LOG_ALPHA - shift) * expit(-(LOG_ALPHA - shift))
    np.testing.assert_allclose(grads["log_alpha"], np.broadcast_to(l0 * slope, (3, 3)), rtol=1e-8)


def test_l0_objective_counts_every_gate_a_site_draws_scaled_as_the_likelihood(backend):
    """Gates in a subsampled plate (one per data point, 2 of 8 per step): the expected L0 norm is
    scaled to the plate's size as the likelihood is, so the loss is unbiased for the full-data
    objective (it was -log p scaled plus the subsample's gates unscaled: the penalty a quarter of its
    value); and a plate that broadcasts one gate distribution draws one gate per element (three
    here, where one was counted). The observations do not depend on the gates."""
    temperature, l0, low, high = 2 / 3, 5.0, -0.1, 1.1
    shift = temperature * np.log(-low / high)
    log_alpha = np.linspace(-2.0, 2.0, 8)
    y = backend.array(np.full(2, 0.5))

    def model(y):
        with backend.plate("data", 8, subsample_size=2):
            backend.site("gate", backend.lib.HardConcrete(temperature, logits=backend.array(np.zeros(2))))
            backend.site("y", backend.normal(0.0, 1.0), obs=y)
        with backend.plate("units", 3):
            backend.site("shared", backend.lib.HardConcrete(temperature, logits=backend.array(0.0)))

    def guide(y):
        a, b = backend.param("log_alpha", log_alpha), backend.param("b", 0.3)
        with backend.plate("data", 8, subsample_size=2) as index:
            backend.site("gate", backend.lib.HardConcrete(temperature, logits=a[index]))
        with backend.plate("units", 3):
            backend.site("shared", backend.lib.HardConcrete(temperature, logits=b))

    values, _ = backend.loss_samples(model, guide, y, loss=backend.lib.L0Objective(l0), seeds=range(1, 401))
    expected = -8 * stats.norm.logpdf(0.5, 0.0, 1.0) + l0 * (expit(log_alpha - shift).sum() + 3 * expit(0.3 - shift))
    z = abs(values.mean() - expected) / (values.std(ddof=1) / np.sqrt(len(values)))
    assert z < 4.5, (values.mean(), expected, z)  # |z| > 4.5: probability 7e-6


def test_l0_objective_charges_only_the_gates_a_mask_keeps(backend):
    """Gates masked out -- by the mask handler around the site, by the distribution's own ``.mask``,
    and inside ``to_event`` -- are not charged, as their density would not be: the objective counted
    every gate a site drew (2 masked of 4 here, so twice the penalty). The observations do not depend
    on the gates, so the value is exact at every seed, and the gradient is that of the kept gates."""
    temperature, l0, low, high = 2 / 3, 3.0, -0.1, 1.1
    shift = temperature * np.log(-low / high)
    log_alpha = np.array([0.5, -1.0, 2.0, 0.1])
    handler_mask, own_mask = np.array([True, False, True, False]), np.array([True, True, False, False])
    y = backend.array(np.full(2, 0.5))

    def gates(site_name, logits):
        with backend.plate("units", 4), backend.mask(handler_mask):
            backend.site(site_name, backend.lib.HardConcrete(temperature, logits=logits))
        # own mask, then one event of 4 gates: the masked ones add nothing to its sum
        backend.site(site_name + "_event", backend.lib.HardConcrete(temperature, logits=logits).mask(backend.array(own_mask, "bool")).to_event(1))

    def model(y):
        gates("g", backend.array(np.zeros(4)))
        with backend.plate("data", 2):
            backend.site("y", backend.normal(0.0, 1.0), obs=y)

    def guide(y):
        gates("g", backend.param("log_alpha", log_alpha))

    values, grads = backend.loss_samples(model, guide, y, loss=backend.lib.L0Objective(l0), seeds=range(1, 3))
    kept = handler_mask.astype(float) + own_mask
    p = expit(log_alpha - shift)
    np.testing.assert_allclose(values, -2 * stats.norm.logpdf(0.5) + l0 * (kept * p).sum(), rtol=1e-10)
    np.testing.assert_allclose(grads["log_alpha"], np.broadcast_to(l0 * kept * p * (1 - p), (2, 4)), rtol=1e-8)


@pytest.mark.parametrize("l0", [-1.0, float("nan"), float("inf"), True, "3", None])
def test_l0_objective_refuses_an_l0_that_is_not_a_finite_nonnegative_number(backend, l0):
    with pytest.raises(ValueError, match=r"L0Objective: l0 must be a finite number >= 0"):
        backend.lib.L0Objective(l0)


def test_l0_objective_refuses_a_guide_without_gates(backend):
    """Gates written with BinConcrete by mistake: the guide draws no HardConcrete site, and the loss
    was the likelihood alone, with no penalty and no error. It raises, saying so."""

    def model(x):
        with backend.plate("data", 2):
            g = backend.site("g", backend.lib.BinConcrete(2 / 3, logits=backend.array([0.0, 0.0])))
            backend.site("x", backend.normal(g, 1.0), obs=x)

    def guide(x):
        with backend.plate("data", 2):
            backend.site("g", backend.lib.BinConcrete(2 / 3, logits=backend.param("a", np.zeros(2))))

    with pytest.raises(ValueError, match=r"^L0Objective: the guide draws no HardConcrete site"):
        backend.elbo_loss(model, guide, backend.array([0.5, 1.5]), loss=backend.lib.L0Objective(0.1))


@pytest.mark.parametrize("where", ["guide", "model"])
def test_l0_objective_refuses_latents_that_are_not_gates(backend, where):
    """NumPyro's bnn.py with Bayesian weights beside the gates: the objective charges gates only, so a
    weight's prior and entropy were left out with no error -- the loss the same under a prior of
    scale 1 and of 1e-3, and the guide's scales shrank to a point. A latent that is not a gate, in
    the guide or drawn by the model alone, raises, naming it."""

    def model(x):
        w = backend.site("w", backend.normal(0.0, 1.0))
        with backend.plate("data", 2):
            g = backend.site("g", backend.lib.HardConcrete(2 / 3, logits=backend.array([0.0, 0.0])))
            backend.site("x", backend.normal(w * g, 1.0), obs=x)

    def guide(x):
        if where == "guide":
            backend.site("w", backend.normal(backend.param("m", np.array(0.0)), 0.5))
        with backend.plate("data", 2):
            backend.site("g", backend.lib.HardConcrete(2 / 3, logits=backend.param("a", np.zeros(2))))

    with pytest.raises(ValueError, match=r"^L0Objective: site\(s\) \['w'\] are latents other than the guide's HardConcrete gates"):
        backend.elbo_loss(model, guide, backend.array([0.5, 1.5]), loss=backend.lib.L0Objective(0.1))
