"""The machinery behind ``evaluation`` and ``losses``: running a model with given parameters or
globals, checking its sites, tracing a guide and the model replayed against it (the host's
``get_importance_trace``), the proposal of an autoguide, and importance weights per particle.

Errors about the model or guide are raised as ``concrete_common.messages.ModelError``, without a
name: the public helper or loss that was called names itself (``messages.named_errors``)."""

import math
import warnings

import pyro
import torch
from pyro import poutine
from pyro.distributions import LowRankMultivariateNormal, MultivariateNormal, Normal, TorchDistribution
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide import AutoContinuous, AutoGuideList
from pyro.infer.enum import get_importance_trace
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import prune_subsample_sites, site_is_subsample
from pyro.util import ignore_jit_warnings

from concrete_common import discrete_proposal, messages, subsampling
from concrete_common.common_scale import ScaleLedger

from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .hard_concrete import HardConcrete
from ._carry import _traced
from .handlers import ARGMAX_VALUE, CONCRETE_FAMILY, clamped_probability, rewrap, unwrap

_PARTICLES = "_particles"  # the name of the particle plate (:func:`particle_traces`)


def _module_overrides(fn, params):
    """The plain ``nn.Parameter`` attributes of a ``PyroModule`` ``fn`` that ``params`` names (by
    their param-store name), by attribute path -- e.g. the ``loc`` of AutoDiagonalNormal and
    AutoMultivariateNormal: the module emits a ``pyro.param`` statement for them but uses the
    attribute, not the statement's value, so ``substitute`` alone would leave them unchanged."""
    if not isinstance(fn, PyroModule):
        return {}
    overrides = {}
    for path, parameter in fn.named_parameters():
        name = f"{fn._pyro_name}.{path}" if fn._pyro_name else path
        if not path.endswith("_unconstrained") and name in params:
            overrides[path] = torch.as_tensor(params[name], dtype=parameter.dtype, device=parameter.device)
    return overrides


def with_params(fn, params):
    """``fn`` with its param sites taken from ``params`` -- one dict for model and guide, as
    ``pyro.get_param_store()`` or NumPyro's ``svi.get_params`` give (the names a function does not
    use are expected, so Pyro's warning about them is silenced). A ``PyroModule``'s plain
    ``nn.Parameter`` attributes named in ``params`` are swapped in for the call
    (``torch.func.functional_call``; see :func:`_module_overrides`)."""
    messages.check_params(params)
    if params is None:
        return fn
    overrides = _module_overrides(fn, params)
    if overrides:
        module = fn

        def fn(*args, **kwargs):
            return torch.func.functional_call(module, overrides, args, kwargs)

    substituted = poutine.substitute(fn, data=params)

    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="pyro.module data did not find params")
            return substituted(*args, **kwargs)

    return run


class _GivenMessenger(Messenger):
    """Holds the sample sites named in ``given`` at the given values and leaves them out of the log
    joint (masked), so that the discrete graph is evaluated conditionally on them: p(x | given)."""

    def __init__(self, given):
        self.given = given
        super().__init__()

    def _pyro_sample(self, msg):
        if msg["name"] in self.given:
            if msg["is_observed"]:
                raise messages.given_observed_site(msg["name"])
            msg["value"] = _as_value_of(self.given[msg["name"]], msg["fn"])
            msg["is_observed"] = True
            # masked in the distribution, whose log_prob is then never evaluated: a relaxed site given at
            # a discrete value (a one-hot, 0 or 1) has no Concrete density, and the site's mask alone
            # applies after the host has computed it (a ValueError under validation)
            msg["fn"] = _Held(msg["fn"])


class _Held(MaskedDistribution):
    """``fn.mask(False)``, whose log density is zeros of the value's dtype (Pyro's are the default
    dtype's: float32 zeros in a float64 model fail in ``TraceEnum_ELBO``)."""

    def __init__(self, base_dist):
        super().__init__(base_dist, False)

    def expand(self, batch_shape, _instance=None):
        return _Held(self.base_dist.expand(batch_shape))

    def log_prob(self, value):
        shape = torch.broadcast_shapes(self.base_dist.batch_shape, value.shape[: value.dim() - self.event_dim])
        dtype = value.dtype if value.is_floating_point() else torch.get_default_dtype()
        return torch.zeros((), dtype=dtype, device=value.device).expand(shape)


def _as_value_of(value, fn):
    """``value`` as a tensor of the site's dtype and device (those of its mean, or of its logits)."""
    if isinstance(value, torch.Tensor):
        return value
    for attribute in ("mean", "logits"):
        try:
            like = getattr(fn, attribute)
            return torch.as_tensor(value, dtype=like.dtype, device=like.device)
        except (AttributeError, NotImplementedError):
            pass
    return torch.as_tensor(value, dtype=torch.get_default_dtype())


class HeldAsObserved(Messenger):
    """Wraps the user's model, innermost of the library's handlers: a latent sample site that reaches
    it with a value already set by a handler inside the model (``poutine.replay`` of a partial
    trace) is held there, and is treated as observed, as ``poutine.condition`` would make it: scored
    at that value, neither enumerated nor taken for a draw from its prior (whose log density
    cancels in an importance weight: a held model-only latent lost log p(value | parameters) and its
    gradient). Values set by ``discrete(mode="argmax")`` are the mode's own, and an enumeration's
    values inside the model its support: both stay latent."""

    def _pyro_sample(self, msg):
        infer = msg["infer"] or {}
        if msg["is_observed"] or msg["value"] is None or infer.get(ARGMAX_VALUE) or "_enumerate_dim" in infer:
            return  # the mode's values; an enumeration's (its support)
        msg["is_observed"] = True


def held_as_observed(fn):
    return HeldAsObserved()(fn)


def with_given(fn, given):
    return fn if not given else _GivenMessenger(given)(fn)


class Elementwise(TorchDistribution):
    """Stands in for a site's base distribution under the site's own wrappers (``rewrap``): its
    ``log_prob`` is ``fn(value)``, one number per element of the base's batch, which the wrappers
    then expand (a plate), mask and sum over event dimensions as they do a density -- so that a
    per-element quantity is weighed as the site's density would be."""

    arg_constraints: dict = {}

    def __init__(self, base, fn):
        self.base, self.fn = base, fn
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def support(self):
        return self.base.support

    def log_prob(self, value):
        return self.fn(value)


def weighed(site, fn):
    """``fn`` of the site's value, per element of the site's base, weighed as the site's density:
    the plates' expansion, the masks (``.mask``, ``poutine.mask``), the events' sums and the scale."""
    base, wrappers = unwrap(site["fn"])
    stand_in = rewrap(Elementwise(base, fn), wrappers)
    return scale_and_mask(stand_in.log_prob(site["value"]), site["scale"], site["mask"])


def boundary_points(base, value):
    """Per element of ``base``'s batch, whether ``value`` holds a point of the boundary of its
    support, where the density is only a limit: a coordinate 0 (Concrete), 0 or 1 (BinConcrete),
    -inf (ExpConcrete), +-inf (LogitBinConcrete); Hard Concrete's ends are its point masses, not
    a boundary."""
    if isinstance(base, Concrete):
        return (value == 0).any(-1)
    if isinstance(base, ExpConcrete):
        return value.isneginf().any(-1)
    if isinstance(base, BinConcrete):
        return (value == 0) | (value == 1)
    if isinstance(base, LogitBinConcrete):
        return value.isinf()
    return torch.zeros(value.shape[: value.dim() - len(base.event_shape)], dtype=torch.bool, device=value.device)


def check_observed_densities(trace):
    """An observed Concrete-family site at a point of its support's boundary (a relaxed site
    conditioned on a one-hot or 0/1 value: discrete data) would be scored by its density's limit
    there -- +inf for every assignment (with validation off that was an argmax of ties, with no
    error), or a finite number or -inf that is the density of no relaxed sample and not the
    discrete data's probability: it raises, whatever the temperature and whether or not validation
    is on. Elements masked out are left alone; sites held by ``given`` are masked out, density 0."""
    for site in trace.nodes.values():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        base = unwrap(site["fn"])[0]
        if isinstance(base, CONCRETE_FAMILY) and bool(weighed(site, lambda value: boundary_points(base, value).to(value.dtype)).any()):
            raise messages.observed_at_boundary(site["name"], type(base).__name__)


class SummedWithPriorMasses(Messenger):
    """Outside ``config_enumerate``: drops the mask of every latent site marked for parallel
    enumeration, the model's own ``Bernoulli`` / ``Categorical`` too, so that each is summed out with
    its prior masses as ``discrete(mode="enumerate")`` sums a Concrete-family site (a data point
    masked out entirely contributes 0; Pyro's ``TraceEnum_ELBO`` gave a masked latent mass 1 at every
    value, adding log K, so that a model and its ``discrete(relax(model))`` disagreed).

    ``drawn=True``: every latent site of discrete support instead, enumerated or not --
    ``discrete_log_likelihood``'s model and proposal, whose importance weight p(z) / q(z) at a data
    point masked out then averages 1, as the sum gives (the host's mask made it 1 / q(z): log K at
    a uniform proposal, in both the per-element and the joint bound)."""

    def __init__(self, drawn=False):
        self.drawn = drawn
        super().__init__()

    def _summed(self, msg):
        if self.drawn:
            return getattr(msg["fn"], "has_enumerate_support", False)
        return (msg["infer"] or {}).get("enumerate") == "parallel"

    def _pyro_sample(self, msg):
        if msg["is_observed"] or not self._summed(msg):
            return
        base, wrappers = unwrap(msg["fn"])
        msg["fn"] = rewrap(base, [(method, argument) for method, argument in wrappers if method != "mask"])
        msg["mask"] = None


class CommonScale(Messenger):
    """Takes the scale (``poutine.scale``) off every sample site of a model or a guide whose
    importance weights ``discrete_log_likelihood`` averages (NumPyro's ``CommonScale(...,
    every_site=True)``; Pyro's other exact helpers leave the scale to ``TraceEnum_ELBO``, which
    sums the unscaled factors and scales the result), and keeps it in ``scale`` (None: none):
    the bound of a model scaled by s is s L_m, which rises to s log p(x) (``marginal_log_likelihood``)
    as m grows, not log E[w^s], which exceeded it (``ledger``, its scale). Two different scales are
    refused, and so is a per-element one. Sites held by ``given`` are left alone. (The bound refuses a subsampled plate,
    so every scale here is the user's.)"""

    def __init__(self, given=None):
        self.given = set(given or ())
        self.ledger = ScaleLedger()
        super().__init__()

    def _pyro_sample(self, msg):
        # a plate's subsample site and pyro.deterministic's (a masked Delta) hold no density
        if msg["name"] in self.given or site_is_subsample(msg) or msg["infer"].get("_deterministic"):
            return
        scale = msg["scale"]
        if isinstance(scale, torch.Tensor):
            if scale.dim() != 0:  # as NumPyro's: one number
                raise messages.per_element_scale(msg["name"])
            scale = scale.item()
        self.ledger.record(msg["name"], scale)
        msg["scale"] = 1.0


def sample_sites(trace):
    """The sample sites of ``trace``, without the plates' subsample sites."""
    return [site for site in trace.nodes.values() if site["type"] == "sample" and not site_is_subsample(site)]


def max_plate_nesting(trace):
    dims = [-f.dim for site in sample_sites(trace) for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None]
    return max(dims, default=0)


def check_given(trace, given):
    messages.check_given(given, [site["name"] for site in sample_sites(trace)])


def _infinite_logits(base):
    """Whether a Bernoulli given by logits has one of +-inf (eagerly; torch's log density of the
    certain outcome is then NaN, and the exact sum -inf)."""
    return "logits" in base.__dict__ and not torch._C._is_tracing() and bool(torch.isinf(base.logits).any())


def check_all_latents_discrete(trace):
    for site in sample_sites(trace):
        if not site["is_observed"] and not getattr(site["fn"], "has_enumerate_support", False):
            raise messages.not_enumerable(site["name"], type(unwrap(site["fn"])[0]).__name__)
        if not site["is_observed"] and (site["infer"] or {}).get("enumerate") == "sequential":
            raise messages.sequential_enumeration(site["name"])
        if not site["is_observed"] and (site["infer"] or {}).get("num_samples") is not None:
            raise messages.monte_carlo_enumeration(site["name"])
        if not site["is_observed"] and clamped_probability(base := unwrap(site["fn"])[0]):
            raise messages.clamped_probability(site["name"], type(base).__name__)
        if not site["is_observed"] and isinstance(base, torch.distributions.Bernoulli) and _infinite_logits(base):
            raise messages.infinite_logits(site["name"], type(base).__name__, "torch scores the certain outcome NaN")


def check_masked_latents_unread(model, args, kwargs):
    """A latent site masked out where an unmasked site reads its value raises
    (:func:`concrete_common.messages.masked_latent_read`): the helpers sum a masked-out latent with
    its prior masses, the host weighs each value 1, and only where nothing unmasked reads it (a data
    point masked out with its children) are the two one model. Read off the enumerated trace, masks
    kept: a site reads the latent where its log density varies along the latent's enumeration
    dimension."""
    if _traced() or torch._C._is_tracing():
        return  # the values cannot be read
    from pyro.infer import config_enumerate

    from .handlers import DiscreteMessenger, discrete

    with torch.no_grad(), poutine.block():  # a model with no discrete latent masked out has nothing to check
        drawn = poutine.trace(discrete(model, mode="sample")).get_trace(*args, **kwargs)
    if not any(_masked_out(site) is not None for site in sample_sites(drawn) if not site["is_observed"] and getattr(site["fn"], "has_enumerate_support", False)):
        return
    nesting = max_plate_nesting(drawn)
    swap = DiscreteMessenger(mode="enumerate")
    swap.masks_kept = True
    try:
        with torch.no_grad(), poutine.block():
            trace = poutine.trace(poutine.enum(config_enumerate(swap(model)), first_available_dim=-1 - nesting)).get_trace(*args, **kwargs)
    except (ValueError, NotImplementedError):  # not enumerable (a discrete_log_likelihood's .to_event() site): what is drawn is not summed
        return
    masked = [(site, _masked_out(site)) for site in sample_sites(trace) if not site["is_observed"] and "_enumerate_dim" in (site["infer"] or {})]
    masked = [(site, out) for site, out in masked if out is not None]
    if not masked:
        return
    with torch.no_grad():
        trace.compute_log_prob()
    for site, out in masked:
        dim = site["infer"]["_enumerate_dim"]
        identity = site["infer"].get("_dim_to_id", {}).get(dim)
        # the plates only: the enumeration dimensions of the site's parents (left of them) masked anywhere
        out = out.reshape((-1,) + out.shape[max(out.dim() - nesting, 0) :]).any(0) if out.dim() > nesting else out
        for reader in sample_sites(trace):
            log_prob = reader["log_prob"]
            if reader is site or log_prob.dim() < -dim or log_prob.shape[dim] == 1:
                continue
            if (reader["infer"] or {}).get("_dim_to_id", {}).get(dim) != identity:
                continue  # the dimension reused by another site (markov): not this latent's
            varies = log_prob != log_prob.narrow(dim, 0, 1)  # the reader's density changes with the latent's value
            varies = varies.reshape((-1,) + varies.shape[varies.dim() - out.dim() :]).any(0) if out.dim() else varies.any()
            for d in range(out.dim()):  # plates the reader is in and the latent is not
                if out.shape[d] == 1 and varies.shape[d] > 1:
                    varies = varies.any(d, keepdim=True)
            if bool((varies & out).any()):
                raise messages.masked_latent_read(site["name"], reader["name"])


def _masked_out(site):
    """Where a site is masked out (its batch shape; None: nowhere), by ``poutine.mask`` and ``.mask()``."""
    masks = [site["mask"]] + [argument for method, argument in unwrap(site["fn"])[1] if method == "mask"]
    masks = [torch.as_tensor(mask) for mask in masks if mask is not None and mask is not True]
    if not masks:
        return None
    kept = masks[0]
    for mask in masks[1:]:
        kept = kept & mask
    if kept.dim() > len(site["fn"].batch_shape) or bool(kept.all()):
        return None
    return ~kept.expand(site["fn"].batch_shape)


def check_full_data(trace):
    """The helpers evaluate the whole data set: a subsampled plate, whose sites would be a random
    subsample scaled up to the plate's size, raises."""
    check_scored_as_traced(trace)
    for site in sample_sites(trace):
        for frame in site["cond_indep_stack"]:
            if frame.full_size is not None:
                messages.check_full_plate(frame.name, frame.size, frame.full_size)


def replayed_traces(model, guide, args, kwargs):
    """(model trace, guide trace), unscored: the guide traced and the model replayed against it --
    which sites there are, not their densities."""
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    return poutine.trace(poutine.replay(held_as_observed(model), trace=guide_trace)).get_trace(*args, **kwargs), guide_trace


def check_scored_as_traced(trace):
    """Every site of ``trace`` is scored as it was traced: a site of ``vectorized_markov`` (Pyro's funsor
    backend) is a slice of a chain traced twice, once marked not to be scored, and raises."""
    for site in sample_sites(trace):
        if (site["infer"] or {}).get("_do_not_score"):
            raise messages.vectorized_markov(site["name"])


def importance_traces(model, guide, args, kwargs, *, max_plate_nesting=math.inf):
    """(model trace, guide trace) with every site's log_prob: the guide traced and the model replayed
    against it, by the host's ``get_importance_trace`` (which also checks that model and guide match
    and that each site's shape fits its plates, under Pyro's validation). A latent site the guide
    leaves out is drawn by the model from its prior, which is then its proposal (:func:`log_weights`;
    the structured-prediction bound and the discrete graph's proposal rely on it), so the host's
    warning about such sites is not given."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Found vars in model but not guide")
        traces = get_importance_trace("flat", max_plate_nesting, held_as_observed(model), guide, args, kwargs)
    for trace in traces:
        check_scored_as_traced(trace)
    return traces


def replayed_model_trace(model, guide_trace, args, kwargs):
    """The model replayed against a given guide trace, its subsample sites pruned and every site
    scored (the model side of ``get_importance_trace``, for a guide trace made otherwise)."""
    trace = prune_subsample_sites(poutine.trace(poutine.replay(held_as_observed(model), trace=guide_trace)).get_trace(*args, **kwargs))
    check_scored_as_traced(trace)
    trace.compute_log_prob()
    return trace


def no_guide(*args, **kwargs):
    pass


def _relaxed_latents(trace):
    return {
        site["name"]
        for site in sample_sites(trace)
        if not site["is_observed"] and isinstance(unwrap(site["fn"])[0], CONCRETE_FAMILY)
    }


def _autoguide_parts(guide):
    """``guide`` itself, or the parts of an ``AutoGuideList`` (recursively)."""
    if isinstance(guide, AutoGuideList):
        return [part for member in guide for part in _autoguide_parts(member)]
    return [guide]


def _joint_latent_layouts(guide):
    """{auxiliary site name: {model site name: its coordinates in the joint latent}} for the
    autoguides in ``guide`` that draw every latent site from one auxiliary vector (the
    ``AutoContinuous`` family: AutoDiagonalNormal, AutoMultivariateNormal, ...), read off their
    own unpacking of the vector; empty for the others. The guide must have run once."""
    layouts = {}
    for part in _autoguide_parts(guide):
        if isinstance(part, AutoContinuous) and part.prototype_trace is not None:
            coordinates = torch.arange(part.latent_dim, dtype=torch.float64)
            layouts[f"_{part._pyro_name}_latent"] = {
                site["name"]: value.reshape(-1).long() for site, value in part._unpack_latent(coordinates)
            }
    return layouts


def _marginal_log_prob(joint, value, keep):
    """The log density, at ``value``, of the coordinates ``keep`` (a boolean mask over the last
    dimension) of ``joint``, the rest integrated out: closed form for a diagonal Normal (the
    product over the kept coordinates) and a (low-rank) multivariate Normal (the Normal with the
    kept rows and columns of the covariance); None for any other distribution."""
    if isinstance(joint, torch.distributions.Independent) and isinstance(joint.base_dist, Normal):
        if joint.reinterpreted_batch_ndims == 1:
            return torch.where(keep, joint.base_dist.log_prob(value), 0.0).sum(-1)
    elif isinstance(joint, Normal):  # coordinates along the last batch dimension
        return torch.where(keep, joint.log_prob(value), 0.0)
    elif isinstance(joint, (MultivariateNormal, LowRankMultivariateNormal)):
        index = keep.nonzero().reshape(-1)
        covariance = joint.covariance_matrix[..., index, :][..., index]
        return MultivariateNormal(joint.loc[..., index], covariance_matrix=covariance).log_prob(value[..., index])
    return None


class _Marginal(TorchDistribution):
    """Draws of ``joint``, scored by the marginal density of their coordinates ``keep``: drawing the
    whole vector and using only those coordinates is drawing them from their marginal."""

    def __init__(self, joint, keep):
        self.joint, self.keep = joint, keep
        super().__init__(joint.batch_shape, joint.event_shape, validate_args=False)

    @property
    def has_rsample(self):
        return self.joint.has_rsample

    @property
    def support(self):
        return self.joint.support

    def expand(self, batch_shape, _instance=None):
        return _Marginal(self.joint.expand(batch_shape), self.keep)

    def sample(self, sample_shape=torch.Size()):
        return self.joint.sample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        return self.joint.rsample(sample_shape)

    def log_prob(self, value):
        return _marginal_log_prob(self.joint, value, self.keep)


class _MarginalMessenger(Messenger):
    """Scores the auxiliary sites in ``marginals`` (name -> boolean mask of the coordinates kept)
    by their marginal density (:class:`_Marginal`)."""

    def __init__(self, marginals):
        self.marginals = marginals
        super().__init__()

    def _pyro_sample(self, msg):
        keep = self.marginals.get(msg["name"])
        if keep is not None and not isinstance(msg["fn"], _Marginal):
            msg["fn"] = _Marginal(msg["fn"], keep)


def marginalize(guide, marginals):
    return _MarginalMessenger(marginals)(guide) if marginals else guide


def proposal(model, guide, args, kwargs, autoguide=None, given=None):
    """Which guide sites to discretize, which to hide and which to marginalize for the discrete
    graph's proposal: the rules of ``concrete_common.discrete_proposal.sort_guide_sites``, on this
    guide's sites. An autoguide's auxiliary site is attributed to the model sites it feeds --
    ``{name}_unconstrained`` (AutoNormal) to ``name``; the joint latent of an ``AutoContinuous``
    autoguide (``autoguide``, or a part of an ``AutoGuideList``) to every site, by its coordinates;
    one that feeds kept and hidden sites alike is still drawn whole, but scored by the marginal
    density of the coordinates of the sites kept (:func:`_marginal_log_prob`; a joint without a
    closed-form marginal raises).

    :returns: (discretized names, hidden names, {auxiliary name: boolean mask of the coordinates
        kept}, the model's plate nesting, {name: value} of the guide's sites the model holds).
    """
    with torch.no_grad(), poutine.block():
        model_trace, guide_trace = replayed_traces(model, guide, args, kwargs)
    for trace in (guide_trace, model_trace):
        check_full_data(trace)
    relaxed = _relaxed_latents(model_trace)
    check_given(model_trace, given)
    guide_sites = {site["name"]: site for site in sample_sites(guide_trace)}
    model_sites = {site["name"] for site in sample_sites(model_trace)}
    infer = {name: site["infer"] for name, site in guide_sites.items()}
    layouts = discrete_proposal.auxiliary_layouts(_joint_latent_layouts(autoguide), infer, model_sites)
    concrete = {name for name, site in guide_sites.items() if isinstance(unwrap(site["fn"])[0], CONCRETE_FAMILY)}
    relaxed, held, held_values = discrete_proposal.model_side(sample_sites(model_trace), relaxed, concrete, guide_sites, given)
    discretized, hidden, partial = discrete_proposal.sort_guide_sites(relaxed, concrete, guide_sites, model_sites, held, layouts)
    marginals = {}
    for name, (kept, fed_hidden) in partial.items():
        joint, value = guide_sites[name]["fn"], guide_sites[name]["value"]
        keep = torch.zeros(value.shape[-1], dtype=torch.bool, device=value.device)
        for site in kept:
            keep[layouts[name][site]] = True
        if _marginal_log_prob(joint, value, keep) is None:
            raise discrete_proposal.no_closed_form_marginal(name, fed_hidden, kept, type(joint).__name__, "poutine.block")
        marginals[name] = keep
    nesting = max_plate_nesting(model_trace)
    _check_observed_within_plates(model_trace, nesting)
    return discretized, hidden, marginals, nesting, held_values


def _check_observed_within_plates(trace, nesting):
    """Observations with a batch dimension left of the model's plates would put their rows where the
    particles are read (one particle: the rows taken for particles; m particles: data whose size is m
    broadcasts with them silently); Pyro's shape check ignores dimensions left of ``max_plate_nesting``."""
    for site in sample_sites(trace):
        if not site["is_observed"]:
            continue
        fn, value = site["fn"], torch.as_tensor(site["value"])
        try:
            batch = torch.broadcast_shapes(fn.batch_shape, value.shape[: value.dim() - fn.event_dim])
        except RuntimeError:
            continue  # the density raises its own error
        if any(size != 1 for size in batch[: len(batch) - nesting]):
            raise messages.particle_shape(site["name"], batch, -1 - nesting, 1)


# ----------------------------------------------------------------------------- importance weights


def per_particle(log_prob, site, particle_dim, plate):
    """A site's log_prob summed to shape (num_particles,) or (num_particles, plate size). A
    :class:`~concrete_common.messages.ParticleShapeError` where it holds a dimension left of the
    particle dimension, or one there that is not the particles': a model that does not broadcast over
    the particle plate, or with a batch dimension outside its plates (Pyro's shape check ignores
    dimensions left of ``max_plate_nesting``), whose weights would mix particles or data points."""
    log_prob = log_prob.reshape((1,) * max(-particle_dim - log_prob.dim(), 0) + log_prob.shape)
    count = _particle_count(site, particle_dim)
    with ignore_jit_warnings():  # shapes: fixed per compilation of the Jit losses
        fits = log_prob.dim() <= -particle_dim and int(log_prob.shape[particle_dim]) in (1, int(count))
    if not fits:
        raise messages.particle_shape(site["name"], tuple(log_prob.shape), particle_dim, count)
    # right of the particles, only the site's plates may hold several values: a .to_event(1) site
    # outside the plate whose values it holds has the particles there, which the sum below would mix
    plated = {f.dim for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None}
    with ignore_jit_warnings():
        unplated = [d for d in range(particle_dim + 1, 0) if d not in plated and int(log_prob.shape[d]) != 1]
    if unplated:
        raise messages.unplated_dimension(site["name"], tuple(log_prob.shape), unplated[0], particle_dim)
    keep = {log_prob.dim() + particle_dim}
    if plate is not None:
        keep.add(log_prob.dim() + plate_frame(site, plate).dim)
    dims = [d for d in range(log_prob.dim()) if d not in keep]
    return log_prob.sum(dims) if dims else log_prob


def _particle_count(site, particle_dim):
    """m where ``site`` is in the particle plate (:func:`particle_traces`), else 1."""
    return next((f.size for f in site["cond_indep_stack"] if f.name == _PARTICLES and f.dim == particle_dim), 1)


def score_log_prob(site):
    """The log density of the distribution a site's value was drawn from, neither scaled nor masked:
    what a score-function term differentiates. A scale (a subsampled plate, ``poutine.scale``) or a
    mask weighs the site's terms in the objective, not the draw (Pyro's ``ScoreParts.scale_and_mask``
    leaves the score function alone for the same reason)."""
    base, wrappers = unwrap(site["fn"])
    if all(method != "mask" for method, _ in wrappers) and "unscaled_log_prob" in site:
        return site["unscaled_log_prob"]
    return rewrap(base, [(method, argument) for method, argument in wrappers if method != "mask"]).log_prob(site["value"])


def score_function_sites(model_trace, guide_trace):
    """The latent sites whose draws need a score-function term: the guide's without a reparameterized
    sampler, and the model's that the guide does not draw (their prior is their proposal) without one."""
    guide_latents = [site for site in sample_sites(guide_trace) if not site["is_observed"]]
    proposed = {site["name"] for site in guide_latents}
    model_only = [
        site for site in sample_sites(model_trace) if not site["is_observed"] and site["name"] not in proposed
    ]
    return [site for site in guide_latents + model_only if not getattr(site["fn"], "has_rsample", False)]


def model_only_latents(model_trace, guide_trace):
    """The latent sites of the model that the guide does not draw."""
    proposed = {site["name"] for site in sample_sites(guide_trace)}
    return [site for site in sample_sites(model_trace) if not site["is_observed"] and site["name"] not in proposed]


def _subsample_scales(site):
    """{plate name: size / subsample size} of the subsampled plates around ``site``. (Under
    ``torch.jit.trace`` the sizes are tensors; the structure, and so they, are fixed per compilation.)"""
    with ignore_jit_warnings():
        sizes = [(f.name, int(f.size), int(f.full_size)) for f in site["cond_indep_stack"] if f.full_size is not None]
    return {name: full / size for name, size, full in sizes if size != full}  # more indices than elements: scaled down


def subsampled_plates(traces):
    """{plate name: size / subsample size} of the subsampled plates around the traces' sites."""
    subsampled = {}
    for trace in traces:
        for site in sample_sites(trace):
            subsampled.update(_subsample_scales(site))
    return subsampled


def plate_subsampling(traces, plate, num_particles):
    """The factor by which the host has scaled the log densities of ``plate``'s elements, checked
    for a bound of ``num_particles`` (``concrete_common.subsampling.bound_scale``)."""
    return subsampling.bound_scale(subsampled_plates(traces), plate, num_particles, beside=subsampling.plates_beside([site for trace in traces for site in sample_sites(trace)], plate))


def per_element_at_site(values, site, plate):
    """Values per element of ``plate`` (a scalar without one), shaped to broadcast against the site's
    batch shape (the plate's dimension where the site has it)."""
    if plate is None:
        return values
    return values.reshape(values.shape + (1,) * (-plate_frame(site, plate).dim - 1))


def plate_frame(site, plate):
    """The frame of ``plate`` around a site: a ValueError where the site is outside it, or where the
    plate is iterated sequentially (no dimension to hold one value per element)."""
    frames = [f for f in site["cond_indep_stack"] if f.name == plate]
    if not frames:
        raise messages.outside_plate(site["name"], plate)
    if frames[0].dim is None:
        raise messages.sequential_plate(site["name"], plate)
    return frames[0]


def shifted_log_weights(w):
    """Log weights (particles first) less their largest, where that is finite: the quantities VIMCO
    takes differences of are then of the size of their spread, not of the weights' (float32's spacing
    at 1e4 is 1e-3: at log weights of -1e4 that error was the size of a particle's signal at m = 1000)."""
    top = w.max(0, keepdim=True).values
    return w - torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def log_weights(model_trace, guide_trace, particle_dim, plate, *, globals_given=False):
    """Per-particle log p(x, z) - log q(z): shape (num_particles,) or (num_particles, plate size).

    A latent site the guide does not draw is drawn by the model from its prior, which is then its
    proposal: its log p cancels against its log q and is left out; one the guide draws and the model
    observes raises (:func:`concrete_common.messages.drawn_and_observed`), and so does a Hard Concrete
    latent (:func:`concrete_common.messages.hard_concrete_in_bound`). ``globals_given`` (per-element
    bounds of the discrete graph): observed sites outside ``plate`` condition every element alike and
    are left out, and a latent outside it raises.
    """
    total = 0.0
    proposed = {site["name"] for site in sample_sites(guide_trace)}
    observed = {site["name"] for site in sample_sites(model_trace) if site["is_observed"]}
    for site in sample_sites(guide_trace):
        if site["name"] in observed and not site["is_observed"] and not (site["infer"] or {}).get("is_auxiliary"):
            raise messages.drawn_and_observed(site["name"])
    for traced in (guide_trace, model_trace):
        for site in sample_sites(traced):
            if not site["is_observed"] and isinstance(unwrap(site["fn"])[0], HardConcrete):
                raise messages.hard_concrete_in_bound(site["name"])
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for site in sample_sites(trace):
            if sign > 0 and not site["is_observed"] and site["name"] not in proposed:
                continue
            if globals_given and plate is not None and not any(f.name == plate for f in site["cond_indep_stack"]):
                if site["is_observed"]:
                    continue
                raise messages.global_latent(site["name"], plate)
            total = total + sign * per_particle(site["log_prob"], site, particle_dim, plate)
    return total


def particle_traces(model, guide, args, kwargs, *, num_particles, max_plate_nesting):
    """(model trace, guide trace, particle dim) of m particles drawn in parallel in a plate left of
    the model's plates (``num_particles=None``: one, without that plate)."""
    particle_dim = -1 - max_plate_nesting
    if num_particles is None:  # one particle, as the model is written: no particle plate
        traces = importance_traces(model, guide, args, kwargs, max_plate_nesting=max_plate_nesting)
        return (*traces, particle_dim)

    def vectorized(fn):
        def run(*a, **k):
            with pyro.plate(_PARTICLES, num_particles, dim=particle_dim):
                return fn(*a, **k)

        return run

    traces = importance_traces(vectorized(model), vectorized(guide), args, kwargs, max_plate_nesting=-particle_dim)
    return (*traces, particle_dim)


def _same_subsample(model, guide, args, kwargs):
    """A wrapper that replays the subsample of every plate of one run of ``guide`` and of ``model``
    replayed against it (the subsample sites of Pyro's plates; a plate of the model alone too), so
    that runs one after another see the same elements."""
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    subsamples = poutine.Trace()
    for traced in (guide_trace, model_trace):
        for name, site in traced.nodes.items():
            if site["type"] == "sample" and site_is_subsample(site) and name not in subsamples:
                subsamples.add_node(name, **site)
    return lambda fn: poutine.replay(fn, trace=subsamples)


def importance_bound(model, guide, args, kwargs, *, num_particles, plate, max_plate_nesting, globals_given=False):
    """log (1/m) sum_i p(x, z_i) / q(z_i), z_i from the guide, the m particles drawn in parallel in
    a plate left of the model's plates: a scalar, or one bound per element of ``plate`` (of a
    subsampled plate, scaled to its size: :func:`plate_subsampling`). ``globals_given``: the discrete
    graph's per-element bound, with globals conditioned (see :func:`log_weights`)."""
    num_particles = messages.check_num_particles(num_particles)
    scales = []  # s, from the first traces drawn (see plate_subsampling)

    def weights(count, model=model, guide=guide):
        model_trace, guide_trace, particle_dim = particle_traces(
            model, guide, args, kwargs, num_particles=count, max_plate_nesting=max_plate_nesting
        )
        if not scales:
            scales.append(plate_subsampling((model_trace, guide_trace), plate, num_particles))
        weight = log_weights(model_trace, guide_trace, particle_dim, plate, globals_given=globals_given)
        # a model and guide with no site: log 1 per particle, as NumPyro's sum of no terms gives
        return weight if torch.is_tensor(weight) else torch.zeros(count or 1, dtype=torch.get_default_dtype())

    if num_particles == 1:  # one particle: the model as written, no particle plate
        return torch.logsumexp(weights(None), dim=0)
    try:
        drawn = weights(num_particles)
    except (RuntimeError, ValueError) as error:
        if isinstance(error, messages.ModelError) and not isinstance(error, messages.ParticleShapeError):
            raise  # not a shape: the model's own problem, at any m
        # a model written for one draw (``z @ locs`` with a batched global ``locs``) may not broadcast
        # over the particle dimension: then one particle at a time (a failure there is the model's own),
        # all of one subsample (the bound of an element averages its own particles)
        same = _same_subsample(model, guide, args, kwargs)
        drawn = torch.cat([weights(None, same(model), same(guide)) for _ in range(num_particles)])
        warnings.warn(
            f"the model or guide does not broadcast over a leftmost particle dimension "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); drew the {num_particles} particles one "
            "at a time, which is slower (see the docstring)",
            RuntimeWarning,
            stacklevel=4,
        )
    scale = scales[0]
    if scale == 1.0:
        return torch.logsumexp(drawn, dim=0) - math.log(num_particles)
    return scale * (torch.logsumexp(drawn / scale, dim=0) - math.log(num_particles))
