"""Pyro specifics (not a conformance test: torch tensors are mutable and have views, JAX arrays
neither): the carried log-space coordinates of a sample follow views and are dropped when the sample
or its coordinates are modified in place."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import pyro_concrete as pc  # noqa: E402

LOGITS = torch.tensor([[0.7, -1.2, 2.0, 0.1], [30.0, -30.0, 0.0, 1.0]], dtype=torch.float64)


def test_an_exp_concrete_sample_changed_in_place_to_the_boundary_scores_minus_inf():
    d = pc.ExpConcrete(0.5, logits=LOGITS, validate_args=False)  # the changed row is off log Δ
    y = d.rsample()
    exact = d.log_prob(y)
    assert torch.isfinite(exact).all()
    y[0, 1] = -math.inf  # now a boundary point of log Δ; the carried "finite" mark must not apply
    scored = d.log_prob(y)
    assert scored[0].item() == -math.inf
    torch.testing.assert_close(scored[1], exact[1], rtol=1e-12, atol=0)


def test_a_concrete_sample_changed_in_place_is_scored_from_its_new_value():
    d = pc.Concrete(0.5, logits=LOGITS)
    x = d.rsample()
    x.copy_(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64))
    fresh = x.clone()  # no carried coordinates: scored from log x
    torch.testing.assert_close(d.log_prob(x), d.log_prob(fresh), rtol=1e-12, atol=0)


def test_carried_coordinates_follow_views_of_the_sample():
    """A float32 sample at t = 0.01 has exact zeros; its expand/detach views are still scored exactly
    (Delta hands an autoguide's value to the model as value.expand(shape))."""
    d = pc.Concrete(0.01, logits=torch.randn(200, 10))
    x = d.rsample()
    assert (x == 0).any()
    exact = d.log_prob(x)
    assert torch.isfinite(exact).all()
    for view in (x.detach(), x.expand(x.shape), x.view_as(x)):
        torch.testing.assert_close(d.log_prob(view), exact, rtol=0, atol=0)
    copy = x.detach().clone()  # a copy is user data: scored from log x, the density's limit (+inf at
    with pytest.raises(ValueError, match="density is only a limit"):  # a vertex: refused under validation)
        d.log_prob(copy)
    unvalidated = pc.Concrete(0.01, logits=d.logits, validate_args=False)
    assert not torch.isfinite(unvalidated.log_prob(copy)).all()


def test_straight_through_sample_and_rsample_are_both_discrete():
    """pyro#3127: Pyro's RelaxedBernoulliStraightThrough.sample() returns the soft value. Ours
    returns the same discrete value from both, for the same seed."""
    for d in (pc.BinConcreteStraightThrough(0.5, logits=torch.randn(50)), pc.ConcreteStraightThrough(0.5, logits=torch.randn(50, 4))):
        torch.manual_seed(0)
        soft = d.rsample()
        torch.manual_seed(0)
        hard = d.sample()
        assert not hard.requires_grad
        torch.testing.assert_close(hard, soft.detach(), rtol=0, atol=0)
        assert set(hard.unique().tolist()) <= {0.0, 1.0}


def test_a_straight_through_sample_changed_in_place_has_no_relaxed_density():
    d = pc.BinConcreteStraightThrough(0.5, logits=torch.zeros(3))
    x = d.rsample()
    x.detach().fill_(1.0)
    with pytest.raises(ValueError, match="not a sample"):
        d.log_prob(x)


# ----------------------------------------------------------------------------- attacks on the carry
# A wrong finite number is the worst failure: every route by which the memory of a sample changes
# behind torch's back must end with the value scored from what it now holds.


def _scored_as_its_content(d, value):
    """log_prob of ``value`` equals that of a fresh copy of its content (no carried coordinates), or
    raises as the copy does (under validation, content where the density is +inf)."""
    fresh = value.detach().clone()
    try:
        expected = d.log_prob(fresh)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            d.log_prob(value)
        assert str(raised.value) == str(error)
        return
    torch.testing.assert_close(d.log_prob(value), expected, rtol=0, atol=0, equal_nan=True)


def _caught(d, value):
    """A sample whose memory changed behind the version counter: under validation it is scored as its
    content; without, the check is left to the device (nothing waits for it) and every score is NaN."""
    if d._validate_args:
        _scored_as_its_content(d, value)
    else:
        assert d.log_prob(value).isnan().all()


@pytest.mark.parametrize("validate", [True, False])
def test_an_edit_through_data_that_bypasses_the_version_counter_is_caught(validate):
    d = pc.Concrete(0.1, logits=5 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0)), validate_args=validate)
    x, other = d.rsample(), d.rsample()
    version = x._version
    x.data.copy_(other)  # .data has its own version counter
    assert x._version == version
    _caught(d, x)


@pytest.mark.parametrize("validate", [True, False])
def test_single_element_writes_through_numpy_and_dlpack_at_a_sentinel_are_caught(validate):
    """Writes that bypass the version counter are caught where they touch a sentinel element
    (the first element is always one); see README, Numerics, for what sentinels do not cover."""
    from torch.utils import dlpack

    # float64: no sample rounds to 0 or 1, so the edited value has a finite density to compare
    logits = torch.randn(200, 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    d = pc.BinConcrete(0.5, logits=logits, validate_args=validate)
    for alias in (lambda x: torch.from_numpy(x.detach().numpy()), lambda x: dlpack.from_dlpack(dlpack.to_dlpack(x.detach()))):
        x = d.rsample()
        exact = d.log_prob(x)
        alias(x)[0, 0] = 0.25
        scored = d.log_prob(x)
        _caught(d, x)
        assert not scored[0, 0] == exact[0, 0]


@pytest.mark.parametrize(
    "release",
    [
        lambda x: x.share_memory_(),  # what Module.share_memory() does to buffers
        lambda x: setattr(x, "data", torch.full_like(x, 1 / x.shape[-1])),
        lambda x: x.set_(torch.full_like(x, 1 / x.shape[-1]).untyped_storage(), 0, x.shape),
        lambda x: x.untyped_storage().resize_(0),
    ],
    ids=["share_memory_", "data=", "set_", "storage.resize_"],
)
def test_memory_released_while_the_sample_lives_is_never_scored_with_its_coordinates(release):
    """The sample object stays alive, its old memory goes back to the allocator, and an unrelated
    tensor of the same shape lands at the old address: it is scored from its own content."""
    d = pc.Concrete(0.1, logits=5 * torch.randn(64, 50, generator=torch.Generator().manual_seed(2)))
    reused = 0
    for _ in range(40):
        content = d.rsample().detach().clone()
        x = d.rsample()
        address = x.data_ptr()
        release(x)
        unrelated = content * 1.0  # a fresh allocation (version counter 0), often at the old address
        if unrelated.data_ptr() == address:
            reused += 1
            _scored_as_its_content(d, unrelated)
        if x.untyped_storage().nbytes():
            _scored_as_its_content(d, x)  # what the sample object holds now
    if reused == 0:
        pytest.skip("the allocator never reused the address")


@pytest.mark.parametrize("validate", [True, False])
def test_an_exp_concrete_sample_edited_through_data_is_refused_or_nan(validate):
    """Under validation the edited sample is checked as any value (off log Δ: refused); without, the
    memory check runs on the device and every score is NaN, never the old sample's density."""
    d = pc.ExpConcrete(0.5, logits=LOGITS, validate_args=validate)
    y = d.rsample()
    y.data[0, 1] = -math.inf  # a boundary point of log Δ, behind the version counter
    if validate:
        with pytest.raises(ValueError, match="support"):
            d.log_prob(y)
        return
    assert d.log_prob(y).isnan().all()


# ----------------------------------------------------------------------------- gradients reach the sample


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_log_prob_of_an_own_sample_is_differentiable_with_respect_to_the_sample(name):
    """torch.autograd.grad(log_prob(z), z) for a non-leaf own sample equals the gradient at a leaf
    copy of it (interior points: T = 0.7, moderate logits), and the gradient with respect to the
    logits is unchanged: that of the density computed from the carried coordinates."""
    from pyro_concrete import _carry, _numerics

    logits = torch.randn(50, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    d = getattr(pc, name)(0.7, logits=logits)
    z = d.rsample()
    assert not z.is_leaf and ((z > 0) & (z < 1)).all()
    (by_sample,) = torch.autograd.grad(d.log_prob(z).sum(), z, retain_graph=True)
    leaf = z.detach().clone().requires_grad_()
    (by_leaf,) = torch.autograd.grad(d.log_prob(leaf).sum(), leaf)
    torch.testing.assert_close(by_sample, by_leaf, rtol=1e-9, atol=1e-9)

    (by_logits,) = torch.autograd.grad(d.log_prob(z).sum(), logits, retain_graph=True)
    y = _carry.carry.recall(z, ("log",) if name == "Concrete" else ("logit",))
    density = _numerics.concrete_log_prob if name == "Concrete" else _numerics.bin_concrete_log_prob
    (expected,) = torch.autograd.grad(density(y, d.logits, d.temperature).sum(), logits)
    torch.testing.assert_close(by_logits, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete", "ConcreteStraightThrough", "BinConcreteStraightThrough"])
def test_gradients_stay_exact_where_the_sample_underflowed(name):
    """float32, T = 0.05, logits over [-50, 50]: the sample has exact zeros (ones); the gradient with
    respect to the logits is exactly that through the carried coordinates, and the gradient with
    respect to the sample is finite (zero where it underflowed)."""
    from pyro_concrete import _carry, _numerics

    logits = torch.linspace(-50, 50, 60).reshape(10, 6).requires_grad_()
    d = getattr(pc, name)(0.05, logits=logits)
    z = d.rsample((20,))
    relaxed = name.replace("StraightThrough", "")
    kind = ("straight_through_" if relaxed != name else "") + ("log" if relaxed == "Concrete" else "logit")
    y = _carry.carry.recall(z, (kind,))
    if relaxed == "Concrete":
        assert (torch.exp(y) == 0).any()
    else:
        assert ((torch.sigmoid(y) == 0) | (torch.sigmoid(y) == 1)).any()
    # a second density scoring the same sample (prior and guide in SVI): the gradients of both meet
    # at z, where dy/dz is astronomically large for the subnormal entries of the sample
    other = getattr(pc, name)(0.1, logits=logits / 2)
    scored = 1000 * (d.log_prob(z).sum() + other.log_prob(z).sum())
    (by_logits, by_sample) = torch.autograd.grad(scored, [logits, z], retain_graph=True)
    density = _numerics.concrete_log_prob if relaxed == "Concrete" else _numerics.bin_concrete_log_prob
    through_y = 1000 * (density(y, d.logits, d.temperature).sum() + density(y, other.logits, other.temperature).sum())
    (expected,) = torch.autograd.grad(through_y, logits)
    assert torch.isfinite(by_logits).all() and torch.isfinite(by_sample).all()
    torch.testing.assert_close(by_logits, expected, rtol=1e-5, atol=1e-3)


def test_a_detached_alias_that_requires_grad_sends_no_gradient_to_the_sampler():
    logits = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    d = pc.Concrete(0.5, logits=logits)
    z = d.rsample()
    alias = z.detach().requires_grad_()  # same memory, carried; not on the sampler's graph
    lp = d.log_prob(alias).sum()
    (by_logits, by_alias) = torch.autograd.grad(lp, [logits, alias])
    leaf = z.detach().clone().requires_grad_()
    (leaf_logits, by_leaf) = torch.autograd.grad(d.log_prob(leaf).sum(), [logits, leaf])
    torch.testing.assert_close(by_alias, by_leaf, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(by_logits, leaf_logits, rtol=1e-9, atol=1e-9)  # the density's own dependence only


def _scored_sample(name, underflowed=False):
    """(logits, d, z, y, through_y, leaf_gradient): a sample z of d, its carried coordinates y, the
    gradient of log_prob with respect to the logits computed through y alone, and the gradient with
    respect to the sample computed at a leaf copy of it (scored from its values; None where the
    sample underflowed: T = 0.05, float32, logits over ±50, where each link splits its gradient)."""
    from pyro_concrete import _carry, _numerics

    logits = torch.randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if underflowed:
        logits = (20 * logits).float()
    logits.requires_grad_()
    d = getattr(pc, name)(0.05 if underflowed else 0.7, logits=logits)
    z = d.rsample()
    y = _carry.carry.recall(z, ("log",) if name == "Concrete" else ("logit",))
    if underflowed:
        x = torch.exp(y) if name == "Concrete" else torch.sigmoid(y)
        assert ((x == 0) | (x == 1)).any()
    density = _numerics.concrete_log_prob if name == "Concrete" else _numerics.bin_concrete_log_prob
    (through_y,) = torch.autograd.grad(density(y, d.logits, d.temperature).sum(), logits, retain_graph=True)
    if underflowed:
        return logits, d, z, y, through_y, None
    leaf = z.detach().clone().requires_grad_()
    (leaf_gradient,) = torch.autograd.grad(d.log_prob(leaf).sum(), leaf)
    return logits, d, z, y, through_y, leaf_gradient


def _backward(logits, d, z, y):
    d.log_prob(z).sum().backward()
    return logits.grad, None


def _grad_of_both(logits, d, z, y):
    return torch.autograd.grad(d.log_prob(z).sum(), [logits, z])


def _grad_of_the_coordinates(logits, d, z, y):
    """The gradient with respect to the carried coordinates alone, mapped to the logits by the
    sampler's own graph: it reaches y only through the sample's node, which must hand it over whole."""
    (by_y,) = torch.autograd.grad(d.log_prob(z).sum(), y, retain_graph=True)
    (mapped,) = torch.autograd.grad(y, logits, by_y)
    (direct,) = torch.autograd.grad(d.log_prob(z.detach()).sum(), logits)  # the density's own dependence
    return mapped + direct, None


def _retain_grad(logits, d, z, y):
    z.retain_grad()
    d.log_prob(z).sum().backward()
    return logits.grad, z.grad


def _twice(logits, d, z, y):
    scored = d.log_prob(z).sum()
    scored.backward(retain_graph=True)
    first, logits.grad = logits.grad, None
    scored.backward()
    torch.testing.assert_close(logits.grad, first, rtol=0, atol=0)
    return first, None


def _hook_in_place(logits, d, z, y):
    z.register_hook(lambda grad: grad.mul_(1.0))  # a hook that writes into the gradient (same values)
    d.log_prob(z).sum().backward()
    return logits.grad, None


@pytest.mark.parametrize("underflowed", [False, True], ids=["interior", "underflowed"])
@pytest.mark.parametrize("ask", [_backward, _grad_of_both, _grad_of_the_coordinates, _retain_grad, _twice, _hook_in_place])
@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_every_way_of_asking_for_the_gradient_of_log_prob_of_rsample_gets_the_same_numbers(name, ask, underflowed):
    """``d.log_prob(d.rsample())``: whether the gradient is asked for by ``backward``, by
    ``autograd.grad`` of the logits and the sample together or of the coordinates alone, with the
    sample's gradient retained, twice on a retained graph, or through a hook on the sample, the
    logits' gradient is the one through the carried coordinates, and the sample's that of a leaf
    copy (finite where the sample underflowed). When nothing but the density reached the sample, the
    sampler hands the coordinates the gradient the density gave them: bitwise then."""
    logits, d, z, y, through_y, leaf_gradient = _scored_sample(name, underflowed)
    by_logits, by_sample = ask(logits, d, z, y)
    exact = ask in (_backward, _twice)
    tolerance = 0 if exact else 1e-12 if not underflowed else 1e-5
    torch.testing.assert_close(by_logits, through_y, rtol=tolerance, atol=tolerance * through_y.abs().max().item())
    if by_sample is not None:
        assert torch.isfinite(by_sample).all()
        if leaf_gradient is not None:
            torch.testing.assert_close(by_sample, leaf_gradient, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_a_backward_pass_that_failed_midway_leaves_nothing_behind(name):
    """A hook on the sample raises after the density's link handed its gradient over to the sampler;
    the next pass over the same graph (a hook on the sample makes the sampler add the handed-over
    rests) gets the gradient through the coordinates, not the failed pass's leftovers added to it."""
    logits, d, z, y, through_y, _ = _scored_sample(name, underflowed=True)
    scored = d.log_prob(z).sum()

    def fail(grad):
        raise ValueError("a failing hook")

    handle = z.register_hook(fail)
    with pytest.raises(ValueError, match="a failing hook"):
        scored.backward(retain_graph=True)
    handle.remove()
    z.register_hook(lambda grad: 1.0 * grad)
    scored.backward()
    torch.testing.assert_close(logits.grad, through_y, rtol=1e-5, atol=1e-5 * through_y.abs().max().item())


@pytest.mark.parametrize("underflowed", [False, True], ids=["interior", "underflowed"])
@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_a_hook_that_edits_the_samples_gradient_in_place_acts_as_one_that_returns_the_edit(name, underflowed):
    """``grad.mul_(2)`` / ``grad.clamp_(-1, 1)`` in a hook on the sample: the logits' gradient equals
    that of the same hook returning a new tensor (the rest a link hands over is computed before any
    hook sees the gradient)."""

    def with_hook(hook):
        torch.manual_seed(0)  # the same sample each time
        logits, d, z, *_ = _scored_sample(name, underflowed)
        z.register_hook(hook)
        d.log_prob(z).sum().backward()
        return logits.grad

    for in_place, returned in ((lambda g: g.mul_(2), lambda g: 2 * g), (lambda g: g.clamp_(-1, 1), lambda g: g.clamp(-1, 1))):
        expected = with_hook(returned)
        torch.testing.assert_close(with_hook(in_place), expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())
    assert not torch.allclose(with_hook(lambda g: g.mul_(2)), with_hook(lambda g: None))


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_nested_and_concurrent_backward_passes_over_one_sample_keep_their_own_gradients(name):
    """A backward pass started inside another (from a hook on the sample) and two threads each
    differentiating their own score of the sample, one paused between the density and the sampler
    while the other runs: every pass gets the gradient through the coordinates."""
    import threading

    logits, d, z, y, through_y, _ = _scored_sample(name, underflowed=True)
    other = getattr(pc, name)(0.1, logits=logits.detach() / 2)
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * through_y.abs().max().item()}
    nested = []

    def start_another_pass(grad):
        if not nested:  # once: the inner pass reaches this hook too
            nested.append(None)
            with torch.enable_grad():
                nested[0] = torch.autograd.grad(other.log_prob(z).sum(), logits, retain_graph=True)[0]

    handle = z.register_hook(start_another_pass)
    (outer,) = torch.autograd.grad(d.log_prob(z).sum(), logits, retain_graph=True)
    handle.remove()
    torch.testing.assert_close(outer, through_y, **tolerance)
    assert len(nested) == 1 and torch.isfinite(nested[0]).all()

    first, second = d.log_prob(z).sum(), d.log_prob(z).sum()
    inside, done, got = threading.Event(), threading.Event(), {}

    def pause_first(grad):
        if threading.current_thread().name == "first":
            inside.set()
            done.wait(10)

    z.register_hook(pause_first)

    def run_first():
        got["first"] = torch.autograd.grad(first, logits, retain_graph=True)[0]

    def run_second():
        inside.wait(10)
        got["second"] = torch.autograd.grad(second, logits, retain_graph=True)[0]
        done.set()

    threads = [threading.Thread(target=run_first, name="first"), threading.Thread(target=run_second, name="second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for key in ("first", "second"):
        torch.testing.assert_close(got[key], through_y, **tolerance)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_passes_that_stop_at_the_sample_leave_at_most_one_pass_of_gradients_behind(name):
    """``torch.autograd.grad(log_prob, z)`` captures the gradient at the sample: the sampler's node
    does not run, so what its link handed it stays. Repeated on a retained graph, at most one pass's
    stays (each later one is dropped at its end), and passes through the sampler stay exact."""
    logits, d, z, y, through_y, _ = _scored_sample(name, underflowed=True)
    scored = d.log_prob(z).sum()
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * through_y.abs().max().item()}
    for _ in range(5):
        (by_sample,) = torch.autograd.grad(scored, z, retain_graph=True)
        assert torch.isfinite(by_sample).all()
        assert len(z.grad_fn.offers) == 1
    for _ in range(3):
        (by_logits,) = torch.autograd.grad(scored, logits, retain_graph=True)
        torch.testing.assert_close(by_logits, through_y, **tolerance)
        assert len(z.grad_fn.offers) == 1
    both = torch.autograd.grad(scored, [logits, z], retain_graph=True)
    torch.testing.assert_close(both[0], through_y, **tolerance)
    torch.testing.assert_close(both[1], by_sample, rtol=0, atol=0)
    assert len(z.grad_fn.offers) == 1


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
@pytest.mark.parametrize("underflowed", [False, True], ids=["float64", "underflowed"])
def test_checkpointed_scores_give_the_eager_gradient_or_refuse(name, underflowed):
    """``torch.utils.checkpoint`` around the density of a sample drawn outside it. Without reentrance
    (torch's recommended mode) the gradient is eager's. The reentrant mode recomputes the function on
    a detached alias of the sample inside the backward pass and hands its gradient back to the
    sample: exact where the sample's value carries it all, and refused (RuntimeError) where the
    sample underflowed, where the part its value cannot carry would be lost, a wrong finite gradient."""
    from torch.utils.checkpoint import checkpoint

    logits, d, z, y, through_y, _ = _scored_sample(name, underflowed=underflowed)
    prior = getattr(pc, name)(d.temperature, logits=torch.zeros_like(logits.detach()))

    def score(value):
        return prior.log_prob(value).sum()

    def gradient(run):
        logits.grad = None
        run().backward(retain_graph=True)
        return logits.grad.clone()

    tolerance = {"rtol": 1e-5, "atol": 1e-5} if underflowed else {"rtol": 1e-12, "atol": 1e-12}
    eager = gradient(lambda: score(z))
    torch.testing.assert_close(gradient(lambda: checkpoint(score, z, use_reentrant=False)), eager, **tolerance)
    if underflowed:
        with pytest.raises(RuntimeError, match="use_reentrant=False"):
            gradient(lambda: checkpoint(score, z, use_reentrant=True))
    else:
        torch.testing.assert_close(gradient(lambda: checkpoint(score, z, use_reentrant=True)), eager, **tolerance)


def test_a_sample_detached_in_place_sends_no_gradient_to_the_sampler():
    """``z.detach_()`` makes the sample a constant: its density's gradient with respect to the logits
    is the density's own dependence on them, not the path through the sampler."""
    from pyro_concrete import _numerics

    logits, d, z, y, _, _ = _scored_sample("Concrete")
    z.detach_()
    (got,) = torch.autograd.grad(d.log_prob(z).sum(), logits)
    (expected,) = torch.autograd.grad(_numerics.concrete_log_prob(y.detach(), d.logits, d.temperature).sum(), logits)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_a_sample_also_used_elsewhere_gets_both_gradients(name):
    """The sample scored and fed to a decoder: the gradient with respect to the logits is that of the
    same loss written on the coordinates."""
    logits, d, z, y, _, _ = _scored_sample(name)
    from pyro_concrete import _numerics

    weights = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    show = torch.exp if name == "Concrete" else torch.sigmoid
    density = _numerics.concrete_log_prob if name == "Concrete" else _numerics.bin_concrete_log_prob
    (expected,) = torch.autograd.grad(density(y, d.logits, d.temperature).sum() + (show(y) * weights).sum(), logits, retain_graph=True)
    (by_logits,) = torch.autograd.grad(d.log_prob(z).sum() + (z * weights).sum(), logits)
    torch.testing.assert_close(by_logits, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("temperature, dtype", [(0.7, torch.float64), (0.05, torch.float32)], ids=["interior", "underflowed"])
@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_second_derivatives_of_log_prob_of_rsample_are_those_through_the_coordinates(name, temperature, dtype):
    """``create_graph=True`` (Hessian-vector products, gradient penalties): the gradient of the squared
    gradient with respect to the logits equals that of the density written on the carried
    coordinates, also where the sample underflowed (T = 0.05, float32, scored by two densities)."""
    from pyro_concrete import _carry, _numerics

    logits = (10 * torch.randn(40, 6, generator=torch.Generator().manual_seed(5))).to(dtype).requires_grad_()
    d = getattr(pc, name)(temperature, logits=logits)
    other = getattr(pc, name)(2 * temperature, logits=logits / 2)
    # seeded: in float32 both sides lose up to 1e-3 of the largest entry to cancellation on some
    # samples (6 of 40 seeds for Concrete, the same before and after issue 30's changes)
    torch.manual_seed(0)
    z = d.rsample()
    y = _carry.carry.recall(z, ("log",) if name == "Concrete" else ("logit",))
    if dtype == torch.float32:
        x = torch.exp(y) if name == "Concrete" else torch.sigmoid(y)
        assert ((x == 0) | (x == 1)).any()
    density = _numerics.concrete_log_prob if name == "Concrete" else _numerics.bin_concrete_log_prob

    def second(scored):
        (first,) = torch.autograd.grad(scored, logits, create_graph=True, retain_graph=True)
        return torch.autograd.grad((first**2).sum(), logits, retain_graph=True)[0]

    expected = second(density(y, d.logits, d.temperature).sum() + density(y, other.logits, other.temperature).sum())
    by_sample = second(d.log_prob(z).sum() + other.log_prob(z).sum())
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(by_sample, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


# torch's own: forward-mode AD loads its decompositions with torch.jit.script on first use
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_forward_mode_derivatives_of_log_prob_and_rsample(name):
    """``torch.autograd.forward_ad`` and ``torch.func``: the tangent of ``log_prob(rsample())`` in the
    logits equals the reverse-mode gradient's projection; a dual made from the sample, or from a
    detached alias of it, has the tangent of a leaf copy; jvp and jacrev of rsample agree with central
    differences (float64)."""
    import torch.autograd.forward_ad as fwAD

    generator = torch.Generator().manual_seed(6)
    a, direction = torch.randn(2, 3, 6, dtype=torch.float64, generator=generator)

    def scored(a):
        torch.manual_seed(7)
        d = getattr(pc, name)(0.6, logits=a)
        return d.log_prob(d.rsample()).sum()

    def sample(a):
        torch.manual_seed(7)
        return getattr(pc, name)(0.6, logits=a, validate_args=False).rsample()

    leaf = a.clone().requires_grad_()
    scored(leaf).backward()
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(scored(fwAD.make_dual(a, direction))).tangent
    torch.testing.assert_close(tangent, (leaf.grad * direction).sum(), rtol=1e-10, atol=1e-10)

    d = getattr(pc, name)(0.6, logits=a)
    z = d.rsample()
    copy = z.detach().clone()
    with fwAD.dual_level():
        expected = fwAD.unpack_dual(d.log_prob(fwAD.make_dual(copy, direction))).tangent
        for value in (z, z.detach()):
            got = fwAD.unpack_dual(d.log_prob(fwAD.make_dual(value, direction))).tangent
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)

    central = (sample(a + 1e-6 * direction) - sample(a - 1e-6 * direction)) / 2e-6
    _, jvp = torch.func.jvp(sample, (a,), (direction,))
    torch.testing.assert_close(jvp, central, rtol=1e-6, atol=1e-8)
    jacobian = torch.func.jacrev(sample)(a)
    torch.testing.assert_close(torch.einsum("ijkl,kl->ij", jacobian, direction), central, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------- Pyro's generic machinery


@pytest.mark.parametrize("name", ["ConcreteStraightThrough", "BinConcreteStraightThrough", "Concrete", "BinConcrete"])
@pytest.mark.parametrize("base_batch, batch", [((), (5, 2)), ((3, 1), (2, 3, 4))], ids=["leading", "interstitial"])
def test_pyro_expanded_distribution_carries_the_coordinates(name, base_batch, batch):
    """Pyro's generic ExpandedDistribution (TorchDistribution.expand's fallback) draws with the base's
    sampler and permutes/reshapes the draw: its samples are still scored exactly (T = 0.05, logits
    over [-20, 20]: the relaxed samples underflow, so a value scored from its content would not be)."""
    from pyro.distributions.torch_distribution import ExpandedDistribution, TorchDistribution

    event = (4,) if name.startswith("Concrete") else ()
    logits = torch.linspace(-20.0, 20.0, math.prod(base_batch + event) or 1).reshape(base_batch + event)
    base = getattr(pc, name)(0.05, logits=logits)
    large = TorchDistribution.expand(base, torch.Size(batch))
    assert isinstance(large, ExpandedDistribution)
    value = large.rsample((7,))
    scored = large.log_prob(value)
    assert scored.shape == (7,) + batch and torch.isfinite(scored).all()


@pytest.mark.parametrize("name", ["Concrete", "ExpConcrete", "ConcreteStraightThrough", "BinConcrete", "LogitBinConcrete", "BinConcreteStraightThrough"])
def test_infer_shapes_agrees_with_the_distribution(name):
    n_ary = name.startswith(("Concrete", "ExpConcrete"))
    # temperature is a batch parameter: it broadcasts with the logits' batch shape
    cases = [((), (3, 5)), ((3,), (3, 5)), ((2, 1), (3, 5))] if n_ary else [((), (3, 5)), ((5,), (3, 5)), ((2, 1, 1), (3, 1))]
    for temperature_shape, logits_shape in cases:
        cls = getattr(pc, name)
        batch_shape, event_shape = cls.infer_shapes(temperature=temperature_shape, logits=logits_shape)
        d = cls(torch.ones(temperature_shape), logits=torch.zeros(logits_shape))
        assert (batch_shape, event_shape) == (d.batch_shape, d.event_shape)
        assert cls.infer_shapes(temperature=temperature_shape, probs=logits_shape) == (d.batch_shape, d.event_shape)


def test_clearing_the_carry_scores_an_own_sample_from_its_values():
    """``carry.clear()`` forgets every sample: afterwards an underflowed own sample is scored from its
    values, as a copy is (the density's boundary limit), where before it was scored exactly."""
    from pyro_concrete._carry import carry

    d = pc.Concrete(0.05, logits=torch.linspace(-20, 20, 8), validate_args=False)
    torch.manual_seed(0)
    z = d.rsample((50,))
    assert (z == 0).any() and carry.recall(z, ("log",)) is not None and len(carry) >= 1
    exact = d.log_prob(z)
    assert torch.isfinite(exact).all()
    carry.clear()
    assert len(carry) == 0 and carry.recall(z, ("log",)) is None
    from_values = d.log_prob(z)
    assert torch.equal(from_values, d.log_prob(z.clone()))
    underflowed = (z == 0).any(-1)
    assert underflowed.any() and not torch.isfinite(from_values[underflowed]).any()


_SAMPLERS = ["Concrete", "ExpConcrete", "ConcreteStraightThrough", "BinConcrete", "LogitBinConcrete", "BinConcreteStraightThrough"]


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("name", _SAMPLERS)
def test_samples_drawn_under_inference_mode_are_scored_as_eager_ones(name, validate):
    """``torch.inference_mode`` (evaluation) makes tensors without a version counter: the carry
    compares their memory in full instead. Float32 at t = 0.05, where samples underflow and only the
    carried coordinates score them: the values of the same draw outside inference mode."""
    logits = torch.linspace(-6.0, 6.0, 40).reshape(4, 10)
    d = getattr(pc, name)(0.05, logits=logits, validate_args=validate)
    torch.manual_seed(3)
    x = d.rsample((3,))
    eager = d.log_prob(x)
    with torch.inference_mode():
        torch.manual_seed(3)
        y = d.rsample((3,))
        scored = d.log_prob(y)
    assert y.is_inference() and torch.equal(x, y)
    assert torch.isfinite(eager).all() and torch.equal(scored, eager)


@pytest.mark.parametrize("validate", [True, False])
def test_an_inference_tensor_sample_edited_in_place_is_scored_from_its_new_value(validate):
    """No version counter sees the edit: the memory, compared in full, does (any row, not only the
    sentinel rows an ordinary sample is checked at), as for an edit behind the counter."""
    d = pc.Concrete(0.5, logits=torch.randn(64, 6, dtype=torch.float64), validate_args=validate)
    with torch.inference_mode():
        x = d.rsample()
        x[37] = torch.full((6,), 1.0 / 6, dtype=torch.float64)  # not a sentinel row of 64
        _caught(d, x)


def test_a_loss_evaluated_under_inference_mode_equals_it_under_no_grad():
    import pyro
    import pyro.distributions as dist

    data = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])

    def model():
        with pyro.plate("data", 2):
            z = pyro.sample("z", pc.Concrete(0.1, logits=torch.zeros(4)))
            pyro.sample("x", dist.Bernoulli(logits=z @ torch.randn(4, 3, generator=torch.Generator().manual_seed(0))).to_event(1), obs=data)

    def guide():
        with pyro.plate("data", 2):
            pyro.sample("z", pc.Concrete(0.1, logits=torch.tensor([2.0, -1.0, 0.0, 0.5])))

    values = []
    for context in (torch.no_grad, torch.inference_mode):
        pyro.set_rng_seed(5)
        with context():
            values.append(pc.ImportanceWeightedELBO(4).loss(model, guide))
    assert math.isfinite(values[0]) and values[0] == values[1]


@pytest.mark.parametrize("make", [lambda: pc.ScoreFunctionELBO(plate="data"), lambda: pc.VIMCO(2, plate="data")])
def test_a_loss_per_element_of_a_sequential_plate_says_it_needs_a_vectorized_one(make):
    """``for i in pyro.plate(...)`` has no dimension to hold one value per element: a ValueError that
    names the plate (it once failed with "unsupported operand type(s) for +: 'int' and 'NoneType'")."""
    import pyro
    import pyro.distributions as dist

    data = torch.tensor([0.4, 2.5, -0.3, 1.8], dtype=torch.float64)

    def model():
        for i in pyro.plate("data", 4, subsample_size=2):
            z = pyro.sample(f"z_{i}", dist.Bernoulli(torch.tensor(0.4, dtype=torch.float64)))
            pyro.sample(f"x_{i}", dist.Normal(2.0 * z, 1.0), obs=data[i])

    def guide():
        phi = pyro.param("phi", torch.tensor(0.3, dtype=torch.float64))
        for i in pyro.plate("data", 4, subsample_size=2):
            pyro.sample(f"z_{i}", dist.Bernoulli(logits=phi))

    pyro.clear_param_store()
    with pytest.raises(ValueError, match=r"site 'z_\d' is in plate 'data' iterated sequentially .*vectorized plate .*plate=None"):
        make().loss_and_grads(model, guide)


# ----------------------------------------------------------------------------- nothing waits for the device


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every operation that hands a tensor's content to the host (``.item()``, ``float()``,
    ``bool()``, ``torch.equal``) or makes a tensor of host data (``torch.tensor``, a copy to a GPU):
    on a GPU each one waits for the device to finish its queue."""

    READS = ("aten._local_scalar_dense", "aten.equal", "aten.is_nonzero", "aten.item", "aten.lift_fresh")

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.READS):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


_UNVALIDATED = {
    "Concrete": lambda a: pc.Concrete(0.05, logits=a, validate_args=False),
    "ExpConcrete": lambda a: pc.ExpConcrete(0.05, logits=a, validate_args=False),
    "BinConcrete": lambda a: pc.BinConcrete(0.05, logits=a, validate_args=False),
    "LogitBinConcrete": lambda a: pc.LogitBinConcrete(0.05, logits=a, validate_args=False),
    "ConcreteStraightThrough": lambda a: pc.ConcreteStraightThrough(0.05, logits=a, validate_args=False),
    "BinConcreteStraightThrough": lambda a: pc.BinConcreteStraightThrough(0.05, logits=a, validate_args=False),
    "HardConcrete": lambda a: pc.HardConcrete(0.05, logits=a, validate_args=False),
}


@pytest.mark.parametrize("name", list(_UNVALIDATED))
def test_without_validation_sampling_scoring_and_their_gradient_read_nothing_back_from_the_device(name, monkeypatch):
    """Issue 30: ``d.log_prob(d.rsample()).sum()`` and its gradient, validation off, at T = 0.05 in
    float32 where samples underflow, with the distribution built from a Python-number temperature:
    no operation reads a tensor back to the host, and the score is the exact one from the carried
    coordinates (finite; the same as with validation on, which may read). The CPU run as a GPU:
    ``HOST_DEVICES`` empty (on the CPU the carry reads where that saves passes, the same values)."""
    from pyro_concrete import _carry

    monkeypatch.setattr(_carry, "HOST_DEVICES", ())
    logits = (20 * torch.randn(64, 6, generator=torch.Generator().manual_seed(0))).requires_grad_()
    make = _UNVALIDATED[name]
    torch.manual_seed(1)
    with _HostReads() as mode:
        d = make(logits)
        x = d.rsample()
        score = d.log_prob(x)
        score.sum().backward(retain_graph=True)
        other = make(logits.detach() / 2)  # a second density scoring the sample (a prior in SVI)
        (score.sum() + other.log_prob(x).sum()).backward()
    assert mode.reads == []
    assert torch.isfinite(score).all() and torch.isfinite(logits.grad).all()
    validated = d.__class__.__new__(d.__class__)
    validated.__dict__.update(d.__dict__, _validate_args=True)
    torch.testing.assert_close(score, validated.log_prob(x), rtol=0, atol=0)


def test_the_host_read_recorder_sees_the_reads_it_must_catch():
    """The recorder of the test above sees the read the carry makes under validation (its memory
    check, decided on the host) and each kind of read it looks for."""
    logits = torch.randn(64, 6)
    with _HostReads() as mode:
        d = pc.Concrete(0.5, logits=logits, validate_args=True)
        d.log_prob(d.rsample())
    assert "aten.equal.default" in mode.reads
    with _HostReads() as mode:
        x = torch.zeros(3)
        float(x.sum()), bool(x.any()), torch.equal(x, x), torch.tensor(0.5)
    assert len(mode.reads) == 4


def test_half_precision_logits_from_autocast_are_refused_with_the_fix_named():
    """Under ``torch.autocast`` a network's logits are bfloat16, where |logits| > 0.25 lose the
    sampler's noise: refused, and the message names what such a user does (``logits.float()``)."""
    net = torch.nn.Linear(3, 4)
    torch.nn.init.constant_(net.weight, 1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = net(torch.ones(2, 3))
        assert logits.dtype == torch.bfloat16
        with pytest.raises(ValueError, match=r"under autocast are half precision: pass logits\.float\(\)"):
            pc.BinConcrete(0.5, logits=logits)
        d = pc.BinConcrete(0.5, logits=logits.float())
        x = d.rsample()
        assert x.dtype == torch.float32 and torch.isfinite(d.log_prob(x)).all()


@pytest.mark.parametrize("temperature", [-1.0, 0.0])
def test_an_unvalidated_invalid_temperature_gives_nan_not_a_finite_number(temperature):
    """A tensor temperature validation does not read (off by the user, or for the whole process by a
    ``torch.compile`` call: a learned one gone negative): the densities are NaN (their
    log(temperature)), and so are the cdf, icdf and Hard Concrete's point masses, which took none of
    its log. They were finite numbers of no distribution: at temperature -1, P(Z = 0) = 0.87 and
    P(Z = 1) = 0.95, prob_nonzero 0.13 (L0Objective's penalty), cdfs of 0.59 and 0.31. NumPyro's
    mirror: tests/test_numpyro_jax.py."""
    logits = torch.tensor(0.3)
    outputs = {
        "HardConcrete.log_prob": lambda t: pc.HardConcrete(t, logits=logits, validate_args=False).log_prob(torch.tensor([0.0, 1.0])),
        "HardConcrete.cdf": lambda t: pc.HardConcrete(t, logits=logits, validate_args=False).cdf(torch.tensor(0.5)),
        "HardConcrete.prob_nonzero": lambda t: pc.HardConcrete(t, logits=logits, validate_args=False).prob_nonzero,
        "HardConcrete.discrete": lambda t: pc.HardConcrete(t, logits=logits, validate_args=False).discrete().probs,
        "BinConcrete.cdf": lambda t: pc.BinConcrete(t, logits=logits, validate_args=False).cdf(torch.tensor(0.4)),
        "BinConcrete.icdf": lambda t: pc.BinConcrete(t, logits=logits, validate_args=False).icdf(torch.tensor(0.4)),
        "LogitBinConcrete.cdf": lambda t: pc.LogitBinConcrete(t, logits=logits, validate_args=False).cdf(torch.tensor(0.4)),
        "LogitBinConcrete.icdf": lambda t: pc.LogitBinConcrete(t, logits=logits, validate_args=False).icdf(torch.tensor(0.4)),
    }
    for name, fn in outputs.items():
        assert torch.isnan(fn(torch.tensor(temperature))).all(), name
        assert torch.isfinite(fn(torch.tensor(0.5))).all(), name


def test_a_certain_coin_given_by_logits_is_refused_by_the_helpers_and_relax():
    """``Bernoulli(logits=-inf)``: torch scores the certain outcome NaN, and the exact sum was -inf
    (log p(x) = -13.42 where x = 5 from a coin that is always 0: ninth round of user trials);
    ``relax`` of -inf logits called them probabilities the host clamps, though the user gave logits."""
    import pyro
    import pyro.distributions as dist
    from pyro_concrete import marginal_log_likelihood, relax

    def model(logits, x):
        z = pyro.sample("z", dist.Bernoulli(logits=logits))
        pyro.sample("x", dist.Normal(5.0 * z, 1.0), obs=x)

    with pytest.raises(ValueError, match=r"^marginal_log_likelihood: site 'z' is Bernoulli with a logit of \+-inf .* torch scores the certain outcome NaN"):
        marginal_log_likelihood(model, torch.tensor(-float("inf")), torch.tensor(0.0))
    exact = float(dist.Normal(0.0, 1.0).log_prob(torch.tensor(5.0)))
    assert abs(float(marginal_log_likelihood(model, torch.tensor(-40.0), torch.tensor(5.0))) - exact) < 1e-6
    with pytest.raises(ValueError, match=r"^relax: site 'z' is Bernoulli with a logit of \+-inf .* no Concrete distribution has a probability of 0"):
        pyro.poutine.trace(relax(model, temperature=0.5)).get_trace(torch.tensor(-float("inf")), torch.tensor(0.0))


@pytest.mark.parametrize("family", ["BinConcrete", "LogitBinConcrete", "HardConcrete", "Concrete"])
def test_auto_discrete_parallel_guides_the_discrete_graph_of_every_relaxed_family(family):
    """AutoDiscreteParallel builds a guide from the site's distribution class, the host's own only:
    it raised "Bernoulli is not supported" for the library's Bernoulli limit of a BinConcrete site.
    Its initial guide is the prior, so TraceEnum_ELBO's value is E_prior[log p(x | z)], by enumeration."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer import TraceEnum_ELBO
    from pyro.infer.autoguide import AutoDiscreteParallel

    logits = torch.tensor([0.3, -1.1, 2.0], dtype=torch.float64)
    data = torch.tensor([0.4, -0.8, 1.7], dtype=torch.float64)
    if family == "Concrete":
        logits = torch.tensor([[0.3, -1.1, 0.5], [2.0, 0.0, -0.4], [-1.0, 1.0, 0.2]], dtype=torch.float64)
        relaxed = pc.Concrete(0.5, logits=logits)
    elif family == "HardConcrete":
        relaxed = pc.HardConcrete(0.5, logits=logits)
    else:
        relaxed = getattr(pc, family)(0.5, logits=logits)
    limit = relaxed.discrete()

    def model():
        with pyro.plate("data", 3):
            z = pyro.sample("z", relaxed)
            if family == "LogitBinConcrete":
                z = (z > 0).to(data.dtype)
            elif family == "Concrete":
                z = z @ torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
            pyro.sample("x", dist.Normal(2.0 * z, 1.0), obs=data)

    pyro.clear_param_store()
    evaluated = pc.discrete(model, mode="enumerate")
    guide = AutoDiscreteParallel(evaluated)
    elbo = TraceEnum_ELBO(max_plate_nesting=1).loss(evaluated, guide)
    # exact: per data point, the prior's expectation of log N(x | 2 z, 1) over the limit's support
    values = limit.enumerate_support(expand=False)
    log_p = limit.log_prob(values).exp()
    z_values = values if family != "Concrete" else values @ torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    if family == "LogitBinConcrete":
        z_values = (values > 0).to(data.dtype)
    exact = (log_p * dist.Normal(2.0 * z_values, 1.0).log_prob(data)).sum()
    assert -elbo == pytest.approx(exact.item(), rel=1e-12, abs=1e-12)


def test_relax_keeps_a_mark_for_monte_carlo_enumeration_for_trace_tmc_elbo():
    """relax(config_enumerate(model, num_samples=n)): the relaxed site keeps its mark, which
    TraceTMC_ELBO reads to draw n values of the continuous site and average over them; without it,
    TMC scored one draw as if summed ("log p(x)" of +2.2 on average, +15 at worst, for -1.36). The
    same seed gives the loss of the relaxed site written by hand with that mark, value for value."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer import TraceTMC_ELBO, config_enumerate

    logits = torch.tensor([0.3, -0.5, 1.0], dtype=torch.float64)
    locs = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    x = torch.tensor(0.7, dtype=torch.float64)

    def written():
        z = pyro.sample("z", dist.OneHotCategorical(logits=logits))
        pyro.sample("x", dist.Normal(z @ locs, 1.0), obs=x)

    def by_hand():
        z = pyro.sample("z", pc.Concrete(0.5, logits=logits), infer={"enumerate": "parallel", "num_samples": 200})
        pyro.sample("x", dist.Normal(z @ locs, 1.0), obs=x)

    relaxed = pc.relax(config_enumerate(written, num_samples=200), temperature=0.5)
    tmc = TraceTMC_ELBO(max_plate_nesting=0)
    for seed in range(3):
        pyro.set_rng_seed(seed)
        expected = tmc.loss(by_hand, lambda: None)
        pyro.set_rng_seed(seed)
        assert tmc.loss(relaxed, lambda: None) == pytest.approx(expected, rel=1e-12)
    # and the mark without num_samples still goes (TraceEnum_ELBO cannot sum a continuous site)
    plain = pyro.poutine.trace(pc.relax(config_enumerate(written), temperature=0.5)).get_trace()
    assert "enumerate" not in plain.nodes["z"]["infer"]


def test_a_vectorized_markov_chain_is_refused_not_summed_as_separate_sites():
    """Pyro's funsor backend traces a vectorized_markov chain as overlapping slices, one a copy marked
    not to be scored (only its own TraceMarkovEnum_ELBO reads the mark): summed as separate sites,
    log p(x) of a 3-step chain was -6.4598 for -3.8486, and the decodings disagreed with themselves."""
    funsor = pytest.importorskip("funsor")
    backend = funsor.get_backend()  # put back after: NumPyro's tests in this process use funsor's jax backend
    try:
        import pyro.contrib.funsor  # noqa: F401  (sets funsor's torch backend)

        funsor.set_backend("torch")
        _refuses_vectorized_markov()
    finally:
        funsor.set_backend(backend)


def _refuses_vectorized_markov():
    import pyro
    from pyroapi import distributions as dist
    from pyroapi import pyro as ppyro
    from pyroapi import pyro_backend

    y = torch.tensor([0.3, 1.5, -0.2], dtype=torch.float64)
    transition = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)

    def model():
        previous = None
        for t in ppyro.vectorized_markov(name="time", size=3, dim=-1):
            probs = transition[0] if isinstance(t, int) else transition[previous]
            x = ppyro.sample(f"x_{t}", dist.Categorical(probs), infer={"enumerate": "parallel"})
            ppyro.sample(f"y_{t}", dist.Normal(x.double(), 1.0), obs=y[t] if not isinstance(t, int) else y[0])
            previous = x

    def guide():
        pass

    with pyro_backend("contrib.funsor"):
        for helper in (pc.marginal_log_likelihood, pc.map_assignment, pc.sample_assignment):
            with pytest.raises(ValueError, match=f"{helper.__name__}: site 'x_slice.*vectorized_markov"):
                helper(model)
        with pytest.raises(ValueError, match="vectorized_markov"):
            pc.discrete_log_likelihood(model, guide, num_particles=4)
        pyro.clear_param_store()


def test_sample_assignment_where_the_hosts_infer_discrete_fails_draws_site_by_site():
    """Pyro's infer_discrete(temperature=1) fails on a group-level discrete effect read by a markov
    chain in an inner plate (examples/mixed_hmm's structure: RuntimeError "shape '[2, 2, 2]' is invalid
    for input of size 4"), which the helpers can sum; sample_assignment now draws such a model site by
    site. Groups are independent a posteriori: each group's joint (a, y_0, y_1 of both individuals;
    32 cells) against brute force, chi-square with cells of expected count below 5 merged, each at
    a false-failure rate of 1e-5."""
    import itertools

    import pyro
    import pyro.distributions as dist
    from scipy import stats

    steps, individuals, draws = 2, 2, 500
    x = torch.tensor([[[0.3, -1.2], [1.5, 0.8]], [[-0.4, 2.2], [0.1, 1.1]]], dtype=torch.float64)  # (ind, group, t)
    transition = torch.tensor([[[2.0, -1.0], [-1.0, 2.0]], [[-1.0, 2.0], [2.0, -1.0]]], dtype=torch.float64)
    a_logits = torch.tensor([0.2, -0.3], dtype=torch.float64)

    def model():
        with pyro.plate("group", 2, dim=-1):
            a = pyro.sample("a", dist.Categorical(logits=a_logits))
            with pyro.plate("ind", individuals, dim=-2):
                y = torch.tensor(0)
                for t in pyro.markov(range(steps)):
                    rows = (torch.nn.functional.one_hot(a, 2).double()[..., None, None] * transition).sum(-3)
                    logits = (torch.nn.functional.one_hot(y, 2).double().unsqueeze(-1) * rows).sum(-2)
                    y = pyro.sample(f"y_{t}", dist.Categorical(logits=logits))
                    pyro.sample(f"x_{t}", dist.Normal(y.double(), 1.0), obs=x[..., t])

    def log_joint(g, a, y):
        total = torch.log_softmax(a_logits, -1)[a]
        for i in range(individuals):
            previous = 0
            for t in range(steps):
                total = total + torch.log_softmax(transition[a][previous], -1)[y[i][t]]
                total = total + dist.Normal(float(y[i][t]), 1.0).log_prob(x[i, g, t])
                previous = y[i][t]
        return total.item()

    cells = list(itertools.product(range(2), repeat=1 + individuals * steps))
    counts = np.zeros((2, len(cells)))
    pyro.set_rng_seed(0)
    for _ in range(draws):
        drawn = pc.sample_assignment(model)
        for g in range(2):
            cell = (int(drawn["a"][g]),) + tuple(int(drawn[f"y_{t}"][i, g]) for i in range(individuals) for t in range(steps))
            counts[g, cells.index(cell)] += 1
    for g in range(2):
        log_p = np.array([log_joint(g, c[0], [c[1 + i * steps : 1 + (i + 1) * steps] for i in range(individuals)]) for c in cells])
        expected = draws * np.exp(log_p - np.logaddexp.reduce(log_p))
        big = expected >= 5
        observed = np.append(counts[g][big], counts[g][~big].sum())
        expected = np.append(expected[big], expected[~big].sum())
        chi2 = ((observed - expected) ** 2 / expected).sum()
        assert stats.chi2.sf(chi2, len(expected) - 1) > 1e-5, (g, chi2, len(expected) - 1)


def test_a_categorical_given_probabilities_with_zeros_is_summed_exactly():
    """A left-to-right chain whose transition rows hold zeros, written with Pyro's Categorical(probs):
    torch clamps the zeros to eps before taking logits, and the helpers refused the model (tenth round
    of user trials); they now enumerate it by the probabilities' own logarithms. Brute force over
    the 27 paths; the MAP is the best of them."""
    import itertools

    import pyro
    import pyro.distributions as dist

    transition = torch.tensor([[0.6, 0.4, 0.0], [0.0, 0.7, 0.3], [0.0, 0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0.1, 1.3, 2.2], dtype=torch.float64)

    def model():
        state = torch.tensor(0)
        for t in pyro.markov(range(3)):
            state = pyro.sample(f"s_{t}", dist.Categorical(probs=transition[state]))
            pyro.sample(f"y_{t}", dist.Normal(state.double(), 0.5), obs=y[t])

    paths = list(itertools.product(range(3), repeat=3))

    def log_joint(path):
        previous, total = 0, 0.0
        for t, state in enumerate(path):
            total += math.log(transition[previous, state]) if transition[previous, state] > 0 else -math.inf
            total += dist.Normal(torch.tensor(float(state), dtype=torch.float64), 0.5).log_prob(y[t]).item()
            previous = state
        return total

    log_p = np.array([log_joint(path) for path in paths])
    assert pc.marginal_log_likelihood(model).item() == pytest.approx(np.logaddexp.reduce(log_p), rel=1e-12)
    best = pc.map_assignment(model)
    assert tuple(int(best[f"s_{t}"]) for t in range(3)) == paths[int(np.argmax(log_p))]
    for _ in range(20):
        drawn = pc.sample_assignment(model)
        assert log_joint(tuple(int(drawn[f"s_{t}"]) for t in range(3))) > -math.inf, drawn


def test_a_site_given_logits_whose_probabilities_were_read_is_summed_by_its_logits():
    """torch computes a distribution's probabilities from its logits once anything reads them (a
    ``.sample()`` of a prior built outside the model) and keeps them: sigmoid(20) = 1 in float32.
    Only probabilities that torch clamped are taken for their own logarithms (a first version of the
    tenth round's fix took every cached probability: -50.92 for -20.92). Exact: only z = 0 explains
    x = -20 under Normal(40 z - 20, 1)."""
    import pyro
    import pyro.distributions as dist

    prior = dist.Bernoulli(logits=torch.tensor(20.0))
    prior.sample()  # reads the probabilities: cached, rounded to 1

    def model():
        z = pyro.sample("z", prior)
        pyro.sample("x", dist.Normal(40.0 * z - 20.0, 1.0), obs=torch.tensor(-20.0))

    expected = float(torch.nn.functional.logsigmoid(torch.tensor(-20.0, dtype=torch.float64))) - 0.5 * math.log(2 * math.pi)
    assert pc.marginal_log_likelihood(model).item() == pytest.approx(expected, rel=1e-6)
    assert pc.map_assignment(model)["z"].item() == 0


def test_the_site_by_site_draw_under_a_common_scale():
    """A model drawn site by site (the host's infer_discrete fails on it) under poutine.scale(1/N):
    an element's shares sum to the scale, and were taken for "no posterior" below one half. Each
    draw is the one the unscaled model gives with the same seed."""
    import pyro
    import pyro.distributions as dist

    transition = torch.tensor([[[2.0, -1.0], [-1.0, 2.0]], [[-1.0, 2.0], [2.0, -1.0]]], dtype=torch.float64)
    x = torch.zeros(2, 2, 2, dtype=torch.float64)

    def model():
        with pyro.poutine.scale(scale=0.1), pyro.plate("group", 2, dim=-1):
            a = pyro.sample("a", dist.Categorical(logits=torch.zeros(2, dtype=torch.float64)))
            with pyro.plate("ind", 2, dim=-2):
                y = torch.tensor(0)
                for t in pyro.markov(range(2)):
                    rows = (torch.nn.functional.one_hot(a, 2).double()[..., None, None] * transition).sum(-3)
                    y = pyro.sample(f"y_{t}", dist.Categorical(logits=(torch.nn.functional.one_hot(y, 2).double().unsqueeze(-1) * rows).sum(-2)))
                    pyro.sample(f"x_{t}", dist.Normal(y.double(), 1.0), obs=x[..., t])

    def unscaled():
        with pyro.poutine.scale(scale=10.0):  # the scale undone: the same posterior
            model()

    for seed in range(5):  # the same posterior and seed: the same draw (raised "no posterior" before)
        pyro.set_rng_seed(seed)
        drawn = pc.sample_assignment(model)
        pyro.set_rng_seed(seed)
        expected = pc.sample_assignment(unscaled)
        for name in ("a", "y_0", "y_1"):
            assert torch.equal(drawn[name], expected[name]), (seed, name, drawn, expected)


def test_the_helpers_sum_exactly_not_by_monte_carlo_enumeration():
    """relax(config_enumerate(model, num_samples=n)) (a model made for TraceTMC_ELBO) passed to a
    helper: the relaxed site's limit is summed exactly, not over n draws (seed-dependent values
    before), as is the model's own one-hot site; its own Categorical marked so raises, naming the
    mark."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer import config_enumerate

    logits = torch.tensor([0.3, -0.5, 1.0], dtype=torch.float64)
    locs = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)

    def written():
        z = pyro.sample("z", dist.OneHotCategorical(logits=logits))
        pyro.sample("x", dist.Normal(z @ locs, 1.0), obs=torch.tensor(0.7, dtype=torch.float64))

    exact = torch.logsumexp(torch.log_softmax(logits, -1) + dist.Normal(locs, 1.0).log_prob(torch.tensor(0.7, dtype=torch.float64)), 0)
    relaxed = pc.relax(config_enumerate(written, num_samples=3), temperature=0.5)
    for seed in range(3):
        pyro.set_rng_seed(seed)
        assert pc.marginal_log_likelihood(relaxed).item() == pytest.approx(exact.item(), rel=1e-12)
    pyro.set_rng_seed(0)  # the model's own one-hot site is enumerated as an index: summed exactly too
    assert pc.marginal_log_likelihood(config_enumerate(written, num_samples=3)).item() == pytest.approx(exact.item(), rel=1e-12)

    def indexed():
        z = pyro.sample("z", dist.Categorical(logits=logits))
        pyro.sample("x", dist.Normal(locs[z], 1.0), obs=torch.tensor(0.7, dtype=torch.float64))

    with pytest.raises(ValueError, match="marginal_log_likelihood: site 'z' is marked for Monte Carlo enumeration"):
        pc.marginal_log_likelihood(config_enumerate(indexed, num_samples=3))
