"""``python -m benchmarks.run`` makes its output folders before it measures, and writes the
figures it has even when a plot fails (a run of minutes once ended in FileNotFoundError for a
missing ``--plot-dir`` and wrote nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import run


def test_missing_output_folders_exist_before_the_first_part_and_a_failed_plot_keeps_the_figures(tmp_path, monkeypatch):
    plot_dir, out = tmp_path / "plots" / "deep", tmp_path / "res" / "results.json"
    seen = {}

    def part(args, res):
        seen["folders"] = Path(args.plot_dir).is_dir() and Path(args.out).parent.is_dir()
        res.add("fake.figure", 1.5, "s")

        def draw(path: str) -> None:
            raise RuntimeError("no backend")

        assert not res.plot(Path(args.plot_dir) / "fake.png", draw)
        res.add("fake.after_plot", 2.0, "s")
        return {}

    monkeypatch.setattr(run, "PARTS", {"fake": part})
    rc = run.main(["--quick", "--parts", "fake", "--plot-dir", str(plot_dir), "--out", str(out)])
    assert seen["folders"]
    assert rc == 1  # the failed plot is reported in the exit status
    names = [i["name"] for i in json.loads(out.read_text())]
    assert names == ["fake.after_plot", "fake.figure"]


def test_a_part_that_raises_still_writes_the_figures_before_it(tmp_path, monkeypatch):
    out = tmp_path / "results.json"

    def first(args, res):
        res.add("first.figure", 1.0, "s")

    def second(args, res):
        raise RuntimeError("measurement broke")

    monkeypatch.setattr(run, "PARTS", {"first": first, "second": second})
    with pytest.raises(RuntimeError, match="measurement broke"):
        run.main(["--quick", "--parts", "first,second", "--out", str(out)])
    assert [i["name"] for i in json.loads(out.read_text())] == ["first.figure"]


def test_an_output_path_taken_by_a_file_is_refused_before_measuring(tmp_path):
    taken = tmp_path / "file"
    taken.write_text("x")
    with pytest.raises(SystemExit, match=r"--plot-dir: cannot create the folder .*file"):
        run.prepare_outputs(None, str(taken))
