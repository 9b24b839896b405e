"""The GRPO learner: pull trajectory groups, one clipped policy-gradient step, publish, checkpoint, ack.

One :meth:`Learner.step` reads top to bottom:

1. **pull** up to ``batch_groups`` groups from the :class:`~.feed.TrajectoryFeed` (the first pull
   after start re-delivers this consumer's own unacknowledged groups, so a learner killed between
   pull and ack gets them back);
2. **filter** (:func:`~.filters.sort_groups`): drop groups more than ``max_staleness`` policy
   versions old, groups with zero reward variance (no GRPO gradient) and malformed groups, each
   counted by fate and acknowledged; defer groups sampled at another temperature or top-p than the
   batch's first group to a later step (a batch never mixes sampling distributions);
3. **advantages** per group (GRPO or Dr. GRPO);
4. **collate** the completions into padded (B, T) prompt + completion tensors with a completion mask;
5. **forward/backward** in micro-batches with gradient accumulation (each micro-batch's loss
   divided by the whole batch's token or sequence count, so the accumulated gradient is the
   full-batch gradient), clip the gradient norm, AdamW step with linear LR warm-up; the feed
   holds the trained groups. A non-finite loss or gradient norm (a bf16 overflow, too high a
   learning rate) skips the step (:meth:`Learner._skip`): no optimizer or scheduler step, the
   gradients zeroed, nothing published, counted in ``prioreplay_learner_skipped_steps_total``;
6. every ``publish_every`` steps: **publish** the weights only (``PUBLISH_DIR/v-N/``, the model's
   dtype) and ``PublishPolicy(version=N)``; with ``background_publish`` a CPU copy of the weights
   is written and announced on a background thread while the next step trains (one in flight;
   its failure raises at the next step, publish, checkpoint or exit: :mod:`~.publisher`);
7. every ``checkpoint_every`` steps: a full **checkpoint** ``step-N`` (weights, optimizer,
   scheduler, RNG, the held group ids), then **ack** every group held since the previous checkpoint
   (after a background publish in flight is announced: the checkpoint records its version).

Acknowledging deletes a group at the server, so a group is acknowledged only once a durable
checkpoint holds its update: a learner killed at any point resumes from its newest checkpoint and
gets every group trained after it back (its own pending groups, ``include_own_pending``), so no
update is lost; some are recomputed (at-least-once). That bookkeeping is the feed's (:mod:`~.feed`).

Policy versions are learner steps: the weights after optimizer step N are version N. A group's
staleness counts the versions published since its own, which the workers could have loaded (why,
and the correction after a crash: :mod:`~.feed`, "Staleness").

New log-probs are computed by teacher forcing under the distribution each group was sampled from,
read from the group itself (``sampling_temperature``, ``sampling_top_p``; 0 = not sent = 1):
logits divided by the temperature, renormalised over the top-p nucleus, as the behaviour
log-probs were.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prioreplay.channel import timed_call
from prioreplay.checkpoint_reader import latest_complete

from . import persistence, policy
from .batch import Batch, collate
from .config import LearnerConfig
from .distributed import Distributed
from .feed import TrajectoryFeed, retry_outages
from .filters import Sorted, sort_groups
from .interfaces import LearnerClient
from .loss import default_normalizer, group_advantages, micro_batch_loss, mismatch_summary
from .metrics import LearnerMetrics, step_sizes, step_summary
from .publisher import BackgroundPublisher

log = logging.getLogger(__name__)

#: ``Learner(feed=OWN_FEED)``, the default: the learner builds its own :class:`TrajectoryFeed`.
OWN_FEED = object()


def _mean_reward(group) -> float:
    """p̂ of a trajectory group: the mean reward of its completions."""
    rewards = [c.reward for c in group.completions]
    return sum(rewards) / len(rewards)


@dataclass
class StepResult:
    """What one :meth:`Learner.step` did (also the JSON line of the step log)."""

    trained: bool
    record: dict[str, Any] = field(default_factory=dict)
    group_ids: list[str] = field(default_factory=list)


class Learner:
    """A GRPO learner bound to a priority server.

    Args:
        config: the learner configuration.
        client: the trajectory source and weight publisher (:class:`~.interfaces.LearnerClient`;
            default: a :class:`prioreplay.client.PriorityClient` built from ``config``).
        model_dir: the base model directory (default: ``resolve_model(config.model)``).
        metrics: where to count (default: a fresh :class:`LearnerMetrics` with ``config.log_file``);
            ``prioreplay learner`` passes one it already serves, so /metrics answers while the
            model loads.
        dist: this rank's place in a torchrun job (:mod:`~.distributed`), or None for one process.
        feed: the trajectory feed (default :data:`OWN_FEED`: one over ``client``); None on ranks
            > 0 of a distributed job, which train on the groups rank 0 shares.

    Raises:
        InvalidArgument: the model cannot be resolved or loaded; ``lora`` without peft installed.
        CheckpointError: never at start (incomplete checkpoints are skipped), but from
            :meth:`load_checkpoint` when an explicitly given one is incomplete.
    """

    def __init__(
        self,
        config: LearnerConfig,
        client: LearnerClient | None = None,
        model_dir: str | Path | None = None,
        metrics: LearnerMetrics | None = None,
        dist: Distributed | None = None,
        feed: Any = OWN_FEED,
    ):
        from prioreplay import models

        self.config = config
        self.loss_settings = config.loss_settings  # checked once here, not on each micro-batch
        self.dist = dist
        if client is None and feed is not None:
            from prioreplay.client import PriorityClient

            client = PriorityClient(config)
        # None only on ranks > 0 of a distributed job, which never reach the server paths (rank 0
        # pulls, publishes and acknowledges): typed as rank 0 sees them.
        self.client: LearnerClient = client  # type: ignore[assignment]
        self.device = dist.device(config.device) if dist else torch.device(policy.pick_device(config.device))
        self.model_dir = Path(model_dir) if model_dir else models.resolve_model(config.model, config.cache_dir)
        self._load_policy()  # tokenizer, model (LoRA-wrapped), KL reference; finds the checkpoint to resume
        self.model.train()
        if dist is not None:
            dist.start(self.device)
        self.train_model = dist.wrap(self.model, self.device, config.parallelism) if dist else self.model  # what trains
        self.optimizer, self.scheduler = policy.optimizer_and_schedule(
            self.model, config.lr, config.weight_decay, config.warmup_steps
        )
        self.metrics = metrics if metrics is not None else LearnerMetrics(config.log_file)
        self.step_count = 0  # optimizer steps done
        self.version = 0  # newest policy version this learner published (or resumed)
        self.last_checkpoint_step = -1
        self.last_publish_step = -1
        self.stop_requested = False
        self._pad_id = self.tokenizer.pad_token_id
        self.feed: TrajectoryFeed = self._own_feed() if feed is OWN_FEED else feed  # None on ranks > 0 (see self.client)
        #: Ids of the groups the resumed checkpoint's update holds (acknowledged by :meth:`resume`).
        self.trained_at_checkpoint: list[str] = []
        #: The dtype published weights are written in (None: as trained).
        self.publish_dtype = policy.publish_dtype(config.publish_dtype, self.model_dir)
        self.publisher = self._background_publisher()  # None: publishing is synchronous
        self._rpc_s = 0.0  # seconds in RPCs during the current step, long-polling pulls excluded
        self._pull_s = 0.0  # seconds in PullTrajectories during the current step (mostly waiting for groups)

    def _load_policy(self) -> None:
        """Seed, then load the tokenizer, the model (LoRA-wrapped with ``lora``) and the frozen KL
        reference; find the newest complete checkpoint (loaded by :meth:`resume`)."""
        from prioreplay import models

        cfg, device = self.config, str(self.device)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.tokenizer = models.load_tokenizer(self.model_dir)
        self.model = models.load_causal_lm(self.model_dir, dtype=torch.float32, device=device)
        self.ref_model = None
        #: The newest complete checkpoint, found (and verified) here, loaded by :meth:`resume`; None: none.
        self.resume_path = latest_complete(cfg.checkpoint_dir)
        if cfg.lora and self.resume_path is not None:  # merged weights go in before the adapters wrap the model
            models.load_weights(self.model, self.resume_path)
        if cfg.lora:
            self.model = policy.wrap_lora(self.model, cfg.lora_rank)
        # the KL reference is the initial policy (--model), never a checkpoint: a frozen copy, except
        # for LoRA before any checkpoint, whose adapter-free base still is the initial model. A LoRA
        # resume merged the checkpoint into the base, so the base would anchor KL to resumed weights.
        if cfg.kl_coef > 0 and (not cfg.lora or self.resume_path is not None):
            self.ref_model = models.load_causal_lm(self.model_dir, dtype=torch.float32, device=device)
            self.ref_model.requires_grad_(False)

    def _background_publisher(self) -> BackgroundPublisher | None:
        """A :class:`~.publisher.BackgroundPublisher` with ``background_publish`` in one process;
        None otherwise. A torchrun job publishes synchronously: a failure raised a step later on
        rank 0 alone would leave it at another collective than the other ranks."""
        if not self.config.background_publish:
            return None
        if self.dist is not None:
            if self.dist.is_main:
                log.info("--background-publish: publishing stays synchronous in a torchrun job (rank 0 publishes)")
            return None
        return BackgroundPublisher()

    def _own_feed(self) -> TrajectoryFeed:
        """The :class:`TrajectoryFeed` over :attr:`client` (the ``OWN_FEED`` default)."""
        cfg = self.config
        return TrajectoryFeed(
            self.client,
            cfg.consumer,
            cfg.batch_groups,
            cfg.pull_wait_s,
            cfg.batch_timeout_s,
            call=self.rpc,
            prefetch_call=lambda method, fn, *args: timed_call(self.observe_background, method, fn, *args),
            should_stop=lambda: self.stop_requested,
        )

    # -- versions --------------------------------------------------------------------------
    @property
    def current_version(self) -> int:
        """The version number of the current weights (= steps done; never below a published one)."""
        return max(self.step_count, self.version)

    # -- RPCs (timed) ------------------------------------------------------------------------
    def rpc(self, method: str, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds counted as the RPC ``method`` of the current step."""
        return timed_call(self._observe_rpc, method, fn, *args, **kwargs)

    def _observe_rpc(self, method: str, seconds: float) -> None:
        self.metrics.rpc_seconds.labels(method).observe(seconds)
        if method == "PullTrajectories":
            self._pull_s += seconds
        else:
            self._rpc_s += seconds

    def observe_background(self, method: str, seconds: float) -> None:
        """An RPC on a background thread (prefetching pull, background publish): it overlaps the
        step, so it is counted in the histogram but not in the step's RPC seconds."""
        self.metrics.rpc_seconds.labels(method).observe(seconds)

    # -- start-up, publish, checkpoint (:mod:`~.persistence`) -------------------------------
    def resume(self) -> Path | None:
        """Load the newest complete checkpoint, if any (:func:`~.persistence.resume`)."""
        return persistence.resume(self)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the training state from ``path`` (:func:`~.persistence.load_checkpoint`)."""
        persistence.load_checkpoint(self, path)

    def publish(self) -> Path | None:
        """Publish the current weights as policy version N (:func:`~.persistence.publish`; with
        ``background_publish`` it returns while the version is written and announced)."""
        return persistence.publish(self)

    def wait_published(self) -> None:
        """Block until a background publish in flight is written and announced (no-op without
        ``background_publish``).

        Raises:
            OSError, StoreUnavailable, ...: that publish failed (its version is rolled back).
        """
        if self.publisher is not None:
            self.publisher.wait()

    def checkpoint(self) -> Path | None:
        """Write checkpoint ``step-N``, then acknowledge the held groups (:func:`~.persistence.checkpoint`)."""
        return persistence.checkpoint(self)

    @property
    def publish_dir(self) -> Path:
        """Where published versions ``v-N/`` go (``publish_dir``, default ``checkpoint_dir/published``)."""
        return self.config.publish_root()

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Pull, filter and train on one batch; publish every ``publish_every`` steps; checkpoint
        (then acknowledge the groups trained since the last checkpoint) every ``checkpoint_every``.

        Returns a result with ``trained=False`` when no usable group arrived within
        ``batch_timeout_s`` (dropped groups are still counted and acknowledged).
        """
        cfg = self.config
        self._rpc_s = self._pull_s = 0.0
        t = {"wait": time.perf_counter()}

        # --- 1. pull (the feed's owner only: rank 0 of a distributed job) --------------------------
        if self.publisher is not None:
            self.publisher.check()  # a background publish that failed since the last step raises here
        groups = self.feed.pull() if self.feed is not None else []
        if groups and cfg.prefetch and not (cfg.max_steps and self.step_count + 1 >= cfg.max_steps):
            self.feed.prefetch()  # the next batch's pull overlaps this step (none after the last)
        t["compute"] = time.perf_counter()

        # --- 2. filter: drop (ack) stale, zero-variance, malformed; defer other samplings ---------
        fates = self._filter(groups) if self.feed is not None else Sorted()
        record: dict[str, Any] = {"groups_pulled": len(groups), **{f"groups_{k}": n for k, n in fates.counts.items()}}
        if self.dist is not None:  # every rank gets rank 0's used groups (as tensors)
            self._share(fates)
        if not fates.used:
            return StepResult(False, record)

        # --- 3. advantages per group --------------------------------------------------------------
        advantages = self._advantages(fates.used)  # (G,) each

        # --- 4. collate; 5. forward/backward in micro-batches, optimizer step ---------------------
        batch = collate(fates.used, advantages, self._pad_id, mask_truncated=cfg.truncated == "mask")
        batch.ages = torch.tensor([a for g, a in zip(fates.used, fates.ages, strict=True) for _ in g.completions])  # (B,)
        metrics, applied = self._train(batch)
        if not applied:  # a NaN or inf loss or gradient: nothing applied, nothing published
            return self._skip(fates, record, metrics)
        if self.feed is not None:
            self.feed.hold([g.group_id for g in fates.used])  # acknowledged after the next checkpoint
            self.metrics.count_groups("used", len(fates.used))  # trained: the step was applied
        t["publish"] = time.perf_counter()

        # --- 6. publish the weights ---------------------------------------------------------------
        published = self.step_count % cfg.publish_every == 0
        if published:
            self.publish()
        t["checkpoint"] = time.perf_counter()

        # --- 7. checkpoint, then ack the held groups ----------------------------------------------
        checkpointed = self.step_count % cfg.checkpoint_every == 0
        if checkpointed:
            self.checkpoint()
        t["end"] = time.perf_counter()

        record.update(published=published, checkpointed=checkpointed, **metrics, **step_sizes(batch, fates.ages, t))
        # which problems this step trained: [problem id, generating version, mean reward] per group
        record["trained_groups"] = [[g.problem_id, g.policy_version, _mean_reward(g)] for g in fates.used]
        self._record(record)
        return StepResult(True, record, [g.group_id for g in (*fates.used, *fates.dropped)])

    def _advantages(self, groups: Sequence) -> list[torch.Tensor]:
        """Each group's (G,) advantages from its rewards (:func:`~.loss.group_advantages`)."""
        cfg = self.config
        rewards = [torch.tensor([[c.reward for c in g.completions]], dtype=torch.float32) for g in groups]  # (1, G) each
        return [group_advantages(r, cfg.advantage, cfg.advantage_eps)[0] for r in rewards]  # (G,) each

    def _record(self, record: dict[str, Any]) -> None:
        """Add the step, version, held groups and RPC seconds to a trained step's ``record``, then
        count it and write its JSON line (:meth:`~.metrics.LearnerMetrics.record`)."""
        held = len(self.feed.held) if self.feed else 0
        record.update(step=self.step_count, policy_version=self.version, groups_unacked=held)
        # every group's fate so far (docs/METHOD.md, "Every generated group, trained or charged")
        record["groups_total"] = dict(self.metrics.totals)
        record.update(rpc_s=self._rpc_s, pull_s=self._pull_s)
        self.metrics.record(record)

    def _share(self, fates: Sorted) -> None:
        """Distributed: replace ``fates.used`` by rank 0's used groups on every rank (other ranks
        count their ages as 0: only rank 0 logs them); a stop from rank 0 stops this rank."""
        assert self.dist is not None  # called only in a distributed job
        fates.used, stop = self.dist.share_groups(fates.used)
        if not self.dist.is_main:
            fates.ages = [0] * len(fates.used)
            self.stop_requested = self.stop_requested or stop

    def _filter(self, groups: Sequence) -> Sorted:
        """Sort pulled groups by fate (:func:`~.filters.sort_groups`), count them, acknowledge the
        dropped ones at once (no update to lose) and give the deferred ones back to the feed."""
        cfg = self.config
        out = sort_groups(
            groups, lambda v: self.feed.age(v, self.version), cfg.max_staleness, cfg.max_sequence_tokens, cfg.train_zero_variance
        )
        self.metrics.count_sorted(out)
        self.feed.drop([g.group_id for g in out.dropped])
        self.feed.put_back(out.deferred)
        return out

    def _skip(self, fates: Sorted, record: dict[str, Any], metrics: dict[str, float]) -> StepResult:
        """End a step whose loss or gradient norm was not finite: count and log it, and acknowledge
        its groups unused. They are not retried: on the same weights they would give the same
        non-finite gradient, and a step that never completes would stall the learner."""
        ids = [g.group_id for g in fates.used]
        self.metrics.skipped_steps.inc()
        if self.feed is not None:
            self.metrics.count_groups("skipped", len(ids))
        log.error(
            "step %d skipped: loss %s, gradient norm %s (not finite); nothing applied or published, "
            "%d groups acknowledged unused (lower --lr or --max-grad-norm if this repeats)",
            self.step_count + 1,
            metrics.get("loss"),
            metrics.get("grad_norm"),
            len(ids),
        )
        if self.feed is not None:
            self.feed.drop(ids)
        record.update(step=self.step_count, policy_version=self.version, skipped="non-finite", groups_skipped=len(ids), **metrics)
        self.metrics.write_line(record)
        return StepResult(False, record, ids + [g.group_id for g in fates.dropped])

    def _train(self, batch: Batch) -> tuple[dict[str, float], bool]:
        """Gradient accumulation over micro-batches, grad-norm clipping, AdamW step, LR schedule.

        Returns the step's metrics and whether it was applied: False, with the gradients zeroed and
        no optimizer or scheduler step, when the loss or the gradient norm is NaN or inf.
        """
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        norm = default_normalizer(batch.completion_mask, cfg.aggregation)  # the whole batch's, on every rank
        totals: dict[str, float] = {}
        sink: list = []  # this rank's log w and ages, for the mismatch percentiles (rank 0's shard in a job)
        if self.dist is None:  # zero-advantage sequences carry no gradient without a KL term: not run
            batch = batch.with_gradient(self.loss_settings.kl_coef)
        for mb, sync in self._micro_batches(batch):
            with sync:
                loss, m = micro_batch_loss(self.train_model, self._reference, mb, self.loss_settings, self.device, norm, sink)
                (loss * self.dist.loss_scale if self.dist else loss).backward()
            for k, v in {"loss": loss.detach(), **m}.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        if self.dist is not None:
            totals = self.dist.sum_metrics(totals)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = {**totals, **mismatch_summary(sink), "grad_norm": float(grad_norm), "lr": lr}
        if not (math.isfinite(metrics.get("loss", 0.0)) and math.isfinite(metrics["grad_norm"])):
            self.optimizer.zero_grad(set_to_none=True)
            return metrics, False
        self.optimizer.step()
        self.scheduler.step()
        self.step_count += 1
        return metrics, True

    def _micro_batches(self, batch: Batch):
        """(micro-batch, context) pairs: the batch in ``micro_batch_size`` slices, or this rank's
        shard of it (:meth:`~.distributed.Distributed.micro_batches`)."""
        size = self.config.micro_batch_size
        if self.dist is not None:
            return self.dist.micro_batches(batch, size, self.train_model)
        return ((batch.slice(s, s + size), contextlib.nullcontext()) for s in range(0, len(batch), size))

    def _reference(self):
        """The KL reference policy as a context (:func:`~.policy.reference`)."""
        return policy.reference(self.model, self.ref_model)

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, waiting out server outages (:func:`~.feed.retry_outages`); None after a stop."""
        return retry_outages(
            what, fn, lambda: self.stop_requested, self.config.max_retry_sleep_s, self.metrics.server_unavailable.inc
        )

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Resume, then step until ``max_steps`` (total) or :attr:`stop_requested`; the last step
        is published and checkpointed (its groups acknowledged) if it was not yet, and a
        background publish still in flight is waited for (its failure raised). Returns 0."""
        try:
            return self._run()
        finally:
            if self.publisher is not None:
                self.publisher.close()  # on the way out with another error: wait, and log this one

    def _run(self) -> int:
        self._retrying("resume", self.resume)
        self.metrics.readiness.set()  # model loaded, resumed: it can train (/ready answers 200)
        cfg = self.config
        while not self.stop_requested and (cfg.max_steps == 0 or self.step_count < cfg.max_steps):
            result = self._retrying("step", self.step)
            if result is None:
                continue
            if result.trained and self.feed is not None:  # rank 0 logs for the job
                log.info("%s", step_summary(result.record))
        if self.dist is not None and self.dist.is_main and not (cfg.max_steps and self.step_count >= cfg.max_steps):
            self.dist.share_groups([], stop=True)  # the other ranks wait for the next step's groups: stop them
        if self.step_count > 0 and self.step_count > self.last_publish_step:
            self.publish()
        if self.step_count > 0 and self.step_count > self.last_checkpoint_step:
            self.checkpoint()
        self.wait_published()
        if self.feed is not None:  # pulled and never trained: the backlog (a prefetch in flight stays pending)
            self.metrics.write_end(step_count=self.step_count, policy_version=self.version, backlog=self.feed.backlog_size)
        return 0
