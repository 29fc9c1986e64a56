"""Whether an exact helper is running a model's discrete graph, where every Concrete-family site has
been swapped for its zero-temperature limit: a Concrete-family sample drawn meanwhile escaped the
swap (a site hidden by ``block`` from the helper's handlers, a direct ``.sample()`` call), and the
helper's value would be a random draw, not the exact one. Both packages' samplers read it."""

import contextlib

from . import messages

_HELPERS: list = []  # the helpers running a discrete graph, innermost last


@contextlib.contextmanager
def discrete_graph(helper):
    """While an exact helper (named ``helper``) runs the model's discrete graph."""
    _HELPERS.append(helper)
    try:
        yield
    finally:
        _HELPERS.pop()


def check_no_relaxed_draw(cls_name):
    """Called by the relaxed samplers: raises inside :func:`discrete_graph`."""
    if _HELPERS:
        raise messages.ModelError(
            f"a Concrete-family distribution drew a relaxed sample ({cls_name}'s noise) while the model's discrete graph "
            "was evaluated: a Concrete-family site the helper could not see (hidden by block / poutine.block, or a direct .sample() or "
            ".rsample() call), so the value would be one random draw, not the exact one; let every Concrete-family "
            "site reach the helper (no block around it), or hold it at a value with given="
        )
