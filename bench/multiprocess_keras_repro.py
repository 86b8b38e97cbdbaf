"""The smallest reproduction of Keras 3's multi-process JAX fault, and the workaround train/ uses.

Two JAX processes on this machine's CPU (gloo collectives), ``keras.distribution.DataParallel``
over their two devices, a tf.data dataset of 4 global batches, ``steps_per_epoch=4``:

* ``keras``: Keras shards the dataset itself (``distribute_dataset``: ``rebatch`` + ``shard``).
  The result has no known length (cardinality -2), so Keras's epoch iterator, given
  ``steps_per_epoch``, keeps one iterator across epochs and finds it exhausted in epoch 2:
  "Your input ran out of data", and epoch 2 trains nothing (its loss is epoch 1's). With
  validation data as well (as train/ has), the JAX trainer's variables stay purged after that
  empty epoch and the next read fails: ``TypeError: 'NoneType' object is not callable`` in
  ``keras/src/backend/common/variables.py``.
* ``own``: each process cuts its own half of every global batch and Keras's sharding is off
  (``auto_shard_dataset=False``): the dataset keeps its length, every epoch trains.

    python bench/multiprocess_keras_repro.py keras    # epoch 2 empty, the warning
    python bench/multiprocess_keras_repro.py own      # three epochs, three losses

Seen with keras 3.15.1, jax 0.10.2, tensorflow 2.21.0.
"""

import os
import subprocess
import sys

WORKER = r"""
import os, sys
mode, pid = sys.argv[1], int(sys.argv[2])
os.environ.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", KERAS_DISTRIBUTION_JOB_ADDRESSES="localhost:12391",
                  KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(pid))
import tensorflow as tf
import jax, keras, numpy as np
keras.distribution.initialize()
keras.utils.set_random_seed(0)
dist = keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=(mode == "keras"))
keras.distribution.set_distribution(dist)
x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
if mode == "own":
    ds = ds.map(lambda a, b: (a[pid * 8:(pid + 1) * 8], b[pid * 8:(pid + 1) * 8]))
print(f"process {pid}: dataset length as Keras sees it:",
      int((dist.distribute_dataset(ds) if mode == "keras" else ds).cardinality()), flush=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(ds, epochs=3, steps_per_epoch=4, verbose=0)
print(f"process {pid}: loss per epoch", [round(v, 6) for v in history.history["loss"]], flush=True)
"""


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "keras"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, mode, str(i)], env=env) for i in range(2)]
    return max(p.wait(timeout=600) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
