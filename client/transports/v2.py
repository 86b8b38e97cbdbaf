"""The Open Inference Protocol (KServe v2) over HTTP: ``/v2/models/NAME/infer``, ``.../ready`` and the model's metadata."""

import json
import struct
from urllib.parse import quote

import contract
from client.transports.common import UNKNOWN_LABEL, HttpTransport, RequestFailed, Unreachable, reason


class V2Transport(HttpTransport):
    """The Open Inference Protocol over HTTP: the files' bytes as a BYTES tensor in the binary tensor data
    extension, the top k through the classification extension (``"<probability>:<class id>[:<label>]"``)."""

    def __init__(self, url, model, timeout, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self._confidence = None  # the confidence outputs the model has, learned from its metadata

    def _call(self, method, path, **kwargs):
        response = self._send(method, f"{self.url}/v2{path}", **kwargs)
        header_length = response.headers.get("Inference-Header-Content-Length")
        try:
            body = json.loads(response.content[: int(header_length)] if header_length else response.content)
        except ValueError:
            body = None
        self._raise_if_not_ready(response, body)
        return response, body

    def _model_path(self):
        return f"/models/{quote(self.model, safe='')}"

    def predict(self, batch, top_k):
        tensor = b"".join(struct.pack("<I", len(data)) + data for _, data in batch)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": contract.INPUT_BYTES,
                        "shape": [len(batch)],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(tensor)},
                    }
                ],
                "outputs": [
                    {"name": contract.OUTPUT_PROBABILITIES, "parameters": {"classification": top_k, "binary_data": False}},
                    *({"name": name, "parameters": {"binary_data": False}} for name in self._confidence_outputs()),
                ],
            }
        ).encode()
        response, body = self._call(
            "POST",
            f"{self._model_path()}/infer",
            data=header + tensor,
            headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        )
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        try:
            (output,) = [o for o in body["outputs"] if o["name"] == contract.OUTPUT_PROBABILITIES]
            rows, k = output["shape"]
            cells = [_classification(cell) for cell in output["data"]]
            extra = {o["name"]: list(o["data"]) for o in body["outputs"] if o["name"] in self.CONFIDENCE}
        except (KeyError, TypeError, ValueError) as error:
            raise RequestFailed(f"unexpected answer from {self.url}: {type(error).__name__}: {error}", response.status_code) from None
        if rows != len(batch) or len(cells) != rows * k:
            raise RequestFailed(f"unexpected answer from {self.url}: {rows} rows for {len(batch)} images", response.status_code)
        results = []
        for row in range(rows):
            ranked = cells[row * k : (row + 1) * k]
            best = ranked[0]
            score, inside = (extra.get(name, [None] * rows)[row] for name in self.CONFIDENCE)
            results.append({"label": best["label"], "class_id": best["class_id"], "probability": best["probability"],
                            "top_k": ranked, "ood_score": score, "in_distribution": inside})
        return results

    #: The outputs that say how foreign an image looks, asked for when the model has them.
    CONFIDENCE = (contract.OUTPUT_OOD_SCORE, contract.OUTPUT_IN_DISTRIBUTION)

    def _confidence_outputs(self):
        """Which of :data:`CONFIDENCE` the model has, from its metadata (asked once)."""
        if self._confidence is None:
            response, body = self._call("GET", self._model_path())
            if response.status_code != 200 or not isinstance(body, dict):
                raise RequestFailed(reason(body, response), response.status_code)
            names = {o.get("name") for o in body.get("outputs", []) if isinstance(o, dict)}
            self._confidence = [name for name in self.CONFIDENCE if name in names]
        return self._confidence

    def health(self):
        response, body = self._call("GET", f"{self._model_path()}/ready")
        if response.status_code in (401, 403, 404, 429):  # no key, a wrong one, no such model, too many requests
            raise RequestFailed(reason(body, response), response.status_code)
        if response.status_code != 200:  # the protocol says "not ready" with any other 4xx
            raise Unreachable(f"model {self.model} at {self.url} is not ready: {reason(body, response)}")
        return {"status": "ready", "model": self.model, "versions": self.info()["versions"]}

    def info(self):
        response, body = self._call("GET", self._model_path())
        if response.status_code != 200 or not isinstance(body, dict):
            raise RequestFailed(reason(body, response), response.status_code)
        versions = [str(v) for v in body.get("versions") or []]
        if all(v.isdigit() for v in versions):
            versions = sorted(int(v) for v in versions)

        def tensors(entries):
            return {t["name"]: {"datatype": t.get("datatype"), "shape": t.get("shape")} for t in entries or []}

        return {
            "name": body.get("name"),
            "version": max(versions) if versions else None,
            "versions": versions,
            "class_names": None,
            "signatures": {"infer": {"inputs": tensors(body.get("inputs")), "outputs": tensors(body.get("outputs"))}},
            "backend": f"v2 {self.url} ({body.get('platform')})",
        }


def _classification(cell):
    """One classification-extension string ``"<value>:<index>[:<label>]"`` as ``{label, class_id, probability}``."""
    value, index, *label = cell.split(":", 2)
    return {"label": label[0] if label else UNKNOWN_LABEL, "class_id": int(index), "probability": float(value)}
