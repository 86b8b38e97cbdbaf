"""The one piece of model code every peer server shares: ``model.tflite`` in LiteRT's interpreter.

Each peer server script imports this file from its own virtual environment (it needs only
``ai-edge-litert`` and numpy), so every server runs the same model the same way this project's
``litert`` runtime does: the ``serving_default`` signature, uint8 pixels ``[N, 32, 32, 3]`` in,
softmax ``probabilities`` ``[N, 10]`` out, on as many threads as the process has cores (this
project's default, ``serve/backends/runtimes.py``). The interpreter is made in the process that
calls it (after any fork), and one call runs at a time per process.
"""

import os
import threading

import numpy as np

SIGNATURE = "serving_default"
INPUT = "images"
OUTPUT = "probabilities"


def model_file(model_dir):
    """``model_dir/N/model.tflite`` of the newest version N (``model_dir`` is a ``models/NAME/`` root)."""
    versions = sorted(int(n) for n in os.listdir(model_dir) if n.isdigit() and os.path.isfile(os.path.join(model_dir, n, "model.tflite")))
    if not versions:
        raise FileNotFoundError(f"{model_dir} has no version N/ holding model.tflite")
    return os.path.join(model_dir, str(versions[-1]), "model.tflite")


class LiteRTModel:
    def __init__(self, path, threads=None):
        self.path = path
        self.threads = threads or len(os.sched_getaffinity(0))
        self._lock = threading.Lock()
        self._pid = None
        self._runner = None

    def __getstate__(self):  # a server that spawns its workers pickles the model: send the path, not the interpreter
        return {"path": self.path, "threads": self.threads}

    def __setstate__(self, state):
        self.__init__(state["path"], state["threads"])

    def _load(self):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=self.path, num_threads=self.threads)
        self._runner = interpreter.get_signature_runner(SIGNATURE)
        self._interpreter = interpreter
        self._pid = os.getpid()

    def probabilities(self, pixels):
        """float32 ``[N, C]`` for ``pixels`` (anything numpy reads as ``[N, 32, 32, 3]`` values 0-255)."""
        images = np.ascontiguousarray(pixels, dtype=np.uint8)
        if images.ndim != 4 or images.shape[1:] != (32, 32, 3):
            raise ValueError(f"expected images of shape [N, 32, 32, 3], got {list(images.shape)}")
        with self._lock:
            if self._pid != os.getpid():
                self._load()
            return self._runner(**{INPUT: images})[OUTPUT]
