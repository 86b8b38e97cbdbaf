"""airbench_muon: airbench94_muon's optimizer (Muon on the kernels, PyTorch's Nesterov SGD on the rest) at
airbench_fast's widths, checked against a NumPy transcription of airbench94_muon's step, and a tiny real run
that exports by its own name."""

import dataclasses
import json

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE
from train import airbench, models, schedules, trainer
from train.hardware import Placement


def _newton_schulz(g, steps=3, eps=1e-7):
    """airbench94_muon's zeropower_via_newtonschulz5, in float64 NumPy: the control."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (np.linalg.norm(g) + eps)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(16, 40), (40, 16)])
def test_orthogonalise_keeps_the_singular_vectors_and_pulls_the_values_toward_one(shape):
    import keras

    rng = np.random.default_rng(0)
    g = rng.standard_normal(shape) * rng.uniform(0.01, 10, size=(1, shape[1]))  # badly scaled columns
    out = keras.ops.convert_to_numpy(schedules.orthogonalise(keras.ops.convert_to_tensor(g, "float32")))
    assert out.shape == g.shape
    np.testing.assert_allclose(out, _newton_schulz(g), rtol=1e-3, atol=1e-4)
    u, s, vt = np.linalg.svd(g, full_matrices=False)
    inner = u.T @ out @ vt.T  # diagonal when the singular vectors are g's
    off = inner - np.diag(np.diag(inner))
    assert np.abs(off).max() < 1e-3
    singular = np.linalg.svd(out, compute_uv=False)
    assert singular.max() < 1.6 and np.median(singular) > 0.5
    assert s.max() / s.min() > 5 and singular.max() / singular.min() < 3  # the input's spread, mostly gone


def test_the_muon_optimizer_steps_as_airbench94_muon():
    import keras

    rng = np.random.default_rng(1)
    kernel = keras.Variable(rng.standard_normal((3, 3, 2, 4)).astype("float32"), name="kernel")
    bias = keras.Variable(rng.standard_normal(4).astype("float32"), name="bias")
    rates, ratio, momentum, filter_momentum = [0.5, 0.25], 0.3, 0.85, 0.6
    rate = keras.Variable(rates[0], trainable=False)
    optimizer = schedules.muon(lambda: rate.value, ratio, momentum=momentum, filter_momentum=filter_momentum)
    k, b = kernel.numpy().astype(np.float64), bias.numpy().astype(np.float64)
    k_buffer, b_buffer = np.zeros_like(k), np.zeros_like(b)
    for step, lr in enumerate(rates):
        rate.assign(lr)
        gk, gb = rng.standard_normal(k.shape), rng.standard_normal(b.shape)
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(gk, "float32"), kernel),
                                   (keras.ops.convert_to_tensor(gb, "float32"), bias)])
        # airbench94_muon's Muon.step on the kernel (PyTorch's layout is out, in, h, w; Keras's h, w, in, out)
        k_buffer = filter_momentum * k_buffer + gk
        update = gk + filter_momentum * k_buffer
        k = k * np.sqrt(k.shape[-1]) / np.linalg.norm(k)
        k = k - lr * ratio * _newton_schulz(update.reshape(-1, k.shape[-1])).reshape(k.shape)
        # torch.optim.SGD(nesterov=True) on the bias
        b_buffer = momentum * b_buffer + gb
        b = b - lr * (gb + momentum * b_buffer)
        np.testing.assert_allclose(kernel.numpy(), k, rtol=2e-4, atol=2e-5, err_msg=f"kernel, step {step}")
        np.testing.assert_allclose(bias.numpy(), b, rtol=1e-5, atol=1e-6, err_msg=f"bias, step {step}")


def test_the_linear_schedule_falls_from_the_peak_straight_to_zero():
    recipe = dataclasses.replace(models.recipe("airbench_muon"), schedule="linear")
    optimizer = schedules.optimizer(recipe, 2.0, "linear", total_steps=100)
    values = []
    for step in (0, 25, 100, 150):
        optimizer.iterations.assign(step)
        values.append(float(optimizer.learning_rate))
    np.testing.assert_allclose(values, [2.0, 1.5, 0.0, 0.0], atol=1e-6)


def test_the_muon_recipe_is_airbench94_muons_at_the_fast_widths():
    recipe = models.recipe("airbench_muon")
    assert recipe is airbench.AIRBENCH_MUON_RECIPE
    assert (recipe.optimizer, recipe.schedule, recipe.batch_size, recipe.label_smoothing) == ("muon", "linear", 1000, 0.0)
    assert (recipe.epochs, recipe.reference_batch, recipe.learning_rate) == (12, 2000, 1.66)
    assert (recipe.corrupt_fraction, recipe.corrupt_noise, recipe.corrupt_blur) == (0.1, 0.1, 1.0)
    assert (recipe.filter_learning_rate, recipe.filter_momentum, recipe.momentum) == (0.24, 0.6, 0.85)
    plan = trainer._plan(trainer.Config(model="airbench_muon", precision="float32"), recipe,
                         Placement("tensorflow", "test", "cpu", replicas=1), 45_000)
    assert (plan.global_batch, plan.learning_rate, plan.steps_per_epoch) == (1000, 0.83, 45)
    callbacks = models.training_callbacks("airbench_muon", recipe.epochs * plan.steps_per_epoch)
    assert [type(c) for c in callbacks] == [airbench.HoldFrom]  # no lookahead
    model = models.build_model("airbench_muon", num_classes=10)
    network = model.get_layer("views").network
    assert network.get_layer("whiten_bias").gain == airbench.BIAS_GAIN  # the whitening bias at the shifts' rate
    assert network.get_layer("group3_conv2").filters == airbench.FAST_WIDTHS[-1]
    # No L2 on the kernels (Muon holds their norm); the head and the shifts keep airbench's.
    assert all(network.get_layer(f"group{g}_conv{c}").kernel_regularizer is None for g in (1, 2, 3) for c in (1, 2))
    assert network.get_layer("logits").kernel_regularizer is not None
    fast = models.build_model("airbench_fast", num_classes=10).get_layer("views").network
    assert fast.get_layer("group1_conv1").kernel_regularizer is not None


def test_the_wide_member_is_the_muon_recipe_at_airbenchs_widths_for_seven_epochs():
    assert models.recipe("airbench_muon_wide") == dataclasses.replace(airbench.AIRBENCH_MUON_RECIPE, epochs=7)
    assert [type(c) for c in models.training_callbacks("airbench_muon_wide", 100)] == [airbench.HoldFrom]
    network = models.build_model("airbench_muon_wide", num_classes=10).get_layer("views").network
    assert [network.get_layer(f"group{g}_conv1").filters for g in (1, 2, 3)] == list(airbench.WIDTHS)
    assert network.get_layer("whiten_bias").gain == airbench.BIAS_GAIN
    assert all(network.get_layer(f"group{g}_conv{c}").kernel_regularizer is None for g in (1, 2, 3) for c in (1, 2))


def test_a_tiny_run_of_airbench_muon_learns_and_exports_by_its_name(tmp_path):
    from export import exporter

    splits = synthetic.make_splits(train_per_class=16, test_per_class=4)  # 48 training images: 3 steps of 16
    run = tmp_path / "run"
    trainer.run(trainer.Config(model="airbench_muon", output=str(run), recipe=dict(epochs=2, batch_size=16),
                               precision="float32", holdout=0, verbose=0), splits=splits)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["model"]["name"] == "airbench_muon"
    assert manifest["training"]["recipe"]["optimizer"] == "muon"
    assert manifest["training"]["recipe"]["filter_learning_rate"] == 0.24
    # Muon holds every kernel at norm sqrt(output channels): the trained weights show it.
    trained = models.build_model("airbench_muon", 3)
    trained.load_weights(str(run / "model.weights.h5"))
    kernel = trained.get_layer("views").network.get_layer("group2_conv2").kernel.numpy()
    norm, expected = np.linalg.norm(kernel), np.sqrt(kernel.shape[-1])
    assert abs(norm - expected) < 0.2 * expected
    exporter.run(run_dir=str(run), model_dir=str(tmp_path / "models"), name="cifar10", verbose=0)  # the fingerprint
    published = json.loads((tmp_path / "models" / "cifar10" / "1" / "assets.extra" / MANIFEST_FILE).read_text())
    assert published["model"]["name"] == "airbench_muon"
