"""The demo's held-out curve: versions kept at marks of the budget, scored, then deleted."""

from __future__ import annotations

from prioreplay.apps.demo_curve import CurveKeeper, curve_points


def publish(run_dir, version):
    d = run_dir / "checkpoints" / "published" / f"v-{version}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w%d" % version)
    (d / "prioreplay.json").write_text("{}")


def test_a_version_is_kept_at_each_mark_and_survives_the_learners_prune(tmp_path):
    keeper = CurveKeeper(tmp_path, budget=100.0, points=3)
    assert keeper.marks() == [25.0, 50.0, 75.0]
    keeper.observe(30, 30, 300)  # a mark passed before any version: nothing yet
    assert keeper.kept == []
    publish(tmp_path, 1)
    keeper.observe(40, 40, 400)
    publish(tmp_path, 2)
    keeper.observe(60, 60, 600)
    keeper.observe(61, 61, 610)  # no new mark
    keeper.observe(80, 60, 600)  # a mark passed with no newer version: the same version kept again, the first one intact
    assert [(r, v) for r, _, v, _ in keeper.kept] == [(40, 1), (60, 2), (60, 2)]
    assert all(p.is_dir() for *_, p in keeper.kept)
    for v in (1, 2):  # the learner prunes its versions: the kept links still hold the files
        for f in (tmp_path / "checkpoints" / "published" / f"v-{v}").iterdir():
            f.unlink()
    scored = keeper.score(lambda w: [True, (w / "model.safetensors").read_bytes() == b"w2"])
    assert [p["accuracy"] for p in scored] == [0.5, 1.0, 1.0] and [p["policy_version"] for p in scored] == [1, 2, 2]
    assert not any((tmp_path / "curve").iterdir())  # deleted once scored


def test_the_curve_runs_from_before_training_to_the_final_policy():
    pts = curve_points(
        [True, False], [{"rollouts": 5, "completion_tokens": 50, "policy_version": 1, "accuracy": 0.5}], [True, True], 10, 99
    )
    assert [p["rollouts"] for p in pts] == [0, 5, 10] and [p["accuracy"] for p in pts] == [0.5, 0.5, 1.0]
    assert curve_points(None, [], None, 10, 0)[0]["accuracy"] is None
