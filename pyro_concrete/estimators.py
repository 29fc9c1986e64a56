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
  side by side are fine, and so are continuous sites before them).
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

import contextlib
import math
from typing import Any, Callable, NamedTuple, Optional

import pyro
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.params import param_with_module_name
from pyro.poutine.messenger import Messenger
from pyro.util import get_rng_state, set_rng_state
from torch import Tensor, nn

from concrete_common import messages
from concrete_common.floats import coldest_temperature, logits_bounds
from concrete_common.messages import named_errors

from ._checks import _in_transform
from ._numerics import log_softmax
from ._traces import (
    held_as_observed,
    importance_traces,
    log_weights,
    model_only_latents,
    per_particle,
    plate_frame,
    replayed_model_trace,
    sample_sites,
    score_log_prob,
    subsampled_plates,
)
from .distributions import BinConcrete, Concrete, ExpConcrete, LogitBinConcrete
from .handlers import rewrap, unwrap
from .hard_concrete import HardConcrete
from .losses import ImportanceWeightedELBO

__all__ = ["REBAR", "RELAX", "GumbelRao", "DisARM"]

_N_ARY = (Concrete, ExpConcrete)
_RELAXED = (Concrete, ExpConcrete, BinConcrete, LogitBinConcrete)


# ----------------------------------------------------------------------------- sites


class _SoftMass(TorchDistribution):
    """The mass of a Concrete-family site's limit, extended linearly to relaxed values:
    ``sum_k s_k log pi_k`` (n-ary) or ``s log p + (1 - s) log(1 - p)`` (binary), ``s`` the value on
    the simplex or the unit interval (``exp``, ``sigmoid`` of a log-space node's value). Exact at the
    limit's values; what the control variates evaluate at relaxed samples, and differentiable in the
    value for the straight-through path."""

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, base, unsampled=None):
        self.base, self.unsampled = base, unsampled
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def support(self):
        return self.base.support

    def expand(self, batch_shape, _instance=None):
        return _SoftMass(self.base.expand(batch_shape), self.unsampled)

    def rsample(self, sample_shape=torch.Size()):
        """Never drawn: the guide's sites hold given values, and the model's are replayed from the
        guide; one that is not raises ``unsampled`` (a latent of the model that the guide does not draw)."""
        raise self.unsampled

    sample = rsample

    def log_prob(self, value):
        logits = self.base.logits
        if isinstance(self.base, ExpConcrete):
            value = torch.exp(value)
        elif isinstance(self.base, LogitBinConcrete):
            value = torch.sigmoid(value)
        if isinstance(self.base, _N_ARY):
            return (value * torch.log_softmax(logits, -1)).sum(-1)
        return value * F.logsigmoid(logits) + (1 - value) * F.logsigmoid(-logits)


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
    return (base, wrappers) if isinstance(base, _RELAXED) else None


class _Site:
    """One latent Concrete-family site of the guide, drawn once per step: its distribution (``base``,
    expanded to the site's shape), relaxed coordinates ``y`` at the site's temperature (log x, or
    logit x), the limit ``b``, and what the estimator derived from them."""

    def __init__(self, base, shape):
        n_ary = isinstance(base, _N_ARY)
        self.n_ary = n_ary
        self.base = base.expand(shape[: len(shape) - len(base.event_shape)])
        self.y = self.base._sample_coordinates(())
        self.b = self.limit(self.y)

    def limit(self, y):
        """The limit of the relaxed coordinates y, as a value of the site (one-hot, log one-hot, 0/1, +-inf)."""
        with torch.no_grad():
            if self.n_ary:
                one_hot = F.one_hot(y.argmax(-1), y.shape[-1]).to(y.dtype)
                return torch.log(one_hot) if isinstance(self.base, ExpConcrete) else one_hot
            ones = y > 0
            if isinstance(self.base, LogitBinConcrete):
                return torch.where(ones, math.inf, -math.inf).to(y.dtype)
            return ones.to(y.dtype)

    def conditional(self, sample_shape=()):
        """Relaxed coordinates given the limit b, at the site's temperature."""
        return self.base._conditional_coordinates(self.b, torch.Size(sample_shape))

    def value(self, y, scale=1.0):
        """The site's value for relaxed coordinates ``y`` at the site's temperature times ``scale``."""
        if self.n_ary:
            y = log_softmax(y / scale)
            return torch.exp(y) if isinstance(self.base, Concrete) else y
        y = y / scale
        return torch.sigmoid(y) if isinstance(self.base, BinConcrete) else y


class _Draws(Messenger):
    """At every latent Concrete-family site of the guide: a :class:`_Site` drawn once, the value
    ``value_of(name, site)`` (the limit b unless the estimator says otherwise), scored by the limit's
    mass (:class:`_SoftMass`). ``sites`` keeps them by name, in the order drawn. A site is drawn
    whatever its value, so that a rerun from the same random state draws the same noise everywhere
    (:func:`_same_randomness`)."""

    def __init__(self, value_of=None):
        self.value_of = value_of or (lambda name, site: site.b)
        self.sites = {}
        super().__init__()

    def _pyro_sample(self, msg):
        found = _relaxed_base(msg)
        if found is None:
            return
        base, wrappers = found
        site = _Site(base, msg["fn"].batch_shape + msg["fn"].event_shape)
        self.sites[msg["name"]] = site
        msg["value"] = self.value_of(msg["name"], site)
        msg["fn"] = rewrap(_SoftMass(base), wrappers)


class _ScoredByMass(Messenger):
    """The model's latent Concrete-family sites scored by their limit's mass (:class:`_SoftMass`);
    one the guide does not draw raises (``loss``: who refuses)."""

    def __init__(self, loss):
        self.loss = loss
        super().__init__()

    def _pyro_sample(self, msg):
        found = _relaxed_base(msg)
        if found is not None:
            unsampled = messages.model_only_discrete_latent(msg["name"], type(found[0]).__name__, self.loss)
            msg["fn"] = rewrap(_SoftMass(found[0], unsampled), found[1])


def _rng_state():
    state = get_rng_state()
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


@contextlib.contextmanager
def _same_randomness(state):
    """Inside, the random numbers drawn from ``state`` are drawn again (the same calls get the same
    noise); after, the generators go on from where they were."""
    now = _rng_state()
    set_rng_state(state)
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    try:
        yield
    finally:
        set_rng_state(now)
        if "cuda" in now:
            torch.cuda.set_rng_state_all(now["cuda"])


class _Replay(NamedTuple):
    """What a world needs to run the guide and the model again with the same noise as the draw: the
    random state before it, and whether anything but the relaxed sites is random or reads them (else
    the draw's guide trace is reused with new values at those sites, and the model replayed against
    it)."""

    state: Any
    rerun: bool


def _with_values(trace, values):
    """A copy of ``trace`` with the sites in ``values`` holding those values (scores dropped)."""
    new = trace.copy()
    for name, value in values.items():
        site = {k: v for k, v in trace.nodes[name].items() if k not in ("log_prob", "log_prob_sum", "unscaled_log_prob", "score_parts")}
        site["value"] = value
        new.nodes[name] = site
    new.compute_log_prob()
    return new


# ----------------------------------------------------------------------------- the losses


class _DiscreteGraphLoss(ImportanceWeightedELBO):
    """The discrete graph's ELBO, one draw of the guide, one ELBO per element of ``plate``; the
    estimators differ in the surrogate whose gradient they are."""

    one_layer = True  # the estimator needs one stochastic layer in the guide
    binary_only = False

    def __init__(self, plate: Optional[str] = None) -> None:
        super().__init__(num_particles=1, plate=plate)

    def guide(self, guide: Callable[..., Any]) -> Callable[..., Any]:
        """``guide`` itself: Pyro's losses declare their own parameters (``pyro.param`` in
        ``loss_and_grads``, which ``SVI.step`` collects); NumPyro's must be declared in the guide, and
        ``SVI(model, loss.guide(guide), optim, loss)`` is the same code in both."""
        return guide

    def _check_traces(self, model_trace, guide_trace):
        pass  # checked as the guide is drawn (_check_latents)

    def _draw(self, model, guide, args, kwargs, value_of=None):
        """(model trace, guide trace, {site: _Site}, _Replay) with the guide's sites drawn as their limits."""
        state = _rng_state()
        draws = _Draws(value_of)
        model_trace, guide_trace = importance_traces(
            _ScoredByMass(type(self).__name__)(held_as_observed(model)), draws(guide), args, kwargs, max_plate_nesting=self._max_plate_nesting
        )
        if not draws.sites:
            raise messages.ModelError("the guide has no Concrete-family site: nothing for the estimator to act on")
        rerun = self._check_latents(model_trace, guide_trace, draws.sites)
        for name, site in draws.sites.items():
            if self.binary_only and site.n_ary:
                raise messages.ModelError(f"site {name!r} is categorical; {type(self).__name__} is for binary sites")
            site.plate_axis = self._plate_axis(guide_trace.nodes[name])
        replay = _Replay(state, rerun)
        if self.one_layer and len(draws.sites) > 1:
            self._check_one_layer(guide, args, kwargs, draws.sites, replay)
        return model_trace, guide_trace, draws.sites, replay

    def _check_latents(self, model_trace, guide_trace, sites):
        """The guide's other latents must be reparameterized, and so must the model's latents that the
        guide does not draw (a Concrete-family one raised when the model drew it). Returns whether
        anything but the relaxed sites is random or reads them -- another latent, an observed site of
        the guide, or a plate's subsample (the guide trace holds no subsample sites to replay) -- so
        that the worlds rerun the guide and the model."""
        name = type(self).__name__
        others = [site for site in sample_sites(guide_trace) if not site["is_observed"] and site["name"] not in sites]
        model_only = model_only_latents(model_trace, guide_trace)
        for site in others:
            if not getattr(site["fn"], "has_rsample", False):
                raise messages.guide_site_without_gradient(site["name"], type(unwrap(site["fn"])[0]).__name__, name)
        for site in model_only:
            if not getattr(site["fn"], "has_rsample", False):
                raise messages.model_only_discrete_latent(site["name"], type(unwrap(site["fn"])[0]).__name__, name)
        # an observed site of the guide (a factor, say) may read the relaxed values: the worlds must
        # score it again, not keep the draw's score (its term dropped out of the gradient)
        observed = any(site["is_observed"] for site in sample_sites(guide_trace))
        return bool(others or model_only or observed or subsampled_plates((model_trace, guide_trace)))

    def _plate_axis(self, node):
        """Where ``plate`` is among the axes of the site's value (None without a plate)."""
        if self.plate is None:
            return None
        return node["value"].dim() - node["fn"].event_dim + plate_frame(node, self.plate).dim

    def _check_one_layer(self, guide, args, kwargs, sites, replay):
        """Reruns the guide with the same noise and one relaxed site at a time at another limit value
        (:func:`_moves`), the others as drawn: the relaxed sites' logits must not change. (Moving
        every site at once missed a dependence that the joint move leaves alone, such as one site's
        logits reading whether two others agree: REBAR's and DisARM's gradients were then biased.)"""
        for moved in _moves(sites):
            feed = _Draws(lambda name, site, moved=moved: moved.get(name, sites[name].b))
            with torch.no_grad(), poutine.block(), _same_randomness(replay.state):
                poutine.trace(feed(guide)).get_trace(*args, **kwargs)
            if any(not torch.equal(feed.sites[name].base.logits, site.base.logits.detach()) for name, site in sites.items()):
                raise messages.ModelError(
                    f"a relaxed site's distribution depends on the value of another relaxed site ({', '.join(map(repr, sites))}): "
                    f"{type(self).__name__} needs one stochastic layer in the guide (sites side by side)"
                )

    def _elbo(self, model_trace, guide_trace):
        """The ELBO per element of ``plate`` (a scalar without one)."""
        return log_weights(model_trace, guide_trace, -1 - self._max_plate_nesting, self.plate).squeeze(0)

    def _site_sum(self, guide_trace, sites):
        """log q of the limits per element, unscaled (the density of the draw, for the score term): the
        sum over the relaxed sites."""
        particle_dim = -1 - self._max_plate_nesting
        return sum(per_particle(score_log_prob(guide_trace.nodes[name]), guide_trace.nodes[name], particle_dim, self.plate).squeeze(0) for name in sites)

    def _world(self, model, guide, guide_trace, values, args, kwargs, model_params, replay):
        """The ELBO with the guide's relaxed sites at ``values`` and the model's parameters in
        ``model_params`` held fixed (the control variates train the guide only). Where anything else
        is random, the guide and the model run again with the draw's noise (a continuous site is
        redrawn given the new values by the same reparameterization); otherwise the draw's guide trace
        holds the new values and the model is replayed against it."""
        # hidden from the handlers outside (SVI.step's parameter trace): a substituted parameter
        # statement records the detached value, which is not the parameter store's
        fixed = poutine.block(poutine.substitute(model, data={name: value.detach() for name, value in model_params.items()}),
                              hide_types=["param"]) if model_params else model
        scored = _ScoredByMass(type(self).__name__)(held_as_observed(fixed))
        if replay.rerun:
            with _same_randomness(replay.state):
                world_model, world_guide = importance_traces(
                    scored, _Draws(lambda name, site: values[name])(guide), args, kwargs, max_plate_nesting=self._max_plate_nesting
                )
            return self._elbo(world_model, world_guide)
        world_guide = _with_values(guide_trace, values)
        world_model = replayed_model_trace(scored, world_guide, args, kwargs)
        return self._elbo(world_model, world_guide)

    def _surrogate(self, model, guide, args, kwargs):
        raise NotImplementedError

    @named_errors()
    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        """-ELBO of the discrete graph in value; its gradient is the estimator's."""
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        surrogate, elbo = self._surrogate(model, guide, args, kwargs)[:2]
        return -(surrogate - surrogate.detach() + elbo.detach()).sum()


def _model_params(model_trace, guide_trace):
    return {name: site["value"] for name, site in model_trace.nodes.items() if site["type"] == "param" and name not in guide_trace.nodes}


def _moved(site, shift, where=None):
    """Another limit value at every coordinate (or those ``where`` is true): a one-hot moved by
    ``shift`` categories (mod K), or the other binary value."""
    b = site.b
    if site.n_ary:
        moved = torch.roll(b, shift, -1)
        return moved if where is None else torch.where(where[..., None], moved, b)
    moved = -b if isinstance(site.base, LogitBinConcrete) else 1 - b
    return moved if where is None else torch.where(where, moved, b)


def _moves(sites):
    """The values :meth:`_DiscreteGraphLoss._check_one_layer` gives the guide, ``{name: value}``, one
    site at a time: every coordinate moved by 1, ..., K - 1 categories (0 <-> 1), then every other
    coordinate (in the order of its elements) moved by one, so that a dependence on whether two
    coordinates of the site agree is seen too."""
    for name, site in sites.items():
        for shift in range(1, site.b.shape[-1] if site.n_ary else 2):
            yield {name: _moved(site, shift)}
        shape = site.b.shape[:-1] if site.n_ary else site.b.shape
        if shape.numel() > 1:
            alternate = (torch.arange(shape.numel(), device=site.b.device) % 2 == 0).reshape(shape)
            yield {name: _moved(site, 1, alternate)}


class _ControlVariateLoss(_DiscreteGraphLoss):
    """REBAR and RELAX: ``f(b) + stop(f(b) - c(z~)) log q(b) + c(z) - c(z~)`` per element, z the
    relaxed sample behind b, z~ a relaxed sample given b, c the control variate; its tunable
    parameters (``{name}.eta``, ``{name}.log_temperature_scale``, RELAX's network) are trained, in
    ``loss_and_grads``, on the sum of squares of the estimate of the guide parameters' gradient
    (a single-sample estimate of its variance, up to a constant)."""

    _frozen = False  # differentiable_loss: the tunables get no gradient

    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        """-ELBO of the discrete graph in value; its gradient is the estimator's, for the guide's and
        the model's parameters. The tunable parameters (``eta``, ``log_temperature_scale``, RELAX's
        network) get none here: the estimator is unbiased for any value of them, so the gradient of
        this loss with respect to them is zero-mean noise, which an optimizer would follow as a random
        walk. ``loss_and_grads`` (``SVI.step``) trains them on the variance objective."""
        self._frozen = True
        try:
            return super().differentiable_loss(model, guide, *args, **kwargs)
        finally:
            self._frozen = False

    def _tunables(self, like):
        """``eta`` and ``exp(log_temperature_scale)``, made at first use with the dtype and device of
        ``like`` (the model's ELBO): a float64 or CUDA model gets float64 or CUDA tunables."""
        prefix = type(self).__name__
        eta = pyro.param(f"{prefix}.eta", lambda: like.new_tensor(1.0))
        scale = pyro.param(f"{prefix}.log_temperature_scale", lambda: like.new_tensor(0.0)).exp()
        return (eta.detach(), scale.detach()) if self._frozen else (eta, scale)

    def _control_variate(self, f_relaxed, values, sites):
        eta, _ = self._tunables(f_relaxed)
        return eta * f_relaxed

    def _components(self, model, guide, args, kwargs):
        """Per element: f(b), log q(b), c(z), c(z~); and the guide's parameter names."""
        model_trace, guide_trace, sites, replay = self._draw(model, guide, args, kwargs)
        f_b = self._elbo(model_trace, guide_trace)
        log_q = self._site_sum(guide_trace, sites)
        _, scale = self._tunables(f_b)
        for name, site in sites.items():
            _check_effective_temperature(type(self).__name__, name, site.base, scale)
        model_params = _model_params(model_trace, guide_trace)
        relaxed = {name: site.value(site.y, scale) for name, site in sites.items()}
        conditional = {name: site.value(site.conditional(), scale) for name, site in sites.items()}
        worlds = [self._world(model, guide, guide_trace, values, args, kwargs, model_params, replay) for values in (relaxed, conditional)]
        c_z = self._control_variate(worlds[0], relaxed, sites)
        c_zt = self._control_variate(worlds[1], conditional, sites)
        guide_names = [name for name, site in guide_trace.nodes.items() if site["type"] == "param"]
        return (f_b, log_q, c_z, c_zt), guide_names

    def _surrogate(self, model, guide, args, kwargs):
        (f_b, log_q, c_z, c_zt), _ = self._components(model, guide, args, kwargs)
        return f_b + (f_b - c_zt).detach() * log_q + c_z - c_zt, f_b

    def loss_and_grads(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        return _named_loss_and_grads(self, model, guide, args, kwargs)


def _check_effective_temperature(estimator, name, base, scale):
    """REBAR and RELAX relax ``base`` at its temperature times ``scale``: the distributions' own bounds
    must hold there too (``_checks._check_logits``), or the relaxed samples overflow and the step's
    gradients are NaN (a scale of e^-44 at temperature 1/2 in float32)."""
    if not base.logits.numel():
        return
    info = torch.finfo(base.logits.dtype)
    _, ratio = logits_bounds(info.eps, info.max)
    least = coldest_temperature(info.tiny, info.max)
    dtype = str(base.logits.dtype).replace("torch.", "")
    coldest = (base.temperature * scale).detach().amin()
    largest = base.logits.detach().abs().amax()
    if _in_transform():  # vmap: no Python number can be read; torch's batched all-true decides
        if not torch._is_all_true(torch.isfinite(coldest) & (coldest >= least) & (largest <= ratio * coldest)):
            raise messages.effective_temperature_in_transform(estimator, name, dtype, least, ratio)
        return
    if messages.effective_temperature_refused(coldest.item(), largest.item(), least, ratio):
        raise messages.effective_temperature(estimator, name, scale.item(), coldest.item(), largest.item(), dtype, least, ratio)


@named_errors()
def _named_loss_and_grads(loss, model, guide, args, kwargs):
    """The estimate g of the guide parameters' gradient, as the vector-Jacobian product of the
    components (f(b), log q(b), c(z), c(z~)) with (1, f(b) - c(z~), 1, -1) -- so that g stays a
    function of the control variate's parameters, which get the gradient of |g|^2; the model's
    parameters get the gradient of f(b)."""
    if loss._max_plate_nesting is None:
        loss._setup(model, guide, args, kwargs)
    store = pyro.get_param_store()
    with poutine.trace(param_only=True) as params:
        (f_b, log_q, c_z, c_zt), guide_names = loss._components(model, guide, args, kwargs)
    prefix = f"{type(loss).__name__}."
    leaves = {name: store.get_param(name).unconstrained() for name in params.trace.nodes}
    guide_leaves = [leaves[name] for name in guide_names]
    ones = torch.ones_like(f_b)
    outputs, cotangents = [f_b, log_q, c_z, c_zt], [ones, f_b - c_zt, ones, -ones]
    used = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]
    estimate = torch.autograd.grad([o for o, _ in used], guide_leaves, [c for _, c in used], create_graph=True, allow_unused=True)
    estimate = [torch.zeros_like(p) if g is None else g for p, g in zip(guide_leaves, estimate)]
    tunables = [leaves[name] for name in leaves if name.startswith(prefix)]
    if tunables:
        square = sum((g * g).sum() for g in estimate)
        for p, g in zip(tunables, torch.autograd.grad(square, tunables, retain_graph=True, allow_unused=True)):
            _accumulate(p, g)
    model_leaves = [p for name, p in leaves.items() if name not in guide_names and not name.startswith(prefix)]
    if model_leaves:
        for p, g in zip(model_leaves, torch.autograd.grad(f_b.sum(), model_leaves, allow_unused=True)):
            _accumulate(p, None if g is None else -g)
    for p, g in zip(guide_leaves, estimate):
        _accumulate(p, -g)
    return -f_b.sum().item()


def _accumulate(leaf, grad):
    """Adds ``grad`` to the leaf's ``.grad``, as ``backward`` does (a gradient already there -- another
    loss's in the same step, an earlier micro-batch's -- is kept, not overwritten)."""
    if grad is None:
        return
    grad = grad.detach()
    leaf.grad = grad.clone() if leaf.grad is None else leaf.grad + grad


class REBAR(_ControlVariateLoss):
    """REBAR (Tucker et al. 2017): the score-function gradient of the discrete graph's ELBO with the
    control variate ``eta f(sigma_lambda(z))``, evaluated at the relaxed sample z behind the limit b
    and, in the score term, at a relaxed sample z~ given b (``conditional_rsample``), where f is the
    ELBO with each relaxed site scored by its limit's mass extended to relaxed values and
    sigma_lambda relaxes at the site's temperature times ``exp(log_temperature_scale)``. Unbiased for
    any ``eta`` and lambda; both are parameters (``REBAR.eta``, ``REBAR.log_temperature_scale``,
    initially 1 and 0) trained to lower the variance of the guide's gradient: ``SVI.step`` does
    (``loss_and_grads``); ``differentiable_loss`` gives the estimator's gradient only, and none to them. The model's
    parameters get the gradient of f(b) alone.

    :param str plate: the data plate (one ELBO, and one learning signal, per element), or None.
    """


class RELAX(_ControlVariateLoss):
    """RELAX (Grathwohl et al. 2018): REBAR's estimator with the control variate
    ``eta f(sigma_lambda(z)) + r(sigma_lambda(z))``, r a network of the relaxed values of the
    guide's sites (per element of ``plate``, their coordinates side by side), trained with ``eta`` and
    lambda to lower the variance of the guide's gradient (see :class:`REBAR`). Unbiased whatever r.

    :param str plate: the data plate, or None.
    :param control_variate: the network r, an ``nn.Module`` from (..., D) features to (..., 1) or (...,); by
        default one hidden layer of ``hidden`` tanh units with a zero output layer (RELAX starts as
        REBAR). Registered as ``RELAX.network``, one per param store: a loaded store's network (resuming)
        is the one trained, and one of other shapes raises a ValueError.
    :param int hidden: the default network's width.
    """

    def __init__(self, plate: Optional[str] = None, control_variate: Optional[nn.Module] = None, hidden: int = 32) -> None:
        super().__init__(plate=plate)
        hidden = messages.check_num_particles(hidden, name="RELAX: hidden")  # the default network's width
        if control_variate is not None and not isinstance(control_variate, nn.Module):  # its parameters are trained
            raise ValueError(
                f"RELAX: control_variate must be an nn.Module (whose parameters are trained), got {type(control_variate).__name__}; "
                "wrap a function in a module"
            )
        self.control_variate, self.hidden = control_variate, hidden
        self._width = None  # the default network's number of features, once built

    def _network(self, features):
        if self.control_variate is None:
            layers = [nn.Linear(features.shape[-1], self.hidden), nn.Tanh(), nn.Linear(self.hidden, 1)]
            nn.init.zeros_(layers[-1].weight)
            nn.init.zeros_(layers[-1].bias)
            self.control_variate = nn.Sequential(*layers).to(device=features.device, dtype=features.dtype)
            self._width = features.shape[-1]
        if getattr(self, "_width", None) is not None and features.shape[-1] != self._width:
            raise messages.network_width(type(self).__name__, self._width, features.shape[-1], self.plate)
        name = f"{type(self).__name__}.network"
        store = pyro.get_param_store()
        for key, value in self.control_variate.named_parameters():
            key = param_with_module_name(name, key)
            if key in store and store[key].shape != value.shape:
                raise messages.ModelError(
                    f"the param store holds {key!r} of shape {tuple(store[key].shape)}, where this network's is "
                    f"{tuple(value.shape)}: the network of another {type(self).__name__} (the names {type(self).__name__}.* "
                    "are the store's, one per store) or of a store saved for another model; clear the param store "
                    "(pyro.clear_param_store()) between models"
                )
        # update_module_params: a network in the param store (a loaded one: resuming) is the one trained
        return pyro.module(name, self.control_variate, update_module_params=True)

    def _control_variate(self, f_relaxed, values, sites):
        eta, _ = self._tunables(f_relaxed)
        features = torch.cat([_per_element_features(value, site, self.plate) for value, site in zip(values.values(), sites.values())], -1)
        network = self._network(features)
        if self._frozen:  # no gradient to the network (see differentiable_loss)
            residual = torch.func.functional_call(network, {k: v.detach() for k, v in network.named_parameters()}, (features,))
        else:
            residual = network(features)
        residual = residual[messages.one_per_row(type(self).__name__, residual.shape, features.shape)]
        return eta * f_relaxed + (residual if self.plate is not None else residual.sum())


def _per_element_to_site(vector, site, plate):
    """A value per element of ``plate`` (a scalar without one), broadcastable to the site's value."""
    if plate is None:
        return vector
    return vector.reshape(vector.shape + (1,) * (site.b.dim() - site.plate_axis - 1))


def _to_elements(values, site, plate):
    """A tensor of the site's shape summed to one value per element of ``plate`` (a scalar without one)."""
    if plate is None:
        return values.sum()
    return values.movedim(site.plate_axis, 0).reshape(values.shape[site.plate_axis], -1).sum(-1)


def _per_element_features(value, site, plate):
    """A site's value as one row per element of ``plate`` (a single row without one)."""
    if isinstance(site.base, ExpConcrete):
        value = torch.exp(value)
    elif isinstance(site.base, LogitBinConcrete):
        value = torch.sigmoid(value)
    if plate is None:
        return value.reshape(1, -1)
    axis = site.plate_axis
    return value.movedim(axis, 0).reshape(value.shape[axis], -1)


class GumbelRao(_DiscreteGraphLoss):
    """Gumbel-Rao (Paulus, Maddison & Krause 2021): the straight-through Gumbel-softmax gradient,
    Rao-Blackwellized over ``num_samples`` relaxed samples given the discrete value. Straight-through
    gives a site the value ``b + x - stop_gradient(x)``, b its limit and x = softmax((logits + G) / t)
    the relaxed sample behind it (sigmoid((logits + L) / t) for a binary site): the gradient of the
    discrete graph's ELBO at b, passed back through dx/dlogits with the noise G held fixed. Gumbel-Rao
    replaces dx/dlogits by its expectation given b: the mean over k noises G_i drawn given b
    (``conditional_rsample``) of softmax((logits + G_i) / t), each G_i held fixed (for the logits
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
        if site.n_ary and temperature.dim() > 0:
            temperature = temperature.unsqueeze(-1)
        y = site.conditional((self.num_samples,)).detach()
        y = y + (logits - logits.detach()) / temperature - y * (temperature - temperature.detach()) / temperature
        soft = site.value(y).mean(0)
        return site.b + soft - soft.detach()

    def _surrogate(self, model, guide, args, kwargs):
        model_trace, guide_trace, _, _ = self._draw(model, guide, args, kwargs, value_of=lambda name, site: self._straight_through(site))
        elbo = self._elbo(model_trace, guide_trace)
        return elbo, elbo


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

    def _surrogate(self, model, guide, args, kwargs):
        model_trace, guide_trace, sites, replay = self._draw(model, guide, args, kwargs)
        f_b = self._elbo(model_trace, guide_trace)
        antithetic = {}
        for name, site in sites.items():
            logits = site.base.logits
            site.b_tilde = site.limit(2 * logits / site.base.temperature - site.y)  # H(a - eps): y = (a + eps) / t
            antithetic[name] = site.b_tilde
        f_bt = self._world(model, guide, guide_trace, antithetic, args, kwargs, {}, replay)
        difference = (f_b - f_bt).detach() / 2
        surrogate = (f_b + f_bt) / 2
        for name, site in sites.items():
            ones, ones_tilde = site.b > 0, site.b_tilde > 0  # 0/1 or -inf/+inf
            sign = torch.where(ones_tilde, -1.0, 1.0)
            coefficient = _per_element_to_site(difference, site, self.plate) * sign * (ones != ones_tilde) * torch.sigmoid(site.base.logits.abs())
            surrogate = surrogate + _to_elements((coefficient.detach() * site.base.logits), site, self.plate)
        return surrogate, (f_b + f_bt) / 2
