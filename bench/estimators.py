"""The step time of each estimator of the discrete VAE example, against the same PPL's relaxed
(Concrete) step, measured side by side in one process.

The model is the paper's (200H~784V) binary discrete VAE of ``examples/dvae_*.py`` on Fashion-MNIST
(``--dataset digits`` for the 8x8 digits), batch 64, m = 1, the examples' settings: each contestant
is the SVI step the example builds for ``--estimator NAME`` (``make_svi``), NumPyro's compiled
(``jax.jit`` of ``svi.update``, a fresh binarization inside), Pyro's as the example runs it (fused Adam;
``JitTrace_ELBO`` / ``JitTraceGraph_ELBO`` for Concrete and REINFORCE, the discrete-graph estimators
eager: they differentiate their own gradient estimate). Repetitions are interleaved; a ratio is the
median over the repetitions of the contestant's time over the Concrete step's in the same repetition.

Run: ``python -m bench.estimators`` (``--quick`` for a few short repetitions, each estimator in one
of the PPLs, alternating, Concrete in both; ``--ppl numpyro|pyro``).
"""


import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pyro
import torch

from bench.harness import (
    interleaved_times,
    load_dataset,
    machine_line,
    parse_steps,
    step_parser,
)
from examples import data, pyro_training
from examples import dvae_numpyro as numpyro_example
from examples import dvae_pyro as pyro_example

ESTIMATORS = ["concrete", "reinforce", "rebar", "relax", "gumbel-rao", "disarm"]
UNITS, BATCH, LR = 200, 64, 3e-4


def _batches(dataset):
    return [dataset.train[data.batch_indices(len(dataset.train), BATCH, 0, i)] for i in range(64)]


def numpyro_steps(dataset, names=ESTIMATORS):
    """estimator -> a function running one compiled NumPyro step (each keeps its own state)."""
    batches = [jnp.asarray(b) for b in _batches(dataset)]
    base_rate = jnp.asarray(dataset.train.mean(0))
    steps = {}
    for estimator in names:
        vae = numpyro_example.DiscreteVAE([numpyro_example.NodeLayer(UNITS, 2)], True, numpyro_example.PAPER_TEMPERATURES[2],
                                          base_rate, estimator == "reinforce")
        svi = numpyro_example.make_svi(vae, numpyro.optim.Adam(LR), estimator)
        step = numpyro_example.make_train_step(svi, "dynamic", jax.random.PRNGKey(1))
        state = [svi.init(jax.random.PRNGKey(0), batches[0]), 0]

        def run(svi_step=step, state=state):
            s, i = state
            s, loss = svi_step(s, batches[i % 64], i)
            loss.block_until_ready()
            state[:] = s, i + 1

        steps[estimator] = run
    return steps


def pyro_steps(dataset, names=ESTIMATORS):
    """estimator -> a function running one step of the Pyro example's SVI (each its own parameters:
    the module is registered under the same name, so each step first restores its own param store)."""
    batches = [torch.as_tensor(b) for b in _batches(dataset)]
    base_rate = torch.as_tensor(dataset.train.mean(0))
    store = pyro.get_param_store()
    steps = {}
    for estimator in names:
        store.clear()
        torch.manual_seed(0)
        vae = pyro_example.DiscreteVAE(dataset.dim, [pyro_example.NodeLayer(UNITS, 2)], True,
                                       pyro_example.PAPER_TEMPERATURES[2], base_rate, estimator == "reinforce")
        step = pyro_example.make_step(vae, pyro_training.adam(LR, fused=True), estimator)
        step.init(torch.bernoulli(batches[0]))  # creates the parameters (and the loss's own ones)
        state = [store.get_state(), 1]

        def run(step=step, state=state):
            store.set_state(state[0])
            step(torch.bernoulli(batches[state[1] % 64]))
            state[:] = store.get_state(), state[1] + 1

        steps[estimator] = run
    return steps


def main(argv=None):
    args = parse_steps(step_parser(__doc__, steps=50, repetitions=9, quick=(3, 3), ppl=True), argv)
    dataset = load_dataset(args.dataset)
    print(machine_line())
    print(f"# bench.estimators: the discrete VAE example's step per estimator, (200H~{dataset.dim}V) binary, batch {BATCH}, "
          f"m = 1, {dataset.name}; median ms per step over {args.repetitions} interleaved repetitions of {args.steps} steps "
          "after warm-up; ratio: median over the repetitions of the time over the same PPL's Concrete step's")
    builders = {"numpyro": numpyro_steps, "pyro": pyro_steps}
    result = {}
    ppls = args.ppl.split(",")
    for index, ppl in enumerate(ppls):
        names = ESTIMATORS
        if args.quick and len(ppls) > 1:  # a smoke run: each estimator in one PPL, Concrete (the reference) in each
            names = ["concrete"] + [n for i, n in enumerate(ESTIMATORS[1:]) if i % len(ppls) == index]
        steps = builders[ppl](dataset, names)
        times = interleaved_times(steps, args.repetitions, {name: args.steps for name in steps}, warmup=3)
        print(f"\n{ppl}\n| estimator | ms/step | vs Concrete |\n|---|---|---|")
        for name, t in times.items():
            ms = float(np.median(t))
            ratio = float(np.median(np.array(t) / np.array(times["concrete"])))
            result[(ppl, name)] = (ms, ratio)
            print(f"| {name} | {ms:.2f} | {ratio:.2f}x |")
    return result


if __name__ == "__main__":
    main()
