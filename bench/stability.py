"""Numerical stability of relaxed distributions on their own samples.

For every distribution, temperature T in {0.01 ... 2}, K in {2, 10, 100, 1000} (categories, or K
independent binary variables) and dtype, draw samples, rebuild the float64 reference sample from the
very same uniforms, and count

* non-finite : log_prob(own sample) is NaN or +-inf
* wrong      : finite but off the float64 reference density at the same noise by more than
               0.01 nats + 1e-4 relative (the library's own acceptance bound)
* rejected   : the distribution's default validation raises on its own sample
* bad grad   : d/dlogits of sum(log_prob(rsample())) has a non-finite entry

Run: ``python -m bench.stability`` (``--quick`` for a smaller grid, ``--by-temperature`` for
one row per temperature).
"""

import argparse
import platform
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributions as td

import pyro
import pyro.distributions as pdist
import pyro_concrete
from pyro_concrete import _numerics
from tests import reference

TEMPERATURES = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0)
SIZES = (2, 10, 100, 1000)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _clamped_uniform(shape, like):
    """torch.distributions' noise: rand clamped to [eps, 1 - eps] (torch.distributions.utils.clamp_probs)."""
    return td.utils.clamp_probs(torch.rand(shape, dtype=like.dtype, device=like.device))


@dataclass
class Subject:
    label: str
    family: str  # the reference density: "Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"
    make: Callable  # (temperature tensor, logits, validate_args) -> distribution
    uniform: Callable  # (shape, like) -> the uniforms its sampler draws first


def _ours(name):
    return Subject(
        f"pyro_concrete.{name}",
        name,
        lambda t, logits, validate: getattr(pyro_concrete, name)(t, logits=logits, validate_args=validate),
        _numerics.uniform,
    )


SUBJECTS = [
    Subject("torch RelaxedOneHotCategorical", "Concrete",
            lambda t, a, v: td.RelaxedOneHotCategorical(t, logits=a, validate_args=v), _clamped_uniform),
    Subject("torch ExpRelaxedCategorical", "ExpConcrete",
            lambda t, a, v: td.relaxed_categorical.ExpRelaxedCategorical(t, logits=a, validate_args=v), _clamped_uniform),
    Subject("pyro RelaxedOneHotCategoricalStraightThrough", "Concrete",
            lambda t, a, v: pdist.RelaxedOneHotCategoricalStraightThrough(t, logits=a, validate_args=v), _clamped_uniform),
    Subject("torch RelaxedBernoulli", "BinConcrete",
            lambda t, a, v: td.RelaxedBernoulli(t, logits=a, validate_args=v), _clamped_uniform),
    Subject("torch LogitRelaxedBernoulli", "LogitBinConcrete",
            lambda t, a, v: td.relaxed_bernoulli.LogitRelaxedBernoulli(t, logits=a, validate_args=v), _clamped_uniform),
] + [_ours(name) for name in ("Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete")]


def _logits(k, seed):
    """The test grid's logits: half spread over [-50, 50] (both extremes included), half moderate."""
    rng = np.random.default_rng(seed)
    logits = np.where(rng.random(k) < 0.5, rng.uniform(-50, 50, k), rng.normal(0, 3, k))
    logits[0], logits[-1] = 50.0, -50.0
    return logits


def measure(subject, t, k, dtype, num_draws):
    """Counts (non-finite, wrong, total) of log_prob on own samples, whether validation rejected the
    sample, and whether the gradient was non-finite."""
    logits_np = _logits(k, seed=k)
    logits = torch.tensor(logits_np, dtype=dtype)
    temperature = torch.tensor(t, dtype=dtype)
    d = subject.make(temperature, logits, False)
    torch.manual_seed(0)
    value = d.rsample((num_draws,))
    torch.manual_seed(0)
    u = subject.uniform((num_draws,) + d.batch_shape + d.event_shape, logits).double().numpy()
    y_ref = reference.sample_log_coordinates(subject.family, u, logits_np, t)
    expected = reference.log_density_at_log_coordinates(subject.family, y_ref, logits_np, t)
    with torch.no_grad():
        actual = d.log_prob(value).double().numpy()
    finite = np.isfinite(actual)
    wrong = finite & (np.abs(actual - expected) > 0.01 + 1e-4 * np.abs(expected))

    try:
        subject.make(temperature, logits, True).log_prob(value)
        rejected = False
    except ValueError:
        rejected = True

    leaf = logits.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = subject.make(temperature, leaf, False)
        torch.manual_seed(0)
        (grad,) = torch.autograd.grad(g.log_prob(g.rsample((num_draws,))).sum(), leaf)
    return (~finite).sum(), wrong.sum(), actual.size, rejected, not torch.isfinite(grad).all().item()


def run(temperatures, sizes, by_temperature):
    torch.set_num_threads(1)
    print(f"# bench.stability -- torch {torch.__version__}, pyro {pyro.__version__}, "
          f"Python {platform.python_version()}, {platform.machine()}")
    print("# % of own samples whose log_prob is non-finite / wrong (> 0.01 nats + 1e-4 rel. off the float64")
    print("# reference at the same noise); % of grid cells where default validation rejects the own sample,")
    print("# or where the gradient w.r.t. logits has a non-finite entry")
    print(f"# grid: T in {temperatures}, K in {sizes}")
    header = f"| {'distribution':46} | {'dtype':7} |" + (f" {'T':>5} |" if by_temperature else "")
    header += " non-finite | wrong | rejected | bad grad |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for subject in SUBJECTS:
        for dtype_name, dtype in DTYPES.items():
            groups = [(t,) for t in temperatures] if by_temperature else [tuple(temperatures)]
            for group in groups:
                nonfinite = wrong = total = rejected = bad_grad = cells = 0
                for t in group:
                    for k in sizes:
                        n, w, size, r, g = measure(subject, t, k, dtype, max(16, 4096 // k))
                        nonfinite, wrong, total = nonfinite + n, wrong + w, total + size
                        rejected, bad_grad, cells = rejected + r, bad_grad + g, cells + 1
                row = f"| {subject.label:46} | {dtype_name:7} |" + (f" {group[0]:>5} |" if by_temperature else "")
                row += (f" {100 * nonfinite / total:9.1f}% | {100 * wrong / total:4.1f}% |"
                        f" {100 * rejected / cells:7.0f}% | {100 * bad_grad / cells:7.0f}% |")
                print(row)
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T in {0.01, 0.5}, K in {2, 100}")
    parser.add_argument("--by-temperature", action="store_true", help="one row per temperature")
    args = parser.parse_args(argv)
    temperatures, sizes = ((0.01, 0.5), (2, 100)) if args.quick else (TEMPERATURES, SIZES)
    run(temperatures, sizes, args.by_temperature)


if __name__ == "__main__":
    main()
