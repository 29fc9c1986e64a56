"""The argument checks of the temperature schedules (``temperature.py`` in each package): plain
Python numbers, before any schedule exists."""

import math
import numbers


def positive(schedule, name, x):
    """``x`` as a float, or a ValueError unless it is a positive finite real number."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{schedule}: {name} must be a positive finite number, got {x!r}")
    return float(x)


def exponential_decay_arguments(initial, rate, floor, every):
    initial, floor = positive("exponential_decay", "initial", initial), positive("exponential_decay", "floor", floor)
    if not isinstance(rate, numbers.Real) or not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"exponential_decay: rate must be a finite number >= 0, got {rate!r}")
    if not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"exponential_decay: every must be an integer >= 1, got {every!r}")
    return initial, rate, floor, every


def linear_decay_arguments(initial, final, steps):
    initial, final = positive("linear_decay", "initial", initial), positive("linear_decay", "final", final)
    if not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"linear_decay: steps must be an integer >= 1, got {steps!r}")
    return initial, final, steps


def step_error(schedule, step):
    return ValueError(f"{schedule}: step must be >= 0, got {step}")
