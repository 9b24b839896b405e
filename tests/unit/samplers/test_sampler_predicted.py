"""``predicted`` (samplers/predicted.py): unseen problems ranked by a kNN-predicted priority."""

from __future__ import annotations

import numpy as np
import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.samplers.predicted import embed_prompt, predict_pass_rates
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import RedisStore
from prioreplay.problems import ProblemRecord


def test_embedding_is_deterministic_unit_and_similar_for_similar_prompts():
    a, b, c = (embed_prompt(t) for t in ("Add 17 and 25.", "Add 17 and 26.", "Name the capital of France."))
    assert np.array_equal(a, embed_prompt("Add 17 and 25.")) and a.dtype == np.float32
    assert float(np.linalg.norm(a)) == pytest.approx(1.0, abs=1e-6)
    assert float(a @ b) > 0.7 and float(a @ c) < 0.3  # 3 of 14 trigrams differ; a different text
    assert not embed_prompt("").any()


def test_prediction_is_the_softmax_weighted_mean_of_the_nearest():
    ref = np.eye(3, dtype=np.float32)  # (3, 3)
    rates = np.array([0.9, 0.1, 0.5])
    q = np.array([[1.0, 0.0, 0.1], [0.6, 0.8, 0.0]], dtype=np.float32)  # (2, 3)
    got = predict_pass_rates(q, ref, rates, k=2, tau=0.1)
    w = np.exp(np.array([0.6, 0.8]) / 0.1)
    # nearest two of q0: 0 (similarity 1) and 2 (0.1); of q1: 0 (0.6) and 1 (0.8)
    assert got[0] == pytest.approx((0.9 * np.exp(10) + 0.5 * np.exp(1)) / (np.exp(10) + np.exp(1)), rel=1e-6)
    assert got[1] == pytest.approx((0.9 * w[0] + 0.1 * w[1]) / w.sum(), rel=1e-6)


async def _store(prompts: list[str]) -> MemoryStore:
    store = MemoryStore(StoreConfig(sampler="predicted", retest_fraction=0.0, seed=3), clock=lambda: 1_700_000_000.0)
    await store.register([ProblemRecord(f"p{i}", t, "1") for i, t in enumerate(prompts)])
    return store


async def test_unseen_problems_like_a_mixed_one_come_before_those_like_solved_ones():
    topics = ["integrate the polynomial x^{} over the unit interval", "spell the word number {} backwards"]
    prompts = [topics[i % 2].format(i) for i in range(40)]
    store = await _store(prompts)
    first = await store.sample(8)  # no tested problem yet: the heap's order
    outcomes = []
    for sp in first.problems:
        mixed = int(sp.problem.id[1:]) % 2 == 0  # the integrals are mixed, the spelling is solved
        outcomes.append(GroupOutcome(sp.problem.id, (1.0, 0.0, 1.0, 0.0) if mixed else (1.0,) * 4))
    await store.report(first.lease_id, outcomes)
    seen = {sp.problem.id for sp in first.problems}
    nxt = await store.sample(6)
    unseen = [sp.problem.id for sp in nxt.problems if sp.problem.id not in seen]
    assert unseen and all(int(i[1:]) % 2 == 0 for i in unseen)  # predicted mixed: the integrals


async def test_with_nothing_tested_it_is_the_heap():
    prompts = [f"problem {i}" for i in range(20)]
    heap = MemoryStore(StoreConfig(sampler="heap", retest_fraction=0.0, seed=3))
    await heap.register([ProblemRecord(f"p{i}", t, "1") for i, t in enumerate(prompts)])
    store = await _store(prompts)
    assert [p.problem.id for p in (await store.sample(5)).problems] == [p.problem.id for p in (await heap.sample(5)).problems]


def test_the_redis_store_refuses_it():
    with pytest.raises(InvalidArgument, match="memory store only"):
        RedisStore(StoreConfig(sampler="predicted"), "redis://127.0.0.1:1/0", "ns")
