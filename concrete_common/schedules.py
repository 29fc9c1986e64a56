"""The temperature schedules on plain Python numbers, and their argument checks. ``pyro_concrete``
exports these as they are (a Python float per step, which the model takes as a tensor);
``numpyro_concrete.temperature`` computes the same formulas on JAX values, so that a traced step
works inside ``jit``."""

import math
import numbers
from typing import Callable


def positive(schedule, name, x):
    """``x`` as a float, or a ValueError unless it is a positive finite real number."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{schedule}: {name} must be a positive finite number, got {x!r}")
    return float(x)


def exponential_decay_arguments(initial, rate, floor, every):
    initial, floor = positive("exponential_decay", "initial", initial), positive("exponential_decay", "floor", floor)
    if not isinstance(rate, numbers.Real) or isinstance(rate, bool) or not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"exponential_decay: rate must be a finite number >= 0, got {rate!r}")
    if not isinstance(every, numbers.Integral) or isinstance(every, bool) or every < 1:
        raise ValueError(f"exponential_decay: every must be an integer >= 1, got {every!r}")
    return initial, rate, floor, every


def linear_decay_arguments(initial, final, steps):
    initial, final = positive("linear_decay", "initial", initial), positive("linear_decay", "final", final)
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"linear_decay: steps must be an integer >= 1, got {steps!r}")
    return initial, final, steps


def step_error(schedule, step):
    return ValueError(f"{schedule}: step must be >= 0, got {step}")


def check_integer(schedule, step, single=True):
    """A ValueError unless ``step`` is an integer: a Python or NumPy integer, or an array or tensor
    of an integer dtype (``single``: with one element). A float step (2.5, NaN, inf) or a boolean is
    refused: the schedules count steps."""
    integer_array = "int" in str(getattr(step, "dtype", "")) and (not single or getattr(step, "shape", ()) in ((), (1,)))
    if not isinstance(step, bool) and (isinstance(step, numbers.Integral) or integer_array):
        return
    raise ValueError(f"{schedule}: step must be {'an integer' if single else 'an integer or an array of integers'} (the SVI step's count), got {step!r}")


def _check_step(schedule, step):
    check_integer(schedule, step)
    if step < 0:
        raise step_error(schedule, step)


def exponential_decay(initial: float = 1.0, rate: float = 1e-4, floor: float = 0.5, every: int = 1) -> Callable[[int], float]:
    """max(floor, initial * exp(-rate * step)), with step rounded down to a multiple of ``every``
    (Jang et al. 2017 anneal as max(0.5, exp(-r t)) every N steps)."""
    initial, rate, floor, every = exponential_decay_arguments(initial, rate, floor, every)

    def schedule(step: int) -> float:
        _check_step("exponential_decay", step)
        return max(floor, initial * math.exp(-rate * (step // every * every)))

    return schedule


def linear_decay(initial: float, final: float, steps: int) -> Callable[[int], float]:
    """From ``initial`` at step 0 to ``final`` at ``steps``, linearly, then constant."""
    initial, final, steps = linear_decay_arguments(initial, final, steps)

    def schedule(step: int) -> float:
        _check_step("linear_decay", step)
        return initial + (final - initial) * min(step / steps, 1.0)

    return schedule


def constant(value: float) -> Callable[[int], float]:
    """The same temperature at every step."""
    value = positive("constant", "value", value)

    def schedule(step: int) -> float:
        _check_step("constant", step)
        return value

    return schedule
