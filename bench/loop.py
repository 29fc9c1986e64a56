"""What the examples' training loops add to their compiled steps: the discrete VAE's whole loop
against its bare step, per PPL, side by side.

The model is the paper's (200H~784V) binary discrete VAE of ``examples/dvae_*.py`` on Fashion-MNIST
(or the 8x8 digits with ``--dataset digits``), batch 64, m = 1, Adam, a fresh Bernoulli binarization
of every batch. Contestants, per PPL:

- example loop : the example's loop, ``numpyro_training.fit`` / ``pyro_training.fit`` (no progress
                 bar, no evaluation, no checkpoints), with the example's batches: in NumPyro the
                 training set on the device and blocks of 50 steps, each one compiled ``lax.scan``
                 that gathers its batches from the rows ``data.Batches`` gives; in Pyro the example's
                 ``make_batch`` (a slice of the epoch's permutation, on the device, indexes the
                 training tensor; the binarization). Its time is the loop's own clock
                 (``history.seconds``, what the examples report as ms/step), which leaves out
                 ``fit``'s set-up (in Pyro, ``Step.init``), made again for every repetition here
- bare step    : the example's step called in a tight loop on one fixed batch (NumPyro:
                 ``make_train_step``'s ``jax.jit`` step, which binarizes inside; Pyro: the example's
                 ``Step``, on a batch binarized once)
- + binarize   : (Pyro) the bare step on a fixed batch binarized anew at every step, as the example's
                 ``make_batch`` does (NumPyro's step binarizes inside): the part of the loop that is
                 the model's data, not the loop's overhead
- before       : the batches as the loops made them before (issue 30): each step's indices from
                 ``data.batch_indices`` (a new permutation of the training set at every step), the
                 batch gathered by an eager indexing op, one call of the step per step (NumPyro:
                 losses read every 50 steps); hand-written, the loops' bookkeeping left out

Repetitions are interleaved (each contestant runs its steps in turn), after one warm-up repetition
(compilation); the table gives the median milliseconds per step and, as ratios, the median over
the repetitions of each contestant's time over the bare step's time in the same repetition, and
over the time of the step with the example's binarization (NumPyro: the bare step; Pyro: + binarize).

Run: ``python -m bench.loop`` (``--quick`` for a few short repetitions; ``--device cuda`` on a GPU,
as the examples take it).
"""

import os
import platform
import sys
import time
import types

import numpy as np

from bench.harness import load_dataset, parse_steps, step_parser

PRIOR_T, POSTERIOR_T, UNITS, BATCH, LR, SEED = 1 / 2, 2 / 3, 200, 64, 3e-4, 0


def _args(steps):
    """The options ``fit`` reads: no progress bar, evaluation or checkpoint."""
    return types.SimpleNamespace(steps=steps, batch_size=BATCH, seed=SEED, binarize="dynamic", out=None, resume=False,
                                 no_progress=True, checkpoint_every=10**9, eval_every=None)


def numpyro_contestants(dataset):
    """name -> run(n): n steps from the contestant's current state, ms per step."""
    import jax
    import jax.numpy as jnp
    import numpyro

    from examples import data, numpyro_training
    from examples import dvae_numpyro as example

    train = jnp.asarray(dataset.train)
    vae = example.DiscreteVAE([example.NodeLayer(UNITS, 2)], True, (PRIOR_T, POSTERIOR_T), train.mean(0), False)
    svi = example.make_svi(vae, numpyro.optim.Adam(LR))
    init_key, binarize_key = jax.random.split(jax.random.PRNGKey(SEED))
    step = example.make_train_step(svi, "dynamic", binarize_key)
    states = dict.fromkeys(("loop", "step", "before"), svi.init(init_key, train[:BATCH]))
    fixed = train[data.batch_indices(len(train), BATCH, SEED, 0)]

    def loop(n):
        states["loop"], history = numpyro_training.fit(svi, step, states["loop"], (train,), _args(n))
        return 1000 * history.seconds / n

    def bare(n):
        start, state = time.perf_counter(), states["step"]
        for i in range(n):
            state, loss = step(state, fixed, i)
        loss.block_until_ready()
        states["step"] = state
        return 1000 * (time.perf_counter() - start) / n

    def before(n):
        start, state, pending = time.perf_counter(), states["before"], []
        for i in range(n):
            state, loss = step(state, train[data.batch_indices(len(train), BATCH, SEED, i)], i)
            pending.append(loss)
            if len(pending) == 50 or i == n - 1:
                jax.device_get(pending)
                pending = []
        states["before"] = state
        return 1000 * (time.perf_counter() - start) / n

    return {"example loop": loop, "bare step": bare, "before": before}


def pyro_contestants(dataset, device):
    import pyro
    import torch

    from examples import data, pyro_training
    from examples import dvae_pyro as example

    train = torch.as_tensor(dataset.train, device=device)
    pyro.clear_param_store()
    torch.manual_seed(SEED)
    vae = example.DiscreteVAE(dataset.dim, [example.NodeLayer(UNITS, 2)], True, (PRIOR_T, POSTERIOR_T), train.mean(0), False)
    vae.to(device)
    step = example.make_step(vae, pyro_training.adam(LR, fused=True))
    probabilities = train[data.batch_indices(len(train), BATCH, SEED, 0)]
    fixed = torch.bernoulli(probabilities)
    step.init(fixed)

    def loop(n):
        args = _args(n)
        history = pyro_training.fit(step, vae, example.batch_maker(train, args), args)
        return 1000 * history.seconds / n

    def bare(n):
        start = time.perf_counter()
        for _ in range(n):
            step(fixed)  # a float: the device has finished
        return 1000 * (time.perf_counter() - start) / n

    def binarized(n):
        start = time.perf_counter()
        for _ in range(n):
            step(torch.bernoulli(probabilities))
        return 1000 * (time.perf_counter() - start) / n

    def before(n):
        start = time.perf_counter()
        for i in range(n):
            torch.manual_seed(SEED * 1_000_003 + i)
            step(torch.bernoulli(train[data.batch_indices(len(train), BATCH, SEED, i)]))
        return 1000 * (time.perf_counter() - start) / n

    return {"example loop": loop, "bare step": bare, "+ binarize": binarized, "before": before}


def main(argv=None):
    parser = step_parser(__doc__, steps=200, repetitions=9, quick=(50, 3), ppl=True)
    parser.add_argument("--device", default=None, help="cpu or cuda/gpu (default: a GPU if there is one), as the examples take it")
    args = parse_steps(parser, argv)
    if args.device:  # before JAX starts (when run as a script): it reads JAX_PLATFORMS once, on import
        os.environ["JAX_PLATFORMS"] = {"cuda": "cuda", "gpu": "cuda"}.get(args.device, args.device)
    import jax
    import torch

    device = torch.device({"gpu": "cuda"}.get(args.device, args.device) or ("cuda" if torch.cuda.is_available() else "cpu"))
    dataset = load_dataset(args.dataset)
    ppls = args.ppl.split(",")
    environment = [f"{name}={os.environ[name]!r}" for name in ("OMP_NUM_THREADS", "XLA_FLAGS") if os.environ.get(name)]
    print("# " + " ".join(environment + ["python -m bench.loop"] + (sys.argv[1:] if argv is None else argv)))
    print(f"# bench.loop -- the discrete VAE examples' training loops against their bare steps; ({UNITS}H~{dataset.dim}V) binary, "
          f"batch {BATCH}, m = 1; {dataset.name}")
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads, {device.type}{gpu}); jax {jax.__version__} ({jax.devices()[0].device_kind})")
    print(f"# median ms per step over {args.repetitions} interleaved repetitions of {args.steps} steps, after a warm-up "
          "repetition; ratios: median over the repetitions of the time over the bare step's (or the step's with the "
          "example's binarization: NumPyro's binarizes inside) in the same repetition")
    runners = {}
    if "numpyro" in ppls:
        runners.update({("numpyro", name): run for name, run in numpyro_contestants(dataset).items()})
    if "pyro" in ppls:
        runners.update({("pyro", name): run for name, run in pyro_contestants(dataset, device).items()})
    for run in runners.values():  # compilation (in NumPyro, of the block lengths the repetitions use), caches
        run(args.steps)
    times = {key: [] for key in runners}
    for _ in range(args.repetitions):
        for key, run in runners.items():
            times[key].append(run(args.steps))

    def ratio(key, reference):  # paired: each repetition against the reference's block next to it
        return float(np.median(np.array(times[key]) / np.array(times[reference])))

    result = {}
    print("| PPL     | contestant   | ms/step | vs bare step | vs step with binarization |")
    print("|---------|--------------|---------|--------------|---------------------------|")
    for (ppl, name), ms in times.items():
        binarized = (ppl, "+ binarize") if (ppl, "+ binarize") in times else (ppl, "bare step")
        result[ppl, name] = (float(np.median(ms)), ratio((ppl, name), (ppl, "bare step")), ratio((ppl, name), binarized))
        print(f"| {ppl:7} | {name:12} | {result[ppl, name][0]:7.3f} | {result[ppl, name][1]:11.3f}x "
              f"| {result[ppl, name][2]:24.3f}x |")
    return result


if __name__ == "__main__":
    main()
