"""Test-time modes and model transforms, as Pyro effect handlers.

The paper's protocol (section 3.3): train with every discrete node replaced by a Concrete node,
then evaluate the original discrete graph at test time::

    svi = SVI(model, guide, optim, Trace_ELBO())                  # relaxed training
    pyro.infer.TraceEnum_ELBO().loss(discrete(model, mode="enumerate"), guide_without_those_sites)
    trace = poutine.trace(discrete(model, mode="argmax")).get_trace(data)

and the reverse, for a model written with discrete distributions::

    relaxed_model = relax(model, temperature=2 / 3)
"""

import functools
import math
import numbers
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from pyro import distributions as dist
from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.condition_messenger import ConditionMessenger
from pyro.poutine.enum_messenger import EnumMessenger
from pyro.poutine.indep_messenger import IndepMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.replay_messenger import ReplayMessenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import site_is_subsample

from concrete_common import evaluating, messages
from concrete_common.kinds import Mode, check_mode
from concrete_common.named_sites import NamedSites, NamingSites

from ._carry import _traced
from ._log_einsum import _log  # -inf at 0 with a gradient of 0 there: torch's NaN would spread through a row's normalization
from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .hard_concrete import HardConcrete

# the model's own one-hot categorical sites (the host's and ours), enumerated as an index
ONE_HOT = (torch.distributions.OneHotCategorical,)

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
        if isinstance(fn, torch.distributions.Independent):
            wrappers.append(("to_event", fn.reinterpreted_batch_ndims))
        elif isinstance(fn, MaskedDistribution):
            wrappers.append(("mask", fn._mask))
        elif isinstance(fn, ExpandedDistribution):
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
    while isinstance(fn, torch.distributions.TransformedDistribution):
        fn = unwrap(fn.base_dist)[0]
        if isinstance(fn, CONCRETE_FAMILY):
            return type(fn).__name__
    return None


def _broadcast_deterministic(msg):
    """A deterministic site of a reparametrizer inside this handler (the host's TransformReparam:
    ``Delta(value).mask(False)``), whose value is a function of an enumerated site, holds only the
    enumeration's dimensions: the host's shape check wants the plates' too. Its log density is 0, so
    expanding it changes no number (as ``reparam.LogSpaceReparam`` does for its own)."""
    fn = msg["fn"]
    if not (isinstance(fn, MaskedDistribution) and fn._mask is False and isinstance(fn.base_dist, dist.Delta)):
        return
    frames = [f for f in msg["cond_indep_stack"] if f.vectorized and f.dim is not None]
    if not frames:
        return
    shape = [1] * -min(f.dim for f in frames)
    for f in frames:
        shape[f.dim] = f.size
    msg["fn"] = fn.expand(torch.broadcast_shapes(fn.batch_shape, torch.Size(shape)))


def _selected(msg, sites):
    return not msg["is_observed"] and (sites is None or msg["name"] in sites)


def _site_set(sites, handler):
    if sites is None:
        return None
    if isinstance(sites, str):
        return frozenset([sites])
    try:
        return frozenset(sites)
    except TypeError:
        raise ValueError(f"{handler}: sites must be None, a site name or a collection of names, got {sites!r}") from None


# ----------------------------------------------------------------------------- discrete


def _index_distribution(base):
    """An integer-valued distribution to enumerate in place of ``base``'s zero-temperature limit,
    and the map from its values to the limit's values (the relaxed sample space).

    Enumerating one-hot values breaks ``infer_discrete`` (and NumPyro's funsor enumeration): the
    site is enumerated as an index, which the post-sample hook turns into the value the model uses.
    """
    if isinstance(base, ONE_HOT):  # a one-hot site of the model's own
        # given as probabilities: their own logarithms (-inf at 0), not the host's logits, clamped to
        # log(eps) at any probability below eps (a network's softmax reaches them)
        return dist.Categorical(logits=_exact_logits(base._categorical), validate_args=base._validate_args), (
            lambda index: F.one_hot(index.long(), base.event_shape[0]).to(base.logits.dtype)
        )
    if _given_probs(base):  # the model's own Categorical / Bernoulli, in an exact helper
        return _exact_categorical(base), (lambda index: index if isinstance(base, torch.distributions.Categorical) else index.to(base.probs.dtype))
    if isinstance(base, (Concrete, ExpConcrete)):
        num_categories = base.event_shape[0]

        def one_hot(index):
            return F.one_hot(index.long(), num_categories).to(base.logits.dtype)

        to_value = one_hot if isinstance(base, Concrete) else (lambda index: torch.log(one_hot(index)))
        return dist.Categorical(logits=base.logits, validate_args=base._validate_args), to_value
    # the host's own Bernoulli (AutoDiscreteParallel reads the class: a subclass is "not supported")
    if isinstance(base, (BinConcrete, HardConcrete)):
        return dist.Bernoulli(logits=base.discrete().logits, validate_args=base._validate_args), lambda index: index.to(base.logits.dtype)
    return dist.Bernoulli(logits=base.logits, validate_args=base._validate_args), (
        lambda index: torch.full_like(index, -float("inf"), dtype=base.logits.dtype).masked_fill(index > 0, float("inf"))
    )


def _exact_logits(categorical):
    """A host ``Categorical``'s logits, its probabilities' own logarithms where torch clamped them
    (:func:`_clamped`; a distribution given logits keeps them)."""
    clamped = _clamped(categorical)
    return categorical.logits if clamped is None else torch.where(clamped, _log(categorical.probs), categorical.logits)


def _exact_categorical(base):
    """A host ``Categorical`` / ``Bernoulli`` / ``OneHotCategorical`` whose probabilities torch
    clamped (:func:`_given_probs`), as the same (a Bernoulli: a ``Categorical`` of its index 0, 1)
    scored by the probabilities' own logarithms where they were clamped, by the host's logits
    elsewhere."""
    if isinstance(base, torch.distributions.OneHotCategorical):
        return dist.OneHotCategorical(logits=_exact_logits(base._categorical), validate_args=base._validate_args)
    if isinstance(base, torch.distributions.Categorical):
        return dist.Categorical(logits=_exact_logits(base), validate_args=base._validate_args)
    clamped = _clamped(base)
    log_probs = torch.stack(
        [
            torch.where(clamped, _log(1 - base.probs), F.logsigmoid(-base.logits)),
            torch.where(clamped, _log(base.probs), F.logsigmoid(base.logits)),
        ],
        -1,
    )
    return dist.Categorical(logits=log_probs, validate_args=base._validate_args)


def _binary_or_categorical(msg):
    """Whether an observed site's value is one the exact scoring takes: not a Bernoulli's soft label
    (a grey pixel, which the host scores o log p + (1 - o) log(1 - p) and the Categorical of
    :func:`_exact_categorical` would read as an index)."""
    base = unwrap(msg["fn"])[0]
    if not isinstance(base, torch.distributions.Bernoulli) or not torch.is_tensor(msg["value"]):
        return True
    return not (_traced() or torch._C._is_tracing()) and bool(((msg["value"] == 0) | (msg["value"] == 1)).all())


def _given_probs(base):
    """A host ``Categorical`` / ``Bernoulli`` with probabilities that torch clamped to [eps, 1 - eps]
    (:func:`_clamped`), while an exact helper runs: enumerated by their own logarithms there, exact
    at 0 and 1 (a padded element masked out, a transition that cannot happen) and below eps. (On a
    training step, discrete(...) leaves them to the host.)"""
    host = (torch.distributions.Categorical, dist.Categorical, torch.distributions.Bernoulli, dist.Bernoulli)
    return type(base) in host and evaluating.helper_running() and clamped_probability(base)


def _batch_dims(msg):
    """The site's batch dimensions: its distribution's, and those of every plate around it, the
    plates outside discrete(...) too (an index replayed under an outer plate carries its dimension:
    with that plate K wide, counted by the distribution's alone, the index passed for a one-hot)."""
    dims = [-frame.dim for frame in msg["cond_indep_stack"] if frame.dim is not None]
    # the plates outside this handler process the site after it: read from the stack
    dims += [-handler.dim for handler in _PYRO_STACK if isinstance(handler, IndepMessenger) and handler.dim is not None]
    return max([len(msg["fn"].batch_shape), *dims])


def _is_index(msg, base, value):
    """Whether ``value``, set from outside, is an index of the site's enumerated distribution (an
    integer for a categorical site, 0 or 1 for a binary one: what the host's infer_discrete replays)
    rather than a value of the site's own sample space (one-hot, log one-hot, +-inf; a binary
    site's 0/1 is both, alike)."""
    if not isinstance(value, torch.Tensor):
        return False
    if isinstance(base, (ONE_HOT, Concrete, ExpConcrete)):
        # an integer one-hot (batch shape, then the categories) is a value, not an index
        one_hot = value.dim() > _batch_dims(msg) and value.shape[-1] == base.event_shape[-1]
        return not value.is_floating_point() and not one_hot
    if _traced() or torch._C._is_tracing():
        return True  # a traced value cannot be read: the host's index, as it replays one
    return bool(((value == 0) | (value == 1)).all())


def _clamped(distribution):
    """Where torch clamped the probabilities a Bernoulli / Categorical was given to [eps, 1 - eps]
    before taking logits (elementwise), or None where it has no computed probabilities. A
    probability outside [eps, 1 - eps] whose logit is torch's logit of the bound: given by logits,
    a distribution's probabilities are computed from them once read (``.sample()``, ``.mean``) and
    may round to 0 or 1, but its logits are the ones given, not the bound's (logits given exactly at
    the bound are scored alike either way)."""
    if "probs" not in distribution.__dict__:
        return None
    probs, logits = distribution.probs, distribution.logits
    eps = torch.finfo(probs.dtype).eps
    bounds = torch.tensor([eps, 1 - eps], dtype=probs.dtype, device=probs.device)
    binary = isinstance(distribution, torch.distributions.Bernoulli)
    at_bound = torch.log(bounds) - torch.log1p(-bounds) if binary else torch.log(bounds)  # torch's probs_to_logits

    def near(value):
        return (logits - value).abs() <= 1e-6 * value.abs()  # relative: log(1 - eps) is -eps

    return ((probs < eps) & near(at_bound[0])) | ((probs > 1 - eps) & near(at_bound[1]))


def clamped_probability(base, relaxed=False):
    """Whether ``base``, one of the host's Bernoulli / Categorical / OneHotCategorical built from
    probabilities, has one that torch clamps to [eps, 1 - eps] before any use (``probs_to_logits``):
    0 and 1, and any below eps = 1.2e-7 in float32, which a network's sigmoid or softmax reaches. Its
    log density and logits are then of the clamped value, not of the model (a Bernoulli of
    probability 1e-30 scored the outcome at log 1.2e-7; :func:`concrete_common.messages.clamped_probability`).
    One built from logits is exact at any value of them. (``relaxed``: for ``relax``, where NumPyro
    refuses more; here the clamped ones already include every 0.)"""
    if not isinstance(base, (torch.distributions.Bernoulli, torch.distributions.Categorical, torch.distributions.OneHotCategorical)):
        return False
    if _traced() or torch._C._is_tracing():
        return False
    with torch.no_grad():
        clamped = _clamped(getattr(base, "_categorical", base))  # OneHotCategorical holds a Categorical
        return clamped is not None and bool(clamped.any())  # given by logits: nothing read on a training step


def _infinite(logits):
    """Logits of -inf (a probability of exactly 0, which a Concrete distribution cannot have), where
    they can be read (eagerly)."""
    return logits is not None and not (_traced() or torch._C._is_tracing()) and bool(torch.isinf(logits).any())


def _visible_outside(handler, msg):
    """The handlers outside ``handler`` that the site reaches, outermost first: those inside the
    innermost ``block`` that hides it."""
    outside = _PYRO_STACK[: _PYRO_STACK.index(handler)]
    for i in range(len(outside) - 1, -1, -1):
        if isinstance(outside[i], BlockMessenger) and outside[i].hide_fn(msg):
            return outside[i + 1 :]
    return outside


class DiscreteMessenger(NamingSites, Messenger):
    """Swaps every sample site holding a Concrete-family distribution (or only the named ``sites``)
    for its zero-temperature limit on the same sample space, keeping batch/event shapes and the
    ``Independent``/mask/expand wrappers; observed sites, scale, subsampling and plates are left
    alone. See :func:`discrete`.

    In enumerate mode a site is enumerated as an index; ``index_to_value`` maps each such site's
    name to the function from its index to its value in the site's own sample space (filled as the
    model runs)."""

    def __init__(self, mode: str = "sample", sites: Optional[Union[str, Iterable[str]]] = None) -> None:
        self.mode = check_mode("discrete", mode)
        self.sites = _site_set(sites, "discrete")
        self._named = NamedSites(self.sites, "discrete")
        self.index_to_value: dict[str, Callable[[Any], Any]] = {}
        # the MAP decodings keep an enumerated site's mask: a masked-out site contributes nothing to
        # max_z log p, where its prior masses would contribute max_k p(k | parents), not 1 (biasing its
        # parents); the sums drop it, summing the site with its prior masses (a total of 1)
        self.masks_kept = False
        super().__init__()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        # while the model runs under this handler (not a whole ``with`` block, where the sites'
        # densities are computed too): see evaluating.check_no_relaxed_score
        every_site = self.sites is None

        @functools.wraps(fn)
        def run(*args, **kwargs):
            token = evaluating.enter_discrete_run(every_site)
            try:
                return fn(*args, **kwargs)
            finally:
                evaluating.exit_discrete_run(token)

        return super().__call__(run)

    def _check_handler_order(self, name):
        # Handlers inside this one process the site before the swap and post-process it after the
        # index has become a one-hot: enumeration would skip the site and the trace would hold an
        # index distribution with a one-hot value -- a silently wrong log joint.
        inner = _PYRO_STACK[_PYRO_STACK.index(self) + 1 :]
        if any(isinstance(h, (EnumMessenger, TraceMessenger)) for h in inner):
            raise ValueError(
                f"discrete(mode='enumerate') at site {name!r} is outside the inference handlers: "
                "wrap the model, discrete(model, mode='enumerate'), and pass that to TraceEnum_ELBO / "
                "infer_discrete instead of running them inside `with discrete(...)`"
            )

    def _held_outside(self, msg, base):
        """(held, value): whether a handler outside this one gives the site a value in its own
        sample space, which it takes after the swap -- poutine.condition's data, or replay's trace
        (posterior samples handed back to the host's Importance, Predictive, ...) where the value is
        not an index of the enumerated site (:func:`_is_index`: what the host's infer_discrete
        replays) -- and the replayed value. Such a site is scored by its limit at the value, as in
        sample mode, not enumerated. The outermost handler's value is the one the site takes; a
        ``block`` that hides the site hides the handlers outside it (a helper called inside a model
        under the user's condition or replay: the helper's own model is not theirs)."""
        name = msg["name"]
        for handler in _visible_outside(self, msg):
            if isinstance(handler, ConditionMessenger) and name in handler.data:
                return True, None
            if isinstance(handler, ReplayMessenger) and handler.trace is not None and name in handler.trace:
                value = handler.trace.nodes[name]["value"]
                return (False, None) if _is_index(msg, base, value) else (True, value)
        return False, None

    def _pyro_sample(self, msg):
        if not site_is_subsample(msg):
            self._named.saw(msg["name"])
        self.index_to_value.pop(msg["name"], None)  # filled again below if the site is enumerated in this run
        if self.mode is Mode.ENUMERATE and msg["is_observed"]:
            _broadcast_deterministic(msg)
        if msg["is_observed"] and (_given_probs(base := unwrap(msg["fn"])[0]) or (isinstance(base, ONE_HOT) and _given_probs(base._categorical))) and _binary_or_categorical(msg):
            # observed, in a helper: scored by its probabilities' own logarithms where torch clamped
            # them (an observation of probability 0 scored at log eps, a finite log p(x))
            msg["fn"] = rewrap(_exact_categorical(base), unwrap(msg["fn"])[1])
        if not _selected(msg, self.sites):
            return
        base, wrappers = unwrap(msg["fn"])
        held, replayed = self._held_outside(msg, base) if self.mode is Mode.ENUMERATE else (False, None)
        enumerated = self.mode is Mode.ENUMERATE and not held
        sequential = (msg["infer"] or {}).get("enumerate") == "sequential"
        if enumerated and (isinstance(base, ONE_HOT) or (not sequential and _given_probs(base))):
            pass  # enumerated as an index too: infer_discrete cannot decode enumerated one-hot values
        elif not isinstance(base, CONCRETE_FAMILY):
            return
        if enumerated:
            self._check_handler_order(msg["name"])
            if any(method == "to_event" and n > 0 for method, n in wrappers):
                raise ValueError(
                    f"discrete(mode='enumerate'): site {msg['name']!r} is {type(base).__name__}(...).to_event(...), "
                    "whose joint support is a cartesian product; declare the independent variables with a "
                    "pyro.plate instead of .to_event() to enumerate them"
                )
            index_dist, self.index_to_value[msg["name"]] = _index_distribution(base)
            # an enumerated site's values are summed out with their prior masses; a mask applies
            # to the rest of the model (as NumPyro's TraceEnum_ELBO does; Pyro's would weight the
            # values of a masked-out data point equally and add log K)
            if not self.masks_kept:
                wrappers = [(method, argument) for method, argument in wrappers if method != "mask"]
                msg["mask"] = None
            msg["fn"] = rewrap(index_dist, wrappers)
            msg["infer"] = {**(msg["infer"] or {}), "enumerate": "parallel"}  # never mutate the user's dict
            if evaluating.helper_running():  # summed exactly: not a Monte Carlo enumeration (num_samples)
                msg["infer"] = {key: value for key, value in msg["infer"].items() if key not in ("num_samples", "tmc", "expand")}
            return
        limit = base.discrete()
        msg["fn"] = rewrap(limit, wrappers)
        if replayed is not None and not (_traced() or torch._C._is_tracing()) and not bool(limit.support.check(replayed).all()):
            raise messages.value_off_discrete_support(msg["name"])
        if self.mode is Mode.ARGMAX:
            msg["value"] = limit.mode.expand(msg["fn"].shape())
            msg["infer"] = {**(msg["infer"] or {}), ARGMAX_VALUE: True}

    def _pyro_post_sample(self, msg):
        # a transformed Concrete-family site no reparametrizer split (one outside this handler sees it after)
        if _selected(msg, self.sites) and (family := _transformed_family(unwrap(msg["fn"])[0])) is not None:
            raise messages.transformed_site(self.mode.value, msg["name"], family)
        # runs after the outer trace has copied the (index distribution, index) pair
        to_value = self.index_to_value.get(msg["name"])
        if to_value is not None:
            if msg["is_observed"]:  # by a handler outside this one other than poutine.condition
                raise messages.observed_after_enumeration(msg["name"])
            if isinstance(unwrap(msg["fn"])[0], dist.Categorical) and msg["value"].is_floating_point():  # not an index
                raise messages.unforeseen_value(msg["name"])
            msg["value"] = to_value(msg["value"])


def discrete(
    fn: Optional[Callable[..., Any]] = None, *, mode: str = "sample", sites: Optional[Union[str, Iterable[str]]] = None
) -> Union["DiscreteMessenger", Callable[..., Any]]:
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
      one-hot categorical sites (the host's or ``limits.OneHotCategorical``) are enumerated the
      same way, as an index (the host cannot decode enumerated one-hot values);
    - ``mode="argmax"``: the value is the mode (one-hot argmax of the logits; ``logits > 0``),
      scored with the discrete mass.

    Wrap the model, not the inference call: ``TraceEnum_ELBO().loss(discrete(model,
    mode="enumerate"), guide)``; in enumerate mode the wrong order raises a ``ValueError``.

    :param fn: a model or guide; if None, returns a handler usable as a context manager.
    :param str mode: "sample", "enumerate" or "argmax".
    :param sites: None (every Concrete-family site), a site name, or a collection of names (a run
        whose sample sites include none of the names raises a ValueError after it; a name that only
        some runs draw, such as a step beyond a minibatch's length, is no error).
    """
    messenger = DiscreteMessenger(mode=mode, sites=sites)
    return messenger if fn is None else messenger(fn)


# ----------------------------------------------------------------------------- relax


class RelaxMessenger(NamingSites, Messenger):
    """Swaps OneHotCategorical sites for Concrete and Bernoulli sites for BinConcrete. See :func:`relax`."""

    def __init__(self, temperature: Any, sites: Optional[Union[str, Iterable[str]]] = None) -> None:
        # any real number (NumPy's float32 too) or array; a bool is not a temperature
        if isinstance(temperature, bool) or not (callable(temperature) or isinstance(temperature, (dict, numbers.Real, np.ndarray, torch.Tensor))):
            raise ValueError(
                f"relax: temperature must be a number, a dict by site name or a callable of the site, got {temperature!r}"
            )
        self.temperature = temperature
        self.sites = _site_set(sites, "relax")
        self._named = NamedSites(self.sites, "relax")
        super().__init__()

    def _temperature(self, msg):
        if isinstance(self.temperature, dict):
            if msg["name"] not in self.temperature:
                raise ValueError(f"relax: no temperature given for site {msg['name']!r}")
            return self.temperature[msg["name"]]
        if callable(self.temperature):
            return self.temperature(msg)
        return self.temperature

    def _pyro_sample(self, msg):
        if not site_is_subsample(msg):
            self._named.saw(msg["name"])
        if not _selected(msg, self.sites):
            return
        base, wrappers = unwrap(msg["fn"])
        if clamped_probability(base, relaxed=True):
            raise ValueError(f"relax: {messages.clamped_probability(msg['name'], type(base).__name__)}")
        # -inf logits: what the relaxed site's own validation would refuse, named here (validation on only)
        if getattr(base, "_validate_args", False) and _infinite(base.logits if isinstance(base, (torch.distributions.OneHotCategorical, torch.distributions.Bernoulli)) else None):
            raise ValueError(f"relax: {messages.infinite_logits(msg['name'], type(base).__name__)}")
        if isinstance(base, torch.distributions.OneHotCategorical):
            relaxed = Concrete(self._temperature(msg), logits=base.logits, validate_args=base._validate_args)
        elif isinstance(base, torch.distributions.Bernoulli):
            relaxed = BinConcrete(self._temperature(msg), logits=base.logits, validate_args=base._validate_args)
        elif self.sites is not None and isinstance(base, torch.distributions.Categorical):  # named: it cannot be
            raise messages.relax_integer_categorical(msg["name"], type(base).__name__, "OneHotCategorical")
        else:
            return
        msg["fn"] = rewrap(relaxed, wrappers)
        # a mark for enumeration (config_enumerate inside relax marked the discrete site) no longer
        # applies: the relaxed site is continuous (Pyro's TraceEnum_ELBO failed on it with an empty
        # NotImplementedError). A new dict: the user's own ``infer`` is left as given. One with
        # ``num_samples`` stays: Monte Carlo enumeration of the site's draws, which Pyro's
        # TraceTMC_ELBO makes of a continuous site (without it, TMC scored one draw as if summed).
        infer = msg.get("infer") or {}
        if infer.get("enumerate") is not None and infer.get("num_samples") is None:
            msg["infer"] = {key: value for key, value in msg["infer"].items() if key != "enumerate"}


def relax(
    fn: Optional[Callable[..., Any]] = None, *, temperature: Any, sites: Optional[Union[str, Iterable[str]]] = None
) -> Union["RelaxMessenger", Callable[..., Any]]:
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
    messenger = RelaxMessenger(temperature=temperature, sites=sites)
    return messenger if fn is None else messenger(fn)
