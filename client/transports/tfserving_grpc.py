"""TF Serving's gRPC API (``PredictionService``, ``ModelService``), through the vendored protos in :mod:`tfs_protos`."""

import contract
from client.transports.common import RequestFailed, Unreachable, tfs_result, with_bad


class TFServingGrpcTransport:
    """TF Serving's gRPC ``PredictionService``/``ModelService``, through the vendored protos."""

    def __init__(self, target, model, timeout):
        import grpc

        from tfs_protos.tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self._grpc = grpc
        self.target = target
        self.model = model
        self.timeout = timeout
        self.channel = grpc.insecure_channel(target)
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.names = {}

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as error:
            code, details = error.code(), error.details()
            if code in (self._grpc.StatusCode.UNAVAILABLE, self._grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unreachable(f"cannot reach {self.target}: {code.name}") from error
            raise RequestFailed(details or code.name, code.name) from error

    def predict(self, batch, top_k):
        from client import images

        pixels, bad = images.decode_batch(batch)
        return with_bad(batch, bad, lambda: self._predict_pixels(pixels, top_k))

    def _predict_pixels(self, pixels, top_k):
        """``serving_default`` on uint8 ``pixels``, as TF Serving's clients send a uint8 tensor."""
        from tfs_protos import tensors
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model
        request.model_spec.signature_name = contract.SIGNATURE_PIXELS
        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(pixels))
        outputs = self._call(self.predictions.Predict, request).outputs
        probabilities = tensors.to_array(outputs[contract.OUTPUT_PROBABILITIES]).reshape(len(pixels), -1).tolist()
        class_ids = tensors.to_array(outputs[contract.OUTPUT_CLASS_IDS]).reshape(-1).tolist()
        class_names = [n.decode("utf-8") for n in tensors.to_array(outputs[contract.OUTPUT_CLASS_NAMES]).reshape(-1).tolist()]
        self.names.update(zip(class_ids, class_names))
        scores, inside = ([tensors.to_array(outputs[key]).reshape(-1).tolist() if key in outputs else [None] * len(pixels)
                           for key in (contract.OUTPUT_OOD_SCORE, contract.OUTPUT_IN_DISTRIBUTION)])
        return [tfs_result(probabilities[i], class_ids[i], top_k, self.names, scores[i], inside[i])
                for i in range(len(pixels))]

    def health(self):
        from tfs_protos.tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model
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
        request.model_spec.name = self.model
        request.metadata_field.append("signature_def")
        response = self._call(self.predictions.GetModelMetadata, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
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
