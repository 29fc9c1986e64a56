"""Pathwise (reparameterization) gradients of E[f(X)] against finite differences.

With common random numbers (the same seed at every parameter value) the Monte Carlo average is a
smooth deterministic function of the parameters, so its autodiff gradient and its central finite
difference agree to O(h^2) + rounding / h, independent of the Monte Carlo error.
"""

import numpy as np
import pytest

from tests.cases import CASES

N = 200
H = 1e-5
GRADIENT_CASES = [c for c in CASES if min(np.ravel(c.temperature)) >= 0.1]  # O(h^2) needs h << t


def _test_function(name, x, weights):
    """A smooth function of a sample, mixing coordinates."""
    if name in ("ExpConcrete", "LogitBinConcrete"):
        return (weights * (x / (1 + x * x))).sum()  # bounded in the log/logit coordinate
    return (weights * x * x).sum()


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_pathwise_gradient_matches_finite_differences(backend, case):
    rng = np.random.default_rng(0)
    weights_np = rng.normal(size=case.batch_shape + case.event_shape)
    weights = backend.array(weights_np)

    def expectation(logits, temperature):
        d = getattr(backend.lib, case.name)(temperature, logits=logits)
        return _test_function(case.name, backend.sample(d, (N,), seed=9), weights) / N

    logits, t = case.logits_array, case.temperature_array
    _, (grad_logits, grad_t) = backend.value_and_grad(expectation, logits, t)

    def value(logits, t):
        return backend.value_and_grad(expectation, logits, t)[0]

    for params, grad, which in ((logits, grad_logits, 0), (t, grad_t, 1)):
        finite_difference = np.zeros(params.shape)
        for index in np.ndindex(*params.shape):
            step = np.zeros(params.shape)
            step[index] = H
            args_plus = [logits, t]
            args_minus = [logits, t]
            args_plus[which] = params + step
            args_minus[which] = params - step
            finite_difference[index] = (value(*args_plus) - value(*args_minus)) / (2 * H)
        np.testing.assert_allclose(grad, finite_difference, rtol=1e-5, atol=1e-8)
        assert np.abs(grad).max() > 1e-4  # the gradient carries signal: a zero gradient would pass vacuously


def _bin_concrete_density(x, logit, temperature):
    """Eq. 17, plainly: t a x^(-t-1) (1-x)^(-t-1) / (a x^(-t) + (1-x)^(-t))^2."""
    a, t = np.exp(logit), temperature
    return t * a * x ** (-t - 1) * (1 - x) ** (-t - 1) / (a * x ** -t + (1 - x) ** -t) ** 2


def _second_difference(f, u, h=1e-4):
    return (f(u + h) - 2 * f(u) + f(u - h)) / h**2


@pytest.mark.parametrize("where", ["value", "logits"])
@pytest.mark.parametrize("name", ["BinConcrete", "LogitBinConcrete"])
def test_second_derivatives_at_a_binary_density_centre(backend, name, where):
    """The binary log densities are smooth and even in s = log a - t y around s = 0 (the centre:
    y = logits / t, x = 1/2 at logits 0): a Hessian there, as AutoLaplaceApproximation takes at a
    symmetric start, has their curvature. Pyro gave 0 for LogitBinConcrete's (torch's derivative of
    |s| is 0 at 0) and -1.96 for BinConcrete's 6.04, so the Laplace variance was off by a factor 3."""
    t, logit = 0.5, 0.0
    if name == "BinConcrete":
        point = 0.5
        plain = lambda x: np.log(_bin_concrete_density(x, logit, t))  # noqa: E731
        plain_in_logits = lambda a: np.log(_bin_concrete_density(point, a, t))  # noqa: E731
    else:
        point = logit / t
        plain = lambda y: np.log(_bin_concrete_density(1 / (1 + np.exp(-y)), logit, t) * np.exp(-y) / (1 + np.exp(-y)) ** 2)  # noqa: E731
        plain_in_logits = lambda a: np.log(_bin_concrete_density(0.5, a, t) / 4)  # noqa: E731  (y = 0: dx/dy = 1/4)
    cls = getattr(backend.lib, name)
    if where == "value":
        actual = backend.hessian(lambda v: cls(t, logits=backend.array(logit) + 0 * v, validate_args=False).log_prob(v), np.float64(point))
        expected = _second_difference(plain, point)
    else:
        value = backend.array(point)
        actual = backend.hessian(lambda a: cls(t, logits=a, validate_args=False).log_prob(value), np.float64(logit))
        expected = _second_difference(plain_in_logits, logit)
    assert abs(float(actual) - expected) < 1e-5 * max(1.0, abs(expected)), (float(actual), expected)
