"""Differential tests of the settings that change what a report does (both stores, one fake
clock, the memory store the oracle), as in test_store_differential.py:

* ``queue_zero_variance`` (plain GRPO): every group with a payload is queued for the learner;
* ``pool_evidence``: a problem is pooled only after k pool verdicts of one kind in a row, and waits
  at the top of the heap until then (``rules.confirm_pool``, ``rules.PENDING_PRIORITY``);
* ``age_decay``: a report ages the old statistics by the policy versions since the latest one;
* ``warm_start``: new problems start from a previous run's statistics, shrunk.

(test_store_differential.py draws both settings too, over random operations.)
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from prioreplay import rules
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import KEY_NAMES, RedisStore
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool
from tests.system.store.test_store_differential import _assert_dumps_equal, _lease_view, paired_stores, step_both

#: Groups of 4: all-correct, mixed, all-wrong, constant non-binary, mixed.
PATTERNS = [(1.0,) * 4, (0.0, 1.0, 1.0, 0.0), (0.0,) * 4, (0.5,) * 4, (0.0, 0.0, 1.0, 0.0)]


def _pattern(j: int, step: int, pid: str) -> tuple[float, ...]:
    """q0-q7 always all-wrong, q8-q15 all-correct but every fifth step, the rest in turn."""
    i = int(pid[1:])
    if i < 8:
        return PATTERNS[2]
    if i < 16:
        return PATTERNS[1] if step % 5 == 4 else PATTERNS[0]
    return PATTERNS[(j * 3 + step + i) % len(PATTERNS)]


async def _run_both(config: StoreConfig, redis_url: str, namespace: str, steps: int, batch: int = 8, problems: int = 40):
    """``steps`` batches through both stores with the same outcomes and clock, the policy version
    published every other batch; asserts equal answers and dumps after each; returns the last dump
    and the report results."""
    now = [1_700_000_000.0]
    mem = MemoryStore(config, None, clock=lambda: now[0])
    red = RedisStore(config, redis_url, f"{namespace}-e{uuid.uuid4().hex[:6]}", clock=lambda: now[0])
    results = []
    try:
        probs = _problems(problems)
        assert await red.register(probs) == await mem.register(probs)
        _assert_dumps_equal(await mem.dump(), await red.dump())
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


@pytest.mark.parametrize(("evidence", "gamma"), [(0, 1.0), (2, 1.0), (3, 0.6), (1, 0.6)])
def test_pools_from_evidence_and_aged_statistics_agree_on_a_longer_run(redis_url, namespace, evidence, gamma):
    config = StoreConfig(sampler="heap", retest_fraction=0.25, retest_interval=1, seed=9, pool_evidence=evidence, age_decay=gamma)
    dump, _ = asyncio.run(_run_both(config, redis_url, namespace, steps=24))
    k = rules.evidence_groups(4, evidence)
    streaks = dump["evidence"]
    pooled = [pid for pid, row in dump["problems"].items() if row[0] in (int(Pool.SOLVED), int(Pool.UNSOLVED))]
    assert pooled and all(streaks[pid][1] >= k for pid in pooled)  # every pooled problem had k verdicts in a row
    if k > 1:  # some problem waited in the heap on a shorter run
        assert any(row[0] == int(Pool.HEAP) and streaks.get(pid, (0, 0, 0))[1] for pid, row in dump["problems"].items())


def test_aged_statistics_change_the_state(redis_url, namespace):
    fresh, _ = asyncio.run(_run_both(StoreConfig(sampler="heap", seed=9), redis_url, namespace, steps=12))
    aged, _ = asyncio.run(_run_both(StoreConfig(sampler="heap", seed=9, age_decay=0.5), redis_url, namespace, steps=12))
    assert aged["problems"] != fresh["problems"]  # the sampling paths part; the factor itself: tests/unit/rules


@pytest.mark.parametrize("shrink", [0.5, 1 / 3, 0.0])
def test_a_warm_start_registers_alike_in_both_stores(redis_url, namespace, tmp_path, shrink):
    from prioreplay import warm_start

    path = tmp_path / "warm.json"
    warm_start.write(path, {"q1": (8.0, 0.0, 0.0), "q2": (12.0, 6.0, 6.0), "q3": (4.0, 4.0, 4.0), "gone": (4.0, 1.0, 1.0)})
    config = StoreConfig(sampler="heap", seed=4, warm_start=str(path), warm_start_shrink=shrink, retest_fraction=0.25)
    dump, _ = asyncio.run(_run_both(config, redis_url, namespace, steps=0, problems=6))
    q2 = rules.Stats(12.0 * shrink, 6.0 * shrink, 6.0 * shrink)
    assert dump["problems"]["q2"] == (int(Pool.HEAP), q2.n, q2.s1, q2.s2, rules.priority(q2, rules.PriorityParams()))
    assert dump["problems"]["q1"][0] == int(Pool.HEAP)  # never straight to a pool, whatever the old verdict
    assert dump["problems"]["q5"] == (int(Pool.HEAP), 0.0, 0.0, 0.0, rules.MAX_PRIORITY)  # not in the file: cold
    asyncio.run(_run_both(config, redis_url, namespace, steps=10, batch=4, problems=6))  # then runs alike


@pytest.mark.parametrize("shrink", [0.5, 0.0])
def test_a_warm_started_problem_counts_as_seen_alike_in_both_stores(redis_url, namespace, tmp_path, shrink):
    """Seen means statistics n > 0 (docs/METHOD.md, the samplers' probes, a snapshot's restart): a
    problem warm-started with ρ > 0 is seen from registration; with ρ = 0 it starts cold, unseen."""
    from prioreplay import warm_start

    path = tmp_path / "warm.json"
    warm_start.write(path, {"q1": (8.0, 0.0, 0.0), "q2": (12.0, 6.0, 6.0), "q3": (4.0, 4.0, 4.0), "gone": (4.0, 1.0, 1.0)})
    config = StoreConfig(sampler="heap", seed=4, warm_start=str(path), warm_start_shrink=shrink)

    async def run() -> list[int]:
        async with paired_stores(config, redis_url, namespace) as (mem, red, _):
            assert await red.register(_problems(6)) == await mem.register(_problems(6))
            unseen = [(await mem.stats()).unseen]  # the Redis store is asked only after a report, as in a run
            for _ in range(2):
                await step_both(mem, red, 2, lambda ps: [GroupOutcome(p.problem.id, (0.0, 1.0)) for p in ps])
                unseen.append((await mem.stats()).unseen)
                assert (await red.stats()).unseen == unseen[-1]
            dump = await mem.dump()
            assert unseen[-1] == sum(row[1] == 0 for row in dump["problems"].values())  # n == 0: unseen
            return unseen

    unseen = asyncio.run(run())
    assert unseen[0] == (3 if shrink else 6)


def _problems(n: int) -> list[ProblemRecord]:
    return [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(n)]
