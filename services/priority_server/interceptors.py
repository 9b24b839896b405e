"""The priority server's interceptors: bearer-token authentication and per-RPC metrics."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable

import grpc

from prioreplay.errors import InvalidArgument

from .metrics import ServerMetrics
from .servicer import SERVICE_NAME

HEALTH_PREFIX = "/grpc.health.v1.Health/"
_SERVICE_PREFIX = f"/{SERVICE_NAME}/"
UNAUTHENTICATED_DETAILS = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"


def _rewrap(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same kind and serializers as ``handler`` running ``behavior``."""
    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, **kw)
    return grpc.unary_unary_rpc_method_handler(behavior, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires metadata ``authorization: Bearer <token>`` on every RPC except ``grpc.health.v1``.

    The header is compared with :func:`hmac.compare_digest` (constant time); a missing or wrong
    one ends the RPC with UNAUTHENTICATED before the servicer runs. The token is never logged.

    Args:
        token: the shared secret (non-empty).

    Raises:
        InvalidArgument: ``token`` is empty.
    """

    def __init__(self, token: str):
        if not token:
            raise InvalidArgument("auth token is empty; give a non-empty token or disable auth")
        self._expected = f"Bearer {token}".encode()

    def _authorized(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value if isinstance(value, bytes) else value.encode("utf-8")
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(HEALTH_PREFIX):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details.invocation_metadata):
            return handler

        async def deny(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)

        return _rewrap(handler, deny)


def _code_name(context) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - older grpc: no code() on aio contexts
        code = None
    if code is None:
        return "UNKNOWN"
    if isinstance(code, grpc.StatusCode):
        return code.name
    for c in grpc.StatusCode:  # an int from cygrpc
        if c.value[0] == code:
            return c.name
    return "UNKNOWN"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every unary-response RPC of ``PriorityService`` and counts its non-OK status codes.

    Only the service's own method names become label values (bounded cardinality).
    """

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        name = handler_call_details.method
        if handler is None or not name.startswith(_SERVICE_PREFIX) or handler.response_streaming:
            return handler
        method = name[len(_SERVICE_PREFIX) :]
        inner = handler.stream_unary if handler.request_streaming else handler.unary_unary
        metrics = self.metrics

        async def timed(request_or_iterator, context):
            t0 = time.perf_counter()
            code = "OK"
            try:
                result = await inner(request_or_iterator, context)
                code = _code_name(context) if context.code() is not None else "OK"
                return result
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code_name(context)
                raise
            finally:
                metrics.observe_rpc(method, time.perf_counter() - t0, code)

        return _rewrap(handler, timed)
