"""The ``prioreplay`` command line: help, light imports, clear errors, and the real
``server`` / ``load`` / ``stats`` processes against the memory store; plus the committed gRPC stubs
matching the proto.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from prioreplay.apps import cli
from prioreplay.priority_server.admin import run_stats
from prioreplay.priority_server.config import ServerConfig, StatsConfig
from prioreplay.priority_server.open_store import create_store
from tests.conftest import REPO, free_port

PY = sys.executable


def _env() -> dict[str, str]:
    """The environment without PRIOREPLAY_* settings (so the test's flags are the only input)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")}


def _prioreplay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "prioreplay.apps.cli", *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO
    )


# -- help and parsing (in process) ---------------------------------------------------------
def test_top_level_help(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_help_exits_0(name, capsys, monkeypatch):
    for k in list(os.environ):
        if k.startswith("PRIOREPLAY_"):
            monkeypatch.delenv(k)
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    assert e.value.code == 0
    assert f"prioreplay {name}" in capsys.readouterr().out


def test_help_does_not_import_heavy_modules():
    code = (
        "import sys\n"
        "from prioreplay.apps import cli\n"
        "for name in ('server', 'load', 'stats'):\n"
        "    try:\n"
        "        cli.parse(name, ['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'grpc') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "usage: prioreplay server" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "HEAVY="  # no heavy module was imported


#: What only the worker, learner, GPU and demo extras install: the base install must not need them.
MODEL_STACK = ("torch", "transformers", "safetensors", "accelerate", "gguf", "math_verify", "matplotlib", "vllm", "peft")


def test_server_load_and_stats_need_no_model_stack(tmp_path):
    """The base install (`pip install prioreplay`) runs the server, `load` and `stats`: their code
    paths and every server module import nothing of the worker's or learner's model stack."""
    data = tmp_path / "problems.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(4)), encoding="utf-8"
    )
    code = f"""
import importlib, io, pkgutil, sys
import prioreplay.priority_server as ps
from prioreplay.apps import cli
for name in ("server", "load", "stats"):
    try:
        cli.main([name, "--help"])
    except SystemExit:
        pass
for m in pkgutil.walk_packages(ps.__path__, "prioreplay.priority_server."):
    importlib.import_module(m.name)
from prioreplay.priority_server.admin import run_load, run_stats
from prioreplay.priority_server.config import LoadConfig, ServerConfig, StatsConfig
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.background_server import BackgroundServer
with BackgroundServer(lambda: create_store("memory", StoreConfig()), ServerConfig(metrics_port=0)) as srv:
    for source in ({str(data)!r}, "arithmetic:5"):
        assert run_load(LoadConfig(source=source, server=srv.address)) == 0
    out = io.StringIO()
    assert run_stats(StatsConfig(server=srv.address, as_json=True), out=out) == 0
    assert '"problems": 9' in out.getvalue(), out.getvalue()
print("LOADED=" + ",".join(m for m in {MODEL_STACK!r} if m in sys.modules))
"""
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "LOADED=", r.stdout  # none of the model stack was imported


def test_a_role_command_without_its_extra_says_which_to_install():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as on the base install: import torch fails\n"
        "from prioreplay.apps import cli\n"
        "sys.exit(cli.main(['learner', '--metrics-port', '0']))\n"
    )
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "lacks 'torch'" in r.stderr and "pip install 'prioreplay[learner]'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "argv,field",
    [
        (["server", "--port", "70000"], "port"),
        (["server", "--sampler", "greedy"], "sampler"),
        (["server", "--retest-fraction", "1.5"], "retest_fraction"),
        (["server", "--alpha", "0"], "alpha"),
        (["server", "--store", "mongodb://x"], "store"),
        (["server", "--tls-cert-file", "cert.pem"], "tls_key_file"),
        (["server", "--lease-timeout-s", "100", "--max-lease-timeout-s", "10"], "lease_timeout_s"),
        (["load", "data.jsonl", "--chunk-size", "0"], "chunk_size"),
        (["stats", "--buckets", "5000"], "buckets"),
    ],
)
def test_invalid_values_name_the_field(argv, field, capsys, monkeypatch):
    for k in list(os.environ):
        if k.startswith("PRIOREPLAY_"):
            monkeypatch.delenv(k)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"prioreplay {argv[0]}: error:" in err and field in err


def test_unknown_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["stats", "--no-such-flag", "1"])
    assert e.value.code == 2


# -- the real processes ---------------------------------------------------------------------
class ServerProcess:
    """``prioreplay server`` as a subprocess; its stderr is read by a thread (no pipe stalls)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [PY, "-m", "prioreplay.apps.cli", "server", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = self._wait_for(r"listening on 127\.0\.0\.1:(\d+)")

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def _wait_for(self, pattern: str, timeout_s: float = 60) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                return int(m.group(1))
        self.kill()
        raise AssertionError(f"server never logged {pattern!r}:\n{''.join(self.log)}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self, timeout_s: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


def _stats_json(address: str) -> dict:
    r = _prioreplay("stats", "--server", address, "--as-json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow  # starts server processes
def test_server_load_stats_processes(tmp_path):
    secret_prompt = "Zorblax has 3 apples and eats none; how many apples?"
    good = tmp_path / "problems.jsonl"
    _write_jsonl(good, [{"id": f"q{i}", "prompt": f"{secret_prompt} #{i}", "answer": "3"} for i in range(5)])
    bad = tmp_path / "bad.jsonl"
    _write_jsonl(
        bad,
        [
            {"id": "b1", "prompt": "1+1", "answer": "2"},
            {"id": "b2", "prompt": "2+2", "answer": "4"},
            {"id": "b3", "prompt": "3+3", "answer": "6"},
            '{"id": "b4", "prompt": ',
            {"id": "b5", "prompt": "5+5", "answer": "10"},
        ],
    )
    snapshot = tmp_path / "state" / "snapshot.json"
    metrics_port = free_port()
    srv = ServerProcess(
        "--metrics-port", str(metrics_port), "--snapshot-path", str(snapshot), "--stats-interval-s", "0.2", "--grace-s", "2"
    )
    try:
        r = _prioreplay("load", str(good), "--server", srv.address, "--chunk-size", "2")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == f"registered {good}: 5 problem(s) sent, created=5 updated=0 total=5"
        # a malformed line 4: the chunk (lines 3-4) is never sent, the one before is registered
        r = _prioreplay("load", str(bad), "--server", srv.address, "--chunk-size", "2")
        assert r.returncode == 2
        assert f"{bad}:4:" in r.stderr and "registered 2 problem(s) before the error" in r.stderr
        st = _stats_json(srv.address)
        assert st["problems"] == 7 and st["heap_size"] == 7 and st["step"] == 0
        assert sum(st["priority_histogram"]) == 7 and len(st["priority_bucket_edges"]) == 11

        out = io.StringIO()  # the text report, in process (one process start less)
        assert run_stats(StatsConfig(server=srv.address, buckets=4), out=out) == 0
        assert re.search(r"^problems\s+7$", out.getvalue(), re.M)
        assert re.search(r"\[0\.1875, 0\.2500\] #+ +7$", out.getvalue(), re.M)  # every unseen problem at 0.25

        deadline = time.monotonic() + 20
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            if "prioreplay_problems 7.0" in text or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert "prioreplay_problems 7.0" in text
        assert "Zorblax" not in text
        assert srv.terminate() == 0
    finally:
        srv.kill()
    assert any("shutting down" in line for line in srv.log + list(srv.lines.queue))

    # the memory store wrote its snapshot at shutdown; a new store starts from it
    assert snapshot.is_file()
    store = create_store("memory", ServerConfig().to_store_config(), snapshot_path=snapshot)
    assert asyncio.run(store.stats()).problems == 7


def test_stats_without_a_server_fails_clearly(capsys):
    assert cli.main(["stats", "--server", f"127.0.0.1:{free_port()}", "--rpc-timeout-s", "2"]) == 2
    err = capsys.readouterr().err
    assert "prioreplay stats: error:" in err and "GetStats" in err


# -- generated code -------------------------------------------------------------------------
def test_committed_stubs_match_the_proto(tmp_path):
    r = subprocess.run(
        [
            PY,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "proto/prioreplay/v1/priority_service.proto",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    names = ["priority_service_pb2.py", "priority_service_pb2.pyi", "priority_service_pb2_grpc.py"]
    for name in names:
        fresh = (tmp_path / "prioreplay" / "v1" / name).read_text()
        committed = (REPO / "prioreplay" / "v1" / name).read_text()
        assert fresh == committed, f"prioreplay/v1/{name} is stale: run `make proto`"


# -- configuration sources ------------------------------------------------------------------
def test_server_config_sources_and_store_config(tmp_path, monkeypatch):
    """Config file < environment < flags; every sampling knob reaches the StoreConfig."""
    for k in list(os.environ):
        if k.startswith("PRIOREPLAY_"):
            monkeypatch.delenv(k)
    cfg_file = tmp_path / "prioreplay.toml"
    cfg_file.write_text(
        "[server]\nport = 6000\nsampler = 'weighted'\nalpha = 2.5\ndecay = 0.5\n[worker]\nbatch_size = 3\n", encoding="utf-8"
    )
    monkeypatch.setenv("PRIOREPLAY_PORT", "7000")
    monkeypatch.setenv("PRIOREPLAY_SEED", "11")
    cfg = cli.parse("server", ["--config", str(cfg_file), "--retest-fraction", "0.25", "--prior-beta", "1"])
    assert (cfg.port, cfg.sampler, cfg.alpha, cfg.seed, cfg.retest_fraction) == (7000, "weighted", 2.5, 11, 0.25)
    sc = cfg.to_store_config()
    assert (sc.sampler, sc.alpha, sc.seed, sc.retest_fraction, sc.retest_interval) == ("weighted", 2.5, 11, 0.25, 4)
    assert (sc.params.decay, sc.params.prior_alpha, sc.params.prior_beta) == (0.5, 0.0, 1.0)
    assert (sc.lease_timeout_s, sc.max_batch_size) == (cfg.lease_timeout_s, cfg.max_batch_size)
    assert cli.parse("server", ["--config", str(cfg_file), "--port", "8000"]).port == 8000


def test_server_token_from_file_and_secret_hidden(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("PRIOREPLAY_"):
            monkeypatch.delenv(k)
    tok = tmp_path / "token"
    tok.write_text("  file-token-123\n", encoding="utf-8")
    assert cli.parse("server", ["--auth-token-file", str(tok)]).token() == "file-token-123"
    cfg = cli.parse("server", ["--auth-token", "flag-token-456"])
    assert cfg.token() == "flag-token-456" and "flag-token-456" not in repr(cfg)
    assert cli.main(["server", "--auth-token", "a", "--auth-token-file", str(tok)]) == 2


def test_load_says_what_it_registered(memory_server, capsys):
    """The compose loader's log must name the source and the counts (its only output)."""
    from prioreplay.priority_server.admin import run_load
    from prioreplay.priority_server.config import LoadConfig

    server = memory_server()
    assert run_load(LoadConfig(source="arithmetic:12:3", server=server.address, chunk_size=5)) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "registered arithmetic:12:3: 12 problem(s) sent, created=12 updated=0 total=12"
    )


def test_a_taken_metrics_port_is_a_clear_error_not_a_traceback():
    """A taken --metrics-port (9100 is also node_exporter's default) used to end the server with a
    Python traceback; now one line names the setting and the fix, exit code 2, like a taken --port."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "prioreplay.apps.cli",
                "server",
                "--port",
                "0",
                "--host",
                "127.0.0.1",
                "--metrics-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert f"cannot serve /metrics on port {port}" in proc.stderr and "--metrics-port" in proc.stderr


def test_stats_into_a_closed_pipe_exits_quietly():
    """`prioreplay stats | head -1` used to end in a BrokenPipeError traceback. `true` closes the
    pipe before the command starts writing, so every run meets the closed pipe."""
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.store import StoreConfig

    with BackgroundServer(lambda: create_store("memory", StoreConfig()), ServerConfig(metrics_port=0)) as srv:
        cmd = f"{sys.executable} -m prioreplay.apps.cli stats --server {srv.address} | true; echo ${{PIPESTATUS[0]}}"
        proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip() in ("0", "141")


def test_load_of_a_second_dataset_with_colliding_ids_is_refused_until_asked(memory_server, tmp_path, capsys):
    """croissant-baker #101: a second dataset whose ids collide overwrote the first's prompts and
    inherited its statistics, the only sign ``updated=N``. Now it is refused naming the ids and
    both fixes; the same file again is harmless; --id-prefix or --replace let it in."""
    import json

    from prioreplay.apps import cli

    server = memory_server()
    files = {}
    for name, question in (("gsm8k", "How many apples?"), ("math", "Find x if 2x = 4.")):
        path = tmp_path / name / "train.jsonl"
        path.parent.mkdir()
        path.write_text(
            "".join(
                json.dumps({"id": f"train-{i:05d}", "prompt": f"{question} ({i})", "answer": str(i)}) + "\n" for i in range(3)
            ),
            encoding="utf-8",
        )
        files[name] = str(path)
    base = ["--server", server.address]
    assert cli.main(["load", files["gsm8k"], *base]) == 0
    assert cli.main(["load", files["gsm8k"], *base]) == 0  # a loader that re-runs changes nothing
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("created=0 updated=3 total=3")
    assert cli.main(["load", files["math"], *base]) == 2
    err = capsys.readouterr().err
    assert "'train-00000'" in err and "--id-prefix" in err and "--replace" in err
    assert cli.main(["load", files["math"], *base, "--id-prefix", "math/"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("created=3 updated=0 total=6")
    assert cli.main(["load", files["math"], *base, "--replace"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("created=0 updated=3 total=6")
