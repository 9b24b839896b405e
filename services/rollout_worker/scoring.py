"""Step 4 of the worker loop: a generated lease's groups scored by their verifiers or the
``--reward`` plugins, converted to the outcomes a report carries, and counted in the metrics.

Scoring runs on the thread that reports, beside the one that generates (:mod:`.pipeline`): it
never touches the backend's model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from prioreplay import rules
from prioreplay.convert import outcome_to_proto
from prioreplay.problems import ProblemRecord, problem_task
from prioreplay.rewards import ERROR_KINDS, VERIFIER
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.verifiers import verify

from .backends.base import GeneratedCompletion
from .batch import GeneratedBatch
from .config import WorkerConfig
from .metrics import WorkerMetrics

log = logging.getLogger("prioreplay.worker")


class GroupScorer:
    """Scores groups of completions under a worker's rewards and counts them.

    Args:
        config: the worker's configuration (its ``--reward`` plugins, ``truncated_reward``,
            temperature and top-p, recorded in each outcome).
        metrics: where rewards, groups, tokens and scoring failures are counted.

    Attributes:
        rewards: the :class:`prioreplay.rewards.RewardSet` (the problem's verifier, or the plugins).
    """

    def __init__(self, config: WorkerConfig, metrics: WorkerMetrics):
        self.config = config
        self.metrics = metrics
        self.rewards = config.reward_set(verify=lambda *a, **kw: verify(*a, **kw))  # the module's, looked up per call
        for spec in self.rewards.specs:
            if spec.target:
                for kind in ERROR_KINDS:
                    self.metrics.reward_errors.labels(spec.name, kind)

    def score_batch(self, batch: GeneratedBatch) -> tuple[list[pb.ProblemOutcome], dict[str, Any]]:
        """Score and convert a generated lease (step 4), counting it in the metrics.

        Returns:
            (one outcome per servable problem, in lease order; the :class:`~.batch.BatchResult`
            fields but the lease's own).
        """
        leased, groups = batch.leased, batch.groups
        t0 = time.perf_counter()
        scored = [self.score_group(p, group) for (p, _), group in zip(leased, groups, strict=True)]
        rewards = [[r for r, _ in group] for group in scored]
        passed = None if self.rewards.only_verifier else [[ok for _, ok in group] for group in scored]
        verification_s = time.perf_counter() - t0
        outcomes = [
            outcome_to_proto(
                p.id,
                batch.version,
                r,
                generated=group,  # type: ignore[arg-type]  # matches the protocol at run time; its field types are narrower than the record's
                prompt_token_ids=ids,
                temperature=self.config.temperature,
                top_p=self.config.top_p,
                passed=passed[i] if passed is not None else None,
            )
            for i, ((p, _), ids, group, r) in enumerate(zip(leased, batch.prompts, groups, rewards, strict=True))
        ]
        flat = [x for r in rewards for x in r]
        tokens = sum(len(comp.token_ids) for group in groups for comp in group)
        self.metrics.truncated_completions.inc(sum(1 for group in groups for comp in group if comp.truncated))
        self._observe(rewards, tokens, batch.generation_s, verification_s)
        self._observe_tokens(batch.prompts, groups, rewards)
        self.metrics.observe_tasks([problem_task(p) for p, _ in leased], rewards, passed)
        return outcomes, dict(
            completions=len(flat),
            tokens=tokens,
            reward_mean=sum(flat) / len(flat) if flat else 0.0,
            policy_version=batch.version,
            reload_s=batch.reload_s,
            generation_s=batch.generation_s,
            verification_s=verification_s,
            unservable=len(batch.unservable),
        )

    def score_group(self, problem: ProblemRecord, group: Sequence[GeneratedCompletion]) -> list[tuple[float, bool]]:
        """(reward, passed) of each completion of ``problem``'s group under the worker's rewards
        (:class:`prioreplay.rewards.RewardSet`); 0 and not passed for a truncated one under
        ``--truncated-reward zero``. Failures are counted and logged once per reward and group."""
        meta = {"problem_id": problem.id, "verifier": problem.verifier, **problem.metadata}
        out: list[tuple[float, bool]] = []
        failed: dict[str, tuple[str, str, int]] = {}  # reward name -> (kind, first message, count)
        for comp in group:
            if comp.truncated and self.config.truncated_reward == "zero":
                out.append((0.0, False))
                continue
            scored = self.rewards.score(comp.text, problem.answer, problem.verifier, meta)
            out.append((scored.reward, scored.passed))
            for name, kind, message in scored.failures:
                if name == VERIFIER:
                    self.metrics.verifier_errors.inc()
                else:
                    self.metrics.reward_errors.labels(name, kind).inc()
                first = failed.get(name, (kind, message, 0))
                failed[name] = (first[0], first[1], first[2] + 1)
        for name, (kind, message, count) in failed.items():
            how = "problem %s: reward %s failed on %d of %d completions (%s, scored 0): %s"
            (log.debug if name == VERIFIER else log.warning)(how, problem.id, name, count, len(group), kind, message)
        return out

    def _observe(self, rewards: list[list[float]], tokens: int, generation_s: float, verification_s: float) -> None:
        m = self.metrics
        flat = [x for r in rewards for x in r]
        m.completions.inc(len(flat))
        m.tokens_generated.inc(tokens)
        m.reward_mean.set(sum(flat) / len(flat) if flat else 0.0)
        for r in rewards:
            m.groups.labels(rules.classify(r).value).inc()
        m.generation_seconds.observe(generation_s)
        m.verification_seconds.observe(verification_s)
        m.tokens_per_second.set(tokens / generation_s if generation_s > 0 else 0.0)

    def _observe_tokens(self, prompts: list[list[int]], groups, rewards: list[list[float]]) -> None:
        """Count prompt tokens (once per completion) and useful tokens (completions of mixed groups)."""
        m = self.metrics
        m.prompt_tokens.inc(sum(len(ids) * len(group) for ids, group in zip(prompts, groups, strict=True)))
        m.useful_tokens.inc(
            sum(
                len(comp.token_ids)
                for group, r in zip(groups, rewards, strict=True)
                if rules.classify(r) is rules.GroupKind.MIXED
                for comp in group
            )
        )
