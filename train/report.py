"""What a run reports: per-epoch timing, the test-set evaluation, and plots."""

import csv
import json
import os
import time

import keras
import numpy as np


class EpochTimer(keras.callbacks.Callback):
    """Adds ``epoch_time_s`` (wall seconds for the epoch, validation included) to the logs."""

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["epoch_time_s"] = time.monotonic() - self._started


def evaluate(model, splits, out_dir, batch_size=500):
    """Accuracy, per-class accuracy and confusion matrix over every test image, written to ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    probabilities = model.predict(splits.x_test.astype(np.float32), batch_size=batch_size, verbose=0)
    predicted = probabilities.argmax(axis=1)
    truth = splits.y_test
    n = splits.num_classes
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (truth, predicted), 1)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)
    picked = probabilities[np.arange(len(truth)), truth]
    result = {
        "count": int(len(truth)),
        "accuracy": float((predicted == truth).mean()),
        "loss": float(-np.log(np.clip(picked, 1e-7, 1.0)).mean()),
        "per_class_accuracy": {name: float(acc) for name, acc in zip(splits.class_names, per_class)},
        "class_names": list(splits.class_names),
        "confusion_matrix": confusion.tolist(),
        "confusion_matrix_axes": "rows: true class, columns: predicted class",
    }
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    _plot_confusion(confusion, splits.class_names, result["accuracy"], os.path.join(out_dir, "confusion.png"))
    return result


def read_history(path):
    """Rows of history.csv, one per epoch; a row repeated by a resume keeps its latest copy."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = {}
        for row in csv.DictReader(f):
            if row.get("epoch", "epoch") == "epoch":  # a header repeated by an appending resume
                continue
            # "NA": a test metric of an epoch that was not evaluated (--validation-freq).
            rows[int(row["epoch"])] = {k: float(v) for k, v in row.items() if v not in ("", "NA", None)}
    return [rows[e] for e in sorted(rows)]


def plot_history(csv_path, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_history(csv_path)
    if not rows:
        return
    epochs = [r["epoch"] + 1 for r in rows]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for key, ax in (("loss", ax_loss), ("accuracy", ax_acc)):
        for prefix, label in (("", "train"), ("val_", "test")):
            values = [r.get(prefix + key) for r in rows]
            if any(v is not None for v in values):
                ax.plot(epochs, values, marker=".", label=label)
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def _plot_confusion(confusion, class_names, accuracy, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(class_names)
    fig, ax = plt.subplots(figsize=(1 + 0.6 * n, 1 + 0.55 * n))
    ax.imshow(confusion, cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, confusion[i, j], ha="center", va="center", fontsize=7,
                    color="white" if confusion[i, j] > confusion.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"test accuracy {accuracy:.2%}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
