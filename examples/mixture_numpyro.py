"""A Bernoulli mixture of the 8x8 digits with a relaxed assignment per image, in NumPyro: trained by
SVI with Concrete assignments, evaluated by exact enumeration, and compared with the same model
trained by exact enumeration (``TraceEnum_ELBO``, with funsor).

    python -m examples.mixture_numpyro                  # K = 10 clusters of the binarized digits
    python -m examples.mixture_numpyro --training enumerate

Model: z_n ~ Concrete(lambda_2, mixing logits), x_n ~ Bernoulli(logits = z_n @ component_logits);
at a vertex of the simplex z_n picks one component, as in the discrete mixture. Guide (relaxed
training): z_n ~ Concrete(lambda_1, encoder(x_n)). Test time, for either training: the exact
marginal log-likelihood of the test images (``marginal_log_likelihood``, enumerating z) and their
MAP clusters (``map_assignment``), scored against the true digit labels (accuracy after matching
clusters to labels, and adjusted Rand index).
"""


import numpy as np

from examples import data, numpyro_training, training


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=256, lr=0.02)
    parser.add_argument("--components", type=training.categories, default=10)
    parser.add_argument("--training", default="relaxed", choices=["relaxed", "enumerate"])
    parser.add_argument("--prior-temperature", type=training.positive_float, default=1 / 2, help="lambda_2")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=2 / 3, help="lambda_1")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between test evaluations (default: steps / 10)")
    return training.parse(parser, argv, numpyro_training.read_checkpoint)


# Parsed first: --device must reach JAX before it initializes a backend.
if __name__ == "__main__":
    _ARGS = parse_args(None)
    numpyro_training.use_platform(_ARGS.device)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO  # noqa: E402

from examples.clustering import clustering_scores  # noqa: E402
from numpyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood  # noqa: E402


class BernoulliMixture:
    def __init__(self, initial_components, temperatures):
        self.prior_temperature, self.posterior_temperature = temperatures
        # components start at (smoothed) training images: from a random start, the relaxed
        # training collapsed onto 2 of 10 components
        self.initial_logits = jax.scipy.special.logit(0.8 * initial_components + 0.1)

    def model(self, x):
        mixing_logits = numpyro.param("mixing_logits", jnp.zeros(self.initial_logits.shape[0]))
        component_logits = numpyro.param("component_logits", self.initial_logits)
        with numpyro.plate("data", x.shape[0]):
            z = numpyro.sample("z", Concrete(self.prior_temperature, logits=mixing_logits))
            numpyro.sample("x", dist.Bernoulli(logits=z @ component_logits).to_event(1), obs=x)

    def guide(self, x):
        dim, num_components = x.shape[-1], self.initial_logits.shape[0]
        w0 = numpyro.param("encoder.w0", lambda key: jax.nn.initializers.glorot_uniform()(key, (dim, dim)))
        w1 = numpyro.param("encoder.w1", lambda key: jax.nn.initializers.glorot_uniform()(key, (dim, num_components)))
        b0, b1 = numpyro.param("encoder.b0", jnp.zeros(dim)), numpyro.param("encoder.b1", jnp.zeros(num_components))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("z", Concrete(self.posterior_temperature, logits=jnp.tanh(x @ w0 + b0) @ w1 + b1))


def no_guide(x):
    """Enumeration sums z out in the model: nothing to guess."""


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
    dataset = data.load("digits")
    train = jnp.asarray(data.fixed_binarization(dataset.train, "threshold"))
    test = jnp.asarray(data.fixed_binarization(dataset.test, "threshold"))

    initial = train[training.distinct_starts(len(train), args.components, args.seed, "--components", "images")]
    mixture = BernoulliMixture(initial, (args.prior_temperature, args.posterior_temperature))
    if args.training == "relaxed":
        svi = SVI(mixture.model, mixture.guide, numpyro.optim.Adam(args.lr), Trace_ELBO())
    else:
        svi = SVI(discrete(mixture.model, mode="enumerate"), no_guide, numpyro.optim.Adam(args.lr), TraceEnum_ELBO())
    train_step = jax.jit(lambda state, x, step: svi.update(state, x))
    state = svi.init(jax.random.PRNGKey(args.seed), train[: args.batch_size])

    # jitted, as the training step: one compilation for every evaluation
    exact_log_likelihood = jax.jit(lambda params: marginal_log_likelihood(mixture.model, test, params=params))

    def test_log_likelihood(params):
        return float(exact_log_likelihood(params)) / len(test)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    state, history = numpyro_training.fit(svi, train_step, state, (train,), args, evaluate=test_log_likelihood)

    params = svi.get_params(state)
    test_ll = test_log_likelihood(params)
    clusters = np.asarray(map_assignment(mixture.model, test, params=params)["z"]).argmax(-1)
    accuracy, ari = clustering_scores(clusters, dataset.test_labels, args.components)
    metrics = dict(
        example="mixture", backend="numpyro", training=args.training, components=args.components, steps=history.step,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed, test_log_likelihood=test_ll, accuracy=accuracy, ari=ari,
        train_seconds=history.seconds, validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="loss per image / test log p(x)")
    centers = np.asarray(jax.nn.sigmoid(params["component_logits"]))
    training.save_image_grid(args.out, "components.png", [centers], dataset.image_shape, ["component means"])
    print(f"{args.training} training, {history.step} steps: test log p(x) = {test_ll:.2f} nats per image (exact), "
          f"MAP clusters: accuracy {accuracy:.3f}, ARI {ari:.3f}")
    return metrics


if __name__ == "__main__":
    main()
