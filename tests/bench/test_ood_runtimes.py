"""bench/confidence/runtimes.py's comparison of each runtime's score, verdict and class against the SavedModel's."""

import numpy as np
import pytest

from bench.confidence import runtimes

THRESHOLD = 0.0


def outputs(scores, classes):
    """A runtime's outputs: its scores, its verdicts at :data:`THRESHOLD`, one-hot probabilities of ``classes``."""
    scores = np.asarray(scores, np.float32)
    return {"ood_score": scores, "in_distribution": scores <= THRESHOLD,
            "probabilities": np.eye(3, dtype=np.float32)[classes]}


GROUPS = np.array(["test"] * 4 + ["photos"] * 4 + ["noise"] * 2)
SAVED = outputs([-3.0, -2.0, -1.0, 0.5, -0.2, 1.0, 2.0, 3.0, 4.0, 5.0], [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])


def test_a_runtime_is_measured_image_by_image_against_the_savedmodel():
    # Two verdicts flip: a test image crosses the threshold (0.5 -> -0.1), a photo the other way (-0.2 -> 0.1).
    int8 = outputs([-3.0, -2.0, -1.0, -0.1, 0.1, 1.0, 2.0, 3.0, 4.0, 5.5], [0, 1, 2, 0, 1, 2, 0, 1, 2, 1])
    result = runtimes.compare({"savedmodel": SAVED, "litert-int8": int8}, GROUPS, THRESHOLD)
    r = result["litert-int8"]
    assert r["score_diff_max"] == pytest.approx(0.6)
    assert 0.5 < r["score_diff_p99"] < 0.6
    assert r["verdict_agreement"] == pytest.approx(0.8)
    assert r["class_agreement"] == pytest.approx(0.9)
    assert r["verdicts_differ"] == {"test": 1, "photos": 1, "noise": 0}
    assert r["verdicts_differ_within"] == pytest.approx(0.5)
    assert r["test_flagged"] == 0.0 and r["photos_flagged"] == 1.0
    assert r["verdicts_off_threshold"] == 0


def test_the_savedmodel_is_the_reference_with_its_own_figures_only():
    result = runtimes.compare({"savedmodel": SAVED, "litert": SAVED}, GROUPS, THRESHOLD)
    assert "score_diff_max" not in result["savedmodel"]
    assert result["savedmodel"]["test_flagged"] == 0.25
    assert result["savedmodel"]["photos_flagged"] == 0.75
    # One photo (-0.2) scores below one test image (0.5): 15 of 16 pairs ordered.
    assert result["savedmodel"]["photos_auroc"] == pytest.approx(15 / 16)
    assert result["savedmodel"]["nearest_to_threshold"] == pytest.approx(0.2)
    same = result["litert"]
    assert (same["score_diff_max"], same["verdict_agreement"], same["class_agreement"]) == (0.0, 1.0, 1.0)
    assert same["verdicts_differ_within"] is None


def test_a_verdict_that_contradicts_its_own_score_is_counted():
    broken = {**SAVED, "in_distribution": np.ones(len(GROUPS), bool)}
    result = runtimes.compare({"savedmodel": SAVED, "litert": broken}, GROUPS, THRESHOLD)
    assert result["litert"]["verdicts_off_threshold"] == 6
    assert result["savedmodel"]["verdicts_off_threshold"] == 0
    assert result["litert"]["verdicts_differ"] == {"test": 1, "photos": 3, "noise": 2}
