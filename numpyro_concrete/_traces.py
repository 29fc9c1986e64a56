"""The machinery behind ``evaluation`` and ``losses``: running a model with given parameters or
globals, checking its sites, tracing a guide and the model replayed against it (the host's
``get_importance_trace``), the proposal of an autoguide, and importance weights per particle.

Errors about the model or guide are raised as ``concrete_common.messages.ModelError``, without a
name: the public helper or loss that was called names itself (``messages.named_errors``)."""

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.distributions.util import is_identically_one
from numpyro.infer.autoguide import AutoContinuous, AutoGuideList
from numpyro.infer.util import get_importance_trace
from numpyro.primitives import Messenger

from concrete_common import discrete_proposal, messages, subsampling
from concrete_common.common_scale import ScaleLedger

from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .hard_concrete import HardConcrete
from .handlers import ARGMAX_VALUE, CONCRETE_FAMILY, _read, clamped_probability, rewrap, unwrap


def _varying_axes(x):
    """The manual mesh axes (``shard_map``) over which ``x`` varies: ``vma`` in newer JAX, the
    manual axis type's ``varying`` in older."""
    aval = jax.typeof(x)
    axes = getattr(aval, "vma", None)
    if axes is None:
        axes = getattr(getattr(aval, "mat", None), "varying", None)
    return frozenset(axes or ())


def varying_like(params, *inputs):
    """``params`` cast to vary over every manual mesh axis an array of ``inputs`` varies over. Inside
    ``shard_map`` the derivative with respect to a replicated parameter is summed over the shards:
    an inner ``grad`` / ``vjp`` of one shard's objective with respect to the parameters (a baseline's
    fit, REBAR's estimate of the guide's gradient) would give the sum of the shards', D times one
    shard's (D^2 once squared), where the user's ``pmean`` of the loss expects each shard's. Outside
    ``shard_map`` the parameters are returned as they are."""
    axes = frozenset().union(*(_varying_axes(x) for x in jax.tree_util.tree_leaves(inputs) if isinstance(x, jax.Array)))
    if not axes:
        return params

    def cast(x):
        missing = tuple(sorted(axes - _varying_axes(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree_util.tree_map(cast, params)


def with_params(fn, params):
    messages.check_params(params)
    return fn if params is None else handlers.substitute(fn, data=params)


def trace(fn, key, args, kwargs):
    return handlers.trace(handlers.seed(fn, key)).get_trace(*args, **kwargs)


class _GivenMessenger(Messenger):
    """Holds the sample sites named in ``given`` at the given values and leaves them out of the log
    joint (masked), so that the discrete graph is evaluated conditionally on them: p(x | given)."""

    def __init__(self, fn, given):
        self.given = given
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.given:
            if msg["is_observed"]:
                raise messages.given_observed_site(msg["name"])
            msg["value"] = jnp.asarray(self.given[msg["name"]])
            msg["is_observed"] = True
            msg["fn"] = msg["fn"].mask(False)


class SummedWithPriorMasses(Messenger):
    """Outside ``config_enumerate``: drops the mask of every latent site marked for parallel
    enumeration, the model's own ``Bernoulli`` / ``Categorical`` too, so that each is summed out with
    its prior masses as ``discrete(mode="enumerate")`` sums a Concrete-family site (a data point
    masked out entirely contributes 0; funsor's ``log_density`` gave a masked latent mass 1 at every
    value, adding log K, so that a model and its ``discrete(relax(model))`` disagreed).

    ``drawn=True``: every latent site of discrete support instead, enumerated or not --
    ``discrete_log_likelihood``'s model and proposal, whose importance weight p(z) / q(z) at a data
    point masked out then averages 1, as the sum gives (the host's mask made it 1 / q(z): log K at
    a uniform proposal, in both the per-element and the joint bound)."""

    def __init__(self, fn=None, drawn=False):
        self.drawn = drawn
        super().__init__(fn)

    def _summed(self, msg):
        if self.drawn:
            return getattr(msg["fn"], "has_enumerate_support", False)
        return (msg["infer"] or {}).get("enumerate") == "parallel"

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["is_observed"] or not self._summed(msg):
            return
        base, wrappers = unwrap(msg["fn"])
        msg["fn"] = rewrap(base, [(method, argument) for method, argument in wrappers if method != "mask"])


class CommonScale(Messenger):
    """Takes the scale (``handlers.scale``) off the sites whose densities the exact helpers sum or
    draw over -- the observed sites and the discrete ones -- and keeps it in ``scale`` (None: none):
    a scale weighs the log joint, it does not temper it. Pyro's ``TraceEnum_ELBO`` sums the enumerated
    sites out of the unscaled factors and scales the result; funsor's ``log_density`` scales each factor
    first (sum_n log sum_z p(x_n, z)^s, not s log p(x)) and ``infer_discrete`` then draws from
    p(z | x)^s normalized. Two different scales there are refused, as Pyro refuses them for enumerated
    sites (a ModelError); so is a traced or per-element one. Sites held by ``given`` are left alone.
    ``every_site``: ``discrete_log_likelihood``'s, over every sample site of a model or a guide whose
    importance weights it averages: the bound of a model scaled by s is s L_m, which rises to
    s log p(x) as m grows, not log E[w^s], which exceeded it."""

    def __init__(self, fn, given=None, every_site=False):
        self.given = set(given or ())
        self.every_site = every_site  # discrete_log_likelihood's: every site of the model and the guide
        self.ledger = ScaleLedger()
        super().__init__(fn)

    @property
    def scale(self):
        """The common scale (None: none)."""
        return self.ledger.scale

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["name"] in self.given:
            return
        if not (self.every_site or msg["is_observed"] or getattr(msg["fn"], "has_enumerate_support", False)):
            return  # a continuous latent: held by the caller (given, a posterior sample), never summed
        scale = msg.get("scale")
        if scale is not None and (isinstance(scale, jax.core.Tracer) or np.shape(scale) != ()):
            raise messages.per_element_scale(msg["name"], traced=isinstance(scale, jax.core.Tracer))
        self.ledger.record(msg["name"], scale)
        msg["scale"] = None


class HeldAsObserved(Messenger):
    """Wraps the user's model, innermost of the library's handlers: a latent sample site that reaches
    it with a value already set by a handler inside the model (``handlers.substitute``,
    ``handlers.replay`` of a partial trace) is held there, and is treated as observed, as
    ``handlers.condition`` would make it: scored at that value, neither enumerated (the exact helpers
    summed it out as if it were free) nor taken for a draw from its prior (whose log density cancels
    in an importance weight: a held model-only latent lost log p(value | parameters) and its
    gradient). Values set by ``discrete(mode="argmax")`` are the mode's own, a ``scan``'s stacked
    site holds its body's draws, and an enumeration's values (``done``: scan's first steps, enumerated
    inside it) are its support: all stay latent."""

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["is_observed"] or msg["value"] is None:
            return
        if (msg["infer"] or {}).get(ARGMAX_VALUE) or msg.get("_control_flow_done") or msg.get("done"):
            return  # the mode's values; scan's stacked sites; an enumeration's (scan's "_PREV_" steps)
        msg["is_observed"] = True


def held_as_observed(fn):
    return HeldAsObserved(fn)


def with_given(fn, given):
    return fn if not given else _GivenMessenger(fn, given)


def sample_sites(trace):
    return [site for site in trace.values() if site["type"] == "sample"]


def max_plate_nesting(trace):
    dims = [-f.dim for site in sample_sites(trace) for f in site["cond_indep_stack"] if f.dim is not None]
    return max(dims, default=0)


def check_given(trace, given):
    messages.check_given(given, [site["name"] for site in sample_sites(trace)])


def check_all_latents_discrete(trace):
    for site in sample_sites(trace):
        if not site["is_observed"] and not getattr(site["fn"], "has_enumerate_support", False):
            raise messages.not_enumerable(site["name"], type(unwrap(site["fn"])[0]).__name__)
        if not site["is_observed"] and (site["infer"] or {}).get("enumerate") == "sequential":
            raise messages.sequential_enumeration(site["name"])
        if not site["is_observed"] and clamped_probability(base := unwrap(site["fn"])[0]):
            raise messages.clamped_probability(site["name"], type(base).__name__)


def check_masked_latents_unread(model, args, kwargs):
    """A latent site masked out where an unmasked site reads its value raises
    (:func:`concrete_common.messages.masked_latent_read`): the helpers sum a masked-out latent with
    its prior masses, the host weighs each value 1, and only where nothing unmasked reads it (a data
    point masked out with its children) are the two one model. Read off the enumerated trace, masks
    kept: a site reads the latent where its log density varies along the latent's enumeration
    dimension. Under ``jit`` the densities cannot be read: not checked (``scan``'s sites neither)."""
    from numpyro.contrib.funsor import config_enumerate, enum

    from .handlers import discrete

    drawn = trace(discrete(model, mode="sample"), jax.random.PRNGKey(0), args, kwargs)  # nothing masked out: nothing to check
    if not any(_masked_out(site) is not None for site in sample_sites(drawn) if not site["is_observed"] and getattr(site["fn"], "has_enumerate_support", False)):
        return
    nesting = max_plate_nesting(drawn)
    messenger = discrete(model, mode="enumerate")
    messenger.masks_kept = True
    try:
        traced = trace(enum(config_enumerate(messenger), -1 - nesting), jax.random.PRNGKey(0), args, kwargs)
    except (ValueError, NotImplementedError):  # not enumerable (a discrete_log_likelihood's .to_event() site): what is drawn is not summed
        return
    sites = [site for site in sample_sites(traced) if not site.get("_control_flow_done") and not site["name"].startswith("_PREV_")]
    for site in sites:
        out = _masked_out(site)
        if site["is_observed"] or (site["infer"] or {}).get("enumerate") != "parallel" or out is None:
            continue
        dim = -jnp.ndim(site["value"])
        if any(other is not site and (other["infer"] or {}).get("enumerate") == "parallel" and -jnp.ndim(other["value"]) == dim for other in sites):
            continue  # its dimension reused by another site (markov): which site a density varies with cannot be told
        # the plates only: the enumeration dimensions of the site's parents (left of them) masked anywhere
        out = jnp.any(jnp.reshape(out, (-1,) + jnp.shape(out)[jnp.ndim(out) - nesting :]), 0) if jnp.ndim(out) > nesting else out
        for reader in sites:
            log_prob = reader["fn"].log_prob(reader["value"])
            if reader is site or jnp.ndim(log_prob) < -dim or jnp.shape(log_prob)[dim] == 1:
                continue
            varies = log_prob != jax.lax.index_in_dim(log_prob, 0, dim, keepdims=True)  # changes with the latent's value
            varies = jnp.any(jnp.reshape(varies, (-1,) + jnp.shape(varies)[jnp.ndim(varies) - jnp.ndim(out) :]), 0) if jnp.ndim(out) else jnp.any(varies)
            for d in range(jnp.ndim(out)):  # plates the reader is in and the latent is not
                if jnp.shape(out)[d] == 1 and jnp.shape(varies)[d] > 1:
                    varies = jnp.any(varies, d, keepdims=True)
            if _read(lambda: jnp.any(varies & out), False):
                raise messages.masked_latent_read(site["name"], reader["name"])


def _masked_out(site):
    """Where a site is masked out (its batch shape; None: nowhere or where it cannot be read)."""
    masks = [argument for method, argument in unwrap(site["fn"])[1] if method == "mask" and argument is not True]
    if not masks or any(isinstance(mask, jax.core.Tracer) for mask in masks):
        return None
    kept = masks[0]
    for mask in masks[1:]:
        kept = kept & mask
    batch_shape = site["fn"].batch_shape
    if jnp.ndim(kept) > len(batch_shape) or _read(lambda: jnp.all(kept), True):
        return None
    return ~jnp.broadcast_to(kept, batch_shape)


def check_full_data(trace):
    """The helpers evaluate the whole data set: a subsampled plate, whose sites would be a random
    subsample scaled up to the plate's size, raises."""
    for site in trace.values():
        if site["type"] == "plate" and site["value"] is not None:
            messages.check_full_plate(site["name"], len(site["value"]), site["args"][0])


class Elementwise(dist.Distribution):
    """Stands in for a site's base distribution under the site's own wrappers (``rewrap``): its
    ``log_prob`` is ``fn(value)``, one number per element of the base's batch, which the wrappers
    then expand (a plate), mask and sum over event dimensions as they do a density -- so that a
    per-element quantity is weighed as the site's density would be."""

    arg_constraints: dict = {}

    def __init__(self, base, fn):
        self.base, self.fn = base, fn
        super().__init__(batch_shape=base.batch_shape, event_shape=base.event_shape, validate_args=False)

    @property
    def support(self):
        return self.base.support

    def log_prob(self, value, intermediates=None):
        return self.fn(value)


def weighed(site, fn):
    """``fn`` of the site's value, per element of the site's base, weighed as the site's density:
    the plates' expansion, the masks (``.mask``, ``handlers.mask``), the events' sums and the scale."""
    base, wrappers = unwrap(site["fn"])
    stand_in = rewrap(Elementwise(base, fn), wrappers)
    return stand_in.log_prob(site["value"]) * (1.0 if site["scale"] is None else site["scale"])


def boundary_points(base, value):
    """Per element of ``base``'s batch, whether ``value`` holds a point of the boundary of its
    support, where the density is only a limit: a coordinate 0 (Concrete), 0 or 1 (BinConcrete),
    -inf (ExpConcrete), +-inf (LogitBinConcrete); Hard Concrete's ends are its point masses, not
    a boundary."""
    value = jnp.asarray(value)  # a held value may be a Python number (handlers.substitute)
    if isinstance(base, Concrete):
        return jnp.any(value == 0, -1)
    if isinstance(base, ExpConcrete):
        return jnp.any(value == -jnp.inf, -1)
    if isinstance(base, BinConcrete):
        return (value == 0) | (value == 1)
    if isinstance(base, LogitBinConcrete):
        return jnp.isinf(value)
    return jnp.zeros(jnp.shape(value)[: jnp.ndim(value) - len(base.event_shape)], bool)


def check_observed_densities(trace):
    """An observed Concrete-family site at a point of its support's boundary (a relaxed site
    conditioned on a one-hot or 0/1 value: discrete data) would be scored by its density's limit
    there -- +inf for every assignment (decoded under ``jit`` that was an argmax of ties, index 0,
    with no error), or a finite number or -inf that is the density of no relaxed sample and not the
    discrete data's probability: it raises, whatever the temperature and whether or not validation
    is on, from inside ``jit`` by a callback (eagerly, under validation, its ``log_prob`` raises
    first). Elements masked out are left alone; sites held by ``given`` are masked out, density 0."""
    for site in sample_sites(trace):
        base = unwrap(site["fn"])[0]
        if site["is_observed"] and isinstance(base, CONCRETE_FAMILY):
            error = messages.observed_at_boundary(site["name"], type(base).__name__)
            on_boundary = jnp.any(weighed(site, lambda value, base=base: boundary_points(base, value).astype(jnp.result_type(float))) > 0)
            callback_if(on_boundary, lambda flag, error=error: raise_if(bool(np.any(flag)), error), on_boundary)


def callback_if(flag, fn, *args):
    """``jax.debug.callback(fn, *args)``, made only where ``flag`` (a traced boolean) is true: the
    host call is most of a small model's compiled step, and a check's usual answer needs none.
    ``fn`` decides again from its arguments (under ``vmap`` both branches of the ``cond`` run)."""
    if not isinstance(flag, jax.core.Tracer):  # eagerly: the call itself, its error the caller's
        if bool(jnp.any(flag)):
            fn(*args)
        return
    jax.lax.cond(jnp.any(flag), lambda args: jax.debug.callback(fn, *args), lambda args: None, args)


def raise_if(flag, error):
    """Raise ``error`` if ``flag``: from a ``jax.debug.callback`` inside compiled code, whose caller
    receives a JaxRuntimeError (:func:`reraise_from_callbacks` gives it the error back)."""
    if flag:
        RAISED_IN_CALLBACKS.append(error)
        raise error


# the errors a callback raised inside compiled code, which reach the caller as a JaxRuntimeError
RAISED_IN_CALLBACKS: list = []


class _RefusalsReraised(logging.Filter):
    """Drops JAX's log of a callback's exception where it is one of ours (:func:`raise_if`): the
    helper raises it again to its caller, named (:func:`reraise_from_callbacks`), and JAX's
    traceback on stderr before it ("jax.debug.callback failed") said nothing more."""

    def filter(self, record):
        error = record.exc_info[1] if record.exc_info else None
        return not any(error is raised for raised in RAISED_IN_CALLBACKS)


logging.getLogger("jax._src.debugging").addFilter(_RefusalsReraised())


def reraise_from_callbacks(error):
    """Raise the ModelError that a callback raised inside the compiled code ``error`` (a
    JaxRuntimeError) came from, so that the helper names it as eager code would; else ``error``."""
    if RAISED_IN_CALLBACKS:
        raised = RAISED_IN_CALLBACKS.pop()
        RAISED_IN_CALLBACKS.clear()
        raise raised from None
    raise error


def _scanned_sites(trace):
    """The latent sites drawn inside ``numpyro.contrib.control_flow.scan``."""
    return [site for site in sample_sites(trace) if site.get("_control_flow_done") and not site["is_observed"]]


def check_scan(model, args, kwargs, *, decodes=False):
    """``scan`` bodies run with their own handlers: a Concrete-family site there cannot be swapped for
    its limit; and for the host's own discrete sites there NumPyro's ``TraceEnum_ELBO`` gives a wrong
    value and ``infer_discrete`` none (``decodes``: the caller decodes). Raises for what is not
    evaluated exactly; returns whether the model scans."""
    scanned = _scanned_sites(trace(model, jax.random.PRNGKey(0), args, kwargs))
    for site in scanned:
        base = unwrap(site["fn"])[0]
        relaxed = isinstance(base, CONCRETE_FAMILY)
        if relaxed:
            raise messages.scanned_site(site["name"], type(base).__name__)
        if decodes:
            raise messages.scanned_site(site["name"], type(base).__name__, "where NumPyro cannot decode it")
    return bool(scanned)


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
        return [part for member in guide._guides for part in _autoguide_parts(member)]
    return [guide]


def _joint_latent_layouts(guide):
    """{auxiliary site name: {model site name: its coordinates in the joint latent}} for the
    autoguides in ``guide`` that draw every latent site from one auxiliary vector (the
    ``AutoContinuous`` family: AutoDiagonalNormal, AutoMultivariateNormal, ...), read off their
    own unpacking of the vector; empty for the others. The guide must have run once."""
    layouts = {}
    for part in _autoguide_parts(guide):
        if isinstance(part, AutoContinuous) and part.prototype_trace is not None:
            with jax.ensure_compile_time_eval():  # concrete under jit and vmap too
                unpacked = part._unpack_latent(np.arange(part.latent_dim, dtype=np.float32))
                layouts[f"_{part.prefix}_latent"] = {
                    name: np.asarray(value).reshape(-1).round().astype(int) for name, value in unpacked.items()
                }
    return layouts


def _marginal_log_prob(joint, value, keep):
    """The log density, at ``value``, of the coordinates ``keep`` (a boolean mask over the last
    dimension) of ``joint``, the rest integrated out: closed form for a diagonal Normal (the
    product over the kept coordinates), a (low-rank) multivariate Normal (the Normal with the
    kept rows and columns of the covariance) and a batch of them flattened into one vector
    (AutoBatchedMultivariateNormal: the sum over the rows);
    None for any other distribution."""
    if isinstance(joint, dist.Independent) and isinstance(joint.base_dist, dist.Normal):
        if joint.reinterpreted_batch_ndims == 1:
            return jnp.where(keep, joint.base_dist.log_prob(value), 0.0).sum(-1)
    elif isinstance(joint, dist.Normal):  # coordinates along the last batch dimension
        return jnp.where(keep, joint.log_prob(value), 0.0)
    elif isinstance(joint, (dist.MultivariateNormal, dist.LowRankMultivariateNormal)):
        index = np.flatnonzero(keep)
        covariance = joint.covariance_matrix[..., index, :][..., index]
        return dist.MultivariateNormal(joint.loc[..., index], covariance_matrix=covariance).log_prob(value[..., index])
    elif _is_flattened_batch(joint):  # AutoBatched(LowRank)MultivariateNormal
        # the latent vector cut into independent rows (not a plate's elements: rows of consecutive
        # coordinates, so one row may hold one site's and another another's): per row, the marginal
        # of the coordinates it keeps, rows keeping alike computed together
        rows = joint.base_dist  # Independent(a batch of multivariate Normals): the rows as its event
        shape = tuple(rows.event_shape)
        row_keep = np.reshape(keep, shape)
        row_values = jnp.reshape(value, jnp.shape(value)[:-1] + shape)
        total = 0.0
        for pattern in np.unique(row_keep.reshape(-1, shape[-1]), axis=0):
            if not pattern.any():
                continue
            log_prob = _marginal_log_prob(rows.base_dist, row_values, pattern)
            if log_prob is None:
                return None
            chosen = (row_keep == pattern).all(-1)
            total = total + jnp.where(chosen, log_prob, 0.0).sum(tuple(range(-len(shape) + 1, 0)))
        return total
    return None


def _is_flattened_batch(joint):
    """A batch of vectors, reinterpreted as one event and flattened into one vector by a reshape."""
    return (
        isinstance(joint, dist.TransformedDistribution)
        and len(joint.transforms) == 1
        and isinstance(joint.transforms[0], dist.transforms.ReshapeTransform)
        and isinstance(joint.base_dist, dist.Independent)
        and len(joint.base_dist.event_shape) == 2
        and len(joint.base_dist.base_dist.batch_shape) >= 1
    )


class _Marginal(dist.Distribution):
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

    def sample(self, key, sample_shape=()):
        return self.joint.sample(key, sample_shape)

    def log_prob(self, value):
        return _marginal_log_prob(self.joint, value, self.keep)


class _MarginalMessenger(Messenger):
    """Scores the auxiliary sites in ``marginals`` (name -> boolean mask of the coordinates kept)
    by their marginal density (:class:`_Marginal`)."""

    def __init__(self, fn, marginals):
        self.marginals = marginals
        super().__init__(fn)

    def process_message(self, msg):
        keep = self.marginals.get(msg["name"]) if msg["type"] == "sample" else None
        if keep is not None and not isinstance(msg["fn"], _Marginal):
            msg["fn"] = _Marginal(msg["fn"], keep)


def marginalize(guide, marginals):
    return _MarginalMessenger(guide, marginals) if marginals else guide


def proposal(model, guide, key, args, kwargs, autoguide=None, given=None):
    """Which guide sites to discretize, which to hide and which to marginalize for the discrete
    graph's proposal: the rules of ``concrete_common.discrete_proposal.sort_guide_sites``, on this
    guide's sites. An autoguide's auxiliary site is attributed to the model sites it feeds --
    ``{name}_unconstrained`` (AutoNormal) to ``name``; the joint latent of an ``AutoContinuous``
    autoguide (``autoguide``, or a part of an ``AutoGuideList``) to every site, by its coordinates;
    one that feeds kept and hidden sites alike is still drawn whole, but scored by the marginal
    density of the coordinates of the sites kept (:func:`_marginal_log_prob`; a joint without a
    closed-form marginal raises).

    :returns: (discretized names, hidden names, {auxiliary name: boolean mask of the coordinates
        kept}, {name: value} of the guide's sites the model holds).
    """
    model_trace, guide_trace = replayed_traces(model, guide, key, args, kwargs)
    for traced in (guide_trace, model_trace):
        check_full_data(traced)
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
        keep = np.zeros(jnp.shape(value)[-1], dtype=bool)
        for site in kept:
            keep[layouts[name][site]] = True
        if _marginal_log_prob(joint, value, keep) is None:
            raise discrete_proposal.no_closed_form_marginal(name, fed_hidden, kept, type(joint).__name__, "handlers.block")
        marginals[name] = keep
    return discretized, hidden, marginals, held_values


# ----------------------------------------------------------------------------- importance weights


def replayed_traces(model, guide, key, args, kwargs):
    """(model trace, guide trace), unscored: the guide traced and the model replayed against it, each
    seeded with its half of ``key`` -- which sites there are, not their densities (an eager value
    carries no log coordinates, so scoring it here could meet an underflowed one)."""
    guide_key, model_key = jax.random.split(key)
    guide_trace = trace(guide, guide_key, args, kwargs)
    return handlers.trace(handlers.replay(handlers.seed(held_as_observed(model), model_key), trace=guide_trace)).get_trace(*args, **kwargs), guide_trace


def replayed_model_trace(model, guide_trace, key, args, kwargs):
    """The model, seeded with ``key``, replayed against a given guide trace, every sample site
    scored (the model side of ``get_importance_trace``, for a guide trace made otherwise)."""
    trace = handlers.trace(handlers.replay(handlers.seed(held_as_observed(model), key), trace=guide_trace)).get_trace(*args, **kwargs)
    for site in sample_sites(trace):
        log_prob = site["fn"].log_prob(site["value"], site["intermediates"]) if site["intermediates"] else site["fn"].log_prob(site["value"])
        site["log_prob"] = log_prob if site["scale"] is None else site["scale"] * log_prob
    return trace


def importance_traces(model, guide, key, args, kwargs):
    """(model trace, guide trace) with every site's log_prob: the guide traced and the model replayed
    against it, by the host's ``get_importance_trace``, each seeded with its half of ``key``."""
    guide_key, model_key = jax.random.split(key)
    return get_importance_trace(handlers.seed(held_as_observed(model), model_key), handlers.seed(guide, guide_key), args, kwargs, {})


def per_element(log_prob, site, plate):
    """A site's log_prob summed to a scalar, or to one value per element of ``plate``."""
    if plate is None:
        return jnp.sum(log_prob)
    frames = [f for f in site["cond_indep_stack"] if f.name == plate]
    if not frames:
        raise messages.outside_plate(site["name"], plate)
    log_prob = jnp.reshape(log_prob, (1,) * max(-frames[0].dim - jnp.ndim(log_prob), 0) + jnp.shape(log_prob))
    keep = jnp.ndim(log_prob) + frames[0].dim
    return jnp.sum(log_prob, axis=tuple(d for d in range(jnp.ndim(log_prob)) if d != keep))


def score_log_prob(site):
    """The log density of the distribution a site's value was drawn from, neither scaled nor masked:
    what a score-function term differentiates. A scale (a subsampled plate, ``handlers.scale``) or a
    mask weighs the site's terms in the objective, not the draw (Pyro's ``ScoreParts.scale_and_mask``
    leaves the score function alone for the same reason)."""
    base, wrappers = unwrap(site["fn"])
    masked = any(method == "mask" for method, _ in wrappers)
    if not masked and (site["scale"] is None or is_identically_one(site["scale"])):
        return site["log_prob"]  # the host's own, unscaled: the same computation, not a second one
    fn = rewrap(base, [(method, argument) for method, argument in wrappers if method != "mask"])
    return fn.log_prob(site["value"], site["intermediates"]) if site["intermediates"] else fn.log_prob(site["value"])


def score_function_sites(model_trace, guide_trace):
    """The latent sites whose draws need a score-function term: the guide's without a reparameterized
    sampler, and the model's that the guide does not draw (their prior is their proposal) without one."""
    guide_latents = [site for site in sample_sites(guide_trace) if not site["is_observed"]]
    return [site for site in guide_latents + model_only_latents(model_trace, guide_trace) if not site["fn"].has_rsample]


def model_only_latents(model_trace, guide_trace):
    """The latent sites of the model that the guide does not draw."""
    proposed = {site["name"] for site in sample_sites(guide_trace)}
    return [site for site in sample_sites(model_trace) if not site["is_observed"] and site["name"] not in proposed]


def _subsample_scales(site, trace):
    """{plate name: size / subsample size} of the subsampled plates around ``site`` (the frames hold
    the subsample size, the plate's own site in ``trace`` its size)."""
    scales = {}
    for frame in site["cond_indep_stack"]:
        plate_site = trace.get(frame.name)
        if plate_site is not None and plate_site["type"] == "plate" and frame.size != plate_site["args"][0]:  # more indices than elements: scaled down
            scales[frame.name] = plate_site["args"][0] / frame.size
    return scales


def subsampled_plates(traces):
    """{plate name: size / subsample size} of the subsampled plates around the traces' sites."""
    subsampled = {}
    for traced in traces:
        for site in sample_sites(traced):
            subsampled.update(_subsample_scales(site, traced))
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
    frames = [f for f in site["cond_indep_stack"] if f.name == plate]
    if not frames:
        raise messages.outside_plate(site["name"], plate)
    return jnp.reshape(values, jnp.shape(values) + (1,) * (-frames[0].dim - 1))


def shifted_log_weights(w):
    """Log weights (particles first) less their largest, where that is finite: the quantities VIMCO
    takes differences of are then of the size of their spread, not of the weights' (float32's spacing
    at 1e4 is 1e-3: at log weights of -1e4 that error was the size of a particle's signal at m = 1000)."""
    top = w.max(0, keepdims=True)
    return w - jnp.where(jnp.isfinite(top), top, 0.0)


def log_weights(model_trace, guide_trace, plate, *, globals_given=False):
    """log p(x, z) - log q(z) of one particle: a scalar, or one per element of ``plate``.

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
    for traced, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for site in sample_sites(traced):
            if sign > 0 and not site["is_observed"] and site["name"] not in proposed:
                continue
            if globals_given and plate is not None and not any(f.name == plate for f in site["cond_indep_stack"]):
                if site["is_observed"]:
                    continue
                raise messages.global_latent(site["name"], plate)
            total = total + sign * per_element(site["log_prob"], site, plate)
    return total


def same_subsample(model, guide, rng_key, num_particles):
    """(model, guide, key for the particles): m > 1 particles drawn with keys of their own would each
    draw their own subsample of a subsampled plate, and an element's bound would average particles of
    other elements; the plates are seeded with one key for all (as NumPyro's ``RenyiELBO`` does). A
    plate that does not subsample takes no key, so nothing else changes."""
    if num_particles == 1:
        return model, guide, rng_key
    plate_key = jax.random.fold_in(rng_key, 0x5EED)  # beside the particles' keys, which stay as they were
    hide = ["sample", "prng_key", "control_flow"]
    return handlers.seed(model, plate_key, hide_types=hide), handlers.seed(guide, plate_key, hide_types=hide), rng_key


def importance_bound(model, guide, rng_key, args, kwargs, *, num_particles, plate, globals_given=False, check=None):
    """log (1/m) sum_i p(x, z_i) / q(z_i), z_i from the guide, the m particles drawn in parallel
    (``vmap``): a scalar, or one bound per element of ``plate`` (of a subsampled plate, scaled to its
    size: :func:`plate_subsampling`). ``globals_given``: the discrete graph's bound, with globals
    conditioned (see :func:`log_weights`); ``check``, if given, is called with the (model, guide)
    traces first."""
    num_particles = messages.check_num_particles(num_particles)
    scales = []  # s, read off the traces while vmap traces them (static)
    model, guide, rng_key = same_subsample(model, guide, rng_key, num_particles)

    def log_weight(particle_key):
        model_trace, guide_trace = importance_traces(model, guide, particle_key, args, kwargs)
        if check is not None:
            check(model_trace, guide_trace)
        scales.append(plate_subsampling((model_trace, guide_trace), plate, num_particles))
        return log_weights(model_trace, guide_trace, plate, globals_given=globals_given)

    drawn = jax.vmap(log_weight)(jax.random.split(rng_key, num_particles))
    scale = scales[0]
    if scale == 1.0:
        return logsumexp(drawn, axis=0) - math.log(num_particles)
    return scale * (logsumexp(drawn / scale, axis=0) - math.log(num_particles))
