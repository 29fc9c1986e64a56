"""Data-parallel training on the hosts' own engines: NumPyro's compiled SVI step sharded with
``jax.sharding`` over 4 simulated CPU devices, and Pyro under ``torch.distributed`` (DDP, gloo)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _simulated_devices_env(devices):
    env = dict(os.environ)
    # first: XLA stops reading flags at a token that is not one (the suite's worker flags hold one)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {env.get('XLA_FLAGS', '')}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_numpyro_sharded_svi_equals_one_device():
    """Five steps of the dVAE example's compiled step sharded over 4 devices (batch split, state
    replicated, the gradients all-reduced in the compiled program) give the one-device losses and
    parameters to float32 reassociation of the batch sums; a guide's Concrete sample at temperature
    0.01 (exact zeros in float32, which a value-based score refuses) is still scored from its carried
    log-space coordinates inside the sharded program; the test-time helper runs on sharded data.
    The same process (one JAX start with simulated devices) also runs tests/test_loops.py's check of
    ``numpyro_training.fit`` with a ``DataParallel`` over 2 of the devices, each gathering its half
    of every batch inside the blocks: the one-device run's losses and state, up to float32
    reassociation of the batch sums, the state replicated."""
    run = subprocess.run([sys.executable, "-m", "tests.data_parallel_numpyro", "5"], cwd=ROOT, env=_simulated_devices_env(4),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["devices"] == 4 and r["param_devices"] == 4 and r["param_replicated"]
    assert r["all_reduces"] >= 1  # the gradient reduction is in the compiled program
    np.testing.assert_allclose(r["losses_sharded"], r["losses_one"], rtol=2e-5)
    assert r["params_max_relative_difference"] < 1e-4
    # shard_map with the user's pmean: the baseline's and REBAR/RELAX's own parameters get each shard's
    # gradient averaged, as every other parameter (their inner derivative summed the shards': 4x, 16x)
    assert set(r["shard_map_max_relative_difference"]) == {"ScoreFunctionELBO", "REBAR", "RELAX"}
    assert max(r["shard_map_max_relative_difference"].values()) < 1e-4
    assert r["zeros_in_sample"] > 0 and np.isfinite(r["carried_sharded"])
    np.testing.assert_allclose(r["carried_sharded"], r["carried_one"], rtol=5e-5)
    assert r["helper_input_devices"] == 4 and -40 < r["helper_mean"] < -15
    assert r["helper_max_abs_difference"] < 1e-3 and r["helper_eager_max_abs_difference"] < 1e-3
    assert r["fit_devices"] == 2 and r["fit_replicated"] and len(r["fit_sharded"]) == 12
    np.testing.assert_allclose(r["fit_sharded"], r["fit_one"], rtol=1e-5)
    assert r["fit_max_difference"] < 1e-4


def _torchrun(tmp_path, *runs):
    """The runs (each a list of arguments) one after another in one torchrun start: (rank 0's JSON
    line, [rank 0's writes, rank 1's writes]) of each."""
    argv = []
    for i, run in enumerate(runs):
        argv += (["+"] if i else []) + [str(tmp_path / f"writes-{i}-{{rank}}.json"), *run]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "tests.data_parallel_pyro", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(runs), run.stdout[-4000:]
    return [(line, [json.loads((tmp_path / f"writes-{i}-{rank}.json").read_text()) for rank in (0, 1)])
            for i, line in enumerate(lines)]


def test_pyro_ddp_equals_one_process_and_resumes(tmp_path):
    """The Pyro dVAE example under torchrun, 2 gloo processes (DDP): after 6 steps its parameters
    equal those of one process taking the same 6 steps on the whole batches (each slice with the
    noise its rank drew) -- the all-reduced, rescaled gradient is the whole batch's; only rank 0
    writes checkpoints and results; 4 steps, then --resume to 6, give the uninterrupted run. (The
    three runs in one torchrun start, each joining and leaving the process group as a run does.)"""
    (first, writes), (resumed, resumed_writes), (whole, whole_writes) = _torchrun(
        tmp_path,
        ["-", "--steps", "4", "--checkpoint-every", "2", "--out", str(tmp_path / "i")],
        ["-", "--steps", "6", "--resume", "--out", str(tmp_path / "i")],
        ["reference", "--steps", "6", "--out", str(tmp_path / "u")],
    )
    assert writes[1] == [] and writes[0].count("checkpoint.bin") == 3 and "metrics.json" in writes[0]
    assert resumed_writes[1] == [] and "checkpoint.bin" in resumed_writes[0]
    assert whole_writes[1] == [] and first["devices"] == resumed["devices"] == whole["devices"] == 2
    assert resumed["final_train_loss"] == whole["final_train_loss"] and resumed["validation"][-1] == whole["validation"][-1]
    assert whole["moved_from_init"] > 0.1  # the comparison below is not of two initial states
    assert whole["max_relative_difference_to_one_process"] < 1e-6  # 0 here; dropping the rescaling gives 3e-5


def test_distributed_runs_refuse_what_they_cannot_do(monkeypatch, capsys):
    """Under torchrun, an estimator whose gradient DDP cannot all-reduce, or a batch that does not
    split over the processes, is one error line (exit status 2) before any process group starts;
    so in NumPyro are more --devices than JAX sees, or a batch that does not split over them."""
    from examples import dvae_numpyro, dvae_pyro, numpyro_training

    monkeypatch.setenv("WORLD_SIZE", "2")
    for argv, says in [(["--estimator", "rebar"], "--estimator rebar (with --particles 1) does not run under torchrun"),
                       (["--estimator", "reinforce"], "--estimator reinforce (with --particles 1) does not run under torchrun"),
                       (["--batch-size", "63"], "--batch-size 63 does not split evenly over 2 processes")]:
        with pytest.raises(SystemExit) as stopped:
            dvae_pyro.main(["--no-progress", "--steps", "1", *argv])
        assert stopped.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        dvae_numpyro.parse_args(["--devices", "3"])
    assert stopped.value.code == 2 and "--batch-size 64 does not split evenly over --devices 3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        numpyro_training.DataParallel(64)
    assert stopped.value.code == 2 and "--devices 64: JAX sees" in capsys.readouterr().err
