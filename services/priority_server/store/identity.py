"""A run namespace's identity: what tells a server that the namespace it serves is still the one it
claimed, and the error it answers when it is not (:class:`NamespaceLost`).

A namespace in Redis carries an *identity* (key ``identity``: ``"<generation>:<run id>"``), written
by the first server that claims the namespace (generation 1, a random run id) and otherwise only by
a deliberate reset (``--accept-namespace-loss``: the next generation, a new run id). Every server
remembers the identity it claimed and compares it with the stored one on every Lua script call, in
its health refresh and in GetStats. When the stored one is gone, older, another run's, or a *loss
marker* (key ``lost``, written by the first server that saw a loss) says the namespace was lost,
the server serves nothing: health NOT_SERVING and every RPC FAILED_PRECONDITION with the message
of :class:`NamespaceLost`. A newer generation is a deliberate reset made by another server: it is
followed (joined). A namespace whose identity is right but which lacks keys it must always hold
(:func:`missing_keys`: evicted by a Redis whose ``maxmemory-policy`` deletes keys, or deleted by
hand) is lost too (kind ``incomplete``): serving from it would read statistics that are gone.

Pure: no Redis here (the Redis store, :mod:`.redis.client`, reads the keys and calls :func:`assess`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from prioreplay.errors import FailedPrecondition

#: The flag that starts anew on a lost namespace (``ServerConfig.accept_namespace_loss``).
ACCEPT_FLAG = "--accept-namespace-loss"
#: The runbook section of a lost namespace (and of the ``PrioreplayNamespaceLost`` alert).
RUNBOOK = "docs/RUNBOOK.md#prioreplaynamespacelost"
#: How a stored identity can differ from the one a server claimed (the keys of :data:`CAUSES`).
LOSS_KINDS = ("gone", "older", "replaced", "marked", "incomplete")
#: What each kind of loss usually is (in the message).
CAUSES = {
    "gone": "its identity key is gone: the database was flushed, an empty replica was promoted by a failover, "
    "or a snapshot taken before this run began was restored",
    "older": "it holds an older generation: a snapshot taken before the namespace was last reset was restored",
    "replaced": "it holds another run of the same or an older generation: the namespace vanished and a server "
    "started afterwards created it anew",
    "marked": "a server found the namespace lost and marked it (key 'lost'); this run was created after that loss",
    "incomplete": "keys it must always hold are missing: Redis evicted them (a maxmemory-policy other than "
    "noeviction; set CONFIG SET maxmemory-policy noeviction) or someone deleted them",
}
#: The keys a namespace holds from the first server's start on (``claim_settings`` writes both) and never deletes.
MUST_HOLD = ("settings", "counters")


def missing_keys(exists: dict[str, bool], problems: int, stats: int, heap: int) -> list[str]:
    """The keys a claimed namespace lacks, from counts that cost O(1) each (every Lua script checks
    the same in ``lua/namespace_check.lua``).

    Args:
        exists: whether each key of :data:`MUST_HOLD` exists.
        problems, stats: fields of the ``problems`` and ``stats`` hashes (every registered problem
            has one of each, written by one script).
        heap: members of the ``heap`` sorted set (each a registered problem's).

    Returns:
        The missing keys' names (empty: complete); ``stats`` or ``problems`` when one hash has
        fewer fields than the other, ``stats`` also when the heap holds more problems than it.
    """
    out = [name for name in MUST_HOLD if not exists.get(name, False)]
    if stats < problems or heap > stats:
        out.append("stats")
    elif problems < stats:
        out.append("problems")
    return out


@dataclass(frozen=True, order=True)
class Identity:
    """One namespace identity: ``generation`` (>= 1; a deliberate reset adds one) and ``run_id``
    (16 hex characters, random per creation or reset). Stored as ``"<generation>:<run id>"``."""

    generation: int
    run_id: str

    def encode(self) -> str:
        """The stored form, ``"<generation>:<run id>"`` (what the Lua check compares byte for byte)."""
        return f"{self.generation}:{self.run_id}"

    @classmethod
    def parse(cls, value: str | bytes | None) -> Identity | None:
        """The identity of a stored value; None for a missing (None, "") or malformed one."""
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not value:
            return None
        gen, sep, run_id = value.partition(":")
        if not sep or not gen.isdigit() or not run_id:
            return None
        return cls(int(gen), run_id)

    def __str__(self) -> str:
        return f"run {self.run_id} generation {self.generation}"


@dataclass(frozen=True)
class LossMarker:
    """The ``lost`` key: the identity a server was serving when it found the namespace lost, what it
    found (``found``: the stored identity then, "" for none), the kind (:data:`LOSS_KINDS`) and when
    (unix seconds). JSON ``{"identity", "found", "how", "at"}``."""

    identity: str
    found: str
    how: str
    at: float

    def encode(self) -> str:
        """The marker as compact JSON."""
        return json.dumps({"identity": self.identity, "found": self.found, "how": self.how, "at": self.at}, sort_keys=True)

    @classmethod
    def parse(cls, value: str | bytes | None) -> LossMarker | None:
        """The marker of a stored value; None for none. A malformed one still marks a loss (its text
        kept as ``found``): a marker is never ignored."""
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        try:
            doc = json.loads(value)
            return cls(str(doc["identity"]), str(doc.get("found", "")), str(doc.get("how", "gone")), float(doc.get("at", 0.0)))
        except (ValueError, KeyError, TypeError):
            return cls("", value[:80], "gone", math.nan)


def assess(seen: Identity, found: Identity | None, marker: LossMarker | None) -> str:
    """What a server that claimed ``seen`` makes of the stored identity ``found`` and loss ``marker``.

    Returns:
        ``"same"``: the namespace it claimed (also when a marker names ``seen``: the data came back,
        the marker is stale); ``"newer"``: a later generation, a deliberate reset by another server
        (follow it); or a kind of :data:`LOSS_KINDS`: ``"gone"`` (no identity), ``"older"`` (a lower
        generation), ``"replaced"`` (another run id, not newer), ``"marked"`` (``found`` is
        ``seen`` or newer, but a marker names another identity: the namespace was lost before).
    """
    if found is None:
        return "gone"
    if marker is not None and marker.identity != found.encode():
        if found == seen or found.generation > seen.generation:
            return "marked"
    if found == seen:
        return "same"
    if found.generation > seen.generation:
        return "newer"
    if found.generation < seen.generation:
        return "older"
    return "replaced"


class NamespaceLost(FailedPrecondition):
    """The namespace a server was serving is gone or not the one it claimed (FAILED_PRECONDITION).

    The server serves nothing until it is recovered: health NOT_SERVING, every RPC answers this
    error. The message names the namespace and the store, what this server was serving, what it
    found, the likely cause, and both ways out (restore the data; or restart one server with
    :data:`ACCEPT_FLAG`).

    Args:
        namespace: the run's namespace.
        where: the store, password redacted (e.g. ``Redis at redis://:***@host:6379/0``).
        seen: the identity this server claimed.
        found: the stored identity now (None: none).
        how: a kind of :data:`LOSS_KINDS`.
        marker: the loss marker found (None: none).
        missing: with ``how`` ``incomplete``: the keys it lacks (:func:`missing_keys`).
    """

    def __init__(
        self,
        namespace: str,
        where: str,
        seen: Identity,
        found: Identity | None,
        how: str,
        marker: LossMarker | None = None,
        missing: tuple[str, ...] = (),
    ):
        if how not in CAUSES:
            raise ValueError(f"how ({how!r}) must be one of {LOSS_KINDS}")
        self.namespace, self.where, self.seen, self.found, self.how, self.marker = namespace, where, seen, found, how, marker
        self.missing = missing
        holds = f"holds {found}" if found is not None else "holds no identity"
        if how == "incomplete":
            holds += f" but not its keys {', '.join(repr(k) for k in missing)}"
        if how == "marked" and marker is not None:
            lost = Identity.parse(marker.identity)
            detail = f"{CAUSES[how]} ({lost or 'an unreadable identity'} was lost: {marker.how})"
        else:
            detail = CAUSES[how]
        super().__init__(
            f"namespace {namespace!r} in {where} is not the one this server was serving ({seen}): it {holds}; "
            f"{detail}. What it holds is not that run's problems, statistics, leases and queued groups, so nothing is "
            f"served (no lease, no report) until you decide: restore the namespace's data (from a backup or the old "
            f"primary; the servers resume by themselves once {seen} is back), or start anew from what the store "
            f"holds now by restarting one server with {ACCEPT_FLAG} (the others follow)"
            + (
                " (that recreates 'settings' and 'counters' only; with 'stats' or 'problems' missing, use a new "
                "--namespace and register the dataset again)"
                if how == "incomplete"
                else ""
            )
            + f". See {RUNBOOK}"
        )

    def copy(self) -> NamespaceLost:
        """The same error, fresh (raising one instance again and again would grow its traceback)."""
        return NamespaceLost(self.namespace, self.where, self.seen, self.found, self.how, self.marker, self.missing)


def startup_refusal(namespace: str, where: str, found: Identity | None, marker: LossMarker) -> FailedPrecondition:
    """The error of a server starting on a namespace a loss marker names (without :data:`ACCEPT_FLAG`)."""
    lost = Identity.parse(marker.identity)
    holds = f"holds {found}" if found is not None else "holds no identity"
    when = "" if math.isnan(marker.at) else f" at unix time {marker.at:.0f}"
    return FailedPrecondition(
        f"namespace {namespace!r} in {where} was lost while served: a server serving "
        f"{lost or 'it'} found it {marker.how}{when} ({CAUSES.get(marker.how, CAUSES['gone'])}); it now {holds}. "
        f"This server will not start on it: restore the namespace's data (from a backup or the old primary), or "
        f"start with {ACCEPT_FLAG} to go on from what the store holds now, as a new generation. See {RUNBOOK}"
    )
