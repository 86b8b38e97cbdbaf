"""bench.training.step_time: the trainer's compiled step, timed in a fresh process per variant."""

import json

import pytest

from bench.training import step_time


def test_each_variant_is_timed_in_its_own_process_with_its_settings(tmp_path):
    out = tmp_path / "training-step-seed_cnn.json"
    variants = ["float32", "float32 TF_NUM_INTEROP_THREADS=1"]
    step_time.main(["--model", "seed_cnn", "--batch", "8", "--repeats", "2", "--rounds", "1", "--json", str(out),
                    *[arg for v in variants for arg in ("--variant", v)]])
    rec = json.loads(out.read_text())
    assert rec["model"] == "seed_cnn" and rec["batch"] == 8
    assert list(rec["median_step_s"]) == variants
    (round_,) = rec["rounds"]
    for variant in variants:
        run = round_[variant]
        assert len(run["times_s"]) == 2 and all(t > 0 for t in run["times_s"])
        assert min(run["times_s"]) <= run["median_s"] <= max(run["times_s"])
        assert run["first_step_s"] > 0  # the compiling step, timed apart
    rows = {row[0]: row for row in rec["table"]["rows"]}
    assert list(rows) == [f"`{v}`" for v in variants]
    assert rows["`float32`"][4] == 1.0  # the first variant is what the others are against
    for variant in variants:
        assert rows[f"`{variant}`"][1] == round_[variant]["median_s"]  # one round: its median is the figure


def test_a_variant_that_fails_ends_the_run_in_one_line():
    with pytest.raises(SystemExit) as exit:
        step_time.main(["--model", "seed_cnn", "--batch", "8", "--repeats", "1", "--rounds", "1",
                        "--variant", "no_such_policy"])
    message = str(exit.value.code)
    assert message.startswith("step_time: the variant 'no_such_policy' failed: ") and "\n" not in message
