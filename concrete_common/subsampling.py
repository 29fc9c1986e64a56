"""Which objectives a subsample estimates, from the subsampled plates alone (the backends read
those off their traces: ``_traces.subsampled_plates``)."""

from . import messages


def bound_scale(subsampled, plate, num_particles, beside=()):
    """The factor s by which the host has scaled the log densities of the elements of ``plate`` (its
    size over its subsample size; 1 without subsampling, or without a plate), given ``subsampled``,
    {plate name: size / subsample size} of the subsampled plates around the model's sites.

    The ELBO is linear in the log densities, so the scaled terms of a subsample estimate it without
    bias; a bound of m > 1 particles is the log of an average, which they estimate only per element of
    the subsampled plate: the bounds of the subsample's elements, from their unscaled log weights,
    times s. Any other subsampled plate raises for m > 1 (a ModelError), named as inside ``plate``'s
    elements or, where it is in ``beside`` (plates that never share a site with ``plate``), beside them."""
    if num_particles > 1:
        if plate is None and subsampled:
            raise messages.subsampled_joint_bound(sorted(subsampled))
        others = sorted(set(subsampled) - {plate})
        if others:
            if others[0] in beside:
                raise messages.subsampled_beside(plate, others[0])
            raise messages.subsampled_inside(plate, others[0])
    return subsampled.get(plate, 1.0)


def plates_beside(sites, plate):
    """The plates of ``sites`` (the traces' sample sites) that never share a site with ``plate``
    (none without one)."""
    if plate is None:
        return set()
    stacks = [{frame.name for frame in site["cond_indep_stack"]} for site in sites]
    return set().union(*stacks) - set().union(*(stack for stack in stacks if plate in stack))
