"""The paper's appendix C.3 advice as a Pyro reparametrizer: treat the log-space node as the
stochastic node.

A ``Concrete`` site becomes an ``ExpConcrete`` latent ``{name}_log`` plus a deterministic ``exp``;
a ``BinConcrete`` site a ``LogitBinConcrete`` latent ``{name}_logit`` plus a deterministic
``sigmoid``. Densities of the log-space nodes never see an underflowed value, and the ELBO is
unchanged (KL terms are invariant under the invertible exp / sigmoid). Apply it to model and guide::

    model = poutine.reparam(model, config=log_space_config)
    guide = poutine.reparam(guide, config=log_space_config)
"""

from typing import Optional

import torch
from pyro import distributions as dist
from pyro import sample
from pyro.infer.reparam.reparam import Reparam, ReparamMessage, ReparamResult

from concrete_common.kinds import Kind

from . import _numerics
from ._carry import carry, show
from .distributions import BinConcrete, Concrete

__all__ = ["LogSpaceReparam", "log_space_config"]


class LogSpaceReparam(Reparam):
    """Reparametrize a Concrete (BinConcrete) site by its ExpConcrete (LogitBinConcrete) node."""

    def apply(self, msg: ReparamMessage) -> ReparamResult:
        name, fn, value, is_observed = msg["name"], msg["fn"], msg["value"], msg["is_observed"]
        fn, event_dim = self._unwrap(fn)
        if type(fn) is Concrete:  # not the straight-through subclasses, whose values are discrete
            suffix, kind, coordinates = "log", Kind.LOG, _numerics.log
        elif type(fn) is BinConcrete:
            suffix, kind, coordinates = "logit", Kind.LOGIT, _numerics.logit
        else:
            raise ValueError(
                f"LogSpaceReparam: site {name!r} holds {type(fn).__name__}, not Concrete or BinConcrete "
                "(straight-through and Hard Concrete sites are not reparametrized)"
            )

        y = None
        if value is not None:  # an observed or initial value, in log space
            y = carry.recall(value, (kind,))
            y = coordinates(value) if y is None else y
        y = sample(f"{name}_{suffix}", self._wrap(fn.log_space(), event_dim), obs=y, infer={"is_observed": bool(is_observed)})
        if value is None:
            value = show(y, kind)
        # a pyro.deterministic() site, with the site's batch shape (the plates broadcast the original
        # distribution, not this one): an enumerated value holds only the enumeration's dimensions
        delta = dist.Delta(value, event_dim=event_dim)
        delta = delta.expand(torch.broadcast_shapes(delta.batch_shape, msg["fn"].batch_shape))  # type: ignore[attr-defined]
        return {"fn": delta.mask(False), "value": value, "is_observed": True}


def log_space_config(msg: dict) -> Optional[LogSpaceReparam]:
    """A ``poutine.reparam`` config: :class:`LogSpaceReparam` for every Concrete and BinConcrete site.

    The site left behind is deterministic (a masked Delta); it is marked auxiliary, so that Pyro's
    model/guide check does not count the guide's copy as a latent variable missing from the model.
    """
    fn = LogSpaceReparam()._unwrap(msg["fn"])[0]  # what the host's Reparam unwraps
    if type(fn) not in (Concrete, BinConcrete):
        return None
    msg["infer"] = {**(msg["infer"] or {}), "is_auxiliary": True}
    return LogSpaceReparam()
