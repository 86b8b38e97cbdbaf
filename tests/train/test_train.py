import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE, SAMPLES_FILE, WEIGHTS_FILE
from contract.recipe import Recipe
from train import cli, data, hardware, models, report, tf_devices, trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the models -------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.model_names())
def test_model_outputs_probabilities_for_raw_pixels(name):
    import keras

    model = models.build_model(name, num_classes=7)
    probabilities = model(models.fingerprint_images(1, count=4).astype("float32"), training=False).numpy()
    assert probabilities.shape == (4, 7)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert all(not layer.name.startswith(("input_layer", "conv2d", "dense")) for layer in model.layers), (
        "every layer has a chosen name, not an auto-generated one"
    )
    assert model.input_shape == (None, 32, 32, 3)
    assert isinstance(model, keras.Model)


def test_seed_cnn_is_the_tutorial_network_layer_for_layer():
    model = models.build_model("seed_cnn", num_classes=10)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == [
        "InputLayer", "BatchNormalization", "Conv2D", "Conv2D", "MaxPooling2D", "Dropout",
        "BatchNormalization", "Conv2D", "Conv2D", "MaxPooling2D", "Dropout",
        "Flatten", "Dense", "Dropout", "Dense",
    ]
    convs = [layer for layer in model.layers if type(layer).__name__ == "Conv2D"]
    assert [(c.filters, c.padding) for c in convs] == [(32, "same"), (32, "same"), (64, "same"), (64, "valid")]
    assert model.count_params() == 1_676_982  # the tutorial's summary, plus the input BatchNormalization


def test_output_stays_float32_under_mixed_precision():
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        for name in models.model_names():
            model = models.build_model(name, num_classes=3)
            assert model.layers[1].compute_dtype == "bfloat16"
            assert model.output.dtype == "float32"
            assert all(w.dtype == "float32" for w in model.weights), "variables stay float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="known models: airbench, airbench_fast, airbench_muon, airbench_muon_wide, seed_cnn"):
        models.build_model("vgg", num_classes=10)


def test_fingerprint_images_are_deterministic():
    np.testing.assert_array_equal(models.fingerprint_images(7), models.fingerprint_images(7))
    assert not np.array_equal(models.fingerprint_images(7), models.fingerprint_images(8))


# --- loaders ----------------------------------------------------------------------------


def test_folder_zip_and_tarball_load_the_same_images(tmp_path, splits):
    folder = data.load(str(synthetic.write_tree(tmp_path / "tree", splits)))
    archive = data.load(str(synthetic.write_zip(tmp_path / "data.zip", splits)))
    tarball = data.load(str(synthetic.write_cifar_binary(tmp_path / "cifar-10-binary.tar.gz", splits)))
    for loaded in (folder, archive):
        assert loaded.class_names == sorted(synthetic.CLASS_NAMES)
    assert tarball.class_names == list(synthetic.CLASS_NAMES)  # batches.meta.txt order
    # PNG is lossless, so every loader gives back exactly the images written (in its own order).
    for loaded in (folder, archive, tarball):
        assert loaded.x_train.shape == splits.x_train.shape and loaded.x_train.dtype == np.uint8
        assert loaded.x_test.shape == splits.x_test.shape
        for x, y, original_x, original_y in (
            (loaded.x_train, loaded.y_train, splits.x_train, splits.y_train),
            (loaded.x_test, loaded.y_test, splits.x_test, splits.y_test),
        ):
            names = [loaded.class_names[i] for i in y]
            original_names = [splits.class_names[i] for i in original_y]
            got = sorted((n, img.tobytes()) for n, img in zip(names, x))
            want = sorted((n, img.tobytes()) for n, img in zip(original_names, original_x))
            assert got == want


def test_zip_with_a_wrapping_folder(tmp_path, splits):
    import zipfile

    path = tmp_path / "wrapped.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i, (image, label) in enumerate(zip(splits.x_train[:6], splits.y_train[:6])):
            archive.writestr(f"mydata/train/{splits.class_names[label]}/{i}.png", synthetic.encode(image))
            archive.writestr(f"mydata/test/{splits.class_names[label]}/{i}.png", synthetic.encode(image))
    loaded = data.load(str(path))
    assert len(loaded.x_train) == 6 and loaded.num_classes == len(set(splits.y_train[:6].tolist()))


def test_any_size_and_mode_becomes_32x32_rgb(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    variants = {
        "gray.png": Image.fromarray(rng.integers(0, 255, (40, 50), dtype=np.uint8), "L"),
        "rgba.png": Image.fromarray(rng.integers(0, 255, (20, 20, 4), dtype=np.uint8), "RGBA"),
        "palette.gif": Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).convert("P"),
        "big.jpg": Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)),
    }
    for split in ("train", "test"):
        for cls in ("a", "b"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for name, image in variants.items():
                image.save(folder / name)
    loaded = data.load(str(tmp_path))
    assert loaded.x_train.shape == (8, 32, 32, 3) and loaded.x_train.dtype == np.uint8


def _make_tree(root, classes, per_class=2):
    x, _ = synthetic.make_images(per_class)
    for split in ("train", "test"):
        for cls in classes:
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                (folder / f"{i}.png").write_bytes(synthetic.encode(x[i]))


def _bad_data(kind, tmp_path):
    root = tmp_path / "data"
    if kind == "missing":
        return str(tmp_path / "nowhere"), "does not exist"
    if kind == "not_data":
        (tmp_path / "notes.txt").write_text("hello")
        return str(tmp_path / "notes.txt"), "neither a folder"
    _make_tree(root, ["cat", "dog"])
    if kind == "empty_class":
        (root / "train" / "emu").mkdir()
        (root / "test" / "emu").mkdir()
        return str(root), "train/emu has no images"
    if kind == "single_class":
        root = tmp_path / "one"
        _make_tree(root, ["cat"])
        return str(root), "at least 2 classes"
    if kind == "class_mismatch":
        _make_tree(root, ["cat", "dog"])
        (root / "test" / "dog").rename(root / "test" / "fox")
        return str(root), "classes differ"
    if kind == "undecodable":
        (root / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
        return str(root), "cannot decode image"
    if kind == "no_test_split":
        import shutil

        shutil.rmtree(root / "test")
        return str(root), "no test/ folder"
    raise AssertionError(kind)


BAD_DATA = ["missing", "not_data", "empty_class", "single_class", "class_mismatch", "undecodable", "no_test_split"]


@pytest.mark.parametrize("kind", BAD_DATA)
def test_bad_data_is_one_line_and_exit_2_and_output_survives(kind, tmp_path, capsys):
    source, message = _bad_data(kind, tmp_path)
    output = tmp_path / "out"
    output.mkdir()
    (output / "precious.txt").write_text("keep me")
    code = cli.main(["--data", source, "--output", str(output), "--tpu", "none", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and message in err and "\n" not in err and "Traceback" not in err
    assert sorted(os.listdir(output)) == ["precious.txt"]
    assert (output / "precious.txt").read_text() == "keep me"


def test_corrupt_tarball_is_a_clear_error(tmp_path):
    import tarfile, io  # noqa: E401

    path = tmp_path / "cifar-10-binary.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
        info.size = 100
        archive.addfile(info, io.BytesIO(b"x" * 100))
        info = tarfile.TarInfo("cifar-10-batches-bin/test_batch.bin")
        info.size = 100
        archive.addfile(info, io.BytesIO(b"x" * 100))
    with pytest.raises(data.DataError, match="not whole 3073-byte CIFAR-10 records"):
        data.load(str(path))


def test_a_tpu_that_is_not_there_is_an_error_not_a_fallback(tmp_path, capsys):
    _make_tree(tmp_path / "data", ["cat", "dog"])
    code = cli.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--tpu", "local", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: TPU 'local' is not available") and "\n" not in err
    assert err.endswith("train on them with --keras-backend jax")  # this process trains on TensorFlow
    assert not (tmp_path / "out").exists()


def test_tensorflow_on_a_tpu_host_trains_on_the_cpu_and_says_jax_would_use_the_tpu(monkeypatch):
    monkeypatch.setattr(tf_devices, "tpu_present", lambda: True)
    placement = tf_devices.placement("auto")
    assert (placement.name, placement.hardware) == ("_DefaultDistributionStrategy", "cpu")
    assert placement.note == ("a TPU is present, but TensorFlow trains on the CPU: no TensorFlow build runs on "
                              "current TPUs; train on them with --keras-backend jax")


def test_bad_flags_exit_2(capsys):
    for argv in (["--precision", "float8"], ["--profile-steps", "5"], ["--epochs", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2


# --- the pipeline -----------------------------------------------------------------------


def test_training_batches_have_static_shapes_and_augmentation_crops_and_flips():
    import tensorflow as tf

    x, y = synthetic.make_images(10)
    ds = data.train_dataset(x, y, global_batch=8, recipe=Recipe(augment=True), seed=1)
    assert ds.element_spec[0].shape == (8, 32, 32, 3), "drop_remainder gives the static shape a TPU needs"
    images = tf.constant(x[:16])
    out = data.augment(images).numpy()
    padded = np.pad(x[:16], [(0, 0), (4, 4), (4, 4), (0, 0)], mode="reflect")
    for original, crop in zip(padded, out):
        windows = [original[dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(np.array_equal(crop, w) or np.array_equal(crop, w[:, ::-1]) for w in windows)
    flipped_only = data.augment(images, pad=0).numpy()
    for original, out_image in zip(x[:16], flipped_only):
        assert np.array_equal(out_image, original) or np.array_equal(out_image, original[:, ::-1])
    assert any(not np.array_equal(o, f) for o, f in zip(x[:16], flipped_only)), "some images are flipped"


def test_evaluation_counts_every_test_image_once():
    x, y = synthetic.make_images(7)  # 21 images: not a multiple of the batch
    batches = list(data.eval_dataset(x, y, global_batch=8))
    assert all(b[0].shape[0] == 8 for b in batches)
    weights = np.concatenate([b[2].numpy() for b in batches])
    images = np.concatenate([b[0].numpy() for b in batches])[weights > 0]
    assert weights.sum() == len(x)
    np.testing.assert_array_equal(images.astype(np.uint8), x)


def test_precision_auto():
    assert hardware.resolve_precision("auto", "tpu") == "mixed_bfloat16"
    assert hardware.resolve_precision("auto", "gpu") == "mixed_float16"
    expected = "mixed_bfloat16" if hardware.cpu_has_bf16() else "float32"
    assert hardware.resolve_precision("auto", "cpu") == expected
    assert hardware.resolve_precision("float32", "tpu") == "float32"


# --- a real run -------------------------------------------------------------------------


def test_short_real_fit_learns(trained_run):
    manifest = json.loads((trained_run / MANIFEST_FILE).read_text())
    assert manifest["metrics"]["test_accuracy"] > 0.8  # three classes: chance is 0.33
    assert manifest["metrics"]["test_images"] == 48


def test_run_directory_holds_everything_export_needs(trained_run, splits):
    manifest = json.loads((trained_run / MANIFEST_FILE).read_text())
    assert manifest["model"] == {"name": "seed_cnn", "kwargs": {}}
    assert manifest["class_names"] == list(synthetic.CLASS_NAMES)
    assert manifest["input"]["dtype"] == "uint8" and manifest["input"]["shape"] == [32, 32, 3]
    assert manifest["training"]["recipe"]["epochs"] == 4 and manifest["training"]["global_batch"] == 16
    assert set(manifest["versions"]) >= {"tensorflow", "keras", "python"}
    for path in ("eval/metrics.json", "eval/confusion.png", "history.csv", "curves.png", "logs", WEIGHTS_FILE):
        assert (trained_run / path).exists(), path
    assert not (trained_run / "backup").exists(), "the backup is removed once training finishes"
    assert list((trained_run / "logs" / "train" / "plugins" / "profile").glob("*/*.xplane.pb")), "--profile-steps"
    assert [r["epoch"] for r in report.read_history(str(trained_run / "history.csv"))] == [0, 1, 2, 3]
    metrics = json.loads((trained_run / "eval" / "metrics.json").read_text())
    assert np.asarray(metrics["confusion_matrix"]).sum() == len(splits.x_test)
    assert set(metrics["per_class_accuracy"]) == set(synthetic.CLASS_NAMES)


def test_the_samples_hold_every_test_image_up_to_1000_for_exports_int8_gate(trained_run, splits, tmp_path):
    from train import handover

    with np.load(trained_run / SAMPLES_FILE) as sample:
        np.testing.assert_array_equal(sample["test_images"], splits.x_test)  # 48: every one
        np.testing.assert_array_equal(sample["test_labels"], splits.y_test)

    def numbered(count):  # image i carries i in its first two bytes, so a sample shows which it holds
        images = np.zeros((count, 32, 32, 3), np.uint8)
        images[:, 0, 0, 0], images[:, 0, 0, 1] = np.arange(count) % 256, np.arange(count) // 256
        return images, np.arange(count) % 3

    large = data.Splits(*numbered(1_200), *numbered(1_500), list(synthetic.CLASS_NAMES), "synthetic")
    recorded = handover.write_samples(large, str(tmp_path / SAMPLES_FILE), seed=0)
    assert (recorded.train, recorded.test) == (500, 1_000)
    with np.load(tmp_path / SAMPLES_FILE) as sample:
        for split, count in (("train", 500), ("test", 1_000)):
            corner = sample[f"{split}_images"][:, 0, 0].astype(int)
            ids = corner[:, 0] + 256 * corner[:, 1]
            assert len(set(ids.tolist())) == count and np.array_equal(sample[f"{split}_labels"], ids % 3)


def test_weights_reproduce_the_fingerprint(trained_run):
    manifest = json.loads((trained_run / MANIFEST_FILE).read_text())
    model = models.build_model("seed_cnn", num_classes=3)
    model.load_weights(str(trained_run / WEIGHTS_FILE))
    images = models.fingerprint_images(manifest["fingerprint"]["seed"])
    outputs = model(images.astype("float32"), training=False).numpy()
    np.testing.assert_allclose(outputs, manifest["fingerprint"]["outputs"], atol=1e-6)


def test_rerunning_a_finished_run_keeps_it(trained_run, capsys):
    before = (trained_run / WEIGHTS_FILE).read_bytes()
    manifest = trainer.run(trainer.Config(output=str(trained_run), tpu="none", verbose=1))
    assert "already holds a finished run" in capsys.readouterr().out
    assert (trained_run / WEIGHTS_FILE).read_bytes() == before
    assert manifest["model"]["name"] == "seed_cnn"


def test_a_run_in_an_older_manifest_format_is_refused_with_the_commands_that_rebuild_it(tmp_path, capsys):
    from contract import manifest as manifests
    from train import cli

    output = tmp_path / "old-run"
    output.mkdir()
    (output / MANIFEST_FILE).write_text(json.dumps({"format": 2, "model": {"name": "seed_cnn"}}))
    assert cli.main(["--output", str(output), "--tpu", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has manifest format 2, not 4" in err and manifests.REBUILD in err
    assert "pass --overwrite to train again" not in err  # the rebuild command already says it


def test_mirrored_strategy_weights_load_into_a_plain_cpu_model(mirrored_run, mirrored_strategy, splits):
    import keras

    strategy = mirrored_strategy
    manifest = json.loads((mirrored_run / MANIFEST_FILE).read_text())
    assert strategy.num_replicas_in_sync == 8
    assert manifest["training"]["replicas"] == 8
    assert manifest["training"]["global_batch"] == 64
    assert manifest["training"]["strategy"] == "MirroredStrategy"
    assert manifest["training"]["precision"] == "mixed_bfloat16"
    assert manifest["training"]["steps_per_epoch"] == len(splits.x_train) // 64
    assert keras.mixed_precision.global_policy().name == "float32", "the caller's policy is restored"

    probe = models.fingerprint_images(3, count=16).astype("float32")
    with strategy.scope():
        distributed = models.build_model("seed_cnn", num_classes=3)
    distributed.load_weights(str(mirrored_run / WEIGHTS_FILE))
    plain = models.build_model("seed_cnn", num_classes=3)
    plain.load_weights(str(mirrored_run / WEIGHTS_FILE))
    for variable in plain.weights:
        assert variable.dtype == "float32"
    np.testing.assert_allclose(
        distributed.predict(probe, batch_size=16, verbose=0), plain(probe, training=False).numpy(), atol=1e-6
    )


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_killed_run_resumes_at_the_next_epoch(tmp_path, backend):
    """SIGKILL after two of four epochs; the same command then runs epochs 3 and 4 only."""
    x, y = synthetic.make_images(256, seed=3)  # enough steps per epoch to kill between epochs
    from train.data import Splits

    source = synthetic.write_tree(tmp_path / "data", Splits(x, y, x[:30], y[:30], list(synthetic.CLASS_NAMES), ""))
    output = tmp_path / "run"
    command = [sys.executable, "-m", "train", "--data", str(source), "--output", str(output), "--epochs", "4",
               "--batch-size", "16", "--precision", "float32", "--tpu", "none", "--keras-backend", backend]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_BACKEND", None)
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(report.read_history(str(output / "history.csv"))) < 2:
        assert first.poll() is None, "the first run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not (output / MANIFEST_FILE).exists()

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    # progress.Progress's line at each epoch's end: "epoch 3/4 done in 1.2 s: ..."
    epochs_run = [line.split()[1] for line in second.stdout.splitlines() if line.startswith("epoch ") and " done" in line]
    finished = len([e for e in report.read_history(str(output / "history.csv")) if e["epoch"] < 2])
    assert finished == 2
    assert epochs_run and epochs_run[0] in ("3/4", "4/4") and epochs_run[-1] == "4/4"
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    assert manifest["training"]["recipe"]["epochs"] == 4 and manifest["training"]["keras_backend"] == backend
    assert [r["epoch"] for r in report.read_history(str(output / "history.csv"))] == [0, 1, 2, 3]
    resumed_from = int(epochs_run[0].split("/")[0]) - 1  # the epochs the backup held when the kill came
    assert manifest["training"]["resumed_from_epochs"] == [resumed_from]
    assert f"resuming from the backup after epoch {resumed_from} (restart 1 of this run)" in second.stdout


def test_tf_config_selects_multi_worker_mirrored_strategy():
    """In a fresh process: TensorFlow's cluster setup cannot be undone inside this one."""
    from live_server import free_port

    code = (
        "import tensorflow as tf\n"
        "from train import tf_devices as a\n"
        "s = a.select_strategy('auto')\n"
        "print(isinstance(s, tf.distribute.MultiWorkerMirroredStrategy), a.is_chief(s))\n"
        "try:\n"
        "    a.placement(strategy=s)\n"
        "except a.AcceleratorError as e:\n"
        "    print('refused:', e)\n"
    )
    tf_config = {"cluster": {"worker": [f"localhost:{free_port()}"]}, "task": {"type": "worker", "index": 0}}
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["True", "True"]
    # Keras 3 cannot fit under this strategy (keras-team/keras#20585): a clear refusal, not a traceback mid-fit.
    assert lines[1].startswith("refused: TF_CONFIG asks for multi-worker training") and "#20585" in lines[1]


@pytest.mark.parametrize("task_type, task_id, cluster, chief", [
    ("worker", 0, {"worker": ["a:1", "b:1"]}, True),
    ("worker", 1, {"worker": ["a:1", "b:1"]}, False),
    ("chief", 0, {"chief": ["c:1"], "worker": ["a:1"]}, True),
    ("worker", 0, {"chief": ["c:1"], "worker": ["a:1"]}, False),
])
def test_the_chief_is_tf_configs_chief_task_or_else_worker_0(task_type, task_id, cluster, chief):
    assert hardware.is_chief_task(task_type, task_id, cluster) is chief


def test_tf_config_that_is_not_json_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    _make_tree(tmp_path / "data", ["cat", "dog"])
    code = cli.main(["--data", str(tmp_path / "data"), "--output", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert capsys.readouterr().err.strip() == "error: TF_CONFIG is set but is not valid JSON"


# --- the default source, offline ------------------------------------------------------------


@pytest.fixture()
def offline_keras_cache(tmp_path, monkeypatch):
    """Keras's dataset cache in tmp_path, and a network that fails as it does on a machine without DNS."""
    import socket
    import urllib.error

    from keras.src.backend import config
    from keras.src.utils import file_utils

    def unreachable(url, target, progress=None):
        with open(target, "wb") as f:
            f.write(b"\x1f\x8b partial")  # a connection that drops mid-download leaves bytes behind
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    monkeypatch.setattr(config, "_KERAS_DIR", str(tmp_path / "keras"))
    monkeypatch.setattr(file_utils, "urlretrieve", unreachable)
    return tmp_path / "keras" / "datasets"


@pytest.mark.parametrize("cached", ["nothing", "truncated archive"])
def test_offline_download_is_one_line_exit_2_and_leaves_no_poisoned_cache(tmp_path, capsys, offline_keras_cache, cached):
    if cached == "truncated archive":
        offline_keras_cache.mkdir(parents=True)
        (offline_keras_cache / "cifar-10-batches-py-target_archive").write_bytes(b"\x1f\x8b\x08 truncated")
    output = tmp_path / "out"
    output.mkdir()
    (output / "precious.txt").write_text("keep me")
    code = cli.main(["--data", "cifar10", "--output", str(output), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith(f"error: cannot download CIFAR-10 from {data.CIFAR10_URL} (")
    assert "Name or service not known" in err and "--data" in err and "CIFAR_DATA" in err
    assert sorted(os.listdir(output)) == ["precious.txt"]
    assert not list(offline_keras_cache.glob("*_archive")), "no partial archive is left to poison the next run"


def test_every_recipe_field_is_a_flag_and_every_flag_a_recipe_or_run_setting():
    """The flags are made from the fields, so the two cannot drift: a new field is a new flag, with its help and unit."""
    import dataclasses

    from contract.recipe import Recipe

    parser = cli.build_parser()
    options = {action.dest: action for action in parser._actions if action.option_strings and action.dest != "help"}
    recipe_fields = {field.name: field for field in dataclasses.fields(Recipe)}
    run_fields = {field.name for field in dataclasses.fields(trainer.Config)}
    assert set(recipe_fields) <= set(options)
    assert set(options) - set(recipe_fields) - {"quiet"} == run_fields - {"recipe", "verbose"}
    for name, field in recipe_fields.items():
        action = options[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.default is None, name  # unset: the model's own value
        assert field.metadata["help"] in action.help and (field.metadata["unit"] or "") in action.help
    # Each flag sets its field, through the same checks a Recipe makes: a valid value other than the default.
    changed = {name: _another_valid_value(field) for name, field in recipe_fields.items()}
    argv = []
    for name, value in changed.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    config = cli.config_from(parser.parse_args(argv))
    assert config.recipe == changed
    assert trainer._recipe(models.recipe("seed_cnn"), config.recipe) == Recipe(**changed)


def _another_valid_value(field):
    """A value of the recipe's ``field`` that is valid and not its default, so a new field needs no edit here."""
    meta, default = field.metadata, field.default
    if field.type is bool:
        return not default
    if meta["choices"]:
        return next(choice for choice in meta["choices"] if choice != default)
    high = meta["high"] if meta["high"] is not None else default + 2
    if default == high:
        return default - 1 if field.type is int else (default + meta["low"]) / 2
    return default + 1 if field.type is int else (default + high) / 2


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
    (["--label-smoothing", "1.5"], "argument --label-smoothing: must be at most 1.0, got 1.5"),
    (["--learning-rate", "fast"], "argument --learning-rate: 'fast' is not a number"),
    (["--schedule", "cosine"], "argument --schedule: invalid choice: 'cosine'"),
])
def test_a_bad_recipe_flag_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_a_recipe_change_the_recipe_refuses_is_a_usage_error():
    with pytest.raises(ValueError, match="recipe momentum: must be at most 1.0, got 2"):
        trainer._recipe(models.recipe("seed_cnn"), {"momentum": 2})
    with pytest.raises(ValueError, match="the recipe has no field epoch"):
        trainer._recipe(models.recipe("seed_cnn"), {"epoch": 2})


def test_the_input_pipeline_is_decided_once_and_said_when_it_cannot_be():
    # (tf.data beside JAX hides TensorFlow's GPUs, which this process may have set up already: test_jax.py runs it.)
    assert trainer._input_pipeline("auto", "tensorflow") == trainer._input_pipeline("tf.data", "tensorflow") == "tf.data"
    assert trainer._input_pipeline("numpy", "jax") == "numpy"  # JAX on NumPy batches though TensorFlow is here
    with pytest.raises(trainer.UsageError, match="the tensorflow backend trains on tf.data"):
        trainer._input_pipeline("numpy", "tensorflow")
    with pytest.raises(trainer.UsageError, match="'grain' is not one of auto, tf.data, numpy"):
        trainer._input_pipeline("grain", "jax")


def test_seed_cnn_trains_by_its_recipe_block_when_no_flag_says_otherwise():
    """The registry's recipe is the one source of the defaults: the CLI's flags default to None."""
    from train.hardware import Placement

    recipe = models.recipe("seed_cnn")
    config = cli.config_from(cli.build_parser().parse_args(["--precision", "float32"]))
    assert config.recipe == {}  # no flag, no change
    plan = trainer._plan(config, trainer._recipe(recipe, config.recipe),
                         Placement("tensorflow", "test", "cpu", replicas=2), 50_000)
    assert plan.recipe == recipe
    # Two replicas double the global batch; Adam's rate follows its square root.
    assert plan.global_batch == 2 * recipe.batch_size
    assert plan.learning_rate == pytest.approx(recipe.learning_rate * (2 * recipe.batch_size / recipe.reference_batch) ** 0.5)
    assert (recipe.epochs, recipe.batch_size, recipe.crop_padding) == (20, 128, 0)
