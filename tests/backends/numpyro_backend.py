"""The NumPyro adapter (see ``tests/backends/__init__.py`` for the protocol).

Every sample draws from ``jax.random.PRNGKey(seed)``; the PPL round trip and SVI run inside
``jax.jit`` (NumPyro's normal mode), where the values the model sees are tracers. JAX's x64 mode is
set per test by ``tests/conftest.py``: off for float32 cases, as a float32 user runs them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.infer.autoguide as autoguides
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO

import numpyro_concrete
from numpyro_concrete import _numerics
from tests.backends import Run, Site

_DTYPES = {"float16": jnp.float16, "float32": jnp.float32, "float64": jnp.float64, "int64": jnp.int64, "bool": jnp.bool_}


class Backend:
    name = "numpyro"
    particles_by_vmap = True  # how discrete_log_likelihood draws m particles: vmap: any model works
    lib = numpyro_concrete
    cpu_stand_in = False  # tests/test_devices.py: JAX makes arrays in the x64 mode's dtype on the default device: nothing to catch on the CPU

    def reset(self):
        """Forget parameters of earlier tests."""
        pass  # NumPyro keeps no global state between calls

    def array(self, x, dtype="float64", device=None):
        value = jnp.asarray(np.asarray(x), dtype=_DTYPES[dtype])
        return value if device is None else jax.device_put(value, device)

    def copies(self, x):
        """Copies of a value that the PPL's users make: new arrays, same content."""
        return [x * 1.0, jnp.array(x, copy=True), x + 0.0]

    def numpy(self, x):
        return np.asarray(x)

    def device(self, kind):
        """The device of that kind ("cpu" or "gpu"), or None where this machine has none."""
        try:
            return jax.devices(kind)[0]
        except RuntimeError:  # no such platform (or JAX_PLATFORMS leaves it out)
            return None

    def placement(self, x):
        """(device kind, dtype name) of an array: ("gpu", "float64")."""
        (device,) = x.devices()
        return ("gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform), str(x.dtype)

    def make(self, name, temperature, *, logits=None, probs=None, dtype="float64", validate_args=None, **kwargs):
        def convert(x):
            return None if x is None else self.array(x, dtype)

        if not isinstance(temperature, (int, float)):
            temperature = convert(temperature)
        cls = getattr(self.lib, name)
        return cls(temperature, logits=convert(logits), probs=convert(probs), validate_args=validate_args, **kwargs)

    def sample(self, d, sample_shape=(), seed=0):
        return d.sample(jax.random.PRNGKey(seed), tuple(sample_shape))

    def conditional_sample(self, d, hard, sample_shape=(), seed=0):
        """A relaxed sample of ``d`` given its limit ``hard`` (``conditional_sample``)."""
        return d.conditional_sample(jax.random.PRNGKey(seed), hard, tuple(sample_shape))

    def uniforms(self, d, sample_shape=(), seed=0):
        return self._uniforms(d, tuple(sample_shape), jax.random.PRNGKey(seed))

    @staticmethod
    def _uniforms(d, sample_shape, key):
        return np.asarray(_numerics.uniform(key, d.shape(sample_shape), d.logits.dtype), dtype=np.float64)

    def in_trace(self, fn, *args):
        """``fn(*args)`` inside ``jax.jit``, as NumPyro runs a model; the result as NumPy."""
        return jax.tree_util.tree_map(np.asarray, jax.jit(fn)(*args))

    def score_samples(self, d, scorers=(), sample_shape=(), seed=0):
        value, log_probs = _score_samples(d, tuple(scorers), tuple(sample_shape), jax.random.PRNGKey(seed))
        return np.asarray(value), [np.asarray(lp) for lp in log_probs]

    def value_and_grad(self, fn, *args, dtype="float64", static=None, device=None):
        args = [self.array(a, dtype, device) for a in args]
        if static is None:  # a closure: eager, sharing JAX's per-operation compile cache
            value, grads = jax.value_and_grad(fn, argnums=tuple(range(len(args))))(*args)
        else:  # a module-level function: one compiled gradient per (fn, static, shapes)
            value, grads = _compiled_value_and_grad(fn, tuple(static), len(args))(*args)
        return float(value), [np.asarray(g) for g in grads]

    def jacobian(self, fn, u):
        return np.asarray(jax.jacfwd(fn)(jnp.asarray(np.asarray(u), dtype=jnp.float64)))

    def hessian(self, fn, u):
        return np.asarray(jax.hessian(fn)(jnp.asarray(np.asarray(u), dtype=jnp.float64)))

    def enumerate_support(self, d, expand=True):
        """The enumerated values of a discrete limit: NumPyro's one-hot, log one-hot and +-inf limits
        refuse the host's ``enumerate_support`` (its enumeration takes values to be integers:
        tests/test_numpyro_jax.py), and hold the values the library enumerates in ``_enumerated_values``."""
        return getattr(d, "_enumerated_values", d.enumerate_support)(expand)

    def biject_to(self, constraint):
        return biject_to(constraint)

    # ------------------------------------------------------------------ PPL primitives

    def site(self, name, d, obs=None, infer=None):
        return numpyro.sample(name, d, obs=obs, infer=infer)

    def param(self, name, init, dtype="float64", like=None):
        """``like``: an array whose device the parameter takes (the data's, as users write it)."""
        placed = like is not None and not isinstance(like, jax.core.Tracer)  # (under jit the computation places it)
        return numpyro.param(name, self.array(init, dtype, next(iter(like.devices())) if placed else None))

    def trace_guide_then_model(self, guide_dist, model_dist, seed=0):
        """Inside ``jax.jit``, as in a jitted SVI step: the model's site receives a tracer."""
        key = jax.random.PRNGKey(seed)
        value, guide_log_prob, model_log_prob = _round_trip(guide_dist, model_dist, key)
        u = self._uniforms(guide_dist, (), jax.random.split(key)[1])  # the key `seed` hands the site
        return np.asarray(value), u, np.asarray(guide_log_prob), np.asarray(model_log_prob)

    def svi(self, model, guide, *args, steps, lr, seed=0, num_particles=1, jit=False, loss=None, raw=False):
        """``jax.jit(svi.update)`` step by step, or ``svi.run`` (one compiled loop) if ``jit``.
        ``raw``: the losses and parameters as the PPL returns them, not NumPy."""
        svi = SVI(model, guide, numpyro.optim.Adam(lr), loss or Trace_ELBO(num_particles=num_particles))
        key = jax.random.PRNGKey(seed)
        if jit:
            result = svi.run(key, steps, *args, progress_bar=False)
            return np.asarray(result.losses), {k: np.asarray(v) for k, v in result.params.items()}
        state = svi.init(key, *args)
        update = jax.jit(svi.update)
        losses = []
        for _ in range(steps):
            state, loss = update(state, *args)
            losses.append(loss)
        if raw:
            return losses, svi.get_params(state)
        return np.asarray(losses), {k: np.asarray(v) for k, v in svi.get_params(state).items()}

    def loss_samples(self, model, guide, *args, loss, seeds, at=None, fast=False):
        """The loss and its gradients with respect to the (unconstrained) parameters, one per seed,
        at the parameters' initial values (or those in ``at``, by name): (values (S,), {name: (S, ...)}),
        the seeds in one vmap. ``fast`` (for a program run once): the initial values read off one
        compiled run of the guide and the model instead of ``SVI.init`` (for unconstrained
        parameters, the same values), the seeds in a ``lax.map`` loop rather than a vmap, and XLA
        without its backend optimizations (together a fifth of the compile time of a large loss)."""
        if fast:
            params = dict(jax.jit(functools.partial(_initial_params, model, guide, args))(jax.random.PRNGKey(0)))
        else:
            svi = SVI(model, guide, numpyro.optim.Adam(0.0), loss)
            params = svi.get_params(svi.init(jax.random.PRNGKey(0), *args))
        params.update({name: jnp.asarray(np.asarray(value), dtype=jnp.result_type(params[name])) for name, value in (at or {}).items()})

        def value_and_grad(key):
            return jax.value_and_grad(lambda p: loss.loss(key, p, model, guide, *args))(params)

        keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(list(seeds)))
        compiled = jax.jit(jax.vmap(value_and_grad))
        if fast:  # a loop over the seeds compiles three times faster than their vmap, and runs in about as long
            compiled = jax.jit(lambda keys: jax.lax.map(value_and_grad, keys))
            compiled = compiled.lower(keys).compile(compiler_options={"xla_backend_optimization_level": 0})
        values, grads = compiled(keys)
        return np.asarray(values), {name: np.asarray(g) for name, g in grads.items()}

    def control_variate(self, features, hidden=4, seed=0, outputs=None):
        """A RELAX network r (``features`` -> 1) with random weights in both layers, so that r is not
        zero (the default network starts at zero): a function declaring its parameters
        ``RELAX.network.*``, (...,) out (``outputs``: (..., outputs))."""
        generator = np.random.default_rng(seed)
        init = {
            "w0": generator.normal(0, 1.0, (features, hidden)), "b0": generator.normal(0, 1.0, hidden),
            "w1": generator.normal(0, 2.0, (hidden, outputs or 1)), "b1": generator.normal(0, 2.0, outputs or 1),
        }

        def network(x):
            w = {name: numpyro.param(f"RELAX.network.{name}", jnp.asarray(value, x.dtype)) for name, value in init.items()}
            output = jnp.tanh(x @ w["w0"] + w["b0"]) @ w["w1"] + w["b1"]
            return output if outputs else output[..., 0]

        return network

    def autoguide(self, kind, model, init_values=None):
        if init_values is None:
            return getattr(autoguides, kind)(model)
        return getattr(autoguides, kind)(model, init_loc_fn=numpyro.infer.initialization.init_to_value(values=init_values))

    # ------------------------------------------------------------------ models and handlers

    def block(self, fn, hide):
        return handlers.block(fn, hide=hide)

    def in_seed(self, fn, seed=0):
        """``fn()`` under a seed (NumPyro's ``handlers.seed``; Pyro's global one)."""
        with handlers.seed(rng_seed=seed):
            return fn()

    def deterministic(self, name, value):
        return numpyro.deterministic(name, value)

    def plate(self, name, size, subsample_size=None, dim=None, subsample=None):
        """``subsample``: the indices themselves (a list), as a user's own minibatch (the plate draws
        its indices when made: ``substitute`` gives them)."""
        if subsample is not None:
            with handlers.substitute(data={name: jnp.asarray(subsample)}):
                return numpyro.plate(name, size, subsample_size=len(subsample), dim=dim)
        return numpyro.plate(name, size, subsample_size=subsample_size, dim=dim)

    def markov(self, iterable):
        from numpyro.contrib.funsor import markov

        return markov(iterable)

    def condition(self, fn, data):
        return handlers.condition(fn, data={k: self.array(v) for k, v in data.items()})

    def hold(self, fn, data):
        """``fn`` with the latent sites in ``data`` held at those values by a handler inside it, as
        NumPyro holds a sample site: ``handlers.substitute``."""
        return handlers.substitute(fn, data={k: self.array(v) for k, v in data.items()})

    def mask(self, mask):
        """A mask from NumPy, or from an array the model computed (a subsample of a mask, say)."""
        return handlers.mask(mask=mask if isinstance(mask, jax.Array) else self.array(mask, "bool"))

    def scale(self, factor):
        return handlers.scale(scale=factor)

    def normal(self, loc, scale):
        return numpyro.distributions.Normal(loc, scale)

    def categorical(self, logits):
        """The host's own Categorical (integer values)."""
        return numpyro.distributions.Categorical(logits=logits)

    def bernoulli(self, probs):
        """The host's own Bernoulli, built from probabilities."""
        return numpyro.distributions.Bernoulli(probs=probs)

    def one_hot_categorical(self, probs):
        """A OneHotCategorical built from probabilities (NumPyro has none of its own: the library's)."""
        return self.lib.limits.OneHotCategorical(probs=probs)

    def factor(self, name, log_factor):
        return numpyro.factor(name, log_factor)

    def delta(self, value, event_dim=0):
        return numpyro.distributions.Delta(value, event_dim=event_dim)

    def exp(self, x):
        return jnp.exp(x)

    def sigmoid(self, x):
        return jax.nn.sigmoid(x)

    def reparam(self, fn, config):
        return handlers.reparam(fn, config=config)

    def affine_transformed(self, d, loc, scale):
        """The host's TransformedDistribution of ``d`` by x -> loc + scale * x."""
        return numpyro.distributions.TransformedDistribution(d, numpyro.distributions.transforms.AffineTransform(loc, scale))

    def neutra(self, model, *args):
        """``model`` reparametrized by the host's NeuTraReparam over an (untrained) AutoDiagonalNormal."""
        from numpyro.infer.reparam import NeuTraReparam

        guide = autoguides.AutoDiagonalNormal(model)
        svi = SVI(model, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), *args))
        return NeuTraReparam(guide, params).reparam(model)

    def transform_reparam(self):
        from numpyro.infer.reparam import TransformReparam

        return TransformReparam()

    def run(self, model, *args, seed=0, replay=None, **kwargs):
        """Trace ``model`` (replaying ``replay``, a previous run, if given): a Run."""
        fn = handlers.seed(model, jax.random.PRNGKey(seed))
        if replay is not None:
            fn = handlers.replay(fn, trace=replay.trace)
        trace = handlers.trace(fn).get_trace(*args, **kwargs)
        sites = {}
        for name, site in trace.items():
            if site["type"] != "sample":
                continue
            log_prob = site["fn"].log_prob(site["value"], site["intermediates"]) if site["intermediates"] else site["fn"].log_prob(site["value"])
            scale = 1.0 if site["scale"] is None else float(site["scale"])
            sites[name] = Site(
                value=np.asarray(site["value"]),
                log_prob=np.asarray(scale * log_prob),
                fn=type(self.lib.handlers.unwrap(site["fn"])[0]).__name__,
                is_observed=site["is_observed"],
                scale=scale,
            )
        return Run(trace, sites)

    def expanded(self, d, batch_shape):
        """An explicit ExpandedDistribution wrapper (the PPL's own, not the class's expand)."""
        return numpyro.distributions.ExpandedDistribution(d, tuple(batch_shape))

    def infer_discrete(self, model, *args, temperature, first_available_dim, seed=0):
        from numpyro.contrib.funsor import infer_discrete

        decoded = infer_discrete(
            model, first_available_dim=first_available_dim, temperature=temperature, rng_key=jax.random.PRNGKey(seed)
        )
        return self.run(decoded, *args, seed=seed)

    def enum_loss(self, model, guide, *args):
        return float(TraceEnum_ELBO().loss(jax.random.PRNGKey(0), {}, model, guide, *args))

    def elbo_loss(self, model, guide, *args, seed=0, num_particles=1, loss=None):
        elbo = loss or Trace_ELBO(num_particles=num_particles)
        # under jit, as SVI evaluates it (one compilation instead of one per operation)
        return float(jax.jit(lambda key: elbo.loss(key, {}, model, guide, *args))(jax.random.PRNGKey(seed)))

    def discrete_log_likelihood(self, model, guide, *args, num_particles=1, plate=None, params=None, given=None, seed=0, raw=False):
        params = None if params is None else {k: self.array(v) for k, v in params.items()}
        bound = self.lib.discrete_log_likelihood(
            model, guide, *args, num_particles=num_particles, plate=plate, params=params, given=given, rng_key=jax.random.PRNGKey(seed)
        )
        return bound if raw else np.asarray(bound)

    def sample_assignment(self, model, *args, given=None, seed=0):
        return self.lib.sample_assignment(model, *args, given=given, rng_key=jax.random.PRNGKey(seed))

    def predictive(self, model, *args, guide=None, posterior_samples=None, num_samples=None, return_sites=None, infer_discrete=False, seed=0, params=None):
        """``params``: parameter values (NumPyro's Predictive's ``params``)."""
        if posterior_samples is not None:
            posterior_samples = {name: self.array(value) for name, value in posterior_samples.items()}
        elif num_samples is None:
            num_samples = 1
        params = {name: self.array(value) for name, value in (params or {}).items()}
        predictive = self.lib.Predictive(
            model, posterior_samples, guide=guide, params=params, num_samples=num_samples, return_sites=return_sites, infer_discrete=infer_discrete
        )
        return predictive(jax.random.PRNGKey(seed), *args)

    # ---- host generic suite

    def pickle_round_trip(self, d):
        """``d`` saved and loaded back as users save NumPyro objects (``pickle``, highest protocol)."""
        import pickle

        return pickle.loads(pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))

    def traced_round_trips(self, make):
        """The distribution ``make()`` builds, after each pytree round trip JAX puts distributions
        through: {"tree_unflatten": unflatten(flatten(d)), "jit": built inside and returned from
        ``jax.jit``, "lax.map": built inside ``jax.lax.map`` (3 iterations; its first slice)}."""
        d = make()
        leaves, treedef = jax.tree_util.tree_flatten(d)
        mapped = jax.lax.map(lambda _: make(), jnp.ones(3))
        return {
            "tree_unflatten": jax.tree_util.tree_unflatten(treedef, leaves),
            "jit": jax.jit(lambda _: make())(0),
            "lax.map": jax.tree_util.tree_map(lambda leaf: leaf[0], mapped),
        }


# Module-level jitted functions: distributions are pytrees, so these compile once per distribution
# class, shape and dtype and are reused by every parametrized case that only changes values.


@functools.partial(jax.jit, static_argnums=(2,))
def _score_samples(d, scorers, sample_shape, key):
    value = d.sample(key, sample_shape)
    return value, [d.log_prob(value)] + [scorer.log_prob(value) for scorer in scorers]


@jax.jit
def _round_trip(guide_dist, model_dist, key):
    def guide():
        return numpyro.sample("z", guide_dist)

    def model():
        return numpyro.sample("z", model_dist)

    guide_trace = handlers.trace(handlers.seed(guide, key)).get_trace()
    model_trace = handlers.trace(handlers.replay(model, trace=guide_trace)).get_trace()
    g, m = guide_trace["z"], model_trace["z"]
    assert m["value"] is g["value"]  # what reaches the model is the guide's very value object
    guide_log_prob = g["fn"].log_prob(g["value"], g["intermediates"]) if g["intermediates"] else g["fn"].log_prob(g["value"])
    return g["value"], guide_log_prob, m["fn"].log_prob(m["value"])


def _initial_params(model, guide, args, key):
    """{name: initial value} of the parameters of the guide, then the model, as one run draws them."""
    params = {}
    for fn in (guide, model):
        traced = handlers.trace(handlers.seed(fn, key)).get_trace(*args)
        params.update({name: site["value"] for name, site in traced.items() if site["type"] == "param" and name not in params})
    return params


@functools.lru_cache(maxsize=None)
def _compiled_value_and_grad(fn, static, num_args):
    return jax.jit(jax.value_and_grad(lambda *args: fn(*static, *args), argnums=tuple(range(num_args))))
