"""Temperature schedules for an SVI loop: ``schedule(step)`` is the temperature at that step.

Pass the result to the model and guide as an argument, so that one compiled step serves every
temperature (``JitTrace_ELBO`` traces tensors, not Python numbers)::

    schedule = exponential_decay(initial=1.0, rate=1e-4, floor=0.5, every=1000)
    for step in range(num_steps):
        svi.step(data, torch.tensor(schedule(step)))

A learnable temperature is a positive parameter, e.g.
``pyro.param("temperature", torch.tensor(1.0), constraint=constraints.positive)``; every
distribution of the package is differentiable with respect to its temperature.
"""

import math
import numbers

__all__ = ["exponential_decay", "linear_decay", "constant"]


def _positive(schedule_name, name, x):
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{schedule_name}: {name} must be a positive finite number, got {x!r}")
    return float(x)


def _check_step(schedule_name, step):
    if step < 0:
        raise ValueError(f"{schedule_name}: step must be >= 0, got {step}")


def exponential_decay(initial=1.0, rate=1e-4, floor=0.5, every=1):
    """max(floor, initial * exp(-rate * step)), with step rounded down to a multiple of ``every``
    (Jang et al. 2017 anneal as max(0.5, exp(-r t)) every N steps)."""
    initial, floor = _positive("exponential_decay", "initial", initial), _positive("exponential_decay", "floor", floor)
    if not isinstance(rate, numbers.Real) or not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"exponential_decay: rate must be a finite number >= 0, got {rate!r}")
    if not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"exponential_decay: every must be an integer >= 1, got {every!r}")

    def schedule(step):
        _check_step("exponential_decay", step)
        return max(floor, initial * math.exp(-rate * (step // every * every)))  # a Python float

    return schedule


def linear_decay(initial, final, steps):
    """From ``initial`` at step 0 to ``final`` at ``steps``, linearly, then constant."""
    initial, final = _positive("linear_decay", "initial", initial), _positive("linear_decay", "final", final)
    if not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"linear_decay: steps must be an integer >= 1, got {steps!r}")

    def schedule(step):
        _check_step("linear_decay", step)
        return initial + (final - initial) * min(step / steps, 1.0)

    return schedule


def constant(value):
    """The same temperature at every step."""
    value = _positive("constant", "value", value)

    def schedule(step):
        _check_step("constant", step)
        return value

    return schedule
