"""Every ``prioreplay_*`` metric the dashboard or the Prometheus config names is exported: by a real
``prioreplay server --store memory`` process (scraped over HTTP, its compose health check run
against it) and by the worker's and learner's metrics registries (rendered with
``generate_latest``); failure-only counters have a zero fallback in the dashboard.

The rest of the deployment files' checks: test_deploy.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from prioreplay.channel import free_port
from tests.system.deploy.test_deploy import (
    COMPOSE_FILE,
    GRPC_PORT,
    REPO,
    _dashboard_exprs,
    _module_available,
    exported_names,
    interpolate,
    is_exported,
    referenced_metrics,
)

# -- every referenced metric is exported ---------------------------------------------------------------


def _scrape_server(timeout_s: float = 60.0) -> tuple[str, int]:
    """Start ``prioreplay server --store memory`` on free ports, scrape /metrics once stats are in."""
    port, mport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIOREPLAY_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prioreplay.apps.cli",
            "server",
            "--store",
            "memory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(mport),
            "--stats-interval-s",
            "0.2",
            "--log-level",
            "WARNING",
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline, text = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"prioreplay server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
                if "prioreplay_pool_size" in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"no store metrics on /metrics within {timeout_s} s:\n{text[-2000:]}")
        _run_compose_healthcheck(port)
        return text, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stderr.close()


def _run_compose_healthcheck(port: int) -> None:
    """The compose health check of the server, pointed at the test server, must pass."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    test = compose["services"]["priority-server"]["healthcheck"]["test"]
    code = test[test.index("-c") + 1].replace(f":{GRPC_PORT}", f":{port}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert done.returncode == 0, f"the server health check failed: {done.stderr.decode()[-1000:]}"


def _worker_exposition() -> str:
    from prometheus_client import generate_latest

    from prioreplay.rollout_worker.metrics import WorkerMetrics

    return generate_latest(WorkerMetrics().registry).decode()


def _learner_exposition() -> str:
    from prometheus_client import generate_latest

    from prioreplay.learner.metrics import LearnerMetrics

    return generate_latest(LearnerMetrics().registry).decode()


def test_every_referenced_metric_is_exported():
    """Scrape a real server and render the worker's and learner's registries."""
    for module in ("prioreplay.priority_server.server", "prioreplay.rollout_worker.metrics", "prioreplay.learner.metrics"):
        if not _module_available(module):
            pytest.skip(f"{module} does not exist yet")
    server_text, _port = _scrape_server()
    exported = exported_names(server_text) | exported_names(_worker_exposition()) | exported_names(_learner_exposition())
    referenced = referenced_metrics()
    assert referenced, "the dashboard references no metric"
    missing = sorted(n for n in referenced if not is_exported(n, exported))
    assert not missing, f"referenced but not exported: {missing}"


#: Counters of failures: a healthy run never creates a child, so a panel over them alone shows
#: "No data" (found querying a live Prometheus). Their expressions need a zero fallback.
FAILURE_ONLY_METRICS = ("prioreplay_rpc_errors_total",)


def test_failure_counters_have_a_zero_fallback_in_the_dashboard():
    if not _module_available("prioreplay.priority_server.server"):
        pytest.skip("prioreplay.priority_server.server does not exist yet")
    server_text, _port = _scrape_server()
    samples = {
        s.name
        for fam in __import__("prometheus_client.parser", fromlist=["x"]).text_string_to_metric_families(server_text)
        for s in fam.samples
    }
    for name in FAILURE_ONLY_METRICS:
        assert name not in samples, f"{name} has samples before any failure: drop it from FAILURE_ONLY_METRICS"
        exprs = [t["expr"] for targets in _dashboard_exprs().values() for t in targets if name in t["expr"]]
        assert exprs, f"no panel uses {name}"
        for expr in exprs:
            assert re.search(r"\bor on\(\)\s*(label_replace\()?vector\(0\)", expr), (
                f"{expr!r} returns no data until the first failure: append `or on() vector(0)`"
            )


def test_exported_name_matching():
    exported = exported_names(
        '# TYPE a_seconds histogram\na_seconds_bucket{le="1.0"} 1\na_seconds_bucket{le="+Inf"} 1\n'
        "a_seconds_sum 0.5\na_seconds_count 1\n# TYPE b counter\nb_total 3\n# TYPE c gauge\nc 1\n"
    )
    for name in ("a_seconds_bucket", "a_seconds_sum", "a_seconds_count", "a_seconds", "b_total", "c"):
        assert is_exported(name, exported), name
    for name in ("c_total", "d", "b_bucket_x"):
        assert not is_exported(name, exported), name
    assert interpolate("${A:-x}-${B-y}-${C}-$$D") == "x-y--$D"
