"""Secrets stay secret and oversized messages are refused clearly (the gaps test_auth_tls.py leaves).

* The bearer token (and a wrong one a client sends) never reaches the server's log, at DEBUG,
  nor ``/metrics``; neither do prompts, problem ids or worker ids.
* A Redis password in the store URL is hidden in log lines, RPC errors and configuration errors.
* Message-size limits on both sides end the call with RESOURCE_EXHAUSTED and a message that
  says so; a lease whose response could not be sent expires and returns its problems.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from pydantic import SecretStr

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import ResourceExhausted, StoreUnavailable, Unauthenticated
from prioreplay.priority_server import open_store
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.store import StoreConfig
from prioreplay.redact import hide_passwords, redact_url
from prioreplay.v1 import priority_service_pb2 as pb
from tests.conftest import REPO, ServerProcess, free_port

TOKEN = "tok-7d41e0b2c9-do-not-log"
WRONG = "wrong-9f8e7d6c5b-do-not-log"
PASSWORD = "pw-3c2b1a0f-do-not-log"
PROMPT = "zebra-quokka prompt text 4711"
WORKER = "worker-id-sesame-77"


def _client(address: str, token: str | None, **kw) -> PriorityClient:
    settings = ClientSettings(server=address, auth_token=SecretStr(token) if token else None, rpc_timeout_s=10, **kw)
    return PriorityClient(settings, max_retries=0)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.mark.timeout(90)
@pytest.mark.slow  # starts server processes
def test_token_prompts_and_ids_stay_out_of_logs_and_metrics():
    metrics_port = free_port()
    srv = ServerProcess(
        "--log-level", "DEBUG", "--stats-interval-s", "0.2", metrics_port=metrics_port, env={"PRIOREPLAY_AUTH_TOKEN": TOKEN}
    )
    try:
        srv.start()
        for token in (None, WRONG, TOKEN + "x"):
            with _client(srv.address, token) as c, pytest.raises(Unauthenticated) as e:
                c.stats()
            assert WRONG not in str(e.value) and TOKEN not in str(e.value)
        with _client(srv.address, TOKEN) as c:
            c.register([pb.Problem(id="secret-problem-id-1", prompt=PROMPT, answer="42")])
            lease = c.sample(1, worker_id=WORKER)
            comps = [pb.Completion(reward=r, token_ids=[5], logprobs=[-0.1], text=PROMPT) for r in (1.0, 0.0)]
            rep = c.report(
                lease.lease_id, [pb.ProblemOutcome(problem_id="secret-problem-id-1", completions=comps)], worker_id=WORKER
            )
            assert rep.accepted
            assert not c.report(lease.lease_id, [], worker_id=WORKER).accepted  # a late report is logged
            deadline = time.monotonic() + 10
            while "prioreplay_problems 1.0" not in (text := _scrape(metrics_port)):
                assert time.monotonic() < deadline, text
                time.sleep(0.1)
        assert 'code="UNAUTHENTICATED"' in text  # the refusals are counted...
        for secret in (TOKEN, WRONG, PROMPT, "secret-problem-id-1", WORKER, "zebra"):
            assert secret not in text, secret  # ...but nothing secret or textual is exported
    finally:
        srv.kill(signal.SIGTERM)
    log = srv.log
    assert "late report" in log and "listening on" in log  # the log did run at DEBUG
    assert TOKEN not in log and WRONG not in log


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{PASSWORD}@127.0.0.1:1/0",
        f"redis://:{PASSWORD}@127.0.0.1:1/0",
        f"redis://127.0.0.1:1/0?password={PASSWORD}",
    ],
)
def test_redact_url_hides_the_password_in_both_helpers(url):
    for redact in (redact_url, hide_passwords):
        shown = redact(url)
        assert PASSWORD not in shown and "127.0.0.1:1" in shown, (redact.__module__, shown)


async def test_unreachable_redis_error_hides_the_password():
    port = free_port()  # nothing listens there
    store = open_store.create_store(f"redis://admin:{PASSWORD}@127.0.0.1:{port}/0", StoreConfig(), namespace="sec")
    try:
        with pytest.raises(StoreUnavailable) as e:
            await store.stats()
        assert f"127.0.0.1:{port}" in str(e.value) and "unreachable" in str(e.value)
        assert PASSWORD not in str(e.value) and PASSWORD not in repr(e.value)
        assert not await store.healthy()
    finally:
        await store.close()


@pytest.mark.timeout(90)
@pytest.mark.slow  # starts server processes
def test_server_process_with_unreachable_redis_hides_the_password():
    dead = free_port()
    metrics_port = free_port()
    srv = ServerProcess(
        "--store",
        f"redis://admin:{PASSWORD}@127.0.0.1:{dead}/0",
        "--log-level",
        "DEBUG",
        "--stats-interval-s",
        "0.2",
        "--reaper-interval-s",
        "0.2",
        metrics_port=metrics_port,
    )
    try:
        srv.start()
        with _client(srv.address, None) as c, pytest.raises(StoreUnavailable) as e:
            c.sample(1)
        assert "unreachable" in str(e.value) and PASSWORD not in str(e.value)
        time.sleep(0.5)  # a few failing reaper / health rounds get logged
        text = _scrape(metrics_port)
        assert "prioreplay_store_healthy 0.0" in text and PASSWORD not in text
        assert srv.proc.poll() is None  # the server keeps running without its store
    finally:
        srv.kill(signal.SIGTERM)
    assert "admin:***@" in srv.log or "***@" in srv.log  # the store line is logged, redacted
    assert PASSWORD not in srv.log


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prioreplay.apps.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(120)
@pytest.mark.slow  # starts server processes
def test_configuration_errors_do_not_echo_secrets(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    cases = [
        # a malformed Redis URL holding a password
        (["server", "--store", f"redis//:{PASSWORD}@127.0.0.1:6379/0"], {}),
        (["server", "--store", f"redis://:{PASSWORD}@127.0.0.1:6379/0 x"], {}),
        # a cross-field error: pydantic's input is every field, the token included
        (["server", "--auth-token-file", str(token_file), "--port", "0"], {"PRIOREPLAY_AUTH_TOKEN": PASSWORD}),
    ]
    for args, env in cases:
        r = _cli(*args, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert "invalid configuration" in r.stderr, r.stderr
        assert PASSWORD not in r.stderr + r.stdout, r.stderr


# -- message-size limits ---------------------------------------------------------------------
def _server(max_message_mb: int, **kw) -> BackgroundServer:
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, max_message_mb=max_message_mb, reaper_interval_s=0.1, **kw)
    return BackgroundServer(lambda: open_store.create_store("memory", cfg.to_store_config()), cfg)


def _big_problems(n: int) -> list[pb.Problem]:
    return [pb.Problem(id=f"big{i}", prompt="x" * 300_000, answer="1") for i in range(n)]


@pytest.mark.timeout(60)
def test_client_send_limit_is_resource_exhausted_and_changes_nothing():
    with _server(8) as srv, _client(srv.address, None, max_message_mb=1) as c:
        c.register([pb.Problem(id="a", prompt="p", answer="1")])
        lease = c.sample(1)
        big = pb.Completion(reward=1.0, token_ids=[1] * (1 << 19), logprobs=[-1.0] * (1 << 19))
        before = srv.call(srv.store.dump())
        with pytest.raises(ResourceExhausted, match="larger than max"):
            c.report(lease.lease_id, [pb.ProblemOutcome(problem_id="a", completions=[big])])
        assert srv.call(srv.store.dump()) == before
        with pytest.raises(ResourceExhausted, match="larger than max"):
            c.register([pb.Problem(id="b", prompt="y" * (2 << 20), answer="1")])
        assert srv.call(srv.store.stats()).problems == 1


@pytest.mark.timeout(60)
def test_client_receive_limit_is_resource_exhausted():
    with _server(8) as srv, _client(srv.address, None, max_message_mb=1) as c:
        c.register(_big_problems(6), chunk_size=1)  # each chunk fits; a batch of six does not
        with pytest.raises(ResourceExhausted, match="larger than max"):
            c.sample(6, lease_timeout_s=0.5)


@pytest.mark.timeout(60)
def test_server_send_limit_is_resource_exhausted_and_the_lease_expires():
    with _server(1) as srv, _client(srv.address, None, max_message_mb=8) as c:
        c.register(_big_problems(6), chunk_size=1)
        with pytest.raises(ResourceExhausted, match="larger than max"):
            c.sample(6, lease_timeout_s=0.5)
        # the server leased the batch before the response failed: nobody holds it, so it expires
        deadline = time.monotonic() + 10
        while (s := srv.call(srv.store.stats())).heap_size != 6:
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
        assert (s.leased, s.lease_expiries, s.completions_reported) == (0, 1, 0)
        with grpc.insecure_channel(srv.address) as ch:  # a small request still works
            assert (
                pb.GetStatsResponse.FromString(ch.unary_unary("/prioreplay.v1.PriorityService/GetStats")(b"", timeout=5)).problems
                == 6
            )
