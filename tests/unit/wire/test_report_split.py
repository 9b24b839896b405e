"""Report splitting without a server: :func:`prioreplay.client.split_outcomes` and
:meth:`PriorityClient.report_lease` against a fake ``report`` that answers like the server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioreplay.client import OUTCOME_FRAMING_BYTES, REPORT_MARGIN_BYTES, PriorityClient, split_outcomes
from prioreplay.config import ClientSettings
from prioreplay.errors import ResourceExhausted
from prioreplay.v1 import priority_service_pb2 as pb

MIB = 1024 * 1024


def _outcome(pid: str, tokens: int) -> pb.ProblemOutcome:
    comps = [pb.Completion(reward=float(k % 2), token_ids=[7] * tokens, logprobs=[-0.5] * tokens) for k in range(2)]
    return pb.ProblemOutcome(problem_id=pid, completions=comps)


def _cost(o: pb.ProblemOutcome) -> int:
    return o.ByteSize() + OUTCOME_FRAMING_BYTES


@given(st.lists(st.integers(0, 400), max_size=12), st.integers(200, 3000))
def test_parts_keep_order_fit_the_limit_and_are_greedy(tokens, limit):
    outcomes = [_outcome(f"p{i}", n) for i, n in enumerate(tokens)]
    parts = split_outcomes(outcomes, limit)
    assert [o for part in parts for o in part] == outcomes  # nothing lost, nothing reordered
    for part in parts:
        assert len(part) == 1 or sum(map(_cost, part)) <= limit  # only a lone outcome may exceed it
    for a, b in zip(
        parts, parts[1:], strict=False
    ):  # neighbouring parts (strict=False: one pair fewer); greedy: the next outcome did not fit in the previous part
        assert sum(map(_cost, a)) + _cost(b[0]) > limit


def test_no_outcomes_is_one_empty_part_and_a_bad_limit_is_refused():
    assert split_outcomes([], 100) == [[]]
    with pytest.raises(ValueError, match=r"limit_bytes \(0\) must be >= 1"):
        split_outcomes([_outcome("a", 1)], 0)


class FakeServer:
    """``report`` as the server answers it: refuses parts over ``limit`` bytes, counts queued groups."""

    def __init__(self, limit: int = 10 * MIB, accept: bool = True):
        self.limit, self.accept, self.calls = limit, accept, []

    def report(self, lease_id, outcomes, worker_id="", client_source=0, rewards_only=False, more_parts=False, unservable=()):
        if sum(map(_cost, outcomes)) > self.limit:
            raise ResourceExhausted("ReportOutcomes: received message larger than max")
        self.calls.append(([o.problem_id for o in outcomes], more_parts, list(unservable), rewards_only))
        return pb.ReportOutcomesResponse(
            accepted=self.accept, reason="" if self.accept else "lease expired", groups_queued=len(outcomes), groups_filtered=1
        )


@pytest.fixture
def make_client(monkeypatch):
    def make(server: FakeServer, max_message_mb: int = 1) -> PriorityClient:
        c = PriorityClient(ClientSettings(server="127.0.0.1:1", max_message_mb=max_message_mb), max_retries=0)
        monkeypatch.setattr(c, "report", server.report)
        return c

    return make


def test_a_report_over_the_clients_limit_goes_in_parts_with_more_parts_on_all_but_the_last(make_client):
    server = FakeServer()
    c = make_client(server, max_message_mb=1)
    outcomes = [_outcome(f"p{i}", 30_000) for i in range(6)]  # ≈ 0.3 MB each: 1.8 MB in all
    assert sum(map(_cost, outcomes)) > MIB - REPORT_MARGIN_BYTES
    seen = []
    resp = c.report_lease(
        "L", outcomes, unservable=["too-long"], rewards_only=True, observe=lambda method, s: seen.append(method)
    )
    assert [ids for ids, *_ in server.calls] == [["p0", "p1", "p2"], ["p3", "p4", "p5"]]
    assert [(more, unserv, ro) for _, more, unserv, ro in server.calls] == [(True, [], True), (False, ["too-long"], True)]
    assert (resp.accepted, resp.groups_queued, resp.groups_filtered) == (True, 6, 2)  # summed over the parts
    assert seen == ["ReportOutcomes"] * 2  # each part timed
    c.close()


def test_a_part_the_server_refuses_as_too_large_is_halved_until_it_fits(make_client):
    server = FakeServer(limit=int(0.7 * MIB))  # the server's limit is below the client's
    c = make_client(server, max_message_mb=4)
    outcomes = [_outcome(f"p{i}", 30_000) for i in range(6)]
    resp = c.report_lease("L", outcomes)
    sent = [ids for ids, *_ in server.calls]
    assert [p for ids in sent for p in ids] == [f"p{i}" for i in range(6)]  # each once, in order
    assert len(sent) > 1 and all(more for _, more, *_ in server.calls[:-1]) and not server.calls[-1][1]
    assert resp.accepted and resp.groups_queued == 6
    c.close()


def test_one_outcome_too_large_for_the_server_is_left_out_and_the_lease_still_ends(make_client):
    server = FakeServer(limit=int(0.5 * MIB))
    c = make_client(server, max_message_mb=4)
    outcomes = [_outcome("small", 10), _outcome("huge", 100_000)]
    resp = c.report_lease("L", outcomes, unservable=["u"])
    assert server.calls == [(["small"], True, [], False), ([], False, ["u"], False)]  # an empty last part ends it
    assert resp.accepted and resp.groups_queued == 1
    c.close()


def test_a_refused_part_stops_the_report_and_names_the_reason(make_client):
    server = FakeServer(accept=False)
    c = make_client(server, max_message_mb=1)
    resp = c.report_lease("L", [_outcome(f"p{i}", 30_000) for i in range(6)])
    assert len(server.calls) == 1 and (resp.accepted, resp.reason) == (False, "lease expired")
    c.close()
