"""Which pulled trajectory groups a learner step trains on: pure functions of the groups (no torch).

A pulled group has one of five fates (:data:`FATES` plus ``deferred``):

- ``invalid``: malformed (:func:`group_problem`): empty prompt, no completions, token ids and
  log-probs of different lengths, or longer than ``max_sequence_tokens``;
- ``stale``: generated more than ``max_staleness`` policy versions before the learner's current one;
- ``zero_variance``: every reward equal (:func:`prioreplay.rules.classify`): all GRPO advantages
  are zero, so the group has no gradient;
- ``used``: trained on;
- ``deferred``: sampled at another temperature or top-p than the batch (:func:`group_sampling`);
  kept for a later step, never mixed into this one.

Invalid, stale and zero-variance groups have no update to lose and are acknowledged at once;
deferred groups are neither trained on nor acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prioreplay import rules

#: The fates a pulled group is counted under (``prioreplay_learner_groups_total{fate=...}``).
FATES = ("used", "stale", "zero_variance", "invalid")


@dataclass(frozen=True)
class Sampling:
    """The sampling distribution a group's behaviour log-probs are under.

    Attributes:
        temperature: logits are divided by it before the softmax (> 0).
        top_p: the nucleus mass, in (0, 1] (1: no nucleus).
    """

    temperature: float = 1.0
    top_p: float = 1.0


def group_sampling(group) -> Sampling:
    """The temperature and top-p a ``TrajectoryGroup`` was sampled at, read from the wire.

    A field left at 0 was not sent (the proto's rule): the temperature is then read as 1 (the plain
    softmax, every backend's default) and the top-p as 1 (no nucleus). The server refuses negative,
    NaN or infinite temperatures and top-p outside [0, 1], so no other values arrive.
    """
    return Sampling(group.sampling_temperature or 1.0, group.sampling_top_p or 1.0)


def group_problem(group, max_tokens: int) -> str | None:
    """Why a ``TrajectoryGroup`` cannot be trained on (malformed), or None when it is well formed.

    Args:
        group: a ``TrajectoryGroup`` message.
        max_tokens: the learner's ``max_sequence_tokens`` (prompt + completion tokens).
    """
    if not group.prompt_token_ids:
        return "empty prompt_token_ids"
    if not group.completions:
        return "no completions"
    n_prompt = len(group.prompt_token_ids)
    for i, c in enumerate(group.completions):
        if len(c.token_ids) != len(c.logprobs):
            return f"completion {i}: {len(c.token_ids)} token ids but {len(c.logprobs)} logprobs"
        if n_prompt + len(c.token_ids) > max_tokens:
            return f"completion {i}: {n_prompt + len(c.token_ids)} tokens > max_sequence_tokens ({max_tokens})"
    return None


def count_truncated(group) -> int:
    """How many completions of ``group`` were cut at ``max_new_tokens``.

    The learner never changes a reward: a reward rule for truncated completions is the workers'
    (``--truncated-reward zero``), applied before reporting, so that the server's statistics and
    priorities and the learner's advantages see the same reward. The learner's ``truncated``
    setting only decides whether their tokens enter the loss (``mask`` acts in collation).
    """
    return sum(1 for c in group.completions if c.truncated)


def group_fate(group, age: int, max_staleness: int, max_tokens: int, train_zero_variance: bool = False) -> tuple[str, str | None]:
    """``(fate, why)``: the first of invalid, stale, zero_variance that applies, else ``used``.

    Args:
        group: a ``TrajectoryGroup``.
        age: its staleness in policy versions (see :meth:`~.feed.Rollback.age`).
        max_staleness: groups older than this many versions are stale.
        max_tokens: see :func:`group_problem`.
        train_zero_variance: a zero-variance group is ``used`` (plain GRPO as TRL runs it: its zero
            advantages give no gradient, but its tokens count in the loss's normalizer and it
            takes a place in the batch); False (the default): dropped, as DAPO does.

    Returns:
        The fate and, for ``invalid``, the reason (else None).
    """
    problem = group_problem(group, max_tokens)
    if problem is not None:
        return "invalid", problem
    if age > max_staleness:
        return "stale", None
    if not train_zero_variance and rules.classify([c.reward for c in group.completions]) is not rules.GroupKind.MIXED:
        return "zero_variance", None
    return "used", None


@dataclass
class Sorted:
    """Pulled groups sorted by fate (see the module docstring), in pull order within each list.

    Attributes:
        sampling: the batch's sampling (that of the first pulled group; the default if none).
        used: the groups to train on; ``ages``: their staleness, one per used group.
        dropped: invalid, stale and zero-variance groups (acknowledge at once).
        deferred: groups sampled otherwise than ``sampling`` (keep for a later step).
        counts: groups per fate, :data:`FATES` plus ``deferred``.
        invalid: ``(group, reason)`` of each invalid group; ``truncated``: truncated completions seen.
    """

    sampling: Sampling = field(default_factory=Sampling)
    used: list = field(default_factory=list)
    ages: list[int] = field(default_factory=list)
    dropped: list = field(default_factory=list)
    deferred: list = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*FATES, "deferred"), 0))
    invalid: list[tuple] = field(default_factory=list)
    truncated: int = 0


def sort_groups(
    groups: Sequence, age: Callable[[int], int], max_staleness: int, max_tokens: int, train_zero_variance: bool = False
) -> Sorted:
    """Sort pulled groups by fate, so that one batch never mixes sampling distributions.

    The batch takes the sampling of the first group; a group sampled at another temperature or
    top-p is deferred (its behaviour log-probs are under another distribution than the one the
    step's new log-probs are computed under, so its importance ratios would be wrong).

    Args:
        groups: ``TrajectoryGroup`` messages in pull order.
        age: a group's staleness in versions from its ``policy_version``.
        max_staleness, max_tokens, train_zero_variance: see :func:`group_fate`.
    """
    out = Sorted(sampling=group_sampling(groups[0]) if groups else Sampling())
    for g in groups:
        if group_sampling(g) != out.sampling:
            out.deferred.append(g)
            out.counts["deferred"] += 1
            continue
        out.truncated += count_truncated(g)
        a = age(g.policy_version)
        fate, why = group_fate(g, a, max_staleness, max_tokens, train_zero_variance)
        out.counts[fate] += 1
        if fate == "used":
            out.used.append(g)
            out.ages.append(a)
        else:
            out.dropped.append(g)
            if why is not None:
                out.invalid.append((g, why))
    return out
