"""Temperature schedules for an SVI loop: ``schedule(step)`` is the temperature at that step.

Pass the result to the model and guide as an argument, as a tensor, so that one compiled step
serves every temperature (``JitTrace_ELBO`` traces tensors, not Python numbers; ``torch.compile``
guards on a Python number, and compiles again for each new value until its recompile limit)::

    schedule = exponential_decay(initial=1.0, rate=1e-4, floor=0.5, every=1000)
    for step in range(num_steps):
        svi.step(data, torch.tensor(schedule(step)))

A learnable temperature is a positive parameter, e.g.
``pyro.param("temperature", torch.tensor(1.0), constraint=constraints.positive)``; every
distribution of the package is differentiable with respect to its temperature.

``step`` is an integer >= 0 (a Python or NumPy integer, or a one-element integer tensor); a float
step is refused.
"""

# the schedules are plain Python (a float per step): written once, in concrete_common
from concrete_common.schedules import constant, exponential_decay, linear_decay

__all__ = ["exponential_decay", "linear_decay", "constant"]
