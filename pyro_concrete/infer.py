"""Evaluating the discrete graph of a model trained with Concrete relaxations (paper section 3.3).

The helpers put the handlers in the right order themselves: the swap to discrete sites innermost
(around the model and guide, with ``block`` inside it), enumeration and tracing outside.
"""

import math
import warnings
import weakref

import pyro
import torch
from pyro import poutine
from pyro.distributions import LowRankMultivariateNormal, MultivariateNormal, Normal, TorchDistribution
from pyro.infer import ELBO, TraceEnum_ELBO, config_enumerate, infer_discrete
from pyro.infer.autoguide import AutoContinuous, AutoGuideList
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger

from concrete_common import messages

from .handlers import CONCRETE_FAMILY, DiscreteMessenger, discrete, unwrap

__all__ = [
    "marginal_log_likelihood",
    "map_assignment",
    "sample_assignment",
    "Predictive",
    "discrete_log_likelihood",
    "ImportanceWeightedELBO",
    "VIMCO",
    "JitImportanceWeightedELBO",
    "JitVIMCO",
]


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


def _with_params(fn, params):
    """``fn`` with its param sites taken from ``params`` -- one dict for model and guide, as
    ``pyro.get_param_store()`` or NumPyro's ``svi.get_params`` give (the names a function does not
    use are expected, so Pyro's warning about them is silenced). A ``PyroModule``'s plain
    ``nn.Parameter`` attributes named in ``params`` are swapped in for the call
    (``torch.func.functional_call``; see :func:`_module_overrides`)."""
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
            msg["value"] = _as_value_of(self.given[msg["name"]], msg["fn"])
            msg["is_observed"] = True
            msg["mask"] = False


def _as_value_of(value, fn):
    """``value`` as a tensor of the site's dtype (that of its mean, or of its logits)."""
    if isinstance(value, torch.Tensor):
        return value
    for attribute in ("mean", "logits"):
        try:
            return torch.as_tensor(value, dtype=getattr(fn, attribute).dtype)
        except (AttributeError, NotImplementedError):
            pass
    return torch.as_tensor(value, dtype=torch.get_default_dtype())


def _with_given(fn, given):
    return fn if not given else _GivenMessenger(given)(fn)


def _check_given(trace, given, helper):
    messages.check_given(helper, given, [site["name"] for site in _sample_sites(trace)])


def _sample_sites(trace):
    return [
        site
        for site in trace.nodes.values()
        if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"
    ]


def _max_plate_nesting(trace):
    dims = [-f.dim for site in _sample_sites(trace) for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None]
    return max(dims, default=0)


def _check_all_latents_discrete(trace, helper):
    for site in _sample_sites(trace):
        if site["is_observed"]:
            continue
        if not getattr(site["fn"], "has_enumerate_support", False):
            raise ValueError(messages.not_enumerable_message(helper, site["name"], type(unwrap(site["fn"])[0]).__name__))


def _check_full_data(trace, helper):
    """The helpers evaluate the whole data set: a subsampled plate, whose sites would be a random
    subsample scaled up to the plate's size, raises."""
    for site in trace.nodes.values():
        if site["type"] == "sample" and type(site["fn"]).__name__ == "_Subsample" and site["value"] is not None:
            messages.check_full_plate(helper, site["name"], len(site["value"]), site["fn"].size)


def _no_guide(*args, **kwargs):
    pass


def marginal_log_likelihood(model, *args, params=None, given=None, **kwargs):
    """log p(observations) of the model's discrete graph, exactly: every Concrete-family site is
    replaced by its zero-temperature limit and summed out by ``TraceEnum_ELBO``. Evaluates the whole
    data set: a subsampled plate raises a ValueError.

    :param model: a model whose latent sites are all Concrete-family or enumerable, or in ``given``.
    :param given: optional dict from latent site name to a value: those sites are held at the values
        and left out of the log joint, so the result is log p(observations | given) (e.g. the
        continuous globals at their posterior point estimates). ``params`` substitutes parameters;
        ``given`` conditions latent sites.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a scalar tensor, differentiable with respect to the parameters.
    """
    model = _with_given(_with_params(model, params), given)
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(discrete(model, mode="enumerate")).get_trace(*args, **kwargs)
    _check_given(trace, given, "marginal_log_likelihood")
    _check_all_latents_discrete(trace, "marginal_log_likelihood")
    _check_full_data(trace, "marginal_log_likelihood")
    elbo = TraceEnum_ELBO(max_plate_nesting=_max_plate_nesting(trace))
    enumerated = config_enumerate(discrete(model, mode="enumerate"))  # the model's own discrete sites too
    try:
        return -elbo.differentiable_loss(enumerated, _no_guide, *args, **kwargs)
    except ValueError as error:  # raised when no parameter requires a gradient
        if "cannot be differentiated" not in str(error):
            raise
        return torch.tensor(-elbo.loss(enumerated, _no_guide, *args, **kwargs), dtype=torch.float64)


def map_assignment(model, *args, params=None, given=None, **kwargs):
    """The jointly most probable values of the Concrete-family latent sites under the discrete
    graph, given the observations (``infer_discrete`` with ``temperature=0``), for the whole data
    set: a subsampled plate raises a ValueError.

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :returns: dict from site name to its value in the site's own sample space (one-hot vectors for
        Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, ±inf for LogitBinConcrete).
    """
    return _assignment(model, args, kwargs, params, given, 0, "map_assignment")


def sample_assignment(model, *args, params=None, given=None, **kwargs):
    """One draw of the Concrete-family latent sites from their exact posterior under the discrete
    graph, given the observations and ``given`` (``infer_discrete`` with ``temperature=1``), for the
    whole data set: a subsampled plate raises a ValueError. Posterior predictive draws of the
    discrete sites: one call per draw of the continuous globals, passed in ``given`` (not
    ``Predictive`` over ``infer_discrete``, whose enumeration pass does not see the guide's values).

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :returns: dict from site name to its value in the site's own sample space, as
        :func:`map_assignment`.
    """
    return _assignment(model, args, kwargs, params, given, 1, "sample_assignment")


def _is_relaxed_sample(msg):
    return msg["type"] == "sample" and isinstance(unwrap(msg["fn"])[0], CONCRETE_FAMILY)


class Predictive(pyro.infer.Predictive):
    """``pyro.infer.Predictive`` for models with Concrete-family sites; the same arguments. With
    ``infer_discrete=True`` it draws from the model's *discrete graph*: every Concrete-family site
    is drawn from its exact posterior (enumerated, given the observations and the other latents drawn
    from ``guide`` or taken from ``posterior_samples``) and returned in the site's own sample space
    (one-hot vectors for Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, +-inf for
    LogitBinConcrete), not as the enumerated index. The guide's Concrete-family sites are hidden
    (the discrete draws do not start from the guide's relaxed ones). Without ``infer_discrete``,
    ``pyro.infer.Predictive`` as it is.

    (Pyro's own ``Predictive`` around ``infer_discrete`` draws the discrete sites given globals from
    the prior, not the guide's; here each draw is :func:`sample_assignment` given that draw's other
    latents, one draw at a time.)
    """

    def __init__(self, model, posterior_samples=None, guide=None, num_samples=None, return_sites=(), parallel=False, *,
                 infer_discrete=False):
        if infer_discrete and guide is not None:
            guide = poutine.block(guide, hide_fn=_is_relaxed_sample)
        super().__init__(model, posterior_samples, guide, num_samples, return_sites, parallel)
        self.infer_discrete = infer_discrete

    def forward(self, *args, **kwargs):
        if not self.infer_discrete:
            return super().forward(*args, **kwargs)
        posterior = self.posterior_samples
        if self.guide is not None:
            guide_draws = pyro.infer.Predictive(self.guide, posterior, num_samples=self.num_samples, parallel=self.parallel)
            posterior = {**posterior, **guide_draws(*args, **kwargs)}
        draws = [self._draw({name: value[i] for name, value in posterior.items()}, args, kwargs) for i in range(self.num_samples)]
        return {name: torch.stack([draw[name] for draw in draws]) for name in draws[0]}

    def _draw(self, given, args, kwargs):
        """One draw: the Concrete-family sites from their exact posterior given ``given``, then the
        model's other sites given both (as ``pyro.infer.Predictive`` picks its sites)."""
        assignment = sample_assignment(self.model, *args, given=given, **kwargs)
        with torch.no_grad():
            trace = poutine.trace(poutine.condition(discrete(self.model, mode="sample"), data={**given, **assignment})).get_trace(*args, **kwargs)
        if self.return_sites:
            names = self.return_sites
        else:
            names = [site["name"] for site in _sample_sites(trace) if self.guide is not None or site["name"] not in given]
        return {name: trace.nodes[name]["value"] for name in names}


def _assignment(model, args, kwargs, params, given, temperature, helper):
    model = _with_given(_with_params(model, params), given)
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(discrete(model, mode="enumerate")).get_trace(*args, **kwargs)
        _check_given(trace, given, helper)
        _check_all_latents_discrete(trace, helper)
        _check_full_data(trace, helper)
        swap = DiscreteMessenger(mode="enumerate")
        decoded = infer_discrete(
            config_enumerate(swap(model)), first_available_dim=-1 - _max_plate_nesting(trace), temperature=temperature
        )
        trace = poutine.trace(decoded).get_trace(*args, **kwargs)
    to_value = swap._to_value
    return {
        site["name"]: to_value.get(site["name"], lambda v: v)(site["value"])
        for site in _sample_sites(trace)
        if not site["is_observed"]
    }


def _relaxed_latents(trace):
    return {
        site["name"]
        for site in _sample_sites(trace)
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


def _auxiliary_layouts(guide_sites, model_sites, autoguide):
    """{auxiliary guide site: {model site: its coordinates in the auxiliary value, or None for all}}:
    the joint latents of ``_joint_latent_layouts`` and the per-site ``{name}_unconstrained``
    auxiliary sites (Pyro's AutoNormal)."""
    layouts = {name: layout for name, layout in _joint_latent_layouts(autoguide).items() if name in guide_sites}
    for name, site in guide_sites.items():
        base = name[: -len("_unconstrained")]
        if name.endswith("_unconstrained") and base in model_sites and (site["infer"] or {}).get("is_auxiliary"):
            layouts.setdefault(name, {base: None})
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


def _marginalize(guide, marginals):
    return _MarginalMessenger(marginals)(guide) if marginals else guide


def _proposal(model, guide, args, kwargs, autoguide=None, given=None):
    """Which guide sites to discretize, which to hide and which to marginalize for the discrete
    graph's proposal.

    A model site that is relaxed and drawn in the guide from a Concrete-family distribution is
    discretized there; drawn from anything else (an autoguide's Delta over a transformed Normal),
    it is hidden from the guide so that the model draws it from its discrete prior. An autoguide's
    auxiliary site is attributed to the model sites it feeds -- ``{name}_unconstrained`` (Pyro's
    AutoNormal) to ``name``; the joint latent of an ``AutoContinuous`` autoguide (``autoguide``,
    or a part of an ``AutoGuideList``) to every site, by its coordinates -- and is kept if it feeds
    no hidden site, hidden if it feeds hidden sites only, and otherwise marginalized: still drawn
    whole, but scored by the marginal density of the coordinates of the sites kept
    (:func:`_marginal_log_prob`; a joint without a closed-form marginal raises). Any other guide
    site without a model counterpart could not be attributed, and raises.

    :returns: (discretized names, hidden names, {auxiliary name: boolean mask of the coordinates
        kept}, the model's plate nesting).
    """
    with torch.no_grad(), poutine.block():
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    for trace in (guide_trace, model_trace):
        _check_full_data(trace, "discrete_log_likelihood")
    relaxed = _relaxed_latents(model_trace)
    guide_sites = {site["name"]: site for site in _sample_sites(guide_trace)}
    discretized = {name for name in relaxed if name in guide_sites and isinstance(unwrap(guide_sites[name]["fn"])[0], CONCRETE_FAMILY)}
    hidden = {name for name in relaxed & set(guide_sites) if name not in discretized}
    _check_given(model_trace, given, "discrete_log_likelihood")
    hidden |= set(given or ()) & set(guide_sites)  # held at their values: the guide does not propose them
    model_sites = {site["name"] for site in _sample_sites(model_trace)}
    auxiliary, marginals = _auxiliary_layouts(guide_sites, model_sites, autoguide), {}
    for name, layout in auxiliary.items():
        fed_hidden = hidden & set(layout)
        if not fed_hidden:
            continue
        if fed_hidden == set(layout):
            hidden.add(name)
            continue
        joint, value = guide_sites[name]["fn"], guide_sites[name]["value"]
        keep = torch.zeros(value.shape[-1], dtype=torch.bool)
        for site, coordinates in layout.items():
            if site not in hidden:
                keep[coordinates] = True
        if _marginal_log_prob(joint, value, keep) is None:
            raise ValueError(
                f"discrete_log_likelihood: guide site {name!r} draws the relaxed site(s) {sorted(fed_hidden)} jointly "
                f"with the continuous site(s) {sorted(set(layout) - hidden)} from {type(joint).__name__}, whose "
                "marginal density of the continuous coordinates has no closed form: the relaxed sites cannot be "
                "hidden from it. Use an AutoGuideList with this autoguide over the continuous sites only "
                "(poutine.block(model, hide=[...])) and AutoNormal or a Concrete-family guide for the relaxed ones"
            )
        marginals[name] = keep
    unattributed = set(guide_sites) - model_sites - set(auxiliary) - hidden
    if unattributed:
        raise ValueError(
            f"discrete_log_likelihood: guide site(s) {sorted(unattributed)} have no model counterpart; "
            "the discrete graph's proposal is the guide with its relaxed sites discretized (or hidden, for "
            "an autoguide such as AutoNormal), and these cannot be attributed to a site"
        )
    return discretized, hidden, marginals, _max_plate_nesting(model_trace)


def _per_particle(log_prob, site, particle_dim, plate, caller):
    """A site's log_prob summed to shape (num_particles,) or (num_particles, plate size)."""
    log_prob = log_prob.reshape((1,) * max(-particle_dim - log_prob.dim(), 0) + log_prob.shape)
    keep = {log_prob.dim() + particle_dim}
    if plate is not None:
        frames = [f for f in site["cond_indep_stack"] if f.name == plate]
        if not frames:
            raise ValueError(messages.outside_plate_message(caller, site["name"], plate))
        keep.add(log_prob.dim() + frames[0].dim)
    dims = [d for d in range(log_prob.dim()) if d not in keep]
    return log_prob.sum(dims) if dims else log_prob


def _log_weights(model_trace, guide_trace, particle_dim, plate, caller, given_globals=False):
    """Per-particle log p(x, z) - log q(z): shape (num_particles,) or (num_particles, plate size).

    A latent site the guide does not draw is drawn by the model from its prior, which is then its
    proposal: its log p cancels against its log q and is left out. ``given_globals`` (per-element
    bounds of the discrete graph): observed sites outside ``plate`` condition every element alike and
    are left out, and a latent outside it raises.
    """
    total = 0.0
    proposed = {site["name"] for site in _sample_sites(guide_trace)}
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        trace.compute_log_prob()
        for site in _sample_sites(trace):
            if sign > 0 and not site["is_observed"] and site["name"] not in proposed:
                continue
            if given_globals and plate is not None and not any(f.name == plate for f in site["cond_indep_stack"]):
                if site["is_observed"]:
                    continue
                raise ValueError(messages.global_latent_message(caller, site["name"], plate))
            total = total + sign * _per_particle(site["log_prob"], site, particle_dim, plate, caller)
    return total


def _vectorized_traces(model, guide, args, kwargs, num_particles, max_plate_nesting, caller):
    """(model trace, guide trace, particle dim) of m particles drawn in parallel in a plate left of
    the model's plates (``num_particles=None``: one, without that plate)."""
    particle_dim = -1 - max_plate_nesting

    def vectorized(fn):
        if num_particles is None:  # one particle, as the model is written: no particle plate
            return fn

        def run(*a, **k):
            with pyro.plate(f"_{caller}_particles", num_particles, dim=particle_dim):
                return fn(*a, **k)

        return run

    guide_trace = poutine.trace(vectorized(guide)).get_trace(*args, **kwargs)
    model_trace = poutine.trace(poutine.replay(vectorized(model), trace=guide_trace)).get_trace(*args, **kwargs)
    return model_trace, guide_trace, particle_dim


def _importance_bound(model, guide, args, kwargs, num_particles, plate, max_plate_nesting, caller, given_globals=False):
    """log (1/m) sum_i p(x, z_i) / q(z_i), z_i from the guide, the m particles drawn in parallel in
    a plate left of the model's plates: a scalar, or one bound per element of ``plate``."""
    if not (isinstance(num_particles, int) and num_particles >= 1):
        raise ValueError(f"{caller}: num_particles must be a positive integer, got {num_particles!r}")

    def log_weights(count):
        model_trace, guide_trace, particle_dim = _vectorized_traces(model, guide, args, kwargs, count, max_plate_nesting, caller)
        return _log_weights(model_trace, guide_trace, particle_dim, plate, caller, given_globals)

    if num_particles == 1:  # one particle: the model as written, no particle plate
        return torch.logsumexp(log_weights(None), dim=0)
    try:
        weights = log_weights(num_particles)
    except (RuntimeError, ValueError) as error:
        # a model written for one draw (``z @ locs`` with a batched global ``locs``) may not broadcast
        # over the particle dimension: then one particle at a time (a failure there is the model's own)
        weights = torch.cat([log_weights(None) for _ in range(num_particles)])
        warnings.warn(
            f"{caller}: the model or guide does not broadcast over a leftmost particle dimension "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); drew the {num_particles} particles one "
            "at a time, which is slower (see the docstring)",
            RuntimeWarning,
            stacklevel=3,
        )
    return torch.logsumexp(weights, dim=0) - math.log(num_particles)


def discrete_log_likelihood(model, guide, *args, num_particles=1, plate=None, params=None, given=None, **kwargs):
    """The importance-weighted bound L_m of the discrete graph (paper eq. 8; the paper's test
    metric): log (1/m) sum_i p(x, z_i) / q(z_i), z_i drawn from the guide with its relaxed sites
    discretized, every Concrete-family model site scored with its discrete mass. m = 1 is the ELBO
    of the discrete graph. Evaluates the whole data set: a subsampled plate raises a ValueError.

    The proposal q, site by site (log q is summed over exactly the sites it draws, auxiliary sites
    included, as in any importance-weighted bound):

    - a relaxed site that the guide draws from a Concrete-family distribution: its zero-temperature
      limit, scored with its discrete mass;
    - a relaxed site that the guide draws otherwise (an autoguide's Delta or transformed Normal):
      hidden from the guide, with an auxiliary site that feeds it alone (``{name}_unconstrained``),
      so that the model draws it from its discrete prior, which cancels in the weight;
    - any other latent site (a continuous global): the guide's own distribution, scored with its
      density. With AutoNormal (or any proper density) E[L_m] increases to log p(x) as m grows;
      AutoDelta is a point mass at theta scored 1, and L_m tends to log p(x, theta) =
      log p(x | theta) + log p(theta), the MAP objective (not a bound on log p(x));
    - the joint auxiliary latent ``_{prefix}_latent`` of AutoDiagonalNormal, AutoMultivariateNormal
      or AutoLowRankMultivariateNormal, which holds the unconstrained coordinates of the continuous
      and the relaxed sites alike: drawn whole but scored by the marginal density of the continuous
      sites' coordinates, the relaxed coordinates integrated out (their Delta sites are hidden and
      the model draws the relaxed sites from the prior). The proposal of the continuous sites is
      then the autoguide's marginal, and L_m the bound of a proposal q(theta) p(z). An autoguide
      whose joint has no closed-form marginal (a normalizing flow) raises a ValueError when it
      also draws relaxed sites.

    :param given: optional dict from latent site name to a value: held there in the model, left out
        of the weights, and not proposed by the guide (its auxiliary sites hidden too): bounds of
        log p(x | given).
    :param int num_particles: m, drawn in parallel (a plate left of the model's plates): model and
        guide must broadcast over that leftmost dimension, as for Pyro's ``vectorize_particles``;
        where they raise, the particles are drawn one at a time, with a warning (slower). m = 1
        runs model and guide as written.
    :param str plate: None for one bound of all observations jointly; or the name of a plate that
        holds every latent site (the data plate), for one bound per element of it (each data point
        with its own m particles, as the paper evaluates), returned with that plate's size. Observed
        sites outside the plate (globals conditioned on a value) condition every element alike and are
        left out: the bounds are of log p(x_n | globals). A latent global the guide draws raises.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a tensor: a scalar, or the per-element bounds along ``plate``.
    """
    autoguide = guide
    model, guide = _with_given(_with_params(model, params), given), _with_params(guide, params)
    discretized, hidden, marginals, max_plate_nesting = _proposal(model, guide, args, kwargs, autoguide, given)
    guide = _marginalize(guide, marginals)
    guide_d = discrete(poutine.block(guide, hide=list(hidden)), mode="sample", sites=discretized)
    model_d = discrete(model, mode="sample")
    with torch.no_grad():
        return _importance_bound(
            model_d, guide_d, args, kwargs, num_particles, plate, max_plate_nesting, "discrete_log_likelihood", given_globals=True
        )


class ImportanceWeightedELBO(ELBO):
    """The importance-weighted bound L_m (paper eq. 8; Burda et al. 2016) as an SVI loss:
    ``-sum log (1/m) sum_i p(x, z_i) / q(z_i)`` with the m particles drawn in parallel -- one bound
    per element of ``plate`` (each data point with its own m particles, as the paper trains and
    evaluates), or with ``plate=None`` one for all observations jointly. m = 1 is the ELBO. The
    host's ``RenyiELBO(alpha=0)`` also bounds per element, but only of the plates that enclose every
    sample site (a global latent outside the data plate makes its bound joint, silently); here
    ``plate`` is named, and a latent outside it raises a ValueError (condition it on a value, or
    pass ``plate=None``). The guide's sites must be reparameterized (relaxed sites are).

    :param int num_particles: m.
    :param str plate: the data plate, or None.
    """

    def __init__(self, num_particles=1, plate=None):
        super().__init__(num_particles=num_particles, vectorize_particles=True)
        self.plate = plate
        self._max_plate_nesting = None

    def _get_trace(self, model, guide, args, kwargs):
        """One particle's (model trace, guide trace)."""
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        return model_trace, guide_trace

    def _setup(self, model, guide, args, kwargs):
        with torch.no_grad(), poutine.block():
            model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
        self._check_guide(guide_trace)
        self._max_plate_nesting = max(_max_plate_nesting(model_trace), _max_plate_nesting(guide_trace))

    def _check_guide(self, guide_trace):
        for site in _sample_sites(guide_trace):
            if not site["is_observed"] and not getattr(site["fn"], "has_rsample", False):
                raise ValueError(
                    f"ImportanceWeightedELBO: guide site {site['name']!r} holds {type(site['fn']).__name__}, which "
                    "is not reparameterized; relax it (Concrete family) or use VIMCO, a score-function estimator"
                )

    def differentiable_loss(self, model, guide, *args, **kwargs):
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        bound = _importance_bound(
            model, guide, args, kwargs, self.num_particles, self.plate, self._max_plate_nesting, "ImportanceWeightedELBO"
        )
        return -bound.sum()

    def loss(self, model, guide, *args, **kwargs):
        with torch.no_grad():
            return self.differentiable_loss(model, guide, *args, **kwargs).item()

    def loss_and_grads(self, model, guide, *args, **kwargs):
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return loss.item()


class VIMCO(ImportanceWeightedELBO):
    """The importance-weighted bound L_m for guides with discrete sites, with Mnih & Rezende's
    (2016) multi-sample score-function gradient -- the paper's baseline for m > 1: each particle's
    log q(z_i) is weighted by L_m minus the bound with log w_i replaced by the mean of the other
    particles' log weights (a leave-one-out baseline, no learned one). Reparameterized guide sites
    get pathwise gradients. The loss value is ``-sum L_m``; one bound per element of ``plate``.

    :param int num_particles: m >= 2.
    :param str plate: the data plate, or None.
    """

    def __init__(self, num_particles=2, plate=None):
        if not (isinstance(num_particles, int) and num_particles >= 2):
            raise ValueError(
                f"VIMCO: num_particles must be an integer >= 2 (the leave-one-out baseline needs two), got {num_particles!r}"
            )
        super().__init__(num_particles=num_particles, plate=plate)

    def _check_guide(self, guide_trace):
        pass  # any guide: discrete sites get the score-function gradient

    def differentiable_loss(self, model, guide, *args, **kwargs):
        """-sum L_m in value; its gradient is VIMCO's."""
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        m = self.num_particles
        model_trace, guide_trace, particle_dim = _vectorized_traces(
            model, guide, args, kwargs, m, self._max_plate_nesting, "VIMCO"
        )
        log_w = _log_weights(model_trace, guide_trace, particle_dim, self.plate, "VIMCO")
        log_q = sum(  # the score-function part: guide sites without a reparameterized sampler
            _per_particle(site["log_prob"], site, particle_dim, self.plate, "VIMCO")
            for site in _sample_sites(guide_trace)
            if not site["is_observed"] and not getattr(site["fn"], "has_rsample", False)
        )
        bound = torch.logsumexp(log_w, 0) - math.log(m)
        w = log_w.detach()
        leave_one_out = (w.sum(0, keepdim=True) - w) / (m - 1)  # (m, ...): the others' mean
        eye = torch.eye(m, dtype=torch.bool).reshape((m, m) + (1,) * (w.dim() - 1))
        replaced = torch.where(eye, leave_one_out.unsqueeze(1), w.unsqueeze(0))  # [i, j]: w_j, w_i replaced
        learning_signal = bound.detach() - (torch.logsumexp(replaced, 1) - math.log(m))
        surrogate = bound + (learning_signal * log_q).sum(0)
        return -surrogate.sum() + (surrogate - bound).sum().detach()


class _Compiled:
    """``differentiable_loss`` compiled with ``pyro.ops.jit.trace``, as Pyro's ``JitTrace_ELBO``
    compiles its loss; the same restrictions: static model structure, tensors passed in ``*args``
    (a temperature that changes between steps too), non-tensors in ``**kwargs`` (one compilation
    per distinct value), and a fixed batch shape per compilation."""

    def __init__(self, num_particles=2, plate=None, ignore_jit_warnings=False, jit_options=None):
        super().__init__(num_particles=num_particles, plate=plate)
        self.ignore_jit_warnings, self.jit_options = ignore_jit_warnings, jit_options
        self._compiled = None

    def differentiable_loss(self, model, guide, *args, **kwargs):
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        kwargs["_pyro_model_id"], kwargs["_pyro_guide_id"] = id(model), id(guide)
        if self._compiled is None:
            weakself = weakref.ref(self)  # no cycle through the compiled closure

            @pyro.ops.jit.trace(ignore_warnings=self.ignore_jit_warnings, jit_options=self.jit_options)
            def loss(*args, **kwargs):
                del kwargs["_pyro_model_id"], kwargs["_pyro_guide_id"]
                return super(_Compiled, weakself()).differentiable_loss(model, guide, *args, **kwargs)

            self._compiled = loss
        return self._compiled(*args, **kwargs)

    def loss(self, model, guide, *args, **kwargs):
        return self.differentiable_loss(model, guide, *args, **kwargs).detach().item()


class JitImportanceWeightedELBO(_Compiled, ImportanceWeightedELBO):
    """:class:`ImportanceWeightedELBO` with its loss compiled by ``torch.jit.trace`` (Pyro's
    ``JitTrace_ELBO`` idiom; NumPyro's SVI compiles every loss, so ``numpyro_concrete`` has no
    counterpart). Same restrictions as ``JitTrace_ELBO``: static structure, tensors in ``*args``.

    :param int num_particles: m.
    :param str plate: the data plate, or None.
    :param bool ignore_jit_warnings: passed to ``pyro.ops.jit.trace``.
    :param dict jit_options: passed to ``torch.jit.trace``.
    """

    def __init__(self, num_particles=1, plate=None, ignore_jit_warnings=False, jit_options=None):
        super().__init__(num_particles, plate, ignore_jit_warnings, jit_options)


class JitVIMCO(_Compiled, VIMCO):
    """:class:`VIMCO` with its loss compiled by ``torch.jit.trace`` (see
    :class:`JitImportanceWeightedELBO`).

    :param int num_particles: m >= 2.
    :param str plate: the data plate, or None.
    :param bool ignore_jit_warnings: passed to ``pyro.ops.jit.trace``.
    :param dict jit_options: passed to ``torch.jit.trace``.
    """
