"""The paper's appendix C.3 advice as a NumPyro reparametrizer: treat the log-space node as the
stochastic node.

A ``Concrete`` site becomes an ``ExpConcrete`` latent ``{name}_log`` plus a deterministic ``exp``;
a ``BinConcrete`` site a ``LogitBinConcrete`` latent ``{name}_logit`` plus a deterministic
``sigmoid``. Densities of the log-space nodes never see an underflowed value, and the ELBO is
unchanged (KL terms are invariant under the invertible exp / sigmoid). Apply it to model and guide::

    model = handlers.reparam(model, config=log_space_config)
    guide = handlers.reparam(guide, config=log_space_config)
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpyro
from jax.typing import ArrayLike
from numpyro.distributions import Distribution
from numpyro.infer.reparam import Reparam

from concrete_common.kinds import Kind

from . import _numerics
from ._carry import carry
from .distributions import BinConcrete, Concrete

__all__ = ["LogSpaceReparam", "log_space_config"]


class LogSpaceReparam(Reparam):
    """Reparametrize a Concrete (BinConcrete) site by its ExpConcrete (LogitBinConcrete) node."""

    def __call__(self, name: str, fn: Distribution, obs: Optional[ArrayLike]) -> tuple[None, ArrayLike]:
        fn, expand_shape, event_dim = self._unwrap(fn)
        if type(fn) is Concrete:  # not the straight-through subclasses, whose values are discrete
            suffix, kind, show, coordinates = "log", Kind.LOG, jnp.exp, _numerics.log
        elif type(fn) is BinConcrete:
            suffix, kind, show, coordinates = "logit", Kind.LOGIT, jax.nn.sigmoid, _numerics.logit
        else:
            raise ValueError(
                f"LogSpaceReparam: site {name!r} holds {type(fn).__name__}, not Concrete or BinConcrete "
                "(straight-through and Hard Concrete sites are not reparametrized)"
            )

        y = None
        if obs is not None:  # an observed value, in log space
            y = carry.recall(obs, (kind,))
            y = coordinates(obs) if y is None else y
        y = numpyro.sample(f"{name}_{suffix}", self._wrap(fn.log_space(), expand_shape, event_dim), obs=y)
        value = carry.attach(show(y), y, kind) if obs is None else obs
        return None, value  # a deterministic site


def log_space_config(msg: dict) -> Optional[LogSpaceReparam]:
    """A ``handlers.reparam`` config: :class:`LogSpaceReparam` for every Concrete and BinConcrete site."""
    fn = LogSpaceReparam()._unwrap(msg["fn"])[0]  # what the host's Reparam unwraps
    return LogSpaceReparam() if type(fn) in (Concrete, BinConcrete) else None
