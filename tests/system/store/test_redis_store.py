"""Redis-specific behaviour of RedisStore: keys, scripts, bit-exact RNG and floats, errors, streams.

The semantics shared with the memory store are covered by test_redis_store_invariants.py and
test_store_differential.py; these tests look at what only the Redis implementation can get wrong.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from prioreplay import rules
from prioreplay.errors import InvalidArgument, NotFound, StoreUnavailable
from prioreplay.priority_server.samplers import XorShift32, step_seed
from prioreplay.priority_server.store import StoreConfig, tie_member
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import KEY_NAMES, RedisStore
from prioreplay.priority_server.store.redis.scripts import lua_library
from prioreplay.problems import ProblemRecord
from tests.conftest import free_port


def _problems(n: int, prefix: str = "p") -> list[ProblemRecord]:
    return [ProblemRecord(f"{prefix}{i}", f"What is {i} + 1?", str(i + 1), "gsm8k", {"split": "test"}) for i in range(n)]


@pytest.fixture
async def make(redis_url, namespace):
    made: list[RedisStore] = []

    def factory(config: StoreConfig | None = None, clock=None, ns: str = namespace) -> RedisStore:
        store = RedisStore(config or StoreConfig(), redis_url, ns, clock=clock or (lambda: 1_700_000_000.0))
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.close()


async def test_every_key_has_the_prefix_and_the_hash_tag(make, redis_url, namespace):
    store = make(StoreConfig(retest_fraction=0.0))
    await store.register(_problems(6))
    lease = await store.sample(4)
    await store.report(
        lease.lease_id,
        [GroupOutcome(lease.problems[0].problem.id, (0.0, 1.0), b"g"), GroupOutcome(lease.problems[1].problem.id, (1.0, 1.0))],
    )
    await store.sample(1)
    await store.publish(1, "ckpt/step-1")
    await store.pull("learner", 4)
    r = redis.Redis.from_url(redis_url)
    try:
        keys = [k.decode() for k in r.scan_iter(match=f"*{namespace}*", count=1000)]
    finally:
        r.close()
    prefix = f"prioreplay:{{{namespace}}}:"
    assert keys and all(k.startswith(prefix) for k in keys), keys
    assert {k[len(prefix) :] for k in keys} <= set(KEY_NAMES)
    assert {"problems", "stats", "heap", "solved", "leases", "deadlines", "counters", "policy", "stream", "tomb:reported"} <= {
        k[len(prefix) :] for k in keys
    }
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one cluster slot per run
    assert store.key("heap") == f"prioreplay:{{{namespace}}}:heap"


def test_namespace_that_would_break_the_hash_tag_is_refused(redis_url):
    for bad in ("", "run{1}", "a b", "x" * 129):
        with pytest.raises(InvalidArgument, match="namespace"):
            RedisStore(StoreConfig(), redis_url, bad)


async def test_scripts_are_reloaded_after_script_flush(make, redis_url):
    store = make(StoreConfig(retest_fraction=0.0))
    await store.register(_problems(5))
    first = await store.sample(2)
    sha = store._scripts["sample"].sha
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.script_exists(sha) == [True]
        r.script_flush()
        assert r.script_exists(sha) == [False]
        # every kind of call still works: EVALSHA fails with NOSCRIPT, redis-py loads the script again
        assert await store.register(_problems(7)) == (2, 5, 7)
        second = await store.sample(2)
        assert r.script_exists(sha) == [True]
    finally:
        r.close()
    assert second.step == first.step + 1 and len(second.problems) == 2
    res = await store.report(first.lease_id, [GroupOutcome(first.problems[0].problem.id, (1.0,))])
    assert res.accepted and res.groups_filtered == 1


def _lua_xorshift(redis_url: str):
    """``draw(seed32, count)``: ``count`` draws of XorShift32(seed32).next_u32() and one random(),
    computed by the store's Lua library (lib.lua) through the test-only script lua/rng.lua."""
    script = lua_library() + "\n" + (Path(__file__).with_name("lua") / "rng.lua").read_text(encoding="utf-8")
    client = redis.Redis.from_url(redis_url)
    run = client.register_script(script)

    def draw(seed32: int, count: int) -> tuple[list[int], float]:
        res = run(keys=[], args=[seed32, count])
        return [int(x) for x in res[:-1]], float(res[-1])

    return client, draw


def test_lua_xorshift32_is_bit_exact_with_python(redis_url):
    client, lua_xorshift = _lua_xorshift(redis_url)
    rnd = random.Random(1234)
    seeds = [0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1, 0xDEADBEEF]
    seeds += [step_seed(s, step) for s in (0, 7, 2**40) for step in range(1, 40)]
    seeds += [rnd.getrandbits(32) for _ in range(150)]
    for seed in seeds:
        lua_draws, lua_random = lua_xorshift(seed, 100)
        py = XorShift32(seed)
        assert lua_draws == [py.next_u32() for _ in range(100)], seed
        assert lua_random == py.random(), seed  # the float, exactly
    client.close()


async def test_floats_round_trip_exactly_through_redis(make, redis_url):
    params = rules.PriorityParams(decay=0.9, prior_alpha=0.5, prior_beta=0.25)
    now = [1_700_000_000.0]
    store = make(StoreConfig(params=params, retest_fraction=0.0), clock=lambda: now[0])
    await store.register(_problems(1))
    groups = [(0.1, 0.7, 1 / 3), (0.3, 0.3), (1.0, 0.0, 0.2, 0.9), (2 / 3,), (0.0, 0.0), (1e-9, 0.123456789)]
    expected = rules.Stats()
    reward_sum = 0.0
    r = redis.Redis.from_url(redis_url)
    try:
        for rewards in groups:
            lease = await store.sample(1)
            assert [p.problem.id for p in lease.problems] == ["p0"]
            assert (await store.report(lease.lease_id, [GroupOutcome("p0", rewards, b"x")])).accepted
            expected = rules.update_stats(expected, rewards, params)
            group_sum = 0.0
            for x in rewards:
                group_sum = group_sum + x
            reward_sum = reward_sum + group_sum
            state = await store.problem_state("p0")
            assert state.stats == expected  # n, s1, s2 bit for bit
            if state.pool is rules.Pool.HEAP:
                want = rules.priority(expected, params)
                assert state.score == want and state.priority == want
                assert r.zscore(store.key("heap"), tie_member("p0", 0)) == want
            now[0] += 1.0
        assert (await store.stats()).reward_sum == reward_sum  # %.17g, not HINCRBYFLOAT's format
    finally:
        r.close()


async def test_step_moved_by_another_server_is_retried_with_the_right_seed(make, namespace):
    """Two servers on one namespace interleave weighted samples: each RNG seed follows the step."""
    config = StoreConfig(sampler="weighted", seed=3, retest_fraction=0.0)
    a, b = make(config), make(config)
    oracle = MemoryStore(config, None, clock=lambda: 1_700_000_000.0)
    probs = _problems(40)
    await a.register(probs)
    await oracle.register(probs)
    for _ in range(6):
        first = await a.sample(3)  # b's cached step is now stale: its next call retries once
        second = await b.sample(3)
        for got in (first, second):
            want = await oracle.sample(3)
            assert [p.problem.id for p in got.problems] == [p.problem.id for p in want.problems]
            assert got.step == want.step


async def test_problem_state_of_an_unknown_id_raises_not_found(make):
    store = make()
    await store.register(_problems(2))
    with pytest.raises(NotFound, match="'nope'"):
        await store.problem_state("nope")
    assert (await store.problem_state("p1")).problem.answer == "2"


async def test_unreachable_redis_raises_store_unavailable_with_the_password_redacted():
    port = free_port()  # closed: nothing listens there
    store = RedisStore(StoreConfig(), f"redis://:hunter2-secret@127.0.0.1:{port}/0", "offline")
    try:
        for call in (store.sample(1), store.register(_problems(1)), store.pull("l", 1), store.stats(), store.report("abc", [])):
            with pytest.raises(StoreUnavailable) as e:
                await call
            text = f"{e.value} {e.value!r}"
            assert f"127.0.0.1:{port}" in text and "hunter2-secret" not in text
            assert e.value.__cause__ is None  # wrapped once, the driver's exception is not chained
        assert await store.healthy() is False
    finally:
        await store.close()


async def test_unacknowledged_groups_are_redelivered_after_the_timeout_by_redis_clock(make):
    store = make(StoreConfig(redelivery_timeout_s=0.3, retest_fraction=0.0))
    await store.register(_problems(3))
    lease = await store.sample(3)
    outcomes = [GroupOutcome(p.problem.id, (0.0, 1.0), p.problem.id.encode()) for p in lease.problems]
    assert (await store.report(lease.lease_id, outcomes)).groups_queued == 3
    first = await store.pull("a", 2)
    assert [d.payload for d in first] == [o.payload for o in outcomes[:2]]
    assert [d.delivery_count for d in first] == [1, 1]
    assert [d.payload for d in await store.pull("b", 5)] == [outcomes[2].payload]  # not yet idle
    own = await store.pull("a", 5, include_own_pending=True)  # a restarted: its own come back at once
    assert [(d.group_id, d.delivery_count) for d in own] == [(d.group_id, 2) for d in first]
    assert await store.ack([first[0].group_id, "1-0", "not-an-id"]) == (1, 2)
    await asyncio.sleep(0.45)  # real time: XAUTOCLAIM measures idle time with Redis's clock
    again = await store.pull("c", 5)
    assert sorted((d.payload, d.delivery_count) for d in again) == [(outcomes[1].payload, 3), (outcomes[2].payload, 2)]
    assert await store.ack([d.group_id for d in again]) == (2, 0)
    assert await store.ack([d.group_id for d in again]) == (0, 2)  # acknowledged twice: unknown
    await asyncio.sleep(0.45)
    assert await store.pull("c", 5, include_own_pending=True) == []  # acknowledged: never again
    stats = await store.stats()
    assert (stats.queue_depth, stats.pending_groups, stats.groups_acked) == (0, 0, 3)


async def test_statistics_and_priority_stay_under_300_bytes_per_problem(make, redis_url):
    """Memory of the stats hash + heap zset per problem (MEMORY USAGE, exact), ids like GSM8K's."""
    store = make()
    n = 5000
    await store.register([ProblemRecord(f"gsm8k-train-{i:05d}", "q", "1") for i in range(n)])
    r = redis.Redis.from_url(redis_url)
    try:
        used = sum(r.memory_usage(store.key(k), samples=0) for k in ("stats", "heap"))
    finally:
        r.close()
    assert used / n <= 300, f"{used / n:.0f} bytes per problem"


async def test_problem_text_with_newlines_tabs_and_unicode_round_trips(make):
    """Registration packs a chunk into one "id\\tmember\\tJSON" line per problem: no text may break it."""
    tricky = ProblemRecord(
        "id with spaces/ünï", 'Line 1\nLine\t2\r\n "quoted" \\ back 🚀\x00end', "4\n2", "math", {"k\n\t": "v\t\n", "": ""}
    )
    store = make(StoreConfig(retest_fraction=0.0))
    assert await store.register([tricky, *_problems(3)]) == (4, 0, 4)
    assert (await store.problem_state(tricky.id)).problem == tricky
    lease = await store.sample(4)
    assert tricky in [p.problem for p in lease.problems]
    assert await store.register([tricky]) == (0, 1, 4)


async def test_a_clash_in_the_last_chunk_of_a_large_registration_changes_nothing(make):
    """Over REGISTER_CHUNK problems go in several scripts: the clash check reads them all first."""
    from prioreplay.priority_server.store.redis import REGISTER_CHUNK

    store = make(StoreConfig())
    await store.register([ProblemRecord("zz-last", "old prompt", "1")])
    before = await store.dump()
    batch = _problems(REGISTER_CHUNK + 5) + [ProblemRecord("zz-last", "new prompt", "1")]
    with pytest.raises(InvalidArgument, match="'zz-last'.*--id-prefix"):
        await store.register(batch, replace=False)
    assert await store.dump() == before
    assert await store.register([ProblemRecord("zz-last", "old prompt ünï\ttab", "1")], replace=True) == (0, 1, 1)
    with pytest.raises(InvalidArgument, match="zz-last"):  # non-ASCII and tabs compare exactly through cjson
        await store.register([ProblemRecord("zz-last", "old prompt uni\ttab", "1")], replace=False)
    assert await store.register([ProblemRecord("zz-last", "old prompt ünï\ttab", "1", "math")], replace=False) == (0, 1, 1)


async def test_a_namespace_older_than_the_problems_seen_counter_counts_its_reported_problems_once(make, redis_url, namespace):
    store = make(StoreConfig(retest_fraction=0.0))
    await store.register(_problems(6))
    lease = await store.sample(3)
    ids = [sp.problem.id for sp in lease.problems]
    await store.report(lease.lease_id, [GroupOutcome(ids[0], (0.0, 1.0)), GroupOutcome(ids[1], (1.0, 1.0))])
    r = redis.Redis.from_url(redis_url)
    try:
        (counters,) = [k for k in r.scan_iter(match=f"*{{{namespace}}}*counters*")]
        r.hdel(counters, "problems_seen")  # as a namespace written before report.lua kept the counter
        assert (await store.stats()).unseen == 4, "two problems were reported: 4 of 6 unseen, not 6"
        assert r.hget(counters, "problems_seen") == b"2", "the count is stored, so it is made once"
        lease = await store.sample(4)
        fresh = next(sp.problem.id for sp in lease.problems if sp.problem.id not in ids)
        await store.report(lease.lease_id, [GroupOutcome(fresh, (0.0, 0.0))])
        assert (await store.stats()).unseen == 3
    finally:
        r.close()
