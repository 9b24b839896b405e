"""The lean SampleProblems path and the per-batch bookkeeping agree with the per-field path, without a server.

``wire.lease_response`` writes the answer from the ``Problem`` bytes the memory store keeps with
each record; it must give exactly ``convert.lease_to_proto(lease).SerializeToString()``, for any
lease and on the same store state (also after a re-registration with ``replace`` and after a
snapshot is restored). The served-priority histogram, filled once per batch, must export what
prometheus_client's ``Histogram`` exports for the same values, and the traffic tally fed with the
store's group kinds must count what it counts by classifying every group itself.
"""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from prioreplay import rules
from prioreplay.convert import lease_to_proto, problem_bytes, problem_to_proto
from prioreplay.priority_server.client_traffic import ClientTally
from prioreplay.priority_server.metrics import PRIORITY_BUCKETS, BatchHistogram
from prioreplay.priority_server.servicer import PriorityServicer
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome, Lease, SampledProblem
from prioreplay.priority_server.wire import lease_response
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool
from prioreplay.v1 import priority_service_pb2 as pb

NOW = 1_700_000_000.0


def _record(rng: random.Random, i: int, registrable: bool = True) -> ProblemRecord:
    """Problem ``i`` with a random mix of optional fields, unicode and sizes (some over 16 KiB:
    multi-byte length varints past the small-varint table); ``registrable=False`` also gives
    records no store would take (an empty verifier: a default field left out of the bytes)."""
    size = rng.choice([1, 10, 130, 200, 20_000])
    piece = "".join(rng.choice("ab c\u00e9\u4e2d\U0001f600\n") for _ in range(16))
    prompt = "q" + (piece * (size // 16 + 1))[:size]
    metadata = {f"k{j}\u00fc": f"v{j}" * rng.randint(0, 3) for j in range(rng.choice([0, 0, 1, 5]))}
    verifier = rng.choice(["exact", "math"] if registrable else ["exact", "math", ""])
    return ProblemRecord(f"p{i}-\u00df", prompt, rng.choice(["1", "\u0661", "x" * 300]), verifier, metadata)


def _random_lease(rng: random.Random, n: int) -> Lease:
    problems = []
    for i in range(n):
        rec = _record(rng, i, registrable=False)
        priority = rng.choice([0.0, -0.0, 0.25, 1e-300, rng.random() / 4, math.nextafter(0.0, 1.0)])
        group_size = rng.choice([None, 0, 1, 7, 127, 128, 20_000])
        wire = problem_bytes(rec) if rng.random() < 0.7 else b""  # b"": a store that does not keep the bytes
        problems.append(SampledProblem(rec, priority, rng.choice(list(Pool)), group_size, wire=wire))
    return Lease(
        lease_id=rng.choice(["", "L", "a" * 32]),
        deadline=rng.choice([0.0, NOW + 600.5]),
        problems=problems,
        policy_version=rng.choice([0, 3, 2**40]),
        weights_uri=rng.choice(["", "ckpt/step-3", "s3://b/\u00e9t\u00e9"]),
        retry_after_s=rng.choice([0.0, 0.05, 5.0]),
        step=rng.choice([0, 1, 2**33]),
    )


def test_a_problems_bytes_are_its_serialized_proto():
    rec = ProblemRecord("id", "q \u4e2d", "a", "math", {"b": "2", "a": "1"})
    assert problem_bytes(rec) == problem_to_proto(rec).SerializeToString()


@pytest.mark.parametrize("seed", range(6))
def test_a_lease_answer_is_the_per_field_message_byte_for_byte(seed):
    rng = random.Random(seed)
    for n in (0, 1, 2, 17):
        lease = _random_lease(rng, n)
        expected = lease_to_proto(lease).SerializeToString()  # type: ignore[arg-type]  # the protocol's field types are narrower
        assert lease_response(lease) == expected, (seed, n)


def test_a_lease_of_many_problems_is_the_per_field_message_byte_for_byte():
    lease = _random_lease(random.Random(99), 1024)
    assert lease_response(lease) == lease_to_proto(lease).SerializeToString()  # type: ignore[arg-type]  # as above


class _Context:
    async def abort(self, code, details):
        raise AssertionError(f"{code}: {details}")


async def _served_and_per_field(servicer: PriorityServicer, batch: int, key: str) -> tuple[bytes, bytes]:
    """The servicer's answer to a SampleProblems with request id ``key``, and the per-field message
    of the same lease (the store replays it for the same request id: the same store state)."""
    answer = await servicer.SampleProblems(pb.SampleProblemsRequest(batch_size=batch, worker_id="w", request_id=key), _Context())
    assert isinstance(answer, bytes)
    lease = await servicer.store.sample(batch, request_id=f"w\t{key}")
    return answer, lease_to_proto(lease).SerializeToString()  # type: ignore[arg-type]  # as above


async def test_the_servicer_answers_the_per_field_message_on_the_same_store_state(tmp_path):
    rng = random.Random(5)
    path = tmp_path / "snap.json"
    store = MemoryStore(StoreConfig(max_batch_size=256), snapshot_path=path, clock=lambda: NOW)
    servicer = PriorityServicer(store)
    records = [_record(rng, i) for i in range(300)]
    await store.register(records)
    answer, expected = await _served_and_per_field(servicer, 200, "r1")
    assert answer == expected and len(pb.SampleProblemsResponse.FromString(answer).problems) == 200
    leased = pb.SampleProblemsResponse.FromString(answer)
    # report part of it (priorities and sources change), re-register some with other text
    outs = [GroupOutcome(lp.problem.id, (1.0, 0.0) if k % 2 else (1.0, 1.0)) for k, lp in enumerate(leased.problems[:50])]
    assert (await store.report(leased.lease_id, outs, more_parts=True)).accepted
    changed = [ProblemRecord(r.id, r.prompt + " \u00e9dit\u00e9", r.answer, "math", {"new": "1"}) for r in records[:150]]
    await store.register(changed, replace=True)
    answer, expected = await _served_and_per_field(servicer, 250, "r2")
    assert answer == expected and "\u00e9dit\u00e9" in answer.decode("utf-8", "replace")
    await store.close()  # writes the snapshot; a restored store rebuilds the bytes
    later = NOW + 10**6  # the leases above have expired: their problems are back
    restored = MemoryStore(StoreConfig(max_batch_size=256), snapshot_path=path, clock=lambda: later)
    answer, expected = await _served_and_per_field(PriorityServicer(restored), 256, "r3")
    assert answer == expected and pb.SampleProblemsResponse.FromString(answer).problems


def _samples(text: str, name: str) -> dict[str, str]:
    """{sample name with labels: value} of one metric family in an exposition."""
    lines = [ln for ln in text.splitlines() if ln.startswith(name) and not ln.startswith(f"{name}_created")]
    return dict(ln.rsplit(" ", 1) for ln in lines)


def test_the_batch_histogram_exports_what_a_histogram_observing_each_value_does():
    rng = random.Random(3)
    values = [0.0, 0.025, 0.1, 0.25, 0.3]  # on the bounds, and past the last one
    batches = [[rng.choice([*values, rng.random() / 4]) for _ in range(rng.randint(0, 300))] for _ in range(20)]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("prioreplay_sampled_priority", "priority of each problem served", PRIORITY_BUCKETS)
    ours.register(batch)
    each = Histogram("prioreplay_sampled_priority", "priority of each problem served", buckets=PRIORITY_BUCKETS, registry=theirs)
    for values in batches:
        batch.observe(values)
        for v in values:
            each.observe(v)
    got = _samples(generate_latest(ours).decode(), "prioreplay_sampled_priority")
    want = _samples(generate_latest(theirs).decode(), "prioreplay_sampled_priority")
    s = "prioreplay_sampled_priority_sum"
    assert float(got.pop(s)) == pytest.approx(float(want.pop(s)), rel=1e-12)  # summed in another order
    assert got == want and len(got) == len(PRIORITY_BUCKETS) + 2  # the buckets with +Inf, and the count
    assert got["prioreplay_sampled_priority_count"] == f"{float(sum(map(len, batches)))}"


async def test_the_store_reports_every_groups_kind_and_the_tally_counts_them_as_it_would_itself():
    store = MemoryStore(StoreConfig(), clock=lambda: NOW)
    await store.register([ProblemRecord(f"p{i}", "q", "a") for i in range(6)])
    lease = await store.sample(6)
    rewards = [(1.0, 0.0), (1.0, 1.0), (0.0, 0.0), (0.5, 0.5), (0.0,), (0.25, 1.0)]
    groups = [GroupOutcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)]
    first = await store.report(lease.lease_id, groups[:2], more_parts=True)
    again = await store.report(lease.lease_id, groups, more_parts=False)  # the first two: applied by the first part
    assert again.skipped == 2
    for result, sent in ((first, groups[:2]), (again, groups)):
        assert result.kinds == tuple(rules.classify(g.rewards) for g in sent)
    told, counted = ClientTally(), ClientTally()
    told.reported(pb.CLIENT_SOURCE_WORKER, True, [g.rewards for g in groups], again.kinds)
    counted.reported(pb.CLIENT_SOURCE_WORKER, True, [g.rewards for g in groups])
    assert told.to_proto() == counted.to_proto()
    assert told.counts[pb.CLIENT_SOURCE_WORKER].groups_by_kind == {"mixed": 2, "all_correct": 1, "all_wrong": 2, "constant": 1}
