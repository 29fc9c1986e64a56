"""Backend adapters: the only place in the suite that knows torch, Pyro, JAX or NumPyro.

Every conformance test takes the ``backend`` fixture and talks to the library through the
distribution objects themselves (``log_prob``, ``cdf``, ``icdf``, ``expand``, ``to_event``,
``mask``, ``discrete``, ``enumerate_support``, ``mode``, ``batch_shape``, ``event_shape``,
``support``) -- the same names in both PPLs -- and through the adapter methods below for what
differs (arrays, randomness, autodiff, PPL primitives). Numbers go in and come out as NumPy.

An adapter provides:

``name``, ``lib``                   backend name, the package under test
``array(x, dtype)``, ``numpy(x)``   NumPy <-> backend arrays ("float32", "float64", "bool")
``make(name, temperature, logits=, probs=, dtype=, validate_args=)``
                                    a distribution of the package from NumPy parameters
``sample(d, sample_shape, seed)``   a (reparameterized where possible) sample
``uniforms(d, sample_shape, seed)`` the Uniform(0, 1) noise ``sample`` used for that seed (float64)
``score_samples(d, scorers, sample_shape, seed)``
                                    a sample of ``d`` and its log_prob under ``d`` and each scorer
                                    (NumPyro: inside one jitted function)
``value_and_grad(fn, *args, dtype, static)``
                                    value and gradients of a scalar function of backend arrays;
                                    ``fn(*static, *args)`` -- NumPyro compiles and caches it per
                                    (fn, static) when ``static`` is given (module-level fn)
``jacobian(fn, u)``                 Jacobian matrix of a vector function
``biject_to(constraint)``           the PPL's biject_to
``site(name, d, obs=None)``, ``param(name, init)``
                                    ``pyro.sample``/``numpyro.sample`` and ``param``
``trace_guide_then_model(guide_dist, model_dist, seed)``
                                    draw site "z" from a guide, replay it into a model: returns
                                    (value, uniforms, guide log_prob, model log_prob)
``svi(model, guide, steps, lr, seed, num_particles, jit)``
                                    run SVI with Trace_ELBO and Adam, compiled by the PPL's
                                    tracer if ``jit``: (losses, params)
``autoguide(kind, model)``          AutoNormal / AutoDelta / AutoMultivariateNormal
"""

import importlib

BACKEND_NAMES = ["pyro", "numpyro"]


def load_backend(name):
    return importlib.import_module(f"tests.backends.{name}_backend").Backend()
