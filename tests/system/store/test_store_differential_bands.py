"""Differential test of the pass-rate bands (``--solved-at`` / ``--unsolved-at``): the memory
store (the oracle) and the Redis store, whose Lua twin of ``rules.destination`` applies the
bands, agree operation by operation, as in test_store_differential.py (its scenario and
operations, reused unchanged), over configs whose bands pool mixed and constant groups.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from prioreplay import rules
from prioreplay.priority_server.samplers import SAMPLERS
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import KEY_NAMES, RedisStore
from prioreplay.problems import ProblemRecord
from tests.system.store.test_store_differential import _assert_dumps_equal, _lease_view, _scenario, ops

#: (solved_at, unsolved_at): both on, one on, and bands that catch the non-binary rewards too.
BANDS = [(0.75, 0.25), (0.5, 0.0), (1.0, 1 / 3), (0.7, 0.1), (0.9, 0.5)]

configs_with_bands = st.builds(
    lambda sampler, bands, retest_fraction, retest_interval, decay, seed: StoreConfig(
        sampler=sampler,
        solved_at=bands[0],
        unsolved_at=bands[1],
        retest_fraction=retest_fraction,
        retest_interval=retest_interval,
        params=rules.PriorityParams(decay=decay),
        seed=seed,
        lease_timeout_s=20.0,
        redelivery_timeout_s=1e7,
    ),
    sampler=st.sampled_from([name for name, spec in SAMPLERS.items() if spec.lua_branch]),
    bands=st.sampled_from(BANDS),
    retest_fraction=st.sampled_from([0.0, 0.25, 0.5]),
    retest_interval=st.sampled_from([0, 1, 3]),
    decay=st.sampled_from([1.0, 0.5]),
    seed=st.integers(0, 2**31),
)


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(config=configs_with_bands, operations=st.lists(ops, min_size=5, max_size=30))
def test_memory_and_redis_stores_agree_with_pass_rate_bands(config, operations, redis_url, namespace):
    asyncio.run(_scenario(config, operations, redis_url, f"{namespace}-{uuid.uuid4().hex[:6]}"))


#: Groups of 4 whose pass rates (1, 0.75, 0.5, 0.25, 0, 0.75 non-binary, 0.5 constant) fall
#: inside, on and outside each band.
PATTERNS = [
    (1.0,) * 4,
    (1.0, 1.0, 1.0, 0.0),
    (0.0, 1.0, 1.0, 0.0),
    (0.0, 0.0, 1.0, 0.0),
    (0.0,) * 4,
    (0.5, 0.5, 1.0, 1.0),
    (0.5,) * 4,
]


@pytest.mark.parametrize("bands", BANDS)
def test_every_band_places_and_counts_identically_on_a_longer_run(bands, redis_url, namespace):
    """60 problems, 30 batches with retests: pools, priorities, forgetting events and
    breakthroughs agree in both stores, and the bands pool mixed groups (not only uniform ones)."""

    async def run() -> None:
        now = [1_700_000_000.0]
        config = StoreConfig(
            sampler="heap",
            retest_fraction=0.25,
            retest_interval=1,
            seed=3,
            solved_at=bands[0],
            unsolved_at=bands[1],
            params=rules.PriorityParams(decay=0.5),
        )
        mem = MemoryStore(config, None, clock=lambda: now[0])
        red = RedisStore(config, redis_url, f"{namespace}-b{uuid.uuid4().hex[:6]}", clock=lambda: now[0])
        pooled_mixed = 0
        try:
            probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(60)]
            assert await red.register(probs) == await mem.register(probs)
            for step in range(30):
                a, b = await mem.sample(12), await red.sample(12)
                assert _lease_view(b) == _lease_view(a)
                outcomes = [
                    GroupOutcome(p.problem.id, PATTERNS[(j * 5 + step) % len(PATTERNS)], f"{step}:{j}".encode())
                    for j, p in enumerate(a.problems)
                ]
                assert await red.report(b.lease_id, outcomes) == await mem.report(a.lease_id, outcomes)
                for o in outcomes:
                    kind = rules.classify(o.rewards)
                    pooled_mixed += kind is rules.GroupKind.MIXED and (
                        (await mem.problem_state(o.problem_id)).pool is not rules.Pool.HEAP
                    )
                now[0] += 1.0
                _assert_dumps_equal(await mem.dump(), await red.dump())
            counters = (await mem.dump())["counters"]
            assert pooled_mixed > 0 and counters["forgetting_events"] + counters["breakthroughs"] > 0
        finally:
            await red._r.delete(*[red.key(n) for n in KEY_NAMES])
            await red.close()

    asyncio.run(run())
