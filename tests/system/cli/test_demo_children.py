"""The demo's child processes (``prioreplay.apps.demo_children``) with stand-in children (``python -c``):
a stop the demo asked for is a normal end whatever the child's exit, an exit nobody asked for is a
failure with the log tail, and stopping is bounded and concurrent (issue 43: a learner stopped at the
budget died with −15 and the arm was reported failed; stopping an arm took over 45 s)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from prioreplay.apps import demo_children
from prioreplay.apps.demo_children import Child, ChildFailed, Children

#: SIGTERM's default action (a child stopped before it installs its handler)
DIES = "import time; print('up', flush=True); time.sleep(60)"
#: finishes its work in progress on the first SIGTERM only after 2 s, stops at once on the second
SLOW = """
import signal, sys, time
asked = []
def on_term(signum, frame):
    if asked:
        sys.exit(0)
    asked.append(time.monotonic())
signal.signal(signal.SIGTERM, on_term)
print('up', flush=True)
while not asked or time.monotonic() - asked[0] < 2.0:
    time.sleep(0.05)
"""
#: ignores SIGTERM altogether
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def _child(tmp_path, name: str, code: str) -> Child:
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    log.write_text(f"{name} log line\n")
    return Child(name, proc, log, 0)


def test_a_child_killed_by_the_sigterm_the_demo_sent_is_a_normal_end(tmp_path):
    children = Children(tmp_path)
    learner = _child(tmp_path, "learner", DIES)
    children.members.append(learner)
    children.stop(learner, grace_s=5.0)
    assert learner.proc.returncode == -15
    assert learner.failure() is None
    children.check()  # no ChildFailed


@pytest.mark.parametrize("code, rc", [("import sys; print('up', flush=True); sys.exit(3)", 3), ("print('up')", 0)])
def test_an_exit_nobody_asked_for_is_a_failure_with_the_log_tail(tmp_path, code, rc):
    children = Children(tmp_path)
    worker = _child(tmp_path, "worker-0", code)
    children.members.append(worker)
    worker.proc.wait(30)
    with pytest.raises(ChildFailed, match=rf"worker-0 exited with code {rc}(.|\n)*worker-0 log line"):
        children.check()
    worker.may_exit = True  # the learner at its step limit: exit 0 is its normal end
    assert (worker.failure() is None) == (rc == 0)


def test_stopping_escalates_to_a_second_sigterm_then_sigkill_within_a_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_children, "KILL_AFTER_S", 1.0)
    children = Children(tmp_path)
    slow, deaf = _child(tmp_path, "slow", SLOW), _child(tmp_path, "deaf", DEAF)
    children.members += [slow, deaf]
    t0 = time.monotonic()
    children.stop_all(grace_s=0.5)
    took = time.monotonic() - t0
    assert slow.proc.returncode == 0  # stopped at once on the second SIGTERM, before its 2 s were up
    assert deaf.proc.returncode == -9
    assert took < 0.5 + 1.0 + 3.0
    children.check()  # both were stopped by the demo: no failure


def test_stop_all_stops_the_children_at_once_not_one_after_another(tmp_path):
    children = Children(tmp_path)
    children.members += [_child(tmp_path, f"worker-{i}", SLOW) for i in range(3)]
    t0 = time.monotonic()
    children.stop_all(grace_s=10.0)
    took = time.monotonic() - t0
    assert [c.proc.returncode for c in children.members] == [0, 0, 0]
    assert 2.0 <= took < 5.0  # one 2 s finish for all three, not 6 s


def test_a_failure_names_the_first_error_a_long_traceback_pushed_out_of_the_tail(tmp_path):
    """vLLM's engine core logs its root cause, then 40 lines of the worker's traceback: the tail
    alone said "Engine core initialization failed. See root cause above"."""
    children = Children(tmp_path)
    worker = _child(tmp_path, "worker-0", "import sys; print('up', flush=True); sys.exit(1)")
    children.members.append(worker)
    worker.log_path.write_text(
        "(EngineCore pid=7) ERROR [core.py:1] ValueError: the KV cache (0.24 GiB) is too small\n"
        + "".join(f"  frame {i}\n" for i in range(40))
        + "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    worker.proc.wait(30)
    with pytest.raises(ChildFailed) as e:
        children.check()
    assert "first error in the log: ValueError: the KV cache (0.24 GiB) is too small" in str(e.value)
