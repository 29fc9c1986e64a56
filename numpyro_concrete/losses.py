"""SVI objectives: the importance-weighted bound L_m of the paper's section 5 (on the relaxed or the
discrete graph), the score-function estimators of the discrete graph's gradient (a learned baseline
at m = 1, VIMCO's leave-one-out baseline at m > 1), and Louizos et al.'s expected-L0 objective for
Hard Concrete gates."""

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax import Array
from jax.scipy.special import logsumexp
from numpyro.infer import ELBO

from concrete_common import messages
from concrete_common.messages import named_errors

from ._traces import (
    importance_bound,
    importance_traces,
    log_weights,
    model_only_latents,
    per_element,
    per_element_at_site,
    plate_subsampling,
    replayed_traces,
    same_subsample,
    sample_sites,
    score_function_sites,
    score_log_prob,
    shifted_log_weights,
    varying_like,
    weighed,
    with_params,
)
from .handlers import unwrap
from .hard_concrete import HardConcrete

__all__ = ["ImportanceWeightedELBO", "VIMCO", "ScoreFunctionELBO", "L0Objective"]


class ImportanceWeightedELBO(ELBO):
    """The importance-weighted bound L_m (paper eq. 8; Burda et al. 2016) as an SVI loss:
    ``-sum log (1/m) sum_i p(x, z_i) / q(z_i)`` with the m particles drawn in parallel -- one bound
    per element of ``plate`` (each data point with its own m particles, as the paper trains and
    evaluates), or with ``plate=None`` one for all observations jointly. m = 1 is the ELBO. The
    host's ``RenyiELBO(alpha=0)`` also bounds per element, but only of the plates that enclose every
    sample site (a global latent outside the data plate makes its bound joint, silently); here
    ``plate`` is named, and a latent outside it raises a ValueError (condition it on a value, or
    pass ``plate=None``). The guide's sites must be reparameterized (relaxed sites are), and so must
    the latents of the model that the guide does not draw (the model draws them from their prior,
    whose parameters would need a score-function gradient: use :class:`VIMCO`).

    Subsampling (``plate(name, size, subsample_size=...)``): at m = 1 any plate may be subsampled
    (the ELBO is linear in the host's scaled log densities). At m > 1 only ``plate`` itself: each
    element's bound is computed from its unscaled log weights and the sum over the subsample is
    scaled to the plate's size, an unbiased estimate of the sum over the data set; with
    ``plate=None``, or another plate subsampled, a ValueError.

    :param int num_particles: m.
    :param str plate: the data plate, or None.
    """

    @named_errors()
    def __init__(self, num_particles: int = 1, plate: Optional[str] = None) -> None:
        num_particles = messages.check_num_particles(num_particles)
        super().__init__(num_particles=num_particles)
        messages.check_plate_name(plate)
        self.plate = plate

    def _check_traces(self, model_trace, guide_trace):
        """Pathwise gradients only: every latent, the guide's and those the model draws itself, must be
        reparameterized."""
        for site in sample_sites(guide_trace):
            if not site["is_observed"] and not site["fn"].has_rsample:
                raise messages.ModelError(
                    f"guide site {site['name']!r} holds {type(site['fn']).__name__}, which "
                    "is not reparameterized; relax it (Concrete family) or use VIMCO, a score-function estimator"
                )
        for site in model_only_latents(model_trace, guide_trace):
            if not site["fn"].has_rsample:
                raise messages.model_latent_without_rsample(site["name"], type(unwrap(site["fn"])[0]).__name__, type(self).__name__)

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
        model, guide = with_params(model, param_map), with_params(guide, param_map)
        bound = importance_bound(
            model, guide, rng_key, args, kwargs, num_particles=self.num_particles, plate=self.plate, check=self._check_traces
        )
        return {"loss": -jnp.sum(bound), "mutable_state": None}


class VIMCO(ImportanceWeightedELBO):
    """The importance-weighted bound L_m for guides with discrete sites, with Mnih & Rezende's
    (2016) multi-sample score-function gradient -- the paper's baseline for m > 1: each particle's
    log q(z_i) is weighted by L_m minus the bound with log w_i replaced by the mean of the other
    particles' log weights (a leave-one-out baseline, no learned one). Reparameterized guide sites
    get pathwise gradients; the latents of the model that the guide does not draw are proposed by
    their prior, and those without a reparameterized sampler get the same score-function term (the
    gradient of the prior's parameters). The loss value is ``-sum L_m``; one bound per element of
    ``plate``, with subsampling as in :class:`ImportanceWeightedELBO` (only ``plate`` itself).

    Particles the model rules out (log weight -inf) have weight 0. Where it rules out every particle
    but one, the leave-one-out bound of that one is -inf, and its baseline is 0 instead (any baseline
    that does not depend on the particle's own draw keeps the gradient unbiased); where it rules out
    every particle, L_m is -inf and the loss +inf.

    :param int num_particles: m >= 2.
    :param str plate: the data plate, or None.
    """

    can_infer_discrete = True

    @named_errors()
    def __init__(self, num_particles: int = 2, plate: Optional[str] = None) -> None:
        num_particles = messages.check_num_particles(num_particles, least=2)
        super().__init__(num_particles=num_particles, plate=plate)

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
        model, guide = with_params(model, param_map), with_params(guide, param_map)

        m = self.num_particles
        scales = []  # s, read off the traces while vmap traces them (static)
        model, guide, rng_key = same_subsample(model, guide, rng_key, m)

        def particle(particle_key):
            model_trace, guide_trace = importance_traces(model, guide, particle_key, args, kwargs)
            scales.append(plate_subsampling((model_trace, guide_trace), self.plate, m))
            log_w = log_weights(model_trace, guide_trace, self.plate)
            log_q = sum(  # the score-function part, of the draws themselves: unscaled
                (per_element(score_log_prob(site), site, self.plate) for site in score_function_sites(model_trace, guide_trace)),
                jnp.zeros_like(log_w),
            )
            return log_w, log_q

        log_w, log_q = jax.vmap(particle)(jax.random.split(rng_key, m))
        scale = scales[0]
        if scale != 1.0:
            log_w = log_w / scale  # each element's own log weights (see plate_subsampling)
        bound = logsumexp(log_w, axis=0) - math.log(m)
        w = shifted_log_weights(jax.lax.stop_gradient(log_w))
        eye = jnp.eye(m, dtype=bool).reshape((m, m) + (1,) * (w.ndim - 1))
        others = jnp.where(eye, 0.0, w[None])  # [i, j]: w_j, 0 at j = i
        leave_one_out = others.sum(1) / (m - 1)  # (m, ...): the others' mean (no -inf - -inf: a sum, not a difference)
        replaced = jnp.where(eye, leave_one_out[:, None], w[None])  # [i, j]: w_j, w_i replaced
        total, left = logsumexp(w, axis=0), logsumexp(replaced, axis=1)
        learning_signal = jnp.where(jnp.isfinite(left), total - left, jax.lax.stop_gradient(bound))
        learning_signal = jnp.where(jnp.isfinite(total), learning_signal, 0.0)
        score = scale * (learning_signal * log_q).sum(0)
        loss = -(scale * bound).sum() - (score - jax.lax.stop_gradient(score)).sum()
        return {"loss": loss, "mutable_state": None}


class ScoreFunctionELBO(ELBO):
    """The ELBO for guides with discrete sites, with the score-function (REINFORCE) gradient and a
    learned baseline -- the paper's baseline estimator at m = 1 (:class:`VIMCO` at m > 1). Per element
    n of ``plate`` (with ``plate=None``, all observations jointly) the surrogate is

        elbo_n + sum_s stop_gradient(elbo_n - b_sn) log q(z_sn)  +  sum_b (stop_gradient(elbo_n) - b_n)^2

    over the sites s without a reparameterized sampler: the guide's, and the latents of the model that
    the guide does not draw (proposed by their prior, whose parameters get this term). ``log q`` is the
    density of the draw, neither scaled nor masked (as Pyro's ``TraceGraph_ELBO`` scores it), summed
    with its baseline element by element of the site; ``b_s`` is the baseline the guide gives a site
    as Pyro's ``TraceGraph_ELBO`` reads it, ``infer={"baseline": {"baseline_value": b}}`` (e.g. a
    network of the data; 0 where none is given), of a shape that broadcasts to the site's batch shape,
    fitted to elbo_n by squared error, once per distinct baseline (several sites may share one); the
    fit trains the parameters the other terms do not reach (a baseline computed from the guide's
    parameters or its reparameterized draws leaves those to the ELBO's gradient).
    Reparameterized sites get pathwise gradients. Unbiased for the ELBO's gradient whatever the
    baselines, with any plate subsampled (elbo_n holds the host's scaled densities, an estimate of
    the data set's ELBO); the learning signal of a site is the whole element's ELBO (NumPyro's
    ``TraceGraph_ELBO`` takes no baselines). The loss value is ``-ELBO``; the other terms only
    contribute gradients.

    :param str plate: the data plate, or None.
    """

    can_infer_discrete = True

    @named_errors()
    def __init__(self, plate: Optional[str] = None) -> None:
        super().__init__(num_particles=1)
        messages.check_plate_name(plate)
        self.plate = plate

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
        def parts(params):
            return self._parts(rng_key, params, model, guide, args, kwargs)

        surrogate, fit = parts(param_map)
        return {"loss": surrogate + _fit_of_own_params(parts, param_map, fit, (rng_key, args, kwargs)), "mutable_state": None}

    def _parts(
        self, rng_key: Array, param_map: dict[str, Any], model: Callable[..., Any], guide: Callable[..., Any], args: tuple, kwargs: dict
    ) -> tuple[Any, Any]:
        """(the surrogate without the baselines' fit, -ELBO in value; the fit: their squared errors)."""
        model, guide = with_params(model, param_map), with_params(guide, param_map)
        model_trace, guide_trace = importance_traces(model, guide, rng_key, args, kwargs)
        elbo = log_weights(model_trace, guide_trace, self.plate)
        signal = jax.lax.stop_gradient(elbo)
        extra = jnp.zeros_like(jnp.sum(elbo))  # minus the score terms
        fit = None  # the baselines' squared errors
        fitted: list[Any] = []  # the distinct baselines
        proposed = {site["name"] for site in sample_sites(guide_trace)}
        for site in score_function_sites(model_trace, guide_trace):
            log_q = score_log_prob(site)
            target = per_element_at_site(signal, site, self.plate)
            baseline = messages.baseline_value(site["name"], site["infer"]) if site["name"] in proposed else None
            if baseline is None:
                extra = extra - jnp.sum(target * log_q)
                continue
            _check_baseline_shape(site["name"], jnp.shape(baseline), jnp.shape(log_q))
            extra = extra - jnp.sum((target - jax.lax.stop_gradient(baseline)) * log_q)
            if not any(baseline is b for b in fitted):
                fitted.append(baseline)
                fit = jnp.sum((target - baseline) ** 2) + (0.0 if fit is None else fit)
        return -jnp.sum(elbo) + extra - jax.lax.stop_gradient(extra), fit


def _fit_of_own_params(parts, param_map, fit, inputs=()):
    """A term of value 0 whose gradient is the baselines' squared error's, for the parameters the
    ELBO's surrogate does not depend on: a baseline computed from the guide's parameters or its
    reparameterized draws (a head on a shared trunk, c * y of a guide's y) would otherwise pass the
    fit's gradient to them, a gradient of another objective added to the ELBO's (d/d loc -3.78 for
    -0.10). The baseline's own parameters are trained by the fit; those it shares, by the ELBO alone.
    Which parameters each part depends on is read off the parts' jaxpr (an equation's outputs
    depend on all its inputs: a parameter is taken as shared wherever it might be)."""
    if fit is None or not param_map:
        return 0.0
    leaves, treedef = jax.tree_util.tree_flatten(param_map)
    jaxpr = jax.make_jaxpr(lambda *xs: parts(jax.tree_util.tree_unflatten(treedef, xs)))(*leaves).jaxpr
    surrogate_deps, fit_deps = _input_dependencies(jaxpr)
    own = sorted(fit_deps - surrogate_deps)
    if not own:
        return 0.0
    # each shard's fit (shard_map: _traces.varying_like), as the ELBO's gradient is each shard's
    grads = jax.tree_util.tree_leaves(jax.grad(lambda params: parts(params)[1])(varying_like(param_map, inputs)))
    term = sum(jnp.sum(leaves[i] * jax.lax.stop_gradient(grads[i])) for i in own)
    return term - jax.lax.stop_gradient(term)


def _input_dependencies(jaxpr, inputs=None):
    """For each output of ``jaxpr``, the positions of the inputs it depends on differentiably
    (``inputs``: each input's own such set; by default its position). ``stop_gradient`` cuts a
    dependence; a call's body (``pjit``, ``custom_jvp_call``, ...) is followed; any other equation's
    outputs depend on all its inputs."""
    deps = dict(zip(jaxpr.invars, inputs if inputs is not None else ({i} for i in range(len(jaxpr.invars)))))

    def of(var):
        return set() if type(var).__name__ == "Literal" else deps.get(var, set())

    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "stop_gradient":
            outputs = [set() for _ in eqn.outvars]
        else:
            body = next((eqn.params[k] for k in ("jaxpr", "call_jaxpr") if k in eqn.params), None)
            body = getattr(body, "jaxpr", body)  # a ClosedJaxpr's
            if body is not None and hasattr(body, "eqns") and len(body.invars) == len(eqn.invars) and len(body.outvars) == len(eqn.outvars):
                outputs = _input_dependencies(body, [of(var) for var in eqn.invars])
            else:
                union = set().union(*(of(var) for var in eqn.invars))
                outputs = [union for _ in eqn.outvars]
        for var, dependencies in zip(eqn.outvars, outputs):
            deps[var] = dependencies
    return [of(var) for var in jaxpr.outvars]


def _check_baseline_shape(site, shape, batch_shape):
    try:
        fits = jnp.broadcast_shapes(shape, batch_shape) == tuple(batch_shape)
    except ValueError:
        fits = False
    if not fits:
        raise messages.baseline_shape(site, shape, batch_shape)


class L0Objective(ELBO):
    """Louizos, Welling & Kingma's (2018) objective for Hard Concrete gates:
    ``-E_q log p(observations | gates) + l0 * sum_j P_q(gate_j != 0)``, one sample of the guide. The
    log-likelihood of the model's observed sites is scaled by their plates (subsampling); the
    expected L0 norm is the closed-form ``prob_nonzero`` of the guide's :class:`HardConcrete` sites,
    of every gate a site draws (a plate broadcasting one distribution draws one gate per element),
    scaled as the likelihood is (gates in a subsampled plate: size / subsample size).
    Not the ELBO: ``log q(z) - log p(z)`` jumps where a clipped gate sample crosses 0, so its
    pathwise gradient is biased; the expected L0 norm replaces the KL term (eq. 3 and 12 there).

    :param float l0: lambda, the nats charged per open gate.
    """

    def __init__(self, l0: float) -> None:
        super().__init__(num_particles=1)
        self.l0 = messages.check_l0(l0)

    def loss_with_mutable_state(
        self,
        rng_key: Array,
        param_map: dict[str, Any],
        model: Callable[..., Any],
        guide: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        model, guide = with_params(model, param_map), with_params(guide, param_map)
        model_trace, guide_trace = replayed_traces(model, guide, rng_key, args, kwargs)
        log_likelihood = sum(  # scaled by the plates
            jnp.sum(site["fn"].log_prob(site["value"])) * (1.0 if site["scale"] is None else site["scale"])
            for site in sample_sites(model_trace)
            if site["is_observed"]
        )
        gates = [site for site in sample_sites(guide_trace) if isinstance(unwrap(site["fn"])[0], HardConcrete)]
        if not gates:
            raise messages.no_gates()
        others = [site["name"] for site in sample_sites(guide_trace) if not site["is_observed"] and site not in gates]
        others += [site["name"] for site in model_only_latents(model_trace, guide_trace)]
        if others:
            raise messages.l0_other_latents(sorted(set(others)))
        expected_l0 = sum(_expected_open_gates(site) for site in gates)
        return {"loss": -log_likelihood + self.l0 * expected_l0, "mutable_state": None}


def _expected_open_gates(site):
    """Sum over the gates a Hard Concrete site draws of P(gate != 0), weighed as the site's density
    would be: its plates (one gate per element), its masks (a gate masked out is not charged) and its
    scale (a subsampled plate: size / subsample size)."""
    base = unwrap(site["fn"])[0]
    return jnp.sum(weighed(site, lambda value: jnp.broadcast_to(base.prob_nonzero, jnp.broadcast_shapes(jnp.shape(base.prob_nonzero), jnp.shape(value)))))
