"""The prior for unseen problems in the memory store alone (store/base.py, "A prior for unseen problems";
the differential tests against Redis are tests/system/store/test_store_differential_prior.py): the
setting's checks, between off and on fixed for a namespace's life, the unseen band kept across a
snapshot, and the heap order the view reads at any rank."""

from __future__ import annotations

import pytest

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.contract import UNSEEN_SCORE
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.rules import Pool
from tests.support.store_semantics import FakeClock, make_problems, outcome


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"sampler": "weighted"}, "--sampler heap"), ({"heap_age_decay": 0.9}, "--heap-age-decay 1")],
)
def test_the_prior_is_refused_where_the_heap_is_not_read_as_an_order_of_priorities(settings, named):
    with pytest.raises(InvalidArgument, match=f"unseen_prior.*{named}.*--unseen-prior off"):
        StoreConfig(unseen_prior="fit", **settings)
    StoreConfig(unseen_prior="off", **settings)  # off: as before


def test_the_server_flag_takes_off_fit_or_a_priority():
    assert ServerConfig(_cli_parse_args=["--unseen-prior", "fit"]).to_store_config().unseen_prior == "fit"
    assert ServerConfig(_cli_parse_args=["--unseen-prior", "0.125"]).unseen_prior == "0.125"
    assert ServerConfig().unseen_prior == "off"


async def _reported(config: StoreConfig, path=None) -> MemoryStore:
    """A store with 12 problems after one batch of 4: 2/4, 1/4, all wrong, all correct."""
    store = MemoryStore(config, path, FakeClock())
    await store.claim_settings()
    await store.register(make_problems(12))
    lease = await store.sample(4)
    rewards = [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    await store.report(lease.lease_id, [outcome(p.problem.id, r) for p, r in zip(lease.problems, rewards, strict=True)])
    return store


async def test_between_off_and_on_the_setting_is_fixed_for_a_namespace_and_fit_to_a_value_is_a_change(tmp_path):
    path = tmp_path / "store.json"
    await (await _reported(StoreConfig(unseen_prior="fit", seed=1), path)).close()
    with pytest.raises(FailedPrecondition, match=r"unseen_prior 'fit' -> 'off'.*unseen_prior cannot change"):
        await MemoryStore(StoreConfig(seed=1), path, FakeClock()).claim_settings(accept_changes=True)
    with pytest.raises(FailedPrecondition, match=r"unseen_prior 'fit' -> '0\.1'.*--accept-setting-changes"):
        await MemoryStore(StoreConfig(unseen_prior=0.1, seed=1), path, FakeClock()).claim_settings()
    fixed = MemoryStore(StoreConfig(unseen_prior=0.1, seed=1), path, FakeClock())
    assert await fixed.claim_settings(accept_changes=True) == {"unseen_prior": ("fit", "0.1")}
    assert (await fixed.stats()).unseen_priority == 0.1


async def test_the_unseen_band_and_the_fit_survive_a_snapshot(tmp_path):
    path = tmp_path / "store.json"
    store = await _reported(StoreConfig(unseen_prior="fit", seed=4), path)
    dump = await store.dump()
    assert dump["unseen_fit"] == (4, 0.25 + 0.1875)
    assert sorted(row[4] for row in dump["problems"].values() if row[1] == 0.0) == [UNSEEN_SCORE] * 8
    await store.close()
    restored = MemoryStore(store.config, path, FakeClock())
    assert await restored.dump() == dump
    assert [p.problem.id for p in (await restored.sample(6)).problems] == [p.problem.id for p in (await store.sample(6)).problems]


async def test_a_warm_started_problem_counts_as_seen_and_one_shrunk_to_nothing_as_unseen(tmp_path):
    from prioreplay import warm_start

    path = tmp_path / "warm.json"
    warm_start.write(path, {"p0000": (8.0, 4.0, 4.0), "p0001": (8.0, 2.0, 2.0)})
    for shrink, seen in ((0.5, True), (0.0, False)):
        store = MemoryStore(StoreConfig(unseen_prior="fit", warm_start=str(path), warm_start_shrink=shrink), None, FakeClock())
        await store.register(make_problems(6))
        state = await store.problem_state("p0001")
        want = rules.priority(state.stats, store.config.params) if seen else UNSEEN_SCORE
        assert (state.pool, state.score) == (Pool.HEAP, want)
        assert (await store.stats()).unseen == (4 if seen else 6)


async def test_the_view_reads_every_rank_of_the_heap_order_with_unseen_problems_at_the_prior():
    store = await _reported(StoreConfig(unseen_prior="fit", seed=7, retest_fraction=0.0))
    omega = store.unseen_priority(store._s.unseen_fit)
    store._view.unseen = omega
    want = sorted(((omega if score == UNSEEN_SCORE else score, member) for score, member in store._heap), reverse=True)
    assert [store._view.heap_entry(r) for r in range(len(want))] == want
    assert [m for _, m in want[:2]] == [store._view.take_heap(0).member, store._view.take_heap(0).member]
    with pytest.raises(IndexError):
        store._view.heap_entry(len(want) - 2)
