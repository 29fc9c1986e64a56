"""Kernel speed: one sample and its log_prob, ``d.log_prob(d.rsample()).sum()``, forward only and
forward + gradient with respect to the logits, for the four distributions, temperature 0.5, float32,
on the workloads W1 = logits (1024, 200, 2), W2 = (1024, 200, 8), W3 = (64, 10, 1000) and W4 = (8,
2, 8) (the binary distributions read the same logits as independent variables). The distribution is
built inside the timed call, as in a model whose logits come from a network. W4 is launch-bound:
its kernels take next to no time, so what is timed is the host's work per call (Python, torch's
dispatch, autograd), which is what a GPU's time per call is at sizes it finishes faster than they
are launched (issue 30: the floor took about 1 ms on every workload on an H200).

torch: ours (Pyro backend) with validation on (Pyro's default) and off; torch.distributions'
RelaxedOneHotCategorical / ExpRelaxedCategorical / RelaxedBernoulli / LogitRelaxedBernoulli, same;
a hand-written floor of the same math (the n-ary density centred, as ours computes it: the
uncentred form is wrong in float32 at high temperature and many categories); the memory-traffic
floor (noise and one softmax / sigmoid).
JAX (all under ``jax.jit``): ours (NumPyro backend) with validation on (NumPyro 0.22's default) and
off; TensorFlow Probability's JAX substrate (RelaxedOneHotCategorical, ExpRelaxedOneHotCategorical,
RelaxedBernoulli, and Logistic for the logit node; TFP validates nothing by default); a
hand-written floor; the memory-traffic floor.

``--content-check``: instead, the cost of the alternative to the sentinel rows by which ``pyro_concrete``
detects edits of a sample that bypass torch's version counter (``_carry``): comparing the whole
sample with a copy on every recall, as a paired ratio of fwd+grad times with validation on.

``--count``: instead, the kernels each torch contestant launches per call (fwd+grad, every
operation that computes: views and ``detach`` left out) and the operations that read a tensor back
to the host (``.item()``, ``bool()``, ``torch.equal``) or copy host data to the device
(``torch.tensor``), each of which waits for a GPU to finish its queue. Ours is counted as on a GPU
(``_carry.HOST_DEVICES`` empty: on the CPU it decides some checks on the host, where that reads
without waiting and saves passes over the sample). Counted on W3, whose 1000
categories take torch's ``log_softmax`` as every device but the CPU does at any size (the CPU
below 16 categories takes plain ops, see ``_numerics.log_softmax``); the counts do not depend on
the sizes otherwise.

Run: ``python -m bench.kernels`` (``--quick`` for a short smoke run; ``--device cuda`` for the torch
half on a GPU, each timed call then ending with ``torch.cuda.synchronize()``; JAX runs on its default
backend, a GPU where jax has one; ``--count``).
"""

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributions as td

import numpyro_concrete
import pyro_concrete
from pyro_concrete import _carry
from pyro_concrete._numerics import log_softmax
from bench.harness import calls_per_block, interleaved, interleaved_times, machine_line

WORKLOADS = {"W1": (1024, 200, 2), "W2": (1024, 200, 8), "W3": (64, 10, 1000), "W4": (8, 2, 8)}
NAMES = ("Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete")
T = 0.5
DEVICE = torch.device("cpu")  # the torch contestants' (--device)


# ----------------------------------------------------------------------------- torch


def _torch_floor(name):
    """The same math, written directly: sample in log space, show the sample (x = exp(y) or
    sigmoid(y), as rsample returns it), score it from the log coordinates."""
    tiny = torch.finfo(torch.float32).tiny

    def n_ary(a):
        g = torch.rand_like(a).clamp_(min=tiny).log_().neg_().log_().neg_()
        y = log_softmax((a + g) / T)  # torch.log_softmax, in plain ops below 16 categories
        # the sample itself, x = exp(y), as rsample returns it: held while it is scored, as by any
        # code that draws a sample and then scores it
        x = torch.exp(y) if name == "Concrete" else None  # noqa: F841
        k = a.shape[-1]
        b = a - T * (y - y.detach().amin(-1, keepdim=True))  # centred: exact in float32 (see _numerics)
        log_prob = math.lgamma(k) + (k - 1) * math.log(T) + log_softmax(b).sum(-1)
        return (log_prob - y.sum(-1)).sum() if name == "Concrete" else log_prob.sum()

    def binary(a):
        u = torch.rand_like(a).clamp_(min=tiny)
        y = (a + u.log() - torch.log1p(-u)) / T
        x = torch.sigmoid(y) if name == "BinConcrete" else None  # noqa: F841 -- the sample, held while scored
        s = (a - T * y).abs()
        log_prob = math.log(T) - s - 2 * torch.log1p(torch.exp(-s))
        if name == "BinConcrete":
            abs_y = y.abs()
            log_prob = log_prob + abs_y + 2 * torch.log1p(torch.exp(-abs_y))
        return log_prob.sum()

    return n_ary if name in ("Concrete", "ExpConcrete") else binary


def _torch_memory_floor(name):
    if name in ("Concrete", "ExpConcrete"):
        return lambda a: torch.softmax(a + torch.rand_like(a), -1).sum()
    return lambda a: torch.sigmoid(a + torch.rand_like(a)).sum()


TORCH_ANCHORS = {
    "Concrete": td.RelaxedOneHotCategorical,
    "ExpConcrete": td.relaxed_categorical.ExpRelaxedCategorical,
    "BinConcrete": td.RelaxedBernoulli,
    "LogitBinConcrete": td.relaxed_bernoulli.LogitRelaxedBernoulli,
}


def torch_contestants(name, shape, grad):
    logits = torch.randn(shape).to(DEVICE)
    if name in ("BinConcrete", "LogitBinConcrete"):
        logits = logits.reshape(shape[0], -1)
    temperature = torch.tensor(T, device=DEVICE)
    synchronize = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    def timed(fn):
        if grad:
            leaf = logits.clone().requires_grad_()

            def call():
                leaf.grad = None
                fn(leaf).backward()
                synchronize()
        else:
            def call():
                with torch.no_grad():
                    fn(logits)
                synchronize()

        call.score = fn  # for --count
        return call

    def score(make):
        return lambda a: (lambda d: d.log_prob(d.rsample()).sum())(make(a))

    ours, anchor = getattr(pyro_concrete, name), TORCH_ANCHORS[name]
    return {
        "ours, validation on": timed(score(lambda a: ours(T, logits=a, validate_args=True))),
        "ours, validation off": timed(score(lambda a: ours(T, logits=a, validate_args=False))),
        "torch.distributions, validation on": timed(score(lambda a: anchor(temperature, logits=a, validate_args=True))),
        "torch.distributions, validation off": timed(score(lambda a: anchor(temperature, logits=a, validate_args=False))),
        "floor (same math)": timed(_torch_floor(name)),
        "memory floor (noise + softmax)": timed(_torch_memory_floor(name)),
    }


# ----------------------------------------------------------------------------- kernel count


_NOT_KERNELS = (
    "detach", "view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "permute", "t",
    "transpose", "as_strided", "alias", "_reshape_alias", "scalar_tensor",
)
_HOST_WAITS = ("_local_scalar_dense", "equal", "is_nonzero", "item", "lift_fresh")


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """The kernels launched (operations that compute) and the host waits (see ``--count``)."""

    def __init__(self):
        super().__init__()
        self.kernels, self.waits = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]  # aten.view.dtype -> view
        if name in _HOST_WAITS:
            self.waits += 1
        elif name not in _NOT_KERNELS:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def counted(fn, logits):
    """(kernels forward, kernels forward + gradient, host waits) of one call of ``fn``, after one
    call not counted."""
    leaf = logits.clone().requires_grad_()
    fn(leaf).backward()
    forward, whole = _Recorder(), _Recorder()
    with forward:
        out = fn(leaf)
    with whole:
        out.backward()
    return forward.kernels, forward.kernels + whole.kernels, forward.waits + whole.waits


def count(names):
    """The ``--count`` table, one row per contestant and distribution, on W3 (see ``--count``)."""
    print(machine_line())
    print("# kernels launched and host waits per call of d.log_prob(d.rsample()).sum(), fwd+grad, W3 (see --count)")
    print("\n| distribution | contestant | kernels fwd | kernels fwd+grad | / floor | host waits |")
    print("|---|---|---|---|---|---|")
    results = {}
    host_devices, _carry.HOST_DEVICES = _carry.HOST_DEVICES, ()  # ours as on a GPU: no host decisions
    try:
        for name in names:
            results.update(_count(name))
    finally:
        _carry.HOST_DEVICES = host_devices
    return results


def _count(name):
    """The ``--count`` rows of one distribution."""
    contestants = torch_contestants(name, WORKLOADS["W3"], grad=True)
    logits = torch.randn(WORKLOADS["W3"])
    if name in ("BinConcrete", "LogitBinConcrete"):
        logits = logits.reshape(logits.shape[0], -1)
    rows = {label: counted(fn.score, logits) for label, fn in contestants.items()}
    floor = rows["floor (same math)"][1]
    for label, (fwd, whole, waits) in rows.items():
        print(f"| {name} | {label} | {fwd} | {whole} | {whole / floor:.2f}x | {waits} |")
    return {(name, label): row for label, row in rows.items()}


# ----------------------------------------------------------------------------- JAX


def _jax_floor(name):
    # the sample x = exp(y) (sigmoid(y)) is not written here: jit drops it when only the score is used
    def n_ary(a, key):
        u = jnp.maximum(jax.random.uniform(key, a.shape), jnp.finfo(a.dtype).tiny)
        y = jax.nn.log_softmax((a - jnp.log(-jnp.log(u))) / T, -1)
        k = a.shape[-1]
        b = a - T * (y - jax.lax.stop_gradient(y.min(-1, keepdims=True)))  # centred, as ours
        log_prob = math.lgamma(k) + (k - 1) * math.log(T) + jax.nn.log_softmax(b, -1).sum(-1)
        return (log_prob - y.sum(-1)).sum() if name == "Concrete" else log_prob.sum()

    def binary(a, key):
        u = jnp.maximum(jax.random.uniform(key, a.shape), jnp.finfo(a.dtype).tiny)
        y = (a + jnp.log(u) - jnp.log1p(-u)) / T
        s = jnp.abs(a - T * y)
        log_prob = math.log(T) - s - 2 * jnp.log1p(jnp.exp(-s))
        if name == "BinConcrete":
            abs_y = jnp.abs(y)
            log_prob = log_prob + abs_y + 2 * jnp.log1p(jnp.exp(-abs_y))
        return log_prob.sum()

    return n_ary if name in ("Concrete", "ExpConcrete") else binary


def _jax_memory_floor(name):
    if name in ("Concrete", "ExpConcrete"):
        return lambda a, key: jax.nn.softmax(a + jax.random.uniform(key, a.shape), -1).sum()
    return lambda a, key: jax.nn.sigmoid(a + jax.random.uniform(key, a.shape)).sum()


def _tfp():
    try:
        from tensorflow_probability.substrates import jax as tfp
    except ImportError:
        return None
    return tfp.distributions


def jax_contestants(name, shape, grad):
    logits = jax.random.normal(jax.random.PRNGKey(0), shape)
    if name in ("BinConcrete", "LogitBinConcrete"):
        logits = logits.reshape(shape[0], -1)
    key = jax.random.PRNGKey(1)

    def timed(fn):
        compiled = jax.jit(jax.grad(fn) if grad else fn)

        def call():
            return compiled(logits, key).block_until_ready()

        def compiled_bytes():  # XLA's own account of the program's memory beyond its arguments
            stats = compiled.lower(logits, key).compile().memory_analysis()
            return stats.temp_size_in_bytes + stats.output_size_in_bytes

        call.compiled_bytes = compiled_bytes
        return call

    def score(make):
        return lambda a, k: (lambda d: d.log_prob(d.sample(k)).sum())(make(a))

    ours = getattr(numpyro_concrete, name)
    result = {
        "ours, validation on": timed(score(lambda a: ours(T, logits=a, validate_args=True))),
        "ours, validation off": timed(score(lambda a: ours(T, logits=a, validate_args=False))),
    }
    tfd = _tfp()
    if tfd is not None:
        anchors = {
            "Concrete": lambda a: tfd.RelaxedOneHotCategorical(T, logits=a),
            "ExpConcrete": lambda a: tfd.ExpRelaxedOneHotCategorical(T, logits=a),
            "BinConcrete": lambda a: tfd.RelaxedBernoulli(T, logits=a),
            "LogitBinConcrete": lambda a: tfd.Logistic(a / T, 1 / T),
        }
        make = anchors[name]
        result["TFP (JAX substrate)"] = timed(lambda a, k: (lambda d: d.log_prob(d.sample(seed=k)).sum())(make(a)))
    result["floor (same math)"] = timed(_jax_floor(name))
    result["memory floor (noise + softmax)"] = timed(_jax_memory_floor(name))
    return result


# ----------------------------------------------------------------------------- report


class _Retrying:
    """Calls ``fn`` until it does not raise ValueError: torch.distributions' validation rejects some
    of its own float32 samples (its simplex check's tolerance is below float32 rounding of a sum of
    K entries), at random. The time then includes the failed attempts; how often is reported."""

    def __init__(self, fn):
        self.fn, self.calls, self.failures = fn, 0, 0

    def __call__(self):
        for _ in range(1000):
            self.calls += 1
            try:
                return self.fn()
            except ValueError:
                self.failures += 1
        raise RuntimeError("1000 attempts in a row failed")


def _measure(contestants, repetitions, seconds):
    working = {}
    for label, fn in contestants.items():
        try:
            fn()
            working[label] = _Retrying(fn)
        except Exception as error:
            print(f"#   {label}: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
    times = interleaved(working, repetitions=repetitions, seconds=seconds)
    for label, fn in working.items():
        if fn.failures:
            print(f"#   {label}: ValueError on its own sample in {fn.failures} of {fn.calls} calls (retried)")
    return times


def run(workloads, names, repetitions, seconds):
    print(machine_line())
    print(f"# d.log_prob(d.rsample()).sum(), temperature {T}, float32; median ms over {repetitions} interleaved repetitions")
    results = {}
    for framework, contestants_for in (("torch", torch_contestants), ("jax", jax_contestants)):
        print(f"\n## {framework}\n")
        print("| workload | distribution | contestant | forward ms | fwd+grad ms | fwd+grad / floor |")
        print("|---|---|---|---|---|---|")
        for workload in workloads:
            for name in names:
                forward = _measure(contestants_for(name, WORKLOADS[workload], False), repetitions, seconds)
                backward = _measure(contestants_for(name, WORKLOADS[workload], True), repetitions, seconds)
                floor = backward["floor (same math)"]
                for label in backward:
                    results[(framework, workload, name, label)] = (forward.get(label), backward[label])
                    fwd = f"{forward[label]:.2f}" if label in forward else "-"
                    print(f"| {workload} {WORKLOADS[workload]} | {name} | {label} | {fwd} | {backward[label]:.2f} | "
                          f"{backward[label] / floor:.2f}x |")
    return results


# ----------------------------------------------------------------------------- content check


def _compared_in_full(cls):
    """``cls`` with every sample compared in full with a copy of it on each recall, instead of the
    sentinel rows ``pyro_concrete`` compares (``_carry``): the alternative design, timed here only."""

    class ComparedInFull(cls):
        def rsample(self, sample_shape=torch.Size()):
            value = super().rsample(sample_shape)
            entry = _carry.carry._entries.get(value.untyped_storage()._cdata)
            if entry is not None:  # no sentinel rows: the whole sample is what was written
                entry.sentinels, entry.written = None, value.detach().clone()
            return value

    return ComparedInFull


def content_check(workloads, names, repetitions, seconds):
    """fwd+grad with validation on, the whole sample compared on every recall over sentinel rows
    compared (as shipped): median and quartiles of the paired ratio over interleaved repetitions."""
    print(machine_line())
    print(f"# torch, d.log_prob(d.rsample()).sum() fwd+grad, validation on, temperature {T}, float32; "
          f"ratio in each of {repetitions} interleaved repetitions")
    print("\n| workload | distribution | full comparison / sentinel rows: median | quartiles |")
    print("|---|---|---|---|")
    results = {}
    for workload in workloads:
        for name in names:
            logits = torch.randn(WORKLOADS[workload])
            if name in ("BinConcrete", "LogitBinConcrete"):
                logits = logits.reshape(logits.shape[0], -1)
            leaf = logits.clone().requires_grad_()

            def timed(cls):
                def call():
                    leaf.grad = None
                    d = cls(T, logits=leaf, validate_args=True)
                    d.log_prob(d.rsample()).sum().backward()

                return call

            cls = getattr(pyro_concrete, name)
            contestants = {"full": timed(_compared_in_full(cls)), "sentinels": timed(cls)}
            calls = {label: calls_per_block(fn, seconds) for label, fn in contestants.items()}
            times = interleaved_times(contestants, repetitions, calls)
            ratios = np.array(times["full"]) / np.array(times["sentinels"])
            low, median, high = np.percentile(ratios, [25, 50, 75])
            results[(workload, name)] = float(median)
            print(f"| {workload} {WORKLOADS[workload]} | {name} | {median:.3f} | {low:.3f}–{high:.3f} |")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="W3 only, 2 short repetitions")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.2, help="length of a timed block")
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS), help="default: all")
    parser.add_argument("--distribution", action="append", choices=list(NAMES), help="default: all")
    parser.add_argument("--device", default="cpu", help="the torch contestants' device (cpu, cuda)")
    parser.add_argument(
        "--content-check", action="store_true",
        help="instead: what comparing the whole sample on every recall would cost over sentinel rows (torch)",
    )
    parser.add_argument("--count", action="store_true", help="instead: kernels and host waits per call (torch)")
    args = parser.parse_args(argv)
    if args.count:
        return count(args.distribution or list(NAMES))
    global DEVICE
    DEVICE = torch.device(args.device)
    workloads = args.workload or list(WORKLOADS)
    if args.quick:
        workloads, args.repetitions, args.seconds = ["W3"], 2, 0.01
    torch.set_num_threads(torch.get_num_threads())
    if args.content_check:
        repetitions = args.repetitions if args.quick or args.repetitions != 7 else 21
        return content_check(workloads, args.distribution or list(NAMES), repetitions, min(args.seconds, 0.1))
    return run(workloads, args.distribution or list(NAMES), args.repetitions, args.seconds)


if __name__ == "__main__":
    main()
