"""Process plumbing shared by the commands: logging set-up and the stop signals.

Standard library only, so every command can use it without importing anything heavy.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable

#: The log line of every prioreplay process.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int) -> None:
    """Log to stderr at ``level`` (a name such as ``INFO``, or a number) in :data:`LOG_FORMAT`."""
    if isinstance(level, str):
        level = getattr(logging, level.upper())
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)


def on_stop_signal(request_stop: Callable[[int], None]) -> None:
    """Stop in two stages on SIGTERM/SIGINT: the first signal calls ``request_stop(signum)`` (finish
    the work in progress, then exit cleanly), a second raises :class:`KeyboardInterrupt` (stop now).

    Installs the handlers only in the main thread (Python delivers signals there); elsewhere,
    e.g. a process embedding a worker in a thread, it does nothing.
    """
    asked = threading.Event()

    def handler(signum, _frame) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()
        request_stop(signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
