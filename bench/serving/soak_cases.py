"""bench/soak.py's request mix: good CIFAR test JPEGs and the bad inputs a soak sends beside them."""

import base64
import struct
import zipfile
import zlib

PREDICT = "/api/v1/predict"

def read_jpegs(zip_path, count):
    """``count`` CIFAR test JPEGs (bytes), spread over the classes."""
    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("test/") and n.lower().endswith((".jpg", ".jpeg")))
        if not names:
            raise SystemExit(f"error: no test/<class>/*.jpg images in {zip_path}")
        step = max(1, len(names) // count)
        return [archive.read(n) for n in names[::step][:count]]


def _png_chunk(kind, payload):
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bomb():
    """A 1x1 PNG whose header declares 100,000 x 100,000 pixels."""
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0\0\0\0")
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")


def tiff():
    """A tiny valid TIFF (a format the server refuses with 415)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, format="TIFF")
    return buffer.getvalue()


def pixels(jpeg):
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).tolist()


# -- the mix ----------------------------------------------------------------------------------
class Case:
    """One kind of request: how to send it, what it must get, how many good images it carries."""

    def __init__(self, name, weight, send, status, good=0, check=None):
        self.name, self.weight, self.send, self.status, self.good, self.check = name, weight, send, status, good, check


def make_cases(jpegs, upload_limit_mb, max_images=256):
    rows = {j: pixels(j) for j in jpegs[:8]}
    bomb, refused = png_bomb(), tiff()
    deep = b"[" * 100_000 + b"]" * 100_000
    oversize = b"\0" * int((upload_limit_mb + 1) * 1024 * 1024)

    def files(*items):
        return {"files": [("file", item) for item in items]}

    def labelled(body, good):
        slots = body["predictions"]
        return sum("label" in s for s in slots) == good and len(slots) >= good

    return [
        Case("1 good JPEG", 30, lambda r: ("post", PREDICT, files((f"{r.randrange(10**6)}.jpg", r.choice(jpegs)))), 200, 1,
             lambda b: labelled(b, 1)),
        Case("8 good JPEGs", 6, lambda r: ("post", PREDICT, files(*[(f"{i}.jpg", j) for i, j in enumerate(r.sample(jpegs, 8))])),
             200, 8, lambda b: labelled(b, 8)),
        Case("2 good, JSON b64", 6, lambda r: ("post", PREDICT, {"json": {"instances": [
            {"b64": base64.b64encode(j).decode()} for j in r.sample(jpegs, 2)]}}), 200, 2, lambda b: labelled(b, 2)),
        Case("1 good, TF Serving rows", 4, lambda r: ("post", "/v1/models/cifar10:predict", {"json": {
            "instances": [rows[r.choice(list(rows))]]}}), 200, 1, lambda b: len(b["predictions"]) == 1),
        Case("1 good, web form", 4, lambda r: ("post", "/", files(("form.jpg", r.choice(jpegs)))), 200, 1, None),
        Case("2 good + text", 6, lambda r: ("post", PREDICT, files(("a.jpg", r.choice(jpegs)), ("notes.txt", b"not an image"),
                                                                    ("b.jpg", r.choice(jpegs)))), 200, 2, lambda b: labelled(b, 2)),
        Case("good, 5,000-char name", 2, lambda r: ("post", PREDICT, files(("n" * 4996 + ".jpg", r.choice(jpegs)))), 200, 1,
             lambda b: labelled(b, 1)),
        Case("text as image", 6, lambda r: ("post", PREDICT, files(("x.jpg", b"hello " * 50))), 400),
        Case("truncated JPEG", 6, lambda r: ("post", PREDICT, files(("t.jpg", r.choice(jpegs)[:300]))), 400),
        Case("TIFF", 3, lambda r: ("post", PREDICT, files(("x.tif", refused))), 415),
        Case("PNG bomb", 4, lambda r: ("post", PREDICT, files(("bomb.png", bomb))), 413),
        Case("bad base64", 3, lambda r: ("post", PREDICT, {"json": {"instances": [{"b64": "%%%"}]}}), 400),
        Case("JSON 100,000 deep", 3, lambda r: ("post", r.choice([PREDICT, "/v1/models/cifar10:predict"]), {
            "data": deep, "headers": {"Content-Type": "application/json"}}), 400),
        Case("malformed multipart", 3, lambda r: ("post", PREDICT, {"data": b"--b\r\nnonsense", "headers": {
            "Content-Type": "multipart/form-data; boundary=b"}}), 400),
        Case("over the upload limit", 0.3, lambda r: ("post", PREDICT, files(("big.jpg", oversize))), 413),
        Case("1 good, v2 image_bytes", 4, lambda r: ("post", "/v2/models/cifar10/infer", {"json": {"inputs": [{
            "name": "image_bytes", "datatype": "BYTES", "shape": [1], "parameters": {"content_type": "base64"},
            "data": [base64.b64encode(r.choice(jpegs)).decode()]}]}}), 200, 1,
             lambda b: len(b["outputs"][0]["data"]) >= 1),
        Case("PNG bomb, TF Serving predict_images", 2, lambda r: ("post", "/v1/models/cifar10:predict", {"json": {
            "signature_name": "predict_images", "instances": [{"b64": base64.b64encode(bomb).decode()}]}}), 413),
        Case("more images than the cap", 1, lambda r: ("post", "/v2/models/cifar10/infer", {"json": {"inputs": [{
            "name": "images", "datatype": "UINT8", "shape": [max_images + 1, 32, 32, 3], "data": [0]}]}}), 413),
    ]


# -- the server ---------------------------------------------------------------------------------
