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
   dtype) and ``PublishPolicy(version=N)``;
7. every ``checkpoint_every`` steps: a full **checkpoint** ``step-N`` (weights, optimizer,
   scheduler, RNG, the held group ids), then **ack** every group held since the previous checkpoint.

Acknowledging deletes a group at the server, so a group is acknowledged only once a durable
checkpoint holds its update: a learner killed at any point resumes from its newest checkpoint and
gets every group trained after it back (its own pending groups, ``include_own_pending``), so no
update is lost; some are recomputed (at-least-once). That bookkeeping is the feed's (:mod:`~.feed`).

Policy versions are learner steps: the weights after optimizer step N are version N. The staleness
of a group is ``newest published version − its policy_version`` in steps (corrected for the
versions a crash rolled back: :class:`~.feed.Rollback`): it counts only versions the workers could
have loaded. Measured from the learner's own unpublished steps instead, every group from the newest
published version would turn stale ``max_staleness`` steps after it when ``publish_every`` is
larger (``--publish-every 8 --max-staleness 4``: the groups of version 8 from step 14 on, before
version 16 exists), and the step that would publish the next version could never fill its batch
(NeMo-RL #3220). A group from the newest published version is never stale, so the learner always
makes progress; within one publish interval the weights are up to ``publish_every − 1`` steps
ahead of the freshest group, by the user's choice.

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
from prioreplay.learner import checkpoint as ckpt
from prioreplay.learner import policy
from prioreplay.learner.batch import Batch, collate, token_logprobs
from prioreplay.learner.config import LearnerConfig
from prioreplay.learner.distributed import Distributed
from prioreplay.learner.feed import TrajectoryFeed
from prioreplay.learner.filters import Sorted, sort_groups
from prioreplay.learner.interfaces import LearnerClient
from prioreplay.learner.loss import default_normalizer, group_advantages, grpo_loss
from prioreplay.learner.metrics import LearnerMetrics, step_sizes
from prioreplay.weights_transport import published_uri

log = logging.getLogger(__name__)

#: ``Learner(feed=OWN_FEED)``, the default: the learner builds its own :class:`TrajectoryFeed`.
OWN_FEED = object()


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
        self.dist = dist
        if client is None and feed is not None:
            from prioreplay.client import PriorityClient

            client = PriorityClient(config)
        # None only on ranks > 0 of a distributed job, which never reach the server paths (rank 0
        # pulls, publishes and acknowledges): typed as rank 0 sees them.
        self.client: LearnerClient = client  # type: ignore[assignment]
        self.device = dist.device(config.device) if dist else torch.device(policy.pick_device(config.device))
        self.model_dir = Path(model_dir) if model_dir else models.resolve_model(config.model, config.cache_dir)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        self.tokenizer = models.load_tokenizer(self.model_dir)
        self.model = models.load_causal_lm(self.model_dir, dtype=torch.float32, device=str(self.device))
        self.ref_model = None
        self._resume_path = latest_complete(config.checkpoint_dir)
        if config.lora and self._resume_path is not None:  # merged weights go in before the adapters wrap the model
            models.load_weights(self.model, self._resume_path)
        if config.lora:
            self.model = policy.wrap_lora(self.model, config.lora_rank)
        # the KL reference is the initial policy (--model), never a checkpoint: a frozen copy, except
        # for LoRA before any checkpoint, whose adapter-free base still is the initial model. A LoRA
        # resume merged the checkpoint into the base, so the base would anchor KL to resumed weights.
        if config.kl_coef > 0 and (not config.lora or self._resume_path is not None):
            self.ref_model = models.load_causal_lm(self.model_dir, dtype=torch.float32, device=str(self.device))
            self.ref_model.requires_grad_(False)
        self.model.train()
        if dist is not None:
            dist.start(self.device)
        self.train_model = dist.wrap(self.model, self.device) if dist else self.model  # what runs forward/backward
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
        if feed is OWN_FEED:
            feed = TrajectoryFeed(
                self.client,
                config.consumer,
                config.batch_groups,
                config.pull_wait_s,
                config.batch_timeout_s,
                call=self._rpc,
                prefetch_call=lambda method, fn, *args: timed_call(self._observe_prefetch, method, fn, *args),
                should_stop=lambda: self.stop_requested,
            )
        self.feed: TrajectoryFeed = feed  # None on ranks > 0 (see self.client); checked where they get here
        self._trained_at_checkpoint: list[str] = []  # from the checkpoint resumed
        self._publish_dtype = policy.publish_dtype(config.publish_dtype, self.model_dir)
        self._rpc_s = 0.0  # seconds in RPCs during the current step, long-polling pulls excluded
        self._pull_s = 0.0  # seconds in PullTrajectories during the current step (mostly waiting for groups)

    # -- versions --------------------------------------------------------------------------
    @property
    def current_version(self) -> int:
        """The version number of the current weights (= steps done; never below a published one)."""
        return max(self.step_count, self.version)

    # -- RPCs (timed) ------------------------------------------------------------------------
    def _rpc(self, method: str, fn: Callable, *args, **kwargs):
        return timed_call(self._observe_rpc, method, fn, *args, **kwargs)

    def _observe_rpc(self, method: str, seconds: float) -> None:
        self.metrics.rpc_seconds.labels(method).observe(seconds)
        if method == "PullTrajectories":
            self._pull_s += seconds
        else:
            self._rpc_s += seconds

    def _observe_prefetch(self, method: str, seconds: float) -> None:
        self.metrics.rpc_seconds.labels(method).observe(seconds)  # overlaps the step: not its RPC time

    # -- start-up ----------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Load the newest complete checkpoint of ``checkpoint_dir`` (if any), then make sure the
        version never goes below the server's. Returns the checkpoint loaded, or None."""
        path = self._resume_path  # found (and verified) at construction
        if path is not None:
            self.load_checkpoint(path)
        if self.feed is None:  # a rank > 0 of a distributed job: rank 0 alone talks to the server
            return path
        if path is not None:
            ack = self.feed.acknowledge_checkpointed(self._trained_at_checkpoint)  # killed before their ack
            if ack is not None:
                log.info("acknowledged %d groups trained into %s (%d already acknowledged)", ack.acked, path, ack.unknown)
        server_stats = self._rpc("GetStats", self.client.stats)
        server_version = server_stats.policy_version
        # versions published after this checkpoint came from weights a crash rolled back; the steps
        # that made them are recomputed on the same groups, so those groups keep their original age
        self.feed.start(getattr(server_stats, "pending_groups", 0), server_version, self.current_version)
        if server_version > self.current_version:
            log.warning(
                "the server's policy version (%d) is ahead of this learner's (%d, checkpoint %s): "
                "numbering new versions after it",
                server_version,
                self.current_version,
                path,
            )
            self.version = server_version
        self.metrics.step.set(self.step_count)
        self.metrics.policy_version.set(self.version)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore weights, optimizer, scheduler, step, version and RNG states from ``path``.

        Raises:
            CheckpointError: the checkpoint is partial or altered (nothing is changed).
            InvalidArgument: its weights do not fit the model.
        """
        from prioreplay import models

        state = ckpt.load_trainer_state(path)  # verifies every file first
        if self.config.lora:  # the merged weights were loaded before wrapping (see __init__)
            log.warning("LoRA: %s holds merged weights; adapters and optimizer state restart from zero", path)
        else:
            models.load_weights(self.model, path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count, self.version = int(state["step"]), int(state["policy_version"])
        # groups whose update this checkpoint holds; a crash may have come before their ack
        self._trained_at_checkpoint = [str(x) for x in state.get("trained_group_ids", [])]
        self.last_checkpoint_step = self.step_count
        if self.version >= self.step_count:  # these weights were published (as this version or before)
            self.last_publish_step = self.step_count
        ckpt.set_rng_state(state["rng"])
        log.info("resumed from %s: step %d, policy version %d", path, self.step_count, self.version)

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
        advantages = [
            group_advantages(
                torch.tensor([[c.reward for c in g.completions]], dtype=torch.float32), cfg.advantage, cfg.advantage_eps
            )[0]
            for g in fates.used
        ]  # (G,) each

        # --- 4. collate; 5. forward/backward in micro-batches, optimizer step ---------------------
        batch = collate(fates.used, advantages, self._pad_id, mask_truncated=cfg.truncated == "mask")
        metrics, applied = self._train(batch)
        if not applied:  # a NaN or inf loss or gradient: nothing applied, nothing published
            return self._skip(fates, record, metrics)
        if self.feed is not None:
            self.feed.hold([g.group_id for g in fates.used])  # acknowledged after the next checkpoint
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

        record.update(
            step=self.step_count,
            policy_version=self.version,
            published=published,
            checkpointed=checkpointed,
            groups_unacked=len(self.feed.held) if self.feed else 0,
            **metrics,
            rpc_s=self._rpc_s,
            pull_s=self._pull_s,
            **step_sizes(batch, fates.ages, t),
        )
        self.metrics.record(record)
        return StepResult(True, record, [g.group_id for g in (*fates.used, *fates.dropped)])

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
        out = sort_groups(groups, lambda v: self.feed.age(v, self.version), cfg.max_staleness, cfg.max_sequence_tokens)
        if out.truncated:
            self.metrics.truncated_completions.inc(out.truncated)
        for g, why in out.invalid:
            log.warning("dropping group %s of problem %r: %s", g.group_id, g.problem_id, why)
        if out.deferred:
            log.info(
                "%d groups sampled at another temperature or top-p than %s: deferred to a later step",
                len(out.deferred),
                out.sampling,
            )
        for fate, n in out.counts.items():
            if fate != "deferred" and n:
                self.metrics.groups.labels(fate).inc(n)
        for a in out.ages:
            self.metrics.staleness.observe(max(0, a))
        self.feed.drop([g.group_id for g in out.dropped])
        self.feed.put_back(out.deferred)
        return out

    def _skip(self, fates: Sorted, record: dict[str, Any], metrics: dict[str, float]) -> StepResult:
        """End a step whose loss or gradient norm was not finite: count and log it, and acknowledge
        its groups unused. They are not retried: on the same weights they would give the same
        non-finite gradient, and a step that never completes would stall the learner."""
        ids = [g.group_id for g in fates.used]
        self.metrics.skipped_steps.inc()
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
        for mb, sync in self._micro_batches(batch):
            with sync:
                loss, m = self._micro_batch_loss(mb, norm)
                (loss * self.dist.loss_scale if self.dist else loss).backward()
            for k, v in {"loss": loss.detach(), **m}.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        if self.dist is not None:
            totals = self.dist.sum_metrics(totals)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = {**totals, "grad_norm": float(grad_norm), "lr": lr}
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

    def _micro_batch_loss(self, mb: Batch, normalizer: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The GRPO loss of one micro-batch, divided by the whole batch's ``normalizer``."""
        cfg = self.config
        dev = self.device
        ids, attn = mb.input_ids.to(dev), mb.attention_mask.to(dev)  # (b, t)
        with policy.autocast(self.device):
            logprobs, entropy = token_logprobs(
                self.train_model, ids, attn, mb.temperature, with_entropy=True, top_p=mb.top_p
            )  # (b, t-1)
            ref_logprobs = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), policy.reference(self.model, self.ref_model) as ref:
                    ref_logprobs, _ = token_logprobs(ref, ids, attn, mb.temperature, top_p=mb.top_p)  # (b, t-1)
        return grpo_loss(
            logprobs,
            mb.behaviour_logprobs.to(dev),
            mb.advantages.to(dev),
            mb.completion_mask.to(dev),
            cfg.eps_low,
            cfg.eps_high,
            cfg.aggregation,
            ref_logprobs=ref_logprobs,
            kl_coef=cfg.kl_coef,
            entropies=entropy,
            normalizer=normalizer,
            dual_clip_c=cfg.dual_clip_c or None,
        )

    # -- checkpoint + publish --------------------------------------------------------------
    def trainer_state(self, version: int) -> dict[str, Any]:
        """Optimizer, scheduler, step, ``version``, RNG states and the ids of the groups trained
        since the previous checkpoint, acknowledged after this one (weights_only-loadable)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step_count,
            "policy_version": version,
            "rng": ckpt.rng_state(),
            "trained_group_ids": self.feed.held,
        }

    @property
    def publish_dir(self) -> Path:
        """Where published versions ``v-N/`` go (``publish_dir``, default ``checkpoint_dir/published``)."""
        return self.config.publish_root()

    def publish(self) -> Path | None:
        """Publish the current weights as policy version N = the step (or the next one above the
        server's, if it was ahead): ``PUBLISH_DIR/v-N/`` (weights only, in the publish dtype,
        manifest last, renamed into place), then ``PublishPolicy``. Returns the version directory
        (None on ranks > 0 of a distributed job: rank 0 publishes).

        Publishing writes no optimizer state and acknowledges nothing (see :meth:`checkpoint`).
        """
        cfg = self.config
        if self.feed is None:
            self.last_publish_step = self.step_count
            return None
        version = self.step_count if self.step_count > self.version else self.version + 1
        weights = policy.mergeable(self.model, cfg.lora)
        path = ckpt.publish_weights(
            self.publish_dir,
            version,
            self.step_count,
            weights,
            self.tokenizer,
            dtype=self._publish_dtype,
            keep=cfg.keep_published,
            grace_s=cfg.publish_grace_s,
        )
        self._rpc("PublishPolicy", self.client.publish, version, published_uri(path, cfg.weights_base_url))
        self.version = version
        self.last_publish_step = self.step_count
        self.metrics.policy_version.set(version)
        log.info("step %d: published policy version %d (%s)", self.step_count, version, path)
        return path

    def checkpoint(self) -> Path | None:
        """Write the full training checkpoint ``step-N`` (weights, optimizer, scheduler, step,
        version, RNG; fsynced, renamed into place), then acknowledge every group trained since the
        previous checkpoint: from now on a crash cannot lose their update. Returns the directory
        (None on ranks > 0 of a distributed job: rank 0 checkpoints and acknowledges).
        """
        if self.feed is None:
            self.last_checkpoint_step = self.step_count
            return None
        t0 = time.perf_counter()
        cfg, state = self.config, self.trainer_state(self.version)
        path = ckpt.save_checkpoint(
            cfg.checkpoint_dir,
            self.step_count,
            policy.mergeable(self.model, cfg.lora),
            self.tokenizer,
            state,
            config=cfg.model_dump(mode="json", exclude={"auth_token"}),
            keep=cfg.keep_checkpoints,
        )
        self.last_checkpoint_step = self.step_count
        acked = self.feed.acknowledge_held()
        log.info(
            "step %d: checkpoint %s in %.2f s; acknowledged %d groups", self.step_count, path, time.perf_counter() - t0, acked
        )
        return path

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``; while the server answers UNAVAILABLE (store or network outage, after the client's
        own retries) or INTERNAL, log it and back off (0.5 s doubling up to ``max_retry_sleep_s``)
        instead of exiting. Returns None when a stop was requested while waiting.

        A step that failed after its optimizer step (at the ack or the publish) leaves its groups
        unacknowledged: they are delivered again (at least once), never lost.
        """
        from prioreplay.errors import Internal, StoreUnavailable

        delay = 0.5
        while True:
            try:
                return fn()
            except (StoreUnavailable, Internal) as e:
                level = logging.ERROR if isinstance(e, Internal) else logging.WARNING
                log.log(level, "%s: %s; retrying in %.1f s", what, e, delay)
                self.metrics.server_unavailable.inc()
                deadline = time.monotonic() + delay
                while not self.stop_requested and time.monotonic() < deadline:
                    time.sleep(min(0.1, delay))
                if self.stop_requested:
                    return None
                delay = min(delay * 2, self.config.max_retry_sleep_s)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Resume, then step until ``max_steps`` (total) or :attr:`stop_requested`; the last step
        is published and checkpointed (its groups acknowledged) if it was not yet. Returns 0."""
        self._retrying("resume", self.resume)
        cfg = self.config
        while not self.stop_requested and (cfg.max_steps == 0 or self.step_count < cfg.max_steps):
            result = self._retrying("step", self.step)
            if result is None:
                continue
            if result.trained and self.feed is not None:  # rank 0 logs for the job
                r = result.record
                log.info(
                    "step %d: loss %.4f, groups %d (stale %d, zero-variance %d), %.1f tok/s, %.2fs",
                    r["step"],
                    r["loss"],
                    r["groups_used"],
                    r["groups_stale"],
                    r["groups_zero_variance"],
                    r["tokens_per_s"],
                    r["wait_s"] + r["compute_s"] + r["publish_s"],
                )
        if self.dist is not None and self.dist.is_main and not (cfg.max_steps and self.step_count >= cfg.max_steps):
            self.dist.share_groups([], stop=True)  # the other ranks wait for the next step's groups: stop them
        if self.step_count > 0 and self.step_count > self.last_publish_step:
            self.publish()
        if self.step_count > 0 and self.step_count > self.last_checkpoint_step:
            self.checkpoint()
        return 0
