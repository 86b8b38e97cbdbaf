"""This project's own JSON API: ``/api/v1/predict``, ``/readyz`` and ``/api/v1/model``."""

from client.transports.common import (Malformed, MalformedAnswer, RequestFailed, Unreachable, checked,
                                      json_or_none, kind, parsing, reason, server_text, text_or_none)
from client.transports.http import HttpTransport


class ApiTransport(HttpTransport):
    """This project's server: ``POST /api/v1/predict``, ``GET /readyz``, ``GET /api/v1/model``."""

    def _call(self, method, path, **kwargs):
        response = self._send(method, self.url + path, **kwargs)
        body = json_or_none(response)
        self._raise_if_not_ready(response, body)
        return response, body

    def predict(self, batch, top_k):
        files = [("file", (name, data, "application/octet-stream")) for name, data in batch]
        source = f"{self.url}/api/v1/predict"
        response, body = self._call("POST", "/api/v1/predict", files=files, data={"top_k": str(top_k)})
        predictions = body.get("predictions") if isinstance(body, dict) else None
        if isinstance(predictions, list) and len(predictions) == len(batch):
            with parsing(source):
                return [_api_result(p, response.status_code, f"predictions[{i}]") for i, p in enumerate(predictions)]
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        if body is None:
            problem = "not JSON"
        elif isinstance(predictions, list):
            problem = f"{len(predictions)} predictions for {len(batch)} images"
        else:
            problem = "no list of predictions" if isinstance(body, dict) else f"the answer is {kind(body)}, not an object"
        raise MalformedAnswer(f"malformed answer from {source}: {problem}")

    def health(self):
        response, body = self._call("GET", "/readyz")
        if response.status_code != 200:
            raise Unreachable(f"{self.url} is not ready: {reason(body, response)}")
        return body if isinstance(body, dict) else {"status": "ready"}

    def info(self):
        response, body = self._call("GET", "/api/v1/model")
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        with parsing(f"{self.url}/api/v1/model"):
            if not isinstance(body, dict):
                raise Malformed("not JSON" if body is None else f"the answer is {kind(body)}, not an object")
            text_or_none(body.get("name"), "name")
            names = body.get("class_names")
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                raise Malformed(f"class_names is {kind(names)}, not a list of strings")
            if body.get("signatures") is not None and not isinstance(body["signatures"], dict):
                raise Malformed(f"signatures is {kind(body['signatures'])}, not an object")
        return body


def _api_result(prediction, http_status, path):
    if not isinstance(prediction, dict):
        raise Malformed(f"{path} is {kind(prediction)}, not an object")
    if "error" in prediction:
        status = prediction.get("status")
        if isinstance(status, bool) or not isinstance(status, int):
            status = http_status
        return {"error": server_text(prediction["error"]), "status": status}
    return checked(prediction, path)
