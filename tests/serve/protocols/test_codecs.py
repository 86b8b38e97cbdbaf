"""Each protocol is a codec: its wire format to the core's request and the core's answer back, with no server.

For each protocol, what its clients send is decoded into :class:`serve.core.request.Tensor` s, and those read by
the core's rules (serve/core/tensors.py) give back the very pixels or images sent; an answer of the core is encoded
and read back with the protocol's own tools (TensorFlow's ``make_ndarray`` for TF Serving's protos, the binary
extension's layout for v2), giving back the very outputs.
"""

import base64
import json
import struct

import numpy as np
import pytest
import tensorflow as tf

import contract
import synthetic
from fake_backend import FakeBackend, expected
from serve.core import tensors
from serve.core.request import InferResponse, Tensor, Upload
from serve.core.service import Limits
from serve.protocols import tfserving_grpc, tfserving_rest, v2, v2_grpc, v2_rest
from tfs_protos import tensors as protos
from tfs_protos.inference import grpc_predict_v2_pb2 as v2_pb
from tfs_protos.tensorflow_serving.apis import predict_pb2

LIMITS = Limits(max_images=64, max_pixels=1 << 20, top_k=3, max_request_pixels=1 << 22)
INFO = FakeBackend().info()
PIXELS = INFO.signature(contract.SIGNATURE_PIXELS).inputs[contract.INPUT_PIXELS]
ENCODED = INFO.signature(contract.SIGNATURE_BYTES).inputs[contract.INPUT_BYTES]


@pytest.fixture(scope="module")
def images():
    return synthetic.make_images(2)[0][:5]


def _answer(images, version=1):
    return InferResponse(INFO, version, expected(images, version), 3)


def _read(tensor, spec, names=None):
    return tensors.read("x", tensor, spec, LIMITS, names)


# -- TF Serving REST -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["instances", "inputs", "named instances"])
def test_tfserving_rest_pixels_round_trip(images, form):
    if form == "instances":
        body = {"instances": images.tolist()}
    elif form == "inputs":
        body = {"inputs": images.tolist(), "signature_name": contract.SIGNATURE_PIXELS}
    else:
        body = {"instances": [{contract.INPUT_PIXELS: image.tolist()} for image in images]}
    rows, signature, inputs = tfserving_rest.decode(json.loads(json.dumps(body)))
    assert rows == (form != "inputs") and signature == contract.SIGNATURE_PIXELS
    ((key, tensor),) = inputs.items()
    assert key == (contract.INPUT_PIXELS if form == "named instances" else None)
    np.testing.assert_array_equal(_read(tensor, PIXELS), images)


def test_tfserving_rest_b64_images_round_trip(images):
    pngs = [synthetic.encode(image) for image in images]
    body = {"signature_name": contract.SIGNATURE_BYTES, "instances": [{"b64": base64.b64encode(p).decode()} for p in pngs]}
    _, signature, inputs = tfserving_rest.decode(body)
    assert signature == contract.SIGNATURE_BYTES and _read(inputs[None], ENCODED).tolist() == pngs


def test_tfserving_rest_answers_as_tf_serving_shapes_them(images):
    answer = _answer(images)
    rows = json.loads(json.dumps(tfserving_rest.encode(answer.outputs, rows=True), default=lambda a: a.tolist()))
    columns = json.loads(json.dumps(tfserving_rest.encode(answer.outputs, rows=False), default=lambda a: a.tolist()))
    assert len(rows["predictions"]) == len(images)
    np.testing.assert_allclose([row["probabilities"] for row in rows["predictions"]], answer.outputs["probabilities"])
    assert [row["class_names"] for row in rows["predictions"]] == [n.decode() for n in answer.outputs["class_names"]]
    np.testing.assert_array_equal(columns["outputs"]["class_ids"], answer.outputs["class_ids"])


# -- TF Serving gRPC -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["tensor_content", "int_val", "one value filled out"])
def test_tfserving_grpc_tensors_round_trip(images, how):
    proto = protos.to_proto(images)
    if how != "tensor_content":
        proto.ClearField("tensor_content")
        proto.int_val.extend(images.ravel().tolist() if how == "int_val" else [7])
    want = images if how != "one value filled out" else np.full_like(images, 7)
    np.testing.assert_array_equal(_read(tfserving_grpc.tensor("images", proto), PIXELS), want)
    np.testing.assert_array_equal(tf.make_ndarray(proto), want)  # TensorFlow reads the same proto the same way


def test_tfserving_grpc_answers_read_back_by_tensorflow(images):
    answer = _answer(images)
    response = predict_pb2.PredictResponse.FromString(
        tfserving_grpc.predict_response(answer, "cifar10", contract.SIGNATURE_PIXELS).SerializeToString())
    assert response.model_spec.version.value == 1
    for key, value in answer.outputs.items():
        read = tf.make_ndarray(response.outputs[key])
        if value.dtype == object:
            assert read.tolist() == value.tolist()
        else:
            np.testing.assert_array_equal(read, value)


# -- the Open Inference Protocol over HTTP ---------------------------------------------------------------------------


def test_v2_rest_json_and_binary_inputs_round_trip(images):
    flat = {"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(images.shape), "data": images.ravel().tolist()}]}
    inputs, wanted, binary = v2_rest.decode(flat)
    np.testing.assert_array_equal(_read(inputs["images"], PIXELS, v2.NAMES), images)
    assert wanted == [] and binary is False
    raw = images.tobytes()
    header = {"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(images.shape),
                          "parameters": {"binary_data_size": len(raw)}}],
              "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}},
                          {"name": "probabilities", "parameters": {"classification": 2}}]}
    inputs, wanted, _ = v2_rest.decode(header, memoryview(raw))
    np.testing.assert_array_equal(_read(inputs["images"], PIXELS, v2.NAMES), images)
    assert wanted == [v2.Wanted("probabilities", True, 0), v2.Wanted("probabilities", False, 2)]


def test_v2_rest_bytes_inputs_round_trip(images):
    pngs = [synthetic.encode(image) for image in images]
    tail = b"".join(struct.pack("<I", len(p)) + p for p in pngs)
    header = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [len(pngs)],
                          "parameters": {"binary_data_size": len(tail)}}]}
    inputs, _, _ = v2_rest.decode(header, tail)
    assert v2.signature_of(inputs) == contract.SIGNATURE_BYTES
    assert _read(inputs["image_bytes"], ENCODED, v2.NAMES).tolist() == pngs
    as_json = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [len(pngs)],
                           "data": [base64.b64encode(p).decode() for p in pngs], "parameters": {"content_type": "base64"}}]}
    assert _read(v2_rest.decode(as_json)[0]["image_bytes"], ENCODED, v2.NAMES).tolist() == pngs


def test_v2_rest_answers_in_json_and_binary(images):
    answer = _answer(images)
    wanted = [v2.Wanted("probabilities", True), v2.Wanted("class_names"), v2.Wanted("probabilities", False, 2)]
    header, blobs = v2_rest.encode(answer, wanted, "cifar10", {"id": "abc"})
    assert header["id"] == "abc" and header["model_version"] == "1"
    binary, names, ranked = header["outputs"]
    assert binary["parameters"]["binary_data_size"] == len(blobs[0])
    np.testing.assert_array_equal(np.frombuffer(blobs[0], "<f4").reshape(binary["shape"]), answer.outputs["probabilities"])
    assert names["data"] == [n.decode() for n in answer.outputs["class_names"]]
    assert ranked["shape"] == [len(images), 2] and all(entry.count(":") == 2 for entry in ranked["data"])


# -- the Open Inference Protocol over gRPC ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["raw", "typed"])
def test_v2_grpc_inputs_round_trip(images, how):
    request = v2_pb.ModelInferRequest(model_name="cifar10")
    tensor = request.inputs.add(name="images", datatype="UINT8", shape=list(images.shape))
    if how == "raw":
        request.raw_input_contents.append(images.tobytes())
    else:
        tensor.contents.uint_contents.extend(images.ravel().tolist())
    request.outputs.add(name="class_ids")
    inputs, wanted = v2_grpc.decode(v2_pb.ModelInferRequest.FromString(request.SerializeToString()))
    np.testing.assert_array_equal(_read(inputs["images"], PIXELS, v2.NAMES), images)
    assert wanted == [v2.Wanted("class_ids", True)]


def test_v2_grpc_answers_in_raw_output_contents(images):
    answer = _answer(images)
    request = v2_pb.ModelInferRequest(model_name="cifar10", id="call-1")
    response = v2_grpc.encode(answer, [], request)
    assert response.id == "call-1" and response.model_version == "1"
    by_name = {output.name: (output, raw) for output, raw in zip(response.outputs, response.raw_output_contents)}
    assert list(by_name) == list(INFO.outputs)
    output, raw = by_name["probabilities"]
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(output.shape), answer.outputs["probabilities"])
    output, raw = by_name["class_names"]
    assert raw == b"".join(struct.pack("<I", len(n)) + n for n in answer.outputs["class_names"])


def test_uploads_stay_uploads(images):
    """The JSON API's and the form's images reach the core as uploads, file names and faults kept."""
    uploads = [Upload("a.png", synthetic.encode(images[0])), Upload(error="is not valid base64")]
    assert _read(Tensor(uploads), ENCODED) == uploads
