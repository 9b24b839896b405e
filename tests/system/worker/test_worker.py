"""The rollout worker against a real in-process priority server (memory and Redis stores).

The tiny random model never answers a problem right, so most tests swap the verifier for a
deterministic rule on the completion text (reward 1 when its length is even): groups are then
mixed and reach the trajectory queue, which is what the plumbing under test needs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from prioreplay import models
from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.store import StoreConfig
from prioreplay.problems import ProblemRecord
from prioreplay.rollout_worker import scoring as scoring_mod
from prioreplay.rollout_worker import worker as worker_mod
from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.worker import RolloutWorker
from prioreplay.tiny_model import make_tiny_model
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.verifiers import VerifyResult
from tests.conftest import start_background_server

# a model generates against a server, and a worker process: about a minute; make test-fast leaves it out
pytestmark = pytest.mark.slow

B, G = 3, 4
PROBLEMS = [ProblemRecord(id=f"p{i}", prompt=f"Compute {i} + {i}.", answer=str(2 * i), verifier="gsm8k") for i in range(6)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("worker-models")
    return make_tiny_model(base / "v0", seed=0), make_tiny_model(base / "step-1", seed=1)


@pytest.fixture(params=["memory", "redis"])
def server(request, redis_url, namespace):
    srv = start_background_server(request.param, redis_url, namespace, store_config=StoreConfig(seed=1))
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address), max_retries=2, backoff_s=0.05)
    yield c
    c.close()


@pytest.fixture
def parity_verifier(monkeypatch):
    calls = []

    def fake(name, completion, reference, timeout_s=5.0):
        calls.append(name)
        return VerifyResult(1.0 if len(completion) % 2 == 0 else 0.0)

    monkeypatch.setattr(scoring_mod, "verify", fake)
    return calls


def make_worker(client, model_dir, **kw) -> RolloutWorker:
    cfg = WorkerConfig(group_size=G, batch_size=B, max_new_tokens=12, seed=7, worker_id="test-worker", metrics_port=0, **kw)
    return RolloutWorker(cfg, TransformersBackend(model_dir), client, sleep=lambda s: None)


def metric(w: RolloutWorker, name: str, labels: dict | None = None) -> float:
    v = w.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if v is None else v


def teacher_forced(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]  # (L, V)
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)  # (L,)


def test_one_batch_is_leased_generated_verified_and_reported(client, dirs, parity_verifier):
    client.register(problem_to_proto(p) for p in PROBLEMS)
    w = make_worker(client, dirs[0])
    n = 0  # batches run: seeds differ per lease, so a batch may hold only zero-variance groups
    while True:
        n += 1
        res = w.run_once()
        if res.groups_queued or n == 20:
            break
    assert res.reported and res.accepted, res
    assert res.problems == B and res.completions == B * G and res.policy_version == 0
    assert len(parity_verifier) == n * B * G and set(parity_verifier) == {"gsm8k"}

    stats = client.stats()
    assert stats.completions_reported == n * B * G and stats.leased == 0 and stats.active_leases == 0
    assert stats.groups_mixed + stats.groups_all_correct + stats.groups_all_wrong == n * B
    assert stats.groups_mixed == res.groups_queued >= 1

    pulled = client.pull(max_groups=10).groups
    assert len(pulled) == res.groups_queued
    by_id = {p.id: p for p in PROBLEMS}
    for g in pulled:
        assert g.policy_version == 0 and len(g.completions) == G
        assert g.sampling_top_p == w.config.top_p and g.sampling_temperature == w.config.temperature
        assert list(g.prompt_token_ids) == models.apply_chat_template(w.backend.tokenizer, by_id[g.problem_id].prompt)
        rewards = {c.reward for c in g.completions}
        assert rewards == {0.0, 1.0}
        for c in g.completions:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.reward == (1.0 if len(c.text) % 2 == 0 else 0.0)
            want = teacher_forced(w.backend.model, list(g.prompt_token_ids), list(c.token_ids))
            assert torch.allclose(torch.tensor(list(c.logprobs)), want, atol=1e-4)

    # the counters cover all n batches run (CI once needed n = 2 for a mixed group)
    assert metric(w, "prioreplay_worker_completions_total") == n * B * G
    assert metric(w, "prioreplay_worker_batches_total") == n
    truncated_seen = sum(c.truncated for g in pulled for c in g.completions)  # queued (mixed) groups only
    assert truncated_seen <= metric(w, "prioreplay_worker_truncated_completions_total") <= n * B * G
    assert truncated_seen >= 1  # 12 new tokens: the tiny model runs to the limit
    assert metric(w, "prioreplay_worker_tokens_generated_total") == res.tokens > 0
    assert metric(w, "prioreplay_worker_rpc_seconds_count", {"method": "SampleProblems"}) == 1
    assert metric(w, "prioreplay_worker_rpc_seconds_count", {"method": "ReportOutcomes"}) == 1
    assert metric(w, "prioreplay_worker_groups_total", {"kind": "mixed"}) == stats.groups_mixed


def test_a_newer_published_version_is_loaded_before_generating(client, dirs, parity_verifier, tmp_path):
    client.register(problem_to_proto(p) for p in PROBLEMS)
    w = make_worker(client, dirs[0])
    assert w.run_once().policy_version == 0
    client.pull(max_groups=10)  # drain version-0 groups
    client.publish(1, str(dirs[1]))
    reload_s = 0.0  # the new version loads on the first attempt; a retry finds it loaded
    for _attempt in range(20):  # seeds differ per lease: a batch may hold only zero-variance groups
        res = w.run_once()
        reload_s += res.reload_s
        if res.groups_queued:
            break
    assert res.accepted and res.policy_version == 1 and reload_s > 0
    assert w.backend.policy_version == 1
    assert metric(w, "prioreplay_worker_weight_reload_seconds_count") == 1
    assert metric(w, "prioreplay_worker_policy_version") == 1
    groups = client.pull(max_groups=10).groups
    assert groups and all(g.policy_version == 1 for g in groups)
    # The completions were sampled from the new weights: their log-probs match version 1's model.
    v1 = models.load_causal_lm(dirs[1])
    g = groups[0]
    for c in g.completions:
        want = teacher_forced(v1, list(g.prompt_token_ids), list(c.token_ids))
        assert torch.allclose(torch.tensor(list(c.logprobs)), want, atol=1e-4)


def test_an_unloadable_checkpoint_keeps_the_old_weights_and_version(client, dirs, parity_verifier, tmp_path):
    client.register(problem_to_proto(p) for p in PROBLEMS)
    broken = tmp_path / "step-2"
    shutil.copytree(dirs[1], broken)
    (broken / "model.safetensors").unlink()
    client.publish(2, str(broken))
    w = make_worker(client, dirs[0])
    res = w.run_once()
    assert res.accepted and res.policy_version == 0 and w.backend.policy_version == 0
    assert metric(w, "prioreplay_worker_weight_reload_seconds_count") == 0


def test_an_empty_server_gives_no_lease_and_no_report(client, dirs):
    w = make_worker(client, dirs[0])
    res = w.run_once()
    assert res.lease_id == "" and not res.reported and res.retry_after_s > 0
    assert client.stats().late_reports == 0
    assert metric(w, "prioreplay_worker_rpc_seconds_count", {"method": "ReportOutcomes"}) == 0


def test_an_expired_lease_is_reported_once_and_refused(client, dirs, parity_verifier, server):
    client.register(problem_to_proto(p) for p in PROBLEMS)
    w = make_worker(client, dirs[0], requested_lease_s=0.01)
    res = w.run_once()
    assert res.reported and res.accepted is False and res.reason in ("expired", "unknown lease")
    stats = client.stats()
    assert stats.late_reports == 1 and stats.completions_reported == 0


def test_run_stops_after_max_batches_and_when_asked(client, dirs, parity_verifier):
    client.register(problem_to_proto(p) for p in PROBLEMS)
    w = make_worker(client, dirs[0], max_batches=2)
    assert w.run() == 0 and w.batches_done == 2
    assert client.stats().completions_reported == 2 * B * G

    # A stop request during generation: the batch in progress is still reported.
    w2 = make_worker(client, dirs[0])
    inner = w2.backend.generate

    def generate_then_stop(*a, **kw):
        w2.stop_event.set()
        return inner(*a, **kw)

    w2.backend.generate = generate_then_stop
    assert w2.run() == 0 and w2.batches_done == 1
    stats = client.stats()
    assert stats.completions_reported == 3 * B * G and stats.active_leases == 0


def test_a_problem_leased_again_with_unchanged_weights_gets_new_completions(dirs, parity_verifier):
    """A restarted worker (seed + batch index began at 0 again) leasing the same problem under a new
    lease drew the same completions, which the server counted as new evidence; the same lease id
    reproduces them."""
    problem = pb.LeasedProblem(problem=problem_to_proto(PROBLEMS[0]))

    def completions(lease_id: str) -> list[list[int]]:
        w = make_worker(None, dirs[0])  # a fresh worker each time: a restart, same seed and worker id
        outcomes, _, _ = w.generate_batch(
            worker_mod.leased_problems(pb.SampleProblemsResponse(lease_id=lease_id, problems=[problem]), G), lease_id
        )
        return [list(c.token_ids) for c in outcomes[0].completions]

    first, again, replay = completions("lease-1"), completions("lease-2"), completions("lease-1")
    assert first != again
    assert first == replay


@pytest.mark.parametrize("server", ["memory"], indirect=True)
def test_cli_worker_reports_then_stops_cleanly_on_sigterm(server, client, dirs):
    """`prioreplay worker` as a process: it reports batches, and SIGTERM ends it with exit code 0."""
    client.register(problem_to_proto(p) for p in PROBLEMS)
    env = dict(os.environ, OMP_NUM_THREADS="1", PRIOREPLAY_CACHE_DIR=str(dirs[0].parent))
    cmd = [
        sys.executable,
        "-m",
        "prioreplay.apps.cli",
        "worker",
        "--server",
        server.address,
        "--model",
        str(dirs[0]),
        "--group-size",
        "2",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--metrics-port",
        "0",
        "--device",
        "cpu",
        "--worker-id",
        "cli-worker",
        "--max-retry-sleep-s",
        "0.1",
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while client.stats().completions_reported < 4:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "the worker reported nothing within 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    stats = client.stats()
    assert stats.active_leases == 0, "the batch in progress at SIGTERM must be reported"
    assert stats.completions_reported % 4 == 0 and stats.late_reports == 0


@pytest.mark.parametrize("server_mb,worker_mb", [(1, 64), (4, 1)])
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_report_over_the_message_limit_is_sent_in_parts_and_nothing_is_lost(
    kind, server_mb, worker_mb, redis_url, namespace, dirs, parity_verifier
):
    """Issue 13: a report refused as too large used to let the lease expire, generated work lost.

    (1, 64): the server's limit refuses it, the worker halves the part and sends again;
    (4, 1): the worker's own limit, the report is cut into parts before sending.
    """
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.rollout_worker.backends.base import GeneratedCompletion

    cfg = ServerConfig(store="memory", metrics_port=0, snapshot_interval_s=0, max_message_mb=server_mb)
    srv = start_background_server(kind, redis_url, namespace, cfg)
    c = PriorityClient(ClientSettings(server=srv.address, max_message_mb=worker_mb), max_retries=0)
    try:
        c.register(problem_to_proto(p) for p in PROBLEMS)
        w = make_worker(c, dirs[0])
        tokens = 15_000  # per completion: ≈ 0.3 MB per group of 4, ≈ 0.9 MB per batch of 3 with headers

        def big_generate(prompts, n, params):
            return [
                [
                    GeneratedCompletion(token_ids=[5 + i] * tokens, logprobs=[-0.5] * tokens, text="x" * (i + 1), truncated=False)
                    for i in range(n)
                ]
                for _ in prompts
            ]

        w.backend.generate = big_generate
        w.config = w.config.model_copy(update={"batch_size": 6})
        res = w.run_once()
        assert res.reported and res.accepted, res
        s = c.stats()
        assert (s.completions_reported, s.groups_mixed, s.leased, s.active_leases) == (6 * G, 6, 0, 0)
        got = []
        while len(got) < 6:
            resp = c.pull(6) if worker_mb > 1 else c.pull(1)
            assert resp.groups
            got += resp.groups
        assert sorted(g.problem_id for g in got) == sorted(p.id for p in PROBLEMS)
        assert all(len(comp.token_ids) == tokens for g in got for comp in g.completions)  # nothing cut
        assert metric(w, "prioreplay_worker_rpc_seconds_count", {"method": "ReportOutcomes"}) >= 2  # in parts
    finally:
        c.close()
        srv.stop()


def test_a_worker_refused_by_backpressure_waits_the_hint_and_asks_again(redis_url, namespace, dirs):
    """While the trajectory queue is over the server's bound the worker leases nothing, counts the
    refusal, sleeps the server's hint and keeps running (no report, no error)."""
    from prioreplay.priority_server.config import ServerConfig

    config = ServerConfig(snapshot_interval_s=0, max_queue_depth=1, backpressure_retry_s=0.7)
    srv = start_background_server("memory", redis_url, namespace, config=config)
    try:
        with PriorityClient(ClientSettings(server=srv.address), max_retries=0) as c:
            c.register(problem_to_proto(p) for p in PROBLEMS)
            lease = c.sample(1)  # one mixed group queued: the queue is at its bound
            comps = [pb.Completion(reward=r, token_ids=[1], logprobs=[-0.1]) for r in (0.0, 1.0)]
            assert (
                c.report(
                    lease.lease_id, [pb.ProblemOutcome(problem_id=lease.problems[0].problem.id, completions=comps)]
                ).groups_queued
                == 1
            )
            slept = []
            w = make_worker(c, dirs[0], max_retry_sleep_s=5.0)
            w._sleep = lambda s: (slept.append(s), len(slept) >= 3 and w.stop_event.set())
            res = w.run_once()
            assert res.backpressure and res.lease_id == "" and res.retry_after_s == pytest.approx(0.7)
            assert w.run() == 0 and slept == [pytest.approx(0.7)] * 3  # waited the hint, never exited
            assert metric(w, "prioreplay_worker_backpressure_waits_total") == 4
            assert w.batches_done == 0 and c.stats().leased == 0
    finally:
        srv.stop()


def test_a_worker_held_by_the_pace_bound_asks_again_at_once_and_counts_the_wait(redis_url, namespace, dirs):
    """With the server's pace bound full (one lease out, never reported), a SampleProblems call is
    held for --pace-wait-s and answers paced: the worker asks again at once (sleeps 0), logs nothing
    and counts the seconds it was held."""
    from prioreplay.priority_server.config import ServerConfig

    config = ServerConfig(snapshot_interval_s=0, pace_batches=1, pace_batch_groups=1, pace_wait_s=1.0)
    srv = start_background_server("memory", redis_url, namespace, config=config)
    try:
        with PriorityClient(ClientSettings(server=srv.address), max_retries=0) as c:
            c.register(problem_to_proto(p) for p in PROBLEMS)
            assert len(c.sample(1).problems) == 1  # the whole bound, in flight
            slept = []
            w = make_worker(c, dirs[0], max_retry_sleep_s=5.0)
            w._sleep = lambda s: (slept.append(s), len(slept) >= 2 and w.stop_event.set())
            res = w.run_once()
            assert res.lease_id == "" and res.retry_after_s == 0.0 and not res.backpressure
            assert w.run() == 0 and slept == [0.0, 0.0]
            assert metric(w, "prioreplay_worker_pace_wait_seconds_total") >= 3.0  # three held calls of 1 s
            assert w.batches_done == 0
    finally:
        srv.stop()


def test_a_prompt_longer_than_the_context_is_quarantined_and_the_worker_goes_on(client, dirs, parity_verifier):
    """The tiny model's context is 1024 tokens; one problem's prompt is longer. The worker reports
    it unservable (counted), generates and reports the others, and keeps running; the server
    quarantines it, so it is never leased again until it is registered again."""
    long = ProblemRecord(id="too-long", prompt=" ".join(str(i) for i in range(1500)), answer="1", verifier="gsm8k")
    client.register(problem_to_proto(p) for p in [*PROBLEMS[:3], long])
    cfg = WorkerConfig(group_size=G, batch_size=4, max_new_tokens=12, seed=7, worker_id="test-worker", metrics_port=0)
    w = RolloutWorker(cfg, TransformersBackend(dirs[0]), client, sleep=lambda s: None)
    assert w.backend.max_context_tokens == 1024
    res = w.run_once()
    assert res.reported and res.accepted and res.problems == 4 and res.unservable == 1
    assert res.completions == 3 * G  # the three others were generated and reported
    stats = client.stats()
    assert (stats.quarantined, stats.leased, stats.completions_reported) == (1, 0, 3 * G)
    assert metric(w, "prioreplay_worker_unservable_problems_total") == 1
    for _ in range(3):  # leases go on; the quarantined problem never comes back
        res = w.run_once()
        assert res.unservable == 0 and res.reported
    assert client.stats().quarantined == 1
    client.register([problem_to_proto(long)])  # registered again: served again
    assert client.stats().quarantined == 0


def test_a_worker_backs_off_on_unavailable_and_internal_and_goes_on(client, dirs, parity_verifier):
    """UNAVAILABLE (a store outage, after the client's own retries) and INTERNAL from the server:
    the worker logs, sleeps max_retry_sleep_s and leases again; it never exits on them."""
    from prioreplay.errors import Internal, StoreUnavailable

    client.register(problem_to_proto(p) for p in PROBLEMS)
    errors = [
        StoreUnavailable("SampleProblems: Redis is out of memory", kind="out_of_memory"),
        Internal("SampleProblems: Redis answered WRONGTYPE"),
    ]

    class Flaky:
        def __getattr__(self, name):
            return getattr(client, name)

        def sample(self, *a, **kw):
            if errors:
                raise errors.pop(0)
            return client.sample(*a, **kw)

    w = make_worker(Flaky(), dirs[0], max_batches=1, max_retry_sleep_s=3.0)
    slept = []
    w._sleep = slept.append
    assert w.run() == 0 and w.batches_done == 1
    assert slept == [3.0, 3.0] and client.stats().completions_reported == B * G
