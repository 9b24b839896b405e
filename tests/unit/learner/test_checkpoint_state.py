"""The learner's checkpoint state: one dataclass, written and read as ``trainer_state.pt``'s dict."""

from __future__ import annotations

import pytest

from prioreplay.learner.persistence import CheckpointState


def test_the_state_round_trips_through_its_dict_without_copying_the_state_dicts():
    optimizer = {"state": {}, "param_groups": [{"lr": 1e-5}]}
    state = CheckpointState(
        step=4, policy_version=3, trained_group_ids=["g1", "g2"], optimizer=optimizer, scheduler={"x": 1}, rng={"r": 2}
    )
    d = state.to_dict()
    assert set(d) == {"step", "policy_version", "trained_group_ids", "optimizer", "scheduler", "rng"}
    assert d["optimizer"] is optimizer  # a large state dict is written as it is
    assert CheckpointState.from_dict(d) == state


def test_a_checkpoint_from_before_the_group_ids_reads_as_holding_none():
    d = {"step": 2, "policy_version": 2, "optimizer": {}, "scheduler": {}, "rng": {}}
    assert CheckpointState.from_dict(d).trained_group_ids == []
    with pytest.raises(KeyError, match="rng"):
        CheckpointState.from_dict({k: v for k, v in d.items() if k != "rng"})
