"""The contract's constants and helpers both stores share: tie-break members, the run settings,
the error messages of a clash or a refused renewal, the histogram edges, :class:`QueueWatch`.

The store's semantics are in :mod:`prioreplay.priority_server.store.base` (module docstring).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound
from prioreplay.problems import ProblemRecord

from ..config import RENAMED_STORE_SETTINGS, SAMPLER_FLAGS, StoreConfig

#: Due leases one ``sample`` (or one reaper round) expires at most.
EXPIRE_LIMIT = 64
#: Longest request key of ``sample`` (the servicer's "worker id TAB request id"), bytes.
MAX_REQUEST_KEY_BYTES = 256
#: Seconds an ended lease is remembered as "already reported" / "expired" (then "unknown lease").
TOMBSTONE_TTL_S = 86400.0


#: Characters of the seeded tie-break prefix in sorted-set members (hex).
TIE_HEX_CHARS = 8


def tie_member(problem_id: str, seed: int) -> str:
    """Sorted-set member of a problem: a seeded 32-bit tie-break key (8 hex chars) + its id.

    Members with equal scores sort by this string (byte order), so ties in priority (e.g. all
    unseen problems at 0.25) follow a seeded pseudo-random order, never dataset order.
    """
    key = seed.to_bytes(8, "big", signed=True)
    tie = hashlib.blake2b(problem_id.encode("utf-8"), key=key, digest_size=4).hexdigest()
    return tie + problem_id


def queues_group(kind: rules.GroupKind, queue_zero_variance: bool) -> bool:
    """Whether a reported group of ``kind`` (with a payload) goes to the learner: MIXED, or any kind
    with ``queue_zero_variance`` (plain GRPO). The Lua twin: ``report.lua``, ``to_learner``."""
    return kind is rules.GroupKind.MIXED or queue_zero_variance


def member_id(member: str) -> str:
    """The problem id inside a sorted-set member (inverse of :func:`tie_member`)."""
    return member[TIE_HEX_CHARS:]


#: The settings a namespace's statistics and pools were made with (``claim_settings``).
RUN_SETTINGS = (
    "sampler",
    *SAMPLER_FLAGS,
    "sampler_args",
    "retest_fraction",
    "retest_interval",
    "retest_versions",
    "solved_at",
    "unsolved_at",
    "pool_evidence",
    "age_decay",
    "heap_age_decay",
    "unseen_prior",
    "decay",
    "prior_alpha",
    "prior_beta",
    "seed",
)
#: Run settings stored under an earlier name, old -> new (a namespace or snapshot made before the rename).
RENAMED_RUN_SETTINGS = RENAMED_STORE_SETTINGS
#: Run settings no flag may change on an existing namespace (``unseen_prior``: between off and on,
#: :func:`fixed_changes`).
FIXED_SETTINGS = ("seed", "heap_age_decay", "unseen_prior")

#: The heap score of an unseen problem while ``--unseen-prior`` is on (store/base.py, "A prior for unseen
#: problems"): a band of its own below every priority (priorities are in [0, 0.25] then), read apart
#: from the seen problems and ranked at the one priority ω_unseen, so nothing is rescored when it moves.
UNSEEN_SCORE = -1.0


def run_settings(config: StoreConfig) -> dict[str, str | int | float]:
    """The :data:`RUN_SETTINGS` of ``config`` by name (decay and prior from ``config.params``)."""
    p = config.params
    values = {"decay": p.decay, "prior_alpha": p.prior_alpha, "prior_beta": p.prior_beta}
    return {name: values[name] if name in values else getattr(config, name) for name in RUN_SETTINGS}


def fixed_changes(changes: dict[str, tuple]) -> list[str]:
    """The settings of ``changes`` (:func:`setting_changes`) that no flag may change: those of
    :data:`FIXED_SETTINGS`, ``unseen_prior`` only between off and on (the unseen problems' heap
    scores, :data:`UNSEEN_SCORE` or the priority, depend on that; fit <-> a value does not)."""
    return [
        name
        for name in FIXED_SETTINGS
        if name in changes and (name != "unseen_prior" or (changes[name][0] == "off") != (changes[name][1] == "off"))
    ]


def setting_changes(stored: dict, wanted: dict) -> dict[str, tuple]:
    """``{name: (stored, wanted)}`` for every run setting that differs (see "Run settings")."""
    defaults = run_settings(StoreConfig())
    old_names = {new: stored[old] for old, new in RENAMED_RUN_SETTINGS.items() if old in stored}
    stored = old_names | {name: value for name, value in stored.items() if name not in RENAMED_RUN_SETTINGS}
    return {
        name: (stored.get(name, defaults[name]), value)
        for name, value in wanted.items()
        if stored.get(name, defaults[name]) != value
    }


#: Conflicting ids a refused registration names at most.
MAX_NAMED_CONFLICTS = 5


def same_text(a: ProblemRecord, b: ProblemRecord) -> bool:
    """True when two records of one id have the same prompt and answer (verifier and metadata may
    differ: re-registering them is harmless). Lua twin: ``register.lua``'s ``same_text``."""
    return a.prompt == b.prompt and a.answer == b.answer


def conflict_error(ids: Sequence[str]) -> InvalidArgument:
    """The refusal of a registration whose ``ids`` (in call order) hold another prompt or answer."""
    shown = ", ".join(repr(i) for i in ids[:MAX_NAMED_CONFLICTS])
    more = f" and {len(ids) - MAX_NAMED_CONFLICTS} more" if len(ids) > MAX_NAMED_CONFLICTS else ""
    return InvalidArgument(
        f"{len(ids)} problem id(s) are already registered with another prompt or answer: {shown}{more}. "
        "Another dataset whose ids collide needs its own ids: load it with --id-prefix NAME/; to replace "
        "the registered text (statistics kept), load with --replace (RegisterProblemsRequest.replace). "
        "Nothing of this chunk was registered"
    )


def renew_refusal(lease_id: str, reason: str, worker_id: str = "", holder: str = "") -> NotFound | FailedPrecondition:
    """The error of a renew both stores refuse (see "renew"): ``reason`` "unknown lease", "already
    reported" or "expired" gives NotFound; "another worker" gives FailedPrecondition naming ``holder``."""
    if reason == "another worker":
        return FailedPrecondition(
            f"lease {lease_id} was sampled by worker {holder!r}, not {worker_id!r}; only the worker that holds a "
            "lease renews it (send the worker_id it was sampled with)"
        )
    return NotFound(
        f"lease {lease_id} cannot be renewed: {reason}; its problems may be leased again, so drop the batch "
        "(a report of it is refused too) and sample a new one"
    )


def histogram_edges(buckets: int) -> list[float]:
    """``buckets + 1`` equal-width edges over [0, 0.25] (the last bucket includes 0.25)."""
    return [rules.MAX_PRIORITY * i / buckets for i in range(buckets + 1)]


def add_unseen(hist: list[int], edges: Sequence[float], unseen: int, priority: float) -> list[int]:
    """``hist`` with ``unseen`` problems more in the bucket of ``priority`` (edges[i] <= priority <
    edges[i+1], the last bucket including its upper edge): the unseen band counted at ω_unseen."""
    if unseen:
        i = next((i for i in range(len(hist) - 1) if priority < edges[i + 1]), len(hist) - 1)
        hist = [*hist[:i], hist[i] + unseen, *hist[i + 1 :]]
    return hist


@dataclass(frozen=True)
class QueueWatch:
    """What a waiting pull waits on after a pull that delivered nothing (:meth:`Store.pull`).

    Attributes:
        mark: the store's token, taken atomically with the pull: memory, the ``asyncio.Event`` the
            next queued group sets; Redis, the consumer group's last-delivered stream id (a later
            ``XADD`` has a greater id, which ends ``XREAD BLOCK`` from it).
        idle_in_s: seconds until the first pending delivery turns idle (then redelivered to the
            waiting pull); ``inf`` when nothing is pending.
    """

    mark: Any
    idle_in_s: float = math.inf
