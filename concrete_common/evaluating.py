"""Whether an exact helper is running a model's discrete graph, where every Concrete-family site has
been swapped for its zero-temperature limit: a Concrete-family sample drawn meanwhile escaped the
swap (a site hidden by ``block`` from the helper's handlers, a direct ``.sample()`` call), and the
helper's value would be a random draw, not the exact one. Both packages' samplers read it; the
host's own discrete sites are caught where the host draws them."""

import contextlib
import threading

from . import messages


class _ThreadState(threading.local):
    """Per thread: a helper or a discrete(...) run in one thread says nothing of what another draws
    or scores (a Gumbel-softmax layer trained beside an evaluation thread)."""

    def __init__(self):
        self.helpers = []  # the helpers running a discrete graph, innermost last
        self.discrete_runs = []  # (run, every site?) of the models discrete(...) is running, innermost last


_STATE = _ThreadState()
_GUARDS: dict = {}  # id(runtime) -> [the host's default_process_message, the helpers using the guard]
_GUARDS_LOCK = threading.Lock()


@contextlib.contextmanager
def discrete_graph(helper, runtime=None):
    """While an exact helper (named ``helper``) runs the model's discrete graph. ``runtime``: the
    host's module whose ``default_process_message`` draws a site that no handler gave a value
    (``pyro.poutine.runtime``, ``numpyro.primitives``), where every discrete site is enumerated:
    while the graph is summed or decoded there, a discrete site drawn there escaped the helper
    (:func:`check_no_discrete_draw`). The hosts' refusals of crossed plates are given a message that
    names the cause (:func:`concrete_common.messages.crossed_plates`)."""
    _STATE.helpers.append(helper)
    if runtime is not None:
        _install_guard(runtime)
    try:
        yield
    except (NotImplementedError, ValueError) as error:
        if "tree-structured plate nesting" in str(error) or str(error) == "intractable!":  # Pyro's, funsor's
            raise messages.crossed_plates(error) from None
        raise
    finally:
        _STATE.helpers.pop()
        if runtime is not None:
            _remove_guard(runtime)


def helper_running():
    """Whether an exact helper is running a discrete graph in this thread."""
    return bool(_STATE.helpers)


def _install_guard(runtime):
    """The host's ``default_process_message`` checked while any thread runs a helper, the check made
    in the threads that do (:func:`check_no_discrete_draw`); counted, so that helpers of several
    threads ending in any order give the host its own function back."""
    with _GUARDS_LOCK:
        entry = _GUARDS.get(id(runtime))
        if entry is None:
            original = runtime.default_process_message

            def guarded(msg):
                if _STATE.helpers:
                    check_no_discrete_draw(msg)
                return original(msg)

            _GUARDS[id(runtime)] = entry = [original, 0]
            runtime.default_process_message = guarded
        entry[1] += 1


def _remove_guard(runtime):
    with _GUARDS_LOCK:
        entry = _GUARDS[id(runtime)]
        entry[1] -= 1
        if entry[1] == 0:
            runtime.default_process_message = entry[0]
            del _GUARDS[id(runtime)]


def check_no_discrete_draw(msg):
    """A latent site of discrete support that reaches the host's sampler without a value: the
    helper's enumeration gives every site it sees one first, so this one was hidden from its handlers
    (block; marked for enumeration or not), and is drawn at random where the helper sums every other
    value -- log p(x | one random draw), a different number at every call, with no error."""
    if msg["type"] != "sample" or msg["is_observed"] or msg["value"] is not None:
        return
    if getattr(msg["fn"], "has_enumerate_support", False):
        raise messages.ModelError(
            f"site {msg['name']!r} ({type(msg['fn']).__name__}) drew a value while the model's discrete graph was "
            "evaluated: a discrete site the helper could not see (hidden by block / poutine.block), so the value would "
            "be one random draw, not summed out; let every discrete site reach the helper (no block around it)"
        )


def check_no_relaxed_draw(cls_name):
    """Called by the relaxed samplers: raises inside :func:`discrete_graph`."""
    if _STATE.helpers:
        raise messages.ModelError(
            f"a Concrete-family distribution drew a relaxed sample ({cls_name}'s noise) while the model's discrete graph "
            "was evaluated: a Concrete-family site the helper could not see (hidden by block / poutine.block, or a direct .sample() or "
            ".rsample() call), so the value would be one random draw, not the exact one; let every Concrete-family "
            "site reach the helper (no block around it), or hold it at a value with given="
        )


def enter_discrete_run(every_site):
    """``discrete(model)`` starts running the model; ``every_site``: no ``sites=`` was named (the sites
    not named stay relaxed by design). Returns the run's token, for :func:`exit_discrete_run`."""
    token = object()
    _STATE.discrete_runs.append((token, every_site))
    return token


def exit_discrete_run(token):
    """... and ends (an exception may have skipped the exits of runs inside it: they go too)."""
    runs = _STATE.discrete_runs
    for i, (running, _) in enumerate(runs):
        if running is token:
            del runs[i:]
            return


def check_no_relaxed_score(cls_name):
    """Called by the family's ``log_prob``: raises while ``discrete(model)`` (of every site) runs the
    model. The sites' own densities are computed after the run (by the host's trace); one computed
    during it is a reparametrizer's that scores the relaxed site itself (NeuTraReparam,
    StructuredReparam: the site becomes a deterministic function of another latent, with this density
    as a factor), or a factor of the user's, and the discrete graph would hold a relaxed density."""
    if any(every_site for _, every_site in _STATE.discrete_runs):  # a handler of every site, at any depth
        raise messages.ModelError(
            f"{cls_name}.log_prob was evaluated while discrete(...) ran the model: a relaxed density inside the discrete "
            "graph, so every value computed from it would be the relaxed model's, not the discrete one's. A "
            "reparametrizer that scores the site itself (NeuTraReparam, StructuredReparam) turns the Concrete-family "
            "site into a deterministic function of another latent: evaluate the model without it (its reparametrized "
            "latents are the guide's business), or leave the site out of the reparametrizer's config; a factor of a "
            "relaxed density has no discrete counterpart"
        )
