"""SVI step time of the discrete VAE: the examples' steps against hand-written loops computing the
same relaxed ELBO.

The model is the paper's (200H~784V) binary discrete VAE of ``examples/dvae_*.py`` (two tanh
layers of the size of the layer feeding each network), on Fashion-MNIST (or the 8x8 digits with
``--dataset digits``), batch 64, m = 1, lambda_1 = 2/3, lambda_2 = 1/2, Adam, a fresh Bernoulli
binarization of the batch inside every step. Contestants:

- numpyro example : ``examples.dvae_numpyro``'s compiled step (``jax.jit`` of ``svi.update``)
- jax floor       : the same ELBO written directly in JAX (``jax.jit``, jax.example_libraries Adam)
- pyro example    : ``examples.dvae_pyro``'s step (``pyro_training.Step``: the loss writes the gradients,
                    one fused ``torch.optim.Adam`` steps them) with ``JitTrace_ELBO`` (its default), with
                    its ``--compile`` step (``pyro_training.CompiledStep``: the loss, its gradient and
                    Adam's update traced into one graph, compiled by ``torch.compile``; on a GPU in
                    ``mode="reduce-overhead"``, one CUDA graph per step), and with ``Trace_ELBO``
- pyro SVI.step   : the same model, guide and loss stepped by ``SVI.step`` with ``pyro.optim.Adam``
                    (fused), the examples' step before ``Step``
- torch floor     : the same ELBO written directly in torch (eager, torch.optim.Adam), and with
                    ``fused=True`` (one kernel per parameter update instead of six)

Repetitions are interleaved (each contestant runs a block of steps in turn), after warm-up and
compilation; the table gives the median milliseconds per step over the repetitions and, as ratios, the median over
the repetitions of each contestant's time over the floor's time in the same repetition.

Run: ``python -m bench.svi`` (``--quick`` for a few short repetitions; ``--device cuda`` for the torch
contestants on a GPU, each block of steps then ending with ``torch.cuda.synchronize()``; JAX runs on
its default backend, a GPU where jax has one).
"""

import math
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pyro
import torch
from jax.example_libraries import optimizers

from bench.harness import load_dataset, parse_steps, step_parser
from examples import data, pyro_training
from examples import dvae_numpyro as numpyro_example
from examples import dvae_pyro as pyro_example

PRIOR_T, POSTERIOR_T, UNITS, BATCH, LR = 1 / 2, 2 / 3, 200, 64, 3e-4


# ----------------------------------------------------------------------------- JAX floor


def _jax_mlp_init(key, sizes, last_bias=None):
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        key, sub = jax.random.split(key)
        bias = last_bias if (i == len(sizes) - 2 and last_bias is not None) else jnp.zeros(n_out)
        layers.append((jax.nn.initializers.glorot_uniform()(sub, (n_in, n_out)), bias))
    return layers


def _jax_mlp(layers, x):
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = jnp.tanh(x)
    return x


def _jax_logit_bin_log_prob(y, logits, t):
    s = jnp.abs(logits - t * y)
    return jnp.log(t) - s - 2 * jnp.log1p(jnp.exp(-s))


def jax_floor(dim, base_rate, seed=0):
    """A compiled step of the relaxed ELBO, written directly in JAX."""
    key = jax.random.PRNGKey(seed)
    k1, k2 = jax.random.split(key)
    params = dict(
        encoder=_jax_mlp_init(k1, [dim, dim, dim, UNITS]),
        decoder=_jax_mlp_init(k2, [UNITS, UNITS, UNITS, dim], jax.scipy.special.logit(jnp.clip(base_rate, 1e-3, 1 - 1e-3))),
        prior=jnp.zeros(UNITS),
    )

    def loss(params, x, key):
        a = _jax_mlp(params["encoder"], x)
        u = jnp.maximum(jax.random.uniform(key, a.shape), jnp.finfo(a.dtype).tiny)
        y = (a + jnp.log(u) - jnp.log1p(-u)) / POSTERIOR_T
        kl = _jax_logit_bin_log_prob(y, a, POSTERIOR_T) - _jax_logit_bin_log_prob(y, params["prior"], PRIOR_T)
        logits = _jax_mlp(params["decoder"], 2 * jax.nn.sigmoid(y) - 1)
        log_lik = x * logits - jax.nn.softplus(logits)
        return -(log_lik.sum() - kl.sum())

    init, update, get_params = optimizers.adam(LR)
    state = init(params)

    @jax.jit
    def step(state, x, i, key):
        bin_key, noise_key = jax.random.split(jax.random.fold_in(key, i))
        x = jax.random.bernoulli(bin_key, x).astype(x.dtype)
        value, grads = jax.value_and_grad(loss)(get_params(state), x, noise_key)
        return update(i, grads, state), value

    return state, step


# ----------------------------------------------------------------------------- torch floor


class _TorchFloor(torch.nn.Module):
    def __init__(self, dim, base_rate):
        super().__init__()
        self.encoder = pyro_example.network(dim, UNITS, True)
        self.decoder = pyro_example.network(UNITS, dim, True)
        self.decoder[-1].bias.data = torch.logit(torch.as_tensor(base_rate).clamp(1e-3, 1 - 1e-3))
        self.prior = torch.nn.Parameter(torch.zeros(UNITS))

    @staticmethod
    def logit_bin_log_prob(y, logits, t):
        s = (logits - t * y).abs()
        return math.log(t) - s - 2 * torch.log1p(torch.exp(-s))

    def loss(self, x):
        x = torch.bernoulli(x)
        a = self.encoder(x)
        u = torch.rand_like(a).clamp_(min=torch.finfo(a.dtype).tiny)
        y = (a + u.log() - torch.log1p(-u)) / POSTERIOR_T
        kl = self.logit_bin_log_prob(y, a, POSTERIOR_T) - self.logit_bin_log_prob(y, self.prior, PRIOR_T)
        logits = self.decoder(2 * torch.sigmoid(y) - 1)
        log_lik = x * logits - torch.nn.functional.softplus(logits)
        return -(log_lik.sum() - kl.sum())


# ----------------------------------------------------------------------------- contestants


def contestants(dataset, device="cpu", compile_mode="default"):
    """name -> a function running n steps from the current state (each keeps its own state); the
    torch contestants on ``device``; the Pyro example's ``--compile`` step in ``compile_mode``
    (``torch.compile``'s mode; None: not timed)."""
    device = torch.device(device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    train_np = dataset.train
    batches = [train_np[data.batch_indices(len(train_np), BATCH, 0, i)] for i in range(64)]
    jax_batches = [jnp.asarray(b) for b in batches]
    torch_batches = [torch.as_tensor(b, device=device) for b in batches]
    base_rate = train_np.mean(0)
    result = {}

    # NumPyro example
    layers = [numpyro_example.NodeLayer(UNITS, 2)]
    vae = numpyro_example.DiscreteVAE(layers, True, (PRIOR_T, POSTERIOR_T), jnp.asarray(base_rate), False)
    svi = numpyro_example.make_svi(vae, numpyro.optim.Adam(LR))
    numpyro_state = [svi.init(jax.random.PRNGKey(0), jax_batches[0])]
    numpyro_step = numpyro_example.make_train_step(svi, "dynamic", jax.random.PRNGKey(1))

    def run_numpyro(n, offset):
        state = numpyro_state[0]
        for i in range(n):
            state, loss = numpyro_step(state, jax_batches[(offset + i) % 64], offset + i)
        loss.block_until_ready()
        numpyro_state[0] = state

    result["numpyro example (jit)"] = run_numpyro

    # JAX floor
    floor_state, floor_step = jax_floor(dataset.dim, jnp.asarray(base_rate))
    floor = [floor_state]
    floor_key = jax.random.PRNGKey(2)

    def run_jax(n, offset):
        state = floor[0]
        for i in range(n):
            state, loss = floor_step(state, jax_batches[(offset + i) % 64], offset + i, floor_key)
        loss.block_until_ready()
        floor[0] = state

    result["jax floor (jit)"] = run_jax

    # Pyro example (its step, pyro_training.Step), both ELBOs; and SVI.step with a pyro.optim optimizer
    pyro_contestants = [("pyro example (JitTrace_ELBO)", True, True, None), ("pyro example (Trace_ELBO)", False, True, None),
                        ("pyro SVI.step (JitTrace_ELBO)", True, False, None)]
    if compile_mode is not None:
        pyro_contestants.insert(1, (f"pyro example (torch.compile{'' if compile_mode == 'default' else ', ' + compile_mode})",
                                    True, True, {"mode": compile_mode}))
    for label, jit, native, compile in pyro_contestants:
        torch.manual_seed(0)
        pvae = pyro_example.DiscreteVAE(dataset.dim, [pyro_example.NodeLayer(UNITS, 2)], True, (PRIOR_T, POSTERIOR_T),
                                        torch.as_tensor(base_rate), False).to(device)
        pvae.name = f"dvae{len(result)}"  # its own parameters in Pyro's store
        step = pyro_example.make_step(pvae, pyro_training.adam(LR, fused=True), jit=jit, compile=compile)
        if native:
            step.init(torch.bernoulli(torch_batches[0]))
        else:
            step = pyro.infer.SVI(step.model, step.guide, pyro.optim.Adam({"lr": LR, "fused": True}), step.loss).step

        def run_pyro(n, offset, step=step):
            for i in range(n):
                step(torch.bernoulli(torch_batches[(offset + i) % 64]))
            synchronize()

        result[label] = run_pyro

    # torch floors: torch.optim.Adam as most loops write it, and with fused=True (one kernel per update)
    for fused in (False, True):
        torch.manual_seed(0)
        module = _TorchFloor(dataset.dim, base_rate).to(device)
        optim = torch.optim.Adam(module.parameters(), lr=LR, fused=fused)

        def run_torch(n, offset, module=module, optim=optim):
            for i in range(n):
                optim.zero_grad()
                module.loss(torch_batches[(offset + i) % 64]).backward()
                optim.step()
            synchronize()

        result["torch floor (eager, fused Adam)" if fused else "torch floor (eager)"] = run_torch
    return result


def main(argv=None):
    parser = step_parser(__doc__, steps=100, repetitions=15, quick=(10, 3))
    parser.add_argument("--device", default="cpu", help="the torch contestants' device (cpu, cuda)")
    parser.add_argument("--compile-mode", default=None, choices=("default", "reduce-overhead", "max-autotune", "none"),
                        help="torch.compile's mode for the Pyro example's --compile step (default: reduce-overhead on "
                             "a GPU, torch.compile's default on the CPU; none: leave that contestant out)")
    args = parse_steps(parser, argv)
    dataset = load_dataset(args.dataset)
    torch.set_num_threads(torch.get_num_threads())
    print(f"# bench.svi -- discrete VAE (200H~{dataset.dim}V) binary, batch {BATCH}, m = 1; {dataset.name}")
    print(f"# torch {torch.__version__} ({torch.get_num_threads()} threads), pyro {pyro.__version__}, jax {jax.__version__} "
          f"({jax.devices()[0].platform}), numpyro {numpyro.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {__import__('os').cpu_count()} CPUs; torch on {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    print(f"# median ms per step over {args.repetitions} interleaved repetitions of {args.steps} steps, after warm-up; "
          "ratios: median over the repetitions of the time over the floor's in the same repetition")
    mode = args.compile_mode or ("reduce-overhead" if args.device.startswith("cuda") else "default")
    runners = contestants(dataset, args.device, None if mode == "none" else mode)
    for run in runners.values():  # warm-up: compilation, caches
        run(3, 0)
    times = {name: [] for name in runners}
    offset = 3
    for _ in range(args.repetitions):
        for name, run in runners.items():
            start = time.perf_counter()
            run(args.steps, offset)
            times[name].append(1000 * (time.perf_counter() - start) / args.steps)
        offset += args.steps
    medians = {name: float(np.median(t)) for name, t in times.items()}

    def ratio(name, floor):  # paired: each repetition against the floor's block next to it
        return float(np.median(np.array(times[name]) / np.array(times[floor])))

    print(f"| {'contestant':34} | ms/step | vs jax floor | vs torch floor | vs fused torch floor |")
    print(f"|{'-' * 36}|---------|--------------|----------------|----------------------|")
    for name, ms in medians.items():
        print(f"| {name:34} | {ms:7.2f} | {ratio(name, 'jax floor (jit)'):11.2f}x | {ratio(name, 'torch floor (eager)'):13.2f}x "
              f"| {ratio(name, 'torch floor (eager, fused Adam)'):19.2f}x |")
    return medians


if __name__ == "__main__":
    main()
