"""bench/request_cost.py: every route's request is answered 200 by the app it counts (no valgrind needed here)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("request_cost", os.path.join(ROOT, "bench", "request_cost.py"))
request_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(request_cost)


@pytest.mark.parametrize("route", request_cost.ROUTES)
def test_each_route_is_answered(route):
    send = request_cost.sender(route)
    for _ in range(3):  # the second and third find the metric children and caches the first made
        send()  # raises unless the answer is 200


def test_an_unknown_route_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        request_cost.main(["--routes", "nope"])
    assert "unknown route 'nope'" in capsys.readouterr().err
