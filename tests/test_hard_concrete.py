"""Hard Concrete (Louizos, Welling & Kingma 2018): log_prob of the mixed measure against the
float64 reference, masses and density adding up to one, samples against the distribution,
the closed-form expected L0 penalty, the test-time gate, the discrete limit, gradients; the
stretch ``low``/``high`` as ordinary (array-valued, differentiable, validated) parameters."""

import decimal

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


@pytest.mark.parametrize("dtype,log_alpha", [("float32", 20.0), ("float64", 40.0), ("float64", 50.0)])
def test_prob_nonzero_gradient_of_a_gate_surely_open(backend, dtype, log_alpha):
    """d P(z != 0) / d log_alpha = p (1 - p), tiny but positive where p rounds to 1 (the L0
    penalty's gradient on a gate surely open): sigmoid's gradient p (1 - p) was 0 there, with p
    rounded first; exp(log sigmoid) keeps 1 - p."""
    t, low, high = 2 / 3, -0.1, 1.1

    def prob_nonzero(logits):
        return backend.lib.HardConcrete(t, logits=logits, low=low, high=high).prob_nonzero

    _, (grad,) = backend.value_and_grad(prob_nonzero, log_alpha, dtype=dtype)
    a = log_alpha - t * np.log(-low / high)
    np.testing.assert_allclose(grad, expit(a) * expit(-a), rtol=1e-4)


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
    (dict(low=0.0), "low must be a finite number < 0, got 0.0"),
    (dict(high=1.0), "high must be a finite number > 1, got 1.0"),
    (dict(low=float("nan")), "low must be a finite number < 0, got nan"),
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


# ----------------------------------------------------------------------------- low and high as parameters

# a (2, 3) batch: low varies along the first axis, high, logits and the temperature along the second
LOW, HIGH = np.array([[-0.1], [-0.3]]), np.array([1.1, 1.3, 1.05])
LOGITS, TEMPERATURE = np.array([-1.0, 0.2, 0.6]), np.array([2 / 3, 1.0, 0.4])


def _array_stretch(backend, dtype="float64", low=LOW, high=HIGH, **kwargs):
    """low as a backend array, high as a NumPy array (both kinds of input), the batch shape theirs."""
    return backend.make("HardConcrete", TEMPERATURE, logits=LOGITS, dtype=dtype, low=backend.array(low, dtype), high=high, **kwargs)


def test_array_valued_stretch_matches_the_reference(backend, dtype):
    d = _array_stretch(backend, dtype)
    assert tuple(d.batch_shape) == (2, 3) and d.has_rsample
    low, high = (np.broadcast_to(x.astype(dtype).astype(np.float64), (2, 3)) for x in (LOW, HIGH))
    for name, expected in (("low", low), ("high", high)):
        value = backend.numpy(getattr(d, name))
        assert value.dtype == np.dtype(dtype)  # the logits' dtype, whatever the input's
        np.testing.assert_array_equal(value, expected)
    logits, t = np.broadcast_to(LOGITS, (2, 3)), np.broadcast_to(TEMPERATURE, (2, 3))
    points = np.array([0.0, 1e-3, 0.37, 0.999, 1.0])[:, None, None] * np.ones((2, 3))
    assert_close(backend.numpy(d.log_prob(backend.array(points, dtype))),
                 reference.hard_concrete_log_prob(points, logits, t, low, high), dtype)
    assert_close(backend.numpy(d.cdf(backend.array(points, dtype))), reference.hard_concrete_cdf(points, logits, t, low, high), dtype)

    rtol = 1e-6 if dtype == "float32" else 1e-12
    louizos = expit(logits - t * np.log(-low / high))  # Louizos et al. eq. 12
    np.testing.assert_allclose(backend.numpy(d.prob_nonzero), louizos, rtol=rtol)
    np.testing.assert_allclose(backend.numpy(d.discrete().probs), louizos, rtol=rtol)
    np.testing.assert_allclose(backend.numpy(d.deterministic_gate), expit(logits) * (high - low) + low, rtol=rtol)  # all inside (0, 1)
    expanded = d.expand((4, 2, 3))
    assert tuple(expanded.batch_shape) == (4, 2, 3)
    np.testing.assert_array_equal(backend.numpy(expanded.low), np.broadcast_to(low, (4, 2, 3)))
    np.testing.assert_array_equal(backend.numpy(expanded.high), np.broadcast_to(high, (4, 2, 3)))

    # arg_constraints: low < 0, high > 1
    check = {name: backend.numpy(d.arg_constraints[name].check(backend.array(np.array(v), dtype))) for name, v in
             (("low", [-0.1, 0.0, -2.0]), ("high", [1.1, 1.0, 0.5]))}
    np.testing.assert_array_equal(check["low"], [True, False, True])
    np.testing.assert_array_equal(check["high"], [True, False, False])

    if dtype == "float64":  # samples: each batch element stretched by its own ends, from the same uniforms; and scored
        z, (log_prob,) = backend.score_samples(d, (), (100,), seed=2)
        y = reference.sample_log_coordinates("BinConcrete", backend.uniforms(d, (100,), seed=2), logits, t)
        np.testing.assert_allclose(z, np.clip(low + (high - low) * expit(y), 0, 1), rtol=0, atol=1e-12)
        assert ((z > 0) & (z < 1)).mean() > 0.5
        assert_close(log_prob, reference.hard_concrete_log_prob(z, logits, t, low, high), dtype)


def _stretch_objective(backend, part, low, high):
    """A scalar function of low and high through one method (module level: NumPyro compiles it)."""
    d = backend.lib.HardConcrete(backend.array(TEMPERATURE), logits=backend.array(LOGITS), low=low, high=high)
    weights = backend.array(np.array([[0.7, -1.3, 0.4], [-0.2, 0.9, 1.1]]))
    points = backend.array(np.array([0.0, 0.05, 0.4, 0.93, 1.0])[:, None, None] * np.ones((2, 3)))
    if part == "log_prob":
        value = d.log_prob(points)
    elif part == "cdf":
        value = d.cdf(points)
    elif part == "rsample":  # pathwise, common random numbers: smooth away from the clip's kinks
        z = backend.sample(d, (200,), seed=5)
        value = z * z / 200
    else:
        value = {"prob_nonzero": d.prob_nonzero, "deterministic_gate": d.deterministic_gate,
                 "discrete": d.discrete().probs}[part]
    return (value * weights).sum()


@pytest.mark.parametrize("part", ["log_prob", "cdf", "rsample", "prob_nonzero", "deterministic_gate", "discrete"])
def test_gradients_with_respect_to_low_and_high_match_finite_differences(backend, part):
    h = 1e-6
    args = [LOW, HIGH]
    _, grads = backend.value_and_grad(_stretch_objective, *args, static=(backend, part))
    for which, (x, grad) in enumerate(zip(args, grads)):
        fd = np.zeros(x.shape)
        for index in np.ndindex(*x.shape):
            step = np.zeros(x.shape)
            step[index] = h
            values = []
            for sign in (1, -1):
                moved = list(args)
                moved[which] = x + sign * step
                values.append(backend.value_and_grad(_stretch_objective, *moved, static=(backend, part))[0])
            fd[index] = (values[0] - values[1]) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8, err_msg=f"{part}: d/d{['low', 'high'][which]}")
        assert np.abs(grad).min() > 1e-4, (part, which, grad)  # every end moves the result


def _decimal_reference(z, logits, t, low, high):
    """(log_prob, cdf) at one point z, from the definition in 60-digit decimal arithmetic: the
    stretch (z - low) / (high - low) exact, the BinConcrete cdf and density (eq. 17) of it, and
    each tail from its own closed form (no 1 - (1 - tiny))."""
    with decimal.localcontext() as context:
        context.prec = 60
        D = decimal.Decimal
        low, high, t, a = D(float(low)), D(float(high)), D(float(t)), D(float(logits)).exp()
        width = high - low

        def below(s):  # P(S <= s) = 1 / (1 + a ((1 - s) / s)^t)
            return 1 / (1 + a * ((1 - s) / s) ** t)

        def above(s):  # P(S > s) = 1 / (1 + ((s / (1 - s))^t) / a)
            return 1 / (1 + (s / (1 - s)) ** t / a)

        s = (D(float(z)) - low) / width
        if z <= 0:
            log_prob, cdf = below(-low / width).ln(), below(-low / width)
        elif z >= 1:
            log_prob, cdf = above((1 - low) / width).ln(), D(1)
        else:
            density = t * a * (s * (1 - s)) ** (-t - 1) / (a * s ** -t + (1 - s) ** -t) ** 2
            log_prob, cdf = (density / width).ln(), below(s)
        return float(log_prob), float(cdf)


HUGE = [  # (dtype, low, high, logits): logits near t log(-low / high), so that every part has mass
    ("float64", -1e17, 1.1, [25.0, 26.0, 27.5]),
    ("float32", -1e17, 1.1, [25.0, 26.0, 27.5]),
    ("float64", -0.1, 1e300, [-463.0, -462.0, -460.5]),
    ("float64", -1.5e308, 1.5e308, [-1.0, 0.0, 1.0]),  # high - low overflows
    ("float32", -3e38, 3e38, [-1.0, 0.0, 1.0]),
]


@pytest.mark.parametrize("dtype, low, high, logits", HUGE, ids=[f"{c[0]}-{c[1]:g},{c[2]:g}" for c in HUGE])
def test_huge_finite_ends(backend, dtype, low, high, logits):
    """No 'math domain error', NaN or overflow: low=-1e17 (1 - (z - low) / (high - low) is below
    float64's resolution) or ends whose difference overflows are scored exactly."""
    t = 2 / 3
    d = backend.make("HardConcrete", t, logits=np.array(logits), dtype=dtype, low=low, high=high)
    points = np.array([0.0, 1e-3, 0.5, 0.999, 1.0])[:, None] * np.ones(3)
    points = points.astype(dtype).astype(np.float64)
    expected = np.array([[_decimal_reference(z, a, t, low, high) for z, a in zip(row, logits)] for row in points])
    assert_close(backend.numpy(d.log_prob(backend.array(points, dtype))), expected[..., 0], dtype)
    assert_close(backend.numpy(d.cdf(backend.array(points, dtype))), expected[..., 1], dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(backend.numpy(d.prob_nonzero), 1 - expected[0, :, 1], rtol=rtol)
    z, (log_prob,) = backend.score_samples(d, (), (500,), seed=9)
    assert np.isfinite(z).all() and z.min() >= 0 and z.max() <= 1 and not np.isnan(log_prob).any()
    y = reference.sample_log_coordinates("BinConcrete", backend.uniforms(d, (500,), seed=9), np.array(logits), t)
    with decimal.localcontext() as context:  # z = (low + high e^y) / (1 + e^y), exactly
        context.prec = 60
        D = decimal.Decimal
        exact = np.array([float((D(low) + D(high) * D(float(v)).exp()) / (1 + D(float(v)).exp())) for v in y.ravel()])
    np.testing.assert_allclose(z.ravel(), np.clip(exact, 0, 1), rtol=0, atol=1e-4 if dtype == "float32" else 1e-9)


BAD_STRETCH = [  # (id, kwargs, dtype, validate_args, message)
    ("low-positive", dict(low=0.5), "float64", True, r"HardConcrete: low must be a finite number < 0, got 0\.5$"),
    ("low-zero-in-array", dict(low=np.array([-0.1, 0.0, -1.0])), "float64", True, r"low must be a finite number < 0, got 0\.0"),
    ("low-backend-array", dict(low=("backend", [-0.1, 0.2, -1.0])), "float64", True, r"low must be a finite number < 0, got 0\.2"),
    ("low-minus-inf", dict(low=-np.inf), "float64", True, r"low must be a finite number < 0, got -inf"),
    ("low-nan-array", dict(low=np.array([np.nan])), "float64", True, r"low must be a finite number < 0, got nan"),
    ("low-true", dict(low=True), "float64", True, r"low must be a finite number < 0.*got True"),
    ("high-one", dict(high=1.0), "float64", True, r"high must be a finite number > 1, got 1\.0"),
    ("high-inf", dict(high=np.inf), "float64", True, r"high must be a finite number > 1, got inf"),
    ("high-backend-array", dict(high=("backend", [1.5, 0.9, 2.0])), "float64", True, r"high must be a finite number > 1, got 0\.9"),
    ("high-bool-array", dict(high=np.array([True, False, True])), "float64", True, r"high must be a finite number > 1"),
    ("low-string", dict(low="-0.1"), "float64", True, r"low must be a finite number < 0"),
    ("low-overflows-float32", dict(low=-1e39), "float32", True, r"low must be a finite number < 0, got -1e\+39 \(-inf in float32\)"),
    ("high-overflows-float32", dict(high=1e300), "float32", True, r"high must be a finite number > 1, got 1e\+300 \(inf in float32\)"),
    ("low-underflows-float32", dict(low=-1e-50), "float32", True, r"low must be a finite number < 0, got -1e-50 \(-0\.0 in float32\)"),
    ("high-rounds-to-one-float32", dict(high=1 + 1e-9), "float32", True,
     r"high must be a finite number > 1, got 1\.000000001 \(1\.0 in float32\)"),
    # structural, and Python numbers (which cost nothing to check): also without validation
    ("low-python-number-unvalidated", dict(low=0.5), "float64", False, r"low must be a finite number < 0, got 0\.5"),
    ("low-bool-unvalidated", dict(low=np.array(True)), "float64", False, r"low must be a finite number < 0"),
    ("low-shape", dict(low=np.full(2, -0.1)), "float64", False, r"low of shape \(2,\) does not broadcast with the batch shape \(3,\)"),
    ("high-shape", dict(high=("backend", np.full((4, 1, 2), 1.1))), "float64", False,
     r"high of shape \(4, 1, 2\) does not broadcast with the batch shape \(3,\)"),
]


@pytest.mark.parametrize("kwargs, dtype, validate, match", [c[1:] for c in BAD_STRETCH], ids=[c[0] for c in BAD_STRETCH])
def test_bad_low_or_high_raises_naming_it(backend, kwargs, dtype, validate, match):
    kwargs = {k: backend.array(np.asarray(v[1]), dtype) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        backend.make("HardConcrete", 0.5, logits=np.zeros(3), dtype=dtype, validate_args=validate, **kwargs)


def test_array_values_are_checked_only_under_validation(backend):
    d = backend.make("HardConcrete", 0.5, logits=np.zeros(3), low=np.array([-0.1, 0.5, -1.0]), validate_args=False)
    assert tuple(d.batch_shape) == (3,)


def test_numpyro_jit_vmap_and_pytree_over_low_and_high(backend):
    """Traced low/high: vmap, jit, the pytree round trip; NumPy inputs are validated before they
    become (traced) JAX arrays. (grad under jit: the finite-difference test above, which the
    adapter compiles.)"""
    if backend.name != "numpyro":
        pytest.skip("JAX transformations")
    import jax
    import jax.numpy as jnp

    hc = backend.lib.HardConcrete
    points = jnp.asarray(np.array([0.0, 0.3, 1.0])[:, None, None] * np.ones((2, 3)))
    eager = _array_stretch(backend)
    vmapped = jax.vmap(lambda low: hc(jnp.asarray(TEMPERATURE), logits=jnp.asarray(LOGITS), low=low, high=jnp.asarray(HIGH)).prob_nonzero)
    np.testing.assert_allclose(vmapped(jnp.asarray(LOW[:, 0])), eager.prob_nonzero, rtol=1e-12)

    leaves, treedef = jax.tree_util.tree_flatten(eager)
    assert any(leaf is eager.low for leaf in leaves) and any(leaf is eager.high for leaf in leaves)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    np.testing.assert_array_equal(rebuilt.low, eager.low)
    np.testing.assert_array_equal(rebuilt.log_prob(points), eager.log_prob(points))
    # through jit as an argument: low and high arrive as tracers
    np.testing.assert_allclose(jax.jit(lambda dist: dist.log_prob(points))(eager), eager.log_prob(points), rtol=1e-12)
    other = _array_stretch(backend, low=LOW - 1.0, high=HIGH + 1.0)  # the ends are data, not static aux:
    assert jax.tree_util.tree_structure(other) == treedef  # other values reuse a compilation

    with pytest.raises(ValueError, match="low must be a finite number < 0, got 0.5"):
        jax.jit(lambda: hc(0.5, logits=np.zeros(3), low=np.array(0.5), validate_args=True))()
    with pytest.raises(ValueError, match=r"high of shape \(2,\) does not broadcast"):
        jax.jit(lambda high: hc(0.5, logits=jnp.zeros(3), high=high).logits)(jnp.full(2, 1.1))
    # a traced value cannot be read: no error, the caller's responsibility (as for the temperature)
    jax.jit(lambda low: hc(0.5, logits=jnp.zeros(3), low=low, validate_args=True).logits)(jnp.asarray(0.5))


@pytest.mark.parametrize("logits", [-35.0, -21.0, 21.0, 35.0])
def test_log_masses_are_exact_in_float64_where_the_softplus_argument_exceeds_20(backend, logits):
    """log P(Z = 0) and log P(Z = 1) are -softplus of arguments of magnitude > 20 here: torch's
    softplus returns its argument itself above 20, 2e-9 off (1e-10 relatively, 1e5 float64 ulps);
    both backends agree with the reference to a few ulps, as does the density inside."""
    t, low, high = 0.01, -0.1, 1.1
    d = backend.make("HardConcrete", t, logits=np.asarray(logits), dtype="float64", low=low, high=high)
    points = np.array([0.0, 0.5, 1.0])
    expected = reference.hard_concrete_log_prob(points, logits, t, low, high)
    assert_close(backend.numpy(d.log_prob(backend.array(points))), expected, "float64", rtol=1e-14)


def test_the_support_has_no_bijection_so_autoguides_refuse_a_hard_concrete_latent(backend):
    """Hard Concrete's support is [0, 1] with point masses at its ends: the unit interval's sigmoid
    never reaches them, so NUTS over a Hard Concrete latent gave P(z = 0) = P(z = 1) = 0 (both positive
    under the posterior) and an autoguide a continuous q beside a
    mixed prior, with no error. ``biject_to`` refuses the support, and with it each of those; the
    support's check still accepts [0, 1]."""
    d = backend.lib.HardConcrete(2 / 3, logits=backend.array(0.0))
    assert np.all(backend.numpy(d.support.check(backend.array([0.0, 0.3, 1.0]))))
    assert not np.any(backend.numpy(d.support.check(backend.array([-0.1, 1.1]))))
    with pytest.raises(ValueError, match=r"HardConcrete's support, Gate\(\), .* no bijection from the real line"):
        backend.biject_to(d.support)

    def model(y):
        g = backend.site("g", backend.lib.HardConcrete(2 / 3, logits=backend.array(0.0)))
        backend.site("y", backend.normal(g, 0.3), obs=y)

    guide = backend.autoguide("AutoNormal", model)
    with pytest.raises(ValueError, match=r"no bijection from the real line reaches the masses"):
        backend.svi(model, guide, backend.array(0.05), steps=1, lr=0.01)


@pytest.mark.parametrize("where", ["guide", "model"])
@pytest.mark.parametrize("loss", ["ImportanceWeightedELBO", "VIMCO", "ScoreFunctionELBO"])
def test_the_importance_weighted_losses_refuse_a_hard_concrete_latent(backend, loss, where):
    """A Hard Concrete gate drawn by the guide (or by the model, proposed by its prior): its point
    masses at 0 and 1 move with its parameters, and the losses' pathwise gradient through the clamp
    missed their share -- 22-32 % of a gate's gradient in both packages (z = -175 over 2e5 draws), with
    no error. They raise, pointing to L0Objective."""

    def model(x):
        with backend.plate("data", 2):
            g = backend.site("g", backend.lib.HardConcrete(2 / 3, logits=backend.array([-3.0, -3.0])))
            backend.site("x", backend.normal(2.0 * g, 1.0), obs=x)

    def guide(x):
        if where == "guide":
            with backend.plate("data", 2):
                backend.site("g", backend.lib.HardConcrete(2 / 3, logits=backend.param("a", np.array([0.8, 0.8]))))

    kwargs = {"num_particles": 2} if loss == "VIMCO" else {}
    with pytest.raises(ValueError, match=rf"^{loss}: site 'g' holds HardConcrete, whose point masses .* train gates with L0Objective"):
        backend.elbo_loss(model, guide, backend.array([0.5, 1.5]), loss=getattr(backend.lib, loss)(**kwargs))
