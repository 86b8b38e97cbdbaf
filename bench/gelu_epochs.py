"""Whole training epochs of an airbench model with the fused GELU or TensorFlow's: the trainer itself, timed.

``bench/airbench_step_profile.py`` times one train step on a batch in memory; this runs
``train.trainer`` as ``python -m train`` does (the zip's images, the held-out slice, tf.data's
translations and alternating flips, the recipe's callbacks) for a few epochs and reports each
epoch's time from the run's ``history.csv``. ``--gelu keras`` puts ``keras.activations.gelu``
(TensorFlow's own kernels) in the layer while training, the control. Run the two alternately on one
machine, with ``vmstat`` beside them, since these machines' hosts take CPU::

    for gelu in keras fused keras fused; do
        python bench/gelu_epochs.py --data ../shared/data/cifar10-png.zip --gelu $gelu --epochs 2 \\
            --json bench/results/gelu-epochs-$gelu-$(date +%s).json
    done

The first epoch includes the graph's tracing and compilation; the later ones are the steady state.
"""

import argparse
import os
import platform
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emit import emit  # noqa: E402  (bench/, the script's own folder)
from gelu_kernels import add_gelu_argument, use_gelu  # noqa: E402  (imports neither TensorFlow nor JAX)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="as the trainer's --data")
    parser.add_argument("--model", default="airbench_muon", choices=("airbench", "airbench_fast", "airbench_muon"))
    add_gelu_argument(parser)
    parser.add_argument("--epochs", type=int, default=2, help="epochs to time (default: %(default)s)")
    parser.add_argument("--holdout", type=int, default=5000, help="as the trainer's (default: %(default)s)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from train import report, trainer

    use_gelu(args.gelu)
    with tempfile.TemporaryDirectory() as output:
        manifest = trainer.run(trainer.Config(data=args.data, output=output, model=args.model, holdout=args.holdout,
                                              recipe={"epochs": args.epochs}, validation_freq=10**6, verbose=0))
        epochs = [round(row["epoch_time_s"], 1) for row in report.read_history(os.path.join(output, "history.csv"))]
    training = manifest["training"]
    emit({"model": args.model, "gelu": args.gelu, "precision": training["precision"],
          "steps_per_epoch": training["steps_per_epoch"], "epoch_seconds": epochs,
          "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}, args.json)


if __name__ == "__main__":
    main()
