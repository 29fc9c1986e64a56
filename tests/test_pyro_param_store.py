"""Pyro specifics (not a conformance test: NumPyro's parameters live in the SVI state, Pyro's in one
global store): the estimators' own parameters in Pyro's param store -- saved, loaded and resumed
as any Pyro run's, and refused where two models would share them."""

import pytest

torch = pytest.importorskip("torch")
pyro = pytest.importorskip("pyro")

import pyro.distributions as dist  # noqa: E402

import pyro_concrete as pc  # noqa: E402


def _problem(k):
    """A one-layer discrete VAE of 5 binary features with a k-category latent."""
    x = (torch.rand(16, 5, generator=torch.Generator().manual_seed(0)) < 0.4).double()

    def model(x):
        decoder = pyro.param(f"decoder{k}", torch.zeros(k, 5, dtype=torch.float64))
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", pc.Concrete(0.5, logits=torch.zeros(k, dtype=torch.float64)))
            pyro.sample("x", dist.Bernoulli(logits=z @ decoder).to_event(1), obs=x)

    def guide(x):
        encoder = pyro.param(f"encoder{k}", torch.zeros(5, k, dtype=torch.float64))
        with pyro.plate("data", len(x)):
            pyro.sample("z", pc.Concrete(2 / 3, logits=x @ encoder))

    return model, guide, x


def _gradients(loss, model, guide, x, seed):
    pyro.set_rng_seed(seed)
    loss.loss_and_grads(model, guide, x)
    store = pyro.get_param_store()
    grads = {name: store.get_param(name).unconstrained().grad.clone() for name in store.keys()}
    for name in store.keys():
        store.get_param(name).unconstrained().grad = None
    return grads


@pytest.mark.parametrize("name", ["REBAR", "RELAX"])
def test_a_run_resumed_from_a_saved_param_store_continues_it(name, tmp_path):
    """Save the store after some steps, clear it, load it and make a new loss: the gradients at a
    seed are the saved run's, the control variate's network included. (RELAX's network was a new,
    zero one, never trained: ``pyro.module`` without ``update_module_params`` leaves the loaded
    values in the store and the module alone.)"""
    model, guide, x = _problem(3)
    pyro.clear_param_store()
    loss = getattr(pc, name)(plate="data")
    svi = pyro.infer.SVI(model, loss.guide(guide), pyro.optim.Adam({"lr": 0.05}), loss)
    for _ in range(10):
        svi.step(x)
    before = _gradients(loss, model, guide, x, 99)
    pyro.get_param_store().save(tmp_path / "store.pt")

    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "store.pt")
    resumed = getattr(pc, name)(plate="data")
    _gradients(resumed, model, guide, x, 0)  # its first call traces the model once (setup)
    after = _gradients(resumed, model, guide, x, 99)
    assert set(after) == set(before)
    assert any(key.startswith(f"{name}.") for key in after)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0, msg=key)


def test_a_relax_network_of_other_shapes_in_the_store_is_refused():
    """Two RELAX losses of different models in one store would share ``RELAX.network``: the second
    would fail with a matrix shape error inside the network; it is refused, naming the parameter."""
    pyro.clear_param_store()
    for k in (3, 5):  # the network's inputs: the k relaxed coordinates
        model, guide, x = _problem(k)
        loss = pc.RELAX(plate="data")
        if k == 3:
            loss.loss_and_grads(model, guide, x)
            continue
        with pytest.raises(ValueError, match=r"RELAX: the param store holds 'RELAX.network\$\$\$0.weight' of shape \(32, 3\)"):
            loss.loss_and_grads(model, guide, x)
    pyro.clear_param_store()


@pytest.mark.parametrize("name", ["REBAR", "RELAX", "DisARM", "GumbelRao", "ScoreFunctionELBO"])
def test_loss_and_grads_adds_to_the_gradients_already_there(name):
    """Two losses in one step (labelled data by Trace_ELBO, the rest by the estimator), or
    micro-batches: ``loss_and_grads`` adds to ``.grad``, as ``backward`` does. REBAR and RELAX set it,
    dropping what was there (a gradient of 100 became the estimator's 1.9)."""
    pyro.clear_param_store()
    model, guide, x = _binary_problem() if name == "DisARM" else _problem(3)  # DisARM: binary sites
    loss = getattr(pc, name)()
    _gradients(loss, model, guide, x, seed=2)  # creates the estimator's own parameters, sets up the loss
    once = _gradients(loss, model, guide, x, seed=3)
    store = pyro.get_param_store()
    for key in store.keys():
        store.get_param(key).unconstrained().grad = torch.full_like(store.get_param(key).unconstrained(), 100.0)
    pyro.set_rng_seed(3)
    loss.loss_and_grads(model, guide, x)
    for key, grad in once.items():
        torch.testing.assert_close(store.get_param(key).unconstrained().grad, grad + 100.0, rtol=1e-9, atol=1e-9)



def _binary_problem():
    """A binary latent per data point: DisARM's sites."""
    x = (torch.rand(16, 5, generator=torch.Generator().manual_seed(0)) < 0.4).double()

    def model(x):
        decoder = pyro.param("binary_decoder", torch.zeros(5, dtype=torch.float64))
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", pc.BinConcrete(0.5, logits=torch.zeros((), dtype=torch.float64)))
            pyro.sample("x", dist.Bernoulli(logits=z[:, None] * decoder).to_event(1), obs=x)

    def guide(x):
        encoder = pyro.param("binary_encoder", torch.zeros(5, dtype=torch.float64))
        with pyro.plate("data", len(x)):
            pyro.sample("z", pc.BinConcrete(2 / 3, logits=x @ encoder))

    return model, guide, x


def test_relax_default_network_refuses_a_batch_of_another_width():
    """RELAX(plate=None): the default network's features are every relaxed coordinate of the batch,
    so a smaller last batch gives fewer; it failed in torch's matmul, naming nothing of ours."""
    pyro.clear_param_store()
    x = torch.tensor([-1.0, 2.0, 0.5, 1.2, 0.3], dtype=torch.float64)

    def model(idx):
        with pyro.plate("data", 5, subsample=idx):
            z = pyro.sample("z", pc.BinConcrete(0.5, logits=torch.tensor(0.3, dtype=torch.float64)))
            pyro.sample("x", dist.Normal(2.0 * z, 1.0), obs=x[idx])

    def guide(idx):
        phi = pyro.param("phi", torch.zeros(5, dtype=torch.float64))
        with pyro.plate("data", 5, subsample=idx):
            pyro.sample("z", pc.BinConcrete(2 / 3, logits=phi[idx]))

    loss = pc.RELAX()
    svi = pyro.infer.SVI(model, loss.guide(guide), pyro.optim.Adam({"lr": 0.01}), loss)
    svi.step(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^RELAX: its default control variate was built for 2 features and is given 1: with plate=None"):
        svi.step(torch.tensor([4]))


@pytest.mark.parametrize("name", ["REBAR", "RELAX"])
def test_differentiable_loss_gives_the_estimator_and_nothing_to_the_tunables(name):
    """``differentiable_loss`` (ELBOModule, DDP, a user's own loop) gives the guide and the model the
    gradients ``loss_and_grads`` gives them, from the same draw, and the tunables none: theirs there
    was zero-mean noise (eta's mean 0.001 +- 0.023 where the variance objective's is -37.6), which an
    optimizer followed as a random walk, and DDP did not average."""
    pyro.clear_param_store()
    model, guide, x = _problem(3)
    loss = getattr(pc, name)()
    _gradients(loss, model, guide, x, seed=2)  # creates the estimator's own parameters
    store = pyro.get_param_store()
    for key in store.keys():  # away from the start, where RELAX's network has a zero output layer
        store.get_param(key).unconstrained().data.add_(0.1 * torch.randn_like(store.get_param(key).unconstrained()))
    expected = _gradients(loss, model, guide, x, seed=3)
    for key in store.keys():
        store.get_param(key).unconstrained().grad = None
    pyro.set_rng_seed(3)
    loss.differentiable_loss(model, guide, x).backward()
    tunables = [key for key in store.keys() if key.startswith(f"{name}.")]
    assert {f"{name}.eta", f"{name}.log_temperature_scale"} <= set(tunables)
    for key in store.keys():
        grad = store.get_param(key).unconstrained().grad
        if key in tunables:
            assert grad is None, key
        else:
            assert expected[key].abs().max() > 0
            torch.testing.assert_close(grad, expected[key], rtol=1e-9, atol=1e-12)


def test_relax_refuses_a_control_variate_that_is_not_a_module():
    """NumPyro's RELAX takes a function; Pyro's trains the network's parameters, so a function was
    taken and failed at the first step with an AttributeError about ``named_parameters``."""
    with pytest.raises(ValueError, match=r"^RELAX: control_variate must be an nn.Module .* got function"):
        pc.RELAX(control_variate=lambda features: features.sum(-1))
