"""The run's backup (``RUN/backup/``): what a restart after a kill, a preemption or a lost host resumes from.

Keras's ``BackupAndRestore`` writes the weights in place and then the epoch beside them in
``training_metadata.json``: a kill while it writes leaves weights a restart cannot load, and one between
the two files leaves weights an epoch ahead of the epoch the restart begins at. :class:`Backup` writes
the epoch into the weights file itself, under a temporary name, and renames it over the last backup:
each save is one rename, so a restart finds the last whole epoch's backup or, killed mid-save, the one
before it, never a part. Only the chief writes it; every process reads it.

The epochs a run resumed from are kept in ``RUN/resumed.json`` (:func:`resumes`); the manifest
records them (``training.resumed_from_epochs``).
"""

import json
import os

import h5py
import keras

from contract import replaced_atomically
from train import handover

EPOCH = "epochs_done"  # the attribute of the backup's weights file: the epochs the weights have trained
RESUMED_FILE = "resumed.json"


class Backup(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore`` with each save one rename; ``chief``: whether this process writes."""

    def __init__(self, backup_dir, chief=True):
        super().__init__(backup_dir)
        self.chief = chief

    def _save_model(self):
        if not self.chief:
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        handover.save_weights_atomically(self.model, self._weights_path, {EPOCH: self._current_epoch})

    def _load_model(self):
        super()._load_model()  # the weights; Keras's own metadata file is never written here
        if os.path.exists(self._weights_path):
            self.model._initial_epoch = epochs_done(self.backup_dir)  # what Keras sets from its metadata

    def on_train_end(self, logs=None):
        if self.chief:
            super().on_train_end(logs)  # deletes the backup


def epochs_done(backup_dir):
    """The epochs the backup in ``backup_dir`` has trained, or None when there is none."""
    path = os.path.join(backup_dir, "latest.weights.h5")  # BackupAndRestore's name for it
    if not os.path.exists(path):
        return None
    with h5py.File(path, "r") as f:
        return int(f.attrs[EPOCH])


def resumes(workdir, chief):
    """The epochs this run has resumed from after interruptions, in order; this start's is last if it resumes.

    The chief keeps the list in ``workdir/resumed.json``, replaced whole, so each restart adds to it."""
    path = os.path.join(workdir, RESUMED_FILE)
    resumed = []
    if os.path.exists(path):
        with open(path) as f:
            resumed = json.load(f)
    epoch = epochs_done(os.path.join(workdir, "backup"))
    if epoch is None:
        return resumed
    resumed.append(epoch)
    if chief:
        with replaced_atomically(path, ".json") as tmp, open(tmp, "w") as f:
            json.dump(resumed, f)
    return resumed
