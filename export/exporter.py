"""Turn a finished training run into a versioned SavedModel that TF Serving can load.

Typical usage::

    python -m export --run runs/seed --model-dir models
    python -m export --run runs/seed --model-dir models --name cifar10 --version 3

This writes ``models/NAME/N/`` (``N``: the next free integer unless ``--version`` says
otherwise; an existing version is never overwritten) holding:

* ``saved_model.pb`` and ``variables/`` with two signatures, both returning
  ``probabilities`` float32 ``[None, C]``, ``class_ids`` int64 ``[None]`` and
  ``class_names`` string ``[None]``:

  - ``serving_default``: ``images``, uint8 ``[None, 32, 32, 3]``, raw RGB 0-255;
  - ``predict_images``: ``image_bytes``, string ``[None]``, encoded PNG, JPEG, GIF
    (first frame) or BMP, sent over REST as ``{"b64": ...}``. Decoded to RGB in the
    graph; any other size is resized to 32x32 with ``tf.image.resize(method=
    "bilinear", antialias=True)`` (``contract.RESIZE_METHOD``, the server's Pillow
    BILINEAR) and rounded back to 0-255 integers. 32x32 images are never resized,
    so both signatures give identical predictions on them.

* ``assets.extra/tf_serving_warmup_requests`` - ``PredictionLog`` records for both
  signatures, which TF Serving replays before it reports the model available;
* ``assets.extra/manifest.json`` - the training manifest plus an ``export`` section
  (model name, version, signatures, export time, the LiteRT models' checks): where a
  served model came from;
* ``model.tflite`` and ``model.int8.tflite`` - ``serving_default`` as LiteRT models, float32
  and int8, each published only when it agrees with the SavedModel on the run's test sample
  (``export/litert.py`` says how, and what happens when one does not).

Before anything becomes visible the model is proved to be the trained one: rebuilt
with the registry's builder, its outputs on the manifest's probe batch must match the
recorded ones within 1e-5, and the written SavedModel, reloaded with plain
``tf.saved_model.load``, must agree with it on both signatures. The version is
written to a hidden temporary directory next to its final place and renamed in only
after all checks pass, so a TF Serving polling ``models/NAME/`` never sees half a model.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
import warnings

from contract import (
    ASSETS_EXTRA,
    CHANNELS,
    DEFAULT_MODEL_NAME,
    IMAGE_SIZE,
    INPUT_BYTES,
    INPUT_PIXELS,
    MANIFEST_FILE,
    OUTPUT_CLASS_IDS,
    OUTPUT_CLASS_NAMES,
    OUTPUT_PROBABILITIES,
    OUTPUTS,
    RESIZE_METHOD,
    SIGNATURE_BYTES,
    SIGNATURE_PIXELS,
    WARMUP_FILE,
    WEIGHTS_FILE,
    sha256_file,
)
from export import litert

DEFAULT_MODEL_DIR = "models"
TOLERANCE = 1e-5  # max absolute difference allowed between probabilities, float32
WARMUP_BATCH_SIZES = (1, 8)  # one record per signature and batch size
EXPORT_FORMAT = 1
_TEMP_PREFIX = ".export-"  # non-numeric, so TF Serving ignores it while it is being written


class ExportError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""


def run(run_dir, model_dir=DEFAULT_MODEL_DIR, name=DEFAULT_MODEL_NAME, version=None, verbose=1):
    """Export the run in ``run_dir`` to ``model_dir/name/version`` and return that directory.

    Args:
      version: the version number to write; None picks one more than the highest present.
      verbose: 0 prints nothing; 1 prints a line and the signature summary.

    Raises:
      ExportError: bad input (missing or mismatched run files, an existing version, an
        unwritable directory). Nothing is left behind in ``model_dir`` when it is raised.
    """
    import keras
    import numpy as np

    manifest = _read_manifest(run_dir)
    weights_path = os.path.join(run_dir, WEIGHTS_FILE)
    if not os.path.isfile(weights_path):
        raise ExportError(f"no {WEIGHTS_FILE} in {run_dir}")
    if version is not None and version < 1:
        raise ExportError(f"version must be a positive integer, not {version}")
    if not name or os.sep in name or name.startswith(".") or name != name.strip():
        raise ExportError(f"invalid model name {name!r}")
    if version is not None and os.path.lexists(os.path.join(model_dir, name, str(version))):
        # Checked again just before the rename; this early check only saves the user a wait.
        raise ExportError(f"{os.path.join(os.path.abspath(model_dir), name, str(version))} already exists; "
                          "versions are never overwritten")

    # The export graph is float32 whatever training used: the weights are float32, and
    # serving has no reason to lose precision. The policy is global, so restore it.
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = _rebuild(manifest, weights_path)
        probe = _probe(manifest)
        expected = model(probe.astype(np.float32), training=False).numpy()
        _check_fingerprint(manifest, expected, weights_path)
        return _write_version(model, manifest, probe, expected, run_dir, model_dir, name, version, verbose)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def _read_manifest(run_dir):
    """The run's manifest as a dict, validated by :mod:`contract.manifest` (one definition for every stage)."""
    from contract import manifest as manifests

    path = os.path.join(run_dir, MANIFEST_FILE)
    if not os.path.isdir(run_dir):
        raise ExportError(f"run directory {run_dir} does not exist")
    if not os.path.isfile(path):
        raise ExportError(f"no {MANIFEST_FILE} in {run_dir} (is training finished?)")
    try:
        return manifests.read(path).to_dict()
    except manifests.ManifestError as exc:
        raise ExportError(str(exc)) from None


def _rebuild(manifest, weights_path):
    """The trained architecture from the registry, with the run's weights loaded."""
    import tensorflow as tf

    from train import models

    spec = manifest["model"]
    try:
        # One device: tests (and multi-GPU hosts) may have several, and export needs none of them.
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model = models.build_model(spec["name"], manifest["num_classes"], **spec.get("kwargs", {}))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    try:
        # Keras warns about parts of the file it skips; the error below (or the fingerprint
        # check) already says so, on the one line a user reads.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.load_weights(weights_path)
    except Exception as exc:  # h5py and Keras raise many types for a bad file; all mean the same here
        raise ExportError(f"cannot load {weights_path} into {spec['name']} with "
                          f"{manifest['num_classes']} classes: {_load_error(exc)}") from None
    return model


def _load_error(exc):
    """The useful part of Keras's multi-paragraph load_weights error, on one line."""
    text = " ".join(str(exc).split())
    found = re.search(r"object <\w+ name=([^ ,>]+)[^>]*>: (.*)", text)
    if found:
        layer, detail = found.groups()
        shapes = re.search(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))", detail)
        if shapes:
            return f"layer {layer!r} has shape {shapes[1]} but the file holds {shapes[2]}"
        # e.g. "Layer 'input_bn' expected 4 variables, but received 0 variables during loading"
        return detail.split(". ")[0]
    return text[:200] or type(exc).__name__


def _probe(manifest):
    import numpy as np

    from train import models

    fingerprint = manifest["fingerprint"]
    probe = models.probe_batch(fingerprint["seed"], count=fingerprint["shape"][0])
    recorded = fingerprint.get("inputs_sha256")
    # The probe is regenerated from its seed; if NumPy ever changed the stream, comparing
    # outputs would blame the weights for what the inputs did.
    if recorded and models.probe_digest(probe) != recorded:
        raise ExportError("the probe batch regenerated from the manifest's seed differs from the one "
                          "training used (inputs_sha256 mismatch); cannot verify the weights")
    return np.asarray(probe, dtype=np.uint8)


def _check_fingerprint(manifest, outputs, weights_path):
    import numpy as np

    recorded = np.asarray(manifest["fingerprint"]["outputs"], dtype=np.float32)
    if recorded.shape != outputs.shape:
        raise ExportError(f"model outputs have shape {list(outputs.shape)} on the probe batch but the "
                          f"manifest recorded {list(recorded.shape)}")
    diff = float(np.max(np.abs(outputs.astype(np.float32) - recorded)))
    if not diff <= TOLERANCE:  # also catches NaN
        hint = ""
        if manifest.get("weights", {}).get("sha256") not in (None, sha256_file(weights_path)):
            hint = f"; {WEIGHTS_FILE} is not the file the manifest describes (sha256 differs)"
        raise ExportError(f"rebuilt model does not reproduce the manifest's probe outputs: max absolute "
                          f"difference {diff:.3g} > {TOLERANCE:g}{hint}")


def _write_version(model, manifest, probe, expected, run_dir, model_dir, name, version, verbose):
    base = os.path.join(os.path.abspath(model_dir), name)
    created_base = not os.path.isdir(base)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {base}: {exc.strerror or exc}") from None
    if version is None:
        version = 1 + max(_versions(base), default=0)
    final = os.path.join(base, str(version))
    tmp = None
    try:
        if os.path.lexists(final):
            raise ExportError(f"{final} already exists; versions are never overwritten")
        try:
            tmp = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{version}-", dir=base)
        except OSError as exc:
            raise ExportError(f"cannot write in {base}: {exc.strerror or exc}") from None
        # The SavedModel is saved into a subdirectory so mkdtemp's private mode never leaks
        # into the published version directory.
        staging = os.path.join(tmp, str(version))
        _save(model, manifest["class_names"], staging)
        signatures = _verify(staging, probe, expected, manifest["class_names"])
        lite = litert.export(staging, run_dir, probe, expected,
                             samples_sha256=(manifest.get("samples") or {}).get("sha256"), verbose=verbose)
        _write_assets(staging, manifest, name, version, signatures, run_dir, probe, lite)
        if os.path.lexists(final):  # someone else exported this version meanwhile
            raise ExportError(f"{final} already exists; versions are never overwritten")
        os.rename(staging, final)
    except OSError as exc:
        raise ExportError(f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if created_base and not os.listdir(base):
            os.rmdir(base)
    if verbose:
        print(f"exported {manifest['model']['name']} from {run_dir} to {final}")
        print(format_signatures(signatures))
    return final


def _versions(base):
    return [int(entry) for entry in os.listdir(base) if entry.isdigit()]


def _save(model, class_names, path):
    """Write ``model`` with both serving signatures through Keras's ExportArchive."""
    import keras
    import tensorflow as tf

    names = tf.constant(list(class_names), dtype=tf.string)

    def predict(pixels):
        # Cast, not normalise: scaling is the model's own first layer.
        probabilities = model(tf.cast(pixels, tf.float32), training=False)
        probabilities = tf.cast(probabilities, tf.float32)
        class_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {
            OUTPUT_PROBABILITIES: probabilities,
            OUTPUT_CLASS_IDS: class_ids,
            OUTPUT_CLASS_NAMES: tf.gather(names, class_ids),
        }

    # Argument names are the signature's input keys; TensorSpec names say the same.
    def serve_pixels(images):
        return predict(images)

    def serve_bytes(image_bytes):
        pixels = tf.map_fn(_decode, image_bytes, fn_output_signature=tf.TensorSpec(
            [IMAGE_SIZE, IMAGE_SIZE, CHANNELS], tf.uint8))
        return predict(pixels)

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(SIGNATURE_PIXELS, serve_pixels, input_signature=[
        tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], tf.uint8, name=INPUT_PIXELS)])
    archive.add_endpoint(SIGNATURE_BYTES, serve_bytes, input_signature=[
        tf.TensorSpec([None], tf.string, name=INPUT_BYTES)])
    archive.write_out(path, verbose=False)


def _decode(data):
    """One encoded image to uint8 RGB 32x32, as the server's Pillow path would give it."""
    import tensorflow as tf

    # expand_animations=False: a GIF gives its first frame, [H, W, 3] like the others;
    # channels=3 turns grayscale and RGBA into RGB.
    image = tf.io.decode_image(data, channels=CHANNELS, expand_animations=False, dtype=tf.uint8)
    shape = tf.shape(image)
    same_size = tf.logical_and(tf.equal(shape[0], IMAGE_SIZE), tf.equal(shape[1], IMAGE_SIZE))

    def resize():
        resized = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method=RESIZE_METHOD, antialias=True)
        # Back to whole 0-255 pixels, as Pillow returns them, so both resize paths feed the
        # model the same kind of input.
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    # Skipping the resize for 32x32 images makes this path bit-identical to serving_default.
    image = tf.cond(same_size, lambda: image, resize)
    return tf.ensure_shape(image, [IMAGE_SIZE, IMAGE_SIZE, CHANNELS])


def _verify(path, probe, expected, class_names):
    """Reload ``path`` without Keras and check both signatures; return their summary."""
    import numpy as np
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    pngs = tf.stack([tf.io.encode_png(image) for image in probe])  # lossless, so identical pixels
    calls = {
        SIGNATURE_PIXELS: (INPUT_PIXELS, tf.constant(probe)),
        SIGNATURE_BYTES: (INPUT_BYTES, pngs),
    }
    want_ids = np.argmax(expected, axis=-1)
    want_names = [class_names[i] for i in want_ids]
    for signature, (key, value) in calls.items():
        if signature not in loaded.signatures:
            raise ExportError(f"written SavedModel lacks signature {signature!r}")
        result = loaded.signatures[signature](**{key: value})
        if sorted(result) != sorted(OUTPUTS):
            raise ExportError(f"signature {signature!r} returns {sorted(result)}, expected {sorted(OUTPUTS)}")
        diff = float(np.max(np.abs(result[OUTPUT_PROBABILITIES].numpy() - expected)))
        if not diff <= TOLERANCE:
            raise ExportError(f"reloaded signature {signature!r} disagrees with the Keras model: "
                              f"max absolute difference {diff:.3g} > {TOLERANCE:g}")
        if not np.array_equal(result[OUTPUT_CLASS_IDS].numpy(), want_ids):
            raise ExportError(f"reloaded signature {signature!r} returns other class ids than the Keras model")
        got_names = [n.decode() for n in result[OUTPUT_CLASS_NAMES].numpy()]
        if got_names != want_names:
            raise ExportError(f"reloaded signature {signature!r} returns other class names than the manifest's")
    return read_signatures(path)


def read_signatures(path):
    """The serving signatures in ``path/saved_model.pb``, as TF Serving sees them.

    Returns ``{signature: {"inputs": {key: (dtype, shape)}, "outputs": {...}}}`` where
    dtype is a name such as ``"uint8"`` and shape a list with -1 for unknown sizes.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    signature_defs = saved_model.meta_graphs[0].signature_def

    def describe(tensors):
        return {
            key: (tf.dtypes.as_dtype(info.dtype).name,
                  [-1 if info.tensor_shape.unknown_rank else d.size for d in info.tensor_shape.dim])
            for key, info in sorted(tensors.items())
        }

    return {
        name: {"inputs": describe(sig.inputs), "outputs": describe(sig.outputs)}
        for name, sig in sorted(signature_defs.items())
        if not name.startswith("__")  # TF's internal __saved_model_init_op
    }


def format_signatures(signatures):
    """A ``saved_model_cli show``-like listing of :func:`read_signatures`' result."""
    lines = []
    for name, sig in signatures.items():
        lines.append(f"signature_def[{name!r}]:")
        for kind in ("inputs", "outputs"):
            lines.append(f"  {kind}:")
            for key, (dtype, shape) in sig[kind].items():
                lines.append(f"    {key}: {dtype} {_shape_text(shape)}")
    return "\n".join(lines)


def _shape_text(shape):
    return "[" + ", ".join("None" if d == -1 else str(d) for d in shape) + "]"


def _write_assets(path, manifest, name, version, signatures, run_dir, probe, lite=None):
    extra = os.path.join(path, ASSETS_EXTRA)
    os.makedirs(extra, exist_ok=True)
    _write_warmup(os.path.join(extra, WARMUP_FILE), name, probe)
    served = dict(manifest)
    served["export"] = {
        "format": EXPORT_FORMAT,
        "model_name": name,
        "version": version,
        "architecture": manifest["model"]["name"],
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "run_dir": os.path.abspath(run_dir),
        "resize": f"tf.image.resize(method={RESIZE_METHOD!r}, antialias=True), skipped for "
                  f"{IMAGE_SIZE}x{IMAGE_SIZE} inputs",
        "signatures": {
            sig: {kind: {key: {"dtype": dtype, "shape": shape} for key, (dtype, shape) in tensors.items()}
                  for kind, tensors in desc.items()}
            for sig, desc in signatures.items()
        },
    }
    if lite is not None:
        served["export"]["litert"] = lite  # export/litert.py: what was checked, published or refused, and why
    with open(os.path.join(extra, MANIFEST_FILE), "w") as f:
        json.dump(served, f, indent=2)
        f.write("\n")


def _write_warmup(path, name, probe):
    """PredictionLog records for both signatures, replayed by TF Serving before it serves."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    with tf.io.TFRecordWriter(path) as writer:
        for size in WARMUP_BATCH_SIZES:
            batch = probe[:size]
            pngs = [tf.io.encode_png(image).numpy() for image in batch]
            for signature, key, tensor in (
                (SIGNATURE_PIXELS, INPUT_PIXELS, tf.make_tensor_proto(batch, dtype=tf.uint8)),
                (SIGNATURE_BYTES, INPUT_BYTES, tf.make_tensor_proto(pngs, dtype=tf.string, shape=[len(pngs)])),
            ):
                request = predict_pb2.PredictRequest(
                    model_spec=model_pb2.ModelSpec(name=name, signature_name=signature))
                request.inputs[key].CopyFrom(tensor)
                log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
                writer.write(log.SerializeToString())



def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser():
    p = argparse.ArgumentParser(prog="python -m export", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, metavar="DIR",
                   help=f"finished training run holding {MANIFEST_FILE} and {WEIGHTS_FILE}")
    p.add_argument("--model-dir", default=DEFAULT_MODEL_DIR,
                   help="where versioned models go, as models/NAME/N/ (default: %(default)s)")
    p.add_argument("--name", default=DEFAULT_MODEL_NAME,
                   help="model name, TF Serving's MODEL_NAME (default: %(default)s)")
    p.add_argument("--version", type=_positive_int,
                   help="version number to write; never overwrites one (default: the next free number)")
    p.add_argument("--skip-if-exported", action="store_true",
                   help="do nothing when a version under MODEL_DIR/NAME already holds these weights")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    return p


def exported_version(run_dir, model_dir, name):
    """The version directory under ``model_dir/name`` already published from the run's weights, or None."""
    import glob

    from contract import manifest as manifests

    weights = _read_manifest(run_dir)["weights"]["sha256"]
    for path in sorted(glob.glob(os.path.join(model_dir, name, "*", ASSETS_EXTRA, MANIFEST_FILE))):
        try:
            if manifests.read(path).weights.sha256 == weights:
                return os.path.dirname(os.path.dirname(path))
        except manifests.ManifestError:
            continue  # a version this code cannot read was not made from this run
    return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        existing = exported_version(args.run, args.model_dir, args.name) if args.skip_if_exported else None
        if existing:
            if not args.quiet:
                print(f"already exported as {existing}")
            return 0
        run(run_dir=args.run, model_dir=args.model_dir, name=args.name, version=args.version,
            verbose=0 if args.quiet else 1)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
