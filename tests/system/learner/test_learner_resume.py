"""The learner stopped and started again, against a real in-process priority server and the tiny
model: killed between a step and its checkpoint, or between a checkpoint and its acknowledgement,
it resumes on the same groups without training twice; a crash-rolled-back run's groups keep their
age; groups are acknowledged only once a checkpoint holds them.

Server, client, synthetic groups and the learner's settings: test_learner.py and this folder's
conftest.py.
"""

from __future__ import annotations

import pytest
import torch

from prioreplay.learner import checkpoint as ckpt
from tests.system.learner.test_learner import feed, make_config

# training steps and learner processes: tens of seconds; make test-fast leaves them out
pytestmark = pytest.mark.slow


def test_killed_between_step_and_checkpoint_gets_the_same_groups_and_loss_on_resume(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.learner import Learner

    cfg = make_config(server, tiny_dir, tmp_path)
    feed(client, tiny_dir, 2, seed=1)
    first = Learner(cfg)
    first.resume()
    assert first.step().trained  # step 1, checkpoint step-1
    feed(client, tiny_dir, 2, seed=2)

    # step 2 trains, then the process "dies" before its checkpoint (so before acknowledging)
    seen: dict = {}
    train = first._train
    first._train = lambda batch: seen.setdefault("trained", train(batch))  # (metrics, applied)

    def die():
        raise SystemExit("killed before the checkpoint")

    first.checkpoint = die
    with pytest.raises(SystemExit):
        first.step()
    first.client.close()
    pulled = sorted(first.feed.held)  # step 2's groups (step 1's were acknowledged at its checkpoint)
    assert len(pulled) == 2 and client.stats().pending_groups == 2  # trained, yet not acknowledged

    # a new process with the same consumer resumes from step-1 and gets the same groups at once
    second = Learner(cfg)
    assert second.resume() == tmp_path / "ckpt" / "step-1"
    assert second.step_count == 1
    result = second.step()
    assert sorted(result.group_ids) == pulled
    assert result.record["loss"] == pytest.approx(seen["trained"][0]["loss"], rel=1e-5, abs=1e-7)
    assert result.record["grad_norm"] == pytest.approx(seen["trained"][0]["grad_norm"], rel=1e-4)
    # version 2 was published before the crash: the retrained step is numbered after it
    assert second.step_count == 2 and client.stats().policy_version == 3
    # the optimizer (Adam moments) and scheduler were restored too: the same update as the dead one made
    for (name, a), b in zip(second.model.state_dict().items(), first.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)
    assert client.stats().pending_groups == 0
    second.client.close()


def test_killed_between_checkpoint_and_ack_acks_on_resume_without_training_again(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.learner import Learner

    cfg = make_config(server, tiny_dir, tmp_path)
    feed(client, tiny_dir, 2, seed=1)
    first = Learner(cfg)
    first.resume()

    def die(ids):
        raise SystemExit("killed before the ack")

    first.client.ack = die
    with pytest.raises(SystemExit):
        first.step()  # trained, published, checkpointed step-1, then died
    first.client.close()
    assert client.stats().pending_groups == 2

    second = Learner(cfg)
    assert second.resume() == tmp_path / "ckpt" / "step-1"  # its update is in the checkpoint ...
    s = client.stats()
    assert (s.pending_groups, s.groups_acked) == (0, 2)  # ... so the groups are acknowledged, not trained again
    second.client.close()


def test_groups_of_a_crash_rolled_back_run_keep_their_age_after_restart(server, client, tiny_dir, tmp_path):
    """max_staleness 0, publish every step, checkpoint every 3: killed after 2 steps, the server is at
    version 2 but the learner is back at step 0. The groups of the lost steps are trained again
    (their age counted in the surviving lineage), not dropped as 2 versions stale."""
    from prioreplay.learner.learner import Learner

    cfg = make_config(server, tiny_dir, tmp_path, max_staleness=0, checkpoint_every=3, batch_groups=2)
    feed(client, tiny_dir, 2, versions=[0, 0], seed=4)
    first = Learner(cfg)
    first.resume()
    assert first.step().record["groups_used"] == 2
    feed(client, tiny_dir, 2, versions=[1, 1], seed=5)
    assert first.step().record["groups_used"] == 2
    first.client.close()  # "killed": no checkpoint, nothing acknowledged
    assert (client.stats().policy_version, client.stats().pending_groups) == (2, 4)

    second = Learner(cfg)
    assert second.resume() is None and second.current_version == 2
    assert [second.step().record["groups_used"] for _ in range(2)] == [2, 2]  # none dropped as stale
    assert second.metrics.groups.labels("stale")._value.get() == 0
    second.checkpoint()
    s = client.stats()
    assert (s.groups_acked, s.pending_groups) == (4, 0)
    second.client.close()


def test_publish_every_step_checkpoint_every_second_and_ack_only_after_the_checkpoint(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.learner import Learner

    learner = Learner(make_config(server, tiny_dir, tmp_path, publish_every=1, checkpoint_every=2))
    learner.resume()
    feed(client, tiny_dir, 2, seed=6)
    r1 = learner.step().record
    assert (r1["published"], r1["checkpointed"], r1["groups_unacked"]) == (True, False, 2)
    s = client.stats()
    assert (s.policy_version, s.groups_acked, s.pending_groups) == (1, 0, 2)  # published, nothing acknowledged
    assert not (tmp_path / "ckpt" / "step-1").exists()
    feed(client, tiny_dir, 2, seed=7)
    r2 = learner.step().record
    assert (r2["published"], r2["checkpointed"], r2["groups_unacked"]) == (True, True, 0)
    s = client.stats()
    assert (s.policy_version, s.groups_acked, s.pending_groups) == (2, 4, 0)
    assert ckpt.load_trainer_state(tmp_path / "ckpt" / "step-2")["trained_group_ids"] and "optimizer" in ckpt.load_trainer_state(
        tmp_path / "ckpt" / "step-2"
    )
    assert sorted(p.name for p in (tmp_path / "ckpt" / "published").iterdir()) == ["v-1", "v-2"]
    learner.client.close()
