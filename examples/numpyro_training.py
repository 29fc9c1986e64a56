"""The NumPyro training loop of the examples: compiled SVI steps with checkpoints, resume, a clean
stop on SIGINT/SIGTERM, the progress bar and periodic evaluation."""

import pickle

import numpy as np

from examples import training
from examples.pyro_training import History

# JAX is imported in fit(), not here: the scripts read a checkpoint (read_checkpoint) while parsing
# their options, before JAX is imported, which reads JAX_PLATFORMS (--device) once, on import.


def read_checkpoint(path, args):
    """The checkpoint at ``path`` (state: the SVI state's leaves as NumPy arrays, history, args),
    once ``training.load_checkpoint`` found it readable and saved with ``args`` (but for
    ``training.RESUME_MAY_CHANGE``). Needs no JAX backend: the scripts call it before choosing one."""
    return training.load_checkpoint(path, pickle.loads, args, keys=("state",))


def fit(svi, train_step, state, make_batch, args, evaluate=None, batch_size=None):
    """Run ``args.steps`` steps of ``train_step(state, *batch, step) -> (state, loss)`` from ``state``
    (an ``svi.init`` state). Returns (state, history).

    ``make_batch(step)`` returns the arguments of step ``step``; the step's randomness comes from
    the SVI state and ``step``, so a resumed run repeats an uninterrupted one. ``evaluate(params)``
    is called every ``args.eval_every`` steps. Checkpoints (the state's leaves) go to ``args.out``
    every ``args.checkpoint_every`` steps and on SIGINT/SIGTERM (then the process exits);
    ``args.resume`` continues from the last one (``read_checkpoint``: readable, and saved with the
    same options but those in ``training.RESUME_MAY_CHANGE``; else one line and exit status 2).
    Losses are read from the device in blocks, so that steps are dispatched ahead of the computation.
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

    eval_every = getattr(args, "eval_every", None)
    progress = training.Progress(args.steps, history.step, disable=args.no_progress)
    pending = []
    clock = training.Clock(history.seconds)
    with training.StopRequests() as stop:
        while history.step < args.steps and not stop.requested:
            batch = make_batch(history.step)
            state, loss = train_step(state, *batch, history.step)
            pending.append(loss)
            history.step += 1
            due_eval = evaluate is not None and (history.step % eval_every == 0 or history.step == args.steps)
            due_save = history.step % args.checkpoint_every == 0 or stop.requested
            if len(pending) == 50 or due_eval or due_save or history.step == args.steps:
                for value in np.asarray(jax.device_get(pending)) / (batch_size or len(batch[0])):
                    history.losses.append(float(value))
                    progress.update(float(value))
                pending = []
            with clock.paused():  # everything dispatched has finished: its losses were read
                if due_eval:
                    history.evaluations.append((history.step, float(evaluate(svi.get_params(state)))))
                history.seconds = clock.elapsed
                if due_save:
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
    with those shardings; XLA's SPMD partitioner splits the computation and all-reduces the
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

    def shard(self, x):
        """``x`` placed sharded on its first axis, or replicated when that does not split evenly (the
        last, short batch of an evaluation)."""
        import jax

        return jax.device_put(x, self.batch if x.shape[0] % self.devices == 0 else self.replicated)

    def replicate(self, tree):
        import jax

        return jax.device_put(tree, self.replicated)


def simulate_cpu_devices(devices):
    """Ask XLA for ``devices`` CPU devices (before JAX is imported): ``--device cpu --devices N``."""
    import os

    flag = "--xla_force_host_platform_device_count"
    if devices > 1 and flag not in os.environ.get("XLA_FLAGS", ""):
        # first: XLA stops reading flags at a token that is not a flag
        os.environ["XLA_FLAGS"] = f"{flag}={devices} {os.environ.get('XLA_FLAGS', '')}".strip()
