"""The model every server of bench/peers serves, and the images every request carries.

Weights do not change a model's speed, so the benchmark trains its architecture (``seed_cnn``, light, so the
request path dominates; or the main job's default, ``airbench_muon``, whose six test-time views make it many times
heavier) for one epoch on a small synthetic data set of CIFAR-10's ten classes (``python -m train``, then
``python -m export``) and caches the export under ``bench/peers/.cache/ARCHITECTURE/models/cifar10/``; a real
export is passed with ``--model-dir``. Request images are uint8 [32, 32, 3] pixels drawn with a
fixed seed (the synthetic test images), the same for every server.
"""

import io
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CACHE = os.path.join(HERE, ".cache")
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def synthetic_images(per_class, seed, size=32):
    """uint8 [N, size, size, 3] images of ten classes (a tint and a stripe period each, plus noise), labels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    images, labels = [], []
    for label in range(len(CLASSES)):
        tint = rng.integers(40, 220, size=3)
        pattern = ((yy + xx * (label % 3)) // (2 + label)) % 2
        for _ in range(per_class):
            image = tint[None, None, :] * (0.5 + 0.5 * pattern[..., None]) + rng.normal(0, 20, size=(size, size, 3))
            images.append(np.clip(image, 0, 255).astype(np.uint8))
            labels.append(label)
    order = rng.permutation(len(images))
    return np.stack(images)[order], np.asarray(labels)[order]


def request_images(count=64, seed=1):
    """The ``count`` images every request draws from (the synthetic test images; fixed seed)."""
    images, _ = synthetic_images(-(-count // len(CLASSES)), seed)
    return images[:count]


def png(image):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_tree(root):
    for split, (per_class, seed) in {"train": (40, 0), "test": (10, 1)}.items():
        images, labels = synthetic_images(per_class, seed)
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = os.path.join(root, split, CLASSES[label])
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i:05d}.png"), "wb") as f:
                f.write(png(image))


def version_dir(model_dir):
    """The newest version folder ``N/`` of ``model_dir`` that holds ``model.tflite``."""
    versions = sorted(
        (int(n) for n in os.listdir(model_dir) if n.isdigit() and os.path.isfile(os.path.join(model_dir, n, "model.tflite"))),
    )
    if not versions:
        raise SystemExit(f"{model_dir} has no version N/ holding model.tflite (pass the models/NAME/ root)")
    return os.path.join(model_dir, str(versions[-1]))


#: Per architecture, the training flags of its benchmark model: one epoch, batches the 400 images can fill.
ARCHITECTURES = {"seed_cnn": [], "airbench_muon": ["--batch-size", "100"]}


def ensure_model(model_dir=None, log=print, architecture="seed_cnn"):
    """``models/NAME/`` to serve: ``model_dir`` if given, else the cached export of ``architecture`` (made on first use)."""
    if model_dir:
        version_dir(model_dir)
        return os.path.abspath(model_dir)
    cache = os.path.join(CACHE, architecture)
    models = os.path.join(cache, "models")
    model_dir = os.path.join(models, "cifar10")
    if os.path.isdir(model_dir):
        from contract.manifest import ManifestError
        from serve.backends import published

        try:
            published.manifest(version_dir(model_dir))  # made by this code's export: its manifest format is read
            return model_dir
        except (SystemExit, ManifestError):
            shutil.rmtree(model_dir)
    log(f"making the benchmark model: {architecture}, 1 epoch on 400 synthetic images, exported (a few minutes)")
    data, run = os.path.join(cache, "data"), os.path.join(cache, "run")
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)
    _write_tree(data)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    steps = (
        ["-m", "train", "--model", architecture, "--data", data, "--output", run, "--epochs", "1",
         "--precision", "float32", "--tpu", "none", "--quiet", *ARCHITECTURES[architecture]],
        ["-m", "export", "--run", run, "--model-dir", models, "--model-name", "cifar10", "--quiet"],
    )
    for argv in steps:
        subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, check=True)
    return model_dir
