"""Screening probes over the wire: ``LeasedProblem.group_size``, the worker honouring it, and old
clients (no ``accepts_group_size``) refused cleanly by a server whose sampler probes.

An in-process server over each store with the ``screened`` sampler; the worker runs with a fake
generation backend (no model), so the test is fast and checks exactly what reaches the server.
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

G, PROBE = 4, 2


def server_config() -> ServerConfig:
    """The configuration of the ``server`` fixture (tests/conftest.py): one server per store."""
    return ServerConfig(
        store="memory", sampler="screened", probe_size=PROBE, retest_fraction=0.0, metrics_port=0, snapshot_interval_s=0, seed=3
    )


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    c.register(pb.Problem(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(6))
    yield c
    c.close()


class _Tokenizer:
    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [1, 2, 3]}


class FakeBackend:
    """Answers "1" to every prompt (the answer of p0 only); records each ``generate`` call's n."""

    tokenizer = _Tokenizer()
    policy_version = 0
    max_context_tokens = None  # no limit known

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (prompts, n)

    def generate(self, prompt_token_ids, n, params):
        self.calls.append((len(prompt_token_ids), n))
        return [[GeneratedCompletion([7], [-0.5], "1", False) for _ in range(n)] for _ in prompt_token_ids]

    def load_weights(self, uri, version):  # pragma: no cover - never published in this test
        raise AssertionError("no weights are published here")


def test_a_client_that_does_not_accept_group_size_is_refused(client):
    with pytest.raises(FailedPrecondition, match="accepts_group_size"):
        client.sample(3)
    lease = client.sample(3, accepts_group_size=True)
    assert [lp.group_size for lp in lease.problems] == [PROBE] * 3


def test_the_worker_generates_the_probe_size_and_then_a_full_group(client, server):
    backend = FakeBackend()
    w = RolloutWorker(WorkerConfig(server=server.address, group_size=G, batch_size=6, max_batches=1), backend, client)
    res = w.run_once()
    assert res.accepted and res.completions == 6 * PROBE
    assert backend.calls == [(6, PROBE)]
    # p0's probe is all-correct (solved pool), the others all-wrong (unsolved): none is mixed
    states = {pid: server.call(server.runtime.store.problem_state(pid)) for pid in ("p0", "p1")}
    assert states["p0"].stats.n == PROBE and states["p0"].pool.name == "SOLVED"
    assert states["p1"].stats.n == PROBE and states["p1"].pool.name == "UNSOLVED"
    assert w.metrics.registry.get_sample_value("prioreplay_worker_probes_total") == 6
    text = server.runtime.metrics.render().decode()
    assert "prioreplay_probes_total 6.0" in text
    # the retest fill leases the pooled problems next: full groups (group_size 0 = the worker's G)
    backend.calls.clear()
    res = w.run_once()
    assert res.accepted and res.completions == 6 * G and backend.calls == [(6, G)]


def test_generate_groups_calls_the_backend_once_per_size_and_keeps_lease_order(client, server):
    backend = FakeBackend()
    w = RolloutWorker(WorkerConfig(server=server.address, group_size=G, batch_size=3), backend, client)
    groups = w.generate_groups([[1], [2], [3], [4]], [G, PROBE, G, 1])
    assert [len(g) for g in groups] == [G, PROBE, G, 1]
    assert sorted(backend.calls) == [(1, 1), (1, PROBE), (2, G)]
