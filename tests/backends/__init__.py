"""Backend adapters: the only place in the suite that knows torch, Pyro, JAX or NumPyro.

Every conformance test takes the ``backend`` fixture and talks to the library through the
distribution objects themselves (``log_prob``, ``cdf``, ``icdf``, ``expand``, ``to_event``,
``mask``, ``discrete``, ``enumerate_support``, ``mode``, ``batch_shape``, ``event_shape``,
``support``) -- the same names in both PPLs -- and through the adapter methods below for what
differs (arrays, randomness, autodiff, PPL primitives). Numbers go in and come out as NumPy.

An adapter provides:

``name``, ``lib``                   backend name, the package under test
``reset()``                         forget parameters (called before every test)
``array(x, dtype)``, ``numpy(x)``   NumPy <-> backend arrays ("float32", "float64", "bool")
``make(name, temperature, logits=, probs=, dtype=, validate_args=, **kwargs)``
                                    a distribution of the package from NumPy parameters
``copies(x)``                       copies of a value, as users make them (``clone()``, ``x * 1.0``)
``cpu_stand_in``                    whether float64 on the CPU catches an array made in a default
                                    dtype or on a default device (tests/test_devices.py)
``device(kind)``, ``placement(x)``  the device of a kind ("cpu", "gpu"; None where there is none)
                                    and an array's (kind, dtype name); ``array(x, dtype, device)``
                                    puts a NumPy value there
``sample(d, sample_shape, seed)``   a (reparameterized where possible) sample
``uniforms(d, sample_shape, seed)`` the Uniform(0, 1) noise ``sample`` used for that seed (float64)
``in_trace(fn, *args)``              ``fn(*args)`` as the PPL runs a model: NumPyro inside ``jax.jit``
                                    (where samples carry their coordinates), Pyro eagerly; NumPy out
``score_samples(d, scorers, sample_shape, seed)``
                                    a sample of ``d`` and its log_prob under ``d`` and each scorer
                                    (NumPyro: inside one jitted function)
``value_and_grad(fn, *args, dtype, static, device)``
                                    value and gradients of a scalar function of backend arrays;
                                    ``fn(*static, *args)`` -- NumPyro compiles and caches it per
                                    (fn, static) when ``static`` is given (module-level fn)
``jacobian(fn, u)``                 Jacobian matrix of a vector function
``biject_to(constraint)``           the PPL's biject_to
``site(name, d, obs=None)``, ``param(name, init, dtype, like)``, ``deterministic(name, value)``
                                    ``pyro.sample``/``numpyro.sample``, ``param`` (on the device of
                                    the array ``like``, if given) and ``deterministic``
``block(fn, hide)``, ``in_seed(fn, seed)``
                                    the PPL's block handler; ``fn()`` under a seed
``trace_guide_then_model(guide_dist, model_dist, seed)``
                                    draw site "z" from a guide, replay it into a model: returns
                                    (value, uniforms, guide log_prob, model log_prob)
``svi(model, guide, *args, steps, lr, seed, num_particles, jit, loss, raw)``
                                    run SVI with Adam and ``loss`` (default Trace_ELBO), compiled
                                    by the PPL's tracer if ``jit``: (losses, params), as NumPy or
                                    (``raw``) as the PPL returns them
``loss_samples(model, guide, *args, loss, seeds)``
                                    the loss and its parameter gradients at the initial
                                    parameters, one per seed: (values, {name: gradients})
``autoguide(kind, model, init_values)`` AutoNormal / AutoDelta / AutoMultivariateNormal (init_to_value)
``plate``, ``mask``, ``scale``      the PPL's plate and mask / scale handlers (context managers)
``normal``, ``exp``, ``sigmoid``    the PPL's Normal distribution and array functions for models
``reparam(fn, config)``             poutine.reparam / handlers.reparam
``run(model, *args, seed, replay)`` trace a model (replaying an earlier Run): a Run
``expanded(d, batch_shape)``        the PPL's explicit ExpandedDistribution wrapper
``infer_discrete(model, *args, temperature, first_available_dim, seed)``
                                    the PPL's infer_discrete, traced: a Run
``sample_assignment(model, *args, given, seed)``
                                    the library's sample_assignment with that seed
``enum_loss(model, guide, *args)``  TraceEnum_ELBO's loss
``factor(name, log_factor)``        the PPL's factor statement
``elbo_loss(model, guide, *args, seed, num_particles, loss)``
                                    the loss (default Trace_ELBO) for that seed
``discrete_log_likelihood(model, guide, *args, num_particles, plate, params, seed, raw)``
                                    the library's helper, seeded, with NumPy params

Host generic suite (``tests/test_host_generic.py``):

``pickle_round_trip(d)``            ``d`` saved and loaded back as the PPL's users do (Pyro:
                                    ``torch.save``/``torch.load``, NumPyro: ``pickle``)
``traced_round_trips(make)``        {label: the distribution ``make()`` builds, after a pytree round
                                    trip}: NumPyro ``tree_unflatten(tree_flatten)``, returned from
                                    ``jax.jit``, built in ``jax.lax.map`` (first slice); Pyro skips
"""

import importlib
import os
from typing import Any, NamedTuple

import numpy as np


class Site(NamedTuple):
    value: np.ndarray
    log_prob: np.ndarray  # scaled and masked, as the ELBO sees it
    fn: str  # the class name of the distribution inside Independent/mask/expand wrappers
    is_observed: bool
    scale: float


class Run(NamedTuple):
    trace: Any  # the PPL's trace, for replay
    sites: dict  # name -> Site, sample sites only (no subsample pseudo-sites)

    @property
    def log_joint(self):
        return float(sum(site.log_prob.sum() for site in self.sites.values()))

# CONCRETE_TEST_BACKENDS=numpyro: the NumPyro half alone, in an environment without torch (``make
# compat`` on Python 3.12, where torch installs only as a multi-gigabyte CUDA build)
BACKEND_NAMES = [name for name in os.environ.get("CONCRETE_TEST_BACKENDS", "pyro,numpyro").split(",") if name]


def load_backend(name):
    return importlib.import_module(f"tests.backends.{name}_backend").Backend()


def enable_x64(flag):
    """``jax.enable_x64(flag)``, the context manager of jax >= 0.5; ``jax.experimental.enable_x64``
    on the older jax that pyproject admits (``make compat``)."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(flag)
    from jax.experimental import enable_x64 as older

    return older(flag)
