"""Smoke tests of the example scripts (a few steps on the 8x8 digits, both PPLs, every example) and
of checkpoints: resuming, also after SIGTERM, gives the parameters of an uninterrupted run. Not
conformance tests: each example is written for one PPL."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPLS = ["pyro", "numpyro"]
FAST = ["--no-progress", "--steps", "12", "--eval-every", "6", "--checkpoint-every", "6"]


def _run(module, argv):
    example = __import__(f"examples.{module}", fromlist=["main"])
    return example.main(argv)


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize(
    "example, options, outputs",
    [
        ("dvae", ["--eval-samples", "5"], ["images.png"]),
        ("dvae", ["--eval-samples", "5", "--arity", "4", "--particles", "3", "--layers", "2"], ["images.png"]),
        ("dvae", ["--eval-samples", "5", "--estimator", "reinforce", "--arity", "8"], ["images.png"]),
        ("dvae", ["--eval-samples", "5", "--estimator", "reinforce", "--particles", "3", "--layers", "2"], ["images.png"]),
        ("structured", ["--eval-samples", "5"], ["completions.png"]),
        ("mixture", [], ["components.png"]),
        ("mixture", ["--training", "enumerate"], ["components.png"]),
    ],
    ids=["dvae", "dvae-4ary-m3-2layers", "dvae-reinforce-8ary", "dvae-vimco-m3-2layers", "structured", "mixture", "mixture-enumerate"],
)
def test_example_runs_and_writes_its_outputs(ppl, example, options, outputs, tmp_path):
    metrics = _run(f"{example}_{ppl}", FAST + options + ["--out", str(tmp_path)])
    for name in ["metrics.json", "learning_curve.png", "checkpoint.bin"] + outputs:
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["steps"] == 12 and written["backend"] == ppl
    value = written.get("test_nll", -written.get("test_log_likelihood", np.nan))
    assert np.isfinite(value) and value > 0
    assert metrics["steps"] == 12


def _parameters(ppl, out):
    """The parameters in a checkpoint, as a list of arrays."""
    with open(os.path.join(out, "checkpoint.bin"), "rb") as f:
        raw = f.read()
    if ppl == "pyro":
        import io

        import torch

        state = torch.load(io.BytesIO(raw), weights_only=False)["module"]
        return [state[k].numpy() for k in sorted(state)]
    return pickle.loads(raw)["state"]


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("example, options", [
    ("dvae", ["--eval-samples", "3"]),
    ("l0", ["--hidden", "16"]),
])
def test_resume_gives_the_uninterrupted_parameters(ppl, example, options, tmp_path):
    options = ["--no-progress", "--eval-every", "8", "--checkpoint-every", "8"] + options
    full, split = tmp_path / "full", tmp_path / "split"
    _run(f"{example}_{ppl}", options + ["--steps", "24", "--out", str(full)])
    _run(f"{example}_{ppl}", options + ["--steps", "16", "--out", str(split)])
    metrics = _run(f"{example}_{ppl}", options + ["--steps", "24", "--out", str(split), "--resume"])
    assert metrics["steps"] == 24
    for a, b in zip(_parameters(ppl, full), _parameters(ppl, split)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ppl", PPLS)
def test_sigterm_saves_and_resume_finishes_like_an_uninterrupted_run(ppl, tmp_path):
    """A run killed with SIGTERM writes a checkpoint before it exits (status 128 + 15); resuming
    it gives the parameters of a run that was never interrupted."""
    options = ["--no-progress", "--eval-every", "100000", "--eval-samples", "2", "--checkpoint-every", "400"]
    interrupted, reference = tmp_path / "interrupted", tmp_path / "reference"
    command = [sys.executable, "-m", f"examples.dvae_{ppl}", *options, "--steps", "100000", "--out", str(interrupted)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    checkpoint = interrupted / "checkpoint.bin"
    deadline = time.time() + 300
    while not checkpoint.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert checkpoint.exists(), process.communicate()[0].decode()[-2000:]
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=300)[0].decode()
    assert process.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert "continue with --resume" in output

    # the step it stopped at, then an uninterrupted run to the same step and a resumed one past it
    if ppl == "pyro":
        import torch

        stopped = torch.load(checkpoint, weights_only=False)["history"]["step"]
    else:
        stopped = pickle.loads(checkpoint.read_bytes())["history"]["step"]
    assert 400 <= stopped < 100000
    # as separate processes like the interrupted run: the suite's process runs JAX with float64 enabled
    target = stopped + 8
    for out, extra in [(reference, []), (interrupted, ["--resume"])]:
        finished = subprocess.run(
            command[:-4] + ["--steps", str(target), "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True)
        assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    for a, b in zip(_parameters(ppl, reference), _parameters(ppl, interrupted)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ppl", PPLS)
def test_missing_data_gives_a_clear_message(ppl, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _run(f"dvae_{ppl}", ["--no-progress", "--data-dir", str(tmp_path)])
    message = capsys.readouterr().err
    assert "train-images-idx3-ubyte" in message and "not found" in message and "Traceback" not in message


# ----------------------------------------------------------------------------- the L0 example (Hard Concrete gates)

L0_FAST = ["--no-progress", "--steps", "12", "--eval-every", "6", "--checkpoint-every", "6", "--hidden", "16"]


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("options", [[], ["--gate-inputs"]], ids=["hidden-gates", "input-gates"])
def test_l0_example_runs_and_writes_its_outputs(ppl, options, tmp_path):
    metrics = _run(f"l0_{ppl}", L0_FAST + options + ["--out", str(tmp_path)])
    for name in ["metrics.json", "learning_curve.png", "checkpoint.bin", "accuracy_vs_active_gates.png"]:
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["example"] == "l0" and written["backend"] == ppl and written["dataset"] == "digits"
    assert written["steps"] == metrics["steps"] == 12 and written["hidden"] == 16
    assert 0 <= written["test_accuracy"] <= 1
    active = written["active_gates"]
    assert isinstance(active, int) and 0 <= active <= 16
    assert 0 < written["expected_l0"] <= 16 + (64 if options else 0)
    curve = written["accuracy_vs_active"]
    assert [k for k, _ in curve] == list(range(1, 17)) and all(0 <= a <= 1 for _, a in curve)
    if active:  # keeping the open gates is the trained net itself (up to a rounding flip of one test image)
        assert abs(curve[active - 1][1] - written["test_accuracy"]) <= 1.5 / 360
    if options:
        assert 0 <= written["active_input_gates"] <= 64


@pytest.mark.parametrize("ppl", PPLS)
def test_l0_penalty_closes_the_gates(ppl):
    """The expected-L0 term alone drives the gates shut: with a large lambda, a few steps prune
    most units; without it, they stay open."""
    options = ["--no-progress", "--steps", "40", "--eval-every", "40", "--hidden", "16", "--lr", "0.1"]
    pruned = _run(f"l0_{ppl}", options + ["--l0", "10000"])
    kept = _run(f"l0_{ppl}", options + ["--l0", "0"])
    assert pruned["expected_l0"] < 0.2 * 16 and pruned["active_gates"] < 8
    assert kept["expected_l0"] > 0.5 * 16 and kept["active_gates"] >= 8
