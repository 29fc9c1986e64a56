"""The NumPyro training loop of the examples: compiled SVI steps with checkpoints, resume, a clean
stop on SIGINT/SIGTERM, the progress bar and periodic evaluation."""

import functools
import pickle

import numpy as np

from examples import data, training
from examples.training import History  # not from pyro_training: NumPyro's examples run without torch

# JAX is imported in fit(), not here: the scripts read a checkpoint (read_checkpoint) while parsing
# their options, before JAX is imported, which reads JAX_PLATFORMS (--device) once, on import.


def read_checkpoint(path, args):
    """The checkpoint at ``path`` (state: the SVI state's leaves as NumPy arrays, history, args),
    once ``training.load_checkpoint`` found it readable and saved with ``args`` (but for
    ``training.RESUME_MAY_CHANGE``). Needs no JAX backend: the scripts call it before choosing one."""
    return training.load_checkpoint(path, pickle.loads, args, keys=("state",))


@functools.lru_cache(maxsize=4)  # fit called again with the same step (a benchmark, a test) compiles nothing again
def compiled_steps(train_step, parallel=None):
    """``fit``'s compiled block of steps, ``run(state, train, numbers, indices) -> (state, losses)``:
    the steps ``numbers`` one after the other, step ``numbers[i]`` on the rows ``indices[i]`` of the
    arrays ``train`` (``indices`` None: on the whole arrays), in one ``lax.scan``. Compiled once per
    block length; with ``parallel`` (a ``DataParallel``) each device gathers its share of the rows."""
    import jax

    def steps(state, train, numbers, indices):
        def one(state, number_and_rows):
            number, rows = number_and_rows
            batch = train if rows is None else tuple(array[rows] for array in train)
            if parallel:
                batch = parallel.constrain(batch)
            return train_step(state, *batch, number)

        return jax.lax.scan(one, state, (numbers, indices))

    return parallel.jit_steps(steps) if parallel else jax.jit(steps)


# Steps between reads of the losses: one call of one compiled program (a scan) runs them all, so
# that the host neither chooses a batch nor dispatches a call at each step.
BLOCK = 50


def fit(svi, train_step, state, train, args, evaluate=None, batch_size=None, minibatches=True, parallel=None):
    """Run ``args.steps`` steps of ``train_step(state, *batch, step) -> (state, loss)`` (compiled or
    not) from ``state`` (an ``svi.init`` state). Returns (state, history).

    ``train`` is a tuple of training arrays (images; or images and labels), kept on the device:
    step ``step``'s batch is the rows ``data.batch_indices(len(train[0]), args.batch_size, args.seed,
    step)`` of each, chosen inside the compiled program (``minibatches=False``: every step gets the
    arrays themselves, for a model that subsamples them itself). The step's randomness comes from
    the SVI state and ``step``, so a resumed run repeats an uninterrupted one. ``evaluate(params)``
    is called every ``args.eval_every`` steps. Checkpoints (the state's leaves) go to ``args.out``
    every ``args.checkpoint_every`` steps and on SIGINT/SIGTERM (then the process exits);
    ``args.resume`` continues from the last one (``read_checkpoint``: readable, and saved with the
    same options but those in ``training.RESUME_MAY_CHANGE``; else one line and exit status 2).
    ``batch_size``: what the loss is divided by (default ``args.batch_size``). With ``parallel``
    (a ``DataParallel``) the training arrays and the state are replicated, every batch sharded.

    Steps run in blocks of ``BLOCK`` (fewer where an evaluation, a checkpoint or the end falls),
    each block one call of a compiled ``lax.scan`` of ``train_step``; the losses are read after each
    block, and a stop request is answered there. On the CPU a block computes the numbers of its
    steps taken one call at a time, bit for bit (tests/test_loops.py).
    """
    import jax
    import jax.numpy as jnp

    path = training.checkpoint_path(args.out)
    history = History()
    if args.resume:
        saved = read_checkpoint(path, args)
        try:
            # tree_unflatten takes leaves of any shape: compare them with the model's
            saved_shapes = [np.shape(leaf) for leaf in saved["state"]]
            shapes = [np.shape(leaf) for leaf in jax.tree_util.tree_leaves(state)]
            if len(saved_shapes) != len(shapes):
                raise ValueError(f"{len(saved_shapes)} arrays saved, the model's state has {len(shapes)}")
            for i, (a, b) in enumerate(zip(saved_shapes, shapes)):
                if a != b:
                    raise ValueError(f"array {i} of the state has shape {a} saved, {b} in the model")
            treedef = jax.tree_util.tree_structure(state)
            state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(leaf) for leaf in saved["state"]])
            history = History(**saved["history"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            training.checkpoint_does_not_fit(path, error)

    def save():
        if path is not None:
            leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]
            training.atomic_write(path, pickle.dumps(dict(state=leaves, history=vars(history), args=vars(args))))

    run = compiled_steps(train_step, parallel)
    if parallel:
        train = parallel.replicate(train)
    batches = training.batches_or_fail(lambda: data.Batches(len(train[0]), args.batch_size, args.seed)) if minibatches else None
    divisor = batch_size or args.batch_size

    eval_every = getattr(args, "eval_every", None)
    progress = training.Progress(args.steps, history.step, disable=args.no_progress)
    clock = training.Clock(history.seconds)
    with training.StopRequests() as stop:
        while history.step < args.steps and not stop.requested:
            # a block ends where the losses are read: after BLOCK steps, or at an evaluation, a checkpoint or the end
            end = min(history.step + BLOCK, args.steps)
            for every in (eval_every if evaluate is not None else None, args.checkpoint_every):
                if every:
                    end = min(end, (history.step // every + 1) * every)
            indices = batches.block(history.step, end - history.step) if batches else None
            state, losses = run(state, train, np.arange(history.step, end), indices)
            history.step = end
            for value in np.asarray(jax.device_get(losses)) / divisor:
                history.losses.append(float(value))
                progress.update(float(value))
            with clock.paused():  # everything dispatched has finished: its losses were read
                if evaluate is not None and (history.step % eval_every == 0 or history.step == args.steps):
                    history.evaluations.append((history.step, float(evaluate(svi.get_params(state)))))
                history.seconds = clock.elapsed
                if history.step % args.checkpoint_every == 0 or stop.requested:
                    save()
    progress.close()
    history.seconds = clock.elapsed
    save()
    if stop.requested:
        print(f"stopped at step {history.step} by signal {stop.signal}; continue with --resume")
        raise SystemExit(128 + stop.signal)
    return state, history


class DataParallel:
    """Data-parallel SVI with JAX's own sharding (``jax.sharding``): a one-axis ``Mesh`` named
    "batch" over the first ``devices`` devices; every batch is sharded on its first axis over it,
    the SVI state (parameters, optimizer state, the PRNG key) replicated. ``jit`` compiles a step
    with those shardings (``jit_steps``: ``fit``'s blocks of steps, which gather their batches on
    the devices); XLA's SPMD partitioner splits the computation and all-reduces the
    gradients. With ``jax_threefry_partitionable`` (on by default since JAX 0.5) random draws do not
    depend on the sharding, so a run gives the one-device run's numbers up to float32 reassociation
    of the batch sums.

    On a CPU the devices are simulated, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (the
    scripts set it for ``--device cpu --devices N``): they share the host's cores, so they show that
    the program is correct and what it communicates, not a speed-up."""

    def __init__(self, devices):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        available = jax.devices()
        if devices > len(available):
            training.fail(f"--devices {devices}: JAX sees {len(available)} {available[0].platform} device(s); on a CPU "
                          f"pass --device cpu (which simulates {devices}) or set XLA_FLAGS=--xla_force_host_platform_device_count={devices}")
        self.devices = devices
        self.mesh = Mesh(np.array(available[:devices]), ("batch",))
        self.batch = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())

    def jit(self, step):
        """``step(state, x, i) -> (state, loss)`` compiled with the state replicated, ``x`` sharded."""
        import jax

        return jax.jit(step, in_shardings=(self.replicated, self.batch, self.replicated), out_shardings=self.replicated)

    def jit_steps(self, steps):
        """``fit``'s ``steps(state, train, numbers, indices) -> (state, losses)`` compiled with the
        state and the training arrays replicated, the indices (a row per step) split over the
        devices: each device gathers its share of every batch."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        rows = NamedSharding(self.mesh, PartitionSpec(None, "batch"))
        return jax.jit(steps, in_shardings=(self.replicated, self.replicated, self.replicated, rows), out_shardings=self.replicated)

    def constrain(self, batch):
        """A batch gathered inside a compiled step, kept sharded on its first axis."""
        import jax

        return jax.lax.with_sharding_constraint(batch, self.batch)

    def shard(self, x):
        """``x`` placed sharded on its first axis, or replicated when that does not split evenly (the
        last, short batch of an evaluation)."""
        import jax

        return jax.device_put(x, self.batch if x.shape[0] % self.devices == 0 else self.replicated)

    def replicate(self, tree):
        import jax

        return jax.device_put(tree, self.replicated)


def use_platform(device, devices=1):
    """Point JAX at ``--device`` (``training.device_name``'s ``cpu`` or ``cuda``; None: JAX's own
    choice, a GPU if there is one) before anything imports JAX, with ``devices`` simulated CPU
    devices for ``--device cpu --devices N``; a device JAX cannot use is a one-line error here, not
    a traceback at the first array. The scripts call it first, in ``__main__``."""
    import os

    if device is None:
        return
    if ":" in device:
        training.fail(f"--device {device}: JAX chooses GPUs by CUDA_VISIBLE_DEVICES; pass --device cuda "
                      f"with CUDA_VISIBLE_DEVICES={device.partition(':')[2]}")
    os.environ["JAX_PLATFORMS"] = device
    if device == "cpu":
        simulate_cpu_devices(devices)
    import jax

    try:
        jax.devices()
    except Exception as error:  # jax 0.10 without a CUDA plugin: a bare AssertionError; later ones: RuntimeError
        hint = "; is JAX's CUDA plugin installed?" if device == "cuda" else ""
        training.fail(f"--device {device}: JAX cannot start its {device} backend ({training.one_line(error)}){hint}")


def simulate_cpu_devices(devices):
    """Ask XLA for ``devices`` CPU devices (before JAX is imported): ``--device cpu --devices N``."""
    import os

    flag = "--xla_force_host_platform_device_count"
    if devices > 1 and flag not in os.environ.get("XLA_FLAGS", ""):
        # first: XLA stops reading flags at a token that is not a flag
        os.environ["XLA_FLAGS"] = f"{flag}={devices} {os.environ.get('XLA_FLAGS', '')}".strip()
