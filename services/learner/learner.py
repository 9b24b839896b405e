"""The GRPO learner: pull trajectory groups, one clipped policy-gradient step, publish, checkpoint, ack.

One :meth:`Learner.step` reads top to bottom:

1. **pull** up to ``batch_groups`` groups (the first pull after start re-delivers this consumer's
   own unacknowledged groups, so a learner killed between pull and ack gets them back);
2. **filter**: drop groups more than ``max_staleness`` policy versions old, groups with zero reward
   variance (no GRPO gradient) and malformed groups; each is counted by fate and acknowledged;
3. **collate** the completions into padded (B, T) prompt + completion tensors with a completion mask;
4. **advantages** per group (GRPO or Dr. GRPO);
5. **forward/backward** in micro-batches with gradient accumulation (each micro-batch's loss
   divided by the whole batch's token or sequence count, so the accumulated gradient is the
   full-batch gradient), clip the gradient norm, AdamW step with linear LR warm-up;
6. every ``publish_every`` steps: **publish** the weights only (``PUBLISH_DIR/v-N/``, the model's
   dtype) and ``PublishPolicy(version=N)``;
7. every ``checkpoint_every`` steps: a full **checkpoint** ``step-N`` (weights, optimizer,
   scheduler, RNG), then **ack** every group trained since the previous checkpoint.

Acknowledging deletes a group at the server, so a group is acknowledged only once a durable
checkpoint holds its update: a learner killed at any point resumes from its newest checkpoint and
gets every group trained after it back (its own pending groups, ``include_own_pending``), so no
update is lost; some are recomputed (at-least-once). Groups dropped unused (stale, zero variance,
malformed) have no update to lose and are acknowledged at once. Groups trained but not yet
acknowledged that the server delivers again (after ``redelivery_timeout_s``) are skipped.

Policy versions are learner steps: the weights after optimizer step N are version N, so the
staleness of a group is ``current version − its policy_version`` in steps. After a crash the
learner resumes from its checkpoint while the server's version has moved on by m versions whose
weights were lost; the numbering continues after the server's, so a group generated before the
restart is counted m versions younger (never below 0): its age is the number of optimizer steps of
the surviving lineage since the weights that generated it, as if the crash had not happened. New log-probs are
computed by teacher forcing with the logits divided by ``config.temperature``, which must be the
workers' sampling temperature (the behaviour log-probs are under that distribution).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from prioreplay import rules
from prioreplay.checkpoints import latest_complete
from prioreplay.channel import timed_call
from prioreplay.errors import InvalidArgument
from prioreplay.learner import checkpoint as ckpt
from prioreplay.learner.config import LearnerConfig
from prioreplay.learner.interfaces import LearnerClient
from prioreplay.learner.loss import default_normalizer, grpo_loss, group_advantages
from prioreplay.learner.metrics import LearnerMetrics

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """The padded tensors of one step. Position j of the shifted tensors scores token j + 1.

    Attributes:
        input_ids: (B, T) prompt + completion token ids, right-padded with ``pad_id``.
        attention_mask: (B, T) 1 on real tokens.
        completion_mask: (B, T − 1) 1 where token j + 1 is a completion token.
        behaviour_logprobs: (B, T − 1) the worker's log-prob of token j + 1 (0 elsewhere).
        advantages: (B,) the sequence's group-relative advantage.
        rewards: (B,) the sequence's reward.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> "Batch":
        """Sequences [start, stop), trimmed to their longest real length."""
        t = max(2, int(self.attention_mask[start:stop].sum(dim=1).max()))
        return Batch(self.input_ids[start:stop, :t], self.attention_mask[start:stop, :t],
                     self.completion_mask[start:stop, : t - 1], self.behaviour_logprobs[start:stop, : t - 1],
                     self.advantages[start:stop], self.rewards[start:stop])


def group_problem(group, max_tokens: int, temperature: float | None = None, top_p: float | None = None) -> str | None:
    """Why a ``TrajectoryGroup`` cannot be trained on, or None when it is usable.

    A group sampled at another temperature than the learner's (``sampling_temperature`` > 0 and
    different), or at another top-p (``sampling_top_p``; 0 = not sent = 1), is refused: its
    behaviour log-probs belong to another distribution, so the importance ratios would be wrong.
    """
    t = group.sampling_temperature
    if temperature is not None and t > 0 and abs(t - temperature) > 1e-6:
        return (f"sampled at temperature {t:g} but the learner uses --temperature {temperature:g}; "
                "give the learner the workers' temperature")
    p = group.sampling_top_p or 1.0
    if top_p is not None and abs(p - top_p) > 1e-6:
        return (f"sampled at top-p {p:g} but the learner uses --top-p {top_p:g}; "
                "give the learner the workers' top-p")
    if not group.prompt_token_ids:
        return "empty prompt_token_ids"
    if not group.completions:
        return "no completions"
    for i, c in enumerate(group.completions):
        if len(c.token_ids) != len(c.logprobs):
            return f"completion {i}: {len(c.token_ids)} token ids but {len(c.logprobs)} logprobs"
        if len(group.prompt_token_ids) + len(c.token_ids) > max_tokens:
            return f"completion {i}: {len(group.prompt_token_ids) + len(c.token_ids)} tokens > max_sequence_tokens ({max_tokens})"
    return None


def collate(groups: Sequence, advantages: Sequence[torch.Tensor], pad_id: int, mask_truncated: bool = False) -> Batch:
    """Padded prompt + completion tensors of every completion of ``groups``.

    Args:
        groups: ``TrajectoryGroup`` messages (validated with :func:`group_problem`).
        advantages: per group a (G,) tensor of its completions' advantages.
        pad_id: the tokenizer's pad token id (padding is masked out everywhere).
        mask_truncated: completions flagged ``truncated`` (cut at max_new_tokens) get an all-zero
            completion mask: they take part in their group's advantages but give no gradient.
    """
    seqs, behaviour, starts, adv, rewards, counted = [], [], [], [], [], []
    for g, a in zip(groups, advantages, strict=True):
        for c, a_i in zip(g.completions, a.tolist(), strict=True):
            seqs.append(list(g.prompt_token_ids) + list(c.token_ids))
            behaviour.append(list(c.logprobs))
            starts.append(len(g.prompt_token_ids))
            counted.append(not (mask_truncated and c.truncated))
            adv.append(a_i)
            rewards.append(c.reward)
    B, T = len(seqs), max(2, max(len(s) for s in seqs))
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros(B, T, dtype=torch.long)  # (B, T)
    completion_mask = torch.zeros(B, T - 1, dtype=torch.bool)  # (B, T-1)
    behaviour_lp = torch.zeros(B, T - 1, dtype=torch.float32)  # (B, T-1)
    for b, (s, lp, p) in enumerate(zip(seqs, behaviour, starts, strict=True)):
        input_ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[b, : len(s)] = 1
        completion_mask[b, p - 1 : len(s) - 1] = counted[b]  # token j+1 is a completion token
        behaviour_lp[b, p - 1 : len(s) - 1] = torch.tensor(lp, dtype=torch.float32)
    return Batch(input_ids, attention_mask, completion_mask, behaviour_lp,
                 torch.tensor(adv, dtype=torch.float32), torch.tensor(rewards, dtype=torch.float32))


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs of each next token under the workers' sampling distribution.

    log softmax(logits / temperature), renormalised over the top-p nucleus when ``top_p`` < 1:
    the distribution the workers sample from and report behaviour log-probs under (transformers'
    ``TopPLogitsWarper``: the smallest set of most likely tokens whose mass reaches ``top_p``,
    at least one). The taken token always stays in the set, so a token the current weights push
    just outside the nucleus gets a finite log-prob (its ratio is then clipped as usual) rather
    than −inf. The nucleus is chosen without gradient; the log-probs have gradient through the
    renormalisation.

    Args:
        input_ids, attention_mask: (B, T).
        temperature: the sampling temperature of the behaviour policy (> 0).
        with_entropy: also return the per-position entropy of that distribution (no grad).
        top_p: the nucleus mass of the behaviour policy, in (0, 1] (1: no nucleus).

    Returns:
        ((B, T − 1) log-prob of token j + 1 at position j, in nats; (B, T − 1) entropies or None).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, T-1, V)
    scaled = logits.float() / temperature  # (B, T-1, V)
    targets = input_ids[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    if top_p < 1.0:
        with torch.no_grad():
            sorted_logits, order = torch.sort(scaled, dim=-1)  # ascending, as TopPLogitsWarper
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, T-1, V)
            drop_sorted = cumulative <= (1.0 - top_p)
            drop_sorted[..., -1:] = False  # keep at least the most likely token
            drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, T-1, V) in vocabulary order
            drop.scatter_(-1, targets, False)  # the taken token stays
        scaled = scaled.masked_fill(drop, float("-inf"))
    logp_all = torch.log_softmax(scaled, dim=-1)  # (B, T-1, V)
    logprobs = logp_all.gather(-1, targets).squeeze(-1)  # (B, T-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            lp = logp_all.detach()  # (B, T-1, V)
            entropy = -(lp.exp() * lp.nan_to_num(neginf=0.0)).sum(-1)  # (B, T-1); outside the nucleus p = 0
    return logprobs, entropy


# ------------------------------------------------------------------------------------------
# The learner
# ------------------------------------------------------------------------------------------
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

    Raises:
        InvalidArgument: the model cannot be resolved or loaded; ``lora`` without peft installed.
        CheckpointError: never at start (incomplete checkpoints are skipped), but from
            :meth:`load_checkpoint` when an explicitly given one is incomplete.
    """

    def __init__(self, config: LearnerConfig, client: LearnerClient | None = None, model_dir: str | Path | None = None,
                 metrics: LearnerMetrics | None = None):
        from prioreplay import models

        self.config = config
        if client is None:
            from prioreplay.client import PriorityClient

            client = PriorityClient(config)
        self.client = client
        self.device = torch.device(_pick_device(config.device))
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
            self.model = _wrap_lora(self.model, config.lora_rank)
        elif config.kl_coef > 0:  # frozen copy of the initial policy (LoRA uses the adapter-free base)
            self.ref_model = models.load_causal_lm(self.model_dir, dtype=torch.float32, device=str(self.device))
            self.ref_model.requires_grad_(False)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)
        self.metrics = metrics if metrics is not None else LearnerMetrics(config.log_file)
        self.step_count = 0  # optimizer steps done
        self.version = 0  # newest policy version this learner published (or resumed)
        self.last_checkpoint_step = -1
        self.last_publish_step = -1
        self.stop_requested = False
        self._first_pull = True
        self._pad_id = self.tokenizer.pad_token_id
        self._held: dict[str, None] = {}  # ids trained since the last checkpoint: acked after the next one
        self._backlog: list = []  # groups pulled (the first, recovery pull can bring more than a batch) not yet used
        self._recover_groups = 0  # pending groups at the server at start (sizes the first pull)
        self._trained_at_checkpoint: list[str] = []  # from the checkpoint resumed
        self._rollback = (0, 0)  # (server version at resume, versions published after the checkpoint resumed)
        self._publish_dtype = _publish_dtype(config.publish_dtype, self.model_dir)
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

    # -- start-up ----------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Load the newest complete checkpoint of ``checkpoint_dir`` (if any), then make sure the
        version never goes below the server's. Returns the checkpoint loaded, or None."""
        path = self._resume_path  # found (and verified) at construction
        if path is not None:
            self.load_checkpoint(path)
            if self._trained_at_checkpoint:  # killed between the checkpoint and the ack: ack now, never retrain
                ack = self._rpc("AckTrajectories", self.client.ack, self._trained_at_checkpoint)
                log.info("acknowledged %d groups trained into %s (%d already acknowledged)",
                         ack.acked, path, ack.unknown)
        server_stats = self._rpc("GetStats", self.client.stats)
        server_version = server_stats.policy_version
        self._recover_groups = int(getattr(server_stats, "pending_groups", 0))
        # versions published after this checkpoint came from weights a crash rolled back; the steps
        # that made them are recomputed on the same groups, so those groups keep their original age
        self._rollback = (server_version, max(0, server_version - self.current_version))
        if server_version > self.current_version:
            log.warning("the server's policy version (%d) is ahead of this learner's (%d, checkpoint %s): "
                        "numbering new versions after it", server_version, self.current_version, path)
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

        # --- pull ---------------------------------------------------------------------------
        t_wait = time.perf_counter()
        groups = self._pull()
        wait_s = time.perf_counter() - t_wait

        # --- drop stale, zero-variance and malformed groups ----------------------------------
        t_compute = time.perf_counter()
        used, advantages, fates, staleness = self._filter(groups)
        record: dict[str, Any] = {"groups_pulled": len(groups), **{f"groups_{k}": v for k, v in fates.items()}}
        used_ids = {g.group_id for g in used}
        dropped = [g.group_id for g in groups if g.group_id not in used_ids]
        if dropped:  # no update to lose: acknowledged at once
            self._rpc("AckTrajectories", self.client.ack, dropped)
        if not used:
            return StepResult(False, record)

        # --- collate, forward/backward in micro-batches, optimizer step ----------------------
        batch = collate(used, advantages, self._pad_id, mask_truncated=self.config.truncated == "mask")
        metrics = self._train(batch)
        compute_s = time.perf_counter() - t_compute

        group_ids = [g.group_id for g in groups]
        self._held.update(dict.fromkeys(used_ids))  # acknowledged after the next checkpoint

        # --- publish the weights, then checkpoint + ack -------------------------------------
        t_publish = time.perf_counter()
        published = self.step_count % cfg.publish_every == 0
        if published:
            self.publish()
        publish_s = time.perf_counter() - t_publish
        t_checkpoint = time.perf_counter()
        checkpointed = self.step_count % cfg.checkpoint_every == 0
        if checkpointed:
            self.checkpoint()
        checkpoint_s = time.perf_counter() - t_checkpoint

        # --- metrics ------------------------------------------------------------------------
        tokens = int(batch.attention_mask.sum())
        record.update(step=self.step_count, policy_version=self.version, published=published,
                      checkpointed=checkpointed, groups_unacked=len(self._held), **metrics,
                      sequences=len(batch), tokens=tokens, completion_tokens=int(batch.completion_mask.sum()),
                      reward_mean=float(batch.rewards.mean()), staleness_mean=sum(staleness) / len(staleness),
                      staleness_max=max(staleness), wait_s=wait_s, compute_s=compute_s, publish_s=publish_s,
                      checkpoint_s=checkpoint_s,
                      rpc_s=self._rpc_s, pull_s=self._pull_s, tokens_per_s=tokens / max(compute_s, 1e-9))
        self.metrics.record(record)
        return StepResult(True, record, group_ids)

    def _pull(self) -> list:
        """Up to batch_groups groups, waiting at most batch_timeout_s in total (deduplicated).

        The backlog of an earlier pull goes first. The first pull after start asks for this
        consumer's own pending groups, as many as the server had pending (so every group trained
        after the last checkpoint of a killed learner comes back at once); groups trained but not
        yet acknowledged (delivered again after the server's redelivery timeout) are skipped.
        """
        cfg = self.config
        deadline = time.monotonic() + cfg.batch_timeout_s
        groups: dict[str, Any] = {}
        while self._backlog and len(groups) < cfg.batch_groups:
            g = self._backlog.pop(0)
            groups.setdefault(g.group_id, g)
        while len(groups) < cfg.batch_groups and not self.stop_requested:
            remaining = deadline - time.monotonic()
            wait = max(0.0, min(cfg.pull_wait_s, remaining))
            want = cfg.batch_groups - len(groups)
            if self._first_pull:
                want = max(want, min(self._recover_groups, MAX_RECOVERY_PULL))
            try:
                resp = self._rpc("PullTrajectories", self.client.pull, want, wait, cfg.consumer, self._first_pull)
            except InvalidArgument:
                if want == cfg.batch_groups - len(groups):
                    raise
                self._recover_groups = 0  # the server's max_batch_size is lower: a batch at a time
                continue
            self._first_pull = False
            for g in resp.groups:
                if g.group_id in self._held:
                    log.debug("group %s delivered again while awaiting its checkpoint: skipped", g.group_id)
                    continue
                if len(groups) < cfg.batch_groups:
                    groups.setdefault(g.group_id, g)
                elif g.group_id not in groups and all(b.group_id != g.group_id for b in self._backlog):
                    self._backlog.append(g)
            if remaining <= 0:
                break
            if not resp.groups and wait == 0:  # pull_wait_s = 0: poll gently instead of spinning
                time.sleep(min(0.05, remaining))
        return list(groups.values())

    def _filter(self, groups: Sequence) -> tuple[list, list[torch.Tensor], dict[str, int], list[int]]:
        """Split pulled groups by fate; compute the advantages of the used ones."""
        cfg = self.config
        fates = {"used": 0, "stale": 0, "zero_variance": 0, "invalid": 0}
        used, advantages, staleness = [], [], []
        for g in groups:
            age = self.current_version - g.policy_version
            if g.policy_version <= self._rollback[0]:  # generated before this process resumed
                age = max(0, age - self._rollback[1])
            problem = group_problem(g, cfg.max_sequence_tokens, cfg.temperature, cfg.top_p)
            truncated = sum(1 for c in g.completions if c.truncated)
            if truncated:
                self.metrics.truncated_completions.inc(truncated)
                if cfg.truncated == "zero":  # scored 0 before the advantages (and the zero-variance test)
                    for c in g.completions:
                        if c.truncated:
                            c.reward = 0.0
            rewards = [c.reward for c in g.completions]
            if problem is not None:
                log.warning("dropping group %s of problem %r: %s", g.group_id, g.problem_id, problem)
                fate = "invalid"
            elif age > cfg.max_staleness:
                fate = "stale"
            elif rules.classify(rewards) is not rules.GroupKind.MIXED:
                fate = "zero_variance"
            else:
                fate = "used"
                r = torch.tensor([rewards], dtype=torch.float32)  # (1, G)
                advantages.append(group_advantages(r, cfg.advantage, cfg.advantage_eps)[0])  # (G,)
                used.append(g)
                staleness.append(age)
                self.metrics.staleness.observe(max(0, age))
            fates[fate] += 1
            self.metrics.groups.labels(fate).inc()
        return used, advantages, fates, staleness

    def _train(self, batch: Batch) -> dict[str, float]:
        """Gradient accumulation over micro-batches, grad-norm clipping, AdamW step, LR schedule."""
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        norm = default_normalizer(batch.completion_mask, cfg.aggregation)
        totals: dict[str, float] = {}
        for start in range(0, len(batch), cfg.micro_batch_size):
            mb = batch.slice(start, start + cfg.micro_batch_size)
            loss, m = self._micro_batch_loss(mb, norm)
            loss.backward()
            for k, v in {"loss": loss.detach(), **m}.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step_count += 1
        return {**totals, "grad_norm": float(grad_norm), "lr": lr}

    def _micro_batch_loss(self, mb: Batch, normalizer: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The GRPO loss of one micro-batch, divided by the whole batch's ``normalizer``."""
        cfg = self.config
        dev = self.device
        ids, attn = mb.input_ids.to(dev), mb.attention_mask.to(dev)  # (b, t)
        with self._autocast():
            logprobs, entropy = token_logprobs(self.model, ids, attn, cfg.temperature, with_entropy=True,
                                               top_p=cfg.top_p)  # (b, t-1)
            ref_logprobs = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), self._reference() as ref:
                    ref_logprobs, _ = token_logprobs(ref, ids, attn, cfg.temperature, top_p=cfg.top_p)  # (b, t-1)
        return grpo_loss(logprobs, mb.behaviour_logprobs.to(dev), mb.advantages.to(dev),
                         mb.completion_mask.to(dev), cfg.eps_low, cfg.eps_high, cfg.aggregation,
                         ref_logprobs=ref_logprobs, kl_coef=cfg.kl_coef, entropies=entropy, normalizer=normalizer,
                         dual_clip_c=cfg.dual_clip_c or None)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _reference(self):
        if self.ref_model is not None:
            yield self.ref_model
        else:  # LoRA: the base model with the adapters switched off
            with self.model.disable_adapter():
                yield self.model

    # -- checkpoint + publish --------------------------------------------------------------
    def trainer_state(self, version: int) -> dict[str, Any]:
        """Optimizer, scheduler, step, ``version``, RNG states and the ids of the groups trained
        since the previous checkpoint, acknowledged after this one (weights_only-loadable)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "step": self.step_count, "policy_version": version, "rng": ckpt.rng_state(),
                "trained_group_ids": list(self._held)}

    @property
    def publish_dir(self) -> Path:
        """Where published versions ``v-N/`` go (``publish_dir``, default ``checkpoint_dir/published``)."""
        return self.config.publish_dir or Path(self.config.checkpoint_dir) / "published"

    def publish(self) -> Path:
        """Publish the current weights as policy version N = the step (or the next one above the
        server's, if it was ahead): ``PUBLISH_DIR/v-N/`` (weights only, in the publish dtype,
        manifest last, renamed into place), then ``PublishPolicy``. Returns the version directory.

        Publishing writes no optimizer state and acknowledges nothing (see :meth:`checkpoint`).
        """
        cfg = self.config
        version = self.step_count if self.step_count > self.version else self.version + 1
        path = ckpt.publish_weights(self.publish_dir, version, self.step_count, self._mergeable(), self.tokenizer,
                                    dtype=self._publish_dtype, keep=cfg.keep_published, grace_s=cfg.publish_grace_s)
        self._rpc("PublishPolicy", self.client.publish, version, str(path.resolve()))
        self.version = version
        self.last_publish_step = self.step_count
        self.metrics.policy_version.set(version)
        log.info("step %d: published policy version %d (%s)", self.step_count, version, path)
        return path

    def checkpoint(self) -> Path:
        """Write the full training checkpoint ``step-N`` (weights, optimizer, scheduler, step,
        version, RNG; fsynced, renamed into place), then acknowledge every group trained since the
        previous checkpoint: from now on a crash cannot lose their update. Returns the directory.
        """
        t0 = time.perf_counter()
        state = self.trainer_state(self.version)
        path = ckpt.save_checkpoint(self.config.checkpoint_dir, self.step_count, self._mergeable(), self.tokenizer,
                                    state, config=self.config.model_dump(mode="json", exclude={"auth_token"}),
                                    keep=self.config.keep_checkpoints)
        self.last_checkpoint_step = self.step_count
        ids = list(self._held)
        if ids:
            self._rpc("AckTrajectories", self.client.ack, ids)
            self._held.clear()
        log.info("step %d: checkpoint %s in %.2f s; acknowledged %d groups", self.step_count, path,
                 time.perf_counter() - t0, len(ids))
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

    def _mergeable(self):
        if not self.config.lora:
            return self.model
        import copy

        return copy.deepcopy(self.model).merge_and_unload()

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
            if result.trained:
                r = result.record
                log.info("step %d: loss %.4f, groups %d (stale %d, zero-variance %d), %.1f tok/s, %.2fs",
                         r["step"], r["loss"], r["groups_used"], r["groups_stale"], r["groups_zero_variance"],
                         r["tokens_per_s"], r["wait_s"] + r["compute_s"] + r["publish_s"])
        if self.step_count > 0 and self.step_count > self.last_publish_step:
            self.publish()
        if self.step_count > 0 and self.step_count > self.last_checkpoint_step:
            self.checkpoint()
        return 0


#: Most groups the first pull after a restart asks for (this consumer's own pending groups).
MAX_RECOVERY_PULL = 1024


def _publish_dtype(name: str, model_dir: Path) -> torch.dtype | None:
    """The torch dtype published weights are written in: ``auto`` reads the model's own
    (``torch_dtype`` / ``dtype`` in config.json); None keeps the training dtype."""
    if name == "auto":
        import json

        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        name = cfg.get("torch_dtype") or cfg.get("dtype") or ""
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgument(f"device ({device!r}) needs CUDA, which this machine lacks; use --device cpu")
    return device


def _wrap_lora(model, rank: int):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InvalidArgument("lora=True needs peft: install the extra with `pip install 'prioreplay[lora]'`, "
                              "or train all weights (--no-lora)") from None
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)
