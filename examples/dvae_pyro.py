"""The discrete VAE of the paper (section 5.2, appendices C and D) in Pyro: layers of n-ary discrete
latent nodes, trained with their Concrete relaxation and evaluated as the discrete graph.

    python -m examples.dvae_pyro                                  # (200H~64V), binary, 8x8 digits
    python -m examples.dvae_pyro --arity 4 --particles 5          # 4-ary nodes, objective L_5
    python -m examples.dvae_pyro --estimator reinforce            # discrete sites, score function
    python -m examples.dvae_pyro --estimator reinforce --particles 5   # VIMCO, the paper's L_5 baseline
    python -m examples.dvae_pyro --estimator rebar                # the discrete graph, REBAR on the relaxed sites
    python -m examples.dvae_pyro --compile                        # the whole step compiled by torch.compile (one graph)
    python -m examples.dvae_pyro --dataset fashion-mnist --steps 100000 --out runs/fmnist
    torchrun --nproc_per_node 2 -m examples.dvae_pyro --out runs/ddp   # data-parallel, 2 processes (DDP)

Model ``(200H~784V)``: z ~ p(z) (learned prior logits), x ~ Bernoulli(decoder(z)), with n-ary nodes
shown as corners of {-1, 1}^log2(n) (appendix D.2). Training relaxes every node: the prior at
temperature lambda_2, the posterior at lambda_1 (the paper's defaults per arity), both through the
log-space nodes (ExpConcrete / LogitBinConcrete, via ``log_space_config``); the objective is the
importance-weighted bound L_m. The test NLL is -L_m of the *discrete* graph (``discrete_log_likelihood``).

Under ``torchrun`` each process trains on its slice of every batch (``--batch-size`` is the whole
batch), with torch's ``DistributedDataParallel`` (gloo on CPUs, NCCL on GPUs); rank 0 evaluates and
writes the checkpoints and results (``pyro_training.DataParallel``).
"""

import math
import os

import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro import poutine
from pyro.infer import JitTrace_ELBO, JitTraceGraph_ELBO, Trace_ELBO, TraceGraph_ELBO

from examples import data, pyro_training, training
from pyro_concrete import (
    REBAR,
    RELAX,
    VIMCO,
    BinConcrete,
    DisARM,
    GumbelRao,
    Concrete,
    ImportanceWeightedELBO,
    JitImportanceWeightedELBO,
    JitVIMCO,
    discrete,
    discrete_log_likelihood,
    log_space_config,
)

# (prior lambda_2, posterior lambda_1) by arity: the paper's appendix D.5
PAPER_TEMPERATURES = {2: (1 / 2, 2 / 3), 4: (2 / 3, 1.0), 8: (2 / 5, 2 / 3)}


class NodeLayer:
    """``units`` coordinates of the hypercube, grouped into n-ary nodes of log2(n) coordinates;
    a node's value is a corner of {-1, 1}^log2(n) (appendix D.2), relaxed through Concrete
    (BinConcrete for n = 2)."""

    def __init__(self, units, arity):
        self.arity, self.bits = arity, int(math.log2(arity))
        if 2**self.bits != arity or units % self.bits:
            raise ValueError(f"--latent-units {units} must be a multiple of log2(arity) = {self.bits} (arity a power of 2)")
        self.units, self.nodes = units, units // self.bits
        codes = torch.arange(arity)[:, None] >> torch.arange(self.bits - 1, -1, -1)  # binary digits of each state
        self.corners = (2.0 * (codes & 1) - 1.0).T  # (bits, arity): the corners as columns

    @property
    def num_logits(self):
        return self.units if self.arity == 2 else self.nodes * self.arity

    def distribution(self, temperature, logits):
        if self.arity == 2:
            return BinConcrete(temperature, logits=logits).to_event(1)
        return Concrete(temperature, logits=logits.reshape(logits.shape[:-1] + (self.nodes, self.arity))).to_event(1)

    def embed(self, value):
        """The corner coordinates in [-1, 1]^units of a (relaxed or discrete) value."""
        if self.arity == 2:
            return 2.0 * value - 1.0
        return (value @ self.corners.to(value).T).reshape(value.shape[:-2] + (self.units,))


def network(inputs, outputs, nonlinear):
    """Linear ('-'), or two tanh layers ('~') of the size of the stochastic layer feeding the
    network, ``inputs`` (appendix D.1); Glorot initialization, zero biases."""
    layers = [nn.Linear(inputs, outputs)] if not nonlinear else [
        nn.Linear(inputs, inputs), nn.Tanh(), nn.Linear(inputs, inputs), nn.Tanh(), nn.Linear(inputs, outputs)
    ]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class DiscreteVAE(nn.Module):
    """Generative layers top to bottom z1 -> ... -> x; inference x -> ... -> z1. Its parameters are
    registered in Pyro's parameter store under ``name``."""

    name = "dvae"

    def __init__(self, data_dim, layers, nonlinear, temperatures, base_rate, reinforce):
        super().__init__()
        self.layers, self.names = layers, [f"z{i + 1}" for i in range(len(layers))] if len(layers) > 1 else ["z"]
        self.prior_temperature, self.posterior_temperature = temperatures
        self.prior_logits = nn.Parameter(torch.zeros(layers[0].num_logits))
        self.priors = nn.ModuleList(  # p(z_{i+1} | z_i)
            network(upper.units, lower.num_logits, nonlinear) for upper, lower in zip(layers, layers[1:])
        )
        self.decoder = network(layers[-1].units, data_dim, nonlinear)
        self.decoder[-1].bias.data = torch.logit(torch.as_tensor(base_rate).clamp(1e-3, 1 - 1e-3))  # appendix D.3
        inputs = [data_dim] + [layer.units for layer in reversed(layers[1:])]
        self.encoders = nn.ModuleList(  # q(z_i | layer below), bottom first
            network(n_in, layer.num_logits, nonlinear) for n_in, layer in zip(inputs, reversed(layers))
        )
        # a learned, input-dependent baseline for the score-function estimator
        self.baseline = network(data_dim, 1, nonlinear) if reinforce else None

    def model(self, x):
        pyro.module(self.name, self)
        with pyro.plate("data", x.shape[0]):
            logits = self.prior_logits
            for i, (name, layer) in enumerate(zip(self.names, self.layers)):
                z = pyro.sample(name, layer.distribution(self.prior_temperature, logits))
                h = layer.embed(z)
                logits = self.priors[i](h) if i < len(self.priors) else None
            pyro.sample("x", dist.Bernoulli(logits=self.decoder(h)).to_event(1), obs=x)

    def guide(self, x):
        pyro.module(self.name, self)
        infer = {} if self.baseline is None else {"baseline": {"baseline_value": self.baseline(x).squeeze(-1)}}
        with pyro.plate("data", x.shape[0]):
            h = x
            for name, layer, encoder in zip(reversed(self.names), reversed(self.layers), self.encoders):
                z = pyro.sample(name, layer.distribution(self.posterior_temperature, encoder(h)), infer=infer)
                h = layer.embed(z)

    @torch.no_grad()
    def images(self, x, num):
        """Rows of images: samples of the discrete graph, data, its reconstructions (posterior mode)."""
        samples = poutine.trace(discrete(self.model)).get_trace(x[:num])
        bottom = self.names[-1]
        decoded = torch.sigmoid(self.decoder(self.layers[-1].embed(samples.nodes[bottom]["value"])))
        mode = poutine.trace(discrete(self.guide, mode="argmax")).get_trace(x[:num])
        reconstruction = torch.sigmoid(self.decoder(self.layers[-1].embed(mode.nodes[bottom]["value"])))
        return [decoded, x[:num], reconstruction]


DISCRETE_GRAPH_ESTIMATORS = {"rebar": REBAR, "relax": RELAX, "gumbel-rao": GumbelRao, "disarm": DisARM}


def make_step(vae, make_optimizer, estimator="concrete", particles=1, jit=True, compile=None):
    """The training step (``pyro_training.Step``) for the relaxed model through its log-space nodes (objective L_m); for the discrete
    model with the score-function estimator and the learned baseline (VIMCO at m > 1); or for the
    discrete graph with REBAR, RELAX, Gumbel-Rao or DisARM on the relaxed model and guide.

    ``compile``: ``torch.compile``'s options (``{}`` for its defaults), to compile the whole step with
    it (``pyro_training.CompiledStep``: the loss, its gradient and Adam's update traced into one
    graph, the parameters and Adam's state its inputs) instead of tracing the loss with
    ``torch.jit.trace``; for the losses that are their gradient's (concrete; reinforce at m > 1)."""
    if compile is not None and not has_compiled_loss(estimator, particles):
        raise ValueError(f"compile: --estimator {estimator} at --particles {particles} has no compiled loss; "
                         "compile works with concrete, and with reinforce at --particles > 1 (VIMCO)")
    if compile is not None:  # L_m (at m = 1 the ELBO of Trace_ELBO) or VIMCO: the whole step one graph
        if estimator == "concrete":
            model, guide = poutine.reparam(vae.model, config=log_space_config), poutine.reparam(vae.guide, config=log_space_config)
            loss = ImportanceWeightedELBO(particles, "data")
        else:
            model, guide, loss = discrete(vae.model), discrete(vae.guide), VIMCO(particles, "data")
        return pyro_training.CompiledStep(model, guide, loss, make_optimizer, compile)
    if estimator == "concrete":
        model, guide = poutine.reparam(vae.model, config=log_space_config), poutine.reparam(vae.guide, config=log_space_config)
        if particles == 1:
            loss = JitTrace_ELBO(ignore_jit_warnings=True) if jit else Trace_ELBO()
        else:
            loss = (JitImportanceWeightedELBO(particles, "data", ignore_jit_warnings=True) if jit
                    else ImportanceWeightedELBO(particles, "data"))
    elif estimator == "reinforce":
        model, guide = discrete(vae.model), discrete(vae.guide)
        if particles == 1:
            loss = JitTraceGraph_ELBO(ignore_jit_warnings=True) if jit else TraceGraph_ELBO()
        else:  # VIMCO, the paper's multi-sample score-function baseline (no learned baseline)
            loss = JitVIMCO(particles, "data", ignore_jit_warnings=True) if jit else VIMCO(particles, "data")
    else:  # the discrete graph's gradient from the relaxed model and guide (uncompiled: second derivatives)
        loss = DISCRETE_GRAPH_ESTIMATORS[estimator](plate="data")
        model, guide = vae.model, loss.guide(vae.guide)
    return pyro_training.Step(model, guide, loss, make_optimizer)


def batch_maker(train, args):
    """``make_batch(step)`` for ``pyro_training.fit``: the step's rows of ``train`` (chosen on its
    device), binarized (a fresh Bernoulli(x) draw, or x > 1/2)."""
    batches = pyro_training.batches(train, args)

    def make_batch(step):
        x = train[batches(step)]
        return (torch.bernoulli(x) if args.binarize == "dynamic" else (x > 0.5).to(x),)

    return make_batch


def evaluate(vae, images, num_particles, batch_size):
    """Per-image L_m of the discrete graph, in nats."""
    bounds = []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size]
        bounds.append(discrete_log_likelihood(vae.model, vae.guide, x, num_particles=num_particles, plate="data"))
    return torch.cat(bounds)


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=20000, batch_size=64, lr=1e-3)
    parser.add_argument("--dataset", default="digits", choices=["digits", "fashion-mnist"])
    parser.add_argument("--data-dir", default=None, help="a directory of MNIST-format IDX files instead")
    parser.add_argument("--binarize", default="dynamic", choices=["dynamic", "threshold"])
    parser.add_argument("--arity", type=int, default=2, choices=[2, 4, 8])
    parser.add_argument("--latent-units", type=training.positive_int, default=None, help="H per layer (default 200, 240 for 8-ary)")
    parser.add_argument("--layers", type=int, default=1, choices=[1, 2], help="stochastic layers")
    parser.add_argument("--conditioning", default="nonlinear", choices=["nonlinear", "linear"])
    parser.add_argument("--estimator", default="concrete", choices=training.ESTIMATORS,
                        help="relaxed training (concrete), the score function (reinforce), or the discrete graph's gradient "
                             "built on the relaxation (rebar, relax, gumbel-rao, disarm)")
    parser.add_argument("--particles", type=training.positive_int, default=1, help="m of the training objective L_m")
    parser.add_argument("--prior-temperature", type=training.positive_float, default=None, help="lambda_2 (default: the paper's)")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=None, help="lambda_1 (default: the paper's)")
    parser.add_argument("--eval-samples", type=training.positive_int, default=1000, help="m of the test NLL (the paper used 50000)")
    parser.add_argument("--eval-every", type=training.positive_int, default=2000, help="steps between validation evaluations")
    parser.add_argument("--no-jit", action="store_true", help="use the uncompiled ELBO")
    parser.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                        help="compile the whole step (loss, gradient, Adam) with torch.compile instead of tracing the "
                             "loss with torch.jit.trace, in this mode (reduce-overhead: one CUDA graph per step on a GPU); "
                             "concrete, or reinforce with --particles > 1")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    training.check_estimator(args)
    if args.compile is not None:
        if args.no_jit:
            training.fail("--compile and --no-jit: choose one (--compile compiles the whole step with torch.compile)")
        if not has_compiled_loss(args.estimator, args.particles):
            training.fail(f"--compile: --estimator {args.estimator} at --particles {args.particles} has no compiled loss; "
                          "use concrete, or reinforce with --particles > 1 (VIMCO)")
        if "WORLD_SIZE" in os.environ:
            training.fail("--compile does not run under torchrun (untested with DistributedDataParallel); leave it out there")
    return args


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def has_compiled_loss(estimator, particles):
    """Whether ``--compile`` has a loss to compile: L_m of the relaxed model, or VIMCO (reinforce, m > 1)."""
    return estimator == "concrete" or (estimator == "reinforce" and particles > 1)


# the losses whose gradient DDP can all-reduce: a differentiable_loss, parameters only in the module
# (REBAR and RELAX tune their control variates on each step's own gradient estimate; Pyro's
# TraceGraph_ELBO, the REINFORCE loss at m = 1, has no differentiable_loss)
DISTRIBUTED_ESTIMATORS = ("concrete", "gumbel-rao", "disarm")


def start_processes(args):
    """Join the process group ``torchrun`` describes (environment variables WORLD_SIZE, RANK,
    LOCAL_RANK, MASTER_ADDR/PORT); None when not started by it. Returns (rank, world size, device)."""
    import torch.distributed as tdist

    if "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    if args.estimator not in DISTRIBUTED_ESTIMATORS and not (args.estimator == "reinforce" and args.particles > 1):
        training.fail(f"--estimator {args.estimator} (with --particles {args.particles}) does not run under torchrun: "
                      f"use one of {', '.join(DISTRIBUTED_ESTIMATORS)}, or reinforce with --particles > 1 (VIMCO)")
    if args.batch_size % world:
        training.fail(f"--batch-size {args.batch_size} does not split evenly over {world} processes")
    cuda = pyro_training.torch_device(args.device).type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    tdist.init_process_group("nccl" if cuda else "gloo")
    return tdist.get_rank(), world, device


def main(argv=None):
    args = parse_args(argv)
    device = pyro_training.torch_device(args.device)
    processes = start_processes(args)
    rank, world = 0, 1
    if processes is not None:
        rank, world, device = processes
    try:
        dataset = data.load(args.dataset, args.data_dir)
    except data.DataNotFound as error:
        training.fail(str(error))
    units = args.latent_units or (240 if args.arity == 8 else 200)
    try:
        layers = [NodeLayer(units, args.arity) for _ in range(args.layers)]
    except ValueError as error:
        training.fail(str(error))
    paper = PAPER_TEMPERATURES[args.arity]
    temperatures = (args.prior_temperature or paper[0], args.posterior_temperature or paper[1])

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    train = torch.as_tensor(dataset.train, device=device)
    learned_baseline = args.estimator == "reinforce" and args.particles == 1
    vae = DiscreteVAE(dataset.dim, layers, args.conditioning == "nonlinear", temperatures, train.mean(0), learned_baseline).to(device)
    step = make_step(vae, pyro_training.adam(args.lr, fused=True), args.estimator, args.particles, jit=not args.no_jit,
                     compile=None if args.compile is None else {"mode": args.compile})

    valid = torch.as_tensor(data.fixed_binarization(dataset.valid[:1000], args.binarize), device=device)

    make_batch = batch_maker(train, args)
    parallel = pyro_training.DataParallel(vae, step) if processes is not None else None
    history = pyro_training.fit(step, vae, make_batch, args, evaluate=lambda: -evaluate(vae, valid, 1, 500).mean(),
                                parallel=parallel)
    if parallel is not None:
        parallel.close()
        if rank != 0:
            return None

    test = torch.as_tensor(data.fixed_binarization(dataset.test, args.binarize), device=device)
    torch.manual_seed(args.seed)
    test_nll = -evaluate(vae, test, args.eval_samples, max(1, 50000 // args.eval_samples)).mean().item()
    metrics = dict(
        example="dvae", backend="pyro", dataset=dataset.name, arity=args.arity, layers=args.layers, units=units,
        conditioning=args.conditioning, estimator=args.estimator, particles=args.particles, temperatures=temperatures,
        steps=history.step, lr=args.lr, batch_size=args.batch_size, seed=args.seed, eval_samples=args.eval_samples,
        devices=world, platform=device.type,
        test_nll=test_nll, final_train_loss=float(np.mean(history.losses[-100:])), train_seconds=history.seconds,
        seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="negative objective per image (nats)")
    rows = [r.cpu().numpy() for r in vae.images(test, 10)]
    training.save_image_grid(args.out, "images.png", rows, dataset.image_shape, ["samples", "test data", "reconstructions"])
    print(f"test NLL of the discrete graph (L_{args.eval_samples}): {test_nll:.2f} nats  "
          f"[{dataset.name}, {args.arity}-ary, m={args.particles}, {args.estimator}, {history.step} steps, "
          f"{1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    main()
