"""The core alone: the service built directly over the fake backend, and the gate, with no app, no HTTP and no gRPC.

Every refusal of the one request path is here once (the doors' spellings of them are
tests/serve/protocols/test_guards.py's): deadlines, shedding, routing, signatures, inputs, outputs, encoded images
one by one or all at once, and who may call how often.
"""

import threading

import numpy as np
import pytest

import contract
import synthetic
from fake_backend import FakeBackend, expected
from serve.core import admission
from serve.core.errors import (BadRequest, DeadlineExceeded, NotServed, RateLimited, ServeError, Shed, TooLarge,
                               TooManyImages, Unauthenticated, WIRE, wire)
from serve.core.request import Answered, InferRequest, Refused, Tensor, Upload
from serve.core.service import InferenceService, Limits
from serve.settings import Settings


def _service(backend=None, clock=None, **limits):
    values = {"max_images": 4, "max_pixels": 1 << 20, "top_k": 3, "max_request_pixels": 1 << 22, "timeout_s": 30.0, **limits}
    extra = {} if clock is None else {"clock": clock}
    return InferenceService(backend or FakeBackend(), "cifar10", Limits(**values), **extra)


def _pixels(n=1):
    return synthetic.make_images(n)[0][:n]


def _request(images, **fields):
    return InferRequest({contract.INPUT_PIXELS: Tensor(images.tolist())}, **fields)


def test_every_kind_of_refusal_has_one_status_and_one_code():
    assert wire(Shed) == (503, "UNAVAILABLE") and wire(TooManyImages) == (413, "INVALID_ARGUMENT")
    assert wire(NotServed) == (404, "NOT_FOUND") and wire(DeadlineExceeded) == (504, "DEADLINE_EXCEEDED")
    for kind, (status, code) in WIRE.items():
        assert issubclass(kind, ServeError) and 400 <= status < 600 and code.isupper()


def test_pixels_are_answered_and_counted_once():
    images = _pixels(3)
    answer = _service().infer(_request(images))
    np.testing.assert_allclose(answer.outputs["probabilities"], expected(images)["probabilities"], rtol=1e-6)
    assert answer.version == 1 and len(answer.ranked(2)[0]) == 2


def test_a_batch_of_none_is_answered_with_none():
    answer = _service().infer(InferRequest({contract.INPUT_PIXELS: Tensor([], shape=(0, 32, 32, 3), dtype="uint8")}))
    assert answer.outputs["probabilities"].shape[0] == 0


@pytest.mark.parametrize("fields, kind, words", [
    ({"signature": "nope"}, BadRequest, "signature 'nope' not found"),
    ({"outputs": ("probabilities", "nope")}, BadRequest, "unknown output 'nope'"),
    ({"outputs": ("probabilities", "probabilities")}, BadRequest, "named more than once"),
    ({"top_k": 0}, BadRequest, "top_k must be at least 1"),
    ({"model_name": "other"}, NotServed, "unknown model 'other'"),
    ({"version": 7}, NotServed, "has no version 7"),
    ({"version": "\u00b2"}, NotServed, "has no version"),
    ({"label": "canary"}, NotServed, "no version label 'canary'"),
    ({"version": 1, "label": "stable"}, BadRequest, "not both"),
], ids=["signature", "output", "output-twice", "top-k", "model", "version", "non-ascii-version", "label", "both"])
def test_a_request_the_model_cannot_answer_is_refused_with_why(fields, kind, words):
    with pytest.raises(kind, match=words):
        _service(FakeBackend(labels={"stable": 1})).infer(_request(_pixels(), **fields))


@pytest.mark.parametrize("inputs, words", [
    ({"pixels": Tensor([[0]])}, "takes inputs ['images'], got 'pixels'"),
    ({None: Tensor([[0]]), "images": Tensor([[0]])}, "name each input"),
    ({"images": Tensor(np.zeros((1, 32, 32, 3), np.float32).tolist())}, "whole numbers 0..255"),
    ({"images": Tensor([[[[0, 0, 0]] * 32] * 31])}, "must have shape [-1, 32, 32, 3]"),
    ({"images": Tensor(b"\0" * 10, shape=(1, 32, 32, 3), dtype="uint8", packed=True)}, "holds 10 bytes"),
], ids=["unknown", "unnamed-and-named", "fractions", "shape", "short"])
def test_inputs_are_checked_once_by_the_core(inputs, words):
    with pytest.raises(BadRequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        _service().infer(InferRequest(inputs))


def test_the_image_cap_and_the_declared_size_come_before_any_value_is_read():
    with pytest.raises(TooManyImages, match="SERVE_MAX_IMAGES"):
        _service().infer(InferRequest({"images": Tensor(b"", shape=(5, 32, 32, 3), dtype="uint8", packed=True)}))
    with pytest.raises(TooLarge, match="SERVE_MAX_UPLOAD_MB"):
        _service(max_tensor_bytes=100).infer(InferRequest({"images": Tensor(b"", shape=(1, 32, 32, 3), dtype="uint8",
                                                                                 packed=True)}))


def test_encoded_images_one_by_one_or_all_at_once():
    png = synthetic.encode(_pixels()[0])
    uploads = [Upload("a.png", png), Upload("b.txt", b"not an image"), Upload(error="is not valid base64")]
    request = InferRequest({contract.INPUT_BYTES: Tensor(uploads)}, signature=contract.SIGNATURE_BYTES, per_image=True)
    answer = _service().infer(request)
    first, second, third = answer.images
    assert isinstance(first, Answered) and isinstance(second, Refused) and isinstance(third, Refused)
    assert second.status == 400 and "'b.txt' is not an image" in str(second.error)
    assert str(third.error) == "instance 2: is not valid base64"
    tensor = InferRequest({contract.INPUT_BYTES: Tensor([png, b"not an image"])}, signature=contract.SIGNATURE_BYTES)
    with pytest.raises(BadRequest, match="input 'image_bytes' element 1 is not an image"):
        _service().infer(tensor)


def test_the_pixel_budget_is_read_from_the_headers_before_decoding():
    png = synthetic.encode(_pixels()[0])
    request = InferRequest({contract.INPUT_BYTES: Tensor([png, png])}, signature=contract.SIGNATURE_BYTES)
    with pytest.raises(TooLarge, match="SERVE_MAX_REQUEST_PIXELS"):
        _service(max_request_pixels=32 * 32 + 1).infer(request)


def test_the_callers_deadline_and_the_servers_cap():
    now = [100.0]
    backend = FakeBackend()
    backend.hold = threading.Event()  # the model never answers by itself: only a deadline ends a call
    service = _service(backend, clock=lambda: now[0], timeout_s=5.0)
    with pytest.raises(DeadlineExceeded):
        service.infer(_request(_pixels(), deadline=99.0))  # passed before the request started
    backend.hold = None
    assert service.infer(_request(_pixels(), deadline=1e9)).version == 1  # a far deadline: the cap binds, and is met


def test_a_full_worker_sheds_and_counts_what_it_holds():
    backend = FakeBackend()
    backend.hold = threading.Event()
    service = _service(backend, max_queue=3)
    first = threading.Thread(target=service.infer, args=(_request(_pixels(2)),))
    first.start()
    try:
        assert backend.entered.wait(30) and service.holding == 2
        with pytest.raises(Shed, match="SERVE_MAX_QUEUE") as shed:
            service.infer(_request(_pixels(2)))
        assert shed.value.reason == "queue_full" and shed.value.retry_after == 1
    finally:
        backend.hold.set()
        first.join(30)
    assert service.holding == 0


def test_readiness_is_the_cores_and_says_why_not():
    backend = FakeBackend()
    assert _service(backend).ready() == 1
    backend.not_ready = True
    with pytest.raises(ServeError, match="still loading") as refused:
        _service(backend).ready()
    assert refused.value.status == 503


# -- the gate ------------------------------------------------------------------------------------------------------


def _gate(**settings):
    return admission.Gate(Settings.from_env({}, overrides={"MODEL_NAME": "cifar10", **settings}))


def test_keys_by_area_and_who_a_caller_is():
    gate = _gate(API_KEYS="k1,k2", METRICS_KEYS="m", FORM_NEEDS_KEY=False)
    assert gate.admit(admission.Caller("k2", "10.0.0.1"), "api").identity.startswith("key:")
    assert gate.admit(admission.Caller(None, "10.0.0.1"), "form").identity == "addr:10.0.0.1"
    with pytest.raises(Unauthenticated) as missing:
        gate.admit(admission.Caller(None, "10.0.0.1"), "api")
    assert missing.value.reason == "missing_key"
    with pytest.raises(Unauthenticated) as wrong:
        gate.admit(admission.Caller("k1", "10.0.0.1"), "metrics")  # an API key opens no metrics
    assert wrong.value.reason == "wrong_key"
    assert not gate.guarded("open") and gate.guarded("api")


def test_the_limit_comes_first_and_counts_a_moving_window(monkeypatch):
    import types

    import limits.storage.memory

    now = [1_000_000.0]
    monkeypatch.setattr(limits.storage.memory, "time", types.SimpleNamespace(time=lambda: now[0]))
    gate = _gate(API_KEYS="k", RATE_LIMIT_API="2/10seconds")
    guesser = admission.Caller("guess", "10.0.0.9")
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            gate.admit(guesser, "api")
    with pytest.raises(RateLimited) as limited:
        gate.admit(guesser, "api")  # key guessing is limited too: by address
    assert limited.value.limit == "2 per 10 second" and limited.value.window.remaining == 0
    now[0] += 9.0
    with pytest.raises(RateLimited):
        gate.admit(guesser, "api")  # a moving window: the first two are still in it
    now[0] += 1.5
    with pytest.raises(Unauthenticated):
        gate.admit(guesser, "api")  # back to the key's own refusal


def test_a_store_that_fails_counts_in_memory_and_is_tried_again(monkeypatch):
    gate = _gate(API_KEYS="k", RATE_LIMIT_API="100/second")
    calls = []

    class Broken:
        def hit(self, *args, **kwargs):
            calls.append(1)
            raise ConnectionError("the store went away")

    monkeypatch.setattr(gate, "_limiter", Broken())
    caller = admission.Caller("k", "10.0.0.1")
    assert gate.admit(caller, "api").window.limit == 100  # counted in memory, never refused for the store's fault
    assert gate.admit(caller, "api").window.remaining == 98 and calls == [1]  # not asked again at once
