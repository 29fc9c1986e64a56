"""The error messages both packages raise, and the checks that read only plain numbers and names.

Each says what was wrong and what to do; the backends decide when to call them (their values are
tensors or JAX arrays, read in their own way). Below a public helper or loss, errors are raised as
:class:`ModelError` without a name, and the public function names itself where the user called it
(:func:`named_errors`): no caller's name is passed down."""

import functools
import math
import numbers
from collections.abc import Mapping


def fail(owner, message):
    """A ValueError that names who refused (a class or helper) and why."""
    raise ValueError(f"{owner}: {message}")


class ModelError(ValueError):
    """What a helper or loss found wrong with the model or guide it was given, raised below the public
    function, which prefixes its own name (:func:`named_errors`)."""


def named_errors(name=None):
    """Decorates a public function (``name``: how it is called) or a method (``name`` None: its
    class's name): a :class:`ModelError` raised below it reaches the caller as a ValueError that
    starts with that name."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ModelError as error:
                raise ValueError(f"{name or type(args[0]).__name__}: {error}") from None

        return wrapper

    return decorate


# --------------------------------------------------------------------------- distributions


def rounded_temperature_message(temperature, rounded, dtype):
    """Why a temperature the logits' dtype rounds to 0 or inf is refused (with validation off too)."""
    return (
        f"temperature {temperature!r} is {rounded} in {dtype}, the dtype of the logits: pass a temperature "
        f"that {dtype} holds (or logits of a wider dtype)"
    )


def cold_temperature_message(coldest, least, ratio, dtype):
    """Why a temperature below :func:`concrete_common.floats.coldest_temperature` is refused."""
    return (
        f"temperature must be at least {least:.3g} in {dtype}, found {coldest:g}: a sample's noise reaches "
        f"{least * ratio:.3g} in magnitude, and noise / temperature must stay below {ratio:.3g} (as |logits| / "
        "temperature must), or the samples overflow; raise the temperature or use a wider dtype"
    )


def bound_message(largest, coldest, magnitude, ratio, dtype):
    """Why logits beyond :func:`logits_bounds` (``magnitude``, ``ratio``) are refused in ``dtype``."""
    if largest > magnitude:
        return (
            f"|logits| must stay below {magnitude:g} in {dtype}, found {largest:g}: beyond, rounding in "
            "logits + noise loses the sampler's noise and samples and densities would be wrong; to mask a "
            "category give it a logit a few hundred below the others (or use float64)"
            + ("; logits from a network under autocast are half precision: pass logits.float()" if dtype in ("bfloat16", "float16") else "")
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


def boundary_value_message(name, boundary, counterpart, untraced=False):
    """Why a value on the boundary of the support is refused under validation, and what to do;
    ``untraced``: NumPyro's, outside any trace, where a sample carries its coordinates to no other
    distribution (``numpyro_concrete._carry``)."""
    message = (
        f"{name}.log_prob: the value holds {boundary}, where the density is only a limit (+inf, finite or 0, "
        f"by the temperature), not the density of any sample (a sample lies inside). Such values are discrete data: "
        f"score them with the discrete counterpart, {name}(...).discrete() ({counterpart}), e.g. observe one-hot "
        "or 0/1 data through it; as padding under a mask, use an interior value. A sample of the family copied or "
        "changed on its way here (indexed, gathered by MixtureSameFamily, through a transform) is scored from its "
        "values too, and an underflowed or straight-through one lands here: score the sample the distribution drew, "
        "or draw in log space (ExpConcrete, LogitBinConcrete). (With validate_args=False the limit is returned.)"
    )
    if untraced:
        message += (
            " If it is a sample of the family scored by another distribution outside jax.jit -- a straight-through "
            "or underflowed guide sample under the model's prior in an eager svi.evaluate, say -- run that call "
            "under jax.jit (jax.jit(svi.evaluate)): only inside a traced computation does a sample carry its "
            "relaxed coordinates to the model."
        )
    return message


# --------------------------------------------------------------------------- test-time helpers


def check_given(given, sampled):
    """``given`` names only sites the model samples (``sampled``: their names)."""
    unknown = sorted(set(given or {}) - set(sampled))
    if unknown:
        raise ModelError(f"given names site(s) {unknown} that the model does not sample")


def check_params(params):
    """A helper's ``params``: None, or a dict from parameter name to value (as the param store or
    ``svi.get_params`` give)."""
    if params is not None and not isinstance(params, Mapping):
        raise ModelError(f"params must be None or a dict from parameter name to value, got {type(params).__name__}")


def given_observed_site(site):
    """``given`` at an observed site: held at a value it would leave the log joint, and the helper
    would return the value without those observations (0 with no other)."""
    return ModelError(
        f"given names the observed site {site!r}: given holds latent sites at values, left out of the log joint; "
        "observations are the model's data (pass them as its arguments)"
    )


def not_enumerable(site, distribution):
    return ModelError(
        f"discrete latent sites are summed out exactly; site {site!r} holds {distribution}, which is "
        f"neither Concrete-family nor enumerable: evaluate at a value of it with given={{{site!r}: value}}"
    )


def sequential_enumeration(site):
    return ModelError(
        f"site {site!r} asks for sequential enumeration (infer={{'enumerate': 'sequential'}}); the exact helpers "
        "sum and decode discrete sites in parallel, and the host's infer_discrete draws a sequential site from its "
        "prior (a MAP or posterior draw that ignores the data): mark it 'parallel' or leave it unset"
    )


def vectorized_markov(site):
    """A site of Pyro's ``vectorized_markov`` (its funsor backend): the chain is traced as overlapping
    slices, one of them a copy marked not to be scored, which only that backend's own ELBOs read."""
    return ModelError(
        f"site {site!r} is a slice of a vectorized_markov chain (pyro.contrib.funsor), whose overlapping slices "
        "only that backend's TraceMarkovEnum_ELBO knows how to score; here they were summed as separate sites "
        "(a wrong log p(x), and decodings that disagree with themselves). Write the chain with pyro.markov"
    )


def monte_carlo_enumeration(site):
    """A discrete site marked for Monte Carlo enumeration (Pyro's ``num_samples``, for
    ``TraceTMC_ELBO``) in an exact helper."""
    return ModelError(
        f"site {site!r} is marked for Monte Carlo enumeration (infer={{'num_samples': ...}}), whose sum over its "
        "draws is an estimate, not the exact value the helpers return: leave num_samples out of the model "
        "passed to them (config_enumerate(model) without num_samples)"
    )


def check_full_plate(plate, subsample_size, size):
    """The helpers evaluate the whole data set: a subsampled plate, whose sites would be a random
    subsample scaled up to the plate's size, raises."""
    if subsample_size < size:
        raise ModelError(
            f"the whole data set is evaluated, but plate {plate!r} subsamples {subsample_size} of its "
            f"{size} elements (its sites would be a random subsample, scaled up): evaluate the model with "
            "the full plate (subsample_size=None)"
        )
    if subsample_size > size:
        raise ModelError(
            f"the whole data set is evaluated, but plate {plate!r} takes {subsample_size} indices of its "
            f"{size} elements (repeats: its sites would be scaled down by {size}/{subsample_size}): evaluate "
            "the model with the full plate (subsample_size=None)"
        )


def host_enumeration_refused(cls_name):
    """Why NumPyro's one-hot, log one-hot and +-inf limits refuse ``enumerate_support``."""
    return (
        f"{cls_name}.enumerate_support: NumPyro's enumeration (config_enumerate, TraceEnum_ELBO, infer_discrete, "
        "NUTS's own) and its Gibbs samplers (DiscreteHMCGibbs, MixedHMC) take a discrete site's values to be "
        f"integers, one per coordinate, which {cls_name}'s are not; enumerate the model with "
        "discrete(model, mode=\"enumerate\") (an index enumerated in the site's place; NUTS then sums it out), or "
        "write the site with the host's Categorical / Bernoulli"
    )


def no_bijection_onto_gate():
    """Why ``biject_to`` refuses Hard Concrete's support, and what to do instead."""
    return ValueError(
        "HardConcrete's support, Gate(), is [0, 1] with point masses at 0 and 1: no bijection from the real "
        "line reaches the masses, so an autoguide or HMC / NUTS over a HardConcrete latent would see only the "
        "density inside and give P(z = 0) = P(z = 1) = 0. Draw the gates in a guide of your own and train "
        "them with L0Objective (Louizos et al.), or sample whether each gate is open, "
        "HardConcrete(...).discrete() (a Bernoulli), with an enumerating or discrete sampler"
    )


def check_l0(l0):
    """``L0Objective``'s ``l0`` as a float: the nats charged per open gate, a finite number >= 0."""
    if not isinstance(l0, numbers.Real) or isinstance(l0, bool) or not (math.isfinite(l0) and l0 >= 0):
        raise ValueError(f"L0Objective: l0 must be a finite number >= 0 (the nats charged per open gate), got {l0!r}")
    return float(l0)


def check_num_particles(num_particles, least=1, name="num_particles"):
    # any integer, NumPy's too (``for m in 2 ** np.arange(4)``), as the hosts' ELBOs take it
    if not (isinstance(num_particles, numbers.Integral) and not isinstance(num_particles, bool) and num_particles >= least):
        why = "a positive integer" if least == 1 else f"an integer >= {least} (the leave-one-out baseline needs two)"
        raise ModelError(f"{name} must be {why}, got {num_particles!r}")
    return int(num_particles)


def check_plate_name(plate):
    """A loss's ``plate`` argument: None, or the name of a plate of the model."""
    if plate is not None and not isinstance(plate, str):
        raise ModelError(f"plate must be None or the name of a plate (a string), got {plate!r}")


def check_plate_of_model(plate, plates):
    """``plate`` (None, or a name) among ``plates``, the names of the model's plates: a misspelled one
    was reported as a site outside it, whose remedy (condition the site) was not the user's."""
    check_plate_name(plate)
    if plate is not None and plate not in plates:
        raise ModelError(f"plate {plate!r} is not a plate of the model (its plates: {sorted(plates)})")


def outside_plate(site, plate):
    return ModelError(
        f"site {site!r} is outside plate {plate!r}: one value per element of the plate needs every site inside "
        "it; pass plate=None for one value of all observations"
    )


def clamped_probability(site, cls_name):
    """A host's discrete site built from probabilities that the host clamps before use (0, 1, and in
    Pyro any below eps): an exact sum over it, or its relaxation, would not be of the model as
    written."""
    return ModelError(
        f"site {site!r} is {cls_name}(probs=...) with a probability that the host clamps before using it (0 or 1, "
        "or closer to them than the dtype's eps: 1.2e-7 in float32, 2.2e-16 in float64), so its log density is of the clamped value, "
        "not the model's, and no Concrete distribution has a probability of 0: pass logits=... (exact at any "
        "value), or leave an impossible value out of the site's support (fewer categories, or a constant in "
        "place of a certain coin)"
    )


def masked_latent_read(site, reader):
    """A latent site masked out where an unmasked site reads it: the helpers sum a masked-out latent
    with its prior masses (a data point masked out entirely, its children with it, contributes 0),
    where the host weighs each of its values 1; with its children unmasked the two are different
    models (NumPyro's imputation idiom adds the prior back with a factor: counted twice)."""
    return ModelError(
        f"site {site!r} is masked out where the unmasked site {reader!r} reads its value: the exact helpers sum a "
        "masked-out latent with its prior masses (so that a data point masked out entirely, its children with it, "
        "contributes 0), which here would be another model than the host's, whose mask weighs each value 1 (a prior "
        "added back by a factor would count twice); leave the site unmasked and let its distribution score it (no "
        "factor for its prior), or mask the sites that read it where it is masked"
    )


def infinite_logits(site, cls_name, why="no Concrete distribution has a probability of 0"):
    """A host's discrete site given a logit of +-inf (a probability of exactly 0 or 1): ``relax``
    cannot make a Concrete-family site of it, and torch scores a certain coin's outcome NaN."""
    return ModelError(
        f"site {site!r} is {cls_name} with a logit of +-inf (a probability of exactly 0 or 1), and {why}: leave the "
        "impossible value out of the site's support (fewer categories, or a constant in place of a certain coin), "
        "or give it a finite logit"
    )


def relax_integer_categorical(site, cls_name, one_hot):
    """``relax(..., sites=...)`` naming a Categorical site of integer values."""
    return ValueError(
        f"relax: site {site!r} is {cls_name}, whose values are integers (indices), which no point of the simplex "
        f"stands for: write it with {one_hot} (its one-hot value selects with z @ table), which relax turns into Concrete"
    )


def scanned_site(site, cls_name, why="whose body keeps its own handlers, so it cannot be swapped for its discrete limit"):
    """A Concrete-family (or decoded) site drawn inside NumPyro's ``scan``."""
    return ModelError(
        f"site {site!r} ({cls_name}) is drawn inside numpyro.contrib.control_flow.scan, {why}; write the loop "
        "over time with numpyro.contrib.funsor.markov (a Python loop), which the helpers evaluate exactly "
        "(map_assignment: the Viterbi path)"
    )


class ParticleShapeError(ModelError):
    """A site's log_prob that does not hold one value per particle: the model or guide does not
    broadcast over the particle dimension, or has a batch dimension left of its plates. Drawing the
    particles one at a time may cure the first (:func:`importance_bound` does), never the second."""


def particle_shape(site, shape, particle_dim, num_particles):
    where = "left of" if len(shape) > -particle_dim else "at"
    return ParticleShapeError(
        f"site {site!r} has log_prob of shape {tuple(shape)}: a dimension of size other than "
        f"{'1 or ' + str(num_particles) if num_particles > 1 else '1'} {where} dim {particle_dim}, where each particle's "
        f"weight is read ({num_particles} particle{'s' if num_particles > 1 else ''}, left of the model's plates). Every "
        "batch dimension must be a plate's (a batched tensor in a with pyro.plate(...), or .to_event(...)), and with "
        "several particles, model and guide must broadcast over a leftmost particle dimension (a reshape written for one "
        "draw, such as x.unsqueeze(-1) of a global x that the particles batch, adds a dimension left of theirs)"
    )


def unplated_dimension(site, shape, dim, particle_dim):
    """A batch dimension right of the particles' that is none of the site's plates and holds more
    than one value: a batch shape not aligned with the plates, where the particles' values can sit."""
    return ParticleShapeError(
        f"site {site!r} has log_prob of shape {tuple(shape)}: dim {dim}, right of the particles' dim {particle_dim}, "
        f"holds {shape[dim]} values but is none of the site's plates, so each particle's weight would sum values of "
        "other particles or data points. Every batch dimension must be a plate's: a site outside a plate whose batch "
        "shape holds that plate's values (a .to_event(1) over them written after the plate) puts the particles at "
        "the plate's dimension; write the site inside the plate, or sum its density explicitly"
    )


def particles_not_broadcast(error):
    """A model or guide that fails when its particles are drawn in parallel (a reshape written for one
    draw), for a loss that draws them no other way."""
    return ParticleShapeError(
        f"the model or guide does not broadcast over a leftmost particle dimension, where the m particles are "
        f"drawn in parallel ({type(error).__name__}: {str(error).splitlines()[0][:200]}): write them to broadcast "
        "(a global written for one draw, such as z @ locs or x.unsqueeze(-1) of a global the particles batch, does "
        "not), or use ImportanceWeightedELBO / discrete_log_likelihood, which draw the particles one at a time there"
    )


def sequential_plate(site, plate):
    return ModelError(
        f"site {site!r} is in plate {plate!r} iterated sequentially (for i in plate(...)): one value per element "
        "needs a vectorized plate (with plate(...)); pass plate=None for one value of all observations"
    )


def global_latent(site, plate):
    return ModelError(
        f"site {site!r} is a latent outside plate {plate!r}: per-element bounds need every latent "
        f"inside the plate (a global's proposal and density cannot be split between elements). Condition it on "
        f"a value (poutine.condition / numpyro.handlers.condition, e.g. its posterior mean) for the bounds "
        f"log p(x_n | {site}), or pass plate=None for one bound of all observations"
    )


# --------------------------------------------------------------------------- losses


def baseline_value(site, infer):
    """The baseline a guide gives its score-function site ``site`` in ``infer`` -- Pyro's convention,
    ``infer={"baseline": {"baseline_value": b}}`` -- or None. The other keys of Pyro's
    ``TraceGraph_ELBO`` (decaying averages, baseline modules) are refused rather than ignored."""
    baseline = (infer or {}).get("baseline")
    if not baseline:
        return None
    unsupported = sorted(set(baseline) - {"baseline_value"})
    if unsupported:
        raise ModelError(
            f"site {site!r}: infer['baseline'] holds {unsupported}; only 'baseline_value' (a learned baseline "
            "computed in the guide, e.g. by a network of the data) is supported"
        )
    return baseline["baseline_value"]


def network_width(loss, width, features, plate):
    """The default control variate, built for ``width`` features, given another number (with
    ``plate=None`` the features are every coordinate of the subsample: a smaller last batch)."""
    where = (
        "with plate=None its features are every relaxed coordinate of the batch, so batches of another size "
        "(a smaller last one) give another number: pass plate=<the data plate> for features per element, or "
        "keep every batch the same size"
        if plate is None
        else "the relaxed sites' coordinates per element changed between steps"
    )
    return ModelError(f"its default control variate was built for {width} features and is given {features}: {where}")


def baseline_shape(site, shape, batch_shape):
    """A baseline must broadcast to the batch shape of its site's log density (one value per element
    of the site, as Pyro's ``TraceGraph_ELBO`` reads it)."""
    return ModelError(
        f"site {site!r}: infer['baseline']['baseline_value'] has shape {tuple(shape)}, which does not broadcast to "
        f"the site's batch shape {tuple(batch_shape)}: give one baseline per element of the site (or one for all)"
    )


def subsampled_joint_bound(plates):
    """The bound of m > 1 particles of all observations jointly, with a subsampled plate."""
    return ModelError(
        f"plate {plates[0]!r} subsamples its elements, but with plate=None the bound of m > 1 particles is the log of an "
        "average over the whole data set, which a subsample cannot estimate without bias: name the subsampled plate "
        f"(plate={plates[0]!r}) for one bound per element, scaled to the data set, or use num_particles=1 (the ELBO)"
    )


def subsampled_inside(plate, other):
    """The per-element bound of m > 1 particles, with another plate subsampled inside an element."""
    return ModelError(
        f"plate {other!r} subsamples its elements inside the elements of plate {plate!r}: the bound of m > 1 particles "
        f"of an element is the log of an average over the particles, which a subsample of {other!r} cannot estimate "
        f"without bias; subsample {plate!r} alone, or use num_particles=1 (the ELBO)"
    )


def subsampled_beside(plate, other):
    """The per-element bound of m > 1 particles, with another plate subsampled beside ``plate``."""
    return ModelError(
        f"plate {other!r} subsamples its elements beside plate {plate!r}: its sites are shared by every element of "
        f"{plate!r}, whose bound of m > 1 particles is the log of an average over the particles of their log weights "
        f"too, which a subsample of {other!r} cannot estimate without bias; subsample {plate!r} alone, or use "
        "num_particles=1 (the ELBO)"
    )


def drawn_and_observed(site):
    """A site the guide draws and the model observes (conditioned, or held at a value by a handler
    inside the model): the model never reads the guide's value, and log q of it would still be in
    every weight -- a bound above log p(x)."""
    return ModelError(
        f"site {site!r} is drawn by the guide but observed in the model (conditioned, or held at a value by a "
        "handler inside the model): the model never reads the guide's value, and its log q would still be in "
        "every importance weight (a 'bound' above log p(x)); leave it out of the guide, or mark it "
        "infer={'is_auxiliary': True} if the guide only uses it inside"
    )


def hard_concrete_in_bound(site):
    """A Hard Concrete latent in an importance-weighted bound: its point masses at 0 and 1 move with
    its parameters, and the pathwise gradient through the clamp misses their share."""
    return ModelError(
        f"site {site!r} holds HardConcrete, whose point masses at 0 and 1 move with its parameters: the "
        "pathwise gradient of an importance-weighted bound misses their share (22-32 % of the gradient of "
        "a gate, with no error), and its score-function gradient is not this loss's; train gates with "
        "L0Objective (its penalty is the closed-form P(gate != 0))"
    )


def l0_other_latents(sites):
    """``L0Objective`` with latent sites that are not gates: the objective charges gates only, and
    their prior and entropy (log p - log q) would be left out, with no error (a Bayesian weight's
    guide then shrank to a point, whatever its prior)."""
    return ValueError(
        f"L0Objective: site(s) {sites} are latents other than the guide's HardConcrete gates; the objective is -E log p(observations | "
        "gates) + l0 * E||gates||_0 and would leave out their prior and entropy, whatever the prior; hold them as "
        "parameters (deterministic weights, as the L0 paper trains), or train with an ELBO"
    )


def no_gates():
    """``L0Objective`` on a guide without a Hard Concrete site: no penalty at all, with no error."""
    return ValueError(
        "L0Objective: the guide draws no HardConcrete site, so the penalty l0 * sum P(gate != 0) has no gate "
        "to charge and the objective would be the likelihood alone (gates written with BinConcrete?); draw the "
        "gates with HardConcrete, or train with another loss"
    )


def model_latent_without_rsample(site, distribution, loss):
    """A latent the guide does not draw, drawn by the model from a prior without a reparameterized
    sampler: its prior's parameters need a score-function gradient."""
    return ModelError(
        f"site {site!r} ({distribution}) is a latent of the model that the guide does not draw, and it has no "
        f"reparameterized sampler: the gradient of its prior's parameters needs a score-function term, which {loss} "
        "does not compute; draw it in the guide, or use VIMCO / ScoreFunctionELBO, which give it that term"
    )


def guide_site_without_gradient(site, distribution, loss):
    """A guide site an estimator of the discrete graph gives no gradient: neither Concrete-family nor
    reparameterized."""
    return ModelError(
        f"guide site {site!r} holds {distribution}, which is neither Concrete-family nor reparameterized: {loss} "
        "estimates no gradient for it; relax it (a Concrete-family site) or use ScoreFunctionELBO / VIMCO"
    )


def model_only_discrete_latent(site, distribution, loss):
    """A discrete (Concrete-family or other non-reparameterized) latent of the model that the guide of
    an estimator of the discrete graph does not draw."""
    return ModelError(
        f"site {site!r} ({distribution}) is a discrete latent of the model that the guide does not draw: in the "
        f"discrete graph it is drawn from its prior, whose gradient {loss} does not estimate; draw it in the guide "
        "(e.g. a Concrete-family site with the prior's logits), or use ScoreFunctionELBO / VIMCO on discrete(model) and "
        "discrete(guide), which give its prior a score-function gradient"
    )


def effective_temperature_refused(coldest, largest, least, ratio):
    """Whether REBAR or RELAX must refuse to relax a site whose smallest temperature times the
    estimator's scale is ``coldest`` and whose largest |logits| is ``largest``: the distributions' own
    bounds (:func:`concrete_common.floats.coldest_temperature` ``least``,
    :func:`concrete_common.floats.logits_bounds` ``ratio``) must hold there too, or the relaxed samples
    overflow and every gradient of the step is NaN."""
    return not (math.isfinite(coldest) and coldest >= least and largest <= ratio * coldest)


def effective_temperature(estimator, site, scale, coldest, largest, dtype, least, ratio):
    """The error for REBAR's or RELAX's relaxation of ``site`` at its temperature times ``scale`` =
    exp(``{estimator}.log_temperature_scale``), a parameter the variance objective trains or the user
    set, where :func:`effective_temperature_refused` holds."""
    if not math.isfinite(coldest):
        problem = f"that temperature must be finite, found {coldest:g}"
    elif coldest < least:
        problem = cold_temperature_message(coldest, least, ratio, dtype)
    else:
        problem = (f"|logits| / temperature must stay below {ratio:.3g} in {dtype}, found |logits| up to {largest:g} "
                   f"with temperature {coldest:g}")
    return ValueError(
        f"{estimator}: site {site!r} relaxes at its temperature times exp({estimator}.log_temperature_scale) = "
        f"{scale:.3g}: {problem}; set {estimator}.log_temperature_scale nearer 0 (the variance objective trains it: "
        "a lower learning rate keeps it near)"
    )


def effective_temperature_in_transform(estimator, site, dtype, least, ratio):
    """:func:`effective_temperature` inside a torch.func transform (``vmap``), where the values cannot
    be read."""
    return ValueError(
        f"{estimator}: site {site!r} relaxes at its temperature times exp({estimator}.log_temperature_scale), which "
        f"must be finite and >= {least:.3g} in {dtype}, with |logits| / temperature <= {ratio:.3g} (inside a torch.func "
        f"transform: the values are not shown); set {estimator}.log_temperature_scale nearer 0"
    )


def control_variate_shape(estimator, shape, rows):
    """RELAX's network r returned other than one value per row of its features: broadcast against
    the per-element ELBO, it counted each element's terms once per row, a wrong value and gradient."""
    return ValueError(
        f"{estimator}: control_variate must map features of shape {rows + ('D',)} to {rows} or {rows + (1,)}, one value "
        f"per row; it returned shape {shape}"
    )


def one_per_row(estimator, output_shape, feature_shape):
    """The index that takes RELAX's network output to one value per row of its features (``...`` or
    ``(..., 0)``), or raises :func:`control_variate_shape`."""
    rows, shape = tuple(feature_shape[:-1]), tuple(output_shape)
    if shape == rows + (1,):
        return (..., 0)
    if shape == rows or (rows == (1,) and shape == ()):  # plate=None: one row, a scalar is its value
        return ...
    raise control_variate_shape(estimator, shape, rows)


# --------------------------------------------------------------------------- conditional samples


def not_a_limit_value(owner, limit):
    return ValueError(
        f"{owner}: hard must be a value of the zero-temperature limit ({limit}, e.g. a sample of "
        f".discrete()): the relaxed sample is drawn given it"
    )


def hard_shape_mismatch(owner, shape, batch_and_event):
    return ValueError(
        f"{owner}: hard of shape {tuple(shape)} does not broadcast with the distribution's batch and "
        f"event shape {tuple(batch_and_event)}"
    )


def transformed_site(mode, site, family):
    """A latent site whose distribution is a host ``TransformedDistribution`` of a Concrete-family
    distribution, still there after the model ran (no reparametrizer split it): the handler has no
    zero-temperature limit for it, and left as it was the site draws a relaxed sample inside the
    discrete graph (a helper's bound above the discrete graph's own, a relaxed "argmax")."""
    return ValueError(
        f"discrete(mode={mode!r}): site {site!r} is a TransformedDistribution of {family}, whose zero-temperature "
        "limit this handler cannot form, so it would stay relaxed in the discrete graph; sample the "
        f"{family} site itself and apply the transform in the model's code (a deterministic site), or split the "
        "site with the host's TransformReparam (poutine.reparam / numpyro.handlers.reparam)"
    )


def observed_after_enumeration(site):
    """A site ``discrete(mode="enumerate")`` made an enumerated index, then observed by a handler
    outside it that is not the host's ``condition`` (whose data the mode looks up first)."""
    return ModelError(
        f"discrete(mode='enumerate'): site {site!r} was made an enumerated index and then observed by a handler "
        "outside discrete(...): its value is not an index; condition it with the host's condition handler, "
        "or use discrete(..., mode='sample'), which scores an observed value with its discrete mass"
    )


def value_off_discrete_support(site):
    """A value an outer replay or substitute gives a site of ``discrete(mode="enumerate")`` that is
    not one of its discrete limit's values (a relaxed draw: a guide that draws the site)."""
    return ModelError(
        f"discrete(mode='enumerate'): site {site!r} is given a value from outside discrete(...) (the host's replay or "
        "substitute) that is not on its discrete support: the mode sums the site out, so a guide must not draw it "
        "(leave it out of the guide), and a value held from outside must be one of the limit's values (one-hot, "
        "log one-hot, 0/1, +-inf), as the helpers and Predictive return them"
    )


def unforeseen_value(site):
    """A floating-point value given to an enumerated index by a handler the mode could not look up."""
    return ModelError(
        f"discrete(mode='enumerate'): site {site!r} was made an enumerated index and then given a floating-point value "
        "by a handler outside discrete(...) that the mode cannot look up (such as substitute(substitute_fn=...)): an "
        "index is an integer, and the value would be scored as one; hold it with condition, substitute(data=...) or "
        "replay, which the mode reads in the site's own sample space, or use discrete(..., mode='sample')"
    )


def crossed_plates(host_error):
    """The exact helpers on discrete latents in plates that are not nested (a bicluster's rows and
    columns): the hosts' enumeration contracts tree-structured plates only, and said so in its own
    words (Pyro: about dimension symbols the model never named; funsor: "intractable!")."""
    return ModelError(
        "the model's discrete latent sites lie in plates that are not nested (crossed plates, as in a "
        "bicluster or item-response model): their exact sum is not tree-structured, which the hosts' "
        "enumeration cannot contract; bound log p(x) with discrete_log_likelihood instead (the host said: "
        f"{str(host_error).splitlines()[0]})"
    )


def per_element_scale(site, traced=False):
    """A scale the exact helpers and ``discrete_log_likelihood`` cannot take off the log joint."""
    return ModelError(
        f"site {site!r} has a {'traced' if traced else 'per-element'} scale (poutine.scale / handlers.scale): the exact "
        "helpers and discrete_log_likelihood take one number, common to every site they score"
    )


def different_scales(first, second, owners=None):
    """Two sites, (name, scale), scaled differently where one common scale weighs the result;
    ``owners``: whose each site is (the model's, the guide's), where they may share a name."""
    names = [repr(first[0]), repr(second[0])]
    if owners is not None:
        names = [f"{name} of the {owner}" for name, owner in zip(names, owners)]
    return ModelError(
        f"sites {names[0]} and {names[1]} have different scales (poutine.scale / handlers.scale: {first[1]} "
        f"and {second[1]}; None is none): the exact discrete graph and its bounds need one scale common to every "
        "site they score (as Pyro's TraceEnum_ELBO needs one for its enumerated sites), which weighs the result"
    )


def observed_at_boundary(site, cls_name):
    """An observed Concrete-family site whose value (discrete data) lies on the boundary of its
    support, where the density is only a limit: +inf for every assignment of the latents, or a
    number that is the density of no relaxed sample and not the data's probability."""
    return ModelError(
        f"site {site!r} ({cls_name}) is observed at a point of its support's boundary (a one-hot or 0/1 value, "
        "or their log / logit: discrete data), where the density is only a limit (+inf, finite or 0, by the "
        "temperature) that no relaxed sample has, so the discrete graph's log joint would not be that of the data; "
        f"hold it with given={{{site!r}: value}} (its own density left out), or observe the data through the "
        f"discrete counterpart, {cls_name}(...).discrete(), instead of conditioning the relaxed site on it"
    )


def funsor_recursion(limit):
    """Why NumPyro's exact helpers stopped on a long ``markov`` chain (funsor's interpreter recurses
    through the chain's factors; the host's own ``log_density`` of an enumerated chain stops alike)."""
    return (
        f"funsor's interpreter went deeper than Python's recursion limit ({limit}) while summing out the "
        "model's discrete sites: a markov chain of some hundreds of steps reaches the default limit of 1000. "
        "Raise it before the call, with sys.setrecursionlimit"
    )


def no_posterior(sites):
    """Why a decoding stopped: the posterior of the discrete sites is not defined."""
    return (
        f"the posterior of the discrete sites {sites} is not defined: every assignment of them has probability 0 "
        "given the observations (an observation the model rules out under every value)"
    )
