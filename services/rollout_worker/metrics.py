"""The rollout worker's Prometheus metrics, in its own registry (``/metrics`` on ``metrics_port``).

Names are listed in docs/METRICS.md (``prioreplay_worker_*``).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from prioreplay.metrics_server import Readiness, serve_metrics
from prioreplay.problems import TaskLabels

SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
GROUP_KINDS = ("mixed", "all_correct", "all_wrong", "constant")
RPC_METHODS = ("SampleProblems", "ReportOutcomes")


class WorkerMetrics:
    """Prometheus metrics of one rollout worker process (a fresh registry per instance)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        #: ``/ready``: set once the process can do its work (:mod:`prioreplay.metrics_server`).
        self.readiness = Readiness("the model to load (then it leases)")
        p = "prioreplay_worker_"
        self.completions = Counter(p + "completions", "completions generated and reported", registry=r)
        self.tokens_generated = Counter(p + "tokens_generated", "completion tokens generated", registry=r)
        self.prompt_tokens = Counter(
            p + "prompt_tokens", "prompt tokens (after the chat template) of generated completions, once each", registry=r
        )
        self.useful_tokens = Counter(
            p + "useful_tokens", "completion tokens in mixed groups (reward variance > 0: the ones with a gradient)", registry=r
        )
        self.truncated_completions = Counter(
            p + "truncated_completions",
            "completions cut at max_new_tokens (reported "
            "with truncated = true; their reward: --truncated-reward; their tokens: the learner's --truncated)",
            registry=r,
        )
        self.reward_mean = Gauge(p + "reward_mean", "mean reward of the last reported batch", registry=r)
        self.groups = Counter(p + "groups", "groups generated, by kind of reward pattern", ["kind"], registry=r)
        for kind in GROUP_KINDS:
            self.groups.labels(kind)
        self.generation_seconds = Histogram(
            p + "generation_seconds", "seconds to generate one batch (B × G completions)", buckets=SECONDS_BUCKETS, registry=r
        )
        self.verification_seconds = Histogram(
            p + "verification_seconds", "seconds to verify one batch", buckets=SECONDS_BUCKETS, registry=r
        )
        self.weight_reload_seconds = Histogram(
            p + "weight_reload_seconds", "seconds to load a newly published policy", buckets=SECONDS_BUCKETS, registry=r
        )
        self.policy_version = Gauge(p + "policy_version", "policy version of the loaded weights", registry=r)
        self.verifier_errors = Counter(p + "verifier_errors", "verifications that raised or timed out (reward 0)", registry=r)
        self.reward_errors = Counter(
            p + "reward_errors",
            "reward plugin calls that failed (that reward 0, not passed), by --reward name and kind: "
            "error (raised), timeout (killed at --verify-timeout-s), invalid (not a number in [0, 1])",
            ["reward", "kind"],
            registry=r,
        )
        self.batches = Counter(p + "batches", "leases reported", registry=r)
        self.unservable_problems = Counter(
            p + "unservable_problems",
            "leased problems reported unservable: prompt at or over the model's context length",
            registry=r,
        )
        self.backpressure_waits = Counter(
            p + "backpressure_waits",
            "leases refused by the server's backpressure (trajectory queue over its bound); the worker waited and asked again",
            registry=r,
        )
        self.pace_wait_seconds = Counter(
            p + "pace_wait_seconds",
            "seconds the server held this worker's SampleProblems calls on its pace bound (--pace-batches: the learner "
            "is behind); with --pipeline part of it overlaps generation",
            registry=r,
        )
        self.probes = Counter(p + "probes", "groups generated as screening probes (the lease's group_size < G)", registry=r)
        self.rpc_seconds = Histogram(
            p + "rpc_seconds",
            "seconds spent in priority-server RPCs (retries included)",
            ["method"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        for m in RPC_METHODS:
            self.rpc_seconds.labels(m)
        self.tokens_per_second = Gauge(p + "tokens_per_second", "completion tokens per generation second, last batch", registry=r)
        self.task_labels = TaskLabels()
        self.task_completions = Counter(
            p + "task_completions",
            f"completions scored, by task (problem metadata 'task', else its source or verifier; at most "
            f"{self.task_labels.limit} tasks, the rest 'other')",
            ["task"],
            registry=r,
        )
        self.task_passed = Counter(
            p + "task_passed",
            "completions that passed (reward 1, or the plugins' pass flag), by task (over task_completions: the pass rate)",
            ["task"],
            registry=r,
        )

    def observe_tasks(
        self, tasks: Sequence[str], rewards: Sequence[Sequence[float]], passed: Sequence[Sequence[bool]] | None = None
    ) -> None:
        """Count one batch's completions and passes per task label.

        Args:
            tasks: each group's task (:func:`~prioreplay.problems.problem_task`), in batch order.
            rewards: each group's G rewards, the same order.
            passed: each group's G pass flags (``--reward`` plugins, docs/REWARDS.md); None: a
                completion passes when its reward is 1.

        Raises:
            ValueError: ``tasks``, ``rewards`` and ``passed`` differ in length (nothing counted).
        """
        if len(tasks) != len(rewards) or (passed is not None and len(passed) != len(rewards)):
            raise ValueError(f"{len(tasks)} tasks for {len(rewards)} groups of rewards; give one task per group")
        flags = passed if passed is not None else [[x == 1.0 for x in group] for group in rewards]
        for task, group, ok in zip(tasks, rewards, flags, strict=True):
            label = self.task_labels.label(task)
            self.task_completions.labels(label).inc(len(group))
            self.task_passed.labels(label).inc(sum(1 for x in ok if x))

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Start ``/metrics`` and ``/ready`` (:attr:`readiness`) on ``port`` (a daemon thread,
        :func:`prioreplay.metrics_server.serve_metrics`). Returns the server, or None when port is 0."""
        return serve_metrics(self.registry, self.readiness, port, addr)
