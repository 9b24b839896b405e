"""Differential tests of ``heap_age_decay`` (FreshPER: heap priorities that age toward the prior's
between reports), both stores with one fake clock, the memory store the oracle, as in
test_store_differential_evidence.py: every lease (its priorities), every dump and the priority
histogram agree; and the heap's order is the order of the aged priorities, computed here from
each problem's statistics and the version of its latest report."""

from __future__ import annotations

import asyncio
import math

import pytest

from prioreplay import rules
from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.store import StoreConfig
from prioreplay.rules import Pool
from tests.system.store.test_store_differential_evidence import _run_both


def _aged(dump: dict, config: StoreConfig) -> dict[str, tuple[float, float]]:
    """{problem id: (its heap score read back as a priority, the aged priority computed from the
    statistics)} over the heap at the dump's policy version."""
    params, version = config.params, dump["policy"][0]
    prior = rules.priority(rules.Stats(), params)
    out = {}
    for pid, (pool, n, s1, s2, score) in dump["problems"].items():
        if pool != int(Pool.HEAP):
            continue
        streak_pool, streak, last = dump["evidence"].get(pid, (0, 0, 0))  # never reported: as of version 0
        then = rules.PENDING_PRIORITY if streak else rules.priority(rules.Stats(n, s1, s2), params)
        now = rules.fresh_priority_now(then, prior, version - last, config.heap_age_decay)
        out[pid] = (rules.fresh_key_priority(score, prior, version, config.heap_age_decay), now)
    return out


@pytest.mark.parametrize(
    ("gamma", "prior"),
    [(0.5, (0.0, 0.0)), (0.9, (0.0, 0.0)), (0.7, (1.0, 3.0))],  # (1, 3): a prior below 0.25, priorities on both sides
)
def test_aged_heap_scores_agree_in_both_stores_and_order_the_heap_by_aged_priority(redis_url, namespace, gamma, prior):
    params = rules.PriorityParams(prior_alpha=prior[0], prior_beta=prior[1])
    config = StoreConfig(sampler="heap", seed=9, retest_fraction=0.25, retest_interval=1, heap_age_decay=gamma, params=params)
    dump, _ = asyncio.run(_run_both(config, redis_url, namespace, steps=20, problems=120))
    aged = _aged(dump, config)
    assert len(aged) > 8
    for pid, (read, want) in aged.items():
        assert math.isclose(read, want, rel_tol=1e-9, abs_tol=1e-12), pid
    order = sorted(aged, key=lambda pid: -dump["problems"][pid][4])  # heap order: score descending
    vals = [aged[pid][1] for pid in order]
    assert all(a >= b - 1e-12 for a, b in zip(vals, vals[1:], strict=False))


def test_ageing_changes_which_problems_the_heap_serves(redis_url, namespace):
    plain, _ = asyncio.run(_run_both(StoreConfig(sampler="heap", seed=9), redis_url, namespace, steps=16))
    aged, _ = asyncio.run(_run_both(StoreConfig(sampler="heap", seed=9, heap_age_decay=0.5), redis_url, namespace, steps=16))
    assert aged["problems"] != plain["problems"]


def test_a_warm_start_is_aged_from_version_0_alike(redis_url, namespace, tmp_path):
    from prioreplay import warm_start

    path = tmp_path / "warm.json"
    warm_start.write(path, {"q1": (8.0, 1.0, 1.0), "q2": (12.0, 6.0, 6.0), "q3": (4.0, 4.0, 4.0)})
    config = StoreConfig(sampler="heap", seed=4, warm_start=str(path), heap_age_decay=0.8)
    dump, _ = asyncio.run(_run_both(config, redis_url, namespace, steps=0, problems=6))
    q1 = rules.priority(rules.Stats(4.0, 0.5, 0.5), config.params)  # shrunk by the default 0.5
    assert dump["problems"]["q1"][4] == rules.fresh_key(q1, rules.MAX_PRIORITY, 0, 0.8)
    assert dump["problems"]["q5"][4] == 0.0  # cold: at the prior's priority, key 0
    asyncio.run(_run_both(config, redis_url, namespace, steps=10, batch=4, problems=6))  # then runs alike


def test_heap_age_decay_needs_the_heap_sampler():
    with pytest.raises(InvalidArgument, match="heap_age_decay"):
        StoreConfig(sampler="weighted", heap_age_decay=0.9)
    assert StoreConfig(sampler="weighted").heap_age_decay == 1.0
