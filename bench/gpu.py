"""One command for a GPU (issue 30, item 5): the device correctness tests, then the kernels, SVI-step
and training-loop tables with the torch contestants on CUDA and JAX on its GPU backend, each named
with the device and the versions, in about five minutes on one GPU.

1. ``pytest -m gpu tests/test_devices.py``: the four distributions, straight-through, HardConcrete,
   conditional samples, every loss and estimator, the test-time helpers and ``Predictive`` on the
   GPU, values against the CPU's; the unbiased losses' mean against the exact ELBO.
2. ``python -m bench.kernels --device cuda``: ``d.log_prob(d.rsample()).sum()`` forward and
   forward + gradient against the hand-written floor (goal: ours <= 1.3x the floor).
3. ``python -m bench.svi --device cuda``: the examples' SVI steps against the floors, the Pyro
   example's ``--compile`` step in ``mode="reduce-overhead"`` (CUDA graphs; goal: <= 2x the JAX floor).
4. ``python -m bench.loop --device cuda``: each discrete VAE example's loop against its bare
   compiled step (goal: <= 1.15x).

Each part runs in its own process with a time limit; a part that fails or runs out of time is
reported and the next one runs. With no GPU there is nothing to measure: the command says so and
exits with status 2 (BENCHMARKS.md marks the GPU figures as not yet measured, naming this command).

Run: ``python -m bench.gpu`` (``--quick``: the benchmarks' smoke runs, for trying the command).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gpu_present():
    """(torch sees CUDA, JAX's default backend is a GPU), each decided in a fresh process, as the
    parts below will see them."""
    probe = (
        "import torch, jax; print(int(torch.cuda.is_available()), int(jax.default_backend() == 'gpu'))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        return False, False
    torch_gpu, jax_gpu = (bool(int(v)) for v in run.stdout.split()[-2:])
    return torch_gpu, jax_gpu


def parts(quick, dataset):
    """(title, command, seconds allowed) of each part."""
    fast = ["--quick"] if quick else []
    return [
        ("device correctness (pytest -m gpu)", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                                "tests/test_devices.py"], 150),
        ("kernels", [sys.executable, "-m", "bench.kernels", "--device", "cuda", *fast], 120),
        ("SVI steps", [sys.executable, "-m", "bench.svi", "--device", "cuda", "--dataset", dataset, *fast], 120),  # compiles too
        ("training loops", [sys.executable, "-m", "bench.loop", "--device", "cuda", "--dataset", dataset, *fast], 90),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the benchmarks' smoke runs")
    parser.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"])
    args = parser.parse_args(argv)

    torch_gpu, jax_gpu = gpu_present()
    if not torch_gpu:
        print("# bench.gpu: torch sees no CUDA device: nothing to measure here (the GPU figures of BENCHMARKS.md stay "
              "'not yet measured')")
        return 2
    from bench.harness import machine_line

    import torch

    print(f"# bench.gpu on {torch.cuda.get_device_name()}; JAX on {'the GPU' if jax_gpu else 'the CPU (jax has no GPU backend here)'}")
    print(machine_line())
    failed = []
    for title, command, seconds in parts(args.quick, args.dataset):
        print(f"\n## {title}: {' '.join(Path(c).name if c == sys.executable else c for c in command)}\n", flush=True)
        start = time.perf_counter()
        try:
            run = subprocess.run(command, cwd=ROOT, timeout=seconds, env={**os.environ, "PYTHONPATH": str(ROOT)})
            status = run.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
        print(f"\n# {title}: {'ok' if status == 0 else f'FAILED ({status})'} in {time.perf_counter() - start:.0f} s", flush=True)
        if status != 0:
            failed.append(title)
    if failed:
        print(f"\n# failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
