"""Pyro specifics (not a conformance test: NumPyro's SVI compiles every loss): the compiled losses
``JitImportanceWeightedELBO`` and ``JitVIMCO`` compute what their eager classes compute, with fresh
randomness at every call."""

import pytest

torch = pytest.importorskip("torch")
pyro = pytest.importorskip("pyro")
import pyro.distributions as dist  # noqa: E402
from pyro import poutine  # noqa: E402

import pyro_concrete as pc  # noqa: E402

PAIRS = [
    (pc.ImportanceWeightedELBO, pc.JitImportanceWeightedELBO, lambda fn: fn),  # relaxed sites, pathwise
    (pc.VIMCO, pc.JitVIMCO, pc.discrete),  # discrete sites, score-function
]


def model(x):
    w = pyro.param("w", torch.tensor([0.3, -0.2, 0.5]))
    with pyro.plate("data", x.shape[0]):
        z = pyro.sample("z", pc.Concrete(0.5, logits=w))
        b = pyro.sample("b", pc.BinConcrete(0.5, logits=torch.zeros(2)).to_event(1))
        pyro.sample("x", dist.Normal(z @ torch.tensor([1.0, -1.0, 2.0]) + b.sum(-1), 1.0), obs=x)


def guide(x):
    a, c = pyro.param("a", torch.zeros(3)), pyro.param("c", torch.tensor(0.7))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("z", pc.Concrete(2 / 3, logits=a + c * x[:, None]))
        pyro.sample("b", pc.BinConcrete(2 / 3, logits=c * x[:, None].expand(-1, 2)).to_event(1))


def _loss_and_grads(loss, fns, x, seed):
    pyro.set_rng_seed(seed)
    value = loss.differentiable_loss(*fns, x)
    params = [pyro.param(name).unconstrained() for name in ("w", "a", "c")]
    return value.detach(), torch.autograd.grad(value, params)


@pytest.mark.parametrize("eager_class, jit_class, graph", PAIRS, ids=["importance_weighted", "vimco"])
def test_compiled_loss_and_gradients_equal_the_eager_ones_at_every_call(eager_class, jit_class, graph):
    """Same seed, same draws: equal values and gradients (to float32 rounding), for three seeds in
    a row -- a compilation that froze its first draws as constants would match only one."""
    pyro.clear_param_store()
    fns = [poutine.reparam(graph(fn), config=pc.log_space_config) for fn in (model, guide)]
    x = torch.linspace(-2.0, 3.0, 7)
    eager = eager_class(num_particles=5, plate="data")
    jit = jit_class(num_particles=5, plate="data", ignore_jit_warnings=True)
    for loss in (eager, jit):  # set-up and compilation draw extra randomness; compare afterwards
        loss.differentiable_loss(*fns, x)
    values = []
    for seed in range(3):
        (value, grads), (jit_value, jit_grads) = (_loss_and_grads(loss, fns, x, seed) for loss in (eager, jit))
        assert torch.allclose(jit_value, value, rtol=1e-5, atol=1e-5), (seed, jit_value, value)
        for g, jit_g in zip(grads, jit_grads):
            assert torch.allclose(jit_g, g, rtol=1e-4, atol=1e-5), (seed, jit_g, g)
        values.append(value.item())
    assert len(set(values)) == 3  # the seeds drew different particles
    pyro.set_rng_seed(0)
    assert jit.loss(*fns, x) == pytest.approx(_loss_and_grads(jit, fns, x, 0)[0].item(), rel=1e-6)


def _cold_model(x):
    w = pyro.param("w", torch.tensor([30.0, -20.0, 5.0]))
    with pyro.plate("data", x.shape[0]):
        z = pyro.sample("z", pc.Concrete(0.05, logits=w))
        b = pyro.sample("b", pc.BinConcrete(0.05, logits=w[:2]).to_event(1))
        pyro.sample("x", dist.Normal(z @ torch.tensor([1.0, -1.0, 2.0]) + b.sum(-1), 1.0), obs=x)


def _cold_guide(x):
    a, c = pyro.param("a", torch.tensor([25.0, -30.0, 0.0])), pyro.param("c", torch.tensor(0.7))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("z", pc.Concrete(0.1, logits=a + c * x[:, None]))
        pyro.sample("b", pc.BinConcrete(0.1, logits=a[:2] + c * x[:, None]).to_event(1))


def test_a_compiled_loss_scoring_underflowed_samples_has_the_eager_gradients():
    """No reparametrization, T = 0.05 / 0.1, logits up to ±30: the samples underflow to exact 0 and
    1, so the model's densities split their gradients between the sample and its coordinates. The
    compiled loss replays the graph traced at its first call: it must not keep that call's sample
    (its node) as a constant, and its gradients equal the eager loss's at every call."""
    pyro.clear_param_store()
    x = torch.linspace(-2.0, 3.0, 7)
    eager = pc.ImportanceWeightedELBO(num_particles=3, plate="data")
    jit = pc.JitImportanceWeightedELBO(num_particles=3, plate="data", ignore_jit_warnings=True)
    fns = (_cold_model, _cold_guide)
    for loss in (eager, jit):
        loss.differentiable_loss(*fns, x)
    for seed in range(3):
        (value, grads), (jit_value, jit_grads) = (_loss_and_grads(loss, fns, x, seed) for loss in (eager, jit))
        assert torch.allclose(jit_value, value, rtol=1e-5, atol=1e-5), (seed, jit_value, value)
        for g, jit_g in zip(grads, jit_grads):
            assert torch.isfinite(g).all() and torch.allclose(jit_g, g, rtol=1e-4, atol=1e-4), (seed, jit_g, g)


def test_jit_vimco_needs_two_particles():
    with pytest.raises(ValueError, match="num_particles must be an integer >= 2"):
        pc.JitVIMCO(num_particles=1)


def _st_model(x):
    with pyro.plate("data", x.shape[0]):
        z = pyro.sample("z", pc.ConcreteStraightThrough(0.5, logits=torch.zeros(3)))
        g = pyro.sample("g", pc.HardConcrete(0.5, logits=torch.zeros(2)).to_event(1))
        pyro.sample("x", dist.Normal(z @ torch.tensor([1.0, -1.0, 2.0]) + g.sum(-1), 1.0), obs=x)


def _st_guide(x):
    a = pyro.param("a_st", torch.zeros(3))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("z", pc.ConcreteStraightThrough(0.5, logits=a + x[:, None]))
        pyro.sample("g", pc.HardConcrete(0.5, logits=x[:, None].expand(-1, 2)).to_event(1))


@pytest.mark.parametrize("loss", [pyro.infer.JitTrace_ELBO, pc.JitImportanceWeightedELBO])
def test_compiled_losses_raise_no_tracer_warning_from_this_package(loss):
    """Every class of the package inside Pyro's compiled losses: the user sees no TracerWarning
    from this package (each new shape retraces, so several steps with two data sizes)."""
    import warnings

    pyro.clear_param_store()
    elbo = loss() if loss is pyro.infer.JitTrace_ELBO else loss(num_particles=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", category=torch.jit.TracerWarning, append=True)  # others: every time
        for fns in ((model, guide), (_st_model, _st_guide)):
            for n in (5, 5, 7):
                elbo.differentiable_loss(*fns, torch.linspace(-1, 1, n)).backward()
    ours = [w for w in caught if "pyro_concrete" in w.filename]
    assert not ours, [f"{w.filename}:{w.lineno}: {w.message}" for w in ours]
    # the filter hides ours only: a TracerWarning raised from a test file still gets through
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", category=torch.jit.TracerWarning, append=True)
        torch.jit.trace(lambda t: t * float(t.sum()), torch.ones(2))
    assert any(issubclass(w.category, torch.jit.TracerWarning) for w in caught)
