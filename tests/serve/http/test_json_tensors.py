"""serve/http/json_tensors.py: the fast read of a JSON tensor gives what orjson and NumPy give, or defers to them."""

import json
import random

import numpy as np
import orjson
import pytest

from serve.http import json_tensors


def same(fast, general):
    """``fast`` (the fast path's result) equals ``general`` (orjson's), with an ndarray standing for its nested lists."""
    if isinstance(fast, np.ndarray):
        expected = np.asarray(general)
        return fast.dtype.kind == "i" and fast.shape == expected.shape and bool((fast == expected).all())
    if isinstance(fast, dict):
        return isinstance(general, dict) and list(fast) == list(general) and all(same(fast[k], general[k]) for k in fast)
    if isinstance(fast, list):
        return isinstance(general, list) and len(fast) == len(general) and all(map(same, fast, general))
    return type(fast) is type(general) and fast == general


def outcome(fn, body):
    try:
        return "value", fn()
    except orjson.JSONDecodeError as e:
        return "error", str(e)


def check(body, key="instances"):
    kind, fast = outcome(lambda: json_tensors.loads(body, key), body)
    general_kind, general = outcome(lambda: orjson.loads(body), body)
    assert kind == general_kind, (body[:200], fast, general)
    if kind == "error":
        assert fast == general  # the general path's own message
    else:
        assert same(fast, general), body[:200]
    return fast


def test_a_batch_of_images_is_read_as_one_integer_array():
    pixels = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3))
    body = json.dumps({"signature_name": "serving_default", "instances": pixels.tolist()}).encode()
    read = check(body)
    assert isinstance(read["instances"], np.ndarray) and read["instances"].shape == (64, 32, 32, 3)
    assert read["signature_name"] == "serving_default"


@pytest.mark.parametrize("text", [
    "[[1, 2], [3]]",  # ragged
    "[[1, 2], 3]",  # a number where a row should be
    "[[[1], [2]], [3, 4]]",  # ragged depth with the same count of numbers
    "[1, 2.5]", "[1, -2]", "[1e3]", "[01, 2]", "[1, 2,]", "[,1]", "[1 2]", "[]", "[[]]", "[[], []]",
    "[1234567890123]",  # longer than the fast path reads
    "[true, 1]", "[null]", '["1"]', '[{"b64": "AA=="}]', "[[1, 2], [3, 4]", "[[1, 2]] ]", "[1, [2]]",
])
def test_anything_but_a_rectangular_array_of_plain_integers_is_left_to_orjson(text):
    body = ('{"instances": ' + text + ', "signature_name": "x"}').encode()
    read = check(body)
    if isinstance(read, dict) and isinstance(read.get("instances"), np.ndarray):
        pytest.fail(f"{text} took the fast path")


@pytest.mark.parametrize("body", [
    b'{"instances": [[1, 2]], "instances": [[3, 4]]}',  # a second copy of the key: the last one counts
    b'{"a": {"instances": [1, 2]}, "instances": [3]}',  # the first "instances" is not the top-level one
    b'{"note": "instances", "instances": [1]}',  # the name inside a string
    b'{"note": "\\"instances\\": [9]", "instances": [1]}',  # a key's text inside a string
    b'{"instances": [1, 2], "x": "\\u0000tensor\\u0000"}',  # the cut's own text in the body
    b'{"instances":\n [ [ 1 ,2 ] ,\r\n[3,\t4] ] }',  # white space anywhere JSON allows it
    b'{"instances": [[1, 2], [3, 4]]',  # not JSON
    b'{"instances": [[1, 2], [3, 4]]} x',  # not JSON after the value
    b'[{"instances": [1, 2]}]',  # not an object at the top
    b'{"inputs": [{"name": "pixels", "data": [1, 2, 3, 4], "shape": [2, 2]}]}',
])
def test_odd_bodies_read_as_orjson_reads_them(body):
    check(body)
    check(body, key="data")


def test_v2_data_is_read_in_place():
    data = list(range(256)) * 12
    body = json.dumps({"id": "7", "inputs": [{"name": "pixels", "shape": [1, 32, 32, 3], "datatype": "UINT8", "data": data}]})
    read = check(body.encode(), key="data")
    assert isinstance(read["inputs"][0]["data"], np.ndarray) and read["inputs"][0]["data"].shape == (3072,)


def test_random_bodies_agree_with_orjson():
    """Random arrays (rectangular or not, with noise in their text) read as orjson reads them."""
    rng = random.Random(0)
    alphabet = "0123456789[], \n-.e"
    for _ in range(3000):
        shape = [rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
        values = np.asarray([rng.randint(0, 300) for _ in range(int(np.prod(shape)))]).reshape(shape).tolist()
        text = json.dumps(values, separators=rng.choice([(",", ":"), (", ", ": ")]))
        for _ in range(rng.randint(0, 2)):  # now and then one character changed, added or removed
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice([rng.choice(alphabet), ""]) + text[i + rng.randint(0, 1):]
        check(('{"instances": ' + text + "}").encode())
