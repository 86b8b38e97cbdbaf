"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService`` (``ModelInfer``,
``ModelReady``, ``ModelMetadata``), through the vendored protos in :mod:`tfs_protos.inference` and grpcio, so
the client needs no ``tritonclient``."""

import struct

import contract
from client.transports.common import Malformed, Unreachable, parsing
from client.transports.grpc_call import GrpcTransport
from client.transports.v2 import V2Transport, image_results, parse_classification

#: The bytes of one value of each fixed-size datatype the client reads, and its ``struct`` code.
FIXED = {"FP32": (4, "f"), "BOOL": (1, "?")}


class V2GrpcTransport(GrpcTransport):
    """The Open Inference Protocol over gRPC, as :class:`~client.transports.v2.V2Transport` speaks it over HTTP: the
    files' bytes as a BYTES ``image_bytes`` tensor in ``raw_input_contents``, the top k through the classification
    extension; ``version`` (a number; the protocol has no labels) goes in every request's ``model_version``."""

    def __init__(self, target, model, timeout, version=None):
        from tfs_protos.inference import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

        super().__init__(target, model, timeout, version)
        self.pb = grpc_predict_v2_pb2
        self.stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self._metadata = None

    def _model_version(self):
        return "" if self.version is None else str(int(self.version))

    def predict(self, batch, top_k):
        request = self.pb.ModelInferRequest(model_name=self.model, model_version=self._model_version())
        request.inputs.add(name=contract.INPUT_BYTES, datatype="BYTES", shape=[len(batch)])
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(data)) + data for _, data in batch))
        wanted = request.outputs.add(name=contract.OUTPUT_PROBABILITIES)
        wanted.parameters["classification"].int64_param = top_k
        for name in self._confidence_outputs():
            request.outputs.add(name=name)
        response = self._call(self.stub.ModelInfer, request)
        with parsing(self.target):
            return self._results(response, len(batch))

    def _results(self, response, images):
        if len(response.raw_output_contents) != len(response.outputs):
            raise Malformed(f"{len(response.raw_output_contents)} raw_output_contents for {len(response.outputs)} outputs")
        raw = {output.name: (output, data) for output, data in zip(response.outputs, response.raw_output_contents)}
        if contract.OUTPUT_PROBABILITIES not in raw:
            raise Malformed(f"no output {contract.OUTPUT_PROBABILITIES!r}")
        output, data = raw[contract.OUTPUT_PROBABILITIES]
        if output.datatype != "BYTES" or len(output.shape) != 2 or output.shape[0] != images or output.shape[1] < 1:
            raise Malformed(f"the classification is {output.datatype} {list(output.shape)[:4]}, not BYTES [{images}, k]")
        rows, k = output.shape
        strings = _strings(data, rows * k)
        cells = [parse_classification(cell.decode("utf-8", "replace"), f"classification {i}") for i, cell in enumerate(strings)]
        extra = {}
        for name in V2Transport.CONFIDENCE:
            if name in raw:
                output, data = raw[name]
                size, code = FIXED.get(output.datatype, (0, ""))
                if not size or list(output.shape) != [rows] or len(data) != rows * size:
                    raise Malformed(f"output {name!r} is {output.datatype} {list(output.shape)[:4]} in {len(data)} bytes, "
                                    f"not {rows} values")
                extra[name] = list(struct.unpack(f"<{rows}{code}", data))
        return image_results(cells, rows, k, extra)

    def _confidence_outputs(self):
        """Which of the confidence outputs the model has, from its metadata (asked once)."""
        names = {output.name for output in self._model_metadata().outputs}
        return [name for name in V2Transport.CONFIDENCE if name in names]

    def _model_metadata(self):
        if self._metadata is None:
            request = self.pb.ModelMetadataRequest(name=self.model, version=self._model_version())
            self._metadata = self._call(self.stub.ModelMetadata, request)
        return self._metadata

    def health(self):
        request = self.pb.ModelReadyRequest(name=self.model, version=self._model_version())
        if not self._call(self.stub.ModelReady, request).ready:
            raise Unreachable(f"model {self.model} at {self.target} is not ready")
        return {"status": "ready", "model": self.model, "versions": self.info()["versions"]}

    def info(self):
        metadata = self._model_metadata()
        versions = list(metadata.versions)
        versions = sorted(int(v) for v in versions) if all(v.isascii() and v.isdigit() for v in versions) else sorted(versions)

        def tensors(entries):
            return {t.name: {"datatype": t.datatype, "shape": list(t.shape)} for t in entries}

        return {
            "name": metadata.name,
            "version": versions[-1] if versions else None,
            "versions": versions,
            "class_names": None,
            "signatures": {"infer": {"inputs": tensors(metadata.inputs), "outputs": tensors(metadata.outputs)}},
            "backend": f"v2-grpc {self.target} ({metadata.platform})",
        }


def _strings(data, count):
    """``count`` BYTES elements of raw contents: each a little-endian uint32 length, then that many bytes."""
    strings, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise Malformed("a BYTES element's length is cut short")
        (length,) = struct.unpack_from("<I", data, at)
        if at + 4 + length > len(data):
            raise Malformed(f"a BYTES element of {length} bytes runs past the end of its {len(data)}")
        strings.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    if len(strings) != count:
        raise Malformed(f"{len(strings)} BYTES elements for {count}")
    return strings
