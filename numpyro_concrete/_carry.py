"""Carry the exact log-space coordinates of a sample alongside the sample.

A Concrete sample ``x = exp(y)`` underflows to exact zeros at low temperature, and a BinConcrete
sample ``x = sigmoid(y)`` to exact 0 or 1; ``y`` itself is finite. ``Concrete.log_prob(x)`` needs
``y``, and it is asked for it by other objects than the one that drew ``x``: in SVI the model's
prior scores the guide's sample. NumPyro's ``intermediates`` reach only the guide's own site --
``replay`` copies ``msg["value"]`` into the model, not the intermediates -- but the value the model
receives is the very same Python object (a concrete array eagerly, a tracer inside ``jit``,
``grad`` and ``vmap``).

So ``y`` is kept in a registry keyed by the identity of ``x``, checked through a weak reference
(JAX arrays and tracers are immutable, so identity is enough). An entry is dropped when ``x`` is
freed; a tracer never outlives its trace. A value with no entry (any new array computed from
``x``, user data) is scored from ``log x``, which is exact wherever ``x`` did not underflow.
"""

import weakref

import jax.numpy as jnp
from numpyro.util import not_jax_tracer

_entries = {}


def _drop(key, ref):
    entry = _entries.get(key)
    if entry is not None and entry[0] is ref:
        del _entries[key]


def attach(value, coordinates, kind):
    """Record that ``value`` has the log-space ``coordinates`` of the given ``kind``
    (``"log"``: value = exp(coordinates); ``"logit"``: value = sigmoid(coordinates);
    ``"log_simplex"``, ``"real"``: ``value`` is an ExpConcrete (LogitBinConcrete) sample, its own
    coordinates, all finite, and ``coordinates`` is None; ``log_prob`` then skips the boundary check
    and the validation of the value). Returns value."""
    key = id(value)
    try:
        ref = weakref.ref(value, lambda ref, key=key: _drop(key, ref))
    except TypeError:  # not weak-referenceable (e.g. a NumPy array): nothing to carry
        return value
    _entries[key] = (ref, coordinates, kind)
    return value


def recall(value, kind):
    """The coordinates attached to ``value``, or None."""
    entry = _entries.get(id(value))
    if entry is None:
        return None
    ref, coordinates, entry_kind = entry
    if entry_kind != kind or ref() is not value:
        return None
    return value if coordinates is None else coordinates


def recall_copy(value, kind):
    """The coordinates of the one live sample of the given ``kind`` that ``value`` is a copy of
    (same shape, dtype and content; ``x * 1.0``, ``jnp.array(x)``), or None when no live sample or
    more than one has that content (discrete values collide: the copy is then ambiguous). Used by
    the straight-through distributions, whose discrete values alone do not determine the relaxed
    sample behind them; only consulted when ``recall`` finds nothing, and only for concrete arrays
    (a tracer's content is unknown while tracing)."""
    if not not_jax_tracer(value):
        return None
    found = []
    for ref, coordinates, entry_kind in list(_entries.values()):
        sample = ref()
        if entry_kind != kind or sample is None or not not_jax_tracer(sample):
            continue
        if jnp.shape(sample) == jnp.shape(value) and sample.dtype == jnp.result_type(value):
            if bool(jnp.all(sample == value)):
                found.append(coordinates)
    return found[0] if len(found) == 1 else None
