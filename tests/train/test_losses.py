"""The loss a recipe names (train/losses.py): LogitNorm against its formula in NumPy, and a run that trains by it."""

import json

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE
from contract.recipe import Recipe
from train import losses, report, trainer


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logit_norm(z, labels, temperature, smoothing=0.0):
    """Wei et al.'s LogitNorm on the centred logits, in float64: the control."""
    f = z - z.mean(axis=-1, keepdims=True)
    scaled = f / ((np.linalg.norm(f, axis=-1, keepdims=True) + 1e-7) * temperature)
    log_p = scaled - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True)) - scaled.max(-1, keepdims=True)
    targets = np.eye(z.shape[-1])[labels] * (1 - smoothing) + smoothing / z.shape[-1]
    return -(targets * log_p).sum(axis=-1)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_logit_norm_is_the_cross_entropy_of_the_normalised_centred_logits(smoothing):
    import keras

    rng = np.random.default_rng(0)
    z = rng.normal(0, 4, size=(64, 10))
    labels = rng.integers(0, 10, size=64)
    y_true = np.eye(10, dtype="float32")[labels] if smoothing else labels
    loss = losses.LogitNorm(0.04, label_smoothing=smoothing, reduction=None)
    got = keras.ops.convert_to_numpy(loss(y_true, _softmax(z).astype("float32")))
    np.testing.assert_allclose(got, _logit_norm(z, labels, 0.04, smoothing), rtol=2e-4, atol=2e-4)


def test_logit_norm_cannot_be_lowered_by_growing_the_logits_where_cross_entropy_can():
    import keras

    rng = np.random.default_rng(1)
    z = rng.normal(0, 1, size=(32, 10))
    labels = np.argmax(z, axis=-1)  # every answer right: cross-entropy falls as the logits grow
    logit_norm, cross_entropy = losses.LogitNorm(0.04), keras.losses.SparseCategoricalCrossentropy()
    small, large = _softmax(z).astype("float32"), _softmax(4 * z).astype("float32")
    assert float(cross_entropy(labels, large)) < 0.5 * float(cross_entropy(labels, small))
    np.testing.assert_allclose(float(logit_norm(labels, large)), float(logit_norm(labels, small)), rtol=1e-4)


def test_the_recipe_names_the_loss():
    import keras

    assert isinstance(losses.for_recipe(Recipe()), keras.losses.SparseCategoricalCrossentropy)
    assert isinstance(losses.for_recipe(Recipe(label_smoothing=0.1)), keras.losses.CategoricalCrossentropy)
    chosen = losses.for_recipe(Recipe(logit_norm=0.04, label_smoothing=0.1))
    assert isinstance(chosen, losses.LogitNorm) and (chosen.temperature, chosen.label_smoothing) == (0.04, 0.1)
    with pytest.raises(ValueError, match="logit_norm"):
        Recipe(logit_norm=-0.04)


def test_a_run_trains_by_logit_norm_and_records_it(tmp_path):
    splits = synthetic.make_splits(train_per_class=16, test_per_class=4)
    run = tmp_path / "run"
    trainer.run(trainer.Config(output=str(run), recipe=dict(epochs=3, batch_size=16, logit_norm=0.04, augment=False),
                               precision="float32", holdout=0, verbose=0), splits=splits)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["training"]["recipe"]["logit_norm"] == 0.04
    # The loss of record is LogitNorm's: an untrained network's cross-entropy on 3 classes is about ln 3,
    # LogitNorm's at temperature 0.04 many times that (it puts every image's logits at norm 25); it falls.
    loss = [row["loss"] for row in report.read_history(str(run / "history.csv"))]
    assert len(loss) == 3 and loss[0] > 3 * np.log(3) and loss[-1] < loss[0]


def test_outlier_exposure_is_cross_entropy_for_a_class_and_the_distance_to_uniform_for_an_outlier():
    z = np.random.default_rng(1).normal(size=(6, 10)) * 3
    labels = np.array([3, -1, 0, -1, 9, 2])
    loss = losses.OutlierExposure(fraction=0.2, weight=0.5)
    got = np.asarray(loss(labels, _softmax(z).astype(np.float32)))
    log_p = np.log(_softmax(z))
    per_image = np.where(labels >= 0, -log_p[np.arange(6), np.maximum(labels, 0)],
                         0.5 * (0.8 / 0.2) * (-log_p.mean(axis=-1) - np.log(10)))
    np.testing.assert_allclose(got, per_image.mean(), rtol=1e-5)
    assert np.asarray(loss(np.array([-1]), np.full((1, 10), 0.1, np.float32))) == pytest.approx(0.0, abs=1e-6)


def test_outlier_exposure_is_chosen_by_the_recipe_and_refuses_smoothed_labels():
    chosen = losses.for_recipe(Recipe(outlier_fraction=0.1, outlier_weight=0.25))
    assert isinstance(chosen, losses.OutlierExposure) and (chosen.fraction, chosen.weight) == (0.1, 0.25)
    with pytest.raises(ValueError, match="label-smoothing 0"):
        losses.for_recipe(Recipe(outlier_fraction=0.1, label_smoothing=0.1))


def test_a_run_asking_for_outliers_with_smoothed_labels_is_refused_before_it_starts(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(trainer.UsageError, match="outlier exposure"):  # seed_cnn's recipe smooths its labels
        trainer.run(trainer.Config(output=str(run), recipe=dict(outlier_fraction=0.1), verbose=0),
                    splits=synthetic.make_splits(train_per_class=4, test_per_class=2))
    assert not run.exists()


def test_a_run_trains_with_outliers_and_jpeg_images_and_records_it(tmp_path):
    splits = synthetic.make_splits(train_per_class=16, test_per_class=4)
    run = tmp_path / "run"
    recipe = dict(epochs=2, batch_size=16, outlier_fraction=0.25, jpeg_fraction=0.25, label_smoothing=0.0)
    trainer.run(trainer.Config(output=str(run), recipe=recipe, precision="float32", holdout=0, verbose=0), splits=splits)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["training"]["recipe"]["outlier_fraction"] == 0.25
    assert manifest["training"]["recipe"]["jpeg_fraction"] == 0.25
    assert len(report.read_history(str(run / "history.csv"))) == 2


def test_the_start_line_names_every_augmentation_the_recipe_trains_with():
    assert Recipe().augmentation() == "off"
    recipe = Recipe(augment=True, alternate_flips=True, crop_padding=2, corrupt_fraction=0.1, jpeg_fraction=0.1,
                    outlier_fraction=0.1)
    assert recipe.augmentation() == ("crop(pad 2)+alternating flip+corrupt(0.1 of each batch: noise std up to 0.1, "
                                     "blur sigma up to 1 px)+jpeg(0.1 of each batch: quality 30-95)+"
                                     "outliers(0.1 of each batch: patches shuffled, weight 0.5)")
