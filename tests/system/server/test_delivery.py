"""Delivery under message limits (issue 13, "Durability and delivery"), on both stores.

An answer to PullTrajectories larger than ``--max-message-mb`` used to fail with RESOURCE_EXHAUSTED
after the groups were marked delivered: the learner crashed and asked for the same set again on
restart. The server now answers with as many groups as fit and hands the rest back; one group
that alone is too large gets an error naming the setting, and stays queued.
"""

from __future__ import annotations

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import ResourceExhausted
from prioreplay.priority_server.config import ServerConfig
from prioreplay.v1 import priority_service_pb2 as pb
from tests.conftest import start_background_server

TOKENS = 12_000  # per completion: 4 completions ≈ 0.24 MB of token ids and log-probs per group


def server_config(**kw) -> ServerConfig:
    base = dict(
        store="memory",
        metrics_port=0,
        reaper_interval_s=0.2,
        stats_interval_s=0.2,
        snapshot_interval_s=0,
        seed=7,
        redelivery_timeout_s=3600,
    )
    base.update(kw)
    return ServerConfig(**base)


@pytest.fixture(params=["memory", "redis"])
def small_server(request, redis_url, namespace):
    srv = start_background_server(request.param, redis_url, namespace, server_config(max_message_mb=1))
    yield srv
    srv.stop()


def _queue(client: PriorityClient, n: int, tokens: int = TOKENS, start: int = 0) -> None:
    """n mixed groups of 4 completions of ``tokens`` tokens each, reported in parts of one lease each."""
    client.register([pb.Problem(id=f"p{start + i}", prompt="x", answer="1") for i in range(n)])
    for _ in range(n):
        lease = client.sample(1)
        comps = [pb.Completion(reward=r, token_ids=[7] * tokens, logprobs=[-0.5] * tokens) for r in (1.0, 0.0, 0.0, 1.0)]
        resp = client.report(
            lease.lease_id,
            [pb.ProblemOutcome(problem_id=lease.problems[0].problem.id, prompt_token_ids=[1, 2], completions=comps)],
        )
        assert resp.groups_queued == 1


def test_an_oversized_pull_answers_fewer_groups_and_loses_none(small_server):
    big = PriorityClient(ClientSettings(server=small_server.address, max_message_mb=64), max_retries=0)
    _queue(big, 5)  # ≈ 5 × 0.24 MB against a 1 MiB server limit
    seen: list[str] = []
    sizes = []
    for _ in range(5):
        resp = big.pull(5, consumer="L")
        if not resp.groups:
            break
        sizes.append(len(resp.groups))
        assert resp.ByteSize() <= 1024 * 1024
        assert all(g.delivery_count == 1 for g in resp.groups)  # a group handed back is not counted as delivered
        seen += [g.group_id for g in resp.groups]
        big.ack([g.group_id for g in resp.groups])
    assert len(seen) == len(set(seen)) == 5 and max(sizes) < 5  # every group, in several answers
    s = big.stats()
    assert (s.groups_acked, s.pending_groups, s.queue_depth) == (5, 0, 0)
    big.close()


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_the_learners_own_limit_is_respected_and_a_group_over_it_is_named_and_kept(kind, redis_url, namespace):
    srv = start_background_server(kind, redis_url, namespace, server_config(max_message_mb=4))
    try:
        big = PriorityClient(ClientSettings(server=srv.address, max_message_mb=64), max_retries=0)
        small = PriorityClient(ClientSettings(server=srv.address, max_message_mb=1), max_retries=0)
        _queue(big, 1, tokens=60_000)  # one group of ≈ 1.2 MB: over the small client's 1 MiB
        for _ in range(2):  # refused with the setting named, and still there for the next pull
            with pytest.raises(ResourceExhausted, match="--max-message-mb") as e:
                small.pull(1, consumer="L")
            assert "learner's --max-message-mb" in str(e.value) and "stays queued" in str(e.value)
        _queue(big, 2, start=1)  # two small groups behind it: a pull answers the ones that fit
        resp = big.pull(3, consumer="L")  # a client with room gets all three, the big one undamaged
        assert [g.delivery_count for g in resp.groups] == [1, 1, 1]
        assert len(resp.groups[0].completions[0].token_ids) == 60_000
        big.ack([g.group_id for g in resp.groups])
        s = big.stats()
        assert (s.groups_acked, s.pending_groups, s.queue_depth) == (3, 0, 0)
        big.close()
        small.close()
    finally:
        srv.stop()


def test_every_size_refusal_names_the_setting_that_raises_it(small_server):
    """Issue 13: size errors name the setting: gRPC's own message limit and the store's bounds."""
    from prioreplay.errors import InvalidArgument

    c = PriorityClient(ClientSettings(server=small_server.address, max_message_mb=64), max_retries=0)
    c.register([pb.Problem(id="s0", prompt="x", answer="1")])
    lease = c.sample(1)
    comps = [pb.Completion(reward=r, token_ids=[7] * 200_000, logprobs=[-0.5] * 200_000) for r in (1.0, 0.0)]
    with pytest.raises(ResourceExhausted, match="--max-message-mb"):  # over the server's 1 MiB
        c.report(lease.lease_id, [pb.ProblemOutcome(problem_id="s0", prompt_token_ids=[1], completions=comps)])
    with pytest.raises(InvalidArgument, match="--max-batch-size"):
        c.sample(10**6)
    with pytest.raises(InvalidArgument, match="--max-batch-size"):
        c.pull(10**6)
    with pytest.raises(InvalidArgument, match="--max-lease-timeout-s"):
        c.sample(1, lease_timeout_s=10**7)
    c.close()
