"""Run by tests/test_data_parallel.py under ``torchrun --nproc_per_node 2`` (gloo): the Pyro dVAE
example, data-parallel, with every file it writes recorded per rank; with "reference", rank 0 then
computes the same steps in one process on the whole batch. Several runs, one after another in the
same processes (each joins and leaves the process group, as a run does), are separated by "+" on
the command line: one torchrun start instead of one per run. Each run rendezvouses through a store
of its own (rank 0 hosts it on a free port it publishes in torchrun's store): a second process group
joined through torchrun's store would read the first one's stale addresses there, since the group's
keys restart with it. Rank 0 prints one JSON line per run."""

import io
import json
import os
import socket
import sys

import pyro
import torch

from examples import data, dvae_pyro, pyro_training, training

OPTIONS = ["--no-progress", "--eval-samples", "4", "--eval-every", "3", "--latent-units", "32", "--device", "cpu"]


def _run_recording_writes(argv):
    """The example's main, every checkpoint or result file it writes recorded (by this rank)."""
    writes, write = [], training.atomic_write

    def recording(path, payload):
        writes.append(os.path.basename(path))
        write(path, payload)

    training.atomic_write = recording
    try:
        metrics = dvae_pyro.main(argv)
    finally:
        training.atomic_write = write
    return metrics, writes


def _module_state(out):
    with open(os.path.join(out, "checkpoint.bin"), "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)["module"]


def one_process_reference(steps, seed=0, batch_size=64, world=2, lr=1e-3):
    """The same steps in this one process: each step's global batch (seeded as fit seeds it), the
    loss of the whole batch as the sum of its slices' losses, each slice with the noise its rank
    draws, one backward, one update (the example's optimizer)."""
    dataset = data.load("digits")
    layers = [dvae_pyro.NodeLayer(32, 2)]
    pyro.clear_param_store()
    torch.manual_seed(seed)
    train = torch.as_tensor(dataset.train)
    vae = dvae_pyro.DiscreteVAE(dataset.dim, layers, True, dvae_pyro.PAPER_TEMPERATURES[2], train.mean(0), False)
    step = dvae_pyro.make_step(vae, pyro_training.adam(lr, fused=True))
    loss = step.loss

    def batch(step):
        return torch.bernoulli(train[data.batch_indices(len(train), batch_size, seed, step)])

    torch.manual_seed(seed)  # the compiled loss traces on its first call, as fit's warm-up call
    step.init(batch(0).tensor_split(world)[0])
    for i in range(steps):
        torch.manual_seed(seed * 1_000_003 + i)
        x = batch(i)
        total = 0.0
        for rank, shard in enumerate(x.tensor_split(world)):
            torch.manual_seed((seed * 1_000_003 + i) * 1_009 + rank)
            total = total + loss.differentiable_loss(step.model, step.guide, shard)
        total.backward()
        step.optim.step()
        step.optim.zero_grad(set_to_none=True)
    return {name: value.detach().clone() for name, value in vae.state_dict().items()}


def _max_relative(a, b):
    return max(float(((a[k] - b[k]).abs() / (b[k].abs() + 1e-3)).max()) for k in b)


def _own_store(agent_port, number):
    """The port of a new store for the next ``init_process_group`` (env://): rank 0 picks a free one
    (its ``init_process_group`` starts the store there) and publishes it, under the run's number, in
    torchrun's store at ``agent_port``."""
    agent = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], agent_port, is_master=False)
    if os.environ["RANK"] == "0":
        with socket.socket() as s:
            s.bind((os.environ["MASTER_ADDR"], 0))
            port = s.getsockname()[1]
        agent.set(f"run-{number}-port", str(port))
    return agent.get(f"run-{number}-port").decode()


def _one_run(record, reference, argv):
    metrics, writes = _run_recording_writes([*OPTIONS, *argv])
    rank = int(os.environ["RANK"])
    with open(record.format(rank=rank), "w") as f:
        json.dump(writes, f)
    if rank == 0:
        result = {"devices": metrics["devices"], "final_train_loss": metrics["final_train_loss"], "validation": metrics["validation"]}
        if reference == "reference":
            out = argv[argv.index("--out") + 1]
            state, steps = _module_state(out), int(argv[argv.index("--steps") + 1])
            result["max_relative_difference_to_one_process"] = _max_relative(state, one_process_reference(steps))
            result["moved_from_init"] = _max_relative(state, one_process_reference(0))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    # argv: runs separated by "+", each a record file for this rank's writes ({rank} in its name),
    # "reference" or "-", and the example's options
    runs, current = [], []
    for token in sys.argv[1:] + ["+"]:
        if token == "+":
            runs.append(current)
            current = []
        else:
            current.append(token)
    agent_port = int(os.environ["MASTER_PORT"])
    for number, (record, reference, *argv) in enumerate(runs):
        os.environ.update(MASTER_PORT=_own_store(agent_port, number), TORCHELASTIC_USE_AGENT_STORE="False")
        _one_run(record, reference, argv)
