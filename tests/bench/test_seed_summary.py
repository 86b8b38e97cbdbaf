"""bench/accuracy/seed_summary.py, the accuracy of record over seeds: its figures on runs whose answers are known."""

import json
import subprocess
import sys

import pytest

from bench.record import ROOT

NAMES = [f"test/{cls}/{i:04d}.png" for cls in ("cat", "dog") for i in range(50)]


def answers(wrong):
    """Per-image classes that get exactly the images in ``wrong`` wrong."""
    other = {"cat": "dog", "dog": "cat"}
    return {n: other[n.split("/")[1]] if i in wrong else n.split("/")[1] for i, n in enumerate(NAMES)}


def port_report(path, wrong, int8_wrong=()):
    """A ``python -m bench.accuracy.of_record --json`` record."""
    with open(path, "w") as f:
        json.dump({"data": "x.zip", "savedmodel": {"predicted": answers(wrong)},
                   "litert-int8": {"predicted": answers(int8_wrong)}}, f)
    return str(path)


def control_report(path, *wrongs):
    """A bench/training/airbench94_reference.py --predictions file with one run per ``wrongs``."""
    with open(path, "w") as f:
        json.dump({"seed": 0, "runs": [{"predicted": answers(w)} for w in wrongs]}, f)
    return str(path)


def summary(*args):
    return subprocess.run([sys.executable, "-m", "bench.accuracy.seed_summary", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_each_run_the_means_the_spread_and_mcnemar(tmp_path):
    ports = [port_report(tmp_path / "p0.json", range(0, 10)),      # 90 of 100
             port_report(tmp_path / "p1.json", range(0, 8)),       # 92
             port_report(tmp_path / "p2.json", range(0, 6))]       # 94
    control = control_report(tmp_path / "c.json", range(40, 49), range(40, 47))  # 91, 93
    out = tmp_path / "summary.json"
    done = summary("--group", "port", *ports, "--group", "control", control, "--json", str(out), "--resamples", "2000")
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["images"] == 100
    port, ctrl = report["groups"]["port"], report["groups"]["control"]
    assert [r["accuracy"] for r in port["runs"]] == [0.90, 0.92, 0.94]
    assert [r["run"] for r in ctrl["runs"]] == ["c.json[0]", "c.json[1]"]
    assert port["mean"] == pytest.approx(0.92) and ctrl["mean"] == pytest.approx(0.92)
    assert port["sd"] == pytest.approx(0.02) and ctrl["sd"] == pytest.approx(2 ** 0.5 / 100)
    assert port["range"] == [0.90, 0.94]
    assert port["runs"][0]["wilson_95"][0] < 0.90 < port["runs"][0]["wilson_95"][1]
    low, high = port["bootstrap_95"]
    assert low < 0.92 < high and high - low < 0.15
    (difference,) = report["differences"]
    assert difference["difference"] == pytest.approx(0.0)
    assert difference["bootstrap_95"][0] < 0 < difference["bootstrap_95"][1]
    pairs = {(m["first"], m["second"]): m for m in difference["mcnemar"]}
    assert len(pairs) == 6
    first = pairs[("p0.json", "c.json[0]")]  # the port misses 0-9, the control 40-48: disjoint
    assert (first["only_first_right"], first["only_second_right"]) == (9, 10)
    assert first["p"] == pytest.approx(1.0)
    assert "McNemar exact p" in done.stdout and "| port | p0.json | 90.00% |" in done.stdout


def test_runtime_picks_which_answers_of_a_report(tmp_path):
    port = port_report(tmp_path / "p.json", range(0, 4), int8_wrong=range(0, 30))
    done = summary("--group", "port", port, "--runtime", "litert-int8", "--json", str(tmp_path / "s.json"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["groups"]["port"]["runs"][0]["accuracy"] == pytest.approx(0.70)
    assert report["groups"]["port"]["sd"] is None and report["differences"] == []


def test_runs_on_other_images_are_refused_in_one_line(tmp_path):
    port = port_report(tmp_path / "p.json", range(3))
    other = tmp_path / "c.json"
    other.write_text(json.dumps({"runs": [{"predicted": {n: "cat" for n in NAMES[:60]}}]}))
    done = summary("--group", "port", port, "--group", "control", str(other))
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error:") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_runtime_the_report_lacks_is_refused_not_replaced(tmp_path):
    port = port_report(tmp_path / "p.json", range(3))  # SavedModel and int8 answers only
    done = summary("--group", "port", port, "--runtime", "litert")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: {port} holds no litert answers"


@pytest.mark.parametrize("args, message", [
    (["--group", "port"], "names no predictions file"),
    (["--group", "port", "missing.json"], "no such file"),
])
def test_bad_arguments_are_usage_errors(args, message):
    done = summary(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
