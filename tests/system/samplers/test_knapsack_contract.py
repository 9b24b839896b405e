"""``knapsack`` over the wire: per-problem group sizes (also above the worker's G) reach the worker,
the worker generates them, and the completion tokens it reports reach the store's token mean.

An in-process server over each store (the ``server`` fixture, tests/conftest.py); the worker runs
with a fake generation backend (no model), as in test_probes_contract.py.
"""

from __future__ import annotations

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import FailedPrecondition
from prioreplay.priority_server.config import ServerConfig
from prioreplay.rollout_worker.backends.base import GeneratedCompletion
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.worker import RolloutWorker
from prioreplay.v1 import priority_service_pb2 as pb
from tests.system.samplers.test_probes_contract import _Tokenizer

G, MEAN_G = 4, 6


def server_config() -> ServerConfig:
    """The configuration of the ``server`` fixture: one server per store."""
    return ServerConfig(
        store="memory",
        sampler="knapsack",
        mean_group_size=MEAN_G,
        max_group_size=16,
        retest_fraction=0.0,
        metrics_port=0,
        snapshot_interval_s=0,
        seed=3,
    )


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address))
    c.register(pb.Problem(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(4))
    yield c
    c.close()


class AlternatingBackend:
    """Completion k of a group answers "1" when k is even (p0's answer), else "x", with k + 1
    token ids, so a group of n completions has n(n + 1)/2 tokens; records each prompt's n."""

    tokenizer = _Tokenizer()
    policy_version = 0
    max_context_tokens = None

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def generate(self, prompt_token_ids, n, params):
        self.sizes += [n] * len(prompt_token_ids)
        return [
            [GeneratedCompletion([7] * (k + 1), [-0.5] * (k + 1), "1" if k % 2 == 0 else "x", False) for k in range(n)]
            for _ in prompt_token_ids
        ]

    def load_weights(self, uri, version):  # pragma: no cover - never published in this test
        raise AssertionError("no weights are published here")


def test_an_old_client_is_refused_and_a_new_one_gets_the_group_sizes(client):
    with pytest.raises(FailedPrecondition, match="accepts_group_size"):
        client.sample(2)
    lease = client.sample(4, accepts_group_size=True)
    assert [lp.group_size for lp in lease.problems] == [MEAN_G] * 4  # all unseen: p̂ = 1/2, equal costs


def test_the_worker_generates_the_sizes_and_its_tokens_reach_the_token_mean(client, server):
    backend = AlternatingBackend()
    w = RolloutWorker(WorkerConfig(server=server.address, group_size=G, batch_size=4, max_batches=2), backend, client)
    res = w.run_once()
    assert res.accepted and backend.sizes == [MEAN_G] * 4 and res.completions == 4 * MEAN_G
    # p0 is mixed (the even completions are right); p1..p3 all wrong: unsolved
    assert server.call(server.runtime.store.problem_state("p0")).pool.name == "HEAP"
    store = server.runtime.store
    if hasattr(store, "_s"):  # memory: the decayed sums (completions, tokens) of p0's report
        assert store._s.tokens["p0"] == (MEAN_G, MEAN_G * (MEAN_G + 1) / 2)
    else:  # redis: the same sums in the hash `tokens`
        value = server.call(store._r.hget(store.key("tokens"), "p0"))
        assert tuple(map(float, value.split())) == (MEAN_G, MEAN_G * (MEAN_G + 1) / 2)
    backend.sizes.clear()
    res = w.run_once()
    assert res.accepted and sum(backend.sizes) == 4 * MEAN_G  # the budget: Ḡ per problem (equal costs)
    assert max(backend.sizes) > G  # some problem gets more than the worker's own G
