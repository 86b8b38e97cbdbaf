"""Corruption augmentation (``--corrupt-fraction``): noise and blur on a share of each batch, in both input pipelines."""

import numpy as np
import pytest

from contract.recipe import Recipe
from train import arrays, corruption, data


def _pipelines(name):
    """``train.corruption.NAME`` (tf.data) and its NumPy twin ``train.arrays.NAME``, each seeded alike, on NumPy arrays."""
    def on_tf(*arrays_in, **options):
        import tensorflow as tf

        tf.random.set_seed(0)
        out = getattr(corruption, name)(*map(tf.constant, arrays_in), **options)
        return tuple(part.numpy() for part in out) if isinstance(out, tuple) else out.numpy()

    def on_numpy(*arrays_in, **options):
        return getattr(arrays, name)(*arrays_in, **options, rng=np.random.default_rng(0))

    return {"tf.data": on_tf, "numpy": on_numpy}


PIPELINES = _pipelines("corrupt")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_blurred_point_keeps_its_light_and_spreads_by_the_sigma_drawn(pipeline):
    points = np.zeros((400, 32, 32, 3), np.float32)
    points[:, 16, 16, :] = 255.0
    out = PIPELINES[pipeline](points, fraction=1.0, noise=0.0, blur=2.0)
    assert out.shape == points.shape and out.dtype == np.float32
    light = out[..., 0].sum(axis=(1, 2)) / 255.0
    np.testing.assert_allclose(light, 1.0, rtol=1e-4)  # normalised kernels; reflection never reaches the centre
    weights = out[..., 0] / out[..., 0].sum(axis=(1, 2), keepdims=True)
    columns = np.arange(32)[None, None, :]
    spread = np.sqrt((weights * (columns - 16) ** 2).sum(axis=(1, 2)))
    blurred = np.abs(out - points).reshape(len(points), -1).max(axis=1) > 1e-3
    assert 0.3 < blurred.mean() < 0.7, "half of the corrupted images are blurred, the other half noisy (here by 0)"
    assert spread.max() <= 2.0 * 1.02 and spread.max() > 1.6, "sigmas drawn up to the largest, never past it"
    assert np.median(spread[blurred]) > 0.5
    rows = np.arange(32)[None, :, None]
    np.testing.assert_allclose(np.sqrt((weights * (rows - 16) ** 2).sum(axis=(1, 2))), spread, atol=1e-3,
                               err_msg="the same blur down as across")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_noise_is_drawn_per_image_up_to_its_largest_spread(pipeline):
    grey = np.full((400, 32, 32, 3), 128.0, np.float32)
    out = PIPELINES[pipeline](grey, fraction=0.5, noise=0.1, blur=1.0)
    spread = (out - grey).reshape(len(grey), -1).std(axis=1)
    noisy = spread > 0.01  # a blurred flat image is the same image, up to float rounding
    assert 0.15 < noisy.mean() < 0.35, "a quarter: half of the corrupted half"
    assert spread.max() < 0.1 * 255 * 1.05
    assert 0.4 * 0.1 * 255 < spread[noisy].mean() < 0.6 * 0.1 * 255, "uniform from 0 to the largest: half of it on average"
    np.testing.assert_allclose(out[~noisy], grey[~noisy], atol=1e-3)


def test_the_corruption_never_leaves_the_pixel_range():
    rng = np.random.default_rng(2)
    images = rng.choice([0.0, 255.0], size=(200, 32, 32, 3)).astype(np.float32)
    for corrupt in PIPELINES.values():
        out = corrupt(images, fraction=1.0, noise=0.5, blur=3.0)
        assert out.min() >= 0.0 and out.max() <= 255.0


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_training_pipeline_corrupts_its_share_of_each_batch(pipeline):
    # Every image flat, each its own grey: a corrupted one is no longer flat but for a blur of very small sigma.
    count = 512
    x = np.repeat(np.arange(count, dtype=np.float32)[:, None] % 200 + 20, 32 * 32 * 3, axis=1).reshape(count, 32, 32, 3)
    y = np.arange(count) % 3
    options = dict(recipe=Recipe(corrupt_fraction=0.5, corrupt_noise=0.1, corrupt_blur=1.0), seed=0)
    if pipeline == "tf.data":
        batches = [images.numpy() for images, _ in data.train_dataset(x.astype(np.uint8), y, 128, **options).take(4)]
    else:
        dataset = arrays.train_dataset(x.astype(np.uint8), y, 128, **options)
        batches = [dataset[i][0] for i in range(4)]
    images = np.concatenate(batches)
    changed = images.reshape(len(images), -1).std(axis=1) > 0.01
    # Blurring a flat image changes nothing: the changed ones are the noisy quarter.
    assert 0.17 < changed.mean() < 0.33
    clean = data.train_dataset(x.astype(np.uint8), y, 128, Recipe(), seed=0) if pipeline == "tf.data" else (
        arrays.train_dataset(x.astype(np.uint8), y, 128, Recipe(), seed=0))
    first = next(iter(clean))[0] if pipeline == "tf.data" else clean[0][0]
    assert np.asarray(first).reshape(128, -1).std(axis=1).max() == 0, "no corruption unless the recipe asks"


EXPOSERS = _pipelines("expose")


@pytest.mark.parametrize("pipeline", EXPOSERS)
def test_an_outlier_is_its_own_image_with_its_patches_shuffled_and_no_class(pipeline):
    # Each pixel its own number: an outlier's pixels are its image's, each 8x8 patch whole, moved.
    count = 400
    images = np.arange(count * 32 * 32 * 3, dtype=np.float32).reshape(count, 32, 32, 3)
    labels = np.arange(count) % 10
    out, out_labels = EXPOSERS[pipeline](images, labels, fraction=0.25)
    exposed = out_labels == corruption.OUTLIER
    assert 0.17 < exposed.mean() < 0.33
    np.testing.assert_array_equal(out[~exposed], images[~exposed])
    np.testing.assert_array_equal(out_labels[~exposed], labels[~exposed])

    def patches(batch):
        return batch.reshape(len(batch), 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(len(batch), 16, -1)

    moved, own = patches(out[exposed]), patches(images[exposed])
    np.testing.assert_array_equal(np.sort(moved[:, :, 0], axis=1), np.sort(own[:, :, 0], axis=1))
    starts = own[:, :, 0]
    where = np.argmax(moved[:, :, None, 0] == starts[:, None, :], axis=2)  # which patch landed in each place
    np.testing.assert_array_equal(moved, np.take_along_axis(own, where[:, :, None], axis=1), err_msg="patches move whole")
    assert (where != np.arange(16)).any(axis=1).mean() > 0.99, "an outlier's patches are out of place"


@pytest.mark.parametrize("pipeline", ["tf.data", "numpy"])
def test_the_training_pipeline_replaces_its_share_of_each_batch_by_outliers(pipeline):
    count = 512
    x = np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    y = np.arange(count) % 10
    options = dict(recipe=Recipe(outlier_fraction=0.2), seed=0)
    if pipeline == "tf.data":
        labels = np.concatenate([b.numpy() for _, b in data.train_dataset(x, y, 128, **options).take(4)])
    else:
        dataset = arrays.train_dataset(x, y, 128, **options)
        labels = np.concatenate([dataset[i][1] for i in range(4)])
    assert 0.12 < (labels == corruption.OUTLIER).mean() < 0.28
    assert set(labels[labels != corruption.OUTLIER]) == set(range(10))


COMPRESSORS = _pipelines("compress")


def _pillow_error(image, quality):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return np.abs(np.asarray(Image.open(buffer), np.float32) - image).mean()


@pytest.mark.parametrize("pipeline", COMPRESSORS)
def test_a_compressed_image_is_its_jpeg_at_a_quality_between_the_lowest_and_95(pipeline):
    rng = np.random.default_rng(3)
    coarse = rng.integers(0, 256, (200, 8, 8, 3)).astype(np.float32)
    images = np.clip(np.repeat(np.repeat(coarse, 4, axis=1), 4, axis=2) + rng.normal(0, 8, (200, 32, 32, 3)), 0, 255).round()
    images = images.astype(np.float32)
    out = COMPRESSORS[pipeline](images, fraction=0.5, lowest_quality=30)
    assert out.dtype == np.float32 and out.shape == images.shape
    error = np.abs(out - images).reshape(len(images), -1).mean(axis=1)
    changed = error > 0
    assert 0.35 < changed.mean() < 0.65
    for image, got in zip(images[changed], error[changed]):
        assert 0.8 * _pillow_error(image, 95) <= got <= 1.25 * _pillow_error(image, 30)


@pytest.mark.parametrize("pipeline", ["tf.data", "numpy"])
def test_the_training_pipeline_compresses_its_share_of_each_batch(pipeline):
    count = 512
    x = np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    y = np.arange(count) % 10
    options = dict(recipe=Recipe(jpeg_fraction=0.25, jpeg_quality=50), seed=0)
    if pipeline == "tf.data":
        dataset = data.train_dataset(x, y, 128, **options)
        batches = [(images.numpy(), labels.numpy()) for images, labels in dataset.take(4)]
    else:
        dataset = arrays.train_dataset(x, y, 128, **options)
        batches = [dataset[i] for i in range(4)]
    images = np.concatenate([b[0] for b in batches]).reshape(512, -1)
    originals = {row.tobytes() for row in x.reshape(count, -1)}  # the batches are shuffled: untouched ones are copies
    untouched = np.array([row.astype(np.uint8).tobytes() in originals for row in images])
    assert 0.65 < untouched.mean() < 0.85, "a quarter of the images re-encoded, the others untouched"
