"""Shared fixtures: a real Redis (never skipped), fresh namespaces, the GSM8K data path.

Layout: ``tests/unit/`` holds pure tests (no processes, servers, Redis or models: seconds),
``tests/system/`` everything that starts servers, processes, Redis or a model, each with one
folder per part of the code (``store/``, ``server/``, ``learner/``, ...); helpers shared by both
live in ``tests/support/``. Each test gets the ``unit`` or ``system`` marker from its top folder,
however deep it sits (``pytest -m unit``).

Redis: ``PRIOREPLAY_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). When nothing answers
there, a throwaway ``redis-server`` is started on a free port for the session; when the binary
is missing too, the run stops with instructions instead of skipping the Redis tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from prioreplay.channel import free_port  # noqa: F401 - the tests import it from here

REPO = Path(__file__).resolve().parent.parent
#: GSM8K's folder (``train.jsonl``, ``test.jsonl``): ``PRIOREPLAY_GSM8K_DIR``, else ``data/gsm8k`` in the
#: repository (ignored by git: put or link the files there).
GSM8K_DIR = Path(os.environ.get("PRIOREPLAY_GSM8K_DIR") or REPO / "data" / "gsm8k")


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def self_signed(workdir: Path, key: str, cert: str, subject: str, *extra: str) -> None:
    """Write a self-signed EC P-256 certificate ``cert`` and its key ``key`` (valid 1 day) in
    ``workdir`` with the ``openssl`` command line; ``extra``: more ``openssl req`` arguments
    (e.g. ``-addext``). Fails the test, naming the package, when openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates (apt-get install openssl)")
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
    args += ["-keyout", key, "-out", cert, "-subj", subject, *extra]
    subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True, timeout=60)


def start_redis_server(port: int, workdir: str, appendonly: bool = False, *extra: str) -> subprocess.Popen:
    """Start a test-owned ``redis-server`` on ``port`` (``extra``: more flags, e.g. ``--replicaof``)
    and wait until it answers."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.exit(
            "redis-server not found: install it (Debian: apt-get install redis-server) "
            "or set PRIOREPLAY_TEST_REDIS_URL to a running Redis",
            returncode=3,
        )
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        workdir,
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "always",
        *extra,
    ]
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
    ns = f"test-{uuid.uuid4().hex[:12]}"
    yield ns
    drop_namespace(redis_url, ns)


def drop_namespace(redis_url: str, ns: str) -> None:
    """Delete every Redis key of the run namespace ``ns`` (keys are hash-tagged ``{ns}``)."""
    import redis

    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(match=f"*{{{ns}}}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """GSM8K's folder (read-only): ``PRIOREPLAY_GSM8K_DIR`` or ``data/gsm8k`` in the repository."""
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.fail(
            f"GSM8K data not found at {GSM8K_DIR}: set PRIOREPLAY_GSM8K_DIR to the folder holding GSM8K's "
            "train.jsonl and test.jsonl, or put (or link) them in data/gsm8k"
        )
    return GSM8K_DIR


async def _store_maker(kind: str, redis_url: str | None = None, namespace: str | None = None):
    """Yield ``make(config=None, clock=None, **kw) -> Store`` of one kind; close every store after."""
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig

    made = []

    def make(config=None, clock=None, **kw):
        spec = "memory" if kind == "memory" else redis_url
        if kind == "redis":
            kw.setdefault("namespace", namespace)
        store = create_store(spec, config or StoreConfig(), clock=clock, **kw)  # None: Redis's own clock
        made.append(store)
        return store

    make.kind = kind
    yield make
    for store in made:
        await store.close()


@pytest.fixture(params=["memory", "redis"])
async def store_factory(request, redis_url, namespace):
    """``make(config=None, clock=None, **kw) -> Store`` for each store kind (``make.kind``).

    ``memory``: ``create_store("memory", ...)`` (kw e.g. ``snapshot_path``); ``redis``:
    ``create_store(redis_url, ..., namespace=namespace)``, so stores made in one test share the
    test's fresh namespace (a "restart" sees the same state). Every store made is closed after
    the test.
    """
    async for make in _store_maker(request.param, redis_url, namespace):
        yield make


@pytest.fixture
async def memory_store_factory():
    """As ``store_factory``, the memory store only (no Redis: for tests/unit)."""
    async for make in _store_maker("memory"):
        yield make


@pytest.fixture
async def redis_store_factory(redis_url, namespace):
    """As ``store_factory``, the Redis store only."""
    async for make in _store_maker("redis", redis_url, namespace):
        yield make


def pytest_collection_modifyitems(config, items):
    """Mark every test with the folder it lives in: ``unit`` or ``system``."""
    for item in items:
        parts = item.path.relative_to(REPO / "tests").parts
        if len(parts) > 1 and parts[0] in ("unit", "system"):  # tests/unit/samplers/... is unit too
            item.add_marker(parts[0])


@contextlib.contextmanager
def server_in_namespace(kind: str, redis_url: str, prefix: str, config=None):
    """A background server (``kind``: memory or redis) in a fresh namespace ``<prefix>-<random>``;
    on exit it stops, and a Redis namespace is dropped."""
    ns = f"{prefix}-{uuid.uuid4().hex[:10]}"
    s = start_background_server(kind, redis_url, ns, config)
    try:
        yield s
    finally:
        s.stop()
        if kind == "redis":
            drop_namespace(redis_url, ns)


def start_background_server(kind: str, redis_url: str, namespace: str, config=None, store_config=None):
    """A started ``BackgroundServer`` over the ``memory`` store or the test Redis (keys under
    ``namespace``); ``store_config`` defaults to ``config.to_store_config()``. Stop it after."""
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.open_store import create_store

    store_config = store_config or config.to_store_config()
    spec = "memory" if kind == "memory" else redis_url
    return BackgroundServer(lambda: create_store(spec, store_config, namespace=namespace), config).start()


@pytest.fixture(params=["memory", "redis"])
def server(request, redis_url, namespace):
    """A running ``BackgroundServer`` over each store (Redis under a fresh namespace), configured
    by the test module's ``server_config()``; stopped after the test."""
    srv = start_background_server(request.param, redis_url, namespace, request.module.server_config())
    yield srv
    srv.stop()


# -- reliability tests: real server processes and the --soak-seconds option ----------------------
def pytest_addoption(parser):
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=15.0,
        help="duration of each soak test in tests/system/faults/test_soak.py, seconds (default 15)",
    )


@pytest.fixture
def soak_seconds(request) -> float:
    """The ``--soak-seconds`` option (default 15 s)."""
    return float(request.config.getoption("--soak-seconds"))


class ServerProcess:
    """A ``prioreplay server`` subprocess for fault tests; stderr is collected in :attr:`log`.

    ``args`` are extra CLI flags; ``port`` 0 picks a free port once, so :meth:`restart` binds the
    same one; ``clock_skew_s``: its wall clock runs that many seconds off (``tests/support/skewed_clock.py``).
    Always :meth:`kill` it in a ``finally`` block.
    """

    def __init__(self, *args: str, port: int = 0, metrics_port: int = 0, env: dict | None = None, clock_skew_s: float = 0.0):
        self.args = list(args)
        self.clock_skew_s = clock_skew_s
        self.port = port or free_port()
        self.metrics_port = metrics_port
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        import sys
        import threading

        launcher = ["tests.support.skewed_clock", str(self.clock_skew_s)] if self.clock_skew_s else ["prioreplay.apps.cli"]
        cmd = [
            sys.executable,
            "-m",
            *launcher,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, cwd=REPO)
        ready = threading.Event()

        def pump(proc=self.proc):
            for line in proc.stdout:
                self.lines.append(line)
                if "listening on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout_s) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError(f"prioreplay server did not start:\n{self.log}")
        return self

    def restart(self, timeout_s: float = 60.0) -> ServerProcess:
        self.kill()
        return self.start(timeout_s)

    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = 9) -> int | None:
        """Send ``sig`` (default SIGKILL) and wait; returns the exit status (None if not started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


# -- in-process servers ---------------------------------------------------------------------------
@pytest.fixture
def memory_server():
    """``start(**server_config) -> BackgroundServer``: an in-process memory-store server (no metrics
    port, no snapshots unless asked), for tests too slow to repeat over both stores; every one
    started is stopped after the test."""
    from prioreplay.priority_server.config import ServerConfig

    started = []

    def start(**kw):
        cfg = ServerConfig(**{"store": "memory", "metrics_port": 0, "snapshot_interval_s": 0, **kw})
        started.append(start_background_server("memory", "", "default", cfg))
        return started[-1]

    yield start
    for srv in started:
        srv.stop()


def cli(command: str, **flags: object) -> list[str]:
    """The argv of ``prioreplay COMMAND --flag value ...`` run with this interpreter (flags in
    the order given, ``snake_case`` names as ``--kebab-case``)."""
    args = [sys.executable, "-m", "prioreplay.apps.cli", command]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def server_children(pid: int) -> list[int]:
    """The server processes ``pid`` spawned (not multiprocessing's resource tracker)."""
    kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


@pytest.fixture
def two_processes(redis_url, namespace):
    """``prioreplay server --processes 2`` on the test Redis, once both processes and the store are
    up: (address, metrics port, parent process). A child the test stopped (SIGSTOP) is continued
    before the server is stopped; it must exit 0."""
    port, mport = free_port(), free_port()
    args = cli("server", store=redis_url, namespace=namespace, processes=2, port=port, metrics_port=mport, stats_interval_s=0.2)
    proc = subprocess.Popen(
        [*args, "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "".join(err)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2).read().decode()
                if "prioreplay_server_processes 2.0" in text and "prioreplay_store_healthy 1.0" in text:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not come up: " + "".join(err)
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", mport, proc
    finally:
        for child in server_children(proc.pid) if proc.poll() is None else []:
            os.kill(child, signal.SIGCONT)
        proc.terminate()
        assert proc.wait(60) == 0, "".join(err)
