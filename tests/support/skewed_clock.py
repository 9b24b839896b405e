"""Run the ``prioreplay`` command line as on a host whose wall clock is off by some seconds.

``python -m tests.support.skewed_clock SECONDS server --port ...`` shifts ``time.time`` and
``time.time_ns`` by ``SECONDS`` before anything of prioreplay is imported (so default arguments
such as ``clock=time.time`` bind the shifted one), then runs ``prioreplay.apps.cli`` with the
remaining arguments. Monotonic clocks are left alone, as on a real host with a skewed wall clock.
One process only: processes it spawns (``--processes N``) read the true clock.
"""

from __future__ import annotations

import runpy
import sys
import time


def skew_wall_clock(seconds: float) -> None:
    """Shift ``time.time`` and ``time.time_ns`` of this process by ``seconds``."""
    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + int(seconds * 1e9)  # type: ignore[assignment]


if __name__ == "__main__":
    skew_wall_clock(float(sys.argv[1]))
    sys.argv = ["prioreplay", *sys.argv[2:]]
    runpy.run_module("prioreplay.apps.cli", run_name="__main__", alter_sys=True)
