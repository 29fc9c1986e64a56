"""The exact log-space coordinates of a sample, carried alongside the sample inside a traced
computation: :class:`Carry`.

A Concrete sample ``x = exp(y)`` underflows to exact zeros at low temperature, and a BinConcrete
sample ``x = sigmoid(y)`` to exact 0 or 1; ``y`` itself is finite. ``Concrete.log_prob(x)`` needs
``y``, and it is asked for it by other objects than the one that drew ``x``: in SVI the model's
prior scores the guide's sample.

Two routes carry ``y``, and they never disagree (both hold the sampler's own ``y`` for that very
value); where both are present, NumPyro's ``intermediates`` are read:

- **NumPyro's ``intermediates``** (``x, [y] = d.sample_with_intermediates(key)``;
  ``d.log_prob(x, intermediates)``), the host's own route: NumPyro passes a site's intermediates to
  the ``log_prob`` of the site that drew it, eagerly and traced alike. It is authoritative for that
  site, but it reaches only that site: ``replay`` copies ``msg["value"]`` into the model, not the
  intermediates. So a traced value scored with its intermediates is entered in the registry too:
  inside ``numpyro.contrib.control_flow.scan`` the sites' values are stacked outside the body,
  where no sampler's tracer is, and the guide's site, scored first, carries the coordinates to the
  model's prior that scores the same stacked value.
- **This registry**, for every other scorer (the model's prior scoring the guide's value, a second
  distribution, a transform): inside the traced computation that runs the guide and the model
  (``jit``, ``grad``, ``vmap``: every SVI step, ``svi.run``, ``Predictive``) the value the model
  receives is the very same tracer object, so identity finds it.
"""

import weakref

from numpyro.util import not_jax_tracer

__all__ = ["Carry", "carry"]


class Carry:
    """Traced samples of the family and their log-space coordinates.

    - **Keyed** by the identity of a tracer, checked through a weak reference (JAX values are
      immutable, so identity is enough); a tracer never outlives its trace, and the entry goes with
      it (or with :meth:`clear`).
    - **Only tracers are carried.** A concrete array (drawn eagerly, or returned out of a ``jit``) is
      scored from its values wherever it is scored -- eagerly or passed into ``jit``, where it becomes
      a new tracer that nothing can link back to it -- so one array has one log density. Eagerly, the
      exact route is the intermediates (module docstring).
    - **Otherwise** (no entry: any new array computed from ``x``, user data) the value is scored from
      ``log x``, exact wherever ``x`` did not underflow -- or, for the straight-through distributions,
      whose discrete values alone do not determine the relaxed sample behind them, refused with a
      ValueError.
    """

    def __init__(self):
        self._entries = {}

    def __len__(self):
        return len(self._entries)

    def clear(self):
        """Forget every carried sample (they are scored from their values afterwards)."""
        self._entries.clear()

    def attach(self, value, coordinates, kind):
        """Record that ``value`` has the log-space ``coordinates`` of the given ``kind`` (a
        ``concrete_common.kinds.Kind``; ``LOG``: value = exp(coordinates); ``LOGIT``: value =
        sigmoid(coordinates); ``STRAIGHT_THROUGH_LOG`` / ``_LOGIT``: a straight-through value whose
        relaxed sample is exp / sigmoid of the coordinates; ``LOG_SIMPLEX``, ``REAL``: ``value`` is an
        ExpConcrete (LogitBinConcrete) sample, its own coordinates, all finite, and ``coordinates`` is
        None). Concrete arrays are not recorded. Returns value."""
        if not_jax_tracer(value):
            return value
        key, entries = id(value), self._entries
        try:
            ref = weakref.ref(value, lambda ref, key=key: _drop(entries, key, ref))
        except TypeError:  # not weak-referenceable: nothing to carry
            return value
        entries[key] = (ref, coordinates, kind)
        return value

    def recall(self, value, kinds):
        """The coordinates attached to ``value`` by a sampler of one of the ``kinds``, or None. An
        ExpConcrete / LogitBinConcrete sample is its own coordinates: the value is returned."""
        entry = self._entries.get(id(value))
        if entry is None:
            return None
        ref, coordinates, kind = entry
        if kind not in kinds or ref() is not value:
            return None
        return value if coordinates is None else coordinates


carry = Carry()  # the registry of this process, which every distribution of the package uses


def _drop(entries, key, ref):
    entry = entries.get(key)
    if entry is not None and entry[0] is ref:
        del entries[key]
