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

    _broadcast_or_refused(backend, lambda s: s[..., None] if s.ndim else s, "VIMCO: site 'x' has log_prob of shape (3, 3, 2)")


def _broadcast_or_refused(backend, written, refusal):
    """VIMCO on a model whose global ``shift`` enters as ``written(shift)`` (written for one draw):
    Pyro, drawing the particles in a plate left of the model's, raises a ValueError starting with
    ``refusal`` (returned); NumPyro, mapping over them, gives the loss and gradients of the model that
    uses ``shift`` as it is, seed for seed (None returned)."""

    def problem(used):
        def model(x):
            s = backend.site("shift", backend.normal(0.0, 1.0))
            with backend.plate("data", 2):
                z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)))
                backend.site("x", backend.normal(2.0 * z + used(s), 1.0), obs=x)

        def guide(x):
            backend.site("shift", backend.normal(backend.param("mu", 0.3), 1.0))
            with backend.plate("data", 2):
                backend.site("z", backend.lib.limits.Bernoulli(logits=backend.param("phi", PHI)))

        return model, guide

    broadcast = backend.loss_samples(*problem(lambda s: s), backend.array(DATA), loss=backend.lib.VIMCO(M), seeds=range(1, 4))
    try:
        values, grads = backend.loss_samples(*problem(written), backend.array(DATA), loss=backend.lib.VIMCO(M), seeds=range(1, 4))
    except ValueError as error:
        assert not backend.particles_by_vmap, error
        assert str(error).startswith(refusal), error
        return str(error)
    assert backend.particles_by_vmap
    np.testing.assert_allclose(values, broadcast[0], rtol=1e-12)
    for name in ("mu", "phi"):
        np.testing.assert_allclose(grads[name], broadcast[1][name], rtol=1e-12)
    return None


def _problem_with(backend, extra, dtype="float64"):
    """``_problem``'s model with one more observed site per data point, ``extra(z)``: a site whose
    log density is added to every particle's log weight."""

    def model(x):
        with backend.plate("data", 2):
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS, dtype)))
            backend.site("x", backend.normal(2.0 * z, 1.0), obs=x)
            extra(z)

    def guide(x):
        phi = backend.param("phi", PHI, dtype)
        with backend.plate("data", 2):
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi))

    return model, guide


@pytest.mark.parametrize("dtype", ["float32"])
def test_vimco_gradient_is_unchanged_by_a_constant_in_the_log_weights(backend, dtype):
    """An observation whose density does not depend on the latents (about -1e4 nats per data point)
    adds a constant to every log weight: the bound moves by it, VIMCO's gradient does not, draw for
    draw. The learning signals are differences of two log-sum-exps of the log weights, of the size
    of 1 / m; taken of the unshifted log weights in float32 each carried an error of the spacing of
    1e4 (1e-3), several per cent of the gradient at m = 64 (they are now taken of the weights less
    their largest). What remains is the log weights' own rounding at 1e4, a few thousandths of the
    gradient's scale."""
    m, far = 64, float(np.sqrt(2e4))
    x = backend.array(DATA, dtype)

    def far_observation(z):
        backend.site("c", backend.normal(0.0 * z, 1.0), obs=backend.array([far, far], dtype))

    plain = backend.loss_samples(*_problem_with(backend, lambda z: None, dtype), x, loss=backend.lib.VIMCO(m, plate="data"), seeds=range(1, 11))
    offset = backend.loss_samples(*_problem_with(backend, far_observation, dtype), x, loss=backend.lib.VIMCO(m, plate="data"), seeds=range(1, 11))
    constant = 2 * (1e4 + 0.5 * np.log(2 * np.pi))  # minus the two points' log N(far; 0, 1)
    np.testing.assert_allclose(offset[0], plain[0] + constant, rtol=2e-6)
    scale = np.abs(plain[1]["phi"]).max()
    np.testing.assert_allclose(offset[1]["phi"], plain[1]["phi"], rtol=0, atol=2e-2 * scale)


def test_vimco_with_particles_the_model_rules_out(backend):
    """A particle whose log weight is -inf (the model gives its value probability 0: ``Delta(z)``
    observed at 1 rules out z = 0) has weight 0 in the bound; the others' leave-one-out mean took
    -inf - (-inf) and made the loss and every gradient NaN in each draw holding one. Now, in a draw
    where each data point has two particles the model allows, the loss and gradient are the ones of a
    stand-in whose ruled-out particles have a finite log weight far below the others' (Normal(z,
    1e-12) observed at 1: about -5e23 at z = 0): the same particles, a constant for the rest. Where a
    point has one allowed particle, its leave-one-out bound is -inf (the stand-in's about -7e22, its
    gradient about 1e23) and its baseline 0: the loss and gradient are finite. Where a point has none,
    its bound is -inf and the loss +inf (the guide gives z = 0 mass, so E[L_m] itself is -inf)."""
    x = backend.array(DATA)

    def ruled_out(z):
        backend.site("o", backend.delta(z), obs=backend.array([1.0, 1.0]))

    def far_below(z):
        backend.site("o", backend.normal(z, 1e-12), obs=backend.array([1.0, 1.0]))

    seeds = range(1, 41)
    exact = backend.loss_samples(*_problem_with(backend, ruled_out), x, loss=backend.lib.VIMCO(8, plate="data"), seeds=seeds)
    stand_in = backend.loss_samples(*_problem_with(backend, far_below), x, loss=backend.lib.VIMCO(8, plate="data"), seeds=seeds)
    some = stand_in[0] < 1e20  # every point has a particle at z = 1
    two = some & (np.abs(stand_in[1]["phi"]).max(1) < 1e10)  # and not only one
    assert two.sum() >= 10 and (some & ~two).sum() >= 3 and (~some).sum() >= 3, (two.sum(), some.sum())  # each kind of draw
    np.testing.assert_allclose(exact[0][two] - stand_in[0][two], exact[0][two][0] - stand_in[0][two][0], rtol=1e-12)
    np.testing.assert_allclose(exact[1]["phi"][two], stand_in[1]["phi"][two], rtol=1e-9, atol=1e-12)
    assert np.isfinite(exact[0][some]).all() and np.isfinite(exact[1]["phi"][some]).all()
    assert (exact[0][~some] == np.inf).all()


def test_a_plate_given_more_indices_than_elements(backend):
    """A minibatch drawn with replacement beyond the data set's size (here the data set twice over,
    4 indices of 2 elements): the host scales each density by 2 / 4. The bounds of m > 1 particles
    took such a plate for the full data (they looked for fewer indices than elements) and averaged
    the scaled log weights, a tempered bound, with no error. Now it is a subsample as any other: the
    loss estimates -E[L_m] of the whole data without bias (500 seeds, |z| < 5), the joint bound
    (plate=None) and the exact helpers refuse it."""
    indices = [0, 1, 1, 0]

    def model(x):
        with backend.plate("data", 2, subsample=indices) as index:
            z = backend.site("z", backend.lib.limits.Bernoulli(logits=backend.array(PRIOR_LOGITS)[index]))
            backend.site("x", backend.normal(2.0 * z, 1.0), obs=x[index])

    def guide(x):
        phi = backend.param("phi", PHI)
        with backend.plate("data", 2, subsample=indices) as index:
            backend.site("z", backend.lib.limits.Bernoulli(logits=phi[index]))

    x = backend.array(DATA)
    values, _ = backend.loss_samples(model, guide, x, loss=backend.lib.VIMCO(M, plate="data"), seeds=range(1, 501))
    assert _z_scores(values, -_expected_bound(PHI)) < 5
    with pytest.raises(ValueError, match="plate 'data' subsamples its elements, but with plate=None"):
        backend.loss_samples(model, guide, x, loss=backend.lib.VIMCO(M), seeds=[1])
    with pytest.raises(ValueError, match="plate 'data' takes 4 indices of its 2 elements"):
        backend.lib.marginal_log_likelihood(model, x)


def test_vimco_on_a_model_that_fails_on_batched_particles(backend):
    """A global reshaped as written for one draw (``shift.reshape(())``). Pyro draws VIMCO's particles
    in a plate left of the model's, where the reshape fails with torch's own error, which names no
    cause (as the host's plate shape errors did on the DP-mixture and LDA tutorials' models, written
    for one draw); now a ValueError saying the particles do not broadcast, and which losses draw
    them one at a time. NumPyro maps over the particles: the loss of the model written to broadcast,
    seed for seed."""

    refusal = "VIMCO: the model or guide does not broadcast over a leftmost particle dimension"
    message = _broadcast_or_refused(backend, lambda s: s.reshape(()), refusal)
    assert message is None or "ImportanceWeightedELBO / discrete_log_likelihood" in message


def test_vimco_passes_on_the_models_own_error(backend):
    """An error the model raises at any number of draws (here its own ValueError; a NaN parameter
    under validation, a missing temperature) is the model's, not the particles': it reaches the
    user as raised, not as the advice about broadcasting over particles."""
    plain, guide = _problem(backend)
    calls = []

    def model(x):  # runs once (the loss's setup), then fails: as a NaN parameter after a step
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("the model's own error")
        plain(x)

    with pytest.raises(ValueError, match="^the model's own error"):
        backend.loss_samples(model, guide, backend.array(DATA), loss=backend.lib.VIMCO(M), seeds=[1])

