"""REBAR, RELAX, Gumbel-Rao and DisARM (issue 15): the discrete graph's ELBO and its gradient, from a
model and guide written with relaxed sites. REBAR, RELAX and DisARM are unbiased -- their mean loss
and mean gradient over 2000 seeds (Pyro 500) against the exact expectation by enumeration (binary sites, and a
categorical site for the control-variate estimators); the control variate's own parameters receive
the gradient of the squared gradient estimate they are trained to lower (against finite differences,
seed by seed); Gumbel-Rao's mean is the same for every number of conditional samples while its
variance falls, at straight-through's mean; and what the estimators cannot treat raises."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, log_expit, log_softmax

from concrete_common.floats import coldest_temperature
from tests.test_vimco import DATA, PHI, PRIOR_LOGITS, _z_scores

SEEDS = {"pyro": 500, "numpyro": 2000}  # Pyro runs one step per seed (10-20 ms), NumPyro all in one vmap
MEANS = np.array([-1.0, 0.5, 2.0])  # the categorical problem: x_n ~ Normal(MEANS[z_n], 1)
CATEGORICAL_PHI = np.array([[0.5, -1.0, 0.3], [-0.4, 0.2, 1.1]])
CATEGORICAL_PRIOR = np.array([0.2, -0.3, 0.4])


def _binary(backend, name="BinConcrete", guide_temperature=2 / 3, scale=2.0, learned_scale=False):
    """z_n ~ BinConcrete(1/2, 0.3) relaxed (its limit Bernoulli(sigmoid 0.3)), x_n ~ Normal(scale z_n, 1);
    guide z_n ~ BinConcrete(guide_temperature, phi_n). ``learned_scale``: scale is the model's own
    parameter ``scale`` (not the guide's)."""

    def model(x):
        nonlocal scale
        if learned_scale:
            scale = backend.param("scale", 2.0)
        with backend.plate("data", 2):
            z = backend.site("z", getattr(backend.lib, name)(0.5, logits=backend.array(PRIOR_LOGITS)))
            if name == "LogitBinConcrete":
                z = 1.0 * (z > 0)
            backend.site("x", backend.normal(scale * z, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            backend.site("z", getattr(backend.lib, name)(guide_temperature, logits=phi))

    return model, guide


def _binary_elbo(phi, scale=2.0):
    """E_q[log p(x_n, z_n) - log q(z_n)] per data point, the limits' masses, by enumerating z_n."""
    total = 0.0
    for z in (0, 1):
        log_q = log_expit(phi) if z else log_expit(-phi)
        log_p = (log_expit(PRIOR_LOGITS) if z else log_expit(-PRIOR_LOGITS)) + stats.norm.logpdf(DATA, scale * z, 1.0)
        total = total + np.exp(log_q) * (log_p - log_q)
    return total


def _categorical(backend):
    def model(x):
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.Concrete(0.5, logits=backend.array(CATEGORICAL_PRIOR)))
            backend.site("x", backend.normal((z * backend.array(MEANS)).sum(-1), 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", CATEGORICAL_PHI)
        with backend.plate("data", 2):
            backend.site("z", backend.lib.Concrete(2 / 3, logits=phi))

    return model, guide


def _categorical_elbo(phi):
    log_q, log_prior = log_softmax(phi, -1), log_softmax(CATEGORICAL_PRIOR)
    log_p = log_prior[None] + stats.norm.logpdf(DATA[:, None], MEANS[None], 1.0)
    return (np.exp(log_q) * (log_p - log_q)).sum(-1)


def _exact_gradient(elbo, phi, h=1e-6):
    gradient = np.zeros(phi.shape)
    for index in np.ndindex(*phi.shape):
        step = np.zeros(phi.shape)
        step[index] = h
        gradient[index] = -(elbo(phi + step) - elbo(phi - step)).sum() / (2 * h)  # of the loss, -ELBO
    return gradient


def _check_unbiased(values, grads, elbo, phi):
    """Mean loss and mean gradient in phi within 5 standard errors of the exact ones (|z| > 5 has
    probability 6e-7 per check)."""
    assert _z_scores(values, -elbo(phi).sum()).max() < 5
    exact = _exact_gradient(elbo, phi)
    assert np.abs(exact).min() > 0.01  # signal in every coordinate
    assert _z_scores(grads["phi"], exact).max() < 5


@pytest.mark.parametrize("estimator", ["REBAR", "RELAX", "DisARM"])
def test_estimators_are_unbiased_on_binary_sites(backend, estimator):
    model, guide = _binary(backend)
    loss = getattr(backend.lib, estimator)(plate="data")
    values, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=range(1, SEEDS[backend.name] + 1))
    _check_unbiased(values, grads, _binary_elbo, PHI)


def _guide_observing(backend):
    """``_binary``'s model and guide, with an observed site in the guide that reads the relaxed
    value: o_n = 0 ~ Normal(1.5 z_n, 1), a term -log N(0; 1.5 z_n, 1) of the ELBO."""
    model, _ = _binary(backend)

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.BinConcrete(2 / 3, logits=phi))
            backend.site("o", backend.normal(1.5 * z, 1.0), obs=backend.array(np.zeros(2)))

    return model, guide


def _guide_observing_elbo(phi):
    total = _binary_elbo(phi)
    return total - sum((expit(phi) if z else expit(-phi)) * stats.norm.logpdf(0.0, 1.5 * z, 1.0) for z in (0, 1))


@pytest.mark.filterwarnings("ignore:Found non-auxiliary vars in guide but not model")  # Pyro's, of the guide's observation
@pytest.mark.parametrize("estimator", ["REBAR", "RELAX", "DisARM"])
def test_estimators_are_unbiased_with_an_observed_site_in_the_guide(backend, estimator):
    """The draw's other evaluations (DisARM's antithetic value, the control variate's) kept the
    observed guide site's score of the draw where nothing else was random: its term dropped out of
    the guide's gradient, far beyond its Monte Carlo error. They now score it again."""
    model, guide = _guide_observing(backend)
    loss = getattr(backend.lib, estimator)(plate="data")
    values, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=range(1, SEEDS[backend.name] + 1))
    _check_unbiased(values, grads, _guide_observing_elbo, PHI)


@pytest.mark.parametrize("estimator", ["REBAR", "RELAX"])
def test_control_variates_are_unbiased_on_a_categorical_site_at_any_tuning(backend, estimator):
    """K = 3; the control variate's parameters away from their initial values (eta 0.4, the
    temperature scaled by e^0.7): unbiased whatever they are."""
    model, guide = _categorical(backend)
    loss = getattr(backend.lib, estimator)(plate="data")
    at = {f"{estimator}.eta": 0.4, f"{estimator}.log_temperature_scale": 0.7}
    values, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=range(1, SEEDS[backend.name] + 1), at=at)
    _check_unbiased(values, grads, _categorical_elbo, CATEGORICAL_PHI)


def test_disarm_is_unbiased_on_logit_space_sites(backend):
    model, guide = _binary(backend, "LogitBinConcrete")
    loss = backend.lib.DisARM(plate="data")
    values, grads = backend.loss_samples(model, guide, backend.array(DATA), loss=loss, seeds=range(1, SEEDS[backend.name] + 1))
    _check_unbiased(values, grads, _binary_elbo, PHI)


@pytest.mark.parametrize("estimator", ["REBAR", "RELAX", "DisARM"])
def test_the_model_parameters_gradient_is_unbiased(backend, estimator):
    """A parameter of the model alone (the scale of the likelihood): its gradient is that of the
    discrete graph's ELBO, mean over 2000 seeds (Pyro 500) within 5 standard errors of the exact one."""
    model, guide = _binary(backend, learned_scale=True)
    loss = getattr(backend.lib, estimator)(plate="data")
    _, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=range(1, SEEDS[backend.name] + 1))
    h = 1e-6
    exact = -(_binary_elbo(PHI, scale=2.0 + h) - _binary_elbo(PHI, scale=2.0 - h)).sum() / (2 * h)
    assert abs(exact) > 0.01
    assert _z_scores(grads["scale"], exact).max() < 5


@pytest.mark.parametrize("estimator", ["REBAR", "RELAX", "GumbelRao", "DisARM"])
def test_estimators_train_under_the_hosts_svi(backend, estimator):
    """``SVI(model, loss.guide(guide), optim, loss)`` with a model that has a parameter of its own
    (Pyro's ``SVI.step`` collects every parameter statement the loss makes; a substituted model
    parameter once reached it without its store entry): finite losses, and every parameter,
    the model's, the guide's and the loss's own, moves."""
    model, guide = _binary(backend, learned_scale=True)
    loss = getattr(backend.lib, estimator)(plate="data")
    losses, params = backend.svi(model, loss.guide(guide), backend.array(DATA), steps=5, lr=0.05, loss=loss)
    assert np.all(np.isfinite(losses)) and len(losses) == 5
    # the loss's own parameters (eta, the temperature scale, RELAX's network) take the model's dtype
    assert {name: str(np.asarray(value).dtype) for name, value in params.items()} == {name: "float64" for name in params}
    assert abs(float(params["scale"]) - 2.0) > 0.01 and np.all(np.abs(params["phi"] - PHI) > 0.01)
    if estimator in ("REBAR", "RELAX"):
        assert abs(float(params[f"{estimator}.eta"]) - 1.0) > 1e-4


@pytest.mark.parametrize("tunable", ["eta", "log_temperature_scale"])
def test_the_control_variate_is_trained_on_the_squared_gradient(backend, tunable):
    """Seed by seed, REBAR's gradient for its own parameter equals the derivative of the squared
    norm of its gradient estimate for the guide's (``phi``): central finite differences of that square."""
    model, guide = _binary(backend)
    loss = backend.lib.REBAR(plate="data")
    name, h, seeds = f"REBAR.{tunable}", 1e-4, range(1, 6)
    base = {"REBAR.eta": 0.8, "REBAR.log_temperature_scale": 0.3}

    def squares(shift):
        at = {**base, name: base[name] + shift}
        _, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=seeds, at=at)
        return (grads["phi"] ** 2).sum(-1), grads[name]

    _, reported = squares(0.0)
    difference = (squares(h)[0] - squares(-h)[0]) / (2 * h)
    np.testing.assert_allclose(reported, difference, rtol=1e-3, atol=1e-5)
    assert np.abs(reported).max() > 1e-3


@pytest.mark.parametrize("estimator", ["REBAR", "RELAX"])
def test_control_variates_refuse_a_temperature_scale_beyond_the_dtype(backend, estimator):
    """REBAR and RELAX relax each guide site at its temperature times exp(log_temperature_scale), a
    parameter the variance objective trains (or the user sets): beyond the distributions' own bound
    (``coldest_temperature``: 5.3e-152 in float64, 4.7e-18 in float32) the relaxed samples overflowed
    and every gradient of the step was NaN, with no error (float32, temperature 1/2: from a scale of
    e^-44). Within the bound the step's loss and gradients are finite; beyond it, or at a scale that
    is not finite, a ValueError names the parameter."""
    model, guide = _binary(backend)  # float64, the guide relaxing at 2/3
    loss = getattr(backend.lib, estimator)(plate="data")
    name = f"{estimator}.log_temperature_scale"
    info = np.finfo(np.float64)
    within = np.log(coldest_temperature(info.tiny, info.max) / (2 / 3)) + 1.0
    values, grads = backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=[1, 2], at={name: within})
    assert np.all(np.isfinite(values)) and all(np.all(np.isfinite(g)) for g in grads.values())
    for beyond, why in ((within - 2.0, "temperature must be at least 5.28e-152 in float64"), (800.0, "must be finite, found inf"),
                        (np.nan, "must be finite, found nan")):
        # NumPyro raises from the compiled step's callback: a JAX runtime error carrying the message
        with pytest.raises(Exception, match=rf"{estimator}: site 'z' relaxes at its temperature times exp\({name}\) = .*{why}"):
            backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=[1], at={name: beyond})


def test_relax_takes_a_network_of_one_value_per_row_and_refuses_others(backend):
    """RELAX's network r maps the (rows, D) features to one value per row, as (rows,) or (rows, 1)
    alike (the two packages documented one each): the same weights give the same loss and gradients
    either way. A network of another width raises, naming ``control_variate``: a (2, 2) output on a
    plate of 2 broadcast against the per-element ELBO into (2, 2), and Pyro's loss and gradients
    were twice the right ones (z = 8 over 1500 seeds), with no error."""
    model, guide = _binary(backend)
    x = backend.array(DATA)

    def samples(outputs):
        loss = backend.lib.RELAX(plate="data", control_variate=backend.control_variate(1, outputs=outputs, seed=3))
        return backend.loss_samples(model, loss.guide(guide), x, loss=loss, seeds=[1, 2])

    (column, column_grads), (habitual, habitual_grads) = samples(1), samples(None)
    np.testing.assert_allclose(column, habitual, rtol=1e-12)
    np.testing.assert_allclose(column_grads["phi"], habitual_grads["phi"], rtol=1e-12)
    with pytest.raises(Exception, match=r"RELAX: control_variate must map features of shape \(2, 'D'\) to \(2,\) or \(2, 1\), one value per row; it returned shape \(2, 2\)"):
        samples(2)


@pytest.mark.parametrize("estimator", ["REBAR", "DisARM"])
def test_a_model_site_held_inside_the_model_is_scored_as_conditioned(backend, estimator):
    """A relaxed site of the model alone held at a relaxed value by the host's handler inside the
    model (NumPyro's ``substitute``, Pyro's ``replay``): the estimators score it as ``condition``
    makes it, by its Concrete density at the value. They scored it by its limit's mass extended to
    relaxed values (their own scoring of relaxed sites, applied before the site was found held):
    a loss 1.07 from the conditioned model's, with no error."""
    held = np.array([0.7, 0.2, 0.1])

    def model(x):
        c = backend.site("c", backend.lib.Concrete(0.5, logits=backend.array(CATEGORICAL_PRIOR)))
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.BinConcrete(0.5, logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(2.0 * z + c[0], 1.0), obs=x)

    _, guide = _binary(backend)
    losses = {}
    for handler in ("hold", "condition"):
        loss = getattr(backend.lib, estimator)()  # c is global: one ELBO of all the data
        fn = getattr(backend, handler)(model, {"c": held})
        losses[handler], _ = backend.loss_samples(fn, loss.guide(guide), backend.array(DATA), loss=loss, seeds=[1, 2, 3])
    np.testing.assert_allclose(losses["hold"], losses["condition"], rtol=1e-10)


def test_gumbel_rao_has_the_straight_through_mean_for_every_k_and_less_variance(backend):
    """Gumbel-Rao is E[straight-through gradient | b]: its mean is straight-through's for every number
    k of conditional samples -- within a z-test (false-failure rate 1e-4 over the checks) of the
    exact straight-through mean, the expectation over the noise of the gradient with the noise held
    fixed (tests/exact_objectives.py, 20000 draws) -- and its variance falls with k (an F-test at 1e-5
    that k = 100 has the smaller variance than k = 1). It is biased, as straight-through is: its
    mean differs from the exact gradient of the discrete ELBO (|z| > 5). A likelihood steep in z
    (x ~ Normal(6 z, 1)) and a guide relaxing at 0.3, where the straight-through path carries most of
    the variance. (It once differentiated through the conditional sampler, a third gradient with
    mean 0.14 where straight-through's is 0.54.)"""
    from tests import exact_objectives
    from tests.random_models import Latent, Observed, Spec, build, initial_params

    z = Latent("z0", "binary", "BinConcrete", 1, "local", True, True, prior=PRIOR_LOGITS[0], prior_temperature=0.5,
               guide_temperature=0.3, guide_init=PHI.copy())
    spec = Spec(0, 2, None, None, None, [z], [Observed("x", "local", (("z0", 6.0),), 0.0, 1.0, DATA.copy())], "data", 2, 1)
    straight_through = exact_objectives.expected_straight_through(spec, initial_params(spec), draws=20000)
    model, guide = build(spec, backend)
    seeds, grads = 1000, {}
    threshold = stats.norm.isf(1e-4 / (2 * 3 * 2))
    for k in (1, 10, 100):
        _, g = backend.loss_samples(model, guide, loss=backend.lib.GumbelRao(plate="data", num_samples=k), seeds=range(1, seeds + 1))
        grads[k] = g["q_z0"]
        se = np.sqrt(grads[k].var(0, ddof=1) / seeds + straight_through.gradient_se["q_z0"] ** 2)
        z_scores = np.abs(grads[k].mean(0) - straight_through.gradient["q_z0"]) / se
        assert np.all(z_scores < threshold), (k, grads[k].mean(0), straight_through.gradient["q_z0"])
    ratio = grads[1].var(0, ddof=1) / grads[100].var(0, ddof=1)
    assert np.all(stats.f.sf(ratio, seeds - 1, seeds - 1) < 1e-5), ratio
    exact = _exact_gradient(lambda phi: _binary_elbo(phi, scale=6.0), PHI)
    assert np.any(_z_scores(grads[100], exact) > 5), (grads[100].mean(0), exact)


def _two_layer(backend):
    """A guide whose second site's logits depend on the first site's value."""

    def model(x):
        with backend.plate("data", 2):
            z1 = backend.site("z1", backend.lib.BinConcrete(0.5, logits=backend.array(PRIOR_LOGITS)))
            z2 = backend.site("z2", backend.lib.BinConcrete(0.5, logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(z1 + z2, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            z1 = backend.site("z1", backend.lib.BinConcrete(2 / 3, logits=phi))
            backend.site("z2", backend.lib.BinConcrete(2 / 3, logits=phi + 2.0 * z1))

    return model, guide


@pytest.mark.parametrize("estimator", ["REBAR", "DisARM"])
def test_unbiased_estimators_refuse_two_stochastic_layers(backend, estimator):
    model, guide = _two_layer(backend)
    loss = getattr(backend.lib, estimator)(plate="data")
    # NumPyro raises from the compiled step's callback: a JAX runtime error carrying the message
    with pytest.raises(Exception, match=rf"{estimator}: a relaxed site's distribution depends on the value of another relaxed site .*one stochastic layer"):
        backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=[1])


def _agreement(backend, within):
    """A guide whose third site's logits read whether two relaxed values agree: z1 and z2 (``within``
    False), or the two elements of z1 (``within``): moving every site, or every coordinate of one,
    at once leaves the agreement alone."""

    def model(x):
        with backend.plate("data", 2):
            for name in ("z1", "z2", "z3"):
                backend.site(name, backend.lib.BinConcrete(0.5, logits=backend.array(PRIOR_LOGITS)))
            backend.site("x", backend.normal(0.0, 1.0), obs=x)

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2):
            z1 = backend.site("z1", backend.lib.BinConcrete(2 / 3, logits=phi))
            z2 = backend.site("z2", backend.lib.BinConcrete(2 / 3, logits=phi))
            agree = (z1[..., :1] > 0.5) == (z1[..., 1:] > 0.5) if within else (z1 > 0.5) == (z2 > 0.5)
            backend.site("z3", backend.lib.BinConcrete(2 / 3, logits=phi + 2.0 * agree))

    return model, guide


@pytest.mark.parametrize("within", [False, True], ids=["two-sites-agree", "two-elements-agree"])
@pytest.mark.parametrize("estimator", ["REBAR", "DisARM"])
def test_unbiased_estimators_refuse_a_site_reading_whether_values_agree(backend, estimator, within):
    """Moving every relaxed site at once left "z1 agrees with z2" as drawn: the guide was accepted,
    and REBAR's and DisARM's guide gradients were biased against enumeration.
    One site at a time, and every other element of a site, each such dependence is seen."""
    model, guide = _agreement(backend, within)
    loss = getattr(backend.lib, estimator)(plate="data")
    with pytest.raises(Exception, match=rf"{estimator}: a relaxed site's distribution depends on the value of another relaxed site"):
        backend.loss_samples(model, loss.guide(guide), backend.array(DATA), loss=loss, seeds=[0, 1, 2, 3])


def test_estimators_refuse_what_they_cannot_treat(backend):
    model, guide = _categorical(backend)
    with pytest.raises(ValueError, match=r"DisARM: site 'z' is categorical; DisARM is for binary sites"):
        backend.loss_samples(model, guide, backend.array(DATA), loss=backend.lib.DisARM(plate="data"), seeds=[1])
    model, guide = _binary(backend, "LogitBinConcrete")
    with pytest.raises(ValueError, match=r"GumbelRao: .*LogitBinConcrete site's straight-through value"):
        backend.loss_samples(model, guide, backend.array(DATA), loss=backend.lib.GumbelRao(plate="data"), seeds=[1])
    with pytest.raises(ValueError, match=r"num_samples must be a positive integer"):
        backend.lib.GumbelRao(num_samples=0)
