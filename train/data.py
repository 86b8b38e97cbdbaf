"""Training data: loaders for every supported source, and the tf.data pipelines.

Sources (``--data``):

* ``cifar10``: Keras's CIFAR-10 loader (downloads once, then reads its cache).
* a directory or ``.zip`` holding ``train/<class>/*`` and ``test/<class>/*``
  images of any size and mode; class names are the sorted folder names.
* the official ``cifar-10-binary.tar.gz`` (parsed as raw bytes, never unpickled).

Every loader returns a :class:`Splits` of uint8 ``[N, 32, 32, 3]`` RGB arrays and
int64 labels. Anything wrong with the data raises :class:`DataError` with one
line a user can act on.
"""

import dataclasses
import io
import os
import tarfile
import zipfile

import numpy as np
from PIL import Image

from contract import CHANNELS, CIFAR10_CLASSES, IMAGE_SIZE
from contract.pixels import to_rgb32  # the server's rule too: one definition of "file -> model input"
from train.corruption import compress, corrupt, expose

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
SPLITS = ("train", "test")
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"  # what Keras's loader fetches
_RECORD_BYTES = 1 + IMAGE_SIZE * IMAGE_SIZE * CHANNELS  # CIFAR-10 binary: label byte + CHW pixels


class DataError(ValueError):
    """The data cannot be used; the message says why in one line."""


@dataclasses.dataclass
class Splits:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list
    source: str

    @property
    def num_classes(self):
        return len(self.class_names)


def load(source):
    """Load ``source`` (``"cifar10"``, a folder, a ``.zip`` or a binary tarball)."""
    if source == "cifar10":
        return _load_keras_cifar10()
    if not os.path.exists(source):
        raise DataError(f"data path {source!r} does not exist")
    if os.path.isdir(source):
        return _check(_load_tree(_DirTree(source)), source)
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            return _check(_load_tree(_ZipTree(archive)), source)
    if tarfile.is_tarfile(source):
        return _check(_load_cifar_binary(source), source)
    raise DataError(f"{source!r} is neither a folder, a .zip, nor a CIFAR-10 binary tarball")


@dataclasses.dataclass
class HeldOut:
    """Training images kept out of training (``--holdout``): their pixels, labels and indices."""

    images: np.ndarray
    labels: np.ndarray
    indices: np.ndarray  # into the training split as loaded


def hold_out(splits, count):
    """``(splits without the held-out images, HeldOut or None)``: contract.confidence's choice of ``count``."""
    if not count:
        return splits, None
    from contract import confidence

    try:
        indices = confidence.holdout_indices(len(splits.x_train), count)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    keep = np.ones(len(splits.x_train), bool)
    keep[indices] = False
    held = HeldOut(splits.x_train[indices], splits.y_train[indices], indices)
    return dataclasses.replace(splits, x_train=splits.x_train[keep], y_train=splits.y_train[keep]), held


def _load_keras_cifar10():
    import keras

    try:
        (x_train, y_train), (x_test, y_test) = keras.datasets.cifar10.load_data()
    except Exception as exc:  # Keras raises a bare Exception when the fetch fails, ValueError on a bad hash
        # Keras deletes a failed or corrupt download itself, so the next run starts clean.
        reason = " ".join(str(exc).split()).rsplit(" -- ", 1)[-1] or type(exc).__name__
        raise DataError(
            f"cannot download CIFAR-10 from {CIFAR10_URL} ({reason}); without internet, pass --data a folder "
            "or .zip of train/<class>/ and test/<class>/ images, or cifar-10-binary.tar.gz "
            "(CIFAR_DATA=... for scripts/main.sh)"
        ) from None
    return Splits(
        x_train, y_train.reshape(-1).astype(np.int64), x_test, y_test.reshape(-1).astype(np.int64),
        list(CIFAR10_CLASSES), "cifar10",
    )


class _DirTree:
    def __init__(self, root):
        self.root = root

    def classes(self, split):
        path = os.path.join(self.root, split)
        if not os.path.isdir(path):
            return None
        return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))

    def files(self, split, cls):
        path = os.path.join(self.root, split, cls)
        return sorted(os.path.join(path, f) for f in os.listdir(path) if f.lower().endswith(IMAGE_EXTENSIONS))

    def read(self, name):
        with open(name, "rb") as f:
            return f.read()


class _ZipTree:
    def __init__(self, archive):
        self.archive = archive
        names = [n for n in archive.namelist() if not n.endswith("/")]
        # Accept both "train/cls/x.jpg" and a single wrapping folder "cifar/train/cls/x.jpg".
        prefixes = {n.split("/")[0] for n in names}
        self.prefix = ""
        if not prefixes & set(SPLITS) and len(prefixes) == 1:
            self.prefix = prefixes.pop() + "/"
        self.index = {}
        for n in names:
            parts = n[len(self.prefix):].split("/")
            if len(parts) == 3 and parts[0] in SPLITS and not parts[2].startswith("."):
                self.index.setdefault(parts[0], {}).setdefault(parts[1], []).append(n)
        # A class folder may exist with no files in it; keep it so it is reported as empty.
        for n in archive.namelist():
            parts = n[len(self.prefix):].rstrip("/").split("/")
            if n.endswith("/") and len(parts) == 2 and parts[0] in SPLITS:
                self.index.setdefault(parts[0], {}).setdefault(parts[1], [])

    def classes(self, split):
        if split not in self.index:
            return None
        return sorted(self.index[split])

    def files(self, split, cls):
        return sorted(n for n in self.index[split][cls] if n.lower().endswith(IMAGE_EXTENSIONS))

    def read(self, name):
        return self.archive.read(name)


def _load_tree(tree):
    classes = {}
    for split in SPLITS:
        found = tree.classes(split)
        if found is None:
            raise DataError(f"no {split}/ folder (expected {split}/<class>/<images>)")
        classes[split] = found
    if classes["train"] != classes["test"]:
        only_train = sorted(set(classes["train"]) - set(classes["test"]))
        only_test = sorted(set(classes["test"]) - set(classes["train"]))
        raise DataError(
            f"train and test classes differ (only in train: {only_train or 'none'}; only in test: {only_test or 'none'})"
        )
    class_names = classes["train"]
    if len(class_names) < 2:
        raise DataError(f"need at least 2 classes, found {len(class_names)}: {class_names}")
    arrays = {}
    for split in SPLITS:
        images, labels = [], []
        for label, cls in enumerate(class_names):
            files = tree.files(split, cls)
            if not files:
                raise DataError(f"class folder {split}/{cls} has no images")
            for name in files:
                try:
                    with Image.open(io.BytesIO(tree.read(name))) as image:
                        images.append(to_rgb32(image))
                except (OSError, ValueError, Image.DecompressionBombError) as exc:
                    raise DataError(f"cannot decode image {name}: {exc}") from None
                labels.append(label)
        arrays[split] = (np.stack(images), np.asarray(labels, dtype=np.int64))
    return Splits(*arrays["train"], *arrays["test"], class_names, "")


def _load_cifar_binary(path):
    splits = {"train": [], "test": []}
    class_names = list(CIFAR10_CLASSES)
    try:
        with tarfile.open(path) as archive:
            for member in archive:
                base = os.path.basename(member.name)
                if not member.isfile():
                    continue
                if base.startswith("data_batch_") and base.endswith(".bin"):
                    splits["train"].append((base, archive.extractfile(member).read()))
                elif base == "test_batch.bin":
                    splits["test"].append((base, archive.extractfile(member).read()))
                elif base == "batches.meta.txt":
                    names = archive.extractfile(member).read().decode("utf-8").split()
                    if names:
                        class_names = names
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot read tarball {path}: {exc}") from None
    arrays = {}
    for split, blobs in splits.items():
        if not blobs:
            raise DataError(f"{path} holds no {'data_batch_*.bin' if split == 'train' else 'test_batch.bin'}")
        raw = b"".join(blob for _, blob in sorted(blobs))
        if len(raw) % _RECORD_BYTES:
            raise DataError(f"{path}: {split} batches are not whole {_RECORD_BYTES}-byte CIFAR-10 records")
        records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _RECORD_BYTES)
        labels = records[:, 0].astype(np.int64)
        images = records[:, 1:].reshape(-1, CHANNELS, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
        arrays[split] = (np.ascontiguousarray(images), labels)
    splits_ = Splits(*arrays["train"], *arrays["test"], class_names, "")
    if max(splits_.y_train.max(), splits_.y_test.max()) >= len(class_names):
        raise DataError(f"{path}: labels exceed the {len(class_names)} class names")
    return splits_


def _check(splits, source):
    splits.source = os.path.abspath(source)
    if len(splits.x_train) == 0 or len(splits.x_test) == 0:
        raise DataError(f"{source}: empty train or test split")
    return splits


# --- tf.data pipelines (train.arrays has their TensorFlow-free twins) -------------------


def augment(images, pad=4, flips=None, shard=(0, 1)):
    """Random crop after ``pad``-pixel reflection padding (none when ``pad`` is 0), and a horizontal flip.

    Works on a batch of uint8 images with a static shape; every op runs on a TPU. ``flips``
    (bool, one per image) says which images to mirror; without it each is mirrored at random.
    The flip is folded into the column gather (reversed column indices) rather than a reverse
    and a select over the whole batch: on the CPU that takes a quarter to a third off the
    pipeline's cost. ``shard=(index, count)``: ``images`` is part ``index`` of ``count`` equal
    parts of a global batch; the random draws are made for the whole global batch and this
    part's are used, so the parts of one batch are not augmented alike.
    """
    import tensorflow as tf

    index, count = shard
    batch = tf.shape(images)[0]

    def draw(make):
        # This part's share of draws made for the whole global batch: processes seeded alike would
        # otherwise give the same offsets and flips to the same rows of their parts.
        if count == 1:
            return make(batch)
        local = images.shape[0]  # static: a part of a drop_remainder batch
        return make(count * local)[index * local:(index + 1) * local]

    flip = draw(lambda n: tf.random.uniform([n, 1])) < 0.5 if flips is None else flips[:, None]
    cols = tf.where(flip, tf.range(IMAGE_SIZE - 1, -1, -1)[None, :], tf.range(IMAGE_SIZE)[None, :])
    if pad == 0:
        return tf.gather(images, cols, axis=2, batch_dims=1)
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    # One random offset per image, applied with a gather so the batch keeps its static shape.
    dx = draw(lambda n: tf.random.uniform([n, 1], 0, 2 * pad + 1, dtype=tf.int32))
    dy = draw(lambda n: tf.random.uniform([n, 1], 0, 2 * pad + 1, dtype=tf.int32))
    cropped = tf.gather(padded, dy + tf.range(IMAGE_SIZE)[None, :], axis=1, batch_dims=1)
    return tf.gather(cropped, dx + cols, axis=2, batch_dims=1)


def first_flips(count, seed):
    """Which of ``count`` images are mirrored in even epochs under alternating flips (odd epochs: the others)."""
    return np.random.default_rng([0 if seed is None else seed, 1]).random(count) < 0.5


def train_dataset(x, y, global_batch, recipe, seed=None, num_classes=None, shard=(0, 1)):
    """Shuffled, augmented, static-shape batches (``drop_remainder=True``), repeated per epoch.

    ``recipe`` (a :class:`contract.recipe.Recipe`) says what the images go through, in this order:
    with ``augment``, a random crop after ``crop_padding`` pixels of reflection padding and a flip;
    then :func:`corrupt`'s share, noise and blur (``corrupt_*``; a share of 0: none); then
    :func:`compress`'s share and lowest quality (``jpeg_*``); then :func:`expose`'s share
    (``outlier_fraction``, integer labels only). Its other fields do not touch the input.

    Labels are one-hot over ``num_classes`` when it is given (for label smoothing), else integers.
    With ``alternate_flips`` (and ``augment``) each image is mirrored in every other epoch,
    starting from :func:`first_flips`, rather than at random (airbench: more distinct views in few
    epochs); the dataset then repeats without end and counts its own epochs, from 0 again when a
    run resumes. ``shard=(index, count)``: this process's part of each global batch, for
    ``count`` processes that shuffle alike (same ``seed``) and each feed ``global_batch / count``
    images, so a batch is cut before anything but the cached decode touches its images. (The
    random augmentation is not reproducible batch for batch even in one process: the parallel map
    takes its random numbers in whatever order its calls run.)
    """
    import tensorflow as tf

    index, count = check_shard(shard, global_batch)
    local = global_batch // count
    alternate = recipe.augment and recipe.alternate_flips
    columns = (x, y, first_flips(len(x), seed)) if alternate else (x, y)
    ds = tf.data.Dataset.from_tensor_slices(columns).cache()
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(global_batch, drop_remainder=True)
    if alternate:
        steps = len(x) // global_batch
        ds = ds.repeat().enumerate().map(
            lambda step, batch: (batch[0], batch[1], tf.not_equal(batch[2], (step // steps) % 2 == 1)))
    if count > 1:
        ds = ds.map(lambda *batch: tuple(column[index * local:(index + 1) * local] for column in batch))
    if recipe.augment:
        ds = ds.map(lambda images, labels, *flips: (
            augment(images, recipe.crop_padding, *flips, shard=(index, count)), labels),
            num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.map(lambda images, labels: (tf.cast(images, tf.float32), _labels(tf, labels, num_classes)))
    if recipe.corrupt_fraction > 0:
        ds = ds.map(lambda images, labels: (corrupt(images, recipe.corrupt_fraction, recipe.corrupt_noise,
                                                    recipe.corrupt_blur, shard=(index, count)), labels),
                    num_parallel_calls=tf.data.AUTOTUNE)
    if recipe.jpeg_fraction > 0:
        ds = ds.map(lambda images, labels: (
            compress(images, recipe.jpeg_fraction, recipe.jpeg_quality, shard=(index, count)), labels),
            num_parallel_calls=tf.data.AUTOTUNE)
    if recipe.outlier_fraction > 0:
        ds = ds.map(lambda images, labels: expose(images, labels, recipe.outlier_fraction, shard=(index, count)),
                    num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def eval_dataset(x, y, global_batch, num_classes=None, shard=(0, 1)):
    """Every test image exactly once, in static-shape batches (see :func:`pad_for_evaluation`).

    ``shard=(index, count)``: this process's part of each global batch, as for :func:`train_dataset`.
    """
    import tensorflow as tf

    index, count = check_shard(shard, global_batch)
    local = global_batch // count
    ds = tf.data.Dataset.from_tensor_slices(pad_for_evaluation(x, y, global_batch)).cache()
    ds = ds.batch(global_batch, drop_remainder=True)
    if count > 1:
        ds = ds.map(lambda *batch: tuple(column[index * local:(index + 1) * local] for column in batch))
    return ds.map(lambda images, labels, w: (tf.cast(images, tf.float32), _labels(tf, labels, num_classes), w)
                  ).prefetch(tf.data.AUTOTUNE)


def check_shard(shard, global_batch):
    """``shard`` as ``(index, count)``, checked: a valid part, and global batches that split into equal parts."""
    index, count = shard
    if not 0 <= index < count or global_batch % count:
        raise ValueError(f"cannot take part {index} of {count} from global batches of {global_batch}")
    return index, count


def pad_for_evaluation(x, y, global_batch):
    """``(x, y, weights)`` padded to whole batches with copies of image 0 carrying weight 0.

    Accuracy then counts each real image once, and an accelerator still sees fixed shapes.
    """
    n = len(x)
    padding = (-n) % global_batch
    weights = np.concatenate([np.ones(n, np.float32), np.zeros(padding, np.float32)])
    if padding:
        x = np.concatenate([x, np.repeat(x[:1], padding, axis=0)])
        y = np.concatenate([y, np.repeat(y[:1], padding, axis=0)])
    return x, y, weights


def _labels(tf, labels, num_classes):
    return labels if num_classes is None else tf.one_hot(labels, num_classes)
