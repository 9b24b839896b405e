"""A pulled group's fate (invalid, stale, zero variance, used, deferred) and the batch's sampling,
as pure functions of the groups: no server, no model."""

from __future__ import annotations

import pytest
import torch

from prioreplay.learner.batch import collate
from prioreplay.learner.filters import Sampling, group_fate, group_problem, group_sampling, sort_groups
from prioreplay.v1 import priority_service_pb2 as pb


def group(gid="g", rewards=(1.0, 0.0, 0.0), version=0, n_tokens=3, n_logprobs=None, temperature=0.0, top_p=0.0, truncated=()):
    comps = [
        pb.Completion(reward=r, token_ids=[7] * n_tokens, logprobs=[-1.0] * (n_logprobs or n_tokens), truncated=i in truncated)
        for i, r in enumerate(rewards)
    ]
    return pb.TrajectoryGroup(
        group_id=gid,
        problem_id=gid,
        policy_version=version,
        prompt_token_ids=[4, 5, 6],
        completions=comps,
        sampling_temperature=temperature,
        sampling_top_p=top_p,
    )


def sort(groups, current=0, max_staleness=4, max_tokens=12):
    return sort_groups(groups, lambda v: current - v, max_staleness, max_tokens)


def test_sampling_is_read_from_the_group_and_a_field_not_sent_reads_as_1():
    assert group_sampling(group(temperature=0.7, top_p=0.9)) == Sampling(0.7, 0.9)
    assert group_sampling(group()) == Sampling(1.0, 1.0)  # 0 = not sent (the proto's rule)
    assert group_sampling(group(temperature=0.7)) == Sampling(0.7, 1.0)


def test_malformed_groups_name_what_is_wrong():
    assert group_problem(group(), 12) is None
    assert "3 token ids but 2 logprobs" in group_problem(group(n_logprobs=2), 12)
    assert "13 tokens > max_sequence_tokens (12)" in group_problem(group(n_tokens=10), 12)
    assert group_problem(pb.TrajectoryGroup(prompt_token_ids=[1]), 12) == "no completions"
    assert group_problem(pb.TrajectoryGroup(completions=[pb.Completion()]), 12) == "empty prompt_token_ids"


def test_fates_in_order_invalid_then_stale_then_zero_variance():
    assert group_fate(group(n_logprobs=2), age=99, max_staleness=4, max_tokens=12)[0] == "invalid"
    assert group_fate(group(rewards=(1.0, 1.0)), age=5, max_staleness=4, max_tokens=12) == ("stale", None)
    assert group_fate(group(rewards=(1.0, 1.0)), age=4, max_staleness=4, max_tokens=12) == ("zero_variance", None)
    assert group_fate(group(rewards=(1.0,)), age=0, max_staleness=4, max_tokens=12) == ("zero_variance", None)
    assert group_fate(group(), age=4, max_staleness=4, max_tokens=12) == ("used", None)


def test_plain_grpo_trains_zero_variance_groups_but_never_invalid_or_stale_ones():
    kw = dict(max_staleness=4, max_tokens=12, train_zero_variance=True)
    assert group_fate(group(rewards=(1.0, 1.0)), age=4, **kw) == ("used", None)
    assert group_fate(group(rewards=(0.0, 0.0)), age=5, **kw) == ("stale", None)
    assert group_fate(group(n_logprobs=2), age=0, **kw)[0] == "invalid"
    out = sort_groups([group("m"), group("z", (0.0, 0.0))], lambda v: 0, 4, 12, train_zero_variance=True)
    assert [g.group_id for g in out.used] == ["m", "z"] and out.counts["zero_variance"] == 0


def test_zero_variance_and_malformed_groups_are_not_trained_on():
    groups = [
        group("mixed"),
        group("all-correct", (1.0, 1.0)),
        group("single", (1.0,)),
        group("mismatch", (1.0, 0.0), n_logprobs=2),
        group("too-long", (1.0, 0.0), n_tokens=10),
        group("stale", version=-5),
    ]
    out = sort(groups)
    assert [g.group_id for g in out.used] == ["mixed"] and out.ages == [0]
    assert out.counts == {"used": 1, "stale": 1, "zero_variance": 2, "invalid": 2, "deferred": 0}
    assert [g.group_id for g in out.dropped] == ["all-correct", "single", "mismatch", "too-long", "stale"]
    assert [g.group_id for g, _ in out.invalid] == ["mismatch", "too-long"]


def test_a_batch_takes_the_first_groups_sampling_and_defers_the_others():
    groups = [
        group("a", temperature=0.7),
        group("b", temperature=1.0),
        group("c", temperature=0.7, top_p=0.9),
        group("d", temperature=0.7),
        group("e", temperature=0.7, rewards=(0.0, 0.0)),
    ]
    out = sort(groups)
    assert out.sampling == Sampling(0.7, 1.0)
    assert [g.group_id for g in out.used] == ["a", "d"]
    assert [g.group_id for g in out.deferred] == ["b", "c"]  # neither trained nor dropped
    assert [g.group_id for g in out.dropped] == ["e"]
    assert out.counts["deferred"] == 2
    assert sort([]).sampling == Sampling() and sort([]).used == []


def test_truncated_completions_are_counted_and_their_rewards_left_as_reported():
    """The reward is the workers' (--truncated-reward): the learner changing it disagreed with the
    server's statistics, which saw the reported one."""
    out = sort([group(rewards=(1.0, 0.0, 0.0), truncated=(0,))])
    assert out.truncated == 1 and out.used[0].completions[0].reward == 1.0
    deferred = group("other", rewards=(1.0, 0.0), temperature=0.5, truncated=(0,))
    out = sort([group(), deferred])
    assert out.truncated == 0 and deferred.completions[0].reward == 1.0  # counted when it is trained, not now


def test_a_batch_carries_its_groups_sampling_and_refuses_a_mix():
    adv = [torch.tensor([1.0, -0.5, -0.5])] * 2
    batch = collate([group(temperature=0.7, top_p=0.9)] * 2, adv, pad_id=0)
    assert (batch.temperature, batch.top_p) == (0.7, 0.9)
    assert (batch.slice(0, 2).temperature, batch.slice(0, 2).top_p) == (0.7, 0.9)
    with pytest.raises(ValueError, match="mixes sampling distributions"):
        collate([group(temperature=0.7), group(temperature=1.0)], adv, pad_id=0)
    with pytest.raises(ValueError, match="at least one group"):
        collate([], [], pad_id=0)


def test_truncated_completions_are_masked_from_the_loss_when_asked():
    g = group(rewards=(1.0, 0.0, 0.0), truncated=(0,))
    adv = [torch.tensor([1.0, -0.5, -0.5])]
    masked = collate([g], adv, pad_id=0, mask_truncated=True)
    assert masked.completion_mask[0].sum() == 0 and masked.completion_mask[1].sum() == 3
    assert collate([g], adv, pad_id=0, mask_truncated=False).completion_mask[0].sum() == 3
