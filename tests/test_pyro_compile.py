"""Pyro specifics (not a conformance test: JAX traces every function it transforms): the family under
``torch.compile`` and ``torch.func``. There the coordinates of a sample ride on the sample object
(``_carry``'s traced path), so ``log_prob`` of an own sample is the eager value -- finite where the
sample underflowed -- with one graph, no recompilation from step to step, and eager's gradients."""

import math
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pyro = pytest.importorskip("pyro")

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


def _score_own_sample(name, validate=False):
    def score(logits):
        d = getattr(pc, name)(T, logits=logits, validate_args=validate)
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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_one_graph(dtype, no_recompilation):
    """A number temperature with float16 / bfloat16 logits: its check against the dtype's range reads
    the number in Python, not the 0-dim tensor the kernels take (a data-dependent guard that broke
    the graph, and a wait on a GPU), with eager's values."""

    def score(logits):
        d = pc.Concrete(0.5, logits=logits, validate_args=False)
        x = d.rsample()
        return d.log_prob(x), x

    compiled = torch.compile(score, fullgraph=True, backend="aot_eager")
    logits = (0.5 * torch.randn((16, 4), generator=torch.Generator().manual_seed(0))).to(dtype)
    torch.manual_seed(1)
    expected, x = score(logits)
    torch.manual_seed(1)
    got, got_x = compiled(logits)
    torch.testing.assert_close(got_x, x, rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


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


# ----------------------------------------------------------------------------- compiled losses
# ``JitImportanceWeightedELBO`` / ``JitVIMCO`` with ``compiler="torch.compile"``: the whole loss,
# Pyro's handlers included, traced once into one graph with the parameters as inputs.


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 8)
        with torch.no_grad():  # deterministic: an eager init drawing random numbers would shift eager's draws
            self.net.weight.copy_(torch.linspace(-3, 3, 32).reshape(8, 4))
            self.net.bias.copy_(torch.linspace(-1, 1, 8))


def _relaxed_model_and_guide(discrete=False):
    """Two relaxed sites (T = 0.05, float32: underflowing samples) in a data plate, a module
    encoder (``pyro.module``), a constrained parameter and a Normal observation; ``discrete``: the
    discrete graph (``pc.discrete``), for the score-function losses."""
    import pyro
    import pyro.distributions as dist
    from pyro.distributions import constraints

    encoder = _Encoder()

    def model(x):
        scale = pyro.param("scale", torch.tensor(0.5), constraint=constraints.positive)
        loc = pyro.param("loc", torch.linspace(-2, 2, 4))
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", pc.Concrete(T, logits=torch.zeros(4)))
            b = pyro.sample("b", pc.BinConcrete(T, logits=torch.zeros(())))
            pyro.sample("x", dist.Normal((z * loc).sum(-1, keepdim=True) + b[..., None], scale).to_event(1), obs=x)

    def guide(x):
        pyro.module("encoder", encoder)
        logits = encoder.net(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", pc.Concrete(T, logits=logits[:, :4]))
            pyro.sample("b", pc.BinConcrete(T, logits=logits[:, 4]))

    return (pc.discrete(model), pc.discrete(guide)) if discrete else (model, guide)


def _loss_and_grads(loss, model, guide, x, seed):
    import pyro

    torch.manual_seed(seed)
    value = loss.differentiable_loss(model, guide, x)
    names = sorted(pyro.get_param_store().keys())
    grads = torch.autograd.grad(value, [pyro.param(name).unconstrained() for name in names])
    return value.detach(), dict(zip(names, grads))


from pyro_concrete import _tracing  # noqa: E402

needs_detach = pytest.mark.skipif(
    not _tracing.make_fx_keeps_detach(),
    reason="this torch's make_fx drops detach: the compiled losses refuse torch.compile (test_a_compiled_loss_refuses_a_torch_whose_make_fx_drops_detach)",
)


COMPILED_LOSSES = [("ImportanceWeightedELBO", 1, False), ("ImportanceWeightedELBO", 3, False), ("VIMCO", 3, True)]


@needs_detach
@pytest.mark.parametrize("name, particles, discrete", COMPILED_LOSSES, ids=[f"{c[0]}-{c[1]}" for c in COMPILED_LOSSES])
def test_a_compiled_loss_is_one_graph_with_eager_values_and_gradients(name, particles, discrete, no_recompilation):
    """Three steps on new data, ``fullgraph=True`` and no recompilation, against the eager loss
    drawing the same random numbers: the loss and the gradient of every parameter (module,
    constrained, plain) are eager's, finite where samples underflowed; a batch of another shape
    compiles once more and is right too. Dynamo's backend without a compiler (``"eager"``) runs the
    traced graph's operations in order: AOTAutograd's partitioner may reorder the two sites'
    independent draws, which changes which random numbers each site gets."""
    import pyro

    pyro.clear_param_store()
    model, guide = _relaxed_model_and_guide(discrete)
    eager = getattr(pc, name)(particles, "data")
    compiled = getattr(pc, "Jit" + name)(particles, "data", compiler="torch.compile",
                                         jit_options=dict(backend="eager", fullgraph=True))
    generator = torch.Generator().manual_seed(3)
    with pyro.validation_enabled(False):
        first = torch.randn(16, 4, generator=generator)
        eager.differentiable_loss(model, guide, first)  # its set-up (plate nesting) draws too
        compiled.differentiable_loss(model, guide, first)  # traces and compiles
        for step, size in enumerate((16, 16, 16, 5)):
            x = torch.randn(size, 4, generator=generator)
            expected, expected_grads = _loss_and_grads(eager, model, guide, x, step)
            got, grads = _loss_and_grads(compiled, model, guide, x, step)
            assert torch.isfinite(got)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3)
            assert grads.keys() == {"scale", "loc", "encoder$$$net.weight", "encoder$$$net.bias"}
            for key, grad in grads.items():
                assert grad.abs().sum() > 0, key  # the parameter is an input of the graph, not a constant
                torch.testing.assert_close(grad, expected_grads[key], rtol=1e-4, atol=1e-4 * expected_grads[key].abs().max().item())
    assert len(compiled._compiled.compiled) == 2  # batch 16, batch 5


def test_a_compiled_loss_refuses_a_torch_whose_make_fx_drops_detach(monkeypatch):
    """Torch 2.14's ``make_fx`` records ``detach`` as ``aten.alias``, so a compiled loss's gradient
    flowed through the detached parts of its surrogate: the compiled VIMCO's guide gradients were
    wrong on torch 2.14.1 (``make compat``'s newest-torch), its value right. Where make_fx drops it, the
    compiled losses refuse ``compiler="torch.compile"``; the probe reads the installed torch."""
    from pyro_concrete import _tracing, losses
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x: (x.detach() * x).sum())(torch.ones(3, requires_grad=True))
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    keeps = torch.autograd.grad(graph(x), x)[0].equal(x.detach())  # d/dx (stop(x) x) = x, not 2x
    assert _tracing.make_fx_keeps_detach() == keeps
    monkeypatch.setattr(losses, "make_fx_keeps_detach", lambda: False)
    for name in ("JitImportanceWeightedELBO", "JitVIMCO"):
        with pytest.raises(NotImplementedError, match=r"make_fx traces detach\(\) as an alias"):
            getattr(pc, name)(2, "data", compiler="torch.compile")
        getattr(pc, name)(2, "data")  # torch.jit.trace: unaffected


def test_a_compiled_loss_names_its_compilers():
    with pytest.raises(ValueError, match="compiler must be one of.*'torch.compile'.*got 'inductor'"):
        pc.JitImportanceWeightedELBO(1, "data", compiler="inductor")


@needs_detach
def test_a_compiled_loss_refuses_parameters_that_change_with_the_shapes(no_recompilation):
    """A parameter first made for a new batch shape would be a constant of that shape's graph,
    never trained: refused, naming both sets."""
    import pyro

    pyro.clear_param_store()

    def model(x):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", pc.BinConcrete(0.5, logits=torch.zeros(())))

    def guide(x):
        logits = pyro.param(f"logits_{x.shape[0]}", torch.zeros(x.shape[0]))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", pc.BinConcrete(0.5, logits=logits))

    loss = pc.JitImportanceWeightedELBO(1, "data", compiler="torch.compile", jit_options=dict(backend="eager"))
    with pyro.validation_enabled(False):
        assert torch.isfinite(loss.differentiable_loss(model, guide, torch.zeros(4)))
        with pytest.raises(NotImplementedError, match=r"the first call had \['logits_4'\], this one \(new shapes\) has \['logits_5'\]"):
            loss.differentiable_loss(model, guide, torch.zeros(5))


@pytest.mark.parametrize("estimator, particles", [("concrete", 1), ("concrete", 3), ("reinforce", 3)])
def test_the_dvae_example_compiled_step_trains_as_its_eager_step(estimator, particles, no_recompilation):
    """``examples.dvae_pyro``'s ``--compile`` step (``pyro_training.CompiledStep``: the loss, its
    gradient and Adam's update in one graph) against its uncompiled step (``Trace_ELBO``, L_3,
    VIMCO) from the same parameters and seeds: the same losses, parameters and Adam state after four
    steps (Dynamo's backend without a compiler: the same random numbers in the same order), one
    graph for all of them; a checkpoint of either step loads into the other; the estimators
    without a compiled loss refuse, naming the option."""
    import pyro

    from examples import dvae_pyro, pyro_training

    x = torch.bernoulli(torch.full((4, 16), 0.3), generator=torch.Generator().manual_seed(0))
    runs = []
    for compile in (None, {"backend": "eager", "fullgraph": True}):
        pyro.clear_param_store()
        torch.manual_seed(0)
        vae = dvae_pyro.DiscreteVAE(16, [dvae_pyro.NodeLayer(8, 2)], True, (0.5, 2 / 3), torch.full((16,), 0.3), False)
        step = dvae_pyro.make_step(vae, pyro_training.adam(1e-2), estimator, particles, jit=False, compile=compile)
        assert isinstance(step, pyro_training.CompiledStep) == (compile is not None)
        step.init(x)
        losses = []
        for i in range(4):
            torch.manual_seed(10 + i)
            losses.append(step(x))
        runs.append((losses, {k: v.detach().clone() for k, v in vae.state_dict().items()}, step))
    (eager_losses, eager_params, eager_step), (losses, params, compiled_step) = runs
    assert len(set(eager_losses)) == 4  # the steps train: every loss differs
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=1e-4)
    for name, value in params.items():
        torch.testing.assert_close(value, eager_params[name], rtol=1e-4, atol=1e-5)
    eager_state, compiled_state = eager_step.state_dict(), compiled_step.state_dict()
    assert compiled_state["names"] == eager_state["names"]
    for index, entry in eager_state["optimizer"]["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(compiled_state["optimizer"]["state"][index][key], value, rtol=1e-4, atol=1e-6)
    eager_step.load_state_dict(compiled_state)
    compiled_step.load_state_dict(eager_state)
    with pytest.raises(ValueError, match="compile: --estimator rebar at --particles 1 has no compiled loss"):
        dvae_pyro.make_step(vae, pyro_training.adam(1e-2), "rebar", compile={})


def test_a_compiled_step_refuses_an_optimizer_it_does_not_compute():
    import pyro

    from examples import pyro_training

    def model():
        pyro.sample("x", pyro.distributions.Normal(pyro.param("a", torch.zeros(2)), 1.0).to_event(1), obs=torch.zeros(2))

    for make_optimizer, message in (
        (lambda params: torch.optim.SGD(params, lr=0.1), "must make a torch.optim.Adam"),
        (lambda params: torch.optim.Adam(params, lr=0.1, weight_decay=0.1), "without weight_decay"),
    ):
        pyro.clear_param_store()
        step = pyro_training.CompiledStep(model, lambda: None, pc.ImportanceWeightedELBO(1), make_optimizer, {})
        with pytest.raises(ValueError, match=message):
            step.init()


@pytest.mark.parametrize("options, message", [
    (["--compile", "--no-jit"], "--compile and --no-jit: choose one"),
    (["--compile", "--estimator", "reinforce"], "--compile: --estimator reinforce at --particles 1 has no compiled loss"),
    (["--compile", "fastest"], "argument --compile: invalid choice: 'fastest'"),
])
def test_the_dvae_example_refuses_compile_where_it_has_no_compiled_loss(options, message, capsys):
    from examples import dvae_pyro

    with pytest.raises(SystemExit) as stopped:
        dvae_pyro.parse_args(options)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("name, shape", CASES + [("HardConcrete", (256,))], ids=[c[0] for c in CASES] + ["HardConcrete"])
def test_vmap_with_validation_on_checks_and_gives_the_unvalidated_values(name, shape):
    """Validation under ``torch.func.vmap``: its checks decide by torch's vmap-friendly
    ``_is_all_true`` / ``_is_any_true`` (where reading a Python number from a batched tensor, ``.item()``
    or ``bool()``, raised a RuntimeError about data-dependent control flow): batched parameters and
    batched values give the values of validation off; parameters or values that validation refuses
    raise its ValueError (inside a transform without the values in the message)."""

    logits = _logits((3, *shape), 12)
    results = []
    for validate in (True, False):
        torch.manual_seed(2)
        results.append(torch.func.vmap(_score_own_sample(name, validate), randomness="different")(logits))
    (checked, x_checked), (unchecked, x_unchecked) = results
    torch.testing.assert_close(x_checked, x_unchecked, rtol=0, atol=0)
    torch.testing.assert_close(checked, unchecked, rtol=0, atol=0)
    assert torch.isfinite(checked).all()

    # plain values (copies: no coordinates), in float64 so that none rounds onto the boundary: the
    # eager scores, or, for the straight-through classes (not their samples), eager's ValueError
    plain = getattr(pc, name)(0.5, logits=logits[0].double())
    values = plain.sample((3,)).clone()
    try:
        expected = plain.log_prob(values)
    except ValueError as error:
        with pytest.raises(ValueError, match=str(error)[:40]):
            torch.func.vmap(plain.log_prob)(values)
    else:
        torch.testing.assert_close(torch.func.vmap(plain.log_prob)(values), expected, rtol=1e-12, atol=1e-12)

    bad = logits.clone()
    bad[1].view(-1)[0] = math.nan
    with pytest.raises(ValueError, match="logits"):
        torch.func.vmap(_score_own_sample(name, True), randomness="different")(bad)


@pytest.mark.parametrize("end, good, bad", [("low", -0.1, 0.2), ("high", 1.1, 0.9)])
def test_torch_func_over_hard_concrete_ends_checks_them_and_gives_the_unvalidated_values(end, good, bad):
    """``grad``, ``jacrev`` and ``vmap`` with respect to Hard Concrete's ``low`` / ``high`` under
    validation (Pyro's default): the ends are checked by torch's vmap-friendly comparison (reading
    them as NumPy numbers inside a transform raised a RuntimeError about a tensor without storage),
    so the results are those of validation off, and an end on the wrong side of 0 (1) raises the
    ValueError naming it."""
    logits, value = torch.tensor([0.3, -0.5, 1.2], dtype=torch.float64), torch.tensor([0.0, 0.4, 1.0], dtype=torch.float64)

    def log_prob(validate):
        return lambda e: pc.HardConcrete(2 / 3, logits=logits, validate_args=validate, **{end: e}).log_prob(value).sum()

    def prob_nonzero(validate):
        return lambda e: pc.HardConcrete(2 / 3, logits=logits, validate_args=validate, **{end: e}).prob_nonzero

    ends = torch.tensor([good, good - 0.05 if end == "low" else good + 0.05], dtype=torch.float64)
    for transform, fn, argument in [
        (torch.func.grad, log_prob, ends[0]),
        (torch.func.jacrev, prob_nonzero, ends[0].expand(3).clone()),
        (torch.func.vmap, log_prob, ends),
    ]:
        checked, unchecked = transform(fn(True))(argument), transform(fn(False))(argument)
        torch.testing.assert_close(checked, unchecked, rtol=0, atol=0)
        assert torch.isfinite(checked).all() and checked.abs().sum() > 0
    with pytest.raises(ValueError, match=rf"HardConcrete: {end} must be a finite number"):
        torch.func.vmap(log_prob(True))(torch.tensor([good, bad], dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"HardConcrete: {end} must be a finite number"):
        torch.func.grad(log_prob(True))(torch.tensor(bad, dtype=torch.float64))


def test_torch_compile_turns_the_default_validation_off_for_the_process():
    """What docs/numerics.rst tells users: torch's first ``torch.compile`` call sets
    torch.distributions' default validation off for the whole process (torch/_dynamo's
    ``TorchPatcher``), so eager distributions built afterwards are unchecked unless told, and
    ``pyro.enable_validation(True)`` turns it back on. (tests/conftest.py turns it on before each test.)"""
    script = """
import pyro, torch
import pyro_concrete as pc
bad = lambda: pc.HardConcrete(2 / 3, logits=torch.tensor(0.0), high=torch.tensor(0.9))
try:
    bad()
except ValueError as error:
    assert "high must be a finite number > 1" in str(error)
else:
    raise AssertionError("checked before compiling")
torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
assert not torch.distributions.Distribution._validate_args
assert bad().prob_nonzero.isfinite()  # unchecked
pyro.enable_validation(True)
try:
    bad()
except ValueError:
    pass
else:
    raise AssertionError("unchecked after pyro.enable_validation(True)")
"""
    # in a fresh interpreter: torch turns it off at the process's first compilation only
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                         cwd=pathlib.Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("make", [lambda: pc.REBAR("data"), lambda: pc.RELAX("data"), lambda: pc.DisARM("data"), lambda: pc.GumbelRao("data")],
                         ids=["REBAR", "RELAX", "DisARM", "GumbelRao"])
def test_per_example_gradients_of_the_estimators_by_vmap_equal_one_example_at_a_time(make):
    """``vmap(grad(loss))`` over the examples (per-example gradients, validation off: Pyro's own
    checks read numbers): each row is the gradient of that example alone, with the same noise. REBAR's
    and RELAX's check of their relaxed temperature read a number with ``.item()`` once."""
    import pyro.distributions as dist

    torch.manual_seed(4)
    net = torch.nn.Linear(4, 3)
    weights = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    data = (torch.rand(5, 4, generator=torch.Generator().manual_seed(2)) < 0.5).float()

    def model(x):
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", pc.BinConcrete(0.5, logits=torch.zeros(3)).to_event(1))
            pyro.sample("x", dist.Bernoulli(logits=z @ weights).to_event(1), obs=x)

    def guide(x):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", pc.BinConcrete(0.5, logits=net(x)).to_event(1))

    loss = make()
    params = {k: p.detach() for k, p in net.named_parameters()}
    pyro.clear_param_store()
    with pyro.validation_enabled(False):
        torch.manual_seed(0)
        loss.differentiable_loss(model, guide, data[:1])  # the estimator's own parameters made once
        rows = []
        for i in range(5):
            torch.manual_seed(3)
            rows.append(torch.func.grad(_with_params(net, loss, model, guide))(params, data[i : i + 1]))
        torch.manual_seed(3)
        batched = torch.func.vmap(torch.func.grad(_with_params(net, loss, model, guide)), in_dims=(None, 0), randomness="same")(params, data[:, None])
    for key in params:
        expected = torch.stack([row[key] for row in rows])
        assert expected.abs().max() > 0
        torch.testing.assert_close(batched[key], expected, rtol=1e-5, atol=1e-7)


def test_a_relaxed_temperature_too_cold_for_the_dtype_is_refused_under_vmap():
    """The same bound as eagerly (tests/test_estimators.py), decided by comparisons under vmap."""
    import pyro.distributions as dist

    net = torch.nn.Linear(2, 2)
    data = torch.tensor([[1.0, 0.0], [0.0, 1.0]])

    def model(x):
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", pc.BinConcrete(0.5, logits=torch.zeros(2)).to_event(1))
            pyro.sample("x", dist.Bernoulli(logits=z).to_event(1), obs=x)

    def guide(x):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", pc.BinConcrete(0.5, logits=net(x)).to_event(1))

    pyro.clear_param_store()
    loss = pc.REBAR("data")
    with pyro.validation_enabled(False):
        loss.differentiable_loss(model, guide, data)
        pyro.param("REBAR.log_temperature_scale").data.fill_(-200.0)  # exp(-200) underflows in float32
        params = {k: p.detach() for k, p in net.named_parameters()}
        with pytest.raises(ValueError, match=r"REBAR: site 'z' relaxes .*inside a torch.func transform"):
            torch.func.vmap(torch.func.grad(_with_params(net, loss, model, guide)), in_dims=(None, 0), randomness="same")(params, data[:, None])


def _with_params(net, loss, model, guide):
    def fn(params, x):
        with torch.nn.utils.stateless._reparametrize_module(net, params):
            return loss.differentiable_loss(model, guide, x)

    return fn
