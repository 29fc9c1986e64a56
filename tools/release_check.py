"""The release check (``make release-check``, run by CI after the suite): what a user installs works.

1. Build the sdist and the wheel (``python -m build``: the wheel is built from the sdist) into a
   temporary directory and check both with ``twine check --strict``.
2. Check their file lists: the wheel holds the three packages (each with its ``py.typed``) and its
   metadata, nothing else; the sdist holds the tracked source (LICENSE, README.md, CHANGELOG.md,
   pyproject.toml, the packages, tests/, examples/, bench/, tools/) and no run outputs, built docs,
   environments or caches.
3. Create a fresh virtual environment, install torch first (the CPU wheel, as the Makefile does),
   then the built wheel FILE with the extras ``[pyro,numpyro]``.
4. From a directory outside the checkout (so the checkout is not importable), run the README's
   ``python`` blocks against the installed wheel: the blocks that import ``pyro_concrete`` in one
   namespace, those that import ``numpyro_concrete`` in another (as ``tests/test_docs.py`` does), and
   check that the package imported lives in the fresh environment's site-packages.

Usage: ``python tools/release_check.py [--torch torch==2.13.0] [--keep]``. Everything it writes is in
one temporary directory, removed in the background at the end unless ``--keep``. Not part of pytest
(it installs an environment: about a minute); ``tests/test_release.py`` checks the file lists with a
quick build and the registrations in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("concrete_common", "pyro_concrete", "numpyro_concrete")
BACKENDS = ("pyro_concrete", "numpyro_concrete")
DISTRIBUTION = "concrete_ppl"  # the project's name, normalized as in the file names
# in the sdist, at its top level (besides the packages); never: run outputs, built docs, caches
SDIST_REQUIRED = ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")
SDIST_REQUIRED_DIRS = ("tests", "examples", "bench", "tools")
SDIST_FORBIDDEN = re.compile(
    r"(^|/)(\.venv|\.git|__pycache__|\.mypy_cache|\.pytest_cache|\.hypothesis|\.ruff_cache)(/|$)"
    r"|^runs[^/]*(/|$)|^build/|^docs/_(build|generated)/|\.py[cod]$"
)


def version() -> str:
    """The version as written in concrete_common/_version.py (read, not imported)."""
    tree = ast.parse((ROOT / "concrete_common" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise RuntimeError("concrete_common/_version.py sets no __version__")


def source_modules(root: Path = ROOT) -> set[str]:
    """The packages' Python files in a source tree, as paths inside a wheel."""
    return {p.relative_to(root).as_posix() for package in PACKAGES for p in (root / package).rglob("*.py")
            if "__pycache__" not in p.parts}


def check_wheel(wheel: Path, root: Path = ROOT) -> list[str]:
    """The wheel's file list: the packages' modules and py.typed markers, its dist-info; nothing else."""
    expected_version = version()
    dist_info = f"{DISTRIBUTION}-{expected_version}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        metadata = archive.read(f"{dist_info}/METADATA").decode() if f"{dist_info}/METADATA" in names else ""
    problems = []
    if not wheel.name.startswith(f"{DISTRIBUTION}-{expected_version}-"):
        problems.append(f"wheel {wheel.name}: not version {expected_version}")
    stray = sorted(n for n in names if PurePosixPath(n).parts[0] not in (*PACKAGES, dist_info))
    if stray:
        problems.append(f"wheel: files outside the three packages: {stray}")
    compiled = sorted(n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo")))
    if compiled:
        problems.append(f"wheel: compiled files: {compiled}")
    modules = {n for n in names if n.endswith(".py")}
    if modules != source_modules(root):
        problems.append(f"wheel: modules missing {sorted(source_modules(root) - modules)}, "
                        f"extra {sorted(modules - source_modules(root))}")
    for package in PACKAGES:
        if f"{package}/py.typed" not in names:
            problems.append(f"wheel: no {package}/py.typed")
    if f"{dist_info}/licenses/LICENSE" not in names:
        problems.append("wheel: no LICENSE in the dist-info")
    for line in (f"Version: {expected_version}", "License-Expression: Apache-2.0", "License-File: LICENSE"):
        if line not in metadata.splitlines():
            problems.append(f"wheel METADATA: no {line!r}")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    """The sdist's file list: the tracked source, no run outputs, built docs, environments, caches."""
    top = f"{DISTRIBUTION}-{version()}"
    with tarfile.open(sdist) as archive:
        members = [m.name for m in archive.getmembers() if m.isfile()]
    problems = []
    outside = [m for m in members if not m.startswith(top + "/")]
    if outside:
        problems.append(f"sdist: files outside {top}/: {outside[:5]}")
    names = {m[len(top) + 1:] for m in members if m.startswith(top + "/")}
    problems += [f"sdist: no {name}" for name in SDIST_REQUIRED if name not in names]
    problems += [f"sdist: no {d}/" for d in (*SDIST_REQUIRED_DIRS, *PACKAGES) if not any(n.startswith(d + "/") for n in names)]
    problems += [f"sdist: no {package}/py.typed" for package in PACKAGES if f"{package}/py.typed" not in names]
    forbidden = sorted(n for n in names if SDIST_FORBIDDEN.search(n))
    if forbidden:
        problems.append(f"sdist: {len(forbidden)} files that do not belong, e.g. {forbidden[:5]}")
    return problems


def readme_blocks(readme: Path = ROOT / "README.md") -> dict[str, list[tuple[int, str]]]:
    """The README's ```python blocks, with the line each starts on, by the package they import."""
    text = readme.read_text()
    blocks: dict[str, list[tuple[int, str]]] = {package: [] for package in BACKENDS}
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL):
        code = match.group(1)
        imports = [p for p in BACKENDS if re.search(rf"^\s*(from|import)\s+{p}\b", code, flags=re.MULTILINE)]
        line = text.count("\n", 0, match.start(1)) + 1
        if len(imports) != 1:
            raise SystemExit(f"README.md line {line}: a python block must import exactly one of {BACKENDS}; "
                             f"this one imports {imports or 'neither'}")
        blocks[imports[0]].append((line, code))
    for package, found in blocks.items():
        if not found:
            raise SystemExit(f"README.md has no python block importing {package}")
    return blocks


# runs in the fresh environment: the blocks in one namespace (README line numbers kept in tracebacks),
# then where the packages were imported from
RUNNER = r'''
import json, pathlib, sys, sysconfig, time
blocks, package, checkout, expected_version = json.loads(pathlib.Path(sys.argv[1]).read_text())
namespace = {"__name__": "__main__"}
start = time.perf_counter()
for line, code in blocks:
    exec(compile("\n" * (line - 1) + code, "README.md", "exec"), namespace)
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
for name in (package, "concrete_common"):
    where = pathlib.Path(sys.modules[name].__file__).resolve()
    assert where.is_relative_to(site), f"{name} imported from {where}, not from {site}"
    assert not where.is_relative_to(pathlib.Path(checkout)), f"{name} imported from the checkout: {where}"
    assert (where.parent / "py.typed").is_file(), f"{name} installed without py.typed"
version = sys.modules[package].__version__
assert version == expected_version, (version, expected_version)
print(f"{package} {version}: {len(blocks)} README blocks ran in {time.perf_counter() - start:.1f} s, "
      f"imported from {pathlib.Path(sys.modules[package].__file__).parent}")
'''


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement installed first (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="concrete-release-")).resolve()
    if work.is_relative_to(ROOT):
        raise SystemExit(f"the temporary directory {work} is inside the checkout: set TMPDIR elsewhere")
    steps: list[tuple[str, float]] = []

    def step(name: str, since: float) -> float:
        now = time.perf_counter()
        steps.append((name, now - since))
        return now

    try:
        t = time.perf_counter()
        dist = work / "dist"
        run([sys.executable, "-m", "build", "--outdir", dist, ROOT], stdout=subprocess.DEVNULL)
        (wheel,), (sdist,) = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
        run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])
        problems = check_wheel(wheel) + check_sdist(sdist)
        if problems:
            raise SystemExit("release check failed:\n  " + "\n  ".join(problems))
        print(f"file lists ok: {wheel.name}, {sdist.name}")
        t = step("build + twine check + file lists", t)

        venv = work / "venv"
        python = venv / "bin" / "python"
        run([sys.executable, "-m", "venv", venv])
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        run([*pip, "--upgrade", "pip"])
        run([*pip, args.torch])  # the CPU wheel first, so that pyro-ppl's torch requirement is met
        run([*pip, f"{wheel}[pyro,numpyro]"])
        t = step("fresh environment + install", t)

        outside = work / "cwd"  # a directory outside the checkout: nothing there to import
        outside.mkdir()
        runner = outside / "run_readme.py"
        runner.write_text(RUNNER)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        for package, blocks in readme_blocks().items():
            spec = outside / f"{package}.json"
            spec.write_text(json.dumps([blocks, package, str(ROOT), version()]))
            # -I: neither the script's directory nor PYTHONPATH nor user site-packages on sys.path
            run([python, "-I", runner, spec], cwd=outside, env=env)
        step("README blocks against the installed wheel", t)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            # removing the environment (torch: ~1.5 GB in many files) took 90 s here (ext4 mounted with
            # discard), twice the rest of the check: it runs on after this process, detached
            subprocess.Popen(["rm", "-rf", str(work)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"removing {work} in the background")
    for name, seconds in steps:
        print(f"  {seconds:6.1f} s  {name}")
    print(f"release check passed in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
