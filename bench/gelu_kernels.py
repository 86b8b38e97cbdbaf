"""The GELU on one activation of ``airbench``'s size, as TensorFlow computes it and as ``train.airbench.GELU`` trains.

    python bench/gelu_kernels.py [--precision mixed_bfloat16] [--json out.json]

On one 2,000 x 31 x 31 x 24 tensor (the whitening's output for a batch of 2,000), each the mean
of ``--repeats`` after one untimed call, in milliseconds: ``forward``, and ``forward_backward``
(the output and its gradient), for ReLU (the floor of an elementwise op), TensorFlow's exact GELU
(``keras.activations.gelu``) and the fused one (``train.airbench.GELU`` in training mode).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emit import emit  # noqa: E402  (bench/, the script's own folder)
from train.hardware import PRECISIONS  # noqa: E402  (after the path is set)


def add_gelu_argument(parser):
    """The ``--gelu`` flag of the benchmarks that time the fused GELU against TensorFlow's."""
    parser.add_argument("--gelu", choices=("fused", "keras"), default="fused",
                        help="fused: train.airbench.GELU as the trainer runs it; keras: keras.activations.gelu "
                             "when training too (TensorFlow's own kernels), the control")


def use_gelu(choice):
    """Make ``train.airbench.GELU`` train as ``choice`` says (``--gelu``): ``keras`` swaps in the control."""
    if choice == "keras":
        import keras

        from train import airbench

        airbench.GELU.call = lambda self, x, training=False: keras.activations.gelu(x, approximate=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="auto", choices=PRECISIONS, help="as the trainer's flag")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from train import hardware

    hardware.prepare_environment("tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    from train import airbench

    precision = hardware.resolve_precision(args.precision, "cpu")
    dtype = keras.DTypePolicy(precision).compute_dtype
    x = tf.cast(np.random.default_rng(0).standard_normal((2000, 31, 31, 24), dtype=np.float32), dtype)
    fused = airbench.GELU(dtype=precision)
    activations = {
        "relu": tf.nn.relu,
        "tensorflow_gelu": lambda v: keras.activations.gelu(v, approximate=False),
        "fused_gelu": lambda v: fused(v, training=True),
    }

    def milliseconds(call):
        call().numpy()
        started = time.perf_counter()
        for _ in range(args.repeats):
            call().numpy()
        return round((time.perf_counter() - started) / args.repeats * 1000, 1)

    report = {"precision": precision, "shape": list(x.shape), "repeats": args.repeats, "milliseconds": {}}
    for name, activation in activations.items():
        forward = tf.function(activation)

        @tf.function
        def forward_backward(v, activation=activation):
            with tf.GradientTape() as tape:
                tape.watch(v)
                y = activation(v)
            return tape.gradient(y, v, output_gradients=tf.ones_like(y))

        report["milliseconds"][name] = {"forward": milliseconds(lambda: forward(x)),
                                        "forward_backward": milliseconds(lambda: forward_backward(x))}
    emit(report, args.json)


if __name__ == "__main__":
    main()
