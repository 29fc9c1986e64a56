"""Supports and the bijections registered for them (what autoguides use)."""

import numpy as np
import pytest
from scipy.special import log_softmax

from tests import reference
from tests.cases import N_ARY, NAMES


def _unconstrained(name, k, n=6, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.normal(0, 3, (n, k - 1) if name in N_ARY else (n,))
    u[0] = 40.0  # far out: Concrete coordinates of e^-40 and BinConcrete values that round to 1
    return u


@pytest.mark.parametrize("name", NAMES)
def test_biject_to_support_round_trip_and_log_jacobian(backend, name):
    """forward lands in the support, inverse recovers u, and log|det J| is the Jacobian of the
    free coordinates (x_1..x_{K-1}), except for ExpConcrete, whose density is with respect to the
    measure dy_1..dy_{K-1} / x_K: there the log-Jacobian must be log|det J| - y_K = 0."""
    k = 4
    d = backend.make(name, 0.5, logits=np.zeros(k) if name in N_ARY else np.zeros(6))
    transform = backend.biject_to(d.support)
    u = _unconstrained(name, k)
    x = transform(backend.array(u))
    assert backend.numpy(d.support.check(x)).all()
    # the round trip as a model runs it (where rounding x to 1 loses u, the carried logit recovers it)
    round_trip = backend.in_trace(lambda u: transform.inv(transform(u)), backend.array(u))
    np.testing.assert_allclose(round_trip, u, rtol=1e-10, atol=1e-10)
    log_jacobian = backend.numpy(transform.log_abs_det_jacobian(backend.array(u), x))
    assert log_jacobian.shape == (u.shape[0],)

    for row in range(1, u.shape[0]):  # not row 0: autodiff of x_1 (1 - x_1) at x_1 = 1 - e^-40 rounds to 0
        if name in N_ARY:
            matrix = backend.jacobian(lambda v: transform(v)[..., :-1], u[row])
            expected = np.linalg.slogdet(matrix)[1]
            if name == "ExpConcrete":
                expected -= log_softmax(np.append(u[row], 0.0))[-1]
        else:
            expected = np.log(np.abs(backend.jacobian(lambda v: transform(v), u[row : row + 1])[0, 0]))
        np.testing.assert_allclose(log_jacobian[row], expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["Concrete", "BinConcrete"])
def test_transformed_values_are_scored_exactly_where_they_round(backend, name):
    """A value produced by the registered bijection far out underflows (Concrete: e^-40 in
    float32 is 0; BinConcrete: rounds to 1) but is scored from its log coordinates where a model
    scores it (NumPyro: inside the traced computation): equal to the log-space density plus the
    change of variables, finite."""
    d = backend.make(name, 0.1, logits=np.array([0.5, 0.0]) if name == "Concrete" else np.array([0.5]), dtype="float32")
    transform = backend.biject_to(d.support)
    u = np.array([[110.0]]) if name == "Concrete" else np.array([[30.0]])
    log_prob = backend.in_trace(lambda u: d.log_prob(transform(u)), backend.array(u if name == "Concrete" else u[:, 0], "float32"))
    if name == "Concrete":
        expected = reference.concrete_log_density(log_softmax(np.append(u[0], 0.0)), np.array([0.5, 0.0]), 0.1)
    else:
        expected = reference.bin_concrete_log_density(u[0], np.array([0.5]), 0.1)
    assert np.all(np.isfinite(log_prob)), log_prob
    np.testing.assert_allclose(log_prob, expected, rtol=1e-5)


def test_log_simplex_accepts_float32_samples_and_rejects_other_values(backend):
    d = backend.make("ExpConcrete", 0.01, logits=np.linspace(-50, 50, 1000), dtype="float32")
    check = d.support.check
    assert backend.numpy(check(backend.sample(d, (64,), seed=0))).all()
    y = log_softmax(np.linspace(-3, 3, 5))
    rejected = [np.exp(y), y + 1e-3, np.append(y[:-1], 0.5), np.append(y[:-1], np.nan)]
    for value in rejected:
        assert not backend.numpy(check(backend.array(value))).any(), value
    with np.errstate(divide="ignore"):
        vertex = np.log(np.eye(5)[1])  # a log one-hot, the zero-temperature limit
    assert backend.numpy(check(backend.array(vertex))).all()


def test_simplex_accepts_float32_samples_and_rejects_other_values(backend):
    d = backend.make("Concrete", 0.01, logits=np.linspace(-50, 50, 1000), dtype="float32")
    assert backend.numpy(d.support.check(backend.sample(d, (64,), seed=0))).all()
    x = np.full(5, 0.2)
    for value in [x + 1e-3, np.append(x[:-1], -1e-3) + np.array([1e-3 / 4] * 4 + [0]), np.append(x[:-1], np.nan)]:
        assert not backend.numpy(d.support.check(backend.array(value))).any(), value


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["Concrete", "ExpConcrete", "BinConcrete", "LogitBinConcrete"])
def test_inverse_of_a_plain_value_on_the_boundary_is_the_nearest_interior_preimage(backend, name, dtype):
    """A plain value (no carried coordinates) that rounded onto the boundary -- a float32 Concrete
    coordinate that underflowed to 0, a BinConcrete value that rounded to 0 or 1 -- has no preimage;
    the inverse gives the preimage of the nearest representable interior point, finite, as the
    hosts' StickBreaking / Sigmoid inverses clamp (it was -inf, +inf or NaN, and NumPyro's
    ``init_to_median`` took the median of such rows: NaN). ExpConcrete's log one-hot (what
    ``map_assignment`` returns, a NUTS ``init_to_value``) has Concrete's inverse of the one-hot, and
    LogitBinConcrete's limits ±inf BinConcrete's inverse of 0 and 1 (they were passed on: a NaN
    loss from an autoguide initialized there). Interior values keep their exact inverse."""
    n_ary = name in N_ARY
    d = backend.make(name, 0.5, logits=np.zeros(3) if n_ary else np.zeros(4), dtype=dtype)
    transform = backend.biject_to(d.support)
    x = np.array([[0.0, 0.25, 0.75], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]]) if n_ary else np.array([0.0, 1.0, 0.25, 0.5])
    with np.errstate(divide="ignore"):
        given = {"ExpConcrete": np.log(x), "LogitBinConcrete": np.log(x) - np.log1p(-x)}.get(name, x)
    u = backend.numpy(transform.inv(backend.array(given, dtype)))
    assert np.isfinite(u).all(), u
    tiny, below_one = np.finfo(dtype).tiny, np.nextafter(np.ones((), dtype), 0)
    if n_ary:
        log_x = np.log(np.where(x == 0, tiny, x))
        np.testing.assert_allclose(u, log_x[:, :-1] - log_x[:, -1:], rtol=1e-6)
        back = backend.numpy(transform(backend.array(u, dtype)))
        np.testing.assert_array_equal((np.exp(back) if name == "ExpConcrete" else back)[x == 0] <= 2 * tiny, True)
    else:
        interior = np.where(x == 0, tiny, np.where(x == 1, below_one, x)).astype(np.float64)
        np.testing.assert_allclose(u, np.log(interior) - np.log1p(-interior), rtol=1e-6)
