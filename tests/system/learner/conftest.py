"""Shared by the learner's system tests: an in-process priority server (memory store) on its own
event loop thread, a client of it, and the tiny random model (written once per module)."""

from __future__ import annotations

import asyncio
import threading

import pytest


# --- an in-process server on its own event loop thread -------------------------------------------
class ServerThread:
    """A priority server (memory store) on 127.0.0.1:<ephemeral> served from a background loop."""

    def __init__(self):
        from prioreplay.priority_server.config import ServerConfig
        from prioreplay.priority_server.open_store import create_store
        from prioreplay.priority_server.server import create_server
        from prioreplay.priority_server.store import StoreConfig

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store = create_store("memory", StoreConfig(retest_fraction=0.0))
        cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0)
        self.server, port = self._run(create_server("127.0.0.1:0", self.store, cfg))
        self.address = f"127.0.0.1:{port}"

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self):
        from prioreplay.priority_server.server import stop_server

        self._run(stop_server(self.server))
        self._run(self.store.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def server():
    s = ServerThread()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from prioreplay.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=1)


@pytest.fixture
def client(server):
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    c = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    yield c
    c.close()
