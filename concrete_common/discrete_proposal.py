"""How ``discrete_log_likelihood`` makes the discrete graph's proposal from a guide, decided on site
names alone: each package reads its traces into these names, and builds the masks of the auxiliary
sites it marginalizes."""

from .messages import ModelError


def auxiliary_layouts(joint_layouts, guide_infer, model_sites):
    """{auxiliary guide site: {model site: its coordinates in the auxiliary value, or None for all}}:
    the joint latents of ``AutoContinuous`` autoguides (``joint_layouts``, read off the autoguide by
    the package) that the guide drew, and the per-site ``{name}_unconstrained`` auxiliary sites
    (AutoNormal). ``guide_infer``: {guide sample site: its infer dict}."""
    layouts = {name: layout for name, layout in joint_layouts.items() if name in guide_infer}
    suffix = "_unconstrained"
    for name, infer in guide_infer.items():
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in model_sites and (infer or {}).get("is_auxiliary"):
            layouts.setdefault(name, {base: None})
    return layouts


def model_side(model_sample_sites, relaxed, concrete_in_guide, guide_sites, given):
    """The model's part of the proposal, from its sample sites (the hosts' message dicts):

    - ``relaxed`` and the model's own discrete sites that the guide draws from a continuous
      distribution (the model as written, its guide trained on ``relax(model)``): a Concrete-family
      one is discretized, any other (an autoguide's transformed Normal or Delta) hidden, where the host
      scored the relaxed draw (a wrong number, or -inf; an autoguide's draw, with validation off,
      was 2.3 nats below log p(x) however many particles);
    - the names held: ``given``, and every site the model observes (conditioned, or held inside it),
      which the guide does not propose;
    - the values of the held sites the guide draws, which its later sites read (q(z | g = v), not
      q(z | g') of a draw of its own).

    :returns: (relaxed names, held names, {name: value}).
    """
    sites = list(model_sample_sites)
    relaxed = set(relaxed) | {
        site["name"] for site in sites
        if not site["is_observed"] and site["name"] in guide_sites and getattr(site["fn"], "has_enumerate_support", False)
        and (site["name"] in concrete_in_guide or not getattr(guide_sites[site["name"]]["fn"], "has_enumerate_support", False))
    }
    observed = [site for site in sites if site["is_observed"]]
    held = set(given or ()) | {site["name"] for site in observed}
    return relaxed, held, {site["name"]: site["value"] for site in observed if site["name"] in guide_sites}


def sort_guide_sites(relaxed, concrete_in_guide, guide_sites, model_sites, given, layouts):
    """Which guide sites the proposal discretizes, hides and marginalizes.

    A relaxed model site (``relaxed``) that the guide draws from a Concrete-family distribution
    (``concrete_in_guide``) is discretized; drawn otherwise (an autoguide's Delta over a transformed
    Normal), it is hidden, so that the model draws it from its discrete prior; a site held at a value
    (``given``) is hidden too. An auxiliary site (``layouts``) is kept if it feeds no hidden site,
    hidden if it feeds hidden sites only, and otherwise marginalized. Any other guide site without a
    model counterpart cannot be attributed, and raises.

    :returns: (discretized names, hidden names, {marginalized auxiliary site: (the model sites it
        feeds that are kept, those hidden)}).
    """
    guide_sites, model_sites = set(guide_sites), set(model_sites)
    discretized = {name for name in relaxed if name in concrete_in_guide}
    hidden = (set(relaxed) & guide_sites) - discretized
    hidden |= set(given or ()) & guide_sites  # held at their values: the guide does not propose them
    marginalized = {}
    for name, layout in layouts.items():
        fed_hidden = hidden & set(layout)
        if fed_hidden == set(layout):
            hidden.add(name)
        elif fed_hidden:
            marginalized[name] = (set(layout) - hidden, fed_hidden)
    unattributed = guide_sites - model_sites - set(layouts) - hidden
    if unattributed:
        raise ModelError(
            f"guide site(s) {sorted(unattributed)} have no model counterpart; "
            "the discrete graph's proposal is the guide with its relaxed sites discretized (or hidden, for "
            "an autoguide such as AutoNormal), and these cannot be attributed to a site"
        )
    return discretized, hidden, marginalized


def no_closed_form_marginal(name, fed_hidden, kept, joint, block):
    """The error for an auxiliary site whose joint (``joint``: its class name) has no closed-form
    marginal; ``block``: the host's block handler, as the user writes it."""
    return ModelError(
        f"guide site {name!r} draws the relaxed site(s) {sorted(fed_hidden)} jointly "
        f"with the continuous site(s) {sorted(kept)} from {joint}, whose "
        "marginal density of the continuous coordinates has no closed form: the relaxed sites cannot be "
        f"hidden from it. Use an AutoGuideList with this autoguide over the continuous sites only "
        f"({block}(model, hide=[...])) and AutoNormal or a Concrete-family guide for the relaxed ones"
    )
