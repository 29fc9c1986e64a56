"""Test-time modes and model transforms, as NumPyro effect handlers.

The paper's protocol (section 3.3): train with every discrete node replaced by a Concrete node,
then evaluate the original discrete graph at test time::

    svi = SVI(model, guide, optim, Trace_ELBO())                  # relaxed training
    TraceEnum_ELBO().loss(key, params, discrete(model, mode="enumerate"), guide_without_those_sites)
    trace = handlers.trace(handlers.seed(discrete(model, mode="argmax"), 0)).get_trace(data)

and the reverse, for a model written with discrete distributions::

    relaxed_model = relax(model, temperature=2 / 3)
"""

import importlib
import numbers
from typing import Any, Callable, Iterable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions.util import validate_sample
from numpyro.primitives import _PYRO_STACK, Messenger, plate

from concrete_common import evaluating, messages
from concrete_common.kinds import Mode, check_mode
from concrete_common.named_sites import NamedSites, NamingSites

from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .hard_concrete import HardConcrete
from .limits import OneHotCategorical

# the model's own one-hot categorical sites (NumPyro has none of its own), enumerated as an index
ONE_HOT = (OneHotCategorical,)

__all__ = ["discrete", "relax", "DiscreteMessenger", "RelaxMessenger"]

CONCRETE_FAMILY = (Concrete, ExpConcrete, BinConcrete, LogitBinConcrete, HardConcrete)  # and subclasses
# the infer key of a value discrete(mode="argmax") set: the mode, not a value held by the user
ARGMAX_VALUE = "concrete_argmax"


# ----------------------------------------------------------------------------- wrappers


def unwrap(fn):
    """(base distribution, wrappers): peel Independent, MaskedDistribution and
    ExpandedDistribution off ``fn``; :func:`rewrap` puts the same wrappers around another base."""
    wrappers = []
    while True:
        if isinstance(fn, dist.Independent):
            wrappers.append(("to_event", fn.reinterpreted_batch_ndims))
        elif isinstance(fn, dist.MaskedDistribution):
            wrappers.append(("mask", fn._mask))
        elif isinstance(fn, dist.ExpandedDistribution):
            wrappers.append(("expand", fn.batch_shape))
        else:
            return fn, wrappers
        fn = fn.base_dist


def rewrap(fn, wrappers):
    for method, argument in reversed(wrappers):
        fn = getattr(fn, method)(argument)
    return fn


def _transformed_family(fn):
    """The class name of the Concrete-family distribution under a host TransformedDistribution
    ``fn`` (through wrappers and nested transforms), or None."""
    while isinstance(fn, dist.TransformedDistribution):
        fn = unwrap(fn.base_dist)[0]
        if isinstance(fn, CONCRETE_FAMILY):
            return type(fn).__name__
    return None


def _selected(msg, sites):
    return msg["type"] == "sample" and not msg["is_observed"] and (sites is None or msg["name"] in sites)


def _site_set(sites, handler):
    if sites is None:
        return None
    if isinstance(sites, str):
        return frozenset([sites])
    try:
        return frozenset(sites)
    except TypeError:
        raise ValueError(f"{handler}: sites must be None, a site name or a collection of names, got {sites!r}") from None


def _inference_handler_types():
    types = [handlers.trace]
    try:  # funsor is optional: NumPyro's enumeration needs it
        from numpyro.contrib.funsor import enum

        types.append(enum)
    except ImportError:
        pass
    return tuple(types)


def _scan_body_handler_types():
    """The handler NumPyro's enumerated ``scan`` runs its body under (a private class: none where a
    version lacks it)."""
    scan_module = importlib.import_module("numpyro.contrib.control_flow.scan")  # the package's `scan` is the function
    found = getattr(scan_module, "_promote_fn_shapes", None)
    return (found,) if isinstance(found, type) else ()


# ----------------------------------------------------------------------------- discrete


def gather_last(table, index):
    """``table[..., index]``: the entries of ``table``'s last axis at ``index``, broadcast against
    ``table``'s other axes (shape: ``broadcast(index.shape, table.shape[:-1])``) by one gather,
    without broadcasting ``table`` to that shape first. An enumerated index of shape (K, 1, ..., 1)
    scored against a table of batch shape (N,) and K columns is then (K, N), not (K, N, K) -- what
    the host's ``Categorical.log_prob`` materialises when its parameters carry the plates' shape
    (a Concrete-family site expands its parameters, not an ``ExpandedDistribution``)."""
    index = jnp.asarray(index)
    ndim = max(index.ndim, jnp.ndim(table) - 1)
    table = jnp.reshape(table, (1,) * (ndim + 1 - jnp.ndim(table)) + jnp.shape(table))
    index = jnp.reshape(index, (1,) * (ndim - index.ndim) + index.shape)
    return jnp.take_along_axis(table, index[..., None], axis=-1)[..., 0]


class _IndexCategoricalLogits(dist.CategoricalLogits):
    """The host's ``CategoricalLogits``, its ``log_prob`` by :func:`gather_last` (memory of the
    enumerated values times the batch, not times the categories too)."""

    @validate_sample
    def log_prob(self, value):
        return gather_last(self.logits - logsumexp(self.logits, axis=-1, keepdims=True), value)


class _IndexCategoricalProbs(dist.CategoricalProbs):
    """The host's ``CategoricalProbs``, its ``log_prob`` by :func:`gather_last`."""

    @validate_sample
    def log_prob(self, value):
        return gather_last(self.logits, value)


class _ExactBernoulliProbs(dist.BernoulliProbs):
    """The host's ``BernoulliProbs`` (its support, enumeration and pytree), its ``log_prob`` by the
    probability's own logarithms: exact at 0 and 1 and below tiny, where the host's clamps it to
    [tiny, 1 - eps] (an outcome of probability 0 scored at log tiny, not -inf). For the sites the
    exact helpers cannot enumerate as an index: observed ones, and those of ``scan``."""

    @validate_sample
    def log_prob(self, value):
        probs = jnp.asarray(self.probs)
        # log of 0 is -inf, with a gradient of 0 there (not NaN): the safe logarithm of _to_logits_multinom
        log_probs = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
        log_1m_probs = jnp.where(probs < 1, jnp.log1p(-jnp.where(probs < 1, probs, 0.0)), -jnp.inf)
        value = jnp.asarray(value, jnp.result_type(float))  # a soft label (a grey pixel) weighs both, as the host's
        return jnp.where(value == 0, 0.0, value * log_probs) + jnp.where(value == 1, 0.0, (1 - value) * log_1m_probs)


def _index_distribution(base):
    """An integer-valued distribution to enumerate in place of ``base``'s zero-temperature limit,
    and the map from its values to the limit's values (the relaxed sample space).

    NumPyro's funsor enumeration only uses the support's size and enumerates ``arange(size)``: the
    site is enumerated as an index, which the post-sample hook turns into the value the model uses.
    """
    dtype = base.logits.dtype
    if isinstance(base, ONE_HOT):  # a one-hot site of the model's own: NumPyro enumerates it as an index
        # by the parameter it was given: probs with a 0 are logits of -inf, which CategoricalLogits refuses
        index = _IndexCategoricalProbs(base.probs) if "probs" in vars(base) else _IndexCategoricalLogits(base.logits)
        return index, lambda index: jax.nn.one_hot(index, base.event_shape[0], dtype=dtype)
    if _given_probs(base):  # the model's own Bernoulli, in an exact helper: its probability, exact at 0 and 1
        # (a CategoricalProbs, whose logarithm of 0 is -inf with a gradient of 0; the gradient with
        # respect to a probability of exactly 0 or 1 is not the derivative there, which the
        # log-space sum cannot give)
        probs = jnp.asarray(base.probs, dtype)
        return _IndexCategoricalProbs(jnp.stack([1 - probs, probs], -1)), lambda index: index
    if isinstance(base, (Concrete, ExpConcrete)):
        num_categories = base.event_shape[0]

        def one_hot(index):
            return jax.nn.one_hot(index, num_categories, dtype=dtype)

        to_value = one_hot if isinstance(base, Concrete) else (lambda index: jnp.log(one_hot(index)))
        return _IndexCategoricalLogits(base.logits), to_value
    if isinstance(base, (BinConcrete, HardConcrete)):
        return dist.BernoulliLogits(base.discrete().logits), lambda index: jnp.asarray(index, dtype)
    return dist.BernoulliLogits(base.logits), lambda index: jnp.where(index > 0, jnp.inf, -jnp.inf).astype(dtype)


def _given_probs(base):
    """A host ``Bernoulli`` given a probability, while an exact helper runs: enumerated by its
    probabilities' own logarithms, exact at 0 and 1 (a padded element masked out) and below tiny,
    where NumPyro's log density is of probabilities clamped to [tiny, 1 - eps]. Every such site, not
    only those read as clamped: inside the helpers' compiled functions the probability cannot be
    read, and the eager check and the compiled sum must see the same site. (On a training step,
    discrete(...) leaves it to the host; a ``CategoricalProbs`` is exact already.)"""
    return type(base) in (dist.BernoulliProbs, _ExactBernoulliProbs) and evaluating.helper_running()


def _exact_in_helper(msg):
    """In a helper, every host ``BernoulliProbs`` is scored by its probability's own logarithms
    (:class:`_ExactBernoulliProbs`), where the host clamps it: observed ones, those of ``scan``
    (which keep the host's classes: under ``jit`` a clamped probability cannot be read to refuse it,
    and a sticky chain's probability of 0 was scored at log tiny, a wrong finite log p(x)), and those
    drawn or held rather than enumerated; the ones enumerated as an index are by :func:`_given_probs`."""
    if not evaluating.helper_running():
        return
    base, wrappers = unwrap(msg["fn"])
    if type(base) is dist.BernoulliProbs:
        msg["fn"] = rewrap(_ExactBernoulliProbs(base.probs, validate_args=base._validate_args), wrappers)


def _batch_dims(msg):
    """The site's batch dimensions: its distribution's, and those of every plate around it, the
    plates outside discrete(...) too (an index replayed under an outer plate carries its dimension:
    with that plate K wide, counted by the distribution's alone, the index passed for a one-hot)."""
    dims = [-frame.dim for frame in msg["cond_indep_stack"] if frame.dim is not None]
    # the plates outside this handler process the site after it: read from the stack
    dims += [-handler.dim for handler in _PYRO_STACK if isinstance(handler, plate) and handler.dim is not None]
    return max([len(msg["fn"].batch_shape), *dims])


def _is_index(msg, base, value):
    """Whether ``value``, set from outside, is an index of the site's enumerated distribution (an
    integer for a categorical site, 0 or 1 for a binary one: what the host's infer_discrete
    substitutes) rather than a value of the site's own sample space (one-hot, log one-hot, +-inf; a
    binary site's 0/1 is both, alike)."""
    if value is None:
        return False
    if isinstance(base, (*ONE_HOT, Concrete, ExpConcrete)):
        # an integer one-hot (batch shape, then the categories) is a value, not an index
        one_hot = jnp.ndim(value) > _batch_dims(msg) and jnp.shape(value)[-1] == base.event_shape[-1]
        return not jnp.issubdtype(jnp.result_type(value), jnp.floating) and not one_hot
    if isinstance(value, jax.core.Tracer):
        return True  # a traced value cannot be read: the host's index, as it substitutes one
    return _read(lambda: jnp.all((jnp.asarray(value) == 0) | (jnp.asarray(value) == 1)), True)


def clamped_probability(base, relaxed=False):
    """Whether ``base``, one of the host's Bernoulli / Categorical built from probabilities, has one
    that the host does not use as given (:func:`concrete_common.messages.clamped_probability`): a
    ``BernoulliProbs`` clamps its probabilities to [tiny, 1 - eps] in its log density and its logits
    (a probability of 1 scored the other outcome at log eps, not -inf). A ``CategoricalProbs`` is exact
    (log 0 = -inf), but no Concrete distribution has a probability of 0: ``relaxed`` (for ``relax``)
    refuses its zeros too. One built from logits is exact at any value of them. Inside ``jit`` the
    values cannot be read: False."""
    if type(base) not in (dist.BernoulliProbs, dist.CategoricalProbs) or isinstance(base.probs, jax.core.Tracer):
        return False
    probs = base.probs
    if type(base) is dist.CategoricalProbs:
        return relaxed and _read(lambda: jnp.any(probs == 0), False)
    finfo = jnp.finfo(jnp.result_type(probs, float))
    return _read(lambda: jnp.any((probs < finfo.tiny) | (probs > 1 - finfo.eps)), False)


def _read(check, traced):
    """The boolean ``check()`` computes from values known when the model runs (constants, eager
    arrays), also inside ``jit`` (where ``jnp`` would stage even a constant's check, and ``bool`` of
    it raised); ``traced`` where it depends on a traced value."""
    with jax.ensure_compile_time_eval():
        result = check()
    return traced if isinstance(result, jax.core.Tracer) else bool(result)


def _infinite(logits):
    """Logits of -inf (a probability of exactly 0, which a Concrete distribution cannot have), where
    they can be read (eagerly, or constants)."""
    return logits is not None and _read(lambda: jnp.any(jnp.isinf(logits)), False)


def _visible_outside(handler, msg):
    """The handlers outside ``handler`` that the site reaches, outermost first: those inside the
    innermost ``block`` that hides it."""
    outside = _PYRO_STACK[: _PYRO_STACK.index(handler)]
    for i in range(len(outside) - 1, -1, -1):
        if isinstance(outside[i], handlers.block) and outside[i].hide_fn(msg):
            return outside[i + 1 :]
    return outside


class DiscreteMessenger(NamingSites, Messenger):
    """Swaps every sample site holding a Concrete-family distribution (or only the named ``sites``)
    for its zero-temperature limit on the same sample space, keeping batch/event shapes and the
    ``Independent``/mask/``ExpandedDistribution`` wrappers; observed sites, scale, subsampling and
    plates are left alone. See :func:`discrete`.

    In enumerate mode a site is enumerated as an index; ``index_to_value`` maps each such site's
    name to the function from its index to its value in the site's own sample space (filled as the
    model runs)."""

    def __init__(
        self, fn: Optional[Callable[..., Any]] = None, mode: str = "sample", sites: Optional[Union[str, Iterable[str]]] = None
    ) -> None:
        self.mode = check_mode("discrete", mode)
        self.sites = _site_set(sites, "discrete")
        self._named = NamedSites(self.sites, "discrete")
        self.index_to_value: dict[str, Callable[[Any], Any]] = {}
        # the MAP decodings keep an enumerated site's mask: a masked-out site contributes nothing to
        # max_z log p, where its prior masses would contribute max_k p(k | parents), not 1 (biasing its
        # parents); the sums drop it, summing the site with its prior masses (a total of 1)
        self.masks_kept = False
        super().__init__(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:  # used as a decorator
            return super().__call__(*args, **kwargs)
        # while the model runs under this handler (not a whole ``with`` block, where the sites'
        # densities are computed too): see evaluating.check_no_relaxed_score
        token = evaluating.enter_discrete_run(self.sites is None)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            evaluating.exit_discrete_run(token)

    def _check_handler_order(self, name):
        # Handlers inside this one process the site before the swap and post-process it after the
        # index has become a one-hot: enumeration would skip the site and the trace would hold an
        # index distribution with a one-hot value -- a silently wrong log joint.
        inner = _PYRO_STACK[_PYRO_STACK.index(self) + 1 :]
        if any(isinstance(h, _inference_handler_types()) for h in inner):
            raise ValueError(
                f"discrete(mode='enumerate') at site {name!r} is outside the inference handlers: "
                "wrap the model, discrete(model, mode='enumerate'), and pass that to TraceEnum_ELBO / "
                "infer_discrete instead of running them inside `with discrete(...)`"
            )

    def _held_outside(self, msg, base):
        """(held, value): whether a handler outside this one gives the site a value in its own
        sample space, which it takes after the swap -- handlers.condition's, or substitute's data or
        replay's trace (posterior samples handed back to the host's log_likelihood, Predictive, ...)
        where the value is not an index of the enumerated site (:func:`_is_index`: what the host's
        infer_discrete substitutes) -- and the value substituted. Such a site is scored by its limit
        at the value, as in sample mode, not enumerated. The outermost handler's value is the one
        the site takes; a ``block`` that hides the site hides the handlers outside it (a helper
        called inside a model under the user's condition or replay: the helper's own model is not
        theirs)."""
        name = msg["name"]
        for handler in _visible_outside(self, msg):
            if isinstance(handler, handlers.condition):
                if handler.condition_fn(msg) is not None if handler.condition_fn is not None else name in handler.data:
                    return True, None
                continue
            if isinstance(handler, handlers.substitute) and handler.data is not None and name in handler.data:
                value = handler.data[name]
            elif isinstance(handler, handlers.replay) and name in handler.trace and handler.trace[name]["type"] == "sample":
                value = handler.trace[name]["value"]
            else:
                continue
            return (False, None) if _is_index(msg, base, value) else (True, value)
        return False, None

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "sample":  # filled again below if the site is enumerated in this run
            self._named.saw(msg["name"])
            self.index_to_value.pop(msg["name"], None)
            _exact_in_helper(msg)
        if not _selected(msg, self.sites):
            return
        base, wrappers = unwrap(msg["fn"])
        held, substituted = self._held_outside(msg, base) if self.mode is Mode.ENUMERATE else (False, None)
        enumerated = self.mode is Mode.ENUMERATE and not held
        # scan's sites (its enumeration draws the previous step's again as "_PREV_<name>") keep the host's
        scanned = msg.get("_control_flow_done") or msg["name"].startswith("_PREV_") or any(
            isinstance(h, _scan_body_handler_types()) for h in _PYRO_STACK[: _PYRO_STACK.index(self)]
        )
        sequential = (msg["infer"] or {}).get("enumerate") == "sequential"
        if enumerated and (isinstance(base, ONE_HOT) or (not scanned and not sequential and _given_probs(base))):
            pass  # enumerated as an index too: NumPyro's enumeration of one-hot values fails on its shapes
        elif not isinstance(base, CONCRETE_FAMILY):
            return
        if msg.get("_control_flow_done"):  # scan's stacked site: the body ran with its relaxed draws
            raise ValueError(f"discrete(mode={self.mode.value!r}): {messages.scanned_site(msg['name'], type(base).__name__)}")
        if enumerated:
            self._check_handler_order(msg["name"])
            if any(isinstance(h, _scan_body_handler_types()) for h in _PYRO_STACK[: _PYRO_STACK.index(self)]):
                # scan(discrete(body, mode="enumerate"), ...): the enumerated scan carries the index, this
                # mode turns it into a value (a carry of another dtype: a TypeError from lax.scan)
                why = "with discrete(..., mode='enumerate') around its body, whose enumerated values scan cannot carry"
                raise ValueError(f"discrete(mode='enumerate'): {messages.scanned_site(msg['name'], type(base).__name__, why)}")
            if any(method == "to_event" and n > 0 for method, n in wrappers):
                raise ValueError(
                    f"discrete(mode='enumerate'): site {msg['name']!r} is {type(base).__name__}(...).to_event(...), "
                    "whose joint support is a cartesian product; declare the independent variables with a "
                    "numpyro.plate instead of .to_event() to enumerate them"
                )
            index_dist, self.index_to_value[msg["name"]] = _index_distribution(base)
            # an enumerated site's values are summed out with their prior masses; a mask applies
            # to the rest of the model (NumPyro's TraceEnum_ELBO drops it here too)
            if not self.masks_kept:
                wrappers = [(method, argument) for method, argument in wrappers if method != "mask"]
            msg["fn"] = rewrap(index_dist, wrappers)
            msg["infer"] = {**(msg["infer"] or {}), "enumerate": "parallel"}  # never mutate the user's dict
            return
        limit = base.discrete()
        msg["fn"] = rewrap(limit, wrappers)
        if substituted is not None and not _read(lambda: jnp.all(limit.support(substituted)), True):
            raise messages.value_off_discrete_support(msg["name"])
        if self.mode is Mode.ARGMAX:
            msg["value"] = jnp.broadcast_to(limit.mode, msg["fn"].shape())
            msg["infer"] = {**(msg["infer"] or {}), ARGMAX_VALUE: True}

    def postprocess_message(self, msg: dict) -> None:
        # a transformed Concrete-family site no reparametrizer split (one outside this handler sees it after)
        if _selected(msg, self.sites) and (family := _transformed_family(unwrap(msg["fn"])[0])) is not None:
            raise messages.transformed_site(self.mode.value, msg["name"], family)
        # runs after the outer trace has copied the (index distribution, index) pair
        to_value = self.index_to_value.get(msg["name"]) if msg["type"] == "sample" else None
        if to_value is not None:
            if msg["is_observed"]:  # by a handler outside this one other than handlers.condition
                raise messages.observed_after_enumeration(msg["name"])
            if isinstance(unwrap(msg["fn"])[0], (dist.CategoricalLogits, dist.CategoricalProbs)) and jnp.issubdtype(jnp.result_type(msg["value"]), jnp.floating):
                raise messages.unforeseen_value(msg["name"])  # not an index
            msg["value"] = to_value(msg["value"])


def discrete(
    fn: Optional[Callable[..., Any]] = None, *, mode: str = "sample", sites: Optional[Union[str, Iterable[str]]] = None
) -> "DiscreteMessenger":
    """Turn a model with Concrete-family sites into its discrete graph (paper section 3.3).

    Every sample site whose distribution is a Concrete, ExpConcrete, BinConcrete or
    LogitBinConcrete (possibly inside ``to_event``, ``mask`` or ``expand``) -- or only the named
    ``sites`` -- is replaced by its zero-temperature limit on the same sample space:

    - ``mode="sample"``: discrete draws, scored with the discrete masses;
    - ``mode="enumerate"``: the site is marked for parallel enumeration, so ``TraceEnum_ELBO``
      sums it out exactly and ``infer_discrete`` works (``temperature=0`` for MAP); the trace holds
      an integer index while the model receives the one-hot (or log one-hot, 0/1, ±inf) value. The
      site's values are summed out with their prior masses: a mask on it applies to the rest of the
      model only, so a data point masked out entirely contributes 0. The model's own latent
      one-hot categorical sites (``limits.OneHotCategorical``) are enumerated the same way, as an index
      (the host cannot decode enumerated one-hot values);
    - ``mode="argmax"``: the value is the mode (one-hot argmax of the logits; ``logits > 0``),
      scored with the discrete mass.

    Wrap the model, not the inference call: ``TraceEnum_ELBO().loss(key, params, discrete(model,
    mode="enumerate"), guide)``; in enumerate mode the wrong order raises a ``ValueError``.

    :param fn: a model or guide; if None, returns a handler usable as a context manager.
    :param str mode: "sample", "enumerate" or "argmax".
    :param sites: None (every Concrete-family site), a site name, or a collection of names (a run
        whose sample sites include none of the names raises a ValueError after it; a name that only
        some runs draw, such as a step beyond a minibatch's length, is no error).
    """
    return DiscreteMessenger(fn, mode=mode, sites=sites)


# ----------------------------------------------------------------------------- relax


class RelaxMessenger(NamingSites, Messenger):
    """Swaps OneHotCategorical sites for Concrete and Bernoulli sites for BinConcrete. See :func:`relax`."""

    def __init__(
        self, fn: Optional[Callable[..., Any]] = None, temperature: Any = None, sites: Optional[Union[str, Iterable[str]]] = None
    ) -> None:
        # any real number (NumPy's float32 too) or array; a bool is not a temperature
        if isinstance(temperature, bool) or not (callable(temperature) or isinstance(temperature, (dict, numbers.Real, np.ndarray, jax.Array))):
            raise ValueError(
                f"relax: temperature must be a number, a dict by site name or a callable of the site, got {temperature!r}"
            )
        self.temperature = temperature
        self.sites = _site_set(sites, "relax")
        self._named = NamedSites(self.sites, "relax")
        super().__init__(fn)

    def _temperature(self, msg):
        if isinstance(self.temperature, dict):
            if msg["name"] not in self.temperature:
                raise ValueError(f"relax: no temperature given for site {msg['name']!r}")
            return self.temperature[msg["name"]]
        if callable(self.temperature):
            return self.temperature(msg)
        return self.temperature

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "sample":
            self._named.saw(msg["name"])
        if not _selected(msg, self.sites):
            return
        base, wrappers = unwrap(msg["fn"])
        if clamped_probability(base, relaxed=True):
            raise ValueError(f"relax: {messages.clamped_probability(msg['name'], type(base).__name__)}")
        # -inf logits: what the relaxed site's own validation would refuse, named here (validation on only)
        if getattr(base, "_validate_args", False) and _infinite(base.logits if isinstance(base, (OneHotCategorical, dist.BernoulliLogits, dist.BernoulliProbs)) else None):
            raise ValueError(f"relax: {messages.infinite_logits(msg['name'], type(base).__name__)}")
        if isinstance(base, OneHotCategorical):
            relaxed = Concrete(self._temperature(msg), logits=base.logits, validate_args=base._validate_args)
        elif isinstance(base, (dist.BernoulliLogits, dist.BernoulliProbs)):
            relaxed = BinConcrete(self._temperature(msg), logits=base.logits, validate_args=base._validate_args)
        elif self.sites is not None and isinstance(base, (dist.CategoricalLogits, dist.CategoricalProbs)):  # named: it cannot be
            raise messages.relax_integer_categorical(msg["name"], type(base).__name__, "numpyro_concrete.limits.OneHotCategorical")
        else:
            return
        if msg.get("_control_flow_done"):  # scan's stacked site: the body drew discrete values
            why = "whose body keeps its own handlers, so it cannot be relaxed"
            raise ValueError(f"relax: {messages.scanned_site(msg['name'], type(base).__name__, why)}")
        msg["fn"] = rewrap(relaxed, wrappers)
        # a mark for enumeration (config_enumerate inside relax marked the discrete site) no longer
        # applies: the relaxed site is continuous (Pyro's TraceEnum_ELBO failed on such a mark with an
        # empty NotImplementedError; NumPyro's skips it). A new dict: the user's own ``infer`` is left as given.
        if (msg.get("infer") or {}).get("enumerate") is not None:
            msg["infer"] = {key: value for key, value in msg["infer"].items() if key != "enumerate"}


def relax(
    fn: Optional[Callable[..., Any]] = None, *, temperature: Any, sites: Optional[Union[str, Iterable[str]]] = None
) -> "RelaxMessenger":
    """The reverse of :func:`discrete`: OneHotCategorical sites become Concrete and Bernoulli sites
    BinConcrete, so a model written with discrete distributions can be trained relaxed and evaluated
    as written. Observed sites are left alone; a relaxed site loses any mark for enumeration
    (``config_enumerate`` inside ``relax``): it is continuous. (Pyro only: a mark with
    ``num_samples``, for ``TraceTMC_ELBO``'s Monte Carlo enumeration of its draws, stays.)

    :param fn: a model or guide; if None, returns a handler usable as a context manager.
    :param temperature: a number, a dict of numbers by site name, or a callable taking the site
        message and returning the site's temperature.
    :param sites: None (every OneHotCategorical/Bernoulli site; an integer ``Categorical`` site is left
        alone), a site name, or a collection of names (naming a ``Categorical`` site raises: no point of
        the simplex stands for an integer value; so does a run whose sample sites include none of the
        names).
    """
    return RelaxMessenger(fn, temperature=temperature, sites=sites)
