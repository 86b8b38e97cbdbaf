"""bench/report/ and the records: docs/benchmarks.md is what the records render, and every record is read."""

import os
import re

import pytest

from bench import record, report

with open(report.DOC) as f:
    COMMITTED = f.read()
RECORDS = record.load_all()


def test_the_committed_page_is_what_the_records_render():
    rendered, _ = report.render(COMMITTED, RECORDS)
    assert rendered == COMMITTED, "docs/benchmarks.md differs from its records: run python -m bench.report"


def test_every_record_is_read_by_a_region():
    _, used = report.render(COMMITTED, RECORDS)
    assert set(RECORDS) - used.used == set(), "a record no table renders: render it or delete it (git keeps it)"


def test_every_line_of_the_page_fits():
    long = [(number, len(line)) for number, line in enumerate(COMMITTED.splitlines(), 1) if len(line) > 500]
    assert not long, f"lines over 500 characters: {long}"


def test_check_names_a_region_that_differs(tmp_path, monkeypatch, capsys):
    stale = COMMITTED.replace("| 3,494 |", "| 3,000 |", 1)
    assert stale != COMMITTED
    path = tmp_path / "benchmarks.md"
    path.write_text(stale)
    monkeypatch.setattr(report.core, "DOC", str(path))  # what main reads
    assert report.main(["--check"]) == 1
    assert "training-time-airbench-avx2" in capsys.readouterr().err
    assert report.main([]) == 0 and path.read_text() == COMMITTED  # a render puts the records' figure back


def fake(**figures):
    return {"command": "python -m bench.x", "machine": {"kind": "avx2", "cpu": "CPU", "cores": 2}, "commit": "abc1234",
            "date": "2026-12-01", "source": "measured", **figures}


def test_a_table_record_renders_its_formats_and_its_targets():
    records = {"r": fake(table={"columns": ["what", "ms"], "rows": [["a", 1.234], ["b", None]], "formats": [None, "{:.1f} ms"]},
                         targets=[{"target": "a fast", "measured": 1.234, "at_most": 1.0, "format": "{:.2f} ms"},
                                  {"target": "a at all", "measured": 1.234, "at_least": 1.0, "format": "{:.2f} ms"}])}
    text = "# Top\n\n<!-- bench.report: targets -->\n<!-- /bench.report -->\n\n## Where\n\n<!-- bench.report: r -->\n<!-- /bench.report -->\n"
    rendered, _ = report.render(text, records)
    assert "| a | 1.2 ms |" in rendered and "| b |  |" in rendered
    assert "| a fast | 1.23 ms | ≤ 1.00 ms | **missed** | AVX2 | [Where](#where) |" in rendered
    assert "| a at all | 1.23 ms | ≥ 1.00 ms | met |" in rendered
    assert "1. [`r`](../bench/records/r.json): AVX2, CPU, 2 cores; code of `abc1234`, 2026-12-01: `python -m bench.x`" in rendered


def test_records_with_the_same_columns_share_one_table():
    spec = {"columns": ["what", "s"], "rows": [["run", 1]]}
    records = {"a": fake(table=spec), "b": {**fake(table=spec), "machine": {"kind": "h200", "accelerator": "GPU"}}}
    rendered, _ = report.render("<!-- bench.report: a b -->\n<!-- /bench.report -->\n", records)
    assert "| what | s | machine kind | record |" in rendered
    assert "| run | 1 | AVX2 | 1 |" in rendered and "| run | 1 | H200 | 2 |" in rendered


def test_a_region_naming_no_record_is_an_error():
    with pytest.raises(KeyError, match="no record bench/records/missing.json"):
        report.render("<!-- bench.report: missing -->\n<!-- /bench.report -->\n", RECORDS)


@pytest.mark.parametrize("broken, complaint", [
    ({"commit": ""}, "without commit"),
    ({"machine": {"kind": "avx3"}}, "machine kind 'avx3'"),
    ({"date": "3 December"}, "Invalid isoformat"),
])
def test_a_record_without_its_provenance_is_refused(broken, complaint):
    with pytest.raises(ValueError, match=complaint):
        record.check({**fake(), **broken})


def test_write_adds_this_run_and_machine(tmp_path):
    written = record.write(str(tmp_path / "r.json"), {"figure": 1}, "bench.serving.speed", ["--duration", "5"])
    assert written["command"] == "python -m bench.serving.speed --duration 5" and written["figure"] == 1
    assert written["machine"]["kind"] in record.KINDS and written["machine"]["cores"] >= 1
    assert record.load(str(tmp_path / "r.json")) == written


def test_write_keeps_the_provenance_its_caller_gives(tmp_path):
    machine = {**record.machine(), "load": "shared: other work ran beside it"}
    written = record.write(str(tmp_path / "r.json"), {"figure": 1}, "bench.training.run_record", [],
                           command="python -m train --seed 0", commit="abc1234", date="2026-12-05", machine=machine)
    assert (written["command"], written["commit"], written["date"]) == ("python -m train --seed 0", "abc1234", "2026-12-05")
    assert written["machine"]["load"] == "shared: other work ran beside it"
    with pytest.raises(TypeError, match="figures go in figures"):
        record.write(None, {}, "bench.x", [], accuracy=0.9)


@pytest.mark.parametrize("flags, kind", [
    ({"avx2", "fma"}, "avx2"),
    ({"avx2", "avx512f"}, "avx512"),
    ({"avx2", "avx512f", "avx512_bf16"}, "avx512-bf16"),
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "avx512-bf16-amx"),
    ({"sse4_2"}, "other"),
])
def test_the_cpu_kind_of_its_flags(flags, kind):
    assert record.cpu_kind(flags) == kind


def test_accuracy_counts_agree_with_the_measured_records_of_the_same_runs():
    """The transcribed accuracies of airbench_muon's runs are those its out-of-distribution records measured."""
    measured = {("fusedgelu", int(n[-1])): r["accuracy"] for n, r in RECORDS.items() if n.startswith("ood-airbench_muon-fusedgelu")}
    measured.update({("10epochs", int(n[-1])): r["accuracy"] for n, r in RECORDS.items() if n.startswith("ood-airbench_muon-10epochs")})
    transcribed = {("fusedgelu", r["seed"]): r["runs"][0]["correct"] / 1000 for n, r in RECORDS.items()
                   if re.fullmatch(r"accuracy-airbench_muon-h5000-png-s\d", n)}
    transcribed.update({("10epochs", run["seed"]): run["correct"] / 1000
                        for run in RECORDS["accuracy-airbench_muon-10epochs-h5000-png"]["runs"]})
    assert measured and all(transcribed[key] == pytest.approx(value) for key, value in measured.items())


def test_every_link_to_a_section_of_the_page_finds_it():
    anchors = {report.slug(h) for h in report.HEADING.findall(COMMITTED)}
    broken = []
    for path in ["README.md", "serve/README.md", "bench/README.md", "bench/records/README.md",
                 *(os.path.join("docs", n) for n in os.listdir(os.path.join(record.ROOT, "docs")) if n.endswith(".md"))]:
        with open(os.path.join(record.ROOT, path)) as f:
            text = f.read()
        own = path == "docs/benchmarks.md"
        for anchor in re.findall(r"\]\((?:[./]*docs/)?benchmarks\.md#([^)]+)\)" if not own else r"\]\(#([^)]+)\)", text):
            if anchor not in anchors:
                broken.append(f"{path}: #{anchor}")
    assert not broken, broken


def test_a_training_label_names_everything_the_recipe_changed():
    from bench.report.training import recipe_label

    recipe = {"batch_size": 1000, "epochs": 12, "learning_rate": 0.83, "corrupt_fraction": 0.1, "corrupt_noise": 0.1,
              "corrupt_blur": 1.0, "jpeg_fraction": 0.1, "jpeg_quality": 30}
    assert recipe_label(recipe, 0.83) == ("batch 1,000, 12 epochs, 10% of each batch corrupted (noise ≤ 0.1, blur ≤ 1 px), "
                                          "10% re-encoded as JPEG (quality 30-95)")
    # blur 0 leaves the blurred half as it was: a fifth of the batch chosen is a tenth made noisy
    noisy = {**recipe, "corrupt_fraction": 0.2, "corrupt_blur": 0.0, "jpeg_fraction": 0.0}
    assert recipe_label(noisy, 0.83) == "batch 1,000, 12 epochs, 10% of each batch noisy (noise ≤ 0.1)"
    assert recipe_label({**noisy, "corrupt_noise": 0.0, "corrupt_blur": 2.0}, 0.83) == (
        "batch 1,000, 12 epochs, 10% of each batch blurred (blur ≤ 2 px)")
