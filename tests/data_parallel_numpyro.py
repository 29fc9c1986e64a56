"""Run by tests/test_data_parallel.py in a subprocess with 4 simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4, which must be set before JAX starts). Prints
one JSON line of measurements; the test asserts on them."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO

from examples import data, dvae_numpyro, numpyro_training
from numpyro_concrete import Concrete, discrete_log_likelihood

DEVICES = 4


def _max_relative(a, b):
    leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)) / (np.abs(np.asarray(y)) + 1e-3))) for x, y in leaves)


def dvae_steps(steps):
    """The dVAE example's compiled step, ``steps`` steps on one device and sharded over four."""
    dataset = data.load("digits")
    train = jnp.asarray(dataset.train)
    layers = [dvae_numpyro.NodeLayer(200, 2)]
    vae = dvae_numpyro.DiscreteVAE(layers, True, dvae_numpyro.PAPER_TEMPERATURES[2], train.mean(0), False)
    svi = dvae_numpyro.make_svi(vae, numpyro.optim.Adam(1e-3))
    parallel = numpyro_training.DataParallel(DEVICES)
    one = dvae_numpyro.make_train_step(svi, "dynamic", jax.random.PRNGKey(1))
    sharded = dvae_numpyro.make_train_step(svi, "dynamic", jax.random.PRNGKey(1), parallel)
    state = svi.init(jax.random.PRNGKey(0), train[:64])
    states, losses = {"one": state, "sharded": parallel.replicate(state)}, {"one": [], "sharded": []}
    for step in range(steps):
        x = train[data.batch_indices(len(train), 64, 0, step)]
        states["one"], loss = one(states["one"], x, step)
        losses["one"].append(float(loss))
        states["sharded"], loss = sharded(states["sharded"], parallel.shard(x), step)
        losses["sharded"].append(float(loss))
    hlo = sharded.lower(states["sharded"], parallel.shard(train[:64]), 0).compile().as_text()
    leaf = jax.tree_util.tree_leaves(svi.get_params(states["sharded"]))[0]
    return {
        "losses_one": losses["one"],
        "losses_sharded": losses["sharded"],
        "params_max_relative_difference": _max_relative(svi.get_params(states["sharded"]), svi.get_params(states["one"])),
        "param_devices": len(leaf.sharding.device_set),
        "param_replicated": bool(leaf.sharding.is_fully_replicated),
        "all_reduces": hlo.count("all-reduce("),
    }


def carried_scores():
    """A model whose prior scores the guide's own Concrete sample at temperature 0.01 (its float32
    coordinates underflow to exact zeros, where a value-based score refuses): the ELBO compiled on
    sharded data against the one-device value."""
    k = 10

    def model(x):
        with numpyro.plate("data", x.shape[0]):
            z = numpyro.sample("z", Concrete(0.01, logits=jnp.zeros(k)))
            numpyro.sample("x", dist.Normal((z * jnp.arange(k)).sum(-1), 1.0), obs=x)

    def guide(x):
        logits = numpyro.param("q", jnp.linspace(-3.0, 3.0, k))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("z", Concrete(0.01, logits=logits))

    x = jnp.linspace(0.0, 9.0, 64)
    key = jax.random.PRNGKey(3)
    loss = jax.jit(lambda x, key: Trace_ELBO().loss(key, {}, model, guide, x))
    parallel = numpyro_training.DataParallel(DEVICES)
    one, sharded = float(loss(x, key)), float(loss(parallel.shard(x), key))
    # the guide's draw at this key, as plain values: how many coordinates are exactly 0
    sample = numpyro.handlers.trace(numpyro.handlers.seed(guide, key)).get_trace(x)["z"]["value"]
    return {"carried_one": one, "carried_sharded": sharded, "zeros_in_sample": int((sample == 0).sum())}


def helpers_on_sharded_data():
    """discrete_log_likelihood (a test-time helper) on data sharded over the devices."""
    dataset = data.load("digits")
    train = jnp.asarray(dataset.train)
    vae = dvae_numpyro.DiscreteVAE([dvae_numpyro.NodeLayer(200, 2)], True, dvae_numpyro.PAPER_TEMPERATURES[2], train.mean(0), False)
    svi = dvae_numpyro.make_svi(vae, numpyro.optim.Adam(1e-3))
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), train[:64]))
    test = jnp.asarray(data.fixed_binarization(dataset.test[:64], "dynamic"))
    bound = dvae_numpyro.evaluator(vae, 10)
    parallel = numpyro_training.DataParallel(DEVICES)
    key = jax.random.PRNGKey(5)
    one = np.asarray(bound(params, test, key))
    sharded_input = parallel.shard(test)
    sharded = bound(parallel.replicate(params), sharded_input, key)
    direct = discrete_log_likelihood(vae.model, vae.guide, sharded_input, num_particles=10, plate="data", params=params, rng_key=key)
    return {
        "helper_max_abs_difference": float(np.max(np.abs(np.asarray(sharded) - one))),
        "helper_eager_max_abs_difference": float(np.max(np.abs(np.asarray(direct) - one))),
        "helper_input_devices": len(sharded_input.sharding.device_set),
        "helper_mean": float(one.mean()),
    }


def sharded_fit():
    """``numpyro_training.fit`` on one device and with a ``DataParallel`` over two (blocks of 5, 5
    and 2 steps, each gathering its batches on the devices): for tests/test_loops.py's check, in
    this process (one JAX start with simulated devices for both files)."""
    from tests.helpers import loop_args, numpyro_dvae

    svi, step, state, train = numpyro_dvae()
    args = loop_args(steps=12, batch_size=64, seed=0, checkpoint_every=5)
    one_state, one = numpyro_training.fit(svi, step, state, (train,), args)
    parallel = numpyro_training.DataParallel(2)
    sharded_state, sharded = numpyro_training.fit(svi, step, parallel.replicate(state), (train,), args, parallel=parallel)
    leaf = jax.tree_util.tree_leaves(sharded_state)[0]
    return dict(fit_one=one.losses, fit_sharded=sharded.losses, fit_devices=len(leaf.sharding.device_set),
                fit_replicated=bool(leaf.sharding.is_fully_replicated),
                fit_max_difference=max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                       for a, b in zip(jax.tree_util.tree_leaves(one_state), jax.tree_util.tree_leaves(sharded_state))))


def shard_map_gradients():
    """The losses whose own parameters an inner derivative trains (a ScoreFunctionELBO baseline's
    fit, REBAR's and RELAX's eta and temperature scale: the square of an estimate that is itself a
    vector-Jacobian product), under ``shard_map`` with the user's ``pmean`` of the loss (parameters
    replicated, the subsampled batch split over the devices): each parameter's gradient is the mean
    over the shards of each shard's alone. The inner derivative with respect to a replicated
    parameter summed the shards' (the baseline's 4x, eta's 16x). Max relative difference per loss."""
    from jax.sharding import Mesh, PartitionSpec

    import numpyro_concrete as nc

    n, shard = 16, 16 // DEVICES
    x = jnp.linspace(-2.0, 2.5, n)

    def model(x):
        mu = numpyro.param("mu", jnp.array([-1.0, 1.5]))
        with numpyro.plate("data", n, subsample_size=shard):
            z = numpyro.sample("z", nc.BinConcrete(0.5, logits=jnp.zeros(())))
            numpyro.sample("x", dist.Normal(mu[0] + z * (mu[1] - mu[0]), 1.0), obs=x)

    def guide(x, baseline=False):
        w, b = numpyro.param("w", 0.7), numpyro.param("b", -0.2)
        with numpyro.plate("data", n, subsample_size=shard):
            infer = {"baseline": {"baseline_value": numpyro.param("c", 0.3) * x}} if baseline else {}
            numpyro.sample("z", nc.BinConcrete(2 / 3, logits=w * x + b), infer=infer)

    cases = {"ScoreFunctionELBO": (nc.ScoreFunctionELBO(plate="data"), nc.discrete(model), nc.discrete(lambda x: guide(x, True)))}
    for cls in (nc.REBAR, nc.RELAX):
        loss = cls(plate="data")
        cases[cls.__name__] = (loss, model, loss.guide(guide))
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    key = jax.random.PRNGKey(11)
    differences = {}
    for name, (loss, m, g) in cases.items():
        svi = SVI(m, g, numpyro.optim.Adam(0.01), loss)
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), x[:shard]))
        assert ("c" if name == "ScoreFunctionELBO" else f"{name}.eta") in params  # the parameter an inner derivative trains

        def one(p, k, x, loss=loss, m=m, g=g):
            return loss.loss(k, p, m, g, x)

        per_shard = [jax.jit(jax.grad(one))(params, key, x[i * shard : (i + 1) * shard]) for i in range(DEVICES)]
        mean = jax.tree_util.tree_map(lambda *gs: sum(gs) / DEVICES, *per_shard)
        body = lambda p, k, x, one=one: jax.grad(lambda p: jax.lax.pmean(one(p, k, x), "batch"))(p)  # noqa: E731
        sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec("batch")),
                                        out_specs=PartitionSpec()))(params, key, x)
        differences[name] = max(_max_relative(np.asarray(sharded[k]), np.asarray(mean[k])) for k in mean)
    return {"shard_map_max_relative_difference": differences}


if __name__ == "__main__":
    assert jax.device_count() == DEVICES, jax.devices()
    result = {"devices": jax.device_count(), **dvae_steps(int(sys.argv[1])), **carried_scores(), **helpers_on_sharded_data(),
              **sharded_fit(), **shard_map_gradients()}
    print(json.dumps(result))
