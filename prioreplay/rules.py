"""The group rules of the method: pure functions of a group's rewards and a problem's statistics.

Source: Fatemi, "Prioritized Replay for RL Post-training", arXiv 2601.02648. For a group of G
binary rewards with success rate p, the GRPO advantages A_i = r_i − p have mean square
ω = p(1 − p) (the paper's priority); groups with p ∈ {0, 1} carry no gradient and move the
problem to the solved / unsolved pool.

Every role uses these rules (the priority server to place problems, the worker to count group
kinds, the learner to drop zero-variance groups), so they live here, free of I/O, deterministic,
and importable without grpc or torch.

The Redis store's Lua scripts mirror some of them operation for operation, in IEEE double
arithmetic, so both stores agree bit for bit (the differential test checks it). Change a rule
here and its twin together:

=========================  =========================================================================
Python                     Lua twin (``services/priority_server/store/redis/lua/``)
=========================  =========================================================================
:func:`priority`           ``lib.lua``: ``local function priority``
:func:`update_stats`       ``report.lua``: the three ``n = lam * tonumber(n) + G`` lines (the sums
                           themselves come from :func:`reward_sums`, computed in Python)
:func:`destination`        ``report.lua``: ``if kind == 'all_correct' or (solved_at < 1 and rate >= ...``
:func:`pass_rate`          ``report.lua``: ``local rate = sr / G``
:func:`is_forgetting`,     ``report.lua``: ``if source == '2' and o[6] == '1'`` / ``source == '3'``
:func:`is_breakthrough`    (the flags come from these functions, computed in Python with the bands)
:class:`PoolBands`         ARGV ``solved_at`` / ``unsolved_at`` of ``report.lua``
:func:`pool_score`         ``report.lua``: ``local pool_score = f[1]`` (the version with ARGV
                           ``retest_versions``); ``sample.lua``: ``pool_now``
:class:`Pool`              the numbers 1–4 in ``lib.lua`` and ``report.lua``
:func:`evidence_groups`    ARGV ``run.pool_evidence`` of ``report.lua`` (k computed in Python per G: the
                           outcome's 9th field)
:func:`confirm_pool`,      ``report.lua``: ``-- Python twin: rules.confirm_pool``
:func:`place_group`
:data:`PENDING_PRIORITY`  ``report.lua``: ``score = fmt(0.25)`` (a pool verdict short of k)
:func:`aged_decay`         ``report.lua``: ``local lam_s = lam * gamma ^ age``
:func:`fresh_key`          ``lib.lua``: ``local function fresh_key`` (called by ``report.lua`` with
                           ARGV ``run.heap_age_decay`` < 1)
=========================  =========================================================================

:func:`classify` runs in Python only (the Redis store passes its result to the script).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from prioreplay.errors import InvalidArgument

#: A variance at most this fraction of m2 is rounding error of m2 − m1², i.e. 0 (see priority()).
ZERO_VARIANCE_REL = 1e-12

#: Rewards of one group are "all equal" when max − min <= this × max(1, max |r|): a few float32
#: ulps (float32 spacing is 6e-8 just below 1, 1.2e-7 above), so a group that is constant in
#: exact arithmetic is constant in float32 and float64 alike (7 × 0.3 and 0.1 + 0.2 is; a float32
#: mean of 8 × 0.35 leaves a residue of 3e-8). One definition for :func:`classify` and the
#: learner's ``group_advantages``; far below any difference a reward function means (rewards are in [0, 1]).
EQUAL_REWARDS_TOL = 1e-6

#: Priority of a problem never tested: the largest possible variance of a reward in [0, 1].
MAX_PRIORITY = 0.25


class Pool(enum.IntEnum):
    """Where a problem is; values equal the proto's ``prioreplay.v1.Pool``."""

    HEAP = 1
    SOLVED = 2
    UNSOLVED = 3
    LEASED = 4
    #: Reported unservable (e.g. its prompt is longer than the model's context): never sampled
    #: until it is registered again, which returns it where it came from, statistics unchanged.
    QUARANTINED = 5


class GroupKind(enum.Enum):
    """The outcome kind of one reported group."""

    MIXED = "mixed"  # reward variance > 0: a GRPO gradient; queued for the learner
    ALL_CORRECT = "all_correct"  # every reward == 1: to the solved pool
    ALL_WRONG = "all_wrong"  # every reward == 0: to the unsolved pool
    CONSTANT = "constant"  # all equal, neither 0 nor 1 (non-binary rewards): back to the heap


#: The statistics' decay λ per report every run starts from (``PriorityParams.decay``, the server's
#: ``--decay``), defined here once: 0.5 by the simulator (docs/METHOD.md, "How a default is chosen": never worse than
#: λ = 1, 1–3% fewer rollouts under forgetting and dilution). λ = 1 (cumulative counts) is the
#: paper's rule: ``--decay 1``.
DEFAULT_DECAY = 0.5


@dataclass(frozen=True)
class PriorityParams:
    """Parameters of the statistics and the priority estimate.

    Attributes:
        decay: λ in [0, 1], applied to the old sums at each report (1: cumulative counts,
            0: the latest group only); :data:`DEFAULT_DECAY` unless given.
        prior_alpha: α₀ ≥ 0, pseudo-observations of reward 1 (Beta prior).
        prior_beta: β₀ ≥ 0, pseudo-observations of reward 0 (Beta prior).
    """

    decay: float = DEFAULT_DECAY
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
class PoolBands:
    """Pass-rate bands that send a problem to the solved or unsolved pool.

    After a report the problem goes to the solved pool when its group was all-correct or its pass
    rate p̂ = Σr / G (:func:`pass_rate`) is at least ``solved_at``, and to the unsolved pool when
    the group was all-wrong or p̂ is at most ``unsolved_at``. The defaults (1, 0) are the paper's
    rule (Fatemi 2026, arXiv 2601.02648): all-correct and all-wrong groups only. A band at its
    default is off, so a group the paper keeps in the heap stays there bit for bit.

    Attributes:
        solved_at: a in (0, 1]; e.g. 0.875 treats 7 of 8 correct as solved.
        unsolved_at: b in [0, 1), below ``solved_at``; e.g. 0.125 treats 1 of 8 as unsolved.

    Raises:
        InvalidArgument: a bound out of range or ``unsolved_at >= solved_at`` (the message names
            both values and the flags ``--solved-at`` / ``--unsolved-at``).
    """

    solved_at: float = 1.0
    unsolved_at: float = 0.0

    def __post_init__(self) -> None:
        a, b = self.solved_at, self.unsolved_at
        if not (isinstance(a, (int, float)) and math.isfinite(a) and 0.0 < a <= 1.0):
            raise InvalidArgument(f"solved_at ({a!r}) must be in (0, 1]; 1 (the default) counts all-correct groups only")
        if not (isinstance(b, (int, float)) and math.isfinite(b) and 0.0 <= b < 1.0):
            raise InvalidArgument(f"unsolved_at ({b!r}) must be in [0, 1); 0 (the default) counts all-wrong groups only")
        if b >= a:
            raise InvalidArgument(
                f"unsolved_at ({b!r}) must be below solved_at ({a!r}); "
                "lower --unsolved-at or raise --solved-at so the bands do not overlap"
            )


#: The paper's rule: only all-correct groups are solved, only all-wrong ones unsolved.
PAPER_BANDS = PoolBands()


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


def reward_sums(rewards: Sequence[float]) -> tuple[float, float]:
    """(Σ r_i, Σ r_i²) of a group, each summed left to right from 0.0 in doubles.

    The one summation order every store uses (the statistics, the ``reward_sum`` counter and the
    Redis store's script arguments), so both stores agree bit for bit.
    """
    sr = 0.0
    sq = 0.0
    for r in rewards:
        sr = sr + r
        sq = sq + r * r
    return sr, sq


def update_stats(stats: Stats, rewards: Sequence[float], params: PriorityParams) -> Stats:
    """Fold one group's rewards into the decayed sums.

    n ← λ·n + G,  s1 ← λ·s1 + Σ r_i,  s2 ← λ·s2 + Σ r_i²  (sums from :func:`reward_sums`).

    Args:
        stats: the problem's statistics before the report.
        rewards: the group's G rewards, each in [0, 1] (validated by the caller).
        params: λ and the prior.
    """
    return fold_sums(stats, params.decay, len(rewards), *reward_sums(rewards))


def fold_sums(stats: Stats, decay: float, group_size: int, sum_r: float, sum_r2: float) -> Stats:
    """:func:`update_stats` from a group's sums (:func:`reward_sums`) already taken: n ← λ·n + G,
    s1 ← λ·s1 + Σr, s2 ← λ·s2 + Σr², the same operations in the same order (bit for bit)."""
    return Stats(n=decay * stats.n + group_size, s1=decay * stats.s1 + sum_r, s2=decay * stats.s2 + sum_r2)


def priority(stats: Stats, params: PriorityParams) -> float:
    """Estimated reward variance: the problem's priority (Fatemi 2026, arXiv 2601.02648, ω = p(1−p)).

    With the Beta(α₀, β₀) prior as pseudo-observations, m1 = (s1 + α₀)/(n + α₀ + β₀) and
    m2 = (s2 + α₀)/(n + α₀ + β₀); the priority is max(0, m2 − m1²), which equals p(1 − p) with
    p = m1 for binary rewards (r² = r). A problem with no observations and no prior gets the
    maximum, 0.25, so every problem is tried early.

    Zero variance is exactly 0: for a constant group of non-binary rewards (8 × 0.1) m2 − m1²
    cancels to a rounding residue (~1e-17, either sign), so any v <= ``ZERO_VARIANCE_REL``·m2
    (1e-12 of m2, thousands of times the rounding error of the sums, and far below any variance
    a finite number of binary rewards can have) gives 0. The Redis store's Lua twin does the same.

    Returns:
        A float in [0, 0.25].
    """
    denom = stats.n + params.prior_alpha + params.prior_beta
    if denom <= 0.0:
        return MAX_PRIORITY
    m1 = (stats.s1 + params.prior_alpha) / denom
    m2 = (stats.s2 + params.prior_alpha) / denom
    v = m2 - m1 * m1
    if v <= ZERO_VARIANCE_REL * m2:  # also v < 0: the cancellation error of m2 − m1²
        return 0.0
    if v > MAX_PRIORITY:
        return MAX_PRIORITY
    return v


def rewards_equal(a: float, b: float) -> bool:
    """Whether two rewards are equal within :data:`EQUAL_REWARDS_TOL` (relative above 1):
    ``|a − b| <= EQUAL_REWARDS_TOL · max(1, |a|, |b|)``."""
    return abs(a - b) <= EQUAL_REWARDS_TOL * max(1.0, abs(a), abs(b))


def classify(rewards: Sequence[float]) -> GroupKind:
    """The kind of a non-empty group: mixed (variance > 0), all-correct, all-wrong, or constant.

    Only a MIXED group has a GRPO gradient (the advantages r_i − p are not all zero); a group of
    one completion is never mixed. Rewards within :data:`EQUAL_REWARDS_TOL` of each other are
    equal (:func:`rewards_equal`), so the verdict does not depend on float32 or float64 rounding
    or on the order of the rewards.
    """
    low, high = min(rewards), max(rewards)
    if not rewards_equal(low, high):
        return GroupKind.MIXED
    if rewards_equal(low, 1.0) and rewards_equal(high, 1.0):
        return GroupKind.ALL_CORRECT
    if rewards_equal(low, 0.0) and rewards_equal(high, 0.0):
        return GroupKind.ALL_WRONG
    return GroupKind.CONSTANT


def pass_rate(rewards: Sequence[float]) -> float:
    """p̂ = Σ r_i / G of a non-empty group (Σ from :func:`reward_sums`, one IEEE division)."""
    return reward_sums(rewards)[0] / len(rewards)


def destination(kind: GroupKind, rate: float | None = None, bands: PoolBands = PAPER_BANDS) -> Pool:
    """Where a problem goes after a report: solved / unsolved pool, or back to the heap.

    Solved: all-correct, or (``bands.solved_at`` < 1 and ``rate`` >= ``solved_at``); unsolved:
    all-wrong, or (``bands.unsolved_at`` > 0 and ``rate`` <= ``unsolved_at``); else the heap.
    ``rate`` is the group's :func:`pass_rate` (None: the bands are not applied).
    """
    if kind is GroupKind.ALL_CORRECT or (rate is not None and bands.solved_at < 1.0 and rate >= bands.solved_at):
        return Pool.SOLVED
    if kind is GroupKind.ALL_WRONG or (rate is not None and bands.unsolved_at > 0.0 and rate <= bands.unsolved_at):
        return Pool.UNSOLVED
    return Pool.HEAP


def _lands_in(rewards: Sequence[float], bands: PoolBands) -> Pool:
    return destination(classify(rewards), pass_rate(rewards), bands)


def retest_event(source: Pool, verdict: Pool) -> str | None:
    """What a group whose verdict (:func:`destination`) is ``verdict`` means for a problem leased
    from ``source``: ``"forgetting"`` (:func:`is_forgetting`), ``"breakthrough"``
    (:func:`is_breakthrough`) or None, from the verdict already computed."""
    if source is Pool.SOLVED and verdict is not Pool.SOLVED:
        return "forgetting"
    if source is Pool.UNSOLVED and verdict is not Pool.UNSOLVED:
        return "breakthrough"
    return None


def is_forgetting(source: Pool, rewards: Sequence[float], bands: PoolBands = PAPER_BANDS) -> bool:
    """A retest of a solved problem that does not stay solved (with the paper's bands: some
    completion failed, reward < 1)."""
    return source is Pool.SOLVED and _lands_in(rewards, bands) is not Pool.SOLVED


def is_breakthrough(source: Pool, rewards: Sequence[float], bands: PoolBands = PAPER_BANDS) -> bool:
    """A retest of an unsolved problem that does not stay unsolved (with the paper's bands: some
    completion succeeded, reward > 0)."""
    return source is Pool.UNSOLVED and _lands_in(rewards, bands) is not Pool.UNSOLVED


def pool_score(lease_step: int, policy_version: int, retest_versions: int) -> float:
    """The score a problem gets when a group sends it to the solved or unsolved pool: the clock its
    retest waits on.

    ``retest_versions`` 0 (the paper): the lease's step, so a pooled problem is due
    ``retest_interval`` batches after its last test. ``retest_versions`` k >= 1: the policy version
    current when the group is reported (the version the worker generated with, or at most the
    versions published during its generation newer), so it is due once the published version V
    satisfies V − score >= k, and the pools (ordered by score ascending) rank due problems by
    versions elapsed since their last test, most first (the samplers' ``SampleRequest.pool_now``).

    Why versions, not steps or GRESO's skip probability. The paper retests pooled problems so that
    none starves and forgetting is noticed (Fatemi, arXiv 2601.02648, "retest pools": least
    recently tested first). Both causes are changes of the *policy*: a group of G rewards under an
    unchanged policy is a fresh draw of the same Bernoulli(p), so a retest before a new version
    only re-samples noise, and a verdict grows stale with the optimizer updates since it was
    made, not with the batches other workers leased meanwhile (many workers lease many batches
    per version; a fast learner publishes several versions per batch). Counting versions spends
    the retest quota on the problems the policy has moved furthest from since their verdict.
    GRESO (Zheng et al., arXiv 2506.02177, Algorithm 1) instead skips a prompt whose last z
    observations had zero variance with probability 1 − p_e^z, i.e. retests it with probability
    p_e^z that *decays* with repeated zero-variance verdicts: it saves rollouts on prompts that stay
    solved or unsolved, but it parks a prompt longer the more often it was confirmed, the
    opposite of what a fast-improving policy needs (the pool audit's misfiled share, docs/
    METHOD.md, "How a default is chosen"), and its random skips give no bound on starvation. The version rule
    keeps the paper's deterministic order (no random draw, so both stores agree without one): a
    problem is never overtaken by one pooled under a later version, so a due problem waits only
    for the due problems ahead of it. It changes when problems are due and in which order, not
    how many are retested (``retest_fraction`` still sets the quota).

    Args:
        lease_step: the step of the lease the group was reported on (>= 1).
        policy_version: the current policy version when the group is reported (0 before the
            first publish).
        retest_versions: the server's ``--retest-versions`` (0: the paper's step clock).

    Returns:
        The pool score (a float, as every sorted-set score).
    """
    return float(policy_version if retest_versions > 0 else lease_step)


# -- pools from evidence, statistics that age ---------------------------------------------------
#: The largest chance, at the boundary success rate 1/G (or 1 − 1/G), that k zero-variance groups
#: in a row pool a problem that still gives mixed groups (:func:`evidence_groups`).
EVIDENCE_MISFILE_RATE = 0.1


def evidence_groups(group_size: int, setting: int) -> int:
    """k: zero-variance groups of one kind in a row before a problem leaves the heap for a pool.

    ``setting`` k >= 1 is used as given (1: the paper, one group). ``setting`` 0 chooses k by the
    group size G: the smallest k with ((1 − 1/G)^G)^k <= :data:`EVIDENCE_MISFILE_RATE`, i.e.

        k(G) = ⌈ln 0.1 / (G · ln(1 − 1/G))⌉,

    so a problem whose success rate is 1/G — the smallest at which a group of G is mixed about
    two times in three — is pooled as unsolved with probability at most 10% (the same holds for
    solved problems at 1 − 1/G by symmetry). (1 − 1/G)^G rises from 0.25 (G = 2) toward
    e⁻¹ ≈ 0.37, so k(G) = 2 for G = 2, 3 and 3 for every G >= 4 (G = 4: 0.316² = 0.1001, just
    above 0.1); G = 1 (no group can be mixed) gives k = 1.

    Raises:
        InvalidArgument: G < 1 or a negative setting.
    """
    if group_size < 1:
        raise InvalidArgument(f"group size ({group_size}) must be >= 1")
    if setting < 0:
        raise InvalidArgument(f"pool_evidence ({setting}) must be >= 0 (0: chosen by the group size)")
    if setting > 0:
        return setting
    if group_size == 1:
        return 1
    per_group = group_size * math.log1p(-1.0 / group_size)  # ln P(G wrong | p = 1/G), < 0
    return max(1, math.ceil(math.log(EVIDENCE_MISFILE_RATE) / per_group - 1e-9))


def confirm_pool(dest: Pool, streak_pool: int, streak: int, k: int) -> tuple[Pool, int, int]:
    """Where a problem goes after a report when pooling needs k groups of evidence in a row.

    Args:
        dest: :func:`destination` of this group.
        streak_pool, streak: the problem's run of pool verdicts before this group: the pool
            (2 solved, 3 unsolved; 0: none) its latest groups pointed to, and how many in a row.
        k: :func:`evidence_groups`.

    Returns:
        (where it goes, the new streak pool, the new streak). A HEAP verdict ends the run
        (0, 0); a pool verdict extends a run toward the same pool or starts one of 1; the problem
        goes to that pool once the run reaches k, else stays in the heap (k = 1: the paper's rule,
        :func:`destination` unchanged).
    """
    if dest is Pool.HEAP:
        return Pool.HEAP, 0, 0
    count = streak + 1 if streak_pool == int(dest) else 1
    return (dest if count >= k else Pool.HEAP), int(dest), count


#: The heap priority of a problem whose groups point to a pool but whose run of them is shorter than
#: k (:func:`confirm_pool`): the top, :data:`MAX_PRIORITY`, so it is tested again at once and the
#: run is confirmed or broken under (nearly) the same policy. Its point estimate would not do:
#: after one all-wrong group p̂ = 0 gives priority 0, and even a Laplace prior (variance 0.09 after
#: 8 wrong) ranks it below every mixed problem, so the heap parks it untested — the starvation the
#: pools' retests exist to prevent (measured: with 400 problems, B = 16, G = 8 in the simulator, no
#: problem reached a second verdict in 100 batches). The evidence costs k − 1 groups per pooled
#: problem, spent when they are cheapest to interpret.
PENDING_PRIORITY = MAX_PRIORITY


def place_group(
    verdict: Pool, streak_pool: int, streak: int, k: int, stats: Stats, params: PriorityParams
) -> tuple[Pool, float | None, int, int]:
    """Where a reported problem goes and its heap score, with pools from evidence.

    Args:
        verdict: :func:`destination` of the group; streak_pool, streak, k: see :func:`confirm_pool`.
        stats: the problem's statistics after the report; params: the priority's.

    Returns:
        (pool, heap score or None for a pool — the store puts its :func:`pool_score` —, new
        streak pool, new streak): a HEAP verdict scores :func:`priority`, a pool verdict short of
        k scores :data:`PENDING_PRIORITY`.
    """
    dest, streak_pool, streak = confirm_pool(verdict, streak_pool, streak, k)
    if dest is not Pool.HEAP:
        return dest, None, streak_pool, streak
    return dest, priority(stats, params) if verdict is Pool.HEAP else PENDING_PRIORITY, streak_pool, streak


def aged_decay(decay: float, age_decay: float, versions: int) -> float:
    """λ · γ^a: the factor a report applies to a problem's old statistics when the policy has
    moved ``versions`` = a >= 0 versions since its previous report (FreshPER: evidence about an
    older policy counts less; γ = ``age_decay`` in (0, 1], 1: the per-report λ alone).

    Raises:
        InvalidArgument: ``versions`` < 0.
    """
    if versions < 0:
        raise InvalidArgument(f"versions since the last report ({versions}) must be >= 0")
    if age_decay == 1.0 or versions == 0:
        return decay
    return decay * age_decay**versions


# -- heap priorities that age between reports (FreshPER) ----------------------------------------
#: Offset of :func:`fresh_key`'s log scale: above −ln of the smallest positive double (744.4), so
#: ln|ω − ω₀| + 800 > 0 for every |ω − ω₀| > 0 and the key's sign is the sign of ω − ω₀.
FRESH_OFFSET = 800.0


def fresh_priority_now(priority_then: float, prior: float, age: int, heap_age_decay: float) -> float:
    """The effective heap priority of a problem whose latest report, ``age`` policy versions ago,
    gave it ``priority_then`` = ω:

        ω_eff(a) = ω₀ + (ω − ω₀) · γ_h^a,

    ω₀ = ``prior`` (the priority of no observations, ``priority(Stats())``: 0.25 without a Beta
    prior), γ_h = ``heap_age_decay`` in (0, 1] (1: ω, no ageing), a = versions published since.

    Source: FreshPER (Ma et al., "Freshness-Aware Prioritized Experience Replay for LLM/VLM
    Reinforcement Learning", arXiv 2604.16918): a stored priority measured under an older policy
    is stale, so it decays exponentially with its age, p_i = p_base · exp(−τ_i / τ) (γ_h =
    exp(−1/τ), the age in policy versions rather than gradient steps: a version is what a worker
    generates with). FreshPER decays toward 0; here the decay is toward the prior's priority ω₀,
    what the server would believe of a problem it knew nothing about: a problem parked low in the
    heap by an old estimate (p̂ near 0 or 1) climbs back as its estimate ages, so it neither
    starves (decay toward 0 would bury it for good) nor, once re-measured, dominates (its next
    report resets a to 0). With the default prior ω₀ = 0.25 is the maximum, so ageing only raises
    priorities: an old estimate becomes an uncertain one. A problem in a pool is not aged here (its
    retest clock, :func:`pool_score`, does that).

    Raises:
        InvalidArgument: ``age`` < 0 or γ_h outside (0, 1].
    """
    if age < 0:
        raise InvalidArgument(f"versions since the last report ({age}) must be >= 0")
    if not (0.0 < heap_age_decay <= 1.0):
        raise InvalidArgument(f"heap_age_decay ({heap_age_decay}) must be in (0, 1]; 1 is off")
    if age == 0 or heap_age_decay == 1.0:
        return priority_then
    return prior + (priority_then - prior) * heap_age_decay**age


def fresh_key(priority_then: float, prior: float, version: int, heap_age_decay: float) -> float:
    """The heap score of a problem reported at policy ``version`` with priority ω, when the heap
    ages (:func:`fresh_priority_now`, γ_h < 1): a key whose order (descending) is the order of
    ω_eff at EVERY later version V, so neither store rescores a member when the version moves.

    ω_eff(V) − ω₀ = (ω − ω₀) · γ_h^(V − v) = (ω − ω₀) · γ_h^(−v) · γ_h^V, and γ_h^V is common to
    every member at V: ω_eff orders as d · γ_h^(−v), d = ω − ω₀. On a log scale (no overflow for
    any v): key = sign(d) · (ln|d| + v · ln(1/γ_h) + :data:`FRESH_OFFSET`), 0 when d = 0. Members
    with d > 0 sort above d = 0 above d < 0 (a decay toward ω₀ never crosses it), within a sign
    by |d| · γ_h^(−v). Resolution: keys of magnitude ~10³ carry ln|d| to ~1e−13, so priorities
    closer than that relative are tied (the member tie-break decides), as in the Redis score.
    Lua twin: ``lib.lua``'s ``fresh_key`` (same operations, same order).
    """
    d = priority_then - prior
    if d == 0.0:
        return 0.0
    mag = math.log(abs(d)) + version * -math.log(heap_age_decay) + FRESH_OFFSET
    return mag if d > 0.0 else -mag


def fresh_key_priority(key: float, prior: float, version: int, heap_age_decay: float) -> float:
    """ω_eff at policy ``version`` V of a heap member scored :func:`fresh_key`: ω₀ + sign(key) ·
    exp(|key| − offset − V · ln(1/γ_h)) (the inverse of :func:`fresh_key` composed with
    :func:`fresh_priority_now`; exact up to the ~1e−13 of the log scale, kept in [0, 0.25])."""
    if key == 0.0:
        return prior
    mag = math.exp(abs(key) - FRESH_OFFSET - version * -math.log(heap_age_decay))
    return min(MAX_PRIORITY, prior + mag) if key > 0.0 else max(0.0, prior - mag)
