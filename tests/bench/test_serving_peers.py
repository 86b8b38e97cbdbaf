"""bench/peers' reading of wrk and of every server's answer, and its table (no peer is installed here)."""

import json

import numpy as np
import pytest

from bench import harness
from bench.peers import load

# wrk 4's output for bench/wrk/post_body.lua against a server that answered every fourth request 500.
WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:8931/v1/models/cifar10:predict
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    69.20ms   44.50ms 148.03ms   64.71%
    Req/Sec    28.62     10.32    43.00     62.50%
  Latency Distribution
     50%   76.00ms
     75%   97.13ms
     90%  131.00ms
     99%  148.03ms
  32 requests in 1.10s, 4.20KB read
  Non-2xx or 3xx responses: 8
Requests/sec:     29.12
Transfer/sec:      3.83KB
WRK_JSON {"requests": 32, "duration_us": 1098742, "p50_us": 76004, "p99_us": 148028, "mean_us": 69204.3, \
"connect_errors": 0, "read_errors": 0, "write_errors": 0, "status_errors": 8, "timeouts": 0}
"""

CELL = {c.key: c for c in load.CELLS}


def test_wrk_output_gives_rate_percentiles_and_error_answers():
    row = harness.parse_wrk(WRK_OUTPUT)
    assert row["requests"] == 32 and row["requests_per_s"] == pytest.approx(29.12, abs=0.01)
    assert (row["p50_ms"], row["p99_ms"]) == (pytest.approx(76.004), pytest.approx(148.028))
    assert (row["non_2xx"], row["socket_errors"], row["timeouts"]) == (8, 0, 0)  # wrk's own "Non-2xx" line says 8
    assert "8 non-2xx" in load.format_cell(CELL["json-1-c32"], row)


def test_wrk_output_without_the_scripts_line_is_an_error():
    with pytest.raises(RuntimeError, match="no WRK_JSON line"):
        harness.parse_wrk(WRK_OUTPUT.split("WRK_JSON")[0])


REFERENCE = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], np.float32)


@pytest.mark.parametrize(
    "answer",
    [
        # this project's /v1/models/NAME:predict: one object per instance
        {"predictions": [{"class_ids": 1, "probabilities": [0.1, 0.7, 0.2]}, {"class_ids": 0, "probabilities": [0.6, 0.3, 0.1]}]},
        # KServe's v1 and LitServe: rows of probabilities
        {"predictions": [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]]},
        # BentoML: the ndarray itself
        [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]],
        # v2 (this project, KServe): flat data with a shape, among other outputs
        {"outputs": [{"name": "class_ids", "shape": [2], "data": [1, 0]},
                     {"name": "probabilities", "shape": [2, 3], "data": [0.1, 0.7, 0.2, 0.6, 0.3, 0.1]}]},
        # this project's /api/v1/predict: the top class only
        {"predictions": [{"label": "b", "class_id": 1, "probability": 0.7}, {"label": "a", "class_id": 0, "probability": 0.6}]},
    ],
)
def test_every_servers_answer_is_read_and_checked(answer):
    assert load.check_answer(json.loads(json.dumps(answer)), REFERENCE) is None


def test_a_wrong_class_a_drifted_probability_and_a_missing_row_are_reported():
    assert "image 1: class 1" in load.check_answer({"predictions": [[0.1, 0.7, 0.2], [0.3, 0.6, 0.1]]}, REFERENCE)
    assert "differ by 0.01" in load.check_answer({"predictions": [[0.1, 0.7, 0.2], [0.61, 0.29, 0.1]]}, REFERENCE)
    assert "1 answers for 2 images" in load.check_answer([[0.1, 0.7, 0.2]], REFERENCE)


def test_the_table_has_a_row_per_cell_a_server_answered_and_marks_what_went_wrong():
    ok = {"requests": 100, "requests_per_s": 10.0, "p50_ms": 1.5, "p99_ms": 4.0, "non_2xx": 0, "socket_errors": 0, "timeouts": 0}
    bad = dict(ok, timeouts=3, wrong="image 0: class 2, this project's model says 1")
    results = {
        "a": {"cells": {"json-1-c1": ok, "json-64-c2": bad}, "rss_mb": 120.0, "largest_process_mb": 70.0},
        "b": {"cells": {"json-1-c1": ok}},
    }
    lines = load.markdown(results, ["a", "b"]).splitlines()
    assert lines[0] == "| cell | a | b |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert set(rows) == {CELL["json-1-c1"].label, CELL["json-64-c2"].label, "resident memory, all processes after the run",
                         "resident memory, largest process (a worker)"}
    assert "| 70 MB | — |" in rows["resident memory, largest process (a worker)"]
    assert "1.50 / 4.00 ms" in rows[CELL["json-1-c1"].label]
    assert "640 img/s" in rows[CELL["json-64-c2"].label] and "3 timeouts" in rows[CELL["json-64-c2"].label]
    assert "wrong answer" in rows[CELL["json-64-c2"].label] and rows[CELL["json-64-c2"].label].endswith("| — |")


def test_rounds_combine_into_medians_with_every_error_and_wrong_answer_kept():
    def row(rate, errors=0, wrong=None):
        return {"requests": 10, "requests_per_s": rate, "p50_ms": 1000 / rate, "p99_ms": 2000 / rate,
                "non_2xx": errors, "socket_errors": 0, "timeouts": 0, "wrong": wrong}

    rounds = [{"a": {"cells": {"json-1-c32": row(100.0)}, "rss_mb": 90.0, "load_average": 1.0}},
              {"a": {"cells": {"json-1-c32": row(300.0, errors=2)}, "rss_mb": 110.0, "load_average": 3.0}},
              {"a": {"cells": {"json-1-c32": row(200.0, wrong="image 0")}, "load_average": 2.0, "failed": "RuntimeError: x"}}]
    a = load.combine(rounds)["a"]
    cell = a["cells"]["json-1-c32"]
    assert (cell["requests_per_s"], cell["p50_ms"]) == (200.0, 5.0)
    assert (cell["requests"], cell["non_2xx"], cell["wrong"]) == (30, 2, "image 0")
    assert (a["rss_mb"], a["load_average"], a["failed"]) == (110.0, [1.0, 3.0, 2.0], "RuntimeError: x")
    assert "1.0, 3.0, 2.0" in load.markdown({"a": a}, ["a"])


def test_the_record_holds_issue_56s_targets_against_the_best_peer_and_the_bare_model():
    from bench.peers import __main__ as peers

    def row(rate, p50):
        return {"requests": 100, "requests_per_s": rate, "p50_ms": p50, "p99_ms": 2 * p50, "non_2xx": 0, "socket_errors": 0,
                "timeouts": 0}

    results = {
        "this project": {"cells": {"json-1-c32": row(900, 30), "json-1-c1": row(500, 1.2), "json-64-c2": row(40, 50),
                                   "grpc-tfs-64-c2": row(50, 40)}},
        "kserve": {"cells": {"json-1-c32": row(600, 50), "json-1-c1": row(600, 1.5), "json-64-c2": row(10, 200)}},
        "bentoml": {"cells": {"json-1-c32": row(300, 90), "json-1-c1": row(100, 1.0)}},
        "hello-world floor": {"cells": {"json-1-c1": row(3000, 0.3)}},
    }
    limit = {"batch_1": {"p50_ms": 0.5, "images_per_s": 2000}, "batch_64": {"p50_ms": 16, "images_per_s": 4000}}
    targets = {t["target"].removeprefix("seed_cnn").lstrip(",: "): t for t in peers.record_targets(results, limit, "seed_cnn")}
    assert targets["1 image, c=32: ≥ 1.5x the best peer's requests/s"]["measured"] == 1.5  # 900 against KServe's 600
    assert targets["1 image, c=1: p50 ≤ 0.8x the best peer's"]["measured"] == 1.2  # against BentoML's 1.0 ms
    assert abs(targets["1 image, c=1: p50 ≤ the floor's + the bare model's call + 0.5 ms"]["measured"] - 0.4) < 1e-9
    assert targets["64 images a request over JSON: ≥ 2x the best peer"]["measured"] == 4.0
    assert targets["64 images over TF Serving gRPC: ≥ 0.8x the bare model's batch-64 images/s"]["measured"] == 0.8
    assert targets["cells with an error, a timeout or a wrong answer"]["measured"] == 0
    table = peers.record_table(results, list(results), list(results), limit)
    assert table["columns"][-1] == "bare model (the limit)"
    rows = {r[0]: r for r in table["rows"]}
    assert rows["JSON `instances`, 1 image, c=1: p50 (ms)"][-1] == "0.50"
    assert rows["JSON `instances`, 64 images, c=2: images/s"][1:3] == ["2,560", "640"] and rows["JSON `instances`, 64 images, c=2: images/s"][-1] == "4,000"
