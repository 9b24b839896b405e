"""``--min-replica-acks``: a number or ``all`` (the default), validated with a message naming the
value; which replicas the sentinels list count for ``all`` (:func:`...replicas.promotable`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prioreplay.priority_server.config import ReplicationSettings, ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.redis.connection import RedisConnection
from prioreplay.priority_server.store.redis.replicas import ReplicaTarget, promotable


def test_the_default_waits_for_every_promotable_replica_and_accepts_the_memory_store():
    assert ReplicationSettings().min_replica_acks == "all"
    assert ServerConfig(store="memory").min_replica_acks == "all"  # no replica: nothing to wait for
    create_store("memory", StoreConfig(), replication=ReplicationSettings())


@pytest.mark.parametrize(("given", "taken"), [("all", "all"), (" ALL ", "all"), ("2", 2), (0, 0), (16, 16)])
def test_a_number_or_all_is_taken_from_a_flag_a_variable_or_a_file(given, taken):
    assert ReplicationSettings(min_replica_acks=given).min_replica_acks == taken


@pytest.mark.parametrize("bad", ["most", -1, 17, "1.5", True, None])
def test_anything_else_is_refused_naming_the_value_and_the_choices(bad):
    with pytest.raises(ValidationError) as err:
        ReplicationSettings(min_replica_acks=bad)
    assert f"min_replica_acks ({bad!r}) must be 'all'" in str(err.value) and "from 0 to 16" in str(err.value)


def _replica(**kw):
    return {"is_sdown": False, "is_odown": False, "is_disconnected": False, "slave-priority": 100, "role-reported": "slave", **kw}


@pytest.mark.parametrize(
    ("replica", "counts"),
    [
        (_replica(), True),
        (_replica(is_disconnected=True), True),  # right after a failover, before the sentinels connect
        (_replica(is_sdown=True), False),
        (_replica(is_odown=True), False),
        (_replica(**{"slave-priority": 0}), False),  # never promoted
        (_replica(**{"role-reported": "master"}), False),  # the old primary, not demoted yet: follows no one
    ],
)
def test_all_counts_the_replicas_a_failover_could_promote_and_that_can_acknowledge(replica, counts):
    assert promotable(replica) is counts


@pytest.mark.parametrize(("setting", "want", "connected", "waited"), [("all", 1, 2, 2), ("all", 2, 1, 2), (1, 1, 2, 1)])
def test_a_replica_seen_connected_after_a_wait_is_waited_for_at_once_with_all(setting, want, connected, waited):
    """The count of ``all`` may be 0.5 s old; a replica connected since (INFO after the WAIT) raises it."""
    target = ReplicaTarget(RedisConnection("redis://127.0.0.1:1/0"), ReplicationSettings(min_replica_acks=setting))
    assert target.saw_connected(connected, want) == waited
