"""Continuous and discrete latents together: Pyro's Gaussian mixture tutorial model on the Iris
measurements (scikit-learn's copy, no download), in Pyro. The assignments are relaxed (Concrete)
during SVI, the mixture weights, locations and scales are latent with an ``AutoNormal`` guide, and
the discrete graph is evaluated exactly at test time. Compared with the same model trained the
tutorial's way: assignments enumerated (``TraceEnum_ELBO``), the same ``AutoNormal`` guide.

    python -m examples.gmm_pyro                       # K = 3 clusters of the 150 flowers
    python -m examples.gmm_pyro --training enumerate

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

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceEnum_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from pyro.nn import PyroModule, PyroParam, pyro_method

from examples import data, pyro_training, training
from examples.clustering import clustering_scores
from pyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood

class GaussianMixture(PyroModule):
    def __init__(self, initial_locs, num_points, temperatures):
        super().__init__()
        self.num_components, self.dim = initial_locs.shape
        self.prior_temperature, self.posterior_temperature = temperatures
        # component locations start at K flowers (from the prior's median, the components are alike)
        self.global_guide = AutoNormal(poutine.block(self.model, hide=["z"]), init_loc_fn=init_to_value(values={"locs": initial_locs}))
        self.assignment_logits = PyroParam(torch.zeros(num_points, self.num_components))

    def model(self, x, batch_size=None):
        zero = x.new_zeros(())  # the priors' constants on the data's device and dtype (a GPU run)
        weights = pyro.sample("weights", dist.Dirichlet(torch.full((self.num_components,), 0.5, dtype=x.dtype, device=x.device)))
        with pyro.plate("components", self.num_components):
            locs = pyro.sample("locs", dist.Normal(zero, 2.0).expand([self.dim]).to_event(1))
        scale = pyro.sample("scale", dist.LogNormal(zero, 1.0).expand([self.dim]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=batch_size) as index:
            z = pyro.sample("z", Concrete(self.prior_temperature, probs=weights))
            pyro.sample("x", dist.Normal(z @ locs, scale).to_event(1), obs=x[index])

    @pyro_method  # a PyroModule's parameters reach Pyro's param store only inside its methods marked so
    def guide(self, x, batch_size=None):
        self.global_guide(x, batch_size)
        with pyro.plate("data", len(x), subsample_size=batch_size) as index:
            pyro.sample("z", Concrete(self.posterior_temperature, logits=self.assignment_logits[index]))

    def global_values(self, x):
        """The globals at the AutoNormal median: the values the test-time helpers are given."""
        return {name: value.detach() for name, value in self.global_guide.median(x).items()}


def main(argv=None):
    parser = training.common_arguments(training.parser_for(__doc__), steps=2000, batch_size=50, lr=0.05)
    parser.add_argument("--components", type=training.categories, default=3)
    parser.add_argument("--training", default="relaxed", choices=["relaxed", "enumerate"])
    parser.add_argument("--prior-temperature", type=training.positive_float, default=1 / 2, help="lambda_2")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=2 / 3, help="lambda_1")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between evaluations (default: steps / 10)")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    device = pyro_training.torch_device(args.device)
    flowers, species = data.load_iris()
    x = torch.as_tensor(flowers, device=device)
    batch_size = min(args.batch_size, len(x))

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    initial = x[torch.as_tensor(training.distinct_starts(len(x), args.components, args.seed, "--components", "flowers"))]
    mixture = GaussianMixture(initial, len(x), (args.prior_temperature, args.posterior_temperature)).to(device)
    mixture.guide(x, batch_size)  # creates the AutoNormal's parameters, so that a checkpoint can be loaded into them
    adam = pyro_training.adam(args.lr)
    if args.training == "relaxed":
        step = pyro_training.Step(mixture.model, mixture.guide, Trace_ELBO(), adam)
    else:  # the tutorial's way: z enumerated in the model, the guide only over the globals
        step = pyro_training.Step(discrete(mixture.model, mode="enumerate"), mixture.global_guide, TraceEnum_ELBO(max_plate_nesting=1), adam)

    def log_likelihood():
        """log p(x | globals) per flower, exactly (z summed out), the globals at the guide's median."""
        with torch.no_grad():
            return marginal_log_likelihood(mixture.model, x, given=mixture.global_values(x)).item() / len(x)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    history = pyro_training.fit(step, mixture, lambda step: (x, batch_size), args, evaluate=log_likelihood, batch_size=len(x))

    log_px = log_likelihood()
    with torch.no_grad():
        clusters = map_assignment(mixture.model, x, given=mixture.global_values(x))["z"].argmax(-1).cpu().numpy()
    accuracy, ari = clustering_scores(clusters, species, args.components)
    metrics = dict(
        example="gmm", backend="pyro", training=args.training, components=args.components, steps=history.step,
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
