"""``--report-to tensorboard,wandb``: what the learner and the demo write, read back through the
libraries (TensorBoard's ``EventAccumulator``; wandb's offline run folder)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.reporting import open_reporter


def _events(log_dir: Path):
    """TensorBoard's own reader over every event file under ``log_dir`` (one run)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def _series(acc, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_scalars_and_the_priority_histogram_read_back_from_tensorboard(tmp_path):
    rep = open_reporter(["tensorboard"], tmp_path, "t")
    rep.scalars("learner", {"loss": 0.5, "grad_norm": 2.0, "skipped": "non-finite", "kl": float("nan"), "published": True}, 1)
    rep.scalars("learner", {"loss": 0.25}, 2)
    rep.histogram("server/priority", [0.0, 0.125, 0.25], [3, 1], step=2)
    rep.histogram("server/priority", [0.0, 0.125, 0.25], [0, 0], step=3)  # empty: skipped
    rep.close()
    acc = _events(tmp_path / "tensorboard")
    assert _series(acc, "learner/loss") == [(1, 0.5), (2, 0.25)]
    assert _series(acc, "learner/grad_norm") == [(1, 2.0)]
    # strings, bools and NaN are not scalars
    assert not {"learner/kl", "learner/skipped", "learner/published"} & set(acc.Tags()["scalars"])
    (h,) = acc.Histograms("server/priority")
    assert h.step == 2
    assert list(h.histogram_value.bucket) == [3.0, 1.0] and list(h.histogram_value.bucket_limit) == [0.125, 0.25]
    assert h.histogram_value.num == 4 and h.histogram_value.min == 0.0 and h.histogram_value.max == 0.25


def test_a_histogram_with_mismatched_edges_is_refused(tmp_path):
    rep = open_reporter(["tensorboard"], tmp_path, "t")
    with pytest.raises(ValueError, match="2 buckets needs 3 edges, got 2"):
        rep.histogram("h", [0.0, 1.0], [1, 1], step=0)
    rep.close()


def test_no_target_writes_nothing_and_imports_nothing(tmp_path):
    rep = open_reporter([], tmp_path / "r", "t")
    rep.scalars("learner", {"loss": 1.0}, 1)
    rep.histogram("h", [0.0, 1.0], [1], 1)
    rep.close()
    assert not (tmp_path / "r").exists()


def test_a_missing_library_names_the_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(InvalidArgument, match=r"--report-to wandb needs the 'wandb' package.*prioreplay\[wandb\]"):
        open_reporter(["tensorboard", "wandb"], tmp_path, "t")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("tensorboard,wandb", ["tensorboard", "wandb"]),
        ("WandB", ["wandb"]),
        ("none", []),
        ("tensorboard,tensorboard", ["tensorboard"]),
    ],
)
def test_report_to_takes_a_comma_list_in_any_case(given, expected):
    from prioreplay.apps.cli import parse

    for command in ("learner", "demo", "compare"):
        assert parse(command, ["--report-to", given]).report_to == expected


def test_report_to_from_the_environment_is_the_same_comma_list(monkeypatch):
    from prioreplay.apps.cli import parse

    monkeypatch.setenv("PRIOREPLAY_REPORT_TO", "tensorboard,wandb")
    assert parse("learner", []).report_to == ["tensorboard", "wandb"]


def test_an_unknown_target_is_refused_naming_it_and_the_choices():
    from prioreplay.apps.cli import parse

    with pytest.raises(InvalidArgument, match=r"report_to \(tb\) must be a comma list of tensorboard, wandb"):
        parse("learner", ["--report-to", "tensorboard,tb"])


def test_the_learner_reports_each_step_record(tmp_path):
    from prioreplay.learner.metrics import LearnerMetrics

    rep = open_reporter(["tensorboard"], tmp_path, "learner")
    metrics = LearnerMetrics(tmp_path / "learner.jsonl", reporter=rep)
    for step in (1, 2):
        metrics.record(
            {
                "step": step,
                "loss": 0.1 * step,
                "kl": 0.01,
                "clip_frac_low": 0.0,
                "clip_frac_high": 0.05,
                "grad_norm": 1.5,
                "tokens_per_s": 1000.0,
                "staleness_mean": 0.5,
            }
        )
    rep.close()
    acc = _events(tmp_path / "tensorboard")
    assert [s for s, _ in _series(acc, "learner/loss")] == [1, 2]
    assert math.isclose(_series(acc, "learner/loss")[1][1], 0.2, rel_tol=1e-6)
    for key in ("kl", "clip_frac_high", "grad_norm", "tokens_per_s", "staleness_mean"):
        assert f"learner/{key}" in acc.Tags()["scalars"]
    assert len((tmp_path / "learner.jsonl").read_text().splitlines()) == 2  # the JSON lines as before


@pytest.mark.slow
def test_wandb_offline_run_holds_the_scalars_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rep = open_reporter(["wandb"], tmp_path, "t", config={"sampler": "heap"})
    rep.scalars("learner", {"loss": 0.5}, 1)
    rep.histogram("server/priority", [0.0, 0.125, 0.25], [3, 1], step=1)
    rep.close()
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb ships no reader for its offline log: its records are protobuf, uncompressed, so the
    # logged keys and the config appear in the bytes that `wandb sync` uploads. Its writer (the
    # wandb-core service process) can still hold them in a buffer after finish() returns on a
    # loaded machine (a CI run read the 7-byte header only): wait a while, then shut it down,
    # which flushes (what the interpreter's exit does for a demo run).
    needles = (b"learner/loss", b"server/priority", b"sampler", b"heap")
    deadline = time.monotonic() + 30.0
    while not all(n in log.read_bytes() for n in needles) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not all(n in log.read_bytes() for n in needles):
        import wandb

        wandb.teardown()
    data = log.read_bytes()
    for needle in needles:
        assert needle in data, needle


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_demo_run_writes_learner_and_server_events(tmp_path):
    from tests.system.cli.test_demo import _run_demo

    # 1,000 problems instead of 48: the tiny random model fails every problem it is given, which
    # then waits in the unsolved pool, so only unseen problems keep the heap (and its histogram) full
    report = _run_demo(tmp_path, "--report-to", "tensorboard", "--dataset", "arithmetic:1000")
    acc = _events(tmp_path / "run" / "tensorboard")
    steps = [s["step"] for s in report["steps"]]
    assert [s for s, _ in _series(acc, "learner/loss")] == steps == [1, 2, 3]
    for key in ("heap", "solved", "unsolved", "leased", "unseen", "effective_group_fraction"):
        assert [s for s, _ in _series(acc, f"server/{key}")] == steps, key
    last = report["steps"][-1]
    assert _series(acc, "server/heap")[-1][1] == last["heap"]
    assert _series(acc, "learner/grad_norm")[-1][1] == pytest.approx(last["learner"]["grad_norm"], rel=1e-6)
    # the heap's priority histogram at each step, as GetStats gave it
    hist = acc.Histograms("server/priority")
    assert {h.step: h.histogram_value.num for h in hist} == {s["step"]: sum(s["priority_histogram"]) for s in report["steps"]}
    assert list(hist[-1].histogram_value.bucket) == [float(c) for c in last["priority_histogram"]]
    assert _series(acc, "eval/accuracy_after")[0] == (3, pytest.approx(report["accuracy_after"]))


def test_every_compare_arm_reports_where_compare_was_asked_to(tmp_path):
    from prioreplay.apps.cli import parse
    from prioreplay.apps.compare import ARM_KEYS, _arm_config, _demo_args

    cfg = parse("compare", ["--report-to", "tensorboard,wandb", "--run-dir", str(tmp_path)])
    arm = _arm_config(cfg, "heap", 0, tmp_path)
    assert arm.report_to == ["tensorboard", "wandb"]
    # a parallel arm is its own `prioreplay demo` process: its flags carry the targets
    assert parse("demo", _demo_args(arm)).report_to == ["tensorboard", "wandb"]
    assert "report_to" in ARM_KEYS  # runs reported elsewhere are still one comparison
