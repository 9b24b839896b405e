"""Stopping a process that was asked to stop, in real processes (``prioreplay.process``): a signal
that arrives before the command installed its handler is kept for it, and a stop with a grace period
ends within it however long the work in progress would take (issue 43: a learner SIGTERMed during
its start-up died with −15 and the demo called the run failed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

#: a process that installs its handler only after a signal arrived (a model loading), then works
HELD = """
import os, signal, time
from prioreplay.process import hold_stop_signals, on_stop_signal
hold_stop_signals()
print("holding", flush=True)
time.sleep(1.0)  # the imports and the model load: SIGTERM arrives here
stopped = []
on_stop_signal(stopped.append)
print("stop asked:", stopped, flush=True)
"""

#: a process whose work in progress never ends by itself
ENDLESS = """
import time
from prioreplay.process import on_stop_signal
asked = []
on_stop_signal(asked.append, grace_s=GRACE, what="the endless step")
print("working", flush=True)
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("abandoned after", asked, flush=True)
"""


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # the first line: the handler (held or own) is installed
    return proc


def test_a_signal_before_the_handler_is_installed_is_kept_for_it():
    proc = _start(HELD)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # not −15: the default action would have killed it
    assert f"stop asked: [{int(signal.SIGTERM)}]" in out


@pytest.mark.parametrize("grace_s", [0.5, 2.0])
def test_a_stop_with_a_grace_period_abandons_the_work_when_the_period_ends(grace_s):
    proc = _start(ENDLESS.replace("GRACE", repr(grace_s)))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert f"abandoned after [{int(signal.SIGTERM)}]" in out
    assert "the endless step did not finish within" in err
    assert grace_s <= took < grace_s + 5.0


def test_a_second_signal_stops_at_once_without_waiting_for_the_grace_period():
    proc = _start(ENDLESS.replace("GRACE", "600.0"))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "abandoned after" in out and time.monotonic() - t0 < 10
