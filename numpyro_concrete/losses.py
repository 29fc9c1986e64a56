"""Multi-sample objectives for SVI: the importance-weighted bound L_m of the paper's section 5 (on
the relaxed or the discrete graph) and VIMCO's score-function estimator of its gradient."""

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from numpyro.infer import ELBO

from ._traces import (
    _importance_bound,
    _log_weights,
    _particle_traces,
    _per_element,
    _sample_sites,
    _site_log_prob,
    _with_params,
)

__all__ = ["ImportanceWeightedELBO", "VIMCO"]


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
