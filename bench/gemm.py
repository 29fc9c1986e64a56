"""Why the torch floor of ``bench.svi`` is about twice the JAX floor: the dense layers' products.

The discrete VAE's step is dominated by its matrix products: batch 64 through the encoder
(784 -> 784 -> 784 -> 200) and the decoder (200 -> 200 -> 200 -> 784), each layer's product
forward and two backward (the gradients of its input and of its weight; none for the data's). This
times one float32 product ``a @ b`` of each of those shapes in torch's default path
(``torch.matmul``: MKL's SGEMM in the CPU wheel), in torch's oneDNN path (``torch.utils.mkldnn``
Linear on oneDNN tensors: no autograd, so not usable for training as is), and compiled by XLA
(``jax.jit``), and sums them over one step. The three results are checked to agree before timing.

Repetitions are interleaved; the table gives the median microseconds per product and the ratio
over XLA's in the same repetition (median over repetitions).

Run: ``python -m bench.gemm`` (``--quick`` for a few short repetitions).
"""

import argparse
import collections
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bench import harness

with warnings.catch_warnings():  # its classes use torch.jit.script_method, deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch.utils.mkldnn

BATCH = 64
LAYERS = [(784, 784), (784, 784), (784, 200), (200, 200), (200, 200), (200, 784)]  # (inputs, outputs)
CONTESTANTS = ("torch default (MKL)", "torch oneDNN", "jax (XLA)")


def products():
    """(a shape, b shape) -> how many times one SVI step computes a @ b of those shapes."""
    count = collections.Counter()
    for i, (inputs, outputs) in enumerate(LAYERS):
        count[(BATCH, inputs), (inputs, outputs)] += 1  # forward: x @ w
        if i != 0:
            count[(BATCH, outputs), (outputs, inputs)] += 1  # gradient of the input: g @ w.T
        count[(inputs, BATCH), (BATCH, outputs)] += 1  # gradient of the weight: x.T @ g
    return count


def contestants(a_shape, b_shape, seed=0):
    """name -> (a function computing a @ b once, blocking until it is there; its result as NumPy)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = (rng.standard_normal(b_shape) / np.sqrt(b_shape[0])).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    linear = torch.nn.Linear(*b_shape, bias=False)  # a @ b = linear(a) with weight b.T
    with torch.no_grad():
        linear.weight.copy_(tb.T)
    onednn, onednn_a = torch.utils.mkldnn.to_mkldnn(linear), ta.to_mkldnn()
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    product = jax.jit(jnp.matmul)
    return dict(zip(CONTESTANTS, [
        (lambda: ta @ tb, lambda: (ta @ tb).numpy()),
        (lambda: onednn(onednn_a), lambda: onednn(onednn_a).to_dense().numpy()),
        (lambda: product(ja, jb).block_until_ready(), lambda: np.asarray(product(ja, jb))),
    ]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="products per contestant per repetition")
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 10 products")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.repetitions = 10, 3
    print("# bench.gemm -- float32 a @ b, the products of one SVI step of the (200H~784V) discrete VAE, batch 64")
    print(harness.machine_line())
    print(f"# median microseconds per product over {args.repetitions} interleaved repetitions of {args.calls}; "
          "ratio: median of (contestant / jax) within a repetition")
    print("| a @ b | per step | " + " | ".join(f"{name} us" for name in CONTESTANTS) + " | MKL vs jax | oneDNN vs jax |")
    print("|---|---|" + "---|" * (len(CONTESTANTS) + 2))
    results, totals = {}, collections.Counter()
    with torch.no_grad():
        for (a_shape, b_shape), count in products().items():
            runs = contestants(a_shape, b_shape)
            reference = runs["jax (XLA)"][1]()
            for name, (_, result) in runs.items():
                np.testing.assert_allclose(result(), reference, rtol=1e-3, atol=1e-3, err_msg=name)
            calls = {name: args.calls for name in runs}
            times = harness.interleaved_times({name: call for name, (call, _) in runs.items()}, args.repetitions, calls, warmup=3)
            times = {name: 1000 * np.array(t) for name, t in times.items()}  # microseconds
            medians = {name: float(np.median(t)) for name, t in times.items()}
            ratios = {name: float(np.median(t / times["jax (XLA)"])) for name, t in times.items()}
            results[a_shape, b_shape] = medians, ratios
            for name in CONTESTANTS:
                totals[name] += count * medians[name]
            print(f"| {a_shape} @ {b_shape} | {count} | " + " | ".join(f"{medians[n]:.0f}" for n in CONTESTANTS)
                  + f" | {ratios[CONTESTANTS[0]]:.2f}x | {ratios[CONTESTANTS[1]]:.2f}x |")
    print("| one step's products | | " + " | ".join(f"{totals[n]:.0f}" for n in CONTESTANTS)
          + f" | {totals[CONTESTANTS[0]] / totals[CONTESTANTS[2]]:.2f}x | {totals[CONTESTANTS[1]] / totals[CONTESTANTS[2]]:.2f}x |")
    results["step"] = dict(totals)
    return results


if __name__ == "__main__":
    main()
