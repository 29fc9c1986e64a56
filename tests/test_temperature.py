"""Temperatures: the schedules (exponential decay to a floor, linear, constant), gradients of
log_prob with respect to a learnable temperature against finite differences, and SVI learning a
temperature."""

import math

import numpy as np
import pytest

from tests.cases import CASES


def test_exponential_decay(backend):
    schedule = backend.lib.exponential_decay(initial=2.0, rate=1e-3, floor=0.5, every=100)
    for step in (0, 99, 100, 250, 1000, 10**6):
        expected = max(0.5, 2.0 * math.exp(-1e-3 * (step // 100 * 100)))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    assert float(backend.lib.exponential_decay()(0)) == 1.0  # Jang et al.'s max(0.5, exp(-r t)) by default


def test_linear_decay_and_constant(backend):
    schedule = backend.lib.linear_decay(initial=1.0, final=0.2, steps=400)
    for step, expected in ((0, 1.0), (100, 0.8), (400, 0.2), (5000, 0.2)):
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    assert float(backend.lib.constant(0.7)(123)) == pytest.approx(0.7)
    assert float(backend.lib.linear_decay(1.0, 0.5, steps=np.int64(10))(5)) == pytest.approx(0.75)  # NumPy integers


@pytest.mark.parametrize("make, match", [
    (lambda lib: lib.exponential_decay(initial=0.0), "initial must be a positive"),
    (lambda lib: lib.exponential_decay(floor=-1.0), "floor must be a positive"),
    (lambda lib: lib.exponential_decay(rate=float("nan")), "rate must be a finite number"),
    (lambda lib: lib.exponential_decay(every=0), "every must be an integer"),
    (lambda lib: lib.linear_decay(1.0, 0.5, steps=0), "steps must be an integer"),
    (lambda lib: lib.linear_decay(1.0, float("inf"), steps=10), "final must be a positive"),
    (lambda lib: lib.constant(-2.0), "value must be a positive"),
    (lambda lib: lib.constant(1.0)(-1), "step must be >= 0"),
    # steps count: a float, NaN or inf step (a floor of NaN was the floor, 0.5) and a boolean are refused
    (lambda lib: lib.linear_decay(2.0, 0.5, steps=10)(2.5), "step must be an integer"),
    (lambda lib: lib.exponential_decay()(float("nan")), "step must be an integer"),
    (lambda lib: lib.exponential_decay()(float("inf")), "step must be an integer"),
    (lambda lib: lib.constant(1.0)(True), "step must be an integer"),
    (lambda lib: lib.exponential_decay(every=True), "every must be an integer"),
    (lambda lib: lib.exponential_decay(rate=True), "rate must be a finite number"),
    (lambda lib: lib.linear_decay(1.0, 0.5, steps=True), "steps must be an integer"),
])
def test_bad_schedule_arguments_raise(backend, make, match):
    with pytest.raises(ValueError, match=match):
        make(backend.lib)


def test_schedules_take_integer_arrays_and_tensors(backend):
    """A step as an integer array (tensor) is the same step; a float array is refused as a float."""
    schedule = backend.lib.exponential_decay(initial=2.0, rate=1e-2, floor=0.5)
    assert float(schedule(backend.array(7, "int64"))) == pytest.approx(2.0 * math.exp(-0.07), rel=1e-6)
    with pytest.raises(ValueError, match="step must be an integer"):
        schedule(backend.array(7.0))


@pytest.mark.parametrize("precision", ["float32"])  # JAX's x64 mode off (tests/conftest.py), as a float32 user runs it
@pytest.mark.parametrize("make, name", [
    (lambda lib: lib.constant(1e-50), "value"),
    (lambda lib: lib.constant(1e39), "value"),
    (lambda lib: lib.exponential_decay(floor=1e-300), "floor"),
    (lambda lib: lib.linear_decay(1e40, 0.5, steps=10), "initial"),
])
def test_numpyro_schedules_refuse_numbers_their_float_dtype_rounds_to_zero_or_inf(make, name, precision):
    """NumPyro's schedules compute in JAX's default float dtype, float32 unless x64 is on: 1e-50 was
    a temperature of 0.0 and 1e39 one of inf, given without an error. (Pyro's are Python floats, which
    the distributions check as their logits' dtype rounds them.)"""
    pytest.importorskip("jax")
    import numpyro_concrete

    with pytest.raises(ValueError, match=rf"{name} = .* in float32"):
        make(numpyro_concrete)


LEARNABLE = [c for c in CASES if min(np.ravel(c.temperature)) >= 0.1]


def _sum_log_prob(lib, name, t, logits, points):
    return getattr(lib, name)(t, logits=logits).log_prob(points).sum()


@pytest.mark.parametrize("case", LEARNABLE, ids=str)
def test_log_prob_gradient_in_temperature_matches_finite_differences(backend, case):
    """d/dt of sum log_prob(points) -- the gradient a learnable temperature gets."""
    args, static, h = (case.logits_array, case.points(5)), (backend.lib, case.name), 1e-6

    def value_and_grad(t):
        return backend.value_and_grad(_sum_log_prob, t, *args, static=static)

    t = case.temperature_array
    _, (grad, *_) = value_and_grad(t)
    fd = np.zeros(t.shape)
    for index in np.ndindex(*t.shape):
        step = np.zeros(t.shape)
        step[index] = h
        fd[index] = (value_and_grad(t + step)[0] - value_and_grad(t - step)[0]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)


def test_hard_concrete_log_prob_gradient_in_temperature(backend):
    points = backend.array(np.array([0.0, 0.2, 0.7, 1.0]))
    logits = backend.array(np.array([0.5, -1.0, 2.0, 0.0]))
    h = 1e-6

    def total(t):
        return backend.lib.HardConcrete(t, logits=logits).log_prob(points).sum()

    _, (grad,) = backend.value_and_grad(total, np.array(2 / 3))
    fd = (backend.value_and_grad(total, np.array(2 / 3 + h))[0] - backend.value_and_grad(total, np.array(2 / 3 - h))[0]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_svi_learns_a_temperature(backend):
    """Model z ~ BinConcrete(1/2, a); guide z ~ BinConcrete(exp(log_t), phi) with the temperature a
    parameter from 1: the KL is 0 only at t = 1/2 and phi = a. The tolerance, 0.08, is about three
    times the largest error seen over seeds 0-5 in both backends; t starts 0.5 away."""
    prior_logits = np.array([1.0, -0.5, 0.3, -1.0])

    def model():
        backend.site("z", backend.make("BinConcrete", 0.5, logits=prior_logits).to_event(1))

    def guide():
        phi = backend.param("phi", np.zeros(4))
        log_t = backend.param("log_t", np.array(0.0))
        backend.site("z", backend.lib.BinConcrete(backend.exp(log_t), logits=phi).to_event(1))

    losses, params = backend.svi(model, guide, steps=1000, lr=0.02, seed=0, num_particles=32)
    assert abs(math.exp(params["log_t"]) - 0.5) < 0.08
    assert np.all(np.isfinite(losses))
