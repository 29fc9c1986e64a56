"""The host PPLs' generic distribution checks, ported to the seven classes of the family.

NumPyro runs ``test/test_distributions.py`` (N1-N19 in ``/work/host_suites_spec.md``) and Pyro
``tests/distributions/`` (P1-P20, ``test_pickle``) over their own fixture lists; neither lists our
classes. This file runs the checks of those suites that the rest of our suite does not already make,
over selections of :data:`CASES` (one compiled function per case in NumPyro: the selections are
small) -- all seven classes, several temperatures (a batched one included), K = 2, 3, 5
and 12, scalar and batched parameters, ``logits`` and ``probs``, HardConcrete with array-valued
``low``/``high`` (one pair that grows the batch shape). Where an existing test covers some classes
only (the four relaxed ones, say), the cases here are the rest; each test says which host test it
ports, and how a class is treated where the generic check cannot apply (spec section 3):

* straight-through classes (Pyro's ``Relaxed*StraightThrough``: outside Pyro's fixture lists; our
  contract): ``log_prob`` scores only the sample itself, where it was drawn -- NumPyro inside the traced
  computation that drew it (``backend.in_trace`` / ``score_samples``), Pyro the sample or a view of
  it -- and raises ``ValueError`` ("not a sample") for copies and user data; distributional checks
  use the relaxed sample behind the value;
* HardConcrete (no host analogue): checks of a density apply to the interior, the atoms at 0 and 1
  are checked as masses;
* no closed-form moments (NumPyro skips ``mean_var`` for RelaxedBernoulliLogits; Pyro xfails on
  ``NotImplementedError``): ``mean``, ``variance`` and ``entropy`` must raise ``NotImplementedError``.

Deviations from the hosts, by contract: out-of-support values raise ``ValueError`` under validation
(eagerly) where NumPyro warns "Out-of-support"; inside ``jit`` they give ``log_prob = -inf``.

Run settings mirror the hosts (checklist item 26): warnings are errors (both hosts'
``filterwarnings = error``); all randomness is seeded; NumPyro float32 cases run with x64 off
(``tests/conftest.py``). Statistical checks use significance ``ALPHA`` = 1e-5 per check and make at
most six checks per test (false-failure rate below 1e-4 per test).
"""

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import stats
from scipy.spatial import cKDTree
from scipy.special import expit, gammaln, log_expit, logit, softmax

from tests import reference
from tests.helpers import ALPHA, assert_close, assert_frequencies

pytestmark = pytest.mark.filterwarnings("error")

N_ARY = ("Concrete", "ExpConcrete", "ConcreteStraightThrough")
BINARY = ("BinConcrete", "LogitBinConcrete", "BinConcreteStraightThrough")
STRAIGHT_THROUGH = {"ConcreteStraightThrough": "Concrete", "BinConcreteStraightThrough": "BinConcrete"}
NAMES = N_ARY + BINARY + ("HardConcrete",)


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    temperature: object  # a number, or a tuple broadcasting with the batch shape
    logits: object = None  # exactly one of logits / probs (nested tuples or a number)
    probs: object = None
    low: object = None  # HardConcrete: None (the default -0.1 / 1.1), a number or a tuple
    high: object = None

    def __str__(self):
        t = f"{self.temperature:.3g}" if np.isscalar(self.temperature) else "batch"
        shape = "x".join(map(str, self.batch_shape)) or "scalar"
        k = f"-K{self.event_shape[0]}" if self.event_shape else ""
        ends = "-array_ends" if self.low is not None and not (np.isscalar(self.low) and np.isscalar(self.high)) else ""
        return f"{self.name}-T{t}{k}-{shape}-{'probs' if self.probs is not None else 'logits'}{ends}"

    @property
    def n_ary(self):
        return self.name in N_ARY

    @property
    def straight_through(self):
        return self.name in STRAIGHT_THROUGH

    @property
    def parametrization(self):
        return "probs" if self.probs is not None else "logits"

    @property
    def param_array(self):
        return np.asarray(self.probs if self.probs is not None else self.logits, np.float64)

    @property
    def logits_array(self):
        """log alpha (from probs: their logs (n-ary) or log-odds (binary))."""
        if self.probs is None:
            return np.asarray(self.logits, np.float64)
        return np.log(self.param_array) if self.n_ary else logit(self.param_array)

    @property
    def temperature_array(self):
        return np.asarray(self.temperature, np.float64)

    @property
    def low_array(self):
        return np.asarray(-0.1 if self.low is None else self.low, np.float64)

    @property
    def high_array(self):
        return np.asarray(1.1 if self.high is None else self.high, np.float64)

    @property
    def batch_shape(self):
        shapes = [self.temperature_array.shape, self.param_array.shape[:-1] if self.n_ary else self.param_array.shape]
        if self.name == "HardConcrete":
            shapes += [self.low_array.shape, self.high_array.shape]
        return tuple(np.broadcast_shapes(*shapes))

    @property
    def event_shape(self):
        return self.param_array.shape[-1:] if self.n_ary else ()

    def broadcast_params(self):
        """(logits, temperature, low, high) as float64 arrays of the batch (+ event) shape."""
        b = self.batch_shape
        return (
            np.broadcast_to(self.logits_array, b + self.event_shape),
            np.broadcast_to(self.temperature_array, b),
            np.broadcast_to(self.low_array, b),
            np.broadcast_to(self.high_array, b),
        )

    def make(self, backend, dtype="float64", **kwargs):
        """The distribution from NumPy parameters (HardConcrete's ends as NumPy arrays or numbers)."""
        t = self.temperature if np.isscalar(self.temperature) else self.temperature_array
        if self.name == "HardConcrete":
            for end in ("low", "high"):
                value = getattr(self, end)
                if value is not None:
                    kwargs.setdefault(end, value if np.isscalar(value) else np.asarray(value, np.float64))
        return backend.make(self.name, t, **{self.parametrization: self.param_array}, dtype=dtype, **kwargs)

    def traced_args(self, backend, dtype="float64"):
        """(temperature, logits or probs, low, high) as backend arrays: arguments of a traced function."""
        return [backend.array(x, dtype) for x in (self.temperature_array, self.param_array, self.low_array, self.high_array)]


def _construct(lib, name, parametrization, t, param, low, high, validate_args=None):
    """The distribution from (traced) backend arrays; ``low``/``high`` are ignored but by HardConcrete."""
    kwargs = {parametrization: param}
    if name == "HardConcrete":
        kwargs.update(low=low, high=high)
    return getattr(lib, name)(t, validate_args=validate_args, **kwargs)


N_ARY_SPECS = [  # (id letter, temperature, logits or probs)
    ("A", 0.5, dict(logits=(0.3, -0.8))),  # K = 2, scalar batch
    ("B", 2 / 3, dict(probs=(0.2, 0.3, 0.5))),  # K = 3, probs
    ("C", (0.4, 1.5), dict(logits=((1.0, -0.5, 0.3, 2.0, 0.0), (0.2, 0.2, -1.0, 0.5, 1.5)))),  # K = 5, batched temperature
    ("D", 1.0, dict(logits=tuple(np.round(np.linspace(-2.0, 2.0, 12), 3)))),  # K = 12
]
BINARY_SPECS = [
    ("A", 0.5, dict(logits=0.4)),
    ("B", 2 / 3, dict(probs=(0.2, 0.7, 0.5))),
    ("C", (0.3, 1.0, 2.0), dict(logits=(-1.0, 0.5, 2.0))),
]
HARD_CONCRETE_SPECS = [
    ("A", 2 / 3, dict(logits=0.4)),
    ("B", (0.5, 1.0, 2.0), dict(logits=(-1.0, 0.5, 2.0), low=(-0.2, -0.1, -0.5), high=1.2)),
    ("C", 2 / 3, dict(probs=(0.3, 0.6), high=(1.1, 1.5))),
    ("D", 1.0, dict(logits=0.5, low=((-0.1,), (-0.3,)), high=(1.1, 1.3, 1.05))),  # the ends grow the batch to (2, 3)
]
SPECS = {**{n: N_ARY_SPECS for n in N_ARY}, **{n: BINARY_SPECS for n in BINARY}, "HardConcrete": HARD_CONCRETE_SPECS}
CASES_BY_ID = {(name, letter): Case(name, t, **kw) for name in NAMES for letter, t, kw in SPECS[name]}
CASES = list(CASES_BY_ID.values())


def _select(*pairs):
    """Cases by (name or names, id letters)."""
    out = []
    for names, letters in pairs:
        for name in (names,) if isinstance(names, str) else names:
            out += [CASES_BY_ID[name, letter] for letter in letters]
    return out


ONE_PER_CLASS = _select((N_ARY, "C"), (BINARY, "C"), ("HardConcrete", "B"))  # batched, batched temperature
PROBS_PER_CLASS = _select((N_ARY, "B"), (BINARY, "B"), ("HardConcrete", "C"))
SHAPE_CASES_64 = _select(("ConcreteStraightThrough", "C"))
FLOAT32_SHAPES = _select(("BinConcreteStraightThrough", "C"), ("HardConcrete", "B"))


# ----------------------------------------------------------------------------- the reference at the sampler's noise


def _log_node(case):
    return "ExpConcrete" if case.n_ary else "LogitBinConcrete"


def _reference_at_noise(case, u):
    """(value, log_prob) of the float64 reference for the uniforms ``u`` the sampler used, and the
    log-space coordinates y behind them."""
    a, t, low, high = case.broadcast_params()
    y = reference.sample_log_coordinates(_log_node(case), u, a, t)
    name = case.name
    if name == "HardConcrete":
        z = np.clip(low * expit(-y) + high * expit(y), 0.0, 1.0)
        return z, reference.hard_concrete_log_prob(z, a, t, low, high), y
    relaxed = STRAIGHT_THROUGH.get(name, name)
    log_prob = reference.log_density_at_log_coordinates(relaxed, y, a, t)
    if name == "ConcreteStraightThrough":
        return np.eye(y.shape[-1])[np.argmax(y, -1)], log_prob, y
    if name == "BinConcreteStraightThrough":
        return (y > 0).astype(np.float64), log_prob, y
    return reference.value_from_log_coordinates(name, y), log_prob, y


def _value_tolerance(case, dtype, y):
    """How far the sampler's value may be from the float64 reference for the same noise: rounding of
    (log a + noise) / t in log space, 8 eps (|log a| + |noise| + 1) / t (tests/test_sampling.py), with
    |noise| <= |y| t + |log a| bounded over the batch, and the same relative error through exp /
    sigmoid / the stretch."""
    eps = np.finfo(dtype).eps
    a, t, _, _ = case.broadcast_params()
    return 8 * eps * (2 * np.abs(a).max() + np.abs(y).max() * float(np.max(t)) + 1) / float(np.min(t))


def _assert_values(case, value, ref_value, y, dtype):
    if dtype == "float64":
        np.testing.assert_allclose(value, ref_value, rtol=1e-8, atol=1e-12)
        return
    tol = _value_tolerance(case, dtype, y)
    if case.name in ("ExpConcrete", "LogitBinConcrete"):
        np.testing.assert_allclose(value, ref_value, rtol=0, atol=tol)
    elif case.name == "Concrete":
        assert np.all(np.abs(value - ref_value) <= tol * ref_value + 2 * np.finfo(dtype).tiny)
    elif case.name == "BinConcrete":
        np.testing.assert_allclose(value, ref_value, rtol=0, atol=tol / 4 + np.finfo(dtype).eps)
    elif case.name == "HardConcrete":
        _, _, low, high = case.broadcast_params()
        np.testing.assert_allclose(value, ref_value, rtol=0, atol=(high - low).max() * (tol / 4 + np.finfo(dtype).eps))
    else:  # straight-through: exactly the hardened sample, where the reference's decision is not within rounding
        if case.n_ary:
            top2 = np.sort(y, -1)[..., -2:]
            clear = (top2[..., 1] - top2[..., 0] > 2 * tol)[..., None]
        else:
            clear = np.abs(y) > tol
        np.testing.assert_array_equal(np.where(clear, value, 0.0), np.where(clear, ref_value, 0.0))


def _assert_scores(actual, expected, dtype):
    """float64: 1e-8 relative (as tests/test_shapes.py); float32: within 0.01 nats + 1e-4 relative of
    the float64 reference at the same noise (tests/test_numerics.py's tolerance for own samples)."""
    if dtype == "float64":
        assert_close(actual, expected, "float64", rtol=1e-8)
        return
    assert np.all(np.isfinite(actual)) == np.all(np.isfinite(expected))
    np.testing.assert_array_equal(actual[~np.isfinite(expected)], expected[~np.isfinite(expected)])
    finite = np.isfinite(expected)
    assert np.all(np.abs(actual[finite] - expected[finite]) <= 0.01 + 1e-4 * np.abs(expected[finite]))


# ----------------------------------------------------------------------------- 1. shapes and values of own samples

SAMPLE_SHAPES = [(), (2, 3)]  # the host prepends (), (2,), (2, 3); (2,) adds nothing to (2, 3)
SHAPE_CASES = [(c, "float64") for c in SHAPE_CASES_64] + [(c, "float32") for c in FLOAT32_SHAPES]


@pytest.mark.parametrize("case, dtype", SHAPE_CASES, ids=lambda x: str(x))
def test_own_samples_have_the_documented_shapes_values_and_scores(backend, case, dtype):
    """NumPyro test_dist_shape (N1) + test_log_prob (N7, its shape assertion; its scipy comparison
    becomes the float64 reference at the sampler's noise) + test_jit_log_likelihood (N6) / Pyro
    test_batch_log_prob_shape (P4) on own samples. Classes: the straight-through ones (no host ran
    N1/N6/N7 on them: Pyro lists none, NumPyro has none) and HardConcrete (array ends), float64
    and float32 (NumPyro's default), batched temperatures. tests/test_shapes.py does this
    for the four relaxed classes.

    Sample shapes () and (2, 3): value shape = sample + batch + event, log_prob shape = sample +
    batch; values (straight-through: exactly one-hot / {0, 1}) and log_prob equal to the float64
    reference for the noise the sampler used -- drawn and scored inside the trace by a distribution
    built there from traced parameters (temperature, logits/probs, low, high). N6 (HardConcrete; not
    straight-through values, which score only where drawn: tests/test_numpyro_jax.py): eagerly drawn
    samples scored eagerly and by the distribution built from traced parameters agree (the host's
    2e-5 in float32; 1e-10 in float64, the same formula compiled). N1: an eager sample is an array of
    the PPL (jnp.ndarray / torch.Tensor).
    """
    d = case.make(backend, dtype)
    assert tuple(d.batch_shape) == case.batch_shape and tuple(d.event_shape) == case.event_shape
    assert tuple(d.shape()) == case.batch_shape + case.event_shape
    eager = None if case.straight_through else backend.sample(d, (2,), seed=7)
    if eager is not None:
        assert isinstance(eager, type(backend.array(np.zeros(1), dtype)))

    def draw_and_score(t, param, low, high, *samples):
        dist = _construct(backend.lib, case.name, case.parametrization, t, param, low, high)
        out = []
        for seed, shape in enumerate(SAMPLE_SHAPES, start=1):
            x = backend.sample(dist, shape, seed=seed)
            out += [x, dist.log_prob(x)]
        return tuple(out) + tuple(dist.log_prob(x) for x in samples)

    out = backend.in_trace(draw_and_score, *case.traced_args(backend, dtype), *([] if eager is None else [eager]))
    for seed, shape in enumerate(SAMPLE_SHAPES, start=1):
        value, log_prob = out[2 * seed - 2], out[2 * seed - 1]
        assert value.shape == shape + case.batch_shape + case.event_shape
        assert log_prob.shape == shape + case.batch_shape
        ref_value, ref_log_prob, y = _reference_at_noise(case, backend.uniforms(d, shape, seed=seed))
        _assert_values(case, value, ref_value, y, dtype)
        _assert_scores(log_prob, ref_log_prob, dtype)
    if not case.straight_through:
        eager_log_prob = backend.numpy(d.log_prob(eager))
        assert eager_log_prob.shape == (2,) + case.batch_shape
        tol = 2e-5 if dtype == "float32" else 1e-10
        np.testing.assert_allclose(out[-1], eager_log_prob, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- 2. fixed values, support checks


def _in_support(case, n, seed=0):
    """``n`` fixed values per batch element in the support (HardConcrete: the atoms 0 and 1 included)."""
    rng = np.random.default_rng(seed)
    shape = (n,) + case.batch_shape + case.event_shape
    if case.name in ("Concrete", "ConcreteStraightThrough"):
        return softmax(rng.normal(0, 2, shape), -1)
    if case.name == "ExpConcrete":
        x = rng.normal(0, 2, shape)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    if case.name == "LogitBinConcrete":
        return rng.normal(0, 4, shape)
    x = expit(rng.normal(0, 3, shape))
    if case.name == "HardConcrete":
        x[0], x[-1] = 0.0, 1.0
    return x


def _off_support(case, shape, seed=0):
    """Values outside the support, as NumPyro's gen_values_outside_bounds makes them for the closest
    constraint: simplex: a Dirichlet draw + 1e-2 (sum off 1); log simplex: its log (logsumexp off 0);
    unit interval: uniform(1, 2); real: NaN (ours admit +-inf)."""
    rng = np.random.default_rng(seed)
    if case.n_ary:
        x = rng.dirichlet(np.ones(case.event_shape[0]), shape) + 1e-2
        return np.log(x) if case.name == "ExpConcrete" else x
    if case.name == "LogitBinConcrete":
        return np.full(shape, np.nan)
    return rng.uniform(1.0, 2.0, shape)


def _reference_log_prob(case, x):
    a, t, low, high = case.broadcast_params()
    if case.name == "HardConcrete":
        return reference.hard_concrete_log_prob(x, a, t, low, high)
    return reference.log_density(case.name, x, a, t)


@pytest.mark.parametrize(
    "case", _select(("ExpConcrete", "C"), ("LogitBinConcrete", "C"), (STRAIGHT_THROUGH, "C"), ("HardConcrete", "D")), ids=str
)
def test_fixed_values_broadcast_and_lie_in_the_support(backend, case):
    """Pyro test_support_shape (P1), test_batch_log_prob_shape (P4: fixed test data with extra
    leading dims, log_prob shape broadcast(d.shape(), x.shape, strict)[:-event_dim]) and
    test_support_is_not_discrete (P8). Straight-through, HardConcrete and an n-ary and a binary
    relaxed class (Concrete and BinConcrete share their value paths with these), batched; the values
    tests/test_density.py and test_hard_concrete.py score span the batch.

    Values of shape (4,) + (1,) * len(batch) + event broadcast against the batch: support.event_dim is
    the event dim, support.check is all True with the shape of the values' batch dims (P1's
    broadcast(batch_shape, ...) for values that span the batch); log_prob has shape (4,) + batch and
    equals the float64 reference at the broadcast values (HardConcrete: the atoms 0, 1 included).
    Straight-through: the support is the relaxed one (one-hot values are in it), but log_prob of any
    value that is not an own sample raises ValueError "not a sample" (our contract; Pyro's
    Relaxed*StraightThrough silently scores it as a relaxed value).
    """
    d = case.make(backend)
    nb = len(case.batch_shape)
    assert d.support.event_dim == len(case.event_shape)
    assert not d.support.is_discrete
    x = _in_support(case, 4)[(slice(None),) + (slice(0, 1),) * nb]  # (4,) + (1,) * nb + event
    full = np.broadcast_to(x, (4,) + case.batch_shape + case.event_shape)
    for values in (x, full):  # a constraint knows no batch shape: the check has the value's shape
        ok = backend.numpy(d.support.check(backend.array(values)))
        assert ok.shape == values.shape[: values.ndim - len(case.event_shape)] and ok.all()
    if case.straight_through:
        hard = np.eye(case.event_shape[0])[np.argmax(x, -1)] if case.n_ary else np.round(x)
        assert backend.numpy(d.support.check(backend.array(hard))).all()
        with pytest.raises(ValueError, match="not a sample"):
            d.log_prob(backend.array(hard))
        return
    log_prob = backend.numpy(d.log_prob(backend.array(x)))
    assert log_prob.shape == (4,) + case.batch_shape
    assert_close(log_prob, _reference_log_prob(case, full), "float64", rtol=1e-9)


@pytest.mark.parametrize("dtype", ["float32"])  # NumPyro's default, as its suite runs it
@pytest.mark.parametrize("case", ONE_PER_CLASS, ids=str)
def test_out_of_support_values_raise_eagerly_and_score_minus_inf_in_jit(backend, case, dtype):
    """NumPyro test_distribution_constraints (N14), its second half: out-of-support values. All classes.

    Deviation from the host (contract): under validation a concrete out-of-support value raises
    ValueError instead of NumPyro's ``UserWarning("Out-of-support ...")``; inside ``jax.jit`` (NumPyro's
    trace, where values cannot be read) the same values give log_prob -inf, as NumPyro's
    ``validate_sample`` masks. Pyro has no trace that hides values: it raises there too. Straight-
    through: any value that is not an own sample raises, inside the trace as well. The support check
    rejects every one of these values (NumPyro's generators, our own supports: spec 4.1).
    """
    d = case.make(backend, dtype, validate_args=True)
    shape = (2, 3) + case.batch_shape
    oob = _off_support(case, shape)
    assert not backend.numpy(d.support.check(backend.array(oob, dtype))).any()
    with pytest.raises(ValueError, match="support|not a sample"):
        d.log_prob(backend.array(oob, dtype))

    def score(value):
        return d.log_prob(value)

    if backend.name == "numpyro" and not case.straight_through:
        scored = backend.in_trace(score, backend.array(oob, dtype))
        assert scored.shape == shape
        np.testing.assert_array_equal(scored, -np.inf)
    else:
        with pytest.raises(ValueError, match="support|not a sample"):
            backend.in_trace(score, backend.array(oob, dtype))


# ----------------------------------------------------------------------------- 3. parameter validation


def _bad_parameters(name):
    """(id, temperature, {logits/probs/low/high}) out of their constraints, as NumPy arrays (a Python-number
    temperature is checked even without validation, so the temperatures here are arrays)."""
    n_ary = name in N_ARY
    logits = np.array([[0.2, -0.3, 1.0], [0.0, 0.5, 0.1]]) if n_ary else np.array([0.2, -0.3, 1.0])
    probs = softmax(logits, -1) if n_ary else expit(logits)
    t = np.array([0.5, 1.0]) if n_ary else np.array([0.5, 1.0, 2.0])
    bad = [
        ("temperature-negative", np.where(np.arange(t.size) == 1, -1.0, t), dict(logits=logits)),
        ("temperature-zero", np.zeros_like(t), dict(logits=logits)),
        ("logits-nan", t, dict(logits=np.where(logits == logits.flat[1], np.nan, logits))),
        ("probs-above-one", t, dict(probs=np.where(probs == probs.flat[0], 1.5, probs))),
        ("probs-negative", t, dict(probs=np.where(probs == probs.flat[0], -0.2, probs))),
    ]
    if n_ary:
        bad.append(("probs-sum", t, dict(probs=probs * 1.1)))
    if name == "HardConcrete":
        bad += [
            ("low-positive", t, dict(logits=logits, low=np.array([-0.1, 0.2, -0.3]))),
            ("high-below-one", t, dict(logits=logits, high=np.array([1.1, 0.9, 1.2]))),
        ]
    return bad


BAD_PARAMETERS = [(name, *bad) for name in NAMES for bad in _bad_parameters(name)]


@pytest.mark.parametrize(
    "name, what, temperature, kwargs", BAD_PARAMETERS, ids=[f"{b[0]}-{b[1]}" for b in BAD_PARAMETERS]
)
def test_parameters_outside_their_constraints_raise_eagerly_and_inside_jit(backend, name, what, temperature, kwargs):
    """NumPyro test_distribution_constraints (N14), first half / Pyro test_distribution_validate_args:
    out-of-constraint parameters raise ValueError with ``validate_args=True`` -- eagerly and with the
    distribution built inside the trace from NumPy parameters (NumPyro: inside ``jax.jit``, where our
    classes read NumPy inputs before they become tracers) -- and construct silently without
    validation. Classes: all; tests/test_errors.py covers the four relaxed ones eagerly, test_hard_concrete.py
    HardConcrete's low/high eagerly.
    """
    cls = getattr(backend.lib, name)

    def build(validate_args):
        return lambda: cls(temperature, validate_args=validate_args, **kwargs).logits

    with pytest.raises(ValueError, match=rf"{name}: "):
        build(True)()
    with pytest.raises(ValueError, match=rf"{name}: "):
        backend.in_trace(build(True))
    logits = backend.numpy(build(False)())  # the host's validation_enabled(False) branch, eagerly
    event = (3,) if name in N_ARY else ()
    assert logits.shape == np.broadcast_shapes(np.shape(temperature) + event, np.shape(next(iter(kwargs.values()))))


# ----------------------------------------------------------------------------- 4. log_prob gradients


def _weighted_score(backend, name, parametrization, t0, p0, low0, high0, t, param, low, high):
    """sum(w * log_prob(value)) under the distribution of (t, param, low, high), for an own sample drawn,
    inside the same (traced) computation, from the distribution of (t0, p0, low0, high0); w fixed random
    weights (module level: NumPyro compiles it once per case)."""
    value = backend.sample(_construct(backend.lib, name, parametrization, t0, p0, low0, high0, False), (3,), seed=11)
    log_prob = _construct(backend.lib, name, parametrization, t, param, low, high, False).log_prob(value)
    weights = np.random.default_rng(0).normal(size=tuple(log_prob.shape))
    return (log_prob * backend.array(weights, "float64")).sum()


GRADIENT_CASES = _select(
    ("ExpConcrete", "B"), ("ConcreteStraightThrough", "C"), ("BinConcrete", "B"), ("BinConcreteStraightThrough", "C"),
    ("HardConcrete", "B"),
)


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_log_prob_gradient_matches_finite_differences(backend, case):
    """NumPyro test_log_prob_gradient (N12). Logits (batched temperature) or probs; temperature, and
    HardConcrete's low and high. Classes: the straight-through ones (which score by their relaxed
    sample with Concrete's and BinConcrete's kernels), HardConcrete, ExpConcrete and BinConcrete
    (LogitBinConcrete's log_prob is the logistic's: test_cdf_and_icdf_are_consistent_with_log_prob).
    tests/test_temperature.py has the temperature derivative of the relaxed classes at fixed points;
    nothing had the logits/probs derivatives.

    value = an own sample, fixed; f(params) = sum(w * log_prob(value)) with random weights w. The host
    shifts a whole parameter by eps and compares the sum of the gradient: for the n-ary logits that is
    the derivative along the all-ones vector, identically 0 by shift invariance, so the check is
    vacuous there. Here each parameter gets a random direction v: grad . v against the central
    difference (f(p + h v) - f(p - h v)) / 2h, h = 1e-5, validation off (the host's FD also turns it
    off: p + h v leaves the simplex). Tolerance 1e-6 relative + 1e-8: the O(h^2) truncation
    (|f'''| h^2 / 6 < 1e-8 here) and rounding (1e-16 |f| / h < 1e-9) are far below it, a wrong
    gradient term is not. Straight-through: the value is drawn where it is scored (inside the traced
    computation; by another instance of the class, which scores the sample by its relaxed sample).
    """
    base = case.traced_args(backend)
    base = [backend.numpy(a) for a in base]
    static = (backend, case.name, case.parametrization)
    rng = np.random.default_rng(1)
    h = 1e-5

    def f(*params):
        return backend.value_and_grad(_weighted_score, *base, *params, static=static)

    _, grads = f(*base)
    which = ["temperature", case.parametrization] + (["low", "high"] if case.name == "HardConcrete" else [])
    for i, param_name in enumerate(which):
        g = grads[4 + i]
        assert g.shape == base[i].shape
        v = rng.normal(size=base[i].shape)
        moved = [list(base), list(base)]
        moved[0][i], moved[1][i] = base[i] + h * v, base[i] - h * v
        fd = (f(*moved[0])[0] - f(*moved[1])[0]) / (2 * h)
        directional = float(np.sum(g * v))
        assert abs(directional - fd) <= 1e-6 * abs(fd) + 1e-8, (param_name, directional, fd)
        assert abs(directional) > 1e-4, (param_name, directional)  # the direction carries signal


# ----------------------------------------------------------------------------- 5. goodness of fit


def _uniform_p_value(u):
    """Pearson chi-square of values in [0, 1] on round(n^(1/3)) equal bins (the hosts' unif01 test)."""
    bins = int(round(len(u) ** (1 / 3)))
    counts = np.bincount(np.minimum((np.asarray(u) * bins).astype(int), bins - 1), minlength=bins)
    return stats.chisquare(counts).pvalue


def _spacing_p_value(x, log_density):
    """1-D goodness of fit of samples ``x`` to their densities (Pyro's density_goodness_of_fit): the
    gaps between sorted samples times n times the density (1/density averaged over the gap's ends) are
    nearly i.i.d. Exp(1) (uniform spacings are normalized exponentials), so exp(-that) is Uniform(0, 1).
    Calibration (float64 reference samples, 200 seeds, n = 20000, logistic and Hard Concrete interior):
    the p-values are uniform (KS p = 0.07, 0.14; smallest 2e-3). Power (Hard Concrete interior, library
    samples): a density 10% off gives p = 1e-11, the temperature 0.5 -> 0.6 1e-39."""
    order = np.argsort(x)
    sparsity = np.exp(-np.asarray(log_density)[order])
    sparsity = 0.5 * (sparsity[1:] + sparsity[:-1])
    return _uniform_p_value(np.exp(-len(x) * np.diff(np.asarray(x)[order]) / sparsity))


NEIGHBOURS = 30000


def _queries(dim):
    return 10000 if dim <= 2 else 3000


def _nearest_neighbour_p_value(points, log_density):
    """Goodness of fit of samples in R^d to their densities (the hosts' vector_density_goodness_of_fit,
    made exchangeable): for each of the last ``_queries(d)`` points, its distance r to the nearest of
    the first NEIGHBOURS points; NEIGHBOURS * density * ball volume(r) is nearly Exp(1), and exp(-that)
    Uniform(0, 1). The hosts use every point as a query against all the others, whose mutual
    neighbours share distances: the counts are overdispersed and the p-values too small (spec 4.2:
    4.7e-3 in two of three seeds). Queries disjoint from the neighbours, and fewer of them in higher
    dimensions, fix that. Measured on float64 reference samples (ExpConcrete in log-ratio coordinates,
    150 seeds each; KS test of the p-values against uniform): d = 2 with 10000 queries, KS p = 0.77
    (smallest p-value 0.011); d = 4 with 3000, KS p = 0.58 (smallest 8e-3; with 10000 queries it is
    miscalibrated, KS p = 2e-6); the simplex drop-last coordinates at T = 1, 2 (d = 2), KS p = 0.83,
    0.22. Power, median p over 6 seeds (d = 2, 10000 queries): a density normalized 10% off 8e-13,
    logits off by up to 0.3 1e-14, the temperature 20% off 1e-43 (10% off: 1e-3)."""
    dim = points.shape[1]
    assert len(points) == NEIGHBOURS + _queries(dim)
    r = cKDTree(points[:NEIGHBOURS]).query(points[NEIGHBOURS:], k=1)[0]
    log_ball = dim * np.log(r) + 0.5 * dim * math.log(math.pi) - gammaln(0.5 * dim + 1)
    return _uniform_p_value(np.exp(-np.exp(math.log(NEIGHBOURS) + log_density[NEIGHBOURS:] + log_ball)))


GOF_CASES = [  # (case, coordinates)
    (CASES_BY_ID["ExpConcrete", "C"], "log-ratio"),  # K = 5 (d = 4), batched temperature (0.4, 1.5)
    (CASES_BY_ID["Concrete", "B"], "log-ratio"),  # T = 2/3 < 1: the drop-last density is unbounded at the vertices
    (Case("Concrete", 2.0, logits=(0.3, -1.2, 2.0)), "drop-last"),  # T >= 1: as the hosts treat Dirichlet
    (CASES_BY_ID["ConcreteStraightThrough", "B"], "log-ratio"),
    (CASES_BY_ID["BinConcreteStraightThrough", "C"], "logit"),
    (CASES_BY_ID["HardConcrete", "B"], "interior"),
]


@pytest.mark.parametrize("case, coordinates", GOF_CASES, ids=lambda x: str(x))
def test_samples_fit_the_log_prob_density(backend, case, coordinates):
    """NumPyro test_gof (N19) / Pyro test_gof (P9): samples against exp(log_prob) at those samples,
    per batch element, at significance 1e-5 per check (at most six checks). Classes: the ones whose
    law tests/test_sampling.py does not check jointly -- BinConcrete and LogitBinConcrete have KS tests
    there; for Concrete/ExpConcrete it tests pairwise log-ratios, not the joint law.

    * ExpConcrete: in log-ratio coordinates u = y[:-1] - y[-1], where log_prob is a Lebesgue density
      (its base measure, spec 4.1); Concrete at T < 1 the same with log_prob + sum(log x) (the
      Jacobian); Concrete at T >= 1 drop-last (x_1..x_{K-1}), as the hosts treat Dirichlet (below
      T = K - 1 the density is unbounded at the vertices and the host GOF fails: spec 4.2).
    * Straight-through: the relaxed sample behind the value -- the log-space node (ExpConcrete /
      LogitBinConcrete) drawn with the same seed, checked to harden to the value -- against the
      straight-through log_prob of the value, scored where drawn, plus the Jacobian of the coordinates.
    * HardConcrete (no host analogue; the host's HurdleProbs, "point mass at zero", is skipped): the
      counts at 0, at 1 and inside against exp(log_prob(0)), exp(log_prob(1)) and the rest (chi-square),
      and the interior samples against exp(log_prob) / P(0 < Z < 1) (spacings, 1-D).
    """
    n = NEIGHBOURS + _queries(case.event_shape[0] - 1) if case.n_ary else 20000
    d = case.make(backend)
    value, (log_prob,) = backend.score_samples(d, (), (n,), seed=21)
    if case.straight_through:
        node = backend.make(_log_node(case), case.temperature_array, **{case.parametrization: case.param_array})
        y = backend.numpy(backend.sample(node, (n,), seed=21))
        hard = np.eye(y.shape[-1])[np.argmax(y, -1)] if case.n_ary else (y > 0).astype(float)
        np.testing.assert_array_equal(value, hard)  # y is the relaxed sample behind the value
    _, _, low, high = case.broadcast_params()
    for index in np.ndindex(*case.batch_shape):
        at = (slice(None),) + index
        what = f"{case} at {index}"
        if case.name == "HardConcrete":
            z, lp = value[at], log_prob[at]
            zeros, ones = backend.numpy(d.log_prob(backend.array(np.zeros(case.batch_shape)))), backend.numpy(
                d.log_prob(backend.array(np.ones(case.batch_shape)))
            )
            p0, p1 = math.exp(zeros[index]), math.exp(ones[index])
            inside = (z > 0) & (z < 1)
            assert_frequencies([np.sum(z == 0), np.sum(z == 1), np.sum(inside)], [p0, p1, 1 - p0 - p1], what)
            p_value = _spacing_p_value(z[inside], lp[inside] - math.log1p(-p0 - p1))
        elif coordinates == "logit":  # BinConcreteStraightThrough: the logit of the relaxed sample
            p_value = _spacing_p_value(y[at], log_prob[at] + log_expit(y[at]) + log_expit(-y[at]))
        elif coordinates == "drop-last":
            p_value = _nearest_neighbour_p_value(value[at][:, :-1], log_prob[at])
        else:
            log_x = y[at] if case.straight_through else (value[at] if case.name == "ExpConcrete" else np.log(value[at]))
            jacobian = 0.0 if case.name == "ExpConcrete" else log_x.sum(-1)
            p_value = _nearest_neighbour_p_value(log_x[:, :-1] - log_x[:, -1:], log_prob[at] + jacobian)
        assert p_value > ALPHA, f"goodness of fit {what}: p = {p_value:.3g}"


# ----------------------------------------------------------------------------- 6. expand


def _with_batch(case, backend, batch_shape):
    """The case's distribution with its parameters reshaped to ``batch_shape`` (same number of elements)."""
    a, t, low, high = case.broadcast_params()
    param = case.param_array if case.probs is not None else a
    param = np.broadcast_to(param, case.batch_shape + case.event_shape).reshape(batch_shape + case.event_shape)
    kwargs = dict(low=np.array(low).reshape(batch_shape), high=np.array(high).reshape(batch_shape)) if case.name == "HardConcrete" else {}
    return backend.make(case.name, np.array(t).reshape(batch_shape), **{case.parametrization: param}, **kwargs)


EXPAND_CASES = _select(("ConcreteStraightThrough", "C"), ("HardConcrete", "B"))


@pytest.mark.parametrize("case", EXPAND_CASES, ids=str)
def test_expand(backend, case):
    """NumPyro test_expand (N16) / Pyro test_expand_by (P16), test_expand_new_dim (P17),
    test_expand_existing_dim (P18), test_subsequent_expands_ok (P19) with check_sample_shapes, and
    test_expand_error (P20). Classes: ConcreteStraightThrough and HardConcrete (the straight-through
    classes inherit the relaxed classes' ``expand`` -- one method for the six -- and are the hard case:
    their samples must stay scoreable; HardConcrete overrides it for low/high), with the class's own
    ``expand`` and the PPL's generic ExpandedDistribution (Pyro's ``TorchDistribution.expand``
    fallback; NumPyro's wrapper). tests/test_shapes.py expands the four relaxed classes by one leading
    dim, test_pyro_torch.py scores Pyro's ExpandedDistribution; this adds expand_by (tuple, list),
    existing size-1 dims (the own ``expand`` in a chain (2, 1, 1) -> (2, 1, 3) -> (2, 5, 3), which is
    also P19; the generic wrapper on an interstitial size-1 dim), the error contract,
    straight-through and HardConcrete.

    check_sample_shapes(small, large), as Pyro: a sample of ``small`` scored by ``large`` is the
    small log_prob broadcast; a sample of ``large`` scored by ``small`` and by ``large`` agrees -- for
    straight-through samples, scored inside the trace that drew them. Exception by contract: NumPyro's
    ExpandedDistribution *reshapes* the base sample when it expands an existing (interstitial) dim,
    a new array: a straight-through value drawn there is a copy and raises "not a sample" (Pyro's
    wrapper keeps the carried coordinates: test_pyro_torch.py).
    Errors: expands that do not broadcast or shrink raise (ValueError, RuntimeError) as the hosts
    require, with the own expand and the wrapper; NumPyro's message is the host's "Cannot broadcast
    distribution of shape".
    """
    small = case.make(backend)
    b = case.batch_shape
    interstitial = _with_batch(case, backend, b + (1,))  # an existing size-1 dim
    assert tuple(small.expand_by((2, 3)).batch_shape) == tuple(small.expand_by([2, 3]).batch_shape) == (2, 3) + b
    variants = {  # label: (base, large, expected batch shape)
        "expand-chain": (small, small.expand((2, 1, 1) + b).expand((2, 1, 3) + b).expand((2, 5, 3) + b), (2, 5, 3) + b),
        "generic-new": (small, backend.expanded(small, (2, 3) + b), (2, 3) + b),
        "generic-existing-dim": (interstitial, backend.expanded(interstitial, b + (4,)), b + (4,)),
    }
    reshapes_a_copy = backend.name == "numpyro" and case.straight_through
    if reshapes_a_copy:
        _, reshaping, _ = variants.pop("generic-existing-dim")

        def score_reshaped():
            return reshaping.log_prob(backend.sample(reshaping, (), seed=7))

        with pytest.raises(ValueError, match="not a sample"):
            backend.in_trace(score_reshaped)

    bases = [base for base in (small, interstitial) if any(b_ is base for b_, _, _ in variants.values())]

    def check_sample_shapes():
        out = []
        for i, base in enumerate(bases):
            x = backend.sample(base, (), seed=i)
            out.append(base.log_prob(x))
            out += [large.log_prob(x) for b_, large, _ in variants.values() if b_ is base]
        for i, (base, large, _) in enumerate(variants.values()):
            x = backend.sample(large, (), seed=10 + i)
            out += [x, base.log_prob(x), large.log_prob(x)]
        return tuple(out)

    out = list(backend.in_trace(check_sample_shapes))
    for base in bases:
        base_log_prob = out.pop(0)
        for label, (b_, large, batch_shape) in variants.items():
            if b_ is base:
                np.testing.assert_allclose(out.pop(0), np.broadcast_to(base_log_prob, batch_shape), rtol=1e-12, err_msg=label)
    for label, (base, large, batch_shape) in variants.items():
        assert tuple(large.batch_shape) == batch_shape and tuple(large.event_shape) == case.event_shape, label
        x, by_base, by_large = out.pop(0), out.pop(0), out.pop(0)
        assert x.shape == batch_shape + case.event_shape and by_large.shape == batch_shape, label
        np.testing.assert_allclose(by_base, by_large, rtol=1e-12, err_msg=label)
        assert np.isfinite(by_large).all(), label

    for make_large in (lambda d, shape: d.expand(shape), backend.expanded):
        for first, proposed in [((2, 1), (4, 3)), ((2, 4), (2, 2, 1)), ((1, 2, 1), (2, 1))]:
            large = make_large(small, first + b)
            with pytest.raises((ValueError, RuntimeError)) as error:
                large.expand(proposed + b)
            if backend.name == "numpyro":
                assert "Cannot broadcast distribution of shape" in str(error.value)


# ----------------------------------------------------------------------------- 7. infer_shapes


@pytest.mark.parametrize("case", ONE_PER_CLASS + PROBS_PER_CLASS + _select(("Concrete", "AD"), ("HardConcrete", "D")), ids=str)
def test_infer_shapes(backend, case):
    """NumPyro test_infer_shapes (N2) / Pyro test_infer_shapes (P2): ``infer_shapes`` of the argument
    shapes (keywords, as both PPLs accept them) equals (batch_shape, event_shape). All classes;
    test_pyro_torch.py has Pyro for six classes, not HardConcrete (whose low/high join the batch shape)
    nor NumPyro. Also a few shapes beside the case's (temperature and ends broadcasting)."""
    cls = getattr(backend.lib, case.name)

    def shapes(temperature, param, low=None, high=None):
        kwargs = {"temperature": temperature, case.parametrization: param}
        if case.name == "HardConcrete":
            kwargs.update({k: v for k, v in (("low", low), ("high", high)) if v is not None})
        return kwargs

    given = shapes(case.temperature_array.shape, case.param_array.shape, *(
        (case.low_array.shape, case.high_array.shape) if case.name == "HardConcrete" else ()
    ))
    d = case.make(backend)
    batch_shape, event_shape = cls.infer_shapes(**given)
    assert (tuple(batch_shape), tuple(event_shape)) == (tuple(d.batch_shape), tuple(d.event_shape))
    for t_shape, extra in [((4, 1), ()), ((), (3, 1))]:
        param_shape = extra + case.param_array.shape
        ends = ((5, 1, 1, 1), ()) if case.name == "HardConcrete" else (None, None)
        kwargs = shapes(t_shape, param_shape, *ends)
        built = cls(
            backend.array(np.ones(t_shape)),
            **{case.parametrization: backend.array(np.broadcast_to(case.param_array, param_shape))},
            **({"low": backend.array(np.full(ends[0], -0.1)), "high": 1.1} if case.name == "HardConcrete" else {}),
        )
        batch_shape, event_shape = cls.infer_shapes(**kwargs)
        assert (tuple(batch_shape), tuple(event_shape)) == (tuple(built.batch_shape), tuple(built.event_shape)), kwargs


# ----------------------------------------------------------------------------- 8. wrappers: has_rsample, to_event, mask

WRAPPER_CASES = _select(
    ("ConcreteStraightThrough", "C"), ("BinConcreteStraightThrough", "C"), ("HardConcrete", "D"), ("Concrete", "C"),
)


@pytest.mark.parametrize("case", WRAPPER_CASES, ids=str)
def test_wrappers_keep_shapes_reparameterization_and_scores(backend, case):
    """NumPyro test_has_rsample (N3), test_args_attributes (N4), test_independent_shape (N11), test_mask /
    Pyro test_independent.py, test_mask.py. Classes: straight-through and HardConcrete (batch grown
    by its array ends), and a batched relaxed case (the four share the wrappers' code) for
    what tests/test_shapes.py does not check (to_event(i) for every i, to_event(0) returning the
    distribution, masks that broadcast to a larger batch shape, Python-bool masks, has_rsample).

    has_rsample is True and kept by mask(False) and expand_by([2]).to_event(1); NumPyro:
    set(arg_constraints) == set(reparametrized_params) (its definition of has_rsample); every
    arg constraint has event_dim and is_discrete. On own samples (scored where drawn):
    to_event(i).log_prob = log_prob summed over the i rightmost batch dims, with batch/event shapes
    moved accordingly, and to_event beyond the batch raises ValueError; mask(m) with m of shape
    (4,) + batch (larger than the batch) has that batch shape and log_prob where(m, log_prob, 0);
    mask(False) gives zeros and mask(True) the log_prob.
    """
    d = case.make(backend)
    b = case.batch_shape
    assert d.has_rsample
    assert d.mask(False).has_rsample == d.has_rsample
    assert d.expand_by([2]).to_event(1).has_rsample == d.has_rsample
    reparametrized = getattr(d, "reparametrized_params", None)  # NumPyro only
    if reparametrized is not None:
        assert set(d.arg_constraints) == set(reparametrized)
    for constraint in d.arg_constraints.values():
        assert constraint.event_dim in (0, 1) and constraint.is_discrete is False
    assert d.to_event(0) is d
    with pytest.raises(ValueError):
        d.to_event(len(b) + 1)
    mask = np.random.default_rng(0).random((4,) + b) < 0.5
    masked = d.mask(backend.array(mask, "bool"))
    assert tuple(masked.batch_shape) == (4,) + b
    independents = [d.to_event(i) for i in range(1, len(b) + 1)]
    for i, independent in enumerate(independents, start=1):
        assert tuple(independent.batch_shape) == b[: len(b) - i]
        assert tuple(independent.event_shape) == b[len(b) - i :] + case.event_shape
    scorers = independents + [masked, d.mask(False), d.mask(True)]
    _, (log_prob, *scores) = backend.score_samples(d, scorers, (4,), seed=3)
    assert np.isfinite(log_prob).all()
    for i, score in enumerate(scores[: len(independents)], start=1):
        np.testing.assert_allclose(score, log_prob.reshape(log_prob.shape[: log_prob.ndim - i] + (-1,)).sum(-1), rtol=1e-12)
    by_mask, by_false, by_true = scores[len(independents) :]
    # rtol 1e-12, not equality: NumPyro's MaskedDistribution swaps masked-out values for
    # support.feasible_like (HardConcrete's unit_interval) and scores that array, a last-ulp difference
    np.testing.assert_allclose(by_mask, np.where(mask, log_prob, 0.0), rtol=1e-12, atol=0)
    np.testing.assert_array_equal(by_false, np.zeros_like(log_prob))
    np.testing.assert_allclose(by_true, log_prob, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- 9. moments, cdf/icdf, reference values


@pytest.mark.parametrize("case", ONE_PER_CLASS + PROBS_PER_CLASS + _select(("ExpConcrete", "AD")), ids=str)
def test_moments_without_closed_form_raise_not_implemented(backend, case):
    """NumPyro test_mean_var (N13), test_entropy_scipy / test_entropy_samples (N8, N9) / Pyro test_mean,
    test_variance (P10, P11), test_batch_entropy_shape (P5). All classes.

    None of the family has a closed-form mean, variance or entropy (LogitBinConcrete could: a logistic,
    mean logits / T, variance pi^2 / (3 T^2), entropy 2 - log T; spec 4.1), so each must raise
    NotImplementedError, which the hosts read as "skip" (NumPyro, as for RelaxedBernoulliLogits) or
    "xfail" (Pyro). If one is implemented it must have the shape batch + event (entropy: batch) and
    match 200000 samples as the hosts require (mean: rtol 0.05, atol 0.01; std: rtol 0.06, atol 0.01;
    entropy: |z| < 5 over 1000 samples).
    """
    d = case.make(backend)
    implemented = {}
    for moment in ("mean", "variance"):
        try:
            implemented[moment] = backend.numpy(getattr(d, moment))
        except NotImplementedError:
            pass
    try:
        implemented["entropy"] = backend.numpy(d.entropy())
    except NotImplementedError:
        pass
    if not implemented:
        return
    shape = case.batch_shape + case.event_shape
    value, (log_prob,) = backend.score_samples(d, (), (200000,), seed=4)
    if "mean" in implemented:
        assert implemented["mean"].shape == shape
        np.testing.assert_allclose(value.mean(0), implemented["mean"], rtol=0.05, atol=0.01)
    if "variance" in implemented:
        assert implemented["variance"].shape == shape
        np.testing.assert_allclose(value.std(0), np.sqrt(implemented["variance"]), rtol=0.06, atol=0.01)
    if "entropy" in implemented:
        assert implemented["entropy"].shape == case.batch_shape
        neg = -log_prob[:1000]
        z = (implemented["entropy"] - neg.mean(0)) / (neg.std(0) / math.sqrt(999))
        assert np.all(np.abs(z) < 5), z


CDF_CASES = _select(("BinConcrete", "C"), ("LogitBinConcrete", "C"), ("HardConcrete", "D"))


def _cdf_and_icdf_sums(backend, name, parametrization, t, param, low, high, x, q):
    """sum(cdf(x)) + sum(icdf(q)) (HardConcrete: no icdf): the gradients in x and q are the densities
    and the inverse densities, elementwise (module level: NumPyro compiles it once per case)."""
    d = _construct(backend.lib, name, parametrization, t, param, low, high)
    total = d.cdf(x).sum()
    return total if name == "HardConcrete" else total + d.icdf(q).sum()


@pytest.mark.parametrize("case", CDF_CASES, ids=str)
def test_cdf_and_icdf_are_consistent_with_log_prob(backend, case):
    """NumPyro test_cdf_and_icdf (N10) / Pyro test_cdf_icdf (P12), the parts tests/test_density.py does
    not make (it checks cdf/icdf against the reference and the round trip): d/dx cdf(x) = exp(log_prob(x))
    and d/dq icdf(q) = exp(-log_prob(icdf(q))), elementwise by autodiff (rtol 1e-9: both sides are
    closed forms in float64; the host checks the unbatched case at 1e-5). HardConcrete has no icdf
    (NotImplementedError; its cdf jumps at the atoms): the cdf's derivative on the interior. Plus the
    host's scipy comparison, which it skips for RelaxedBernoulliLogits for want of a scipy
    distribution: LogitBinConcrete is scipy.stats.logistic(loc=logits/T, scale=1/T) (log_prob, cdf and
    icdf vs logpdf, cdf, ppf), BinConcrete its sigmoid (log_prob = logistic.logpdf(logit x) - log x -
    log(1 - x)).
    """
    d = case.make(backend)
    a, t, low, high = case.broadcast_params()
    rng = np.random.default_rng(0)
    y = rng.normal(0, 2, (5,) + case.batch_shape)
    x = y if case.name == "LogitBinConcrete" else expit(y)
    q = rng.uniform(0.02, 0.98, (5,) + case.batch_shape)
    args = [backend.numpy(a) for a in case.traced_args(backend)]
    _, grads = backend.value_and_grad(_cdf_and_icdf_sums, *args, x, q, static=(backend, case.name, case.parametrization))
    density, slope = grads[4], grads[5]
    log_prob = backend.numpy(d.log_prob(backend.array(x)))
    np.testing.assert_allclose(density, np.exp(log_prob), rtol=1e-9)
    if case.name == "HardConcrete":
        with pytest.raises(NotImplementedError):
            d.icdf(backend.array(np.full(case.batch_shape, 0.5)))
        return
    quantiles = d.icdf(backend.array(q))
    np.testing.assert_allclose(slope, np.exp(-backend.numpy(d.log_prob(quantiles))), rtol=1e-9)

    logistic = stats.logistic(loc=a / t, scale=1 / t)
    cdf = backend.numpy(d.cdf(backend.array(x)))
    if case.name == "LogitBinConcrete":
        np.testing.assert_allclose(log_prob, logistic.logpdf(y), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cdf, logistic.cdf(y), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(backend.numpy(quantiles), logistic.ppf(q), rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(log_prob, logistic.logpdf(y) - np.log(x) - np.log1p(-x), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(cdf, logistic.cdf(y), rtol=1e-8, atol=1e-14)
        np.testing.assert_allclose(backend.numpy(quantiles), expit(logistic.ppf(q)), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ["Concrete", "ExpConcrete", "ConcreteStraightThrough", "BinConcreteStraightThrough"])
def test_cdf_and_icdf_raise_where_undefined(backend, name):
    """NumPyro test_cdf_and_icdf (N10: multivariate, skipped) / Pyro test_cdf_icdf (P12: vacuous for
    event_shape.numel() != 1): the n-ary classes and the straight-through ones (discrete values) raise
    NotImplementedError from cdf and icdf, which the hosts read as "skip"/"xfail"."""
    logits = np.array([[0.3, -1.0, 2.0]]) if name in N_ARY else np.array([0.3, -1.0])
    d = backend.make(name, 0.5, logits=logits)
    value = backend.array(np.full(logits.shape, 1 / 3 if name in N_ARY else 0.5))
    for method in (d.cdf, d.icdf):
        with pytest.raises(NotImplementedError):
            method(value)


# ----------------------------------------------------------------------------- 10. shape errors


@pytest.mark.parametrize("case", CASES, ids=str)
def test_values_of_the_wrong_shape_raise(backend, case):
    """Pyro test_score_errors_event_dim_mismatch (P6) and test_score_errors_non_broadcastable_data_shape
    (P7), under validation (Pyro's default in its suite). All classes; tests/test_errors.py checks a
    (K+1)-vector for the two relaxed n-ary classes only.

    ones(d.shape() + (1,)) raises (ValueError, RuntimeError) for event_dim 1 (for event_dim 0 it
    broadcasts, and the host asserts nothing); a value whose first dim is one more than d.shape()'s
    raises. Straight-through: these values are not own samples, and raise on that ground where that
    check comes first (ValueError either way).
    """
    d = case.make(backend, validate_args=True)
    shape = case.batch_shape + case.event_shape
    fill = 1 / case.event_shape[0] if case.name in ("Concrete", "ConcreteStraightThrough") else 0.5
    if case.n_ary:
        with pytest.raises((ValueError, RuntimeError)):
            d.log_prob(backend.array(np.full(shape + (1,), fill)))
    if shape:
        wrong = (shape[0] + 1,) + shape[1:]
        value = np.full(wrong, fill)
        if case.name == "ExpConcrete":
            value = np.full(wrong, -math.log(shape[-1]))
        with pytest.raises((ValueError, RuntimeError)):
            d.log_prob(backend.array(value))


# ----------------------------------------------------------------------------- 11. pickle and pytrees


def _assert_same_distribution(backend, case, d, other, label):
    """Same class, shapes and parameters; the same sample for the same seed, scored alike."""
    assert type(other) is type(d), label
    assert tuple(other.batch_shape) == tuple(d.batch_shape) and tuple(other.event_shape) == tuple(d.event_shape), label
    for name in d.arg_constraints:  # every parameter, the lazily derived one (probs or logits) included
        np.testing.assert_allclose(
            backend.numpy(getattr(other, name)), backend.numpy(getattr(d, name)), rtol=1e-12, atol=1e-15, err_msg=f"{label}: {name}"
        )
    value, (own, by_original) = backend.score_samples(other, [d], (3,), seed=6)
    # drawn inside jit vs eagerly: equal up to the last ulp (XLA may fuse the sampler differently)
    np.testing.assert_allclose(value, backend.numpy(backend.sample(d, (3,), seed=6)), rtol=1e-12, atol=1e-300, err_msg=label)
    np.testing.assert_allclose(own, by_original, rtol=1e-12, err_msg=label)
    assert np.isfinite(own).all(), label


PICKLE_CASES = _select((NAMES, "B"))  # probs for the n-ary and binary classes; array ends for HardConcrete


@pytest.mark.parametrize("case", PICKLE_CASES, ids=str)
def test_pickle_round_trip(backend, case):
    """Pyro tests/distributions/test_pickle.py (torch.save / torch.load(weights_only=False), the
    loaded object an instance of the class) -- Pyro's list has the torch relaxed classes, not ours;
    NumPyro has no per-distribution pickle test, and pickles the same way. All classes. Beyond the
    host's isinstance: same shapes and parameters, the same samples for the same seed, scored equally
    by the original (straight-through: scored where drawn)."""
    d = case.make(backend)
    _assert_same_distribution(backend, case, d, backend.pickle_round_trip(d), "pickle")


@pytest.mark.parametrize("case", PICKLE_CASES, ids=str)
def test_pytree_round_trips(backend, case):
    """NumPyro test_dist_pytree (N17) and test_expand_no_unnecessary_batch_shape_expansion: a distribution
    built and returned from ``jax.jit``, built inside ``jax.lax.map``, and through
    tree_unflatten(tree_flatten) has every argument of arg_constraints equal (the host's atol is 1e-7;
    these are the same numbers), and gives the same sample for the same key, scored alike. All classes,
    probs-parameterized (probs is derived lazily in the other parametrization). tests/test_numpyro_jax.py
    covers the tree round trip and jit pass-through of the four relaxed classes with logits.
    Pyro: skipped by the adapter (no pytrees; its round trip is pickling)."""
    trips = backend.traced_round_trips(lambda: case.make(backend))
    d = case.make(backend)
    for label, other in trips.items():
        _assert_same_distribution(backend, case, d, other, label)


# ----------------------------------------------------------------------------- 12. discrete limits of ST and HC


@pytest.mark.parametrize(
    "case", _select(("ConcreteStraightThrough", "ACD"), ("BinConcreteStraightThrough", "C"), ("HardConcrete", "BD")), ids=str
)
def test_discrete_limit_is_enumerable(backend, case):
    """Pyro test_support_is_discrete (P13), test_enumerate_support_shape (P15) / NumPyro
    test_enumerate_support_smoke, on ``.discrete()`` of the straight-through classes and HardConcrete
    (tests/test_discrete.py has the four relaxed classes): discrete and enumerable support, enumerate_support(expand=True)
    of shape (n,) + batch + event and expand=False of shape (n,) + (1,) * len(batch) + event with equal
    broadcast values, and the masses of the enumerated values: softmax(logits) / sigmoid(logits) for the
    straight-through classes, P(gate open) = sigmoid(logits - T log(-low / high)) (Louizos et al. eq. 12)
    for HardConcrete; they sum to 1. (NumPyro's one-hot limit refuses the host's enumerate_support,
    whose enumeration and Gibbs samplers take values to be integers: tests/test_numpyro_jax.py;
    the values are the library's: ``backend.enumerate_support``.)"""
    d = case.make(backend).discrete()
    assert d.support.is_discrete and d.has_enumerate_support
    b, e = case.batch_shape, case.event_shape
    support = backend.numpy(backend.enumerate_support(d, expand=True))
    n = e[0] if case.n_ary else 2
    assert support.shape == (n,) + b + e
    compact = backend.numpy(backend.enumerate_support(d, expand=False))
    assert compact.shape == (n,) + (1,) * len(b) + e
    np.testing.assert_array_equal(np.broadcast_to(compact, support.shape), support)
    a, t, low, high = case.broadcast_params()
    if case.n_ary:
        np.testing.assert_array_equal(compact.reshape(n, n), np.eye(n))
        expected = np.moveaxis(np.log(softmax(a, -1)), -1, 0)
    else:
        np.testing.assert_array_equal(compact.reshape(2), [0.0, 1.0])
        open_logits = a - (t * np.log(-low / high) if case.name == "HardConcrete" else 0.0)
        expected = np.stack([log_expit(-open_logits), log_expit(open_logits)])
    log_mass = backend.numpy(d.log_prob(backend.array(support)))
    np.testing.assert_allclose(log_mass, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.exp(log_mass).sum(0), 1.0, rtol=1e-12)


# ----------------------------------------------------------------------------- 13. straight-through score gradients in probs

# the host's probs, the largest of each kind: a (2, 1, 2) batch of K = 2, K = 10, and a (2, 2) Bernoulli batch
ONE_HOT_PROBS = [[[[0.25, 0.75]], [[0.75, 0.25]]], [0.1] * 10]
BERNOULLI_PROBS = [[[0.25, 0.75], [0.75, 0.25]]]
ST_PROBS = [("ConcreteStraightThrough", p) for p in ONE_HOT_PROBS] + [("BinConcreteStraightThrough", p) for p in BERNOULLI_PROBS]


def _score_of_rsample(backend, name, probs_st, probs_relaxed):
    """log_prob(rsample()).sum() of the straight-through distribution of ``probs_st`` plus that of its
    relaxed parent of ``probs_relaxed``, same seed: one compiled function, the two gradients apart."""
    st = getattr(backend.lib, name)(0.5, probs=probs_st, validate_args=False)
    relaxed = getattr(backend.lib, STRAIGHT_THROUGH[name])(0.5, probs=probs_relaxed, validate_args=False)
    return st.log_prob(backend.sample(st, (), seed=8)).sum() + relaxed.log_prob(backend.sample(relaxed, (), seed=8)).sum()


@pytest.mark.parametrize("name, probs", ST_PROBS, ids=[f"{n}-{np.shape(p)}" for n, p in ST_PROBS])
def test_straight_through_score_gradient_in_probs(backend, name, probs):
    """Pyro test_relaxed_straight_through.py test_onehot_shapes / test_bernoulli_shapes (its probs shapes,
    temperature 0.5): grad(log_prob(rsample()).sum(), probs) has the shape of probs. With a value
    check: it equals the gradient for the relaxed parent (Concrete / BinConcrete) with the same noise
    (the straight-through sample is scored by its relaxed sample, whose gradient it carries), rtol 1e-10;
    tests/test_straight_through.py checks this for logits. (The host's Monte Carlo score-gradient
    test, 1.5-2M samples at prec 0.04-0.08, is implied by this exact equality.)"""
    probs = np.asarray(probs, np.float64)
    _, (by_st, by_relaxed) = backend.value_and_grad(_score_of_rsample, probs, probs, static=(backend, name))
    assert by_st.shape == probs.shape
    np.testing.assert_allclose(by_st, by_relaxed, rtol=1e-10, atol=1e-12)
    assert np.abs(by_st).max() > 1e-3
