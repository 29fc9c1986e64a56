"""The Pyro training loop of the examples: SVI steps with checkpoints, resume, a clean stop on
SIGINT/SIGTERM, the progress bar and periodic evaluation."""

import gc
import io

import torch

from examples import data, training
from examples.training import History


def read_checkpoint(path, args):
    """The checkpoint at ``path`` (module, optim, history, args), once ``training.load_checkpoint``
    found it readable and saved with ``args`` (but for ``training.RESUME_MAY_CHANGE``). Its tensors
    are loaded on the CPU: ``load_state_dict`` and the optimizer then move them to the parameters'
    device, which --device may have changed."""

    def load(raw):
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False)

    return training.load_checkpoint(path, load, args, keys=("module", "optim"))


class Step:
    """One SVI step in PyTorch's own idiom, the loop of Pyro's ``examples/svi_torch.py``: one call
    on a first batch creates the parameters (the model's, the guide's and the loss's own, such as
    REBAR's) and one ``torch.optim`` optimizer over all of them, ``make_optimizer(params)``; every
    step then lets the loss write the gradients (``loss_and_grads``, so that losses without a
    ``differentiable_loss`` work too), steps the optimizer and drops the gradients.

    ``SVI.step`` with a ``pyro.optim`` optimizer computes the same update, but traces the
    parameters on every step, keeps one optimizer (one update kernel) per parameter and writes
    zeros into every gradient: on the discrete VAE that is a fifth of its time
    (``python -m bench.svi``). Parameters first created after the first batch would not be
    optimized: the examples create all of theirs on the first call."""

    def __init__(self, model, guide, loss, make_optimizer):
        self.model, self.guide, self.loss, self.make_optimizer = model, guide, loss, make_optimizer
        self.params, self.optim = {}, None

    def init(self, *args):
        """Create the parameters and the optimizer from one batch (its gradients are discarded).
        The optimizer's parameters are in the order of their names in Pyro's parameter store
        (``pyro.ops.jit`` visits them in set order, which differs between processes), so that a
        checkpoint's optimizer state fits the same parameters when it is loaded."""
        import pyro.poutine as poutine

        with poutine.trace(param_only=True) as capture:
            self.loss.loss_and_grads(self.model, self.guide, *args)
        self.params = {name: capture.trace.nodes[name]["value"].unconstrained() for name in sorted(capture.trace.nodes)}
        self.optim = self.make_optimizer(list(self.params.values()))
        self.optim.zero_grad(set_to_none=True)

    def __call__(self, *args):
        """One step on ``args``; the loss, a float."""
        if self.optim is None:
            raise RuntimeError("Step.init(*args) creates the parameters and the optimizer before the first step")
        loss = self.loss.loss_and_grads(self.model, self.guide, *args)
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        return loss

    def state_dict(self):
        """The optimizer's state with the names of its parameters, in its order."""
        return {"names": list(self.params), "optimizer": self.optim.state_dict()}

    def load_state_dict(self, state):
        """Load a ``state_dict()``, refusing one saved for other parameters (``torch.optim`` matches
        states by position and does not check shapes) or by a ``pyro.optim`` optimizer (one
        optimizer per parameter name: the checkpoints of these examples before ``Step``)."""
        if not (isinstance(state, dict) and {"names", "optimizer"} <= state.keys()):
            raise ValueError("its optimizer state is not a pyro_training.Step one (a pyro.optim state, one optimizer per "
                             "parameter, saved before the examples' step moved to a torch.optim optimizer?)")
        if state["names"] != list(self.params):
            raise ValueError(f"its optimizer is over the parameters {state['names']}, these options make {list(self.params)}")
        params = list(self.params.items())
        for index, saved in state["optimizer"]["state"].items():  # keyed by position; a parameter never stepped has none
            if not 0 <= index < len(params):
                raise ValueError(f"its optimizer state has an entry {index} for {len(params)} parameters")
            name, param = params[index]
            for key, value in saved.items():
                if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                    raise ValueError(f"its optimizer state {key} of {name} has shape {tuple(value.shape)}, "
                                     f"the parameter {tuple(param.shape)}")
        self.optim.load_state_dict(state["optimizer"])


class CompiledStep(Step):
    """:class:`Step` as one compiled graph: the loss, its gradient and the Adam update (``torch.optim.Adam``'s
    arithmetic, its ``capturable`` form) traced together by ``make_fx`` into one graph of tensor
    operations whose inputs are the parameters, Adam's state and the batch, and compiled by
    ``torch.compile`` with ``options``. With ``{"mode": "reduce-overhead"}`` on a GPU that is one CUDA
    graph per step: no kernel is launched from Python (issue 30: eager kernel launches put Pyro's
    step at 7x the JAX floor's time on an H200, and a compiled loss leaves the backward's and the
    optimizer's launches).

    ``make_optimizer`` must make a ``torch.optim.Adam`` (without weight decay, amsgrad or maximize:
    its ``lr``, ``betas`` and ``eps`` are read from it; ``fused`` is moot). Its state is what the graph
    updates in place (``capturable`` on a GPU), so ``state_dict`` and checkpoints are
    :class:`Step`'s. Tracing and compiling (in ``init``, and for each new batch shape) run the step
    twice on copies of the random generators' state, and the parameters and Adam's state are put
    back after them: no step is taken twice, the first draws what an eager step would, and the
    compilation is not inside the steps a loop times. The loss must be
    one whose gradient is that of ``differentiable_loss`` (the relaxed ELBOs, VIMCO); the
    restrictions are ``JitTrace_ELBO``'s (static structure, a new batch shape compiles again)."""

    def __init__(self, model, guide, loss, make_optimizer, options):
        super().__init__(model, guide, loss, make_optimizer)
        self.options = dict(options)
        self.compiled = {}  # signature of the batch -> compiled step

    def init(self, *args):
        super().init(*args)
        defaults = self.optim.defaults
        if type(self.optim) is not torch.optim.Adam or defaults["weight_decay"] or defaults["amsgrad"] or defaults["maximize"]:
            raise ValueError(f"CompiledStep: make_optimizer must make a torch.optim.Adam without weight_decay, amsgrad "
                             f"or maximize, it made {type(self.optim).__name__} with {defaults}")
        if len(self.optim.param_groups) != 1:
            raise ValueError("CompiledStep: make_optimizer must make one parameter group")
        self._capturable()
        self._compiled_for(args)  # compiled here, outside the steps the loop times

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._capturable()  # a checkpoint of a Step (or of another device) brings its own setting

    def _capturable(self):
        """On a GPU, Adam capturable: its step counts on the device, inputs of the graph like the rest
        (the CPU has no capturable Adam)."""
        group = self.optim.param_groups[0]
        group["capturable"] = any(p.device.type == "cuda" for p in self.params.values())
        for param in self.params.values():
            entry = self.optim.state[param]
            if entry:
                entry["step"] = entry["step"].to(dtype=torch.float32, device=param.device if group["capturable"] else "cpu")

    def _state(self):
        """Adam's state tensors per parameter (step, exp_avg, exp_avg_sq), made as its first step
        would make them where it has none yet."""
        state = []
        for param in self.params.values():
            entry = self.optim.state[param]
            if not entry:
                device = param.device if self.optim.param_groups[0]["capturable"] else "cpu"
                entry.update(step=torch.zeros((), dtype=torch.float32, device=device),
                             exp_avg=torch.zeros_like(param, memory_format=torch.preserve_format),
                             exp_avg_sq=torch.zeros_like(param, memory_format=torch.preserve_format))
            state.append((entry["step"], entry["exp_avg"], entry["exp_avg_sq"]))
        return state

    def _update(self, params, state, *args):
        """The step itself, eager: loss, gradient, and Adam in place (what is traced)."""
        loss = self.loss.differentiable_loss(self.model, self.guide, *args)
        grads = torch.autograd.grad(loss, params)
        group = self.optim.param_groups[0]
        (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
        with torch.no_grad():
            for param, grad, (step, exp_avg, exp_avg_sq) in zip(params, grads, state):
                step.add_(1)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                # torch.optim.Adam's capturable arithmetic (_single_tensor_adam): no value read back
                step_size_neg = (lr / (1 - beta1**step)).neg()
                bias_correction2_sqrt = (1 - beta2**step).sqrt()
                denom = (exp_avg_sq.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(eps / step_size_neg)
                param.addcdiv_(exp_avg, denom)
        return loss.detach()

    def __call__(self, *args):
        if self.optim is None:
            raise RuntimeError("Step.init(*args) creates the parameters and the optimizer before the first step")
        compiled, inputs = self._compiled_for(args)
        with torch.no_grad():  # the gradient is in the graph: its operations are run, not differentiated
            return float(compiled(*inputs, *args))

    def _compiled_for(self, args):
        """(the compiled step for batches like ``args``, its inputs but the batch)."""
        from pyro_concrete._tracing import _signature

        params, state = list(self.params.values()), self._state()
        inputs = [*params, *(t for entry in state for t in entry)]
        key = _signature(args)
        if key not in self.compiled:
            self.compiled[key] = self._compile(params, state, inputs, args)
        return self.compiled[key], inputs

    def _compile(self, params, state, inputs, args):
        """Trace and compile the step, and run it once (``torch.compile`` compiles on its first call):
        the parameters, Adam's state and the random generators are put back after both."""
        from torch.fx.experimental.proxy_tensor import make_fx

        def traced(*inputs_and_args):
            return self._update(params, state, *inputs_and_args[len(inputs):])

        import pyro

        saved = [t.detach().clone() for t in inputs]
        with torch.random.fork_rng(devices=sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})):
            with pyro.validation_enabled(False):  # as pyro.ops.jit: value checks are data-dependent
                graph = make_fx(traced)(*inputs, *args)  # runs the step: undone below
            for tensor in inputs:
                if tensor.device.type == "cuda":
                    # CUDA graphs ("reduce-overhead") take a graph that updates its inputs in place
                    # only where those stay at one address: the parameters and Adam's state do (a
                    # checkpoint loaded gives new ones: compiled again). Not yet run on a GPU (issue 30)
                    torch._dynamo.mark_static_address(tensor)
            compiled = torch.compile(graph, **self.options)
            with torch.no_grad():
                compiled(*inputs, *args)  # compiles; undone below
                for tensor, value in zip(inputs, saved):
                    tensor.copy_(value)
        return compiled


def adam(lr, fused=False):
    """``make_optimizer`` for ``Step``: ``torch.optim.Adam`` at learning rate ``lr``; ``fused``: one
    kernel per update instead of six (``bench.svi``)."""
    return lambda params: torch.optim.Adam(params, lr=lr, fused=fused)


def batches(train, args):
    """``data.Batches`` of the rows of ``train`` (a tensor on its device) for ``args.batch_size`` and
    ``args.seed``: each epoch's permutation is made and moved to the device once, so a step's batch,
    ``train[batches(step)]``, is chosen there (no permutation, no transfer at each step)."""
    return training.batches_or_fail(
        lambda: data.Batches(len(train), args.batch_size, args.seed, place=lambda order: torch.as_tensor(order, device=train.device))
    )


def torch_device(name):
    """The ``torch.device`` of ``--device`` (``training.device_name``'s ``cpu``, ``cuda`` or
    ``cuda:N``; None: a GPU if torch sees one), or a one-line error where torch cannot use it,
    before the data are loaded."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            training.fail(f"--device {name}: torch sees no CUDA device (torch {torch.__version__})")
        if device.index is not None and device.index >= count:
            training.fail(f"--device {name}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def seed_step(seed, device):
    """``torch.manual_seed(seed)`` before a step on ``device``. A CPU step's draws all come from the
    CPU's generator, which alone is seeded then: ``torch.manual_seed`` also queues, where CUDA has not
    started, a seeding of CUDA with a stack trace of the call, 0.2 ms at every step."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def fit(step, module, make_batch, args, evaluate=None, batch_size=None, parallel=None):
    """Run ``args.steps`` calls of ``step`` (a ``Step``; all parameters live in ``module`` or in
    the loss), or with ``parallel`` (a ``DataParallel``) its steps: each process trains on its
    shard of the batch, only rank 0 evaluates and writes checkpoints.

    ``make_batch(step)`` returns the arguments of step ``step`` (it draws the step's randomness
    after the loop has seeded torch with (seed, step), so a resumed run repeats an uninterrupted one);
    ``evaluate()`` is called every ``args.eval_every`` steps. Checkpoints go to ``args.out`` every
    ``args.checkpoint_every`` steps and on SIGINT/SIGTERM (then the process exits); ``args.resume``
    continues from the last one (``read_checkpoint``: readable, and saved with the same options but
    those in ``training.RESUME_MAY_CHANGE``; else one line and exit status 2).
    """
    path = training.checkpoint_path(args.out)
    history = History()
    saved = read_checkpoint(path, args) if args.resume else None
    if saved is not None:
        try:
            module.load_state_dict(saved["module"])
            history = History(**saved["history"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            training.checkpoint_does_not_fit(path, error)

    leader = parallel is None or parallel.rank == 0
    device = next(module.parameters()).device

    def save():
        if path is not None and leader:
            buffer = io.BytesIO()
            # the loss's own parameters too (REBAR's eta and temperature scale, RELAX's network): they
            # live in Pyro's param store, not in the module, and a resumed run restarted them
            params = {name: value.detach().cpu() for name, value in step.params.items()}
            saved = dict(module=module.state_dict(), optim=step.state_dict(), params=params, history=vars(history), args=vars(args))
            torch.save(saved, buffer)
            training.atomic_write(path, buffer.getvalue())

    # The first call creates the parameters and the optimizer; a JIT loss also traces then, drawing
    # extra random numbers: made before the first counted step, so that every step draws its
    # randomness the same way, whether the run was resumed or not.
    torch.manual_seed(args.seed)
    batch = make_batch(history.step)
    step.init(*(batch if parallel is None else (parallel.shard(batch[0]),) + tuple(batch[1:])))
    if saved is not None:
        try:
            with torch.no_grad():
                for name, value in saved.get("params", {}).items():  # checkpoints before them hold none
                    if name in step.params:
                        step.params[name].copy_(value)
            step.load_state_dict(saved["optim"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            training.checkpoint_does_not_fit(path, error)

    eval_every = getattr(args, "eval_every", None)
    progress = training.Progress(args.steps, history.step, disable=args.no_progress)
    clock = training.Clock(history.seconds)
    with training.StopRequests() as stop:
        while history.step < args.steps and not stop.requested:
            seed_step(args.seed * 1_000_003 + history.step, device)
            batch = make_batch(history.step)
            if parallel is None:
                loss = step(*batch) / (batch_size or len(batch[0]))
            else:
                loss = parallel.step(batch[0], seed=(args.seed * 1_000_003 + history.step) * 1_009) / (batch_size or len(batch[0]))
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
    ``DistributedDataParallel``, which all-reduces the gradients during ``backward``; then the
    ``Step``'s optimizer steps. Plain DDP rather than Lightning: the same engine without a trainer
    that would replace the examples' loop, checkpoints and resume.

    Every process builds the same global batch (seeded by step) and trains on its own slice of it;
    the model is scored on that slice with its own noise (seeded by step and rank). Each process's
    loss is multiplied by the number of processes before ``backward``: DDP averages the gradients,
    and the loss of a batch is a sum over its data points, so the averaged gradient is then the
    gradient of the whole batch's loss, as one process computes it. Needs a loss with a
    ``differentiable_loss`` whose parameters all live in the module (``Trace_ELBO``,
    ``ImportanceWeightedELBO``, ``VIMCO``, ``GumbelRao``, ``DisARM`` and their compiled forms)."""

    def __init__(self, module, step):
        import torch.distributed as tdist
        from torch.nn.parallel import DistributedDataParallel

        self.world, self.rank, self.svi_step = tdist.get_world_size(), tdist.get_rank(), step
        self.device = device = next(module.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        self.objective = DistributedDataParallel(_Objective(module, step.loss, step.model, step.guide), device_ids=device_ids)

    def shard(self, x):
        """This process's slice of a global batch (the batch splits evenly: the scripts check)."""
        return x.tensor_split(self.world)[self.rank]

    def step(self, x, seed):
        """One SVI step on this process's slice of the global batch ``x``; the whole batch's loss."""
        import torch.distributed as tdist

        seed_step(seed + self.rank, self.device)
        loss = self.objective(self.shard(x))
        (loss * self.world).backward()
        optim = self.svi_step.optim
        optim.step()
        optim.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        tdist.all_reduce(total)
        return total.item()

    def close(self):
        """Leave the process group together (every process has trained, rank 0 has saved), after
        releasing DDP (its reducer must not outlive the group, nor be freed while the interpreter
        exits: gloo aborts the process then, "terminate called without an active exception")."""
        import torch.distributed as tdist

        tdist.barrier()
        del self.objective
        gc.collect()  # DDP sits in reference cycles: freed now, not during the interpreter's exit
        tdist.destroy_process_group()
