"""bench.training.run_record: a finished training run's record, in bench.record's form, with the training's own
command, commit and day, and vmstat's shares over the trainer's wall time as the machine's load."""

import json

from bench import record
from bench.training import run_record

HEADER = ("procs -----------memory---------- ---swap-- -----io---- -system-- ------cpu----- -----timestamp-----\n"
          " r  b   swpd   free   buff  cache   si   so    bi    bo   in   cs us sy id wa st                 UTC\n")


def vmstat_line(r, stamp):
    return f" {r}  0      0 2201914  22880 2057588    0    0   164   466  136  374 90  5  5  0  0 {stamp}\n"


def test_a_runs_record_is_the_training_run_measured(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    manifest = {"model": {"name": "airbench_muon"}, "created": "2026-12-05T08:50:09+00:00",
                "training": {"seed": 2, "recipe": {"batch_size": 1000, "epochs": 10}, "precision": "mixed_bfloat16",
                             "train_images": 45000, "wall_time_s": 20.0, "budget": None},
                "metrics": {"test_accuracy": 0.93, "test_images": 1000}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    log = tmp_path / "vmstat.log"  # before, within and after the trainer's 20 s
    log.write_text(HEADER + vmstat_line(9, "2026-12-05 08:49:40") + vmstat_line(3, "2026-12-05 08:49:55")
                   + vmstat_line(4, "2026-12-05 08:50:00") + vmstat_line(6, "2026-12-05 08:50:05")
                   + vmstat_line(9, "2026-12-05 08:50:30"))
    out = tmp_path / "training-x.json"
    run_record.main(["--run", str(run), "--vmstat", str(log), "--command", "python -m train --seed 2",
                     "--commit", "fab5f94", "--load", "shared: other work ran beside it", "--json", str(out)])
    written = record.load(str(out))
    assert (written["command"], written["commit"], written["date"]) == ("python -m train --seed 2", "fab5f94", "2026-12-05")
    assert written["machine"]["load"] == "shared: other work ran beside it (vmstat r median 4)"
    assert written["machine"]["kind"] in record.KINDS and written["source"] == "measured"
    assert written["vmstat"]["samples"] == 3 and written["seed"] == 2 and written["test_accuracy"] == 0.93
    low, high = written["test_wilson_95"]
    assert low < 0.93 < high
