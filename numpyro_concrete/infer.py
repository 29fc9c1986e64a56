"""Evaluating the discrete graph of a model trained with Concrete relaxations (paper section 3.3).

The helpers put the handlers in the right order themselves: the swap to discrete sites innermost
(around the model and guide, with ``block`` inside it), enumeration and tracing outside.
Enumeration needs ``funsor`` (NumPyro's ``TraceEnum_ELBO`` and ``infer_discrete``).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import numpyro.infer
from jax.scipy.special import logsumexp
from numpyro import handlers
from numpyro.infer import ELBO, TraceEnum_ELBO
from numpyro.infer.autoguide import AutoContinuous, AutoGuideList
from numpyro.primitives import Messenger

from concrete_common import messages

from .handlers import CONCRETE_FAMILY, DiscreteMessenger, discrete, unwrap

__all__ = ["marginal_log_likelihood", "map_assignment", "sample_assignment", "Predictive", "discrete_log_likelihood", "ImportanceWeightedELBO"]


def _with_params(fn, params):
    return fn if params is None else handlers.substitute(fn, data=params)


def _trace(fn, key, args, kwargs):
    return handlers.trace(handlers.seed(fn, key)).get_trace(*args, **kwargs)


class _GivenMessenger(Messenger):
    """Holds the sample sites named in ``given`` at the given values and leaves them out of the log
    joint (masked), so that the discrete graph is evaluated conditionally on them: p(x | given)."""

    def __init__(self, fn, given):
        self.given = given
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.given:
            msg["value"] = jnp.asarray(self.given[msg["name"]])
            msg["is_observed"] = True
            msg["fn"] = msg["fn"].mask(False)


def _with_given(fn, given):
    return fn if not given else _GivenMessenger(fn, given)


def _check_given(trace, given, helper):
    messages.check_given(helper, given, [site["name"] for site in _sample_sites(trace)])


def _sample_sites(trace):
    return [site for site in trace.values() if site["type"] == "sample"]


def _max_plate_nesting(trace):
    dims = [-f.dim for site in _sample_sites(trace) for f in site["cond_indep_stack"] if f.dim is not None]
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
    for site in trace.values():
        if site["type"] == "plate" and site["value"] is not None:
            messages.check_full_plate(helper, site["name"], len(site["value"]), site["args"][0])


def _scanned_sites(trace):
    """The latent sites drawn inside ``numpyro.contrib.control_flow.scan``."""
    return [site for site in _sample_sites(trace) if site.get("_control_flow_done") and not site["is_observed"]]


def _check_scan(model, args, kwargs, helper):
    """``scan`` bodies run with their own handlers: a Concrete-family site there cannot be swapped for
    its limit; and for the host's own discrete sites there NumPyro's ``TraceEnum_ELBO`` gives a wrong
    value and ``infer_discrete`` none. Raises for what is not evaluated exactly; returns whether the
    model scans (``marginal_log_likelihood`` then takes funsor's path, which is exact)."""
    scanned = _scanned_sites(_trace(model, jax.random.PRNGKey(0), args, kwargs))
    for site in scanned:
        base = unwrap(site["fn"])[0]
        relaxed = isinstance(base, CONCRETE_FAMILY)
        if relaxed or helper in ("map_assignment", "sample_assignment"):
            why = "whose body keeps its own handlers, so it cannot be swapped for its discrete limit" if relaxed else "where NumPyro cannot decode it"
            raise ValueError(
                f"{helper}: site {site['name']!r} ({type(base).__name__}) is drawn inside "
                f"numpyro.contrib.control_flow.scan, {why}; write the loop over time with numpyro.contrib.funsor.markov "
                "(a Python loop), which the helpers evaluate exactly (map_assignment: the Viterbi path)"
            )
    return bool(scanned)


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
    :param params: optional dict of parameter values (e.g. ``svi.get_params(state)``).
    :returns: a scalar, differentiable with respect to ``params``.
    """
    from numpyro.contrib.funsor import config_enumerate, enum, log_density

    model = _with_given(_with_params(model, params), given)
    scans = _check_scan(model, args, kwargs, "marginal_log_likelihood")
    trace = _trace(discrete(model, mode="enumerate"), jax.random.PRNGKey(0), args, kwargs)
    _check_given(trace, given, "marginal_log_likelihood")
    _check_all_latents_discrete(trace, "marginal_log_likelihood")
    _check_full_data(trace, "marginal_log_likelihood")
    max_plate_nesting = _max_plate_nesting(trace)
    enumerated = config_enumerate(discrete(model, mode="enumerate"))  # the model's own discrete sites too
    if scans:  # TraceEnum_ELBO is wrong on scan (a wrong finite value); funsor's log density, NUTS's path, is exact
        return log_density(enum(enumerated, -1 - max_plate_nesting), args, kwargs, {})[0]
    elbo = TraceEnum_ELBO(max_plate_nesting=max_plate_nesting)
    return -elbo.loss(jax.random.PRNGKey(0), {}, enumerated, _no_guide, *args, **kwargs)


def map_assignment(model, *args, params=None, given=None, **kwargs):
    """The jointly most probable values of the Concrete-family latent sites under the discrete
    graph, given the observations (``infer_discrete`` with ``temperature=0``), for the whole data
    set: a subsampled plate raises a ValueError.

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :returns: dict from site name to its value in the site's own sample space (one-hot vectors for
        Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, ±inf for LogitBinConcrete).
    """
    return _assignment(model, args, kwargs, params, given, 0, jax.random.PRNGKey(0), "map_assignment")


def sample_assignment(model, *args, params=None, given=None, rng_key=None, **kwargs):
    """One draw of the Concrete-family latent sites from their exact posterior under the discrete
    graph, given the observations and ``given`` (``infer_discrete`` with ``temperature=1``), for the
    whole data set: a subsampled plate raises a ValueError. Posterior predictive draws of the
    discrete sites: one call per draw of the continuous globals, passed in ``given``.

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :param rng_key: a PRNG key (default: ``numpyro.prng_key()``, under ``handlers.seed``).
    :returns: dict from site name to its value in the site's own sample space, as
        :func:`map_assignment`.
    """
    from numpyro import prng_key

    rng_key = prng_key() if rng_key is None else rng_key
    if rng_key is None:
        raise ValueError("sample_assignment: rng_key is required (or run it under numpyro.handlers.seed)")
    return _assignment(model, args, kwargs, params, given, 1, rng_key, "sample_assignment")


def _assignment(model, args, kwargs, params, given, temperature, rng_key, helper):
    from numpyro.contrib.funsor import config_enumerate, infer_discrete

    def decode(arrays, args, kwargs):
        params, given, rng_key = arrays
        conditioned = _with_given(_with_params(model, params), given)
        _check_scan(conditioned, args, kwargs, helper)
        trace = _trace(discrete(conditioned, mode="enumerate"), jax.random.PRNGKey(0), args, kwargs)
        _check_given(trace, given, helper)
        _check_all_latents_discrete(trace, helper)
        _check_full_data(trace, helper)
        swap = DiscreteMessenger(conditioned, mode="enumerate")
        decoded = infer_discrete(
            config_enumerate(swap), first_available_dim=-1 - _max_plate_nesting(trace), temperature=temperature, rng_key=rng_key
        )
        trace = handlers.trace(decoded).get_trace(*args, **kwargs)
        to_value = swap._to_value
        return {
            site["name"]: to_value.get(site["name"], lambda v: v)(site["value"])
            for site in _sample_sites(trace)
            if not site["is_observed"]
        }

    return _compiled_if_possible(decode, (params, given, rng_key), args, kwargs)


def _compiled_if_possible(fn, arrays, args, kwargs):
    """``fn(arrays, args, kwargs)`` under ``jax.jit``, with the array leaves of ``args`` and
    ``kwargs`` as arguments (the rest, e.g. Python numbers, fixed); eagerly where the model cannot be
    traced (it branches on a value). Compiled, the model's runs are traced once, not run op by op;
    eagerly, funsor's decoding of a longer ``markov`` chain runs out of memory where the compiled
    decoding does not."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    is_array = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]

    def run(arrays, array_leaves):
        given_leaves = iter(array_leaves)
        args, kwargs = jax.tree_util.tree_unflatten(treedef, [next(given_leaves) if a else leaf for leaf, a in zip(leaves, is_array)])
        return fn(arrays, args, kwargs)

    array_leaves = [leaf for leaf, a in zip(leaves, is_array) if a]
    try:
        return jax.jit(run)(arrays, array_leaves)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return run(arrays, array_leaves)


def _is_relaxed_sample(msg):
    return msg["type"] == "sample" and isinstance(unwrap(msg["fn"])[0], CONCRETE_FAMILY)


class Predictive(numpyro.infer.Predictive):
    """``numpyro.infer.Predictive`` for models with Concrete-family sites; the same arguments. With
    ``infer_discrete=True`` it draws from the model's *discrete graph*: every Concrete-family site
    is drawn from its exact posterior (enumerated, given the observations and the other latents drawn
    from ``guide`` or taken from ``posterior_samples``) and returned in the site's own sample space
    (one-hot vectors for Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, +-inf for
    LogitBinConcrete), not as the enumerated index. The guide's Concrete-family sites are hidden
    (the discrete draws do not start from the guide's relaxed ones). Without ``infer_discrete``,
    ``numpyro.infer.Predictive`` as it is.
    """

    def __init__(self, model, posterior_samples=None, *, guide=None, infer_discrete=False, **kwargs):
        self._swap = DiscreteMessenger(model, mode="enumerate") if infer_discrete else None
        if infer_discrete:
            model = self._swap
            if guide is not None:
                guide = handlers.block(guide, hide_fn=_is_relaxed_sample)
        super().__init__(model, posterior_samples, guide=guide, infer_discrete=infer_discrete, **kwargs)

    def __call__(self, rng_key, *args, **kwargs):
        samples = super().__call__(rng_key, *args, **kwargs)
        if self._swap is None:
            return samples
        to_value = self._swap._to_value  # filled while the swapped model ran
        return {name: to_value[name](value) if name in to_value else value for name, value in samples.items()}


def _relaxed_latents(trace):
    return {
        site["name"]
        for site in _sample_sites(trace)
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
    if isinstance(joint, dist.Independent) and isinstance(joint.base_dist, dist.Normal):
        if joint.reinterpreted_batch_ndims == 1:
            return jnp.where(keep, joint.base_dist.log_prob(value), 0.0).sum(-1)
    elif isinstance(joint, dist.Normal):  # coordinates along the last batch dimension
        return jnp.where(keep, joint.log_prob(value), 0.0)
    elif isinstance(joint, (dist.MultivariateNormal, dist.LowRankMultivariateNormal)):
        index = np.flatnonzero(keep)
        covariance = joint.covariance_matrix[..., index, :][..., index]
        return dist.MultivariateNormal(joint.loc[..., index], covariance_matrix=covariance).log_prob(value[..., index])
    return None


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


def _marginalize(guide, marginals):
    return _MarginalMessenger(guide, marginals) if marginals else guide


def _proposal(model, guide, key, args, kwargs, autoguide=None, given=None):
    """Which guide sites to discretize, which to hide and which to marginalize for the discrete
    graph's proposal.

    A model site that is relaxed and drawn in the guide from a Concrete-family distribution is
    discretized there; drawn from anything else (an autoguide's Delta or transformed Normal), it
    is hidden from the guide so that the model draws it from its discrete prior. An autoguide's
    auxiliary site is attributed to the model sites it feeds -- ``{name}_unconstrained`` (Pyro's
    AutoNormal) to ``name``; the joint latent of an ``AutoContinuous`` autoguide (``autoguide``,
    or a part of an ``AutoGuideList``) to every site, by its coordinates -- and is kept if it feeds
    no hidden site, hidden if it feeds hidden sites only, and otherwise marginalized: still drawn
    whole, but scored by the marginal density of the coordinates of the sites kept
    (:func:`_marginal_log_prob`; a joint without a closed-form marginal raises). Any other guide
    site without a model counterpart could not be attributed, and raises.

    :returns: (discretized names, hidden names, {auxiliary name: boolean mask of the coordinates
        kept}).
    """
    guide_key, model_key = jax.random.split(key)
    guide_trace = _trace(guide, guide_key, args, kwargs)
    model_trace = handlers.trace(handlers.replay(handlers.seed(model, model_key), trace=guide_trace)).get_trace(*args, **kwargs)
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
        keep = np.zeros(jnp.shape(value)[-1], dtype=bool)
        for site, coordinates in layout.items():
            if site not in hidden:
                keep[coordinates] = True
        if _marginal_log_prob(joint, value, keep) is None:
            raise ValueError(
                f"discrete_log_likelihood: guide site {name!r} draws the relaxed site(s) {sorted(fed_hidden)} jointly "
                f"with the continuous site(s) {sorted(set(layout) - hidden)} from {type(joint).__name__}, whose "
                "marginal density of the continuous coordinates has no closed form: the relaxed sites cannot be "
                "hidden from it. Use an AutoGuideList with this autoguide over the continuous sites only "
                "(handlers.block(model, hide=[...])) and AutoNormal or a Concrete-family guide for the relaxed ones"
            )
        marginals[name] = keep
    unattributed = set(guide_sites) - model_sites - set(auxiliary) - hidden
    if unattributed:
        raise ValueError(
            f"discrete_log_likelihood: guide site(s) {sorted(unattributed)} have no model counterpart; "
            "the discrete graph's proposal is the guide with its relaxed sites discretized (or hidden, for "
            "an autoguide such as AutoNormal), and these cannot be attributed to a site"
        )
    return discretized, hidden, marginals


def _site_log_prob(site):
    log_prob = site["fn"].log_prob(site["value"], site["intermediates"]) if site["intermediates"] else site["fn"].log_prob(site["value"])
    return log_prob if site["scale"] is None else site["scale"] * log_prob


def _per_element(log_prob, site, plate, caller):
    """A site's log_prob summed to a scalar, or to one value per element of ``plate``."""
    if plate is None:
        return jnp.sum(log_prob)
    frames = [f for f in site["cond_indep_stack"] if f.name == plate]
    if not frames:
        raise ValueError(messages.outside_plate_message(caller, site["name"], plate))
    log_prob = jnp.reshape(log_prob, (1,) * max(-frames[0].dim - jnp.ndim(log_prob), 0) + jnp.shape(log_prob))
    keep = jnp.ndim(log_prob) + frames[0].dim
    return jnp.sum(log_prob, axis=tuple(d for d in range(jnp.ndim(log_prob)) if d != keep))


def _log_weights(model_trace, guide_trace, plate, caller, given_globals=False):
    """log p(x, z) - log q(z) of one particle: a scalar, or one per element of ``plate``.

    A latent site the guide does not draw is drawn by the model from its prior, which is then its
    proposal: its log p cancels against its log q and is left out. ``given_globals`` (per-element
    bounds of the discrete graph): observed sites outside ``plate`` condition every element alike and
    are left out, and a latent outside it raises.
    """
    total = 0.0
    proposed = {site["name"] for site in _sample_sites(guide_trace)}
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for site in _sample_sites(trace):
            if sign > 0 and not site["is_observed"] and site["name"] not in proposed:
                continue
            if given_globals and plate is not None and not any(f.name == plate for f in site["cond_indep_stack"]):
                if site["is_observed"]:
                    continue
                raise ValueError(messages.global_latent_message(caller, site["name"], plate))
            total = total + sign * _per_element(_site_log_prob(site), site, plate, caller)
    return total


def _particle_traces(model, guide, particle_key, args, kwargs):
    """(model trace, guide trace) of one particle."""
    guide_key, model_key = jax.random.split(particle_key)
    guide_trace = _trace(guide, guide_key, args, kwargs)
    replayed = handlers.replay(handlers.seed(model, model_key), trace=guide_trace)
    return handlers.trace(replayed).get_trace(*args, **kwargs), guide_trace


def _importance_bound(model, guide, rng_key, args, kwargs, num_particles, plate, caller, given_globals=False):
    """log (1/m) sum_i p(x, z_i) / q(z_i), z_i from the guide, the m particles drawn in parallel
    (``vmap``): a scalar, or one bound per element of ``plate``."""
    if not (isinstance(num_particles, int) and num_particles >= 1):
        raise ValueError(f"{caller}: num_particles must be a positive integer, got {num_particles!r}")

    def log_weight(particle_key):
        return _log_weights(*_particle_traces(model, guide, particle_key, args, kwargs), plate, caller, given_globals)

    log_weights = jax.vmap(log_weight)(jax.random.split(rng_key, num_particles))
    return logsumexp(log_weights, axis=0) - math.log(num_particles)


def discrete_log_likelihood(model, guide, *args, num_particles=1, plate=None, params=None, given=None, rng_key=None, **kwargs):
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
    :param int num_particles: m, drawn in parallel (``vmap`` over particles).
    :param str plate: None for one bound of all observations jointly; or the name of a plate that
        holds every latent site (the data plate), for one bound per element of it (each data point
        with its own m particles, as the paper evaluates), returned with that plate's size. Observed
        sites outside the plate (globals conditioned on a value) condition every element alike and are
        left out: the bounds are of log p(x_n | globals). A latent global the guide draws raises.
    :param params: optional dict of parameter values (e.g. ``svi.get_params(state)``).
    :param rng_key: a JAX PRNG key (default ``PRNGKey(0)``).
    :returns: an array: a scalar, or the per-element bounds along ``plate``.
    """
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    proposal_key, key = jax.random.split(rng_key)
    autoguide = guide
    model, guide = _with_given(_with_params(model, params), given), _with_params(guide, params)
    for fn in (model, guide):
        _check_scan(fn, args, kwargs, "discrete_log_likelihood")
    discretized, hidden, marginals = _proposal(model, guide, proposal_key, args, kwargs, autoguide, given)
    guide = _marginalize(guide, marginals)
    guide_d = discrete(handlers.block(guide, hide=list(hidden)), mode="sample", sites=discretized)
    model_d = discrete(model, mode="sample")
    bound = _importance_bound(model_d, guide_d, key, args, kwargs, num_particles, plate, "discrete_log_likelihood", given_globals=True)
    return jax.lax.stop_gradient(bound)


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
        super().__init__(num_particles=num_particles)
        self.plate = plate

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        model, guide = _with_params(model, param_map), _with_params(guide, param_map)
        bound = _importance_bound(model, guide, rng_key, args, kwargs, self.num_particles, self.plate, "ImportanceWeightedELBO")
        return {"loss": -jnp.sum(bound), "mutable_state": None}


class VIMCO(ImportanceWeightedELBO):
    """The importance-weighted bound L_m for guides with discrete sites, with Mnih & Rezende's
    (2016) multi-sample score-function gradient -- the paper's baseline for m > 1: each particle's
    log q(z_i) is weighted by L_m minus the bound with log w_i replaced by the mean of the other
    particles' log weights (a leave-one-out baseline, no learned one). Reparameterized guide sites
    get pathwise gradients. The loss value is ``-sum L_m``; one bound per element of ``plate``.

    :param int num_particles: m >= 2.
    :param str plate: the data plate, or None.
    """

    can_infer_discrete = True

    def __init__(self, num_particles=2, plate=None):
        if not (isinstance(num_particles, int) and num_particles >= 2):
            raise ValueError(
                f"VIMCO: num_particles must be an integer >= 2 (the leave-one-out baseline needs two), got {num_particles!r}"
            )
        super().__init__(num_particles=num_particles, plate=plate)

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        model, guide = _with_params(model, param_map), _with_params(guide, param_map)

        def particle(particle_key):
            model_trace, guide_trace = _particle_traces(model, guide, particle_key, args, kwargs)
            log_q = sum(  # the score-function part: guide sites without a reparameterized sampler
                _per_element(_site_log_prob(site), site, self.plate, "VIMCO")
                for site in _sample_sites(guide_trace)
                if not site["is_observed"] and not site["fn"].has_rsample
            )
            return _log_weights(model_trace, guide_trace, self.plate, "VIMCO"), log_q

        m = self.num_particles
        log_w, log_q = jax.vmap(particle)(jax.random.split(rng_key, m))
        bound = logsumexp(log_w, axis=0) - math.log(m)
        w = jax.lax.stop_gradient(log_w)
        leave_one_out = (w.sum(0, keepdims=True) - w) / (m - 1)  # (m, ...): the others' mean
        eye = jnp.eye(m, dtype=bool).reshape((m, m) + (1,) * (w.ndim - 1))
        replaced = jnp.where(eye, leave_one_out[:, None], w[None])  # [i, j]: w_j, w_i replaced
        learning_signal = jax.lax.stop_gradient(bound) - (logsumexp(replaced, axis=1) - math.log(m))
        surrogate = bound + (learning_signal * log_q).sum(0)
        loss = -surrogate.sum() + jax.lax.stop_gradient((surrogate - bound).sum())
        return {"loss": loss, "mutable_state": None}
