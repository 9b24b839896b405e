"""Health means ready: ``/ready`` of ``prioreplay worker`` answers 503 while the model loads and 200
once the worker can lease; ``/metrics`` answers throughout (liveness, scrapes).

Compose healthchecks and Kubernetes readiness probes ask ``/ready`` (docker-compose.yml,
deploy/k8s/base/rollout-worker.yaml): a worker converting its model is alive, not healthy (issue 44:
workers reported healthy 15-31 s before they could lease). No model and no server here: the
backend's construction and the worker loop are stand-ins that look at the endpoint.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from prioreplay.channel import free_port
from prioreplay.metrics_server import Readiness, serve_metrics
from prioreplay.rollout_worker import main as worker_main
from prioreplay.rollout_worker import worker as worker_module
from prioreplay.rollout_worker.config import WorkerConfig


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ready_is_503_until_set_and_metrics_answer_throughout():
    registry = CollectorRegistry()
    Counter("prioreplay_test_things", "things", registry=registry).inc()
    readiness = Readiness("the model to load")
    server = serve_metrics(registry, readiness, free_port(), "127.0.0.1")
    assert server is not None
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + "/ready") == (503, "not ready: waiting for the model to load\n")
        status, body = _get(base + "/metrics")
        assert status == 200 and "prioreplay_test_things_total 1.0" in body
        readiness.set()
        assert _get(base + "/ready") == (200, "ready\n") and _get(base + "/ready/") == (200, "ready\n")
        readiness.clear("the server")
        assert _get(base + "/ready") == (503, "not ready: waiting for the server\n")
    finally:
        server.shutdown()
        server.server_close()
    assert serve_metrics(registry, readiness, 0) is None  # port 0: not served


def test_the_worker_is_ready_once_its_model_is_loaded_not_before(monkeypatch):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    seen: dict[str, tuple[int, str]] = {}

    def loading(config):
        seen["loading"] = _get(base + "/ready")
        seen["metrics while loading"] = _get(base + "/metrics")[:1] + ("",)

        class Loaded:
            policy_version = 0

        return Loaded()

    class Leasing:
        def __init__(self, config, backend, client, metrics):
            pass

        def run(self) -> int:
            seen["leasing"] = _get(base + "/ready")
            return 0

    monkeypatch.setattr(worker_main, "build_backend", loading)
    monkeypatch.setattr(worker_module, "RolloutWorker", Leasing)
    monkeypatch.setattr(worker_main, "stop_after_batch_on_signal", lambda worker, grace_s: [])
    config = WorkerConfig(server="127.0.0.1:1", device="cpu", backend="transformers", metrics_port=port)
    assert worker_main.run(config) == 0
    assert seen["loading"][0] == 503 and "the model to load" in seen["loading"][1]
    assert seen["metrics while loading"][0] == 200
    assert seen["leasing"] == (200, "ready\n")


@pytest.mark.parametrize("path", ["/metrics", "/", "/anything"])
def test_every_other_path_is_the_prometheus_exposition(path):
    registry = CollectorRegistry()
    Counter("prioreplay_test_paths", "paths", registry=registry)
    server = serve_metrics(registry, Readiness("x"), free_port(), "127.0.0.1")
    try:
        status, body = _get(f"http://127.0.0.1:{server.server_address[1]}{path}")
        assert status == 200 and "prioreplay_test_paths_total 0.0" in body
    finally:
        server.shutdown()
        server.server_close()
