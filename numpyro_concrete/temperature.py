"""Temperature schedules for an SVI loop: ``schedule(step)`` is the temperature at that step (the
formulas of ``concrete_common.schedules``, on JAX values).

Pass the result to the model and guide as an argument, so that one compiled step serves every
temperature; the schedules are written in ``jax.numpy`` and also take a traced ``step`` inside
``jax.jit``::

    schedule = exponential_decay(initial=1.0, rate=1e-4, floor=0.5, every=1000)
    for step in range(num_steps):
        state, loss = update(state, data, schedule(step))   # update = jax.jit(svi.update)

A learnable temperature is a positive parameter, e.g.
``numpyro.param("temperature", 1.0, constraint=constraints.positive)``; every distribution of the
package is differentiable with respect to its temperature.

``step`` is an integer or an array of integers (a float step is refused); it is checked to be >= 0
where its value can be read, not when traced. The numbers given must hold in JAX's default float
dtype (float32 unless x64 is on), where the schedule computes.
"""


import math
from typing import Callable, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from numpyro.util import not_jax_tracer

from concrete_common import schedules

__all__ = ["exponential_decay", "linear_decay", "constant"]

Step = Union[int, Array]  # a Python step, or a traced one inside jit


def _check_step(schedule_name, step):
    """An integer step (array), >= 0 where its value can be read (a traced step is not checked)."""
    schedules.check_integer(schedule_name, step, single=False)
    if not_jax_tracer(step) and jnp.any(jnp.asarray(step) < 0):
        raise schedules.step_error(schedule_name, step)


def _representable(schedule_name, name, x):
    """``x`` (checked positive and finite in Python) as JAX's default float dtype holds it: float32
    unless x64 is on, where 1e-300 is 0 and 1e39 is inf -- a temperature the distributions refuse."""
    dtype = jax.dtypes.canonicalize_dtype(np.float64)  # read in NumPy: a schedule made inside jit too
    with np.errstate(over="ignore", under="ignore"):
        rounded = float(np.asarray(x, dtype))
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"{schedule_name}: {name} = {x!r} is {rounded!r} in {dtype} (JAX's default float dtype; numpyro.enable_x64() for float64)")
    return x


def exponential_decay(initial: float = 1.0, rate: float = 1e-4, floor: float = 0.5, every: int = 1) -> Callable[[Step], Array]:
    """max(floor, initial * exp(-rate * step)), with step rounded down to a multiple of ``every``
    (Jang et al. 2017 anneal as max(0.5, exp(-r t)) every N steps)."""
    initial, rate, floor, every = schedules.exponential_decay_arguments(initial, rate, floor, every)
    initial, floor = _representable("exponential_decay", "initial", initial), _representable("exponential_decay", "floor", floor)

    def schedule(step: Step) -> Array:
        _check_step("exponential_decay", step)
        return jnp.maximum(floor, initial * jnp.exp(-rate * (step // every * every)))

    return schedule


def linear_decay(initial: float, final: float, steps: int) -> Callable[[Step], Array]:
    """From ``initial`` at step 0 to ``final`` at ``steps``, linearly, then constant."""
    initial, final, steps = schedules.linear_decay_arguments(initial, final, steps)
    initial, final = _representable("linear_decay", "initial", initial), _representable("linear_decay", "final", final)

    def schedule(step: Step) -> Array:
        _check_step("linear_decay", step)
        return initial + (final - initial) * jnp.minimum(step / steps, 1.0)

    return schedule


def constant(value: float) -> Callable[[Step], Array]:
    """The same temperature at every step."""
    value = _representable("constant", "value", schedules.positive("constant", "value", value))

    def schedule(step: Step) -> Array:
        _check_step("constant", step)
        return jnp.asarray(value)

    return schedule
