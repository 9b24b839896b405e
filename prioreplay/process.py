"""Process plumbing shared by the commands: logging set-up and the stop signals.

Standard library only, so every command can use it without importing anything heavy.
"""

from __future__ import annotations

import _thread
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


#: The first stop signal that arrived before the command installed its handler (:func:`hold_stop_signals`).
_held: list[int] = []


def hold_stop_signals() -> None:
    """Remember a SIGTERM/SIGINT that arrives before the command installs its own stop handler
    (:func:`on_stop_signal`, which then acts on it at once); a second one raises
    :class:`KeyboardInterrupt`. Called first thing by the commands that load a model before they
    can stop cleanly: without it a SIGTERM during the imports and the model load killed the
    process with the default action (exit −15), and a supervisor that had asked for a clean stop
    saw a crash. Main thread only (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def held(signum, _frame) -> None:
        if _held:
            raise KeyboardInterrupt
        _held.append(signum)

    signal.signal(signal.SIGTERM, held)
    signal.signal(signal.SIGINT, held)


def on_stop_signal(
    request_stop: Callable[[int], None], grace_s: float | None = None, what: str = "the work in progress"
) -> Callable[[], None]:
    """Stop in two stages on SIGTERM/SIGINT: the first signal calls ``request_stop(signum)`` (finish
    the work in progress, then exit cleanly), a second raises :class:`KeyboardInterrupt` (stop now).

    With ``grace_s``, the second stage also comes by itself ``grace_s`` seconds after the first
    signal (a warning names ``what`` was abandoned), so a stop asked for ends within a bounded time
    however long the work in progress would take; the caller catches the ``KeyboardInterrupt``.
    A signal held since :func:`hold_stop_signals` is acted on at once. Returns a function that
    cancels the grace timer (call it once the work has stopped, before cleaning up).

    Installs the handlers only in the main thread (Python delivers signals there); elsewhere,
    e.g. a process embedding a worker in a thread, it does nothing.
    """
    asked = threading.Event()
    timers: list[threading.Timer] = []

    def give_up() -> None:
        logging.getLogger("prioreplay.process").warning(
            "%s did not finish within %.0f s of the stop signal; stopping without it", what, grace_s
        )
        _thread.interrupt_main()  # runs handler() below in the main thread: the second stage

    def handler(signum, _frame) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()
        if grace_s is not None:
            timer = threading.Timer(grace_s, give_up)
            timer.daemon = True  # never keeps a process alive that finished in time
            timers.append(timer)
            timer.start()
        request_stop(signum)

    def cancel() -> None:
        for t in timers:
            t.cancel()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        if _held:
            handler(_held.pop(), None)
    return cancel
