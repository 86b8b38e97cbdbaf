"""Small image data sets the tests make themselves: learnable, and written in every supported layout."""

import io
import os
import tarfile
import zipfile

import numpy as np
from PIL import Image

CLASS_NAMES = ("red_stripes", "green_checks", "blue_dots")


def make_images(per_class, seed=0, size=32):
    """uint8 [N, size, size, 3] images of three classes that differ in colour and pattern, plus noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    patterns = [
        (yy // 4) % 2,  # horizontal stripes
        ((yy // 4) + (xx // 4)) % 2,  # checks
        (((yy % 8) - 4) ** 2 + ((xx % 8) - 4) ** 2 < 6).astype(int),  # dots
    ]
    images, labels = [], []
    for label in range(len(CLASS_NAMES)):
        for _ in range(per_class):
            base = rng.integers(20, 90, size=3)
            base[label] = rng.integers(150, 250)
            image = base[None, None, :] * (0.6 + 0.4 * patterns[label][..., None])
            image = image + rng.normal(0, 12, size=(size, size, 3))
            images.append(np.clip(image, 0, 255).astype(np.uint8))
            labels.append(label)
    order = rng.permutation(len(images))
    return np.stack(images)[order], np.asarray(labels, dtype=np.int64)[order]


def make_splits(train_per_class=64, test_per_class=16, seed=0):
    from train.data import Splits

    x_train, y_train = make_images(train_per_class, seed=seed)
    x_test, y_test = make_images(test_per_class, seed=seed + 1)
    return Splits(x_train, y_train, x_test, y_test, list(CLASS_NAMES), "synthetic")


def encode(image, fmt="PNG", **kwargs):
    """The bytes of ``image`` (a uint8 array or a Pillow image) saved as ``fmt``."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def photo_like(seed, size=32):
    """Smooth colour gradients plus noise: every DCT coefficient matters, unlike flat synthetic shapes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([x, y, (x + y) / 2], axis=-1) * rng.uniform(80, 255, 3)
    return np.clip(base + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)


def multipart(*files, **fields):
    """``post()`` arguments: ``(filename, bytes)`` files in field ``file``, as browsers and ``requests`` encode them.

    werkzeug's test client writes an empty file as a part with no body at all, not even the
    blank line before the next boundary; real clients always send it. The server is tested
    against what real clients send (the refusal of the other form is tested on its own).
    """
    from urllib3.filepost import encode_multipart_formdata

    body, content_type = encode_multipart_formdata([("file", (name, data)) for name, data in files] + list(fields.items()))
    return {"data": body, "content_type": content_type}


def write_tree(root, splits, fmt="PNG"):
    """Write ``splits`` as ``root/train/<class>/N.png`` and ``root/test/<class>/N.png``."""
    for split, (x, y) in {"train": (splits.x_train, splits.y_train), "test": (splits.x_test, splits.y_test)}.items():
        for i, (image, label) in enumerate(zip(x, y)):
            folder = os.path.join(root, split, splits.class_names[label])
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i:05d}.{fmt.lower()}"), "wb") as f:
                f.write(encode(image, fmt))
    return root


def write_zip(path, splits, fmt="PNG"):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for split, (x, y) in {"train": (splits.x_train, splits.y_train), "test": (splits.x_test, splits.y_test)}.items():
            for i, (image, label) in enumerate(zip(x, y)):
                archive.writestr(f"{split}/{splits.class_names[label]}/{i:05d}.{fmt.lower()}", encode(image, fmt))
    return path


def write_cifar_binary(path, splits, class_names=None, batches=2):
    """The official cifar-10-binary.tar.gz layout: records of 1 label byte + 3072 CHW pixel bytes."""

    def records(x, y):
        chw = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
        return np.concatenate([y.astype(np.uint8)[:, None], chw], axis=1).tobytes()

    def add(archive, name, payload):
        info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))

    with tarfile.open(path, "w:gz") as archive:
        for b, idx in enumerate(np.array_split(np.arange(len(splits.x_train)), batches), start=1):
            add(archive, f"data_batch_{b}.bin", records(splits.x_train[idx], splits.y_train[idx]))
        add(archive, "test_batch.bin", records(splits.x_test, splits.y_test))
        add(archive, "batches.meta.txt", "\n".join(class_names or splits.class_names).encode() + b"\n")
    return path
