"""The checks of Hard Concrete's stretch ends (``low`` < 0, ``high`` > 1) that read plain numbers:
Python numbers and NumPy arrays, each also checked after rounding to the distribution's dtype."""

import math

import numpy as np

BOUNDS = {"low": "< 0", "high": "> 1"}  # what each end of the stretch must be (and stay in the dtype)


def fail(cls_name, name, given, converted=None, dtype=None):
    """The ValueError for an end outside its bound: the given value, and its rounding where that differs."""
    text = repr(given) if isinstance(given, int) else repr(float(given))
    if converted is not None and not (math.isnan(given) and math.isnan(converted)) and converted != given:
        text += f" ({float(converted)!r} in {dtype})"  # finite or of the right sign only before the conversion
    raise ValueError(f"{cls_name}: {name} must be a finite number {BOUNDS[name]}, got {text}")


def in_bounds(name, x):
    return (x < 0) if name == "low" else (x > 1)


def check_end(cls_name, name, given, converted, dtype):
    """Raises unless every entry of ``converted`` (``given`` in the distribution's dtype, both
    NumPy arrays) is finite and on the right side of 0 (low) or 1 (high)."""
    ok = in_bounds(name, converted) & np.isfinite(converted)
    if not bool(ok.all()):
        first = int(np.argmin(ok.ravel()))
        fail(cls_name, name, given.flatten()[first].item(), converted.flatten()[first].item(), dtype)


def check_number(cls_name, name, x, numpy_type, dtype_name):
    """A Python (or NumPy scalar) number x as a float, after checking it and its rounding to the dtype."""
    try:
        value = float(x)
    except OverflowError:  # an int beyond any float
        fail(cls_name, name, x)
    if numpy_type is np.float64:
        converted = value
    else:
        with np.errstate(over="ignore"):
            converted = float(numpy_type(value))
    if not (math.isfinite(converted) and in_bounds(name, converted)):
        fail(cls_name, name, value, converted, dtype_name)
    return value


def broadcast_shapes(a, b):
    """NumPy's broadcasting rule for two shapes (a ValueError if they do not broadcast), without
    the per-call overhead of the library versions on this path, which every construction takes."""
    a, b = tuple(a), tuple(b)
    if len(a) < len(b):
        a, b = b, a
    b = (1,) * (len(a) - len(b)) + b
    if any(m != n and m != 1 and n != 1 for m, n in zip(a, b)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(n if m == 1 else m for m, n in zip(a, b))
