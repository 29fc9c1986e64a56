"""The sites a handler's ``sites=`` names, checked against the sites of each run: a name that no
sample site of the run has (a typo, ``"Z"`` for ``"z"``) left the site as it was, with no error --
``discrete(model, mode="argmax", sites="Z")`` returned relaxed values as the mode."""


class NamedSites:
    """Kept by a handler with ``sites=`` (``handler``: its name in messages): :meth:`start` as the
    handler is entered, :meth:`saw` at each sample site, :meth:`end` as it is left. A run raises
    where none of the names is one of its sample sites. One that misses only some of them is left
    alone: a site drawn in one branch, or ``z_{t}`` for steps beyond a minibatch's length, is missing
    from some runs of a correct model (requiring every name of every run failed their training at
    random steps). A run in which no sample site reached the handler (a block with nothing in it, a
    helper that hides its own runs) names nothing wrongly."""

    def __init__(self, names, handler):
        self.names, self.handler = names, handler
        self._depth, self._seen = 0, set()

    def start(self):
        if self._depth == 0:
            self._seen = set()
        self._depth += 1

    def saw(self, name):
        if self.names is not None:
            self._seen.add(name)

    def end(self, completed):
        self._depth -= 1
        if self._depth or not completed or not self.names or not self._seen:  # None: every site; empty: none
            return
        if not self.names & self._seen:
            raise ValueError(
                f"{self.handler}: sites= names {sorted(self.names)}, none of which is a sample site of the model "
                f"(its sites: {sorted(self._seen)})"
            )


class NamingSites:
    """A handler's mixin (before the host's ``Messenger`` in its bases): ``sites=`` checked against
    each run's sample sites (:class:`NamedSites` in ``_named``), entered as a ``with`` block or as the
    wrapper of a model alike (the hosts' wrappers enter the handler)."""

    _named: NamedSites

    def __enter__(self):
        self._named.start()
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        result = super().__exit__(exc_type, exc_value, traceback)
        self._named.end(exc_type is None)
        return result
