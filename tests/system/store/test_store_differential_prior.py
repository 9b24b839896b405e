"""Differential tests of the prior for unseen problems (``--unseen-prior``; store/base.py, "A prior for
unseen problems"): both stores on one fake clock, the memory store the oracle, as in
test_store_differential.py (whose dumps compare the first-visit sums in every run): random operations
with the prior on; a longer run whose every lease, dump and stats (the histogram with the unseen band
at ω_unseen) agree; a fixed prior at the priority of no observations leasing exactly what ``off``
leases; and what the prior is for: a problem that scored 2/4 in the first batch is leased again in
the second, beside unseen problems."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prioreplay import rules
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.contract import UNSEEN_SCORE
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord
from tests.system.store.test_store_differential import (
    DIFFERENTIAL,
    _assert_dumps_equal,
    _lease_view,
    _scenario,
    ops,
    paired_stores,
    step_both,
)

configs = st.builds(
    StoreConfig,
    sampler=st.just("heap"),
    unseen_prior=st.sampled_from(["fit", "fit", "0.1", "0.0", "0.25"]),
    retest_fraction=st.sampled_from([0.0, 0.25, 0.5]),
    retest_interval=st.sampled_from([0, 1, 3]),
    retest_versions=st.sampled_from([0, 0, 1]),
    pool_evidence=st.sampled_from([1, 1, 0, 2]),
    age_decay=st.sampled_from([1.0, 1.0, 0.7]),
    params=st.builds(
        rules.PriorityParams,
        decay=st.sampled_from([1.0, 0.8, 0.0]),
        prior_alpha=st.sampled_from([0.0, 1.0]),
        prior_beta=st.sampled_from([0.0, 0.5]),
    ),
    seed=st.integers(0, 2**31),
    lease_timeout_s=st.just(20.0),
    redelivery_timeout_s=st.just(1e7),
)


@settings(DIFFERENTIAL, max_examples=20)
@given(config=configs, operations=st.lists(ops, min_size=5, max_size=30))
def test_memory_and_redis_stores_agree_with_the_prior_on(config, operations, redis_url, namespace):
    asyncio.run(_scenario(config, operations, redis_url, f"{namespace}-{uuid.uuid4().hex[:6]}"))


#: Groups of 4: 2/4, 1/4, all wrong, all correct, 3/4, constant non-binary.
PATTERNS = [(1.0, 0.0, 1.0, 0.0), (0.0, 0.0, 1.0, 0.0), (0.0,) * 4, (1.0,) * 4, (1.0, 1.0, 0.0, 1.0), (0.5,) * 4]


async def _batches(config: StoreConfig, redis_url: str, namespace: str, steps: int, problems: int = 60) -> list:
    """``steps`` batches of 6 through both stores (leases, answers, dumps and stats asserted equal after
    each; two of every batch's problems left out of the report, every sixth group of one completion,
    the clock past the lease timeout every fifth step, a policy published every third, 30 more problems
    registered at steps 5 and 10: unseen ones whose members sort above seen problems tied with them).
    Returns the memory store's lease views and how many problems of each lease were unseen."""
    views, unseen = [], []
    async with paired_stores(config, redis_url, namespace) as (mem, red, now):
        probs = [ProblemRecord(f"q{i:03d}", f"prompt {i}", str(i)) for i in range(problems)]
        assert await red.register(probs) == await mem.register(probs)
        for step in range(steps):
            if step in (5, 10):
                more = [ProblemRecord(f"r{step}-{i:02d}", f"more {i}", str(i)) for i in range(30)]
                assert await red.register(more) == await mem.register(more)

            def outcomes(ps, step=step):
                return [
                    GroupOutcome(p.problem.id, PATTERNS[(j + step) % 6][: 1 if (j + step) % 6 == 5 else 4], b"%d" % j)
                    for j, p in enumerate(ps[:4])
                ]

            never = {pid for pid, row in (await mem.dump())["problems"].items() if row[1] == 0.0}
            lease = await step_both(mem, red, 6, outcomes, f"step {step}")
            views.append(_lease_view(lease))
            unseen.append(sum(p.problem.id in never for p in lease.problems))
            now[0] += 30.0 if step % 5 == 4 else 1.0
            assert await red.expire_leases() == await mem.expire_leases()
            if step % 3 == 2:
                await mem.publish(step, f"v{step}")
                await red.publish(step, f"v{step}")
            assert await red.stats(9) == await mem.stats(9), f"step {step}"
            _assert_dumps_equal(await mem.dump(), await red.dump())
    return views, unseen


def test_a_longer_run_with_the_fitted_prior_agrees_and_mixes_seen_and_unseen_problems(redis_url, namespace):
    config = StoreConfig(sampler="heap", seed=11, unseen_prior="fit", retest_fraction=0.2, retest_interval=2)
    _, unseen = asyncio.run(_batches(config, redis_url, f"{namespace}-long", steps=24))
    assert unseen[0] == 6  # the first batch explores
    assert sum(0 < u < 6 for u in unseen[1:]) >= 12  # then seen problems are revisited beside unseen ones


def test_a_fixed_prior_at_the_priority_of_no_observations_leases_what_off_leases(redis_url, namespace):
    off = StoreConfig(sampler="heap", seed=5, retest_fraction=0.1, unseen_prior="off")
    top = StoreConfig(sampler="heap", seed=5, retest_fraction=0.1, unseen_prior=rules.MAX_PRIORITY)
    a, _ = asyncio.run(_batches(off, redis_url, f"{namespace}-off", steps=16))
    b, _ = asyncio.run(_batches(top, redis_url, f"{namespace}-top", steps=16))
    assert a == b


HALF, QUARTER, WRONG = (1.0, 0.0, 0.0, 1.0), (0.0, 1.0, 0.0, 0.0), (0.0,) * 4


def _first_batch(problems) -> list[GroupOutcome]:
    """The first batch's report: 2/4, 1/4 and two all-wrong groups (priorities 0.25, 0.1875, 0, 0)."""
    return [GroupOutcome(p.problem.id, r, b"x") for p, r in zip(problems, (HALF, QUARTER, WRONG, WRONG), strict=True)]


@pytest.mark.parametrize("prior", ["off", "fit"])
def test_a_problem_that_scored_2_of_4_is_leased_again_in_the_second_batch_beside_unseen_ones(redis_url, namespace, prior):
    config = StoreConfig(sampler="heap", seed=3, retest_fraction=0.0, unseen_prior=prior)

    async def run() -> None:
        async with paired_stores(config, redis_url, f"{namespace}-{prior}") as (mem, red, now):
            probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(40)]
            assert await red.register(probs) == await mem.register(probs)
            first = await step_both(mem, red, 4, _first_batch)
            half, quarter = first.problems[0].problem.id, first.problems[1].problem.id
            second = await step_both(mem, red, 4, lambda ps: [])
            ids = [p.problem.id for p in second.problems]
            unseen = [p for p in second.problems if p.problem.id not in (half, quarter)]
            stats = await mem.stats()
            if prior == "fit":
                # the fit: 4 first visits gave 0.25 + 0.1875 + 0 + 0; ω = (4·0.25 + 0.4375)/(4 + 4)
                assert stats.unseen_priority == 0.1796875
                assert ids[:2] == [half, quarter]  # 0.25, then 0.1875, both above ω
                assert [p.priority for p in second.problems] == [0.25, 0.1875, 0.1796875, 0.1796875]
                assert len(unseen) == 2  # explored beside them
            else:
                assert quarter not in ids  # every unseen problem (0.25) comes first
                assert {p.priority for p in second.problems} == {0.25}
            assert (await red.stats()).unseen_priority == stats.unseen_priority
            for p in unseen:
                assert (await mem.problem_state(p.problem.id)).stats.n == 0.0

    asyncio.run(run())


def test_the_priority_histogram_counts_unseen_problems_at_the_fitted_prior(redis_url, namespace):
    config = StoreConfig(sampler="heap", seed=2, retest_fraction=0.0, unseen_prior="fit")

    async def run() -> None:
        async with paired_stores(config, redis_url, f"{namespace}-hist") as (mem, red, now):
            probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(20)]
            await mem.register(probs)
            await red.register(probs)
            await step_both(mem, red, 4, _first_batch)
            for store in (mem, red):
                s = await store.stats(10)  # buckets of 0.025: ω = 0.1797 in [0.175, 0.2), 0.1875 too, 0.25 in the last
                assert s.unseen == 16 and s.heap_size == 18
                assert s.priority_histogram == [0] * 7 + [17, 0, 1]

    asyncio.run(run())


@pytest.mark.parametrize("shrink", [0.5, 0.0])
def test_a_warm_start_registers_alike_in_both_stores_with_the_prior(redis_url, namespace, tmp_path, shrink):
    """Warm-started problems count as seen (in the heap at their priority); shrunk to nothing (ρ = 0),
    unseen (in the unseen band); then both stores run alike."""
    from prioreplay import warm_start

    path = tmp_path / "warm.json"
    warm_start.write(path, {"q001": (8.0, 4.0, 4.0), "q002": (8.0, 1.0, 1.0), "q003": (4.0, 4.0, 4.0)})
    config = StoreConfig(sampler="heap", seed=8, unseen_prior="fit", warm_start=str(path), warm_start_shrink=shrink)

    async def registered() -> dict:
        async with paired_stores(config, redis_url, f"{namespace}-warm{shrink}") as (mem, red, _):
            probs = [ProblemRecord(f"q{i:03d}", f"prompt {i}", str(i)) for i in range(6)]
            assert await red.register(probs) == await mem.register(probs)
            _assert_dumps_equal(await mem.dump(), await red.dump())
            assert await red.stats() == await mem.stats()
            return (await mem.dump())["problems"]

    problems = asyncio.run(registered())
    scores = {pid: row[4] for pid, row in problems.items()}
    if shrink:  # (4, 2, 2): 0.25; (4, 0.5, 0.5): 0.109375; (2, 2, 2): 0
        assert [scores[f"q00{i}"] for i in range(4)] == [UNSEEN_SCORE, 0.25, 0.109375, 0.0]
    else:
        assert set(scores.values()) == {UNSEEN_SCORE}
    asyncio.run(_batches(config, redis_url, f"{namespace}-warmrun{shrink}", steps=6))
