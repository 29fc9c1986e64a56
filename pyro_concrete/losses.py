"""SVI objectives: the importance-weighted bound L_m of the paper's section 5 (on the relaxed or the
discrete graph), the score-function estimators of the discrete graph's gradient (a learned baseline
at m = 1, VIMCO's leave-one-out baseline at m > 1), and Louizos et al.'s expected-L0 objective for
Hard Concrete gates."""

import math
import weakref
from typing import Any, Callable, Optional

import pyro
import torch
from pyro import poutine
from pyro.infer import ELBO
from torch import Tensor

from concrete_common import messages
from concrete_common.messages import named_errors

from ._traces import (
    importance_bound,
    importance_traces,
    log_weights,
    max_plate_nesting,
    model_only_latents,
    particle_traces,
    per_element_at_site,
    per_particle,
    plate_subsampling,
    replayed_traces,
    sample_sites,
    score_function_sites,
    score_log_prob,
    shifted_log_weights,
    weighed,
)
from ._tracing import GraphFunction, make_fx_keeps_detach
from .handlers import unwrap
from .hard_concrete import HardConcrete

__all__ = ["ImportanceWeightedELBO", "VIMCO", "ScoreFunctionELBO", "L0Objective", "JitImportanceWeightedELBO", "JitVIMCO"]


class _DifferentiableLoss(ELBO):
    """A loss defined by its ``differentiable_loss``: the value and the gradients follow from it."""

    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        raise NotImplementedError

    def loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        with torch.no_grad():
            return self.differentiable_loss(model, guide, *args, **kwargs).item()

    def loss_and_grads(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return loss.item()


class ImportanceWeightedELBO(_DifferentiableLoss):
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
        super().__init__(num_particles=num_particles, vectorize_particles=True)
        messages.check_plate_name(plate)
        self.plate = plate
        self._max_plate_nesting = None

    def _get_trace(self, model, guide, args, kwargs):
        """One particle's (model trace, guide trace), the host's ``ELBO`` interface."""
        return importance_traces(model, guide, args, kwargs)

    def _setup(self, model, guide, args, kwargs):
        with torch.no_grad(), poutine.block():
            model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
        self._check_traces(model_trace, guide_trace)
        self._max_plate_nesting = max(max_plate_nesting(model_trace), max_plate_nesting(guide_trace))

    def _check_traces(self, model_trace, guide_trace):
        """Pathwise gradients only: every latent, the guide's and those the model draws itself, must be
        reparameterized."""
        for site in sample_sites(guide_trace):
            if not site["is_observed"] and not getattr(site["fn"], "has_rsample", False):
                raise messages.ModelError(
                    f"guide site {site['name']!r} holds {type(site['fn']).__name__}, which "
                    "is not reparameterized; relax it (Concrete family) or use VIMCO, a score-function estimator"
                )
        for site in model_only_latents(model_trace, guide_trace):
            if not getattr(site["fn"], "has_rsample", False):
                raise messages.model_latent_without_rsample(site["name"], type(unwrap(site["fn"])[0]).__name__, type(self).__name__)

    @named_errors()
    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        bound = importance_bound(
            model, guide, args, kwargs, num_particles=self.num_particles, plate=self.plate, max_plate_nesting=self._max_plate_nesting
        )
        return -bound.sum()



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

    @named_errors()
    def __init__(self, num_particles: int = 2, plate: Optional[str] = None) -> None:
        num_particles = messages.check_num_particles(num_particles, least=2)
        super().__init__(num_particles=num_particles, plate=plate)

    def _check_traces(self, model_trace, guide_trace):
        pass  # any guide: discrete sites get the score-function gradient

    @named_errors()
    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        """-sum L_m in value; its gradient is VIMCO's."""
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        m = self.num_particles
        try:
            model_trace, guide_trace, particle_dim = particle_traces(
                model, guide, args, kwargs, num_particles=m, max_plate_nesting=self._max_plate_nesting
            )
        except (RuntimeError, ValueError) as error:  # the host's shape errors name no cause
            if isinstance(error, (messages.ModelError, torch.OutOfMemoryError)):
                raise
            particle_traces(model, guide, args, kwargs, num_particles=None, max_plate_nesting=self._max_plate_nesting)
            # one draw runs (else its error, the model's own, is raised): the particles' dimension is at fault
            raise messages.particles_not_broadcast(error) from error
        scale = plate_subsampling((model_trace, guide_trace), self.plate, m)
        log_w = log_weights(model_trace, guide_trace, particle_dim, self.plate)
        if scale != 1.0:
            log_w = log_w / scale  # each element's own log weights (see plate_subsampling)
        log_q = sum(  # the score-function part, of the draws themselves: unscaled
            (per_particle(score_log_prob(site), site, particle_dim, self.plate) for site in score_function_sites(model_trace, guide_trace)),
            torch.zeros_like(log_w),
        )
        bound = torch.logsumexp(log_w, 0) - math.log(m)
        w = shifted_log_weights(log_w.detach())
        eye = torch.eye(m, dtype=torch.bool, device=w.device).reshape((m, m) + (1,) * (w.dim() - 1))
        others = torch.where(eye, w.new_zeros(()), w.unsqueeze(0))  # [i, j]: w_j, 0 at j = i
        leave_one_out = others.sum(1) / (m - 1)  # (m, ...): the others' mean (no -inf - -inf: a sum, not a difference)
        replaced = torch.where(eye, leave_one_out.unsqueeze(1), w.unsqueeze(0))  # [i, j]: w_j, w_i replaced
        total, left = torch.logsumexp(w, 0), torch.logsumexp(replaced, 1)
        learning_signal = torch.where(torch.isfinite(left), total - left, bound.detach())
        learning_signal = torch.where(torch.isfinite(total), learning_signal, torch.zeros_like(learning_signal))
        score = scale * (learning_signal * log_q).sum(0)
        return -(scale * bound).sum() - (score - score.detach()).sum()


class ScoreFunctionELBO(ImportanceWeightedELBO):
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
    the data set's ELBO); the learning signal of a site is the whole element's ELBO (no
    Rao-Blackwellization over the dependency graph, unlike ``TraceGraph_ELBO``). The loss value is
    ``-ELBO``; the other terms only contribute gradients.

    :param str plate: the data plate, or None.
    """

    def __init__(self, plate: Optional[str] = None) -> None:
        super().__init__(num_particles=1, plate=plate)

    def _check_traces(self, model_trace, guide_trace):
        pass  # any guide: discrete sites get the score-function gradient

    @named_errors()
    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        """-ELBO in value; its gradient is the score-function estimator's, baselines included."""
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        model_trace, guide_trace, particle_dim = particle_traces(
            model, guide, args, kwargs, num_particles=None, max_plate_nesting=self._max_plate_nesting
        )
        elbo = log_weights(model_trace, guide_trace, particle_dim, self.plate).squeeze(0)
        signal = elbo.detach()
        extra = torch.zeros_like(elbo).sum()  # minus the score terms
        fit = torch.zeros_like(elbo).sum()  # the baselines' squared errors
        fitted: list[Any] = []  # the distinct baselines
        proposed = {site["name"] for site in sample_sites(guide_trace)}
        for site in score_function_sites(model_trace, guide_trace):
            log_q = score_log_prob(site)
            target = per_element_at_site(signal, site, self.plate)
            baseline = messages.baseline_value(site["name"], site["infer"]) if site["name"] in proposed else None
            if baseline is None:
                extra = extra - (target * log_q).sum()
                continue
            baseline = torch.as_tensor(baseline, dtype=log_q.dtype, device=log_q.device)
            _check_baseline_shape(site["name"], baseline.shape, log_q.shape)
            extra = extra - ((target - baseline.detach()) * log_q).sum()
            if not any(baseline is b for b in fitted):
                fitted.append(baseline)
                fit = fit + ((target - baseline) ** 2).sum()
        surrogate = -elbo.sum() + extra - extra.detach()
        return surrogate + _fit_of_own_leaves(fit, surrogate)


def _fit_of_own_leaves(fit, surrogate):
    """A term of value 0 whose gradient is the baselines' squared error's, for the leaves the ELBO's
    surrogate does not reach: a baseline computed from the guide's parameters or its reparameterized
    draws (a head on a shared trunk, c * y of a guide's y) would otherwise pass the fit's gradient to
    them, a gradient of another objective added to the ELBO's (d/d loc -3.79 for -0.10). The
    baseline's own parameters are trained by the fit; those it shares, by the ELBO alone."""
    if not fit.requires_grad:
        return 0.0
    shared = {id(leaf) for leaf in _leaves(surrogate)}
    own = [leaf for leaf in _leaves(fit) if id(leaf) not in shared]
    if not own:
        return 0.0
    grads = torch.autograd.grad(fit, own, retain_graph=True, allow_unused=True)
    term = sum((leaf * g).sum() for leaf, g in zip(own, grads) if g is not None)
    return term - term.detach() if torch.is_tensor(term) else 0.0


def _leaves(tensor):
    """The leaf tensors that ``tensor``'s autograd graph reaches (what ``backward`` would fill)."""
    leaves, seen, stack = [], set(), [tensor.grad_fn] if tensor.grad_fn is not None else []
    if tensor.grad_fn is None and tensor.requires_grad:
        return [tensor]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: its leaf
        if variable is not None:
            leaves.append(variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def _check_baseline_shape(site, shape, batch_shape):
    try:
        fits = torch.broadcast_shapes(shape, batch_shape) == batch_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise messages.baseline_shape(site, shape, batch_shape)


class L0Objective(_DifferentiableLoss):
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

    def _get_trace(self, model, guide, args, kwargs):
        return replayed_traces(model, guide, args, kwargs)

    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
        model_trace.compute_log_prob(site_filter=lambda name, site: site["is_observed"])  # scaled by the plates
        log_likelihood = sum(site["log_prob_sum"] for site in model_trace.nodes.values() if "log_prob_sum" in site)
        gates = [site for site in sample_sites(guide_trace) if isinstance(unwrap(site["fn"])[0], HardConcrete)]
        if not gates:
            raise messages.no_gates()
        others = [site["name"] for site in sample_sites(guide_trace) if not site["is_observed"] and site not in gates]
        others += [site["name"] for site in model_only_latents(model_trace, guide_trace)]
        if others:
            raise messages.l0_other_latents(sorted(set(others)))
        expected_l0 = sum(_expected_open_gates(site) for site in gates)
        return -log_likelihood + self.l0 * expected_l0


def _expected_open_gates(site):
    """Sum over the gates a Hard Concrete site draws of P(gate != 0), weighed as the site's density
    would be: its plates (one gate per element), its masks (a gate masked out is not charged) and its
    scale (a subsampled plate: size / subsample size)."""
    base = unwrap(site["fn"])[0]
    return weighed(site, lambda value: base.prob_nonzero.expand(torch.broadcast_shapes(base.prob_nonzero.shape, value.shape))).sum()


COMPILERS = ("torch.jit.trace", "torch.compile")


class _Compiled(ImportanceWeightedELBO):
    """``differentiable_loss`` compiled with ``pyro.ops.jit.trace``, as Pyro's ``JitTrace_ELBO``
    compiles its loss, or with ``torch.compile`` (``compiler="torch.compile"``: the loss traced
    into one graph of tensor operations, which ``torch.compile`` compiles with ``jit_options``, e.g.
    ``{"mode": "reduce-overhead"}``). The same restrictions either way: static model structure,
    tensors passed in ``*args`` (a temperature that changes between steps too), non-tensors in
    ``**kwargs`` (one compilation per distinct value), and a fixed batch shape per compilation
    (``torch.compile``: a new shape compiles again). ``compiler="torch.compile"`` needs a torch whose
    ``make_fx`` keeps ``detach`` in its graph (2.13 does; 2.14 records it as an alias, which would
    make the gradients wrong): elsewhere it raises a NotImplementedError."""

    def __init__(
        self,
        num_particles: int = 2,
        plate: Optional[str] = None,
        ignore_jit_warnings: bool = False,
        jit_options: Optional[dict[str, Any]] = None,
        compiler: str = "torch.jit.trace",
    ) -> None:
        super().__init__(num_particles=num_particles, plate=plate)
        if compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, got {compiler!r}")
        if compiler == "torch.compile" and not make_fx_keeps_detach():
            raise NotImplementedError(
                f"compiler='torch.compile' on torch {torch.__version__}: its make_fx traces detach() as an alias, so "
                "gradients would flow through every detach of the loss (its score-function surrogate, straight-through "
                "values) and be wrong; use compiler='torch.jit.trace' or the eager loss"
            )
        self.ignore_jit_warnings, self.jit_options, self.compiler = ignore_jit_warnings, jit_options, compiler
        self._compiled: Optional[Callable[..., Tensor]] = None

    @named_errors()
    def differentiable_loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> Tensor:
        if self._max_plate_nesting is None:
            self._setup(model, guide, args, kwargs)
        kwargs["_pyro_model_id"], kwargs["_pyro_guide_id"] = id(model), id(guide)
        compiled = self._compiled
        if compiled is None:
            weakself = weakref.ref(self)  # no cycle through the compiled closure

            def loss(*args, **kwargs):
                del kwargs["_pyro_model_id"], kwargs["_pyro_guide_id"]
                return super(_Compiled, weakself()).differentiable_loss(model, guide, *args, **kwargs)

            if self.compiler == "torch.compile":
                compiled = GraphFunction(loss, self.jit_options or {})
            else:
                compiled = pyro.ops.jit.trace(ignore_warnings=self.ignore_jit_warnings, jit_options=self.jit_options)(loss)
            self._compiled = compiled
        return compiled(*args, **kwargs)

    def loss(self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        return self.differentiable_loss(model, guide, *args, **kwargs).detach().item()


class JitImportanceWeightedELBO(_Compiled, ImportanceWeightedELBO):
    """:class:`ImportanceWeightedELBO` with its loss compiled by ``torch.jit.trace`` (Pyro's
    ``JitTrace_ELBO`` idiom; NumPyro's SVI compiles every loss, so ``numpyro_concrete`` has no
    counterpart). Same restrictions as ``JitTrace_ELBO``: static structure, tensors in ``*args``.

    :param int num_particles: m.
    :param str plate: the data plate, or None.
    :param bool ignore_jit_warnings: passed to ``pyro.ops.jit.trace``.
    :param dict jit_options: passed to ``torch.jit.trace``, or to ``torch.compile``.
    :param str compiler: ``"torch.jit.trace"`` (Pyro's ``pyro.ops.jit``), or ``"torch.compile"``:
        the loss, Pyro's handlers included, traced once into a graph of tensor operations with the
        parameters as inputs (``make_fx``), which ``torch.compile`` compiles: one graph, no
        recompilation from one step to the next, no deprecated TorchScript. With
        ``num_particles=1`` the objective and its gradient are ``Trace_ELBO``'s on reparametrized
        sites: the compiled ELBO of a relaxed model.
    """

    def __init__(
        self,
        num_particles: int = 1,
        plate: Optional[str] = None,
        ignore_jit_warnings: bool = False,
        jit_options: Optional[dict[str, Any]] = None,
        compiler: str = "torch.jit.trace",
    ) -> None:
        super().__init__(num_particles, plate, ignore_jit_warnings, jit_options, compiler)


class JitVIMCO(_Compiled, VIMCO):
    """:class:`VIMCO` with its loss compiled by ``torch.jit.trace`` or ``torch.compile`` (see
    :class:`JitImportanceWeightedELBO`).

    :param int num_particles: m >= 2.
    :param str plate: the data plate, or None.
    :param bool ignore_jit_warnings: passed to ``pyro.ops.jit.trace``.
    :param dict jit_options: passed to ``torch.jit.trace``, or to ``torch.compile``.
    :param str compiler: ``"torch.jit.trace"`` or ``"torch.compile"``.
    """
