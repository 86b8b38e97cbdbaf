"""Multi-process JAX training on this CPU: processes joined by ``keras.distribution.initialize()``.

Each process is ``python -m train`` (through ``tests/support/multiprocess_worker.py``, which adds a digest
of every process's variables after each epoch) with ``KERAS_DISTRIBUTION_*`` set as the
Kubernetes Jobs set them. Every wait is on a process or a file, with a generous deadline.
"""

import csv
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import synthetic
from multiprocess_run import DEADLINE_S, FLAGS, REPO, WORKER, digests, finish, log_tail
from contract import MANIFEST_FILE, WEIGHTS_FILE
from contract.recipe import Recipe

GLOBAL_BATCH = 16
EPOCHS = 3


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start(data, output, digests, processes, devices_per_process=1, epochs=EPOCHS, stop_after=None):
    """Start ``processes`` training processes; ``stop_after`` maps a process id to the epochs after which it dies."""
    port = free_port()
    batch = GLOBAL_BATCH // (processes * devices_per_process)
    procs = []
    for i in range(processes):
        env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS")}
        env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO,
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}")
        if processes > 1:
            env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=",".join(f"localhost:{port}" for _ in range(processes)),
                       KERAS_DISTRIBUTION_NUM_PROCESSES=str(processes), KERAS_DISTRIBUTION_PROCESS_ID=str(i))
        command = [sys.executable, WORKER, str(digests), str((stop_after or {}).get(i, 0)), *FLAGS,
                   "--data", str(data), "--output", str(output), "--epochs", str(epochs), "--batch-size", str(batch)]
        log = open(f"{output}.process-{i}.log", "a")  # a restart appends to the first run's log
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def history(output):
    with open(os.path.join(output, "history.csv")) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    splits = synthetic.make_splits(train_per_class=32, test_per_class=8)  # 96 images: 6 global batches
    return synthetic.write_tree(tmp_path_factory.mktemp("mp-data"), splits)


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory, data):
    """Two processes with two host devices each (4 replicas of 4 images), trained to the end."""
    tmp = tmp_path_factory.mktemp("mp-pair")
    output, sums = tmp / "run", tmp / "digests"
    finish(start(data, output, sums, processes=2, devices_per_process=2), output)
    return output, sums


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, data):
    """One process, one device, the same global batch of 16 and seed."""
    tmp = tmp_path_factory.mktemp("mp-single")
    output, sums = tmp / "run", tmp / "digests"
    finish(start(data, output, sums, processes=1), output)
    return output, sums


def test_two_processes_keep_identical_weights_after_every_epoch_and_only_process_0_writes(pair_run):
    output, sums = pair_run
    first, second = digests(sums, 0), digests(sums, 1)
    assert [epoch for epoch, _, _ in first] == list(range(EPOCHS))
    assert [(e, sha) for e, sha, _ in first] == [(e, sha) for e, sha, _ in second]
    assert len({sha for _, sha, _ in first}) == EPOCHS  # the weights moved every epoch (no empty epoch)

    manifest = json.loads((output / MANIFEST_FILE).read_text())
    training = manifest["training"]
    assert (training["keras_backend"], training["strategy"], training["replicas"]) == ("jax", "DataParallel", 4)
    assert (training["global_batch"], training["recipe"]["batch_size"]) == (GLOBAL_BATCH, 4)
    assert (training["recipe"]["epochs"], training["steps_per_epoch"]) == (EPOCHS, 96 // GLOBAL_BATCH)
    assert [int(row["epoch"]) for row in history(output)] == list(range(EPOCHS))
    assert manifest["metrics"]["test_accuracy"] > 0.6  # three classes: chance is 0.33
    # Process 0 wrote the run; the other process wrote nothing beside it or inside it.
    assert not (output / "backup").exists()
    assert sorted(p.name for p in output.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.name for p in output.parent.iterdir()) == ["digests", "run", "run.process-0.log",
                                                             "run.process-1.log"]


def test_two_processes_train_as_one_process_with_the_same_global_batch(pair_run, single_run):
    (pair, pair_sums), (single, single_sums) = pair_run, single_run
    pair_losses = [loss for _, _, loss in digests(pair_sums, 0)]
    single_losses = [loss for _, _, loss in digests(single_sums, 0)]
    # The same batches and seed: only the order of the float32 sums differs (measured: < 1e-4).
    np.testing.assert_allclose(pair_losses, single_losses, rtol=2e-3)
    pair_manifest = json.loads((pair / MANIFEST_FILE).read_text())
    single_manifest = json.loads((single / MANIFEST_FILE).read_text())
    assert single_manifest["training"]["replicas"] == 1
    assert single_manifest["training"]["global_batch"] == pair_manifest["training"]["global_batch"] == GLOBAL_BATCH
    assert single_manifest["training"]["peak_learning_rate"] == pair_manifest["training"]["peak_learning_rate"]
    # 24 test images: one image is 0.042.
    assert abs(pair_manifest["metrics"]["test_accuracy"] - single_manifest["metrics"]["test_accuracy"]) <= 0.05


def test_weights_of_two_processes_export_under_tensorflow_with_the_fingerprint(pair_run, tmp_path):
    from export import exporter

    output, _ = pair_run
    version = exporter.run(run_dir=str(output), model_dir=str(tmp_path), name="cifar10", verbose=0)  # fingerprint
    published = json.loads((tmp_path / "cifar10" / "1" / "assets.extra" / "manifest.json").read_text())
    assert published["training"]["replicas"] == 4 and os.path.basename(version) == "1"
    assert (tmp_path / "cifar10" / "1" / "saved_model.pb").exists()


def test_a_killed_process_and_a_restart_of_both_resume_from_the_last_finished_epoch(tmp_path, data):
    output, sums = tmp_path / "run", tmp_path / "digests"
    # Process 1 is killed right after its first epoch; process 0's next collective then fails, and it ends
    # at once with one line naming process 1 (not in JAX's shutdown, after the heartbeat timeout).
    first, second = start(data, output, sums, processes=2, stop_after={1: 1})
    assert second.wait(timeout=DEADLINE_S) == -signal.SIGKILL, log_tail(output, 1)
    assert first.wait(timeout=DEADLINE_S) == 3, log_tail(output, 0)  # train.hardware.LOST_PROCESS_EXIT
    assert "error: process 0 of 2: process 1 at 127.0.0.1 was lost mid-run" in log_tail(output, 0)
    assert [e for e, _, _ in digests(sums, 0)] == [0] and not (output / MANIFEST_FILE).exists()
    assert (output / "backup" / "latest.weights.h5").exists()

    finish(start(data, output, sums, processes=2), output)  # the same command again, on both
    zero, one = digests(sums, 0), digests(sums, 1)
    assert [e for e, _, _ in zero] == [e for e, _, _ in one] == [0, 1, 2]  # epochs 2 and 3 after the restart
    assert [sha for _, sha, _ in zero] == [sha for _, sha, _ in one]
    assert [int(row["epoch"]) for row in history(output)] == [0, 1, 2]
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    assert manifest["training"]["recipe"]["epochs"] == EPOCHS and manifest["metrics"]["test_accuracy"] > 0.6
    assert manifest["training"]["resumed_from_epochs"] == [1]
    assert (output / WEIGHTS_FILE).exists() and not (output / "backup").exists()


@pytest.mark.parametrize("pipeline", ["data", "arrays"])
def test_the_parts_of_a_global_batch_are_the_batch_one_process_makes(pipeline):
    """Each process's part is its rows of the batch one process would make (NumPy: augmentation included).

    tf.data's random augmentation is not reproducible batch for batch even in one process (its
    parallel map takes random numbers in whatever order its calls run), so it is compared unaugmented.
    """
    import tensorflow as tf

    from train import arrays, data

    splits = synthetic.make_splits(train_per_class=16, test_per_class=5)  # 48 and 15 images
    module = data if pipeline == "data" else arrays

    def batches(shard, count=2):
        tf.random.set_seed(7)  # what keras.utils.set_random_seed does in every process
        train = module.train_dataset(splits.x_train, splits.y_train, 16, Recipe(augment=pipeline == "arrays"), seed=7,
                                     shard=shard)
        evaluation = module.eval_dataset(splits.x_test, splits.y_test, 16, shard=shard)
        if pipeline == "data":
            return [[np.asarray(t) for t in b] for b in list(train)[:count]], [[np.asarray(t) for t in b] for b in evaluation]
        return [train[i] for i in range(count)], [evaluation[i] for i in range(len(evaluation))]

    whole_train, whole_eval = batches((0, 1))
    parts = [batches((i, 4)) for i in range(4)]
    for got, whole in ((0, whole_train), (1, whole_eval)):
        for b, columns in enumerate(whole):
            for c, column in enumerate(columns):
                joined = np.concatenate([part[got][b][c] for part in parts])
                np.testing.assert_array_equal(joined, column)
                assert len(parts[0][got][b][c]) == len(column) // 4
    assert sum(part[1][-1][2].sum() for part in parts) == 15  # every test image counted once, by one process


def test_a_part_that_does_not_divide_the_global_batch_is_refused():
    from train import data

    with pytest.raises(ValueError, match="cannot take part 0 of 3 from global batches of 16"):
        data.check_shard((0, 3), 16)
    with pytest.raises(ValueError, match="cannot take part 2 of 2"):
        data.check_shard((2, 2), 16)
