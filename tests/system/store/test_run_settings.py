"""A server started on a namespace made with other run settings (sampler, decay, prior, bands)
is refused, naming each change and ``--accept-setting-changes``; a server started while Redis is
down checks them before the first RPC Redis answers (store.py docstring, "Run settings")."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile

import grpc
import pytest

from prioreplay.errors import FailedPrecondition
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.server import create_server, stop_server
from prioreplay.priority_server.store import run_settings
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port, start_redis_server


def _config(**kw) -> ServerConfig:
    return ServerConfig(metrics_port=0, snapshot_interval_s=0, **kw)


async def _start(url: str, namespace: str, cfg: ServerConfig):
    store = create_store(url, cfg.to_store_config(), namespace=namespace)
    try:
        server, port = await create_server("127.0.0.1:0", store, cfg)
    except BaseException:
        await store.close()
        raise
    return store, server, port


async def _stop(store, server) -> None:
    await stop_server(server)
    await store.close()


def test_a_restart_with_other_settings_is_refused_unless_accepted(redis_url, namespace):
    async def run() -> None:
        await _stop(*(await _start(redis_url, namespace, _config(decay=0.5, sampler="heap")))[:2])
        await _stop(*(await _start(redis_url, namespace, _config(decay=0.5, sampler="heap")))[:2])  # same: fine
        with pytest.raises(FailedPrecondition) as err:
            await _start(redis_url, namespace, _config(decay=1.0, sampler="uniform", unsolved_at=0.125))
        msg = str(err.value)
        assert "decay 0.5 -> 1.0" in msg and "sampler 'heap' -> 'uniform'" in msg and "unsolved_at 0.0 -> 0.125" in msg
        assert "--accept-setting-changes" in msg
        changed = _config(decay=1.0, sampler="uniform", unsolved_at=0.125, accept_setting_changes=True)
        await _stop(*(await _start(redis_url, namespace, changed))[:2])
        await _stop(*(await _start(redis_url, namespace, _config(decay=1.0, sampler="uniform", unsolved_at=0.125)))[:2])

    asyncio.run(run())


def test_a_server_started_before_redis_checks_the_settings_before_serving():
    async def run(url: str, proc_box: list, workdir: str, port: int) -> None:
        store, server, grpc_port = await _start(url, "late", _config(decay=0.5))  # Redis is not up: deferred
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                stub = pb_grpc.PriorityServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.GetStats(pb.GetStatsRequest(), timeout=20)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                proc_box.append(start_redis_server(port, workdir))
                import redis

                other = run_settings(_config(decay=1.0).to_store_config())
                redis.Redis.from_url(url).set("prioreplay:{late}:settings", json.dumps(other))
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=20)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "decay 1.0 -> 0.5" in e.value.details()
        finally:
            await _stop(store, server)

    port, workdir, procs = free_port(), tempfile.mkdtemp(prefix="prioreplay-redis-"), []
    try:
        asyncio.run(run(f"redis://127.0.0.1:{port}/0", procs, workdir, port))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
