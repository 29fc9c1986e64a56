"""Pruning the hidden units of a small network with Hard Concrete gates (Louizos, Welling & Kingma,
"Learning Sparse Neural Networks through L0 Regularization", 2018) in Pyro: an MLP classifier of the
8x8 digits with one gate per hidden unit, trained by SVI with the expected-L0 objective.

    python -m examples.l0_pyro                          # 64-100-10, lambda = 20 nats per open gate
    python -m examples.l0_pyro --l0 60 --out runs/l0-60 # sparser; metrics.json and the plots in runs/l0-60
    python -m examples.l0_pyro --gate-inputs            # also a gate on each of the 64 pixels

Model: gates_j ~ HardConcrete(2/3, logits 0) on [0, 1], one per hidden unit (a point mass at 0 prunes
the unit), y_n ~ Categorical(W2 (gates * relu(W1 x_n + b1)) + b2), the weights point estimates.
Guide: gates_j ~ HardConcrete(2/3, log alpha_j). The objective is Louizos et al.'s, not the ELBO:
-E_q log p(y | x, gates) (one gate sample per step, the minibatch scaled to the training set by the
data plate) + lambda * sum_j P_q(gate_j != 0) (``prob_nonzero``, the expected L0 norm in closed form).
Test time: the deterministic gates min(1, max(0, sigmoid(log alpha) 1.2 - 0.1)), the test accuracy,
the number of open gates, and the accuracy when only the k largest gates are kept, for every k
(``accuracy_vs_active_gates.png``).
"""


import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from examples import data, pyro_training, training
from pyro_concrete import HardConcrete, L0Objective


class GatedMLP(nn.Module):
    """inputs -> hidden (ReLU, a Hard Concrete gate on each unit) -> classes. The weights are point
    estimates; ``log_alpha`` holds the guide's gate logits."""

    def __init__(self, num_data, inputs, hidden, classes, temperature, gate_inputs):
        super().__init__()
        self.num_data, self.temperature, self.gate_inputs = num_data, temperature, gate_inputs
        self.hidden, self.output = nn.Linear(inputs, hidden), nn.Linear(hidden, classes)
        # Louizos et al.'s initialization: log alpha ~ N(log(1 - p) - log(p), 0.01^2), dropout rate p = 1/2
        self.log_alpha = nn.Parameter(0.01 * torch.randn(hidden))
        self.input_log_alpha = nn.Parameter(0.01 * torch.randn(inputs)) if gate_inputs else None

    def forward(self, x, gates, input_gates=None):
        """Class logits with the given gates (``gates`` (..., hidden) broadcasts against the units)."""
        if input_gates is not None:
            x = x * input_gates
        return self.output(torch.relu(self.hidden(x)) * gates)

    def model(self, x, y):
        pyro.module("mlp", self)
        input_gates = None
        if self.gate_inputs:
            with pyro.plate("pixels", x.shape[-1]):
                input_gates = pyro.sample("input_gates", HardConcrete(self.temperature, logits=x.new_zeros(x.shape[-1])))
        with pyro.plate("units", self.log_alpha.shape[0]):
            gates = pyro.sample("gates", HardConcrete(self.temperature, logits=x.new_zeros(self.log_alpha.shape[0])))
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("y", dist.Categorical(logits=self(x, gates, input_gates)), obs=y)

    def guide(self, x, y):
        pyro.module("mlp", self)
        for name, plate, log_alpha in self.gate_parameters():
            with pyro.plate(plate, log_alpha.shape[0]):
                pyro.sample(name, HardConcrete(self.temperature, logits=log_alpha))

    def gate_parameters(self):
        """(site, plate, guide logits) of each layer of gates."""
        layers = [("gates", "units", self.log_alpha)]
        return layers + ([("input_gates", "pixels", self.input_log_alpha)] if self.gate_inputs else [])

    @torch.no_grad()
    def deterministic_gates(self):
        """{site: test-time gate values}."""
        return {name: HardConcrete(self.temperature, logits=a).deterministic_gate for name, _, a in self.gate_parameters()}


@torch.no_grad()
def accuracy(mlp, x, y, gates, input_gates=None):
    """Accuracy for each row of ``gates`` (k, hidden), or for one gate vector."""
    return (mlp(x, gates[..., None, :], input_gates).argmax(-1) == y).double().mean(-1)


@torch.no_grad()
def accuracy_vs_active(mlp, x, y, gates, input_gates=None):
    """[k, accuracy] for k = 1..hidden, keeping the k largest gates at their values, zeroing the rest."""
    hidden = gates.shape[-1]
    rank = gates.argsort(descending=True).argsort()  # 0 for the largest gate
    kept = rank < torch.arange(1, hidden + 1, device=gates.device)[:, None]  # row k - 1: the k largest
    return [[k + 1, float(a)] for k, a in enumerate(accuracy(mlp, x, y, gates * kept, input_gates))]


def main(argv=None):
    parser = training.common_arguments(training.parser_for(__doc__), steps=3000, batch_size=128, lr=1e-2)
    parser.add_argument("--hidden", type=training.positive_int, default=100, help="hidden units, one gate each")
    parser.add_argument("--l0", type=training.non_negative_float, default=20.0, help="lambda: nats of training log-likelihood per open gate")
    parser.add_argument("--temperature", type=training.positive_float, default=2 / 3, help="of the Hard Concrete gates")
    parser.add_argument("--gate-inputs", action="store_true", help="also gate the input pixels")
    parser.add_argument("--eval-every", type=training.positive_int, default=None, help="steps between validation evaluations (default: steps / 10)")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    device = pyro_training.torch_device(args.device)
    dataset = data.load("digits")
    train, train_labels = (torch.as_tensor(a, device=device) for a in (dataset.train, dataset.train_labels))
    valid, valid_labels = (torch.as_tensor(a, device=device) for a in (dataset.valid, dataset.valid_labels))
    test, test_labels = (torch.as_tensor(a, device=device) for a in (dataset.test, dataset.test_labels))

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    mlp = GatedMLP(len(train), dataset.dim, args.hidden, 10, args.temperature, args.gate_inputs).to(device)
    step = pyro_training.Step(mlp.model, mlp.guide, L0Objective(args.l0), pyro_training.adam(args.lr, fused=True))

    batches = pyro_training.batches(train, args)

    def make_batch(step):
        indices = batches(step)
        return train[indices], train_labels[indices]

    def validation_loss():
        """Cross-entropy per image of the validation set with the deterministic gates."""
        gates = mlp.deterministic_gates()
        with torch.no_grad():
            logits = mlp(valid, gates["gates"], gates.get("input_gates"))
            return -dist.Categorical(logits=logits).log_prob(valid_labels).mean()

    args.eval_every = args.eval_every or max(1, args.steps // 10)
    # the loss is scaled to the training set: per image, divide by its size
    history = pyro_training.fit(step, mlp, make_batch, args, evaluate=validation_loss, batch_size=len(train))

    gates = mlp.deterministic_gates()
    hidden_gates, input_gates = gates["gates"], gates.get("input_gates")
    test_accuracy = float(accuracy(mlp, test, test_labels, hidden_gates, input_gates))
    active = int((hidden_gates > 0).sum())
    with torch.no_grad():
        expected_l0 = float(sum(HardConcrete(args.temperature, logits=a).prob_nonzero.sum() for _, _, a in mlp.gate_parameters()))
    curve = accuracy_vs_active(mlp, test, test_labels, hidden_gates, input_gates)
    metrics = dict(
        example="l0", backend="pyro", dataset=dataset.name, hidden=args.hidden, l0=args.l0, temperature=args.temperature,
        gate_inputs=args.gate_inputs, steps=history.step, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        test_accuracy=test_accuracy, active_gates=active, expected_l0=expected_l0, accuracy_vs_active=curve,
        final_train_loss=float(np.mean(history.losses[-100:])), train_seconds=history.seconds,
        seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    if input_gates is not None:
        metrics["active_input_gates"] = int((input_gates > 0).sum())
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="objective per image / validation cross-entropy")
    training.plot_accuracy_vs_active(args.out, curve, active, test_accuracy, args.hidden)
    inputs = f", {metrics['active_input_gates']} of {dataset.dim} pixels" if input_gates is not None else ""
    print(f"test accuracy (deterministic gates): {test_accuracy:.3f} with {active} of {args.hidden} gates active{inputs}  "
          f"[{dataset.name}, l0={args.l0:g}, expected L0 {expected_l0:.1f}, {history.step} steps, "
          f"{1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    # a 64-100-10 network: torch's intra-op threads only synchronize, and on a busy CPU they make each
    # step 10-100x slower (set here, not in main(), which tests call in a process they share)
    torch.set_num_threads(1)
    main()
