"""Densities against the paper: reference values, normalization, and the identities between the
four distributions."""

import numpy as np
import pytest
from scipy.special import expit, log_expit, log_softmax

from tests import reference
from tests.cases import BINARY, CASES, Case
from tests.helpers import assert_close


@pytest.mark.parametrize("case", CASES, ids=str)
def test_log_prob_matches_reference(backend, case, dtype):
    d = case.make(backend, dtype)
    x = case.points(20, dtype)
    actual = backend.numpy(d.log_prob(backend.array(x, dtype)))
    assert actual.shape == (20,) + case.batch_shape
    assert_close(actual, reference.log_density(case.name, x, case.logits_array, case.temperature_array), dtype)


def test_reference_integrator_is_exact():
    """The quadrature used below integrates the reference densities to 1 within 1e-9."""
    for t in (0.1, 0.5, 2.0):
        logits = np.array([0.5, -0.3, 1.0])
        total = reference.integrate(
            lambda u: reference.exp_concrete_log_density(log_softmax(np.pad(u, ((0, 0), (0, 1))), -1), logits, t),
            dim=2,
            scale=1 / t,
        )
        assert abs(total - 1) < 1e-9, (t, total)


def _log_integrand(backend, name, logits, t):
    """exp(log_integrand(u)) integrates over u in R^(K-1) (or R) to the total mass of ``name``.

    n-ary: u are the log-ratios y_k - y_K, x = softmax([u, 0]); the Concrete density gets the
    Jacobian prod_k x_k, ExpConcrete's density is already one of the log-ratios (its base measure).
    BinConcrete: x = sigmoid(u) with Jacobian x (1 - x); the upper half of (0, 1) is scored through
    the symmetry p_a(x) = p_{-a}(1 - x) of eq. (17), so that 1 - x is never rounded.
    """
    d = backend.make(name, t, logits=logits)

    def log_integrand(u):
        out = np.full(u.shape[0], -np.inf)
        if name in ("Concrete", "ExpConcrete"):
            y = log_softmax(np.pad(u, ((0, 0), (0, 1))), axis=-1)
            ok = np.all(y > -700, axis=-1)  # exp(y) representable; the rest is a tail below e^-35
            value = np.exp(y[ok]) if name == "Concrete" else y[ok]
            jacobian = y[ok].sum(-1) if name == "Concrete" else 0.0
            out[ok] = backend.numpy(d.log_prob(backend.array(value))) + jacobian
        elif name == "LogitBinConcrete":
            out = backend.numpy(d.log_prob(backend.array(u[:, 0])))
        else:
            u = u[:, 0]
            far = np.abs(u) > 700  # x rounds to 0 or 1 (+inf density, refused under validation); tail below e^-700
            u = np.where(far, 0.0, u)
            mirrored = backend.make(name, t, logits=-logits)
            lower = backend.numpy(d.log_prob(backend.array(expit(np.minimum(u, 0)))))
            upper = backend.numpy(mirrored.log_prob(backend.array(expit(-np.maximum(u, 0)))))
            out = np.where(u <= 0, lower, upper) + log_expit(u) + log_expit(-u)
            out[far] = -np.inf
        return out

    return log_integrand


@pytest.mark.parametrize("temperature", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize(
    "name, logits",
    [
        ("Concrete", [0.5, -0.3]),
        ("Concrete", [0.5, -0.3, 1.0]),
        ("ExpConcrete", [0.5, -0.3]),
        ("ExpConcrete", [0.5, -0.3, 1.0]),
        ("BinConcrete", 0.7),
        ("LogitBinConcrete", 0.7),
    ],
    ids=lambda x: str(x).replace(" ", ""),
)
def test_density_integrates_to_one(backend, name, logits, temperature):
    logits = np.asarray(logits, dtype=np.float64)
    dim = max(logits.size - 1, 1)
    total = reference.integrate(_log_integrand(backend, name, logits, temperature), dim, scale=1 / temperature)
    assert abs(total - 1) < 1e-6, total


@pytest.mark.parametrize("temperature", [0.1, 2 / 3, 1.0, 3.0])
def test_concrete_with_two_categories_is_bin_concrete(backend, temperature, dtype):
    """Concrete(t, (a1, a2)) at (x, 1 - x) has the BinConcrete(t, a1 - a2) density at x."""
    logits = np.array([[0.4, -1.1], [3.0, 3.0], [-20.0, 25.0]])
    x = Case("BinConcrete", temperature, (0.0,) * 3).points(16, dtype)
    concrete = backend.make("Concrete", temperature, logits=logits, dtype=dtype)
    binary = backend.make("BinConcrete", temperature, logits=logits[:, 0] - logits[:, 1], dtype=dtype)
    on_simplex = np.stack([x, 1 - x], axis=-1)
    assert_close(
        backend.numpy(concrete.log_prob(backend.array(on_simplex, dtype))),
        backend.numpy(binary.log_prob(backend.array(x, dtype))),
        dtype,
    )


@pytest.mark.parametrize("case", [c for c in CASES if c.name == "ExpConcrete"], ids=str)
def test_exp_concrete_is_concrete_times_prod_x(backend, case, dtype):
    """kappa(log x) = log p(x) + sum_k log x_k (the paper's convention for the base measure)."""
    y = case.points(20, dtype)
    exp_concrete = case.make(backend, dtype)
    concrete = backend.make("Concrete", case.temperature_array, logits=case.logits_array, dtype=dtype)
    expected = backend.numpy(concrete.log_prob(backend.array(np.exp(y), dtype))) + y.sum(-1)
    assert_close(backend.numpy(exp_concrete.log_prob(backend.array(y, dtype))), expected, dtype)


@pytest.mark.parametrize("case", [c for c in CASES if c.name == "LogitBinConcrete"], ids=str)
def test_logit_bin_concrete_is_bin_concrete_change_of_variables(backend, case):
    """g(y) = p(sigmoid y) sigmoid(y) (1 - sigmoid y): LogitBinConcrete is the logit of BinConcrete."""
    y = np.clip(case.points(20), -15, 15)  # beyond, 1 - sigmoid(y) is not representable to 1e-9
    logit_node = case.make(backend)
    binary = backend.make("BinConcrete", case.temperature_array, logits=case.logits_array)
    expected = backend.numpy(binary.log_prob(backend.array(expit(y)))) + log_expit(y) + log_expit(-y)
    assert_close(backend.numpy(logit_node.log_prob(backend.array(y))), expected, "float64", rtol=1e-9)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in BINARY], ids=str)
def test_cdf_and_icdf_match_reference(backend, case, dtype):
    d = case.make(backend, dtype)
    x = case.points(30, dtype)
    a, t = case.logits_array, case.temperature_array
    if case.name == "BinConcrete":
        cdf, icdf = reference.bin_concrete_cdf, reference.bin_concrete_icdf
    else:
        cdf, icdf = reference.logit_bin_concrete_cdf, reference.logit_bin_concrete_icdf
    rtol = {"float32": 1e-4, "float64": 1e-10}[dtype]
    actual_cdf = backend.numpy(d.cdf(backend.array(x, dtype)))
    np.testing.assert_allclose(actual_cdf, cdf(x, a, t), rtol=rtol, atol=rtol * 1e-3)

    q = np.linspace(0.01, 0.99, 30).reshape((30,) + (1,) * len(case.batch_shape))
    q = np.broadcast_to(q, (30,) + case.batch_shape)
    actual_icdf = backend.numpy(d.icdf(backend.array(q, dtype)))
    np.testing.assert_allclose(actual_icdf, icdf(q, a, t), rtol=rtol * 10, atol=rtol * 1e-3)
    # round trip through the backend's own cdf, as a model runs it (the quantile carries its logit)
    back = backend.in_trace(lambda q: d.cdf(d.icdf(q)), backend.array(q, dtype))
    np.testing.assert_allclose(back, q, rtol=rtol * 10)


@pytest.mark.parametrize("name", BINARY)
def test_icdf_at_zero_and_one_is_the_support_boundary(backend, name):
    d = backend.make(name, 0.5, logits=np.array([-2.0, 0.0, 3.0]))
    low, high = (0.0, 1.0) if name == "BinConcrete" else (-np.inf, np.inf)
    np.testing.assert_array_equal(backend.numpy(d.icdf(backend.array(np.zeros(3)))), low)
    np.testing.assert_array_equal(backend.numpy(d.icdf(backend.array(np.ones(3)))), high)
    if name != "BinConcrete":
        return  # LogitBinConcrete's +-inf: the density's limit 0, as for any value there
    # the boundary is refused under validation, as a plain 0 or 1 is (Pyro scored the logit of
    # +-inf that icdf carried with the endpoints: NaN, with no error)
    checked = backend.make(name, 0.5, logits=np.array([-2.0, 0.0, 3.0]), validate_args=True)
    for u in (np.array([0.0, 0.5, 0.5]), np.array([0.5, 0.5, 1.0])):
        with pytest.raises(ValueError, match=rf"{name}.log_prob: the value holds"):
            checked.log_prob(checked.icdf(backend.array(u)))


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("Concrete", "BinConcrete")], ids=str)
def test_log_space_is_the_node_of_the_same_variable(backend, case, validate):
    """``Concrete.log_space()`` is the ExpConcrete (``BinConcrete``'s the LogitBinConcrete) with the
    same parameters and validation: the density of the same points as one built directly."""
    node = case.make(backend, validate_args=validate).log_space()
    node_name = "ExpConcrete" if case.n_ary else "LogitBinConcrete"
    assert type(node).__name__ == node_name and node._validate_args is validate
    direct = Case(node_name, case.temperature, case.logits)
    y = backend.array(direct.points(20))
    assert_close(backend.numpy(node.log_prob(y)), backend.numpy(direct.make(backend).log_prob(y)), "float64", rtol=1e-12)
