"""Structured output prediction (paper section 5.3) in Pyro: predict the bottom half of a digit from
its top half through two layers of binary latent nodes, ``(392V-240H-240H-392V)`` on 28x28 images
(``(32V-240H-240H-32V)`` on the 8x8 digits).

    python -m examples.structured_pyro                            # 8x8 digits, objective L_1^SP
    python -m examples.structured_pyro --particles 5 --dataset fashion-mnist --out runs/sp

The model is p(bottom, z1, z2 | top) = p(z1 | top) p(z2 | z1) p(bottom | z2) with linear ('-')
conditioning and no guide: the objective L_m^SP = E log (1/m) sum_i p(bottom | z_i) draws the z_i
from the prior given the top half, relaxed at the paper's lambda = 2/3 (through the log-space
nodes). The test metric is L_100^SP of the *discrete* graph (``discrete_log_likelihood``).
"""

import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro import poutine

from examples import data, pyro_training, training
from examples.dvae_pyro import network  # the discrete VAE's networks
from pyro_concrete import (
    BinConcrete,
    ImportanceWeightedELBO,
    JitImportanceWeightedELBO,
    discrete,
    discrete_log_likelihood,
    log_space_config,
)


class HalfPredictor(nn.Module):
    def __init__(self, half, units, nonlinear, temperature, base_rate):
        super().__init__()
        self.temperature = temperature
        self.first = network(half, units, nonlinear)
        self.second = network(units, units, nonlinear)
        self.output = network(units, half, nonlinear)
        self.output[-1].bias.data = torch.logit(torch.as_tensor(base_rate).clamp(1e-3, 1 - 1e-3))

    def model(self, top, bottom):
        pyro.module("predictor", self)
        with pyro.plate("data", top.shape[0]):
            z1 = pyro.sample("z1", BinConcrete(self.temperature, logits=self.first(top)).to_event(1))
            z2 = pyro.sample("z2", BinConcrete(self.temperature, logits=self.second(2 * z1 - 1)).to_event(1))
            pyro.sample("bottom", dist.Bernoulli(logits=self.output(2 * z2 - 1)).to_event(1), obs=bottom)

    def guide(self, top, bottom):
        """No guide: the latent nodes are drawn from the model given the top half."""

    @torch.no_grad()
    def completions(self, top, bottom, num):
        """Rows of images: the data, and completions of its bottom half by the discrete graph."""
        rows = [torch.cat([top, bottom], -1)[:num]]
        for _ in range(3):
            trace = poutine.trace(discrete(self.model)).get_trace(top[:num], bottom[:num])
            probs = torch.sigmoid(self.output(2 * trace.nodes["z2"]["value"] - 1))
            rows.append(torch.cat([top[:num], probs], -1))
        return rows


def evaluate(predictor, top, bottom, num_particles, batch_size):
    bounds = [
        discrete_log_likelihood(predictor.model, predictor.guide, top[s : s + batch_size], bottom[s : s + batch_size],
                                num_particles=num_particles, plate="data")
        for s in range(0, len(top), batch_size)
    ]
    return torch.cat(bounds)


def main(argv=None):
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
    parser.add_argument("--no-jit", action="store_true", help="use the uncompiled objective")
    args = training.parse(parser, argv, pyro_training.read_checkpoint)
    device = pyro_training.torch_device(args.device)
    try:
        dataset = data.load(args.dataset, args.data_dir)
    except data.DataNotFound as error:
        training.fail(str(error))
    half = dataset.dim // 2  # the rows of the top half, then those of the bottom half

    pyro.clear_param_store()
    torch.manual_seed(args.seed)
    train = torch.as_tensor(dataset.train, device=device)
    predictor = HalfPredictor(half, args.latent_units, args.conditioning == "nonlinear", args.temperature, train[:, half:].mean(0)).to(device)
    model = poutine.reparam(predictor.model, config=log_space_config)
    if args.no_jit:
        objective = ImportanceWeightedELBO(args.particles, "data")
    else:
        objective = JitImportanceWeightedELBO(args.particles, "data", ignore_jit_warnings=True)
    step = pyro_training.Step(model, predictor.guide, objective, pyro_training.adam(args.lr, fused=True))

    batches = pyro_training.batches(train, args)

    def make_batch(step):
        x = train[batches(step)]
        x = torch.bernoulli(x) if args.binarize == "dynamic" else (x > 0.5).to(x)
        return x[:, :half], x[:, half:]

    valid = torch.as_tensor(data.fixed_binarization(dataset.valid[:1000], args.binarize), device=device)
    history = pyro_training.fit(
        step, predictor, make_batch, args,
        evaluate=lambda: -evaluate(predictor, valid[:, :half], valid[:, half:], 10, 1000).mean(),
    )

    test = torch.as_tensor(data.fixed_binarization(dataset.test, args.binarize), device=device)
    torch.manual_seed(args.seed)
    test_nll = -evaluate(predictor, test[:, :half], test[:, half:], args.eval_samples, max(1, 50000 // args.eval_samples)).mean().item()
    metrics = dict(
        example="structured", backend="pyro", dataset=dataset.name, units=args.latent_units, conditioning=args.conditioning,
        temperature=args.temperature, particles=args.particles, steps=history.step, lr=args.lr, batch_size=args.batch_size,
        seed=args.seed, eval_samples=args.eval_samples, test_nll=test_nll, final_train_loss=float(np.mean(history.losses[-100:])),
        train_seconds=history.seconds, seconds_per_step=history.seconds / max(history.step, 1), validation=history.evaluations,
    )
    training.write_metrics(args.out, metrics)
    training.plot_learning_curve(args.out, history.losses, history.evaluations, ylabel="-L_m^SP per image (nats)")
    rows = [r.cpu().numpy() for r in predictor.completions(test[:, :half], test[:, half:], 10)]
    training.save_image_grid(args.out, "completions.png", rows, dataset.image_shape, ["test data", "completions", "", ""])
    print(f"test -L_{args.eval_samples}^SP of the discrete graph: {test_nll:.2f} nats  "
          f"[{dataset.name}, m={args.particles}, {history.step} steps, {1000 * history.seconds / max(history.step, 1):.2f} ms/step]")
    return metrics


if __name__ == "__main__":
    main()
