"""Smoke tests of the example scripts (a few steps on the 8x8 digits, both PPLs, every example) and
of checkpoints: resuming, also after SIGTERM, gives the parameters of an uninterrupted run. Not
conformance tests: each example is written for one PPL."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.backends import enable_x64

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPLS = ["pyro", "numpyro"]
FAST = ["--no-progress", "--steps", "12", "--eval-every", "6", "--checkpoint-every", "6"]
SMALL = ["--latent-units", "24", "--conditioning", "linear"]


def _run(module, argv):
    example = __import__(f"examples.{module}", fromlist=["main"])
    return example.main(argv)


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize(
    "example, options, outputs",
    [
        ("dvae", ["--eval-samples", "5", "--arity", "4", "--particles", "3", "--layers", "2"], ["images.png"]),
        # VIMCO on small linear networks (a nonlinear one runs above, 2 layers; REINFORCE, 8-ary, in the resume test)
        ("dvae", ["--eval-samples", "5", "--estimator", "reinforce", "--particles", "3", "--layers", "2", *SMALL], ["images.png"]),
        ("structured", ["--eval-samples", "5"], ["completions.png"]),
        ("mixture", [], ["components.png"]),
        ("mixture", ["--training", "enumerate"], ["components.png"]),
        # the tutorial shapes: continuous and discrete latents; a markov chain (relaxed training; both
        # evaluate the discrete graph exactly)
        ("gmm", [], ["clusters.png"]),
        ("hmm", ["--states", "4"], ["viterbi.png"]),
    ],
    ids=["dvae-4ary-m3-2layers", "dvae-vimco-m3-2layers", "structured", "mixture", "mixture-enumerate", "gmm", "hmm"],
)
def test_example_runs_and_writes_its_outputs(ppl, example, options, outputs, tmp_path):
    """(The binary discrete VAE runs in tiny_run and the SIGTERM test, the 8-ary one with REINFORCE
    in the resume test, on small linear networks; the nonlinear networks run here in the 4-ary one.)"""
    metrics = _run(f"{example}_{ppl}", FAST + options + ["--out", str(tmp_path)])
    for name in ["metrics.json", "learning_curve.png", "checkpoint.bin"] + outputs:
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["steps"] == 12 and written["backend"] == ppl
    value = written.get("test_nll", -written.get("test_log_likelihood", written.get("log_likelihood", np.nan)))
    assert np.isfinite(value) and value > 0
    assert metrics["steps"] == 12
    if example == "gmm":  # 150 flowers, 3 species
        assert 1 / 3 <= written["accuracy"] <= 1 and -1 <= written["ari"] <= 1
    if example == "hmm":
        assert 0 <= written["viterbi_pixel_accuracy"] <= 1 and 1 <= written["states_used"] <= 4


def _parameters(ppl, out):
    """The parameters in a checkpoint, as a list of arrays."""
    with open(os.path.join(out, "checkpoint.bin"), "rb") as f:
        raw = f.read()
    if ppl == "pyro":
        import io

        import torch

        state = torch.load(io.BytesIO(raw), weights_only=False, map_location="cpu")["module"]  # a GPU run's too
        return [state[k].numpy() for k in sorted(state)]
    return pickle.loads(raw)["state"]


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("example, options", [
    # REINFORCE: its learned baseline is part of what a checkpoint must restore
    ("dvae", ["--eval-samples", "3", "--estimator", "reinforce", "--arity", "8", *SMALL]),
    ("l0", ["--hidden", "16"]),
    # RELAX: its own parameters (eta, the temperature scale, the control variate's network) live in
    # Pyro's param store, not the module; a resumed Pyro run restarted them at their initial values
    ("dvae", ["--eval-samples", "3", "--estimator", "relax", *SMALL]),
])
def test_resume_gives_the_uninterrupted_parameters(ppl, example, options, tmp_path):
    options = ["--no-progress", "--eval-every", "8", "--checkpoint-every", "8"] + options
    full, split = tmp_path / "full", tmp_path / "split"
    _run(f"{example}_{ppl}", options + ["--steps", "24", "--out", str(full)])
    _run(f"{example}_{ppl}", options + ["--steps", "16", "--out", str(split)])
    metrics = _run(f"{example}_{ppl}", options + ["--steps", "24", "--out", str(split), "--resume"])
    assert metrics["steps"] == 24
    for out in (full, split):
        written = json.loads((out / "metrics.json").read_text())
        assert written["steps"] == 24 and written["backend"] == ppl
        value = written.get("test_nll", -written.get("test_accuracy", np.nan))
        assert np.isfinite(value) and (value > 0 if example == "dvae" else -1 <= value <= 0)
    for a, b in zip(_parameters(ppl, full), _parameters(ppl, split)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ppl", PPLS)
def test_sigterm_saves_and_resume_finishes_like_an_uninterrupted_run(ppl, tmp_path):
    """A run killed with SIGTERM writes a checkpoint before it exits (status 128 + 15); resuming
    it gives the parameters of a run that was never interrupted. (The smallest discrete VAE. The
    killed run is a process of its own; the uninterrupted and the resumed runs run in this one, with
    JAX in float32 as there: the same arithmetic, bit for bit, without two more interpreters.)"""
    options = TINY + ["--eval-every", "100000", "--checkpoint-every", "20"]
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
    assert 20 <= stopped < 100000
    target = stopped + 8
    with enable_x64(False):  # the suite's process runs JAX with float64 enabled; the killed run did not
        for out, extra in [(reference, []), (interrupted, ["--resume"])]:
            assert _run(f"dvae_{ppl}", options + ["--steps", str(target), "--out", str(out), *extra])["steps"] == target
    for a, b in zip(_parameters(ppl, reference), _parameters(ppl, interrupted)):
        np.testing.assert_array_equal(a, b)


def test_the_numpyro_examples_import_no_torch():
    """A NumPyro user need not have torch: every NumPyro example and its training loop import with
    torch made unimportable (the loop once took its History from the Pyro loop, which imports torch;
    ``make compat``'s torch-less newest-jax environment runs them whole)."""
    modules = ["examples.numpyro_training"] + [f"examples.{name}_numpyro" for name in ("dvae", "structured", "mixture", "l0", "gmm", "hmm")]
    block = ("import sys\n"
             "class NoTorch:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'torch':\n"
             "            raise ImportError('torch is not installed (blocked by the test)')\n"
             "sys.meta_path.insert(0, NoTorch())\n")
    script = block + "".join(f"import {m}\n" for m in modules) + "assert 'torch' not in sys.modules\nprint('ok')"
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


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


# ----------------------------------------------------------------------------- trust at the edges: --resume, --out, file modes

# the cheapest discrete VAE (8 latent units, linear networks, a 1-sample test bound); tiny_run trains it one step
TINY = ["--no-progress", "--latent-units", "8", "--conditioning", "linear", "--eval-samples", "1"]
SCRIPTS = [f"{example}_{ppl}" for example in ("dvae", "structured", "mixture", "l0", "gmm", "hmm") for ppl in PPLS]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """``tiny_run(ppl)``: the --out directory of a one-step discrete VAE run (made once per module),
    written under umask 027, so that its files' mode shows whether they follow the umask."""
    made = {}

    def make(ppl):
        if ppl not in made:
            out = tmp_path_factory.mktemp(f"tiny-{ppl}")
            previous = os.umask(0o027)
            try:
                _run(f"dvae_{ppl}", TINY + ["--steps", "1", "--eval-every", "1", "--out", str(out)])
            finally:
                os.umask(previous)
            made[ppl] = out
        return made[ppl]

    return make


def _error_line(stderr):
    """The one 'error:' line of a failed run's stderr (other lines, library warnings, are allowed)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("ppl", PPLS)
def test_resume_with_other_shape_options_refuses_naming_them(ppl, tiny_run, tmp_path, capsys):
    """--resume with another --latent-units or --layers (another model) or --lr: one line naming
    each with both values, exit status 2, no traceback, nothing trained or written; the options
    that may change (training.RESUME_MAY_CHANGE: --steps, --eval-every, ...) are not named."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run(ppl), out)
    checkpoint = (out / "checkpoint.bin").read_bytes()
    metrics = (out / "metrics.json").read_bytes()
    may_change = ["--steps", "2", "--eval-every", "2", "--eval-samples", "2", "--checkpoint-every", "5", "--out", str(out), "--resume"]
    changed = ["--no-progress", "--conditioning", "linear", "--latent-units", "16", "--layers", "2", "--lr", "0.5"]
    with pytest.raises(SystemExit) as stopped:
        _run(f"dvae_{ppl}", [*changed, *may_change])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    assert str(out / "checkpoint.bin") in line
    assert "--latent-units: checkpoint 8, now 16" in line
    assert "--layers: checkpoint 1, now 2" in line
    assert "--lr: checkpoint 0.001, now 0.5" in line
    for same_or_may_change in ["--conditioning", "--steps", "--eval-every", "--eval-samples", "--checkpoint-every",
                               "--no-progress", "--out", "--resume"]:
        assert f"{same_or_may_change}:" not in line
    assert (out / "checkpoint.bin").read_bytes() == checkpoint and (out / "metrics.json").read_bytes() == metrics


def test_resume_accepts_the_options_that_may_change(capsys):
    """training.RESUME_MAY_CHANGE, one place for both PPLs: changing only those passes the check;
    any other option, also one the checkpoint lacks or has beyond this run's, is named."""
    from examples import dvae_numpyro, training

    saved = vars(dvae_numpyro.parse_args(["--steps", "10"]))
    may_change = dict(steps=20, resume=True, no_progress=True, device="cpu", devices=2, no_jit=True, compile="default",
                      out="elsewhere", checkpoint_every=7, eval_every=3, eval_samples=5)
    assert set(may_change) == training.RESUME_MAY_CHANGE
    training.check_resume_options("ckpt", saved, {**saved, **may_change})
    for current, named in [({**saved, "seed": 1}, "--seed: checkpoint 0, now 1"),
                           ({**saved, "dataset": "fashion-mnist"}, "--dataset: checkpoint 'digits', now 'fashion-mnist'"),
                           ({**saved, "extra": 1}, "--extra: checkpoint (no such option), now 1"),
                           ({k: v for k, v in saved.items() if k != "arity"}, "--arity: checkpoint 2, now (no such option)")]:
        with pytest.raises(SystemExit) as stopped:
            training.check_resume_options("ckpt", saved, current)
        assert stopped.value.code == 2
        line = _error_line(capsys.readouterr().err)
        assert named in line and line.count(": checkpoint ") == 1


@pytest.mark.parametrize("script", ["dvae", "structured", "mixture", "l0", "hmm"])
@pytest.mark.parametrize("ppl", PPLS)
def test_a_batch_larger_than_the_training_set_gives_one_line(ppl, script, tmp_path, capsys):
    """--batch-size 5000 on the 8x8 digits (1257 training images, or fewer): one line naming the
    option, exit status 2, where it was a traceback from the batches' constructor."""
    with pytest.raises(SystemExit) as stopped:
        _run(f"{script}_{ppl}", ["--no-progress", "--steps", "2", "--batch-size", "5000", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith("error: --batch-size: batch size 5000 exceeds the") and "training examples" in line, line


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_damaged_checkpoint_gives_one_line_naming_it(ppl, damage, tiny_run, tmp_path, capsys):
    raw = (tiny_run(ppl) / "checkpoint.bin").read_bytes()
    damaged = raw[: len(raw) // 2] if damage == "truncated" else b""
    (tmp_path / "checkpoint.bin").write_bytes(damaged)
    with pytest.raises(SystemExit) as stopped:
        _run(f"dvae_{ppl}", TINY + ["--steps", "2", "--out", str(tmp_path), "--resume"])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    assert f"checkpoint {tmp_path / 'checkpoint.bin'} is damaged or truncated" in line and "delete it" in line
    assert (tmp_path / "checkpoint.bin").read_bytes() == damaged  # left for the user to restore


@pytest.mark.parametrize("ppl", PPLS)
def test_checkpoint_without_saved_options_is_refused(ppl, tiny_run, tmp_path, capsys):
    """The documented policy for a checkpoint without its options (no version of the examples wrote
    one): one line, not a resume that cannot be checked."""
    raw = (tiny_run(ppl) / "checkpoint.bin").read_bytes()
    if ppl == "pyro":
        import io

        import torch

        saved = torch.load(io.BytesIO(raw), weights_only=False)
        del saved["args"]
        torch.save(saved, tmp_path / "checkpoint.bin")
    else:
        saved = pickle.loads(raw)
        del saved["args"]
        (tmp_path / "checkpoint.bin").write_bytes(pickle.dumps(saved))
    with pytest.raises(SystemExit) as stopped:
        _run(f"dvae_{ppl}", TINY + ["--steps", "2", "--out", str(tmp_path), "--resume"])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    assert "has no saved options" in line and str(tmp_path / "checkpoint.bin") in line


@pytest.mark.parametrize("saved_by", ["pyro.optim", "other parameters", "states out of order"])
def test_pyro_checkpoint_of_another_optimizer_is_refused(saved_by, tiny_run, tmp_path, capsys):
    """``torch.optim`` loads a state by position without checking shapes (a state of another
    shape then reads past its parameter): a checkpoint whose optimizer state was saved by
    pyro.optim (before ``pyro_training.Step``: one optimizer per parameter name), for other
    parameters, or in another order is refused in one line, not loaded."""
    import io

    import torch

    saved = torch.load(io.BytesIO((tiny_run("pyro") / "checkpoint.bin").read_bytes()), weights_only=False)
    assert set(saved["optim"]) == {"names", "optimizer"}  # what Step saves: a torch.optim state and its parameters
    assert saved["optim"]["names"] == sorted(f"dvae$$${name}" for name in saved["module"])
    if saved_by == "pyro.optim":
        saved["optim"] = {name: {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]} for name in saved["optim"]["names"]}
        expected = "pyro.optim"
    elif saved_by == "other parameters":
        saved["optim"]["names"][0] = "dvae$$$another"
        expected = "its optimizer is over the parameters ['dvae$$$another'"
    else:
        state = saved["optim"]["optimizer"]["state"]
        state[0], state[1] = state[1], state[0]
        expected = "its optimizer state exp_avg of dvae$$$decoder.0.bias has shape (64, 8), the parameter (64,)"
    torch.save(saved, tmp_path / "checkpoint.bin")
    with pytest.raises(SystemExit) as stopped:
        _run("dvae_pyro", TINY + ["--steps", "2", "--out", str(tmp_path), "--resume"])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    assert str(tmp_path / "checkpoint.bin") in line and expected in line, line


def test_pyro_checkpoint_whose_optimizer_never_stepped_a_parameter_resumes(tiny_run, tmp_path):
    """torch.optim keeps no state for a parameter it never stepped: the states are keyed by
    position, and the others are still checked against their own parameters (not shifted by one)."""
    import io

    import torch

    saved = torch.load(io.BytesIO((tiny_run("pyro") / "checkpoint.bin").read_bytes()), weights_only=False)
    del saved["optim"]["optimizer"]["state"][0]
    torch.save(saved, tmp_path / "checkpoint.bin")
    metrics = _run("dvae_pyro", TINY + ["--steps", "2", "--out", str(tmp_path), "--resume"])
    assert metrics["steps"] == 2


@pytest.mark.parametrize("estimator, jit", [("concrete", True), ("concrete", False), ("reinforce", False), ("rebar", False)])
def test_pyro_step_computes_the_update_of_svi_step(estimator, jit):
    """``pyro_training.Step`` (the examples' step: the loss writes the gradients, one torch
    optimizer) gives the parameters ``SVI.step`` with ``pyro.optim.Adam`` gives, bitwise, on the
    discrete VAE's losses: also the loss's own parameters (REBAR's) and a learned baseline
    (REINFORCE). Adam is elementwise, so one optimizer over all parameters is the same update as
    one per parameter."""
    import pyro
    import torch

    from examples import data, dvae_pyro, pyro_training

    dataset = data.load("digits")
    batches = torch.bernoulli(torch.as_tensor(dataset.train[:48]), generator=torch.Generator().manual_seed(0)).split(16)

    def run(native):
        pyro.clear_param_store()
        torch.manual_seed(0)
        vae = dvae_pyro.DiscreteVAE(dataset.dim, [dvae_pyro.NodeLayer(8, 2)], False, (0.5, 2 / 3),
                                    torch.full((dataset.dim,), 0.3), estimator == "reinforce")
        step = dvae_pyro.make_step(vae, pyro_training.adam(0.05), estimator, jit=jit)
        torch.manual_seed(1)
        if native:
            with pytest.raises(RuntimeError, match="Step.init"):
                step(batches[0])
            step.init(batches[0])
            update = step
        else:
            svi = pyro.infer.SVI(step.model, step.guide, pyro.optim.Adam({"lr": 0.05}), step.loss)
            svi.loss_and_grads(svi.model, svi.guide, batches[0])  # the first call, as fit makes it
            for value in pyro.get_param_store().values():
                value.unconstrained().grad = None
            update = svi.step
        initial = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
        losses = []
        for i in range(6):
            torch.manual_seed(100 + i)
            losses.append(update(batches[i % 3]))
        return losses, {name: value.detach().clone() for name, value in pyro.get_param_store().items()}, initial

    losses, params, initial = run(native=True)
    svi_losses, svi_params, _ = run(native=False)
    assert losses == svi_losses
    assert params.keys() == svi_params.keys() and len(params) >= 5
    if estimator == "rebar":
        assert any(name.endswith(".eta") for name in params)
    for name, value in params.items():
        assert torch.equal(value, svi_params[name]), name
        assert not torch.equal(value, initial[name]), f"{name} did not move"
    pyro.clear_param_store()


@pytest.mark.parametrize("script", SCRIPTS)
def test_out_that_is_a_file_fails_before_training(script, tmp_path, capsys, monkeypatch):
    """--out an existing regular file, or below one: one line before any data, model or step
    (the loops are replaced by ones that fail the test), not an error at the first checkpoint."""

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    for loop in _training_loops(script):
        monkeypatch.setattr(loop, "fit", no_training)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    for out, expected in [(blocker, "is not a directory"), (blocker / "run", "is not a writable directory")]:
        with pytest.raises(SystemExit) as stopped:
            _run(script, ["--no-progress", "--steps", "2", "--checkpoint-every", "1000", "--out", str(out)])
        assert stopped.value.code == 2
        line = _error_line(capsys.readouterr().err)
        assert f"--out {out} {expected}" in line
    assert blocker.read_text() == "not a directory\n"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes through permission bits")
def test_out_without_write_permission_fails_before_training(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(SystemExit) as stopped:
            _run("dvae_numpyro", ["--no-progress", "--steps", "2", "--out", str(locked)])
    finally:
        locked.chmod(0o700)
    assert stopped.value.code == 2
    assert f"--out {locked} is not a writable directory" in _error_line(capsys.readouterr().err)


@pytest.mark.parametrize("ppl", PPLS)
def test_checkpoint_and_metrics_get_the_mode_of_other_outputs(ppl, tiny_run):
    """0666 & ~umask (run under umask 027: 0640), like the plots, not mkstemp's 0600."""
    out = tiny_run(ppl)
    for name in ["checkpoint.bin", "metrics.json", "learning_curve.png", "images.png"]:
        assert oct((out / name).stat().st_mode & 0o777) == oct(0o666 & ~0o027), name


def test_atomic_write_follows_the_umask(tmp_path):
    from examples import training

    previous = os.umask(0o002)
    try:
        training.atomic_write(str(tmp_path / "new" / "file.bin"), b"data")
        training.write_metrics(str(tmp_path), {"a": 1})
    finally:
        os.umask(previous)
    assert (tmp_path / "new" / "file.bin").read_bytes() == b"data"
    assert oct((tmp_path / "new" / "file.bin").stat().st_mode & 0o777) == oct(0o664)
    assert oct((tmp_path / "metrics.json").stat().st_mode & 0o777) == oct(0o664)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


# ----------------------------------------------------------------------------- no lost run, no silent wrong run: --out, --resume, option values

EXAMPLES = ("dvae", "structured", "mixture", "l0", "gmm", "hmm")


@pytest.fixture
def no_training(monkeypatch):
    """Both training loops (the NumPyro one alone where torch is not installed) replaced by ones
    that fail the test: what is checked must fail before."""

    def fit(*args, **kwargs):
        raise AssertionError("training started")

    for loop in _training_loops():
        monkeypatch.setattr(loop, "fit", fit)


def _training_loops(script=""):
    """The examples' training loop modules: ``script``'s PPL's, or both (NumPyro's alone without torch:
    a NumPyro user's environment, make compat's newest-jax)."""
    import importlib

    names = [f"examples.{ppl}_training" for ppl in ("pyro", "numpyro") if not script or script.endswith(f"_{ppl}")]
    loops = []
    for name in names:
        try:
            loops.append(importlib.import_module(name))
        except ImportError:  # torch absent
            if script:
                raise
    return loops


def _tree(directory):
    """Every file under ``directory`` (relative path -> bytes), and every directory (-> None)."""
    tree = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            tree[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                tree[os.path.relpath(path, directory)] = f.read()
    return tree


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("holds", ["checkpoint", "metrics-only"])
def test_new_run_into_an_out_with_a_run_refuses_before_overwriting_it(script, holds, no_training, tmp_path, capsys):
    """Without --resume, an --out that holds a checkpoint (an interrupted or finished run) or a
    finished run's metrics.json is refused with one line naming the file and the ways forward,
    before data, model or step; nothing in it changes."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"steps": 5}\n')
    if holds == "checkpoint":
        (out / "checkpoint.bin").write_bytes(b"a previous run's checkpoint\n")
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        _run(script, ["--no-progress", "--steps", "2", "--out", str(out)])
    assert stopped.value.code == 2
    line = _error_line(capsys.readouterr().err)
    named = out / ("checkpoint.bin" if holds == "checkpoint" else "metrics.json")
    assert f"--out {out} already holds" in line and str(named) in line and "would overwrite" in line
    assert "another --out" in line and f"delete {out}" in line
    assert ("continue that run with --resume" in line) == (holds == "checkpoint")
    assert _tree(tmp_path) == before


def test_results_runs_resume_or_start_where_the_check_allows(tmp_path, monkeypatch):
    """examples.results: a run with a checkpoint gets --resume, one with a metrics.json is skipped,
    a new one starts without --resume into an --out that the refusal lets through."""
    from examples import results, training

    commands = []
    monkeypatch.setattr(results.subprocess, "run", lambda cmd, **kwargs: commands.append(cmd))
    names = list(results.RUNS)[:3]
    (tmp_path / names[0]).mkdir()
    (tmp_path / names[0] / "checkpoint.bin").write_bytes(b"interrupted")
    (tmp_path / names[1]).mkdir()
    (tmp_path / names[1] / "checkpoint.bin").write_bytes(b"finished")
    (tmp_path / names[1] / "metrics.json").write_text("{}")
    results.run(None, str(tmp_path))
    outs = {cmd[cmd.index("--out") + 1]: cmd for cmd in commands}
    assert str(tmp_path / names[1]) not in outs and len(outs) == len(results.RUNS) - 1
    assert outs[str(tmp_path / names[0])][-1] == "--resume"
    for out, cmd in outs.items():
        if out != str(tmp_path / names[0]):
            assert "--resume" not in cmd
            training.check_new_out(out)  # would fail (SystemExit) if the run were refused


# every option that counts something (>= 1) or is a rate or temperature (finite, > 0), per example
COUNTS = ["--steps", "--batch-size", "--checkpoint-every", "--eval-every"]
OWN_COUNTS = {"dvae": ["--particles", "--eval-samples", "--latent-units"], "structured": ["--particles", "--eval-samples", "--latent-units"],
              "mixture": ["--components"], "l0": ["--hidden"], "gmm": ["--components"], "hmm": ["--states"]}
RATES = {"dvae": ["--lr", "--prior-temperature", "--posterior-temperature"], "structured": ["--lr", "--temperature"],
         "mixture": ["--lr", "--prior-temperature", "--posterior-temperature"], "l0": ["--lr", "--temperature"],
         "gmm": ["--lr", "--prior-temperature", "--posterior-temperature"], "hmm": ["--lr", "--prior-temperature", "--posterior-temperature"]}
# values a count or a penalty of one example cannot take: one category (the run failed in training,
# a Concrete site needs two), a negative penalty (it rewarded open gates)
OWN_BOUNDS = {"mixture": [("--components", "1")], "gmm": [("--components", "1")], "hmm": [("--states", "1")],
              "l0": [("--l0", "-5"), ("--l0", "nan")]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_counts_and_rates_are_one_line_argparse_errors(script, no_training, tmp_path, capsys):
    """--checkpoint-every 0 (a ZeroDivisionError at the first step before), --steps -1, --lr nan, ...:
    argparse's one line naming the option and the value, exit status 2, before anything is created."""
    example = script.rsplit("_", 1)[0]
    out = tmp_path / "new"
    cases = [(option, value) for option in COUNTS + OWN_COUNTS[example] for value in ["0", "-1", "2.5", "x"]]
    cases += [(option, value) for option in RATES[example] for value in ["0", "-0.1", "nan", "inf", "-inf", "x"]]
    cases += OWN_BOUNDS.get(example, []) + [("--seed", "-1"), ("--seed", "x")]
    cases += [("--device", value) for value in ["foo", "cpu:0", "cuda:x", "tpu"]]  # a torch or JAX traceback later before
    for option, value in cases:
        with pytest.raises(SystemExit) as stopped:
            _run(script, ["--no-progress", "--out", str(out), f"{option}={value}"])
        assert stopped.value.code == 2, (option, value)
        stderr = capsys.readouterr().err
        assert "Traceback" not in stderr
        errors = [line for line in stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1 and f"error: argument {option}: " in errors[0] and value in errors[0], (option, value, stderr)
    assert not out.exists()


@pytest.mark.parametrize("ppl", PPLS)
def test_gmm_refuses_more_components_than_flowers(ppl, no_training, capsys):
    """Each component starts at a flower of its own: --components 200 of 150 flowers was NumPy's
    "Cannot take a larger sample than population" traceback."""
    with pytest.raises(SystemExit) as stopped:
        _run(f"gmm_{ppl}", ["--no-progress", "--components", "200"])
    assert stopped.value.code == 2
    assert _error_line(capsys.readouterr().err) == "error: --components 200: the data have 150 flowers, each starts at one of them"


def test_device_names_are_normalized():
    """--device gpu is cuda (the help says so; torch.device("gpu") raised before), in any case."""
    from examples import training

    assert [training.device_name(name) for name in ["cpu", "CPU", "cuda", "gpu", "GPU:1", "cuda:0"]] == \
        ["cpu", "cpu", "cuda", "cuda", "cuda:1", "cuda:0"]


@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_pyro_device_torch_cannot_use_is_one_line(device, capsys):
    """--device cuda on a machine without one (or cuda:7 beyond its GPUs): one line naming it, before
    the data are loaded, not torch's traceback at the first tensor moved there."""
    torch = pytest.importorskip("torch")
    from examples import pyro_training

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count > (7 if device == "cuda:7" else 0):
        pytest.skip(f"torch sees {count} CUDA devices")
    with pytest.raises(SystemExit) as stopped:
        pyro_training.torch_device(device)
    assert stopped.value.code == 2
    assert _error_line(capsys.readouterr().err).startswith(f"error: --device {device}: torch sees ")


@pytest.mark.parametrize("device, message", [("cuda", "--device cuda: JAX cannot start its cuda backend ("),
                                             ("cuda:1", "--device cuda:1: JAX chooses GPUs by CUDA_VISIBLE_DEVICES")])
def test_numpyro_device_jax_cannot_use_is_one_line(device, message):
    """The NumPyro scripts choose JAX's platform before importing JAX (a new process): --device cuda
    where JAX has no GPU, or a GPU index, is one line and exit status 2, not a traceback."""
    import jax

    if device == "cuda" and jax.default_backend() != "cpu":
        pytest.skip("JAX has a GPU here")
    run = subprocess.run([sys.executable, "-m", "examples.gmm_numpyro", "--no-progress", "--steps", "1", "--device", device],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert _error_line(run.stderr).startswith(f"error: {message}"), run.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_failed_resume_creates_no_directory(script, no_training, tmp_path, capsys):
    """--resume into an --out that does not exist: one line, and no --out (nor parent) made; into an
    existing empty one: one line, and it stays empty."""
    missing = tmp_path / "new" / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in [missing, empty]:
        with pytest.raises(SystemExit) as stopped:
            _run(script, ["--no-progress", "--steps", "2", "--out", str(out), "--resume"])
        assert stopped.value.code == 2
        line = _error_line(capsys.readouterr().err)
        assert f"--resume needs a checkpoint in --out: there is no {out / 'checkpoint.bin'}" in line
    assert sorted(os.listdir(tmp_path)) == ["empty"] and os.listdir(empty) == []


def test_results_compare_prints_each_rerun_beside_its_committed_result(tmp_path, capsys):
    """examples.results compare: a rerun (here a committed result with its test NLL moved by +0.25
    and its last validation -L_1 by -1.5) is printed beside the committed one, with the differences;
    runs without a committed result, or outside --only, are left out."""
    import json

    from examples import results

    name = "digits-dvae-numpyro-2ary-m1"
    committed = json.load(open(os.path.join(results.RESULTS, f"{name}.json")))
    rerun = dict(committed, test_nll=committed["test_nll"] + 0.25,
                 validation=committed["validation"][:-1] + [[20000, committed["validation"][-1][1] - 1.5]])
    for run_name, metrics in ((name, rerun), ("not-a-committed-run", rerun), ("digits-dvae-pyro-2ary-m1", committed)):
        (tmp_path / run_name).mkdir()
        (tmp_path / run_name / "metrics.json").write_text(json.dumps(metrics))
    results.compare("numpyro", str(tmp_path), results.RESULTS)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(f"| {name} ")]
    assert len(lines) == 1 and "not-a-committed-run" not in out and "| digits-dvae-pyro-2ary-m1 " not in out
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[1:4] == [f"{committed['test_nll']:.3f}", f"{committed['test_nll'] + 0.25:.3f}", "+0.250"]
    assert cells[6] == "-1.50"


# ----------------------------------------------------------------------------- the discrete graph's estimators (issue 15)


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("estimator, arity", [("rebar", 4), ("relax", 2), ("gumbel-rao", 2), ("disarm", 2)])
def test_dvae_trains_the_discrete_graph_with_each_estimator(ppl, estimator, arity, tmp_path):
    """--estimator rebar | relax | gumbel-rao | disarm: the relaxed model and guide, the discrete
    graph's ELBO; the control variate's parameters are saved with the others (resumable)."""
    metrics = _run(f"dvae_{ppl}", TINY + ["--steps", "6", "--eval-every", "6", "--checkpoint-every", "6", "--arity", str(arity),
                                          "--estimator", estimator, "--out", str(tmp_path)])
    assert metrics["estimator"] == estimator and metrics["steps"] == 6 and np.isfinite(metrics["test_nll"])
    assert (tmp_path / "checkpoint.bin").stat().st_size > 0


@pytest.mark.parametrize("ppl", PPLS)
@pytest.mark.parametrize("options, message", [
    (["--estimator", "rebar", "--particles", "2"], "--estimator rebar trains the single-sample ELBO: use --particles 1 (got 2)"),
    (["--estimator", "disarm", "--arity", "4"], "--estimator disarm is for binary nodes: use --arity 2 (got 4)"),
    (["--estimator", "relax", "--layers", "2"], "--estimator relax needs one stochastic layer: use --layers 1 (got 2)"),
])
def test_dvae_refuses_estimator_options_it_cannot_honour(ppl, options, message, no_training, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        _run(f"dvae_{ppl}", [*options, "--out", str(tmp_path / "out")])
    assert stopped.value.code == 2 and _error_line(capsys.readouterr().err) == f"error: {message}"


def test_results_tables_hold_every_committed_run():
    """``examples.results.tables`` (printed by ``python -m examples.results table``, rendered on the
    docs' example pages): every committed run is in exactly one row (or one seed of a row), with the
    numbers of its metrics.json."""
    from examples import results

    committed = results._load(results.RESULTS)
    tables = {t.key: t for t in results.tables(committed)}
    assert all(len(row) == len(t.header) for t in tables.values() for row in t.rows)
    one_per_run = sum(len(tables[key].rows) for key in ("dvae_digits", "dvae_fmnist", "structured", "hmm", "l0"))
    seeds = sum(int(row[-1]) for key in ("mixture", "gmm") for row in tables[key].rows)
    assert one_per_run + seeds == len(committed) == len(results.RUNS)
    m = committed["fmnist-dvae-pyro-binary-m5"]
    assert ["pyro", "2-ary", "Concrete, L_5", "100k", f"{m['test_nll']:.2f}"] in [row[:5] for row in tables["dvae_fmnist"].rows]
