"""The hazard P1 and P2 read is a Gamma–Poisson posterior mean shrunk toward the provider's (group's) and the
campus's rates by the evidence it rests on (design §2 "Estimators"), and P2's why text says how far
(design §3, `scheduler.explain.hazard_evidence_words`)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.estimators import HazardEstimator, shrinkage_weight, shrunk_rate_per_s
from scheduler.explain import Candidate, hazard_evidence_words, placement_words

SETTINGS = settings(max_examples=100, deadline=None)


@SETTINGS
@given(st.floats(1e-6, 1e-2), st.floats(1e-6, 1e-2), st.floats(0.5, 5.0))
def test_shrunk_hazard_equals_plain_estimate_when_evidence_is_large(true_per_s: float, prior_per_s: float,
                                                                     prior_events: float) -> None:
    """With the exposure 10⁶ times the pseudo-exposure at the lower of the two rates (so at least 10⁶ prior-sized
    counts of departures), the posterior mean is k/T to 1e-5 (relative)."""
    exposure_s = 1e6 * prior_events / min(prior_per_s, true_per_s)
    k = true_per_s * exposure_s
    shrunk = float(shrunk_rate_per_s(k, exposure_s, prior_per_s, prior_events))
    assert shrunk == pytest.approx(k / exposure_s, rel=1e-5)
    assert float(shrinkage_weight(exposure_s, prior_per_s, prior_events)) > 0.9999


@SETTINGS
@given(st.integers(0, 5), st.floats(1.0, 3600.0), st.floats(1e-5, 1e-3), st.floats(0.5, 5.0))
def test_shrunk_hazard_moves_toward_the_prior_when_evidence_is_small(k: int, exposure_s: float, prior_per_s: float,
                                                                      prior_events: float) -> None:
    """A handful of departures over a short lent time: the posterior mean lies between the plain k/T and the prior
    (a weighted mean, weight `shrinkage_weight` on k/T), closer to the prior the less exposure there is."""
    shrunk = float(shrunk_rate_per_s(k, exposure_s, prior_per_s, prior_events))
    plain = k / exposure_s
    w = float(shrinkage_weight(exposure_s, prior_per_s, prior_events))
    assert shrunk == pytest.approx(w * plain + (1 - w) * prior_per_s, rel=1e-9)
    assert min(plain, prior_per_s) * (1 - 1e-12) <= shrunk <= max(plain, prior_per_s) * (1 + 1e-12)
    less = float(shrunk_rate_per_s(k * 0.5, exposure_s * 0.5, prior_per_s, prior_events))  # same k/T, half the data
    assert abs(less - prior_per_s) <= abs(shrunk - prior_per_s) * (1 + 1e-12)
    assert float(shrunk_rate_per_s(0, 0.0, prior_per_s, prior_events)) == pytest.approx(prior_per_s)


def test_estimator_level_is_the_shrunk_rate_of_its_evidence() -> None:
    """`HazardEstimator.hazard_evidence` reports what each node's level rests on, and the level is
    `shrunk_rate_per_s` of it toward its group's level: in a group that left 301 times in 5 h, the node with 300
    departures sits near its own rate, the one with none is pulled up toward the group's."""
    hz = HazardEstimator(3, group_of=np.array([0, 0, 0]), prior_per_s=0.2 / 3600)
    hz.add_exposure(0.0, 5 * 3600.0, np.array([True, True, True]))
    hz.record_departures(np.array([1] * 300), 4 * 3600.0)
    hz.record_departures(np.array([0]), 4.5 * 3600.0)
    t = 5 * 3600.0
    ev = hz.hazard_evidence(t)
    assert np.allclose(ev["level_per_s"], shrunk_rate_per_s(ev["events"], ev["exposure_s"], ev["prior_per_s"],
                                                            hz.prior_events))
    assert np.all((ev["weight"] > 0) & (ev["weight"] < 1))
    plain = ev["events"] / ev["exposure_s"]
    # the heavy node is close to its own rate; the quiet node (no departures) is pulled up toward the group
    assert ev["level_per_s"][2] > plain[2] == 0.0
    assert abs(ev["level_per_s"][1] - plain[1]) / plain[1] < 0.05


def test_why_text_says_how_far_the_risk_was_shrunk() -> None:
    """Two departures in half an hour lent: the text names the evidence and the share taken from the provider's
    rate; a long history says the risk rests on the node's own record."""
    prior = 1.0 / 3600
    weight = float(shrinkage_weight(1800.0, prior))
    level = float(shrunk_rate_per_s(2, 1800.0, prior))
    text = hazard_evidence_words(2, 1800.0, prior, level)
    assert "2 departures in 30 min lent" in text
    assert f"{100 * (1 - weight):.0f} % its provider's rate" in text
    long = hazard_evidence_words(400, 400 * 3600.0, prior, float(shrunk_rate_per_s(400, 400 * 3600.0, prior)))
    assert "its own history" in long and "%" not in long
    why = placement_words(Candidate("gpu-7", transfer_s=40.0, survival=0.8), ckpt_bytes=3.2e9, restart_s=10.0,
                          remaining_s=3600.0, hazard_evidence=text)
    assert why.startswith("gpu-7 was chosen") and text in why
