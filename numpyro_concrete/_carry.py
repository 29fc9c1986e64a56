"""Carry the exact log-space coordinates of a sample alongside the sample, inside a traced computation.

A Concrete sample ``x = exp(y)`` underflows to exact zeros at low temperature, and a BinConcrete
sample ``x = sigmoid(y)`` to exact 0 or 1; ``y`` itself is finite. ``Concrete.log_prob(x)`` needs
``y``, and it is asked for it by other objects than the one that drew ``x``: in SVI the model's
prior scores the guide's sample. NumPyro's ``intermediates`` reach only the guide's own site --
``replay`` copies ``msg["value"]`` into the model, not the intermediates -- but inside the traced
computation that runs the guide and the model (``jit``, ``grad``, ``vmap``: every SVI step, ``svi.run``,
``Predictive``) the value the model receives is the very same tracer object.

Invariants of the registry:

- **Keyed** by the identity of a tracer, checked through a weak reference (JAX values are
  immutable, so identity is enough); a tracer never outlives its trace, and the entry goes with it.
- **Only tracers are carried.** A concrete array (drawn eagerly, or returned out of a ``jit``) is
  scored from its values wherever it is scored -- eagerly or passed into ``jit``, where it becomes a
  new tracer that nothing can link back to it -- so one array has one log density. Eagerly, the
  exact route is NumPyro's own: ``x, intermediates = d.sample_with_intermediates(key)`` and
  ``d.log_prob(x, intermediates)``.
- **Otherwise** (no entry: any new array computed from ``x``, user data) the value is scored from
  ``log x``, exact wherever ``x`` did not underflow -- or, for the straight-through distributions,
  whose discrete values alone do not determine the relaxed sample behind them, refused with a
  ValueError.
"""

import weakref

from numpyro.util import not_jax_tracer

_entries = {}


def clear():
    """Forget every carried sample (they are scored from their values afterwards)."""
    _entries.clear()


def _drop(key, ref):
    entry = _entries.get(key)
    if entry is not None and entry[0] is ref:
        del _entries[key]


def attach(value, coordinates, kind):
    """Record that ``value`` has the log-space ``coordinates`` of the given ``kind``
    (a ``concrete_common.kinds.Kind``; ``LOG``: value = exp(coordinates); ``LOGIT``: value =
    sigmoid(coordinates); ``STRAIGHT_THROUGH_LOG`` / ``_LOGIT``: a straight-through value whose relaxed
    sample is exp / sigmoid of the coordinates; ``LOG_SIMPLEX``, ``REAL``: ``value`` is an
    ExpConcrete (LogitBinConcrete) sample, its own coordinates, all finite, and ``coordinates`` is
    None, so that ``log_prob`` may skip the boundary check and the validation of the value).
    Concrete arrays are not recorded (see the module docstring). Returns value."""
    if not_jax_tracer(value):
        return value
    key = id(value)
    try:
        ref = weakref.ref(value, lambda ref, key=key: _drop(key, ref))
    except TypeError:  # not weak-referenceable: nothing to carry
        return value
    _entries[key] = (ref, coordinates, kind)
    return value


def recall(value, kinds):
    """The coordinates attached to ``value`` by a sampler of one of the ``kinds``, or None."""
    entry = _entries.get(id(value))
    if entry is None:
        return None
    ref, coordinates, kind = entry
    if kind not in kinds or ref() is not value:
        return None
    return value if coordinates is None else coordinates
