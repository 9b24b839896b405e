"""The trajectory feed's delivery rules against an in-memory queue (no Redis, no server, no model).

``FakeQueue`` keeps the server's consumer-group semantics that the feed relies on: a pulled group
is pending for its consumer until acknowledged; ``include_own_pending`` hands a consumer its own
pending groups first; :meth:`FakeQueue.expire` delivers every pending group again (the server's
redelivery timeout); an acknowledged group is deleted.
"""

from __future__ import annotations

import threading

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.learner.feed import MAX_RECOVERY_PULL, Rollback, TrajectoryFeed
from prioreplay.learner.filters import sort_groups
from prioreplay.v1 import priority_service_pb2 as pb

CONSUMER = "learner-0"


def group(gid: str, version: int = 0, rewards=(1.0, 0.0)) -> pb.TrajectoryGroup:
    comps = [pb.Completion(reward=r, token_ids=[7, 8], logprobs=[-1.0, -1.0]) for r in rewards]
    return pb.TrajectoryGroup(group_id=gid, problem_id=gid, policy_version=version, prompt_token_ids=[4, 5], completions=comps)


class Clock:
    """A fake monotonic clock: pulls that wait and sleeps advance it, so no test waits."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakeQueue:
    """The server's trajectory queue for the feed: new → pending (per consumer) → acknowledged."""

    def __init__(self, clock: Clock, max_batch: int = 10_000):
        self.clock, self.max_batch = clock, max_batch
        self.new: list[pb.TrajectoryGroup] = []
        self.pending: dict[str, tuple[str, pb.TrajectoryGroup]] = {}  # id → (consumer, group)
        self.redeliver: list[str] = []  # pending ids due again (after expire)
        self.acked: list[str] = []
        self.pulls: list[tuple[int, bool]] = []  # (max_groups, include_own_pending) per call
        self.declared: list[int] = []  # batch_groups each pull declared (the server's pace bound)
        self.fail_ack = False

    def add(self, *groups):
        self.new.extend(groups)

    def expire(self):
        """The redelivery timeout passed: every pending group is delivered again."""
        self.redeliver = list(self.pending)

    def pull(self, max_groups, wait_s=0.0, consumer="learner", include_own_pending=False, batch_groups=0):
        if max_groups > self.max_batch:
            raise InvalidArgument(f"max_groups ({max_groups}) must be <= {self.max_batch}")
        self.pulls.append((max_groups, include_own_pending))
        self.declared.append(batch_groups)
        out = []
        if include_own_pending:
            out += [g for c, g in self.pending.values() if c == consumer]
        out += [self.pending[i][1] for i in self.redeliver if i in self.pending and self.pending[i][1] not in out]
        self.redeliver = []
        out = out[:max_groups]
        while self.new and len(out) < max_groups:
            g = self.new.pop(0)
            self.pending[g.group_id] = (consumer, g)
            out.append(g)
        if not out:
            self.clock.sleep(wait_s)
        return pb.PullTrajectoriesResponse(groups=out)

    def ack(self, group_ids):
        if self.fail_ack:
            raise ConnectionError("ack failed")
        known = [i for i in group_ids if i in self.pending]
        for i in known:
            del self.pending[i]
        self.acked.extend(known)
        return pb.AckTrajectoriesResponse(acked=len(known), unknown=len(group_ids) - len(known))


def make_feed(queue: FakeQueue, batch_groups: int = 2, **kw) -> TrajectoryFeed:
    return TrajectoryFeed(
        queue, CONSUMER, batch_groups, pull_wait_s=0.5, batch_timeout_s=2.0, sleep=queue.clock.sleep, clock=queue.clock, **kw
    )


@pytest.fixture
def queue():
    return FakeQueue(Clock())


def ids(groups) -> list[str]:
    return [g.group_id for g in groups]


# --- recovery after a restart ------------------------------------------------------------------------


def test_the_first_pull_after_a_restart_redelivers_this_consumers_pending_groups(queue):
    queue.add(*[group(f"old{i}") for i in range(5)])
    make_feed(queue, batch_groups=5).pull()  # a learner pulled five groups, then died before any ack
    queue.add(group("new0"), group("new1"))

    feed = make_feed(queue, batch_groups=2)
    feed.start(pending_groups=5, server_version=0, learner_version=0)
    first = feed.pull()
    assert queue.pulls[-1] == (5, True)  # own pending asked for, as many as the server had pending
    assert ids(first) == ["old0", "old1"] and feed.backlog_size == 3
    pulls = len(queue.pulls)
    assert ids(feed.pull()) == ["old2", "old3"] and len(queue.pulls) == pulls  # the backlog first, no RPC
    assert ids(feed.pull()) == ["old4", "new0"]
    assert queue.pulls[-1][1] is False  # only the first pull asks for own pending


def test_the_recovery_pull_is_capped_and_falls_back_to_a_batch_when_the_server_refuses_it(queue):
    queue.max_batch = 3
    queue.add(*[group(f"g{i}") for i in range(4)])
    feed = make_feed(queue, batch_groups=2)
    feed.start(pending_groups=10 * MAX_RECOVERY_PULL, server_version=0, learner_version=0)
    assert ids(feed.pull()) == ["g0", "g1"]
    assert queue.pulls == [(2, True)]  # the refused MAX_RECOVERY_PULL-sized pull is not recorded
    queue.max_batch = 1
    with pytest.raises(InvalidArgument):  # a batch-sized pull refused: the configuration is wrong
        make_feed(queue, batch_groups=2).pull()


def test_groups_a_resumed_checkpoint_holds_are_acknowledged_and_never_retrained(queue):
    queue.add(group("a"), group("b"), group("c"))
    make_feed(queue, batch_groups=3).pull()  # trained into the checkpoint, killed before the ack
    feed = make_feed(queue, batch_groups=3)
    resp = feed.acknowledge_checkpointed(["a", "b"])
    assert (resp.acked, resp.unknown) == (2, 0) and queue.acked == ["a", "b"]
    feed.start(pending_groups=1, server_version=0, learner_version=0)
    assert ids(feed.pull()) == ["c"]
    assert feed.acknowledge_checkpointed([]) is None


# --- acknowledging -------------------------------------------------------------------------------------


def test_trained_groups_are_acknowledged_only_after_the_checkpoint(queue):
    queue.add(group("a"), group("b"))
    feed = make_feed(queue)
    batch = feed.pull()
    feed.hold(ids(batch))
    assert queue.acked == [] and feed.held == ["a", "b"]  # trained, not yet checkpointed: no ack
    assert feed.acknowledge_held() == 2
    assert queue.acked == ["a", "b"] and feed.held == []
    assert feed.acknowledge_held() == 0 and queue.acked == ["a", "b"]


def test_a_failed_ack_keeps_the_groups_held_for_the_next_checkpoint(queue):
    queue.add(group("a"))
    feed = make_feed(queue)
    feed.hold(ids(feed.pull()))
    queue.fail_ack = True
    with pytest.raises(ConnectionError):
        feed.acknowledge_held()
    assert feed.held == ["a"]
    queue.fail_ack = False
    assert feed.acknowledge_held() == 1 and queue.acked == ["a"]


def test_acknowledged_groups_are_never_delivered_again(queue):
    queue.add(group("a"), group("b"), group("c"))
    feed = make_feed(queue)
    feed.hold(ids(feed.pull()))
    feed.acknowledge_held()
    queue.expire()  # every still-pending group is due again
    restarted = make_feed(queue, batch_groups=5)
    restarted.start(pending_groups=len(queue.pending), server_version=0, learner_version=0)
    assert ids(restarted.pull()) == ["c"]  # a, b acknowledged: gone; c was never pulled


def test_a_group_trained_but_not_acknowledged_that_comes_back_is_skipped(queue):
    queue.add(group("a"), group("b"))
    feed = make_feed(queue)
    feed.hold(ids(feed.pull()))  # trained; the checkpoint is some steps away
    queue.expire()  # the server's redelivery timeout passes first
    queue.add(group("c"), group("d"))
    assert ids(feed.pull()) == ["c", "d"]
    assert feed.held == ["a", "b"]  # still acknowledged at the next checkpoint


def test_stale_groups_are_dropped_counted_and_acknowledged_at_once(queue):
    queue.add(group("old", version=1), group("fresh", version=9), group("flat", version=9, rewards=(1.0, 1.0)))
    feed = make_feed(queue, batch_groups=3)
    fates = sort_groups(feed.pull(), lambda v: feed.age(v, current_version=10), max_staleness=4, max_tokens=100)
    assert fates.counts == {"used": 1, "stale": 1, "zero_variance": 1, "invalid": 0, "deferred": 0}
    assert ids(fates.used) == ["fresh"] and fates.ages == [1]
    feed.drop(ids(fates.dropped))
    assert queue.acked == ["old", "flat"]  # no update to lose: acknowledged without a checkpoint
    assert feed.held == []


# --- deferring and pulling ---------------------------------------------------------------------------------


def test_deferred_groups_come_back_first_in_order_and_once(queue):
    queue.add(group("a"), group("b"), group("c"), group("d"))
    feed = make_feed(queue, batch_groups=2)
    first = feed.pull()
    feed.put_back(first)
    feed.put_back(first[:1])  # put back twice: still once
    assert feed.backlog_size == 2
    assert ids(feed.pull()) == ["a", "b"]
    assert ids(feed.pull()) == ["c", "d"]


def test_deferred_groups_delivered_again_are_handed_out_once(queue):
    queue.add(group("a"), group("b"), group("c"), group("d"))
    feed = make_feed(queue, batch_groups=3)
    a, b, c = feed.pull()
    feed.hold([c.group_id])  # c trained; a and b deferred (another sampling)
    feed.put_back([a, b])
    queue.expire()  # the server delivers a, b and c again while a and b wait in the backlog
    assert ids(feed.pull()) == ["a", "b", "d"]  # a, b once; c held: skipped


def test_a_held_group_in_the_backlog_is_not_handed_out_again(queue):
    queue.add(group("a"), group("b"))
    feed = make_feed(queue, batch_groups=2)
    batch = feed.pull()
    feed.hold(ids(batch))
    feed.put_back(batch)  # e.g. a recovery backlog holding a group that was trained meanwhile
    assert ids(feed.pull()) == []


def test_a_pull_returns_what_came_when_the_batch_timeout_passes(queue):
    queue.add(group("a"))
    feed = make_feed(queue, batch_groups=4)
    assert ids(feed.pull()) == ["a"]
    assert queue.clock.t == pytest.approx(2.0)  # waited out batch_timeout_s, in pull_wait_s steps
    assert ids(feed.pull()) == []


def test_a_stop_request_ends_the_pull(queue):
    stop = [True]
    feed = make_feed(queue, batch_groups=4, should_stop=lambda: stop[0])
    assert feed.pull() == [] and queue.pulls == []


def test_bad_sizes_are_refused_with_the_value():
    with pytest.raises(ValueError, match=r"batch_groups \(0\)"):
        TrajectoryFeed(FakeQueue(Clock()), CONSUMER, 0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"pull_wait_s \(-1"):
        TrajectoryFeed(FakeQueue(Clock()), CONSUMER, 1, -1.0, 0.0)


# --- staleness across a restart --------------------------------------------------------------------------


def test_a_restart_does_not_age_groups_by_the_versions_it_rolled_back():
    # the server published versions 8, 9, 10 from weights lost in a crash; the learner resumed at 7
    rollback = Rollback.at_resume(server_version=10, learner_version=7)
    assert rollback == Rollback(10, 3)
    current = 10  # the learner numbers its next versions after the server's
    assert rollback.age(9, current) == 0  # generated by lost weights: as young as the resumed ones
    assert rollback.age(5, current) == 2  # 7 − 5: two steps of the surviving lineage
    assert rollback.age(11, current + 2) == 1  # generated after the restart: no correction
    assert Rollback.at_resume(server_version=3, learner_version=7) == Rollback(3, 0)
    assert Rollback().age(2, 6) == 4


def test_the_feed_ages_groups_by_the_rollback_it_started_with(queue):
    feed = make_feed(queue)
    feed.start(pending_groups=0, server_version=10, learner_version=7)
    assert feed.age(5, 10) == 2 and feed.age(12, 13) == 1


# --- prefetching the next batch while the step computes ---------------------------------------------


class BlockingQueue(FakeQueue):
    """A queue whose pulls after the first block until :attr:`release` is set (a step computing)."""

    def __init__(self, clock: Clock):
        super().__init__(clock)
        self.release = threading.Event()
        self.entered = threading.Event()

    def pull(self, *args, **kwargs):
        if self.pulls:  # the first pull answers at once
            self.entered.set()
            assert self.release.wait(5), "the test never released the prefetching pull"
        return super().pull(*args, **kwargs)


def test_prefetch_pulls_the_next_batch_in_the_background_and_the_next_pull_takes_it_first():
    queue = BlockingQueue(Clock())
    queue.add(*[group(f"g{i}") for i in range(4)])
    feed = make_feed(queue, batch_groups=2)
    assert ids(feed.pull()) == ["g0", "g1"]
    assert feed.prefetch()  # returns while its pull is still blocked (the step computes meanwhile)
    assert queue.entered.wait(5) and not feed.prefetch()  # one prefetch in flight at most
    feed.hold(["g0", "g1"])
    queue.release.set()
    assert ids(feed.pull()) == ["g2", "g3"]
    assert queue.pulls == [(2, True), (2, False)]  # no third pull: the prefetched batch was enough


def test_prefetch_waits_for_the_first_pull_and_asks_only_for_what_the_backlog_lacks(queue):
    queue.add(*[group(f"g{i}") for i in range(6)])
    feed = make_feed(queue, batch_groups=2)
    assert not feed.prefetch()  # before the first (recovery) pull: nothing
    feed.start(pending_groups=3, server_version=0, learner_version=0)
    assert ids(feed.pull()) == ["g0", "g1"] and feed.backlog_size == 1  # recovery pull of 3
    assert feed.prefetch()
    assert ids(feed.pull()) == ["g2", "g3"]
    assert queue.pulls == [(3, True), (1, False)]  # the prefetch asked for the one the backlog lacked


def test_a_failed_prefetch_loses_nothing_and_the_next_pull_pulls_again(queue, caplog):
    queue.add(*[group(f"g{i}") for i in range(4)])
    feed = make_feed(queue, batch_groups=2)
    feed.pull()

    def broken(method, fn, *args):
        raise ConnectionError("server gone")

    feed._prefetch_call = broken
    assert feed.prefetch()
    assert ids(feed.pull()) == ["g2", "g3"]  # pulled again, in the step itself
    assert "prefetching pull failed" in caplog.text


def test_a_prefetched_group_that_is_held_is_not_handed_out_again(queue):
    queue.add(group("a"), group("b"))
    feed = make_feed(queue, batch_groups=2)
    feed.pull()
    feed.hold(["a", "b"])
    queue.expire()  # the redelivery timeout passed before the checkpoint: a and b come back
    queue.add(group("c"))
    assert feed.prefetch()
    assert ids(feed.pull()) == ["c"]  # within the batch timeout; a and b are held, never retrained


def test_every_pull_declares_the_learners_batch_for_the_servers_pace_bound(queue):
    """The server's pace bound counts learner batches of the size the learner declares on its pulls
    (PullTrajectoriesRequest.learner_batch_groups): the recovery pull, top-ups and prefetches alike,
    whatever max_groups each asks for."""
    queue.add(*[group(f"g{i}") for i in range(7)])
    feed = make_feed(queue, batch_groups=3)
    feed.start(pending_groups=5, server_version=0, learner_version=0)
    assert ids(feed.pull()) == ["g0", "g1", "g2"]
    assert feed.prefetch()
    assert ids(feed.pull()) == ["g3", "g4", "g5"]
    assert queue.declared and set(queue.declared) == {3}
    assert {n for n, _ in queue.pulls} != {3}  # the calls asked for other sizes (recovery: 5)
