"""The error messages both packages raise, and the checks that read only plain numbers and names.

Each says what was wrong and what to do; the backends decide when to call them (their values are
tensors or JAX arrays, read in their own way)."""


def fail(owner, message):
    """A ValueError that names who refused (a class or helper) and why."""
    raise ValueError(f"{owner}: {message}")


# --------------------------------------------------------------------------- distributions


def bound_message(largest, coldest, magnitude, ratio, dtype):
    """Why logits beyond :func:`logits_bounds` (``magnitude``, ``ratio``) are refused in ``dtype``."""
    if largest > magnitude:
        return (
            f"|logits| must stay below {magnitude:g} in {dtype}, found {largest:g}: beyond, rounding in "
            "logits + noise loses the sampler's noise and samples and densities would be wrong; to mask a "
            "category give it a logit a few hundred below the others (or use float64)"
        )
    return (
        f"|logits| / temperature must stay below {ratio:.3g} in {dtype} (a sample's log coordinates are "
        f"(logits + noise) / temperature, and their sums must stay finite): found |logits| up to {largest:g} "
        f"with temperature {coldest:g}; rescale the logits (only their differences matter in the n-ary case) "
        "or raise the temperature"
    )


def boundary_probs_message(categorical):
    """Why probabilities of exactly 0 (or 1, binary) are refused."""
    if categorical:
        return (
            "probs must be positive: a probability of exactly 0 is alpha_k = 0, outside the Concrete family "
            "(every alpha_k must be > 0; a probability that rounds to 1 beside positive ones is fine); to make "
            "a category negligible, pass logits instead with it a few hundred below the others"
        )
    return (
        "probs must lie strictly inside (0, 1): a probability of exactly 0 or 1 is an infinite "
        "logit, outside the Concrete family (alpha in (0, inf)); pass finite logits instead"
    )


def infinite_density_message(name, boundary, counterpart):
    """Why a value where the density is +inf is refused under validation, and what to do."""
    return (
        f"{name}.log_prob: the value holds {boundary}, where the density is infinite (log_prob +inf). "
        f"Such values are discrete data: score them with the discrete counterpart, {name}(...).discrete() "
        f"({counterpart}), e.g. observe one-hot or 0/1 data through it; as padding under a mask, use an "
        "interior value. (With validate_args=False the limit +inf is returned.)"
    )


# --------------------------------------------------------------------------- test-time helpers


def check_given(helper, given, sampled):
    """``given`` names only sites the model samples (``sampled``: their names)."""
    unknown = sorted(set(given or {}) - set(sampled))
    if unknown:
        fail(helper, f"given names site(s) {unknown} that the model does not sample")


def not_enumerable_message(helper, site, distribution):
    return (
        f"{helper} sums out discrete latent sites exactly; site {site!r} holds {distribution}, which is "
        f"neither Concrete-family nor enumerable: evaluate at a value of it with given={{{site!r}: value}}"
    )


def check_full_plate(helper, plate, subsample_size, size):
    """The helpers evaluate the whole data set: a subsampled plate, whose sites would be a random
    subsample scaled up to the plate's size, raises."""
    if subsample_size < size:
        raise ValueError(
            f"{helper} evaluates the whole data set, but plate {plate!r} subsamples {subsample_size} of its "
            f"{size} elements (its sites would be a random subsample, scaled up): evaluate the model with "
            "the full plate (subsample_size=None)"
        )


def outside_plate_message(caller, site, plate):
    return f"{caller}: site {site!r} is outside plate {plate!r}"


def global_latent_message(caller, site, plate):
    return (
        f"{caller}: site {site!r} is a latent outside plate {plate!r}: per-element bounds need every latent "
        f"inside the plate (a global's proposal and density cannot be split between elements). Condition it on "
        f"a value (poutine.condition / numpyro.handlers.condition, e.g. its posterior mean) for the bounds "
        f"log p(x_n | {site}), or pass plate=None for one bound of all observations"
    )
