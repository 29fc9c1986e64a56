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
