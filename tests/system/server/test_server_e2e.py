"""End to end through gRPC: GSM8K registered, sampled, reported, pulled and acknowledged.

An in-process server on an ephemeral port (a background event loop, so the blocking client can
talk to it) runs over both stores; every check compares the server's answers with what the test
itself sent and tallied.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay import rules
from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.datasets import iter_problems
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

G = 4  # group size: small, still gives mixed / all-correct / all-wrong groups
BATCH = 256
ROUNDS = 8  # 8 × 256 > 1,319: every problem is tried, some are retested


def server_config(**kw) -> ServerConfig:
    # decay 1 (cumulative counts, the paper's rule): the checks below count completions exactly
    base = dict(
        store="memory", decay=1.0, metrics_port=0, reaper_interval_s=0.2, stats_interval_s=0.2, snapshot_interval_s=0, seed=7
    )
    base.update(kw)
    return ServerConfig(**base)


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address, rpc_timeout_s=30), max_retries=0)
    yield c
    c.close()


def _synthetic_group(rng: random.Random, skill: float) -> list[pb.Completion]:
    """G completions with Bernoulli(skill) rewards, random token ids and exact-in-float32 logprobs."""
    out = []
    for _ in range(G):
        n = rng.randint(0, 12)
        out.append(
            pb.Completion(
                reward=1.0 if rng.random() < skill else 0.0,
                token_ids=[rng.randrange(50_000) for _ in range(n)],
                logprobs=[-rng.randrange(0, 40) / 8 for _ in range(n)],
                text=f"completion of {n} tokens",
                truncated=n == 12,
            )
        )
    return out


def _key(problem_id: str, completions) -> tuple:
    return (problem_id, tuple((c.reward, tuple(c.token_ids), tuple(c.logprobs)) for c in completions))


def test_gsm8k_through_grpc(server, client, gsm8k_dir):
    test_file = gsm8k_dir / "test.jsonl"
    n_problems = sum(1 for line in test_file.open(encoding="utf-8") if line.strip())

    # -- register through the client, in chunks --------------------------------------------
    resp = client.register((problem_to_proto(p) for p in iter_problems(str(test_file))), chunk_size=200)
    assert (resp.created, resp.updated, resp.total) == (n_problems, 0, n_problems)
    again = client.register((problem_to_proto(p) for p in iter_problems(str(test_file), limit=30)), chunk_size=7)
    assert (again.created, again.updated, again.total) == (0, 30, n_problems)

    # -- sample, report seeded synthetic outcomes ------------------------------------------
    rng = random.Random(1234)
    skill = {}  # per problem: always solved, never solved, or in between
    expected_groups: Counter = Counter()
    kinds: Counter = Counter()
    latest_kind: dict[str, rules.GroupKind] = {}
    n_reported: Counter = Counter()
    reward_sum = 0.0
    seen_steps = []
    for round_ in range(ROUNDS):
        if round_ == 3:
            pub = client.publish(1, "checkpoints/step-1")
            assert (pub.version, pub.weights_uri) == (1, "checkpoints/step-1")
        lease = client.sample(BATCH, worker_id=f"worker-{round_ % 2}")
        assert len(lease.problems) == BATCH and lease.lease_id
        assert len({lp.problem.id for lp in lease.problems}) == BATCH
        assert lease.policy_version == (1 if round_ >= 3 else 0)
        assert all(0.0 <= lp.priority <= 0.25 for lp in lease.problems)
        seen_steps.append(lease.step)
        outcomes = []
        for lp in lease.problems:
            pid = lp.problem.id
            s = skill.setdefault(pid, rng.choice([0.0, 1.0, 0.5, 0.3]))
            comps = _synthetic_group(rng, s)
            rewards = [c.reward for c in comps]
            kind = rules.classify(rewards)
            kinds[kind] += 1
            latest_kind[pid] = kind
            n_reported[pid] += 1
            reward_sum += sum(rewards)
            if kind is rules.GroupKind.MIXED:
                expected_groups[_key(pid, comps)] += 1
            outcomes.append(
                pb.ProblemOutcome(
                    problem_id=pid, policy_version=lease.policy_version, prompt_token_ids=[1, 2, 3, len(pid)], completions=comps
                )
            )
        rep = client.report(lease.lease_id, outcomes, worker_id="w")
        assert rep.accepted, rep.reason
        assert rep.groups_queued + rep.groups_filtered == BATCH
        # a second report of the same lease changes nothing
        dup = client.report(lease.lease_id, outcomes[:1])
        assert not dup.accepted and dup.reason == "already reported"
    assert seen_steps == list(range(1, ROUNDS + 1))

    # -- stats agree with what was sent ----------------------------------------------------
    st = client.stats(histogram_buckets=5)
    assert st.problems == n_problems
    assert st.heap_size + st.solved + st.unsolved + st.leased == n_problems and st.leased == 0
    assert st.groups_mixed == kinds[rules.GroupKind.MIXED]
    assert st.groups_all_correct == kinds[rules.GroupKind.ALL_CORRECT]
    assert st.groups_all_wrong == kinds[rules.GroupKind.ALL_WRONG]
    assert st.completions_reported == G * BATCH * ROUNDS
    assert st.reward_sum == pytest.approx(reward_sum)
    assert st.effective_group_fraction == pytest.approx(kinds[rules.GroupKind.MIXED] / (BATCH * ROUNDS))
    assert st.late_reports == ROUNDS
    assert (st.step, st.policy_version, st.weights_uri) == (ROUNDS, 1, "checkpoints/step-1")
    assert len(st.priority_histogram) == 5 and len(st.priority_bucket_edges) == 6
    assert sum(st.priority_histogram) == st.heap_size
    assert st.queue_depth == sum(expected_groups.values())

    # -- every problem is where its latest group sends it ----------------------------------
    dump = server.call(server.store.dump())
    expected_pool = Counter(
        int(rules.destination(latest_kind[pid])) if pid in latest_kind else int(rules.Pool.HEAP) for pid in dump["problems"]
    )
    assert Counter(v[0] for v in dump["problems"].values()) == expected_pool
    assert (expected_pool[2], expected_pool[3]) == (st.solved, st.unsolved)
    for pid, (_pool, n, _s1, _s2, _score) in dump["problems"].items():
        assert n == G * n_reported[pid]  # decay 1: cumulative counts

    # -- mixed groups arrive once, byte for byte ---------------------------------------------
    got: Counter = Counter()
    ids = []
    while True:
        pulled = client.pull(max_groups=97, wait_s=0.0, consumer="learner-a")
        if not pulled.groups:
            break
        for g in pulled.groups:
            assert g.delivery_count == 1 and g.group_id and g.reported_unix_s > 0
            assert list(g.prompt_token_ids) == [1, 2, 3, len(g.problem_id)]
            assert len({c.reward for c in g.completions}) == 2  # mixed only
            got[_key(g.problem_id, g.completions)] += 1
            ids.append(g.group_id)
    assert got == expected_groups
    assert pulled.queue_depth == 0
    # not acknowledged yet: this consumer gets its own pending groups back first
    again = client.pull(max_groups=5, consumer="learner-a", include_own_pending=True)
    assert [g.delivery_count for g in again.groups] == [2] * 5 and {g.group_id for g in again.groups} <= set(ids)
    ack = client.ack(ids + ids[:3])
    assert (ack.acked, ack.unknown) == (len(ids), 3)
    # acknowledged groups are never delivered again
    after = client.pull(max_groups=100, wait_s=0.2, consumer="learner-a", include_own_pending=True)
    assert list(after.groups) == []
    st2 = client.stats()
    assert (st2.queue_depth, st2.pending_groups, st2.groups_acked) == (0, 0, len(ids))

    # -- the standard health service -------------------------------------------------------
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "prioreplay.v1.PriorityService"):
            assert (
                health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
                == health_pb2.HealthCheckResponse.SERVING
            )


def test_metrics_follow_the_store(server, client):
    """/metrics exports the store's counters and pools, and no prompt text."""
    secret_prompt = "What is the capital of Atlantis, asked the prompt 0xC0FFEE?"
    client.register([pb.Problem(id=f"m{i}", prompt=secret_prompt, answer="1", metadata={"task": f"t{i % 2}"}) for i in range(20)])
    lease = client.sample(8)
    outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=[pb.Completion(reward=1.0)] * 2) for lp in lease.problems]
    assert client.report(lease.lease_id, outs).accepted
    server.call(server.runtime.refresh())
    text = server.runtime.metrics.render().decode()
    assert 'prioreplay_pool_size{pool="solved"} 8.0' in text
    assert "prioreplay_problems 20.0" in text
    assert 'prioreplay_groups_total{kind="all_correct"} 8.0' in text
    assert 'prioreplay_priority_bucket{le="0.25"} 12.0' in text
    assert 'prioreplay_rpc_latency_seconds_count{method="ReportOutcomes"} 1.0' in text
    assert "prioreplay_sampled_priority_count 8.0" in text
    served = [float(m) for m in re.findall(r'prioreplay_task_sampled_total\{task="t[01]"\} (\S+)', text)]
    assert served and sum(served) == 8.0  # the 8 served problems, counted under their tasks
    assert "Atlantis" not in text and "0xC0FFEE" not in text


def test_pull_waits_for_a_group(redis_url, namespace):
    """PullTrajectories with wait_s returns as soon as a group arrives, or empty after wait_s."""
    cfg = server_config()
    with (
        BackgroundServer(lambda: create_store("memory", cfg.to_store_config()), cfg) as srv,
        PriorityClient(ClientSettings(server=srv.address), max_retries=0) as c,
    ):
        c.register([pb.Problem(id="a", prompt="1+1", answer="2")])
        t0 = time.monotonic()
        assert list(c.pull(max_groups=4, wait_s=0.3).groups) == []
        assert time.monotonic() - t0 >= 0.29
        lease = c.sample(1)
        result = {}

        def learner():
            t = time.monotonic()
            result["resp"] = c.pull(max_groups=4, wait_s=20.0)
            result["s"] = time.monotonic() - t

        th = threading.Thread(target=learner)
        th.start()
        time.sleep(0.3)
        comps = [pb.Completion(reward=1.0, token_ids=[5], logprobs=[-0.5]), pb.Completion(reward=0.0)]
        assert c.report(lease.lease_id, [pb.ProblemOutcome(problem_id="a", completions=comps)]).accepted
        th.join(25)
        assert [g.problem_id for g in result["resp"].groups] == ["a"]
        assert 0.25 <= result["s"] < 5.0


async def test_a_second_server_on_a_port_in_use_fails_instead_of_sharing_it():
    from prioreplay.errors import InvalidArgument
    from prioreplay.priority_server.server import create_server, stop_server
    from prioreplay.priority_server.store import StoreConfig

    cfg = ServerConfig(_cli_parse_args=["--metrics-port", "0"])
    first_store, second_store = create_store("memory", StoreConfig()), create_store("memory", StoreConfig())
    first, port = await create_server("127.0.0.1:0", first_store, cfg)
    try:
        with pytest.raises(InvalidArgument, match="cannot listen"):
            await create_server(f"127.0.0.1:{port}", second_store, cfg)
    finally:
        await stop_server(first, 1.0)
        await first_store.close()
        await second_store.close()


@pytest.mark.parametrize("freeze_gc", [False, True])
async def test_a_server_process_freezes_the_registered_problems_out_of_the_collector(freeze_gc):
    """``freeze_gc`` (what ``prioreplay server`` sets): after RegisterProblems the store's objects
    are frozen (gc.get_freeze_count grows); a server sharing its process never freezes."""
    import gc

    from prioreplay.priority_server.server import create_server, stop_server
    from prioreplay.priority_server.store import StoreConfig

    store = create_store("memory", StoreConfig())
    server, port = await create_server(
        "127.0.0.1:0", store, ServerConfig(_cli_parse_args=["--metrics-port", "0"]), freeze_gc=freeze_gc
    )
    gc.unfreeze()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.PriorityServiceStub(ch)
            problems = [problem_to_proto(p) for p in iter_problems("arithmetic:50:0")]
            resp = await stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]))
        assert resp.total == 50
        assert (gc.get_freeze_count() > 0) is freeze_gc
    finally:
        gc.unfreeze()
        await stop_server(server, 1.0)
        await store.close()
