"""``compare-trl``'s summary: per-arm intervals, the paired per-seed difference, and ``--combine``
of outputs run side by side (one process per seed), refused when their settings differ."""

from __future__ import annotations

import json

import pytest

from prioreplay.apps import compare_trl


def _run(arm: str, seed: int, egf: float, change: float) -> dict:
    return {"arm": arm, "seed": seed, "effective_group_fraction": egf, "final_reward": 0.5, "accuracy_change": change,
            "accuracy_after": 0.5, "wall_s": 10.0}  # fmt: skip


def _write(d, runs, steps="60"):
    d.mkdir()
    settings = {"seed": str(runs[0]["seed"]), "seeds": "1", "steps": steps, "out": str(d), "combine": "None"}
    (d / "summary.json").write_text(json.dumps({"settings": settings, "runs": runs}))


def test_the_paired_difference_is_per_seed_and_only_over_seeds_both_arms_ran():
    runs = [_run("trl", 0, 0.4, 0.1), _run("prioreplay", 0, 0.6, 0.2), _run("trl", 1, 0.5, 0.0)]
    runs += [_run("prioreplay", 1, 0.6, 0.1), _run("trl", 2, 0.3, 0.0)]  # seed 2: trl only
    paired = compare_trl.summarize(runs)["prioreplay_minus_trl"]
    assert paired["effective_group_fraction"]["per_seed"] == pytest.approx([0.2, 0.1])
    assert paired["effective_group_fraction"]["runs"] == 2
    assert paired["accuracy_change"]["mean"] == pytest.approx(0.1)
    lo, hi = paired["effective_group_fraction"]["ci95"]
    assert 0.1 - 1e-9 <= lo <= hi <= 0.2 + 1e-9


def test_combine_gathers_the_runs_of_like_outputs_and_refuses_unlike_ones(tmp_path, capsys):
    _write(tmp_path / "s0", [_run("trl", 0, 0.4, 0.1), _run("prioreplay", 0, 0.6, 0.2)])
    _write(tmp_path / "s1", [_run("trl", 1, 0.5, 0.0), _run("prioreplay", 1, 0.7, 0.1)])
    out = tmp_path / "all"
    assert compare_trl.main(["--combine", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in summary["runs"]) == [
        ("prioreplay", 0),
        ("prioreplay", 1),
        ("trl", 0),
        ("trl", 1),
    ]
    assert summary["arms"]["prioreplay_minus_trl"]["effective_group_fraction"]["per_seed"] == pytest.approx([0.2, 0.2])
    assert "(n=2)" in capsys.readouterr().out
    _write(tmp_path / "s2", [_run("trl", 2, 0.5, 0.0)], steps="100")
    with pytest.raises(SystemExit, match="differs from .* in steps"):
        compare_trl.main(["--combine", str(tmp_path / "s0"), str(tmp_path / "s2"), "--out", str(out)])
    with pytest.raises(SystemExit, match="does not exist"):
        compare_trl.main(["--combine", str(tmp_path / "nothing"), "--out", str(out)])
