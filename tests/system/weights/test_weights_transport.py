"""Weights without a shared filesystem: the learner serves v-N/ over HTTP, workers fetch, check, cache.

The learner side publishes into its own directory and serves it (a real HTTP server on an
ephemeral port); the worker side has a separate cache directory and sees only URLs, never a path
of the learner's. Tiny random model; each published version's weights differ (seeded noise).
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from prioreplay import checkpoint_reader as checkpoints
from prioreplay import models
from prioreplay.learner import checkpoint as ckpt
from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.worker import RolloutWorker
from prioreplay.tiny_model import make_tiny_model
from prioreplay.weights_transport import WeightsFetcher, WeightsFetchError, published_uri, serve_published


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


@pytest.fixture
def learner_side(tmp_path, tiny_dir):
    """(publish dir, base URL, model, tokenizer): the learner's own directory, served over HTTP."""
    root = tmp_path / "learner" / "published"
    server = serve_published(root, "127.0.0.1", 0)
    yield root, f"http://127.0.0.1:{server.server_address[1]}", models.load_causal_lm(tiny_dir), models.load_tokenizer(tiny_dir)
    server.shutdown()
    server.server_close()


def make_worker(tmp_path, tiny_dir, **kw) -> RolloutWorker:
    cfg = WorkerConfig(metrics_port=0, weights_cache_dir=tmp_path / "worker" / "cache", weights_fetch_timeout_s=5, **kw)
    return RolloutWorker(cfg, TransformersBackend(tiny_dir), client=None, sleep=lambda s: None)


def publish(root: Path, model, tok, version: int) -> Path:
    """Perturb the weights (seeded by the version) and publish them as ``v-N``."""
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    return ckpt.publish_weights(root, version, version, model, tok)


def same_weights(a, b) -> bool:
    sb = b.state_dict()
    return all(torch.equal(v, sb[k]) for k, v in a.state_dict().items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --- fetch, check, cache, load -------------------------------------------------------------------
def test_every_version_published_over_http_is_loaded_by_a_worker_with_its_own_directory(tmp_path, tiny_dir, learner_side):
    root, url, model, tok = learner_side
    worker = make_worker(tmp_path, tiny_dir)
    cache = tmp_path / "worker" / "cache"
    for version in (1, 2, 3):
        uri = published_uri(publish(root, model, tok, version), url)
        assert uri == f"{url}/v-{version}/"  # the worker is told a URL, never the learner's path
        assert worker.maybe_reload(version, uri) > 0
        assert worker.backend.policy_version == version
        assert same_weights(worker.backend.model, model)
    # only the newest weights_cache_keep (2) versions stay, each whole; no temporary directory left
    assert sorted(p.name for p in cache.iterdir()) == ["v-2", "v-3"]
    assert checkpoints.verify_weights(cache / "v-3")["version"] == 3
    # a cached version whose manifest equals the remote one is not downloaded again
    mtime = (cache / "v-3" / "model.safetensors").stat().st_mtime_ns
    assert WeightsFetcher(cache).fetch(f"{url}/v-3/", 3) == cache / "v-3"
    assert (cache / "v-3" / "model.safetensors").stat().st_mtime_ns == mtime


def test_a_corrupted_byte_is_refused_the_worker_keeps_its_version_and_a_retry_loads_it(tmp_path, tiny_dir, learner_side):
    root, url, model, tok = learner_side
    worker = make_worker(tmp_path, tiny_dir)
    assert worker.maybe_reload(1, published_uri(publish(root, model, tok, 1), url)) > 0
    v1 = {k: v.clone() for k, v in worker.backend.model.state_dict().items()}
    weights = publish(root, model, tok, 2) / "model.safetensors"
    size = weights.stat().st_size
    flip_byte(weights, size - 7)  # one byte inside the tensor data, same size: only the hash can tell
    assert weights.stat().st_size == size
    assert worker.maybe_reload(2, f"{url}/v-2/") == 0.0
    assert worker.backend.policy_version == 1
    assert all(torch.equal(v, v1[k]) for k, v in worker.backend.model.state_dict().items())
    cache = tmp_path / "worker" / "cache"
    assert sorted(p.name for p in cache.iterdir()) == ["v-1"]  # nothing of v-2, no temporary directory
    with pytest.raises(WeightsFetchError, match="does not match its manifest"):
        WeightsFetcher(cache).fetch(f"{url}/v-2/", 2)
    flip_byte(weights, size - 7)  # the learner serves the right bytes again: the next lease loads it
    assert worker.maybe_reload(2, f"{url}/v-2/") > 0 and worker.backend.policy_version == 2
    assert same_weights(worker.backend.model, model)


def test_a_file_pruned_during_the_download_or_another_version_is_refused(tmp_path, tiny_dir, learner_side):
    root, url, model, tok = learner_side
    (publish(root, model, tok, 1) / "config.json").unlink()  # listed in the manifest, gone (pruned)
    fetcher = WeightsFetcher(tmp_path / "cache")
    with pytest.raises(WeightsFetchError, match="config.json"):
        fetcher.fetch(f"{url}/v-1/", 1)
    publish(root, model, tok, 2)
    with pytest.raises(WeightsFetchError, match="version 2, the lease names 3"):
        fetcher.fetch(f"{url}/v-2/", 3)
    assert not any((tmp_path / "cache").iterdir())


class _Truncating(BaseHTTPRequestHandler):
    """Serves a published version but breaks the connection halfway through model.safetensors."""

    root: Path

    def do_GET(self):  # noqa: N802
        path = self.root / self.path.lstrip("/")
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if path.name == "model.safetensors" else data)
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_a_download_that_breaks_is_refused_and_leaves_nothing(tmp_path, tiny_dir, learner_side):
    root, _, model, tok = learner_side
    publish(root, model, tok, 1)
    handler = type("H", (_Truncating,), {"root": root})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker = make_worker(tmp_path, tiny_dir)
        assert worker.maybe_reload(1, f"http://127.0.0.1:{server.server_address[1]}/v-1/") == 0.0
        assert worker.backend.policy_version == 0
        assert not any((tmp_path / "worker" / "cache").iterdir())
    finally:
        server.shutdown()
        server.server_close()


def test_a_closed_port_is_retried_without_a_crash_until_the_restarted_learner_serves(tmp_path, tiny_dir, learner_side):
    root, _, model, tok = learner_side
    publish(root, model, tok, 1)
    port = free_port()
    uri = f"http://127.0.0.1:{port}/v-1/"
    worker = make_worker(tmp_path, tiny_dir)
    assert worker.maybe_reload(1, uri) == 0.0  # learner down: refused, logged, weights kept
    assert worker.backend.policy_version == 0
    server = serve_published(root, "127.0.0.1", port)  # the learner is back, serving the same directory
    try:
        assert worker.maybe_reload(1, uri) > 0 and worker.backend.policy_version == 1
        assert same_weights(worker.backend.model, model)
    finally:
        server.shutdown()
        server.server_close()


def test_a_file_url_loads_in_place_through_the_same_path(tmp_path, tiny_dir, learner_side):
    root, _, model, tok = learner_side
    path = publish(root, model, tok, 1)
    worker = make_worker(tmp_path, tiny_dir)
    assert worker.maybe_reload(1, path.resolve().as_uri()) > 0 and worker.backend.policy_version == 1
    assert same_weights(worker.backend.model, model)
    assert not (tmp_path / "worker" / "cache").exists()  # local: loaded where it is, not copied


def test_any_fsspec_url_is_fetched_and_checked(tmp_path, tiny_dir, learner_side):
    """An object store stands in as fsspec's memory:// filesystem: the same fetch, check and cache."""
    import fsspec

    root, _, model, tok = learner_side
    path = publish(root, model, tok, 1)
    fs = fsspec.filesystem("memory")
    for f in path.iterdir():
        fs.pipe_file(f"/bucket/run/v-1/{f.name}", f.read_bytes())
    try:
        worker = make_worker(tmp_path, tiny_dir)
        assert worker.maybe_reload(1, "memory://bucket/run/v-1") > 0
        assert same_weights(worker.backend.model, model)
        fs.pipe_file("/bucket/run/v-1/model.safetensors", b"\0" * path.joinpath("model.safetensors").stat().st_size)
        with pytest.raises(WeightsFetchError, match="does not match"):
            WeightsFetcher(tmp_path / "other-cache").fetch("memory://bucket/run/v-1", 1)
    finally:
        fs.rm("/bucket", recursive=True)


# --- the learner's HTTP server serves published files only ---------------------------------------
def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)  # the path is sent exactly as given
        conn.endheaders()
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_the_weights_server_serves_published_files_only(tmp_path, learner_side):
    root, url, model, tok = learner_side
    path = publish(root, model, tok, 1)
    port = int(url.rsplit(":", 1)[1])
    secret = tmp_path / "learner" / "secret.txt"
    secret.write_text("not for workers")
    (root / "stray.txt").write_text("beside the versions")
    tmp = root / ".tmp-v-2-abcd"  # a version being written: never served
    tmp.mkdir()
    (tmp / "prioreplay.json").write_text("{}")
    (root / "v-3").mkdir()  # a v-N without a manifest: not a complete version
    (root / "v-3" / "config.json").write_text("{}")
    os.symlink(secret, path / "link.txt")

    status, headers, body = _get(port, "/v-1/model.safetensors")
    assert status == 200 and body == (path / "model.safetensors").read_bytes()
    assert int(headers["Content-Length"]) == (path / "model.safetensors").stat().st_size
    status, headers, body = _get(port, "/v-1/prioreplay.json", "HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == (path / "prioreplay.json").stat().st_size
    for bad in [
        "/v-1/../../secret.txt",
        "/v-1/%2e%2e/%2e%2e/secret.txt",
        "/v-1/..%2f..%2fsecret.txt",
        "/../secret.txt",
        "/stray.txt",
        "/v-1/",
        "/v-1",
        "/",
        "/.tmp-v-2-abcd/prioreplay.json",
        "/v-3/config.json",
        "/v-9/model.safetensors",
        "/v-1/link.txt",
        "/v-1//model.safetensors",
        "/v-1/.hidden",
        "//etc/passwd",
        "/v-1/model.safetensors/",
    ]:
        status, _, body = _get(port, bad)
        assert status == 404, bad
        assert b"not for workers" not in body
    assert _get(port, "/v-1/model.safetensors", "POST")[0] == 501  # read-only


# --- a worker with no shared volume trains along -------------------------------------------------
@pytest.mark.slow
def test_a_worker_with_no_shared_volume_trains_along_loading_every_version(tmp_path, tiny_dir, monkeypatch):
    """Learner (own checkpoint dir, serving it over HTTP) and worker (own cache dir) around one
    priority server: each step's version reaches the worker by URL and generates the next batch."""
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.convert import problem_to_proto
    from prioreplay.learner.config import LearnerConfig
    from prioreplay.learner.learner import Learner
    from prioreplay.learner.main import serve_weights
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.problems import ProblemRecord
    from prioreplay.rollout_worker import scoring as scoring_mod
    from prioreplay.verifiers import VerifyResult
    from tests.conftest import start_background_server

    # the tiny model never answers right: reward by completion length parity, so groups are mixed
    monkeypatch.setattr(scoring_mod, "verify", lambda name, c, ref, timeout_s=5.0: VerifyResult(float(len(c) % 2 == 0)))
    srv = start_background_server("memory", "", "weights", store_config=StoreConfig(seed=1, retest_fraction=0.0))
    client = PriorityClient(ClientSettings(server=srv.address), max_retries=2, backoff_s=0.05)
    cfg = LearnerConfig(
        server=srv.address,
        model=str(tiny_dir),
        checkpoint_dir=tmp_path / "learner" / "ckpt",
        batch_groups=1,
        micro_batch_size=8,
        lr=1e-2,
        publish_every=1,
        checkpoint_every=1,
        metrics_port=0,
        pull_wait_s=0.2,
        batch_timeout_s=2.0,
        device="cpu",
        serve_weights_port=free_port(),
    )  # a fixed port: the learner's advertised URL
    http_server, cfg = serve_weights(cfg)
    learner = Learner(cfg)
    try:
        client.register(
            problem_to_proto(ProblemRecord(id=f"p{i}", prompt=f"Compute {i} + {i}.", answer=str(2 * i), verifier="gsm8k"))
            for i in range(8)
        )
        worker = RolloutWorker(
            WorkerConfig(
                server=srv.address,
                group_size=4,
                batch_size=2,
                max_new_tokens=8,
                seed=1,
                metrics_port=0,
                weights_cache_dir=tmp_path / "worker" / "cache",
            ),
            TransformersBackend(tiny_dir),
            client,
            sleep=lambda s: None,
        )
        versions, reloads = [], []
        for _ in range(4):
            reload_s = 0.0  # a new version loads on the first attempt; retries find it already loaded
            for _attempt in range(20):  # seeds differ per lease: a batch may hold only zero-variance groups
                res = worker.run_once()
                assert res.accepted
                reload_s += res.reload_s
                if res.groups_queued >= 1:  # mixed groups reach the learner
                    break
            versions.append(res.policy_version)
            reloads.append(reload_s)
            assert learner.step().trained
        assert versions == [0, 1, 2, 3]  # every version was loaded before the next batch
        assert all(s > 0 for s in reloads[1:])
        assert client.stats().weights_uri == f"{cfg.weights_base_url}/v-4/"
        assert str(tmp_path / "learner") not in client.stats().weights_uri
        assert sorted(p.name for p in (tmp_path / "worker" / "cache").iterdir()) == ["v-2", "v-3"]
    finally:
        learner.client.close()
        client.close()
        http_server.shutdown()
        http_server.server_close()
        srv.stop()


def test_every_backend_is_handed_the_verified_local_copy_never_the_url(tmp_path, tiny_dir, learner_side):
    """The vLLM backend reads a local directory only (weights_path refuses a URL): the worker
    hands any backend the cached, verified copy."""
    from prioreplay.rollout_worker.backends.base import verified_weights_dir

    root, url, model, tok = learner_side
    publish(root, model, tok, 1)
    seen = []

    class Recording:  # the part of GenerationBackend the reload uses, loading as the vLLM backend checks
        policy_version = 0

        def load_weights(self, uri, version):
            path, tensors = verified_weights_dir(uri)
            seen.append((uri, tensors))
            self.policy_version = version
            return 0.01

    worker = RolloutWorker(WorkerConfig(metrics_port=0, weights_cache_dir=tmp_path / "cache"), Recording(), client=None)
    assert worker.maybe_reload(1, f"{url}/v-1/") > 0
    assert seen == [(str(tmp_path / "cache" / "v-1"), checkpoints.verify_weights(root / "v-1")["tensors"])]
