"""airbench_fast: airbench's one builder at narrower widths, its recipe airbench's but for the epochs,
and a tiny real run that exports by its own name (export rebuilds it from the registry and the fingerprint passes)."""

import dataclasses
import json

import numpy as np

import synthetic
from contract import MANIFEST_FILE
from train import airbench, models, trainer
from train.hardware import Placement


def _conv_widths(model):
    network = model.get_layer("views").network
    return tuple(network.get_layer(f"group{group}_conv2").filters for group in (1, 2, 3))


def test_the_builder_takes_the_widths_and_each_registered_member_has_its_own():
    assert _conv_widths(models.build_model("airbench", num_classes=10)) == airbench.WIDTHS == (64, 256, 256)
    fast = models.build_model("airbench_fast", num_classes=10)
    assert _conv_widths(fast) == airbench.FAST_WIDTHS
    assert _conv_widths(airbench.airbench(3, widths=(8, 16, 16))) == (8, 16, 16)
    # The same network, layer for layer, at fewer channels: export, LiteRT's float layers and the
    # out-of-distribution features find the same names.
    full = models.build_model("airbench", num_classes=10)
    names = [layer.name for layer in full.get_layer("views").network.layers]
    assert [layer.name for layer in fast.get_layer("views").network.layers] == names
    assert fast.count_params() < full.count_params() / 2


def test_the_fast_recipe_is_airbenchs_but_for_the_epochs():
    fast, full = models.recipe("airbench_fast"), models.recipe("airbench")
    assert fast is airbench.AIRBENCH_FAST_RECIPE and full is airbench.AIRBENCH_RECIPE
    assert fast.epochs < full.epochs
    assert dataclasses.replace(fast, epochs=full.epochs) == full
    plan = trainer._plan(trainer.Config(model="airbench_fast", precision="float32"), fast,
                         Placement("tensorflow", "test", "cpu", replicas=1), 45_000)
    assert (plan.recipe, plan.global_batch, plan.learning_rate) == (fast, 1024, 1.5)
    callbacks = models.training_callbacks("airbench_fast", fast.epochs * plan.steps_per_epoch)
    assert {type(c) for c in callbacks} == {airbench.HoldFrom, airbench.Lookahead}


def test_a_tiny_run_of_airbench_fast_exports_by_its_name(tmp_path):
    from export import exporter

    splits = synthetic.make_splits(train_per_class=16, test_per_class=4)  # 48 training images: 3 steps of 16
    run = tmp_path / "run"
    trainer.run(trainer.Config(model="airbench_fast", output=str(run), recipe=dict(epochs=1, batch_size=16), precision="float32",
                               holdout=0, verbose=0), splits=splits)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["model"]["name"] == "airbench_fast"
    assert manifest["training"]["recipe"]["epochs"] == 1 and manifest["training"]["recipe"]["alternate_flips"]
    # The weights file carries the data's whitening, as airbench's does.
    fresh, expected = models.build_model("airbench_fast", 3), models.build_model("airbench_fast", 3)
    models.prepare("airbench_fast", expected, splits.x_train)
    fresh.load_weights(str(run / "model.weights.h5"))
    np.testing.assert_allclose(airbench.whiten_layer(fresh).kernel.numpy(),
                               airbench.whiten_layer(expected).kernel.numpy(), rtol=1e-5, atol=1e-6)
    exporter.run(run_dir=str(run), model_dir=str(tmp_path / "models"), name="cifar10", verbose=0)  # the fingerprint
    published = json.loads((tmp_path / "models" / "cifar10" / "1" / "assets.extra" / MANIFEST_FILE).read_text())
    assert published["model"]["name"] == "airbench_fast"
