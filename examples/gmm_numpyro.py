"""Continuous and discrete latents together: Pyro's Gaussian mixture tutorial model on the Iris
measurements (scikit-learn's copy, no download), in NumPyro. The assignments are relaxed (Concrete)
during SVI, the mixture weights, locations and scales are latent with an ``AutoNormal`` guide, and
the discrete graph is evaluated exactly at test time. Compared with the same model trained the
tutorial's way: assignments enumerated (``TraceEnum_ELBO``, with funsor), the same ``AutoNormal`` guide.

    python -m examples.gmm_numpyro                    # K = 3 clusters of the 150 flowers
    python -m examples.gmm_numpyro --training enumerate

Model (the 4 measurements standardized, K components):
    weights ~ Dirichlet(0.5), locs_k ~ Normal(0, 2) (4-vectors), scale ~ LogNormal(0, 1) (per measurement),
    z_n ~ Concrete(lambda_2, probs=weights), x_n ~ Normal(z_n @ locs, scale);
at a vertex of the simplex z_n picks one component, as in the tutorial's discrete mixture. Guide
(relaxed training): ``AutoNormal`` over the globals (z hidden from it) and z_n ~ Concrete(lambda_1,
logits_n), free logits per flower; each step sees a random subsample of --batch-size flowers (the
plate scales the likelihood up). Test time, for either training, with the globals at the AutoNormal
median (``given=``): the exact log p(x | globals) of all flowers (``marginal_log_likelihood``, z
summed out) and their MAP clusters (``map_assignment``), scored against the species (accuracy after
matching clusters to species, adjusted Rand index). The helpers evaluate the whole data set: the
model is called without a subsample size there.
"""


import numpy as np

from examples import data, numpyro_training, training


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=2000, batch_size=50, lr=0.05)
    parser.add_argument("--components", type=training.categories, default=3)
    parser.add_argument("--training", default="relaxed", choices=["relaxed", "enumerate"])
    parser.add_argument("--prior-temperature", type=training.positive_float, default=1 / 2, help="lambda_2")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=2 / 3, help="lambda_1")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between evaluations (default: steps / 10)")
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
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoNormal  # noqa: E402
from numpyro.infer.initialization import init_to_value  # noqa: E402

from examples.clustering import clustering_scores  # noqa: E402
from numpyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood  # noqa: E402

class GaussianMixture:
    def __init__(self, initial_locs, num_points, temperatures):
        self.num_components, self.dim = initial_locs.shape
        self.num_points = num_points
        self.prior_temperature, self.posterior_temperature = temperatures
        # component locations start at K flowers (from the prior's median, the components are alike)
        self.global_guide = AutoNormal(handlers.block(self.model, hide=["z"]), init_loc_fn=init_to_value(values={"locs": initial_locs}))

    def model(self, x, batch_size=None):
        weights = numpyro.sample("weights", dist.Dirichlet(jnp.full((self.num_components,), 0.5)))
        with numpyro.plate("components", self.num_components):
            locs = numpyro.sample("locs", dist.Normal(0.0, 2.0).expand([self.dim]).to_event(1))
        scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0).expand([self.dim]).to_event(1))
        with numpyro.plate("data", len(x), subsample_size=batch_size) as index:
            z = numpyro.sample("z", Concrete(self.prior_temperature, probs=weights))
            numpyro.sample("x", dist.Normal(z @ locs, scale).to_event(1), obs=x[index])

    def guide(self, x, batch_size=None):
        self.global_guide(x, batch_size)
        logits = numpyro.param("assignment_logits", jnp.zeros((self.num_points, self.num_components)))
        with numpyro.plate("data", len(x), subsample_size=batch_size) as index:
            numpyro.sample("z", Concrete(self.posterior_temperature, logits=logits[index]))

    def global_values(self, params):
        """The globals at the AutoNormal median: the values the test-time helpers are given."""
        return self.global_guide.median(params)


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
    flowers, species = data.load_iris()
    x = jnp.asarray(flowers)
    batch_size = min(args.batch_size, len(x))

    initial = x[training.distinct_starts(len(x), args.components, args.seed, "--components", "flowers")]
    mixture = GaussianMixture(initial, len(x), (args.prior_temperature, args.posterior_temperature))
    if args.training == "relaxed":
        svi = SVI(mixture.model, mixture.guide, numpyro.optim.Adam(args.lr), Trace_ELBO())
    else:  # the tutorial's way: z enumerated in the model, the guide only over the globals
        svi = SVI(discrete(mixture.model, mode="enumerate"), mixture.global_guide, numpyro.optim.Adam(args.lr),
                  TraceEnum_ELBO(max_plate_nesting=1))
    train_step = jax.jit(lambda state, x, step: svi.update(state, x, batch_size))
    state = jax.jit(lambda key: svi.init(key, x, batch_size))(jax.random.PRNGKey(args.seed))  # traced once, not run op by op

    # jitted, as the training step: one compilation for every evaluation
    @jax.jit
    def log_likelihood(params):
        """log p(x | globals) per flower, exactly (z summed out), the globals at the guide's median."""
        return marginal_log_likelihood(mixture.model, x, given=mixture.global_values(params)) / len(x)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    state, history = numpyro_training.fit(svi, train_step, state, (x,), args, evaluate=log_likelihood, batch_size=len(x),
                                          minibatches=False)

    params = svi.get_params(state)
    log_px = float(log_likelihood(params))
    clusters = np.asarray(map_assignment(mixture.model, x, given=mixture.global_values(params))["z"]).argmax(-1)
    accuracy, ari = clustering_scores(clusters, species, args.components)
    metrics = dict(
        example="gmm", backend="numpyro", training=args.training, components=args.components, steps=history.step,
        lr=args.lr, batch_size=batch_size, seed=args.seed, log_likelihood=log_px, accuracy=accuracy, ari=ari,
        train_seconds=history.seconds, validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="loss per flower / log p(x | globals)")
    training.plot_clusters(args.out, flowers, clusters, data.IRIS_FEATURES)
    print(f"{args.training} training, {history.step} steps: log p(x | globals) = {log_px:.3f} nats per flower (exact), "
          f"MAP clusters: accuracy {accuracy:.3f}, ARI {ari:.3f}")
    return metrics


if __name__ == "__main__":
    main()
