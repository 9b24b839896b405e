"""``thompson`` (samplers/thompson.py): retests by Thompson draws of the decayed posterior."""

from __future__ import annotations

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.store import StoreConfig, tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import RedisStore
from prioreplay.rules import Pool


async def _second_batch(make_store) -> list[str]:
    store = await make_store("thompson", n=12, retest_fraction=0.5, retest_interval=0)
    lz = await store.sample(6)
    await store.report(lz.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0)) for sp in lz.problems])
    return [sp.problem.id for sp in (await store.sample(6)).problems]


async def test_thompson_is_deterministic_per_seed_and_memory_only(make_store):
    assert await _second_batch(make_store) == await _second_batch(make_store)
    with pytest.raises(InvalidArgument, match="memory store only"):
        RedisStore(StoreConfig(sampler="thompson"), "redis://127.0.0.1:1/0", "ns")


async def test_thompson_retests_the_oldest_first_and_fills_its_quota(make_store):
    store = await make_store("thompson", n=12, retest_fraction=0.5, retest_interval=0)
    lz = await store.sample(6)
    await store.report(lz.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0)) for sp in lz.problems])
    oldest = min((sp.problem.id for sp in lz.problems), key=lambda i: tie_member(i, 3))  # first in pool order
    nxt = await store.sample(6)  # quota 3
    retests = [sp for sp in nxt.problems if sp.source is Pool.SOLVED]
    assert len(retests) == 3
    assert retests[0].problem.id == oldest
