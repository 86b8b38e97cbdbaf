#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: train seed_cnn on the full CIFAR-10 under both Keras backends,
# export each run (the fingerprint must pass), and write seconds per epoch and test accuracy to JSON.
#
#   DATA=../shared/data/cifar10-jpeg.zip ./scripts/accelerator_check.sh     # -> accelerator-check.json
#
# Environment: DATA (default: cifar10, Keras's downloader), EPOCHS (default: the recipe's),
# OUT (default: accelerator-check.json), BACKENDS (default: "jax tensorflow"), VENV (default: .venv-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-cifar10}
OUT=${OUT:-accelerator-check.json}
BACKENDS=${BACKENDS:-jax tensorflow}
VENV=${VENV:-.venv-gpu}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/accelerator-check.XXXXXX")
export TF_CPP_MIN_LOG_LEVEL=2

python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# JAX's CUDA 12 wheels, and TensorFlow with its own CUDA libraries for the TensorFlow backend.
"$VENV/bin/python" -m pip install -q -e ".[gpu,export]" "tensorflow[and-cuda]==2.21.0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/gpu.txt" || echo unknown > "$WORK/gpu.txt"

for backend in $BACKENDS; do
    echo "== $backend"
    "$VENV/bin/python" -m train --backend "$backend" --model seed_cnn --data "$DATA" --output "$WORK/run-$backend" \
        ${EPOCHS:+--epochs "$EPOCHS"} 2>&1 | tail -n 4
    "$VENV/bin/python" -m export --run "$WORK/run-$backend" --model-dir "$WORK/models" --name "seed-$backend" --quiet
done

"$VENV/bin/python" - "$WORK" "$OUT" $BACKENDS <<'PY'
import json, statistics, sys
from train import report
work, out, *backends = sys.argv[1:]
result = {"gpu": open(f"{work}/gpu.txt").read().strip(), "runs": {}}
for backend in backends:
    manifest = json.load(open(f"{work}/run-{backend}/manifest.json"))
    epochs = [row["epoch_time_s"] for row in report.read_history(f"{work}/run-{backend}/history.csv")]
    result["runs"][backend] = {
        "epochs": len(epochs),
        "first_epoch_s": round(epochs[0], 2),  # includes compilation
        "median_epoch_s": round(statistics.median(epochs[1:] or epochs), 2),
        "wall_time_s": manifest["training"]["wall_time_s"],
        "test_accuracy": manifest["metrics"]["test_accuracy"],
        "test_images": manifest["metrics"]["test_images"],
        "hardware": manifest["training"]["hardware"],
        "replicas": manifest["training"]["replicas"],
        "precision": manifest["training"]["precision"],
        "exported": f"seed-{backend}/1 (fingerprint verified)",
    }
json.dump(result, open(out, "w"), indent=2)
print(json.dumps(result, indent=2))
PY
