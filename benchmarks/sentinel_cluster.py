"""A Redis primary, its replicas and a quorum of sentinels as real processes on free loopback ports.

Used by the failover-loss harness (:mod:`benchmarks.failover_loss`) and its tests. Each process is
``redis-server`` (``--sentinel`` for a sentinel) in its own folder under ``workdir``; nothing is
persisted (``--save ""``), so a restarted replica starts empty. The sentinels are tuned for a
short test: the primary is down after ``down_after_ms`` (default 1000 ms) without an answer, a
quorum of two of three agree, a failover times out after 4 s.

Up means more than linked: ``master_link_status:up`` comes before a diskless sync has delivered
the data set (the replica has it only once it acknowledges the primary's offset), so
:meth:`SentinelCluster.start` waits until ``WAIT`` on the primary counts every replica, and until
every sentinel lists every replica.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import redis

from prioreplay.channel import free_port

SERVICE = "prio"


def until(
    what: str, check: Callable[[], Any], timeout_s: float = 20.0, every_s: float = 0.05, why: Callable[[], str] = lambda: ""
) -> Any:
    """``check()``'s first truthy value within ``timeout_s`` seconds (Redis errors count as falsy).

    Raises:
        TimeoutError: not within ``timeout_s``; the message names ``what`` and adds ``why()``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s {why()}")
        time.sleep(every_s)


def redis_server(port: int, workdir: Path, *extra: str) -> subprocess.Popen:
    """Start ``redis-server`` on 127.0.0.1:``port`` in ``workdir`` (``extra``: more flags) and wait until it answers.

    Raises:
        FileNotFoundError: no ``redis-server`` on PATH (Debian: ``apt-get install redis-server``).
        TimeoutError: it did not answer within 10 s.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not found on PATH: install it (Debian: apt-get install redis-server)")
    workdir.mkdir(parents=True, exist_ok=True)
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]
    proc = subprocess.Popen([*args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(f"redis-server on port {port} answers", lambda: redis.Redis(port=port, socket_timeout=1).ping(), 10.0)
    except TimeoutError:
        proc.kill()
        raise
    return proc


class SentinelCluster:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (see the module docstring).

    Args:
        workdir: an empty folder for the processes' files.
        replicas: replicas of the primary (>= 1).
        sentinels: sentinel processes; the quorum is a majority of them.
        down_after_ms: ``sentinel down-after-milliseconds``.

    Attributes:
        ports: {name: port}: ``primary``, ``replica1``.., ``sentinel1``..; names keep their port
            through a failover (the ``primary`` may become a replica).
        procs: {name: process}.
    """

    def __init__(self, workdir: Path, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000):
        self.workdir = workdir
        self.down_after_ms = down_after_ms
        self.redis_names = ["primary", *(f"replica{i + 1}" for i in range(replicas))]
        self.sentinel_names = [f"sentinel{i + 1}" for i in range(sentinels)]
        self.ports = {name: free_port() for name in self.redis_names + self.sentinel_names}
        self.procs: dict[str, subprocess.Popen] = {}
        self.paused: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SentinelCluster:
        """Start every process; return when every replica holds the data and every sentinel knows them all.

        Raises:
            TimeoutError: a step did not happen in time (every process started is stopped).
        """
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> SentinelCluster:
        for name in self.redis_names:
            self.start_redis(name)
        self.wait_replicated()
        quorum = len(self.sentinel_names) // 2 + 1
        for name in self.sentinel_names:
            d = self.workdir / name
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {self.ports[name]}\nbind 127.0.0.1\ndir {d}\nlogfile {d / 'sentinel.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['primary']} {quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 4000\nsentinel parallel-syncs {SERVICE} {len(self.redis_names)}\n"
            )
            binary = shutil.which("redis-server") or "redis-server"
            self.procs[name] = subprocess.Popen(
                [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        for name in self.sentinel_names:
            until(
                f"{name} lists {len(self.redis_names) - 1} replicas and {len(self.sentinel_names) - 1} other sentinels",
                partial(self.knows_all, name),
                30.0,
            )
        return self

    def start_redis(self, name: str) -> None:
        """Start (or restart, empty) the Redis ``name``; a replica follows the current primary."""
        extra: tuple[str, ...] = ("--repl-diskless-sync-delay", "0")
        if name != "primary" or "primary" in self.procs:
            extra += ("--replicaof", "127.0.0.1", str(self.ports[self.current_primary()]))
        self.procs[name] = redis_server(self.ports[name], self.workdir / name / str(time.monotonic_ns()), *extra)

    def stop(self) -> None:
        """SIGKILL every process (resumed first if paused) and reap it."""
        for name, proc in self.procs.items():
            if proc.poll() is None:
                if name in self.paused:
                    proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)

    # -- faults -------------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        """SIGKILL ``name``."""
        self.procs[name].kill()
        self.procs[name].wait(10)

    def pause(self, name: str) -> None:
        """SIGSTOP ``name`` (it keeps its sockets and answers nothing)."""
        self.procs[name].send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT ``name``."""
        self.procs[name].send_signal(signal.SIGCONT)
        self.paused.discard(name)

    def planned_failover(self) -> None:
        """``SENTINEL FAILOVER`` on the first sentinel (a planned switch, no agreement needed)."""
        self.sentinel().sentinel_failover(SERVICE)

    # -- observing ----------------------------------------------------------------------------
    def client(self, name: str, **kw: Any) -> redis.Redis:
        """A client of the Redis ``name`` (2 s socket timeout)."""
        return redis.Redis(port=self.ports[name], **{"socket_timeout": 2, **kw})

    def sentinel(self, name: str = "") -> redis.Redis:
        """A client of sentinel ``name`` (default: the first)."""
        return redis.Redis(port=self.ports[name or self.sentinel_names[0]], socket_timeout=2, decode_responses=True)

    def master_state(self, sentinel: str = "") -> dict[str, Any]:
        """``SENTINEL MASTER`` of the service as sentinel ``sentinel`` (default: the first) sees it."""
        return cast(dict[str, Any], self.sentinel(sentinel).sentinel_master(SERVICE))

    def knows_all(self, sentinel: str) -> bool:
        """Whether ``sentinel`` lists every replica and every other sentinel."""
        m = self.master_state(sentinel)
        return m["num-slaves"] == len(self.redis_names) - 1 and m["num-other-sentinels"] == len(self.sentinel_names) - 1

    def name_of(self, port: int) -> str:
        """The name of the process on ``port``."""
        return next(name for name, p in self.ports.items() if p == port)

    def current_primary(self) -> str:
        """The name of the primary the first sentinel names (before the sentinels start: ``primary``)."""
        if not any(n in self.procs for n in self.sentinel_names):
            return "primary"
        address = cast(tuple[str, int], self.sentinel().sentinel_get_master_addr_by_name(SERVICE))
        return self.name_of(int(address[1]))

    def switched_from(self, old: str) -> str | None:
        """The new primary's name once every sentinel has ended a failover away from ``old``, else None."""
        names = set()
        for s in self.sentinel_names:
            state = self.master_state(s)
            if state["is_sdown"] or state["is_odown"] or "failover_in_progress" in state["flags"]:
                return None
            names.add(self.name_of(int(state["port"])))
        return names.pop() if len(names) == 1 and old not in names else None

    def role(self, name: str) -> str:
        """``master`` or ``slave``, as the Redis ``name`` says of itself."""
        return str(self.client(name).info("replication")["role"])

    def acknowledging(self, primary: str, replicas: int, timeout_ms: int = 500) -> int:
        """``WAIT replicas timeout_ms`` on ``primary``: replicas holding everything written so far."""
        return int(self.client(primary, socket_timeout=timeout_ms / 1000 + 2).wait(replicas, timeout_ms))

    def wait_replicated(self, timeout_s: float = 20.0) -> None:
        """Until every live replica acknowledges the primary's whole offset (``WAIT``).

        Raises:
            TimeoutError: not within ``timeout_s``.
        """
        primary = self.current_primary()
        live = sum(1 for n in self.redis_names if n != primary and self.procs[n].poll() is None)
        until(f"{live} replicas acknowledge {primary}'s offset", lambda: self.acknowledging(primary, live) >= live, timeout_s)

    def promotable_replicas(self) -> set[str]:
        """Names of the replicas the first sentinel lists as not down and connected."""
        replicas = self.sentinel().sentinel_slaves(SERVICE)
        return {self.name_of(int(r["port"])) for r in replicas if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])}

    @property
    def url(self) -> str:
        """The store URL: ``redis+sentinel://`` with every sentinel, database 0."""
        hosts = ",".join(f"127.0.0.1:{self.ports[n]}" for n in self.sentinel_names)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def __enter__(self) -> SentinelCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
