"""Smoke runs of the benchmark scripts in their ``--quick`` modes, so that they keep working. Not
timed tests: speed is reported by the scripts (BENCHMARKS.md), never asserted here. What is checked
is that every contestant ran and gave a positive time, and the stability table's verdicts."""

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

NAMES = ("Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete")


def _positive(ms):
    return ms is not None and math.isfinite(ms) and ms > 0


def test_kernels_quick_runs_every_contestant(capsys):
    from bench import kernels

    # Concrete and BinConcrete: their floors hold every line of the log-space nodes' and more
    tested = ("Concrete", "BinConcrete")
    results = kernels.main(["--quick", *(f"--distribution={name}" for name in tested)])
    capsys.readouterr()
    expected = {
        "torch": {"ours, validation on", "ours, validation off", "torch.distributions, validation on",
                  "torch.distributions, validation off", "floor (same math)", "memory floor (noise + softmax)"},
        "jax": {"ours, validation on", "ours, validation off", "floor (same math)", "memory floor (noise + softmax)"}
        | ({"TFP (JAX substrate)"} if kernels._tfp() is not None else set()),
    }
    for framework, labels in expected.items():
        for name in tested:
            measured = {label for (f, w, n, label) in results if (f, w, n) == (framework, "W3", name)}
            assert measured == labels, (framework, name)
    assert all(_positive(forward) and _positive(backward) for forward, backward in results.values())


def test_kernels_content_check_times_the_full_comparison_it_describes(capsys):
    import torch

    import pyro_concrete
    from bench import kernels

    results = kernels.main(["--quick", "--content-check"])
    capsys.readouterr()
    assert set(results) == {("W3", name) for name in NAMES}
    assert all(_positive(ratio) for ratio in results.values())
    # the timed alternative does compare the whole sample: an edit that spares every sentinel is seen
    # float64: no sample rounds to 0 or 1, where the edited (no longer own) value would be refused
    d = kernels._compared_in_full(pyro_concrete.BinConcrete)(0.5, logits=torch.randn(200, 30, dtype=torch.float64))
    x = d.rsample()
    exact = d.log_prob(x)
    x.detach().numpy()[123, 7] = 0.25
    assert d.log_prob(x)[123, 7] != exact[123, 7]


def test_scaling_quick_measures_both_frameworks(capsys):
    from bench import scaling

    results = scaling.main(["--quick"])
    capsys.readouterr()
    assert {framework for framework, _ in results} == {"torch", "jax"}
    for (framework, sweep), rows in results.items():
        ((batch, k, measured),) = rows
        assert (batch, k) == scaling.SWEEPS[sweep][0]
        assert _positive(measured["ms"]) and measured["mb"] >= 0


def test_svi_quick_times_the_examples_and_the_floors(capsys):
    from bench import svi

    # the --compile contestant's inductor compilation (tens of CPU-seconds) left out: its step is tested in
    # test_pyro_compile.py, its time in bench/results
    medians = svi.main(["--quick", "--dataset", "digits", "--compile-mode", "none"])
    assert "digits" in capsys.readouterr().out
    assert set(medians) == {"numpyro example (jit)", "jax floor (jit)", "pyro example (JitTrace_ELBO)",
                            "pyro example (Trace_ELBO)", "pyro SVI.step (JitTrace_ELBO)", "torch floor (eager)",
                            "torch floor (eager, fused Adam)"}
    assert all(_positive(ms) for ms in medians.values())


def test_stability_quick_ours_exact_and_torch_failure_visible(capsys):
    from bench import stability

    stability.main(["--quick"])
    output = capsys.readouterr().out.splitlines()
    rows = [line for line in output if line.startswith(("| pyro_concrete", "| numpyro_concrete"))]
    assert len(rows) == 8
    for row in rows:  # ours: 0.0% non-finite, 0.0% wrong, 0% rejected, 0% bad gradients
        cells = [c.strip() for c in row.split("|")[3:-1]]
        assert cells == ["0.0%", "0.0%", "0%", "0%"], row
    # the motivating failure stays visible: torch's relaxed one-hot at t = 0.01 in float32
    (anchor,) = [line for line in output if line.startswith("| torch RelaxedOneHotCategorical")]
    assert float(anchor.split("|")[3].strip().rstrip("%")) > 50, anchor


def test_gemm_quick_times_every_product_of_a_step(capsys):
    """Every product of one SVI step was timed for the three contestants (after the script checked
    their results agree), and the step's total is the count-weighted sum of the rows."""
    from bench import gemm

    results = gemm.main(["--quick"])
    capsys.readouterr()
    counts = gemm.products()
    assert sum(counts.values()) == 3 * len(gemm.LAYERS) - 1  # forward, two gradients, no data gradient
    for name in gemm.CONTESTANTS:
        assert all(_positive(results[shapes][0][name]) for shapes in counts)
        total = sum(count * results[shapes][0][name] for shapes, count in counts.items())
        assert results["step"][name] == pytest.approx(total)


def test_variance_quick_measures_each_estimator_at_each_step(capsys, tmp_path):
    """bench.variance in --quick mode on two estimators (an unbiased and a biased one): every cell is
    a finite log variance with its bias and noise, and the figure is written. The unbiased one's
    bias stays within a few times its Monte Carlo noise; nothing else is asserted of the numbers."""
    from bench import variance

    table = variance.main(["--quick", "--estimators", "disarm,st", "--out", str(tmp_path)])
    capsys.readouterr()
    steps = sorted({step for _, step in table})
    assert steps == [0, 5, 25, 50, 100] and {name for name, _ in table} == {"disarm", "st"}
    for (name, step), (log_variance, bias, noise, elbo) in table.items():
        assert all(math.isfinite(v) for v in (log_variance, bias, noise, elbo)) and elbo < 0
        if name == "disarm":
            assert bias < 5 * noise, (step, bias, noise)
    assert (tmp_path / "variance.png").stat().st_size > 0


def test_estimators_quick_times_every_estimator_against_concrete(capsys):
    """bench.estimators in --quick mode: every estimator of the dVAE example timed, each in one PPL
    (alternating; the full run times all in both), against its own PPL's Concrete step (whose ratio
    to itself is exactly 1)."""
    from bench import estimators

    result = estimators.main(["--quick", "--dataset", "digits"])
    capsys.readouterr()
    others = estimators.ESTIMATORS[1:]
    assert set(result) == ({("numpyro", "concrete"), ("pyro", "concrete")} | {("numpyro", n) for n in others[0::2]}
                           | {("pyro", n) for n in others[1::2]})
    for (ppl, name), (ms, ratio) in result.items():
        assert _positive(ms) and _positive(ratio)
        if name == "concrete":
            assert ratio == 1.0


def test_data_parallel_quick_numpyro_and_the_projection():
    """bench.data_parallel in --quick mode (NumPyro, 2 simulated devices; a subprocess, since the
    devices must exist before JAX starts): three configurations timed, the bytes all-reduced per
    step equal to the Pyro example's parameter bytes for the same (200H~64V) model (459136: 114784
    float32 parameters), and the projection's all-reduce cost by its formula."""
    import subprocess
    import sys

    from bench import data_parallel

    run = subprocess.run([sys.executable, "-m", "bench.data_parallel", "--quick", "--dataset", "digits", "--ppl", "numpyro"],
                         cwd=data_parallel.ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 1 device") or line.startswith("| 2 devices")]
    assert len(rows) == 3 and "0.46 MB" in run.stdout
    for row in rows:
        ms, images_per_second = (float(cell) for cell in row.strip("|").split("|")[2:4])
        assert ms > 0 and images_per_second > 0
    (n8, comm8, eff8), (n64, comm64, eff64) = data_parallel.projection(459136, 10.0)
    assert (n8, n64) == (8, 64)
    assert abs(comm8 - 1000 * (2 * 7 / 8 * 459136 / 150e9 + 14 * 5e-6)) < 1e-12
    assert abs(eff64 - 10.0 / (10.0 + comm64)) < 1e-12 and 0 < eff64 < eff8 < 1


def test_scaling_large_k_quick_against_the_floor(capsys):
    """bench.scaling --large-k --quick: ours and the hand-written floor, timed side by side and their
    peak memory measured alone, in both frameworks; the floor's own ratios are exactly 1."""
    from bench import scaling

    results = scaling.main(["--large-k", "--quick"])
    out = capsys.readouterr().out
    assert set(results) == {("torch", 1000), ("jax", 1000)}
    for row in results.values():
        assert set(row) == {"ours, validation on", scaling.FLOOR}
        for ms, mb in row.values():
            assert _positive(ms) and mb >= 0
    assert out.count("| 1000 | 10 | floor (same math) |") == 2 and "goal (ours, default settings" in out


def test_gpu_command_measures_nothing_without_a_gpu_and_names_its_parts(monkeypatch, capsys):
    """bench.gpu where torch sees no CUDA device: exit status 2 and one line saying so, no part run;
    its parts are the four the docs name, each a module of bench/ or the device tests."""
    from pathlib import Path

    from bench import gpu

    monkeypatch.setattr(gpu, "gpu_present", lambda: (False, False))
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **k: pytest.fail("a part ran without a GPU"))
    assert gpu.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out
    commands = [command for _, command, _ in gpu.parts(False, "digits")]
    assert commands[0][-1] == "tests/test_devices.py" and "gpu" in commands[0]
    for command in commands[1:]:
        module = command[command.index("-m") + 1]
        assert (Path(gpu.ROOT) / (module.replace(".", "/") + ".py")).exists(), module
        assert command[command.index("--device") + 1] == "cuda"


def test_kernels_count_sees_the_host_waits_and_counts_the_kernels(capsys):
    """``bench.kernels --count``: ours without validation waits for nothing, with validation it reads
    back (its memory check); torch.distributions' RelaxedOneHotCategorical reads back even without
    validation (it builds its Categorical with the global default, validation on); the floor
    launches fewer kernels than ours."""
    from bench import kernels

    results = kernels.main(["--count", "--distribution=Concrete"])
    capsys.readouterr()
    off = results[("Concrete", "ours, validation off")]
    assert off[2] == 0
    assert results[("Concrete", "ours, validation on")][2] > 0
    assert results[("Concrete", "torch.distributions, validation off")][2] > 0
    floor = results[("Concrete", "floor (same math)")]
    assert 0 < floor[0] < floor[1] <= off[1]
