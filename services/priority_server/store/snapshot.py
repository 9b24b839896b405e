"""The memory store's records and their snapshot file: JSON, written atomically, refused whole when corrupt.

The memory store keeps its state as the records below (plus indexes it derives from them: the
heap, the pools, the deadline order, the pending groups per consumer). A snapshot is exactly
these records as one JSON document (payloads base64):

``{"format": "prioreplay-memory-store", "version": 1, "step", "policy": [version, uri],
"counters": {...}, "problems": [[id, prompt, answer, verifier, metadata, n, s1, s2, pool, home,
score], ...], "leases": [[lease id, deadline, step, [problem ids], worker id], ...] (files written
before RenewLease lack the worker id: ""), "tombstones": [[lease
id, reason, ended], ...], "queue": {"last_id": [ms, seq], "new": [[group id, payload], ...],
"pending": [[group id, payload, delivery count, consumer, delivered at], ...]}, "settings": {name:
value} or null, "unseen_fit": [first visits, their priority sum]}`` (``settings``: the run settings,
``store.run_settings``; older files lack it, and ``unseen_fit``: [0, 0.0])

:func:`write_atomic` writes through a temporary file, fsync and ``os.replace``, so a crash leaves
the previous snapshot whole. :func:`read` checks the whole document (types, every leased problem
in exactly one lease, pending groups delivered to someone) before anything is used, and raises
:class:`InvalidArgument` naming the file otherwise.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool, Stats
from prioreplay.unseen_prior import UnseenFit

#: Snapshot format tag and version; a file with another tag or version is refused.
SNAPSHOT_FORMAT = "prioreplay-memory-store"
SNAPSHOT_VERSION = 1

#: The counters of ``StoreStats`` / ``dump()["counters"]`` that the store accumulates.
COUNTER_NAMES = (
    "groups_mixed",
    "groups_all_correct",
    "groups_all_wrong",
    "groups_constant",
    "forgetting_events",
    "breakthroughs",
    "lease_expiries",
    "completions_reported",
    "reward_sum",
    "late_reports",
    "groups_acked",
)

GroupKey = tuple[int, int]  # (ms, seq) of a stream-style group id "ms-seq"


@dataclass(slots=True)
class Entry:
    """A problem's mutable state.

    ``pool`` is where it is now (LEASED while out); ``home`` and ``score`` are where it returns
    to and with which score (equal to pool/score while not leased).
    """

    record: ProblemRecord
    member: str
    stats: Stats
    pool: Pool
    home: Pool
    score: float
    #: The record's serialized ``Problem`` (:func:`prioreplay.convert.problem_bytes`), set by the
    #: memory store whenever ``record`` is (derived, not written to snapshots); b"": not built yet.
    wire: bytes = b""


@dataclass(slots=True)
class LeaseRecord:
    lease_id: str
    deadline: float  # unix seconds
    step: int  # the step' of the sample that created it
    problem_ids: list[str]  # batch order
    worker_id: str = ""  # the worker_id it was sampled with: the one that may renew it


@dataclass(slots=True)
class QueuedGroup:
    """A queued trajectory group (a stream entry); ``consumer`` is "" until first delivered."""

    key: GroupKey
    payload: bytes
    delivery_count: int = 0
    consumer: str = ""
    delivered_at: float = 0.0  # unix seconds of the last delivery


@dataclass
class MemoryState:
    """Everything the memory store keeps, as records (what a snapshot holds).

    ``tombstones`` maps an ended lease id to (reason, unix seconds it ended), oldest first;
    ``new`` holds the groups never delivered in report order, ``pending`` the delivered,
    unacknowledged ones by key.
    """

    step: int = 0
    policy: tuple[int, str] = (0, "")
    counters: dict[str, float | int] = field(
        default_factory=lambda: {name: 0.0 if name == "reward_sum" else 0 for name in COUNTER_NAMES}
    )
    problems: dict[str, Entry] = field(default_factory=dict)
    leases: dict[str, LeaseRecord] = field(default_factory=dict)
    tombstones: collections.OrderedDict[str, tuple[str, float]] = field(default_factory=collections.OrderedDict)
    last_key: GroupKey = (0, 0)
    new: collections.OrderedDict[GroupKey, QueuedGroup] = field(default_factory=collections.OrderedDict)
    pending: dict[GroupKey, QueuedGroup] = field(default_factory=dict)
    #: The run settings the state was made with (``store.run_settings``); None before the first start.
    settings: dict[str, Any] | None = None
    #: problem id -> (decayed completions, decayed completion tokens) of the reports that carried
    #: token ids: the running mean of completion tokens is tokens / completions.
    tokens: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: problem id -> (streak pool, streak, policy version at its latest report): the run of pool
    #: verdicts ``rules.confirm_pool`` extends (pool 2 / 3, 0: none) and the version ``age_decay``
    #: counts from. Absent: no report yet (streak 0; the first report ages nothing).
    evidence: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: The first visits the prior for unseen problems is fitted to (:mod:`prioreplay.unseen_prior`).
    unseen_fit: UnseenFit = UnseenFit()


def group_id(key: GroupKey) -> str:
    """The stream-style id "ms-seq" of a group key."""
    return f"{key[0]}-{key[1]}"


def parse_group_id(gid: str) -> GroupKey | None:
    """(ms, seq) of a stream-style id "ms-seq", or None when it is not one."""
    ms, sep, seq = gid.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        return None
    return int(ms), int(seq)


# -- encoding ---------------------------------------------------------------------------------
def encode(state: MemoryState) -> dict[str, Any]:
    """The whole state as JSON-ready data (a copy: the caller may keep changing ``state``)."""
    b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "step": state.step,
        "policy": list(state.policy),
        "counters": dict(state.counters),
        "problems": [
            [
                e.record.id,
                e.record.prompt,
                e.record.answer,
                e.record.verifier,
                dict(e.record.metadata),
                e.stats.n,
                e.stats.s1,
                e.stats.s2,
                int(e.pool),
                int(e.home),
                e.score,
            ]
            for e in state.problems.values()
        ],
        "leases": [[lz.lease_id, lz.deadline, lz.step, list(lz.problem_ids), lz.worker_id] for lz in state.leases.values()],
        "tombstones": [[lid, reason, ended] for lid, (reason, ended) in state.tombstones.items()],
        "settings": dict(state.settings) if state.settings is not None else None,
        "tokens": [[pid, n, t] for pid, (n, t) in state.tokens.items()],
        "evidence": [[pid, sp, k, v] for pid, (sp, k, v) in state.evidence.items()],
        "unseen_fit": [state.unseen_fit.visits, state.unseen_fit.priority_sum],
        "queue": {
            "last_id": list(state.last_key),
            "new": [[group_id(g.key), b64(g.payload)] for g in state.new.values()],
            "pending": [
                [group_id(g.key), b64(g.payload), g.delivery_count, g.consumer, g.delivered_at] for g in state.pending.values()
            ],
        },
    }


def write_atomic(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON to ``path``: temp file in the same directory, fsync, os.replace.

    Raises:
        OSError: the directory is not writable (the previous file stays intact).
    """
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"), allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# -- decoding ---------------------------------------------------------------------------------
def read(path: Path, member_of) -> MemoryState:
    """Load and check the snapshot at ``path``.

    Args:
        path: the snapshot file.
        member_of: ``member_of(problem_id) -> str``, the sorted-set member (``store.tie_member``
            with the store's seed).

    Raises:
        InvalidArgument: the file cannot be read or is corrupt (the message names the path and
            says how to recover); nothing of it is used.
    """
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
        return decode(doc, member_of)
    except InvalidArgument as e:
        raise InvalidArgument(
            f"snapshot {str(path)!r} is corrupt: {e}; move it away to start empty, or restore a good copy"
        ) from e
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise InvalidArgument(
            f"snapshot {str(path)!r} cannot be read or is corrupt ({type(e).__name__}: {e}); "
            "move it away to start empty, or restore a good copy"
        ) from e


def decode(doc: Any, member_of) -> MemoryState:
    """The state of a snapshot document; checks its consistency first (see :func:`read`)."""
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise InvalidArgument(f"not a {SNAPSHOT_FORMAT} snapshot")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise InvalidArgument(f"snapshot version {doc.get('version')!r} is not the supported {SNAPSHOT_VERSION}")
    state = MemoryState()
    step = doc["step"]
    version, uri = doc["policy"]
    if not (isinstance(step, int) and step >= 0 and isinstance(version, int) and version >= 0 and isinstance(uri, str)):
        raise InvalidArgument("step or policy has a wrong type")
    state.step, state.policy = step, (version, uri)
    counters = doc["counters"]
    if set(counters) != set(COUNTER_NAMES):
        raise InvalidArgument(f"counters must be exactly {', '.join(COUNTER_NAMES)}")
    state.counters = {k: _number(counters[k], k) for k in COUNTER_NAMES}
    _decode_problems(doc["problems"], member_of, state)
    _decode_leases(doc["leases"], state)
    for lease_id, reason, ended in doc["tombstones"]:
        if reason not in ("already reported", "expired"):
            raise InvalidArgument(f"tombstone reason {reason!r} is unknown")
        state.tombstones[str(lease_id)] = (reason, _number(ended, "ended"))
    _decode_queue(doc["queue"], state)
    settings = doc.get("settings")  # absent in snapshots older than the stored settings: None
    if settings is not None and not (
        isinstance(settings, dict) and all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in settings.items())
    ):
        raise InvalidArgument("settings must be an object of setting names to numbers or strings")
    state.settings = settings
    for pid, n, t in doc.get("tokens", []):  # absent in snapshots older than the token means: none
        if pid not in state.problems:
            raise InvalidArgument(f"token mean of problem {pid!r}, which is not registered")
        state.tokens[pid] = (_number(n, "token completions"), _number(t, "tokens"))
    for row in doc.get("evidence", []):  # absent in snapshots older than pools from evidence: none
        if not (isinstance(row, list) and len(row) == 4 and all(isinstance(x, int) for x in row[1:])):
            raise InvalidArgument(f"evidence row {row!r} must be [problem id, streak pool, streak, policy version]")
        if row[0] not in state.problems:
            raise InvalidArgument(f"evidence of problem {row[0]!r}, which is not registered")
        state.evidence[row[0]] = (row[1], row[2], row[3])
    visits, total = doc.get("unseen_fit", [0, 0.0])  # absent in snapshots older than the prior: none
    if not (isinstance(visits, int) and visits >= 0):
        raise InvalidArgument(f"unseen_fit visits ({visits!r}) must be an integer >= 0")
    state.unseen_fit = UnseenFit(visits, float(_number(total, "unseen_fit priority sum")))
    return state


def _decode_problems(rows: list, member_of, state: MemoryState) -> None:
    for row in rows:
        pid, prompt, answer, verifier, metadata, n, s1, s2, pool, home, score = row
        rec = ProblemRecord(pid, prompt, answer, verifier, {str(k): str(v) for k, v in metadata.items()})
        if not isinstance(pid, str) or pid in state.problems:
            raise InvalidArgument(f"problem id {pid!r} is not a string or appears twice")
        pool, home = Pool(pool), Pool(home)
        if pool is Pool.LEASED and home is Pool.LEASED:
            raise InvalidArgument(f"leased problem {pid!r} has no pool to return to")
        if pool is Pool.QUARANTINED and home not in (Pool.HEAP, Pool.SOLVED, Pool.UNSOLVED):
            raise InvalidArgument(f"quarantined problem {pid!r} has no pool to return to")
        if pool not in (Pool.LEASED, Pool.QUARANTINED) and home is not pool:
            raise InvalidArgument(f"problem {pid!r} is in {pool.name} but would return to {home.name}")
        state.problems[pid] = Entry(
            rec, member_of(pid), Stats(_number(n, "n"), _number(s1, "s1"), _number(s2, "s2")), pool, home, _number(score, "score")
        )


def _decode_leases(rows: list, state: MemoryState) -> None:
    leased_seen: set[str] = set()
    for row in rows:
        if not (isinstance(row, list) and len(row) in (4, 5)):
            raise InvalidArgument(f"lease row {row!r} is not [lease id, deadline, step, [problem ids], worker id]")
        lease_id, deadline, lstep, ids, worker = (*row, "") if len(row) == 4 else row
        if not (isinstance(lease_id, str) and isinstance(lstep, int) and isinstance(ids, list) and isinstance(worker, str)):
            raise InvalidArgument(f"lease {lease_id!r} has a wrong type")
        for pid in ids:
            if state.problems[pid].pool is not Pool.LEASED or pid in leased_seen:
                raise InvalidArgument(f"problem {pid!r} of lease {lease_id!r} is not leased, or leased twice")
            leased_seen.add(pid)
        state.leases[lease_id] = LeaseRecord(lease_id, _number(deadline, "deadline"), lstep, [str(p) for p in ids], worker)
    if leased_seen != {pid for pid, e in state.problems.items() if e.pool is Pool.LEASED}:
        raise InvalidArgument("a leased problem belongs to no lease")


def _decode_queue(q: dict, state: MemoryState) -> None:
    ms, seq = q["last_id"]
    state.last_key = (int(ms), int(seq))
    for gid, payload in q["new"]:
        key = _checked_key(gid)
        state.new[key] = QueuedGroup(key, base64.b64decode(payload, validate=True))
    for gid, payload, count, consumer, delivered_at in q["pending"]:
        key = _checked_key(gid)
        g = QueuedGroup(
            key, base64.b64decode(payload, validate=True), int(count), str(consumer), _number(delivered_at, "delivered_at")
        )
        if not g.consumer or g.delivery_count < 1 or key in state.new:
            raise InvalidArgument(f"pending group {gid!r} has no consumer, no delivery, or is also undelivered")
        state.pending[key] = g


def _number(value: Any, name: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{name} ({value!r}) is not a finite number")
    return value


def _checked_key(gid: Any) -> GroupKey:
    key = parse_group_id(gid) if isinstance(gid, str) else None
    if key is None:
        raise InvalidArgument(f"group id {gid!r} is not of the form 'ms-seq'")
    return key
