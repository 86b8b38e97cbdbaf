"""The handover's one definition: every stage reads and writes the manifest through contract.manifest and contract.published, typed end to end."""

import dataclasses
import json

import pytest

from contract import MANIFEST_FILE
from contract import manifest as manifests
from contract import published as publications
from contract.recipe import Recipe
from train import models


def _raw(trained_run):
    return json.loads((trained_run / MANIFEST_FILE).read_text())


def test_a_training_run_round_trips_unchanged(trained_run, tmp_path):
    raw = _raw(trained_run)
    manifest = manifests.read(str(trained_run / MANIFEST_FILE))
    assert manifest.format == manifests.FORMAT == 4
    assert manifest.to_dict() == raw
    assert manifest.model.name == "seed_cnn" and manifest.num_classes == 3
    assert manifest.training.keras_backend == "tensorflow" and "backend" not in raw["training"]
    assert manifest.training.input_pipeline == "tf.data"
    # The whole recipe the run trained with, typed: the model's, with the run's changes (tests/conftest.py).
    assert isinstance(manifest.training.recipe, Recipe)
    assert manifest.training.recipe == dataclasses.replace(
        models.recipe("seed_cnn"), epochs=4, batch_size=16, schedule="constant", augment=False, label_smoothing=0.0)
    assert manifest.samples.file == "samples.npz" and manifest.samples.test == 48
    path = tmp_path / MANIFEST_FILE
    manifests.write(str(path), manifest)
    assert json.loads(path.read_text()) == raw


def test_the_published_copy_is_typed_and_round_trips(model_base, tmp_path):
    path = model_base / "1" / "assets.extra" / MANIFEST_FILE
    published = publications.read_published(str(path))
    assert isinstance(published.export, publications.Export) and isinstance(published.confidence, publications.Confidence)
    assert published.export.version == 1 and published.export.model_name == "cifar10"
    assert isinstance(published.export.litert.runtimes["litert"], publications.RuntimeCheck)
    assert isinstance(published.confidence.ood.threshold, float)
    copy = tmp_path / MANIFEST_FILE
    manifests.write(str(copy), published)
    assert json.loads(copy.read_text()) == json.loads(path.read_text())
    # A run's manifest is not a published one, and the other way round.
    without_export = published.to_dict()
    del without_export["export"]
    with pytest.raises(manifests.ManifestError, match="lacks field 'export'"):
        publications.Published.from_dict(without_export)
    with pytest.raises(manifests.ManifestError, match="sections this version does not know: confidence, export"):
        manifests.Manifest.from_dict(published.to_dict())


def test_sections_this_code_does_not_know_are_refused(trained_run):
    raw = _raw(trained_run)
    raw["litert"] = {"agreement": 0.99}
    with pytest.raises(manifests.ManifestError, match="sections this version does not know: litert"):
        manifests.Manifest.from_dict(raw)
    raw = _raw(trained_run)
    raw["training"]["backend"] = raw["training"].pop("keras_backend")  # format 2's spelling
    with pytest.raises(manifests.ManifestError, match="fields this version does not know in 'training': backend"):
        manifests.Manifest.from_dict(raw)


@pytest.mark.parametrize("older", [1, 2, 3])
def test_an_older_format_is_refused_with_the_commands_that_rebuild_it(trained_run, tmp_path, older):
    raw = _raw(trained_run)
    raw["format"] = older
    path = tmp_path / MANIFEST_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(manifests.FormatError) as error:
        manifests.read(str(path))
    message = str(error.value)
    assert message.startswith(f"{path} has manifest format {older}, not 4")
    assert "python -m train --output RUN --overwrite, then python -m export --run RUN" in message and "\n" not in message


def test_write_takes_only_a_typed_manifest(trained_run, tmp_path):
    with pytest.raises(TypeError, match="not dict"):
        manifests.write(str(tmp_path / MANIFEST_FILE), _raw(trained_run))


def test_sections_are_frozen(trained_run):
    manifest = manifests.read(str(trained_run / MANIFEST_FILE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.training.keras_backend = "jax"


def _set(key, value):
    def edit(raw):
        raw[key] = value
    return edit


def _drop(*path):
    def edit(raw):
        for key in path[:-1]:
            raw = raw[key]
        del raw[path[-1]]
    return edit


def _short_fingerprint(raw):
    raw["fingerprint"]["outputs"] = raw["fingerprint"]["outputs"][:3]


def _bad_recipe(raw):
    raw["training"]["recipe"]["schedule"] = "cosine"


def _wrong_type(raw):
    raw["metrics"]["test_images"] = "many"


@pytest.mark.parametrize("edit, message", [
    (_set("format", 5), "has manifest format 5; this version reads format 4 (upgrade the pipeline)"),
    (_drop("format"), "has manifest format None"),
    (_drop("fingerprint"), "lacks field 'fingerprint'"),
    (_drop("samples"), "lacks field 'samples'"),
    (_drop("weights", "sha256"), "lacks field 'weights.sha256'"),
    (_set("num_classes", 5), "lists 3 class names for 5 classes"),
    (_set("model", "seed_cnn"), "section 'model' is not an object"),
    (_wrong_type, "field 'metrics.test_images' should be an integer, not \"many\""),
    (_bad_recipe, "section 'training.recipe': recipe schedule: 'cosine' is not one of constant, onecycle, triangle"),
    (_short_fingerprint, "fingerprint's outputs do not match its image shape"),
], ids=["newer", "no-format", "no-fingerprint", "no-samples", "no-sha256", "class-count", "model-not-object",
        "wrong-type", "bad-recipe", "short-fingerprint"])
def test_a_broken_or_newer_manifest_is_one_clear_line(trained_run, tmp_path, edit, message):
    raw = _raw(trained_run)
    edit(raw)
    path = tmp_path / MANIFEST_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(manifests.ManifestError) as error:
        manifests.read(str(path))
    assert str(error.value).startswith(str(path)) and message in str(error.value) and "\n" not in str(error.value)


def test_a_truncated_file_names_the_file(tmp_path):
    path = tmp_path / MANIFEST_FILE
    path.write_text('{"format": 4, "model": {')
    with pytest.raises(manifests.ManifestError, match=f"cannot read {path}"):
        manifests.read(str(path))
