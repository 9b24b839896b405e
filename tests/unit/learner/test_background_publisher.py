"""The background publisher: one job in flight, in order, and a failed job's error never lost."""

from __future__ import annotations

import threading

import pytest

from prioreplay.learner.publisher import BackgroundPublisher


def test_a_second_job_starts_only_after_the_first_has_ended():
    pub, release, order = BackgroundPublisher(), threading.Event(), []

    def first():
        assert release.wait(5), "the test never released the first job"
        order.append(1)

    pub.submit("v-1", first)
    assert pub.busy
    threading.Timer(0.05, release.set).start()
    pub.submit("v-2", lambda: order.append(2))  # waits for the first
    pub.wait()
    assert order == [1, 2] and not pub.busy


def test_a_failed_job_raises_once_on_the_callers_thread_after_its_rollback():
    pub, rolled_back = BackgroundPublisher(), []

    def broken():
        raise OSError("No space left on device")

    pub.submit("v-1", broken, on_failure=lambda: rolled_back.append(True))
    with pytest.raises(OSError, match="No space left"):
        pub.wait()
    assert rolled_back == [True]
    pub.wait()  # raised once: nothing left


def test_check_leaves_a_running_job_alone_and_raises_a_finished_failure():
    pub, release = BackgroundPublisher(), threading.Event()

    def slow_then_broken():
        assert release.wait(5)
        raise RuntimeError("PublishPolicy refused")

    pub.submit("v-3", slow_then_broken)
    pub.check()  # still running: returns at once, raises nothing
    assert pub.busy
    release.set()
    with pytest.raises(RuntimeError, match="refused"):
        pub.submit("v-4", lambda: None)  # the previous failure is raised; v-4 never starts
    assert not pub.busy


def test_close_waits_and_logs_a_failure_instead_of_raising(caplog):
    pub = BackgroundPublisher()
    pub.submit("policy version 5", lambda: (_ for _ in ()).throw(OSError("disk gone")))
    pub.close()
    assert "background publish of policy version 5 failed: disk gone" in caplog.text
    assert not pub.busy
