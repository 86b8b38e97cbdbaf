"""The Open Inference Protocol (KServe v2) over HTTP: ``/v2/models/NAME/infer``, ``.../ready`` and the model's metadata."""

import json
import struct
from urllib.parse import quote

import contract
from client.transports.common import (UNKNOWN_LABEL, Malformed, RequestFailed, Unreachable,
                                      checked, field, kind, number, parse_json, parsing, reason, text_or_none)
from client.transports.http import HttpTransport


class V2Transport(HttpTransport):
    """The Open Inference Protocol over HTTP: the files' bytes as a BYTES tensor in the binary tensor data
    extension, the top k through the classification extension (``"<probability>:<class id>[:<label>]"``).

    The protocol names versions by number only: it has no labels."""

    def __init__(self, url, model, timeout, version=None, **retry):
        super().__init__(url, timeout, **retry)
        self.model = model
        self.version = version  # named in every path (/v2/models/NAME/versions/N); None: the server's choice
        self._confidence = None  # the confidence outputs the model has, learned from its metadata

    def _call(self, method, path, **kwargs):
        response = self._send(method, f"{self.url}/v2{path}", **kwargs)
        header_length = response.headers.get("Inference-Header-Content-Length", "").strip()
        try:
            body = parse_json(response.content[: int(header_length)] if header_length.isascii() and header_length.isdigit() else response.content)
        except ValueError:
            body = None
        self._raise_if_not_ready(response, body)
        return response, body

    def _model_path(self):
        version = "" if self.version is None else f"/versions/{int(self.version)}"
        return f"/models/{quote(self.model, safe='')}{version}"

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
        source = f"{self.url}/v2{self._model_path()}/infer"
        response, body = self._call(
            "POST",
            f"{self._model_path()}/infer",
            data=header + tensor,
            headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        )
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        with parsing(source):
            return self._results(body, len(batch))

    def _results(self, body, images):
        """One result per image from the classification extension's ``[images, k]`` strings and the confidence outputs."""
        if body is None:
            raise Malformed("not JSON")
        outputs = field(body, "outputs", list)
        named = [o for o in outputs if isinstance(o, dict) and o.get("name") == contract.OUTPUT_PROBABILITIES]
        if len(named) != 1:
            raise Malformed(f"{len(named)} outputs named {contract.OUTPUT_PROBABILITIES!r}, not one")
        (output,) = named
        shape = output.get("shape")
        if not (isinstance(shape, list) and len(shape) == 2 and all(type(d) is int for d in shape)):
            raise Malformed(f"the classification's shape is {kind(shape) if not isinstance(shape, list) else shape[:4]}, not [images, k]")
        rows, k = shape
        if rows != images:
            raise Malformed(f"{rows} rows for {images} images")
        if k < 1:
            raise Malformed(f"a classification of shape [{rows}, {k}] names no class")
        data = field(output, "data", list, f"outputs[{contract.OUTPUT_PROBABILITIES!r}]")
        if len(data) != rows * k:
            raise Malformed(f"{len(data)} classifications for shape [{rows}, {k}]")
        cells = [parse_classification(cell, f"classification {i}") for i, cell in enumerate(data)]
        extra = {}
        for o in outputs:
            if isinstance(o, dict) and o.get("name") in self.CONFIDENCE:
                values = field(o, "data", list, f"outputs[{o['name']!r}]")
                if len(values) != rows:
                    raise Malformed(f"{len(values)} values of {o['name']!r} for {rows} images")
                extra[o["name"]] = values
        return image_results(cells, rows, k, extra)

    #: The outputs that say how foreign an image looks, asked for when the model has them.
    CONFIDENCE = (contract.OUTPUT_OOD_SCORE, contract.OUTPUT_IN_DISTRIBUTION)

    def _confidence_outputs(self):
        """Which of :data:`CONFIDENCE` the model has, from its metadata (asked once)."""
        if self._confidence is None:
            response, body = self._call("GET", self._model_path())
            if response.status_code != 200:
                raise RequestFailed(reason(body, response), response.status_code)
            with parsing(f"{self.url}/v2{self._model_path()}"):
                outputs = body.get("outputs", []) if isinstance(body, dict) else field(body, "outputs", list)
                if not isinstance(outputs, list):
                    raise Malformed(f"outputs is {kind(outputs)}, not a list")
                names = {o.get("name") for o in outputs if isinstance(o, dict)}
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
        if response.status_code != 200:
            raise RequestFailed(reason(body, response), response.status_code)
        with parsing(f"{self.url}/v2{self._model_path()}"):
            if not isinstance(body, dict):
                raise Malformed("not JSON" if body is None else f"the answer is {kind(body)}, not an object")
            versions = body.get("versions") or []
            if not isinstance(versions, list):
                raise Malformed(f"versions is {kind(versions)}, not a list")
            versions = [str(v) for v in versions]
            if all(v.isascii() and v.isdigit() for v in versions):
                versions = sorted(int(v) for v in versions)
            else:
                versions = sorted(versions)

            def tensors(part):
                entries = body.get(part) or []
                if not isinstance(entries, list):
                    raise Malformed(f"{part} is {kind(entries)}, not a list")
                for i, t in enumerate(entries):
                    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                        raise Malformed(f"{part}[{i}] is not an object with a name")
                return {t["name"]: {"datatype": t.get("datatype"), "shape": t.get("shape")} for t in entries}

            return {
                "name": text_or_none(body.get("name"), "name"),
                "version": versions[-1] if versions else None,
                "versions": versions,
                "class_names": None,
                "signatures": {"infer": {"inputs": tensors("inputs"), "outputs": tensors("outputs")}},
                "backend": f"v2 {self.url} ({body.get('platform')})",
            }


def image_results(cells, rows, k, extra):
    """One result per image: its ``k`` ranked classification cells and its ``extra`` confidence outputs (by name)."""
    results = []
    for row in range(rows):
        ranked = cells[row * k : (row + 1) * k]
        best = ranked[0]
        score, inside = (extra.get(name, [None] * rows)[row] for name in V2Transport.CONFIDENCE)
        results.append(checked({"label": best["label"], "class_id": best["class_id"], "probability": best["probability"],
                                "top_k": ranked, "ood_score": score, "in_distribution": inside}, f"image {row}"))
    return results


def parse_classification(cell, path):
    """One classification-extension string ``"<value>:<index>[:<label>]"`` as ``{label, class_id, probability}``."""
    if not isinstance(cell, str) or cell.count(":") < 1:
        raise Malformed(f"{path} is {kind(cell)}, not \"<probability>:<class id>[:<label>]\"")
    value, index, *label = cell.split(":", 2)
    try:
        probability, class_id = float(value), int(index)
    except ValueError:
        raise Malformed(f"{path} is {kind(cell)}, not \"<probability>:<class id>[:<label>]\"") from None
    return {"label": label[0] if label else UNKNOWN_LABEL, "class_id": class_id,
            "probability": number(probability, f"{path}'s probability")}
