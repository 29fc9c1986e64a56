"""Small random models with relaxed sites, for the estimators' harness (``tests/fuzz_estimators.py``):
a :class:`Spec` drawn from a seed, and its model and guide written in either backend.

A spec is a list of latent sites -- binary and categorical relaxed sites (linear or log-space
nodes) and Normal sites -- at three levels: global, local (inside the plate ``data``, subsampled or
not) and inner (inside a plate ``inner`` nested in ``data``, subsampled or not). Each site may be in
the model and the guide, in the model only (drawn from its prior) or in the guide only; its logits
(its mean) are a base plus coefficients times the features of earlier sites, separately in the model
and in the guide. Observations: ``x`` per element of ``data``, ``y`` per element of ``inner``, Normal
around a linear function of the model's sites, optionally masked. Some priors and one observation
coefficient are parameters of the model; the guide's bases are parameters of the guide; sites may
carry a scale (``poutine.scale``, in both model and guide) and a learned baseline (``infer``).

``tests/exact_objectives.py`` computes what each loss estimates on such a model, in NumPy.
"""

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

RELAXED_NODES = {"binary": ("BinConcrete", "LogitBinConcrete"), "categorical": ("Concrete", "ExpConcrete")}
LOG_SPACE = ("LogitBinConcrete", "ExpConcrete")


@dataclass
class Latent:
    name: str
    kind: str  # "binary", "categorical" or "normal"
    node: str  # the distribution: one of RELAXED_NODES, or "Normal"
    k: int  # categories (1 for binary and normal)
    level: str  # "global", "local" or "inner"
    in_model: bool
    in_guide: bool
    model_parents: tuple = ()  # ((parent name, coefficient), ...): a float, or (k,) for a categorical child
    guide_parents: tuple = ()
    weights: Optional[np.ndarray] = None  # (k,): a categorical value's feature is its dot with these
    prior: np.ndarray = field(default_factory=lambda: np.zeros(()))  # logits (k,) / logit / loc
    prior_learned: bool = False  # the prior's base is the model's parameter p_<name>
    prior_scale: float = 1.0  # a Normal prior's scale
    prior_temperature: float = 2 / 3
    guide_temperature: float = 2 / 3
    guide_init: Optional[np.ndarray] = None  # the guide's base per instance (full data): q_<name>
    guide_log_scale: Optional[np.ndarray] = None  # a Normal guide's log scale per instance: s_<name>
    scale: float = 1.0  # poutine.scale on the site, in model and guide
    baseline: str = "none"  # the site's baseline in the guide: "none", "scalar", "element" (one per
    # element of data), "site" (one per element of the site: data x inner), "shared" (one for all sites)

    @property
    def relaxed(self):
        return self.kind != "normal"

    @property
    def event(self):
        return (self.k,) if self.kind == "categorical" else ()


@dataclass
class Observed:
    name: str
    level: str  # "local" or "inner"
    parents: tuple  # ((latent name, coefficient), ...)
    bias: float
    sigma: float
    data: np.ndarray  # the level's shape over the full data
    mask: Optional[np.ndarray] = None
    learned: Optional[str] = None  # a latent whose coefficient is the model's parameter w_<name>


@dataclass
class Spec:
    seed: int
    n: int  # the plate data's size
    subsample: Optional[int]  # its subsample size, or None
    inner: Optional[int]  # the nested plate's size, or None
    inner_subsample: Optional[int]
    latents: list
    observed: list
    plate: Optional[str]  # the losses' plate argument
    particles: int  # m of ImportanceWeightedELBO and VIMCO
    gumbel_rao_samples: int

    @property
    def data_dim(self):
        return -2 if self.inner else -1

    def level_shape(self, level):
        """A level's batch shape over the full data, as the model holds it (data at data_dim)."""
        if level == "global":
            return ()
        if level == "local":
            return (self.n, 1) if self.inner else (self.n,)
        return (self.n, self.inner)

    def latent(self, name):
        return next(latent for latent in self.latents if latent.name == name)

    def describe(self):
        parts = [f"data {self.n}" + (f"/{self.subsample}" if self.subsample else "")]
        if self.inner:
            parts.append(f"inner {self.inner}" + (f"/{self.inner_subsample}" if self.inner_subsample else ""))
        for latent in self.latents:
            role = "both" if latent.in_model and latent.in_guide else ("model" if latent.in_model else "guide")
            deps = [p for p, _ in latent.model_parents] + [f"q:{p}" for p, _ in latent.guide_parents]
            extra = (f" scale {latent.scale}" if latent.scale != 1 else "") + (f" baseline {latent.baseline}" if latent.baseline != "none" else "")
            parts.append(f"{latent.name}={latent.node}{latent.k if latent.kind == 'categorical' else ''}@{latent.level}/{role}"
                         + (f"<-{','.join(deps)}" if deps else "") + (" learned-prior" if latent.prior_learned else "") + extra)
        for obs in self.observed:
            parts.append(f"{obs.name}@{obs.level}<-{','.join(p for p, _ in obs.parents)}" + (" masked" if obs.mask is not None else ""))
        parts.append(f"plate={self.plate} m={self.particles} k={self.gumbel_rao_samples}")
        return "; ".join(parts)


# ----------------------------------------------------------------------------- the generator

_LEVEL_ORDER = {"global": 0, "local": 1, "inner": 2}


def _may_depend(child_level, parent_level):
    """A child can read a parent at its own level or an enclosing one."""
    return _LEVEL_ORDER[parent_level] <= _LEVEL_ORDER[child_level]


def generate(seed):
    """The spec of case ``seed``."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([2, 3]))
    subsample = int(rng.integers(1, n)) if rng.random() < 0.5 else None
    inner = inner_subsample = None
    if rng.random() < 0.25:
        inner = int(rng.choice([2, 3]))
        inner_subsample = 2 if inner == 3 and rng.random() < 0.4 else None
    levels = ["global", "local"] + (["inner"] if inner else [])
    level_p = [0.25, 0.75] if not inner else [0.2, 0.5, 0.3]
    num_latents = int(rng.choice([1, 2, 3], p=[0.3, 0.45, 0.25]))
    latents = []
    for i in range(num_latents):
        kind = "binary" if i == 0 else str(rng.choice(["binary", "categorical", "normal"], p=[0.45, 0.3, 0.25]))
        if i == 0 and rng.random() < 0.35:
            kind = "categorical"
        k = int(rng.choice([2, 3])) if kind == "categorical" else 1
        node = "Normal" if kind == "normal" else str(rng.choice(RELAXED_NODES[kind], p=[0.7, 0.3]))
        level = str(rng.choice(levels, p=level_p))
        role = str(rng.choice(["both", "model", "guide"], p=[0.74, 0.13, 0.13]))
        if i == 0:
            role = "both"
        latent = Latent(name=f"z{i}", kind=kind, node=node, k=k, level=level, in_model=role != "guide", in_guide=role != "model")
        event = latent.event
        for parent in latents:
            if not _may_depend(level, parent.level):
                continue
            coefficient = rng.normal(0, 1.2, size=event) if event else float(rng.normal(0, 1.2))
            if latent.in_model and parent.in_model and rng.random() < 0.35:
                latent.model_parents += ((parent.name, coefficient),)
            if latent.in_guide and parent.in_guide and rng.random() < 0.3:
                latent.guide_parents += ((parent.name, rng.normal(0, 1.2, size=event) if event else float(rng.normal(0, 1.2))),)
        if kind == "categorical":
            latent.weights = rng.normal(0, 1.0, size=k)
        latent.prior = rng.normal(0, 1.0, size=event) if kind != "normal" else np.asarray(float(rng.normal(0, 1.0)))
        latent.prior_learned = latent.in_model and rng.random() < 0.3
        latent.prior_temperature = float(rng.choice([0.5, 2 / 3, 1.0]))
        latent.guide_temperature = float(rng.choice([0.5, 2 / 3, 1.0]))
        shape = _full_shape(n, inner, level) + event
        latent.guide_init = rng.normal(0, 1.0, size=shape)
        if kind == "normal":
            latent.guide_log_scale = rng.normal(-0.5, 0.2, size=shape)
        if rng.random() < 0.15:
            latent.scale = float(rng.choice([0.5, 2.0]))
        if latent.in_guide and latent.relaxed:
            latent.baseline = str(rng.choice(["none", "scalar", "element", "shared"], p=[0.4, 0.2, 0.25, 0.15]))
            if latent.baseline == "element" and level == "global":
                latent.baseline = "scalar"
            if latent.baseline == "element" and level == "inner" and seed % 2:  # every accepted shape, by turns
                latent.baseline = "site"
        latents.append(latent)
    observed = []
    model_latents = [latent for latent in latents if latent.in_model]
    for name, level in [("x", "local")] + ([("y", "inner")] if inner and any(lt.level == "inner" for lt in model_latents) else []):
        parents = tuple((lt.name, float(rng.normal(0, 1.5))) for lt in model_latents if _may_depend(level, lt.level))
        shape = _full_shape(n, inner, level)
        mask = None
        if rng.random() < 0.2:
            mask = rng.random(shape) < 0.6
            mask.flat[int(rng.integers(mask.size))] = True
        learned = parents[0][0] if parents and rng.random() < 0.3 else None
        observed.append(Observed(name, level, parents, float(rng.normal(0, 0.5)), 1.0, rng.normal(0, 1.5, size=shape), mask, learned))
    # per element of the plate "data" where nothing in the guide is global (a global guide latent is
    # refused there: mostly no plate then, so that the accepted shapes get the cases)
    per_element = 0.12 if any(lt.in_guide and lt.level == "global" for lt in latents) else 0.6
    return Spec(
        seed=seed, n=n, subsample=subsample, inner=inner, inner_subsample=inner_subsample, latents=latents, observed=observed,
        plate="data" if rng.random() < per_element else None, particles=int(rng.choice([2, 3])),
        gumbel_rao_samples=int(rng.choice([1, 3, 10])),
    )


def _full_shape(n, inner, level):
    if level == "global":
        return ()
    if level == "local":
        return (n, 1) if inner else (n,)
    return (n, inner)


def relax_features(spec):
    """How many features RELAX's network sees in a row: the coordinates of the guide's relaxed
    sites in one element of the plate (in the subsample of all of them, without a plate)."""
    elements = spec.subsample or spec.n
    inner = spec.inner_subsample or spec.inner or 1
    total = 0
    for latent in spec.latents:
        if latent.in_guide and latent.relaxed:
            count = {"global": 1, "local": 1, "inner": inner}[latent.level] * (latent.k if latent.kind == "categorical" else 1)
            total += count if spec.plate is not None or latent.level == "global" else count * elements
    return max(total, 1)


def initial_params(spec):
    """{name: NumPy array} of every parameter, as the model and guide initialize them."""
    params = {}
    for latent in spec.latents:
        if latent.in_guide:
            params[f"q_{latent.name}"] = latent.guide_init
            if latent.kind == "normal":
                params[f"s_{latent.name}"] = latent.guide_log_scale
        if latent.prior_learned:
            params[f"p_{latent.name}"] = latent.prior
    for obs in spec.observed:
        if obs.learned:
            params[f"w_{obs.name}"] = np.asarray(dict(obs.parents)[obs.learned])
    return params


# ----------------------------------------------------------------------------- the model and guide in a backend


def build(spec, b):
    """(model, guide) of ``spec`` written with backend ``b`` (its adapter), relaxed: the sites hold
    Concrete-family distributions. ``discrete(model)``, ``discrete(guide)`` are the discrete graph."""
    params = initial_params(spec)
    data = {obs.name: b.array(obs.data) for obs in spec.observed}
    masks = {obs.name: b.array(obs.mask, "bool") for obs in spec.observed if obs.mask is not None}
    weights = {lt.name: b.array(lt.weights) for lt in spec.latents if lt.weights is not None}

    def feature(latent, value):
        if latent.node == "LogitBinConcrete":
            return b.sigmoid(value)
        if latent.node == "ExpConcrete":
            return (b.exp(value) * weights[latent.name]).sum(-1)
        if latent.node == "Concrete":
            return (value * weights[latent.name]).sum(-1)
        return value

    def linear(base, parents, latents, values, event):
        for name, coefficient in parents:
            term = feature(latents[name], values[name])
            if event:
                term = term[..., None] * b.array(coefficient)
            else:
                term = term * coefficient
            base = base + term
        return base

    def plates():
        data_plate = b.plate("data", spec.n, subsample_size=spec.subsample, dim=spec.data_dim)
        inner_plate = b.plate("inner", spec.inner, subsample_size=spec.inner_subsample, dim=-1) if spec.inner else None
        return data_plate, inner_plate

    @contextlib.contextmanager
    def at(level, data_plate, inner_plate):
        """Inside the plates of ``level``; yields the subsample of a full-data array (:class:`_Subsample`)."""
        with contextlib.ExitStack() as stack:
            idx = stack.enter_context(data_plate) if level != "global" else None
            jdx = stack.enter_context(inner_plate) if level == "inner" else None
            yield _Subsample(idx, jdx)

    def scaled(latent):
        return b.scale(latent.scale) if latent.scale != 1 else contextlib.nullcontext()

    def distribution(latent, base, temperature, log_scale=None, prior_scale=None):
        if latent.kind == "normal":
            return b.normal(base, b.exp(log_scale) if log_scale is not None else prior_scale)
        return getattr(b.lib, latent.node)(temperature, logits=base)

    latents = {latent.name: latent for latent in spec.latents}

    def model():
        data_plate, inner_plate = plates()
        values = {}
        for latent in spec.latents:
            if not latent.in_model:
                continue
            prior = b.param(f"p_{latent.name}", params[f"p_{latent.name}"]) if latent.prior_learned else b.array(latent.prior)
            with at(latent.level, data_plate, inner_plate), scaled(latent):
                base = linear(prior, latent.model_parents, latents, values, latent.event)
                d = distribution(latent, base, latent.prior_temperature, prior_scale=latent.prior_scale)
                values[latent.name] = b.site(latent.name, d)
        for obs in spec.observed:
            learned = b.param(f"w_{obs.name}", params[f"w_{obs.name}"]) if obs.learned else None
            with at(obs.level, data_plate, inner_plate) as subsample:
                loc = b.array(obs.bias)
                for name, coefficient in obs.parents:
                    loc = loc + (learned if name == obs.learned else coefficient) * feature(latents[name], values[name])
                masked = b.mask(subsample(masks[obs.name])) if obs.name in masks else contextlib.nullcontext()
                with masked:
                    b.site(obs.name, b.normal(loc, obs.sigma), obs=subsample(data[obs.name]))

    def guide():
        data_plate, inner_plate = plates()
        values = {}
        shared = b.param("bl_shared", np.zeros(())) if any(lt.baseline == "shared" for lt in spec.latents) else None
        for latent in spec.latents:
            if not latent.in_guide:
                continue
            base_full = b.param(f"q_{latent.name}", params[f"q_{latent.name}"])
            log_scale_full = b.param(f"s_{latent.name}", params[f"s_{latent.name}"]) if latent.kind == "normal" else None
            baseline_full = None
            if latent.baseline == "scalar":
                baseline_full = b.param(f"bl_{latent.name}", np.zeros(()))
            elif latent.baseline == "element":
                baseline_full = b.param(f"bl_{latent.name}", np.zeros(_full_shape(spec.n, spec.inner, "local")))
            elif latent.baseline == "site":
                baseline_full = b.param(f"bl_{latent.name}", np.linspace(-1.0, 1.0, spec.n * spec.inner).reshape(spec.n, spec.inner))
            with at(latent.level, data_plate, inner_plate) as subsample, scaled(latent):
                base = linear(subsample(base_full), latent.guide_parents, latents, values, latent.event)
                log_scale = subsample(log_scale_full) if log_scale_full is not None else None
                d = distribution(latent, base, latent.guide_temperature, log_scale=log_scale)
                infer = None
                if latent.baseline == "shared":
                    infer = {"baseline": {"baseline_value": shared}}
                elif baseline_full is not None:
                    if latent.baseline == "scalar":
                        value = baseline_full
                    else:
                        value = subsample.elements(baseline_full) if latent.baseline == "element" else subsample(baseline_full)
                    infer = {"baseline": {"baseline_value": value}}
                values[latent.name] = b.site(latent.name, d, infer=infer)

    return model, guide


class _Subsample:
    """The subsample of a full-data array at a level: its elements of ``data`` (``idx``) and of
    ``inner`` (``jdx``); ``elements``: of ``data`` only."""

    def __init__(self, idx, jdx):
        self.idx, self.jdx = idx, jdx

    def __call__(self, array):
        if self.idx is None:
            return array
        array = array[self.idx]
        return array if self.jdx is None else array[:, self.jdx]

    def elements(self, array):
        return array if self.idx is None else array[self.idx]
