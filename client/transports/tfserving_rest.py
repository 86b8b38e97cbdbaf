"""TF Serving's REST API: ``/v1/models/NAME:predict``, its status and its ``/metadata``."""

import json
from urllib.parse import quote

import contract
from client.transports.common import (MAX_SERVER_TEXT, Malformed, RequestFailed, Unreachable, field, kind,
                                      json_or_none, parsing, reason, text_or_none, tfs_result, whole, with_bad)
from client.transports.http import HttpTransport


class TFServingRestTransport(HttpTransport):
    """TF Serving's REST API: images decoded here (:mod:`client.images`), uint8 pixels to ``serving_default``.

    ``version`` (a number) or ``label`` (a version label) is named in every path:
    ``/v1/models/NAME/versions/N`` or ``/v1/models/NAME/labels/LABEL``."""

    def __init__(self, url, model, timeout, version=None, label=None, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self.names = {}  # class id -> name, learned from the answers (TF Serving names only the top class)
        self._which = (f"/versions/{int(version)}" if version is not None
                       else f"/labels/{quote(label, safe='')}" if label is not None else "")

    def _source(self, path=""):
        return f"{self.url}/v1/models/{quote(self.model, safe='')}{self._which}{path}"

    def _call(self, method, path, **kwargs):
        response = self._send(method, self._source(path), **kwargs)
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
            predictions = field(self._call("POST", ":predict", json=body), "predictions", list)
            if len(predictions) != len(pixels):
                raise Malformed(f"{len(predictions)} predictions for {len(pixels)} images")
            results = []
            for i, row in enumerate(predictions):
                path = f"predictions[{i}]"
                if not isinstance(row, dict):
                    raise Malformed(f"{path} is not an object")
                class_id = whole(row.get(contract.OUTPUT_CLASS_IDS), f"{path}.{contract.OUTPUT_CLASS_IDS}")
                name = text_or_none(row.get(contract.OUTPUT_CLASS_NAMES), f"{path}.{contract.OUTPUT_CLASS_NAMES}")
                if name is not None:
                    self.names[class_id] = name
                results.append(tfs_result(row.get(contract.OUTPUT_PROBABILITIES), class_id, top_k, self.names,
                                          row.get(contract.OUTPUT_OOD_SCORE), row.get(contract.OUTPUT_IN_DISTRIBUTION), path))
            return results

        with parsing(self._source(":predict")):
            return with_bad(batch, bad, predict_good)

    def health(self):
        body = self._call("GET", "")
        with parsing(self._source()):
            if not isinstance(body, dict):
                raise Malformed(f"the answer is {kind(body)}, not an object")
            states = body.get("model_version_status", [])
            if not isinstance(states, list):
                raise Malformed(f"model_version_status is {kind(states)}, not a list")
            available = [int(s["version"]) for s in states if isinstance(s, dict) and s.get("state") == "AVAILABLE"]
        if not available:
            raise Unreachable(f"model {self.model} at {self.url} is not available: {json.dumps(states)[:MAX_SERVER_TEXT]}")
        return {"status": "ready", "model": self.model, "versions": available}

    def info(self):
        body = self._call("GET", "/metadata")
        with parsing(self._source("/metadata")):
            spec = field(body, "model_spec", dict)
            metadata = field(field(body, "metadata", dict), "signature_def", dict, "metadata")
            signatures = field(metadata, "signature_def", dict, "metadata.signature_def")
            return {
                "name": text_or_none(spec.get("name"), "model_spec.name"),
                "version": int(spec.get("version")),
                "class_names": None,
                "signatures": {name: _signature_summary(sig, f"signature_def[{name!r}]")
                               for name, sig in signatures.items() if not name.startswith("__")},
                "backend": f"tfserving-rest {self.url}",
            }


def _signature_summary(signature, path):
    if not isinstance(signature, dict):
        raise Malformed(f"{path} is not an object")
    return {part: sorted(str(name) for name in (signature.get(part) or {})) for part in ("inputs", "outputs")}
