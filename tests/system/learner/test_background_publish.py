"""``--background-publish``: the learner writes and announces a version on a background thread.

Against a real in-process priority server (memory store) and the tiny model, as
``test_learner.py`` (whose server and synthetic groups these tests reuse). The write is slowed
or broken by wrapping :func:`prioreplay.learner.checkpoint.publish_weights`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from prioreplay import checkpoint_reader
from prioreplay.learner import checkpoint as ckpt
from tests.system.learner import test_learner as tl

pytestmark = pytest.mark.slow  # training steps: seconds each


@pytest.fixture
def server():
    s = tl.ServerThread()
    yield s
    s.close()


@pytest.fixture
def client(server):
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    c = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from prioreplay.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=1)


def _learner(server, tiny_dir, tmp_path, **kw):
    from prioreplay.learner.learner import Learner

    kw.setdefault("checkpoint_every", 10)  # no checkpoint (which waits for the publish) unless asked
    cfg = tl.make_config(server, tiny_dir, tmp_path, background_publish=True, **kw)
    return Learner(cfg)


class Spy:
    """The learner's client, recording each PublishPolicy and checking its version is complete."""

    def __init__(self, inner):
        self.inner, self.announced = inner, []

    def publish(self, version, uri):
        checkpoint_reader.verify_weights(Path(uri))  # raises if the files are not all there
        self.announced.append(version)
        return self.inner.publish(version, uri)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_published_weights_are_the_publish_steps_although_the_next_step_trained_meanwhile(
    server, client, tiny_dir, tmp_path, monkeypatch
):
    from safetensors.torch import load_file

    learner = _learner(server, tiny_dir, tmp_path)
    write = ckpt.publish_weights

    def after_the_next_optimizer_step(root, version, *a, **kw):
        deadline = time.monotonic() + 30
        while version == 1 and learner.step_count < 2:  # v-1 is written only once step 2 changed the weights
            assert time.monotonic() < deadline, "step 2 never stepped the optimizer"
            time.sleep(0.01)
        return write(root, version, *a, **kw)

    monkeypatch.setattr(ckpt, "publish_weights", after_the_next_optimizer_step)
    tl.feed(client, tiny_dir, 4, seed=11)
    learner.resume()
    assert learner.step().record["published"]
    at_publish = tl._params(learner.model)  # the weights of step 1, as the publish copied them
    assert learner.step().trained and learner.step_count == 2
    learner.wait_published()

    written = load_file(str(tmp_path / "ckpt" / "published" / "v-1" / "model.safetensors"))
    assert "lm_head.weight" not in written and "model.embed_tokens.weight" in written  # tied: stored once
    dtype = learner.publish_dtype or torch.float32
    for name, t in written.items():
        torch.testing.assert_close(t, at_publish[name].to(dtype), rtol=0, atol=0, msg=name)
    now = learner.model.state_dict()
    assert any(not torch.equal(t, now[name].to(dtype)) for name, t in written.items()), "step 2 changed nothing"
    assert client.stats().policy_version == 2
    learner.client.close()


def test_versions_are_announced_in_order_complete_before_each_checkpoint_and_before_exit(
    server, client, tiny_dir, tmp_path, monkeypatch
):
    learner = _learner(server, tiny_dir, tmp_path, max_steps=3, checkpoint_every=2)
    learner.client = spy = Spy(learner.client)
    write, at_checkpoint = ckpt.publish_weights, []
    save = ckpt.save_checkpoint

    def slow(*a, **kw):
        time.sleep(0.3)  # a slow disk: without the waits the checkpoint and the exit would pass it
        return write(*a, **kw)

    def checkpoint_spy(root, step, *a, **kw):
        at_checkpoint.append((step, client.stats().policy_version))
        return save(root, step, *a, **kw)

    monkeypatch.setattr(ckpt, "publish_weights", slow)
    monkeypatch.setattr(ckpt, "save_checkpoint", checkpoint_spy)
    tl.feed(client, tiny_dir, 6, seed=12)
    assert learner.run() == 0
    assert spy.announced == [1, 2, 3]
    assert at_checkpoint == [(2, 2), (3, 3)]  # each checkpoint after its step's version was out
    assert client.stats().policy_version == 3 and not learner.publisher.busy  # the exit waited
    spy.inner.close()


def test_a_failed_background_publish_raises_at_the_next_step_and_its_version_is_rolled_back(
    server, client, tiny_dir, tmp_path, monkeypatch
):
    learner = _learner(server, tiny_dir, tmp_path)
    write = ckpt.publish_weights

    def full_disk_once(root, version, *a, **kw):
        if version == 1:
            raise OSError(28, "No space left on device")
        return write(root, version, *a, **kw)

    monkeypatch.setattr(ckpt, "publish_weights", full_disk_once)
    tl.feed(client, tiny_dir, 6, seed=13)
    learner.resume()
    assert learner.step().record["published"] and learner.version == 1  # numbered; written in the background
    with pytest.raises(OSError, match="No space left"):
        learner.step()
    assert learner.version == 0 and client.stats().policy_version == 0  # never announced, never counted
    assert not (tmp_path / "ckpt" / "published" / "v-1").exists()
    learner.step()
    learner.wait_published()
    assert client.stats().policy_version == learner.version == learner.step_count
    learner.client.close()
