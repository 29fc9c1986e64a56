"""The README's example, the demo and the benchmark scripts run (not a conformance test: these are
written for one PPL each)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_pyro_example_trains_and_discretizes():
    torch = pytest.importorskip("torch")
    (block,) = _python_blocks(ROOT / "README.md")
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    pyro = namespace["pyro"]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.cat([torch.randn(20) * 0.5 - 3, torch.randn(20) * 0.5 + 3])
    losses = [namespace["svi"].step(x) for _ in range(300)]
    assert losses[-1] < losses[0]
    mode = namespace["Concrete"](2 / 3, logits=pyro.param("phi").detach()).discrete().mode
    assert mode.shape == (40, 3) and bool((mode.sum(-1) == 1).all())
    # the two halves of the data end up in different clusters
    assert mode[:20].argmax(-1).mode().values != mode[20:].argmax(-1).mode().values


def test_demo_runs(capsys):
    from examples import svi_demo

    svi_demo.main(["--steps", "300"])
    assert "accuracy" in capsys.readouterr().out


def test_stability_benchmark_quick_mode(capsys):
    from bench import stability

    stability.main(["--quick"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pyro_concrete")]
    assert len(rows) == 8
    for row in rows:  # ours: 0.0% non-finite, 0.0% wrong, 0% rejected, 0% bad gradients
        cells = [c.strip() for c in row.split("|")[3:-1]]
        assert cells == ["0.0%", "0.0%", "0%", "0%"], row
