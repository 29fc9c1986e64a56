"""A small SVI demo: a 1-D Gaussian mixture whose per-point assignments are relaxed to Concrete
latents during training and read off as discrete assignments afterwards.

    python -m examples.svi_demo [--steps 1500] [--seed 0]

Prior z_n ~ Concrete(1/2, uniform), guide z_n ~ Concrete(2/3, phi_n) (local logits; distinct
temperatures as the paper recommends), likelihood x_n ~ Normal(z_n . mu, 0.5) with learned means.
After training, each point's guide is discretized with ``.discrete()`` and its ``mode`` is the
cluster.
"""

import argparse

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam

from pyro_concrete import Concrete

PRIOR_TEMPERATURE, GUIDE_TEMPERATURE = 1 / 2, 2 / 3


def make_data(num_points, seed):
    generator = torch.Generator().manual_seed(seed)
    true_means = torch.tensor([-3.0, 0.0, 3.5])
    labels = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), num_points, replacement=True, generator=generator)
    return true_means[labels] + 0.5 * torch.randn(num_points, generator=generator), labels


def model(x):
    means = pyro.param("means", torch.tensor([-1.0, 0.0, 1.0]))
    with pyro.plate("data", len(x)):
        z = pyro.sample("z", Concrete(PRIOR_TEMPERATURE, logits=torch.zeros(3)))
        pyro.sample("x", dist.Normal((z * means).sum(-1), 0.5), obs=x)


def guide(x):
    phi = pyro.param("phi", torch.zeros(len(x), 3))
    with pyro.plate("data", len(x)):
        pyro.sample("z", Concrete(GUIDE_TEMPERATURE, logits=phi))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    x, labels = make_data(300, args.seed)
    svi = SVI(model, guide, Adam({"lr": 0.05}), Trace_ELBO(num_particles=8, vectorize_particles=True))
    for step in range(1, args.steps + 1):
        loss = svi.step(x)
        if step % 250 == 0:
            print(f"step {step:5d}  loss per point {loss / len(x):8.4f}")

    means = pyro.param("means").detach()
    guide_dist = Concrete(GUIDE_TEMPERATURE, logits=pyro.param("phi").detach())
    order = torch.argsort(means)  # clusters are identified up to a permutation
    clusters = torch.argsort(order)[guide_dist.discrete().mode.argmax(-1)]
    accuracy = (clusters == labels).float().mean().item()
    print(f"learned means {means[order].numpy().round(2)}  (true [-3.0, 0.0, 3.5])")
    print(f"cluster sizes from the discrete assignments {torch.bincount(clusters, minlength=3).tolist()}"
          f"  (true {torch.bincount(labels, minlength=3).tolist()})")
    print(f"discrete assignments (guide.discrete().mode): accuracy {accuracy:.3f}")

if __name__ == "__main__":
    main()
