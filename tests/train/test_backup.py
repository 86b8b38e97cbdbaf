"""train.backup: a kill during a save leaves the last whole backup, and a restart resumes from it."""

import json

import keras
import numpy as np
import pytest

from train import backup


class Killed(BaseException):
    """What a SIGKILL during the write would leave: the code after it never runs."""


class StopAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.begun = epoch, []

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Killed
        self.begun.append(epoch)


def tiny_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype("float32"), rng.integers(0, 3, 32)


def test_a_kill_while_the_backup_is_written_leaves_the_previous_epochs_and_a_restart_resumes_from_it(tmp_path):
    directory = str(tmp_path / "backup")
    x, y = data()
    model = tiny_model()
    with pytest.raises(Killed):  # two epochs backed up, then the process stops
        model.fit(x, y, epochs=4, verbose=0, callbacks=[backup.Backup(directory), StopAt(2)])
    assert backup.epochs_done(directory) == 2
    after_two = [w.copy() for w in model.get_weights()]

    def killed_mid_write(filepath, overwrite=True):
        with open(filepath, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n")  # an HDF5 file's first bytes and no more
        raise Killed

    model.save_weights = killed_mid_write  # the third epoch's save is cut short
    with pytest.raises(Killed):
        model.fit(x, y, initial_epoch=2, epochs=4, verbose=0, callbacks=[backup.Backup(directory)])
    assert backup.epochs_done(directory) == 2

    restarted, seen = tiny_model(), StopAt(None)
    loaded = []

    class Weights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            loaded.extend(w.copy() for w in self.model.get_weights())

    restarted.fit(x, y, epochs=4, verbose=0, callbacks=[backup.Backup(directory), Weights(), seen])
    assert seen.begun == [2, 3]  # epochs 3 and 4, from the two the backup held
    for got, want in zip(loaded[: len(after_two)], after_two):
        np.testing.assert_array_equal(got, want)
    assert not (tmp_path / "backup").exists()  # a finished run removes its backup


def test_resumes_lists_every_restart_and_only_the_chief_writes_it(tmp_path):
    assert backup.resumes(str(tmp_path), chief=True) == []  # no backup: a first start
    model = tiny_model()
    model.fit(*data(), epochs=1, verbose=0)
    (tmp_path / "backup").mkdir()
    from train import handover

    handover.save_weights_atomically(model, str(tmp_path / "backup" / "latest.weights.h5"), {backup.EPOCH: 3})
    assert backup.resumes(str(tmp_path), chief=False) == [3]
    assert not (tmp_path / backup.RESUMED_FILE).exists()
    assert backup.resumes(str(tmp_path), chief=True) == [3]
    assert backup.resumes(str(tmp_path), chief=True) == [3, 3]  # killed again before another epoch ended
    assert json.loads((tmp_path / backup.RESUMED_FILE).read_text()) == [3, 3]
