"""Turn a finished training run into a versioned SavedModel that TF Serving can load.

Typical usage::

    python -m export --run runs/seed --model-dir models
    python -m export --run runs/seed --model-dir models --model-name cifar10 --version 3

This writes ``models/NAME/N/`` (``N``: the next free integer unless ``--version`` says
otherwise; an existing version is never overwritten) holding:

* ``saved_model.pb`` and ``variables/`` with two signatures, both returning
  ``probabilities`` float32 ``[None, C]``, ``class_ids`` int64 ``[None]``,
  ``class_names`` string ``[None]``, ``ood_score`` float32 ``[None]`` and, for a run trained
  with ``--holdout``, ``in_distribution`` bool ``[None]`` (export/calibration.py: the
  probabilities are divided by a temperature fitted on the held-out images, the score is the
  energy of the logits, and the threshold lets 98% of the held-out images pass):

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
  (model name, version, signatures, export time, the LiteRT models' checks) and a
  ``confidence`` section (temperature and threshold), written through
  :class:`contract.published.Published`: where a served model came from, and how it answers;
* ``model.tflite`` and ``model.int8.tflite`` - ``serving_default`` as LiteRT models, float32
  and int8, each published only when it agrees with the SavedModel on the run's test sample
  (``export/litert.py`` says how, and what happens when one does not).

Before anything becomes visible the model is proved to be the trained one: rebuilt
with the registry's builder, its outputs on the manifest's fingerprint images must match the
recorded ones within 1e-5, and the written SavedModel, reloaded with plain
``tf.saved_model.load``, must agree with it on both signatures. The version is
written to a hidden temporary directory next to its final place and renamed in only
after all checks pass, so a TF Serving polling ``models/NAME/`` never sees half a model.
"""

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time

from contract import (
    ASSETS_EXTRA,
    DEFAULT_MODEL_NAME,
    DEFAULT_SERVING_RUNTIME,
    IMAGE_SIZE,
    MANIFEST_FILE,
    RESIZE_METHOD,
    WARMUP_FILE,
    WEIGHTS_FILE,
    sha256_file,
)
from contract import manifest as manifests
from contract import published as publications
from contract.arguments import add_renamed, positive_int
from export import ExportError, calibration, litert
from export.savedmodel import format_signatures, save, write_warmup
from export.verify import TOLERANCE, check_fingerprint, fingerprint_images, rebuild, verify_saved_model

DEFAULT_MODEL_DIR = "models"
_TEMP_PREFIX = ".export-"  # non-numeric, so TF Serving ignores it while it is being written
#: A staging directory untouched this long was left by an export that died (SIGKILL, a lost machine):
#: the next export removes it. Far longer than any export takes, so a running one is never touched.
STALE_AFTER_S = 3600


def run(run_dir, model_dir=DEFAULT_MODEL_DIR, name=DEFAULT_MODEL_NAME, version=None, verbose=1):
    """Export the run in ``run_dir`` to ``model_dir/name/version`` and return that directory.

    Args:
      version: the version number to write; None picks one more than the highest present.
      verbose: 0 prints nothing; 1 prints a line and the signature summary.

    Raises:
      ExportError: bad input (missing or mismatched run files, an existing version, an
        unwritable directory). Nothing is left behind in ``model_dir`` when it is raised.
    """
    # Bad input is reported before Keras (and TensorFlow) load: a mistyped --run costs no seconds.
    manifest = _read_manifest(run_dir)
    weights_path = os.path.join(run_dir, WEIGHTS_FILE)
    if not os.path.isfile(weights_path):
        raise ExportError(f"no {WEIGHTS_FILE} in {run_dir}")
    samples_path = os.path.join(run_dir, manifest.samples.file)
    if not os.path.isfile(samples_path):
        raise ExportError(f"no {manifest.samples.file} in {run_dir}, which its manifest names (LiteRT models are "
                          "checked on it); train the run again")
    if sha256_file(samples_path) != manifest.samples.sha256:
        raise ExportError(f"{samples_path} is not the file the run's manifest describes (sha256 differs)")
    if version is not None and version < 1:
        raise ExportError(f"version must be a positive integer, not {version}")
    if not name or os.sep in name or name.startswith(".") or name != name.strip():
        raise ExportError(f"invalid model name {name!r}")
    if version is not None and os.path.lexists(os.path.join(model_dir, name, str(version))):
        # Checked again just before the rename; this early check only saves the user a wait.
        raise ExportError(f"{os.path.join(os.path.abspath(model_dir), name, str(version))} already exists; "
                          "versions are never overwritten")
    import keras
    import numpy as np

    from contract import confidence as confidence_rules
    from train import models

    # The export graph is float32 whatever training used: the weights are float32, and
    # serving has no reason to lose precision. The policy is global, so restore it.
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = rebuild(manifest, weights_path)
        images = fingerprint_images(manifest)
        expected = model(images.astype(np.float32), training=False).numpy()
        check_fingerprint(manifest, expected, weights_path)
        logits_model = models.logits_model(model)
        image_logits = calibration.logits(logits_model, images)
        if not np.max(np.abs(confidence_rules.softmax(image_logits) - expected)) <= TOLERANCE:
            raise ExportError("the model's logits do not give its probabilities on the fingerprint images "
                              "(train.models.logits_model does not fit this architecture)")
        confidence = calibration.fit(logits_model, manifest, run_dir)
        return _write_version(logits_model, manifest, images, calibration.outputs(confidence, image_logits), confidence,
                              run_dir, model_dir, name, version, verbose)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def _read_manifest(run_dir):
    """The run's :class:`contract.manifest.Manifest` (one definition for every stage)."""
    path = os.path.join(run_dir, MANIFEST_FILE)
    if not os.path.isdir(run_dir):
        raise ExportError(f"run directory {run_dir} does not exist")
    if not os.path.isfile(path):
        raise ExportError(f"no {MANIFEST_FILE} in {run_dir} (is training finished?)")
    try:
        return manifests.read(path)
    except manifests.ManifestError as exc:
        raise ExportError(str(exc)) from None


def _say_confidence(confidence, verbose):
    if not verbose:
        return
    if confidence.ood.threshold is None:
        print(f"probabilities not calibrated and no out-of-distribution threshold: {confidence.why}")
        return
    held = confidence.held_out
    images = confidence.fitted_on.images
    if confidence.calibrated:
        print(f"temperature {confidence.temperature:.4f} fitted on {images} held-out images (NLL "
              f"{held.nll.before:.4f} -> {held.nll.after:.4f}, ECE {held.ece.before:.4f} -> {held.ece.after:.4f})")
    else:
        print(f"probabilities not calibrated: {confidence.why}")
    print(f"out-of-distribution threshold {confidence.ood.threshold:.4f}: {confidence.ood.held_out_passing:.1%} of "
          f"{images} held-out images pass")


def _write_version(model, manifest, images, expected, confidence, run_dir, model_dir, name, version, verbose):
    base = os.path.join(os.path.abspath(model_dir), name)
    created_base = not os.path.isdir(base)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {base}: {exc.strerror or exc}") from None
    clean_stale(base, verbose=verbose)
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
        save(model, manifest.class_names, staging, confidence.temperature, confidence.ood.threshold)
        signatures = verify_saved_model(staging, images, expected, manifest.class_names)
        lite = litert.export(staging, run_dir, manifest.samples, verbose=verbose)
        _write_assets(staging, manifest, name, version, signatures, run_dir, images, lite, confidence)
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
        print(f"exported {manifest.model.name} from {run_dir} to {final}")
        _say_confidence(confidence, verbose)
        print(format_signatures(signatures))
    return final


def clean_stale(base, now=None, verbose=0):
    """Remove the ``.export-*`` staging directories under ``base`` that no export has touched for ``STALE_AFTER_S``."""
    now = time.time() if now is None else now
    for entry in os.scandir(base):
        if not (entry.name.startswith(_TEMP_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        try:
            touched = max([entry.stat(follow_symlinks=False).st_mtime]
                          + [e.stat(follow_symlinks=False).st_mtime for e in os.scandir(entry.path)])
        except OSError:  # removed meanwhile, or unreadable: not ours to judge
            continue
        if now - touched > STALE_AFTER_S:
            shutil.rmtree(entry.path, ignore_errors=True)
            if verbose:
                print(f"removed {entry.path}, left by an export that did not finish")


def _versions(base):
    return [int(entry) for entry in os.listdir(base) if entry.isdigit()]


def _write_assets(path, manifest, name, version, signatures, run_dir, images, lite, confidence):
    """TF Serving's warmup records (replaying ``images``) and the published manifest, in ``path/assets.extra``."""
    extra = os.path.join(path, ASSETS_EXTRA)
    os.makedirs(extra, exist_ok=True)
    write_warmup(os.path.join(extra, WARMUP_FILE), name, images)
    export = publications.Export(
        model_name=name,
        version=version,
        exported=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        run_dir=os.path.abspath(run_dir),
        resize=f"tf.image.resize(method={RESIZE_METHOD!r}, antialias=True), skipped for {IMAGE_SIZE}x{IMAGE_SIZE} inputs",
        signatures={
            sig: publications.Signature(**{kind: {key: publications.Tensor(dtype=dtype, shape=list(shape))
                                               for key, (dtype, shape) in tensors.items()}
                                        for kind, tensors in desc.items()})
            for sig, desc in signatures.items()
        },
        litert=lite,  # export/litert.py: what was checked, published or refused, and why
    )
    manifests.write(os.path.join(extra, MANIFEST_FILE), publications.Published.of(manifest, export, confidence))


def build_parser():
    p = argparse.ArgumentParser(prog="python -m export", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, metavar="DIR",
                   help=f"finished training run holding {MANIFEST_FILE} and {WEIGHTS_FILE}")
    p.add_argument("--model-dir", default=DEFAULT_MODEL_DIR,
                   help="where versioned models go, as models/NAME/N/ (default: %(default)s)")
    add_renamed(p, "--model-name", "--name", default=DEFAULT_MODEL_NAME,
                help="model name, as in MODEL_DIR/NAME/N and TF Serving's MODEL_NAME (default: %(default)s)")
    p.add_argument("--version", type=positive_int,
                   help="version number to write; never overwrites one (default: the next free number)")
    p.add_argument("--skip-if-exported", action="store_true",
                   help="do nothing when a version under MODEL_DIR/NAME already holds these weights")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    return p


def exported_version(run_dir, model_dir, name):
    """The version directory under ``model_dir/name`` already published from the run's weights, or None."""
    import glob

    weights = _read_manifest(run_dir).weights.sha256
    for path in sorted(glob.glob(os.path.join(model_dir, name, "*", ASSETS_EXTRA, MANIFEST_FILE))):
        try:
            if publications.read_published(path).weights.sha256 == weights:
                return os.path.dirname(os.path.dirname(path))
        except manifests.ManifestError:
            continue  # a version this code cannot read was not made from this run
    return None


#: Exit status when the version was published but the default serving runtime's model was refused.
EXIT_DEFAULT_RUNTIME_REFUSED = 3


def default_runtime_refusal(version_dir):
    """Why export refused the default serving runtime's model in ``version_dir``, or None when it published it."""
    served = publications.read_published(os.path.join(version_dir, ASSETS_EXTRA, MANIFEST_FILE))
    check = served.export.litert.runtimes[DEFAULT_SERVING_RUNTIME]
    return None if check.published else check.reason


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        existing = exported_version(args.run, args.model_dir, args.model_name) if args.skip_if_exported else None
        if existing:
            if not args.quiet:
                print(f"already exported as {existing}")
            return 0
        final = run(run_dir=args.run, model_dir=args.model_dir, name=args.model_name, version=args.version,
                    verbose=0 if args.quiet else 1)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refused = default_runtime_refusal(final)
    if refused:
        # Published for the savedmodel runtime and TF Serving, but a server on its default would
        # skip it: a script or a Job must stop here, not carry on serving older weights.
        print(f"error: {final} is published without its {DEFAULT_SERVING_RUNTIME} model, which servers use by "
              f"default ({refused}); serve it with SERVE_RUNTIME=savedmodel or TF Serving, or export again",
              file=sys.stderr)
        return EXIT_DEFAULT_RUNTIME_REFUSED
    return 0
