"""bench.training.throughput: a model trained as the trainer trains it, timed three ways, in a record the docs render."""

import json

import pytest

from bench.training import throughput
import synthetic


def test_the_step_is_timed_three_ways_and_the_pipeline_alone(tmp_path):
    data = tmp_path / "data.zip"
    synthetic.write_zip(data, synthetic.make_splits())
    out = tmp_path / "training-throughput-seed_cnn.json"
    throughput.main(["--data", str(data), "--model", "seed_cnn", "--steps", "2", "--warmup", "1", "--rounds", "2",
                     "--json", str(out)])
    rec = json.loads(out.read_text())
    rows = {row[0]: row for row in rec["table"]["rows"]}
    assert list(rows) == ["the recipe's callbacks, the pipeline", "no callbacks, the pipeline",
                          "no callbacks, one batch in memory", "the pipeline alone, no model"]
    for way, times in rec["rounds_s"].items():
        assert len(times) == 2 and all(t > 0 for t in times)
        assert rows[way][2] <= rows[way][1] <= rows[way][3]  # the median between the lowest and highest round
    assert rows["no callbacks, one batch in memory"][4] == 1.0  # the floor the others are against
    (target,) = rec["targets"]
    assert target["measured"] == pytest.approx(rows["the recipe's callbacks, the pipeline"][4] - 1)
    assert target["at_most"] == throughput.OVERHEAD
    assert rec["model"] == "seed_cnn" and rec["batch"] == 128


def test_no_warmup_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        throughput.main(["--warmup", "0"])
    assert exit.value.code == 2 and "at least 1" in capsys.readouterr().err
