"""Evaluating the discrete graph of a model trained with Concrete relaxations (paper section 3.3).

The helpers put the handlers in the right order themselves: the swap to discrete sites innermost
(around the model and guide, with ``block`` inside it), enumeration and tracing outside.
"""

import contextlib
import copy
import functools
from typing import Any, Callable, Optional, Sequence

import pyro
import pyro.poutine.runtime
import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.infer import TraceEnum_ELBO, config_enumerate, infer_discrete
from pyro.infer.traceenum_elbo import _compute_model_factors
from pyro.ops import packed
from pyro.ops.contract import contract_tensor_tree
from pyro.poutine.messenger import Messenger
from torch import Tensor

from concrete_common import evaluating, messages
from concrete_common.common_scale import joint_scale
from concrete_common.messages import named_errors

from ._log_einsum import ExactLogRing
from ._traces import (
    CommonScale,
    SummedWithPriorMasses,
    check_all_latents_discrete,
    check_masked_latents_unread,
    check_full_data,
    check_given,
    check_observed_densities,
    held_as_observed,
    importance_bound,
    marginalize,
    max_plate_nesting,
    no_guide,
    proposal,
    sample_sites,
    with_given,
    with_params,
)
from .handlers import CONCRETE_FAMILY, DiscreteMessenger, discrete, unwrap

__all__ = ["marginal_log_likelihood", "map_assignment", "sample_assignment", "Predictive", "discrete_log_likelihood"]


def _isolated(helper):
    """The helper's runs of the model and guide hidden from the handlers outside the call (their
    parameters excepted, which an outer trace collects for training): a helper called inside a
    model, a ``with relax(...)`` block or a trace computes the value of the model it is given and
    leaves no site in the caller's trace (an outer ``relax`` turned the discrete graph relaxed again;
    a traced caller held the helper's sites beside its own), with dimensions of its own
    (:func:`_own_dimensions`)."""

    @functools.wraps(helper)
    def isolated(*args, **kwargs):
        with poutine.block(expose_types=["param"]), _own_dimensions():
            return helper(*args, **kwargs)

    return isolated


@contextlib.contextmanager
def _own_dimensions():
    """Pyro's allocators of plate and enumeration dimensions are global: the helper starts from fresh
    ones and the caller's are put back after it (called inside the caller's plate or enumeration,
    the helper's plates were shifted left of their data: the host's "Invalid tensor shape")."""
    dims, enums = pyro.poutine.runtime._DIM_ALLOCATOR, pyro.poutine.runtime._ENUM_ALLOCATOR
    plates, enumeration = dims._stack, {name: copy.copy(value) for name, value in vars(enums).items()}
    dims._stack = []
    try:
        yield
    finally:
        dims._stack = plates
        vars(enums).clear()
        vars(enums).update(enumeration)


@named_errors("marginal_log_likelihood")
@_isolated
def marginal_log_likelihood(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, **kwargs: Any
) -> Tensor:
    """log p(observations) of the model's discrete graph, exactly: every Concrete-family site is
    replaced by its zero-temperature limit and summed out as ``TraceEnum_ELBO`` does (with a gradient
    that stays exact where the prior and the likelihood favour different values). Evaluates the whole
    data set: a subsampled plate raises a ValueError.

    :param model: a model whose latent sites are all Concrete-family or enumerable, or in ``given``.
    :param given: optional dict from latent site name to a value: those sites are held at the values
        and left out of the log joint, so the result is log p(observations | given) (e.g. the
        continuous globals at their posterior point estimates). ``params`` substitutes parameters;
        ``given`` conditions latent sites.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a scalar tensor, differentiable with respect to the parameters.
    """
    model = with_given(with_params(held_as_observed(model), params), given)
    trace = _checked_discrete_trace(model, args, kwargs, given)
    check_masked_latents_unread(model, args, kwargs)  # summed with their prior masses
    _check_common_scale(model, args, kwargs, given)  # named, as in NumPyro and the decodings (the host's error named nothing)
    enumerated = SummedWithPriorMasses()(config_enumerate(discrete(model, mode="enumerate")))  # the model's own discrete sites too
    with evaluating.discrete_graph("marginal_log_likelihood", runtime=pyro.poutine.runtime):
        value = _summed_log_joint(enumerated, args, kwargs, max_plate_nesting(trace))
    if not torch.is_tensor(value):  # nothing to sum
        like = _observed_value(trace)
        return torch.tensor(float(value), dtype=like.dtype, device=like.device)
    return value


def _summed_log_joint(enumerated, args, kwargs, nesting):
    """The log joint of the model, its enumerated sites summed out: ``TraceEnum_ELBO``'s value with
    no guide, contracted by :class:`ExactLogRing` (the host's ring scaled gradients down by up to
    S / eps where the prior and the likelihood favour different values: see ``_log_einsum``)."""
    elbo = TraceEnum_ELBO(max_plate_nesting=nesting)
    total = 0.0
    for model_trace, guide_trace in elbo._get_traces(enumerated, no_guide, args, kwargs):
        costs, log_factors, _, sum_dims, scale = _compute_model_factors(model_trace, guide_trace)
        terms = [cost for costs_t in costs.values() for cost in costs_t]
        if log_factors:
            contracted = contract_tensor_tree(log_factors, sum_dims, ring=ExactLogRing())
            terms += [packed.scale_and_mask(term, scale=scale) for terms_t in contracted.values() for term in terms_t]
        total = total + sum(term.sum() for term in terms)
    return total


def _observed_value(trace):
    """A floating tensor the result should resemble (dtype, device): the first observed value's, else
    a float64 scalar on the CPU."""
    for site in trace.nodes.values():
        value = site.get("value")
        if site["type"] == "sample" and site["is_observed"] and torch.is_tensor(value) and value.is_floating_point():
            return value
    return torch.zeros((), dtype=torch.float64)


def _checked_discrete_trace(model, args, kwargs, given):
    """A trace of the model's discrete graph, after the checks of the exact helpers: ``given`` names
    sites of the model, every latent is enumerable, and no plate subsamples."""
    with torch.no_grad(), poutine.block(), evaluating.discrete_graph("the exact helper"):
        trace = poutine.trace(discrete(model, mode="enumerate")).get_trace(*args, **kwargs)
    check_given(trace, given)
    check_all_latents_discrete(trace)
    check_full_data(trace)
    check_observed_densities(trace)
    return trace


@named_errors("map_assignment")
@_isolated
def map_assignment(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, **kwargs: Any
) -> dict[str, Tensor]:
    """The jointly most probable values of the Concrete-family latent sites under the discrete
    graph, given the observations (max-product: the Viterbi path of a ``markov`` chain, in time linear
    in its length), for the whole data set: a subsampled plate raises a ValueError.

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :returns: dict from site name to its value in the site's own sample space (one-hot vectors for
        Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, ±inf for LogitBinConcrete).
    """
    return _assignment(model, args, kwargs, params, given, temperature=0)


@named_errors("sample_assignment")
@_isolated
def sample_assignment(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, **kwargs: Any
) -> dict[str, Tensor]:
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
    return _assignment(model, args, kwargs, params, given, temperature=1)


def _is_relaxed_sample(msg):
    return msg["type"] == "sample" and isinstance(unwrap(msg["fn"])[0], CONCRETE_FAMILY)


class Predictive(pyro.infer.Predictive):
    """``pyro.infer.Predictive`` for models with Concrete-family sites; the same arguments. With
    ``infer_discrete=True`` it draws from the model's *discrete graph*: every Concrete-family site
    is drawn from its exact posterior (enumerated, given the observations and the other latents drawn
    from ``guide`` or taken from ``posterior_samples``) and returned in the site's own sample space
    (one-hot vectors for Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, +-inf for
    LogitBinConcrete), not as the enumerated index. Only the draws of the model's other latent sites
    are held: the guide's (or ``posterior_samples``') values of the relaxed sites, and an autoguide's
    auxiliary sites (``{name}_unconstrained``, a joint ``_{prefix}_latent``), are left out (the
    discrete draws do not start from the relaxed ones). Without ``infer_discrete``,
    ``pyro.infer.Predictive`` as it is.

    (Pyro's own ``Predictive`` around ``infer_discrete`` draws the discrete sites given globals from
    the prior, not the guide's; here each draw is :func:`sample_assignment` given that draw's other
    latents, one draw at a time.)
    """

    def __init__(
        self,
        model: Callable[..., Any],
        posterior_samples: Optional[dict[str, Tensor]] = None,
        guide: Optional[Callable[..., Any]] = None,
        num_samples: Optional[int] = None,
        return_sites: Sequence[str] = (),
        parallel: bool = False,
        *,
        infer_discrete: bool = False,
    ) -> None:
        if infer_discrete and guide is not None:
            guide = poutine.block(guide, hide_fn=_is_relaxed_sample)
        super().__init__(model, posterior_samples, guide, num_samples, return_sites, parallel)
        self.infer_discrete = infer_discrete

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        if not self.infer_discrete:
            return super().forward(*args, **kwargs)
        posterior = self.posterior_samples
        if self.guide is not None:
            guide_draws = pyro.infer.Predictive(self.guide, posterior, num_samples=self.num_samples, parallel=self.parallel)
            posterior = {**posterior, **guide_draws(*args, **kwargs)}
        held = self._held_sites(args, kwargs)
        draws = [
            self._draw({name: _unpadded(value[i], held[name]) for name, value in posterior.items() if name in held}, args, kwargs)
            for i in range(self.num_samples)
        ]
        return {name: torch.stack([draw[name] for draw in draws]) for name in draws[0]}

    def _held_sites(self, args, kwargs):
        """{name: shape} of the model's latent sites that are not Concrete-family: those a draw holds."""
        with torch.no_grad(), poutine.block():
            trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        return {site["name"]: site["value"].shape for site in sample_sites(trace) if not site["is_observed"] and not _is_relaxed_sample(site)}

    def _draw(self, given, args, kwargs):
        """One draw: the Concrete-family sites from their exact posterior given ``given``, then the
        model's other sites given both (as ``pyro.infer.Predictive`` picks its sites)."""
        assignment = sample_assignment(self.model, *args, given=given, **kwargs)
        with torch.no_grad():
            trace = poutine.trace(poutine.condition(discrete(self.model, mode="sample"), data={**given, **assignment})).get_trace(*args, **kwargs)
        if self.return_sites:
            names = self.return_sites
        else:
            names = [site["name"] for site in sample_sites(trace) if self.guide is not None or site["name"] not in given]
        return {name: trace.nodes[name]["value"] for name in names}


def _unpadded(value, shape):
    """A draw of ``pyro.infer.Predictive`` without the leading ones it pads a site's value with (to the
    plates of the whole guide: a global drawn beside an autoguide's local auxiliary site gets one)."""
    extra = value.dim() - len(shape)
    if extra > 0 and all(size == 1 for size in value.shape[:extra]):
        return value.reshape(value.shape[extra:])
    return value


def _assignment(model, args, kwargs, params, given, temperature):
    try:
        return _decoded(model, args, kwargs, params, given, temperature)
    except (ValueError, RuntimeError) as error:
        # infer_discrete's draw from logits that are NaN everywhere (the host's error): no posterior
        if temperature == 1 and (latents := _ruled_out(model, args, kwargs, params, given)):
            raise messages.ModelError(messages.no_posterior(latents)) from None
        if temperature == 1 and type(error) is RuntimeError:
            # the host's infer_discrete fails on some models it can sum (a site in an outer plate
            # that a markov chain in an inner one reads: "shape '[2, 2, 2]' is invalid ...")
            return _drawn_site_by_site(model, args, kwargs, params, given)
        raise


def _drawn_site_by_site(model, args, kwargs, params, given):
    """A draw from p(z | x), one latent site after another, each given those drawn before it (NumPyro's
    decoding, ``_decode_by_conditioning``): the gradient of log p(x) (``_summed_log_joint``) with
    respect to a zero potential e[k] added to a site's log density at its k-th value is the posterior
    probability of that value. A site's value is drawn from it and then held by a potential of 0
    there and a huge negative number elsewhere (-inf would make the exact ring's gradients NaN).
    One forward and backward pass per site.

    The elements of a site (its plates) are drawn at once, independently. That is exact because the
    sites with fewer plates come first: in a model that Pyro can sum out (plates nested as a tree),
    the elements of a site in the plates P depend on each other only through sites outside some
    plate of P, and those are then held."""
    model = with_given(with_params(held_as_observed(model), params), given)
    checked = _checked_discrete_trace(model, args, kwargs, given)
    sites = sorted((site for site in sample_sites(checked) if not site["is_observed"]), key=lambda site: len(site["cond_indep_stack"]))
    supports = {site["name"]: _index_support(site) for site in sites}
    swap = DiscreteMessenger(mode="enumerate")
    enumerated = SummedWithPriorMasses()(config_enumerate(swap(model)))
    potentials = {
        site["name"]: torch.zeros(site["fn"].batch_shape + supports[site["name"]].shape, dtype=unwrap(site["fn"])[0].logits.dtype)
        for site in sites
    }
    for site in sites:
        name = site["name"]
        trial = {key: value.detach().requires_grad_(key == name) for key, value in potentials.items()}
        with torch.enable_grad(), evaluating.discrete_graph("the decoding", runtime=pyro.poutine.runtime):
            log_joint = _summed_log_joint(_Potentials(trial)(enumerated), args, kwargs, max_plate_nesting(checked))
            (shares,) = torch.autograd.grad(log_joint, [trial[name]])
        # an element's shares sum to the model's common scale (1 unscaled); to 0 (or NaN) where
        # every assignment left has probability 0
        total = shares.sum(-1)
        if not bool((torch.isfinite(total) & (total > 0)).all()):
            raise messages.ModelError(messages.no_posterior([s["name"] for s in sites]))
        chosen = torch.distributions.Categorical(probs=shares.clamp(min=0) / total.unsqueeze(-1)).sample()
        held = torch.nn.functional.one_hot(chosen, shares.shape[-1]).bool()
        potentials[name] = torch.where(held, 0.0, -1e30).to(potentials[name].dtype)
    to_value = swap.index_to_value
    return {
        name: to_value.get(name, lambda v: v)(supports[name][potentials[name].argmax(-1)])
        for name in (site["name"] for site in sites)
    }


def _index_support(site):
    """The values of an enumerated site (the host's Categorical or Bernoulli the swap left there):
    value k is at position k."""
    base = unwrap(site["fn"])[0]
    if not isinstance(base, (torch.distributions.Categorical, torch.distributions.Bernoulli)) or base.event_shape:
        raise messages.ModelError(f"site {site['name']!r}: the site-by-site draw sums Categorical and Bernoulli sites only, not {type(base).__name__}")
    return base.enumerate_support(expand=False).reshape(-1)


class _Potentials(Messenger):
    """Adds ``potentials[name][..., k]`` to the log density of the latent site ``name`` at its k-th
    value, outside the site's masks (a masked-out site's value still matters through its children)."""

    def __init__(self, potentials):
        self.potentials = potentials
        super().__init__()

    def _pyro_sample(self, msg):
        if not msg["is_observed"] and msg["name"] in self.potentials:
            msg["fn"] = _WithPotential(msg["fn"], self.potentials[msg["name"]])


class _WithPotential(TorchDistribution):
    """``base`` with ``potential[..., k]`` added to its log density at its k-th value (an index)."""

    arg_constraints: dict = {}
    has_enumerate_support = True

    def __init__(self, base, potential):
        self.base, self.potential = base, potential
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def support(self):
        return self.base.support

    def enumerate_support(self, expand=True):
        return self.base.enumerate_support(expand)

    def sample(self, sample_shape=torch.Size()):
        return self.base.sample(sample_shape)

    def log_prob(self, value):
        one_hot = torch.nn.functional.one_hot(value.long(), self.potential.shape[-1]).to(self.potential.dtype)
        return self.base.log_prob(value) + (one_hot * self.potential).sum(-1)


def _ruled_out(model, args, kwargs, params, given):
    """The latent sites' names where the observations have probability 0 under every assignment of
    them (None otherwise, or where that cannot be told)."""
    try:
        if marginal_log_likelihood(model, *args, params=params, given=given, **kwargs) != -float("inf"):
            return None
        model = with_given(with_params(held_as_observed(model), params), given)
        return [site["name"] for site in sample_sites(_checked_discrete_trace(model, args, kwargs, given)) if not site["is_observed"]]
    except Exception:
        return None


def _decoded(model, args, kwargs, params, given, temperature):
    model = with_given(with_params(held_as_observed(model), params), given)
    trace = _checked_discrete_trace(model, args, kwargs, given)
    if temperature != 0:  # drawn with their prior masses (the MAP leaves a masked-out site out, as the host)
        check_masked_latents_unread(model, args, kwargs)
    _check_common_scale(model, args, kwargs, given)
    with torch.no_grad(), poutine.block():
        swap = DiscreteMessenger(mode="enumerate")
        enumerated = config_enumerate(swap(model))
        if temperature == 0:  # the MAP: a masked-out site contributes nothing (see DiscreteMessenger.masks_kept)
            swap.masks_kept = True
        else:  # a draw from the posterior: a masked-out site drawn from its prior
            enumerated = SummedWithPriorMasses()(enumerated)
        decoded = infer_discrete(enumerated, first_available_dim=-1 - max_plate_nesting(trace), temperature=temperature)
        with evaluating.discrete_graph("the decoding", runtime=pyro.poutine.runtime):
            trace = poutine.trace(decoded).get_trace(*args, **kwargs)
    to_value = swap.index_to_value
    return {
        site["name"]: to_value.get(site["name"], lambda v: v)(_decoded_shape(site))
        for site in sample_sites(trace)
        if not site["is_observed"]
    }


def _decoded_shape(site):
    """The decoded value in its site's shape: ``infer_discrete`` drops a plate dimension of size 1
    (a last minibatch of one point), which the value of every other size keeps."""
    value, shape = site["value"], site["fn"].shape()
    return value.reshape(shape) if value.shape != shape and value.numel() == shape.numel() else value


def _check_common_scale(model, args, kwargs, given):
    """``infer_discrete`` applies masks but not scales: sites of different scales (``poutine.scale``
    on the observations alone) were decoded as if unscaled, with no error. One scale common to every
    site (the same posterior) passes; others raise, as in NumPyro's helpers. The random state is left
    as it was."""
    state = pyro.util.get_rng_state()
    try:
        with torch.no_grad(), poutine.block(), evaluating.discrete_graph("the exact helper"):
            poutine.trace(CommonScale(given)(discrete(model, mode="enumerate"))).get_trace(*args, **kwargs)
    finally:
        pyro.util.set_rng_state(state)


def _check_observed_sites(model, args, kwargs, plate):
    """``check_observed_densities`` on one run of the model (an observed site's value and class do
    not depend on the latents' draw), and ``plate`` one of its plates, with the random state left as
    it was."""
    state = pyro.util.get_rng_state()
    try:
        with torch.no_grad(), poutine.block():
            traced = poutine.trace(model).get_trace(*args, **kwargs)
        check_observed_densities(traced)
        messages.check_plate_of_model(plate, {frame.name for site in sample_sites(traced) for frame in site["cond_indep_stack"]})
    finally:
        pyro.util.set_rng_state(state)


@named_errors("discrete_log_likelihood")
@_isolated
def discrete_log_likelihood(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    *args: Any,
    num_particles: int = 1,
    plate: Optional[str] = None,
    params: Optional[dict[str, Any]] = None,
    given: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> Tensor:
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
        where they raise, or where a site's log density holds a dimension left of the particles' (a
        global reshaped for one draw), the particles are drawn one at a time, with a warning
        (slower). m = 1 runs model and guide as written. Observations with a batch dimension outside
        every plate raise a ValueError.
    :param str plate: None for one bound of all observations jointly; or the name of a plate that
        holds every latent site (the data plate), for one bound per element of it (each data point
        with its own m particles, as the paper evaluates), returned with that plate's size. Observed
        sites outside the plate (globals conditioned on a value) condition every element alike and are
        left out: the bounds are of log p(x_n | globals). A latent global the guide draws raises.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a tensor: a scalar, or the per-element bounds along ``plate``.
    """
    autoguide = guide
    model, guide = with_given(with_params(held_as_observed(model), params), given), with_params(guide, params)
    _check_observed_sites(model, args, kwargs, plate)
    discretized, hidden, marginals, nesting, held_values = proposal(model, guide, args, kwargs, autoguide, given)
    check_masked_latents_unread(model, args, kwargs)  # weighed by their prior masses
    guide = marginalize(poutine.condition(guide, data=held_values) if held_values else guide, marginals)
    # one common scale taken off every site and put on the bound: s L_m, below s log p(x)
    model_scale, guide_scale = CommonScale(given), CommonScale()
    # a masked-out data point's discrete latents weighed by their masses, as the exact sum weighs them
    guide_d = guide_scale(SummedWithPriorMasses(drawn=True)(discrete(poutine.block(guide, hide=list(hidden)), mode="sample", sites=discretized)))
    model_d = model_scale(SummedWithPriorMasses(drawn=True)(discrete(model, mode="sample")))
    with torch.no_grad():
        bound = importance_bound(
            model_d, guide_d, args, kwargs, num_particles=num_particles, plate=plate, max_plate_nesting=nesting, globals_given=True
        )
    return bound * joint_scale(model=model_scale.ledger, guide=guide_scale.ledger)
