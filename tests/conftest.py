"""Shared fixtures: a real Redis (never skipped), fresh namespaces, the GSM8K data path.

Redis: ``PRIOREPLAY_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). When nothing answers
there, a throwaway ``redis-server`` is started on a free port for the session; when the binary
is missing too, the run stops with instructions instead of skipping the Redis tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis_server(port: int, workdir: str, appendonly: bool = False) -> subprocess.Popen:
    """Start a test-owned ``redis-server`` on ``port`` and wait until it answers."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.exit("redis-server not found: install it (Debian: apt-get install redis-server) "
                    "or set PRIOREPLAY_TEST_REDIS_URL to a running Redis", returncode=3)
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir,
            "--appendonly", "yes" if appendonly else "no", "--appendfsync", "always"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if _redis_answers(url):
            return proc
        time.sleep(0.05)
    proc.kill()
    pytest.exit(f"redis-server on port {port} did not start", returncode=3)


@pytest.fixture(scope="session")
def redis_url():
    """URL of a Redis for the tests (the configured one, or a throwaway server)."""
    url = os.environ.get("PRIOREPLAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if _redis_answers(url):
        yield url
        return
    workdir = tempfile.mkdtemp(prefix="prioreplay-redis-")
    port = free_port()
    proc = start_redis_server(port, workdir)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def namespace(redis_url):
    """A fresh run namespace; every key under it is deleted after the test."""
    import redis

    ns = f"test-{uuid.uuid4().hex[:12]}"
    yield ns
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(match=f"*{{{ns}}}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The shared GSM8K folder (read-only)."""
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.fail(f"GSM8K data not found at {GSM8K_DIR}; the tests read it from ../shared/data/gsm8k")
    return GSM8K_DIR
