"""What a demo run keeps on disk (``prioreplay.apps.demo_disk``) on a hand-made run folder."""

from __future__ import annotations

from prioreplay.apps.demo_disk import GB, disk_line, disk_usage, drop_trainer_state


def _run(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for name, files in {
        "step-12": {"model.safetensors": 500, "trainer_state.pt": 1000},
        ".tmp-step-13-ab12": {"model.safetensors": 100},
        "published/v-9": {"model.safetensors": 500},
        "published/v-10": {"model.safetensors": 500},
    }.items():
        (root / name).mkdir(parents=True)
        for f, size in files.items():
            (root / name / f).write_bytes(b"x" * size)
    (tmp_path / "run" / "report.json").write_text("{}")
    return tmp_path / "run"


def test_the_report_counts_each_part_and_names_the_newest_version_last(tmp_path):
    run = _run(tmp_path)
    disk = disk_usage(run, trainer_state_kept=True)
    assert disk["checkpoints"] == ["step-12"] and disk["published"] == ["v-9", "v-10"]  # by number, not by text
    assert (disk["checkpoint_bytes"], disk["published_bytes"]) == (1500, 1000)
    assert disk["run_dir_bytes"] == 1500 + 1000 + 100 + 2
    line = disk_line(run, {**disk, "run_dir_bytes": int(2.2 * GB)})
    assert line.startswith(f"disk: {run} holds 2.20 GB") and "checkpoints/step-12" in line and "published/v-10" in line


def test_dropping_the_trainer_state_keeps_the_published_weights_only(tmp_path):
    run = _run(tmp_path)
    gone = drop_trainer_state(run)
    assert sorted(p.name for p in gone) == [".tmp-step-13-ab12", "step-12"]
    disk = disk_usage(run, trainer_state_kept=False)
    assert disk["checkpoints"] == [] and disk["published_bytes"] == 1000
    assert "trainer state dropped" in disk_line(run, disk)
