"""Scaling: time and peak memory of ``d.log_prob(d.rsample()).sum()`` and its gradient (Concrete,
temperature 0.5, float32) against the number of categories K (2 ... 10^4, batch 1000) and against
the batch size (10^2 ... 10^6, K = 10), for both backends (JAX under ``jax.jit``).

Each configuration runs in a fresh process, so that its peak resident memory (above the process's
baseline after the imports and a small warm-up) is its own; it is measured in whole megabytes, so
small configurations read 0. Below each sweep: the slope of log time against log size over the upper
two decades, and of log memory over the configurations that use at least 8 MB -- 1 is linear; a
quadratic term would push it towards 2.

Large K (``--large-k``): vocabulary-sized categories, K = 10^4, 10^5, 10^6 at 10^7 elements (batch
1000, 100, 10), each contestant of ``bench.kernels`` (ours with validation on and off, torch's or
TFP's relaxed categorical, the hand-written floor of the same math, the memory-traffic floor)
timed interleaved in one process per configuration, and its peak memory measured alone in a fresh
process (torch: the resident set's peak; JAX: XLA's memory analysis of the compiled program, which
the timing process reads, since it does not depend on what else the process ran); both against the
floor (goal: time <= 1.1x, peak memory <= 1.2x).

Run: ``python -m bench.scaling`` (``--quick`` for a smoke run; ``--large-k`` for the large-K table only).
"""

import argparse
import json
import resource
import subprocess
import sys

import numpy as np

SWEEPS = {
    "K (batch 1000)": [(1000, k) for k in (2, 10, 100, 1000, 10000)],
    "batch (K = 10)": [(b, 10) for b in (100, 1000, 10000, 100000, 1000000)],
}


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(framework, batch, k, repetitions):
    """Runs in a subprocess: prints {"ms": ..., "mb": ...} for one configuration."""
    import time

    if framework == "torch":
        import torch

        from pyro_concrete import Concrete

        def make(shape):
            leaf = torch.randn(shape).requires_grad_()

            def call():
                leaf.grad = None
                d = Concrete(0.5, logits=leaf, validate_args=False)
                d.log_prob(d.rsample()).sum().backward()

            return call
    else:
        import jax

        from numpyro_concrete import Concrete

        def make(shape):
            logits = jax.random.normal(jax.random.PRNGKey(0), shape)
            grad = jax.jit(jax.grad(lambda a, key: (lambda d: d.log_prob(d.sample(key)).sum())(Concrete(0.5, logits=a, validate_args=False))))
            return lambda: grad(logits, jax.random.PRNGKey(1)).block_until_ready()

    small = make((2, 2))
    small()
    baseline = _peak_rss_mb()
    call = make((batch, k))
    call()  # compile / warm up
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    print(json.dumps({"ms": float(np.median(times)), "mb": _peak_rss_mb() - baseline}))


LARGE_K = [(1000, 10**4), (100, 10**5), (10, 10**6)]
FLOOR = "floor (same math)"


def _contestants(framework, batch, k):
    from bench import kernels

    make = kernels.torch_contestants if framework == "torch" else kernels.jax_contestants
    return make("Concrete", (batch, k), grad=True)


def large_k_time_worker(framework, batch, k, repetitions, labels):
    """Runs in a subprocess: the median ms (forward + gradient) of each contestant in ``labels``
    (all when empty), interleaved; JAX's also XLA's memory analysis of each ("mb")."""
    from bench.harness import interleaved

    contestants = _contestants(framework, batch, k)
    chosen, failed = {}, {}
    for label, fn in contestants.items():
        if labels and label not in labels:
            continue
        try:
            fn()
            chosen[label] = fn
        except Exception as error:  # noqa: BLE001 -- a contestant that cannot run this size is reported, not fatal
            failed[label] = f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
    result = {"ms": interleaved(chosen, repetitions=repetitions, seconds=0.3), "failed": failed}
    if framework == "jax":
        result["mb"] = {label: _compiled_mb(fn) for label, fn in chosen.items()}
    print(json.dumps(result))


def _compiled_mb(call):
    """XLA's own account of a compiled contestant's memory beyond its arguments (temporaries and
    outputs): the CPU client keeps freed buffers resident, so the resident set does not show a
    second call's peak."""
    return call.compiled_bytes() / 2**20


def _status_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def large_k_memory_worker(framework, batch, k, label):
    """Runs in a subprocess, torch's contestants only (JAX's timing worker reports XLA's account): the
    peak resident memory of one contestant's call above the resident memory just before it (Linux:
    the peak is reset through /proc/self/clear_refs), on its second call."""
    call = _contestants(framework, batch, k)[label]
    call()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    before = _status_mb("VmRSS")
    call()
    print(json.dumps({"mb": _status_mb("VmHWM") - before}))


def _worker_json(*argv):
    output = subprocess.run([sys.executable, "-m", "bench.scaling", *argv], capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def large_k(repetitions, configs=LARGE_K, labels=()):
    """The large-K table for both frameworks; returns {(framework, K): {label: (ms, mb)}}."""
    results = {}
    for framework in ("torch", "jax"):
        print(f"\n{framework}, large K (10^7 elements, forward + gradient, float32, t = 0.5)\n")
        print("| K | batch | contestant | ms | x floor | peak MB | x floor |\n|---|---|---|---|---|---|---|")
        for batch, k in configs:
            measured = _worker_json("--large-k-time", framework, str(batch), str(k), str(repetitions), *labels)
            memory = measured["mb"] if framework == "jax" else {
                label: _worker_json("--large-k-memory", framework, str(batch), str(k), label)["mb"] for label in measured["ms"]}
            row = {label: (ms, memory[label]) for label, ms in measured["ms"].items()}
            floor_ms, floor_mb = row[FLOOR]
            for label, (ms, mb) in row.items():
                print(f"| {k} | {batch} | {label} | {ms:.2f} | {ms / floor_ms:.2f} | {mb:.0f} | {mb / max(floor_mb, 1):.2f} |")
            for label, error in measured["failed"].items():
                print(f"| {k} | {batch} | {label} | fails: {error} | | | |")
            results[(framework, k)] = row
    print("\ngoal (ours, default settings = validation on): time <= 1.1x floor, peak memory <= 1.2x floor")
    for (framework, k), row in results.items():
        ms, mb = row["ours, validation on"]
        floor_ms, floor_mb = row[FLOOR]
        verdict = "met" if ms <= 1.1 * floor_ms and mb <= 1.2 * max(floor_mb, 1) else "NOT met"
        print(f"- {framework}, K = {k}: time {ms / floor_ms:.2f}x, memory {mb / max(floor_mb, 1):.2f}x: {verdict}")
    return results


def _measure(framework, batch, k, repetitions):
    output = subprocess.run(
        [sys.executable, "-m", "bench.scaling", "--worker", framework, str(batch), str(k), str(repetitions)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def _slope(sizes, values):
    """Slope of log value against log size, or None with fewer than two points."""
    if len(sizes) < 2:
        return None
    return float(np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.asarray(values, float)), 1)[0])


def _format(slope):
    return "n/a" if slope is None else f"{slope:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smallest configuration of each sweep, one repetition")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--large-k", action="store_true", help="only the large-K table (K = 10^4 ... 10^6)")
    parser.add_argument("--worker", nargs=4, metavar=("FRAMEWORK", "BATCH", "K", "REPETITIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--large-k-time", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--large-k-memory", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        framework, batch, k, repetitions = args.worker
        return worker(framework, int(batch), int(k), int(repetitions))
    if args.large_k_time:
        framework, batch, k, repetitions, *labels = args.large_k_time
        return large_k_time_worker(framework, int(batch), int(k), int(repetitions), labels)
    if args.large_k_memory:
        framework, batch, k, label = args.large_k_memory
        return large_k_memory_worker(framework, int(batch), int(k), label)
    from bench.harness import machine_line

    print(machine_line())
    if args.large_k:
        if args.quick:  # a small configuration, the two contestants of the goal
            return large_k(1, [(10, 1000)], labels=("ours, validation on", FLOOR))
        return large_k(args.repetitions)
    print("# Concrete, t = 0.5, float32: median ms of forward + gradient, and peak resident memory above the process baseline")
    results = {}
    for framework in ("torch", "jax"):
        for sweep, configs in SWEEPS.items():
            if args.quick:
                configs = configs[:1]
            rows = [(b, k, _measure(framework, b, k, 1 if args.quick else args.repetitions)) for b, k in configs]
            sizes = [b * k for b, k, _ in rows]
            print(f"\n{framework}, sweep over {sweep}\n")
            print("| batch | K | elements | ms | ms per 10^6 elements | peak MB | bytes per element |")
            print("|---|---|---|---|---|---|---|")
            for (b, k, m), n in zip(rows, sizes):
                print(f"| {b} | {k} | {n} | {m['ms']:.2f} | {1e6 * m['ms'] / n:.2f} | {m['mb']:.0f} | "
                      f"{2**20 * m['mb'] / n:.0f} |")
            if len(rows) >= 3:
                ms = [m["ms"] for _, _, m in rows]
                big = [(n, m["mb"]) for n, (_, _, m) in zip(sizes, rows) if m["mb"] >= 8]
                print(f"\nslope of log time against log elements, upper two decades: {_format(_slope(sizes[-3:], ms[-3:]))}; "
                      f"of log memory, configurations >= 8 MB: {_format(_slope(*zip(*big)) if len(big) >= 2 else None)}")
            results[(framework, sweep)] = rows
    return results


if __name__ == "__main__":
    main()
