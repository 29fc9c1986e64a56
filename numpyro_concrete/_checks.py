"""Parameter promotion and the ValueErrors of the Concrete family.

Structural problems (both or neither of logits/probs, too few categories, a temperature shape that
does not broadcast with the batch shape, a boolean temperature) are always errors, inside ``jit``
too. Checks that read parameter values run when validation is on (NumPyro's switch,
``numpyro.enable_validation()``, or ``validate_args=True``) on every input whose values can be
read: Python numbers, NumPy arrays and concrete JAX arrays, inside ``jit`` too (they are checked
before conversion); a traced input (a function argument under ``jit``/``grad``/``vmap``) cannot be
read. A Python-number temperature is always checked since that costs nothing. They decide with the
distributions' ``arg_constraints`` (``constraints.py``: positive finite temperatures, resolvable
logits, positive probabilities) and add the reason to the error, plus the one condition that ties
two parameters: |logits| / temperature within ``concrete_common.floats.logits_bounds``.
"""

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution
from numpyro.util import not_jax_tracer

from concrete_common.floats import coldest_temperature, logits_bounds
from concrete_common.messages import bound_message, boundary_probs_message, cold_temperature_message, fail, rounded_temperature_message

from .constraints import (
    open_unit_interval,
    positive_finite,
    positive_simplex,
    resolvable_real,
    resolvable_real_vector,
    simplex_tolerance,
)


def validation_enabled(validate_args):
    return Distribution._validate_args if validate_args is None else bool(validate_args)


def _as_float_array(x, dtype=None):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(dtype or jnp.result_type(float))
    return x


def _readable(x):
    """``x`` as a NumPy array if its values can be read now (a Python number, a NumPy array, a
    concrete JAX array), else None (a tracer inside ``jit``/``grad``/``vmap``)."""
    return np.asarray(x) if not_jax_tracer(x) else None


def _checked_real(cls_name, name, x):
    """``x`` if it is a real number or a real array (a list or tuple of real numbers becomes one);
    else a ValueError naming it (None, a string or a complex number failed in JAX's conversion,
    unnamed)."""
    if isinstance(x, numbers.Real):
        return x
    if isinstance(x, jax.Array):
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            fail(cls_name, f"{name} must be a real number or a floating-point array, got one of dtype {x.dtype}")
        return x
    try:
        array = np.asarray(x)
    except Exception:  # noqa: BLE001 -- e.g. a list of traced values: JAX's conversion decides
        try:
            array = jnp.asarray(x)
        except Exception:  # noqa: BLE001
            array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        fail(cls_name, f"{name} must be a real number or a floating-point array, got {x!r}")
    return x if isinstance(x, np.ndarray) else jnp.asarray(array)


def _check_not_bool(cls_name, name, x):
    if isinstance(x, (bool, np.bool_)) or jnp.result_type(x) == jnp.bool_:
        fail(cls_name, f"{name} must be a number or a floating-point array, got the boolean {x!r}")


def _explain(cls_name, name, x, constraint, low_open=None):
    """Raises the ValueError that says why ``x`` (a NumPy array) fails ``constraint`` (validation
    decided it does)."""
    if np.isnan(x).any():
        fail(cls_name, f"{name} contains NaN")
    if np.isinf(x).any():
        fail(cls_name, f"{name} must be finite, found {x[np.isinf(x)].flatten()[0]}")
    if low_open is not None and (x <= low_open).any():
        fail(cls_name, f"{name} must be > {low_open}, found {x.min():g}")
    fail(cls_name, f"{name} must satisfy {constraint}")


def _check_temperature(cls_name, temperature):
    temperature = _readable(temperature)
    if temperature is not None and not np.all(positive_finite(temperature)):
        _explain(cls_name, "temperature", temperature, positive_finite, low_open=0.0)


def _check_logits(cls_name, logits, temperature, categorical, dtype):
    """Logits (in ``dtype``) that satisfy ``resolvable_real(_vector)``, and |logits| / temperature
    within ``logits_bounds``' second bound."""
    logits = _readable(logits)
    if logits is None or logits.size == 0:
        return
    with np.errstate(over="ignore"):
        logits = logits.astype(dtype)  # as the distribution will hold them
    constraint = resolvable_real_vector if categorical else resolvable_real
    temperature = _readable(temperature)
    largest = float(np.abs(logits).max())  # NaN if any is NaN
    coldest = float(temperature.min().astype(dtype)) if temperature is not None and temperature.size else math.inf
    info = jnp.finfo(dtype)
    magnitude, ratio = logits_bounds(float(info.eps), float(info.max))
    least = coldest_temperature(float(info.tiny), float(info.max))
    if np.all(constraint(logits)) and largest <= ratio * coldest and coldest >= least:
        return
    if not math.isfinite(largest):
        _explain(cls_name, "logits", logits, constraint)
    if np.all(constraint(logits)) and largest <= ratio * coldest:  # the logits are fine: the temperature is not
        fail(cls_name, cold_temperature_message(coldest, least, ratio, jnp.dtype(dtype).name))
    fail(cls_name, bound_message(largest, coldest, magnitude, ratio, jnp.dtype(dtype).name))


def _check_probs(cls_name, probs, categorical, dtype):
    probs = _readable(probs)
    constraint = positive_simplex if categorical else open_unit_interval
    if probs is None or (categorical and not probs.ndim) or np.all(constraint(probs.astype(dtype))):
        return
    if np.isnan(probs).any():
        fail(cls_name, "probs contains NaN")
    if (probs < 0).any() or (probs > 1).any():
        fail(cls_name, f"probs must lie in [0, 1], found values in [{probs.min():g}, {probs.max():g}]")
    if categorical:
        error = np.abs(probs.sum(-1) - 1).max()
        if error > simplex_tolerance(np.zeros(probs.shape[-1:], dtype)):
            fail(cls_name, f"probs must sum to 1 along the last axis, found a sum off by {error:g}")
    # a categorical probability of 1.0 beside positive ones is a rounded float vector, finite logits
    fail(cls_name, boundary_probs_message(categorical))


def _validate_inputs(cls_name, temperature, logits, probs, categorical, dtype):
    """The value checks, on the parameters as given -- before they become JAX arrays, which inside
    ``jit`` would be tracers even for NumPy inputs -- each skipped for an input that is a tracer."""
    if not isinstance(temperature, numbers.Real):
        _check_temperature(cls_name, temperature)
    if probs is not None:
        _check_probs(cls_name, probs, categorical, dtype)
        probs = _readable(probs)
        if probs is None:
            return
        with np.errstate(divide="ignore"):
            logits = np.log(probs) if categorical else np.log(probs) - np.log1p(-probs)
    _check_logits(cls_name, logits, temperature, categorical, dtype)


def promote_params(cls_name, temperature, logits, probs, event_dim, validate):
    """Returns (temperature, logits, probs or None, batch_shape), broadcast to the batch shape.

    ``event_dim`` is 1 for the n-ary family (the last axis of logits holds the categories) and 0
    for the binary family. ``temperature`` is a batch parameter: its shape broadcasts with
    ``logits.shape[:-event_dim]`` and becomes part of the batch shape. Under validation the values
    are checked as given (NumPy or concrete inputs inside ``jit`` included).
    """
    if (logits is None) == (probs is None):
        fail(cls_name, f"pass exactly one of `logits` or `probs`, got {'neither' if logits is None else 'both'}")
    temperature = _checked_real(cls_name, "temperature", temperature)
    _check_not_bool(cls_name, "temperature", temperature)
    categorical = event_dim == 1
    given = (temperature, logits, probs)
    if probs is not None:
        probs = _as_float_array(probs)
        logits = jnp.log(probs) if categorical else jnp.log(probs) - jnp.log1p(-probs)
    else:
        logits = _as_float_array(logits)

    if categorical:
        if jnp.ndim(logits) < 1:
            fail(cls_name, "logits must have a last axis of categories, got a scalar")
        if jnp.shape(logits)[-1] < 2:
            fail(cls_name, f"needs at least 2 categories, got logits with last axis of size {jnp.shape(logits)[-1]}")

    if isinstance(temperature, numbers.Real):
        if not (math.isfinite(temperature) and temperature > 0):
            fail(cls_name, f"temperature must be positive and finite, got {temperature}")
        with np.errstate(over="ignore"):  # as the array below rounds it, read on the host (beyond the dtype: inf)
            rounded = float(np.asarray(temperature).astype(logits.dtype))
        if not (math.isfinite(rounded) and rounded > 0):
            fail(cls_name, rounded_temperature_message(temperature, rounded, jnp.dtype(logits.dtype).name))
        temperature = jnp.asarray(float(temperature), dtype=logits.dtype)
    else:
        temperature = _as_float_array(temperature, logits.dtype)
        dtype = jnp.promote_types(temperature.dtype, logits.dtype)
        temperature, logits = temperature.astype(dtype), logits.astype(dtype)
        probs = None if probs is None else probs.astype(dtype)
    if validate:
        _validate_inputs(cls_name, *given, categorical, logits.dtype)

    param_batch_shape = jnp.shape(logits)[:-1] if categorical else jnp.shape(logits)
    try:
        batch_shape = tuple(jnp.broadcast_shapes(jnp.shape(temperature), param_batch_shape))
    except ValueError:
        fail(
            cls_name,
            f"temperature of shape {tuple(jnp.shape(temperature))} does not broadcast with the batch shape "
            f"{tuple(param_batch_shape)} of the logits; temperature is a batch parameter "
            "(one per distribution, never one per category)",
        )
    event_shape = tuple(jnp.shape(logits)[-1:]) if categorical else ()
    temperature = jnp.broadcast_to(temperature, batch_shape)
    logits = jnp.broadcast_to(logits, batch_shape + event_shape)
    probs = None if probs is None else jnp.broadcast_to(probs, batch_shape + event_shape)
    return temperature, logits, probs, batch_shape


class ValidatedValues:
    """Mixin for NumPyro distributions: under validation, a value with the wrong event shape or off
    the support raises a ValueError (NumPyro itself only warns) when it is concrete; inside ``jit``
    the support check can only mask, which ``@validate_sample`` does (log_prob -inf)."""

    def _check_value_shape(self, value):
        if not self._validate_args:
            return
        event_shape = tuple(self.event_shape)
        shape = tuple(jnp.shape(value))
        if shape[len(shape) - len(event_shape) :] != event_shape or len(shape) < len(event_shape):
            raise ValueError(f"The right-most size of value must match event_shape: {shape} vs {event_shape}.")
        try:
            jnp.broadcast_shapes(shape, tuple(self.batch_shape) + event_shape)
        except ValueError:
            raise ValueError(
                f"Value is not broadcastable with batch_shape+event_shape: {shape} vs "
                f"{tuple(self.batch_shape) + event_shape}."
            ) from None

    def _validate_sample(self, value):
        mask = self.support(value)
        if not_jax_tracer(mask) and not np.all(mask):
            raise ValueError(
                f"Expected value argument (array of shape {tuple(jnp.shape(value))}) to be within the "
                f"support ({self.support!r}) of the distribution {type(self).__name__}, but found invalid "
                f"values:\n{value}"
            )
        return mask
