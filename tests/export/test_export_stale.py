"""An export killed mid-way (SIGKILL) leaves its hidden staging directory; the next export removes it once stale."""

import os


def test_stale_staging_directories_are_removed_and_fresh_ones_kept(tmp_path):
    from export import exporter

    base = tmp_path / "cifar10"
    (base / "1").mkdir(parents=True)
    dead = base / ".export-2-abc"
    (dead / "2").mkdir(parents=True)
    running = base / ".export-3-def"
    (running / "3").mkdir(parents=True)
    now = 1_000_000.0
    old = now - exporter.STALE_AFTER_S - 1
    for path in (dead, dead / "2"):
        os.utime(path, (old, old))
    for path in (running, running / "3"):
        os.utime(path, (now - 60, now - 60))
    exporter.clean_stale(str(base), now=now)
    assert sorted(p.name for p in base.iterdir()) == [".export-3-def", "1"]
