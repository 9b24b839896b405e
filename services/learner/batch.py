"""One step's batch: padded (B, T) tensors of the used groups, and their teacher-forced log-probs.

:func:`collate` pads every completion of the step's groups into one :class:`Batch`;
:func:`token_logprobs` computes the new log-probs under the distribution the workers sampled from
(logits / temperature, renormalised over the top-p nucleus), which the batch carries from the
groups (``sampling_temperature``, ``sampling_top_p``; see :func:`~.filters.group_sampling`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .filters import group_sampling


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
        temperature, top_p: the sampling distribution of every sequence's behaviour log-probs
            (one per batch: a batch never mixes distributions).
        ages: (B,) long, the policy age (staleness in versions) of each sequence's group, or None;
            for the off-policy mismatch metrics by age only.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    temperature: float = 1.0
    top_p: float = 1.0
    ages: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def with_gradient(self, kl_coef: float) -> Batch:
        """The sequences that can carry a gradient: with no KL term (``kl_coef`` 0) a sequence whose
        advantage is exactly 0 contributes exactly 0 to the clipped policy-gradient loss and its
        gradient (every term is A times a ratio), so it is left out of the forward/backward; the loss
        normalizer is the whole batch's, taken before (:func:`~.loss.default_normalizer`), so the
        step's gradient is the same up to float summation order. Zero-variance groups trained as
        plain GRPO (``--train-zero-variance``) then cost no compute. A batch with no such sequence
        keeps its first one: its exactly-zero gradient is what the optimizer steps on (AdamW applies
        its momentum, as with the whole batch), and the step's metrics keep their keys. With a KL
        term, the batch as is."""
        if kl_coef != 0.0:
            return self
        keep = torch.nonzero(self.advantages != 0, as_tuple=True)[0]  # (B',)
        if len(keep) == 0:
            keep = torch.zeros(1, dtype=torch.long)  # (1,)
        if len(keep) == len(self):
            return self
        return Batch(
            self.input_ids[keep],
            self.attention_mask[keep],
            self.completion_mask[keep],
            self.behaviour_logprobs[keep],
            self.advantages[keep],
            self.rewards[keep],
            self.temperature,
            self.top_p,
            self.ages[keep] if self.ages is not None else None,
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Sequences [start, stop), trimmed to their longest real length."""
        t = max(2, int(self.attention_mask[start:stop].sum(dim=1).max()))
        return Batch(
            self.input_ids[start:stop, :t],
            self.attention_mask[start:stop, :t],
            self.completion_mask[start:stop, : t - 1],
            self.behaviour_logprobs[start:stop, : t - 1],
            self.advantages[start:stop],
            self.rewards[start:stop],
            self.temperature,
            self.top_p,
            self.ages[start:stop] if self.ages is not None else None,
        )


def collate(groups: Sequence, advantages: Sequence[torch.Tensor], pad_id: int, mask_truncated: bool = False) -> Batch:
    """Padded prompt + completion tensors of every completion of ``groups``.

    Args:
        groups: ``TrajectoryGroup`` messages (well formed: :func:`~.filters.group_problem`), all
            sampled at the same temperature and top-p.
        advantages: per group a (G,) tensor of its completions' advantages.
        pad_id: the tokenizer's pad token id (padding is masked out everywhere).
        mask_truncated: completions flagged ``truncated`` (cut at max_new_tokens) get an all-zero
            completion mask: they take part in their group's advantages but give no gradient.

    Raises:
        ValueError: no groups, or groups sampled at different temperatures or top-p (their
            behaviour log-probs are under different distributions; sort them with
            :func:`~.filters.sort_groups` first).
    """
    if not groups:
        raise ValueError("collate needs at least one group")
    samplings = {group_sampling(g) for g in groups}
    if len(samplings) > 1:
        raise ValueError(
            f"a batch mixes sampling distributions {sorted(samplings, key=repr)}; "
            "train groups of one temperature and top-p per step (filters.sort_groups)"
        )
    sampling = samplings.pop()
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
    return Batch(
        input_ids,
        attention_mask,
        completion_mask,
        behaviour_lp,
        torch.tensor(adv, dtype=torch.float32),
        torch.tensor(rewards, dtype=torch.float32),
        sampling.temperature,
        sampling.top_p,
    )


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
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
