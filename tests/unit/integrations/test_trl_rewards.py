"""A reward plugin in TRL's ``reward_funcs`` (:class:`prioreplay.rewards.PluginReward`): the TRL
integration's wrapper returns its rewards to TRL and sends its pass flags with them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from examples.rewards import correct_number  # noqa: E402 - after the skip
from prioreplay.integrations.trl import ID_COLUMN, PriorityReplay  # noqa: E402
from prioreplay.rewards import PluginReward  # noqa: E402


class RecordingSampler:
    def __init__(self):
        self.reports: list[tuple] = []

    def report(self, ids, rewards, passed=None):
        self.reports.append((ids, rewards, passed))


def replay(training: bool = True) -> PriorityReplay:
    """A PriorityReplay's reporting half, without a trainer or a server."""
    r = object.__new__(PriorityReplay)
    r.trainer = SimpleNamespace(model=SimpleNamespace(training=training))
    r.sampler, r.id_column, r.to_success, r.reported_calls = RecordingSampler(), ID_COLUMN, None, 0
    return r


def call(fn):
    return fn(
        prompts=["What is 1 + 1?", "What is 1 + 1?"],
        completions=["#### 2", "#### 3"],
        answer=["2", "2"],
        **{ID_COLUMN: ["p1", "p1"]},
    )


def test_the_priority_reward_sends_the_plugins_pass_flags_with_its_rewards():
    r = replay()
    wrapped = r._wrap(PluginReward(correct_number), report=True)
    assert wrapped.__name__ == "correct_number"
    assert call(wrapped) == [1.0, 0.0]  # what TRL gets back
    assert r.sampler.reports == [(["p1", "p1"], [1.0, 0.0], [True, False])]


def test_a_plain_reward_function_sends_no_pass_flags():
    r = replay()
    call(r._wrap(lambda completions, **kw: [0.5] * len(completions), report=True))
    assert r.sampler.reports == [(["p1", "p1"], [0.5, 0.5], None)]


def test_evaluation_calls_are_not_reported():
    r = replay(training=False)
    assert call(r._wrap(PluginReward(correct_number), report=True)) == [1.0, 0.0]
    assert r.sampler.reports == []
