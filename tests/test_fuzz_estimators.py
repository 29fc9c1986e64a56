"""The estimators' harness (``tests/fuzz_estimators.py``) on a fixed list of its generated models:
every loss and estimator of both packages is unbiased on each, or refuses it as documented; and the
harness catches a loss that is not (a score term that reads the host's scaled density, the defect
it was built against). The longer sweep: ``python -m tests.fuzz_estimators --cases 2000``
(``tests/fuzz_estimators_results.txt``)."""

import numpy as np
import pytest

from tests import fuzz_estimators, random_models

# Chosen from the sweep for what they hold together (each runs in 10-35 s). Cases 6 (a global Normal,
# a learned prior, per-element baselines without a plate, a masked observation) and 24 (a guide site
# after another, a per-element baseline without a plate, a scaled site) ran here too until the suite
# needed their 30 CPU-seconds; the baselines' shapes are tests/test_estimators_exact.py's, and both
# cases are in the sweep.
CASES = {
    17: "a subsampled plate, categorical sites in linear and log space, a relaxed site after another in model and guide",
    39: "a nested subsampled plate, a Normal guide site after a relaxed one, masked observations",
    14: "a guide-only categorical site, a Normal after relaxed sites in the guide, a subsample without a plate",
    41: "relaxed latents of the model only (score terms for their priors; refused by the estimators)",
}


# Each case in one backend, the backends alternating, so that each backend meets two of them and
# the suite keeps its time budget (both backends on every case: the sweep).
BACKEND_OF = {17: "pyro", 39: "numpyro", 14: "pyro", 41: "numpyro"}


@pytest.mark.parametrize("seed", list(CASES))
def test_every_loss_is_unbiased_or_refuses_as_documented(seed):
    case = fuzz_estimators.Case(seed, backends=(BACKEND_OF[seed],))
    outcomes = case.run()
    third = [(o.backend, o.loss, o.kind, o.detail) for o in outcomes if o.third]
    assert not third, (case.spec.describe(), third)
    assert {o.backend for o in outcomes if o.kind == "unbiased"} == {BACKEND_OF[seed]}, (case.spec.describe(), outcomes)


def test_the_cases_hold_what_they_were_chosen_for():
    """The generator is part of the test: a change to it would silently test other models."""
    assert set(BACKEND_OF) == set(CASES) and set(BACKEND_OF.values()) == {"pyro", "numpyro"}
    described = {seed: random_models.generate(seed).describe() for seed in CASES}
    assert "data 3/2" in described[17] and "ExpConcrete3" in described[17]
    assert "inner 3/2" in described[39] and "z1=Normal@inner/both<-z0,q:z0" in described[39]
    assert "/guide" in described[14] and "plate=None" in described[14]
    assert "/model" in described[41]


def test_the_harness_catches_a_score_term_of_the_scaled_density(monkeypatch):
    """The defect the harness was built against, put back: ScoreFunctionELBO's score term of the
    host's scaled log density, on a binary site in a plate of 8 subsampled by 2 (s = 4). The harness
    reports it biased, and the loss as it is unbiased."""
    import numpyro_concrete.losses
    from tests.test_estimators_exact import _binary_spec

    case = fuzz_estimators.Case(0, backends=("numpyro",), spec=_binary_spec())
    outcome = case._outcome(case.backends[0], "ScoreFunctionELBO", case.threshold(), verbose=False)
    assert outcome.kind == "unbiased", outcome
    monkeypatch.setattr(numpyro_concrete.losses, "score_log_prob", lambda site: site["log_prob"])
    outcome = case._outcome(case.backends[0], "ScoreFunctionELBO", case.threshold(), verbose=False)
    assert outcome.kind == "biased" and np.isfinite(outcome.worst_z), outcome
