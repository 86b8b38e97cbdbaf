"""This project's own JSON API: ``/api/v1/predict``, ``/readyz`` and ``/api/v1/model``."""

from client.transports.common import HttpTransport, RequestFailed, Unreachable, json_or_none, reason


class ApiTransport(HttpTransport):
    """This project's server: ``POST /api/v1/predict``, ``GET /readyz``, ``GET /api/v1/model``."""

    def _call(self, method, path, **kwargs):
        response = self._send(method, self.url + path, **kwargs)
        body = json_or_none(response)
        self._raise_if_not_ready(response, body)
        return response, body

    def predict(self, batch, top_k):
        files = [("file", (name, data, "application/octet-stream")) for name, data in batch]
        response, body = self._call("POST", "/api/v1/predict", files=files, data={"top_k": str(top_k)})
        predictions = (body or {}).get("predictions") if isinstance(body, dict) else None
        if isinstance(predictions, list) and len(predictions) == len(batch):
            return [_api_result(p, response.status_code) for p in predictions]
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        raise RequestFailed(f"unexpected answer from {self.url}/api/v1/predict", response.status_code)

    def health(self):
        response, body = self._call("GET", "/readyz")
        if response.status_code != 200:
            raise Unreachable(f"{self.url} is not ready: {reason(body, response)}")
        return body if isinstance(body, dict) else {"status": "ready"}

    def info(self):
        response, body = self._call("GET", "/api/v1/model")
        if response.status_code != 200 or not isinstance(body, dict):
            raise RequestFailed(reason(body, response), response.status_code)
        return body


def _api_result(prediction, http_status):
    if "error" in prediction:
        return {"error": prediction["error"], "status": prediction.get("status", http_status)}
    return {
        "label": prediction.get("label"),
        "class_id": prediction.get("class_id"),
        "probability": prediction.get("probability"),
        "top_k": prediction.get("top_k", []),
        "ood_score": prediction.get("ood_score"),
        "in_distribution": prediction.get("in_distribution"),
    }
