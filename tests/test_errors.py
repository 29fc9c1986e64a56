"""Bad input: a ValueError that names the argument and what is wrong, for every distribution."""

import numpy as np
import pytest

from tests.cases import N_ARY, NAMES


def _good_logits(name):
    return np.array([0.2, -0.3, 1.0]) if name in N_ARY else np.array([0.2, -0.3])


def _batch_of_two(name):
    return np.zeros((2, 3)) if name in N_ARY else np.zeros(2)


def _good_probs(name):
    return np.array([0.2, 0.3, 0.5]) if name in N_ARY else np.array([0.2, 0.7])


# (id, constructor arguments as a function of the distribution name, regex the message must match)
BAD_PARAMETERS = [
    ("temperature-zero", lambda n: dict(temperature=0.0), r"temperature must be positive"),
    ("temperature-negative", lambda n: dict(temperature=-1.0), r"temperature must be positive"),
    ("temperature-nan", lambda n: dict(temperature=float("nan")), r"temperature"),
    ("temperature-inf", lambda n: dict(temperature=float("inf")), r"temperature must be positive and finite"),
    ("temperature-array-zero", lambda n: dict(temperature=np.array([0.5, 0.0])), r"temperature must be > 0"),
    ("temperature-array-nan", lambda n: dict(temperature=np.array([0.5, np.nan])), r"temperature contains NaN"),
    ("temperature-array-inf", lambda n: dict(temperature=np.array([np.inf])), r"temperature must be finite"),
    ("logits-nan", lambda n: dict(logits=np.where([True, False, False][: len(_good_logits(n))], np.nan, _good_logits(n))), r"logits contains NaN"),
    ("logits-inf", lambda n: dict(logits=np.where([False, True, False][: len(_good_logits(n))], -np.inf, _good_logits(n))), r"logits must be finite"),
    ("logits-and-probs", lambda n: dict(logits=_good_logits(n), probs=_good_probs(n)), r"exactly one of `logits` or `probs`, got both"),
    ("neither", lambda n: dict(logits=None), r"exactly one of `logits` or `probs`, got neither"),
    ("probs-negative", lambda n: dict(logits=None, probs=np.array([-0.1, 0.6, 0.5])[: len(_good_probs(n))]), r"probs must lie in \[0, 1\]"),
    ("probs-above-one", lambda n: dict(logits=None, probs=np.array([1.2, -0.1, -0.1])[: len(_good_probs(n))]), r"probs must lie in \[0, 1\]"),
    ("probs-nan", lambda n: dict(logits=None, probs=np.array([np.nan, 0.5, 0.5])[: len(_good_probs(n))]), r"probs contains NaN"),
    ("probs-zero", lambda n: dict(logits=None, probs=np.array([0.0, 0.5, 0.5])[: len(_good_probs(n))]),
     r"probs must (lie strictly inside \(0, 1\)|be positive: .* alpha_k = 0)"),
    ("temperature-shape", lambda n: dict(temperature=np.ones(4) / 2, logits=_batch_of_two(n)), r"temperature of shape \(4,\) does not broadcast"),
    ("temperature-bool", lambda n: dict(temperature=True), r"temperature must be a number .* boolean"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", BAD_PARAMETERS, ids=[b[0] for b in BAD_PARAMETERS])
def test_bad_parameters_raise(backend, name, bad):
    _, arguments, message = bad
    kwargs = dict(temperature=0.5, logits=_good_logits(name))
    kwargs.update(arguments(name))
    with pytest.raises(ValueError, match=rf"{name}: .*{message}|{name}: {message}"):
        backend.make(name, kwargs.pop("temperature"), validate_args=True, **kwargs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("temperature", [None, "0.5", 1 + 2j, object()], ids=["None", "str", "complex", "object"])
def test_a_temperature_that_is_not_a_real_number_raises_naming_it(backend, name, temperature):
    """Not a number at all: named, where the hosts' conversions raised a TypeError of their own
    ("must be real number, not NoneType", "Cannot determine dtype")."""
    with pytest.raises(ValueError, match=rf"{name}: temperature must be a real number or a floating-point (tensor|array), got"):
        getattr(backend.lib, name)(temperature, logits=backend.array(_good_logits(name)))


@pytest.mark.parametrize("name", NAMES)
def test_a_temperature_given_as_a_list_is_a_batch_parameter(backend, name):
    d = getattr(backend.lib, name)([0.5, 2.0], logits=backend.array(_batch_of_two(name)))
    same = getattr(backend.lib, name)(backend.array([0.5, 2.0]), logits=backend.array(_batch_of_two(name)))
    x = backend.sample(same, seed=3)
    np.testing.assert_array_equal(backend.numpy(d.log_prob(x)), backend.numpy(same.log_prob(x)))


@pytest.mark.parametrize("name", N_ARY)
def test_categorical_probs_with_one_that_rounds_to_one_are_accepted(backend, name):
    """A float32 point estimate whose largest probability rounds to 1.0 beside positive ones is a
    valid categorical (finite logits): accepted, and the same distribution as its logits."""
    probs = np.array([4e-17, 1.9e-18, 1.3e-18, 1.0], np.float32)
    by_probs = backend.make(name, 0.5, probs=probs, dtype="float32", validate_args=True)
    by_logits = backend.make(name, 0.5, logits=np.log(probs), dtype="float32", validate_args=True)
    x = backend.sample(by_logits, (5,), seed=1)
    np.testing.assert_array_equal(backend.numpy(by_probs.log_prob(x)), backend.numpy(by_logits.log_prob(x)))
    assert np.isfinite(backend.numpy(by_probs.log_prob(x))).all()


@pytest.mark.parametrize("name", [n for n in NAMES if n not in N_ARY])
def test_binary_probs_of_one_raise(backend, name):
    with pytest.raises(ValueError, match=rf"{name}: probs must lie strictly inside \(0, 1\)"):
        backend.make(name, 0.5, probs=np.array([0.5, 1.0]), validate_args=True)


@pytest.mark.parametrize("name", N_ARY)
def test_probs_not_summing_to_one_raise(backend, name):
    with pytest.raises(ValueError, match=rf"{name}: probs must sum to 1 along the last axis"):
        backend.make(name, 0.5, probs=np.array([0.2, 0.3, 0.4]), validate_args=True)


@pytest.mark.parametrize("name", N_ARY)
@pytest.mark.parametrize("logits", [np.array([1.0]), np.array(1.0), np.zeros((3, 1))], ids=["K1", "scalar", "batch-K1"])
def test_fewer_than_two_categories_raise(backend, name, logits):
    """Structural: raised even with validation off."""
    with pytest.raises(ValueError, match=rf"{name}: (needs at least 2 categories|logits must have a last axis)"):
        backend.make(name, 0.5, logits=logits, validate_args=False)


@pytest.mark.parametrize("name", NAMES)
def test_structural_errors_raise_without_validation(backend, name):
    with pytest.raises(ValueError, match="got both"):
        backend.make(name, 0.5, logits=_good_logits(name), probs=_good_probs(name), validate_args=False)
    with pytest.raises(ValueError, match="does not broadcast"):
        backend.make(name, np.ones(4) / 2, logits=_batch_of_two(name), validate_args=False)
    with pytest.raises(ValueError, match="temperature must be positive"):
        backend.make(name, -0.5, logits=_good_logits(name), validate_args=False)


OFF_SUPPORT = {
    "Concrete": [np.array([0.5, 0.6, 0.1]), np.array([-0.1, 0.6, 0.5]), np.array([np.nan, 0.5, 0.5])],
    "ExpConcrete": [np.log([0.5, 0.6, 0.1]), np.array([0.1, -1.0, -2.0]), np.array([0.2, 0.3, 0.5])],
    "BinConcrete": [np.array([0.5, 1.5]), np.array([-0.1, 0.5]), np.array([np.nan, 0.5])],
    "LogitBinConcrete": [np.array([np.nan, 0.5])],
}


@pytest.mark.parametrize("name", NAMES)
def test_values_off_the_support_raise_under_validation(backend, name):
    d = backend.make(name, 0.5, logits=_good_logits(name), validate_args=True)
    for value in OFF_SUPPORT[name]:
        with pytest.raises(ValueError, match="support"):
            d.log_prob(backend.array(value))


@pytest.mark.parametrize("name", N_ARY)
def test_values_with_the_wrong_event_shape_raise_under_validation(backend, name):
    d = backend.make(name, 0.5, logits=_good_logits(name), validate_args=True)
    with pytest.raises(ValueError, match="event_shape|event shape"):
        d.log_prob(backend.array(np.full(4, 0.25)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "logits, temperature, message",
    [
        ((3e38, 3e38, 0.0), 1.0, r"\|logits\| must stay below 16384 in float32, found 3e\+38"),
        ((1e37, 0.0, -1.0), 0.01, r"\|logits\| must stay below 16384 in float32"),
        ((0.0, -1e9, 1.0), 0.5, r"\|logits\| must stay below 16384 in float32, found 1e\+09.*to mask a category"),
        ((10.0, 0.0, 3.0), 1e-19, r"\|logits\| / temperature must stay below 1.84e\+19 in float32"),
    ],
    ids=["3e38", "1e37-cold", "mask-1e9", "tiny-temperature"],
)
def test_logits_beyond_what_float32_resolves_raise(backend, name, logits, temperature, message):
    """float32. Huge logits made NaN samples and log_prob (also for the binary family at +-3e38);
    logits of 1e6-1e9 (a category masked with -1e9) lose the sampler's noise to rounding in
    logits + noise, and own samples were scored up to 13 nats off; a temperature so small that
    logits / temperature overflows. Under validation each is a ValueError naming the logits."""
    logits = np.array(logits[: len(_good_logits(name))])
    with pytest.raises(ValueError, match=rf"{name}: {message}"):
        backend.make(name, temperature, logits=logits, dtype="float32", validate_args=True)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "temperature, dtype, validate, message",
    [
        (1e-46, "float32", False, r"temperature 1e-46 is 0.0 in float32, the dtype of the logits"),
        (1e39, "float32", False, r"temperature 1e\+39 is inf in float32, the dtype of the logits"),
        (1e-8, "float16", False, r"temperature 1e-08 is 0.0 in float16"),
        (1e-40, "float32", True, r"temperature must be at least 4.73e-18 in float32, found 9.99995e-41"),
        (np.array(1e-40), "float32", True, r"temperature must be at least 4.73e-18 in float32"),
        (1e-320, "float64", True, r"temperature must be at least 5.28e-152 in float64"),
    ],
    ids=["rounds-to-0", "rounds-to-inf", "float16-0", "subnormal", "subnormal-array", "float64-subnormal"],
)
def test_temperatures_the_dtype_does_not_resolve_raise(backend, name, temperature, dtype, validate, message):
    """The temperature was checked as given, before the logits' dtype rounded it: 1e-46 became 0 in
    float32, 1e39 inf, and with logits of 0 (a uniform prior, which the ratio bound leaves alone) a
    temperature of 1e-40 overflowed the samples: NaN samples and log_prob, no error. A number that
    rounds to 0 or inf is refused with validation off too, as 0 and inf are."""
    logits = np.zeros(len(_good_logits(name)))
    with pytest.raises(ValueError, match=rf"{name}: {message}"):
        backend.make(name, temperature, logits=logits, dtype=dtype, validate_args=validate or None)


@pytest.mark.parametrize("name", NAMES)
def test_the_logits_bounds_leave_resolvable_cases_alone(backend, name):
    """Logits +-50 at T = 0.01 (the grid's extremes), a mask of -1e4 in float32, 1e12 in float64:
    accepted, and their own samples are scored without NaN."""
    for logits, temperature, dtype in [((50.0, -50.0, 0.0), 0.01, "float32"), ((0.0, -1e4, 1.0), 0.5, "float32"), ((1e12, 0.0, -1.0), 1.0, "float64")]:
        d = backend.make(name, temperature, logits=np.array(logits[: len(_good_logits(name))]), dtype=dtype, validate_args=True)
        _, (own,) = backend.score_samples(d, (), (4,), seed=0)
        assert not np.isnan(own).any()


# ----------------------------------------------------------------------------- discrete data under a relaxed site

DISCRETE_DATA = {
    "Concrete": (np.array([0.3, -0.2, 1.0]), np.array([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0]])),
    "BinConcrete": (np.array([0.3, -0.2]), np.array([[0.4, 0.6], [1.0, 0.0]])),
}


# the one-hot (0/1) limit of the density by temperature: +inf below K - 1 (K = 3; binary: 1), finite there, 0 above
LIMITS = {"Concrete": {0.5: np.inf, 2.0: "finite", 3.0: -np.inf}, "BinConcrete": {0.5: np.inf, 1.0: "finite", 1.5: -np.inf}}


@pytest.mark.parametrize("name, temperature", [(name, t) for name in sorted(LIMITS) for t in LIMITS[name]])
def test_discrete_data_under_a_relaxed_site_raises_naming_the_discrete_counterpart(backend, name, temperature):
    """A one-hot (0/1) value lies on the boundary, where the density is only a limit: +inf at T <
    K - 1 (binary: 1), finite at K - 1, 0 above (LIMITS). Under validation log_prob
    raises at every temperature -- also at an observed site of a model -- and names .discrete()
    (a finite limit was returned: the density of no sample, so a straight-through or underflowed
    sample scored eagerly by NumPyro's prior got a wrong finite number); without validation, the
    limit; the discrete counterpart scores the same data with its masses."""
    logits, values = DISCRETE_DATA[name]
    counterpart = "OneHotCategorical" if name == "Concrete" else "Bernoulli"
    message = rf"{name}\.log_prob: .* density is only a limit .*{name}\(\.\.\.\)\.discrete\(\) \({counterpart}\)"
    d = backend.make(name, temperature, logits=logits, validate_args=True)
    with pytest.raises(ValueError, match=message):
        d.log_prob(backend.array(values))
    interior = backend.numpy(d.log_prob(backend.array(values[:1])))  # no boundary point: scored
    assert np.all(np.isfinite(interior))

    def model(data):
        backend.site("y", backend.make(name, temperature, logits=logits, validate_args=True), obs=data)

    with pytest.raises(ValueError, match=message):
        backend.run(model, backend.array(values))
    unvalidated = backend.numpy(backend.make(name, temperature, logits=logits, validate_args=False).log_prob(backend.array(values)))
    assert np.all(np.isfinite(unvalidated[0]))
    limit = LIMITS[name][temperature]
    if limit == "finite":
        assert np.all(np.isfinite(unvalidated[1]))
    else:
        np.testing.assert_array_equal(unvalidated[1], limit)
    masses = backend.numpy(d.discrete().log_prob(backend.array(values[1])))
    expected = np.log(np.exp(logits) / np.exp(logits).sum())[1] if name == "Concrete" else np.log(1 / (1 + np.exp(-logits * [1, -1])))
    np.testing.assert_allclose(masses, expected, rtol=1e-10)


@pytest.mark.parametrize("name, dtype", [("Concrete", "int64"), ("Concrete", "bool"), ("BinConcrete", "int64"), ("BinConcrete", "bool")])
def test_discrete_data_of_an_integer_dtype_is_discrete_data(backend, name, dtype):
    """A label as ``one_hot(y, K)`` (an integer dtype) or a bool mask: the hosts' errors about the
    dtype (torch.finfo of an integer type, negation of a bool tensor, NumPy's "not inexact") came
    before the message that names .discrete(); it is the same data as its float copy now, refused
    alike under validation and scored alike without."""
    logits, values = DISCRETE_DATA[name]
    boundary = values[1:]
    with pytest.raises(ValueError, match=rf"{name}\.log_prob: .* density is only a limit"):
        backend.make(name, 0.5, logits=logits, validate_args=True).log_prob(backend.array(boundary, dtype))
    unvalidated = backend.make(name, 2.0 if name == "Concrete" else 1.0, logits=logits, validate_args=False)
    np.testing.assert_array_equal(backend.numpy(unvalidated.log_prob(backend.array(boundary, dtype))),
                                  backend.numpy(unvalidated.log_prob(backend.array(boundary))))


def test_numpyro_eager_straight_through_sample_under_a_relaxed_prior_raises():
    """NumPyro, eagerly (``svi.evaluate`` outside ``jit``): the guide's straight-through one-hot
    reaches the model's Concrete prior without its relaxed coordinates (only a traced value carries
    them). At T = 1 with K = 2 the boundary limit is finite, and the loss was a wrong finite number
    (not the jitted one); it raises, saying to jit the call, and the jitted loss
    is the hand-written one."""
    jax = pytest.importorskip("jax")
    numpyro = pytest.importorskip("numpyro")
    import jax.numpy as jnp
    import numpyro.distributions as dist
    from numpyro.infer import Trace_ELBO

    import numpyro_concrete as nc

    x = jnp.array([-2.5, 2.8, 3.1, -3.3])
    prior_logits, phi = jnp.array([0.8, -0.4]), jnp.full((4, 2), 0.3)

    def model(x):
        with numpyro.plate("data", 4):
            z = numpyro.sample("z", nc.Concrete(1.0, logits=prior_logits, validate_args=True))
            numpyro.sample("x", dist.Normal((z * jnp.array([-3.0, 3.0])).sum(-1), 1.0), obs=x)

    def guide(x):
        with numpyro.plate("data", 4):
            numpyro.sample("z", nc.ConcreteStraightThrough(1.0, logits=numpyro.param("phi", phi), validate_args=True))

    key = jax.random.PRNGKey(3)
    with pytest.raises(ValueError, match=r"density is only a limit .*jax\.jit\(svi\.evaluate\)"):
        Trace_ELBO().loss(key, {"phi": phi}, model, guide, x)
    jitted = jax.jit(lambda p: Trace_ELBO().loss(key, p, model, guide, x))({"phi": phi})
    # by hand: the guide's draw with the seed Trace_ELBO gives it, scored by its coordinates
    _, guide_key = jax.random.split(key)
    with numpyro.handlers.seed(rng_seed=guide_key):
        value, (y,) = nc.ConcreteStraightThrough(1.0, logits=phi).sample_with_intermediates(numpyro.prng_key())
    relaxed = jnp.exp(y)
    by_hand = -(dist.Normal((value * jnp.array([-3.0, 3.0])).sum(-1), 1.0).log_prob(x).sum()
                + nc.Concrete(1.0, logits=prior_logits).log_prob(relaxed, [y]).sum() - nc.Concrete(1.0, logits=phi).log_prob(relaxed, [y]).sum())
    np.testing.assert_allclose(float(jitted), float(by_hand), rtol=1e-6)


# ----------------------------------------------------------------------------- arg_constraints are what is checked

F32_BOUND = 2.0**14  # concrete_common.floats.logits_bounds in float32
# {parameter: (valid values, invalid values)} in float32, each beside valid other parameters (logits of
# magnitude <= 1, temperatures >= 1e-10: the ratio bound, which ties two parameters, is not reached)
CONSTRAINT_VALUES = {
    "temperature": ([0.5, 1e-10, 1e30], [0.0, -1.0, np.inf, np.nan]),
    "logits": ([0.0, -1.0, F32_BOUND, -F32_BOUND], [2 * F32_BOUND, np.inf, -np.inf, np.nan]),
    "probs": ([(0.2, 0.3, 0.5), (1.0, 4e-17, 1e-18)], [(0.0, 0.5, 0.5), (0.2, 0.3, 0.6), (np.nan, 0.5, 0.5), (-0.1, 0.6, 0.5)]),
    "binary probs": ([0.5, 1e-30, 1 - 1e-7], [0.0, 1.0, 1.5, np.nan]),
    "low": ([-0.1, -1e30], [0.0, 0.5, -np.inf, np.nan]),
    "high": ([1.1, 1e30], [1.0, 0.5, np.inf, np.nan]),
}


@pytest.mark.parametrize("name", NAMES + ("HardConcrete",))
def test_arg_constraints_say_what_validation_checks(backend, name):
    """For every parameter of every class, ``arg_constraints[parameter].check`` holds for the valid
    values and fails for the invalid ones, and construction under validation raises a ValueError
    exactly for the invalid ones (issue 14: the constraints a host's tools read are the ones applied);
    the bijection registered for each maps onto it."""
    n_ary = name in N_ARY
    good = {"temperature": 0.5, "logits": np.array([0.2, -0.3, 1.0]) if n_ary else np.array(0.2)}
    parameters = ["temperature", "logits", "probs"] + (["low", "high"] if name == "HardConcrete" else [])
    for parameter in parameters:
        valid, invalid = CONSTRAINT_VALUES["binary probs" if parameter == "probs" and not n_ary else parameter]
        for value, ok in [(v, True) for v in valid] + [(v, False) for v in invalid]:
            value = np.array(value, dtype=np.float64)
            if parameter == "logits" and n_ary:
                value = np.array([value, 0.0, 0.5])
            arguments = {**good, parameter: value} if parameter != "probs" else {"temperature": 0.5, "logits": None, "probs": value}
            constraint = backend.make(name, 0.5, logits=good["logits"], dtype="float32").arg_constraints[parameter]
            holds = bool(np.all(backend.numpy(constraint.check(backend.array(value, "float32")))))
            try:
                backend.make(name, dtype="float32", validate_args=True, **arguments)
                raised = False
            except ValueError:
                raised = True
            assert holds == ok and raised != ok, f"{name} {parameter}={value}: {constraint} holds={holds}, raised={raised}"
        unconstrained = np.array([[-3.0, 0.0, 2.5], [1.0, -1.0, 0.5]])
        if parameter == "logits" or (parameter == "probs" and n_ary):
            unconstrained = unconstrained[:, :2]  # R^(K-1) onto the simplex / into vectors of logits
        if parameter == "logits" and not n_ary:
            unconstrained = unconstrained[:, 0]
        mapped = backend.biject_to(constraint)(backend.array(unconstrained, "float32"))
        assert np.all(backend.numpy(constraint.check(mapped))), (name, parameter)


@pytest.mark.parametrize("name", ["ImportanceWeightedELBO", "VIMCO", "ScoreFunctionELBO", "REBAR", "RELAX", "GumbelRao", "DisARM"])
def test_the_losses_constructor_arguments_raise_naming_them(backend, name):
    """``plate`` must be a plate's name (3 was taken, to fail later as "outside plate 3"); RELAX's
    ``hidden`` a positive integer (0 divided by zero in NumPyro's initializer, -3 and 2.5 gave the
    hosts' errors, and Pyro trained a network of width 0)."""
    cls = getattr(backend.lib, name)
    with pytest.raises(ValueError, match=rf"^{name}: plate must be None or the name of a plate \(a string\), got 3$"):
        cls(plate=3)
    if name == "RELAX":
        for hidden in (0, -3, 2.5, "32", True):
            with pytest.raises(ValueError, match=rf"^RELAX: hidden must be a positive integer, got {hidden!r}$"):
                cls(hidden=hidden)
        assert cls(hidden=1).hidden == 1
        assert cls(hidden=np.int64(3)).hidden == 3


@pytest.mark.parametrize("name, least", [("ImportanceWeightedELBO", 1), ("VIMCO", 2)])
def test_num_particles_is_checked_at_construction_and_takes_numpy_integers(backend, name, least):
    """``for m in 2 ** np.arange(4)``: NumPy's integers were refused ("must be an integer >= 2, got
    np.int64(4)"), which the hosts' ELBOs take; ImportanceWeightedELBO(num_particles=0) was built, to
    fail at the first step."""
    cls = getattr(backend.lib, name)
    for bad in (0, -2, 2.0, None):
        with pytest.raises(ValueError, match=rf"^{name}: num_particles must be "):
            cls(num_particles=bad)
    assert cls(num_particles=np.int64(4)).num_particles == 4

