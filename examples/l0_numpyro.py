"""Pruning the hidden units of a small network with Hard Concrete gates (Louizos, Welling & Kingma,
"Learning Sparse Neural Networks through L0 Regularization", 2018) in NumPyro: an MLP classifier of
the 8x8 digits with one gate per hidden unit, trained by SVI with the expected-L0 objective.

    python -m examples.l0_numpyro                           # 64-100-10, lambda = 20 nats per open gate
    python -m examples.l0_numpyro --l0 60 --out runs/l0-60  # sparser; metrics.json and the plots in runs/l0-60
    python -m examples.l0_numpyro --gate-inputs             # also a gate on each of the 64 pixels

Model: gates_j ~ HardConcrete(2/3, logits 0) on [0, 1], one per hidden unit (a point mass at 0 prunes
the unit), y_n ~ Categorical(W2 (gates * relu(W1 x_n + b1)) + b2), the weights point estimates.
Guide: gates_j ~ HardConcrete(2/3, log alpha_j). The objective is Louizos et al.'s, not the ELBO:
-E_q log p(y | x, gates) (one gate sample per step, the minibatch scaled to the training set by the
data plate) + lambda * sum_j P_q(gate_j != 0) (``prob_nonzero``, the expected L0 norm in closed form),
compiled with ``jax.jit``. Test time: the deterministic gates min(1, max(0, sigmoid(log alpha) 1.2 - 0.1)),
the test accuracy, the number of open gates, and the accuracy when only the k largest gates are kept,
for every k (``accuracy_vs_active_gates.png``).
"""


import numpy as np

from examples import data, numpyro_training, training


def parse_args(argv):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=128, lr=1e-2)
    parser.add_argument("--hidden", type=training.positive_int, default=100, help="hidden units, one gate each")
    parser.add_argument("--l0", type=training.non_negative_float, default=20.0, help="lambda: nats of training log-likelihood per open gate")
    parser.add_argument("--temperature", type=training.positive_float, default=2 / 3, help="of the Hard Concrete gates")
    parser.add_argument("--gate-inputs", action="store_true", help="also gate the input pixels")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between validation evaluations (default: steps / 10)")
    return training.parse(parser, argv, numpyro_training.read_checkpoint)


# Parsed first: --device must reach JAX before it initializes a backend.
if __name__ == "__main__":
    _ARGS = parse_args(None)
    numpyro_training.use_platform(_ARGS.device)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI  # noqa: E402

from numpyro_concrete import HardConcrete, L0Objective  # noqa: E402


class GatedMLP:
    """inputs -> hidden (ReLU, a Hard Concrete gate on each unit) -> classes. The weights are point
    estimates (``numpyro.param``); ``log_alpha`` holds the guide's gate logits."""

    def __init__(self, num_data, inputs, hidden, classes, temperature, gate_inputs):
        self.num_data, self.temperature, self.gate_inputs = num_data, temperature, gate_inputs
        self.inputs, self.hidden, self.classes = inputs, hidden, classes

    def weights(self):
        """The network's parameters, PyTorch's nn.Linear initialization."""

        def uniform(shape, fan_in):
            bound = 1 / np.sqrt(fan_in)
            return lambda key: jax.random.uniform(key, shape, minval=-bound, maxval=bound)

        sizes = {"hidden": (self.inputs, self.hidden), "output": (self.hidden, self.classes)}
        return {
            f"{layer}.{kind}": numpyro.param(f"{layer}.{kind}", uniform((n_in, n_out) if kind == "weight" else (n_out,), n_in))
            for layer, (n_in, n_out) in sizes.items()
            for kind in ("weight", "bias")
        }

    @staticmethod
    def logits(weights, x, gates, input_gates=None):
        """Class logits with the given gates (``gates`` (..., hidden) broadcasts against the units)."""
        if input_gates is not None:
            x = x * input_gates
        h = jax.nn.relu(x @ weights["hidden.weight"] + weights["hidden.bias"]) * gates
        return h @ weights["output.weight"] + weights["output.bias"]

    def model(self, x, y):
        weights = self.weights()
        input_gates = None
        if self.gate_inputs:
            with numpyro.plate("pixels", self.inputs):
                input_gates = numpyro.sample("input_gates", HardConcrete(self.temperature, logits=jnp.zeros(self.inputs)))
        with numpyro.plate("units", self.hidden):
            gates = numpyro.sample("gates", HardConcrete(self.temperature, logits=jnp.zeros(self.hidden)))
        with numpyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            numpyro.sample("y", dist.Categorical(logits=self.logits(weights, x, gates, input_gates)), obs=y)

    def guide(self, x, y):
        for name, plate, size in self.gate_layers():
            # Louizos et al.'s initialization: log alpha ~ N(log(1 - p) - log(p), 0.01^2), dropout rate p = 1/2
            log_alpha = numpyro.param(f"{name}.log_alpha", lambda key, size=size: 0.01 * jax.random.normal(key, (size,)))
            with numpyro.plate(plate, size):
                numpyro.sample(name, HardConcrete(self.temperature, logits=log_alpha))

    def gate_layers(self):
        """(site, plate, size) of each layer of gates."""
        return [("gates", "units", self.hidden)] + ([("input_gates", "pixels", self.inputs)] if self.gate_inputs else [])

    def gate_distributions(self, params):
        """{site: the guide's HardConcrete} from the parameters."""
        return {name: HardConcrete(self.temperature, logits=params[f"{name}.log_alpha"]) for name, _, _ in self.gate_layers()}


def accuracy(mlp, params, x, y, gates, input_gates=None):
    """Accuracy for each row of ``gates`` (k, hidden), or for one gate vector."""
    logits = mlp.logits(params, x, gates[..., None, :], input_gates)
    return jnp.mean(jnp.argmax(logits, -1) == y, -1)


def accuracy_vs_active(mlp, params, x, y, gates, input_gates=None):
    """[k, accuracy] for k = 1..hidden, keeping the k largest gates at their values, zeroing the rest."""
    hidden = gates.shape[-1]
    rank = jnp.argsort(jnp.argsort(-gates))  # 0 for the largest gate
    kept = rank < jnp.arange(1, hidden + 1)[:, None]  # row k - 1: the k largest
    return [[k + 1, float(a)] for k, a in enumerate(np.asarray(accuracy(mlp, params, x, y, gates * kept, input_gates)))]


def main(argv=None):
    args = _ARGS if argv is None and __name__ == "__main__" else parse_args(argv)
    dataset = data.load("digits")
    train, train_labels = jnp.asarray(dataset.train), jnp.asarray(dataset.train_labels)
    valid, valid_labels = jnp.asarray(dataset.valid), jnp.asarray(dataset.valid_labels)
    test, test_labels = jnp.asarray(dataset.test), jnp.asarray(dataset.test_labels)

    mlp = GatedMLP(len(train), dataset.dim, args.hidden, 10, args.temperature, args.gate_inputs)
    svi = SVI(mlp.model, mlp.guide, numpyro.optim.Adam(args.lr), L0Objective(args.l0))
    train_step = jax.jit(lambda state, x, y, step: svi.update(state, x, y))
    state = svi.init(jax.random.PRNGKey(args.seed), train[: args.batch_size], train_labels[: args.batch_size])

    @jax.jit
    def validation_loss(params):
        """Cross-entropy per image of the validation set with the deterministic gates."""
        gates = {name: d.deterministic_gate for name, d in mlp.gate_distributions(params).items()}
        logits = mlp.logits(params, valid, gates["gates"], gates.get("input_gates"))
        return -jnp.mean(dist.Categorical(logits=logits).log_prob(valid_labels))

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    # the loss is scaled to the training set: per image, divide by its size
    state, history = numpyro_training.fit(svi, train_step, state, (train, train_labels), args, evaluate=validation_loss, batch_size=len(train))

    params = svi.get_params(state)
    distributions = mlp.gate_distributions(params)
    hidden_gates = distributions["gates"].deterministic_gate
    input_gates = distributions["input_gates"].deterministic_gate if args.gate_inputs else None
    test_accuracy = float(accuracy(mlp, params, test, test_labels, hidden_gates, input_gates))
    active = int(jnp.sum(hidden_gates > 0))
    expected_l0 = float(sum(jnp.sum(d.prob_nonzero) for d in distributions.values()))
    curve = accuracy_vs_active(mlp, params, test, test_labels, hidden_gates, input_gates)
    metrics = dict(
        example="l0", backend="numpyro", dataset=dataset.name, hidden=args.hidden, l0=args.l0, temperature=args.temperature,
        gate_inputs=args.gate_inputs, steps=history.step, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        test_accuracy=test_accuracy, active_gates=active, expected_l0=expected_l0, accuracy_vs_active=curve,
        final_train_loss=float(np.mean(history.losses[-100:])), train_seconds=history.seconds,
        seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    if input_gates is not None:
        metrics["active_input_gates"] = int(jnp.sum(input_gates > 0))
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="objective per image / validation cross-entropy")
    training.plot_accuracy_vs_active(args.out, curve, active, test_accuracy, args.hidden)
    inputs = f", {metrics['active_input_gates']} of {dataset.dim} pixels" if input_gates is not None else ""
    print(f"test accuracy (deterministic gates): {test_accuracy:.3f} with {active} of {args.hidden} gates active{inputs}  "
          f"[{dataset.name}, l0={args.l0:g}, expected L0 {expected_l0:.1f}, {history.step} steps, "
          f"{1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    main()
