"""Test helpers of the priority server: a server on its own event loop, for blocking callers.

Tests and benchmarks use :class:`BackgroundServer` with the blocking
:class:`prioreplay.client.PriorityClient`, which would deadlock on the server's own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import grpc

from .config import ServerConfig
from .runtime import SHUTDOWN_STEP_S, ServerRuntime, bounded
from .server import create_server, runtime_of, stop_server
from .store import Store


class BackgroundServer:
    """A priority server on its own event loop in a daemon thread, for blocking callers.

    Args:
        store_factory: builds the store; called on the server's loop (a Redis client binds to
            the loop that first uses it).
        config: server configuration (default: :class:`ServerConfig` defaults).
        address: where to listen (default: an ephemeral port on 127.0.0.1).

    Attributes (after :meth:`start`):
        port: the bound port; address: ``127.0.0.1:<port>`` for clients; store; server.

    Example::

        with BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
            client = PriorityClient(ClientSettings(server=srv.address))
    """

    def __init__(self, store_factory: Callable[[], Store], config: ServerConfig | None = None, address: str = "127.0.0.1:0"):
        self._factory = store_factory
        self._config = config
        self._bind_address = address
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.store: Store | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` for a client (the bind host, 127.0.0.1 for a wildcard)."""
        host = self._bind_address.rpartition(":")[0]
        if host in ("", "0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        """Start the loop thread, build the store and the server. Raises what create_server raises."""
        self._loop = loop = asyncio.new_event_loop()
        self._thread = thread = threading.Thread(target=loop.run_forever, name="prioreplay-server", daemon=True)
        thread.start()

        async def up():
            self.store = self._factory()
            try:
                self.server, self.port = await create_server(self._bind_address, self.store, self._config)
            except BaseException:
                await self.store.close()
                raise

        try:
            self.call(up(), timeout_s)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def call(self, coro, timeout_s: float | None = 60.0):
        """Run a coroutine on the server's loop and return its result (e.g. ``srv.call(srv.store.dump())``)."""
        if self._loop is None:
            raise RuntimeError("the background server is not started: call start() (or use it as a context manager)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def runtime(self) -> ServerRuntime:
        """The server's :class:`ServerRuntime` (metrics, health)."""
        if self.server is None:
            raise RuntimeError("the background server is not started: call start() first")
        return runtime_of(self.server)

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the server, close the store (memory: writes its snapshot), end the thread. Idempotent."""
        if self._loop is None:
            return

        async def down():
            if self.server is not None:
                await stop_server(self.server, grace_s)
            if self.store is not None:
                await bounded(self.store.close(), SHUTDOWN_STEP_S, "store close")

        try:
            self.call(down(), grace_s + 5 * SHUTDOWN_STEP_S)  # every step inside is bounded
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
