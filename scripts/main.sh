#!/usr/bin/env bash
# The main job on a fresh machine: set up, train, export, serve.
#
#   ./scripts/main.sh                                  # CIFAR-10 via Keras's downloader, airbench_muon's 7 epochs
#   CIFAR_DATA=../shared/data/cifar10-jpeg.zip ./scripts/main.sh
#
# Environment overrides (defaults in brackets):
#   CIFAR_DATA  'cifar10', a folder or .zip of train/<class>/ test/<class>/ images, or
#               cifar-10-binary.tar.gz                                   [cifar10]
#   MODEL       airbench_muon, airbench_fast, seed_cnn or airbench       [airbench_muon]
#   EPOCHS      passes over the training set                   [the model's recipe: 7 / 20 / 10]
#   HOLDOUT     training images kept out of training, on which export calibrates the
#               probabilities and sets the out-of-distribution threshold; 0: none    [5000]
#   TRAIN_ARGS  any further `python -m train` flags, e.g. "--augment --schedule onecycle"
#   RUN_DIR     training output                                          [runs/$MODEL]
#   MODELS_DIR  SavedModel root (models/NAME/N/)                         [models]
#   MODEL_NAME  served model name                                        [cifar10]
#   PORT        HTTP port                                                [8000]
# Re-running resumes an interrupted training run, skips a finished one, and exports a new
# version only when the weights changed.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-airbench_muon}
RUN_DIR=${RUN_DIR:-runs/$MODEL}
MODELS_DIR=${MODELS_DIR:-models}
MODEL_NAME=${MODEL_NAME:-cifar10}
PORT=${PORT:-8000}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

python3 -m venv .venv
# The locked versions (requirements/all.txt, with hashes), then the project with nothing else resolved.
.venv/bin/python -m pip install -q --require-hashes -r requirements/all.txt
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .

CIFAR_DATA=${CIFAR_DATA:-cifar10}
if [ "$CIFAR_DATA" = cifar10 ]; then
    echo "== data: CIFAR-10 through Keras's downloader, https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    echo "   (163 MB, cached in ~/.keras/datasets; offline, set CIFAR_DATA to a folder, .zip or cifar-10-binary.tar.gz)"
else
    echo "== data: $CIFAR_DATA"
fi

echo "== train: $MODEL -> $RUN_DIR"
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
.venv/bin/python -m train --model "$MODEL" --data "$CIFAR_DATA" --output "$RUN_DIR" \
    --holdout "${HOLDOUT:-5000}" ${EPOCHS:+--epochs "$EPOCHS"} ${TRAIN_ARGS:-}

echo "== export: $RUN_DIR -> $MODELS_DIR/$MODEL_NAME/N"
.venv/bin/python -m export --run "$RUN_DIR" --model-dir "$MODELS_DIR" --model-name "$MODEL_NAME" --skip-if-exported

echo "== serve: http://localhost:$PORT/ (Ctrl-C to stop)"
exec .venv/bin/python -m serve --model-dir "$MODELS_DIR/$MODEL_NAME" --model-name "$MODEL_NAME" --port "$PORT"
