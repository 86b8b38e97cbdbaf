"""bench/confidence/ood.py's verdicts at other pass rates: thresholds fitted on held-out scores, shares flagged."""

import numpy as np
import pytest

from bench.confidence import ood


def test_each_pass_rate_flags_what_lies_above_its_held_out_threshold():
    held_out = np.arange(100.0)  # the rate r lets the lowest 100 r scores pass
    test = np.array([10.0, 94.5, 97.5, 98.5, 99.5])
    foreign = {"photos": np.array([0.0, 95.0, 98.0, 200.0]), "noise": np.full(3, 1000.0)}
    result = ood.verdicts(held_out, test, foreign, pass_rates=(0.95, 0.98, 0.99))
    assert list(result) == ["0.95", "0.98", "0.99"]
    assert [v["threshold"] for v in result.values()] == [94.0, 97.0, 98.0]
    assert [v["test_flagged"] for v in result.values()] == [0.8, 0.6, 0.4]
    assert [v["sets"]["photos"] for v in result.values()] == [0.75, 0.5, 0.25]
    assert all(v["sets"]["noise"] == 1.0 for v in result.values())
    low, high = result["0.99"]["test_flagged_interval_95"]
    assert low < 0.4 < high


def test_the_measurement_reports_verdicts_only_with_a_held_out_slice():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3, 4))

    def logits(images):  # a stand-in model: any fixed map from images to logits
        return images.reshape(len(images), -1)[:, :3].astype(np.float64) @ weights

    images = rng.integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 50)
    sets = {"bright": np.full((20, 32, 32, 3), 255, np.uint8)}
    assert "verdicts" not in ood.measure(logits, images, labels, sets)
    held_out = rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8)
    result = ood.measure(logits, images, labels, sets, held_out_images=held_out)
    passing = np.mean(ood.rules.score(logits(held_out)) <= result["verdicts"]["0.98"]["threshold"])
    assert passing == pytest.approx(0.98)
