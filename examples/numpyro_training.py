"""The NumPyro training loop of the examples: compiled SVI steps with checkpoints, resume, a clean
stop on SIGINT/SIGTERM, the progress bar and periodic evaluation."""

import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np

from examples import training
from examples.pyro_training import History


def fit(svi, train_step, state, make_batch, args, evaluate=None, batch_size=None):
    """Run ``args.steps`` steps of ``train_step(state, *batch, step) -> (state, loss)`` from ``state``
    (an ``svi.init`` state). Returns (state, history).

    ``make_batch(step)`` returns the arguments of step ``step``; the step's randomness comes from
    the SVI state and ``step``, so a resumed run repeats an uninterrupted one. ``evaluate(params)``
    is called every ``args.eval_every`` steps. Checkpoints (the state's leaves) go to ``args.out``
    every ``args.checkpoint_every`` steps and on SIGINT/SIGTERM (then the process exits);
    ``args.resume`` continues from the last one. Losses are read from the device in blocks, so
    that steps are dispatched ahead of the computation.
    """
    path = training.checkpoint_path(args.out)
    history = History()
    if args.resume:
        if path is None or not os.path.exists(path):
            training.fail("--resume needs a checkpoint in --out")
        with open(path, "rb") as f:
            saved = pickle.load(f)
        treedef = jax.tree_util.tree_structure(state)
        state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(leaf) for leaf in saved["state"]])
        history = History(**saved["history"])

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
