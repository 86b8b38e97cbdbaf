"""The TensorFlow-free input pipelines (train.arrays) give the batches the tf.data ones give."""

import numpy as np

import synthetic
from contract.recipe import Recipe
from train import arrays, data


def test_training_batches_are_whole_shuffled_float32_and_cover_each_image_once_per_epoch():
    x, y = synthetic.make_images(7)  # 21 images, 2 whole batches of 8
    x = x.copy()
    x[:, 0, 0, 0] = np.arange(len(x))  # tag each image so a batch can be traced back
    batches = arrays.train_dataset(x, y, global_batch=8, recipe=Recipe(), seed=3)
    assert len(batches) == 2
    seen = []
    for i in range(len(batches)):
        images, labels = batches[i]
        assert images.shape == (8, 32, 32, 3) and images.dtype == np.float32 and labels.shape == (8,)
        tags = images[:, 0, 0, 0].astype(int)
        np.testing.assert_array_equal(labels, y[tags])
        seen.extend(tags)
    assert len(set(seen)) == 16
    first_order = batches.order.copy()
    batches.on_epoch_end()
    assert not np.array_equal(first_order, batches.order), "a new order every epoch"
    assert not np.array_equal(first_order, np.arange(len(x))), "shuffled"


def test_augmentation_crops_a_window_of_the_reflection_padded_image_and_flips():
    x, _ = synthetic.make_images(10)
    out = arrays.augment(x[:16], 4, np.random.default_rng(0))
    padded = np.pad(x[:16], [(0, 0), (4, 4), (4, 4), (0, 0)], mode="reflect")
    for original, crop in zip(padded, out):
        windows = [original[dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(np.array_equal(crop, w) or np.array_equal(crop, w[:, ::-1]) for w in windows)
    assert any(not np.array_equal(o, c) for o, c in zip(x[:16], out)), "some images move"
    flipped_only = arrays.augment(x[:16], 0, np.random.default_rng(1))
    for original, image in zip(x[:16], flipped_only):
        assert np.array_equal(image, original) or np.array_equal(image, original[:, ::-1])
    assert any(not np.array_equal(o, f) for o, f in zip(x[:16], flipped_only)), "some images are flipped"


def test_augmented_batches_are_the_same_whichever_thread_makes_them():
    x, y = synthetic.make_images(10)
    batches = arrays.train_dataset(x, y, global_batch=8, recipe=Recipe(augment=True, crop_padding=2), seed=5)
    np.testing.assert_array_equal(batches[1][0], batches[1][0])


def test_one_hot_labels_for_label_smoothing():
    x, y = synthetic.make_images(4)
    images, labels = arrays.train_dataset(x, y, global_batch=4, recipe=Recipe(), num_classes=3)[0]
    assert labels.shape == (4, 3) and labels.dtype == np.float32
    np.testing.assert_array_equal(labels.sum(axis=1), 1)


def test_evaluation_matches_the_tf_data_pipeline_batch_for_batch():
    x, y = synthetic.make_images(7)  # 21 images: not a multiple of the batch
    expected = list(data.eval_dataset(x, y, global_batch=8))
    batches = arrays.eval_dataset(x, y, global_batch=8)
    assert len(batches) == len(expected) == 3
    for i, (images, labels, weights) in enumerate(expected):
        got = batches[i]
        for a, b in zip(got, (images.numpy(), labels.numpy(), weights.numpy())):
            np.testing.assert_array_equal(a, b)
    assert sum(batches[i][2].sum() for i in range(len(batches))) == len(x)


def _marked(count):
    """``count`` images, each all zeros but for a 255 in its top-left corner, labelled by its index."""
    x = np.zeros((count, 32, 32, 3), np.uint8)
    x[:, 0, 0, :] = 255
    return x, np.arange(count)


def _mirrored_by_epoch(batches_of_each_epoch, count):
    """For each epoch, whether each image (by label) came out mirrored."""
    result = []
    for batches in batches_of_each_epoch:
        mirrored = np.full(count, -1)
        for images, labels in batches:
            mirrored[np.asarray(labels)] = np.asarray(images)[:, 0, -1, 0] == 255
        result.append(mirrored)
    return result


ALTERNATING = Recipe(augment=True, crop_padding=0, alternate_flips=True)


def test_alternating_flips_mirror_each_image_in_every_other_epoch_in_both_pipelines():
    import itertools

    x, y = _marked(32)
    first = data.first_flips(len(x), seed=7)
    assert 0 < first.sum() < len(x)
    tf_batches = iter(data.train_dataset(x, y, global_batch=8, recipe=ALTERNATING, seed=7))
    tf_epochs = [list(itertools.islice(tf_batches, 4)) for _ in range(3)]  # repeats without end: 4 steps an epoch
    numpy_batches = arrays.train_dataset(x, y, global_batch=8, recipe=ALTERNATING, seed=7)
    numpy_epochs = []
    for _ in range(3):
        numpy_epochs.append([numpy_batches[i] for i in range(len(numpy_batches))])
        numpy_batches.on_epoch_end()
    for epochs in (tf_epochs, numpy_epochs):
        mirrored = _mirrored_by_epoch(epochs, len(x))
        np.testing.assert_array_equal(mirrored[0], first)
        np.testing.assert_array_equal(mirrored[1], ~first)
        np.testing.assert_array_equal(mirrored[2], first)
    # Random flips, as before, when the recipe does not ask for alternation.
    random = arrays.train_dataset(x, y, global_batch=8, recipe=Recipe(augment=True, crop_padding=0), seed=7)
    mirrored = _mirrored_by_epoch([[random[i] for i in range(len(random))]], len(x))[0]
    assert not np.array_equal(mirrored, first) and 0 < mirrored.sum() < len(x)
