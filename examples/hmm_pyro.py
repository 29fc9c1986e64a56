"""A sequential model with discrete states: a hidden Markov model of the 8x8 digits read row by row
(the shape of Pyro's HMM example and NumPyro's ``hmm_enum``), in Pyro: trained by SVI with Concrete
states, evaluated exactly on its discrete graph (the forward algorithm and the Viterbi path, through
``pyro.markov``), and compared with the same model trained by exact enumeration (``TraceEnum_ELBO``).

    python -m examples.hmm_pyro                       # K = 8 hidden states
    python -m examples.hmm_pyro --training enumerate

Model, per image, rows t = 0..7 (each 8 binary pixels), in a ``pyro.markov`` loop:
    z_0 ~ Concrete(lambda_2, init logits), z_t ~ Concrete(lambda_2, logits = z_{t-1} @ transition logits),
    row_t ~ Bernoulli(logits = z_t @ emission logits);
at the vertices of the simplex the z_t pick one state each: the discrete HMM. Guide (relaxed
training), structured like the chain: z_t ~ Concrete(lambda_1, encoder(image)_t + z_{t-1} @ G).
Test time, for either training: the exact log-likelihood of the test images (``marginal_log_likelihood``:
the states summed out, which ``markov`` makes the forward algorithm) and their Viterbi paths
(``map_assignment``), scored by how many pixels the Viterbi states' emission probabilities
reconstruct (the pixel is 1 where the state's probability exceeds 1/2).
"""

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.infer import Trace_ELBO, TraceEnum_ELBO

from examples import data, pyro_training, training
from pyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood


class RowHMM(nn.Module):
    def __init__(self, initial_emissions, num_rows, temperatures):
        super().__init__()
        num_states, width = initial_emissions.shape
        self.num_rows = num_rows
        self.prior_temperature, self.posterior_temperature = temperatures
        self.init_logits = nn.Parameter(torch.zeros(num_states))
        self.transition_logits = nn.Parameter(torch.zeros(num_states, num_states))
        # emissions start at (smoothed) training rows: from a random start, states went unused
        self.emission_logits = nn.Parameter(torch.logit(0.8 * initial_emissions + 0.1))
        self.encoder = nn.Linear(num_rows * width, num_rows * num_states)
        self.guide_transition = nn.Parameter(torch.zeros(num_states, num_states))

    def model(self, rows):
        pyro.module("hmm", self)
        with pyro.plate("data", rows.shape[0]):
            z = None
            for t in pyro.markov(range(self.num_rows)):
                logits = self.init_logits if z is None else z @ self.transition_logits
                z = pyro.sample(f"z_{t}", Concrete(self.prior_temperature, logits=logits))
                pyro.sample(f"row_{t}", dist.Bernoulli(logits=z @ self.emission_logits).to_event(1), obs=rows[:, t])

    def guide(self, rows):
        pyro.module("hmm", self)
        encoded = self.encoder(rows.flatten(-2)).unflatten(-1, (self.num_rows, -1))
        with pyro.plate("data", rows.shape[0]):
            z = None
            for t in range(self.num_rows):
                logits = encoded[:, t] if z is None else encoded[:, t] + z @ self.guide_transition
                z = pyro.sample(f"z_{t}", Concrete(self.posterior_temperature, logits=logits))


def no_guide(rows):
    """Enumeration sums the states out in the model: nothing to guess."""


def main(argv=None):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=256, lr=0.02)
    parser.add_argument("--states", type=training.categories, default=8)
    parser.add_argument("--training", default="relaxed", choices=["relaxed", "enumerate"])
    parser.add_argument("--prior-temperature", type=training.positive_float, default=1 / 2, help="lambda_2")
    parser.add_argument("--posterior-temperature", type=training.positive_float, default=2 / 3, help="lambda_1")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between test evaluations (default: steps / 10)")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    device = pyro_training.torch_device(args.device)
    dataset = data.load("digits")
    height, width = dataset.image_shape
    train = torch.as_tensor(data.fixed_binarization(dataset.train, "threshold"), device=device).unflatten(-1, (height, width))
    test = torch.as_tensor(data.fixed_binarization(dataset.test, "threshold"), device=device).unflatten(-1, (height, width))

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    rows = train.flatten(0, 1)
    initial = rows[torch.as_tensor(training.distinct_starts(len(rows), args.states, args.seed, "--states", "rows"))]
    hmm = RowHMM(initial, height, (args.prior_temperature, args.posterior_temperature)).to(device)
    adam = pyro_training.adam(args.lr)
    if args.training == "relaxed":
        step = pyro_training.Step(hmm.model, hmm.guide, Trace_ELBO(), adam)
    else:
        step = pyro_training.Step(discrete(hmm.model, mode="enumerate"), no_guide, TraceEnum_ELBO(max_plate_nesting=1), adam)

    batches = pyro_training.batches(train, args)

    def make_batch(step):
        return (train[batches(step)],)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    history = pyro_training.fit(
        step, hmm, make_batch, args,
        evaluate=lambda: marginal_log_likelihood(hmm.model, test).item() / len(test),
    )

    with torch.no_grad():
        test_ll = marginal_log_likelihood(hmm.model, test).item() / len(test)
        viterbi = map_assignment(hmm.model, test)
        states = torch.stack([viterbi[f"z_{t}"].argmax(-1) for t in range(height)], -1)  # (images, rows)
        decoded = torch.sigmoid(hmm.emission_logits)[states]  # each row's Viterbi state's pixel probabilities
    reconstruction = float(((decoded > 0.5).float() == test).float().mean())
    metrics = dict(
        example="hmm", backend="pyro", training=args.training, states=args.states, steps=history.step,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed, test_log_likelihood=test_ll,
        viterbi_pixel_accuracy=reconstruction, states_used=int(states.unique().numel()),
        train_seconds=history.seconds, validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="loss per image / test log p(x)")
    shown = slice(0, 12)
    training.save_image_grid(args.out, "viterbi.png", [test[shown].flatten(-2).cpu().numpy(), decoded[shown].flatten(-2).cpu().numpy()],
                             dataset.image_shape, ["test images", "their Viterbi states' emission probabilities"])
    print(f"{args.training} training, {history.step} steps: test log p(x) = {test_ll:.2f} nats per image (exact), "
          f"Viterbi states reconstruct {reconstruction:.3f} of the pixels, {metrics['states_used']} states used")
    return metrics


if __name__ == "__main__":
    main()
