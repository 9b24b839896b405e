"""Differential test of the pace bound (store/base.py, "sample" step 1b): the memory store (the
oracle) and the Redis store (``sample.lua``) cut batches to the same room, refuse the same samples
(``paced``, with the same time to the earliest expiry) and lease the same problems, retest quota of
the cut batch included, over seeded runs of samples, reports (mixed and filtered), pulls, acks,
declared learner batches and expiries.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from prioreplay import rules
from prioreplay.priority_server.samplers import SAMPLERS
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord
from tests.system.store.test_store_differential import _assert_dumps_equal, _lease_view, paired_stores

PATTERNS = [(0.0, 1.0), (1.0, 1.0), (0.0, 0.0), (1.0, 0.0, 1.0), (0.5, 0.5)]


def _view(lease):
    return (*_lease_view(lease), lease.paced)


@pytest.mark.parametrize("sampler", ["heap", "uniform", "weighted", "knapsack"])
@pytest.mark.parametrize("pace_batches, pace_batch_groups", [(1, 3), (2, 0)])
def test_both_stores_pace_alike(sampler, pace_batches, pace_batch_groups, redis_url, namespace):
    assert SAMPLERS[sampler].lua_branch

    async def run() -> None:
        config = StoreConfig(
            sampler=sampler,
            retest_fraction=0.3,
            retest_interval=1,
            seed=11,
            params=rules.PriorityParams(decay=0.9),
            lease_timeout_s=20.0,
            redelivery_timeout_s=1e7,
            pace_batches=pace_batches,
            pace_batch_groups=pace_batch_groups,
        )
        rng = random.Random(f"{sampler}-{pace_batches}")
        async with paired_stores(config, redis_url, f"{namespace}-{sampler}-{pace_batches}") as (mem, red, now):
            probs = [ProblemRecord(f"q{i:02d}", f"prompt {i}", str(i)) for i in range(40)]
            assert await red.register(probs) == await mem.register(probs)
            leases: list[tuple] = []
            kinds = {"cut": 0, "paced": 0, "full": 0}
            for step in range(120):
                op = rng.choice(["sample", "sample", "sample", "report", "report", "pull", "batch", "advance"])
                if op == "sample":
                    size = rng.randint(1, 6)
                    a, b = await mem.sample(size), await red.sample(size)
                    assert _view(b) == _view(a), f"step {step}"
                    kinds["paced" if a.paced else "cut" if len(a.problems) < size else "full"] += 1
                    if a.lease_id:
                        leases.append((a, b))
                elif op == "report" and leases:
                    a, b = leases.pop(rng.randrange(len(leases)))
                    outs = [
                        GroupOutcome(p.problem.id, rng.choice(PATTERNS), f"{step}:{p.problem.id}".encode())
                        for p in a.problems[: rng.randint(0, len(a.problems))]  # some left out: returned
                    ]
                    assert await red.report(b.lease_id, outs) == await mem.report(a.lease_id, outs)
                elif op == "pull":
                    n = rng.randint(1, 4)
                    da, db = await mem.pull("L", n), await red.pull("L", n)
                    assert [d.payload for d in db] == [d.payload for d in da]
                    assert await red.ack([d.group_id for d in db]) == await mem.ack([d.group_id for d in da])
                elif op == "batch":
                    n = rng.randint(1, 5)
                    await mem.pace.note_learner_batch(n)
                    await red.pace.note_learner_batch(n)
                else:
                    now[0] += rng.choice([1.0, 8.0, 25.0])
                sa, sb = await mem.stats(5), await red.stats(5)
                sa.reward_sum = sb.reward_sum = round(sa.reward_sum, 9)
                assert sb == sa, f"step {step} {op}"
            _assert_dumps_equal(await mem.dump(), await red.dump())
            assert all(kinds.values()), kinds  # the run met full, cut and refused batches
            assert await red.pace.read_learner_batch() == mem.pace.learner_batch

    asyncio.run(run())
