"""``python -m train`` for the multi-process tests, with two test hooks around the trainer's callbacks.

Run as ``python tests/support/multiprocess_worker.py DIGESTS STOP_AFTER [train flags...]``:

* after every epoch each process appends ``EPOCH SHA256`` of its model and optimizer variables
  to ``DIGESTS/process-N.txt`` (after the backup is written: it is the last callback);
* ``STOP_AFTER`` > 0: the process kills itself (SIGKILL) after that many epochs of this run,
  leaving its peers in the next step's collectives.
"""

import hashlib
import os
import signal
import sys

import numpy as np

from train import cli, trainer


def digest_callback(directory, stop_after):
    import jax
    import keras  # only now: the trainer picks Keras's backend before it first loads

    keras.config.disable_traceback_filtering()

    class Digest(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = 0

        def on_epoch_end(self, epoch, logs=None):
            digest = hashlib.sha256()
            for variable in list(self.model.variables) + list(self.model.optimizer.variables):
                digest.update(np.ascontiguousarray(np.asarray(variable.value)).tobytes())
            with open(os.path.join(directory, f"process-{jax.process_index()}.txt"), "a") as f:
                f.write(f"{epoch} {digest.hexdigest()} {logs['loss']:.6f}\n")
            self.epochs += 1
            if stop_after and self.epochs >= stop_after:
                os.kill(os.getpid(), signal.SIGKILL)

    return Digest()


def main():
    directory, stop_after, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    os.makedirs(directory, exist_ok=True)
    callbacks = trainer._callbacks

    def with_digest(*args):  # whatever the trainer's callbacks take, plus the digest
        return callbacks(*args) + [digest_callback(directory, stop_after)]

    trainer._callbacks = with_digest
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
