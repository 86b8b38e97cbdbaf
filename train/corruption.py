"""Corruption augmentation (``--corrupt-fraction``): Gaussian noise and blur on a share of each batch.

:func:`corrupt` runs in the tf.data pipeline (train.data); train.arrays has its NumPy twin, which blurs
with :func:`blur_kernels`, the same kernels.
"""

import numpy as np

#: Taps on each side of the blur's kernel: two sigmas at the largest sigma a recipe allows (3 pixels).
BLUR_RADIUS = 6
#: The least sigma a blurred image is given (pixels): below it the kernel is a plain copy, and 0 would divide by 0.
LEAST_SIGMA = 0.05


def blur_kernels(sigma, radius=BLUR_RADIUS):
    """``[n, 2 * radius + 1]`` normalised 1-D Gaussian kernels, one per ``sigma`` (pixels; at least :data:`LEAST_SIGMA`)."""
    taps = np.arange(-radius, radius + 1, dtype=np.float32)
    weights = np.exp(-0.5 * (taps[None, :] / np.maximum(np.asarray(sigma, np.float32), LEAST_SIGMA)[:, None]) ** 2)
    return weights / weights.sum(axis=1, keepdims=True)


def corrupt(images, fraction, noise, blur, shard=(0, 1)):
    """Corrupt a random share of a float32 batch (0-255): ``fraction / 2`` of its images with Gaussian noise, as many blurred.

    Each image draws on its own whether it is corrupted and how much: a noisy one a standard deviation
    uniform in [0, ``noise`` x 255), a blurred one a Gaussian sigma uniform in [0, ``blur``) pixels
    (separable, reflect-padded: one depthwise convolution each way with the blurred images as its
    channels, so every image has its own kernel). Clipped to 0-255. Only the chosen images are
    computed: on a batch of 2,000 the whole batch's noise and blur cost about a tenth of a second each
    on a CPU core. Light corruptions of the kinds users' photos carry, for robustness; the
    imagecorruptions sets the robustness benchmark scores are made by another generator
    (bench/confidence/corruptions_generate.py) and never seen here. ``shard``: as
    :func:`train.data.augment`, which images are corrupted and how much is drawn for the whole global
    batch and this part's draws are used.
    """
    import tensorflow as tf

    index, count = shard
    local = images.shape[0]  # static: drop_remainder batches
    draws = tf.random.uniform([count * local, 3])[index * local:(index + 1) * local] if count > 1 else (
        tf.random.uniform([local, 3]))
    kind, std, sigma = tf.unstack(draws, axis=1)
    noisy = tf.where(kind < fraction / 2)
    blurred = tf.where((kind >= fraction / 2) & (kind < fraction))
    chosen = tf.gather(images, noisy[:, 0])
    scale = tf.gather(std, noisy[:, 0]) * noise * 255.0
    out = tf.tensor_scatter_nd_update(images, noisy, chosen + tf.random.normal(tf.shape(chosen)) * scale[:, None, None, None])
    out = tf.tensor_scatter_nd_update(out, blurred, _blur(tf, tf.gather(images, blurred[:, 0]),
                                                          tf.gather(sigma, blurred[:, 0]) * blur))
    return tf.clip_by_value(out, 0.0, 255.0)


#: The highest JPEG quality :func:`compress` draws.
BEST_QUALITY = 95


def compress(images, fraction, lowest_quality, shard=(0, 1)):
    """Re-encode a random ``fraction`` of a float32 batch (0-255) as JPEG, each at a quality uniform in
    [``lowest_quality``, :data:`BEST_QUALITY`]: the blocks and ringing of the photos users upload.

    Encoded and decoded by TensorFlow's libjpeg (4:2:0 chroma, accurate DCT), one image at a time, the
    chosen ones only. ``shard``: as :func:`corrupt`.
    """
    import tensorflow as tf

    index, count = shard
    local = images.shape[0]
    draws = tf.random.uniform([count * local, 2])[index * local:(index + 1) * local]
    chosen = tf.where(draws[:, 0] < fraction)
    quality = tf.cast(tf.round(lowest_quality + tf.gather(draws[:, 1], chosen[:, 0]) * (BEST_QUALITY - lowest_quality)),
                      tf.int32)

    def one(args):
        image, q = args
        pixels = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
        return tf.cast(tf.image.adjust_jpeg_quality(pixels, q, dct_method="INTEGER_ACCURATE"), tf.float32)

    encoded = tf.map_fn(one, (tf.gather(images, chosen[:, 0]), quality), fn_output_signature=tf.float32)
    return tf.tensor_scatter_nd_update(images, chosen, tf.ensure_shape(encoded, [None, *images.shape[1:]]))


#: The side of the square patches :func:`expose` shuffles (pixels): 4x4 of them in a 32x32 image.
PATCH = 8
#: The label :func:`expose` gives an outlier: no class (train.losses.OutlierExposure).
OUTLIER = -1


def expose(images, labels, fraction, shard=(0, 1)):
    """Replace a random ``fraction`` of a float32 batch with outliers: each image's :data:`PATCH`-pixel patches shuffled.

    Outlier exposure's outliers made locally from the batch itself: the colours and the local texture of
    CIFAR images with no object left to recognise, so the network learns a low score for the parts of a
    photo that are not one of the classes. bench/confidence/ood_sets.py (the benchmark's foreign images)
    makes nothing of the kind. Labels become int32, :data:`OUTLIER` for the replaced images. ``shard``:
    as :func:`corrupt`.
    """
    import tensorflow as tf

    index, count = shard
    local, size, channels = images.shape[0], images.shape[1], images.shape[-1]
    side = size // PATCH
    draws = tf.random.uniform([count * local, 1 + side * side])[index * local:(index + 1) * local]
    chosen = draws[:, 0] < fraction
    patches = tf.reshape(tf.transpose(tf.reshape(images, [local, side, PATCH, side, PATCH, channels]),
                                      [0, 1, 3, 2, 4, 5]), [local, side * side, PATCH, PATCH, channels])
    shuffled = tf.gather(patches, tf.argsort(draws[:, 1:], axis=1), batch_dims=1)
    shuffled = tf.reshape(tf.transpose(tf.reshape(shuffled, [local, side, side, PATCH, PATCH, channels]),
                                       [0, 1, 3, 2, 4, 5]), [local, size, size, channels])
    return (tf.where(chosen[:, None, None, None], shuffled, images),
            tf.where(chosen, OUTLIER, tf.cast(labels, tf.int32)))


def _blur(tf, images, sigma):
    """Each of ``images`` (float32, NHWC, any count) blurred by a Gaussian of its own ``sigma`` (pixels), as :func:`blur_kernels`."""
    count, size, channels = tf.shape(images)[0], images.shape[1], images.shape[-1]

    def convolve():
        taps = tf.range(-BLUR_RADIUS, BLUR_RADIUS + 1, dtype=tf.float32)
        weights = tf.exp(-0.5 * (taps[None, :] / tf.maximum(sigma, LEAST_SIGMA)[:, None]) ** 2)
        kernels = tf.transpose(tf.repeat(weights / tf.reduce_sum(weights, axis=1, keepdims=True), channels, axis=0))
        # The images as the channels of one image, each channel with its own image's kernel.
        stacked = tf.reshape(tf.transpose(images, [1, 2, 0, 3]), [1, size, size, count * channels])
        padded = tf.pad(stacked, [[0, 0], [BLUR_RADIUS] * 2, [BLUR_RADIUS] * 2, [0, 0]], mode="REFLECT")
        across = tf.nn.depthwise_conv2d(padded, kernels[None, :, :, None], [1, 1, 1, 1], "VALID")
        down = tf.nn.depthwise_conv2d(across, kernels[:, None, :, None], [1, 1, 1, 1], "VALID")
        return tf.transpose(tf.reshape(down, [size, size, count, channels]), [2, 0, 1, 3])

    return tf.cond(count > 0, convolve, lambda: images)  # no image to blur: no convolution with no channels
