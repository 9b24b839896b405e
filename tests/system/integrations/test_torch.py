"""PrioritySampler: indices from leases, rewards buffered per problem, checkpoints with DataLoaders.

A real server (in-process, over each store) answers every RPC; the checks compare what the sampler
yielded and reported with the server's own statistics (``Store.dump()``: id → (pool, n, Σr, Σr², score)).
"""

from __future__ import annotations

import math

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.torch import PrioritySampler
from prioreplay.priority_server.config import ServerConfig
from prioreplay.v1 import priority_service_pb2 as pb

ROWS = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(11)]


def server_config() -> ServerConfig:
    """The ``server`` fixture's configuration (tests/conftest.py): no retests, so every batch is the
    heap's top, exactly; decay 1 (cumulative counts), so the reward sums are counted exactly."""
    return ServerConfig(store="memory", metrics_port=0, snapshot_interval_s=0, retest_fraction=0.0, decay=1.0, seed=5)


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    yield c
    c.close()


def _sampler(server, **kw) -> PrioritySampler:
    kw.setdefault("batch_size", 4)
    kw.setdefault("group_size", 2)
    return PrioritySampler(ROWS, server=server.address, **kw)


def _dump(server) -> dict:
    return server.call(server.store.dump())["problems"]


def _seed_priorities(client, ids: list[str]) -> None:
    """Give row j a reported group of 22 rewards with j correct: priority (j/22)(1 − j/22), distinct,
    increasing in j for j = 0..10 and below 0.25 (row 0, all wrong, goes to the unsolved pool)."""
    lease = client.sample(len(ids))
    assert len(lease.problems) == len(ids)
    row = {pid: j for j, pid in enumerate(ids)}
    outcomes = [
        pb.ProblemOutcome(
            problem_id=lp.problem.id,
            completions=[pb.Completion(reward=1.0 if k < row[lp.problem.id] else 0.0) for k in range(22)],
        )
        for lp in lease.problems
    ]
    assert client.report(lease.lease_id, outcomes).accepted


def test_bad_sizes_are_refused_with_the_value_and_the_fix(server):
    with pytest.raises(InvalidArgument, match=r"batch_size \(12\) is larger than the dataset \(11 rows\)"):
        _sampler(server, batch_size=12)
    with pytest.raises(InvalidArgument, match=r"group_size \(0\) must be an integer >= 1"):
        _sampler(server, group_size=0)
    with pytest.raises(InvalidArgument, match="partial_groups"):
        _sampler(server, partial_groups="keep")


# -- order and counting ---------------------------------------------------------------------------
def test_batches_follow_the_servers_priorities_and_each_group_is_counted_once(server, client):
    s = _sampler(server, repeat_each=2)  # each index twice in a row, as TRL's num_generations layout
    _seed_priorities(client, s.table.ids)
    before = client.stats()
    it = iter(s)
    first = [next(it) for _ in range(8)]
    assert first == [10, 10, 9, 9, 8, 8, 7, 7]  # the four highest priorities, highest first
    assert s.report(first, [1.0] * 8) == 1  # one lease complete → sent once
    second = [next(it) for _ in range(8)]
    assert second == [6, 6, 5, 5, 4, 4, 3, 3]
    s.report(second, [0.0, 1.0] * 4)

    after = client.stats()
    assert after.completions_reported - before.completions_reported == 16
    assert (after.groups_all_correct - before.groups_all_correct, after.groups_mixed - before.groups_mixed) == (4, 4)
    assert after.queue_depth == before.queue_depth  # rewards only: nothing more waits for a learner
    dump = _dump(server)
    assert dump[s.problem_id(10)][1:3] == (24.0, 12.0)  # n and Σr: 22 seeded + the 2 reported here
    assert s.counters["reports_accepted"] == 2 and s.counters["reports_refused"] == 0
    src = {c.source: c for c in after.clients}[pb.CLIENT_SOURCE_TORCH]
    assert (src.leases, src.groups, src.completions) == (2, 8, 16)


def test_rewards_are_buffered_per_problem_until_the_whole_lease_is_complete(server, client):
    s = _sampler(server, batch_size=3, group_size=2)
    it = iter(s)
    batch = [next(it) for _ in range(3)]
    order = [batch[0], batch[1], batch[0], batch[2], batch[1]]
    for i in order:
        assert s.report([i], [1.0]) == 0
        assert client.stats().completions_reported == 0  # not sent while any group is short
    assert s.report([s.problem_id(batch[2])], [0.0]) == 1  # ids or indices; the last reward sends the lease
    assert client.stats().completions_reported == 6
    with pytest.raises(InvalidArgument, match="is not in a lease of this sampler"):
        s.report([batch[0]], [1.0])  # already sent: never counted twice


def test_bad_rewards_change_nothing(server, client):
    s = _sampler(server, batch_size=2, group_size=2)
    it = iter(s)
    a, b = next(it), next(it)
    never_served = next(i for i in range(len(ROWS)) if i not in (a, b))
    for ids, rewards, match in (
        ([b, a], [1.0, math.nan], "reward nan for problem"),
        ([b, a], [1.0, 1.5], "must be a finite number in \\[0, 1\\]"),
        ([b, a, a, a], [1, 1, 1, 1], "would get 3 rewards"),
        ([b, a], [1], "2 ids for 1 rewards"),
        ([b, never_served], [1.0, 1.0], "is not in a lease"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            s.report(ids, rewards)
    assert s.report([a, a, b], [1, None, 0]) == 0  # None counts toward the group, sends nothing for it
    assert s.report([b], [1]) == 1
    dump = _dump(server)
    assert dump[s.problem_id(a)][1:3] == (1.0, 1.0) and dump[s.problem_id(b)][1:3] == (2.0, 1.0)


@pytest.mark.parametrize("partial", ["report", "drop"])
def test_flush_sends_partial_groups_as_documented(server, client, partial):
    s = _sampler(server, batch_size=3, group_size=4, partial_groups=partial)
    it = iter(s)
    a, b, c = next(it), next(it), next(it)
    s.report([a, a, b, b, b, b], [1, 0, 1, 1, 1, 1])  # a: 2 of 4, b: complete, c: nothing
    assert s.flush() == 1 and s.outstanding == {}
    dump, stats = _dump(server), client.stats()
    assert dump[s.problem_id(b)][1] == 4.0
    assert dump[s.problem_id(a)][1] == (2.0 if partial == "report" else 0.0)
    assert dump[s.problem_id(c)][1] == 0.0 and stats.leased == 0  # returned unchanged, nothing left leased


# -- DataLoaders and checkpoints ------------------------------------------------------------------
def test_plain_dataloader_serves_leased_rows(server, client):
    s = _sampler(server, batch_size=4, num_batches=2)
    dl = DataLoader(ROWS, batch_size=4, sampler=s, collate_fn=list)
    assert len(dl) == 2
    for batch in dl:
        idx = [ROWS.index(r) for r in batch]
        s.report([i for i in idx for _ in range(2)], [1.0, 0.0] * 4)
    stats = client.stats()
    assert (stats.groups_mixed, stats.completions_reported, stats.active_leases) == (8, 16, 0)


def test_stateful_dataloader_continues_the_saved_lease_mid_batch(server, client):
    # DataLoader batches of 2 over sampler batches of 4: the checkpoint falls inside a lease
    s1 = _sampler(server, batch_size=4, group_size=1)
    dl1 = StatefulDataLoader(ROWS, batch_size=2, sampler=s1, collate_fn=list)
    it = iter(dl1)
    head = [ROWS.index(r) for r in next(it)]
    state = dl1.state_dict()
    lease_id = next(iter(s1.outstanding))

    s2 = _sampler(server, batch_size=4, group_size=1, register=False)
    dl2 = StatefulDataLoader(ROWS, batch_size=2, sampler=s2, collate_fn=list)
    dl2.load_state_dict(state)
    tail = [ROWS.index(r) for r in next(iter(dl2))]
    assert s2.outstanding == {lease_id: [s2.problem_id(i) for i in head + tail]}  # the same lease, continued
    assert s2.report(head + tail, [1.0] * 4) == 1
    assert client.stats().completions_reported == 4 and s2.counters["reports_accepted"] == 1


def test_a_resumed_sampler_never_double_counts_what_the_crashed_one_reported(server, client):
    s1 = _sampler(server, batch_size=4, group_size=1)
    dl1 = StatefulDataLoader(ROWS, batch_size=2, sampler=s1, collate_fn=list)
    it = iter(dl1)
    head = [ROWS.index(r) for r in next(it)]
    state = dl1.state_dict()  # the checkpoint
    tail = [ROWS.index(r) for r in next(it)]
    s1.report(head + tail, [1.0] * 4)  # the run goes on, reports its lease, then crashes

    s2 = _sampler(server, batch_size=4, group_size=1, register=False)
    dl2 = StatefulDataLoader(ROWS, batch_size=2, sampler=s2, collate_fn=list)
    dl2.load_state_dict(state)
    again = [ROWS.index(r) for r in next(iter(dl2))]
    assert again == tail  # the resumed run replays the rest of the batch from the checkpoint
    s2.report(head + again, [0.0] * 4)  # its rewards for that lease are refused: counted once, by s1
    stats = client.stats()
    assert (stats.completions_reported, stats.reward_sum, stats.late_reports) == (4, 4.0, 1)
    assert s2.counters["reports_refused"] == 1


def test_return_on_resume_sends_the_buffered_groups_and_frees_the_rest(server, client):
    s1 = _sampler(server, batch_size=4, group_size=2)
    it = iter(s1)
    a, b = next(it), next(it)
    s1.report([a, a, b], [1.0, 0.0, 1.0])
    state = s1.state_dict()

    s2 = _sampler(server, batch_size=4, group_size=2, register=False, on_resume="return")
    s2.load_state_dict(state)
    stats = client.stats()
    assert (stats.completions_reported, stats.groups_mixed, stats.leased, stats.active_leases) == (3, 1, 0, 0)
    assert s2.outstanding == {}
    rest = list(iter(s2))  # the epoch goes on where the state left it (1 of 2 batches), with a new lease
    assert len(rest) == 4 and list(s2.outstanding) != [lease["lease_id"] for lease in state["leases"]]


def test_a_state_from_other_data_or_geometry_is_refused(server, memory_server):
    state = _sampler(server).state_dict()
    other = PrioritySampler(ROWS[:5], server=memory_server().address, batch_size=4, group_size=2)
    with pytest.raises(InvalidArgument, match="is for dataset"):
        other.load_state_dict(state)
    with pytest.raises(InvalidArgument, match="group_size=2, this sampler 3"):
        _sampler(server, group_size=3, register=False).load_state_dict(state)


# -- capacity and foreign problems ----------------------------------------------------------------
def test_holding_every_problem_unreported_fails_at_once_with_the_fix(server):
    s = _sampler(server, batch_size=4, group_size=1, num_batches=5)
    it = iter(s)
    for _ in range(8):
        next(it)  # two batches served, none reported: 8 of 11 problems held
    with pytest.raises(InvalidArgument, match="holds 8 of the dataset's 11 in leases"):
        next(it)


def test_the_wait_message_names_the_holders_and_blames_others_only_when_they_hold_some(server, client):
    s = _sampler(server, batch_size=4, group_size=1)
    it = iter(s)
    for _ in range(4):
        next(it)  # one batch held by this sampler, nobody else holds any
    mine = s._wait_message(2)
    assert "4 in 1 held by this sampler" in mine and "0 in 0 by other clients" in mine
    assert "Report the rewards of the batches this sampler holds" in mine and "other clients' leases" not in mine
    other = client.sample(3, worker_id="someone-else")
    theirs = s._wait_message(2)
    assert "3 in 1 by other clients" in theirs and "Wait for the other clients' leases" in theirs
    client.report(other.lease_id, [])
    s.close()


def test_a_problem_from_another_dataset_is_refused_and_its_lease_returned(server, client):
    s = _sampler(server, batch_size=4)
    _seed_priorities(client, s.table.ids)  # every row below the 0.25 of a new problem
    client.register([pb.Problem(id="stranger", prompt="?", answer="!")])
    with pytest.raises(InvalidArgument, match="'stranger', which is not a row of this dataset"):
        next(iter(s))
    assert client.stats().active_leases == 0


# -- a crashed process: short leases, renewed while held ------------------------------------------
HOLDER = r"""
import sys, time
from prioreplay.integrations.torch import PrioritySampler
rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(11)]
sampler = PrioritySampler(rows, server=sys.argv[1], batch_size=4, group_size=2, lease_timeout_s=float(sys.argv[2]))
it = iter(sampler)
[next(it) for _ in range(4)]  # one batch leased, its rewards never reported
print("leased", flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_sampler_frees_its_problems_within_its_short_lease(memory_server):
    """The sampler renews its 2 s lease while it holds the batch (past its first deadline); SIGKILLed,
    it stops renewing and the reaper returns the problems unchanged long before the server's 600 s."""
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    lease_s = 2.0
    srv = memory_server(retest_fraction=0.0, reaper_interval_s=0.1)
    client = PriorityClient(ClientSettings(server=srv.address), max_retries=0)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, srv.address, str(lease_s)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "leased\n", f"the holder exited ({proc.wait(60)})"
        time.sleep(1.5 * lease_s)  # past the first deadline: still held, renewed
        st = client.stats()
        assert (st.leased, st.active_leases, st.lease_expiries) == (4, 1, 0)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 5 * lease_s  # a bound far below the server's default lease (600 s)
        while client.stats().leased and time.monotonic() < deadline:
            time.sleep(0.05)
        st = client.stats()
        assert (st.leased, st.lease_expiries, st.completions_reported) == (0, 1, 0)
        assert all(v[1] == 0 for v in _dump(srv).values())  # returned with statistics unchanged (n = 0)
    finally:
        proc.kill()
        proc.wait(10)
        client.close()


def test_a_reward_plugins_pass_flags_travel_with_its_rewards(server, client):
    """A torch loop scores with a reward plugin (examples/rewards.py) and reports its pass flags:
    they are buffered with the rewards (also in the saved state) and sent in ``Completion.passed``."""
    from examples.rewards import correct_number
    from prioreplay.rewards import PluginReward

    plugin = PluginReward(correct_number)
    s = _sampler(server, batch_size=2, group_size=2)
    sent: list[pb.ProblemOutcome] = []
    report_lease = s.client.report_lease
    s.client.report_lease = lambda lease_id, outcomes, **kw: (sent.extend(outcomes), report_lease(lease_id, outcomes, **kw))[1]
    it = iter(s)
    batch = [next(it) for _ in range(2)]
    for n, i in enumerate(batch):
        scored = [plugin.score(text, ROWS[i]["answer"]) for text in (f"#### {2 * i}", "#### 999")]
        s.report([i, i], [r for r, _ in scored], passed=[ok for _, ok in scored])
        if n == 0:
            assert s.state_dict()["leases"][0]["passed"] == {s.problem_id(i): [True, False]}
    assert sorted(o.problem_id for o in sent) == sorted(s.problem_id(i) for i in batch)
    for o in sent:
        assert [(c.reward, c.HasField("passed"), c.passed) for c in o.completions] == [(1.0, True, True), (0.0, True, False)]
    assert client.stats().completions_reported == 4
