"""The names both packages use for the test-time modes and for the log-space coordinates a
sample carries."""

import enum


class Mode(str, enum.Enum):
    """What ``discrete(model, mode=...)`` does at a Concrete-family site (a ``str``: users pass the
    plain names)."""

    SAMPLE = "sample"  # discrete draws, scored with the discrete masses
    ENUMERATE = "enumerate"  # marked for the host's parallel enumeration
    ARGMAX = "argmax"  # the mode of the limit


MODES = tuple(mode.value for mode in Mode)


def check_mode(owner, mode):
    """``mode`` as a :class:`Mode`, or a ValueError naming the allowed ones."""
    try:
        return Mode(mode)
    except ValueError:
        raise ValueError(f"{owner}: mode must be one of {MODES}, got {mode!r}") from None


class Kind(str, enum.Enum):
    """The coordinates a sample carries (the paper's appendix C: the log-space node): which sampler
    made it, so that a density reads only what its own family wrote."""

    LOG = "log"  # Concrete: y = log x, x on the simplex
    LOG_SIMPLEX = "log_simplex"  # an ExpConcrete sample: its own coordinates, no -inf entries
    LOGIT = "logit"  # BinConcrete: y = logit x
    REAL = "real"  # a LogitBinConcrete sample: its own coordinates, finite
    STRAIGHT_THROUGH_LOG = "straight_through_log"  # a one-hot value whose relaxed sample is exp(y)
    STRAIGHT_THROUGH_LOGIT = "straight_through_logit"  # a 0/1 value whose relaxed sample is sigmoid(y)

    @property
    def n_ary(self):
        """The last axis is an event (a point of the simplex, or of log Δ)."""
        return self in (Kind.LOG, Kind.LOG_SIMPLEX, Kind.STRAIGHT_THROUGH_LOG)

    @property
    def straight_through(self):
        return self in (Kind.STRAIGHT_THROUGH_LOG, Kind.STRAIGHT_THROUGH_LOGIT)

    @property
    def binary(self):
        return self in (Kind.LOGIT, Kind.STRAIGHT_THROUGH_LOGIT)
