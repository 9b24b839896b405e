"""The memory store without Redis: every store invariant (tests/support/store_semantics.py) on the
in-process store, then what only the memory store has: snapshot round trip, corrupt-snapshot
refusal, a quarantined problem kept across a snapshot, the store factory, URL redaction.
"""

from __future__ import annotations

import json

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.redact import redact_url
from prioreplay.rules import Pool
from tests.support.store_semantics import *  # noqa: F401,F403  (the invariant tests, collected here)
from tests.support.store_semantics import FakeClock, make_problems, outcome
from tests.support.store_semantics_run import *  # noqa: F401,F403


@pytest.fixture
def store_factory(memory_store_factory):
    """The invariant tests' store: the memory store only."""
    return memory_store_factory


async def _busy_memory_store(path, clock):
    store = MemoryStore(StoreConfig(retest_fraction=0.25, retest_interval=0, seed=9, redelivery_timeout_s=30), path, clock)
    await store.register(make_problems(12))
    lease = await store.sample(12)
    rewards = [[1, 0]] * 4 + [[1, 1]] * 4 + [[0, 0]] * 4
    await store.report(lease.lease_id, [outcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)])
    await store.report(lease.lease_id, [])  # a late report: counted
    await store.publish(2, "ckpt/step-2")
    pulled = await store.pull("L1", 2)
    live = await store.sample(5, lease_timeout_s=100)
    return store, lease, live, pulled


async def test_memory_snapshot_round_trip(tmp_path):
    clock = FakeClock()
    path = tmp_path / "state" / "store.json"
    store, old, live, pulled = await _busy_memory_store(path, clock)
    await store.snapshot()
    assert sorted(p.name for p in path.parent.iterdir()) == ["store.json"]  # no temp file left behind
    assert path.is_file()
    restored = MemoryStore(store.config, path, clock)
    assert await restored.dump() == await store.dump()
    assert await restored.stats() == await store.stats()
    for p in make_problems(12):
        assert await restored.problem_state(p.id) == await store.problem_state(p.id)
    assert (await restored.report(old.lease_id, [])).reason == "already reported"
    # both continue identically: same next batch, same lease accepted
    assert [sp.problem.id for sp in (await restored.sample(3)).problems] == [
        sp.problem.id for sp in (await store.sample(3)).problems
    ]
    assert (await restored.report(live.lease_id, [outcome(live.problems[0].problem.id, [1, 0])])).accepted
    again = await restored.pull("L1", 10, include_own_pending=True)
    assert [(d.group_id, d.delivery_count) for d in again[:2]] == [(d.group_id, 2) for d in pulled]
    assert len(again) == 5  # 2 own pending + 2 never delivered + 1 queued after the restore
    assert len({d.group_id for d in again}) == 5


async def test_memory_close_snapshots_and_a_missing_file_starts_empty(tmp_path):
    path = tmp_path / "s.json"
    store = MemoryStore(StoreConfig(), path, FakeClock())
    assert (await store.stats()).problems == 0 and not path.exists()
    await store.register(make_problems(3))
    await store.close()
    assert (await MemoryStore(StoreConfig(), path, FakeClock()).stats()).problems == 3


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong-format", "lease-lost", "bad-payload", "empty"])
async def test_memory_store_refuses_a_corrupt_snapshot(tmp_path, damage):
    clock = FakeClock()
    path = tmp_path / "store.json"
    store, *_ = await _busy_memory_store(path, clock)
    await store.snapshot()
    raw = path.read_bytes()
    doc = json.loads(raw)
    if damage == "garbage":
        path.write_bytes(b"\x00\xffnot json")
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "wrong-format":
        path.write_text(json.dumps({"format": "something-else", "version": 1}))
    elif damage == "lease-lost":
        doc["leases"] = []
        path.write_text(json.dumps(doc))
    elif damage == "bad-payload":
        doc["queue"]["new"][0][1] = "***not base64***"
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(b"")
    with pytest.raises(InvalidArgument) as err:
        MemoryStore(store.config, path, clock)
    assert str(path) in str(err.value)


# -- the factory ------------------------------------------------------------------------------------
def test_create_store_memory_and_refusal_of_unknown_specs(tmp_path):
    store = create_store("memory", StoreConfig(), snapshot_path=tmp_path / "x.json")
    assert isinstance(store, MemoryStore) and store.snapshot_path == tmp_path / "x.json"
    for spec in ("bogus", "redis:/x", "http://user:hunter2@host/0", ""):
        with pytest.raises(InvalidArgument) as err:
            create_store(spec, StoreConfig())
        msg = str(err.value)
        assert "'memory'" in msg and "redis://" in msg and "rediss://" in msg
        assert "hunter2" not in msg
    assert "bogus" in str(pytest.raises(InvalidArgument, create_store, "bogus", StoreConfig()).value)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://app:s3cret@cache.example:6380/2", "rediss://app:***@cache.example:6380/2"),
        ("redis://host/0?password=s3cret&ssl_cert_reqs=none", "redis://host/0?password=***&ssl_cert_reqs=none"),
        ("redis://app@host/0", "redis://app@host/0"),
    ],
)
def test_redact_url_hides_passwords(url, expected):
    assert redact_url(url) == expected
    assert "s3cret" not in redact_url(url)


async def test_a_quarantined_problem_survives_a_memory_snapshot(tmp_path):
    path = tmp_path / "state.json"
    store = MemoryStore(StoreConfig(retest_fraction=0.0), snapshot_path=path)
    await store.register(make_problems(3))
    lease = await store.sample(3)
    bad = lease.problems[2].problem.id
    assert (await store.report(lease.lease_id, [], unservable=[bad])).quarantined == 1
    await store.close()  # writes the snapshot
    again = MemoryStore(StoreConfig(retest_fraction=0.0), snapshot_path=path)
    assert (await again.problem_state(bad)).pool is Pool.QUARANTINED
    assert (await again.stats()).quarantined == 1 and bad not in {p.problem.id for p in (await again.sample(3)).problems}
    await again.register(make_problems(3))
    assert (await again.problem_state(bad)).pool is Pool.HEAP


async def test_a_snapshot_from_before_stored_settings_loads_and_takes_the_current_ones(tmp_path):
    from prioreplay.errors import FailedPrecondition

    path = tmp_path / "state.json"
    store = MemoryStore(StoreConfig(seed=3), path)
    await store.register(make_problems(3))
    await store.close()
    doc = json.loads(path.read_text())
    assert doc["settings"] is None  # never claimed (no server started on it)
    del doc["settings"]  # as written before the run settings were stored
    path.write_text(json.dumps(doc))
    old = MemoryStore(StoreConfig(seed=3, retest_interval=2), path)
    assert await old.claim_settings() == {}
    await old.close()
    with pytest.raises(FailedPrecondition, match="retest_interval 2 -> 4"):
        await MemoryStore(StoreConfig(seed=3), path).claim_settings()


async def test_a_leases_holder_survives_a_memory_snapshot_and_old_rows_load_without_one(tmp_path):
    import json

    from prioreplay.errors import FailedPrecondition

    clock = FakeClock()
    path = tmp_path / "state.json"
    store = MemoryStore(StoreConfig(retest_fraction=0.0), path, clock)
    await store.register(make_problems(4))
    held = await store.sample(2, lease_timeout_s=100, worker_id="w1")
    await store.close()
    again = MemoryStore(StoreConfig(retest_fraction=0.0), path, clock)
    with pytest.raises(FailedPrecondition, match="sampled by worker 'w1'"):
        await again.renew(held.lease_id, "w2", 10)
    assert (await again.renew(held.lease_id, "w1", 10)).deadline == clock.t + 10
    doc = json.loads(path.read_text())
    doc["leases"] = [row[:4] for row in doc["leases"]]  # a file written before leases kept their holder
    path.write_text(json.dumps(doc))
    old = MemoryStore(StoreConfig(retest_fraction=0.0), path, clock)
    assert (await old.renew(held.lease_id, "", 10)).problems == 2
