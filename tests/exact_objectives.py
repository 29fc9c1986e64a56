"""What each loss estimates on a model of ``tests/random_models.py``, computed in NumPy, float64,
independently of both backends: the discrete graph's ELBO and importance-weighted bound L_m by
exact enumeration of its discrete values (and of m-tuples of them), the relaxed graph's by Monte
Carlo, and the mean of the straight-through gradient; gradients by central differences with the
same noise (common random numbers). Continuous sites -- every site of the relaxed graph, the Normal
sites of the discrete one -- are integrated by Monte Carlo over ``draws`` noises: the value is then a
mean over draws, returned with its standard error (zero where everything is enumerated).

The full data set is evaluated: the reference of a subsampled model is the objective of all its
data, which the losses must estimate without bias from subsamples.
"""

import numpy as np
from scipy import stats
from scipy.special import log_expit, log_softmax, logsumexp

from tests import reference

BUDGET = 2_000_000  # array entries of one particle tuple (configurations^m x draws)


class Unavailable(Exception):
    """No exact value within the budget (too many discrete configurations)."""


# ----------------------------------------------------------------------------- one particle


def _lift(feature, parent_level, child_level):
    """A feature array (batch, *parent level shape) broadcast against the child level's shape."""
    order = {"global": 0, "local": 1, "inner": 2}
    missing = order[child_level] - order[parent_level]
    return feature.reshape(feature.shape + (1,) * missing)


def _squeeze_local(array, spec, level):
    """The model holds a local array as (n, 1) when an inner plate exists; here levels are
    global (), local (E,), inner (E, J)."""
    if level == "local" and spec.inner:
        return array[:, 0]
    return array


class _Particle:
    """One particle of the model and guide over a batch of configurations x noises.

    ``mode``: "discrete" (the relaxed sites' limits, enumerated), "relaxed" (relaxed samples) or
    "straight_through" (the value b + x - stop(x) with b and stop(x) from ``anchor``). Results per
    batch entry: ``elements`` (batch, E) the log-weight terms of each element, ``globals`` (batch,)
    those of no element, ``log_pi`` (batch,) the log probability of the discrete configuration under
    the proposal (the guide, and the prior for the model's own latents)."""

    def __init__(self, spec, params, mode, elements, rng, draws, anchor=None):
        self.spec, self.params, self.mode = spec, params, mode
        self.elements = np.asarray(elements)
        self.anchor = anchor
        self.record = {} if anchor is None else None
        self._enumerate(draws)
        self._noise(rng)
        b = self.batch = self.configurations * draws
        self.terms = {"global": np.zeros(b), "local": np.zeros((b, len(elements))),
                      "inner": np.zeros((b, len(elements), spec.inner or 1))}
        self.log_pi = np.zeros(b)
        self.values, self.coordinates = {}, {}
        self._guide()
        self._model()

    # ---- shapes, enumeration, noise

    def shape(self, level):
        return _level_shape(self.spec, level, len(self.elements))

    def _enumerate(self, draws):
        units = _enumerated_units(self.spec, self.mode, len(self.elements))
        radices = [radix for _, count, radix in units for _ in range(count)]
        self.configurations = configurations(self.spec, self.mode, len(self.elements))
        if self.configurations * draws > BUDGET:
            raise Unavailable(f"{self.configurations} configurations x {draws} draws")
        self.draws = draws
        digits = np.stack(np.unravel_index(np.arange(self.configurations), radices), -1) if radices else np.zeros((1, 0), int)
        self.indices, start = {}, 0
        for latent, count, _ in units:
            block = digits[:, start : start + count].reshape((self.configurations,) + self.shape(latent.level))
            self.indices[latent.name] = np.repeat(block, draws, axis=0)
            start += count

    def _noise(self, rng):
        """Standard normal noise for Normal sites, uniforms for relaxed samples, per site in order,
        the same for the same ``rng`` state whatever the parameters."""
        self.eps, self.uniforms = {}, {}
        for latent in self.spec.latents:
            shape = (self.draws,) + self.shape(latent.level)
            tile = (self.configurations,) + (1,) * len(self.shape(latent.level))
            self.eps[latent.name] = np.tile(rng.standard_normal(shape), tile)
            u = rng.uniform(np.finfo(float).tiny, 1.0, size=shape + latent.event)
            self.uniforms[latent.name] = np.tile(u, tile + (1,) * len(latent.event))

    def elements_of(self, array, level):
        """The evaluated elements of a full-data array of ``level``."""
        if level == "global":
            return array
        return _squeeze_local(array[self.elements], self.spec, level)

    # ---- features and parameters

    def feature(self, latent, value):
        """The scalar a site passes to its children and the observations: its value in (0, 1) or on
        the simplex (dot the site's weights)."""
        if latent.kind == "categorical":
            return (value * latent.weights).sum(-1)
        return value

    def linear(self, base, parents, latent):
        base = np.broadcast_to(base, (self.batch,) + self.shape(latent.level) + latent.event)
        for name, coefficient in parents:
            parent = self.spec.latent(name)
            term = _lift(self.feature(parent, self.values[name]), parent.level, latent.level)
            base = base + (term[..., None] * coefficient if latent.event else term * coefficient)
        return base

    def add(self, level, term, scale=1.0):
        """Adds a log-density term of ``level``'s shape (batch, *shape) to the log weight."""
        self.terms[level] = self.terms[level] + scale * term

    # ---- densities of a relaxed site's value

    @staticmethod
    def discrete_mass(latent, index, logits):
        if latent.kind == "binary":
            return np.where(index > 0, log_expit(logits), log_expit(-logits))
        return np.take_along_axis(log_softmax(logits, -1), index[..., None], -1)[..., 0]

    @staticmethod
    def one_hot(latent, index):
        if latent.kind == "binary":
            return index.astype(float)
        return np.eye(latent.k)[index]

    @staticmethod
    def soft_mass(latent, value, logits):
        """The limit's mass extended linearly to a relaxed value (the estimators' _SoftMass)."""
        if latent.kind == "binary":
            return value * log_expit(logits) + (1 - value) * log_expit(-logits)
        return (value * log_softmax(logits, -1)).sum(-1)

    def relaxed_draw(self, latent, logits, temperature):
        """(log coordinates y, the value's linear form x) of a relaxed sample."""
        y = reference.sample_log_coordinates(latent.node, self.uniforms[latent.name], logits, temperature)
        x = np.exp(y) if latent.kind == "categorical" else 1 / (1 + np.exp(-y))
        return y, x

    # ---- the guide, then the model replayed against it

    def _guide(self):
        for latent in self.spec.latents:
            if not latent.in_guide:
                continue
            base = self.linear(self.elements_of(self.params[f"q_{latent.name}"], latent.level), latent.guide_parents, latent)
            level, name = latent.level, latent.name
            if latent.kind == "normal":
                scale = np.exp(self.elements_of(self.params[f"s_{name}"], level))
                value = base + scale * self.eps[name]
                self.add(level, -stats.norm.logpdf(value, base, scale), latent.scale)
            elif self.mode == "discrete":
                index = self.indices[name]
                mass = self.discrete_mass(latent, index, base)
                self.log_pi = self.log_pi + mass.reshape(self.batch, -1).sum(-1)
                value = self.one_hot(latent, index)
                self.add(level, -mass, latent.scale)
            elif self.mode == "relaxed":
                y, value = self.relaxed_draw(latent, base, latent.guide_temperature)
                self.coordinates[name] = y
                self.add(level, -reference.log_density_at_log_coordinates(latent.node, y, base, latent.guide_temperature), latent.scale)
            else:
                y, x = self.relaxed_draw(latent, base, latent.guide_temperature)
                if self.record is not None:
                    hard = self.one_hot(latent, np.argmax(y, -1)) if latent.kind == "categorical" else (y > 0).astype(float)
                    self.record[name] = (hard, x)
                hard, x0 = (self.record if self.record is not None else self.anchor)[name]
                value = hard + x - x0
                self.add(level, -self.soft_mass(latent, value, base), latent.scale)
            self.values[name] = value

    def _model(self):
        for latent in self.spec.latents:
            if not latent.in_model:
                continue
            name, level = latent.name, latent.level
            prior = self.params[f"p_{name}"] if latent.prior_learned else latent.prior
            base = self.linear(prior, latent.model_parents, latent)
            proposed = latent.in_guide
            if latent.kind == "normal":
                if proposed:
                    self.add(level, stats.norm.logpdf(self.values[name], base, latent.prior_scale), latent.scale)
                else:
                    self.values[name] = base + latent.prior_scale * self.eps[name]
            elif self.mode == "discrete":
                index = self.indices[name] if not proposed else None
                if proposed:
                    value = self.values[name]
                    index = np.argmax(value, -1) if latent.kind == "categorical" else value.astype(int)
                    self.add(level, self.discrete_mass(latent, index, base), latent.scale)
                else:
                    self.log_pi = self.log_pi + self.discrete_mass(latent, index, base).reshape(self.batch, -1).sum(-1)
                    self.values[name] = self.one_hot(latent, index)
            elif self.mode == "relaxed":
                if proposed:
                    y = self.coordinates[name]
                    self.add(level, reference.log_density_at_log_coordinates(latent.node, y, base, latent.prior_temperature), latent.scale)
                else:
                    _, self.values[name] = self.relaxed_draw(latent, base, latent.prior_temperature)
            else:
                if not proposed:
                    raise Unavailable("straight-through with a relaxed latent of the model only")
                self.add(level, self.soft_mass(latent, self.values[name], base), latent.scale)
        for obs in self.spec.observed:
            loc = np.full((self.batch,) + self.shape(obs.level), obs.bias)
            for name, coefficient in obs.parents:
                parent = self.spec.latent(name)
                weight = self.params[f"w_{obs.name}"] if name == obs.learned else coefficient
                loc = loc + weight * _lift(self.feature(parent, self.values[name]), parent.level, obs.level)
            term = stats.norm.logpdf(self.elements_of(obs.data, obs.level), loc, obs.sigma)
            if obs.mask is not None:
                term = np.where(self.elements_of(obs.mask, obs.level), term, 0.0)
            self.add(obs.level, term)

    # ---- results

    def by_element(self):
        """(batch, E): each element's log-weight terms (its local and inner sites)."""
        return self.terms["local"] + (self.terms["inner"].sum(-1) if self.spec.inner else 0.0)


# ----------------------------------------------------------------------------- objectives


def _combine(particles, joint):
    """Per draw, the expectation over the particles' configurations of log (1/m) sum_i w_i: the
    particles are _Particle results over the same (configurations, draws); ``joint``: one log weight
    for all elements, else one per element (then summed). Returns (draws,)."""
    m = len(particles)
    c, r = particles[0].configurations, particles[0].draws
    log_w, log_pi = [], []
    for i, p in enumerate(particles):
        w = p.by_element()  # (batch, E)
        if joint:
            w = w.sum(-1, keepdims=True) + p.terms["global"][:, None]
        shape = (1,) * i + (c,) + (1,) * (m - 1 - i) + (r, w.shape[-1])
        log_w.append(w.reshape(shape))
        log_pi.append(p.log_pi.reshape(shape[:-1] + (1,)))
    bound = log_w[0]
    for w in log_w[1:]:
        bound = np.logaddexp(bound, w)
    bound = bound - np.log(m)
    weight = np.exp(sum(log_pi))
    expected = (weight * bound).reshape(c**m, r, -1).sum(0)  # (draws, E)
    return expected.sum(-1)


def _level_shape(spec, level, num_elements):
    if level == "global":
        return ()
    if level == "local":
        return (num_elements,)
    return (num_elements, spec.inner)


def _enumerated_units(spec, mode, num_elements):
    """(latent, instances, values per instance) of the sites enumerated in ``mode``: the relaxed
    sites' limits in the discrete graph."""
    if mode != "discrete":
        return []
    return [
        (latent, int(np.prod(_level_shape(spec, latent.level, num_elements), dtype=int)), 2 if latent.kind == "binary" else latent.k)
        for latent in spec.latents
        if latent.relaxed
    ]


def configurations(spec, mode, num_elements):
    """How many discrete configurations one particle over ``num_elements`` elements has."""
    return int(np.prod([float(radix) ** count for _, count, radix in _enumerated_units(spec, mode, num_elements)]))


def _draws(spec, mode, tuples, draws):
    """Noise draws per evaluation: 1 where nothing is continuous, else as many as the budget allows
    beside ``tuples`` configurations (at least 100)."""
    continuous = mode != "discrete" or any(latent.kind == "normal" for latent in spec.latents)
    if tuples > BUDGET:
        raise Unavailable(f"{tuples} configurations of the particles")
    return int(max(100, min(draws, BUDGET // tuples))) if continuous else 1


def per_draw_objective(spec, params, mode, m, joint, seed, draws):
    """The objective, one value per noise draw (their mean estimates it): the ELBO (m = 1) or the sum
    of the bounds L_m (per element of the plate ``data``, or ``joint``)."""
    n = spec.n
    if m == 1 and mode == "discrete":
        # linear: the sum over elements of each element's expected terms, each evaluated with the
        # globals (its own enumeration), plus the expected global terms
        r = _draws(spec, mode, configurations(spec, mode, 1), draws)
        total = 0.0
        for e in range(n):
            p = _Particle(spec, params, mode, [e], np.random.default_rng([seed, e]), r)
            weight = np.exp(p.log_pi).reshape(p.configurations, r)
            total = total + (weight * p.by_element()[:, 0].reshape(p.configurations, r)).sum(0)
            if e == 0:
                total = total + (weight * p.terms["global"].reshape(p.configurations, r)).sum(0)
        return total
    together = joint or m == 1
    groups = [list(range(n))] if together else [[e] for e in range(n)]
    r = _draws(spec, mode, configurations(spec, mode, len(groups[0])) ** m, draws)
    total = 0.0
    for g, elements in enumerate(groups):
        particles = [_Particle(spec, params, mode, elements, np.random.default_rng([seed, g, i]), r) for i in range(m)]
        total = total + _combine(particles, joint=together)
    return total


def straight_through_gradient(spec, params, seed, draws):
    """Per draw, the gradient of the straight-through surrogate: central differences of the ELBO
    with each relaxed site at b + x(theta) - x(theta0), b and x(theta0) from the same noise at the
    parameters ``params`` (theta0). Returns {name: (draws, *shape)}."""
    anchor_particle = _Particle(spec, params, "straight_through", list(range(spec.n)), np.random.default_rng([seed, 0]), draws)
    anchor = anchor_particle.record

    def value(p):
        particle = _Particle(spec, p, "straight_through", list(range(spec.n)), np.random.default_rng([seed, 0]), draws, anchor=anchor)
        return particle.by_element().sum(-1) + particle.terms["global"]

    return _differences(value, params)


def _differences(value, params, h=1e-5):
    """{name: (draws, *shape)}: central differences of ``value(params)`` (draws,) in each entry."""
    gradients = {}
    for name, array in params.items():
        array = np.asarray(array, dtype=float)
        out = np.zeros((len(value(params)),) + array.shape)
        for index in np.ndindex(array.shape):
            step = np.zeros(array.shape)
            step[index] = h
            up = value({**params, name: array + step})
            down = value({**params, name: array - step})
            out[(slice(None),) + index] = (up - down) / (2 * h)
        gradients[name] = out
    return gradients


class Reference:
    """The expected loss (minus the objective) and its gradient in every parameter, with standard
    errors: ``value``, ``value_se``, ``gradient[name]``, ``gradient_se[name]``."""

    def __init__(self, value_draws, gradient_draws):
        self.value, self.value_se = _mean_and_se(-np.asarray(value_draws, dtype=float))
        self.gradient, self.gradient_se = {}, {}
        for name, draws in gradient_draws.items():
            self.gradient[name], self.gradient_se[name] = _mean_and_se(-draws)


def _mean_and_se(draws):
    """The mean over the first axis, and its standard error (0 for one draw: an exact value)."""
    r = len(draws)
    return draws.mean(0), (draws.std(0, ddof=1) / np.sqrt(r) if r > 1 else np.zeros(draws.shape[1:]))


def expected_loss(spec, params, mode, m=1, joint=True, seed=0, draws=20000):
    """:class:`Reference` of a loss whose value estimates minus the objective of ``mode`` ("discrete"
    or "relaxed") with m particles, per element of the plate data (``joint=False``) or jointly."""

    def value(p):
        return per_draw_objective(spec, p, mode, m, joint, seed, draws)

    return Reference(value(params), _differences(value, params))


def expected_straight_through(spec, params, seed=0, draws=20000):
    """:class:`Reference` whose gradient is the straight-through estimator's mean (the value: the
    discrete ELBO's, by enumeration)."""
    value = per_draw_objective(spec, params, "discrete", 1, True, seed, draws)
    return Reference(value, straight_through_gradient(spec, params, seed, draws))


