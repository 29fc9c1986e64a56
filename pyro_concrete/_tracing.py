"""Quiet under ``torch.jit.trace``.

Under tracing (Pyro's ``JitTrace_ELBO`` and the other ``Jit*`` losses) shapes are traced values, and
the shape logic and parameter checks of this package read them, as Pyro's own distributions do: the
trace is specialised to them and Pyro retraces when they change. The ``TracerWarning`` raised by
reading them says nothing a user can act on, so the helpers that read them silence it while tracing
(a filter installed at import would not do: test runners and ``catch_warnings`` blocks reset filters).
"""

import functools
import warnings

import torch


def quiet_under_trace(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not torch.jit.is_tracing():
            return fn(*args, **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            return fn(*args, **kwargs)

    return wrapper
