"""Differential test: the in-process MemoryStore (the oracle) and the RedisStore give identical
results for the same config, seed, clock readings and operations (store.py docstring).

Hypothesis draws a config and a sequence of operations (register, sample with every sampler,
report with all-0 / all-1 / mixed / non-binary rewards, clock advance + expire, publish,
pull + ack, late and repeated reports). Both stores read one fake clock. After every operation
the answers and the full ``dump()`` must be equal: lease contents (lease ids are random and
differ), priorities, sources, report results, counters. ``reward_sum`` is compared with a tight
tolerance; every other float exactly. Group ids differ (Redis stamps them with its own clock), so
deliveries are matched by position. Redelivery is driven by Redis's clock, so the redelivery
timeout is set far beyond the fake clock's total advance (it is tested in test_redis_store.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.priority_server.samplers import SAMPLERS
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.store.redis import KEY_NAMES, RedisStore
from prioreplay.problems import ProblemRecord

IDS = [f"prob-{i:02d}" for i in range(12)]
NON_BINARY = (0.1, 0.25, 1 / 3, 0.5, 0.7, 0.9)
#: groups whose rewards are equal only up to float rounding: constant, all-correct, all-wrong, constant
ROUNDED_CONSTANT = ((0.3,) * 3 + (0.1 + 0.2,), (1.0, 1.0 - 2**-24, 1.0), (0.0, 2**-30), (0.35, 0.3499999940395355))

configs = st.builds(
    StoreConfig,
    sampler=st.sampled_from([name for name, spec in SAMPLERS.items() if spec.lua_branch]),
    alpha=st.sampled_from([0.5, 1.0, 2.0]),
    retest_fraction=st.sampled_from([0.0, 0.25, 0.5]),
    retest_interval=st.sampled_from([0, 1, 3]),
    retest_versions=st.sampled_from([0, 0, 1, 2]),  # 0: the step clock; k: pools by policy version
    pool_evidence=st.sampled_from([1, 1, 0, 2]),  # 1: the paper; 0: k by G; 2: two verdicts in a row
    age_decay=st.sampled_from([1.0, 1.0, 0.7]),  # 0.7: statistics age by the policy versions between reports
    params=st.builds(
        rules.PriorityParams,
        decay=st.sampled_from([1.0, 0.8, 0.0]),
        prior_alpha=st.sampled_from([0.0, 1.0]),
        prior_beta=st.sampled_from([0.0, 0.5]),
    ),
    seed=st.integers(0, 2**31),
    lease_timeout_s=st.just(20.0),
    redelivery_timeout_s=st.just(1e7),
    gumbel_temperature=st.sampled_from([1.0, 0.3]),
    probe_size=st.sampled_from([1, 2]),
    posterior_decay=st.sampled_from([1.0, 0.9]),
    posterior_prior=st.sampled_from([1.0, 0.5]),
)

rewards = st.one_of(
    st.integers(1, 4).map(lambda g: (0.0,) * g),  # all wrong
    st.integers(1, 4).map(lambda g: (1.0,) * g),  # all correct
    st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=4).map(tuple),  # binary, often mixed
    st.tuples(st.sampled_from(NON_BINARY), st.integers(1, 3)).map(lambda t: (t[0],) * t[1]),  # constant
    st.lists(st.sampled_from((0.0, 1.0) + NON_BINARY), min_size=1, max_size=4).map(tuple),  # anything
    st.sampled_from(ROUNDED_CONSTANT),  # constant up to rounding (rules.EQUAL_REWARDS_TOL)
)

ops = st.one_of(
    st.tuples(st.just("register"), st.lists(st.sampled_from(IDS), min_size=1, max_size=6), st.integers(0, 2)),
    st.tuples(st.just("sample"), st.integers(1, 6), st.sampled_from([None, 5.0, 30.0])),
    st.tuples(st.just("sample"), st.integers(1, 6), st.sampled_from([None, 5.0, 30.0])),
    st.tuples(st.just("report"), st.integers(0, 50), st.lists(rewards, min_size=6, max_size=6), st.integers(0, 6)),
    st.tuples(st.just("report"), st.integers(0, 50), st.lists(rewards, min_size=6, max_size=6), st.integers(0, 6)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 4.0, 12.0, 25.0])),
    st.tuples(st.just("publish"), st.integers(-1, 1), st.booleans()),
    st.tuples(st.just("pull"), st.sampled_from(["a", "b"]), st.integers(1, 4), st.booleans(), st.integers(0, 4)),
)


def _lease_view(lease):
    return (
        [(p.problem, p.priority, p.source, p.group_size) for p in lease.problems],
        lease.deadline,
        lease.policy_version,
        lease.weights_uri,
        lease.retry_after_s,
        lease.step,
        bool(lease.lease_id),
    )


def _assert_dumps_equal(mem: dict, red: dict) -> None:
    assert red["problems"] == mem["problems"]
    mc, rc = dict(mem["counters"]), dict(red["counters"])
    assert math.isclose(mc.pop("reward_sum"), rc.pop("reward_sum"), rel_tol=1e-12, abs_tol=1e-12)
    assert rc == mc
    for k in ("step", "policy", "leases", "queue", "unseen_fit"):  # unseen_fit: bit for bit, like the scores
        assert red[k] == mem[k], k


@contextlib.asynccontextmanager
async def paired_stores(
    config: StoreConfig, redis_url: str, namespace: str
) -> AsyncIterator[tuple[MemoryStore, RedisStore, list[float]]]:
    """A MemoryStore and a RedisStore of ``config`` on one clock, ``now[0]`` (unix seconds, set by the
    caller); the Redis store's keys are deleted afterwards."""
    now = [1_700_000_000.0]
    mem = MemoryStore(config, None, clock=lambda: now[0])
    red = RedisStore(config, redis_url, namespace, clock=lambda: now[0])
    try:
        yield mem, red, now
    finally:
        await red._r.delete(*[red.key(n) for n in KEY_NAMES])
        await red.close()


async def step_both(
    mem: MemoryStore, red: RedisStore, batch_size: int, outcomes: Callable[[Sequence], list[GroupOutcome]], what: str = ""
):
    """Sample ``batch_size`` from both stores (identical leases asserted), report ``outcomes(problems)``
    of the memory lease to both (identical answers asserted); returns the memory store's lease."""
    a, b = await mem.sample(batch_size), await red.sample(batch_size)
    assert _lease_view(b) == _lease_view(a), what
    reported = outcomes(a.problems)
    assert await red.report(b.lease_id, reported) == await mem.report(a.lease_id, reported), what
    return a


async def _call(fn, *args):
    """(result, None) or (None, (error class, message))."""
    try:
        return await fn(*args), None
    except (InvalidArgument, FailedPrecondition) as e:
        return None, type(e)


async def _scenario(config: StoreConfig, operations, redis_url: str, namespace: str) -> None:
    now = [1_700_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    mem = MemoryStore(config, None, clock=clock)
    red = RedisStore(config, redis_url, namespace, clock=clock)
    leases: list[tuple] = []  # (memory lease, redis lease)
    version = [0]
    try:
        for i, op in enumerate(operations):
            kind = op[0]
            if kind == "register":
                probs = [
                    ProblemRecord(pid, f"What is {pid} (v{op[2]})?", str(len(pid) + op[2]), "exact", {"variant": str(op[2])})
                    for pid in op[1]
                ]
                assert await red.register(probs) == await mem.register(probs)
            elif kind == "sample":
                a, b = await mem.sample(op[1], op[2]), await red.sample(op[1], op[2])
                assert _lease_view(b) == _lease_view(a)
                if a.lease_id:
                    leases.append((a, b))
            elif kind == "report" and leases:
                a, b = leases[op[1] % len(leases)]
                picked = a.problems[: op[3]]
                outcomes = [GroupOutcome(p.problem.id, op[2][j], f"{i}:{p.problem.id}".encode()) for j, p in enumerate(picked)]
                if op[3] == 6 and a.problems:  # a problem not in the lease: refused, nothing changes
                    outcomes.append(GroupOutcome("not-leased", (1.0,), b""))
                ra, rb = await _call(mem.report, a.lease_id, outcomes), await _call(red.report, b.lease_id, outcomes)
                assert rb == ra
            elif kind == "advance":
                now[0] += op[1]
                assert await red.expire_leases() == await mem.expire_leases()
            elif kind == "publish":
                v = max(1, version[0] + op[1])
                uri = f"ckpt/step-{v}" if op[2] else f"other/step-{v}"
                ra, rb = await _call(mem.publish, v, uri), await _call(red.publish, v, uri)
                assert rb == ra
                if ra[0] is not None:
                    version[0] = ra[0][0]
            elif kind == "pull":
                da, db = await mem.pull(op[1], op[2], op[3]), await red.pull(op[1], op[2], op[3])
                assert [(d.payload, d.delivery_count) for d in db] == [(d.payload, d.delivery_count) for d in da]
                k = min(op[4], len(da))
                acks_a = [d.group_id for d in da[:k]] + ["999-0", "junk"]
                acks_b = [d.group_id for d in db[:k]] + ["999-0", "junk"]
                assert await red.ack(acks_b) == await mem.ack(acks_a)
            sa, sb = await mem.stats(7), await red.stats(7)
            sa.reward_sum = sb.reward_sum = round(sa.reward_sum, 9)
            assert sb == sa, f"after op {i} {op}"
            _assert_dumps_equal(await mem.dump(), await red.dump())
        for pid in IDS:  # problem_state agrees too (NotFound for unregistered ids)
            try:
                sa = await mem.problem_state(pid)
            except KeyError:
                with pytest.raises(KeyError):
                    await red.problem_state(pid)
                continue
            assert await red.problem_state(pid) == sa
        # every late report of a lease already used is refused identically
        for a, b in leases:
            assert await red.report(b.lease_id, []) == await mem.report(a.lease_id, [])
        assert await red.report("0" * 32, []) == await mem.report("f" * 32, [])
        _assert_dumps_equal(await mem.dump(), await red.dump())
    finally:
        await red._r.delete(*[red.key(n) for n in KEY_NAMES])
        await red.close()


#: Hypothesis settings of the differential tests (this file's and the prior's), each with its own
#: ``max_examples``. No shrink phase: on this small machine a failing example is reported as drawn, at once.
DIFFERENTIAL = settings(
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(DIFFERENTIAL, max_examples=25)
@given(config=configs, operations=st.lists(ops, min_size=5, max_size=30))
def test_memory_and_redis_stores_agree(config, operations, redis_url, namespace):
    asyncio.run(_scenario(config, operations, redis_url, f"{namespace}-{uuid.uuid4().hex[:6]}"))


@pytest.mark.parametrize("sampler", [name for name, spec in SAMPLERS.items() if spec.lua_branch and name != "heap"])
def test_every_sampler_agrees_on_a_larger_run(sampler, redis_url, namespace):
    """A longer fixed run over 200 problems: every sampler with a Lua branch picks identical
    batches (problems, sources, group sizes) in both stores."""

    async def run(sampler: str) -> None:
        config = StoreConfig(
            sampler=sampler,
            alpha=1.5,
            retest_fraction=0.2,
            retest_interval=2,
            seed=7,
            params=rules.PriorityParams(decay=0.9, prior_alpha=0.5, prior_beta=0.5),
            gumbel_temperature=0.5,
            posterior_decay=0.9,
        )
        patterns = [(0.0,) * 4, (1.0,) * 4, (0.0, 1.0, 1.0, 0.0), (1.0, 1.0, 1.0, 0.0), (0.5, 0.25)]
        async with paired_stores(config, redis_url, f"{namespace}-{sampler}") as (mem, red, now):
            probs = [ProblemRecord(f"q{i}", f"prompt {i}", str(i)) for i in range(200)]
            assert await red.register(probs) == await mem.register(probs)
            for step in range(40):

                def outcomes(problems, step=step):
                    return [
                        GroupOutcome(p.problem.id, patterns[(j * 3 + step) % 5], f"{step}:{j}".encode())
                        for j, p in enumerate(problems[:12])
                    ]

                await step_both(mem, red, 16, outcomes)
                now[0] += 1.0
            _assert_dumps_equal(await mem.dump(), await red.dump())
            assert len({p[0] for p in (await mem.dump())["problems"].values()}) >= 3  # heap and both pools used

    asyncio.run(run(sampler))


@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 0.9])
def test_constant_non_binary_groups_get_priority_exactly_zero_in_both_stores(redis_url, namespace, value):
    """Issue 13: m2 − m1² cancelled to ~1e-17 for a constant group of 8; both stores must give 0."""

    async def run() -> None:
        now = [1_700_000_000.0]
        config = StoreConfig(sampler="heap", seed=1, params=rules.PriorityParams(decay=0.9))
        mem = MemoryStore(config, None, clock=lambda: now[0])
        red = RedisStore(config, redis_url, f"{namespace}-zv-{uuid.uuid4().hex[:6]}", clock=lambda: now[0])
        try:
            probs = [ProblemRecord(f"c{i}", f"prompt {i}", "1") for i in range(3)]
            assert await red.register(probs) == await mem.register(probs)
            for step in range(3):
                a, b = await mem.sample(3), await red.sample(3)
                outcomes = [GroupOutcome(p.problem.id, (value,) * 8, f"{step}:{j}".encode()) for j, p in enumerate(a.problems)]
                assert await red.report(b.lease_id, outcomes) == await mem.report(a.lease_id, outcomes)
                for store in (mem, red):
                    for p in probs:
                        assert (await store.problem_state(p.id)).priority == 0.0
                now[0] += 1.0
            _assert_dumps_equal(await mem.dump(), await red.dump())
        finally:
            await red._r.delete(*[red.key(n) for n in KEY_NAMES])
            await red.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "rewards, kind", [((0.3,) * 7 + (0.1 + 0.2,), "constant"), ((1.0,) * 3 + (1.0 - 2**-24,), "all_correct")]
)
def test_groups_equal_up_to_rounding_are_counted_and_kept_from_the_learner_alike(redis_url, namespace, rewards, kind):
    """Issue 43: 7 × 0.3 and 0.1 + 0.2 is a constant group (rules.EQUAL_REWARDS_TOL), not a mixed
    one queued for the learner with advantages of rounding noise; both stores count it so."""

    async def run() -> None:
        now = [1_700_000_000.0]
        config = StoreConfig(sampler="heap", seed=2)
        mem = MemoryStore(config, None, clock=lambda: now[0])
        red = RedisStore(config, redis_url, f"{namespace}-eq-{uuid.uuid4().hex[:6]}", clock=lambda: now[0])
        try:
            probs = [ProblemRecord(f"e{i}", f"prompt {i}", "1") for i in range(2)]
            assert await red.register(probs) == await mem.register(probs)
            a, b = await mem.sample(2), await red.sample(2)
            outcomes = [GroupOutcome(p.problem.id, rewards, f"g{j}".encode()) for j, p in enumerate(a.problems)]
            assert await red.report(b.lease_id, outcomes) == await mem.report(a.lease_id, outcomes)
            mem_dump, red_dump = await mem.dump(), await red.dump()
            _assert_dumps_equal(mem_dump, red_dump)
            counters = dict(mem_dump["counters"])
            assert counters[f"groups_{kind}"] == 2 and counters.get("groups_mixed", 0) == 0
            assert counters.get("groups_queued", 0) == 0
        finally:
            await red._r.delete(*[red.key(n) for n in KEY_NAMES])
            await red.close()

    asyncio.run(run())
