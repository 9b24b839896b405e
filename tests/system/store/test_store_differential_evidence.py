"""Differential tests of the settings that change what a report does (both stores, one fake
clock, the memory store the oracle), as in test_store_differential.py:

* ``queue_zero_variance`` (plain GRPO): every group with a payload is queued for the learner;
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import KEY_NAMES, RedisStore
from prioreplay.problems import ProblemRecord
from tests.system.store.test_store_differential import _assert_dumps_equal, _lease_view

#: Groups of 4: all-correct, mixed, all-wrong, constant non-binary, mixed.
PATTERNS = [(1.0,) * 4, (0.0, 1.0, 1.0, 0.0), (0.0,) * 4, (0.5,) * 4, (0.0, 0.0, 1.0, 0.0)]


def _pattern(j: int, step: int, pid: str) -> tuple[float, ...]:
    return PATTERNS[(j * 3 + step + int(pid[1:])) % len(PATTERNS)]


async def _run_both(config: StoreConfig, redis_url: str, namespace: str, steps: int, batch: int = 8, problems: int = 40):
    """``steps`` batches through both stores with the same outcomes and clock, the policy version
    published every other batch; asserts equal answers and dumps after each; returns the last dump
    and the report results."""
    now = [1_700_000_000.0]
    mem = MemoryStore(config, None, clock=lambda: now[0])
    red = RedisStore(config, redis_url, f"{namespace}-e{uuid.uuid4().hex[:6]}", clock=lambda: now[0])
    results = []
    try:
        probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(problems)]
        assert await red.register(probs) == await mem.register(probs)
        for step in range(steps):
            a, b = await mem.sample(batch), await red.sample(batch)
            assert _lease_view(b) == _lease_view(a)
            outcomes = [
                GroupOutcome(p.problem.id, _pattern(j, step, p.problem.id), f"{step}:{j}".encode())
                for j, p in enumerate(a.problems)
            ]
            res = await mem.report(a.lease_id, outcomes)
            assert await red.report(b.lease_id, outcomes) == res
            results.append(res)
            now[0] += 1.0
            if step % 2:
                await mem.publish(step // 2 + 1, f"v{step}")
                await red.publish(step // 2 + 1, f"v{step}")
            _assert_dumps_equal(await mem.dump(), await red.dump())
        return await mem.dump(), results
    finally:
        await red._r.delete(*[red.key(n) for n in KEY_NAMES])
        await red.close()


@pytest.mark.parametrize("queue", [False, True])
def test_zero_variance_groups_are_queued_only_for_plain_grpo(redis_url, namespace, queue):
    config = StoreConfig(sampler="uniform", retest_fraction=0.0, seed=5, queue_zero_variance=queue)
    dump, results = asyncio.run(_run_both(config, redis_url, namespace, steps=6))
    queued = sum(r.groups_queued for r in results)
    mixed = dump["counters"]["groups_mixed"]
    assert len(dump["queue"]) == queued
    if queue:
        assert queued == 6 * 8 and sum(r.groups_filtered for r in results) == 0
    else:
        assert queued == mixed < 6 * 8
