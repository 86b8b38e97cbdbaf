"""TF Serving's gRPC API (``PredictionService``, ``ModelService``), through the vendored protos in :mod:`tfs_protos`."""

import math

import contract
from client.transports.common import Malformed, Unreachable, parsing, tfs_result, with_bad
from client.transports.grpc_call import GrpcTransport

#: The most classes an answer may rank per image (this project's models have 10).
MAX_CLASSES = 100_000


class TFServingGrpcTransport(GrpcTransport):
    """TF Serving's gRPC ``PredictionService``/``ModelService``, through the vendored protos: TF Serving's own, or
    this project's server on its ``GRPC_PORT``, which speaks the same API.

    ``version`` (a number) or ``label`` (a version label) goes in every request's ``model_spec``."""

    def __init__(self, target, model, timeout, version=None, label=None):
        from tfs_protos.tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        super().__init__(target, model, timeout, version)
        self.label = label
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.names = {}

    def _spec(self, model_spec):
        """Name the model, and the version or label asked for, in a request's ``model_spec``."""
        model_spec.name = self.model
        if self.version is not None:
            model_spec.version.value = self.version
        elif self.label is not None:
            model_spec.version_label = self.label

    def predict(self, batch, top_k):
        from client import images

        pixels, bad = images.decode_batch(batch)
        with parsing(self.target):
            return with_bad(batch, bad, lambda: self._predict_pixels(pixels, top_k))

    def _predict_pixels(self, pixels, top_k):
        """``serving_default`` on uint8 ``pixels``, as TF Serving's clients send a uint8 tensor."""
        from tfs_protos import tensors
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec)
        request.model_spec.signature_name = contract.SIGNATURE_PIXELS
        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(pixels))
        outputs = self._call(self.predictions.Predict, request).outputs
        images = len(pixels)

        def output(key, required=True):
            if key not in outputs:
                if required:
                    raise Malformed(f"no output {key!r}")
                return [None] * images
            # The shape a tensor declares is checked before it is read: one value and a shape of 2**40 would be filled out.
            count = math.prod(d.size for d in outputs[key].tensor_shape.dim)
            if key == contract.OUTPUT_PROBABILITIES:
                if not 0 < count <= images * MAX_CLASSES or count % images:
                    raise Malformed(f"{count} probabilities for {images} images")
            elif count != images:
                raise Malformed(f"{count} values of {key!r} for {images} images")
            return tensors.to_array(outputs[key])

        probabilities = output(contract.OUTPUT_PROBABILITIES).reshape(images, -1).tolist()
        class_ids = output(contract.OUTPUT_CLASS_IDS).reshape(-1).tolist()
        class_names = [n.decode("utf-8") for n in output(contract.OUTPUT_CLASS_NAMES).reshape(-1).tolist()]
        self.names.update(zip(class_ids, class_names))

        def optional(key):
            values = output(key, required=False)
            return values if isinstance(values, list) else values.reshape(-1).tolist()

        scores, inside = optional(contract.OUTPUT_OOD_SCORE), optional(contract.OUTPUT_IN_DISTRIBUTION)
        return [tfs_result(probabilities[i], class_ids[i], top_k, self.names, scores[i], inside[i], f"image {i}")
                for i in range(images)]

    def health(self):
        from tfs_protos.tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request.model_spec)
        response = self._call(self.models.GetModelStatus, request)
        available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        versions = [s.version for s in response.model_version_status if s.state == available]
        if not versions:
            raise Unreachable(f"model {self.model} at {self.target} has no available version")
        return {"status": "ready", "model": self.model, "versions": versions}

    def info(self):
        from tfs_protos.tensorflow.core.protobuf import meta_graph_pb2  # noqa: F401  (SignatureDef, for Unpack)
        from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec)
        request.metadata_field.append("signature_def")
        from google.protobuf.message import DecodeError

        response = self._call(self.predictions.GetModelMetadata, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        with parsing(self.target):
            try:
                if not response.metadata["signature_def"].Unpack(signature_map):
                    raise Malformed(f"metadata.signature_def is a {response.metadata['signature_def'].type_url}, "
                                    "not a SignatureDefMap")
            except DecodeError as e:
                raise Malformed(f"metadata.signature_def does not parse ({e})") from None
        return {
            "name": response.model_spec.name,
            "version": response.model_spec.version.value,
            "class_names": None,
            "signatures": {
                name: {"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs)}
                for name, sig in signature_map.signature_def.items()
                if not name.startswith("__")
            },
            "backend": f"tfserving-grpc {self.target}",
        }
