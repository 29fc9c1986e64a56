"""The README's example, the demo and the benchmark scripts run (not a conformance test: these are
written for one PPL each)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("ppl", ["pyro", "numpyro"])
def test_readme_example_runs_as_written(ppl):
    """Each README block trains the relaxed mixture and reads off discrete clusters that separate
    the two halves of its data."""
    pytest.importorskip(ppl)
    example, test_time = [b for b in _python_blocks(ROOT / "README.md") if f"from {ppl}_concrete import" in b]
    if ppl == "pyro":
        import pyro

        pyro.clear_param_store()
        pyro.set_rng_seed(0)
    namespace = {}
    exec(compile(example, "README.md", "exec"), namespace)
    for clusters in [namespace["clusters"]] + _test_time_clusters(test_time, namespace):
        clusters = [int(c) for c in clusters]
        first, second = clusters[:50], clusters[50:]
        majority = max(set(first), key=first.count)
        accuracy = (first.count(majority) + sum(c != majority for c in second)) / 100
        assert accuracy >= 0.95, accuracy


def _test_time_clusters(block, namespace):
    """Run the README's test-time block after the example: the exact marginal is at least the
    per-point bound L_100 (up to Monte Carlo error) and the MAP clusters separate the data."""
    exec(compile(block, "README.md", "exec"), namespace)
    def number(x):
        return float(x.detach() if hasattr(x, "detach") else x)

    log_px, bound = number(namespace["log_px"]), number(namespace["bound"].sum())
    assert bound <= log_px + 1.0 and bound > log_px - 50.0, (log_px, bound)
    return [namespace["clusters"]]
