"""Timing side by side: interleaved repetitions, medians, after warm-up; machine and versions."""

import argparse
import os
import platform
import time

import numpy as np


def load_dataset(name):
    """``examples.data.load(name)``, or the 8x8 digits (always there, in scikit-learn) with a
    comment line saying so when ``name``'s files are missing."""
    from examples import data

    try:
        return data.load(name)
    except data.DataNotFound as error:
        print(f"# {error}; using the 8x8 digits")
        return data.load("digits")


def step_parser(doc, *, steps, repetitions, quick, ppl=False):
    """The options of the benchmarks that time training steps: --dataset, --steps, --repetitions,
    --quick (``quick``: its (steps, repetitions)) and, with ``ppl``, --ppl. Parse with ``parse_steps``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    if ppl:
        parser.add_argument("--ppl", default="numpyro,pyro")
    parser.add_argument("--steps", type=int, default=steps, help="steps per contestant per repetition")
    parser.add_argument("--repetitions", type=int, default=repetitions)
    parser.add_argument("--quick", action="store_true", help=f"{quick[1]} repetitions of {quick[0]} steps")
    parser.set_defaults(quick_settings=quick)
    return parser


def parse_steps(parser, argv):
    """``parser.parse_args(argv)``, with --quick's steps and repetitions applied."""
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repetitions = args.quick_settings
    return args


def machine_line():
    import jax
    import torch

    return (
        f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); jax {jax.__version__} ({jax.devices()[0].platform})"
    )


def calls_per_block(fn, seconds):
    """How many calls of ``fn`` take about ``seconds`` (at least 1)."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, int(seconds / once))


def interleaved_times(contestants, repetitions, calls, warmup=2):
    """Milliseconds per call of each ``contestants[name]()`` in every repetition (a list per name, in
    repetition order, for paired ratios): blocks of ``calls[name]`` calls, interleaved, after warm-up."""
    for fn in contestants.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in contestants}
    for _ in range(repetitions):
        for name, fn in contestants.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            times[name].append(1000 * (time.perf_counter() - start) / calls[name])
    return times


def interleaved(contestants, repetitions=7, seconds=0.2, warmup=2):
    """Median milliseconds per call of each ``contestants[name]()`` (a callable that blocks until its
    result is ready), repetitions interleaved so that machine noise hits them all alike."""
    for fn in contestants.values():
        for _ in range(warmup):
            fn()
    counts = {name: calls_per_block(fn, seconds) for name, fn in contestants.items()}
    times = interleaved_times(contestants, repetitions, counts, warmup=0)
    return {name: float(np.median(t)) for name, t in times.items()}
