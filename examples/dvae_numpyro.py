"""The discrete VAE of the paper (section 5.2, appendices C and D) in NumPyro: layers of n-ary
discrete latent nodes, trained with their Concrete relaxation and evaluated as the discrete graph.

    python -m examples.dvae_numpyro                               # (200H~64V), binary, 8x8 digits
    python -m examples.dvae_numpyro --arity 4 --particles 5       # 4-ary nodes, objective L_5
    python -m examples.dvae_numpyro --estimator reinforce         # discrete sites, score function
    python -m examples.dvae_numpyro --estimator reinforce --particles 5   # VIMCO, the paper's L_5 baseline
    python -m examples.dvae_numpyro --estimator rebar             # the discrete graph, REBAR on the relaxed sites
    python -m examples.dvae_numpyro --dataset fashion-mnist --steps 100000 --out runs/fmnist
    python -m examples.dvae_numpyro --devices 4 --device cpu      # data-parallel over 4 (simulated) devices

Model ``(200H~784V)``: z ~ p(z) (learned prior logits), x ~ Bernoulli(decoder(z)), with n-ary nodes
shown as corners of {-1, 1}^log2(n) (appendix D.2). Training relaxes every node: the prior at
temperature lambda_2, the posterior at lambda_1 (the paper's defaults per arity), both through the
log-space nodes (ExpConcrete / LogitBinConcrete, via ``log_space_config``); the objective is the
importance-weighted bound L_m, compiled with ``jax.jit``. The test NLL is -L_m of the *discrete*
graph (``discrete_log_likelihood``).
"""

import math

import numpy as np

from examples import data, numpyro_training, training


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
    parser.add_argument("--devices", type=training.positive_int, default=1,
                        help="data-parallel over this many JAX devices (jax.sharding): each batch split over them, "
                             "parameters replicated; with --device cpu they are simulated")
    args = training.parse(parser, argv, numpyro_training.read_checkpoint)
    training.check_estimator(args)
    if args.batch_size % args.devices:
        training.fail(f"--batch-size {args.batch_size} does not split evenly over --devices {args.devices}")
    return args


# Parsed first: --device must reach JAX before it initializes a backend.
if __name__ == "__main__":
    _ARGS = parse_args(None)
    numpyro_training.use_platform(_ARGS.device, _ARGS.devices)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402

from numpyro_concrete import (  # noqa: E402
    REBAR,
    RELAX,
    BinConcrete,
    Concrete,
    DisARM,
    GumbelRao,
    VIMCO,
    ImportanceWeightedELBO,
    ScoreFunctionELBO,
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
        codes = np.arange(arity)[:, None] >> np.arange(self.bits - 1, -1, -1)  # binary digits of each state
        self.corners = jnp.asarray((2.0 * (codes & 1) - 1.0).T)  # (bits, arity): the corners as columns

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
        return (value @ self.corners.T).reshape(value.shape[:-2] + (self.units,))


def network(name, x, outputs, nonlinear, output_bias=None):
    """Linear ('-'), or two tanh layers ('~') of the size of the stochastic layer feeding the
    network, the size of ``x`` (appendix D.1); Glorot initialization, zero biases (``output_bias``
    initializes the last one)."""
    inputs = x.shape[-1]
    sizes = [inputs, inputs, inputs, outputs] if nonlinear else [inputs, outputs]
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = numpyro.param(f"{name}.w{i}", lambda key, shape=(n_in, n_out): jax.nn.initializers.glorot_uniform()(key, shape))
        last = i == len(sizes) - 2
        b = numpyro.param(f"{name}.b{i}", jnp.zeros(n_out) if not last or output_bias is None else output_bias)
        x = x @ w + b
        if not last:
            x = jnp.tanh(x)
    return x


class DiscreteVAE:
    """Generative layers top to bottom z1 -> ... -> x; inference x -> ... -> z1."""

    def __init__(self, layers, nonlinear, temperatures, base_rate, reinforce):
        self.layers, self.names = layers, [f"z{i + 1}" for i in range(len(layers))] if len(layers) > 1 else ["z"]
        self.nonlinear = nonlinear
        self.prior_temperature, self.posterior_temperature = temperatures
        self.base_logit = jax.scipy.special.logit(jnp.clip(base_rate, 1e-3, 1 - 1e-3))  # appendix D.3
        self.reinforce = reinforce

    def decode(self, h):
        return network("decoder", h, self.base_logit.shape[-1], self.nonlinear, self.base_logit)

    def model(self, x):
        logits = numpyro.param("prior_logits", jnp.zeros(self.layers[0].num_logits))
        with numpyro.plate("data", x.shape[0]):
            for i, (name, layer) in enumerate(zip(self.names, self.layers)):
                z = numpyro.sample(name, layer.distribution(self.prior_temperature, logits))
                h = layer.embed(z)
                if i + 1 < len(self.layers):
                    logits = network(f"prior{i}", h, self.layers[i + 1].num_logits, self.nonlinear)
            numpyro.sample("x", dist.Bernoulli(logits=self.decode(h)).to_event(1), obs=x)

    def guide(self, x):
        with numpyro.plate("data", x.shape[0]):
            infer = {}
            if self.reinforce:  # a learned, input-dependent baseline for the score-function estimator
                infer = {"baseline": {"baseline_value": network("baseline", x, 1, self.nonlinear)[..., 0]}}
            h = x
            for i, (name, layer) in enumerate(zip(reversed(self.names), reversed(self.layers))):
                logits = network(f"encoder{i}", h, layer.num_logits, self.nonlinear)
                z = numpyro.sample(name, layer.distribution(self.posterior_temperature, logits), infer=infer)
                h = layer.embed(z)

    def images(self, params, x, key):
        """Rows of images: samples of the discrete graph, data, its reconstructions (posterior mode)."""
        bottom = self.names[-1]
        sample = handlers.trace(handlers.seed(handlers.substitute(discrete(self.model), params), key)).get_trace(x)
        mode = handlers.trace(handlers.seed(handlers.substitute(discrete(self.guide, mode="argmax"), params), key)).get_trace(x)
        decode = handlers.substitute(self.decode, params)
        return [
            jax.nn.sigmoid(decode(self.layers[-1].embed(sample[bottom]["value"]))),
            x,
            jax.nn.sigmoid(decode(self.layers[-1].embed(mode[bottom]["value"]))),
        ]


DISCRETE_GRAPH_ESTIMATORS = {"rebar": REBAR, "relax": RELAX, "gumbel-rao": GumbelRao, "disarm": DisARM}


def make_svi(vae, optim, estimator="concrete", particles=1):
    """SVI for the relaxed model through its log-space nodes (objective L_m); for the discrete
    model with the score-function estimator and the learned baseline (VIMCO at m > 1); or for the
    discrete graph with REBAR, RELAX, Gumbel-Rao or DisARM on the relaxed model and guide."""
    if estimator == "concrete":
        model, guide = handlers.reparam(vae.model, config=log_space_config), handlers.reparam(vae.guide, config=log_space_config)
        loss = Trace_ELBO() if particles == 1 else ImportanceWeightedELBO(num_particles=particles, plate="data")
    elif estimator == "reinforce":  # m > 1: VIMCO, the paper's multi-sample score-function baseline (no learned baseline)
        loss = ScoreFunctionELBO(plate="data") if particles == 1 else VIMCO(num_particles=particles, plate="data")
        model, guide = discrete(vae.model), discrete(vae.guide)
    else:  # the discrete graph's gradient from the relaxed model and guide
        loss = DISCRETE_GRAPH_ESTIMATORS[estimator](plate="data")
        model, guide = vae.model, loss.guide(vae.guide)
    return SVI(model, guide, optim, loss)


def make_train_step(svi, binarize, binarize_key, parallel=None):
    """One compiled step: binarize the batch (a fresh Bernoulli(x) draw per step, or x > 1/2) and
    update; with ``parallel`` (a ``numpyro_training.DataParallel``) the batch is sharded over its
    devices and the state replicated."""

    def train_step(state, x, step):
        if binarize == "dynamic":
            x = jax.random.bernoulli(jax.random.fold_in(binarize_key, step), x).astype(x.dtype)
        else:
            x = (x > 0.5).astype(x.dtype)
        return svi.update(state, x)

    return parallel.jit(train_step) if parallel else jax.jit(train_step)


def evaluator(vae, num_particles):
    """A compiled per-image L_m of the discrete graph."""

    def bound(params, x, key):
        return discrete_log_likelihood(vae.model, vae.guide, x, num_particles=num_particles, plate="data", params=params, rng_key=key)

    return jax.jit(bound)


def evaluate(bound, params, images, batch_size, key, place=lambda x: x):
    return np.concatenate([
        np.asarray(bound(params, place(images[start : start + batch_size]), jax.random.fold_in(key, start)))
        for start in range(0, len(images), batch_size)
    ])


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
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

    train = jnp.asarray(dataset.train)
    learned_baseline = args.estimator == "reinforce" and args.particles == 1
    vae = DiscreteVAE(layers, args.conditioning == "nonlinear", temperatures, train.mean(0), learned_baseline)
    svi = make_svi(vae, numpyro.optim.Adam(args.lr), args.estimator, args.particles)
    key = jax.random.PRNGKey(args.seed)
    init_key, binarize_key, eval_key = jax.random.split(key, 3)
    parallel = numpyro_training.DataParallel(args.devices) if args.devices > 1 else None
    place = parallel.shard if parallel else (lambda x: x)
    # unsharded here: fit compiles it into its blocks of steps, with the shardings of ``parallel``
    train_step = make_train_step(svi, args.binarize, binarize_key)

    state = svi.init(init_key, train[: args.batch_size])
    if parallel:
        state = parallel.replicate(state)
    quick_bound = evaluator(vae, 1)
    valid = jnp.asarray(data.fixed_binarization(dataset.valid[:1000], args.binarize))

    def validation(params):
        return -evaluate(quick_bound, params, valid, 500, eval_key, place).mean()

    state, history = numpyro_training.fit(svi, train_step, state, (train,), args, evaluate=validation, parallel=parallel)

    params = svi.get_params(state)
    test = jnp.asarray(data.fixed_binarization(dataset.test, args.binarize))
    test_bound = evaluate(evaluator(vae, args.eval_samples), params, test, max(1, 50000 // args.eval_samples), eval_key, place)
    test_nll = -float(test_bound.mean())
    metrics = dict(
        example="dvae", backend="numpyro", dataset=dataset.name, arity=args.arity, layers=args.layers, units=units,
        conditioning=args.conditioning, estimator=args.estimator, particles=args.particles, temperatures=temperatures,
        steps=history.step, lr=args.lr, batch_size=args.batch_size, seed=args.seed, eval_samples=args.eval_samples,
        devices=args.devices, platform=jax.devices()[0].platform,
        test_nll=test_nll, final_train_loss=float(np.mean(history.losses[-100:])), train_seconds=history.seconds,
        seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="negative objective per image (nats)")
    rows = [np.asarray(r) for r in vae.images(params, test[:10], eval_key)]
    training.save_image_grid(args.out, "images.png", rows, dataset.image_shape, ["samples", "test data", "reconstructions"])
    print(f"test NLL of the discrete graph (L_{args.eval_samples}): {test_nll:.2f} nats  "
          f"[{dataset.name}, {args.arity}-ary, m={args.particles}, {args.estimator}, {history.step} steps, "
          f"{1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    main()
