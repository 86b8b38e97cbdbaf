"""Does ``airbench`` compute what airbench94's own code computes? Step for step, from the same start.

Reads a trace written by airbench94's PyTorch code (``bench/airbench94_trace.py``,
in an environment with PyTorch), then, in this project's code:

1. whitens from the same 5,000 images (:func:`train.airbench.whiten_from`) and compares the
   kernel with airbench's (each filter up to its sign: an eigenvector's sign is arbitrary);
2. loads the trace's initial weights into ``models.build_model("airbench")``, compiles it as
   the trainer does (the recipe's optimizer and triangular rate at the trace's batch, its label
   smoothing), fits the same batches in the same order, and compares every weight, BatchNorm
   statistics included, with airbench's after the same steps. Training at airbench's rates
   amplifies rounding: the yardstick is how far airbench's own steps taken in float64 end from
   its float32 ones, and the port passes within ``--floor-ratio`` times that;
3. compares the trained model's probabilities (six test-time views) with the softmax of
   airbench's six-view logits on 500 more images.

::

    python bench/airbench94_trace.py --data ../shared/data/cifar10-jpeg.zip --out /tmp/trace.npz
    python bench/airbench_port_check.py /tmp/trace.npz [--keras-backend jax]

Prints one JSON object; exits 1 when a comparison fails.
"""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from contract.arguments import add_renamed  # noqa: E402  (after the path is set)

GROUPS = {"2": "group1", "3": "group2", "4": "group3"}  # airbench's nn.Sequential indices


def port_weights(state, prefix, bias_gain):
    """airbench's state_dict (PyTorch layouts) as {Keras layer name: [weights in Keras order]}."""
    def get(name):
        return state[f"{prefix}/{name}"]

    def kernel(name):  # OIHW -> HWIO
        return get(name).transpose(2, 3, 1, 0)

    weights = {"whiten": [kernel("0.weight")], "whiten_bias": [get("0.bias")], "logits": [get("7.weight").T]}
    for index, group in GROUPS.items():
        for conv in ("1", "2"):
            weights[f"{group}_conv{conv}"] = [kernel(f"{index}.conv{conv}.weight")]
            weights[f"{group}_{conv}_bn"] = [get(f"{index}.norm{conv}.running_mean"),
                                            get(f"{index}.norm{conv}.running_var")]
            weights[f"{group}_{conv}_shift"] = [get(f"{index}.norm{conv}.bias") / bias_gain]
    return weights


def relative(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help=".npz from bench/airbench94_trace.py")
    add_renamed(parser, "--keras-backend", "--backend", choices=("tensorflow", "jax"), default="tensorflow")
    parser.add_argument("--optimizer", choices=("sgd_pytorch", "sgd"),
                        help="override the recipe's optimizer (sgd: Keras's form, to see what it changes)")
    parser.add_argument("--floor-ratio", type=float, default=5.0,
                        help="the port may end at most this many times further from airbench's float32 weights "
                             "than airbench's own float64 run does (median over weights)")
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = args.keras_backend

    import keras

    from train import airbench, models, schedules

    trace = np.load(args.trace)
    steps, batch, held = int(trace["steps"]), int(trace["batch_size"]), int(trace["held"])
    images, labels = trace["images"].astype("float32"), trace["labels"]
    model = models.build_model("airbench", 10)
    network = model.get_layer("views").network
    report = {"keras_backend": args.keras_backend, "steps": steps, "batch_size": batch}

    # 1. Whitening from the same images.
    airbench.whiten_from(model, images[:airbench.WHITEN_IMAGES])
    ours = network.get_layer("whiten").kernel.numpy()
    ours = ours.reshape(-1, ours.shape[-1])  # one column per filter
    theirs = trace["initial/0.weight"].transpose(2, 3, 1, 0).reshape(ours.shape)
    signs = np.sign(np.sum(ours * theirs, axis=0))
    report["whitening_kernel"] = relative(ours * signs, theirs)

    # 2. The same steps from the same weights.
    start = port_weights(trace, "initial", airbench.BIAS_GAIN)
    for name, values in start.items():
        network.get_layer(name).set_weights(values)
    recipe = models.recipe("airbench")
    if args.optimizer:
        recipe = dataclasses.replace(recipe, optimizer=args.optimizer)
    report["optimizer"] = recipe.optimizer
    model.compile(optimizer=schedules.optimizer(recipe, schedules.scaled_rate(recipe, batch), "triangle", steps),
                  loss=keras.losses.CategoricalCrossentropy(label_smoothing=recipe.label_smoothing))
    x, y = images[:steps * batch], keras.utils.to_categorical(labels[:steps * batch], 10)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    expected = port_weights(trace, "final", airbench.BIAS_GAIN)
    float64 = port_weights(trace, "final64", airbench.BIAS_GAIN)
    differences = {}
    for name, values in expected.items():
        if name == "whiten":
            continue  # frozen, checked above
        for index, (got, want) in enumerate(zip(network.get_layer(name).get_weights(), values)):
            differences[f"{name}/{index}"] = (relative(got, want), relative(float64[name][index], want))
    port, floor = (np.array(column) for column in zip(*differences.values()))
    worst = max(differences, key=lambda k: differences[k][0] / differences[k][1])
    report["weights_after_steps"] = {
        "median": float(np.median(port)), "float64_median": float(np.median(floor)),
        "worst": worst, "worst_difference": differences[worst][0], "worst_float64": differences[worst][1]}

    # 3. Inference: six views against airbench's six-view logits.
    logits = trace["logits"]
    want = np.exp(logits - logits.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    got = model.predict(images[held:], batch_size=500, verbose=0)
    report["probabilities"] = relative(got, want)
    report["same_class"] = float(np.mean(got.argmax(1) == want.argmax(1)))

    # The last filters whiten directions with eigenvalues 1e-5 of the largest, which airbench's
    # float32 covariance resolves to about 3%; the port's is float64.
    failed = ["whitening_kernel"] if report["whitening_kernel"] > 0.05 else []
    steps_report = report["weights_after_steps"]
    if steps_report["median"] > args.floor_ratio * steps_report["float64_median"]:
        failed.append("weights_after_steps")
    failed += ["same_class"] if report["same_class"] < 0.98 else []
    report["passed"] = not failed
    print(json.dumps(report, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
