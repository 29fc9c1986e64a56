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


def fit(svi, module, optim, make_batch, args, evaluate=None, batch_size=None, parallel=None):
    """Run ``args.steps`` steps of ``svi`` (all parameters live in ``module``), or with ``parallel``
    (a ``DataParallel``) its steps: each process trains on its shard of the batch, only rank 0
    evaluates and writes checkpoints.

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

    leader = parallel is None or parallel.rank == 0

    def save():
        if path is not None and leader:
            buffer = io.BytesIO()
            saved = dict(module=module.state_dict(), optim=optim.get_state(), history=vars(history), args=vars(args))
            torch.save(saved, buffer)
            training.atomic_write(path, buffer.getvalue())

    # A JIT loss traces on its first call, drawing extra random numbers; compile it (and discard the
    # gradients) before the first counted step, so that every step draws its randomness the same
    # way, whether the run was resumed or not.
    torch.manual_seed(args.seed)
    if parallel is None:
        svi.loss_and_grads(svi.model, svi.guide, *make_batch(history.step))
    else:
        parallel.warm_up(*make_batch(history.step))
    module.zero_grad(set_to_none=True)

    eval_every = getattr(args, "eval_every", None)
    progress = training.Progress(args.steps, history.step, disable=args.no_progress)
    clock = training.Clock(history.seconds)
    with training.StopRequests() as stop:
        while history.step < args.steps and not stop.requested:
            torch.manual_seed(args.seed * 1_000_003 + history.step)
            batch = make_batch(history.step)
            if parallel is None:
                loss = svi.step(*batch) / (batch_size or len(batch[0]))
            else:
                loss = parallel.step(optim, batch[0], seed=(args.seed * 1_000_003 + history.step) * 1_009) / (batch_size or len(batch[0]))
            history.losses.append(loss)
            history.step += 1
            progress.update(loss)
            with clock.paused():
                if leader and evaluate is not None and (history.step % eval_every == 0 or history.step == args.steps):
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


class _Objective(torch.nn.Module):
    """The loss as a module whose parameters are ``module``'s (Pyro's ``ELBOModule``, for a model and
    guide that are methods of a module rather than modules themselves)."""

    def __init__(self, module, loss, model, guide):
        super().__init__()
        self.module, self.loss, self.model, self.guide = module, loss, model, guide

    def forward(self, *args):
        return self.loss.differentiable_loss(self.model, self.guide, *args)


class DataParallel:
    """Data-parallel SVI under ``torch.distributed`` (one process per device, ``torchrun``): the loss
    as a module (Pyro's ``ELBO.__call__`` / ``ELBOModule`` pattern, the one Pyro's
    ``examples/svi_lightning.py`` hands to Lightning's DDP strategy) wrapped in torch's
    ``DistributedDataParallel``, which all-reduces the gradients during ``backward``; then the step
    ``SVI.step`` takes (the Pyro optimizer on the parameters the loss touched). Plain DDP rather than
    Lightning: the same engine without a trainer that would replace the examples' loop, checkpoints
    and resume.

    Every process builds the same global batch (seeded by step) and trains on its own slice of it;
    the model is scored on that slice with its own noise (seeded by step and rank). Each process's
    loss is multiplied by the number of processes before ``backward``: DDP averages the gradients,
    and the loss of a batch is a sum over its data points, so the averaged gradient is then the
    gradient of the whole batch's loss, as one process computes it. Needs a loss with a
    ``differentiable_loss`` whose parameters all live in the module (``Trace_ELBO``,
    ``ImportanceWeightedELBO``, ``VIMCO``, ``GumbelRao``, ``DisARM`` and their compiled forms)."""

    def __init__(self, module, loss, model, guide):
        import torch.distributed as tdist
        from torch.nn.parallel import DistributedDataParallel

        self.world, self.rank = tdist.get_world_size(), tdist.get_rank()
        device = next(module.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        self.objective = DistributedDataParallel(_Objective(module, loss, model, guide), device_ids=device_ids)

    def shard(self, x):
        """This process's slice of a global batch (the batch splits evenly: the scripts check)."""
        return x.tensor_split(self.world)[self.rank]

    def warm_up(self, x):
        """Call the loss once outside DDP (a compiled loss traces on its first call)."""
        self.objective.module(self.shard(x))

    def step(self, optim, x, seed):
        """One SVI step on this process's slice of the global batch ``x``; the whole batch's loss."""
        import pyro.poutine as poutine
        import torch.distributed as tdist
        from pyro.infer.util import zero_grads

        torch.manual_seed(seed + self.rank)
        with poutine.trace(param_only=True) as capture:
            loss = self.objective(self.shard(x))
            (loss * self.world).backward()
        params = {site["value"].unconstrained() for site in capture.trace.nodes.values()}
        optim(params)
        zero_grads(params)
        total = loss.detach().clone()
        tdist.all_reduce(total)
        return total.item()

    def close(self):
        """Leave the process group together (every process has trained, rank 0 has saved), after
        releasing DDP (its reducer must not outlive the group: gloo aborts the process then)."""
        import torch.distributed as tdist

        tdist.barrier()
        del self.objective
        tdist.destroy_process_group()
