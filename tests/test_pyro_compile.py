"""Pyro specifics (not a conformance test: JAX traces every function it transforms): the family under
``torch.compile`` and ``torch.func``. There the coordinates of a sample ride on the sample object
(``_carry``'s traced path), so ``log_prob`` of an own sample is the eager value -- finite where the
sample underflowed -- with one graph, no recompilation from step to step, and eager's gradients."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyro")

import pyro_concrete as pc  # noqa: E402

# torch's own: its forward-mode AD and its compiler load their decompositions with torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script.* is deprecated:DeprecationWarning")

# (name, logits shape): T = 0.05 in float32 with logits of scale 3 -- Concrete samples underflow to
# exact zeros, BinConcrete ones round to exact 0 or 1
CASES = [
    ("Concrete", (64, 8)),
    ("ExpConcrete", (64, 8)),
    ("BinConcrete", (256,)),
    ("LogitBinConcrete", (256,)),
    ("ConcreteStraightThrough", (64, 8)),
    ("BinConcreteStraightThrough", (256,)),
]
UNDERFLOWING = {"Concrete", "BinConcrete"}
T = 0.05


def _logits(shape, seed):
    return 3 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _score_own_sample(name):
    def score(logits):
        d = getattr(pc, name)(T, logits=logits, validate_args=False)
        x = d.rsample()
        return d.log_prob(x), x

    return score


def _eager(fn, logits, seed):
    """fn's values and the gradient of their sum with respect to the logits, eagerly."""
    logits = logits.clone().requires_grad_()
    torch.manual_seed(seed)
    log_prob, x = fn(logits)
    (grad,) = torch.autograd.grad(log_prob.sum(), logits)
    return log_prob.detach(), x.detach(), grad


@pytest.fixture
def no_recompilation():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name, shape", CASES, ids=[c[0] for c in CASES])
def test_compiled_log_prob_of_an_own_sample_is_one_graph_with_eager_values(name, shape, no_recompilation):
    """``fullgraph=True`` (a graph break raises), three steps with new logits and new noise (a
    recompilation raises), values bitwise eager's and gradients eager's to rounding. The AOT
    backend without code generation: it runs the traced graph with eager kernels and the same random
    numbers, so the comparison is of the tracing, not of the compiler's arithmetic."""
    score = _score_own_sample(name)
    compiled = torch.compile(score, fullgraph=True, backend="aot_eager")
    for step in range(3):
        logits = _logits(shape, step)
        expected, x, expected_grad = _eager(score, logits, step)
        got, got_x, grad = _eager(compiled, logits, step)
        if name in UNDERFLOWING and step == 0:
            assert ((x == 0) | (x == 1)).any()  # the point of the case: x alone would score +inf
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got_x, x, rtol=0, atol=0)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5 * expected_grad.abs().max().item())


def test_inductor_compiles_the_underflowing_case_to_finite_eager_values(no_recompilation):
    """The default compiler (generated kernels): with torch's own random numbers
    (``fallback_random``) the sample is eager's to float32 rounding, its density finite and eager's to
    the rounding of densities of size 1e3-1e4 per element."""
    score = _score_own_sample("BinConcrete")
    compiled = torch.compile(score, fullgraph=True, options={"fallback_random": True})
    for step in range(2):
        logits = _logits((256,), step)
        expected, x, expected_grad = _eager(score, logits, step)
        got, got_x, grad = _eager(compiled, logits, step)
        assert ((x == 0) | (x == 1)).any() and torch.isfinite(got).all()
        torch.testing.assert_close(got_x, x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, shape", CASES, ids=[c[0] for c in CASES])
def test_torch_func_transforms_give_eager_values(name, shape):
    """grad, jacrev, jvp (forward mode) and vmap over a function that draws and scores: eager's
    value and gradient, finite where the sample underflowed (the transforms' wrapped tensors have
    no memory a registry could key)."""
    score = _score_own_sample(name)
    logits = _logits(shape, 7)
    expected, _, expected_grad = _eager(score, logits, 0)
    total = expected.sum()
    tolerance = dict(rtol=1e-5, atol=1e-5 * expected_grad.abs().max().item())

    def summed(logits):
        torch.manual_seed(0)
        return score(logits)[0].sum()

    grad, value = torch.func.grad_and_value(summed)(logits)
    torch.testing.assert_close(value, total, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, **tolerance)
    torch.testing.assert_close(torch.func.jacrev(summed)(logits), expected_grad, **tolerance)
    direction = torch.randn(shape, generator=torch.Generator().manual_seed(8))
    value, derivative = torch.func.jvp(summed, (logits,), (direction,))
    torch.testing.assert_close(value, total, rtol=0, atol=0)
    torch.testing.assert_close(derivative, (expected_grad * direction).sum(), rtol=1e-4, atol=1e-3)

    # vmap over three copies of the parameters, each drawing its own noise: finite, and each the
    # eager density of its own sample
    def draw_and_score(logits):
        d = getattr(pc, name)(T, logits=logits, validate_args=False)
        x = d.rsample()
        return d.log_prob(x).sum(), x

    torch.manual_seed(1)
    totals, samples = torch.func.vmap(draw_and_score, randomness="different")(logits.expand(3, *shape))
    assert torch.isfinite(totals).all()
    if name in UNDERFLOWING:
        assert ((samples == 0) | (samples == 1)).any()
    if name in ("ExpConcrete", "LogitBinConcrete"):  # their own coordinates: eager scores them exactly
        d = getattr(pc, name)(T, logits=logits, validate_args=False)
        torch.testing.assert_close(totals, d.log_prob(samples).sum(-1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_a_loss_of_the_sample_and_its_density_has_eager_gradients(name, no_recompilation):
    """f(x) + log p(x): the density's gradient is split between the value (``g dy/dx``, where that
    is within bounds) and the coordinates, and the sample's own path adds f's; compiled and under
    torch.func.grad the total reaching the parameters is eager's, at the temperature where x
    underflows and dy/dx is infinite or astronomically large."""
    shape = (64, 8) if name == "Concrete" else (256,)
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(5))

    def loss(logits):
        d = getattr(pc, name)(T, logits=logits, validate_args=False)
        x = d.rsample()
        return (weights * x).sum() + d.log_prob(x).sum()

    def with_x(logits):
        return loss(logits).reshape(1), torch.zeros(())

    logits = _logits(shape, 11)
    _, _, expected = _eager(with_x, logits, 0)
    tolerance = dict(rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    _, _, compiled = _eager(torch.compile(with_x, fullgraph=True, backend="aot_eager"), logits, 0)
    torch.testing.assert_close(compiled, expected, **tolerance)

    def seeded(logits):
        torch.manual_seed(0)
        return loss(logits)

    torch.testing.assert_close(torch.func.grad(seeded)(logits), expected, **tolerance)


@pytest.mark.parametrize("backend_name", ["aot_eager"])
def test_a_sample_changed_in_place_after_it_was_drawn_scores_nan_under_compile(backend_name, no_recompilation):
    """A traced function cannot raise on data: a sample edited after it was drawn (compared in full
    with what the sampler wrote) scores NaN in the edited rows, never the old sample's density."""

    def edited(logits):
        d = pc.Concrete(T, logits=logits, validate_args=False)
        x = d.rsample()
        x[0] = 1.0 / x.shape[-1]  # in place: the coordinates carried are no longer x's
        return d.log_prob(x)

    got = torch.compile(edited, fullgraph=True, backend=backend_name)(_logits((4, 8), 0))
    assert math.isnan(got[0].item())
    assert torch.isfinite(got[1:]).all()
    torch.manual_seed(0)
    got = torch.func.vmap(edited, randomness="different")(_logits((3, 4, 8), 0))  # under torch.func
    assert torch.isnan(got[:, 0]).all() and torch.isfinite(got[:, 1:]).all()
