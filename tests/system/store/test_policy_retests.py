"""Retests that follow the policy (``retest_versions`` k >= 1, ``rules.pool_score``) in both stores.

A pooled problem's score is the policy version of its last test; it is due once the published
version is k or more past it, and due problems are retested by versions elapsed, most first. Each
test runs on the memory store and on the Redis store (``store_factory``); the last one checks
that both stores choose the same batches on a longer run with publishes in between.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from prioreplay import rules
from prioreplay.errors import FailedPrecondition
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool
from tests.support.store_semantics import FakeClock, make_problems, outcome
from tests.system.store.test_store_differential import _assert_dumps_equal, paired_stores, step_both

MIXED, WRONG, RIGHT = [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]

#: B = 4 with a quarter retested: quota 1 every batch; k = 3 versions; the step interval 0 (would
#: make every pooled problem due at once) shows it is unused.
CONFIG = StoreConfig(sampler="heap", retest_fraction=0.25, retest_interval=0, retest_versions=3, seed=5)


async def _publish(store, *versions: int) -> None:
    for v in versions:
        await store.publish(v, f"ckpt/v{v}")


async def _report(store, lease, first: list[int]) -> str:
    """Report ``lease`` with ``first`` for its first problem and mixed groups for the rest; returns
    the first problem's id."""
    rewards = [first] + [MIXED] * (len(lease.problems) - 1)
    await store.report(lease.lease_id, [outcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)])
    return lease.problems[0].problem.id


async def _park_two(store) -> tuple[str, str]:
    """Pool problem A under version 1 (all wrong) and B under version 3 (all right); returns (A, B)."""
    await store.register(make_problems(12))
    await _publish(store, 1)
    a = await _report(store, await store.sample(4), WRONG)
    await _publish(store, 2, 3)
    lease = await store.sample(4)
    assert all(sp.source is Pool.HEAP for sp in lease.problems)  # A is 2 versions old: not due at k = 3
    b = await _report(store, lease, RIGHT)
    assert ((await store.problem_state(a)).pool, (await store.problem_state(a)).score) == (Pool.UNSOLVED, 1.0)
    assert ((await store.problem_state(b)).pool, (await store.problem_state(b)).score) == (Pool.SOLVED, 3.0)
    return a, b


async def _retested(store) -> list[tuple[str, Pool]]:
    """The retests R of the next batch (the pool problems it leased), reported as mixed groups."""
    lease = await store.sample(4)
    await store.report(lease.lease_id, [outcome(sp.problem.id, MIXED) for sp in lease.problems])
    return [(sp.problem.id, sp.source) for sp in lease.problems if sp.source is not Pool.HEAP]


async def test_a_problem_pooled_many_versions_ago_is_retested_before_one_pooled_recently(store_factory):
    store = store_factory(CONFIG, FakeClock())
    a, b = await _park_two(store)
    await _publish(store, 4)  # A 3 versions old: due; B 1 version old: not yet
    assert await _retested(store) == [(a, Pool.UNSOLVED)]
    await _report(store, await store.sample(4), WRONG)  # another problem pooled under version 4
    await _publish(store, 5, 6, 7)  # B 4 versions old, the new one 3: both due, B first
    assert [pid for pid, _ in await _retested(store)] == [b]
    assert len(await _retested(store)) == 1  # the one pooled under version 4, one batch later


async def test_retests_wait_for_a_new_policy_version_not_for_batches(store_factory):
    store = store_factory(CONFIG, FakeClock())
    await store.register(make_problems(12))
    await _publish(store, 1)
    parked = await _report(store, await store.sample(4), WRONG)
    for _ in range(6):  # many batches under one policy: a retest would only redraw the same p
        assert await _retested(store) == []
    await _publish(store, 4)
    assert await _retested(store) == [(parked, Pool.UNSOLVED)]


async def test_the_step_clock_is_unchanged_when_the_setting_is_off(store_factory):
    store = store_factory(StoreConfig(sampler="heap", retest_fraction=0.25, retest_interval=1, seed=5), FakeClock())
    await store.register(make_problems(12))
    parked = await _report(store, await store.sample(4), WRONG)
    assert (await store.problem_state(parked)).score == 1.0  # the lease's step
    assert await _retested(store) == [(parked, Pool.UNSOLVED)]  # due one batch later, no publish


async def test_pooled_versions_survive_a_restart(store_factory, tmp_path):
    clock = FakeClock()
    kw = {"snapshot_path": tmp_path / "state.json"} if store_factory.kind == "memory" else {}
    first = store_factory(CONFIG, clock, **kw)
    a, b = await _park_two(first)
    await first.close()  # memory: writes the snapshot; Redis: the state stays in the namespace
    again = store_factory(CONFIG, clock, **kw)
    assert (await again.problem_state(a)).score == 1.0 and (await again.problem_state(b)).score == 3.0
    await _publish(again, 4)
    assert await _retested(again) == [(a, Pool.UNSOLVED)]
    await _publish(again, 6)
    assert await _retested(again) == [(b, Pool.SOLVED)]


async def _drop_stored_setting(store_factory, store, path) -> None:
    """Remove ``retest_versions`` from the stored run settings, as a server of an earlier version wrote them."""
    if store_factory.kind == "memory":
        await store.close()
        doc = json.loads(path.read_text())
        del doc["settings"]["retest_versions"]
        path.write_text(json.dumps(doc))
    else:
        key = store.key("settings")
        stored = json.loads(await store._r.get(key))
        del stored["retest_versions"]
        await store._r.set(key, json.dumps(stored, sort_keys=True))


async def test_a_namespace_from_before_the_setting_loads_and_refuses_turning_it_on_unasked(store_factory, tmp_path):
    path = tmp_path / "state.json"
    kw = {"snapshot_path": path} if store_factory.kind == "memory" else {}
    off = StoreConfig(sampler="heap", seed=5)
    old = store_factory(off, FakeClock(), **kw)
    await old.register(make_problems(3))
    assert await old.claim_settings() == {}
    await _drop_stored_setting(store_factory, old, path)
    assert await store_factory(off, FakeClock(), **kw).claim_settings() == {}  # missing = the default 0
    on = StoreConfig(sampler="heap", seed=5, retest_versions=2)
    with pytest.raises(FailedPrecondition, match="retest_versions 0 -> 2"):
        await store_factory(on, FakeClock(), **kw).claim_settings()
    turned = store_factory(on, FakeClock(), **kw)
    assert await turned.claim_settings(accept_changes=True) == {"retest_versions": (0, 2)}
    assert len((await turned.sample(3)).problems) == 3  # the old problems are served


@pytest.mark.parametrize("sampler", ["heap", "posterior", "knapsack"])
def test_both_stores_choose_the_same_retests_by_version(sampler, redis_url, namespace):
    """200 problems, 40 batches, a version published every third batch: identical batches (problems,
    sources, group sizes) and identical state in both stores."""

    async def run() -> None:
        config = StoreConfig(
            sampler=sampler,
            retest_fraction=0.25,
            retest_versions=2,
            seed=11,
            params=rules.PriorityParams(decay=0.8),
            posterior_decay=0.9,
        )
        patterns = [(0.0,) * 4, (1.0,) * 4, (0.0, 1.0, 1.0, 0.0), (1.0, 1.0, 1.0, 0.0), (0.0,) * 4]
        async with paired_stores(config, redis_url, f"{namespace}-{sampler}") as (mem, red, now):
            probs = make_problems(200)
            assert await red.register(probs) == await mem.register(probs)
            retests = 0
            for step in range(40):
                if step % 3 == 2:
                    v = step // 3 + 1
                    assert await red.publish(v, f"ckpt/v{v}") == await mem.publish(v, f"ckpt/v{v}")

                def outcomes(problems, step=step):
                    return [
                        GroupOutcome(p.problem.id, patterns[(j * 3 + step) % 5], f"{step}:{j}".encode())
                        for j, p in enumerate(problems[:12])
                    ]

                lease = await step_both(mem, red, 16, outcomes, f"batch {step}")
                retests += sum(sp.source is not Pool.HEAP for sp in lease.problems)
                now[0] += 1.0
            _assert_dumps_equal(await mem.dump(), await red.dump())
            assert retests >= 20  # the retest rule was exercised, not only the heap

    asyncio.run(run())
