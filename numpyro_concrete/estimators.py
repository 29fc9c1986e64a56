"""Gradients of the discrete graph built on the Concrete relaxation, as SVI losses: REBAR (Tucker et
al. 2017), RELAX (Grathwohl et al. 2018), Gumbel-Rao (Paulus, Maddison & Krause 2021) and DisARM
(Dong, Mnih & Tucker 2020).

The model and guide are written as for relaxed training (Concrete / BinConcrete sites, or their
log-space nodes); these losses train the **discrete** graph: the ELBO of the model and guide with
every Concrete-family site replaced by its zero-temperature limit, one draw of the guide per step,
one ELBO per element of ``plate``. Each latent site of the guide is drawn as its limit b = H(z), z
the site's relaxed sample, and scored by the limit's mass; what the relaxation adds is a control
variate (REBAR, RELAX) or the gradient path (Gumbel-Rao). REBAR, RELAX and DisARM are unbiased for
the gradient of the discrete ELBO; Gumbel-Rao is the straight-through estimator's conditional
expectation given the discrete value, biased as straight-through is, with less variance.

What they accept (anything else raises a ValueError that names the site):

- **One stochastic layer of relaxed sites** (REBAR, RELAX, DisARM): no relaxed site's distribution
  may depend on another relaxed site's value (the encoder of a one-layer discrete VAE; several sites
  side by side are fine, and so are continuous sites before them). Inside ``jit`` this is checked by
  the compiled step, which raises a JAX runtime error carrying the same message.
- **Other latents of the guide must be reparameterized** (a Normal, say, before or after the relaxed
  sites): they get pathwise gradients. Where the control variates and DisARM evaluate the ELBO at
  other values of the relaxed sites, the guide and the model are run again with the same noise
  (the same random numbers, or the same JAX key), so that a continuous site that depends on a
  relaxed one is redrawn from its distribution there, by the same reparameterization.
- **Every discrete latent in the guide**: a latent of the model that the guide does not draw is
  drawn from its prior, whose gradient would need a score-function term; only reparameterized ones
  (pathwise) are accepted.
- **Any plate subsampled**: the ELBO of a subsample, with the host's scaled densities, estimates the
  data set's; the score terms use the unscaled density of the draw.
"""

import math
import warnings
from types import SimpleNamespace
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import Array
from numpyro import handlers
from numpyro.infer import ELBO
from numpyro.primitives import Messenger
from numpyro.util import not_jax_tracer

from concrete_common import messages
from concrete_common.floats import coldest_temperature, logits_bounds
from concrete_common.messages import named_errors

from ._traces import (
    held_as_observed,
    importance_traces,
    log_weights,
    model_only_latents,
    per_element,
    callback_if,
    raise_if,
    replayed_model_trace,
    sample_sites,
    score_log_prob,
    subsampled_plates,
    trace,
    varying_like,
    with_params,
)
from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .handlers import rewrap, unwrap
from .hard_concrete import HardConcrete

__all__ = ["REBAR", "RELAX", "GumbelRao", "DisARM"]

_N_ARY = (Concrete, ExpConcrete)
_RELAXED = (Concrete, ExpConcrete, BinConcrete, LogitBinConcrete)


# ----------------------------------------------------------------------------- sites


class _SoftMass(dist.Distribution):
    """The mass of a Concrete-family site's limit, extended linearly to relaxed values:
    ``sum_k s_k log pi_k`` (n-ary) or ``s log p + (1 - s) log(1 - p)`` (binary), ``s`` the value on
    the simplex or the unit interval (``exp``, ``sigmoid`` of a log-space node's value). Exact at the
    limit's values; what the control variates evaluate at relaxed samples, and differentiable in the
    value for the straight-through path."""

    arg_constraints: dict = {}
    reparametrized_params: list = []  # has_rsample: NumPyro keeps the value's gradient (straight-through)
    pytree_aux_fields = ("base", "unsampled")

    def __init__(self, base, unsampled=None):
        self.base, self.unsampled = base, unsampled
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def support(self):
        return self.base.support

    def sample(self, key, sample_shape=()):
        """Never drawn: the guide's sites hold given values, and the model's are replayed from the
        guide; one that is not raises ``unsampled`` (a latent of the model that the guide does not draw)."""
        raise self.unsampled

    def log_prob(self, value):
        logits = self.base.logits
        if isinstance(self.base, ExpConcrete):
            value = jnp.exp(value)
        elif isinstance(self.base, LogitBinConcrete):
            value = jax.nn.sigmoid(value)
        if isinstance(self.base, _N_ARY):
            return (value * jax.nn.log_softmax(logits, -1)).sum(-1)
        return value * jax.nn.log_sigmoid(logits) + (1 - value) * jax.nn.log_sigmoid(-logits)


def _relaxed_base(msg):
    """(base, wrappers) of a latent Concrete-family site, or None; a Hard Concrete site raises."""
    if msg["type"] != "sample" or msg["is_observed"]:
        return None
    base, wrappers = unwrap(msg["fn"])
    if isinstance(base, HardConcrete):
        raise messages.ModelError(
            f"site {msg['name']!r} holds HardConcrete, whose gates have no relaxed limit of their own: train "
            "gates with L0Objective"
        )
    if not isinstance(base, _RELAXED):
        return None
    if msg.get("_control_flow_done"):  # scan's stacked site: the body ran with its own handlers
        raise messages.scanned_site(msg["name"], type(base).__name__)
    return base, wrappers


class _Site:
    """One latent Concrete-family site of the guide, drawn once per step: its distribution (``base``,
    expanded to the site's shape), relaxed coordinates ``y`` at the site's temperature (log x, or
    logit x), the limit ``b``, and what the estimator derived from them."""

    def __init__(self, base, shape, key):
        self.n_ary = isinstance(base, _N_ARY)
        self.base = base.expand(tuple(shape[: len(shape) - len(base.event_shape)]))
        self.key, draw_key = jax.random.split(key)
        self.y = self.base._sample_coordinates(draw_key, ())
        self.b = self.limit(self.y)

    def limit(self, y):
        """The limit of the relaxed coordinates y, as a value of the site (one-hot, log one-hot, 0/1, +-inf)."""
        y = jax.lax.stop_gradient(y)
        if self.n_ary:
            one_hot = jax.nn.one_hot(jnp.argmax(y, -1), y.shape[-1], dtype=y.dtype)
            return jnp.log(one_hot) if isinstance(self.base, ExpConcrete) else one_hot
        ones = y > 0
        if isinstance(self.base, LogitBinConcrete):
            return jnp.where(ones, jnp.inf, -jnp.inf).astype(y.dtype)
        return ones.astype(y.dtype)

    def conditional(self, sample_shape=()):
        """Relaxed coordinates given the limit b, at the site's temperature."""
        return self.base._conditional_coordinates(self.key, self.b, tuple(sample_shape))

    def value(self, y, scale=1.0):
        """The site's value for relaxed coordinates ``y`` at the site's temperature times ``scale``."""
        if self.n_ary:
            y = jax.nn.log_softmax(y / scale, axis=-1)
            return jnp.exp(y) if isinstance(self.base, Concrete) else y
        y = y / scale
        return jax.nn.sigmoid(y) if isinstance(self.base, BinConcrete) else y


class _Draws(Messenger):
    """At every latent Concrete-family site of the guide: a :class:`_Site` drawn once, the value
    ``value_of(name, site)`` (the limit b unless the estimator says otherwise), scored by the limit's
    mass (:class:`_SoftMass`). ``sites`` keeps them by name, in the order drawn. A site takes its key
    whatever its value, so that a rerun with the same key draws the same noise everywhere."""

    def __init__(self, fn, value_of=None):
        self.value_of = value_of or (lambda name, site: site.b)
        self.sites = {}
        super().__init__(fn)

    def process_message(self, msg):
        found = _relaxed_base(msg)
        if found is None:
            return
        base, wrappers = found
        site = _Site(base, msg["fn"].shape(), numpyro.prng_key())
        self.sites[msg["name"]] = site
        msg["value"] = self.value_of(msg["name"], site)
        msg["fn"] = rewrap(_SoftMass(base), wrappers)


class _ScoredByMass(Messenger):
    """The model's latent Concrete-family sites scored by their limit's mass (:class:`_SoftMass`);
    one the guide does not draw raises (``loss``: who refuses)."""

    def __init__(self, fn, loss):
        self.loss = loss
        super().__init__(fn)

    def process_message(self, msg):
        found = _relaxed_base(msg)
        if found is not None:
            unsampled = messages.model_only_discrete_latent(msg["name"], type(found[0]).__name__, self.loss)
            msg["fn"] = rewrap(_SoftMass(found[0], unsampled), found[1])


class _Replay(NamedTuple):
    """What a world needs to run the guide and the model again with the same noise as the draw: the
    draw's key, and whether anything but the relaxed sites is random or reads them (else the draw's
    guide trace is reused with new values at those sites, and the model replayed against it)."""

    key: Any
    rerun: bool


def _with_values(guide_trace, values):
    """A copy of ``guide_trace`` with the sites in ``values`` holding those values, rescored."""
    new = dict(guide_trace)
    for name, value in values.items():
        site = dict(guide_trace[name], value=value)
        log_prob = site["fn"].log_prob(value)
        site["log_prob"] = log_prob if site["scale"] is None else site["scale"] * log_prob
        new[name] = site
    return new


class _FixedParams(Messenger):
    """Parameters held fixed (no gradient): the control variates train the guide only."""

    def postprocess_message(self, msg):
        if msg["type"] == "param":
            msg["value"] = jax.lax.stop_gradient(msg["value"])


# ----------------------------------------------------------------------------- the losses


class _DiscreteGraphLoss(ELBO):
    """The discrete graph's ELBO, one draw of the guide, one ELBO per element of ``plate``; the
    estimators differ in the surrogate whose gradient they are."""

    can_infer_discrete = True
    one_layer = True  # the estimator needs one stochastic layer in the guide
    binary_only = False
    tunable: tuple[str, ...] = ()  # the names (after the class name) of the parameters trained on the variance

    @named_errors()
    def __init__(self, plate: Optional[str] = None) -> None:
        super().__init__(num_particles=1)
        messages.check_plate_name(plate)
        self.plate = plate

    def guide(self, guide: Callable[..., Any]) -> Callable[..., Any]:
        """``guide`` with this estimator's own parameters declared in it (NumPyro's ``SVI.init``
        collects parameters from the model and the guide only): ``SVI(model, loss.guide(guide),
        optim, loss)`` trains them; without it they keep their initial values."""
        return guide

    def _draw(self, model, guide, key, args, kwargs, value_of=None):
        """(model trace, guide trace, {site: _Site}, _Replay) with the guide's sites drawn as their limits."""
        draws = _Draws(guide, value_of)
        model_trace, guide_trace = importance_traces(_ScoredByMass(held_as_observed(model), type(self).__name__), draws, key, args, kwargs)
        if not draws.sites:
            raise messages.ModelError("the guide has no Concrete-family site: nothing for the estimator to act on")
        rerun = self._check_latents(model_trace, guide_trace, draws.sites)
        for name, site in draws.sites.items():
            if self.binary_only and site.n_ary:
                raise messages.ModelError(f"site {name!r} is categorical; {type(self).__name__} is for binary sites")
            site.plate_axis = self._plate_axis(guide_trace[name])
        replay = _Replay(key, rerun)
        if self.one_layer and len(draws.sites) > 1:
            self._check_one_layer(guide, args, kwargs, draws.sites, replay)
        return model_trace, guide_trace, draws.sites, replay

    def _check_latents(self, model_trace, guide_trace, sites):
        """The guide's other latents must be reparameterized, and so must the model's latents that the
        guide does not draw (a Concrete-family one raised when the model drew it). Returns whether
        anything but the relaxed sites is random or reads them -- another latent, an observed site of
        the guide, or a plate's subsample (a model seeded anew would draw another) -- so that the
        worlds rerun the guide and the model."""
        name = type(self).__name__
        others = [site for site in sample_sites(guide_trace) if not site["is_observed"] and site["name"] not in sites]
        model_only = model_only_latents(model_trace, guide_trace)
        for site in others:
            if not site["fn"].has_rsample:
                raise messages.guide_site_without_gradient(site["name"], type(unwrap(site["fn"])[0]).__name__, name)
        for site in model_only:
            if not site["fn"].has_rsample:
                raise messages.model_only_discrete_latent(site["name"], type(unwrap(site["fn"])[0]).__name__, name)
        # an observed site of the guide (a factor, say) may read the relaxed values: the worlds must
        # score it again, not keep the draw's score (its term dropped out of the gradient)
        observed = any(site["is_observed"] for site in sample_sites(guide_trace))
        return bool(others or model_only or observed or subsampled_plates((model_trace, guide_trace)))

    def _plate_axis(self, node):
        """Where ``plate`` is among the axes of the site's value (None without a plate)."""
        if self.plate is None:
            return None
        frames = [f for f in node["cond_indep_stack"] if f.name == self.plate]
        if not frames:
            raise messages.outside_plate(node["name"], self.plate)
        return jnp.ndim(node["value"]) - node["fn"].event_dim + frames[0].dim

    def _check_one_layer(self, guide, args, kwargs, sites, replay):
        """Reruns the guide with the draw's key and one relaxed site at a time at another limit value
        (:func:`_moves`), the others as drawn: the relaxed sites' logits must not change (checked
        inside ``jit`` by a callback that raises). (Moving every site at once missed a dependence
        that the joint move leaves alone, such as one site's logits reading whether two others
        agree: REBAR's and DisARM's gradients were then biased.)"""
        changed = []
        for moved in _moves(sites):
            feed = _Draws(guide, lambda name, site, moved=moved: moved.get(name, sites[name].b))
            trace(handlers.block(feed), jax.random.split(replay.key)[0], args, kwargs)  # the guide's half, as drawn
            changed += [
                jnp.any(jax.lax.stop_gradient(feed.sites[name].base.logits) != jax.lax.stop_gradient(site.base.logits))
                for name, site in sites.items()
            ]
        error = ValueError(  # raised from the compiled step, outside the named boundary: named here
            f"{type(self).__name__}: a relaxed site's distribution depends on the value of another relaxed site "
            f"({', '.join(map(repr, sites))}): {type(self).__name__} needs one stochastic layer in the guide (sites side by side)"
        )
        flag = jnp.any(jnp.stack(changed))
        callback_if(flag, lambda flag: raise_if(bool(flag), error), flag)

    def _elbo(self, model_trace, guide_trace):
        """The ELBO per element of ``plate`` (a scalar without one)."""
        return log_weights(model_trace, guide_trace, self.plate)

    def _site_sum(self, guide_trace, sites):
        """log q of the limits per element, unscaled (the density of the draw, for the score term): the
        sum over the relaxed sites."""
        return sum(per_element(score_log_prob(guide_trace[name]), guide_trace[name], self.plate) for name in sites)

    def _world(self, model, guide, guide_trace, values, args, kwargs, replay, key, fixed_model=False):
        """The ELBO with the guide's relaxed sites at ``values``; ``fixed_model``: with the model's
        parameters held fixed. Where anything else is random, the guide and the model run again with
        the draw's key (a continuous site is redrawn given the new values by the same
        reparameterization); otherwise the draw's guide trace holds the new values and the model,
        seeded with ``key``, is replayed against it."""
        scored = _ScoredByMass(held_as_observed(_FixedParams(model) if fixed_model else model), type(self).__name__)
        if replay.rerun:
            world_guide = _Draws(guide, lambda name, site: values[name])
            return self._elbo(*importance_traces(scored, world_guide, replay.key, args, kwargs))
        world_guide = _with_values(guide_trace, values)
        return self._elbo(replayed_model_trace(scored, world_guide, key, args, kwargs), world_guide)

    def _surrogate(self, key, model, guide, args, kwargs, tunables):
        raise NotImplementedError

    @named_errors()
    def loss_with_mutable_state(
        self,
        rng_key: Array,
        param_map: dict[str, Any],
        model: Callable[..., Any],
        guide: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        prefix = type(self).__name__
        tunables = {name: param_map[name] for name in param_map if name.startswith(f"{prefix}.")}
        model_m, guide_m = with_params(model, param_map), with_params(guide, param_map)
        surrogate, elbo, guide_names = self._surrogate(rng_key, model_m, guide_m, args, kwargs, jax.lax.stop_gradient(tunables))
        loss = -(surrogate - jax.lax.stop_gradient(surrogate) + jax.lax.stop_gradient(elbo)).sum()
        if self.tunable and not tunables:
            warnings.warn(
                f"{prefix}: its parameters ({', '.join(f'{prefix}.{t}' for t in self.tunable)}) are not in the model or guide, "
                f"so they keep their initial values and are not trained on the variance: pass guide=loss.guide(guide) to SVI",
                RuntimeWarning,
                stacklevel=3,  # past the named boundary: the host's call of the loss
            )
        if tunables:
            square = self._square(rng_key, param_map, model, guide, args, kwargs, tunables, guide_names)
            loss = loss + square - jax.lax.stop_gradient(square)
        return {"loss": loss, "mutable_state": None}

    def _square(self, key, param_map, model, guide, args, kwargs, tunables, guide_names):
        """|g|^2, g the estimate of the guide parameters' gradient as a function of the tunables (the
        other parameters held fixed): the vector-Jacobian product of the components (f(b),
        log q(b), c(z), c(z~)) with (1, f(b) - c(z~), 1, -1), whose cotangent stays a function of
        the tunables."""
        fixed = {name: jax.lax.stop_gradient(value) for name, value in param_map.items() if name not in tunables}
        theta = {name: fixed[name] for name in guide_names if name in fixed}

        def components(theta):
            params = {**fixed, **theta, **tunables}
            # the same step again, under grad: its temperatures were checked by the surrogate's run
            return self._components(key, with_params(model, params), with_params(guide, params), args, kwargs, tunables, check=False)[0]

        # each shard's estimate (shard_map: _traces.varying_like), not the sum of the shards'
        (f_b, log_q, c_z, c_zt), vjp = jax.vjp(components, varying_like(theta, (key, args, kwargs)))
        ones = jnp.ones_like(f_b)
        (estimate,) = vjp((ones, f_b - c_zt, ones, -ones))
        return sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(estimate))


def _guide_params(guide_trace):
    return [name for name, site in guide_trace.items() if site["type"] == "param"]


def _moved(site, shift, where=None):
    """Another limit value at every coordinate (or those ``where`` is true): a one-hot moved by
    ``shift`` categories (mod K), or the other binary value."""
    b = site.b
    if site.n_ary:
        moved = jnp.roll(b, shift, -1)
        return moved if where is None else jnp.where(where[..., None], moved, b)
    moved = -b if isinstance(site.base, LogitBinConcrete) else 1 - b
    return moved if where is None else jnp.where(where, moved, b)


def _moves(sites):
    """The values :meth:`_DiscreteGraphLoss._check_one_layer` gives the guide, ``{name: value}``, one
    site at a time: every coordinate moved by 1, ..., K - 1 categories (0 <-> 1), then every other
    coordinate (in the order of its elements) moved by one, so that a dependence on whether two
    coordinates of the site agree is seen too."""
    for name, site in sites.items():
        for shift in range(1, site.b.shape[-1] if site.n_ary else 2):
            yield {name: _moved(site, shift)}
        shape = jnp.shape(site.b)[:-1] if site.n_ary else jnp.shape(site.b)
        size = math.prod(shape)
        if size > 1:
            yield {name: _moved(site, 1, (jnp.arange(size) % 2 == 0).reshape(shape))}


class _ControlVariateLoss(_DiscreteGraphLoss):
    """REBAR and RELAX: ``f(b) + stop(f(b) - c(z~)) log q(b) + c(z) - c(z~)`` per element, z the
    relaxed sample behind b, z~ a relaxed sample given b, c the control variate; its tunable
    parameters (``{name}.eta``, ``{name}.log_temperature_scale``, RELAX's network) are trained on the
    sum of squares of the estimate of the guide parameters' gradient (a single-sample estimate of its
    variance, up to a constant): declared in the guide by :meth:`guide`."""

    tunable: tuple[str, ...] = ("eta", "log_temperature_scale")

    def guide(self, guide: Callable[..., Any]) -> Callable[..., Any]:
        """``guide`` with this estimator's own parameters declared in it (NumPyro's ``SVI.init``
        collects parameters from the model and the guide only): ``SVI(model, loss.guide(guide),
        optim, loss)`` trains them; without it they keep their initial values."""
        prefix = type(self).__name__

        def with_estimator_parameters(*args, **kwargs):
            result = guide(*args, **kwargs)
            numpyro.param(f"{prefix}.eta", 1.0)
            numpyro.param(f"{prefix}.log_temperature_scale", 0.0)
            return result

        return with_estimator_parameters

    def _tunables(self, tunables):
        prefix = type(self).__name__
        return tunables.get(f"{prefix}.eta", 1.0), jnp.exp(tunables.get(f"{prefix}.log_temperature_scale", 0.0))

    def _control_variate(self, f_relaxed, values, sites, tunables):
        return self._tunables(tunables)[0] * f_relaxed

    def _components(self, key, model, guide, args, kwargs, tunables, check=True):
        """Per element: (f(b), log q(b), c(z), c(z~)); and the guide's parameter names."""
        draw_key, world_key = jax.random.split(key)
        model_trace, guide_trace, sites, replay = self._draw(model, guide, draw_key, args, kwargs)
        f_b = self._elbo(model_trace, guide_trace)
        log_q = self._site_sum(guide_trace, sites)
        _, scale = self._tunables(tunables)
        if check:
            _check_effective_temperatures(type(self).__name__, sites, scale)
        relaxed = {name: site.value(site.y, scale) for name, site in sites.items()}
        conditional = {name: site.value(site.conditional(), scale) for name, site in sites.items()}
        worlds = [
            self._world(model, guide, guide_trace, values, args, kwargs, replay, world_key, fixed_model=True)
            for values in (relaxed, conditional)
        ]
        c_z = self._control_variate(worlds[0], relaxed, sites, tunables)
        c_zt = self._control_variate(worlds[1], conditional, sites, tunables)
        return (f_b, log_q, c_z, c_zt), _guide_params(guide_trace)

    def _surrogate(self, key, model, guide, args, kwargs, tunables):
        (f_b, log_q, c_z, c_zt), guide_names = self._components(key, model, guide, args, kwargs, tunables)
        return f_b + jax.lax.stop_gradient(f_b - c_zt) * log_q + c_z - c_zt, f_b, guide_names


def _check_effective_temperatures(estimator, sites, scale):
    """REBAR and RELAX relax each site's ``base`` at its temperature times ``scale``: the
    distributions' own bounds must hold there too (``_checks._check_logits``), or the relaxed samples
    overflow and the step's gradients are NaN (a scale of e^-44 at temperature 1/2 in float32).
    Inside ``jit`` the decisions are made on the device, in the parameters' dtype, and one callback
    for every site raises the first refusal (a callback per site was most of a small model's step);
    it receives logarithms (a callback's arguments take the host thread's x64 mode, which may not be
    the caller's)."""
    stop = jax.lax.stop_gradient
    log_scale = jnp.log(stop(jnp.asarray(scale)))
    traced = []  # (refused, log coldest, log largest, the error's maker)
    for name, site in sites.items():
        base = site.base
        if not jnp.size(base.logits):
            continue
        info = jnp.finfo(base.logits.dtype)
        _, ratio = logits_bounds(float(info.eps), float(info.max))
        least = coldest_temperature(float(info.tiny), float(info.max))
        coldest, largest = jnp.min(stop(base.temperature * scale)), jnp.max(jnp.abs(stop(base.logits)))

        def error(log_scale, log_coldest, log_largest, name=name, dtype=str(info.dtype), least=least, ratio=ratio):
            scale, coldest, largest = (math.inf if float(x) > 709 else math.exp(float(x)) for x in (log_scale, log_coldest, log_largest))
            return messages.effective_temperature(estimator, name, scale, coldest, largest, dtype, least, ratio)

        if not_jax_tracer(coldest) and not_jax_tracer(largest) and not_jax_tracer(log_scale):
            if messages.effective_temperature_refused(float(coldest), float(largest), least, ratio):
                raise error(log_scale, jnp.log(coldest), jnp.log(largest))
        else:
            refused = ~(jnp.isfinite(coldest) & (coldest >= least) & (largest <= ratio * coldest))
            traced.append((refused, jnp.log(coldest), jnp.log(largest), error))
    if traced:
        makers = [maker for *_, maker in traced]

        def check(log_scale, *flat):
            for k, maker in enumerate(makers):
                refused, log_coldest, log_largest = flat[3 * k : 3 * k + 3]
                if bool(refused):
                    raise_if(True, maker(log_scale, log_coldest, log_largest))

        callback_if(jnp.stack([refused for refused, *_ in traced]), check, log_scale, *[x for *values, _ in traced for x in values])


class REBAR(_ControlVariateLoss):
    """REBAR (Tucker et al. 2017): the score-function gradient of the discrete graph's ELBO with the
    control variate ``eta f(sigma_lambda(z))``, evaluated at the relaxed sample z behind the limit b
    and, in the score term, at a relaxed sample z~ given b (``conditional_sample``), where f is the
    ELBO with each relaxed site scored by its limit's mass extended to relaxed values and
    sigma_lambda relaxes at the site's temperature times ``exp(log_temperature_scale)``. Unbiased for
    any ``eta`` and lambda; both are parameters (``REBAR.eta``, ``REBAR.log_temperature_scale``,
    initially 1 and 0) trained to lower the variance of the guide's gradient, once declared in the
    guide: ``SVI(model, loss.guide(guide), optim, loss)``. The model's parameters get the gradient
    of f(b) alone.

    :param str plate: the data plate (one ELBO, and one learning signal, per element), or None.
    """


class RELAX(_ControlVariateLoss):
    """RELAX (Grathwohl et al. 2018): REBAR's estimator with the control variate
    ``eta f(sigma_lambda(z)) + r(sigma_lambda(z))``, r a network of the relaxed values of the
    guide's sites (per element of ``plate``, their coordinates side by side), trained with ``eta`` and
    lambda to lower the variance of the guide's gradient (see :class:`REBAR`). Unbiased whatever r.

    :param str plate: the data plate, or None.
    :param control_variate: the network r, a function from (..., D) features to (...,) or (..., 1) whose
        parameters are ``numpyro.param`` sites named ``RELAX.network...``; by default one hidden
        layer of ``hidden`` tanh units with a zero output layer (RELAX starts as REBAR).
    :param int hidden: the default network's width.
    """

    tunable = ("eta", "log_temperature_scale", "network")

    def __init__(self, plate: Optional[str] = None, control_variate: Optional[Callable[..., Any]] = None, hidden: int = 32) -> None:
        super().__init__(plate=plate)
        hidden = messages.check_num_particles(hidden, name="RELAX: hidden")  # the default network's width
        self.control_variate, self.hidden = control_variate or self._default_network, hidden

    def _default_network(self, features):
        prefix = f"{type(self).__name__}.network"
        inputs, glorot = features.shape[-1], jax.nn.initializers.glorot_uniform()
        w0 = numpyro.param(f"{prefix}.w0", lambda key: glorot(key, (inputs, self.hidden), features.dtype))
        if jnp.shape(w0)[0] != inputs:  # built for the first step's features
            raise messages.network_width(type(self).__name__, jnp.shape(w0)[0], inputs, self.plate)
        b0 = numpyro.param(f"{prefix}.b0", jnp.zeros(self.hidden, features.dtype))
        w1 = numpyro.param(f"{prefix}.w1", jnp.zeros((self.hidden, 1), features.dtype))
        b1 = numpyro.param(f"{prefix}.b1", jnp.zeros(1, features.dtype))
        return (jnp.tanh(features @ w0 + b0) @ w1 + b1)[..., 0]

    def guide(self, guide: Callable[..., Any]) -> Callable[..., Any]:
        """``guide`` with this estimator's own parameters declared in it (NumPyro's ``SVI.init``
        collects parameters from the model and the guide only): ``SVI(model, loss.guide(guide),
        optim, loss)`` trains them; without it they keep their initial values."""
        with_tunables = super().guide(guide)

        @named_errors(type(self).__name__)
        def with_network(*args, **kwargs):
            with handlers.trace() as traced:
                result = with_tunables(*args, **kwargs)
            sites, values = {}, {}
            for name, node in traced.items():
                if node["type"] != "sample" or node["is_observed"]:
                    continue
                base = unwrap(node["fn"])[0]
                base = base.base if isinstance(base, _SoftMass) else base  # inside the loss: drawn by it
                if isinstance(base, _RELAXED):
                    sites[name] = SimpleNamespace(base=base, plate_axis=self._plate_axis(node))
                    values[name] = node["value"]
            features = _features(values, sites, self.plate)
            messages.one_per_row(type(self).__name__, jnp.shape(self.control_variate(features)), features.shape)  # declares its parameters
            return result

        return with_network

    def _control_variate(self, f_relaxed, values, sites, tunables):
        eta, _ = self._tunables(tunables)
        network = {name: value for name, value in tunables.items() if name.startswith(f"{type(self).__name__}.network")}
        if not network:
            return eta * f_relaxed
        features = _features(values, sites, self.plate)
        residual = handlers.substitute(self.control_variate, data=network)(features)
        residual = residual[messages.one_per_row(type(self).__name__, jnp.shape(residual), features.shape)]
        return eta * f_relaxed + (residual if self.plate is not None else residual.sum())


def _features(values, sites, plate):
    """The sites' values side by side, one row per element of ``plate`` (a single row without one)."""
    rows = []
    for name, site in sites.items():
        value = values[name]
        if isinstance(site.base, ExpConcrete):
            value = jnp.exp(value)
        elif isinstance(site.base, LogitBinConcrete):
            value = jax.nn.sigmoid(value)
        if plate is None:
            rows.append(value.reshape(1, -1))
        else:
            moved = jnp.moveaxis(value, site.plate_axis, 0)
            rows.append(moved.reshape(moved.shape[0], -1))
    return jnp.concatenate(rows, -1)


def _per_element_to_site(vector, site, plate):
    """A value per element of ``plate`` (a scalar without one), broadcastable to the site's value."""
    if plate is None:
        return vector
    return vector.reshape(vector.shape + (1,) * (jnp.ndim(site.b) - site.plate_axis - 1))


def _to_elements(values, site, plate):
    """A tensor of the site's shape summed to one value per element of ``plate`` (a scalar without one)."""
    if plate is None:
        return values.sum()
    moved = jnp.moveaxis(values, site.plate_axis, 0)
    return moved.reshape(moved.shape[0], -1).sum(-1)


class GumbelRao(_DiscreteGraphLoss):
    """Gumbel-Rao (Paulus, Maddison & Krause 2021): the straight-through Gumbel-softmax gradient,
    Rao-Blackwellized over ``num_samples`` relaxed samples given the discrete value. Straight-through
    gives a site the value ``b + x - stop_gradient(x)``, b its limit and x = softmax((logits + G) / t)
    the relaxed sample behind it (sigmoid((logits + L) / t) for a binary site): the gradient of the
    discrete graph's ELBO at b, passed back through dx/dlogits with the noise G held fixed. Gumbel-Rao
    replaces dx/dlogits by its expectation given b: the mean over k noises G_i drawn given b
    (``conditional_sample``) of softmax((logits + G_i) / t), each G_i held fixed (for the logits
    and for a learned temperature t alike). Its mean is
    straight-through's for every k (E[E[grad | b]] = E[grad]); its variance falls with k. Biased, as
    straight-through is. The sites must be Concrete or BinConcrete (a log-space node's
    straight-through value carries no gradient); any number of stochastic layers; the guide's other
    latents and the model's latents that the guide does not draw as for the other estimators.

    :param str plate: the data plate, or None.
    :param int num_samples: k, the relaxed samples averaged per site and step.
    """

    one_layer = False

    @named_errors()
    def __init__(self, plate: Optional[str] = None, num_samples: int = 10) -> None:
        num_samples = messages.check_num_particles(num_samples, name="num_samples")
        super().__init__(plate=plate)
        self.num_samples = num_samples

    def _straight_through(self, site):
        if isinstance(site.base, (ExpConcrete, LogitBinConcrete)):
            raise messages.ModelError(
                f"a {type(site.base).__name__} site's straight-through value is the log (logit) of a "
                "discrete value, which carries no gradient: write the site as Concrete / BinConcrete"
            )
        # the noise behind each conditional sample, held fixed: y = (logits + G) / t, G = t y - logits,
        # written so that y is the conditional sample bit for bit: dy/dlogits = 1 / t, dy/dt = -y / t
        logits, temperature = site.base.logits, site.base.temperature
        if site.n_ary:
            temperature = jnp.expand_dims(temperature, -1)
        stop = jax.lax.stop_gradient
        y = stop(site.conditional((self.num_samples,)))
        y = y + (logits - stop(logits)) / temperature - y * (temperature - stop(temperature)) / temperature
        soft = site.value(y).mean(0)
        return site.b + soft - jax.lax.stop_gradient(soft)

    def _surrogate(self, key, model, guide, args, kwargs, tunables):
        value_of = lambda name, site: self._straight_through(site)  # noqa: E731
        model_trace, guide_trace, _, _ = self._draw(model, guide, key, args, kwargs, value_of=value_of)
        elbo = self._elbo(model_trace, guide_trace)
        return elbo, elbo, _guide_params(guide_trace)


class DisARM(_DiscreteGraphLoss):
    """DisARM (Dong, Mnih & Tucker 2020) for binary sites: unbiased, antithetic, no relaxation. The
    logistic noise eps behind each site's limit b = H(a + eps) gives a second value b~ = H(a - eps);
    with f the discrete graph's ELBO per element, the gradient in the logits a is
    ``(f(b) - f(b~)) / 2 * (-1)^b~ * [b != b~] * sigmoid(|a|)`` coordinate by coordinate, and every
    direct dependence (the model's parameters, the guide's continuous sites) gets the mean of the two
    ELBOs' gradients. The loss value is minus that mean. BinConcrete or LogitBinConcrete sites only.

    :param str plate: the data plate, or None.
    """

    binary_only = True

    def _surrogate(self, key, model, guide, args, kwargs, tunables):
        draw_key, world_key = jax.random.split(key)
        model_trace, guide_trace, sites, replay = self._draw(model, guide, draw_key, args, kwargs)
        f_b = self._elbo(model_trace, guide_trace)
        antithetic = {}
        for name, site in sites.items():
            site.b_tilde = site.limit(2 * site.base.logits / site.base.temperature - site.y)  # H(a - eps): y = (a + eps) / t
            antithetic[name] = site.b_tilde
        f_bt = self._world(model, guide, guide_trace, antithetic, args, kwargs, replay, world_key)
        difference = jax.lax.stop_gradient(f_b - f_bt) / 2
        surrogate = (f_b + f_bt) / 2
        for site in sites.values():
            ones, ones_tilde = site.b > 0, site.b_tilde > 0  # 0/1 or -inf/+inf
            sign = jnp.where(ones_tilde, -1.0, 1.0)
            coefficient = _per_element_to_site(difference, site, self.plate) * sign * (ones != ones_tilde) * jax.nn.sigmoid(jnp.abs(site.base.logits))
            surrogate = surrogate + _to_elements(jax.lax.stop_gradient(coefficient) * site.base.logits, site, self.plate)
        return surrogate, (f_b + f_bt) / 2, _guide_params(guide_trace)
