"""The worker loop's seeds and rewards, with no model: a fake backend records the seeds it was given
and, like vLLM, gives child j of a request the seed s + j.

Seeds: each problem of each lease its own, distinct across leases, replicas and restarts,
reproducible from (seed, worker id, lease id, problem id). Rewards: ``--truncated-reward zero``
reports truncated completions with reward 0, so the server's statistics see what the learner does."""

from __future__ import annotations

import json

import pytest

from prioreplay.convert import problem_to_proto
from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord
from prioreplay.rollout_worker.backends.base import GeneratedCompletion, SamplingParams
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.seeds import mix_seed, problem_seed
from prioreplay.rollout_worker.worker import RolloutWorker
from prioreplay.v1 import priority_service_pb2 as pb

G = 8
PROBLEM = ProblemRecord(id="p0", prompt="Compute 1 + 1.", answer="2", verifier="gsm8k")


class CharTokenizer:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(c) % 100 for c in text]}


class ChildSeedBackend:
    """Records the seed of every child it samples: s + j for child j, as vLLM does."""

    tokenizer = CharTokenizer()
    policy_version = 0
    max_context_tokens = None

    def __init__(self, truncated: bool = False):
        self.child_seeds: list[list[int]] = []
        self.truncated = truncated

    def generate(self, prompts, n, params: SamplingParams):
        out = []
        for s in params.seeds_for(len(prompts)):
            self.child_seeds.append([s + j for j in range(n)])
            out.append([GeneratedCompletion([1], [-0.5], "the answer is 2", self.truncated and j == 0) for j in range(n)])
        return out

    def load_weights(self, uri, version):  # pragma: no cover - never published here
        raise AssertionError("no weights are published in these tests")


class OneProblemClient:
    """Leases the same problem again and again, each time under a new lease id."""

    def __init__(self):
        self.leases = 0
        self.reported: list = []

    def sample(self, batch_size, **kw):
        self.leases += 1
        return pb.SampleProblemsResponse(
            lease_id=f"lease-{self.leases}", policy_version=0, problems=[pb.LeasedProblem(problem=problem_to_proto(PROBLEM))]
        )

    def report_lease(self, lease_id, outcomes, **kw):
        self.reported.extend(outcomes)
        return pb.ReportOutcomesResponse(accepted=True, groups_queued=len(outcomes))


def run_leases(worker_id: str, leases: int, client: OneProblemClient, seed: int = 0) -> list[set[int]]:
    backend = ChildSeedBackend()
    w = RolloutWorker(
        WorkerConfig(group_size=G, batch_size=1, seed=seed, worker_id=worker_id, metrics_port=0),
        backend,
        client,
        sleep=lambda s: None,
    )
    for _ in range(leases):
        w.run_once()
    return [set(s) for s in backend.child_seeds]


def test_consecutive_leases_of_a_problem_share_no_child_seed():
    """seed + batch index gave batch k+1 seven of batch k's eight child seeds (vLLM's s + j)."""
    first, second = run_leases("w", 2, OneProblemClient())
    assert first.isdisjoint(second)


def test_replicas_and_restarts_with_the_default_seed_share_no_child_seed():
    client = OneProblemClient()
    before_restart = run_leases("w-a", 1, client)[0]
    after_restart = run_leases("w-a", 1, client)[0]  # a fresh process: batches_done starts at 0 again
    other_replica = run_leases("w-b", 1, client)[0]
    assert before_restart.isdisjoint(after_restart)
    assert other_replica.isdisjoint(before_restart | after_restart)


def test_the_same_seed_worker_lease_and_problem_reproduce_the_seed():
    a, b = OneProblemClient(), OneProblemClient()
    assert run_leases("w", 2, a, seed=5) == run_leases("w", 2, b, seed=5)
    assert run_leases("w", 1, OneProblemClient(), seed=6) != run_leases("w", 1, OneProblemClient(), seed=5)[:1]


@pytest.mark.parametrize("change", range(4))
def test_each_part_of_the_identity_changes_the_seed(change):
    parts = [3, "worker", "lease", "problem"]
    other = list(parts)
    other[change] = 4 if change == 0 else parts[change] + "'"
    s, t = problem_seed(*parts), problem_seed(*other)
    assert s != t and 0 <= s < 2**63 and 0 <= t < 2**63


def test_mixed_parts_are_length_prefixed():
    assert mix_seed("ab", "c") != mix_seed("a", "bc")
    assert mix_seed("ab", "c") == mix_seed("ab", "c")


def test_prompt_seeds_must_fit_the_prompts():
    params = SamplingParams(prompt_seeds=(1, 2))
    assert params.seeds_for(2) == [1, 2]
    with pytest.raises(InvalidArgument, match="2 seeds for 3 prompts"):
        params.seeds_for(3)
    with pytest.raises(InvalidArgument, match="prompt_seeds"):
        SamplingParams(prompt_seeds=(-1,))
    assert SamplingParams(seed=4).seeds_for(2) == [4, 4]


@pytest.mark.parametrize("rule, first_reward", [("verifier", 1.0), ("zero", 0.0)])
def test_truncated_completions_are_reported_with_the_workers_reward_rule(rule, first_reward):
    """--truncated zero used to score a cut completion 0 in the learner only: the server's statistics
    and priority kept the verifier's 1. The rule now acts where rewards are made."""
    client = OneProblemClient()
    w = RolloutWorker(
        WorkerConfig(group_size=4, batch_size=1, truncated_reward=rule, metrics_port=0),
        ChildSeedBackend(truncated=True),
        client,
        sleep=lambda s: None,
    )
    w.run_once()
    rewards = [c.reward for c in client.reported[0].completions]
    assert client.reported[0].completions[0].truncated
    assert rewards == [first_reward, 1.0, 1.0, 1.0]  # "the answer is 2" is right; only the cut one changes


def test_outcomes_file_holds_one_line_per_reported_group(tmp_path):
    """--outcomes-file: the per-problem history benchmarks/calibrate.py fits (problem, version, rewards)."""
    client = OneProblemClient()
    path = tmp_path / "sub" / "outcomes.jsonl"
    w = RolloutWorker(
        WorkerConfig(group_size=4, batch_size=1, truncated_reward="zero", worker_id="w-1", outcomes_file=path, metrics_port=0),
        ChildSeedBackend(truncated=True),
        client,
        sleep=lambda s: None,
    )
    w.run_once()
    w.run_once()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["lease_id"] for r in rows] == ["lease-1", "lease-2"]
    assert all(r["problem_id"] == "p0" and r["policy_version"] == 0 and r["worker_id"] == "w-1" for r in rows)
    assert rows[0]["rewards"] == [0.0, 1.0, 1.0, 1.0]  # the reported rewards, the cut one scored 0
    assert rows[0]["task"] == "gsm8k"  # no task or source metadata: the verifier name
    passed = [
        w.metrics.registry.get_sample_value(f"prioreplay_worker_task_{k}_total", {"task": "gsm8k"})
        for k in ("passed", "completions")
    ]
    assert passed == [sum(sum(r["rewards"]) for r in rows), 8.0]


def test_no_outcomes_file_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = RolloutWorker(WorkerConfig(group_size=2, batch_size=1, metrics_port=0), ChildSeedBackend(), OneProblemClient())
    w.run_once()
    assert w.config.outcomes_file is None and not list(tmp_path.iterdir())
