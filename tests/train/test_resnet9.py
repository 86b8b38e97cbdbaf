"""The stronger model goes through the same pipeline as the seed: trained under an 8-replica
MirroredStrategy (an 8-core TPU's code path), rebuilt and verified by name at export, served, and
the served model says which architecture it is."""

import base64
import json

import numpy as np
import pytest

import synthetic
from contract import MANIFEST_FILE
from train import models, trainer


@pytest.fixture(scope="module")
def resnet9_models(tmp_path_factory, splits, mirrored_strategy):
    from export import exporter

    run = tmp_path_factory.mktemp("resnet9-run")
    trainer.run(
        trainer.Config(output=str(run), model="resnet9", epochs=1, batch_size=8, verbose=0),
        strategy=mirrored_strategy, splits=splits,
    )
    models_dir = tmp_path_factory.mktemp("resnet9-models")
    exporter.run(run_dir=str(run), model_dir=str(models_dir), name="cifar10", verbose=0)
    return run, models_dir / "cifar10"


def test_resnet9_recipe_is_one_documented_block():
    recipe = models.recipe("resnet9")
    assert recipe.optimizer == "sgd" and recipe.schedule == "onecycle" and recipe.augment
    assert 0 < recipe.label_smoothing < 1 and recipe.weight_decay > 0


def test_resnet9_has_residual_blocks_and_no_dynamic_shapes():
    model = models.build_model("resnet9", num_classes=10)
    adds = [layer.name for layer in model.layers if type(layer).__name__ == "Add"]
    assert adds == ["res1_add", "res3_add"]
    for layer in model.layers:
        shape = layer.output.shape
        assert all(d is not None for d in shape[1:]), f"{layer.name} has a dynamic shape {shape}"


def test_resnet9_trains_under_8_replicas_with_its_recipe(resnet9_models):
    run, _ = resnet9_models
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert manifest["model"]["name"] == "resnet9"
    training = manifest["training"]
    assert training["replicas"] == 8 and training["global_batch"] == 64
    assert training["optimizer"] == "sgd" and training["schedule"] == "onecycle"
    assert training["label_smoothing"] == models.recipe("resnet9").label_smoothing


def test_resnet9_is_served_and_says_what_it_is(resnet9_models):
    import tensorflow as tf

    from serve import create_app

    _, model_base = resnet9_models
    app = create_app({"TESTING": True, "MODEL_DIR": str(model_base), "MODEL_NAME": "cifar10"})
    app.extensions["serve.backend"].wait_loaded()
    try:
        client = app.test_client()
        info = client.get("/api/v1/model").get_json()
        assert info["architecture"] == "resnet9"
        assert info["class_names"] == list(synthetic.CLASS_NAMES)

        images, _ = synthetic.make_images(2, seed=11)
        body = {"instances": [{"b64": base64.b64encode(synthetic.encode(im)).decode()} for im in images]}
        answer = client.post("/api/v1/predict", json=body)
        assert answer.status_code == 200
        assert answer.get_json()["model"]["architecture"] == "resnet9"
        served = [p["class_id"] for p in answer.get_json()["predictions"]]

        direct = tf.saved_model.load(str(model_base / "1")).signatures["serving_default"](images=tf.constant(images))
        assert served == direct["class_ids"].numpy().tolist()
        np.testing.assert_allclose(
            [p["probability"] for p in answer.get_json()["predictions"]],
            direct["probabilities"].numpy().max(axis=1), rtol=1e-5,
        )
    finally:
        app.extensions["serve.backend"].close()
