"""Multi-sample objectives for SVI: the importance-weighted bound L_m of the paper's section 5 (on
the relaxed or the discrete graph) and VIMCO's score-function estimator of its gradient."""

import math
import weakref

import pyro
import torch
from pyro import poutine
from pyro.infer import ELBO

from ._traces import (
    _importance_bound,
    _log_weights,
    _max_plate_nesting,
    _per_particle,
    _sample_sites,
    _vectorized_traces,
)

__all__ = ["ImportanceWeightedELBO", "VIMCO", "JitImportanceWeightedELBO", "JitVIMCO"]


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
