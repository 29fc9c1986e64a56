"""Data-parallel throughput of the discrete VAE examples on the hosts' engines: NumPyro's compiled SVI
step sharded with ``jax.sharding`` over 1 and 2 devices (interleaved in one process), Pyro's step under
``torch.distributed`` DDP (gloo) with 1 and 2 processes (``torchrun``, the runs alternated); the
parameter bytes all-reduced per step; a weak-scaling projection from those numbers.

The model is the paper's (200H~784V) binary discrete VAE on Fashion-MNIST (``--dataset digits`` for
the 8x8 digits), Concrete, m = 1, the examples' step. Strong scaling keeps the batch (64, split over
the devices); weak scaling keeps 64 per device. On a CPU the JAX devices are simulated by XLA
(``--xla_force_host_platform_device_count``) and share the host's cores with each other, as the two
gloo processes do: the numbers show what the programs cost here, not a GPU's scaling.

Run: ``python -m bench.data_parallel`` (``--quick``: a few short repetitions).
"""

import os
import sys

if __name__ == "__main__" and "--pyro-worker" not in sys.argv:  # before JAX starts: two CPU devices
    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{flag}=2 {os.environ.get('XLA_FLAGS', '')}".strip()  # first: see numpyro_training

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bench.harness import load_dataset, parse_steps, step_parser  # noqa: E402
from examples import data  # noqa: E402

UNITS, PER_DEVICE, LR = 200, 64, 3e-4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def numpyro_contestants(dataset):
    """(name -> one compiled step, images per step, parameter bytes): 1 device, 2 devices at the
    same batch (strong), 2 devices at twice the batch (weak)."""
    import jax
    import jax.numpy as jnp
    import numpyro

    from examples import dvae_numpyro, numpyro_training

    train = jnp.asarray(dataset.train)
    vae = dvae_numpyro.DiscreteVAE([dvae_numpyro.NodeLayer(UNITS, 2)], True, dvae_numpyro.PAPER_TEMPERATURES[2], train.mean(0), False)
    svi = dvae_numpyro.make_svi(vae, numpyro.optim.Adam(LR))
    state0 = svi.init(jax.random.PRNGKey(0), train[:PER_DEVICE])
    param_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(svi.get_params(state0)))
    contestants = {}
    for name, devices, batch in (("1 device", 1, PER_DEVICE), ("2 devices, same batch", 2, PER_DEVICE), ("2 devices, 2x batch", 2, 2 * PER_DEVICE)):
        parallel = numpyro_training.DataParallel(devices) if devices > 1 else None
        step = dvae_numpyro.make_train_step(svi, "dynamic", jax.random.PRNGKey(1), parallel)
        place = parallel.shard if parallel else (lambda x: x)
        batches = [place(train[data.batch_indices(len(train), batch, 0, i)]) for i in range(16)]
        state = [parallel.replicate(state0) if parallel else state0, 0]

        def run(step=step, state=state, batches=batches):
            s, i = state
            s, loss = step(s, batches[i % 16], i)
            loss.block_until_ready()
            state[:] = s, i + 1

        contestants[name] = (run, batch)
    return contestants, param_bytes


def pyro_worker(dataset_name, batch, steps):
    """Inside torchrun (or alone): time ``steps`` steps of the Pyro example's step; rank 0 prints
    one JSON line (ms per step, parameter bytes)."""
    import torch

    from examples import dvae_pyro, pyro_training

    dataset = load_dataset(dataset_name)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    train = torch.as_tensor(dataset.train)
    vae = dvae_pyro.DiscreteVAE(dataset.dim, [dvae_pyro.NodeLayer(UNITS, 2)], True, dvae_pyro.PAPER_TEMPERATURES[2], train.mean(0), False)
    svi_step = dvae_pyro.make_step(vae, pyro_training.adam(LR, fused=True))
    batches = [torch.bernoulli(train[data.batch_indices(len(train), batch, 0, i)]) for i in range(16)]
    if world > 1:
        parallel = pyro_training.DataParallel(vae, svi_step)
        svi_step.init(parallel.shard(batches[0]))

        def step(i):
            return parallel.step(batches[i % 16], seed=i)
    else:
        svi_step.init(batches[0])

        def step(i):
            return svi_step(batches[i % 16])

    for i in range(5):
        step(i)
    if world > 1:
        torch.distributed.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    if world > 1:
        parallel.close()
    ms = 1000 * (time.perf_counter() - start) / steps
    if rank == 0:
        print(json.dumps({"ms": ms, "param_bytes": sum(p.numel() * p.element_size() for p in vae.parameters())}))


def _pyro_run(dataset_name, processes, batch, steps):
    command = [sys.executable, "-m", "bench.data_parallel", "--pyro-worker", "--dataset", dataset_name,
               "--batch", str(batch), "--steps", str(steps)]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *command[1:]]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // processes)))
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{(run.stdout + run.stderr)[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _table(label, times, images, reference):
    print(f"\n{label}\n| configuration | images per step | ms/step (median) | images/s | throughput vs the first row |\n|---|---|---|---|---|")
    result = {}
    for name, t in times.items():
        t = np.asarray(t)
        ratio = float(np.median((images[name] / t) / (images[reference] / np.asarray(times[reference]))))
        result[name] = (float(np.median(t)), 1000 * images[name] / float(np.median(t)), ratio)
        print(f"| {name} | {images[name]} | {result[name][0]:.2f} | {result[name][1]:.0f} | {ratio:.2f}x |")
    return result


def projection(param_bytes, step_ms, devices=(8, 64)):
    """Weak scaling on paper: each device keeps its batch and its step time; a ring all-reduce of
    the gradients adds 2 (N-1)/N x bytes / bandwidth + 2 (N-1) x latency. Efficiency = step / (step
    + all-reduce), for NVLink-class (150 GB/s bus, 5 us) within 8 GPUs and InfiniBand-class (12
    GB/s, 10 us) across 64."""
    links = {8: (150e9, 5e-6), 64: (12e9, 10e-6)}
    rows = []
    for n in devices:
        bandwidth, latency = links[n]
        comm_ms = 1000 * (2 * (n - 1) / n * param_bytes / bandwidth + 2 * (n - 1) * latency)
        rows.append((n, comm_ms, step_ms / (step_ms + comm_ms)))
    return rows


def main(argv=None):
    parser = step_parser(__doc__, steps=50, repetitions=7, quick=(5, 3), ppl=True)
    parser.add_argument("--pyro-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=PER_DEVICE, help=argparse.SUPPRESS)
    args = parse_steps(parser, argv)
    if args.pyro_worker:  # launched with --steps, never --quick
        return pyro_worker(args.dataset, args.batch, args.steps)
    from bench.harness import interleaved_times, machine_line

    dataset = load_dataset(args.dataset)
    print(machine_line())
    print(f"# bench.data_parallel: the discrete VAE example's Concrete step, (200H~{dataset.dim}V) binary, m = 1, {dataset.name}, "
          f"{PER_DEVICE} images per device (weak) or {PER_DEVICE} in all (strong); median over {args.repetitions} interleaved "
          f"repetitions of {args.steps} steps; CPU devices simulated by XLA, gloo processes sharing the same cores")
    result = {}
    if "numpyro" in args.ppl:
        contestants, param_bytes = numpyro_contestants(dataset)
        times = interleaved_times({k: v[0] for k, v in contestants.items()}, args.repetitions, {k: args.steps for k in contestants})
        result["numpyro"] = _table("numpyro (jax.sharding)", times, {k: v[1] for k, v in contestants.items()}, "1 device")
        result["numpyro_param_bytes"] = param_bytes
    if "pyro" in args.ppl.split(","):
        configurations = {"1 process": (1, PER_DEVICE), "2 processes, same batch": (2, PER_DEVICE), "2 processes, 2x batch": (2, 2 * PER_DEVICE)}
        times = {name: [] for name in configurations}
        for _ in range(args.repetitions):  # alternated, so that drifts in the machine's load hit each alike
            for name, (processes, batch) in configurations.items():
                measured = _pyro_run(dataset.name if dataset.name != "digits" else "digits", processes, batch, args.steps)
                times[name].append(measured["ms"])
        result["pyro"] = _table("pyro (DDP, gloo)", times, {k: v[1] for k, v in configurations.items()}, "1 process")
        result["pyro_param_bytes"] = measured["param_bytes"]
    param_bytes = result.get("numpyro_param_bytes", result.get("pyro_param_bytes"))
    print(f"\nall-reduced per step: the gradient of every parameter, {param_bytes / 1e6:.2f} MB (float32); a ring all-reduce over "
          "N devices sends and receives 2 (N-1)/N of it per device")
    one = result.get("numpyro", result.get("pyro"))
    step_ms = next(iter(one.values()))[0]
    print("\nweak-scaling projection (on paper: this step time per device, the all-reduce on assumed links)\n"
          "| devices | link (assumed) | all-reduce ms | efficiency |\n|---|---|---|---|")
    for n, comm_ms, efficiency in projection(param_bytes, step_ms):
        link = "NVLink-class, 150 GB/s, 5 us" if n == 8 else "InfiniBand-class, 12 GB/s, 10 us"
        print(f"| {n} | {link} | {comm_ms:.3f} | {efficiency:.3f} (step {step_ms:.2f} ms) |")
    return result


if __name__ == "__main__":
    main()
