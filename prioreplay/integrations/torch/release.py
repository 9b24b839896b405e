"""Leases returned when the process ends: at interpreter exit and on SIGTERM / SIGHUP.

Every :class:`~prioreplay.integrations.torch.PrioritySampler` is tracked here from its
construction (:func:`release_on_exit`); the process's end closes every live one, which reports
its groups and returns its leases instead of locking its problems until the lease timeout.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prioreplay.integrations.torch.sampler import PrioritySampler

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[PrioritySampler] = weakref.WeakSet()
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_RELEASE_SIGNALS = ("SIGTERM", "SIGHUP")
EXIT_RETRIES = 1  # attempts after the first when returning leases at exit or on a signal


def release_all() -> None:
    """Close every live sampler of this process (returns their leases); errors are logged.

    The process is ending, so each return gets one retry, not the client's whole back-off: against
    a server that is already gone, eight retries cost about a minute per sampler at exit (the
    lease then expires on the server within its short, renewed timeout anyway).
    """
    for sampler in list(_LIVE):
        client = getattr(sampler, "client", None)
        if client is not None and getattr(client, "max_retries", 0) > EXIT_RETRIES:
            client.max_retries = EXIT_RETRIES
        try:
            sampler.close()
        except Exception as e:  # noqa: BLE001 - at exit: the leases then expire on the server
            log.warning("prioreplay: could not return the leases of %s (%s); they expire on the server", sampler.worker_id, e)


def on_signal(signum: int, frame) -> None:
    """Return every live sampler's leases, then do what the signal did before (default: exit 128 + signum)."""
    log.warning("prioreplay: signal %d: returning the leases of %d sampler(s)", signum, len(_LIVE))
    release_all()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    raise SystemExit(128 + signum)


atexit.register(release_all)


def release_on_exit(sampler: PrioritySampler) -> None:
    """Track ``sampler``; the first time, hook interpreter exit and (from the main thread) SIGTERM/SIGHUP.

    A signal left ignored (``SIG_IGN``) stays ignored. SIGINT needs no handler: Python raises
    KeyboardInterrupt, and the ``with`` block, TRL's ``train`` or the exit hook returns the leases.
    """
    _LIVE.add(sampler)
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _RELEASE_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None or sig in _PREVIOUS_HANDLERS:
            continue
        previous = signal.getsignal(sig)
        _PREVIOUS_HANDLERS[sig] = previous
        if previous is not signal.SIG_IGN:
            signal.signal(sig, on_signal)


def forget(sampler: PrioritySampler) -> None:
    """Stop tracking ``sampler`` (it closed: nothing of it is left to return)."""
    _LIVE.discard(sampler)
