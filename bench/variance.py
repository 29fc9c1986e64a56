"""The variance of each estimator's gradient along its own training run -- the standard figure of
the REBAR, RELAX and DisARM papers -- on the discrete VAE of ``examples/dvae_numpyro.py``.

Each estimator trains the binary (200H~64V) discrete VAE on the 8x8 digits (``--dataset
fashion-mnist``: 200H~784V) with its own loss; at fixed steps of its run, its gradient with respect
to the encoder's output layer (the weights and biases that make the guide's logits) is drawn
``--draws`` times on one fixed minibatch of 64 binarized images, and the table gives log10 of the
variance, averaged over those coordinates, with the step's discrete ELBO on that batch. Estimators:

- Concrete      : the relaxed ELBO (log-space nodes), the examples' default
- ST            : straight-through Gumbel-softmax (Gumbel-Rao with one sample)
- Gumbel-Rao    : straight-through Rao-Blackwellized over 10 conditional samples
- REINFORCE     : the score function with a learned baseline (``ScoreFunctionELBO``)
- VIMCO m=5     : the score function at m = 5, leave-one-out baselines
- REBAR, RELAX  : control variates from the relaxation, tuned on the variance
- DisARM        : antithetic, no relaxation

Concrete, ST and Gumbel-Rao estimate other gradients than that of the discrete graph's ELBO (biased);
``bias`` is the norm of the difference of an estimator's mean from the mean of DisARM's gradient
(unbiased) at the same parameters over five times as many draws, relative to the latter's norm, and
``noise`` the value Monte Carlo error alone gives it (the root of the expected squared difference
for an unbiased estimator): a bias well above its noise is a bias. NumPyro (the faster one here; the
estimators are the same in both packages).

Run: ``python -m bench.variance`` (``--quick``: a short run; ``--out DIR`` writes variance.png).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from bench.harness import machine_line
from examples import data
from examples import dvae_numpyro as example
from numpyro_concrete import DisARM, GumbelRao

ESTIMATORS = ["concrete", "st", "gumbel-rao", "reinforce", "vimco", "rebar", "relax", "disarm"]
LABELS = {"concrete": "Concrete", "st": "ST", "gumbel-rao": "Gumbel-Rao", "reinforce": "REINFORCE", "vimco": "VIMCO m=5",
          "rebar": "REBAR", "relax": "RELAX", "disarm": "DisARM"}


def _svi(vae, estimator, lr):
    optim = numpyro.optim.Adam(lr)
    if estimator == "st":
        loss = GumbelRao(plate="data", num_samples=1)
        return numpyro.infer.SVI(vae.model, vae.guide, optim, loss)
    if estimator == "vimco":
        return example.make_svi(vae, optim, "reinforce", 5)
    return example.make_svi(vae, optim, estimator, 1)


def _output_layer(params):
    """The encoder's output layer: the names of its weights and biases."""
    last = max(int(name.split(".w")[1]) for name in params if name.startswith("encoder0.w"))
    return [f"encoder0.w{last}", f"encoder0.b{last}"]


def run(estimator, dataset, checkpoints, draws, seed=0, lr=1e-3):
    """{step: (draws x coordinates gradient array, DisARM's mean gradient, discrete ELBO per image on
    the batch)} along the estimator's run."""
    layers = [example.NodeLayer(200, 2)]
    train = jnp.asarray(dataset.train)
    vae = example.DiscreteVAE(layers, True, example.PAPER_TEMPERATURES[2], train.mean(0), estimator == "reinforce")
    svi = _svi(vae, estimator, lr)
    key = jax.random.PRNGKey(seed)
    init_key, binarize_key, draw_key = jax.random.split(key, 3)
    batch = jnp.asarray(data.fixed_binarization(dataset.train[:64], "threshold"))
    state = svi.init(init_key, train[:64])
    step_fn = example.make_train_step(svi, "dynamic", binarize_key)
    names = _output_layer(svi.get_params(state))
    bound = example.evaluator(vae, 1)

    reference = DisARM(plate="data")

    def draw(loss, model, guide):
        @jax.jit
        def gradients(params, keys):
            def one(key):
                grads = jax.grad(lambda p: loss.loss(key, p, model, guide, batch))(params)
                return jnp.concatenate([grads[name].reshape(-1) for name in names])

            return jax.vmap(one)(keys)

        return gradients

    gradients, unbiased = draw(svi.loss, svi.model, svi.guide), draw(reference, vae.model, vae.guide)

    out, step = {}, 0
    for checkpoint in checkpoints:
        while step < checkpoint:
            x = train[data.batch_indices(len(train), 64, seed, step)]
            state, _ = step_fn(state, x, step)
            step += 1
        params = svi.get_params(state)
        keys = jax.random.split(jax.random.fold_in(draw_key, step), 6 * draws)
        g = np.asarray(gradients(params, keys[:draws]), dtype=np.float64)
        reference = np.asarray(unbiased(params, keys[draws:]), dtype=np.float64)
        elbo = float(np.asarray(bound(params, batch, jax.random.fold_in(draw_key, 2**31 + step))).mean())
        out[checkpoint] = (g, reference, elbo)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits", choices=["digits", "fashion-mnist"])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--draws", type=int, default=200, help="gradient draws per estimator and step")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--quick", action="store_true", help="100 steps, 10 draws")
    parser.add_argument("--out", default=None, help="a directory for variance.png")
    args = parser.parse_args(argv)
    steps, draws = (100, 10) if args.quick else (args.steps, args.draws)
    checkpoints = sorted({0, steps // 20, steps // 4, steps // 2, steps})
    dataset = data.load(args.dataset)
    estimators = args.estimators.split(",")
    results = {name: run(name, dataset, checkpoints, draws) for name in estimators}

    print(machine_line())
    print(f"# bench.variance: binary (200H~{dataset.dim}V) discrete VAE on {dataset.name}, each estimator's own run, "
          f"{draws} gradient draws per step on one fixed batch of 64; log10 mean variance of the encoder output layer's "
          f"gradient (bias: |mean - DisARM's mean| / |DisARM's mean|, noise: that ratio's Monte Carlo level); ELBO: the "
          f"discrete graph's, nats per image")
    header = " | ".join(f"step {c}" for c in checkpoints)
    print(f"\n| estimator | {header} |")
    print("|---|" + "---|" * len(checkpoints))
    table = {}
    for name in estimators:
        cells = []
        for checkpoint in checkpoints:
            g, reference, elbo = results[name][checkpoint]
            variance = float(np.log10(g.var(0, ddof=1).mean()))
            scale = np.linalg.norm(reference.mean(0))
            bias = float(np.linalg.norm(g.mean(0) - reference.mean(0)) / scale)
            # what Monte Carlo error alone gives that ratio: sqrt(E |difference|^2) for an unbiased estimator
            noise = float(np.sqrt(g.var(0, ddof=1).sum() / len(g) + reference.var(0, ddof=1).sum() / len(reference)) / scale)
            table[(name, checkpoint)] = (variance, bias, noise, elbo)
            cells.append(f"{variance:.2f} (bias {bias:.2f} / noise {noise:.2f}; ELBO {elbo:.1f})")
        print(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    if args.out:
        _plot(args.out, estimators, checkpoints, table)
    return table


def _plot(out, estimators, checkpoints, table):
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in estimators:
        ax.plot(checkpoints, [table[(name, c)][0] for c in checkpoints], marker="o", label=LABELS[name],
                linestyle="--" if name in ("concrete", "st", "gumbel-rao") else "-")
    ax.set_xlabel("training step (each estimator's own run)")
    ax.set_ylabel("log10 variance of the encoder output layer's gradient")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("gradient variance along training (dashed: biased estimators)")
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    fig.savefig(os.path.join(out, "variance.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
