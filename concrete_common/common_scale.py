"""The one scale common to the sites an exact helper scores (``poutine.scale`` / ``handlers.scale``):
taken off the sites as they run and put on the result, s log p(x) or s L_m. Both packages'
``CommonScale`` messengers record each site's scale here."""

from . import messages


class ScaleLedger:
    """The scale of the first site recorded, which every later site must share."""

    def __init__(self):
        self.first = None  # (site name, scale; None for none)

    @property
    def scale(self):
        return None if self.first is None else self.first[1]

    def record(self, name, scale):
        """Record site ``name``'s scale (a number or None; 1 is none); a different one raises."""
        scale = None if scale is None or float(scale) == 1.0 else float(scale)
        if self.first is None:
            self.first = (name, scale)
        elif scale != self.first[1]:
            raise messages.different_scales(self.first, (name, scale))


def joint_scale(**ledgers):
    """The scale common to several ledgers, named by whose they are (``model=``, ``guide=``), as a
    number, 1.0 for none; ledgers that recorded nothing do not count, and two different scales raise,
    naming each site with its owner (a model's site and a guide's may share a name)."""
    recorded = [(owner, ledger) for owner, ledger in ledgers.items() if ledger.first is not None]
    for owner, ledger in recorded[1:]:
        if ledger.scale != recorded[0][1].scale:
            first_owner, first = recorded[0]
            raise messages.different_scales(first.first, ledger.first, owners=(first_owner, owner))
    scale = recorded[0][1].scale if recorded else None
    return 1.0 if scale is None else scale
