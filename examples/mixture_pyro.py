"""A Bernoulli mixture of the 8x8 digits with a relaxed assignment per image, in Pyro: trained by SVI
with Concrete assignments, evaluated by exact enumeration, and compared with the same model trained
by exact enumeration (``TraceEnum_ELBO``).

    python -m examples.mixture_pyro                     # K = 10 clusters of the binarized digits
    python -m examples.mixture_pyro --training enumerate

Model: z_n ~ Concrete(lambda_2, mixing logits), x_n ~ Bernoulli(logits = z_n @ component_logits);
at a vertex of the simplex z_n picks one component, as in the discrete mixture. Guide (relaxed
training): z_n ~ Concrete(lambda_1, encoder(x_n)). Test time, for either training: the exact
marginal log-likelihood of the test images (``marginal_log_likelihood``, enumerating z) and their
MAP clusters (``map_assignment``), scored against the true digit labels (accuracy after matching
clusters to labels, and adjusted Rand index).
"""

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.infer import Trace_ELBO, TraceEnum_ELBO

from examples import data, pyro_training, training
from examples.clustering import clustering_scores
from pyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood


class BernoulliMixture(nn.Module):
    def __init__(self, initial_components, temperatures):
        super().__init__()
        num_components, dim = initial_components.shape
        self.prior_temperature, self.posterior_temperature = temperatures
        self.mixing_logits = nn.Parameter(torch.zeros(num_components))
        # components start at (smoothed) training images: from a random start, the relaxed
        # training collapsed onto 2 of 10 components
        self.component_logits = nn.Parameter(torch.logit(0.8 * initial_components + 0.1))
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, num_components))

    def model(self, x):
        pyro.module("mixture", self)
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", Concrete(self.prior_temperature, logits=self.mixing_logits))
            pyro.sample("x", dist.Bernoulli(logits=z @ self.component_logits).to_event(1), obs=x)

    def guide(self, x):
        pyro.module("mixture", self)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", Concrete(self.posterior_temperature, logits=self.encoder(x)))


def no_guide(x):
    """Enumeration sums z out in the model: nothing to guess."""


def main(argv=None):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=256, lr=0.02)
    parser.add_argument("--components", type=training.categories, default=10)
    parser.add_argument("--training", default="relaxed", choices=["relaxed", "enumerate"])
    parser.add_argument("--prior-temperature", type=training.positive_float, default=1 / 2, help="lambda_2")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=2 / 3, help="lambda_1")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between test evaluations (default: steps / 10)")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    device = pyro_training.torch_device(args.device)
    dataset = data.load("digits")
    train = torch.as_tensor(data.fixed_binarization(dataset.train, "threshold"), device=device)
    test = torch.as_tensor(data.fixed_binarization(dataset.test, "threshold"), device=device)

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    initial = train[torch.as_tensor(training.distinct_starts(len(train), args.components, args.seed, "--components", "images"))]
    mixture = BernoulliMixture(initial, (args.prior_temperature, args.posterior_temperature)).to(device)
    adam = pyro_training.adam(args.lr, fused=True)
    if args.training == "relaxed":
        step = pyro_training.Step(mixture.model, mixture.guide, Trace_ELBO(), adam)
    else:
        step = pyro_training.Step(discrete(mixture.model, mode="enumerate"), no_guide, TraceEnum_ELBO(max_plate_nesting=1), adam)

    batches = pyro_training.batches(train, args)

    def make_batch(step):
        return (train[batches(step)],)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    history = pyro_training.fit(
        step, mixture, make_batch, args,
        evaluate=lambda: marginal_log_likelihood(mixture.model, test).item() / len(test),
    )

    with torch.no_grad():
        test_ll = marginal_log_likelihood(mixture.model, test).item() / len(test)
        clusters = map_assignment(mixture.model, test)["z"].argmax(-1).cpu().numpy()
    accuracy, ari = clustering_scores(clusters, dataset.test_labels, args.components)
    metrics = dict(
        example="mixture", backend="pyro", training=args.training, components=args.components, steps=history.step,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed, test_log_likelihood=test_ll, accuracy=accuracy, ari=ari,
        train_seconds=history.seconds, validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="loss per image / test log p(x)")
    centers = torch.sigmoid(mixture.component_logits).detach().cpu().numpy()
    training.save_image_grid(args.out, "components.png", [centers], dataset.image_shape, ["component means"])
    print(f"{args.training} training, {history.step} steps: test log p(x) = {test_ll:.2f} nats per image (exact), "
          f"MAP clusters: accuracy {accuracy:.3f}, ARI {ari:.3f}")
    return metrics


if __name__ == "__main__":
    main()
