"""Differential test of the completion-token means and the samplers that read them (``cost-aware``,
``knapsack``): the memory store (the oracle) and the Redis store (``report.lua`` keeps the token
sums, ``sample.lua`` ranks and sizes by them) lease identical batches, group sizes included, over a
fixed run whose reports carry varied token counts (and some none).
"""

from __future__ import annotations

import asyncio

import pytest

from prioreplay import rules
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord
from tests.system.store.test_store_differential import _assert_dumps_equal, _lease_view, paired_stores


@pytest.mark.parametrize("sampler, decay", [("cost-aware", 0.9), ("knapsack", 0.9), ("knapsack", 1.0), ("cost-aware", 0.0)])
def test_token_aware_samplers_agree_on_a_run_with_token_counts(sampler, decay, redis_url, namespace):
    async def run() -> None:
        config = StoreConfig(
            sampler=sampler,
            retest_fraction=0.2,
            retest_interval=2,
            seed=5,
            params=rules.PriorityParams(decay=decay, prior_alpha=0.5, prior_beta=0.5),
            mean_group_size=6,
            max_group_size=20,
        )
        async with paired_stores(config, redis_url, f"{namespace}-{sampler}-{decay}") as (mem, red, now):
            probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(120)]
            assert await red.register(probs) == await mem.register(probs)
            sizes_seen: set[int] = set()
            for step in range(30):
                a, b = await mem.sample(12), await red.sample(12)
                assert _lease_view(b) == _lease_view(a)
                sizes_seen |= {p.group_size or 0 for p in a.problems}
                patterns = [(0.0, 1.0), (1.0,) * 3, (0.0, 1.0, 1.0, 0.0), (1.0, 0.0, 0.0, 0.0, 0.0), (0.0,) * 2]
                outcomes = []
                for j, p in enumerate(a.problems[:10]):
                    rewards = patterns[(j * 3 + step) % 5]
                    tokens = 0 if (j + step) % 7 == 0 else len(rewards) * (17 + 31 * ((j * 5 + step) % 11))
                    outcomes.append(GroupOutcome(p.problem.id, rewards, f"{step}:{j}".encode(), tokens))
                assert await red.report(b.lease_id, outcomes) == await mem.report(a.lease_id, outcomes)
                now[0] += 1.0
            _assert_dumps_equal(await mem.dump(), await red.dump())
            stored = await red._r.hgetall(red.key("tokens"))
            assert {k.decode(): tuple(map(float, v.split())) for k, v in stored.items()} == mem._s.tokens
            if sampler == "knapsack":
                assert len(sizes_seen) >= 4  # the sizes really vary

    asyncio.run(run())
