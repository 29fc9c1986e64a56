"""Numerical stability of relaxed distributions on their own samples.

For every distribution, temperature T in {0.01 ... 1000}, K in {2, 10, ..., 100000} (categories, or
K independent binary variables) and dtype, draw samples with the grid's logits (half of them spread
over [-50, 50]), rebuild the float64 reference sample from the very same noise, and count

* non-finite : log_prob(own sample) is NaN or +-inf
* wrong      : finite but off the float64 reference density at the same noise by more than
               0.01 nats + 1e-4 relative (the library's own acceptance bound)
* rejected   : validation (torch/Pyro: its default; NumPyro, TFP: validate_args=True) refuses the
               distribution's own sample (an error, or a log_prob made -inf by its mask)
* bad grad   : d/dlogits of sum(log_prob(rsample())) has a non-finite entry

The first two are percentages of samples, the last two of grid cells. Each (framework, dtype) runs
in its own process (JAX's x64 mode must be off for float32 to be float32 throughout).

Run: ``python -m bench.stability`` (``--quick`` for a smaller grid, ``--by-temperature`` for one row
per temperature).
"""

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tests import reference

TEMPERATURES = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 10.0, 100.0, 1000.0)
SIZES = (2, 10, 100, 1000, 10000, 100000)


def _logits(k, seed):
    """The test grid's logits: half spread over [-50, 50] (both extremes included), half moderate."""
    rng = np.random.default_rng(seed)
    logits = np.where(rng.random(k) < 0.5, rng.uniform(-50, 50, k), rng.normal(0, 3, k))
    logits[0], logits[-1] = 50.0, -50.0
    return logits


@dataclass
class Subject:
    label: str
    family: str  # the reference density: "Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"
    make: Callable  # (temperature, logits, validate) -> distribution
    draw: Callable  # (distribution, num_draws, seed) -> (value, float64 reference log coordinates)


# ----------------------------------------------------------------------------- torch subjects


def torch_subjects():
    import pyro.distributions as pdist
    import torch
    import torch.distributions as td

    import pyro_concrete
    from pyro_concrete import _numerics

    def draw_with(uniform):
        def draw(d, n, seed):
            torch.manual_seed(seed)
            value = d.rsample((n,))
            torch.manual_seed(seed)
            u = uniform((n,) + d.batch_shape + d.event_shape, d.logits).double().numpy()
            return value, u

        return draw

    def clamped(shape, like):  # torch.distributions' noise: rand clamped to [eps, 1 - eps]
        return td.utils.clamp_probs(torch.rand(shape, dtype=like.dtype))

    subjects = [
        ("torch RelaxedOneHotCategorical", "Concrete", td.RelaxedOneHotCategorical, clamped),
        ("torch ExpRelaxedCategorical", "ExpConcrete", td.relaxed_categorical.ExpRelaxedCategorical, clamped),
        ("pyro RelaxedOneHotCategoricalStraightThrough", "Concrete", pdist.RelaxedOneHotCategoricalStraightThrough, clamped),
        ("torch RelaxedBernoulli", "BinConcrete", td.RelaxedBernoulli, clamped),
        ("torch LogitRelaxedBernoulli", "LogitBinConcrete", td.relaxed_bernoulli.LogitRelaxedBernoulli, clamped),
    ]
    result = [
        Subject(label, family, lambda t, a, v, cls=cls: cls(torch.tensor(t, dtype=a.dtype), logits=a, validate_args=v), draw_with(noise))
        for label, family, cls, noise in subjects
    ]
    for name in ("Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"):
        cls = getattr(pyro_concrete, name)
        result.append(Subject(f"pyro_concrete.{name}", name, lambda t, a, v, cls=cls: cls(t, logits=a, validate_args=v), draw_with(_numerics.uniform)))
    return result


def measure_torch(subject, t, k, dtype, num_draws):
    import torch

    torch_dtype = getattr(torch, dtype)
    logits_np = _logits(k, seed=k)
    logits = torch.tensor(logits_np, dtype=torch_dtype)
    d = subject.make(t, logits, False)
    value, u = subject.draw(d, num_draws, 0)
    expected = reference.log_density_at_log_coordinates(
        subject.family, reference.sample_log_coordinates(subject.family, u, logits_np, t), logits_np, t
    )
    with torch.no_grad():
        actual = d.log_prob(value).double().numpy()
    try:
        on = subject.make(t, logits, True).log_prob(value)
        rejected = bool((~torch.isfinite(on) & torch.as_tensor(np.isfinite(actual))).any())
    except ValueError:
        rejected = True
    leaf = logits.clone().requires_grad_()
    g = subject.make(t, leaf, False)
    torch.manual_seed(0)
    (grad,) = torch.autograd.grad(g.log_prob(g.rsample((num_draws,))).sum(), leaf)
    return actual, expected, rejected, not bool(torch.isfinite(grad).all())


# ----------------------------------------------------------------------------- JAX subjects


def jax_subjects():
    import jax
    import jax.numpy as jnp
    import numpyro.distributions as nd

    import numpyro_concrete
    from numpyro_concrete import _numerics

    def draw_ours(d, n, seed):
        key = jax.random.PRNGKey(seed)
        value = d.sample(key, (n,))
        return value, ("uniform", np.asarray(_numerics.uniform(key, d.shape((n,)), d.logits.dtype), np.float64))

    def draw_numpyro_relaxed_bernoulli(d, n, seed):
        key = jax.random.PRNGKey(seed)
        value = d.sample(key, (n,))
        return value, ("logistic", np.asarray(jax.random.logistic(key, (n,) + d.batch_shape), np.float64))

    subjects = [
        Subject("numpyro RelaxedBernoulli", "BinConcrete",
                lambda t, a, v: nd.RelaxedBernoulliLogits(jnp.asarray(t, a.dtype), a, validate_args=v), draw_numpyro_relaxed_bernoulli),
    ]
    try:
        from tensorflow_probability.substrates import jax as tfp
        from tensorflow_probability.substrates.jax.internal import samplers

        tfd = tfp.distributions

        def draw_tfp(d, n, seed):
            key = jax.random.PRNGKey(seed)
            value = d.sample(n, seed=key)
            shape = (n,) + tuple(d.batch_shape) + tuple(d.event_shape)
            dtype = d.dtype
            u = samplers.uniform(shape=shape, minval=np.finfo(dtype).tiny, maxval=1.0, dtype=dtype, seed=key)
            return value, ("uniform", np.asarray(u, np.float64))

        for label, family, cls in (
            ("TFP RelaxedOneHotCategorical", "Concrete", tfd.RelaxedOneHotCategorical),
            ("TFP ExpRelaxedOneHotCategorical", "ExpConcrete", tfd.ExpRelaxedOneHotCategorical),
            ("TFP RelaxedBernoulli", "BinConcrete", tfd.RelaxedBernoulli),
        ):
            subjects.append(Subject(label, family, lambda t, a, v, cls=cls: cls(jnp.asarray(t, a.dtype), logits=a, validate_args=v), draw_tfp))
    except ImportError:
        pass
    for name in ("Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"):
        cls = getattr(numpyro_concrete, name)
        subjects.append(Subject(f"numpyro_concrete.{name}", name, lambda t, a, v, cls=cls: cls(t, logits=a, validate_args=v), draw_ours))
    return subjects


def measure_jax(subject, t, k, dtype, num_draws):
    import jax
    import jax.numpy as jnp

    logits_np = _logits(k, seed=k)
    logits = jnp.asarray(logits_np, dtype)
    d = subject.make(t, logits, False)
    value, (kind, noise) = subject.draw(d, num_draws, 0)
    if kind == "uniform":
        y_ref = reference.sample_log_coordinates(subject.family, noise, logits_np, t)
    else:  # logistic noise, for the binary families
        y_ref = (logits_np + noise) / t
    expected = reference.log_density_at_log_coordinates(subject.family, y_ref, logits_np, t)

    actual = _jax_own_scores(subject, t, logits, num_draws, validate=False)
    try:
        if actual is None:  # the anchors: scored eagerly, on the value they drew
            actual = np.asarray(d.log_prob(value), np.float64)
            on = np.asarray(subject.make(t, logits, True).log_prob(value), np.float64)
        else:
            on = _jax_own_scores(subject, t, logits, num_draws, validate=True)
        rejected = bool((~np.isfinite(on) & np.isfinite(actual)).any())
    except Exception:
        rejected = True

    def total(a):
        q = subject.make(t, a, False)
        key = jax.random.PRNGKey(0)
        sample = q.sample(key, (num_draws,)) if subject.label.startswith(("numpyro", "numpyro_concrete")) else q.sample(num_draws, seed=key)
        return q.log_prob(sample).sum()

    grad = jax.jit(jax.grad(total))(logits)  # compiled once, as in SVI (op-by-op dispatch is slow)
    return actual, expected, rejected, not bool(jnp.isfinite(grad).all())


def _jax_own_scores(subject, t, logits, num_draws, validate):
    """Ours: the sample drawn (with the same key) and scored inside one jitted function, as
    NumPyro runs it (an eager array carries no coordinates: see numpyro_concrete._carry)."""
    import jax

    if not subject.label.startswith("numpyro_concrete"):
        return None
    key = jax.random.PRNGKey(0)

    @jax.jit
    def own(a):
        q = subject.make(t, a, validate)
        return q.log_prob(q.sample(key, (num_draws,)))

    return np.asarray(own(logits), np.float64)


# ----------------------------------------------------------------------------- driver


def worker(framework, dtype, temperatures, sizes, set_x64=True):
    """One row of counts per (subject, temperature): in a subprocess of its own, or, with
    ``set_x64=False``, in this process as it is (the quick mode)."""
    if framework == "jax":
        import jax

        if set_x64:
            jax.config.update("jax_enable_x64", dtype == "float64")
        subjects, measure = jax_subjects(), measure_jax
    else:
        subjects, measure = torch_subjects(), measure_torch
    rows = []
    for subject in subjects:
        for t in temperatures:
            counts = dict(label=subject.label, dtype=dtype, t=t, nonfinite=0, wrong=0, total=0, rejected=0, bad_grad=0, cells=0)
            for k in sizes:
                actual, expected, rejected, bad_grad = measure(subject, t, k, dtype, max(16, 4096 // k))
                finite = np.isfinite(actual)
                counts["nonfinite"] += int((~finite).sum())
                counts["wrong"] += int((finite & (np.abs(actual - expected) > 0.01 + 1e-4 * np.abs(expected))).sum())
                counts["total"] += actual.size
                counts["rejected"] += int(rejected)
                counts["bad_grad"] += int(bad_grad)
                counts["cells"] += 1
            rows.append(counts)
    return rows


def run(temperatures, sizes, by_temperature, quick=False):
    from bench.harness import machine_line

    print(machine_line())
    print("# % of own samples whose log_prob is non-finite / wrong (> 0.01 nats + 1e-4 rel. off the float64")
    print("# reference at the same noise); % of grid cells where validation rejects the own sample, or where")
    print(f"# the gradient w.r.t. logits has a non-finite entry. Grid: T in {temperatures}, K in {sizes}")
    rows = []
    for framework in ("torch", "jax"):
        if quick:  # float32 only, in this process
            rows += worker(framework, "float32", temperatures, sizes, set_x64=False)
            continue
        for dtype in ("float32", "float64"):
            cmd = [sys.executable, "-m", "bench.stability", "--worker", framework, dtype,
                   "--temperatures", ",".join(map(str, temperatures)), "--sizes", ",".join(map(str, sizes))]
            env = dict(os.environ, JAX_ENABLE_X64="1" if dtype == "float64" else "0")
            output = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            rows += [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    header = f"| {'distribution':46} | {'dtype':7} |" + (f" {'T':>5} |" if by_temperature else "")
    header += " non-finite | wrong | rejected | bad grad |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    groups = {}
    for row in rows:
        key = (row["label"], row["dtype"]) + ((row["t"],) if by_temperature else ())
        group = groups.setdefault(key, dict(nonfinite=0, wrong=0, total=0, rejected=0, bad_grad=0, cells=0))
        for field in group:
            group[field] += row[field]
    for key, g in groups.items():
        line = f"| {key[0]:46} | {key[1]:7} |" + (f" {key[2]:>5} |" if by_temperature else "")
        line += (f" {100 * g['nonfinite'] / g['total']:9.1f}% | {100 * g['wrong'] / g['total']:4.1f}% |"
                 f" {100 * g['rejected'] / g['cells']:7.0f}% | {100 * g['bad_grad'] / g['cells']:7.0f}% |")
        print(line)
    return groups


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T = 0.01, K = 10, float32, in this process (a smoke run)")
    parser.add_argument("--by-temperature", action="store_true", help="one row per temperature")
    parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--temperatures", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
        sizes = tuple(int(k) for k in args.sizes.split(","))
        for row in worker(*args.worker, temperatures, sizes):
            print(json.dumps(row), flush=True)
        return None
    temperatures, sizes = ((0.01,), (10,)) if args.quick else (TEMPERATURES, SIZES)
    return run(temperatures, sizes, args.by_temperature, quick=args.quick)


if __name__ == "__main__":
    main()
