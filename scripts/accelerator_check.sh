#!/usr/bin/env bash
# On an accelerator host (an NVIDIA GPU, or a TPU VM): train each model under each Keras backend on the
# full CIFAR-10, export each run (the fingerprint must pass), and write seconds per epoch and test
# accuracy to JSON.
#
#   DATA=../shared/data/cifar10-jpeg.zip ./scripts/accelerator_check.sh     # -> accelerator-check.json
#
# On an image that has JAX and no TensorFlow (Colab's TPU runtimes, most JAX containers), train with
# the interpreter as it is and export on another machine from the run directories:
#
#   PYTHON=python3 BACKENDS=jax EXPORT=0 RUNS=/tmp/runs ./scripts/accelerator_check.sh
#
# Environment: DATA (default: cifar10, Keras's downloader), MODELS (default: "seed_cnn airbench"),
# BACKENDS (default: "jax tensorflow"), EPOCHS and PRECISION (default: each recipe's, and auto),
# SEEDS (default: 0), PYTHON (default: a new venv at VENV=.venv-gpu, made by python3, which must be
# CPython 3.11 as the lock is, holding requirements/scripts/accelerator.txt: the gpu and export
# extras and tensorflow[and-cuda]), EXPORT (default: 1), RUNS (default: a new temporary folder),
# OUT (default: accelerator-check.json).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-cifar10}
MODELS=${MODELS:-seed_cnn airbench}
BACKENDS=${BACKENDS:-jax tensorflow}
SEEDS=${SEEDS:-0}
EXPORT=${EXPORT:-1}
OUT=${OUT:-accelerator-check.json}
RUNS=${RUNS:-$(mktemp -d "${TMPDIR:-/tmp}/accelerator-check.XXXXXX")}
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$RUNS"

if [[ -z "${PYTHON:-}" ]]; then
    VENV=${VENV:-.venv-gpu}
    python3 -m venv "$VENV"
    # The lock (docs/training.md, "Installs and the lock"), each file checked against its hash: the gpu extra (JAX's
    # CUDA 12 wheels), the export extra, and TensorFlow with its own CUDA libraries for the TensorFlow
    # backend; then the project alone, resolving nothing.
    "$VENV/bin/python" -m pip install -q --require-hashes -r requirements/scripts/accelerator.txt
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
    PYTHON="$VENV/bin/python"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RUNS/gpu.txt" 2>/dev/null \
    || echo unknown > "$RUNS/gpu.txt"

for model in $MODELS; do
    for backend in $BACKENDS; do
        for seed in $SEEDS; do
            run="$RUNS/$model-$backend-$seed"
            echo "== $model $backend seed $seed"
            "$PYTHON" -m train --keras-backend "$backend" --model "$model" --data "$DATA" --output "$run" --seed "$seed" \
                ${EPOCHS:+--epochs "$EPOCHS"} ${PRECISION:+--precision "$PRECISION"} 2>&1 | grep -v '^Epoch ' | tail -n 3
            if [[ "$EXPORT" == 1 ]]; then
                "$PYTHON" -m export --run "$run" --model-dir "$RUNS/models" --model-name "$model-$backend-$seed" --quiet
            fi
        done
    done
done

# train.report imports Keras: give it a backend this interpreter has.
KERAS_BACKEND=${BACKENDS%% *} "$PYTHON" - "$RUNS" "$OUT" "$EXPORT" <<'PY'
import glob, json, os, statistics, sys
from train.report import read_history
runs, out, exported = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
result = {"gpu": open(f"{runs}/gpu.txt").read().strip(), "runs": {}}
for manifest_path in sorted(glob.glob(f"{runs}/*/manifest.json")):
    run = os.path.dirname(manifest_path)
    manifest = json.load(open(manifest_path))
    history = read_history(f"{run}/history.csv")
    epochs = [row["epoch_time_s"] for row in history]
    training = manifest["training"]
    result["runs"][os.path.basename(run)] = {
        "epochs": len(epochs),
        "first_epoch_s": round(epochs[0], 2),  # includes compilation
        "median_epoch_s": round(statistics.median(epochs[1:] or epochs), 2),
        "wall_time_s": training["wall_time_s"],
        "test_accuracy": manifest["metrics"]["test_accuracy"],
        "test_accuracy_by_epoch": [round(row["val_accuracy"], 4) for row in history],
        "test_images": manifest["metrics"]["test_images"],
        **{key: training[key] for key in ("keras_backend", "hardware", "replicas", "global_batch", "precision")},
        "versions": manifest["versions"],
        "exported": exported,
    }
json.dump(result, open(out, "w"), indent=2)
print(json.dumps(result, indent=2))
PY
