"""The Pyro training loop of the examples: SVI steps with checkpoints, resume, a clean stop on
SIGINT/SIGTERM, the progress bar and periodic evaluation."""

import io
from dataclasses import dataclass, field

import torch

from examples import training


@dataclass
class History:
    step: int = 0
    losses: list = field(default_factory=list)  # one per step, per data point
    evaluations: list = field(default_factory=list)  # (step, value)
    seconds: float = 0.0  # training wall time, without evaluation and checkpoints


def read_checkpoint(path, args):
    """The checkpoint at ``path`` (module, optim, history, args), once ``training.load_checkpoint``
    found it readable and saved with ``args`` (but for ``training.RESUME_MAY_CHANGE``). Its tensors
    are loaded on the CPU: ``load_state_dict`` and the optimizer then move them to the parameters'
    device, which --device may have changed."""

    def load(raw):
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False)

    return training.load_checkpoint(path, load, args, keys=("module", "optim"))


def fit(svi, module, optim, make_batch, args, evaluate=None, batch_size=None):
    """Run ``args.steps`` steps of ``svi`` (all parameters live in ``module``).

    ``make_batch(step)`` returns the arguments of step ``step`` (it draws the step's randomness
    after the loop has seeded torch with (seed, step), so a resumed run repeats an uninterrupted one);
    ``evaluate()`` is called every ``args.eval_every`` steps. Checkpoints go to ``args.out`` every
    ``args.checkpoint_every`` steps and on SIGINT/SIGTERM (then the process exits); ``args.resume``
    continues from the last one (``read_checkpoint``: readable, and saved with the same options but
    those in ``training.RESUME_MAY_CHANGE``; else one line and exit status 2).
    """
    path = training.checkpoint_path(args.out)
    history = History()
    if args.resume:
        saved = read_checkpoint(path, args)
        try:
            module.load_state_dict(saved["module"])
            optim.set_state(saved["optim"])
            history = History(**saved["history"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            training.checkpoint_does_not_fit(path, error)

    def save():
        if path is not None:
            buffer = io.BytesIO()
            saved = dict(module=module.state_dict(), optim=optim.get_state(), history=vars(history), args=vars(args))
            torch.save(saved, buffer)
            training.atomic_write(path, buffer.getvalue())

    # A JIT loss traces on its first call, drawing extra random numbers; compile it (and discard the
    # gradients) before the first counted step, so that every step draws its randomness the same
    # way, whether the run was resumed or not.
    torch.manual_seed(args.seed)
    svi.loss_and_grads(svi.model, svi.guide, *make_batch(history.step))
    module.zero_grad(set_to_none=True)

    eval_every = getattr(args, "eval_every", None)
    progress = training.Progress(args.steps, history.step, disable=args.no_progress)
    clock = training.Clock(history.seconds)
    with training.StopRequests() as stop:
        while history.step < args.steps and not stop.requested:
            torch.manual_seed(args.seed * 1_000_003 + history.step)
            batch = make_batch(history.step)
            loss = svi.step(*batch) / (batch_size or len(batch[0]))
            history.losses.append(loss)
            history.step += 1
            progress.update(loss)
            with clock.paused():
                if evaluate is not None and (history.step % eval_every == 0 or history.step == args.steps):
                    history.evaluations.append((history.step, float(evaluate())))
                history.seconds = clock.elapsed
                if history.step % args.checkpoint_every == 0 or stop.requested:
                    save()
    progress.close()
    history.seconds = clock.elapsed
    save()
    if stop.requested:
        print(f"stopped at step {history.step} by signal {stop.signal}; continue with --resume")
        raise SystemExit(128 + stop.signal)
    return history
