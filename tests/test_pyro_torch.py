"""Pyro specifics (not a conformance test: torch tensors are mutable and have views, JAX arrays
neither): the carried log-space coordinates of a sample follow views and are dropped when the sample
or its coordinates are modified in place."""

import math

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
    copy = x.detach().clone()  # a copy is user data: scored from log x, the density's limit
    assert not torch.isfinite(d.log_prob(copy)).all()


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
