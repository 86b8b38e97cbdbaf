"""The fake backend serve's unit tests run on: a :class:`serve.core.model.Backend` whose model info is the local
backend's for the same published manifest, and whose answers a test can compute."""

import dataclasses
import threading

import numpy as np
import pytest

import contract
import fake_backend
import synthetic
from contract import manifest as manifests
from contract import published as publications
from serve.core.errors import ModelFailed, NotServed, ServeError
from serve.core.model import Backend, ModelInfo


def test_it_is_a_backend_with_a_real_manifest():
    backend = fake_backend.FakeBackend()
    assert isinstance(backend, Backend)
    manifest = backend.manifests[1]
    assert isinstance(manifest, publications.Published) and manifest.format == manifests.FORMAT
    info = backend.info()
    assert isinstance(info, ModelInfo) and info.version == 1 and info.versions == (1,)
    assert info.class_names == synthetic.CLASS_NAMES and info.outputs == contract.CALIBRATED_OUTPUTS
    assert set(info.signatures) == {contract.SIGNATURE_PIXELS, contract.SIGNATURE_BYTES}


def test_answers_are_computed_from_the_pixels_and_name_the_version():
    images, labels = synthetic.make_images(4, seed=3)
    backend = fake_backend.FakeBackend(versions=(1, 2), labels={"stable": 1})
    first, second = backend.infer(images, 1), backend.infer(images)
    assert (first.version, second.version) == (1, 2)
    for prediction in (first, second):
        expected = fake_backend.expected(images, prediction.version)
        assert set(prediction.outputs) == set(expected)
        for key, values in expected.items():
            np.testing.assert_array_equal(prediction.outputs[key], values)
    probabilities = first.outputs[contract.OUTPUT_PROBABILITIES]
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    assert (first.outputs[contract.OUTPUT_CLASS_IDS] == labels).all()  # the synthetic classes, by their brightest channel
    assert not np.allclose(probabilities, second.outputs[contract.OUTPUT_PROBABILITIES])  # versions answer differently
    assert backend.info().labels == {"stable": 1} and backend.info(1).version == 1
    with pytest.raises(NotServed):
        backend.infer(images, 3)


def test_faults_raise_hold_and_refuse():
    images = synthetic.make_images(1)[0]
    backend = fake_backend.FakeBackend()
    backend.raises = ModelFailed("prediction failed: boom")
    with pytest.raises(ServeError, match="boom"):
        backend.infer(images)
    backend.raises = None
    backend.hold = threading.Event()
    answered = []
    caller = threading.Thread(target=lambda: answered.append(backend.infer(images)))
    caller.start()
    assert backend.entered.wait(30) and not answered
    backend.hold.set()
    caller.join(30)
    assert answered and answered[0].version == 1
    backend.not_ready = True
    assert not backend.loaded
    with pytest.raises(ServeError) as refused:
        backend.ready()
    assert refused.value.status == 503


@pytest.mark.end_to_end
def test_the_local_backend_describes_the_same_manifest_alike(model_base):
    """Over a real export, the local backend's info and the fake's for the same published manifest agree on every
    field but the runtime's tensor names, which the fake cannot know."""
    from serve.backends import published
    from serve.backends import LocalBackend

    local = LocalBackend(model_base, "cifar10", "litert", max_batch=8, batch_wait_ms=0, poll_s=0)
    local.wait_loaded()
    try:
        real = local.info()
    finally:
        local.close()
    fake = fake_backend.FakeBackend(manifests={1: published.manifest(str(model_base / "1"))}).info()

    def unnamed(signatures):  # the graph's tensor names differ: they are the fake's own
        return {name: {kind: {key: dataclasses.replace(spec, name="") for key, spec in getattr(sig, kind).items()}
                       for kind in ("inputs", "outputs")} | {"method": sig.method_name}
                for name, sig in signatures.items()}

    assert unnamed(fake.signatures) == unnamed(real.signatures)
    for field in dataclasses.fields(ModelInfo):
        if field.name not in ("signatures", "states"):
            assert getattr(fake, field.name) == getattr(real, field.name), field.name
    assert fake.version_states() == real.version_states()
