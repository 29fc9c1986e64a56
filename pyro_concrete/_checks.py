"""Parameter promotion and the ValueErrors of the Concrete family.

Structural problems (both or neither of logits/probs, too few categories, a temperature shape that
does not broadcast with the batch shape, a boolean temperature) are always errors. Checks that read
parameter values run when validation is on, which Pyro makes the default; a Python-number
temperature is always checked since that costs nothing. They decide with the distributions'
``arg_constraints`` (``constraints.py``: positive finite temperatures, resolvable logits, positive
probabilities) and add the reason to the error, plus the one condition that ties two parameters:
|logits| / temperature within ``concrete_common.floats.logits_bounds``.
"""

import math
import numbers
from typing import Any, Sequence, Union

import numpy as np
import torch
from torch.distributions import Distribution

from concrete_common.floats import coldest_temperature, logits_bounds
from concrete_common.messages import bound_message, boundary_probs_message, cold_temperature_message, fail, rounded_temperature_message

from ._tracing import quiet_under_trace
from .constraints import (
    open_unit_interval,
    positive_finite,
    positive_simplex,
    resolvable_real,
    resolvable_real_vector,
    simplex_tolerance,
)

# what the public API takes for a parameter: a tensor, a NumPy array, a number or a nested sequence
# (torch.as_tensor's inputs); NumPyro's hints say jax.typing.ArrayLike
ArrayLike = Union[torch.Tensor, np.ndarray, float, Sequence[Any]]


def validation_enabled(validate_args):
    return Distribution._validate_args if validate_args is None else bool(validate_args)


def _as_float_tensor(x, dtype=None):
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=dtype or torch.get_default_dtype())
    if not x.is_floating_point():
        x = x.to(dtype or torch.get_default_dtype())
    return x


def _in_transform():
    """Whether this runs inside a torch.func transform, where a Python number cannot be read from a
    batched tensor (``vmap``): the checks then decide by torch's vmap-friendly ``_is_all_true``."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _explain(cls_name, name, x, constraint, low_open=None):
    """Raises the ValueError that says why ``x`` fails ``constraint`` (validation decided it does)."""
    if _in_transform():
        fail(cls_name, f"{name} must satisfy {constraint} (inside a torch.func transform: the values are not shown)")
    if torch.isnan(x).any():
        fail(cls_name, f"{name} contains NaN")
    if torch.isinf(x).any():
        fail(cls_name, f"{name} must be finite, found {x[torch.isinf(x)].flatten()[0].item()}")
    if low_open is not None and (x <= low_open).any():
        fail(cls_name, f"{name} must be > {low_open}, found {x.min().item():g}")
    fail(cls_name, f"{name} must satisfy {constraint}")


def _checked_real(cls_name, name, x):
    """``x`` if it is a real number, a real tensor or array-like of real numbers; else a ValueError
    naming it (None, a string or a complex number failed in torch's conversion, unnamed)."""
    if isinstance(x, numbers.Real) or (isinstance(x, torch.Tensor) and not x.is_complex()):
        return x
    try:
        kind = np.asarray(x).dtype.kind
    except Exception:  # noqa: BLE001 -- e.g. a list of tensors that require grad: torch's conversion decides
        try:
            kind = "c" if torch.as_tensor(x).is_complex() else "f"
        except Exception:  # noqa: BLE001
            kind = "O"
    if kind not in "biuf":
        fail(cls_name, f"{name} must be a real number or a floating-point tensor, got {x!r}")
    return x


def _check_not_bool(cls_name, name, x):
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        fail(cls_name, f"{name} must be a number or a floating-point tensor, got the boolean {x!r}")


def _check_temperature(cls_name, temperature):
    if not torch._is_all_true(positive_finite.check(temperature)):
        _explain(cls_name, "temperature", temperature, positive_finite, low_open=0.0)


def _check_logits(cls_name, logits, temperature, categorical):
    """Logits that satisfy ``resolvable_real(_vector)`` (one reduction: its largest |logit| against its
    bound), and |logits| / temperature within ``logits_bounds``' second bound."""
    constraint = resolvable_real_vector if categorical else resolvable_real
    if _in_transform():
        _check_logits_in_transform(cls_name, logits, temperature, categorical, constraint)
        return
    largest = constraint.largest(logits)  # NaN if any is NaN
    if isinstance(temperature, float):
        coldest = temperature
    else:
        coldest = temperature.detach().amin().item() if temperature.numel() else 1.0
    info = torch.finfo(logits.dtype)
    magnitude, ratio = logits_bounds(info.eps, info.max)
    least = coldest_temperature(info.tiny, info.max)
    if largest <= constraint.bound(logits.dtype) and largest <= ratio * coldest and coldest >= least:  # one reduction
        return
    if not math.isfinite(largest):
        _explain(cls_name, "logits", logits, constraint)
    dtype = str(logits.dtype).replace("torch.", "")
    if largest <= constraint.bound(logits.dtype) and largest <= ratio * coldest:  # the logits are fine: the temperature is not
        fail(cls_name, cold_temperature_message(coldest, least, ratio, dtype))
    fail(cls_name, bound_message(largest, coldest, magnitude, ratio, dtype))


def _check_logits_in_transform(cls_name, logits, temperature, categorical, constraint):
    """:func:`_check_logits` by tensor comparisons (batched parameters under ``vmap``)."""
    info = torch.finfo(logits.dtype)
    _, ratio = logits_bounds(info.eps, info.max)
    least = coldest_temperature(info.tiny, info.max)
    size = logits.detach().abs()
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.detach().unsqueeze(-1) if categorical and temperature.dim() else temperature.detach()
    if torch._is_all_true((size <= constraint.bound(logits.dtype)) & (size <= ratio * temperature) & (temperature >= least)):  # False for NaN
        return
    dtype = str(logits.dtype).replace("torch.", "")
    fail(
        cls_name,
        f"logits must be finite, with |logits| <= {constraint.bound(logits.dtype):g} and |logits| / temperature <= "
        f"{ratio:.3g} in {dtype}, and temperature >= {least:.3g} (inside a torch.func transform: the values are not shown)",
    )


def _check_probs(cls_name, probs, categorical):
    constraint = positive_simplex if categorical else open_unit_interval
    if torch._is_all_true(constraint.check(probs)):
        return
    if _in_transform():
        fail(cls_name, f"probs must satisfy {constraint} (inside a torch.func transform: the values are not shown)")
    if torch.isnan(probs).any():
        fail(cls_name, "probs contains NaN")
    if (probs < 0).any() or (probs > 1).any():
        fail(cls_name, f"probs must lie in [0, 1], found values in [{probs.min().item():g}, {probs.max().item():g}]")
    if categorical:
        error = (probs.sum(-1) - 1).abs().max().item()
        if error > simplex_tolerance(probs):
            fail(cls_name, f"probs must sum to 1 along the last axis, found a sum off by {error:g}")
    # a categorical probability of 1.0 beside positive ones is a rounded float vector, finite logits
    fail(cls_name, boundary_probs_message(categorical))


@quiet_under_trace
def promote_params(cls_name, temperature, logits, probs, event_dim, validate):
    """Returns (temperature, logits, probs or None, batch_shape): logits and probs broadcast to the
    batch shape, temperature only broadcastable to it, and a Python float where a number was given
    (checked here; see :func:`_kernel_number`).

    ``event_dim`` is 1 for the n-ary family (the last axis of logits holds the categories) and 0
    for the binary family. ``temperature`` is a batch parameter: its shape broadcasts with
    ``logits.shape[:-event_dim]`` and becomes part of the batch shape.
    """
    if (logits is None) == (probs is None):
        fail(cls_name, f"pass exactly one of `logits` or `probs`, got {'neither' if logits is None else 'both'}")
    temperature = _checked_real(cls_name, "temperature", temperature)
    _check_not_bool(cls_name, "temperature", temperature)
    categorical = event_dim == 1
    if probs is not None:
        probs = _as_float_tensor(probs)
        if validate:
            _check_probs(cls_name, probs, categorical)
        logits = torch.log(probs) if categorical else torch.log(probs) - torch.log1p(-probs)
    else:
        logits = _as_float_tensor(logits)

    if categorical:
        if logits.dim() < 1:
            fail(cls_name, "logits must have a last axis of categories, got a scalar")
        if logits.shape[-1] < 2:
            fail(cls_name, f"needs at least 2 categories, got logits with last axis of size {logits.shape[-1]}")

    if isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        if not (math.isfinite(temperature) and temperature > 0):
            fail(cls_name, f"temperature must be positive and finite, got {temperature}")
        rounded = _rounded(temperature, logits.dtype)
        if not (math.isfinite(rounded) and rounded > 0):
            fail(cls_name, rounded_temperature_message(temperature, rounded, str(logits.dtype).replace("torch.", "")))
        temperature = _kernel_number(rounded, temperature, logits)
    else:
        temperature = _as_float_tensor(temperature, logits.dtype)
        if validate:
            _check_temperature(cls_name, temperature)
        dtype = torch.promote_types(temperature.dtype, logits.dtype)
        temperature, logits = temperature.to(dtype), logits.to(dtype)
        probs = None if probs is None else probs.to(dtype)

    if validate:
        _check_logits(cls_name, logits, temperature, categorical)

    param_batch_shape = logits.shape[:-1] if categorical else logits.shape
    try:  # torch.broadcast_shapes costs more than the rest of a small distribution's construction
        batch_shape = param_batch_shape if isinstance(temperature, float) or temperature.dim() == 0 else torch.broadcast_shapes(temperature.shape, param_batch_shape)
    except RuntimeError:
        fail(
            cls_name,
            f"temperature of shape {tuple(temperature.shape)} does not broadcast with the batch shape "
            f"{tuple(param_batch_shape)} of the logits; temperature is a batch parameter "
            "(one per distribution, never one per category)",
        )
    if batch_shape != param_batch_shape:  # else already of the full shape: no view, no autograd node
        event_shape = logits.shape[-1:] if categorical else torch.Size()
        logits = logits.expand(batch_shape + event_shape)
        probs = None if probs is None else probs.expand(batch_shape + event_shape)
    return temperature, logits, probs, batch_shape


# the float dtypes whose rounding NumPy does exactly as torch (bfloat16 has no NumPy type)
_ROUNDING = {torch.float32: np.float32, torch.float64: np.float64}


def _rounded(number, dtype):
    """``number`` as ``dtype`` rounds it, read in Python (no tensor: under torch.compile a tensor's
    value would be a data-dependent guard, on a GPU a wait): exact for float32 and float64; for the
    half dtypes, 0 below half the smallest subnormal and inf beyond the largest value, else itself."""
    info = torch.finfo(dtype)
    if float(number) > info.max:
        return math.inf
    if dtype in _ROUNDING:
        return float(_ROUNDING[dtype](number))
    return 0.0 if float(number) <= info.tiny * info.eps / 2 else float(number)


def _kernel_number(rounded, temperature, logits):
    """A number as the kernels read it: rounded to the logits' dtype (``rounded``, :func:`_rounded`),
    as a Python float -- torch's scalar arguments, so that no kernel makes a temperature tensor (on a
    GPU, ``torch.tensor`` of a number is a copy from the host that waits for the device) or takes its
    log -- or, in float16 and bfloat16 (which NumPy does not round as torch does), a 0-dim tensor
    made by a fill of ``temperature``."""
    if logits.dtype in _ROUNDING:
        return rounded
    return torch.full((), temperature, dtype=logits.dtype, device=logits.device)
