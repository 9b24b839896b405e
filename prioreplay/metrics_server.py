"""The HTTP endpoint of a rollout worker or a learner: ``/metrics`` and ``/ready`` on one port.

``/metrics`` answers from the start (Prometheus exposition of the role's registry), so a scrape
and a liveness check see the process while its model loads. ``/ready`` answers ``200 ready`` only
once the process can do its work (:class:`Readiness`, set by the role: a worker once its model is
loaded or converted and it can lease, a learner once its model is loaded and it has resumed), and
``503`` with what it waits for until then. Compose healthchecks and Kubernetes readiness probes
ask ``/ready``; liveness probes keep asking ``/metrics`` (a loading model is alive, not ready).

The server is prometheus_client's own WSGI server (threaded, silent) with one more route.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

#: The path that answers 200 once the process is ready, 503 before.
READY_PATH = "/ready"


class Readiness:
    """Whether a process can do its work yet; thread-safe (set by the role, read by HTTP threads).

    Args:
        waiting_for: what the process waits for until :meth:`set` (e.g. ``"the model to load"``),
            quoted by ``/ready``'s 503 answer.
    """

    def __init__(self, waiting_for: str):
        self._lock = threading.Lock()
        self._ready = False
        self._waiting_for = waiting_for

    def set(self) -> None:
        """The process can do its work: ``/ready`` answers 200 from now on."""
        with self._lock:
            self._ready = True

    def clear(self, waiting_for: str) -> None:
        """The process cannot do its work until ``waiting_for`` (``/ready`` answers 503 quoting it)."""
        with self._lock:
            self._ready, self._waiting_for = False, waiting_for

    def state(self) -> tuple[bool, str]:
        """(ready, what it waits for when not ready)."""
        with self._lock:
            return self._ready, self._waiting_for


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Log nothing (a scrape every few seconds would fill the log)."""


def metrics_app(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``/ready`` from ``readiness``, every other path prometheus_client's exposition."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").rstrip("/") != READY_PATH:
            return metrics(environ, start_response)
        ready, waiting_for = readiness.state()
        status, body = ("200 OK", "ready\n") if ready else ("503 Service Unavailable", f"not ready: waiting for {waiting_for}\n")
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body.encode()]

    return app


def serve_metrics(
    registry: CollectorRegistry, readiness: Readiness, port: int, addr: str = "0.0.0.0"
) -> ThreadingWSGIServer | None:
    """Serve ``/metrics`` and ``/ready`` on ``addr:port`` from a daemon thread.

    Returns:
        The server (``shutdown()``, ``server_close()``, ``server_address``), or None when
        ``port`` is 0 (not served).

    Raises:
        OSError: the port is taken or the address cannot be bound (the caller names the setting).
    """
    if port == 0:
        return None
    httpd = make_server(addr, port, metrics_app(registry, readiness), ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name=f"metrics-{port}", daemon=True).start()
    return httpd
