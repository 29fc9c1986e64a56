"""Hard Concrete (Louizos, Welling & Kingma 2018): log_prob of the mixed measure against the
float64 reference, masses and density adding up to one, samples against the distribution,
the closed-form expected L0 penalty, the test-time gate, the discrete limit, gradients."""

import numpy as np
import pytest
from scipy.special import expit

from tests import reference
from tests.helpers import assert_close, assert_frequencies, assert_ks

SPECS = [  # (temperature, logits, (low, high))
    (2 / 3, (-2.0, 0.0, 1.5), (-0.1, 1.1)),
    (0.1, (50.0, -50.0, 3.0), (-0.1, 1.1)),
    ((0.3, 1.0, 2.0), (0.5,), (-0.5, 1.2)),
    (1.0, ((1.0, -1.0), (0.2, 3.0)), (-1.0, 2.0)),
]


def _id(spec):
    t, logits, stretch = spec
    return f"T{t if np.isscalar(t) else 'batch'}-{np.size(logits)}-{stretch[0]},{stretch[1]}"


def _make(backend, spec, dtype="float64", **kwargs):
    t, logits, (low, high) = spec
    t = t if np.isscalar(t) else np.asarray(t, np.float64)
    return backend.make("HardConcrete", t, logits=np.asarray(logits, np.float64), dtype=dtype, low=low, high=high, **kwargs)


def _params(spec):
    t, logits, (low, high) = spec
    logits = np.asarray(logits, np.float64)
    t = np.broadcast_to(np.asarray(t, np.float64), np.broadcast_shapes(np.shape(t), logits.shape))
    return np.broadcast_to(logits, t.shape), t, low, high


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_log_prob_matches_the_reference(backend, spec, dtype):
    logits, t, low, high = _params(spec)
    d = _make(backend, spec, dtype)
    points = np.stack([np.zeros_like(t), np.full_like(t, 1e-3), np.full_like(t, 0.37), np.full_like(t, 0.999), np.ones_like(t)])
    points = points.astype(dtype).astype(np.float64)
    expected = reference.hard_concrete_log_prob(points, logits, t, low, high)
    rtol = 1e-3 if dtype == "float32" else None  # float32 rounding of (z - low) / (high - low)
    assert_close(backend.numpy(d.log_prob(backend.array(points, dtype))), expected, dtype, rtol=rtol)
    assert_close(backend.numpy(d.cdf(backend.array(points, dtype))), reference.hard_concrete_cdf(points, logits, t, low, high),
                 dtype, rtol=rtol)


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_masses_and_density_add_up_to_one(backend, spec):
    """P(0) + P(1) + the integral of the density over (0, 1) (Simpson's rule in the logit of the
    stretched variable, where the integrand is smooth) is 1."""
    logits, t, low, high = _params(spec)
    d = _make(backend, spec)
    width = high - low
    lo, hi = -low / width, (1 - low) / width  # the stretched variable's range that lands inside (0, 1)
    u = np.linspace(np.log(lo) - np.log1p(-lo), np.log(hi) - np.log1p(-hi), 20001)
    s = expit(u)
    z = np.clip(low + width * s, 1e-12, 1 - 1e-12)[(...,) + (None,) * t.ndim] * np.ones(t.shape)  # the ends: their limits
    log_density = backend.numpy(d.log_prob(backend.array(z)))
    integrand = np.exp(log_density) * (width * s * (1 - s))[(...,) + (None,) * t.ndim]  # dz = width s (1 - s) du
    from scipy.integrate import simpson

    integral = simpson(integrand, x=u, axis=0)
    ends = np.exp(backend.numpy(d.log_prob(backend.array(np.zeros(t.shape))))) + np.exp(
        backend.numpy(d.log_prob(backend.array(np.ones(t.shape))))
    )
    np.testing.assert_allclose(ends + integral, 1.0, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS[:1] + SPECS[2:], ids=_id)
def test_samples_follow_the_distribution(backend, spec):
    """20000 draws: the counts at 0, at 1 and inside against the masses (chi-square), and the
    values inside against the conditional cdf (KS), per batch element."""
    logits, t, low, high = _params(spec)
    n = 20000
    z = backend.numpy(backend.sample(_make(backend, spec), (n,), seed=11))
    assert z.min() >= 0 and z.max() <= 1
    for index in np.ndindex(*t.shape):
        x, a, lam = z[(slice(None),) + index], logits[index], t[index]
        p0 = reference.bin_concrete_cdf(-low / (high - low), a, lam)
        p1 = 1 - reference.bin_concrete_cdf((1 - low) / (high - low), a, lam)
        counts = [np.sum(x == 0), np.sum(x == 1), np.sum((x > 0) & (x < 1))]
        assert_frequencies(counts, [p0, p1, 1 - p0 - p1], what=f"masses at {index}")
        inner = x[(x > 0) & (x < 1)]
        if inner.size > 100:
            assert_ks(inner, lambda v: (reference.hard_concrete_cdf(v, a, lam, low, high) - p0) / (1 - p0 - p1), what=f"{index}")


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_prob_nonzero_gate_and_discrete_limit(backend, spec):
    logits, t, low, high = _params(spec)
    d = _make(backend, spec)
    lo = -low / (high - low)
    p_nonzero = expit(logits - t * (np.log(lo) - np.log1p(-lo)))  # 1 - P(S <= lo), the cdf's complement
    louizos = expit(logits - t * np.log(-low / high))  # Louizos et al. eq. 12
    np.testing.assert_allclose(backend.numpy(d.prob_nonzero), p_nonzero, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(backend.numpy(d.prob_nonzero), louizos, rtol=1e-10, atol=1e-300)
    gate = np.clip(expit(logits) * (high - low) + low, 0, 1)  # eq. 13
    np.testing.assert_allclose(backend.numpy(d.deterministic_gate), gate, rtol=1e-12)
    np.testing.assert_allclose(backend.numpy(d.discrete().probs), louizos, rtol=1e-10, atol=1e-300)
    expanded = d.expand((3,) + t.shape)
    np.testing.assert_allclose(backend.numpy(expanded.prob_nonzero)[0], louizos, rtol=1e-10, atol=1e-300)


def test_pathwise_gradient_matches_finite_differences(backend):
    """E[f(Z)] with common random numbers is piecewise smooth in the parameters (the clip); away
    from the kinks its autodiff gradient matches central differences."""
    weights = backend.array(np.array([0.7, -1.3, 0.4]))
    h = 1e-6

    def expectation(logits, t):
        d = backend.lib.HardConcrete(t, logits=logits)
        z = backend.sample(d, (300,), seed=4)
        return (weights * z * z).sum() / 300 + (d.prob_nonzero * weights).sum()

    logits, t = np.array([-1.0, 0.5, 2.0]), np.array(2 / 3)
    _, (g_logits, g_t) = backend.value_and_grad(expectation, logits, t)
    for params, grad, which in ((logits, g_logits, 0), (t, g_t, 1)):
        fd = np.zeros(params.shape)
        for index in np.ndindex(*params.shape):
            step = np.zeros(params.shape)
            step[index] = h
            plus, minus = [logits, t], [logits, t]
            plus[which], minus[which] = params + step, params - step
            fd[index] = (backend.value_and_grad(expectation, *plus)[0] - backend.value_and_grad(expectation, *minus)[0]) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8)
        assert np.abs(grad).max() > 1e-3


@pytest.mark.parametrize("kwargs, match", [
    (dict(low=0.0), "low must be < 0"),
    (dict(high=1.0), "high must be > 1"),
    (dict(low=float("nan")), "low must be a finite number"),
])
def test_bad_stretch_raises(backend, kwargs, match):
    with pytest.raises(ValueError, match=match):
        backend.make("HardConcrete", 0.5, logits=np.zeros(2), **kwargs)


def test_values_off_the_support_raise_under_validation(backend):
    d = backend.make("HardConcrete", 0.5, logits=np.zeros(2), validate_args=True)
    with pytest.raises(ValueError, match="support"):
        d.log_prob(backend.array(np.array([0.5, 1.5])))


def _gated_model(backend, logits, data_size):
    """x_n ~ Normal(3 z_n, 1) with a Hard Concrete gate z_n: the discrete graph has z_n ~ Bernoulli(prob_nonzero)."""

    def model(x=None):
        with backend.plate("data", data_size):
            z = backend.site("z", backend.lib.HardConcrete(2 / 3, logits=backend.array(logits)))
            backend.site("x", backend.normal(3.0 * z, 1.0), obs=x)

    return model


def test_test_time_modes_use_the_gate_being_open(backend):
    """argmax: z = [prob_nonzero > 1/2]; enumerate: the exact marginal of the Bernoulli(prob_nonzero) mixture."""
    from scipy import stats
    from scipy.special import logsumexp

    logits = np.array([-1.0, 0.0, 0.5, 2.0])
    data = np.array([0.1, 2.5, -0.4, 3.3])
    p_open = expit(logits - 2 / 3 * np.log(0.1 / 1.1))
    argmax = backend.run(backend.lib.discrete(_gated_model(backend, logits, 4), mode="argmax"), backend.array(data)).sites["z"].value
    np.testing.assert_array_equal(argmax, (p_open > 0.5).astype(float))
    marginal = float(backend.numpy(backend.lib.marginal_log_likelihood(_gated_model(backend, logits, 4), backend.array(data))))
    terms = np.stack([np.log1p(-p_open) + stats.norm.logpdf(data, 0, 1), np.log(p_open) + stats.norm.logpdf(data, 3, 1)])
    assert marginal == pytest.approx(logsumexp(terms, axis=0).sum(), rel=1e-10)


def test_values_off_the_support_without_validation(backend):
    d = backend.make("HardConcrete", 0.5, logits=np.zeros(4), validate_args=False)
    values = backend.array(np.array([-0.5, 0.0, 1.0, 1.5]))
    log_prob, cdf = backend.numpy(d.log_prob(values)), backend.numpy(d.cdf(values))
    assert log_prob[0] == -np.inf and log_prob[3] == -np.inf and np.isfinite(log_prob[1:3]).all()
    np.testing.assert_array_equal(cdf[[0, 2, 3]], [0.0, 1.0, 1.0])
    assert 0 < cdf[1] < 1  # the mass at 0
