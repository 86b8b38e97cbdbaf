"""TF Serving's REST API: ``/v1/models/NAME:predict``, its status and its ``/metadata``."""

import contract
from client.transports.common import HttpTransport, RequestFailed, Unreachable, json_or_none, reason, tfs_result, with_bad


class TFServingRestTransport(HttpTransport):
    """TF Serving's REST API: images decoded here (:mod:`client.images`), uint8 pixels to ``serving_default``."""

    def __init__(self, url, model, timeout, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self.names = {}  # class id -> name, learned from the answers (TF Serving names only the top class)

    def _call(self, method, path, **kwargs):
        response = self._send(method, f"{self.url}/v1/models/{self.model}{path}", **kwargs)
        body = json_or_none(response)
        self._raise_if_not_ready(response, body)
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        return body

    def predict(self, batch, top_k):
        from client import images

        pixels, bad = images.decode_batch(batch)

        def predict_good():
            body = {"signature_name": contract.SIGNATURE_PIXELS, "instances": pixels.tolist()}
            predictions = self._call("POST", ":predict", json=body)["predictions"]
            results = []
            for row in predictions:
                class_id = int(row[contract.OUTPUT_CLASS_IDS])
                self.names[class_id] = row[contract.OUTPUT_CLASS_NAMES]
                results.append(tfs_result(row[contract.OUTPUT_PROBABILITIES], class_id, top_k, self.names,
                                          row.get(contract.OUTPUT_OOD_SCORE), row.get(contract.OUTPUT_IN_DISTRIBUTION)))
            return results

        return with_bad(batch, bad, predict_good)

    def health(self):
        body = self._call("GET", "")
        states = body.get("model_version_status", [])
        if not any(s.get("state") == "AVAILABLE" for s in states):
            raise Unreachable(f"model {self.model} at {self.url} is not available: {states}")
        return {"status": "ready", "model": self.model, "versions": [int(s["version"]) for s in states if s.get("state") == "AVAILABLE"]}

    def info(self):
        body = self._call("GET", "/metadata")
        signatures = body["metadata"]["signature_def"]["signature_def"]
        return {
            "name": body["model_spec"]["name"],
            "version": int(body["model_spec"]["version"]),
            "class_names": None,
            "signatures": {name: _signature_summary(sig) for name, sig in signatures.items() if not name.startswith("__")},
            "backend": f"tfserving-rest {self.url}",
        }


def _signature_summary(signature):
    return {
        "inputs": sorted(signature.get("inputs", {})),
        "outputs": sorted(signature.get("outputs", {})),
    }
