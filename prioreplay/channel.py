"""gRPC channel plumbing every role shares: message limits, load balancing, RPC timing, a free port.

The server (``create_server``) and the client (:class:`prioreplay.client.PriorityClient`) take
their message limits from :func:`channel_options`; the worker and the learner time their RPCs
with :func:`timed_call`; tests, benchmarks and the demo pick ports with :func:`free_port`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Target schemes whose addresses the client spreads RPCs over (gRPC's round_robin policy).
BALANCED_SCHEMES = ("dns:", "ipv4:", "ipv6:")
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    """gRPC channel/server options with explicit send/receive limits (``max_message_mb`` MiB → bytes)."""
    n = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", n), ("grpc.max_receive_message_length", n)]


def client_channel_options(target: str, max_message_mb: int) -> list[tuple[str, int | str]]:
    """Channel options of a client of ``target``: the message limits, and for a target with a
    resolver scheme (``dns:///priority-server:50051``, ``ipv4:10.0.0.1:50051,10.0.0.2:50051``)
    gRPC's ``round_robin`` policy, which keeps a connection to every address the name resolves to
    (e.g. each replica of ``docker compose --scale priority-server=N``) and spreads RPCs over them.
    A plain ``HOST:PORT`` keeps gRPC's default (one connection to the first address that answers).
    """
    opts: list[tuple[str, int | str]] = list(channel_options(max_message_mb))
    if target.startswith(BALANCED_SCHEMES):
        opts.append(("grpc.service_config", _ROUND_ROBIN))
    return opts


def timed_call(observe: Callable[[str, float], None], method: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``, then ``observe(method, seconds)`` with its wall time, also when it raises.

    The worker and the learner time their RPCs with it (retries and backoff included).
    """
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        observe(method, time.perf_counter() - t0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bound to port 0, then released).

    Another process may take it before the caller binds it; callers that cannot retry should let
    the server bind port 0 and report its port instead.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


__all__ = ["BALANCED_SCHEMES", "channel_options", "client_channel_options", "timed_call", "free_port"]
