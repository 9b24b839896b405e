"""benchmarks.passrate --from-json: a --dataset row becomes mix.* figures (no model run)."""

from __future__ import annotations

import json

from benchmarks import passrate

ROW = {
    "pass_rate": 0.25,
    "pass_rate_ci95": [0.1, 0.4],
    "groups": 4,
    "mixed_fraction": 0.5,
    "all_wrong_fraction": 0.25,
    "all_correct_fraction": 0.25,
    "by_task": {
        "sums": {"groups": 2, "pass_rate": 0.5, "mixed_fraction": 0.5, "all_wrong_fraction": 0.0, "all_correct_fraction": 0.5},
        "legs": {"groups": 2, "pass_rate": 0.0, "mixed_fraction": 0.5, "all_wrong_fraction": 0.5, "all_correct_fraction": 0.0},
    },
}
ARGS = {
    "dataset": "mix:x.toml",
    "problems": 4,
    "group_size": 4,
    "temperature": 0.7,
    "stops": "newline",
    "max_new_tokens": 24,
    "seed": 0,
    "model": "smollm2-135m",
}


def test_a_recorded_row_gives_the_first_visit_shares_overall_and_per_task(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"args": ARGS, "rows": [ROW]}))
    out = tmp_path / "results.json"
    out.write_text(json.dumps([{"name": "other.figure", "value": 1}]))
    assert passrate.main(["--from-json", str(run), "--out", str(out), "--name", "mixy", "--note", "load 3"]) == 0
    items = {i["name"]: i for i in json.loads(out.read_text())}
    assert items["other.figure"]["value"] == 1  # other figures kept
    assert items["mixy.first_visit.all_right_share"]["value"] == 0.25
    assert items["mixy.first_visit.all_wrong_share"]["value"] == 0.25
    assert items["mixy.task.legs.first_visit.all_wrong_share"]["value"] == 0.5
    assert items["mixy.task.sums.pass_rate"]["n"] == 2
    assert items["mixy.pass_rate"]["ci95"] == [0.1, 0.4] and items["mixy.pass_rate"]["note"] == "load 3"
    assert "--dataset mix:x.toml --problems 4 --group-size 4" in items["mixy.pass_rate"]["command"]
