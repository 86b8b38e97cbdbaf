"""Hostile input: what a broken or malicious client sends. Never a 5xx, and the server goes on.

In-process (the ``client`` fixture over the fake backend, 1 MiB upload limit) for bodies: deep and huge JSON on every
JSON route the app has (routes added later included), wrong types, mismatched content types,
odd file names and part headers, decompression bombs, truncated and corrupted files of every
accepted format. Against a real gunicorn over the real model (one worker of a few threads, its logs in files; ``end_to_end``) for
what only a socket shows: oversized request heads, slow clients, clients that vanish mid-body,
chunked bodies. At the end that server's access log holds no 5xx, its error log no error, and
its worker is the one it started with.
"""

import base64
import io
import json
import os
import re
import shlex
import socket
import struct
import threading
import time
import zlib

import numpy as np
import pytest
import requests
from PIL import Image

import raw_http
import synthetic
from fake_backend import FakeBackend, make_app
from live_server import access_messages, start_server, stop_server

FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
#: Values for the URL arguments of the routes found in the app.
#: What each route argument is filled with: the app below serves version 1 under the label "stable" too,
#: so the label routes get as far as the body.
ROUTE_VALUES = {"name": "cifar10", "version": 1, "label": "stable"}


@pytest.fixture()
def app(api_key):
    """serve's app over the fake backend (1 MiB upload limit), its one version also labelled ``stable``."""
    return make_app(FakeBackend(labels={"stable": 1}), api_key)


@pytest.fixture(scope="module")
def image():
    """One 32x32 RGB test image."""
    return synthetic.make_images(1, seed=5)[0][0]


def encode(array, fmt, size=None):
    picture = Image.fromarray(array)
    if size is not None:
        picture = picture.resize(size)
    if fmt == "GIF":
        picture = picture.convert("P")
    return synthetic.encode(picture, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))


def part(headers, payload=b""):
    """One raw multipart part (boundary ``B``) with the given header lines."""
    return b"--B\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + payload + b"\r\n"


def file_part(filename, payload, extra=()):
    disposition = b'Content-Disposition: form-data; name="file"; filename="' + filename + b'"'
    return part([disposition, b"Content-Type: application/octet-stream", *extra], payload)


def raw_multipart(*parts):
    return {"data": b"".join(parts) + b"--B--\r\n", "content_type": "multipart/form-data; boundary=B"}


def assert_json_error(response, status):
    assert response.status_code == status, (response.status_code, response.data[:300])
    assert response.is_json and response.get_json()["error"], response.data[:300]


# -- deep and huge JSON, on every JSON route ----------------------------------------------


def json_routes(app):
    """``{rule: url}`` for every POST route under the app's JSON prefixes, as the app has them now."""
    from serve import JSON_PREFIXES

    routes = {}
    for rule in app.url_map.iter_rules():
        if "POST" in rule.methods and rule.rule.startswith(JSON_PREFIXES):
            _, path = rule.build({arg: ROUTE_VALUES.get(arg, "x") for arg in rule.arguments}, append_unknown=False)
            routes[rule.rule] = path
    assert {"/api/v1/predict", "/v1/models/<model:name>:predict"} <= set(routes), routes
    return routes


def _nest(depth, leaf=b"1"):
    return b"[" * depth + leaf + b"]" * depth


DEEP_BODIES = {
    "list": lambda d: _nest(d),
    "object": lambda d: b'{"a":' * d + b"1" + b"}" * d,
    "instances": lambda d: b'{"instances":' + _nest(d) + b"}",
    "inputs": lambda d: b'{"inputs":' + _nest(d) + b"}",
    "b64-instances": lambda d: b'{"signature_name":"predict_images","instances":' + _nest(d, b'{"b64":"AA=="}') + b"}",
    "v2-bytes": lambda d: b'{"inputs":[{"name":"image_bytes","datatype":"BYTES","shape":[1],"data":'
    + _nest(d, b'"AA=="') + b"}]}",
}


@pytest.mark.parametrize("shape", sorted(DEEP_BODIES))
@pytest.mark.parametrize("depth", [100_000, 900, 100])
def test_deep_json_is_400_on_every_json_route(app, client, shape, depth):
    """100,000 levels break the decoder itself; 900 pass it but not Python's recursion; 100 pass both."""
    body = DEEP_BODIES[shape](depth)
    for rule, url in json_routes(app).items():
        response = client.post(url, data=body, content_type="application/json")
        assert response.status_code == 400, (rule, response.status_code, response.data[:200])
        assert response.get_json()["error"], rule


def test_json_over_the_upload_limit_is_413_on_every_json_route(app, client):
    body = b"[" + b"0," * (600 * 1024) + b"0]"  # 1.2 MB: over the fixture's 1 MiB
    for rule, url in json_routes(app).items():
        response = client.post(url, data=body, content_type="application/json")
        assert response.status_code == 413, (rule, response.status_code)
        assert "limit" in response.get_json()["error"], rule


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/v1/predict", b"{" + b",".join(b'"k%d":1' % i for i in range(60_000)) + b"}"),
        ("/api/v1/predict", b'{"instances":[{"b64":"' + b"QUFB" * 200_000 + b'"}]}'),
        ("/api/v1/predict", b'{"instances":[' + b"9" * 5000 + b"]}"),
        ("/v1/models/cifar10:predict", b'{"instances":[[[[' + b"9" * 5000 + b"]]]]}"),
        ("/v1/models/cifar10:predict", b'{"instances":[[[[1e999,-1e999,NaN]]]]}'),
    ],
    ids=["60k-keys", "800k-b64", "5000-digits", "5000-digit-pixel", "inf-nan"],
)
def test_huge_json_is_a_clear_400(client, path, body):
    assert len(body) < 1024 * 1024
    assert_json_error(client.post(path, data=body, content_type="application/json"), 400)


def _v2_bytes(count, element='"AA=="'):
    return (b'{"inputs":[{"name":"image_bytes","datatype":"BYTES","shape":[%d],"parameters":{"content_type":"base64"},"data":['
            % count + b",".join([element.encode()] * count) + b"]}]}")


MANY_IMAGES = {  # within the 1 MiB body limit, each more images than SERVE_MAX_IMAGES (256)
    "api-20k-empty-instances": ("/api/v1/predict", b'{"instances":[' + b",".join([b'{"b64":""}'] * 20_000) + b"]}"),
    "v1-200k-numbers": ("/v1/models/cifar10:predict", b'{"instances":[' + b",".join([b"0"] * 200_000) + b"]}"),
    "v1-257-b64": ("/v1/models/cifar10:predict",
                   b'{"signature_name":"predict_images","instances":[' + b",".join([b'{"b64":"AA=="}'] * 257) + b"]}"),
    "v1-columnar-300": ("/v1/models/cifar10:predict",
                        b'{"signature_name":"predict_images","inputs":{"image_bytes":[' + b",".join([b'{"b64":"AA=="}'] * 300) + b"]}}"),
    "v2-257-bytes": ("/v2/models/cifar10/infer", _v2_bytes(257)),
    "v2-shape-only": ("/v2/models/cifar10/infer",
                      b'{"inputs":[{"name":"images","datatype":"UINT8","shape":[100000,32,32,3],"data":[0]}]}'),
}


@pytest.mark.parametrize("path, body", MANY_IMAGES.values(), ids=MANY_IMAGES)
def test_more_images_than_the_cap_is_a_413_naming_it(client, path, body):
    assert len(body) < 1024 * 1024
    response = client.post(path, data=body, content_type="application/json")
    assert_json_error(response, 413)
    assert "at most 256 per request" in response.get_json()["error"]


def test_more_files_than_the_cap_is_a_413_on_the_api_and_the_form(client, image):
    files = [(f"{i}.png", encode(image, "PNG")) for i in range(257)]
    response = client.post("/api/v1/predict", **synthetic.multipart(*files))
    assert_json_error(response, 413)
    assert "at most 256 per request" in response.get_json()["error"]
    page = client.post("/", **synthetic.multipart(*files))
    assert page.status_code == 413 and "at most 256 per request" in page.get_data(as_text=True)
    assert client.post("/api/v1/predict", **synthetic.multipart(*files[:256])).status_code == 200  # the cap itself is fine


# -- wrong types and mismatched content types ---------------------------------------------

WRONG_TYPES = [
    ("/api/v1/predict", []),
    ("/api/v1/predict", "instances"),
    ("/api/v1/predict", 5),
    ("/api/v1/predict", True),
    ("/api/v1/predict", {"instances": "x"}),
    ("/api/v1/predict", {"instances": {"b64": "AA=="}}),
    ("/api/v1/predict", {"instances": [None, 5, "x", []]}),
    ("/api/v1/predict", {"instances": [{"b64": 5}]}),
    ("/api/v1/predict", {"instances": [{"b64": ["AA=="]}]}),
    ("/api/v1/predict", {"instances": [{"b64": {"b64": "AA=="}}]}),
    ("/api/v1/predict", {"instances": [{"b64": None}]}),
    ("/v1/models/cifar10:predict", []),
    ("/v1/models/cifar10:predict", "x"),
    ("/v1/models/cifar10:predict", {"signature_name": 5, "instances": [1]}),
    ("/v1/models/cifar10:predict", {"signature_name": ["serving_default"], "instances": [1]}),
    ("/v1/models/cifar10:predict", {"instances": None}),
    ("/v1/models/cifar10:predict", {"instances": {"images": 1}}),
    ("/v1/models/cifar10:predict", {"inputs": None}),
    ("/v1/models/cifar10:predict", {"inputs": {"images": {"b64": "AA=="}}}),
    ("/v1/models/cifar10:predict", {"instances": [[[["1", 2, 3]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[None] * 3] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[True] * 3] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [{"images": [[[1, 2, 3]] * 32] * 32, "extra": 1}]}),
    ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "instances": [{"b64": 5}]}),
    ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "instances": [[{"b64": "AA=="}]]}),
    ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "instances": [None]}),
    ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "inputs": {"image_bytes": 5}}),
    ("/v1/models/cifar10:predict", {"signature_name": "__saved_model_init_op", "instances": [1]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[1.5, 2, 3]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[256, 0, 0]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[-1, 0, 0]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[1, 2]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[1, 2, 3]] * 31] * 32]}),
    ("/v1/models/cifar10:predict", {"inputs": [[[1, 2, 3]] * 32] * 32}),
    ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "inputs": {"image_bytes": [[{"b64": "AA=="}]]}}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 32, 32, 3], "data": [0.5] * 3072}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 32, 32], "data": [0] * 1024}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 32, 32, 3], "data": [0] * 3071}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 32, 32, 3], "data": [300] * 3072}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, 32, 32, 3], "data": [0] * 3072}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1, 1], "data": ["AA=="]}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "image_bytes", "datatype": "UINT8", "shape": [1], "data": [0]}]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "tensor", "datatype": "UINT8", "shape": [1], "data": [0]}]}),
    ("/v2/models/cifar10/infer", {"inputs": {"name": "images"}}),
]


@pytest.mark.parametrize("path, body", WRONG_TYPES, ids=[f"{p.split('/')[-1]}-{json.dumps(b)[:40]}" for p, b in WRONG_TYPES])
def test_wrong_json_types_are_400(client, path, body):
    assert_json_error(client.post(path, json=body), 400)


@pytest.mark.parametrize("top_k", ["1.5", "x", "-1", "0", "9" * 5000, "1e3", "\u0663\u0660", "nan"])
def test_wrong_top_k_is_400(client, image, top_k):
    response = client.post(f"/api/v1/predict?top_k={top_k}", **synthetic.multipart(("a.png", encode(image, "PNG"))))
    if top_k == "\u0663\u0660":  # int() reads other scripts' digits: 30, a fine top_k
        assert response.status_code == 200 and len(response.get_json()["predictions"][0]["top_k"]) == 3
    else:
        assert_json_error(response, 400)
        assert "top_k" in response.get_json()["error"]


def test_top_k_field_that_is_not_text(client, image):
    not_utf8 = part([b'Content-Disposition: form-data; name="top_k"'], b"\xff\xfe")
    body = raw_multipart(file_part(b"a.png", encode(image, "PNG")), not_utf8)
    assert_json_error(client.post("/api/v1/predict", **body), 400)
    assert client.post("/", **body).status_code == 400
    as_file = raw_multipart(file_part(b"a.png", encode(image, "PNG")), file_part(b"top_k", b"2"))
    response = client.post("/api/v1/predict", **as_file)  # a file named top_k is an upload, not the field
    assert response.status_code == 200
    assert [p.get("status") for p in response.get_json()["predictions"]] == [None, 400]


MISMATCHED = [
    ("/api/v1/predict", b'{"instances": []}', "multipart/form-data; boundary=B"),
    ("/api/v1/predict", b"--B\r\n", "application/json"),
    ("/api/v1/predict", b"\x89PNG\r\n\x1a\n", "application/json"),
    ("/api/v1/predict", b"\x89PNG\r\n\x1a\n", "image/png"),
    ("/api/v1/predict", b"file=abc", "application/x-www-form-urlencoded"),
    ("/api/v1/predict", b"xx", "multipart/form-data"),
    ("/api/v1/predict", b"xx", 'multipart/form-data; boundary=""'),
    ("/api/v1/predict", b"xx", "multipart/form-data; boundary=" + "b" * 5000),
    ("/api/v1/predict", b"", "application/json"),
    ("/api/v1/predict", b'{"instances": [{"b64": "AA=="}]}'.decode().encode("utf-32"), "application/json; charset=utf-8"),
    ("/v1/models/cifar10:predict", b"--B\r\n\r\n--B--\r\n", "multipart/form-data; boundary=B"),
    ("/v1/models/cifar10:predict", b"\x89PNG\r\n\x1a\n", "image/png"),
    ("/v1/models/cifar10:predict", b'{"instances": [1]', "application/json"),
    ("/v1/models/cifar10:predict", b"", "text/plain"),
]


@pytest.mark.parametrize("path, body, content_type", MISMATCHED, ids=[f"{i}-{c[:30]}" for i, (_, _, c) in enumerate(MISMATCHED)])
def test_mismatched_content_types_are_400(client, path, body, content_type):
    assert_json_error(client.post(path, data=body, content_type=content_type), 400)


@pytest.mark.parametrize("content_type", ["application/json", "image/png", "text/plain", "multipart/form-data; boundary=B"])
def test_the_form_refuses_what_is_not_a_form_upload(client, content_type):
    response = client.post("/", data=b'{"instances": []}', content_type=content_type)
    assert response.status_code == 400
    assert response.mimetype == "text/html" and b'role="alert"' in response.data


# -- file names and part headers ----------------------------------------------------------


def test_a_5000_character_file_name_is_classified_and_shortened(client, image):
    data = encode(image, "PNG")
    name = "x" * 4996 + ".png"
    short = client.post("/api/v1/predict", **synthetic.multipart(("a.png", data))).get_json()["predictions"][0]
    response = client.post("/api/v1/predict", **synthetic.multipart((name, data)))
    assert response.status_code == 200, response.get_json()
    (answer,) = response.get_json()["predictions"]
    assert answer["class_id"] == short["class_id"] and answer["probability"] == short["probability"]
    shown = answer["filename"]
    assert len(shown) <= 200 and shown.startswith("x" * 100) and shown.endswith(".png") and "\u2026" in shown
    page = client.post("/", **synthetic.multipart((name, data)))
    assert page.status_code == 200
    text = page.data.decode()
    assert shown in text and name not in text
    assert text.count('class="result"') == 1
    assert re.findall(r'<span class="name">([^<]*)</span>', text)[0] == short["label"]  # the best of the bars


def test_a_file_name_over_the_header_limit_is_a_400_that_says_so(client, image):
    body = synthetic.multipart(("x" * 100_000 + ".png", encode(image, "PNG")))
    response = client.post("/api/v1/predict", **body)
    assert_json_error(response, 400)
    assert "file name" in response.get_json()["error"]
    page = client.post("/", **body)
    assert page.status_code == 400 and b"file name" in page.data


@pytest.mark.parametrize(
    "filename",
    ["../../etc/passwd", "a\x01b\x7f.png", "<script>alert(1)</script>.png", "\u00e9\u00e8 \u2603 \U0001f600.png", " ", "a;b=c.png"],
    ids=["traversal", "control", "html", "unicode", "blank", "semicolon"],
)
def test_odd_file_names_are_repeated_not_used(client, image, filename):
    body = raw_multipart(file_part(filename.encode(), encode(image, "PNG")))
    response = client.post("/api/v1/predict", **body)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["predictions"][0]["filename"] == filename
    page = client.post("/", **body)
    assert page.status_code == 200
    assert b"<script>alert" not in page.data


@pytest.mark.parametrize(
    "parts",
    [
        [file_part(b"a\xff\xfe.png", b"x")],  # a name that is not UTF-8
        [file_part(b"a.png", b"x", extra=[b"X-Extra-%d: 1" % i for i in range(20)])],  # 22 header lines
        [part([b"Content-Type: image/png"], b"x")],  # no Content-Disposition
        [part([b"Content-Disposition: attachment; filename=a.png"], b"x")],  # not form-data
        [b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\rb.png\"\r\n\r\nx\r\n"],  # CR in a header
    ],
    ids=["not-utf8-name", "too-many-headers", "no-disposition", "not-form-data", "bare-cr"],
)
def test_malformed_part_headers_are_400(client, parts):
    body = raw_multipart(*parts)
    assert_json_error(client.post("/api/v1/predict", **body), 400)
    assert client.post("/", **body).status_code == 400


# -- images: bombs, truncated, corrupted --------------------------------------------------


def _png_chunk(kind, payload):
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def bomb(fmt, image):
    """A small file of ``fmt`` whose header declares billions of pixels (or, for PNG text, 64 MiB of text)."""
    if fmt == "PNG":
        data = encode(image, "PNG")
        header = bytearray(data[16:29])
        header[0:8] = struct.pack(">II", 100_000, 100_000)
        return data[:8] + _png_chunk(b"IHDR", bytes(header)) + data[33:]
    if fmt == "PNG-text":
        data = encode(image, "PNG")
        return data[:33] + _png_chunk(b"zTXt", b"Comment\0\0" + zlib.compress(b"\0" * (64 << 20), 9)) + data[33:]
    if fmt == "PNG-over-limit":  # 4097 x 4097: under Pillow's bomb limit, over the server's
        return synthetic.encode(Image.new("1", (4097, 4097)), "PNG")
    data = bytearray(encode(image, fmt))
    if fmt == "GIF":
        data[6:10] = struct.pack("<HH", 65535, 65535)
        at = data.index(b"\x2c", 13)  # the image descriptor after the palette
        data[at + 5 : at + 9] = struct.pack("<HH", 65535, 65535)
    elif fmt == "BMP":
        data[18:26] = struct.pack("<ii", 30_000, 30_000)
    elif fmt == "JPEG":
        at = data.index(b"\xff\xc0")
        data[at + 5 : at + 9] = struct.pack(">HH", 65_000, 65_000)
    elif fmt == "WEBP":  # a lossless VP8L header: 14-bit width-1 and height-1
        data = bytearray(synthetic.encode(Image.fromarray(image), "WEBP", lossless=True))
        assert data[12:16] == b"VP8L"
        bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
        data[21:25] = (bits | 16382 | (16382 << 14)).to_bytes(4, "little")
    return bytes(data)


@pytest.mark.parametrize("fmt", [*FORMATS, "PNG-over-limit"])
def test_decompression_bombs_are_413(client, image, fmt):
    response = client.post("/api/v1/predict", **synthetic.multipart(("bomb.img", bomb(fmt, image))))
    assert_json_error(response, 413)
    assert "bomb.img" in response.get_json()["error"] and "too many pixels" in response.get_json()["error"]


def _bomb_requests(data):
    """The same encoded bytes as each route takes them: ``{route: (path, JSON body)}``."""
    b64 = base64.b64encode(data).decode()
    return {
        "api-json": ("/api/v1/predict", {"instances": [{"b64": b64}]}),
        "v1-rows": ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "instances": [{"b64": b64}]}),
        "v1-columns": ("/v1/models/cifar10:predict", {"signature_name": "predict_images", "inputs": {"image_bytes": [{"b64": b64}]}}),
        "v2-bytes": ("/v2/models/cifar10/infer", {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1],
                                                            "parameters": {"content_type": "base64"}, "data": [b64]}]}),
    }


@pytest.mark.parametrize("route", ["api-json", "v1-rows", "v1-columns", "v2-bytes"])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "PNG-over-limit"])
def test_decompression_bombs_are_413_on_every_route(client, image, fmt, route):
    """The pixel cap holds wherever encoded bytes come in: the one decoder, before any model or TF Serving."""
    path, body = _bomb_requests(bomb(fmt, image))[route]
    response = client.post(path, json=body)
    assert_json_error(response, 413)
    assert "too many pixels" in response.get_json()["error"]


def test_a_compressed_text_bomb_is_400(client, image):
    response = client.post("/api/v1/predict", **synthetic.multipart(("text.png", bomb("PNG-text", image))))
    assert_json_error(response, 400)
    assert "text.png" in response.get_json()["error"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_files_of_every_format_are_400(client, image, fmt):
    data = encode(image, fmt, size=(48, 40))
    cuts = {"16-bytes": data[:16], "64-bytes": data[:64], "half": data[: len(data) // 2]}
    response = client.post("/api/v1/predict", **synthetic.multipart(*[(f"{name}.img", cut) for name, cut in cuts.items()]))
    assert_json_error(response, 400)
    for name, answer in zip(cuts, response.get_json()["predictions"]):
        assert answer["status"] == 400 and f"{name}.img" in answer["error"]


def _flipped(data, seed):
    damaged = bytearray(data)
    for at in np.random.default_rng(seed).integers(len(data) // 4, len(data), size=8):
        damaged[at] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupted_files_are_classified_or_refused_per_file(client, image, fmt):
    data = encode(image, fmt, size=(48, 40))
    files = [("good.img", data)] + [(f"bad{seed}.img", _flipped(data, seed)) for seed in range(6)]
    response = client.post("/api/v1/predict", **synthetic.multipart(*files))
    assert response.status_code == 200  # the intact file is always answered
    answers = response.get_json()["predictions"]
    assert "label" in answers[0]
    for (name, _), answer in zip(files[1:], answers[1:]):
        assert "label" in answer or (answer["status"] == 400 and name in answer["error"]), answer


def test_damaged_files_in_a_batch_decode_leave_the_good_answers_alone(client):
    """From 16 images up the plain ones are decoded together by TensorFlow: damage must not spread."""
    images, _ = synthetic.make_images(6, seed=9)  # 18 images
    good = [(f"{i}.{fmt.lower()}", encode(im, fmt)) for i, (im, fmt) in enumerate(zip(images, ["PNG", "JPEG"] * 9))]
    alone = client.post("/api/v1/predict", **synthetic.multipart(*good)).get_json()["predictions"]
    png, jpeg = good[0][1], good[1][1]
    damaged = [("cut.png", png[: len(png) - 30]), ("cut.jpg", jpeg[: len(jpeg) // 2]), ("flip.png", _flipped(png, 1))]
    response = client.post("/api/v1/predict", **synthetic.multipart(*good, *damaged))
    assert response.status_code == 200
    answers = response.get_json()["predictions"]
    for before, after in zip(alone, answers[: len(good)]):
        assert (after["filename"], after["class_id"]) == (before["filename"], before["class_id"])
        assert after["probability"] == pytest.approx(before["probability"], abs=1e-5)
    assert [a.get("status") for a in answers[len(good) : len(good) + 2]] == [400, 400]


# -- a real gunicorn: request heads, slow and vanishing clients, chunked bodies -------------

LIVE_THREADS = 6


@pytest.fixture(scope="module")
def hostile_server(model_base, tmp_path_factory):
    """One gunicorn worker of ``LIVE_THREADS`` threads, 1 MiB upload limit, logs in files."""
    logs = tmp_path_factory.mktemp("hostile-logs")
    env = {
        "WEB_CONCURRENCY": "1",
        "GUNICORN_THREADS": str(LIVE_THREADS),
        "SERVE_MAX_UPLOAD_MB": "1",
        "GUNICORN_CMD_ARGS": f"--access-logfile {shlex.quote(str(logs / 'access.log'))} "
        f"--error-logfile {shlex.quote(str(logs / 'error.log'))}",
    }
    process, url = start_server(model_base, extra_env=env)
    server = {"url": url, "port": int(url.rsplit(":", 1)[1]), "logs": logs, "workers": _children(process.pid)}
    # Only what comes after start-up counts (its readiness polls saw 503s while the model loaded).
    server["process"], server["access_from"] = process, (logs / "access.log").stat().st_size
    yield server
    stop_server(process)


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return sorted(int(child) for child in f.read().split())


def exchange(port, data, timeout=60, half_close=False):
    """Send raw bytes; return the answer's status code, or None when the server closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        head = raw_http.receive_until(sock, lambda data: b"\r\n" in data)
    if b"\r\n" not in head:
        return None
    return int(head.split(b" ", 2)[1])


def whole_answer(port, data, timeout=60):
    """Send raw bytes; return ``(status, headers as a lower-cased dict, body)`` of an answer that closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = raw_http.receive_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split(" ", 2)[1]), headers, body


def _request(method, path, headers=(), body=b""):
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: test", *headers, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _chunked(body, size=1000):
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


@pytest.mark.end_to_end
def test_oversized_or_broken_request_heads_are_4xx(hostile_server):
    port = hostile_server["port"]
    assert exchange(port, _request("GET", "/healthz", [b"X-Big: " + b"a" * 100_000])) == 431
    assert exchange(port, _request("GET", "/healthz", [b"X-H%d: 1" % i for i in range(300)])) == 431
    assert exchange(port, _request("GET", "/healthz?" + "a" * 100_000)) == 414
    assert exchange(port, _request("GET", "/healthz", [b"Bad Name: 1"])) == 400
    assert exchange(port, _request("GET", "/healthz", [b"X-Nul: a\x00b"])) == 400
    assert exchange(port, _request("POST", "/api/v1/predict", [b"Content-Length: -5"])) == 400
    assert exchange(port, _request("POST", "/api/v1/predict", [b"Content-Length: 5", b"Transfer-Encoding: chunked"])) == 400
    assert exchange(port, _request("POST", "/api/v1/predict", [b"Content-Length: 99999999999999999999"])) == 413
    assert exchange(port, b"GET /healthz\r\n\r\n") == 400


@pytest.mark.end_to_end
def test_the_answers_gunicorn_gives_itself_are_json_errors(hostile_server):
    port = hostile_server["port"]
    cases = [
        (_request("GET", "/api/v1/model", [b"X-Big: " + b"a" * 100_000]), 431, "Request Header Fields Too Large"),
        (_request("GET", "/api/v1/model?" + "a" * 100_000), 414, "URI Too Long"),
        (_request("GET", "/api/v1/model", [b"Bad Name: 1"]), 400, "Bad Request"),
    ]
    for data, status, reason in cases:
        code, headers, body = whole_answer(port, data)
        assert code == status
        assert headers["content-type"] == "application/json"
        assert headers["x-content-type-options"] == "nosniff"
        assert int(headers["content-length"]) == len(body)
        error = json.loads(body)["error"]
        assert error.startswith(reason), error


@pytest.mark.end_to_end
def test_slow_clients_do_not_hold_up_others(hostile_server, image):
    """Clients dribbling their request a few bytes at a time, fewer than the threads, while others are served.

    The slow clients keep dribbling until every normal request has its answer, so if they
    held the server up, the normal requests could never finish (and would time out).
    """
    port, url = hostile_server["port"], hostile_server["url"]
    body, content_type = _encoded_upload(image)
    slow_request = _request("POST", "/api/v1/predict", [f"Content-Type: {content_type}".encode(), b"Content-Length: %d" % len(body)], body)
    served, statuses = threading.Event(), []
    underway = [threading.Event() for _ in range(LIVE_THREADS - 2)]  # one per slow client

    def dribble(underway):
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sent = 0
            while sent < len(slow_request) - 1:
                if sent >= 20:
                    underway.set()  # connected, and part-way through its request
                step = 1 if not served.is_set() else len(slow_request)
                sock.sendall(slow_request[sent : min(sent + step, len(slow_request) - 1)])
                sent = min(sent + step, len(slow_request) - 1)
                if not served.is_set():
                    time.sleep(0.05)
            sock.sendall(slow_request[-1:])
            statuses.append(int(sock.recv(4096).split(b" ", 2)[1]))

    slow = [threading.Thread(target=dribble, args=(event,)) for event in underway]
    for thread in slow:
        thread.start()
    try:
        for event in underway:
            assert event.wait(60), "a slow client never got its connection"
        for _ in range(5):
            response = requests.post(f"{url}/api/v1/predict", files={"file": ("a.png", encode(image, "PNG"))}, timeout=60)
            assert response.status_code == 200
        assert all(thread.is_alive() for thread in slow), "the slow clients were still sending"
    finally:
        served.set()
        for thread in slow:
            thread.join(120)
    assert statuses == [200] * len(slow)  # and they are served too, once they have sent it all


def _encoded_upload(image):
    from urllib3.filepost import encode_multipart_formdata

    return encode_multipart_formdata([("file", ("a.png", encode(image, "PNG")))])


@pytest.mark.end_to_end
def test_vanishing_and_chunked_clients(hostile_server, image):
    port, url = hostile_server["port"], hostile_server["url"]
    body, content_type = _encoded_upload(image)
    ctype = f"Content-Type: {content_type}".encode()
    # Gone mid-body: a promised megabyte, a few bytes sent, then the connection closed.
    for cut in (0, 10, len(body) // 2):
        promised = _request("POST", "/api/v1/predict", [ctype, b"Content-Length: 1000000"], body[:cut])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(promised)
    truncated_json = _request(
        "POST", "/v1/models/cifar10:predict", [b"Content-Type: application/json", b"Content-Length: 5000"], b'{"instances": [1'
    )
    assert exchange(port, truncated_json, half_close=True) == 400
    # Chunked: whole, over the limit, and with a chunk size that is not hexadecimal.
    chunked = [ctype, b"Transfer-Encoding: chunked"]
    assert exchange(port, _request("POST", "/api/v1/predict", chunked, _chunked(body))) == 200
    over = _chunked(body + b"\0" * (2 << 20), size=1 << 16)
    assert exchange(port, _request("POST", "/api/v1/predict", chunked, over)) == 413
    broken = _chunked(body)[:1006] + b"zz\r\n" + b"x" * 100
    assert exchange(port, _request("POST", "/api/v1/predict", chunked, broken), half_close=True) == 400
    assert requests.get(f"{url}/readyz", timeout=60).status_code == 200


@pytest.mark.end_to_end
def test_the_server_is_unharmed(hostile_server, image):
    """Runs last: a good request is answered, the worker never restarted, the logs show no 5xx and no error."""
    url = hostile_server["url"]
    response = requests.post(f"{url}/api/v1/predict", files={"file": ("a.png", encode(image, "PNG"))}, timeout=60)
    assert response.status_code == 200
    assert _children(hostile_server["process"].pid) == hostile_server["workers"]
    access = (hostile_server["logs"] / "access.log").read_text()[hostile_server["access_from"] :]
    access = "\n".join(access_messages(access))
    statuses = [int(s) for s in re.findall(r'HTTP/1\.[01]" (\d{3}) ', access)]
    assert statuses and 200 in statuses
    assert not [s for s in statuses if s >= 500], access[-3000:]
    errors = [
        line for line in (hostile_server["logs"] / "error.log").read_text().splitlines()
        if "[ERROR]" in line or "[CRITICAL]" in line or "Traceback" in line
    ]
    assert not errors, errors
    assert os.path.getsize(hostile_server["logs"] / "error.log") < 1 << 20
