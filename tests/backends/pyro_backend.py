"""The Pyro adapter (see ``tests/backends/__init__.py`` for the protocol)."""

import numpy as np
import pyro
import pyro.infer.autoguide as autoguides
import pyro.optim
import torch
from pyro import poutine
from pyro.infer import SVI, JitTrace_ELBO, Trace_ELBO

import pyro_concrete
from pyro_concrete import _numerics

from tests.backends import Run, Site

_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bool": torch.bool}


class Backend:
    name = "pyro"
    particles_by_vmap = False  # how discrete_log_likelihood draws m particles: a plate left of the model's plates: the model must broadcast over it
    lib = pyro_concrete
    cpu_stand_in = True  # tests/test_devices.py: torch makes a new tensor in float32 on the CPU unless told: the CPU in float64 shows it

    def reset(self):
        """Forget parameters of earlier tests."""
        pyro.clear_param_store()

    def array(self, x, dtype="float64", device=None):
        return torch.tensor(np.asarray(x), dtype=_DTYPES[dtype], device=device)

    def copies(self, x):
        """Copies of a value that the PPL's users make: new memory, same content."""
        return [x.clone(), x * 1.0, x.detach().clone().requires_grad_(x.requires_grad) + 0.0]

    def numpy(self, x):
        return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    def device(self, kind):
        """The device of that kind ("cpu" or "gpu"), or None where this machine has none."""
        if kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda") if torch.cuda.is_available() else None

    def placement(self, x):
        """(device kind, dtype name) of an array: ("gpu", "float64")."""
        return ("gpu" if x.device.type == "cuda" else x.device.type), str(x.dtype).removeprefix("torch.")

    def make(self, name, temperature, *, logits=None, probs=None, dtype="float64", validate_args=None, **kwargs):
        def convert(x):
            return None if x is None else self.array(x, dtype)

        if not isinstance(temperature, (int, float)):
            temperature = convert(temperature)
        cls = getattr(self.lib, name)
        return cls(temperature, logits=convert(logits), probs=convert(probs), validate_args=validate_args, **kwargs)

    def sample(self, d, sample_shape=(), seed=0):
        torch.manual_seed(seed)
        shape = torch.Size(sample_shape)
        return d.rsample(shape) if d.has_rsample else d.sample(shape)

    def conditional_sample(self, d, hard, sample_shape=(), seed=0):
        """A relaxed sample of ``d`` given its limit ``hard`` (``conditional_rsample``)."""
        torch.manual_seed(seed)
        return d.conditional_rsample(hard, torch.Size(sample_shape))

    def uniforms(self, d, sample_shape=(), seed=0):
        torch.manual_seed(seed)
        like = d.logits.detach()
        return _numerics.uniform(d.shape(torch.Size(sample_shape)), like).double().numpy()

    def in_trace(self, fn, *args):
        """``fn(*args)``, eagerly as Pyro runs a model; the result as NumPy."""
        out = fn(*args)
        return [self.numpy(o) for o in out] if isinstance(out, (tuple, list)) else self.numpy(out)

    def score_samples(self, d, scorers=(), sample_shape=(), seed=0):
        value = self.sample(d, sample_shape, seed)
        return self.numpy(value), [self.numpy(s.log_prob(value)) for s in (d, *scorers)]

    def value_and_grad(self, fn, *args, dtype="float64", static=None, device=None):
        leaves = [self.array(a, dtype, device).requires_grad_() for a in args]
        out = fn(*(static or ()), *leaves)
        grads = torch.autograd.grad(out, leaves, allow_unused=True)
        grads = [np.zeros(np.shape(a)) if g is None else self.numpy(g) for a, g in zip(args, grads)]
        return out.item(), grads

    def jacobian(self, fn, u):
        u = torch.as_tensor(np.asarray(u), dtype=torch.float64)
        return torch.autograd.functional.jacobian(fn, u).numpy()

    def hessian(self, fn, u):
        u = torch.as_tensor(np.asarray(u), dtype=torch.float64)
        return torch.autograd.functional.hessian(fn, u).numpy()

    def enumerate_support(self, d, expand=True):
        """The enumerated values of a discrete limit (the host's ``enumerate_support``)."""
        return d.enumerate_support(expand)

    def biject_to(self, constraint):
        return torch.distributions.biject_to(constraint)

    # ------------------------------------------------------------------ PPL primitives

    def site(self, name, d, obs=None, infer=None):
        return pyro.sample(name, d, obs=obs, infer=infer)

    def param(self, name, init, dtype="float64", like=None):
        """``like``: an array whose device the parameter takes (the data's, as users write it)."""
        device = None if like is None else like.device
        # a copy (self.array: torch.tensor): torch.as_tensor would share the caller's array, which the optimizer then updates in place
        return pyro.param(name, lambda: self.array(init, dtype, device))

    def trace_guide_then_model(self, guide_dist, model_dist, seed=0):
        def guide():
            return pyro.sample("z", guide_dist)

        def model():
            return pyro.sample("z", model_dist)

        u = self.uniforms(guide_dist, (), seed)
        torch.manual_seed(seed)
        guide_trace = poutine.trace(guide).get_trace()
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace()
        guide_trace.compute_log_prob()
        model_trace.compute_log_prob()
        value = guide_trace.nodes["z"]["value"]
        assert model_trace.nodes["z"]["value"] is value
        return (
            self.numpy(value),
            u,
            self.numpy(guide_trace.nodes["z"]["log_prob"]),
            self.numpy(model_trace.nodes["z"]["log_prob"]),
        )

    def svi(self, model, guide, *args, steps, lr, seed=0, num_particles=1, jit=False, loss=None, raw=False):
        """``raw``: the losses and parameters as the PPL returns them, not NumPy."""
        pyro.clear_param_store()
        pyro.set_rng_seed(seed)
        elbo_class = JitTrace_ELBO if jit else Trace_ELBO
        kwargs = {"ignore_jit_warnings": True} if jit else {}
        elbo = loss or elbo_class(num_particles=num_particles, vectorize_particles=num_particles > 1, **kwargs)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), elbo)
        losses = [svi.step(*args) for _ in range(steps)]
        if raw:
            return losses, dict(pyro.get_param_store().items())
        losses = np.array(losses)
        params = {k: self.numpy(v) for k, v in pyro.get_param_store().items()}
        return losses, params

    def loss_samples(self, model, guide, *args, loss, seeds, at=None, fast=False):
        """The loss and its gradients with respect to the (unconstrained) parameters, one per seed,
        at the parameters' initial values (or those in ``at``, by name): (values (S,), {name: (S, ...)}).
        ``fast``: nothing to gain here (nothing is compiled)."""
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        loss.loss(model, guide, *args)  # creates the parameters (and the loss's own)
        store = pyro.get_param_store()
        for name, value in (at or {}).items():
            store[name] = torch.as_tensor(np.asarray(value), dtype=store[name].dtype)
        values, grads = [], {name: [] for name, _ in store.named_parameters()}
        for seed in seeds:
            pyro.set_rng_seed(seed)
            values.append(loss.loss_and_grads(model, guide, *args))
            for name, p in store.named_parameters():
                grads[name].append(np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy().copy())
                p.grad = None
        return np.array(values), {name: np.array(g) for name, g in grads.items()}

    def control_variate(self, features, hidden=4, seed=0, outputs=None):
        """A RELAX network r (``features`` -> 1) with random weights in both layers, so that r is not
        zero (the default network starts at zero): an ``nn.Module``, (..., 1) out (``outputs``: (...,
        outputs))."""
        generator = np.random.default_rng(seed)
        first, last = torch.nn.Linear(features, hidden), torch.nn.Linear(hidden, outputs or 1)
        for layer, scale in ((first, 1.0), (last, 2.0)):
            layer.weight.data = torch.tensor(generator.normal(0, scale, tuple(layer.weight.shape)))
            layer.bias.data = torch.tensor(generator.normal(0, scale, tuple(layer.bias.shape)))
        return torch.nn.Sequential(first, torch.nn.Tanh(), last)

    def autoguide(self, kind, model, init_values=None):
        if init_values is None:
            return getattr(autoguides, kind)(model)
        return getattr(autoguides, kind)(model, init_loc_fn=autoguides.init_to_value(values=init_values))

    # ------------------------------------------------------------------ models and handlers

    def block(self, fn, hide):
        return poutine.block(fn, hide=hide)

    def in_seed(self, fn, seed=0):
        """``fn()`` under a seed (NumPyro's ``handlers.seed``; Pyro's global one)."""
        pyro.set_rng_seed(seed)
        return fn()

    def deterministic(self, name, value):
        return pyro.deterministic(name, value)

    def plate(self, name, size, subsample_size=None, dim=None, subsample=None):
        """``subsample``: the indices themselves (a list), as a user's own minibatch."""
        if subsample is not None:
            return pyro.plate(name, size, subsample=torch.tensor(subsample), dim=dim)
        return pyro.plate(name, size, subsample_size=subsample_size, dim=dim)

    def markov(self, iterable):
        return pyro.markov(iterable)

    def condition(self, fn, data):
        return poutine.condition(fn, data={k: self.array(v) for k, v in data.items()})

    def hold(self, fn, data):
        """``fn`` with the latent sites in ``data`` held at those values by a handler inside it, as
        Pyro holds a sample site: ``poutine.replay`` of a (partial) trace holding them."""
        held = poutine.Trace()
        for name, value in data.items():
            held.add_node(name, type="sample", value=self.array(value), is_observed=False, infer={})
        return poutine.replay(fn, trace=held)

    def mask(self, mask):
        """A mask from NumPy, or from a tensor the model computed (a subsample of a mask, say)."""
        return poutine.mask(mask=mask if isinstance(mask, torch.Tensor) else self.array(mask, "bool"))

    def scale(self, factor):
        return poutine.scale(scale=factor)

    def normal(self, loc, scale):
        return pyro.distributions.Normal(loc, scale)

    def categorical(self, logits):
        """The host's own Categorical (integer values)."""
        return pyro.distributions.Categorical(logits=logits)

    def bernoulli(self, probs):
        """The host's own Bernoulli, built from probabilities."""
        return pyro.distributions.Bernoulli(probs=probs)

    def one_hot_categorical(self, probs):
        """The host's own OneHotCategorical, built from probabilities."""
        return pyro.distributions.OneHotCategorical(probs=probs)

    def factor(self, name, log_factor):
        return pyro.factor(name, log_factor)

    def delta(self, value, event_dim=0):
        return pyro.distributions.Delta(value, event_dim=event_dim)

    def exp(self, x):
        return torch.exp(x)

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def reparam(self, fn, config):
        return poutine.reparam(fn, config=config)

    def affine_transformed(self, d, loc, scale):
        """The host's TransformedDistribution of ``d`` by x -> loc + scale * x."""
        return pyro.distributions.TransformedDistribution(d, pyro.distributions.transforms.AffineTransform(loc, scale))

    def neutra(self, model, *args):
        """``model`` reparametrized by the host's NeuTraReparam over an (untrained) AutoDiagonalNormal."""
        from pyro.infer.reparam import NeuTraReparam

        guide = autoguides.AutoDiagonalNormal(model)
        guide(*args)  # its parameters
        return NeuTraReparam(guide).reparam(model)

    def transform_reparam(self):
        from pyro.infer.reparam import TransformReparam

        return TransformReparam()

    def run(self, model, *args, seed=0, replay=None, **kwargs):
        """Trace ``model`` (replaying ``replay``, a previous run, if given): a Run."""
        pyro.set_rng_seed(seed)
        fn = model if replay is None else poutine.replay(model, trace=replay.trace)
        trace = poutine.trace(fn).get_trace(*args, **kwargs)
        trace.compute_log_prob()
        sites = {
            name: Site(
                value=self.numpy(site["value"]),
                log_prob=self.numpy(site["log_prob"]),
                fn=type(self.lib.handlers.unwrap(site["fn"])[0]).__name__,
                is_observed=site["is_observed"],
                scale=float(site["scale"]),
            )
            for name, site in trace.nodes.items()
            if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"
        }
        return Run(trace, sites)

    def expanded(self, d, batch_shape):
        """An explicit ExpandedDistribution wrapper (the PPL's own, not the class's expand)."""
        from pyro.distributions.torch_distribution import ExpandedDistribution

        return ExpandedDistribution(d, torch.Size(batch_shape))

    def infer_discrete(self, model, *args, temperature, first_available_dim, seed=0):
        pyro.set_rng_seed(seed)
        decoded = pyro.infer.infer_discrete(model, first_available_dim=first_available_dim, temperature=temperature)
        return self.run(decoded, *args, seed=seed)

    def enum_loss(self, model, guide, *args):
        return pyro.infer.TraceEnum_ELBO(max_plate_nesting=1).loss(model, guide, *args)

    def elbo_loss(self, model, guide, *args, seed=0, num_particles=1, loss=None):
        pyro.set_rng_seed(seed)
        elbo = loss or Trace_ELBO(num_particles=num_particles, vectorize_particles=num_particles > 1)
        return elbo.loss(model, guide, *args)

    def discrete_log_likelihood(self, model, guide, *args, num_particles=1, plate=None, params=None, given=None, seed=0, raw=False):
        pyro.set_rng_seed(seed)
        params = None if params is None else {k: self.array(v) for k, v in params.items()}
        bound = self.lib.discrete_log_likelihood(model, guide, *args, num_particles=num_particles, plate=plate, params=params, given=given)
        return bound if raw else self.numpy(bound)

    def sample_assignment(self, model, *args, given=None, seed=0):
        pyro.set_rng_seed(seed)
        return self.lib.sample_assignment(model, *args, given=given)

    def predictive(self, model, *args, guide=None, posterior_samples=None, num_samples=None, return_sites=None, infer_discrete=False, seed=0, params=None):
        """``params``: parameter values, put in the param store (Pyro's Predictive reads them there)."""
        pyro.set_rng_seed(seed)
        for name, value in (params or {}).items():
            pyro.get_param_store()[name] = self.array(value)
        if posterior_samples is not None:
            posterior_samples = {name: self.array(value) for name, value in posterior_samples.items()}
        elif num_samples is None:
            num_samples = 1
        return self.lib.Predictive(
            model, posterior_samples, guide=guide, num_samples=num_samples, return_sites=return_sites, infer_discrete=infer_discrete
        )(*args)

    # ---- host generic suite

    def pickle_round_trip(self, d):
        """``d`` saved and loaded back as Pyro's test_pickle does (``torch.save`` with the highest
        pickle protocol, ``torch.load(weights_only=False)``)."""
        import io
        import pickle

        buffer = io.BytesIO()
        torch.save(d, buffer, pickle_protocol=pickle.HIGHEST_PROTOCOL)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    def traced_round_trips(self, make):
        """JAX pytree round trips: no Pyro counterpart (its round trip is ``pickle_round_trip``)."""
        import pytest

        pytest.skip("Pyro distributions are not pytrees; Pyro's round trip is pickling (pickle_round_trip)")
