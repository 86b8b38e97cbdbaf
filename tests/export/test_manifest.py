"""The handover's one definition: every stage reads and writes the manifest through contract.manifest."""

import json

import pytest

from contract import MANIFEST_FILE
from contract import manifest as manifests


def _raw(trained_run):
    return json.loads((trained_run / MANIFEST_FILE).read_text())


def test_a_training_run_round_trips_unchanged(trained_run):
    raw = _raw(trained_run)
    manifest = manifests.read(str(trained_run / MANIFEST_FILE))
    assert manifest.format == manifests.FORMAT == 2
    assert manifest.to_dict() == raw
    assert manifest.model.name == "seed_cnn" and manifest.num_classes == 3
    assert manifest.training["backend"] == "tensorflow"
    assert manifest.samples.file == "samples.npz" and manifest.samples.test == 48


def test_sections_this_code_does_not_know_are_kept(trained_run, tmp_path):
    raw = _raw(trained_run)
    raw["litert"] = {"agreement": 0.99}
    path = tmp_path / MANIFEST_FILE
    manifests.write(str(path), manifests.Manifest.from_dict(raw))
    assert json.loads(path.read_text()) == raw


def test_format_1_without_samples_is_still_read(trained_run):
    raw = _raw(trained_run)
    raw["format"] = 1
    del raw["samples"]
    manifest = manifests.Manifest.from_dict(raw)
    assert manifest.samples is None and manifest.weights.sha256 == raw["weights"]["sha256"]


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


@pytest.mark.parametrize("edit, message", [
    (_set("format", 3), "has manifest format 3; this version reads formats 1, 2 (upgrade the pipeline)"),
    (_drop("format"), "has manifest format None"),
    (_drop("fingerprint"), "lacks field 'fingerprint'"),
    (_drop("weights", "sha256"), "lacks field 'weights.sha256'"),
    (_set("num_classes", 5), "lists 3 class names for 5 classes"),
    (_set("model", "seed_cnn"), "section 'model' is not an object"),
    (_short_fingerprint, "fingerprint's outputs do not match its probe shape"),
], ids=["newer", "no-format", "no-fingerprint", "no-sha256", "class-count", "model-not-object", "short-fingerprint"])
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
    path.write_text('{"format": 2, "model": {')
    with pytest.raises(manifests.ManifestError, match=f"cannot read {path}"):
        manifests.read(str(path))
