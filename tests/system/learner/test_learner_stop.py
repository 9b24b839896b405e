"""A stop asked of the learner ends it within a bounded time, exit 0, from any point of its life
(issue 43: stopped at the demo's budget while it was still starting, the learner died with −15 and
the demo called the arm failed). ``prioreplay.learner.main.run`` in this process against the
in-process server of conftest.py; the signal is sent to this process, with a handler of the test's
installed first so that a learner that ignores it cannot take the test runner down."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from tests.system.learner.test_learner import feed, make_config

pytestmark = pytest.mark.slow


@pytest.fixture
def signals():
    """Keep this process's SIGTERM/SIGINT handlers; the test's own records a signal nobody handled."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    unhandled: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    yield unhandled
    signal.signal(signal.SIGTERM, before[0])
    signal.signal(signal.SIGINT, before[1])


def _steps(path) -> list[int]:
    """The steps the learner's log records (its last line, ``{"end": true, ...}``, is no step)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r["step"] for r in lines if not r.get("end")]


def test_a_sigterm_while_the_model_loads_stops_the_learner_before_its_first_step(
    server, client, tiny_dir, tmp_path, monkeypatch, signals
):
    from prioreplay.learner import learner as learner_module
    from prioreplay.learner.main import run

    real = learner_module.Learner

    def loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the demo's budget is reached while the model loads
        return real(*args, **kwargs)

    monkeypatch.setattr(learner_module, "Learner", loading)
    feed(client, tiny_dir, 4, seed=5)
    cfg = make_config(server, tiny_dir, tmp_path, max_steps=2)
    t0 = time.monotonic()
    assert run(cfg) == 0
    assert signals == [], "the learner had no handler installed when the signal came"
    assert _steps(tmp_path / "learner.jsonl") == []  # stopped before its first step
    assert time.monotonic() - t0 < 60
    assert client.stats().groups_acked == 0  # nothing trained, nothing acknowledged: the groups stay queued


def test_a_step_that_does_not_finish_is_abandoned_when_the_stop_grace_ends(
    server, client, tiny_dir, tmp_path, monkeypatch, signals
):
    from prioreplay.learner import learner as learner_module
    from prioreplay.learner.main import run

    def endless_step(self):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()  # the stop comes mid-step
        while True:  # a step on a slow CPU, a publish to a slow disk: it would not end by itself
            time.sleep(0.05)

    monkeypatch.setattr(learner_module.Learner, "step", endless_step)
    feed(client, tiny_dir, 2, seed=6)
    cfg = make_config(server, tiny_dir, tmp_path, max_steps=5, stop_grace_s=1.0)
    t0 = time.monotonic()
    assert run(cfg) == 0
    took = time.monotonic() - t0
    assert signals == []
    assert took < 30, f"the stop took {took:.1f} s with a 1 s grace"
    assert not list((tmp_path / "ckpt").glob("step-*"))  # the abandoned step wrote nothing
    assert client.stats().groups_acked == 0  # and acknowledged nothing: its groups come back
