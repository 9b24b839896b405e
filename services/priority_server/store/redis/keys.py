"""The Redis store's key schema and the formats of its values.

Data model (every key is ``prioreplay:{<namespace>}:<name>``, made by :meth:`RedisStore.key`;
the hash tag ``{<namespace>}`` puts a whole run in one Redis Cluster slot):

============== ======= ========================================================================
name           type    content
============== ======= ========================================================================
problems       hash    id → JSON ``[prompt, answer, verifier, metadata]``
stats          hash    id → ``"n s1 s2 pool score"`` (floats as ``%.17g``: exact round trip;
                       pool = rules.Pool value; score = heap priority, pool: last tested step (the
                       policy version with retest_versions), leased: the score it returns with)
heap           zset    score = priority, member = ``store.tie_member(id, seed)``
solved         zset    score = last tested step (or policy version: rules.pool_score), member as above
unsolved       zset    score = last tested step (or policy version: rules.pool_score), member as above
leases         hash    lease id → ``"step\\tdeadline"`` + ``"\\tmember\\tsource\\tscore"`` per problem
deadlines      zset    score = lease deadline (unix s), member = lease id
tomb:reported  zset    lease id → time it was reported (kept ``TOMBSTONE_TTL_S``)
tomb:expired   zset    lease id → time it expired (kept ``TOMBSTONE_TTL_S``)
counters       hash    ``step`` and the StoreStats counters (``reward_sum`` as ``%.17g``)
policy         hash    ``version``, ``uri``; ``learner_batch``: the learner's batch in groups (the pace bound)
health         string  the last write of the health probe, or the one before a WAIT (expires after 60 s)
quarantine     hash    id → the pool (1..3) a quarantined problem returns to (stats pool = 5)
requests       hash    request id → the lease a sample with that id made (retried requests)
requests:due   zset    score = that lease's deadline, member = request id (pruned by ``sample``)
owners         hash    lease id → JSON ``[worker id, request id]`` of a live lease sampled with either
                       (``renew`` checks the holder and moves the request id's deadline); dropped
                       when the lease ends
settings       string  JSON of the run settings the namespace was made with (``store.run_settings``)
stream         stream  trajectory groups (field ``p`` = payload), consumer group ``learners``
pace           stream  wake-ups of leases waiting on the pace bound (:mod:`.pace`; an entry per pull or report
                       that made room, trimmed to about 64), read with ``XREAD BLOCK``
tokens         hash    id → ``"completions tokens"``: decayed sums of the reports that carried token
                       ids (the running mean of completion tokens; ``cost-aware``, ``knapsack``)
evidence       hash    id → ``"streak_pool streak version"``: the run of pool verdicts
                       (``rules.confirm_pool``; pool 2 / 3, 0 none) and the policy version at the
                       problem's latest report (``age_decay``); written by ``report``
identity       string  ``"<generation>:<run id>"``: the namespace's identity (:mod:`..identity`), written
                       by ``claim`` only: at creation (generation 1) or a deliberate reset
                       (``--accept-namespace-loss``: the next generation); every script checks it
lost           string  JSON loss marker (:class:`..identity.LossMarker`): written (SET NX) by the first
                       server that finds the namespace lost; deleted by ``claim`` with
                       ``--accept-namespace-loss``, or when the lost identity is back (data restored)
============== ======= ========================================================================
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from prioreplay import rules
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool

#: Every key of a run (``prioreplay:{<namespace>}:<name>``), but ``parts:<lease id>``.
KEY_NAMES = (
    "problems",
    "stats",
    "heap",
    "solved",
    "unsolved",
    "leases",
    "deadlines",
    "tomb:reported",
    "tomb:expired",
    "counters",
    "policy",
    "stream",
    "pace",
    "health",
    "requests",
    "requests:due",
    "quarantine",
    "settings",
    "tokens",
    "owners",
    "evidence",
    "identity",
    "lost",
)
#: The keys every lease-changing script gets first, in this order (their KEYS[1..9]).
STATE_KEYS = ("stats", "heap", "solved", "unsolved", "leases", "deadlines", "counters", "tomb:reported", "tomb:expired")


def redis_key(namespace: str, name: str) -> str:
    """The Redis key of ``name`` in run ``namespace``: ``prioreplay:{<namespace>}:<name>``."""
    return f"prioreplay:{{{namespace}}}:{name}"


def float_arg(x: float) -> str:
    """A float as a string that Lua's ``tonumber`` and Redis parse back to the same double."""
    return repr(float(x))


def text(b: bytes | str | None) -> str:
    """A Redis answer (bytes, str or None) as str (None: "")."""
    if b is None:
        return ""
    return b.decode("utf-8") if isinstance(b, bytes) else str(b)


def parse_stats(value: bytes | str) -> tuple[rules.Stats, Pool, float]:
    """(statistics, pool, score) of a ``stats`` hash value ``"n s1 s2 pool score"``."""
    n, s1, s2, pool, score = text(value).split(" ")
    return rules.Stats(float(n), float(s1), float(s2)), Pool(int(pool)), float(score)


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # compact: no raw control characters


def encode_problem(p: ProblemRecord) -> str:
    """A ``problems`` hash value: compact JSON ``[prompt, answer, verifier, metadata]``."""
    return _JSON.encode([p.prompt, p.answer, p.verifier, dict(p.metadata)])


def decode_problem(pid: str, value: bytes | str) -> ProblemRecord:
    """The problem ``pid`` of a ``problems`` hash value (:func:`encode_problem`)."""
    prompt, answer, verifier, metadata = json.loads(text(value))
    return ProblemRecord(id=pid, prompt=prompt, answer=answer, verifier=verifier, metadata=metadata)


def warm_arg(problems: Sequence[ProblemRecord], warm: Mapping[str, rules.Stats], score_of: Callable[[rules.Stats], float]) -> str:
    """register.lua's ``warm`` argument: "id\tn s1 s2 1 score" per problem of ``problems`` with
    warm-start statistics in ``warm`` (shrunk already; :mod:`prioreplay.warm_start`), joined by "\n";
    the score is ``score_of(stats)`` (``Store.registered_score``: keyed as of version 0, or the unseen
    band's for statistics with n = 0 while the prior for unseen problems is on)."""
    lines = []
    for p in problems:
        st = warm.get(p.id)
        if st is not None:
            score = float_arg(score_of(st))
            lines.append(f"{p.id}\t{float_arg(st.n)} {float_arg(st.s1)} {float_arg(st.s2)} {int(Pool.HEAP)} {score}")
    return "\n".join(lines)
