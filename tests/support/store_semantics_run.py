"""The store invariants of a run over time, each a test, written once for any store (the rest are
in ``tests/support/store_semantics.py``, with the helpers these use): policy versions never go
backwards, every pooled problem is retested within its bound, the pass-rate bands, re-registration
of colliding ids, and a namespace that refuses a start with other run settings.

Not collected by itself: collected with ``store_semantics`` by
``tests/unit/store/test_memory_store_invariants.py`` (memory store) and
``tests/system/store/test_redis_store_invariants.py`` (Redis store).
"""

from __future__ import annotations

import collections
import math

import pytest

from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.priority_server.store import StoreConfig
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool
from tests.support.store_semantics import FakeClock, check_one_place, make_problems, outcome


# -- publish rules --------------------------------------------------------------------------------
async def test_policy_versions_never_go_backwards(store_factory):
    store = store_factory(StoreConfig(), FakeClock())
    assert await store.policy() == (0, "")
    assert await store.publish(1, "ckpt/step-1") == (1, "ckpt/step-1")
    assert await store.publish(1, "ckpt/step-1") == (1, "ckpt/step-1")  # idempotent
    with pytest.raises(FailedPrecondition):
        await store.publish(1, "ckpt/other")
    assert await store.publish(3, "ckpt/step-3") == (3, "ckpt/step-3")
    with pytest.raises(FailedPrecondition):
        await store.publish(2, "ckpt/step-2")
    for bad in ((0, "x"), (-1, "x"), (4, "")):
        with pytest.raises(InvalidArgument):
            await store.publish(*bad)
    assert await store.policy() == (3, "ckpt/step-3")
    await store.register(make_problems(2))
    lease = await store.sample(2)
    assert (lease.policy_version, lease.weights_uri) == (3, "ckpt/step-3")
    st = await store.stats()
    assert (st.policy_version, st.weights_uri) == (3, "ckpt/step-3")


# -- retests: no pooled problem starves -----------------------------------------------------------
async def test_every_pooled_problem_is_retested_within_the_bound(store_factory):
    batch, fraction, interval = 20, 0.25, 3
    store = store_factory(StoreConfig(retest_fraction=fraction, retest_interval=interval, seed=5), FakeClock())
    solved = make_problems(12, "s")
    unsolved = make_problems(11, "u")
    heap = make_problems(60, "h")
    await store.register(solved + unsolved + heap)
    pooled = {p.id for p in solved + unsolved}
    size = len(pooled)
    bound = math.ceil(size / (fraction * batch)) + interval  # batches
    tested: dict[str, list[int]] = collections.defaultdict(list)
    entered: dict[str, int] = {}
    final_step = 0
    for _ in range(60):
        lease = await store.sample(batch)
        assert len(lease.problems) == batch
        final_step = lease.step
        outs = []
        for sp in lease.problems:
            pid = sp.problem.id
            if pid in pooled:
                if sp.source is Pool.HEAP:
                    entered[pid] = lease.step
                else:
                    tested[pid].append(lease.step)
            rewards = [1, 1] if pid[0] == "s" else [0, 0] if pid[0] == "u" else [1, 0, 0, 0]  # h: 3/16 < 0.25
            outs.append(outcome(pid, rewards))
        assert (await store.report(lease.lease_id, outs)).accepted
    assert set(entered) == pooled
    for pid in pooled:
        steps = [entered[pid]] + tested[pid]
        gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)] + [
            final_step - steps[-1]
        ]  # strict=False: neighbouring pairs: one fewer than steps
        assert max(gaps) <= bound, (pid, steps, bound)
        assert len(tested[pid]) >= 5
    st = await store.stats()
    assert st.forgetting_events == 0 and st.breakthroughs == 0


# -- pass-rate bands (--solved-at / --unsolved-at) ---------------------------------------------
@pytest.mark.parametrize(
    "solved_at, unsolved_at, expected",
    [
        (1.0, 0.0, [Pool.HEAP, Pool.HEAP, Pool.HEAP, Pool.SOLVED, Pool.HEAP, Pool.UNSOLVED]),  # the paper's rule
        (0.75, 0.25, [Pool.SOLVED, Pool.HEAP, Pool.UNSOLVED, Pool.SOLVED, Pool.SOLVED, Pool.UNSOLVED]),
    ],
)
async def test_pass_rate_bands_pool_groups_at_or_past_them(store_factory, solved_at, unsolved_at, expected):
    store = store_factory(StoreConfig(retest_fraction=0.0, solved_at=solved_at, unsolved_at=unsolved_at), FakeClock())
    await store.register(make_problems(6))
    lease = await store.sample(6)
    # pass rates 0.75, 0.5, 0.25, 1, 0.75 (non-binary), 0
    rewards = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0.5, 0.5, 1, 1], [0, 0, 0, 0]]
    ids = [sp.problem.id for sp in lease.problems]
    result = await store.report(lease.lease_id, [outcome(pid, r) for pid, r in zip(ids, rewards, strict=True)])
    assert [(await store.problem_state(pid)).pool for pid in ids] == expected
    assert result.groups_queued == 4  # a pooled mixed group still has a gradient: queued all the same
    await check_one_place(store, [f"p{i:04d}" for i in range(6)])


async def test_a_retest_that_stays_inside_its_band_is_no_forgetting_event(store_factory):
    store = store_factory(StoreConfig(retest_fraction=1.0, retest_interval=0, solved_at=0.75), FakeClock())
    await store.register(make_problems(2))
    lease = await store.sample(2)
    await store.report(lease.lease_id, [outcome(sp.problem.id, [1, 1, 1, 0]) for sp in lease.problems])
    retest = await store.sample(2)
    assert {sp.source for sp in retest.problems} == {Pool.SOLVED}
    first, second = (sp.problem.id for sp in retest.problems)
    await store.report(retest.lease_id, [outcome(first, [1, 0, 1, 1]), outcome(second, [1, 0, 0, 1])])
    counters = (await store.dump())["counters"]
    assert counters["forgetting_events"] == 1  # only the one that fell below 0.75 left the solved pool
    assert [(await store.problem_state(p)).pool for p in (first, second)] == [Pool.SOLVED, Pool.HEAP]


# -- re-registration: colliding ids are refused unless asked to replace (croissant-baker #101) ----
async def test_an_id_with_another_prompt_or_answer_is_refused_and_nothing_changes(store_factory):
    store = store_factory(StoreConfig(retest_fraction=0.0), FakeClock())
    first = make_problems(8)
    await store.register(first, replace=False)
    lease = await store.sample(8)
    await store.report(lease.lease_id, [outcome(sp.problem.id, [1, 0]) for sp in lease.problems])
    before = await store.dump()
    other = [ProblemRecord(p.id, f"Another dataset's question {i}", "7") for i, p in enumerate(first)]
    with pytest.raises(InvalidArgument) as err:
        await store.register(other + make_problems(2, prefix="new"), replace=False)
    msg = str(err.value)
    assert "8 problem id(s)" in msg and "'p0000'" in msg and "'p0004'" in msg and "'p0005'" not in msg
    assert "and 3 more" in msg and "--id-prefix" in msg and "--replace" in msg
    assert await store.dump() == before  # not even the two new ids
    assert (await store.problem_state("p0003")).problem == first[3]
    answer_only = [ProblemRecord(first[0].id, first[0].prompt, "999")]
    with pytest.raises(InvalidArgument, match="'p0000'"):
        await store.register(answer_only, replace=False)


async def test_identical_re_registration_is_harmless_and_replace_keeps_statistics(store_factory):
    store = store_factory(StoreConfig(retest_fraction=0.0), FakeClock())
    first = make_problems(4)
    await store.register(first, replace=False)
    lease = await store.sample(4)
    await store.report(lease.lease_id, [outcome(sp.problem.id, [1, 0]) for sp in lease.problems])
    before = await store.dump()
    retagged = [ProblemRecord(p.id, p.prompt, p.answer, "math", {"split": "train"}) for p in first]
    assert await store.register(retagged, replace=False) == (0, 4, 4)  # a loader that re-runs
    assert await store.dump() == before
    new_text = [ProblemRecord("p0001", "A shorter prompt", "2")]
    assert await store.register(new_text, replace=True) == (0, 1, 4)
    state = await store.problem_state("p0001")
    assert state.problem == new_text[0] and state.stats.n == 2  # text replaced, statistics kept
    with pytest.raises(InvalidArgument, match="'p0002'"):  # a clash inside one call too
        await store.register([first[2], ProblemRecord("p0002", "other", "x")], replace=False)


# -- run settings: a namespace refuses a start with other settings ------------------------------
async def _restart(store_factory, store, config):
    """The same namespace (Redis) or snapshot (memory) opened again with ``config``."""
    await store.snapshot()
    return store_factory(config, snapshot_path=store.snapshot_path if store_factory.kind == "memory" else None)


async def test_a_start_with_other_run_settings_is_refused_naming_each_change(store_factory, tmp_path):
    from prioreplay.rules import PriorityParams

    clock = FakeClock()
    first = store_factory(
        StoreConfig(sampler="heap", params=PriorityParams(decay=0.5)), clock, snapshot_path=tmp_path / "state.json"
    )
    assert await first.claim_settings() == {}  # the first start stores them
    assert await first.claim_settings() == {}  # the same settings again: fine
    other = StoreConfig(sampler="uniform", solved_at=0.875, params=PriorityParams(decay=1.0, prior_alpha=1.0))
    again = await _restart(store_factory, first, other)
    with pytest.raises(FailedPrecondition) as err:
        await again.claim_settings()
    msg = str(err.value)
    for change in ("sampler 'heap' -> 'uniform'", "decay 0.5 -> 1.0", "prior_alpha 0.0 -> 1.0", "solved_at 1.0 -> 0.875"):
        assert change in msg
    assert "retest_fraction" not in msg and "--accept-setting-changes" in msg
    changes = await again.claim_settings(accept_changes=True)
    assert set(changes) == {"sampler", "decay", "prior_alpha", "solved_at"}
    assert await (await _restart(store_factory, again, other)).claim_settings() == {}  # now stored
    with pytest.raises(FailedPrecondition, match="seed 0 -> 5.*cannot change.*--namespace"):
        await (
            await _restart(store_factory, again, StoreConfig(sampler="uniform", solved_at=0.875, seed=5, params=other.params))
        ).claim_settings(accept_changes=True)
