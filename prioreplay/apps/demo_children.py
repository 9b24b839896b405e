"""The demo's child processes: each role started as its own process with its own log file, a child
that ends unexpectedly noticed, and every child stopped within a bounded time.

A stop the demo asks for is a normal end, whatever the child's exit: 0 (it finished its batch or
step), the SIGTERM the demo sent (a child stopped before it installs its handler ends with −15), or
the SIGKILL it sends last. Stopping escalates: SIGTERM (finish the work in progress), after
``grace_s`` a second SIGTERM (abandon it: a worker's lease expires, a learner's unacknowledged
groups come back), after :data:`KILL_AFTER_S` more SIGKILL. :meth:`Children.stop_all` signals
every child at once, so stopping W workers takes one grace period, not W.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prioreplay.errors import PrioreplayError

log = logging.getLogger("prioreplay.apps.demo")

#: Seconds between the second SIGTERM (stop now) and SIGKILL.
KILL_AFTER_S = 10.0
#: Seconds each child gets to finish its work in progress when the demo is interrupted (Ctrl-C,
#: SIGTERM, a failed child): the run is abandoned, so its children are not waited for long.
INTERRUPT_GRACE_S = 5.0


#: A Python exception's last line, ``ValueError: message`` (after any log prefix on that line).
_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .+")


class ChildFailed(PrioreplayError):
    """A child process exited unexpectedly (the message holds its log tail)."""


@dataclass
class Child:
    """A child process of the demo and its log file.

    Attributes:
        may_exit: the child may end by itself with exit 0 (the learner at its step limit).
        stopped: the demo asked it to stop; any exit from then on is expected.
    """

    name: str
    proc: subprocess.Popen
    log_path: Path
    metrics_port: int
    may_exit: bool = False
    stopped: bool = False

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def failure(self) -> str | None:
        """Why the child's exit is a failure (its code and log tail), or None: still running, or an
        end the demo expects (exit 0 when it may exit or was stopped; after a stop also −SIGTERM and
        −SIGKILL, the signals the demo sent)."""
        rc = self.proc.poll()
        if rc is None or (rc == 0 and (self.may_exit or self.stopped)):
            return None
        if self.stopped and rc in (-signal.SIGTERM, -signal.SIGKILL):
            return None
        tail = self.tail()
        cause = self.first_error()
        first = f"\nfirst error in the log: {cause}" if cause and cause not in tail else ""
        return f"{self.name} exited with code {rc}; last lines of {self.log_path}:\n{tail}{first}"

    def first_error(self) -> str | None:
        """The log's first ``SomethingError: message`` line, stripped: the root cause a long
        traceback (vLLM's engine core logs its own, then the worker's) pushes out of the tail."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        match = _ERROR_LINE.search(text)
        return match.group(0).strip() if match else None


def _wait_all(children: Sequence[Child], deadline: float) -> list[Child]:
    """Wait until ``deadline`` (time.monotonic) for ``children`` to exit; returns those still running."""
    running = [c for c in children if c.proc.poll() is None]
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [c for c in running if c.proc.poll() is None]
    return running


@dataclass
class Children:
    """The child processes of one demo run, their logs under ``RUN_DIR/logs/``."""

    run_dir: Path
    members: list[Child] = field(default_factory=list)

    def spawn(self, name: str, args: list[str], metrics_port: int, threads: int, python: str = sys.executable) -> Child:
        """Start ``python -m prioreplay.apps.cli ARGS`` in its own session (a Ctrl-C reaches the demo
        only; the demo stops its children), stdout and stderr to ``logs/NAME.log``; ``threads``
        torch/OpenMP threads."""
        log_path = self.run_dir / "logs" / f"{name}.log"
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(threads),
            MKL_NUM_THREADS=str(threads),
            PRIOREPLAY_TORCH_THREADS=str(threads),
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        env.pop("PRIOREPLAY_CONFIG", None)
        fh = open(log_path, "ab")
        cmd = [python, "-m", "prioreplay.apps.cli", *args]
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        fh.close()
        child = Child(name, proc, log_path, metrics_port)
        self.members.append(child)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
        return child

    def check(self) -> None:
        """Raise :class:`ChildFailed` for the first child that ended unexpectedly (:meth:`Child.failure`)."""
        for c in self.members:
            why = c.failure()
            if why is not None:
                raise ChildFailed(why)

    def stop(self, child: Child, grace_s: float = 30.0) -> None:
        """Stop one child (see :meth:`stop_all`)."""
        self.stop_all(grace_s, [child])

    def stop_all(self, grace_s: float = INTERRUPT_GRACE_S, children: Sequence[Child] | None = None) -> None:
        """Stop ``children`` (default: every child, the last started first) at once: SIGTERM, then
        after ``grace_s`` a second SIGTERM to those still running (stop now), then SIGKILL after
        :data:`KILL_AFTER_S`. Returns when all have exited."""
        group = [c for c in (reversed(self.members) if children is None else children) if c.proc.poll() is None]
        for c in group:
            c.stopped = True
            c.proc.send_signal(signal.SIGTERM)
        late = _wait_all(group, time.monotonic() + grace_s)
        for c in late:
            log.warning("%s did not stop within %.0f s of SIGTERM; asking it to stop at once", c.name, grace_s)
            c.proc.send_signal(signal.SIGTERM)
        for c in _wait_all(late, time.monotonic() + KILL_AFTER_S):
            log.warning("%s still running %.0f s later; killing it (its work in progress is lost)", c.name, KILL_AFTER_S)
            c.proc.kill()
            c.proc.wait(10)

    def scrape(self, child: Child) -> dict[str, float]:
        """Sum of each metric family's samples on a child's /metrics (unlabelled view); {} when it does not answer."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{child.metrics_port}/metrics", timeout=5).read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith("_bucket") or s.name.endswith("_created"):
                    continue
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out
