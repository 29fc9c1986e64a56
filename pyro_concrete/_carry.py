"""Carry the exact log-space coordinates of a sample alongside the sample.

A Concrete sample ``x = exp(y)`` underflows to exact zeros at low temperature, and a BinConcrete
sample ``x = sigmoid(y)`` to exact 0 or 1; ``y`` itself is finite. ``Concrete.log_prob(x)`` needs
``y``, and it is asked for it by other objects than the one that drew ``x`` (in SVI the model's
prior scores the guide's sample after ``pyro.sample``, ``poutine.trace`` and ``replay``).

An attribute on the tensor (Pyro's ``_unquantize``) is lost by every view, including the
``value.expand(shape)`` by which ``Delta`` hands an autoguide's value to the model. Here ``y`` is
kept in a registry keyed by the *memory* of ``x`` (data pointer, shape, strides, dtype, device),
so any tensor that is ``x`` or a same-shape view of it (``expand``, ``detach``, ``view_as``) finds
it. An entry is dropped when ``x`` is freed and ignored once ``x`` or ``y`` was modified in place
(their version counters). A value with no entry (a copy, arithmetic on ``x``, user data) is
scored from ``log x``, which is exact wherever ``x`` did not underflow.
"""

import weakref

import torch

_entries = {}


def _key(value):
    # int(): under torch.jit.trace (Pyro's JitTrace_ELBO) sizes are traced tensors hashed by identity
    return (value.data_ptr(), tuple(int(size) for size in value.shape), value.stride(), value.dtype, value.device)


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
    try:
        key = _key(value)
    except (RuntimeError, NotImplementedError):  # tensors without storage (functorch, fake, meta)
        return value
    ref = weakref.ref(value, lambda ref, key=key: _drop(key, ref))
    coordinates_version = None if coordinates is None else coordinates._version
    _entries[key] = (ref, value._version, coordinates, coordinates_version, kind)
    return value


def recall(value, kind):
    """The coordinates attached to ``value`` (or to the tensor it views), or None."""
    try:
        entry = _entries.get(_key(value))
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    if entry is None:
        return None
    ref, version, coordinates, coordinates_version, entry_kind = entry
    if entry_kind != kind or ref() is None or value._version != version:
        return None
    if coordinates is None:
        return value
    if coordinates._version != coordinates_version:
        return None
    if not value.requires_grad:
        return coordinates.detach()
    if value.is_leaf:  # the caller differentiates with respect to this value itself
        return None
    return coordinates


def recall_copy(value, kind):
    """The coordinates of the one live sample of the given ``kind`` that ``value`` is a copy of
    (same shape, dtype, device and content; ``clone()``, ``x * 1.0``, ``.contiguous()``), or None
    when no live sample or more than one has that content (discrete values collide: the copy is
    then ambiguous). Used by the straight-through distributions, whose discrete values alone do not
    determine the relaxed sample behind them; only consulted when ``recall`` finds nothing."""
    if not isinstance(value, torch.Tensor):
        return None
    found = []
    for key, (ref, version, coordinates, coordinates_version, entry_kind) in list(_entries.items()):
        sample = ref()
        if (
            entry_kind != kind
            or sample is None
            or sample._version != version
            or coordinates._version != coordinates_version
            or key[1] != tuple(value.shape)
            or key[3] != value.dtype
            or key[4] != value.device
        ):
            continue
        if bool((sample.detach() == value.detach()).all()):
            found.append(coordinates)
    if len(found) != 1:
        return None
    return found[0] if value.requires_grad else found[0].detach()
