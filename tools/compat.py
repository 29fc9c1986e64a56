"""The versions users have (``make compat``): fresh virtual environments with the oldest versions the
project declares and the newest that install on this machine, each running the conformance suite's
subset below; then one table of what was installed and what passed.

Environments (what cannot be installed here is said in the README's table, not tried):

- ``oldest``: Python 3.11 and the lower bounds of ``pyproject.toml`` (torch, pyro-ppl, jax/jaxlib,
  numpyro, funsor, numpy). Older torch installs here only as a multi-gigabyte CUDA build; the bounds
  of the others were raised to what passes (README, Supported versions).
- ``newest``: Python 3.11, the newest of each that installs for it; torch 2.13.0 (newer torch
  installs here only as a CUDA build).
- ``newest-torch``: Python 3.11, the newest torch on this disk (2.14.1, a CUDA build, run on the
  CPU; pip's cap here, /etc/xdg/pip) and the newest pyro-ppl, the Pyro half only
  (``CONCRETE_TEST_BACKENDS=pyro``).
- ``newest-jax``: Python 3.12 and the newest jax, jaxlib and numpyro (jax >= 0.11 needs Python
  3.12), the NumPyro half only (``CONCRETE_TEST_BACKENDS=numpyro``: torch for Python 3.12 is a CUDA
  build here), and the NumPyro examples' tests (``tests/test_examples.py -k numpyro``: the mixture,
  GMM and HMM examples once failed on jax 0.11, issue 31).
- ``newest-3.12``: Python 3.12 and the newest of everything from the registry itself (pypi.org),
  torch included, both halves: what a user who installs today gets. It reads past this machine's pip
  configuration (its on-disk index and its cap on torch), so it needs the registry, and torch comes
  as a CUDA build of a few gigabytes (run on the CPU).

The subset: every conformance file that runs the distributions, the test-time modes, the losses and
estimators and the host's machinery through both backends' adapters (it reaches every public name of
both packages: ``tests/test_mirror.py`` is in it), without the examples, benchmarks, docs and release
checks, which exercise the same names through longer runs.

Usage: ``python tools/compat.py [--only NAME ...] [--keep]``; environments in ``.compat/`` (removed
at the end unless ``--keep``). Exit status 1 if any environment's subset failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"

SUBSET = [
    "tests/test_mirror.py", "tests/test_density.py", "tests/test_sampling.py", "tests/test_shapes.py",
    "tests/test_gradients.py", "tests/test_constraints.py", "tests/test_errors.py", "tests/test_numerics.py",
    "tests/test_straight_through.py", "tests/test_hard_concrete.py", "tests/test_conditional.py",
    "tests/test_temperature.py", "tests/test_discrete.py", "tests/test_test_time.py", "tests/test_svi.py",
    "tests/test_score_function.py", "tests/test_vimco.py", "tests/test_importance_weighted.py",
    "tests/test_estimators.py", "tests/test_estimators_exact.py", "tests/test_autoguides_mixed.py",
    "tests/test_host_generic.py", "tests/test_numpyro_jax.py", "tests/test_pyro_torch.py",
    "tests/test_pyro_jit.py", "tests/test_pyro_compile.py", "tests/test_devices.py",
]
TEST_TOOLS = ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6.100", "scipy>=1.11"]
EXAMPLE_TOOLS = ["tqdm>=4.60", "matplotlib>=3.7", "scikit-learn>=1.3"]  # pyproject's "examples" extra
ENVIRONMENTS = {
    "oldest": dict(
        python="3.11", backends="pyro,numpyro",
        packages=["torch==2.13.0", "pyro-ppl==1.9.0", "jax==0.10.2", "jaxlib==0.10.2", "numpyro==0.22.0",
                  "funsor==0.4.8", "numpy==2.0.2"],
    ),
    "newest": dict(
        python="3.11", backends="pyro,numpyro",
        packages=["torch==2.13.0", "pyro-ppl", "jax", "jaxlib", "numpyro", "funsor", "numpy"],
    ),
    "newest-torch": dict(
        python="3.11", backends="pyro",
        packages=["torch==2.14.1", "pyro-ppl", "numpy"],
    ),
    "newest-jax": dict(
        python="3.12", backends="numpyro",
        packages=["jax", "jaxlib", "numpyro", "funsor", "numpy"], examples="numpyro",
    ),
    "newest-3.12": dict(
        python="3.12", backends="pyro,numpyro",
        packages=["torch", "pyro-ppl", "jax", "jaxlib", "numpyro", "funsor", "numpy"],
        registry="https://pypi.org/simple",
    ),
}
REPORTED = ["python", "torch", "pyro-ppl", "jax", "jaxlib", "numpyro", "funsor", "numpy"]


def interpreter(version):
    """pyenv's newest CPython ``version``.x here, or None."""
    found = sorted(PYENV.glob(f"{version}.*"), key=lambda p: [int(x) for x in p.name.split(".")[:3] if x.isdigit()])
    return found[-1] / "bin" / "python" if found else None


def run(command, **kwargs):
    return subprocess.run(command, cwd=ROOT, text=True, capture_output=True, **kwargs)


def build(name, spec, where):
    """A fresh venv at ``where`` with the environment's packages, the test tools and this project
    (no dependencies of its own: they are pinned above). Returns its python, or raises with pip's error."""
    python = interpreter(spec["python"])
    if python is None:
        raise RuntimeError(f"no Python {spec['python']} here (pyenv)")
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(where)], check=True)
    venv_python = where / "bin" / "python"
    packages = list(spec["packages"]) + (EXAMPLE_TOOLS if spec.get("examples") else [])
    torch = [p for p in packages if p.startswith("torch")]
    steps = ([torch] if torch else []) + [packages + TEST_TOOLS, ["--no-deps", "-e", "."]]
    pip, env = [str(venv_python), "-m", "pip", "install", "--quiet"], None
    if spec.get("registry"):  # past this machine's pip configuration (its index on disk, its cap)
        pip, env = pip + ["--index-url", spec["registry"]], {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    for step in steps:  # torch first: the CPU file on this disk, before anything asks for torch
        done = run(pip + step, timeout=1800, env=env)
        if done.returncode:
            raise RuntimeError(f"pip install {' '.join(step)}:\n{done.stderr[-3000:]}")
    return venv_python


def versions(venv_python):
    script = (
        "import importlib.metadata as m, json, platform\n"
        f"names = {REPORTED[1:]!r}\n"
        "out = {'python': platform.python_version()}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = '-'\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(run([str(venv_python), "-c", script], check=True).stdout)


def test(venv_python, spec):
    """The subset, then (``examples``: one PPL) that PPL's example tests; (status, summary, seconds, output)."""
    env = {**os.environ, "CONCRETE_TEST_BACKENDS": spec["backends"]}
    start = time.perf_counter()
    pytest = [str(venv_python), "-m", "pytest", "-n", "2", "--dist", "worksteal", "-q", "-p", "no:cacheprovider"]
    runs = [pytest + SUBSET]
    if spec.get("examples"):
        runs.append(pytest + ["tests/test_examples.py", "-k", spec["examples"]])
    status, summaries, output = 0, [], ""
    for command in runs:
        done = run(command, env=env, timeout=5400)
        lines = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line or " error" in line]
        summaries.append((lines[-1] if lines else done.stdout[-500:]).strip("= "))
        status, output = status or done.returncode, output + done.stdout
    return status, "; examples: ".join(summaries), time.perf_counter() - start, output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(ENVIRONMENTS))
    parser.add_argument("--keep", action="store_true", help="keep .compat/ (the environments)")
    args = parser.parse_args(argv)
    rows, failed = [], False
    for name in args.only or list(ENVIRONMENTS):
        spec = ENVIRONMENTS[name]
        where = ROOT / ".compat" / name
        print(f"# {name}: building {where.relative_to(ROOT)} ({' '.join(spec['packages'])})", flush=True)
        try:
            venv_python = build(name, spec, where)
        except (RuntimeError, subprocess.SubprocessError) as error:
            rows.append((name, {}, "not installed", str(error).splitlines()[0], 0.0))
            failed = True
            continue
        installed = versions(venv_python)
        status, summary, seconds, output = test(venv_python, spec)
        log = ROOT / ".compat" / f"{name}.log"
        log.write_text(output)
        print(f"# {name}: {summary} ({seconds / 60:.1f} min; log {log.relative_to(ROOT)})", flush=True)
        rows.append((name, installed, "passed" if status == 0 else "FAILED", summary, seconds))
        failed |= status != 0
    print("\n| environment | " + " | ".join(REPORTED) + " | backends | subset | minutes |")
    print("|---|" + "---|" * (len(REPORTED) + 3))
    for name, installed, verdict, summary, seconds in rows:
        cells = [installed.get(n, "-") for n in REPORTED]
        print(f"| {name} | " + " | ".join(cells) + f" | {ENVIRONMENTS[name]['backends']} | {verdict}: {summary} | {seconds / 60:.1f} |")
    if not args.keep:
        for name in args.only or list(ENVIRONMENTS):
            shutil.rmtree(ROOT / ".compat" / name, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
