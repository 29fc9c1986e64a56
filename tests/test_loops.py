"""The examples' training loops (issue 30): batches chosen on the device from each epoch's
permutation, made once, are exactly those of ``data.batch_indices``; NumPyro's blocks of steps (one
compiled ``lax.scan`` each) and Pyro's per-step seeding compute, bit for bit on the CPU, what the
loops computed one call at a time; a run stopped by a signal and resumed off the blocks' boundaries
ends as an uninterrupted one; ``bench.loop`` runs. (tests/test_examples.py runs the examples
themselves: their outputs, resumed runs, SIGTERM.)"""

import math
import os
import signal

import numpy as np
import pytest

from examples import data
from tests.backends import enable_x64
from tests.helpers import loop_args, numpyro_dvae

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

# 100 examples in batches of 32: 3 steps an epoch (4 examples left out of each), so that 11 steps
# cross three epoch boundaries
NUM, BATCH, SEED, STEPS = 100, 32, 5, 11


def _args(**options):
    return loop_args(**{"steps": STEPS, "batch_size": BATCH, "seed": SEED, **options})


def _expected(step):
    return data.batch_indices(NUM, BATCH, SEED, step)


def test_batches_are_those_of_batch_indices_and_permute_once_per_epoch():
    made = []
    batches = data.Batches(NUM, BATCH, SEED, place=lambda order: made.append(order.copy()) or order)
    for step in range(STEPS):
        np.testing.assert_array_equal(batches(step), _expected(step))
    assert len(made) == 4  # epochs 0-3, one permutation each
    np.testing.assert_array_equal(made[2], np.random.default_rng([SEED, 2]).permutation(NUM))
    block = data.Batches(NUM, BATCH, SEED).block(2, 6)  # steps 2-7: epochs 0, 1 and 2
    np.testing.assert_array_equal(block, np.stack([_expected(step) for step in range(2, 8)]))
    with pytest.raises(ValueError, match="exceeds"):
        data.Batches(10, 32, SEED)


def test_pyro_batches_are_chosen_on_the_device_of_the_data():
    """``pyro_training.batches``: a step's indices are a slice of the epoch's permutation, a tensor on
    the training tensor's device; the rows, and the dVAE example's binarized batches, are the loop's
    former ``train[batch_indices(...)]``."""
    from examples import dvae_pyro, pyro_training

    train = torch.rand(NUM, 3, dtype=torch.float64)
    batches = pyro_training.batches(train, _args())
    for step in range(STEPS):
        indices = batches(step)
        assert torch.is_tensor(indices) and indices.device == train.device and indices.dtype == torch.int64
        np.testing.assert_array_equal(indices.numpy(), _expected(step))
    args = _args()
    for binarize in ("threshold", "dynamic"):
        args.binarize = binarize
        make_batch = dvae_pyro.batch_maker(train, args)
        for step in range(STEPS):
            torch.manual_seed(step)
            (x,) = make_batch(step)
            former = train[_expected(step)]
            torch.manual_seed(step)
            assert torch.equal(x, torch.bernoulli(former) if binarize == "dynamic" else (former > 0.5).to(former))


def test_pyro_seeding_a_cpu_step_draws_what_manual_seed_did():
    from examples import pyro_training

    torch.manual_seed(123)
    expected = torch.rand(5), torch.bernoulli(torch.full((7,), 0.5))
    torch.manual_seed(0)
    pyro_training.seed_step(123, torch.device("cpu"))
    drawn = torch.rand(5), torch.bernoulli(torch.full((7,), 0.5))
    assert all(torch.equal(a, b) for a, b in zip(expected, drawn))


@pytest.mark.parametrize("block", [4, 50])
def test_numpyro_fit_gives_each_step_the_rows_of_batch_indices(block, monkeypatch):
    """The rows the compiled blocks gather are the steps' ``batch_indices``, in blocks that cross
    epoch boundaries (4: blocks of steps 0-3, 4-7, 8-10) or hold the whole run (50); without
    minibatches every step gets the whole arrays."""
    import jax.numpy as jnp

    from examples import numpyro_training

    monkeypatch.setattr(numpyro_training, "BLOCK", block)

    def record(state, x, step):  # the state keeps each step's rows; the loss is their sum
        return state.at[step].set(x), jnp.sum(x).astype(jnp.float32)

    with enable_x64(False):
        train = jnp.arange(NUM, dtype=jnp.int32)
        state, history = numpyro_training.fit(None, record, jnp.zeros((STEPS, BATCH), jnp.int32), (train,), _args())
        rows = np.stack([_expected(step) for step in range(STEPS)])
        np.testing.assert_array_equal(np.asarray(state), rows)
        assert history.step == STEPS and history.losses == [float(np.float32(r.sum()) / np.float32(BATCH)) for r in rows]

        _, history = numpyro_training.fit(None, lambda state, x, step: (state, jnp.sum(x).astype(jnp.float32)), 0, (train,),
                                          _args(), batch_size=1, minibatches=False)
        assert history.losses == [float(NUM * (NUM - 1) // 2)] * STEPS


def test_numpyro_blocks_compute_the_steps_one_call_at_a_time_bit_for_bit(monkeypatch):
    """``numpyro_training.fit`` (blocks of 20, 20 and 5 steps, each a compiled scan gathering its
    batches; 19 steps an epoch) against the former loop: one call of the dVAE example's compiled
    step per step on ``train[batch_indices(...)]``. Same losses and parameters, bit for bit (on
    the CPU; another device may fuse a block differently, to the last bits)."""
    from examples import numpyro_training

    monkeypatch.setattr(numpyro_training, "BLOCK", 20)
    with enable_x64(False):
        svi, step, state, train = numpyro_dvae()
        args = _args(steps=45, batch_size=64, seed=0)
        blocked, history = numpyro_training.fit(svi, step, state, (train,), args)
        losses = []
        for i in range(args.steps):
            state, loss = step(state, train[data.batch_indices(len(train), 64, 0, i)], i)
            losses.append(float(np.asarray(loss) / 64))
    assert history.step == 45 and len(set(history.losses)) > 40  # it trained: the losses differ
    exact = jax.devices()[0].platform == "cpu"
    compare = np.testing.assert_array_equal if exact else (lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5))
    compare(history.losses, losses)
    for a, b in zip(jax.tree_util.tree_leaves(blocked), jax.tree_util.tree_leaves(state)):
        compare(np.asarray(a), np.asarray(b))


def _pyro_dvae(loop, args):
    """``loop(step, vae, train, args)`` on a fresh dVAE of the example (small networks, the
    uncompiled ELBO) on the 8x8 digits; its result and the module's final state."""
    import pyro

    from examples import dvae_pyro, pyro_training

    dataset = data.load("digits")
    pyro.clear_param_store()
    torch.manual_seed(0)
    train = torch.as_tensor(dataset.train)
    vae = dvae_pyro.DiscreteVAE(dataset.dim, [dvae_pyro.NodeLayer(8, 2)], False, dvae_pyro.PAPER_TEMPERATURES[2],
                                train.mean(0), False)
    step = dvae_pyro.make_step(vae, pyro_training.adam(1e-3, fused=True), jit=False)
    return loop(step, vae, train, args), vae.state_dict()


# ``fit`` with a ``DataParallel`` over 2 simulated devices: checked in tests/test_data_parallel.py,
# whose subprocess has the devices from JAX's start (tests/data_parallel_numpyro.py: sharded_fit)


def test_pyro_fit_computes_the_former_loop_bit_for_bit():
    """``pyro_training.fit`` with the dVAE example's ``make_batch`` (batches on the device, the CPU
    generator alone seeded at each step) against the former loop: ``torch.manual_seed`` and
    ``train[batch_indices(...)]`` at every step. 25 steps (19 an epoch): same losses and parameters."""
    from examples import dvae_pyro, pyro_training

    def example(step, vae, train, args):
        return pyro_training.fit(step, vae, dvae_pyro.batch_maker(train, args), args).losses

    def former(step, vae, train, args):
        def make_batch(i):
            return torch.bernoulli(train[data.batch_indices(len(train), args.batch_size, args.seed, i)])

        torch.manual_seed(args.seed)
        step.init(make_batch(0))
        losses = []
        for i in range(args.steps):
            torch.manual_seed(args.seed * 1_000_003 + i)
            losses.append(step(make_batch(i)) / args.batch_size)
        return losses

    args = _args(steps=25, batch_size=64, seed=3)
    (losses, params), (former_losses, former_params) = _pyro_dvae(example, args), _pyro_dvae(former, args)
    assert len(set(losses)) == 25 and losses == former_losses
    assert all(torch.equal(params[k], former_params[k]) for k in former_params)


def _stop_at_first_evaluation(*params):
    """An ``evaluate`` that stops the run there, as SIGINT from the keyboard would."""
    os.kill(os.getpid(), signal.SIGINT)
    return 0.0


def test_numpyro_run_stopped_off_a_block_boundary_resumes_to_the_uninterrupted_run(tmp_path, capsys):
    """A run stopped by SIGINT at step 10 and resumed to 60 (blocks 0-10 and 10-60, where the
    uninterrupted run has 0-50 and 50-60, across the 19-step epochs of the digits): the same
    per-step losses and state, bit for bit. (tests/test_examples.py resumes the examples' runs from
    checkpoints and after SIGTERM.)"""
    from examples import numpyro_training

    with enable_x64(False):
        svi, step, state, train = numpyro_dvae()
        options = dict(steps=60, batch_size=64, seed=0, out=str(tmp_path))
        whole_state, whole = numpyro_training.fit(svi, step, state, (train,), _args(**{**options, "out": None}))
        with pytest.raises(SystemExit) as stopped:
            numpyro_training.fit(svi, step, state, (train,), _args(**options, eval_every=10), evaluate=_stop_at_first_evaluation)
        assert stopped.value.code == 128 + signal.SIGINT and "stopped at step 10" in capsys.readouterr().out
        resumed_state, resumed = numpyro_training.fit(svi, step, state, (train,), _args(**options, resume=True))
    assert len(resumed.losses) == 60 and resumed.losses == whole.losses
    for a, b in zip(jax.tree_util.tree_leaves(whole_state), jax.tree_util.tree_leaves(resumed_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_pyro_run_stopped_resumes_to_the_uninterrupted_run(tmp_path, capsys):
    """The same in Pyro: stopped by SIGINT at step 10, resumed to 60, against 60 steps in one go."""
    from examples import dvae_pyro, pyro_training

    options = dict(steps=60, batch_size=64, seed=0, out=str(tmp_path))
    whole_losses, whole = _pyro_dvae(lambda step, vae, train, args: pyro_training.fit(
        step, vae, dvae_pyro.batch_maker(train, args), args).losses, _args(**{**options, "out": None}))
    with pytest.raises(SystemExit) as stopped:
        _pyro_dvae(lambda step, vae, train, args: pyro_training.fit(
            step, vae, dvae_pyro.batch_maker(train, args), args, evaluate=_stop_at_first_evaluation), _args(**options, eval_every=10))
    assert stopped.value.code == 128 + signal.SIGINT and "stopped at step 10" in capsys.readouterr().out
    resumed_losses, resumed = _pyro_dvae(lambda step, vae, train, args: pyro_training.fit(
        step, vae, dvae_pyro.batch_maker(train, args), args).losses, _args(**options, resume=True))
    assert len(resumed_losses) == 60 and resumed_losses == whole_losses
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_bench_loop_times_each_loop_against_its_bare_step(capsys, monkeypatch):
    """bench.loop, a few steps of a small dVAE: every contestant of both PPLs timed, the ratios of
    the references to themselves exactly 1."""
    from bench import loop

    monkeypatch.setattr(loop, "UNITS", 8)
    result = loop.main(["--dataset", "digits", "--steps", "10", "--repetitions", "1"])
    assert "bench.loop" in capsys.readouterr().out
    assert set(result) == {(ppl, name) for ppl in ("numpyro", "pyro") for name in ("example loop", "bare step", "before")} | {
        ("pyro", "+ binarize")}
    for (ppl, name), (ms, ratio, binarized_ratio) in result.items():
        assert math.isfinite(ms) and ms > 0 and ratio > 0 and binarized_ratio > 0
        assert ratio == 1.0 or name != "bare step"
    assert result["pyro", "+ binarize"][2] == result["numpyro", "bare step"][2] == 1.0
