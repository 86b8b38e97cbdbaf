"""bench/confidence/robustness.py's parts that need no model and no imagecorruptions: the measures, the cache and its
key, the tables and plot, on a fake generator's output and a fake model."""

import json
import os

import numpy as np
import pytest

from contract import OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from contract import confidence as rules

from bench.confidence import robustness

CLASSES = 10


def images(count=8, seed=0):
    """Noise images, each at its own brightness (a mean of 0.15 to 0.5 of full scale)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (count, 32, 32, 3)) * rng.uniform(0.3, 1.0, (count, 1, 1, 1))).astype(np.uint8)


def fake_generate(calls):
    """A stand-in for bench/confidence/corruptions_generate.py: each set is the clean images darkened by its severity;
    ``fog`` fails, as a corruption the package cannot make would."""

    def generate(clean_path, out_path, corruptions, severities, seed, log=print):
        calls.append((corruptions, severities, seed))
        with np.load(clean_path) as f:
            clean = f["images"]
        sets = {f"{c}-{s}": (clean // (s + 1)).astype(np.uint8) for c in corruptions if c != "fog" for s in severities}
        meta = {"versions": {"imagecorruptions": "fake"}, "seed": seed,
                "not_measured": {"fog": "ValueError: fails"} if "fog" in corruptions else {}}
        np.savez(out_path, meta=np.array(json.dumps(meta)), **sets)

    return generate


def test_ece_of_a_known_case():
    # Four images at confidence 0.9 (bin 14), three right; four at 0.6 (bin 9), all right.
    p = np.full((8, 2), 0.1)
    p[:4] = [0.9, 0.1]
    p[4:] = [0.4, 0.6]
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    m = robustness.measures(p, labels, None)
    assert m["accuracy"] == pytest.approx(7 / 8)
    assert m["ece"] == pytest.approx(0.5 * abs(0.75 - 0.9) + 0.5 * abs(1.0 - 0.6))
    assert m["confidence"] == pytest.approx(0.75)
    assert m["flagged"] is None
    assert m["wilson_95"][0] < 7 / 8 < m["wilson_95"][1]


def test_flagged_from_the_threshold_and_from_the_models_verdict():
    scores = np.array([-9.0, -5.0, -4.0, -1.0])
    # Without the model's verdict: foreign where the score is above the threshold (at it is in distribution).
    flagged = robustness.foreign({OUTPUT_OOD_SCORE: scores}, threshold=-4.0)
    assert flagged.tolist() == [False, False, False, True]
    assert robustness.measures(np.eye(4)[:, :2] + 0.1, np.zeros(4, int), flagged)["flagged"] == pytest.approx(0.25)
    # The model's own verdict is what the server answers, so it wins.
    verdict = {OUTPUT_OOD_SCORE: scores, OUTPUT_IN_DISTRIBUTION: np.array([True, False, False, False])}
    assert robustness.foreign(verdict, threshold=-4.0).tolist() == [False, True, True, True]
    # No threshold and no verdict: nothing to flag with.
    assert robustness.foreign({OUTPUT_OOD_SCORE: scores}, threshold=None) is None


def test_the_cache_key_names_everything_the_sets_depend_on(tmp_path):
    recipe = [tmp_path / "generator.py", tmp_path / "requirements.txt"]
    for path in recipe:
        path.write_text("v1\n")
    x = images()
    key = robustness.cache_key(x, ["fog"], [1, 2], 0, recipe)
    assert len(key) == 16 and key == robustness.cache_key(x.copy(), ["fog"], [1, 2], 0, recipe)
    other = x.copy()
    other[0, 0, 0, 0] ^= 1
    assert robustness.cache_key(other, ["fog"], [1, 2], 0, recipe) != key
    assert robustness.cache_key(x, ["fog"], [1, 2], 1, recipe) != key
    assert robustness.cache_key(x, ["fog"], [1], 0, recipe) != key
    assert robustness.cache_key(x, ["snow"], [1, 2], 0, recipe) != key
    recipe[1].write_text("v2\n")  # a new pin
    assert robustness.cache_key(x, ["fog"], [1, 2], 0, recipe) != key


def test_the_generator_runs_once_per_key_and_a_failed_corruption_is_reported(tmp_path):
    calls = []
    x = images()
    path = robustness.ensure_cache(x, ["snow", "fog"], [1, 3], 7, str(tmp_path), fake_generate(calls))
    again = robustness.ensure_cache(x, ["snow", "fog"], [1, 3], 7, str(tmp_path), fake_generate(calls))
    assert path == again and calls == [(["snow", "fog"], [1, 3], 7)]
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # the clean images' scratch file is gone
    sets, meta = robustness.load_sets(path, ["snow", "fog"], [1, 3], x.shape)
    assert sorted(sets) == [("snow", 1), ("snow", 3)]
    assert np.array_equal(sets["snow", 3], x // 4)
    assert meta["not_measured"] == {"fog": "ValueError: fails"}


def fake_model(labels, threshold):
    """Logits that favour the true class by the images' mean brightness, so darker sets lose accuracy and
    look more foreign. Each set is under one batch, so a batch's rows are ``labels`` in order."""

    def predict(batch):
        brightness = batch.reshape(len(batch), -1).mean(1) / 255.0
        truth = labels[:len(batch)]
        logits = np.zeros((len(batch), CLASSES))
        logits[np.arange(len(batch)), truth] = 60 * brightness
        logits[np.arange(len(batch)), (truth + 1) % CLASSES] = 3.0
        scores = rules.score(logits)
        return {OUTPUT_PROBABILITIES: rules.softmax(logits).astype(np.float32), OUTPUT_OOD_SCORE: scores.astype(np.float32),
                OUTPUT_IN_DISTRIBUTION: rules.in_distribution(scores, threshold)}

    return predict


def test_evaluate_summarise_and_report(tmp_path):
    calls = []
    x = images(40)
    labels = np.arange(40) % CLASSES
    path = robustness.ensure_cache(x, ["snow", "fog", "contrast"], [1, 2, 3], 0, str(tmp_path), fake_generate(calls))
    sets, meta = robustness.load_sets(path, ["snow", "fog", "contrast"], [1, 2, 3], x.shape)
    threshold = -8.0
    predict = fake_model(labels, threshold)
    clean, by_set, mismatches = robustness.evaluate(predict, x, sets, labels, threshold, log=lambda *a: None)
    assert mismatches == 0
    assert clean["accuracy"] == 1.0 and clean["flagged"] == 0.0
    assert list(by_set) == ["snow", "contrast"] and list(by_set["snow"]) == ["1", "2", "3"]
    # Each set is the clean images darkened by its severity, so accuracy falls and flagging rises with it.
    accuracy = [by_set["snow"][s]["accuracy"] for s in ("1", "2", "3")]
    flagged = [by_set["snow"][s]["flagged"] for s in ("1", "2", "3")]
    assert accuracy == sorted(accuracy, reverse=True) and accuracy[-1] < 1.0
    assert flagged == sorted(flagged) and flagged[-1] > 0.0
    summary = robustness.summarise(by_set)
    assert summary["by_corruption"]["snow"]["accuracy"] == pytest.approx(np.mean(accuracy))
    assert summary["by_severity"]["3"]["flagged"] == pytest.approx(flagged[-1])  # snow and contrast are the same sets
    assert summary["all"]["ece"] == pytest.approx(np.mean([m["ece"] for per in by_set.values() for m in per.values()]))

    record = {"name": "fake", "images": 40, "clean": clean, "sets": by_set, "summary": summary,
              "not_measured": meta["not_measured"]}
    table = robustness.tables(record)
    assert "| none (clean) | 100.0% |" in table and "| fog | not measured |" in table
    assert f"| 3 | {summary['by_severity']['3']['accuracy']:.1%} |" in table
    assert "| **mean of 2** |" in table
    robustness.plot(record, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_without_a_threshold_has_no_flagged_share(tmp_path):
    x = images(10)
    labels = np.arange(10) % CLASSES

    def predict(batch):
        return {OUTPUT_PROBABILITIES: np.eye(CLASSES)[labels[:len(batch)]] * 0.9 + 0.01}

    clean, by_set, _ = robustness.evaluate(predict, x, {("snow", 1): x}, labels, None, log=lambda *a: None)
    assert clean["flagged"] is None and by_set["snow"]["1"]["flagged"] is None
    summary = robustness.summarise(by_set)
    record = {"name": "bare", "images": 10, "clean": clean, "sets": by_set, "summary": summary, "not_measured": {}}
    assert "| none (clean) | 100.0% | 0.090 | n/a |" in robustness.tables(record)
    robustness.plot(record, str(tmp_path / "plot.png"))  # two panels, no flagged share to draw
    assert (tmp_path / "plot.png").is_file()


def test_records_side_by_side(tmp_path):
    x = images(20)
    labels = np.arange(20) % CLASSES

    def bare(batch):  # a model without a threshold: no flagged share
        return {OUTPUT_PROBABILITIES: np.eye(CLASSES)[labels[:len(batch)]] * 0.9 + 0.01}

    records = []
    for name, predict, threshold in (("sure", fake_model(labels, -8.0), -8.0), ("bare", bare, None)):
        clean, by_set, _ = robustness.evaluate(predict, x, {("snow", 1): x // 4, ("snow", 2): x // 8}, labels,
                                               threshold, log=lambda *a: None)
        records.append({"name": name, "images": 20, "clean": clean, "sets": by_set,
                        "summary": robustness.summarise(by_set), "not_measured": {}})
    table = robustness.comparison(records).splitlines()
    assert table[0] == "| corruption (mean of severities 1-5) | sure: accuracy / flagged | bare: accuracy / flagged |"
    snow = records[0]["summary"]["by_corruption"]["snow"]
    assert snow["accuracy"] < 1.0 and snow["flagged"] > 0.0  # the darkened sets cost the fake model something
    assert table[3] == f"| snow | {snow['accuracy']:.1%} / {snow['flagged']:.1%} | 100.0% / n/a |"
    assert table[-1].startswith(f"| ECE: clean / mean of the corruptions | {records[0]['clean']['ece']:.3f} / ")
    robustness.comparison_plot(records, str(tmp_path / "models.png"))
    assert (tmp_path / "models.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
