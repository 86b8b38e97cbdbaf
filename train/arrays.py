"""The input pipelines without TensorFlow: ``keras.utils.PyDataset`` over NumPy arrays.

The JAX backend uses these where TensorFlow cannot be imported: Colab's TPU runtimes and
most JAX images ship JAX alone. They give the batches :mod:`train.data`'s tf.data pipelines
give (same shapes, dtypes, augmentation, shuffling per epoch, and zero-weight padding of the
last evaluation batch), so a run trains the same either way; the random streams differ.
Keras fetches batches on worker threads while the accelerator runs the previous step.

Typical usage::

    from contract.recipe import Recipe

    train_ds = arrays.train_dataset(x, y, global_batch=1024, recipe=Recipe(augment=True), seed=0)
    model.fit(train_ds, epochs=10, validation_data=arrays.eval_dataset(x_test, y_test, 1024))
"""

import io
import os

import keras
import numpy as np
from PIL import Image

from contract import IMAGE_SIZE
from train.corruption import BEST_QUALITY, BLUR_RADIUS, OUTLIER, PATCH, blur_kernels
from train.data import check_shard, first_flips, pad_for_evaluation

WORKERS = max(1, min(4, (os.cpu_count() or 1) - 1))  # batch-making threads beside the training loop


def augment(images, pad, rng, flips=None, shard=(0, 1)):
    """Random crop after ``pad``-pixel reflection padding (none when 0), and a horizontal flip (``flips``, or at random).

    The NumPy twin of :func:`train.data.augment`: one gather, the flip folded into the column index.
    ``shard=(index, count)``: ``images`` is part ``index`` of ``count`` equal parts of a global
    batch; the draws are made for the whole global batch and this part's are used.
    """
    n = len(images)
    index, count = shard
    part = slice(index * n, (index + 1) * n)
    flip = rng.random(count * n)[part] < 0.5 if flips is None else flips
    cols = np.where(flip[:, None], np.arange(IMAGE_SIZE - 1, -1, -1), np.arange(IMAGE_SIZE))
    rows = np.broadcast_to(np.arange(IMAGE_SIZE), (n, IMAGE_SIZE))
    if pad:
        images = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
        rows = rows + rng.integers(0, 2 * pad + 1, (count * n, 1))[part]
        cols = cols + rng.integers(0, 2 * pad + 1, (count * n, 1))[part]
    return images[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def corrupt(images, fraction, noise, blur, rng, shard=(0, 1)):
    """Gaussian noise on ``fraction / 2`` of a float32 batch's images, blur on as many, each image on its own draw.

    The NumPy twin of :func:`train.corruption.corrupt`: the same draws' meaning (a standard deviation uniform in
    [0, ``noise`` x 255), a sigma uniform in [0, ``blur``) pixels, a separable reflect-padded kernel per
    image), computed for the chosen images only, one tap at a time over all of them.
    """
    n = len(images)
    index, count = shard
    part = slice(index * n, (index + 1) * n)
    kind, std, sigma = rng.random((count * n, 3))[part].T.astype(np.float32)
    out = images.copy()
    noisy = np.flatnonzero(kind < fraction / 2)
    out[noisy] += rng.standard_normal((len(noisy), *images.shape[1:]), dtype=np.float32) * (
        std[noisy] * noise * 255)[:, None, None, None]
    blurred = np.flatnonzero((kind >= fraction / 2) & (kind < fraction))
    kernels = blur_kernels(sigma[blurred] * blur)[:, :, None, None, None]  # [images, taps, 1, 1, 1]
    r, size = BLUR_RADIUS, images.shape[1]
    padded = np.pad(images[blurred], ((0, 0), (r, r), (r, r), (0, 0)), mode="reflect")
    across = sum(kernels[:, t] * padded[:, :, t:t + size] for t in range(2 * r + 1))
    out[blurred] = sum(kernels[:, t] * across[:, t:t + size] for t in range(2 * r + 1))
    return np.clip(out, 0, 255, out=out)


def compress(images, fraction, lowest_quality, rng, shard=(0, 1)):
    """A random ``fraction`` of a float32 batch re-encoded as JPEG by Pillow: the NumPy twin of :func:`train.corruption.compress`."""
    n = len(images)
    index, count = shard
    chosen, quality = rng.random((count * n, 2))[index * n:(index + 1) * n].T
    out = images.copy()
    for i in np.flatnonzero(chosen < fraction):
        buffer = io.BytesIO()
        Image.fromarray(np.clip(np.round(images[i]), 0, 255).astype(np.uint8)).save(
            buffer, "JPEG", quality=int(round(lowest_quality + quality[i] * (BEST_QUALITY - lowest_quality))))
        with Image.open(buffer) as decoded:
            out[i] = np.asarray(decoded, np.float32)
    return out


def expose(images, labels, fraction, rng, shard=(0, 1)):
    """A random ``fraction`` of a float32 batch replaced by its images with their patches shuffled, labelled
    :data:`~train.corruption.OUTLIER`: the NumPy twin of :func:`train.corruption.expose`."""
    n, size, channels = len(images), images.shape[1], images.shape[-1]
    side = size // PATCH
    index, count = shard
    draws = rng.random((count * n, 1 + side * side))[index * n:(index + 1) * n]
    chosen = np.flatnonzero(draws[:, 0] < fraction)
    patches = images[chosen].reshape(len(chosen), side, PATCH, side, PATCH, channels).transpose(0, 1, 3, 2, 4, 5)
    patches = patches.reshape(len(chosen), side * side, PATCH, PATCH, channels)
    order = np.argsort(draws[chosen, 1:], axis=1)
    shuffled = np.take_along_axis(patches, order[:, :, None, None, None], axis=1)
    out, labels = images.copy(), labels.astype(np.int32)
    out[chosen] = shuffled.reshape(len(chosen), side, side, PATCH, PATCH, channels).transpose(
        0, 1, 3, 2, 4, 5).reshape(len(chosen), size, size, channels)
    labels[chosen] = OUTLIER
    return out, labels


class _Batches(keras.utils.PyDataset):
    def __init__(self, global_batch, num_classes, shard=(0, 1)):
        super().__init__(workers=WORKERS, max_queue_size=2 * WORKERS)
        self.global_batch = global_batch
        self.num_classes = num_classes
        self.shard = check_shard(shard, global_batch)

    def _part(self, i):
        """The positions in the data of this process's part of global batch ``i``."""
        index, count = self.shard
        local = self.global_batch // count
        start = i * self.global_batch + index * local
        return slice(start, start + local)

    def _labels(self, y):
        if self.num_classes is None:
            return y
        return np.eye(self.num_classes, dtype=np.float32)[y]


class TrainBatches(_Batches):
    """Shuffled float32 batches, augmented as ``recipe`` says (as ``data.train_dataset``); the last
    partial batch of each epoch is dropped."""

    def __init__(self, x, y, global_batch, recipe, seed=None, num_classes=None, shard=(0, 1)):
        super().__init__(global_batch, num_classes, shard)
        self.x, self.y, self.recipe = x, y, recipe
        self.seed = 0 if seed is None else seed
        self.first_flips = first_flips(len(x), seed) if recipe.alternate_flips else None
        self.epoch = 0
        self.order = self._shuffled()

    def __len__(self):
        return len(self.x) // self.global_batch

    def __getitem__(self, i):
        index = self.order[self._part(i)]
        images = self.x[index]
        # One stream per (seed, epoch, batch): the same batch whichever thread (or process) makes it.
        rng = np.random.default_rng([self.seed, self.epoch, i])
        recipe = self.recipe
        if recipe.augment:
            flips = None if self.first_flips is None else self.first_flips[index] ^ (self.epoch % 2 == 1)
            images = augment(images, recipe.crop_padding, rng, flips, self.shard)
        images = images.astype(np.float32)
        if recipe.corrupt_fraction > 0:
            images = corrupt(images, recipe.corrupt_fraction, recipe.corrupt_noise, recipe.corrupt_blur, rng,
                             self.shard)
        if recipe.jpeg_fraction > 0:
            images = compress(images, recipe.jpeg_fraction, recipe.jpeg_quality, rng, self.shard)
        if recipe.outlier_fraction > 0:
            return expose(images, self.y[index], recipe.outlier_fraction, rng, self.shard)
        return images, self._labels(self.y[index])

    def on_epoch_end(self):
        self.epoch += 1
        self.order = self._shuffled()

    def _shuffled(self):
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.x))


class EvalBatches(_Batches):
    """Every image exactly once, the last batch padded with zero-weight copies (as ``data.eval_dataset``)."""

    def __init__(self, x, y, global_batch, num_classes=None, shard=(0, 1)):
        super().__init__(global_batch, num_classes, shard)
        self.x, self.y, self.weights = pad_for_evaluation(x, y, global_batch)

    def __len__(self):
        return len(self.x) // self.global_batch

    def __getitem__(self, i):
        batch = self._part(i)
        return self.x[batch].astype(np.float32), self._labels(self.y[batch]), self.weights[batch]


train_dataset = TrainBatches
eval_dataset = EvalBatches
