"""Export stage: the round trip (export, reload without Keras, compare), version numbering,
the warmup records, encoded-image decoding, and every bad input as one line with exit code 2."""

import dataclasses
import io
import json
import os
import re
import types

import numpy as np
import pytest
from PIL import Image
from runs import copy_run

from contract import (
    ASSETS_EXTRA,
    INPUT_BYTES,
    INPUT_PIXELS,
    MANIFEST_FILE,
    OUTPUT_CLASS_IDS,
    OUTPUT_CLASS_NAMES,
    OUTPUT_IN_DISTRIBUTION,
    OUTPUT_OOD_SCORE,
    OUTPUT_PROBABILITIES,
    SAMPLES_FILE,
    SIGNATURE_BYTES,
    SIGNATURE_PIXELS,
    WARMUP_FILE,
    WEIGHTS_FILE,
    sha256_file,
)
from contract import manifest as manifests
from contract import published as publications
from export import exporter, savedmodel

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def manifest(trained_run):
    with open(trained_run / MANIFEST_FILE) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def keras_model(trained_run, manifest):
    """The trained model rebuilt directly, the reference every signature must agree with."""
    from train import models

    model = models.build_model(manifest["model"]["name"], manifest["num_classes"])
    model.load_weights(str(trained_run / WEIGHTS_FILE))
    return model


@pytest.fixture(scope="module")
def version_dir(model_base):
    return model_base / "1"


@pytest.fixture(scope="module")
def loaded(version_dir):
    import tensorflow as tf

    return tf.saved_model.load(str(version_dir))


@pytest.fixture(scope="module")
def temperature(version_dir):
    return publications.read_published(str(version_dir / ASSETS_EXTRA / MANIFEST_FILE)).confidence.temperature


def _calibrated(probabilities, temperature):
    """softmax(logits / T) from softmax(logits): log p is the logits less a constant per row."""
    z = np.log(np.asarray(probabilities, np.float64)) / temperature
    z -= z.max(axis=1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)


def _reference(keras_model, images, temperature):
    """What the exported signatures must answer: the Keras model's probabilities at the exported temperature."""
    return _calibrated(keras_model(images.astype(np.float32), training=False).numpy(), temperature)


def _pixels(loaded, images):
    import tensorflow as tf

    return {k: v.numpy() for k, v in loaded.signatures[SIGNATURE_PIXELS](**{INPUT_PIXELS: tf.constant(images)}).items()}


def _bytes(loaded, blobs):
    import tensorflow as tf

    return {k: v.numpy() for k, v in loaded.signatures[SIGNATURE_BYTES](**{INPUT_BYTES: tf.constant(blobs)}).items()}


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()




# --- The round trip -------------------------------------------------------------------


def test_both_signatures_agree_with_the_keras_model(loaded, keras_model, manifest, splits, temperature):
    from train import models

    images = np.concatenate([models.fingerprint_images(manifest["fingerprint"]["seed"]), splits.x_test[:8]])
    expected = _reference(keras_model, images, temperature)
    pngs = [_encode(Image.fromarray(image), "PNG") for image in images]
    for result in (_pixels(loaded, images), _bytes(loaded, pngs)):
        assert result[OUTPUT_PROBABILITIES].dtype == np.float32
        assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - expected)) <= TOLERANCE
        np.testing.assert_array_equal(result[OUTPUT_CLASS_IDS], np.argmax(expected, axis=-1))
        assert result[OUTPUT_CLASS_IDS].dtype == np.int64
        names = [name.decode() for name in result[OUTPUT_CLASS_NAMES]]
        assert names == [manifest["class_names"][i] for i in np.argmax(expected, axis=-1)]


def test_the_model_reproduces_the_manifest_fingerprint(loaded, manifest, temperature):
    from train import models

    images = models.fingerprint_images(manifest["fingerprint"]["seed"])
    result = _pixels(loaded, images)
    expected = _calibrated(manifest["fingerprint"]["outputs"], temperature)
    assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - expected)) <= TOLERANCE


def test_signatures_use_the_contract_names_dtypes_and_shapes(version_dir, manifest):
    classes = manifest["num_classes"]
    outputs = {
        OUTPUT_CLASS_IDS: ("int64", [-1]),
        OUTPUT_CLASS_NAMES: ("string", [-1]),
        OUTPUT_IN_DISTRIBUTION: ("bool", [-1]),
        OUTPUT_OOD_SCORE: ("float32", [-1]),
        OUTPUT_PROBABILITIES: ("float32", [-1, classes]),
    }
    assert savedmodel.read_signatures(str(version_dir)) == {
        SIGNATURE_BYTES: {"inputs": {INPUT_BYTES: ("string", [-1])}, "outputs": outputs},
        SIGNATURE_PIXELS: {"inputs": {INPUT_PIXELS: ("uint8", [-1, 32, 32, 3])}, "outputs": outputs},
    }


def test_manifest_copy_says_where_the_model_came_from(version_dir, manifest, trained_run):
    with open(version_dir / ASSETS_EXTRA / MANIFEST_FILE) as f:
        served = json.load(f)
    assert served["model"] == manifest["model"]
    assert served["class_names"] == manifest["class_names"]
    assert served["fingerprint"] == manifest["fingerprint"]
    assert served["format"] == manifests.FORMAT and set(served) == {f.name for f in dataclasses.fields(publications.Published)} | {"num_classes"}
    export = served["export"]
    assert export["model_name"] == "cifar10"
    assert export["version"] == 1
    assert export["run_dir"] == str(trained_run)
    assert export["exported"]
    assert set(export["signatures"]) == {SIGNATURE_PIXELS, SIGNATURE_BYTES}
    assert export["signatures"][SIGNATURE_PIXELS]["inputs"][INPUT_PIXELS] == {"dtype": "uint8", "shape": [-1, 32, 32, 3]}


def test_warmup_records_are_prediction_logs_that_the_model_answers(version_dir, loaded):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    seen = set()
    for record in tf.data.TFRecordDataset(str(version_dir / ASSETS_EXTRA / WARMUP_FILE)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        assert request.model_spec.name == "cifar10"
        signature = request.model_spec.signature_name
        seen.add(signature)
        # Replay it, as TF Serving will at load time: the inputs must fit the signature.
        inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
        result = loaded.signatures[signature](**inputs)
        assert result[OUTPUT_PROBABILITIES].shape[0] == next(iter(inputs.values())).shape[0]
    assert seen == {SIGNATURE_PIXELS, SIGNATURE_BYTES}


# --- Encoded images -------------------------------------------------------------------


def _constant(mode, colour, size):
    return Image.new(mode, size, colour)


@pytest.mark.parametrize(
    "image, fmt, pixels",
    [
        # Other sizes, grayscale and alpha: a constant colour stays exactly that colour through
        # any resize, so the result must equal serving_default's on a 32x32 patch of it.
        (_constant("RGB", (200, 40, 90), (57, 41)), "PNG", (200, 40, 90)),
        (_constant("RGB", (10, 220, 60), (96, 96)), "BMP", (10, 220, 60)),
        (_constant("L", 130, (16, 24)), "PNG", (130, 130, 130)),
        (_constant("RGBA", (30, 60, 240, 100), (32, 32)), "PNG", (30, 60, 240)),
    ],
    ids=["png-57x41", "bmp-96x96", "png-grayscale-16x24", "png-rgba"],
)
def test_predict_images_decodes_and_resizes(loaded, image, fmt, pixels):
    expected = _pixels(loaded, np.full((1, 32, 32, 3), pixels, dtype=np.uint8))
    result = _bytes(loaded, [_encode(image, fmt)])
    assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - expected[OUTPUT_PROBABILITIES])) <= TOLERANCE


def test_predict_images_takes_the_first_frame_of_a_gif(loaded, splits):
    # Few colours, so the GIF palette keeps every pixel exact.
    first = (splits.x_test[0] // 64 * 64).astype(np.uint8)
    second = 255 - first
    blob = _encode(Image.fromarray(first), "GIF", save_all=True, append_images=[Image.fromarray(second)])
    assert Image.open(io.BytesIO(blob)).n_frames == 2
    decoded = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
    np.testing.assert_array_equal(decoded, first)  # the palette really was lossless
    expected = _pixels(loaded, first[None])
    result = _bytes(loaded, [blob])
    assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - expected[OUTPUT_PROBABILITIES])) <= TOLERANCE


def test_predict_images_reads_jpeg_like_pillow(loaded, splits):
    blob = _encode(Image.fromarray(splits.x_test[1]), "JPEG", quality=90)
    pillow = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
    expected = _pixels(loaded, pillow[None])
    result = _bytes(loaded, [blob, blob])
    # Decoders may differ by one level here and there; the prediction must not move.
    assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - expected[OUTPUT_PROBABILITIES])) <= 1e-2
    np.testing.assert_array_equal(result[OUTPUT_CLASS_IDS], np.repeat(expected[OUTPUT_CLASS_IDS], 2))


# --- Versions -------------------------------------------------------------------------


def test_versions_count_up_and_are_never_overwritten(trained_run, tmp_path, capsys):
    models = tmp_path / "models"
    first = exporter.run(run_dir=str(trained_run), model_dir=str(models), name="cifar10", verbose=0)
    second = exporter.run(run_dir=str(trained_run), model_dir=str(models), name="cifar10", verbose=0)
    assert (first, second) == (str(models / "cifar10" / "1"), str(models / "cifar10" / "2"))

    assert exporter.main(["--run", str(trained_run), "--model-dir", str(models), "--version", "5"]) == 0
    out = capsys.readouterr().out
    assert f"signature_def['{SIGNATURE_BYTES}']" in out and f"{INPUT_PIXELS}: uint8 [None, 32, 32, 3]" in out

    saved_model = (models / "cifar10" / "2" / "saved_model.pb").read_bytes()
    assert exporter.main(["--run", str(trained_run), "--model-dir", str(models), "--version", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "already exists" in err
    assert (models / "cifar10" / "2" / "saved_model.pb").read_bytes() == saved_model
    assert sorted(os.listdir(models / "cifar10")) == ["1", "2", "5"]  # no temporary directories left


def test_weights_trained_under_mirrored_strategy_export(mirrored_run, tmp_path):
    import keras
    import tensorflow as tf

    run_dir = mirrored_run
    # A caller left a mixed-precision policy in place: export still builds in float32, and restores it.
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        version = exporter.run(run_dir=str(run_dir), model_dir=str(tmp_path / "models"), name="cifar10", verbose=0)
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    finally:
        keras.mixed_precision.set_global_policy(previous)
    with open(run_dir / MANIFEST_FILE) as f:
        manifest = json.load(f)
    from train import models

    images = models.fingerprint_images(manifest["fingerprint"]["seed"])
    result = _pixels(tf.saved_model.load(version), images)
    assert np.max(np.abs(result[OUTPUT_PROBABILITIES] - np.float32(manifest["fingerprint"]["outputs"]))) <= TOLERANCE


# --- Bad input ------------------------------------------------------------------------


def _no_manifest(run):
    os.remove(run / MANIFEST_FILE)


def _no_weights(run):
    os.remove(run / WEIGHTS_FILE)


def _corrupt_weights(run):
    data = (run / WEIGHTS_FILE).read_bytes()
    (run / WEIGHTS_FILE).write_bytes(data[: len(data) // 3])


def _other_architecture(run):
    import keras

    inputs = keras.Input((32, 32, 3))
    outputs = keras.layers.Dense(3, name="other")(keras.layers.Flatten()(inputs))
    keras.Model(inputs, outputs).save_weights(str(run / WEIGHTS_FILE))


def _other_class_count(run):
    from train import models

    models.build_model("seed_cnn", num_classes=5).save_weights(str(run / WEIGHTS_FILE))


def _edit_manifest(edit):
    """Change the run's manifest through the typed writer: ``edit`` takes a Manifest and returns the new one."""
    def damage(run):
        path = str(run / MANIFEST_FILE)
        manifests.write(path, edit(manifests.read(path)))

    return damage


def _unknown_model(manifest):
    return dataclasses.replace(manifest, model=manifests.ModelSpec("no_such_net"))


def _shifted_fingerprint(manifest):
    outputs = [list(row) for row in manifest.fingerprint.outputs]
    outputs[0][0] += 1e-3
    return dataclasses.replace(manifest, fingerprint=dataclasses.replace(manifest.fingerprint, outputs=outputs))


def _no_samples(run):
    os.remove(run / SAMPLES_FILE)


def _older_format(run):
    raw = json.loads((run / MANIFEST_FILE).read_text())
    raw["format"] = 2  # an older pipeline's run: read by no code path
    (run / MANIFEST_FILE).write_text(json.dumps(raw))


def _retrained_weights(run):
    # Same architecture, same classes, other values: only the fingerprint can tell.
    from train import models

    models.build_model("seed_cnn", num_classes=3).save_weights(str(run / WEIGHTS_FILE))


@pytest.mark.parametrize(
    "damage, message",
    [
        (_no_manifest, f"no {MANIFEST_FILE}"),
        (_no_weights, f"no {WEIGHTS_FILE}"),
        (_corrupt_weights, "cannot load"),
        (_other_architecture, "Layer 'input_bn' expected 4 variables"),
        (_other_class_count, "layer 'probabilities' has shape (512, 3) but the file holds (512, 5)"),
        (_edit_manifest(_unknown_model), "unknown model 'no_such_net'"),
        (_edit_manifest(_shifted_fingerprint), "max absolute difference 0.001"),
        (_retrained_weights, "sha256 differs"),
        (_no_samples, f"no {SAMPLES_FILE} in"),
        (_older_format, "has manifest format 2, not 4: it was made by an older version of this pipeline; rebuild it "
                        "with python -m train --output RUN --overwrite, then python -m export --run RUN"),
    ],
    ids=["no-manifest", "no-weights", "corrupt-weights", "other-architecture", "other-class-count",
         "unknown-model", "fingerprint-mismatch", "other-weights", "no-samples", "older-format"],
)
def test_bad_run_is_one_line_and_writes_nothing(trained_run, tmp_path, capsys, damage, message):
    run = copy_run(trained_run, tmp_path / "run")
    damage(run)
    models = tmp_path / "models"
    assert exporter.main(["--run", str(run), "--model-dir", str(models)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err
    assert not (models / "cifar10").exists()  # not even an empty model directory


def test_existing_version_is_refused_and_left_alone(trained_run, tmp_path, capsys):
    version = tmp_path / "models" / "cifar10" / "3"
    version.mkdir(parents=True)
    (version / "marker").write_text("keep me")
    assert exporter.main(["--run", str(trained_run), "--model-dir", str(tmp_path / "models"), "--version", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "already exists" in err
    assert os.listdir(version.parent) == ["3"] and os.listdir(version) == ["marker"]


def test_unwritable_model_dir_is_one_line(trained_run, tmp_path, capsys):
    # A file where the model directory should be: unwritable even for root, unlike chmod.
    blocker = tmp_path / "models"
    blocker.write_text("not a directory")
    assert exporter.main(["--run", str(trained_run), "--model-dir", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create") and err.count("\n") == 1
    assert blocker.read_text() == "not a directory"


# Root writes through directory permissions because it holds CAP_DAC_OVERRIDE (and
# CAP_DAC_READ_SEARCH, CAP_FOWNER), and CI runs as root. The export runs in a child process
# that drops those from its bounding set before it starts Python again: still uid 0, so it
# reads the code and the run it owns, but mode bits now bind it like any other user. As a
# normal user nothing is dropped (and nothing needs to be).
_WITHOUT_ROOT_POWERS = """
import ctypes, os, sys
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            sys.exit(f"cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}")
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
"""
_EXPORT_CAPTURING_STDERR = """
import contextlib, io, sys
with open("/proc/self/status") as status:
    effective = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
if effective & 0b1110:
    sys.exit(f"the export still runs with root's file-permission powers (CapEff {effective:x})")
from export.exporter import main
stderr = io.StringIO()  # what the CLI itself prints, without TensorFlow's C++ start-up lines
with contextlib.redirect_stderr(stderr):
    code = main(sys.argv[1:])
sys.stdout.write(stderr.getvalue())
sys.exit(code)
"""


def test_read_only_model_dir_is_one_line(trained_run, tmp_path):
    import subprocess
    import sys

    models = tmp_path / "models"
    (models / "cifar10").mkdir(parents=True)
    os.chmod(models / "cifar10", 0o555)
    try:
        child = subprocess.run(
            [sys.executable, "-c", _WITHOUT_ROOT_POWERS, _EXPORT_CAPTURING_STDERR,
             "--run", str(trained_run), "--model-dir", str(models)],
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True, timeout=600,
        )
    finally:
        os.chmod(models / "cifar10", 0o755)
    assert child.returncode == 2, child.stderr[-2000:]
    err = child.stdout
    assert err.startswith("error: cannot write in ") and err.count("\n") == 1, err
    assert "Permission denied" in err
    assert os.listdir(models / "cifar10") == []


def test_missing_run_directory_is_one_line(tmp_path, capsys):
    assert exporter.main(["--run", str(tmp_path / "nowhere"), "--model-dir", str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "models").exists()


def test_skip_if_exported_names_the_version_holding_these_weights(trained_run, model_base, capsys):
    before = sorted(os.listdir(model_base))
    code = exporter.main(["--run", str(trained_run), "--model-dir", str(model_base.parent), "--model-name",
                          model_base.name, "--skip-if-exported"])
    assert code == 0
    assert capsys.readouterr().out.strip() == f"already exported as {model_base / '1'}"
    assert sorted(os.listdir(model_base)) == before, "nothing new was written"


def _arrays_file(path, **arrays):
    """``arrays`` saved at ``path``, and the manifest's kind of entry describing that file."""
    np.savez(path, **arrays)
    return types.SimpleNamespace(file=path.name, sha256=sha256_file(path))


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"test_images": np.zeros((2, 32, 32, 3), np.float32), "test_labels": np.zeros(2)},
         "holds float32 test_images [2, 32, 32, 3] and test_labels [2], not uint8 [N, 32, 32, 3] and [N], N > 0"),
        ({"test_images": np.zeros((2, 32, 32, 3), np.uint8), "test_labels": np.zeros(3)}, "test_labels [3], not uint8"),
        ({"test_images": np.zeros((0, 32, 32, 3), np.uint8), "test_labels": np.zeros(0)}, "N > 0"),
        ({"test_images": np.zeros((2, 32, 32, 3), np.uint8)}, "cannot read"),
    ],
    ids=["float-images", "labels-miscounted", "no-images", "no-labels"],
)
def test_a_runs_image_file_that_is_not_images_and_labels_is_refused_saying_what_it_holds(tmp_path, arrays, message):
    from export import ExportError, read_images

    entry = _arrays_file(tmp_path / "samples.npz", **arrays)
    with pytest.raises(ExportError, match=re.escape(message)):
        read_images(tmp_path, entry, "test_")


def test_a_runs_image_file_is_read_only_as_the_manifest_describes_it(tmp_path):
    from export import ExportError, read_images

    entry = _arrays_file(tmp_path / "holdout.npz", images=np.full((3, 32, 32, 3), 7, np.uint8), labels=np.arange(3))
    images, labels = read_images(tmp_path, entry)
    assert images.dtype == np.uint8 and images.shape == (3, 32, 32, 3) and labels.dtype == np.int64
    np.savez(tmp_path / "holdout.npz", images=images[:2], labels=labels[:2])
    with pytest.raises(ExportError, match=r"sha256 differs"):
        read_images(tmp_path, entry)
    os.remove(tmp_path / "holdout.npz")
    with pytest.raises(ExportError, match=r"the run's manifest names holdout.npz, but .* is missing"):
        read_images(tmp_path, entry)
