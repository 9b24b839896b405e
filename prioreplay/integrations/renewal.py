"""Keeping a trainer integration's leases alive: a short lease, renewed from a background thread.

A trainer integration takes short leases (``DEFAULT_LEASE_TIMEOUT_S``, 60 s) and a
:class:`LeaseRenewer` renews every lease it still holds each third of that timeout
(``RenewLease``), so a training step slower than the lease keeps its problems, while a process that
dies without returning its leases (SIGKILL, a lost machine) stops renewing and its problems come
back to the server within one short timeout instead of the server's default (600 s).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from prioreplay.client import PriorityClient
from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound, PrioreplayError

log = logging.getLogger(__name__)

#: Lease length a trainer integration asks for, seconds (renewed every third of it while held).
DEFAULT_LEASE_TIMEOUT_S = 60.0
#: Renewals per lease timeout: at a third, two renewals may fail (a slow RPC, a server restart)
#: before the lease expires.
RENEWALS_PER_TIMEOUT = 3


def check_lease_timeout(lease_timeout_s: float) -> float:
    """``lease_timeout_s`` as a float, seconds (0: the server's default).

    Raises:
        InvalidArgument: not a finite number >= 0 (the message names the value and the default).
    """
    if not (isinstance(lease_timeout_s, (int, float)) and math.isfinite(lease_timeout_s) and lease_timeout_s >= 0):
        raise InvalidArgument(
            f"lease_timeout_s ({lease_timeout_s!r}) must be a finite number of seconds >= 0 "
            f"(0: the server's default; the integrations' default is {DEFAULT_LEASE_TIMEOUT_S:g})"
        )
    return float(lease_timeout_s)


class LeaseRenewer:
    """Renews the leases ``held()`` names from a daemon thread, every ``timeout / 3`` seconds.

    Args:
        client: the holder's client (gRPC channels are thread-safe).
        worker_id: the worker_id the leases were sampled with (the server renews only the holder's).
        lease_timeout_s: the length each renewal asks for, seconds (0: the server's default; the
            period is then a third of the first lease's length as the server granted it).
        held: returns the ids of the leases still held (called from the thread; must be thread-safe).
        client_source: a ``pb.ClientSource`` value, sent with every renewal.

    A renewal the server refuses with NOT_FOUND (the lease expired or was reported meanwhile) or
    FAILED_PRECONDITION (another worker_id sampled it: a lease restored from another process's
    checkpoint) is logged once as lost when the lease is still held, and not asked again; other errors
    (the server unreachable once the client's retries are spent) are logged and retried at the next
    round. :meth:`stop` ends the thread; a forked child never runs its parent's thread.
    """

    def __init__(
        self,
        client: PriorityClient,
        worker_id: str,
        lease_timeout_s: float,
        held: Callable[[], list[str]],
        client_source: int = 0,
    ):
        self.client, self.worker_id, self.held = client, worker_id, held
        self.lease_timeout_s = check_lease_timeout(lease_timeout_s)
        self.client_source = client_source
        self.period_s: float | None = None
        self.renewed = 0  # renewals the server accepted
        self.lost: set[str] = set()  # leases the server no longer had when renewed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, granted_s: float) -> None:
        """Start the thread (once): ``granted_s`` is the first lease's length as granted, seconds."""
        if self._thread is not None or self._stop.is_set():
            return
        timeout = self.lease_timeout_s or granted_s
        self.period_s = max(0.05, timeout / RENEWALS_PER_TIMEOUT)
        self._thread = threading.Thread(target=self._run, name=f"prioreplay-renew-{self.worker_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.period_s is not None  # set by start
        while not self._stop.wait(self.period_s):
            self.renew_now()

    def renew_now(self) -> int:
        """Renew every held lease once. Returns how many the server renewed."""
        n = 0
        for lease_id in self.held():
            if self._stop.is_set():
                break
            if lease_id in self.lost:
                continue
            try:
                self.client.renew(
                    lease_id, worker_id=self.worker_id, lease_timeout_s=self.lease_timeout_s, client_source=self.client_source
                )
                n += 1
            except (NotFound, FailedPrecondition) as e:  # gone, or sampled by another worker_id
                if lease_id in self.held() and lease_id not in self.lost:  # else: reported meanwhile
                    self.lost.add(lease_id)
                    log.warning("prioreplay: lease %s could not be renewed (%s); its report will be refused", lease_id, e)
            except PrioreplayError as e:
                log.warning("prioreplay: renewing lease %s failed (%s); retried in %.1f s", lease_id, e, self.period_s or 0.0)
            except ValueError as e:  # grpc: "Cannot invoke RPC on closed channel!": the client was closed
                log.info("prioreplay: lease renewals end: the client is closed (%s)", e)
                self._stop.set()
                break
        self.renewed += n
        return n

    def stop(self, wait_s: float = 0.0) -> None:
        """End the thread: no renewal starts after this call. Waits up to ``wait_s`` seconds for a
        renewal in flight (default: none; one that lands after the lease was reported is refused
        as already reported, harmlessly, and a daemon thread never holds up the process's exit)."""
        self._stop.set()
        thread = self._thread
        if wait_s > 0 and thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=wait_s)


__all__ = ["DEFAULT_LEASE_TIMEOUT_S", "LeaseRenewer", "check_lease_timeout"]
