"""The priority rules: pure functions of a problem's statistics and of a group's rewards.

Everything here is deterministic and free of I/O, so the in-process store, the Redis store's Lua
scripts (which mirror these formulas operation for operation, in IEEE double arithmetic) and the
tests agree bit for bit.

Source: Fatemi, "Prioritized Replay for RL Post-training", arXiv 2601.02648. For a group of G
binary rewards with success rate p, the GRPO advantages A_i = r_i − p have mean square
ω = p(1 − p) (the paper's priority); groups with p ∈ {0, 1} carry no gradient.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

from prioreplay.errors import InvalidArgument

#: Priority of a problem never tested: the largest possible variance of a reward in [0, 1].
MAX_PRIORITY = 0.25

#: Bytes of the seeded tie-break prefix in sorted-set members (8 hex characters).
TIE_HEX_CHARS = 8


class Pool(enum.IntEnum):
    """Where a problem is; values equal the proto's ``prioreplay.v1.Pool``."""

    HEAP = 1
    SOLVED = 2
    UNSOLVED = 3
    LEASED = 4


class GroupKind(enum.Enum):
    """The outcome kind of one reported group."""

    MIXED = "mixed"  # reward variance > 0: a GRPO gradient; queued for the learner
    ALL_CORRECT = "all_correct"  # every reward == 1: to the solved pool
    ALL_WRONG = "all_wrong"  # every reward == 0: to the unsolved pool
    CONSTANT = "constant"  # all equal, neither 0 nor 1 (non-binary rewards): back to the heap


@dataclass(frozen=True)
class PriorityParams:
    """Parameters of the statistics and the priority estimate.

    Attributes:
        decay: λ in [0, 1], applied to the old sums at each report (1: cumulative counts,
            0: the latest group only).
        prior_alpha: α₀ ≥ 0, pseudo-observations of reward 1 (Beta prior).
        prior_beta: β₀ ≥ 0, pseudo-observations of reward 0 (Beta prior).
    """

    decay: float = 1.0
    prior_alpha: float = 0.0
    prior_beta: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.decay <= 1.0):
            raise InvalidArgument(f"decay ({self.decay}) must be in [0, 1]; 1 keeps cumulative counts")
        for name in ("prior_alpha", "prior_beta"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise InvalidArgument(f"{name} ({v}) must be a finite number >= 0")


@dataclass(frozen=True)
class Stats:
    """Decayed sufficient statistics of a problem's rewards.

    Attributes:
        n: decayed count of rewards (completions).
        s1: decayed Σ r.
        s2: decayed Σ r².
    """

    n: float = 0.0
    s1: float = 0.0
    s2: float = 0.0


def validate_rewards(rewards: Sequence[float], where: str = "rewards") -> None:
    """Check a group's rewards.

    Raises:
        InvalidArgument: empty group, or a reward that is NaN, infinite or outside [0, 1].
    """
    if len(rewards) == 0:
        raise InvalidArgument(f"{where}: a group needs at least one completion (group size G >= 1)")
    for i, r in enumerate(rewards):
        if not (isinstance(r, (int, float)) and math.isfinite(r) and 0.0 <= r <= 1.0):
            raise InvalidArgument(f"{where}[{i}] = {r!r}: rewards must be finite numbers in [0, 1]")


def update_stats(stats: Stats, rewards: Sequence[float], params: PriorityParams) -> Stats:
    """Fold one group's rewards into the decayed sums.

    n ← λ·n + G,  s1 ← λ·s1 + Σ r_i,  s2 ← λ·s2 + Σ r_i²  (sums taken left to right from 0.0,
    the order the Lua scripts use).

    Args:
        stats: the problem's statistics before the report.
        rewards: the group's G rewards, each in [0, 1] (validated by the caller).
        params: λ and the prior.
    """
    lam = params.decay
    sr = 0.0
    sq = 0.0
    for r in rewards:
        sr = sr + r
        sq = sq + r * r
    return Stats(n=lam * stats.n + len(rewards), s1=lam * stats.s1 + sr, s2=lam * stats.s2 + sq)


def priority(stats: Stats, params: PriorityParams) -> float:
    """Estimated reward variance: the problem's priority (Fatemi 2026, arXiv 2601.02648, ω = p(1−p)).

    With the Beta(α₀, β₀) prior as pseudo-observations, m1 = (s1 + α₀)/(n + α₀ + β₀) and
    m2 = (s2 + α₀)/(n + α₀ + β₀); the priority is max(0, m2 − m1²), which equals p(1 − p) with
    p = m1 for binary rewards (r² = r). A problem with no observations and no prior gets the
    maximum, 0.25, so every problem is tried early.

    Returns:
        A float in [0, 0.25].
    """
    denom = stats.n + params.prior_alpha + params.prior_beta
    if denom <= 0.0:
        return MAX_PRIORITY
    m1 = (stats.s1 + params.prior_alpha) / denom
    m2 = (stats.s2 + params.prior_alpha) / denom
    v = m2 - m1 * m1
    if v < 0.0:
        return 0.0
    if v > MAX_PRIORITY:
        return MAX_PRIORITY
    return v


def classify(rewards: Sequence[float]) -> GroupKind:
    """The kind of a group: mixed (variance > 0), all-correct, all-wrong, or constant."""
    first = rewards[0]
    if any(r != first for r in rewards):
        return GroupKind.MIXED
    if first == 1.0:
        return GroupKind.ALL_CORRECT
    if first == 0.0:
        return GroupKind.ALL_WRONG
    return GroupKind.CONSTANT


def destination(kind: GroupKind) -> Pool:
    """Where a problem goes after a report: solved / unsolved pool, or back to the heap."""
    if kind is GroupKind.ALL_CORRECT:
        return Pool.SOLVED
    if kind is GroupKind.ALL_WRONG:
        return Pool.UNSOLVED
    return Pool.HEAP


def is_forgetting(source: Pool, rewards: Sequence[float]) -> bool:
    """A retest of a solved problem in which some completion failed (reward < 1)."""
    return source is Pool.SOLVED and any(r < 1.0 for r in rewards)


def is_breakthrough(source: Pool, rewards: Sequence[float]) -> bool:
    """A retest of an unsolved problem in which some completion succeeded (reward > 0)."""
    return source is Pool.UNSOLVED and any(r > 0.0 for r in rewards)


def tie_member(problem_id: str, seed: int) -> str:
    """Sorted-set member of a problem: a seeded 32-bit tie-break key (8 hex chars) + its id.

    Members with equal scores sort by this string (byte order), so ties in priority (e.g. all
    unseen problems at 0.25) follow a seeded pseudo-random order, never dataset order.
    """
    key = seed.to_bytes(8, "big", signed=True)
    tie = hashlib.blake2b(problem_id.encode("utf-8"), key=key, digest_size=4).hexdigest()
    return tie + problem_id


def member_id(member: str) -> str:
    """The problem id inside a sorted-set member (inverse of :func:`tie_member`)."""
    return member[TIE_HEX_CHARS:]


def retest_quota(batch_size: int, retest_fraction: float) -> int:
    """Problems of a batch reserved for pool retests: ⌊f·B⌋, but at least 1 when f > 0.

    The floor of one keeps retests alive for small batches, so no pooled problem starves.
    """
    if retest_fraction <= 0.0:
        return 0
    return max(1, int(math.floor(batch_size * retest_fraction)))


def step_seed(seed: int, step: int) -> int:
    """The 32-bit non-zero seed of the sampler's RNG at batch ``step`` (restart-safe: derived)."""
    h = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big") or 1


class XorShift32:
    """Marsaglia's xorshift32 (13, 17, 5): the sampler's RNG, mirrored exactly in Lua.

    Python's and Redis-Lua's arithmetic agree on it bit for bit (Lua uses the ``bit`` library),
    so the ``weighted`` and ``uniform`` samplers draw the same problems in both stores.
    """

    __slots__ = ("x",)
    _M = 0xFFFFFFFF

    def __init__(self, seed32: int):
        self.x = (seed32 & self._M) or 1

    def next_u32(self) -> int:
        x = self.x
        x ^= (x << 13) & self._M
        x ^= x >> 17
        x ^= (x << 5) & self._M
        self.x = x
        return x

    def random(self) -> float:
        """A float in [0, 1): next_u32() / 2³²."""
        return self.next_u32() / 4294967296.0


def histogram_edges(buckets: int) -> list[float]:
    """``buckets + 1`` equal-width edges over [0, 0.25] (the last bucket includes 0.25)."""
    return [MAX_PRIORITY * i / buckets for i in range(buckets + 1)]
