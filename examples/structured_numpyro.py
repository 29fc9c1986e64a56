"""Structured output prediction (paper section 5.3) in NumPyro: predict the bottom half of a digit
from its top half through two layers of binary latent nodes, ``(392V-240H-240H-392V)`` on 28x28
images (``(32V-240H-240H-32V)`` on the 8x8 digits).

    python -m examples.structured_numpyro                         # 8x8 digits, objective L_1^SP
    python -m examples.structured_numpyro --particles 5 --dataset fashion-mnist --out runs/sp

The model is p(bottom, z1, z2 | top) = p(z1 | top) p(z2 | z1) p(bottom | z2) with linear ('-')
conditioning and no guide: the objective L_m^SP = E log (1/m) sum_i p(bottom | z_i) draws the z_i
from the prior given the top half, relaxed at the paper's lambda = 2/3 (through the log-space
nodes), compiled with ``jax.jit``. The test metric is L_100^SP of the *discrete* graph
(``discrete_log_likelihood``).
"""


import numpy as np

from examples import data, numpyro_training, training


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=10000, batch_size=64, lr=3e-4)
    parser.add_argument("--dataset", default="digits", choices=["digits", "fashion-mnist"])
    parser.add_argument("--data-dir", default=None, help="a directory of MNIST-format IDX files instead")
    parser.add_argument("--binarize", default="dynamic", choices=["dynamic", "threshold"])
    parser.add_argument("--latent-units", type=training.positive_int, default=240)
    parser.add_argument("--conditioning", default="linear", choices=["linear", "nonlinear"])
    parser.add_argument("--temperature", type=training.positive_float, default=2 / 3, help="lambda of every node (the paper's posterior one)")
    parser.add_argument("--particles", type=training.positive_int, default=1, help="m of the training objective L_m^SP")
    parser.add_argument("--eval-samples", type=training.positive_int, default=100, help="m of the test metric L_m^SP")
    parser.add_argument("--eval-every", type=training.positive_int, default=1000)
    return training.parse(parser, argv, numpyro_training.read_checkpoint)


# Parsed first: --device must reach JAX before it initializes a backend.
if __name__ == "__main__":
    _ARGS = parse_args(None)
    numpyro_training.use_platform(_ARGS.device)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer import SVI  # noqa: E402

from examples.dvae_numpyro import network  # noqa: E402  (the discrete VAE's networks)
from numpyro_concrete import BinConcrete, ImportanceWeightedELBO, discrete, discrete_log_likelihood, log_space_config  # noqa: E402


class HalfPredictor:
    def __init__(self, units, nonlinear, temperature, base_rate):
        self.units, self.nonlinear, self.temperature = units, nonlinear, temperature
        self.base_logit = jax.scipy.special.logit(jnp.clip(base_rate, 1e-3, 1 - 1e-3))

    def output(self, z2):
        return network("output", 2 * z2 - 1, self.base_logit.shape[-1], self.nonlinear, self.base_logit)

    def model(self, top, bottom):
        with numpyro.plate("data", top.shape[0]):
            z1 = numpyro.sample("z1", BinConcrete(self.temperature, logits=network("first", top, self.units, self.nonlinear)).to_event(1))
            logits = network("second", 2 * z1 - 1, self.units, self.nonlinear)
            z2 = numpyro.sample("z2", BinConcrete(self.temperature, logits=logits).to_event(1))
            numpyro.sample("bottom", dist.Bernoulli(logits=self.output(z2)).to_event(1), obs=bottom)

    def guide(self, top, bottom):
        """No guide: the latent nodes are drawn from the model given the top half."""

    def completions(self, params, top, bottom, key):
        """Rows of images: the data, and completions of its bottom half by the discrete graph."""
        rows = [jnp.concatenate([top, bottom], -1)]
        for sample_key in jax.random.split(key, 3):
            model = handlers.seed(handlers.substitute(discrete(self.model), params), sample_key)
            z2 = handlers.trace(model).get_trace(top, bottom)["z2"]["value"]
            rows.append(jnp.concatenate([top, jax.nn.sigmoid(handlers.substitute(self.output, params)(z2))], -1))
        return rows


def evaluator(predictor, num_particles):
    def bound(params, top, bottom, key):
        return discrete_log_likelihood(predictor.model, predictor.guide, top, bottom, num_particles=num_particles,
                                       plate="data", params=params, rng_key=key)

    return jax.jit(bound)


def evaluate(bound, params, top, bottom, batch_size, key):
    return np.concatenate([
        np.asarray(bound(params, top[s : s + batch_size], bottom[s : s + batch_size], jax.random.fold_in(key, s)))
        for s in range(0, len(top), batch_size)
    ])


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
    try:
        dataset = data.load(args.dataset, args.data_dir)
    except data.DataNotFound as error:
        training.fail(str(error))
    half = dataset.dim // 2  # the rows of the top half, then those of the bottom half

    train = jnp.asarray(dataset.train)
    predictor = HalfPredictor(args.latent_units, args.conditioning == "nonlinear", args.temperature, train[:, half:].mean(0))
    model = handlers.reparam(predictor.model, config=log_space_config)
    svi = SVI(model, predictor.guide, numpyro.optim.Adam(args.lr), ImportanceWeightedELBO(num_particles=args.particles, plate="data"))
    init_key, binarize_key, eval_key = jax.random.split(jax.random.PRNGKey(args.seed), 3)

    @jax.jit
    def train_step(state, x, step):
        if args.binarize == "dynamic":
            x = jax.random.bernoulli(jax.random.fold_in(binarize_key, step), x).astype(x.dtype)
        else:
            x = (x > 0.5).astype(x.dtype)
        return svi.update(state, x[:, :half], x[:, half:])

    state = svi.init(init_key, train[: args.batch_size, :half], train[: args.batch_size, half:])
    valid = jnp.asarray(data.fixed_binarization(dataset.valid[:1000], args.binarize))
    quick_bound = evaluator(predictor, 10)

    def validation(params):
        return -evaluate(quick_bound, params, valid[:, :half], valid[:, half:], 1000, eval_key).mean()

    state, history = numpyro_training.fit(svi, train_step, state, (train,), args, evaluate=validation)

    params = svi.get_params(state)
    test = jnp.asarray(data.fixed_binarization(dataset.test, args.binarize))
    bound = evaluator(predictor, args.eval_samples)
    test_nll = -float(evaluate(bound, params, test[:, :half], test[:, half:], max(1, 50000 // args.eval_samples), eval_key).mean())
    metrics = dict(
        example="structured", backend="numpyro", dataset=dataset.name, units=args.latent_units, conditioning=args.conditioning,
        temperature=args.temperature, particles=args.particles, steps=history.step, lr=args.lr, batch_size=args.batch_size,
        seed=args.seed, eval_samples=args.eval_samples, test_nll=test_nll, final_train_loss=float(np.mean(history.losses[-100:])),
        train_seconds=history.seconds, seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="-L_m^SP per image (nats)")
    rows = [np.asarray(r) for r in predictor.completions(params, test[:10, :half], test[:10, half:], eval_key)]
    training.save_image_grid(args.out, "completions.png", rows, dataset.image_shape, ["test data", "completions", "", ""])
    print(f"test -L_{args.eval_samples}^SP of the discrete graph: {test_nll:.2f} nats  "
          f"[{dataset.name}, m={args.particles}, {history.step} steps, {1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    main()
