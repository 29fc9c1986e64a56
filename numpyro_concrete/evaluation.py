"""Evaluating the discrete graph of a model trained with Concrete relaxations (paper section 3.3).

The helpers put the handlers in the right order themselves: the swap to discrete sites innermost
(around the model and guide, with ``block`` inside it), enumeration and tracing outside.
"""

import contextlib
import functools
import math
import sys
import threading
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import numpyro.infer
import numpyro.primitives
from jax import Array
from numpyro import handlers
from numpyro.primitives import Messenger

from concrete_common import evaluating, messages
from concrete_common.common_scale import joint_scale
from concrete_common.messages import named_errors

from ._traces import (
    RAISED_IN_CALLBACKS,
    CommonScale,
    callback_if,
    raise_if,
    SummedWithPriorMasses,
    check_all_latents_discrete,
    check_masked_latents_unread,
    check_full_data,
    check_given,
    check_observed_densities,
    held_as_observed,
    check_scan,
    importance_bound,
    marginalize,
    max_plate_nesting,
    proposal,
    reraise_from_callbacks,
    sample_sites,
    trace,
    with_given,
    with_params,
)
from .handlers import CONCRETE_FAMILY, DiscreteMessenger, discrete, gather_last, rewrap, unwrap

__all__ = ["marginal_log_likelihood", "map_assignment", "sample_assignment", "Predictive", "discrete_log_likelihood"]


def _isolated(helper):
    """The helper's runs of the model and guide hidden from the handlers outside the call (their
    parameters and mutable state excepted: an outer trace collects them for training, an outer
    ``substitute`` gives their trained values, NumPyro's way to evaluate): a helper called inside a
    model, a ``with relax(...)`` block or a trace computes the value of the model it is given and
    leaves no site in the caller's trace (an outer ``relax`` turned the discrete graph relaxed again;
    a traced caller held the helper's sites beside its own)."""

    @functools.wraps(helper)
    def isolated(*args, **kwargs):
        with handlers.block(expose_types=["param", "mutable"]), _own_dimensions():
            try:
                return helper(*args, **kwargs)
            except RecursionError as error:  # funsor's interpreter: a frame or more per step of a chain
                raise RecursionError(f"{helper.__name__}: {messages.funsor_recursion(sys.getrecursionlimit())}") from error

    return isolated


@contextlib.contextmanager
def _own_dimensions():
    """funsor's enumeration keeps its names and dimensions in one global stack, and the caller's
    enumeration makes every ``numpyro.plate`` a funsor plate (``plate_to_enum_plate`` sets
    ``numpyro.plate.__new__``): the helper starts from a fresh stack and plain plates, and the
    caller's are put back after it (called inside the caller's enumeration, the helper's plates were
    read against the caller's frames: funsor's ``KeyError``)."""
    from numpyro.contrib.funsor import enum_messenger

    def plain(*args, **kwargs):  # what plate_to_enum_plate leaves (deleting it breaks object.__new__)
        return object.__new__(numpyro.plate)

    caller, plate_new = enum_messenger._DIM_STACK, vars(numpyro.plate).get("__new__", plain)
    enum_messenger._DIM_STACK, numpyro.plate.__new__ = enum_messenger.DimStack(), plain
    try:
        yield
    finally:
        enum_messenger._DIM_STACK, numpyro.plate.__new__ = caller, plate_new


@named_errors("marginal_log_likelihood")
@_isolated
def marginal_log_likelihood(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, **kwargs: Any
) -> Array:
    """log p(observations) of the model's discrete graph, exactly: every Concrete-family site is
    replaced by its zero-temperature limit and summed out by funsor's ``log_density`` (NUTS's path;
    no dependency tracking: ``TraceEnum_ELBO``'s fails on jax 0.11, and is wrong on ``scan``).
    Evaluates the whole data set: a subsampled plate raises a ValueError.

    :param model: a model whose latent sites are all Concrete-family or enumerable, or in ``given``.
    :param given: optional dict from latent site name to a value: those sites are held at the values
        and left out of the log joint, so the result is log p(observations | given) (e.g. the
        continuous globals at their posterior point estimates). ``params`` substitutes parameters;
        ``given`` conditions latent sites.
    :param params: optional dict of parameter values (e.g. ``svi.get_params(state)``).
    :returns: a scalar, differentiable with respect to ``params``.
    """
    from numpyro.contrib.funsor import config_enumerate, enum, log_density

    model = with_given(with_params(held_as_observed(model), params), given)
    check_scan(model, args, kwargs)
    nesting = max_plate_nesting(_checked_discrete_trace(model, args, kwargs, given))
    check_masked_latents_unread(model, args, kwargs)  # summed with their prior masses
    unscaled = CommonScale(discrete(model, mode="enumerate"), given)  # summed unscaled, then scaled
    enumerated = SummedWithPriorMasses(config_enumerate(unscaled))  # the model's own discrete sites too
    with evaluating.discrete_graph("marginal_log_likelihood", runtime=numpyro.primitives), _summed_past_underflow():
        log_joint = log_density(enum(enumerated, -1 - nesting), args, kwargs, {})[0]
    return log_joint if unscaled.scale is None else unscaled.scale * log_joint


@contextlib.contextmanager
def _summed_past_underflow():
    """funsor's log-space contraction on JAX summed with ``_log_einsum`` (funsor's own, ``numpy_log``,
    underflows to -inf where the factors favour values of a summed site more than about 87 nats apart
    in float32, 708 in float64); funsor reads the backend's name at each contraction."""
    import funsor.cnf

    backends = funsor.cnf.BACKEND_TO_LOGSUMEXP_BACKEND
    with _SWAP_LOCK:  # counted: helpers of several threads ending in any order give funsor its own back
        if not _SWAPPED:
            _SWAPPED.append(backends["jax"])
            backends["jax"] = "numpyro_concrete._log_einsum"
        _SWAPPED.append(None)
    try:
        yield
    finally:
        with _SWAP_LOCK:
            _SWAPPED.pop()
            if len(_SWAPPED) == 1:
                backends["jax"] = _SWAPPED.pop()


_SWAPPED: list = []  # funsor's own backend, then one entry per helper summing with ours
_SWAP_LOCK = threading.Lock()


def _checked_discrete_trace(model, args, kwargs, given):
    """A trace of the model's discrete graph, after the checks of the exact helpers: ``given`` names
    sites of the model, every latent is enumerable, and no plate subsamples."""
    with evaluating.discrete_graph("the exact helper"):
        traced = trace(discrete(model, mode="enumerate"), jax.random.PRNGKey(0), args, kwargs)
    check_given(traced, given)
    check_all_latents_discrete(traced)
    check_full_data(traced)
    check_observed_densities(traced)
    return traced


@named_errors("map_assignment")
@_isolated
def map_assignment(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, **kwargs: Any
) -> dict[str, Array]:
    """The jointly most probable values of the Concrete-family latent sites under the discrete
    graph, given the observations (max-product: the Viterbi path of a ``markov`` chain, in time linear
    in its length), for the whole data set: a subsampled plate raises a ValueError.

    :param given: optional dict from latent site name to a value, held there (see
        :func:`marginal_log_likelihood`); those sites are not in the result.
    :returns: dict from site name to its value in the site's own sample space (one-hot vectors for
        Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, ±inf for LogitBinConcrete).
    """
    return _assignment(model, args, kwargs, params, given, jax.random.PRNGKey(0), temperature=0)


@named_errors("sample_assignment")
@_isolated
def sample_assignment(
    model: Callable[..., Any], *args: Any, params: Optional[dict[str, Any]] = None, given: Optional[dict[str, Any]] = None, rng_key: Optional[Array] = None, **kwargs: Any
) -> dict[str, Array]:
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
    return _assignment(model, args, kwargs, params, given, rng_key, temperature=1)


def _assignment(model, args, kwargs, params, given, rng_key, *, temperature):
    from numpyro.contrib.funsor import config_enumerate

    def decode(arrays, args, kwargs, method):
        params, given, rng_key = arrays
        conditioned = with_given(with_params(held_as_observed(model), params), given)
        check_scan(conditioned, args, kwargs, decodes=True)
        checked = _checked_discrete_trace(conditioned, args, kwargs, given)
        nesting = max_plate_nesting(checked)
        swap = DiscreteMessenger(conditioned, mode="enumerate")
        unscaled = CommonScale(swap, given)  # p(z | x), not p(z | x)^s normalized
        if temperature == 0:  # the MAP: a masked-out site contributes nothing (see DiscreteMessenger.masks_kept)
            swap.masks_kept = True
            enumerated = config_enumerate(unscaled)
        else:  # a draw from the posterior: a masked-out site drawn from its prior
            enumerated = SummedWithPriorMasses(config_enumerate(unscaled))
        return method(enumerated, swap, checked, nesting, args, kwargs, rng_key)

    arrays = (params, given, rng_key)
    by_conditioning = functools.partial(decode, method=functools.partial(_decode_by_conditioning, by_max_product=temperature == 0))
    traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves((arrays, args, kwargs)))
    if temperature != 0 and not traced:  # drawn with their prior masses (the MAP leaves a masked-out site out, as the host)
        conditioned = with_given(with_params(held_as_observed(model), params), given)  # checked eagerly: compiled, nothing can be read
        check_masked_latents_unread(conditioned, args, kwargs)
    if temperature == 0 and not traced:
        # one forward pass where the maximizer is unique; a tie is seen from its gradient only after
        # the pass, which inside the user's jit / vmap cannot be read: there, always site by site
        decoded, unique = _compiled_if_possible(functools.partial(decode, method=_map_by_max_product), arrays, args, kwargs)
        if bool(unique):
            return decoded
    return _compiled_if_possible(by_conditioning, arrays, args, kwargs)


def _map_by_max_product(enumerated, swap, checked, nesting, args, kwargs, rng_key):
    """(the MAP assignment, whether it is the only one): the gradient of max_z log p(x, z) -- funsor's
    log density in the max-product semiring, which ``markov`` makes a Viterbi recursion -- with
    respect to a zero potential e[k] added to each latent site's log density at its k-th value is
    the indicator of the maximizer's value there. With ties JAX's ``max`` splits the gradient
    between the maximizers, so a value below 1 at a site's best value says that another maximizer
    exists (funsor's decoding, the caller's fallback, picks one consistently)."""
    import funsor
    from numpyro.contrib.funsor import enum
    from numpyro.contrib.funsor.infer_util import _enum_log_density

    latents = {site["name"]: site["fn"] for site in sample_sites(checked) if not site["is_observed"]}

    def max_log_joint(potentials):
        model = enum(_Potentials(enumerated, potentials), -1 - nesting)
        with evaluating.discrete_graph("the decoding", runtime=numpyro.primitives):
            value = _enum_log_density(model, args, kwargs, {}, funsor.ops.max, funsor.ops.add)[0]
        return value.data

    zeros = {name: jnp.zeros(fn.batch_shape + (_support(fn).shape[0],)) for name, fn in latents.items()}
    indicators = jax.grad(max_log_joint)(zeros)
    unique = jnp.all(jnp.stack([jnp.all(jnp.max(g, -1) > 0.999) for g in indicators.values()])) if indicators else True
    decoded = {}
    for name, fn in latents.items():
        value = _support(fn)[jnp.argmax(indicators[name], -1)]
        decoded[name] = swap.index_to_value.get(name, lambda v: v)(value)
    return decoded, unique


def _decode_by_conditioning(enumerated, swap, checked, nesting, args, kwargs, rng_key, *, by_max_product):
    """One latent site after another, each decoded given the sites decoded before it: a draw from
    p(z | x), or (``by_max_product``) a MAP assignment, ties included. The gradient of log p(x) --
    funsor's log density in the sum-product semiring, which ``markov`` makes a forward recursion --
    with respect to a zero potential e[k] added to each site's log density at its k-th value is the
    posterior probability of that value; in the max-product semiring it is the share of the maximizers
    that take it (positive only where one does). A site's value is drawn from the former, or taken
    where the latter is largest, and then held by a potential of 0 there and -inf elsewhere. The sums
    are ``marginal_log_likelihood``'s (:func:`_summed_past_underflow`): funsor's own log-space
    contraction is log(0) = -inf with gradient NaN where no term is possible (a state that no parent
    reaches, in a chain with structural zeros; every state but a held one), and NaN marginals drew
    impossible paths. Time:
    one forward pass per site, linear in a ``markov`` chain's length each, where funsor's
    ``infer_discrete`` is exponential in it.

    The elements of a site (its plates) are decoded at once, independently. That is exact because the
    sites with fewer plates come first: in a model that funsor can sum out (plates nested as a tree),
    the elements of a site in the plates P depend on each other only through sites outside some
    plate of P, and those are then held."""
    import funsor
    from numpyro.contrib.funsor import enum
    from numpyro.contrib.funsor.infer_util import _enum_log_density

    sites = [site for site in sample_sites(checked) if not site["is_observed"]]
    sites.sort(key=lambda site: len(site["cond_indep_stack"]))  # stable: the model's order within
    latents = {site["name"]: site["fn"] for site in sites}
    sum_op = funsor.ops.max if by_max_product else funsor.ops.logaddexp

    def log_joint(potentials):
        model = enum(_Potentials(enumerated, potentials), -1 - nesting)
        summed = contextlib.nullcontext() if by_max_product else _summed_past_underflow()
        with evaluating.discrete_graph("the decoding", runtime=numpyro.primitives), summed:
            value = _enum_log_density(model, args, kwargs, {}, sum_op, funsor.ops.add)[0]
        return value.data

    def decode_site(i, potentials):
        shares = jax.grad(log_joint)(potentials)
        # an element's shares sum to 1; to 0 (or NaN) where every assignment left has probability 0
        undefined = jnp.any(jnp.stack([(i == j) & ~jnp.all(jnp.sum(shares[name], -1) > 0.5) for j, name in enumerate(latents)]))
        error = messages.ModelError(messages.no_posterior(list(latents)))
        callback_if(undefined, lambda flag, error=error: raise_if(bool(np.any(flag)), error), undefined)
        held = {}
        for j, name in enumerate(latents):  # every site's choice, the i-th one's kept: one compiled body
            if by_max_product:
                chosen = jnp.argmax(shares[name], -1)
            else:
                chosen = jax.random.categorical(jax.random.fold_in(rng_key, i), jnp.log(shares[name]))
            hold = jnp.where(jax.nn.one_hot(chosen, shares[name].shape[-1], dtype=bool), 0.0, -jnp.inf)
            held[name] = jnp.where(i == j, hold, potentials[name])
        return held

    zeros = {name: jnp.zeros(fn.batch_shape + (_support(fn).shape[0],)) for name, fn in latents.items()}
    potentials = jax.lax.fori_loop(0, len(latents), decode_site, zeros)
    return {
        name: swap.index_to_value.get(name, lambda v: v)(_support(fn)[jnp.argmax(potentials[name], -1)])
        for name, fn in latents.items()
    }


def _support(fn):
    """A site's values, one per row: (K, *event_shape)."""
    support = fn.enumerate_support(expand=False)
    return jnp.reshape(support, (support.shape[0],) + tuple(fn.event_shape))


class _Potentials(Messenger):
    """Adds ``potentials[name][..., k]`` to the log density of the latent site ``name`` at its k-th
    value (the order of ``enumerate_support``), for the decodings' gradients."""

    def __init__(self, fn, potentials):
        self.potentials = potentials
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"] and msg["name"] in self.potentials:
            # outside the site's masks: a masked-out site's value still matters through its children
            msg["fn"] = _WithPotential(msg["fn"], self.potentials[msg["name"]])


class _WithPotential(dist.Distribution):
    """``base`` with ``potential[..., k]`` added to its log density at its k-th value."""

    def __init__(self, base, potential):
        self.base, self.potential = base, potential
        super().__init__(base.batch_shape, base.event_shape)

    has_enumerate_support = True
    support = property(lambda self: self.base.support)

    def enumerate_support(self, expand=True):
        return self.base.enumerate_support(expand)

    def sample(self, key, sample_shape=()):
        return self.base.sample(key, sample_shape)

    def log_prob(self, value):
        if not self.event_shape and isinstance(unwrap(self.base)[0], (dist.CategoricalLogits, dist.CategoricalProbs)):
            # a value is its own position in the support (arange(K)): gathered, not compared with
            # every value, whose broadcast (..., batch, K) is K times the enumerated log density
            return self.base.log_prob(value) + gather_last(self.potential, value)
        events = len(self.event_shape)
        matches = jnp.expand_dims(value, -1 - events) == _support(self.base)  # (..., K, *event)
        if events:
            matches = jnp.all(matches, axis=tuple(range(-events, 0)))
        return self.base.log_prob(value) + jnp.sum(jnp.where(matches, self.potential, 0.0), -1)


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
    RAISED_IN_CALLBACKS.clear()  # an error left by other compiled code (a loss's check) is not this one's
    try:
        return jax.block_until_ready(jax.jit(run)(arrays, array_leaves))  # a callback's error surfaces here
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return run(arrays, array_leaves)
    except jax.errors.JaxRuntimeError as error:
        reraise_from_callbacks(error)


def _is_relaxed_sample(msg):
    return msg["type"] == "sample" and isinstance(unwrap(msg["fn"])[0], CONCRETE_FAMILY)


class Predictive(numpyro.infer.Predictive):
    """``numpyro.infer.Predictive`` for models with Concrete-family sites; the same arguments. With
    ``infer_discrete=True`` it draws from the model's *discrete graph*: every Concrete-family site
    is drawn from its exact posterior (enumerated, given the observations and the other latents drawn
    from ``guide`` or taken from ``posterior_samples``) and returned in the site's own sample space
    (one-hot vectors for Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, +-inf for
    LogitBinConcrete), not as the enumerated index. Only the draws of the model's other latent sites
    are held: the guide's values of the relaxed sites (its own Concrete-family sites, or an
    autoguide's transformed Normal or Delta there) are hidden, and ``posterior_samples`` of them (NUTS
    on the relaxed model) left out, so that those sites are drawn, and returned, as any other (the
    discrete draws do not start from the relaxed ones). Without
    ``infer_discrete``, ``numpyro.infer.Predictive`` as it is.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        posterior_samples: Optional[dict[str, Array]] = None,
        *,
        guide: Optional[Callable[..., Any]] = None,
        infer_discrete: bool = False,
        **kwargs: Any,
    ) -> None:
        self._swap: Optional[DiscreteMessenger] = None
        self._relaxed_model, self._unblocked_guide = model, guide
        if infer_discrete:
            model = self._swap = DiscreteMessenger(held_as_observed(model), mode="enumerate")
            model = CommonScale(model)  # p(z | x), not p(z | x)^s normalized
        super().__init__(model, posterior_samples, guide=guide, infer_discrete=infer_discrete, **kwargs)
        self._all_posterior_samples: dict[str, Array] = dict(self.posterior_samples)  # the host's: {} when none given

    @named_errors("Predictive")
    def __call__(self, rng_key: Array, *args: Any, **kwargs: Any) -> dict[str, Array]:
        if self._swap is not None:
            relaxed = self._relaxed_sites(rng_key, args, kwargs)
            # the relaxed sites are drawn, not held: posterior samples of them (NUTS on the relaxed
            # model) are left out, and the guide's draws of them hidden
            self.posterior_samples = {name: value for name, value in self._all_posterior_samples.items() if name not in relaxed}
            if self._unblocked_guide is not None:
                self.guide = handlers.block(self._unblocked_guide, hide_fn=lambda msg: _is_relaxed_sample(msg) or msg.get("name") in relaxed)
        samples = super().__call__(rng_key, *args, **kwargs)
        if self._swap is None:
            return samples
        to_value = self._swap.index_to_value  # filled while the swapped model ran
        return {name: self._in_shape(to_value[name](value), relaxed[name]) if name in to_value else value for name, value in samples.items()}

    def _in_shape(self, value, shape):
        """The draws of a site with its plate dimensions: the host's ``infer_discrete`` drops one of size
        1 (a last minibatch of one point)."""
        leading = value.shape[: self.batch_ndims]
        if value.shape[len(leading) :] != shape and math.prod(leading) * math.prod(shape) == value.size:
            return value.reshape(leading + shape)
        return value

    def _relaxed_sites(self, rng_key, args, kwargs):
        """The model's Concrete-family sites, ``{name: value shape}``: the guide's draws of them (an
        autoguide's transformed Normal or Delta) are hidden, so that they are drawn, and returned, as
        the others."""
        # batched over their first axis where the host batches them: batch_ndims 1, with a guide
        batched = self.batch_ndims != 0 and self.params and self.guide is not None
        params = jax.tree_util.tree_map(lambda x: x[0], self.params) if batched else self.params
        traced = trace(handlers.substitute(held_as_observed(self._relaxed_model), data=params), rng_key, args, kwargs)
        check_full_data(traced)  # as the other exact helpers (the host's discrete draws asked for a key)
        check_observed_densities(traced)
        return {site["name"]: tuple(jnp.shape(site["value"])) for site in sample_sites(traced) if not site["is_observed"] and _is_relaxed_sample(site)}


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
    rng_key: Optional[Array] = None,
    **kwargs: Any,
) -> Array:
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
    model, guide = with_given(with_params(held_as_observed(model), params), given), with_params(guide, params)
    for fn in (model, guide):
        check_scan(fn, args, kwargs)
    traced = trace(model, key, args, kwargs)
    check_observed_densities(traced)  # an observed site's value and class do not depend on the draw
    messages.check_plate_of_model(plate, {frame.name for site in sample_sites(traced) for frame in site["cond_indep_stack"]})
    discretized, hidden, marginals, held_values = proposal(model, guide, proposal_key, args, kwargs, autoguide, given)
    check_masked_latents_unread(model, args, kwargs)  # weighed by their prior masses
    guide = marginalize(handlers.condition(guide, data=held_values) if held_values else guide, marginals)
    # one common scale taken off every site and put on the bound: s L_m, below s log p(x)
    # a masked-out data point's discrete latents weighed by their masses, as the exact sum weighs them
    guide_d = CommonScale(SummedWithPriorMasses(discrete(handlers.block(guide, hide=list(hidden)), mode="sample", sites=discretized), drawn=True), every_site=True)
    model_d = CommonScale(SummedWithPriorMasses(discrete(model, mode="sample"), drawn=True), given, every_site=True)
    bound = importance_bound(
        model_d, guide_d, key, args, kwargs, num_particles=num_particles, plate=plate, globals_given=True
    )
    return jax.lax.stop_gradient(bound * joint_scale(model=model_d.ledger, guide=guide_d.ledger))
