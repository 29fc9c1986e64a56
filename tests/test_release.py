"""What a release ships (the full check, an installed wheel running the README, is ``make
release-check``, outside the suite): the version in one place, the constraints and transforms
registered by importing the top-level package alone, and the built wheel's and sdist's file lists."""

import importlib.util
import shutil
import subprocess
import sys
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _release_check():
    spec = importlib.util.spec_from_file_location("release_check", ROOT / "tools" / "release_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_version_everywhere():
    import concrete_common

    written = _release_check().version()
    assert concrete_common.__version__ == written
    for package in ("pyro_concrete", "numpyro_concrete"):
        assert pytest.importorskip(package).__version__ == written
    assert installed_version("concrete-ppl") == written, "reinstall the checkout (make test does): its metadata is stale"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {written}" in changelog or f"## [{written}]" in changelog, "CHANGELOG.md has no section for the version"


# In a fresh interpreter, import the top-level package only and reach every support and parameter
# constraint through the host's registries, and through an autoguide over a Concrete site: the
# registrations must not wait for ``import pyro_concrete.transforms``.
REGISTRATION = {
    "pyro_concrete": """
import sys, torch, pyro
import pyro_concrete as pc
from torch.distributions import biject_to, transform_to
assert "pyro_concrete.transforms" in sys.modules  # imported by the package, not by this script
ours = []
for d in DISTRIBUTIONS(pc, torch.zeros):
    for c in [d.support, *d.arg_constraints.values()]:
        for registry in (biject_to, transform_to):
            try:
                t = registry(c)  # NotImplementedError if not registered
            except ValueError as error:  # Hard Concrete's gate: registered to refuse
                assert type(c).__name__ == "_Gate" and "no bijection" in str(error), error
                continue
            if type(c).__module__ == "pyro_concrete.constraints" and type(t).__module__ == "pyro_concrete.transforms":
                ours.append(type(t).__name__)
assert {"LogSimplexTransform", "SimplexTransform", "UnitIntervalTransform"} <= set(ours), ours
def model():
    pyro.sample("z", pc.Concrete(0.5, logits=torch.zeros(3)))
    pyro.sample("b", pc.BinConcrete(0.5, logits=torch.zeros(())))
    pyro.sample("y", pc.ExpConcrete(0.5, logits=torch.zeros(3)))
trace = pyro.poutine.trace(pyro.infer.autoguide.AutoNormal(model)).get_trace()
assert abs(float(trace.nodes["z"]["value"].sum()) - 1) < 1e-5
""",
    "numpyro_concrete": """
import sys, jax, jax.numpy as jnp, numpyro
import numpyro_concrete as pc
from numpyro.distributions.transforms import biject_to
assert "numpyro_concrete.transforms" in sys.modules  # imported by the package, not by this script
ours = []
for d in DISTRIBUTIONS(pc, jnp.zeros):
    for c in [d.support, *d.arg_constraints.values()]:
        try:
            t = biject_to(c)  # NotImplementedError if not registered
        except ValueError as error:  # Hard Concrete's gate: registered to refuse
            assert type(c).__name__ == "_Gate" and "no bijection" in str(error), error
            continue
        if type(c).__module__ == "numpyro_concrete.constraints" and type(t).__module__ == "numpyro_concrete.transforms":
            ours.append(type(t).__name__)
assert {"LogSimplexTransform", "SimplexTransform", "UnitIntervalTransform"} <= set(ours), ours
def model():
    numpyro.sample("z", pc.Concrete(0.5, logits=jnp.zeros(3)))
    numpyro.sample("b", pc.BinConcrete(0.5, logits=jnp.zeros(())))
    numpyro.sample("y", pc.ExpConcrete(0.5, logits=jnp.zeros(3)))
guide = numpyro.infer.autoguide.AutoNormal(model)
trace = numpyro.handlers.trace(numpyro.handlers.seed(guide, 0)).get_trace()
assert abs(float(trace["z"]["value"].sum()) - 1) < 1e-5
""",
}
DISTRIBUTIONS = """
def DISTRIBUTIONS(pc, zeros):
    return [pc.Concrete(0.5, logits=zeros(3)), pc.ExpConcrete(0.5, logits=zeros(3)),
            pc.BinConcrete(0.5, logits=zeros(())), pc.LogitBinConcrete(0.5, logits=zeros(())),
            pc.ConcreteStraightThrough(0.5, logits=zeros(3)), pc.BinConcreteStraightThrough(0.5, logits=zeros(())),
            pc.HardConcrete(0.5, logits=zeros(()))]
"""


@pytest.mark.parametrize("package", sorted(REGISTRATION))
def test_importing_the_package_registers_its_bijections(package):
    pytest.importorskip(package.split("_")[0])
    run = subprocess.run([sys.executable, "-c", DISTRIBUTIONS + REGISTRATION[package]],
                         capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_wheel_holds_the_three_packages_and_the_sdist_the_source(tmp_path):
    """Build both from a copy of the tree (the checkout gets no build/ or egg-info), without build
    isolation (the environment's setuptools), and check their file lists as make release-check does."""
    pytest.importorskip("build")
    setuptools_version = tuple(int(p) for p in installed_version("setuptools").split(".")[:2])
    if setuptools_version < (77, 0):
        pytest.skip("setuptools >= 77 (license-files) is needed to build without isolation")
    source = tmp_path / "source"
    ignored = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()]
    ignored = [p for p in ignored if p and not p.startswith("#")]
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "dist", "_build", "_generated", *ignored))
    run = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path / "dist", source],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = _release_check()
    (wheel,), (sdist,) = sorted((tmp_path / "dist").glob("*.whl")), sorted((tmp_path / "dist").glob("*.tar.gz"))
    assert check.check_wheel(wheel, root=source) == []
    assert check.check_sdist(sdist) == []
