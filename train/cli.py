"""``python -m train``: the command line of :mod:`train.trainer` (its flags, and one-line errors).

Typical usage::

    python -m train --model airbench --data ../shared/data/cifar10-jpeg.zip --output runs/airbench
"""

import argparse
import dataclasses
import os
import sys
import tarfile
import zipfile

from contract.arguments import add_renamed, non_negative_int, positive_float, positive_int
from contract.recipe import Recipe, problem
from train import trainer


def _profile_steps(text):
    try:
        first, last = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected two step numbers, e.g. 10,20") from None
    if not 0 < first <= last:
        raise argparse.ArgumentTypeError("expected 0 < A <= B")
    return first, last


def recipe_value(field):
    """An ``argparse`` type for the recipe's ``field``: its type, then its valid values (contract.recipe.problem)."""

    def parse(text):
        try:
            value = field.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if field.type is int else 'a number'}") from None
        why = problem(field, value)
        if why:
            raise argparse.ArgumentTypeError(why)
        return value

    return parse


def add_recipe_flags(parser):
    """One flag per :class:`contract.recipe.Recipe` field, named after it, with its help and unit; each defaults to None (the model's value)."""
    group = parser.add_argument_group(
        "recipe", "the model's training hyperparameters (contract/recipe.py); each flag defaults to the model's "
                  "own value (train/models.py, train/airbench.py)")
    for field in dataclasses.fields(Recipe):
        meta = field.metadata
        flag = "--" + field.name.replace("_", "-")
        help = meta["help"] + (f" ({meta['unit']})" if meta["unit"] else "")
        if field.type is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, help=help)
        elif meta["choices"]:
            group.add_argument(flag, choices=meta["choices"], help=help)
        else:
            group.add_argument(flag, type=recipe_value(field), metavar=meta["metavar"], help=help)


def build_parser():
    from train.hardware import BACKENDS, PRECISIONS

    p = argparse.ArgumentParser(prog="python -m train", description=trainer.__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("CIFAR_DATA", trainer.DEFAULT_DATA),
                   help="'cifar10' (Keras's downloader), a folder or .zip of train/<class>/ and test/<class>/ "
                        "images, or cifar-10-binary.tar.gz (default: $CIFAR_DATA or cifar10)")
    p.add_argument("--output", default=trainer.DEFAULT_OUTPUT, help="run directory for weights, manifest, logs (default: %(default)s)")
    p.add_argument("--model", default=trainer.DEFAULT_MODEL, help="registered model name (default: %(default)s)")
    add_renamed(p, "--keras-backend", "--backend", choices=BACKENDS, default="auto",
                   help="Keras backend: jax (TPUs, GPUs, CPU), tensorflow, or auto: $KERAS_BACKEND if set, "
                        "else jax on a TPU host and tensorflow elsewhere (default: %(default)s)")
    p.add_argument("--input-pipeline", choices=trainer.INPUT_PIPELINES, default="auto",
                   help="how batches are made: tf.data, or numpy (train/arrays.py; jax only); auto: tf.data where "
                        "TensorFlow is installed, else numpy. The manifest records the choice (default: %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto: bfloat16 on TPU and on CPUs with bf16 units, float16 on GPUs (default: %(default)s)")
    p.add_argument("--tpu", nargs="?", const="auto", default="auto",
                   help="TPUs are JAX's: 'auto' (JAX trains on the TPU when it finds one), 'none', or 'local' "
                        "(TPU VM, Colab: an error unless JAX's devices are TPUs); under --keras-backend tensorflow only "
                        "'auto' and 'none' (default: %(default)s)")
    p.add_argument("--steps-per-execution", type=positive_int,
                   help=f"steps per compiled call (default: {trainer.TPU_STEPS_PER_EXECUTION} on TPU, 1 elsewhere)")
    p.add_argument("--validation-freq", type=non_negative_int, default=1, metavar="N",
                   help="evaluate on the test split every N epochs, 0 never while training; the run's test accuracy "
                        "is measured at the end either way (default: every epoch)")
    p.add_argument("--holdout", type=non_negative_int, default=0, metavar="N",
                   help="keep N training images (a fixed seeded choice) out of training, for export to calibrate "
                        "the probabilities and choose the out-of-distribution threshold on (default: none; "
                        "5000 is a tenth of CIFAR-10)")
    p.add_argument("--time-budget", type=positive_float, metavar="SECONDS",
                   help="seconds for the whole run, from start to manifest: after timing its first steps it trains "
                        "the most epochs, up to the recipe's --epochs, predicted to fit, ends the learning-rate "
                        "schedule there, and says what it chose and why (recorded in the manifest; a resumed run "
                        "keeps the choice). Evaluations during training (--validation-freq) come on top. "
                        "(default: no budget, the recipe's epochs)")
    p.add_argument("--profile-steps", type=_profile_steps, metavar="A,B",
                   help="capture a TensorBoard profile of steps A to B")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="train again even if OUTPUT holds a finished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary lines")
    add_recipe_flags(p)
    return p


def config_from(args):
    """The run's :class:`train.trainer.Config` from parsed flags: the recipe's flags given become its ``recipe`` changes."""
    recipe_fields = {field.name for field in dataclasses.fields(Recipe)}
    settings = {name: value for name, value in vars(args).items() if name not in recipe_fields and name != "quiet"}
    return trainer.Config(
        **settings,
        recipe={name: getattr(args, name) for name in sorted(recipe_fields) if getattr(args, name) is not None},
        # A progress bar on a terminal; one line per epoch in a log file.
        verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2),
    )


def check_data(source):
    """The checks of :func:`train.data.load` that need no framework, made before TensorFlow loads.

    A mistyped ``--data`` is one line in a moment instead of after seconds of framework start-up;
    the messages are ``train.data.load``'s own, which makes the same checks again later.
    """
    if source == trainer.DEFAULT_DATA:  # Keras's downloader; whether it is reachable shows only by trying
        return
    if not os.path.exists(source):
        raise trainer.UsageError(f"data path {source!r} does not exist")
    try:
        readable = os.path.isdir(source) or zipfile.is_zipfile(source) or tarfile.is_tarfile(source)
    except OSError as exc:
        raise trainer.UsageError(f"cannot read data path {source!r}: {exc.strerror or exc}") from None
    if not readable:
        raise trainer.UsageError(f"{source!r} is neither a folder, a .zip, nor a CIFAR-10 binary tarball")


def main(argv=None):
    config = config_from(build_parser().parse_args(argv))
    try:
        check_data(config.data)
        trainer.run(config)
    except trainer.UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
