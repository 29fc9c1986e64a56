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
from pyro.infer import ELBO, TraceEnum_ELBO, config_enumerate, infer_discrete

from .handlers import CONCRETE_FAMILY, DiscreteMessenger, discrete, unwrap

__all__ = [
    "marginal_log_likelihood",
    "map_assignment",
    "discrete_log_likelihood",
    "ImportanceWeightedELBO",
    "VIMCO",
    "JitImportanceWeightedELBO",
    "JitVIMCO",
]


def _with_params(fn, params):
    """``fn`` with its param sites taken from ``params`` -- one dict for model and guide, as
    ``pyro.get_param_store()`` or NumPyro's ``svi.get_params`` give (the names a function does not
    use are expected, so Pyro's warning about them is silenced)."""
    if params is None:
        return fn
    substituted = poutine.substitute(fn, data=params)

    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="pyro.module data did not find params")
            return substituted(*args, **kwargs)

    return run


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
            raise ValueError(
                f"{helper} sums out discrete latent sites exactly; site {site['name']!r} holds "
                f"{type(site['fn']).__name__}, which is neither Concrete-family nor enumerable"
            )


def _no_guide(*args, **kwargs):
    pass


def marginal_log_likelihood(model, *args, params=None, **kwargs):
    """log p(observations) of the model's discrete graph, exactly: every Concrete-family site is
    replaced by its zero-temperature limit and summed out by ``TraceEnum_ELBO``.

    :param model: a model whose latent sites are all Concrete-family or enumerable.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a scalar tensor, differentiable with respect to the parameters.
    """
    model = _with_params(model, params)
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(discrete(model, mode="enumerate")).get_trace(*args, **kwargs)
    _check_all_latents_discrete(trace, "marginal_log_likelihood")
    elbo = TraceEnum_ELBO(max_plate_nesting=_max_plate_nesting(trace))
    enumerated = config_enumerate(discrete(model, mode="enumerate"))  # the model's own discrete sites too
    try:
        return -elbo.differentiable_loss(enumerated, _no_guide, *args, **kwargs)
    except ValueError as error:  # raised when no parameter requires a gradient
        if "cannot be differentiated" not in str(error):
            raise
        return torch.tensor(-elbo.loss(enumerated, _no_guide, *args, **kwargs), dtype=torch.float64)


def map_assignment(model, *args, params=None, **kwargs):
    """The jointly most probable values of the Concrete-family latent sites under the discrete
    graph, given the observations (``infer_discrete`` with ``temperature=0``).

    :returns: dict from site name to its value in the site's own sample space (one-hot vectors for
        Concrete, log one-hot for ExpConcrete, 0/1 for BinConcrete, ±inf for LogitBinConcrete).
    """
    model = _with_params(model, params)
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(discrete(model, mode="enumerate")).get_trace(*args, **kwargs)
        _check_all_latents_discrete(trace, "map_assignment")
        swap = DiscreteMessenger(mode="enumerate")
        decoded = infer_discrete(config_enumerate(swap(model)), first_available_dim=-1 - _max_plate_nesting(trace), temperature=0)
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


def _proposal(model, guide, args, kwargs):
    """Which guide sites to discretize and which to hide for the discrete graph's proposal.

    A model site that is relaxed and drawn in the guide from a Concrete-family distribution is
    discretized there; drawn from anything else (an autoguide's Delta over a transformed Normal),
    it is hidden from the guide -- with its autoguide auxiliary site ``{name}_unconstrained`` -- so
    that the model draws it from its discrete prior. Any other guide site without a model
    counterpart could not be attributed, and raises.
    """
    with torch.no_grad(), poutine.block():
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
    relaxed = _relaxed_latents(model_trace)
    guide_sites = {site["name"]: site for site in _sample_sites(guide_trace)}
    discretized = {name for name in relaxed if name in guide_sites and isinstance(unwrap(guide_sites[name]["fn"])[0], CONCRETE_FAMILY)}
    hidden = {name for name in relaxed & set(guide_sites) if name not in discretized}
    hidden |= {f"{name}_unconstrained" for name in hidden if f"{name}_unconstrained" in guide_sites}
    model_sites = {site["name"] for site in _sample_sites(model_trace)}
    unattributed = set(guide_sites) - model_sites - hidden
    if unattributed:
        raise ValueError(
            f"discrete_log_likelihood: guide site(s) {sorted(unattributed)} have no model counterpart; "
            "the discrete graph's proposal is the guide with its relaxed sites discretized (or hidden, for "
            "an autoguide such as AutoNormal), and these cannot be attributed to a site"
        )
    return discretized, hidden, _max_plate_nesting(model_trace)


def _per_particle(log_prob, site, particle_dim, plate, caller):
    """A site's log_prob summed to shape (num_particles,) or (num_particles, plate size)."""
    log_prob = log_prob.reshape((1,) * max(-particle_dim - log_prob.dim(), 0) + log_prob.shape)
    keep = {log_prob.dim() + particle_dim}
    if plate is not None:
        frames = [f for f in site["cond_indep_stack"] if f.name == plate]
        if not frames:
            raise ValueError(f"{caller}: site {site['name']!r} is outside plate {plate!r}")
        keep.add(log_prob.dim() + frames[0].dim)
    dims = [d for d in range(log_prob.dim()) if d not in keep]
    return log_prob.sum(dims) if dims else log_prob


def _log_weights(model_trace, guide_trace, particle_dim, plate, caller):
    """Per-particle log p(x, z) - log q(z): shape (num_particles,) or (num_particles, plate size).

    A latent site the guide does not draw is drawn by the model from its prior, which is then its
    proposal: its log p cancels against its log q and is left out.
    """
    total = 0.0
    proposed = {site["name"] for site in _sample_sites(guide_trace)}
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        trace.compute_log_prob()
        for site in _sample_sites(trace):
            if sign > 0 and not site["is_observed"] and site["name"] not in proposed:
                continue
            total = total + sign * _per_particle(site["log_prob"], site, particle_dim, plate, caller)
    return total


def _vectorized_traces(model, guide, args, kwargs, num_particles, max_plate_nesting, caller):
    """(model trace, guide trace, particle dim) of m particles drawn in parallel in a plate left of
    the model's plates."""
    particle_dim = -1 - max_plate_nesting

    def vectorized(fn):
        def run(*a, **k):
            with pyro.plate(f"_{caller}_particles", num_particles, dim=particle_dim):
                return fn(*a, **k)

        return run

    guide_trace = poutine.trace(vectorized(guide)).get_trace(*args, **kwargs)
    model_trace = poutine.trace(poutine.replay(vectorized(model), trace=guide_trace)).get_trace(*args, **kwargs)
    return model_trace, guide_trace, particle_dim


def _importance_bound(model, guide, args, kwargs, num_particles, plate, max_plate_nesting, caller):
    """log (1/m) sum_i p(x, z_i) / q(z_i), z_i from the guide, the m particles drawn in parallel in
    a plate left of the model's plates: a scalar, or one bound per element of ``plate``."""
    if not (isinstance(num_particles, int) and num_particles >= 1):
        raise ValueError(f"{caller}: num_particles must be a positive integer, got {num_particles!r}")
    model_trace, guide_trace, particle_dim = _vectorized_traces(model, guide, args, kwargs, num_particles, max_plate_nesting, caller)
    log_weights = _log_weights(model_trace, guide_trace, particle_dim, plate, caller)
    return torch.logsumexp(log_weights, dim=0) - math.log(num_particles)


def discrete_log_likelihood(model, guide, *args, num_particles=1, plate=None, params=None, **kwargs):
    """The importance-weighted bound L_m of the discrete graph (paper eq. 8; the paper's test
    metric): log (1/m) sum_i p(x, z_i) / q(z_i), z_i drawn from the guide with its relaxed sites
    discretized, every Concrete-family model site scored with its discrete mass. m = 1 is the ELBO
    of the discrete graph.

    :param int num_particles: m, drawn in parallel (a plate left of the model's plates).
    :param str plate: None for one bound of all observations jointly; or the name of a plate that
        holds every site (the data plate), for one bound per element of it (each data point with its
        own m particles, as the paper evaluates), returned with that plate's size.
    :param params: optional dict of parameter values (default: Pyro's param store).
    :returns: a tensor: a scalar, or the per-element bounds along ``plate``.
    """
    model, guide = _with_params(model, params), _with_params(guide, params)
    discretized, hidden, max_plate_nesting = _proposal(model, guide, args, kwargs)
    guide_d = discrete(poutine.block(guide, hide=list(hidden)), mode="sample", sites=discretized)
    model_d = discrete(model, mode="sample")
    with torch.no_grad():
        return _importance_bound(model_d, guide_d, args, kwargs, num_particles, plate, max_plate_nesting, "discrete_log_likelihood")


class ImportanceWeightedELBO(ELBO):
    """The importance-weighted bound L_m (paper eq. 8; Burda et al. 2016) as an SVI loss:
    ``-sum log (1/m) sum_i p(x, z_i) / q(z_i)`` with the m particles drawn in parallel -- one bound
    per element of ``plate`` (each data point with its own m particles, as the paper trains and
    evaluates), or one for all observations jointly, as ``RenyiELBO(alpha=0)`` computes. m = 1 is
    the ELBO. The guide's sites must be reparameterized (relaxed sites are).

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
