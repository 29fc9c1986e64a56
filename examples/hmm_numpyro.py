"""A sequential model with discrete states: a hidden Markov model of the 8x8 digits read row by row
(the shape of Pyro's HMM example and NumPyro's ``hmm_enum``), in NumPyro: trained by SVI with Concrete
states, evaluated exactly on its discrete graph (the forward algorithm and the Viterbi path, through
funsor's ``markov``), and compared with the same model trained by exact enumeration (``TraceEnum_ELBO``).

    python -m examples.hmm_numpyro                    # K = 8 hidden states
    python -m examples.hmm_numpyro --training enumerate

Model, per image, rows t = 0..7 (each 8 binary pixels), in a ``numpyro.contrib.funsor.markov`` loop:
    z_0 ~ Concrete(lambda_2, init logits), z_t ~ Concrete(lambda_2, logits = z_{t-1} @ transition logits),
    row_t ~ Bernoulli(logits = z_t @ emission logits);
at the vertices of the simplex the z_t pick one state each: the discrete HMM. Guide (relaxed
training), structured like the chain: z_t ~ Concrete(lambda_1, encoder(image)_t + z_{t-1} @ G).
Test time, for either training: the exact log-likelihood of the test images (``marginal_log_likelihood``:
the states summed out, which ``markov`` makes the forward algorithm) and their Viterbi paths
(``map_assignment``), scored by how many pixels the Viterbi states' emission probabilities
reconstruct (the pixel is 1 where the state's probability exceeds 1/2).
"""


import numpy as np

from examples import data, numpyro_training, training


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=256, lr=0.02)
    parser.add_argument("--states", type=training.categories, default=8)
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
from numpyro.contrib.funsor import markov  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO  # noqa: E402

from numpyro_concrete import Concrete, discrete, map_assignment, marginal_log_likelihood  # noqa: E402


class RowHMM:
    def __init__(self, initial_emissions, num_rows, temperatures):
        self.num_states, self.width = initial_emissions.shape
        self.num_rows = num_rows
        self.prior_temperature, self.posterior_temperature = temperatures
        # emissions start at (smoothed) training rows: from a random start, states went unused
        self.initial_emission_logits = jax.scipy.special.logit(0.8 * initial_emissions + 0.1)

    def model(self, rows):
        k = self.num_states
        init_logits = numpyro.param("init_logits", jnp.zeros(k))
        transition_logits = numpyro.param("transition_logits", jnp.zeros((k, k)))
        emission_logits = numpyro.param("emission_logits", self.initial_emission_logits)
        with numpyro.plate("data", rows.shape[0]):
            z = None
            for t in markov(range(self.num_rows)):
                logits = init_logits if z is None else z @ transition_logits
                z = numpyro.sample(f"z_{t}", Concrete(self.prior_temperature, logits=logits))
                numpyro.sample(f"row_{t}", dist.Bernoulli(logits=z @ emission_logits).to_event(1), obs=rows[:, t])

    def guide(self, rows):
        k, dim = self.num_states, self.num_rows * self.width
        w = numpyro.param("encoder.w", lambda key: jax.nn.initializers.lecun_uniform()(key, (dim, self.num_rows * k)))
        b = numpyro.param("encoder.b", jnp.zeros(self.num_rows * k))
        guide_transition = numpyro.param("guide_transition", jnp.zeros((k, k)))
        encoded = (rows.reshape(rows.shape[0], -1) @ w + b).reshape(rows.shape[0], self.num_rows, k)
        with numpyro.plate("data", rows.shape[0]):
            z = None
            for t in range(self.num_rows):
                logits = encoded[:, t] if z is None else encoded[:, t] + z @ guide_transition
                z = numpyro.sample(f"z_{t}", Concrete(self.posterior_temperature, logits=logits))


def no_guide(rows):
    """Enumeration sums the states out in the model: nothing to guess."""


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
    dataset = data.load("digits")
    height, width = dataset.image_shape
    train = jnp.asarray(data.fixed_binarization(dataset.train, "threshold")).reshape(-1, height, width)
    test = jnp.asarray(data.fixed_binarization(dataset.test, "threshold")).reshape(-1, height, width)

    rows = train.reshape(-1, width)
    initial = rows[training.distinct_starts(len(rows), args.states, args.seed, "--states", "rows")]
    hmm = RowHMM(initial, height, (args.prior_temperature, args.posterior_temperature))
    if args.training == "relaxed":
        svi = SVI(hmm.model, hmm.guide, numpyro.optim.Adam(args.lr), Trace_ELBO())
    else:
        svi = SVI(discrete(hmm.model, mode="enumerate"), no_guide, numpyro.optim.Adam(args.lr), TraceEnum_ELBO(max_plate_nesting=1))
    train_step = jax.jit(lambda state, x, step: svi.update(state, x))
    state = jax.jit(svi.init)(jax.random.PRNGKey(args.seed), train[: args.batch_size])  # traced once, not run op by op

    # jitted, as the training step: one compilation for every evaluation
    exact_log_likelihood = jax.jit(lambda params: marginal_log_likelihood(hmm.model, test, params=params))

    def test_log_likelihood(params):
        return float(exact_log_likelihood(params)) / len(test)

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    state, history = numpyro_training.fit(svi, train_step, state, (train,), args, evaluate=test_log_likelihood)

    params = svi.get_params(state)
    test_ll = test_log_likelihood(params)
    viterbi = map_assignment(hmm.model, test, params=params)
    states = np.stack([np.asarray(viterbi[f"z_{t}"]).argmax(-1) for t in range(height)], -1)  # (images, rows)
    decoded = np.asarray(jax.nn.sigmoid(params["emission_logits"]))[states]  # each row's Viterbi state's pixel probabilities
    reconstruction = float(((decoded > 0.5) == np.asarray(test)).mean())
    metrics = dict(
        example="hmm", backend="numpyro", training=args.training, states=args.states, steps=history.step,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed, test_log_likelihood=test_ll,
        viterbi_pixel_accuracy=reconstruction, states_used=int(len(np.unique(states))),
        train_seconds=history.seconds, validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="loss per image / test log p(x)")
    shown = slice(0, 12)
    training.save_image_grid(args.out, "viterbi.png", [np.asarray(test[shown]).reshape(12, -1), decoded[shown].reshape(12, -1)],
                             dataset.image_shape, ["test images", "their Viterbi states' emission probabilities"])
    print(f"{args.training} training, {history.step} steps: test log p(x) = {test_ll:.2f} nats per image (exact), "
          f"Viterbi states reconstruct {reconstruction:.3f} of the pixels, {metrics['states_used']} states used")
    return metrics


if __name__ == "__main__":
    main()
