"""The namespace identity's rules (store/identity.py): how a stored identity and a loss marker are read,
what a server that claimed one makes of what it finds, and what its errors tell an operator."""

from __future__ import annotations

import asyncio
import math

import pytest
from pydantic import ValidationError

from prioreplay.errors import FailedPrecondition
from prioreplay.priority_server.config import ServerConfig, StoreConfig
from prioreplay.priority_server.store.identity import (
    ACCEPT_FLAG,
    LOSS_KINDS,
    MUST_HOLD,
    RUNBOOK,
    Identity,
    LossMarker,
    NamespaceLost,
    assess,
    missing_keys,
    startup_refusal,
)
from prioreplay.priority_server.store.memory_store import MemoryStore

SEEN = Identity(2, "a1b2c3d4e5f60718")


def test_an_identity_round_trips_and_a_malformed_one_reads_as_none():
    assert Identity.parse(SEEN.encode()) == SEEN
    assert Identity.parse(SEEN.encode().encode()) == SEEN  # Redis answers bytes
    for bad in (None, "", b"", "abc", "x:run", ":run", "3:", "-1:run"):
        assert Identity.parse(bad) is None, bad


@pytest.mark.parametrize(
    ("found", "marker", "how"),
    [
        (SEEN, None, "same"),
        (SEEN, LossMarker(SEEN.encode(), "", "gone", 1.0), "same"),  # the lost data is back
        (None, None, "gone"),
        (None, LossMarker(SEEN.encode(), "", "gone", 1.0), "gone"),
        (Identity(1, "0000000000000000"), None, "older"),
        (Identity(2, "ffffffffffffffff"), None, "replaced"),
        (Identity(3, "ffffffffffffffff"), None, "newer"),  # a reset by another server: followed
        (Identity(3, "ffffffffffffffff"), LossMarker(SEEN.encode(), "", "gone", 1.0), "marked"),
        (SEEN, LossMarker("1:0000000000000000", "", "gone", 1.0), "marked"),  # made after another run's loss
    ],
)
def test_what_a_server_makes_of_the_stored_identity(found, marker, how):
    assert assess(SEEN, found, marker) == how


def test_a_marker_round_trips_and_a_malformed_one_still_marks_a_loss():
    m = LossMarker(SEEN.encode(), "", "gone", 1_700_000_000.5)
    assert LossMarker.parse(m.encode()) == m
    assert LossMarker.parse(None) is None
    broken = LossMarker.parse(b"not json")
    assert broken is not None and broken.identity == "" and math.isnan(broken.at)
    assert assess(SEEN, None, broken) == "gone"


@pytest.mark.parametrize("how", LOSS_KINDS)
def test_the_error_names_the_namespace_what_was_served_what_is_there_and_both_ways_out(how):
    found = None if how == "gone" else Identity(1, "0000000000000000")
    marker = LossMarker("1:9999999999999999", "", "gone", 1.0) if how == "marked" else None
    e = NamespaceLost("run7", "Redis at redis://h:6379/0", SEEN, found, how, marker)
    msg = str(e)
    assert isinstance(e, FailedPrecondition) and e.GRPC_CODE == "FAILED_PRECONDITION"
    for part in ("'run7'", "redis://h:6379/0", str(SEEN), "restore", ACCEPT_FLAG, RUNBOOK):
        assert part in msg, (part, msg)
    assert ("holds no identity" in msg) == (how == "gone")
    assert str(e.copy()) == msg and e.copy() is not e
    with pytest.raises(ValueError, match="must be one of"):
        NamespaceLost("run7", "x", SEEN, None, "vanished")


def test_the_startup_refusal_names_the_loss_and_the_flag():
    e = startup_refusal("run7", "Redis at redis://h:6379/0", None, LossMarker(SEEN.encode(), "", "gone", 1_700_000_000.0))
    msg = str(e)
    for part in ("'run7'", str(SEEN), "found it gone", "1700000000", "holds no identity", ACCEPT_FLAG, RUNBOOK):
        assert part in msg, (part, msg)


ALL = dict.fromkeys(MUST_HOLD, True)


@pytest.mark.parametrize(
    ("exists", "problems", "stats", "heap", "missing"),
    [
        (ALL, 0, 0, 0, []),  # a namespace with nothing registered yet
        (ALL, 50, 50, 46, []),  # 4 leased
        ({**ALL, "settings": False}, 50, 50, 46, ["settings"]),
        ({**ALL, "counters": False}, 50, 50, 46, ["counters"]),
        ({}, 50, 50, 46, list(MUST_HOLD)),
        (ALL, 50, 0, 46, ["stats"]),  # the statistics evicted
        (ALL, 0, 0, 46, ["stats"]),  # statistics and problems evicted, the heap left
        (ALL, 0, 50, 46, ["problems"]),
    ],
)
def test_a_namespace_lacks_a_key_it_must_hold_when_one_is_gone_or_the_counts_disagree(exists, problems, stats, heap, missing):
    assert missing_keys(exists, problems, stats, heap) == missing


def test_an_incomplete_namespace_names_the_missing_keys_and_that_the_flag_does_not_bring_statistics_back():
    msg = str(NamespaceLost("run7", "Redis at redis://h:6379/0", SEEN, SEEN, "incomplete", missing=("settings", "stats")))
    for part in ("but not its keys 'settings', 'stats'", "maxmemory-policy", "noeviction", ACCEPT_FLAG, "new --namespace"):
        assert part in msg, (part, msg)


def test_the_memory_store_has_no_identity_and_the_flag_needs_redis():
    store = MemoryStore(StoreConfig())
    assert asyncio.run(store.claim_namespace(accept_loss=True)) == ""
    assert store.namespace_lost is None
    with pytest.raises(ValidationError, match="accept_namespace_loss applies to a Redis store only"):
        ServerConfig(store="memory", accept_namespace_loss=True)
    assert ServerConfig(store="redis://127.0.0.1:6379/0", accept_namespace_loss=True).accept_namespace_loss
