"""bench/serving/request_cost.py: every route's request is answered 200 by the app it counts (no valgrind needed here)."""

import pytest

from bench.serving import request_cost


@pytest.mark.parametrize("route", request_cost.ROUTES)
def test_each_route_is_answered(route):
    send = request_cost.sender(route)
    for _ in range(3):  # the second and third find the metric children and caches the first made
        send()  # raises unless the answer is 200


def test_an_unknown_route_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        request_cost.main(["--routes", "nope"])
    assert "unknown route 'nope'" in capsys.readouterr().err
