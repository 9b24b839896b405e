"""Published policy versions: weights only, in the model's dtype, verified by workers, pruned safely.

Issue 15 item 4 (publishing apart from checkpointing) and issue 13 (a worker asked to load a pruned
version loads nothing and says so; the learner never prunes a version a worker may still load).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from prioreplay import checkpoint_reader as checkpoints
from prioreplay.errors import InvalidArgument
from prioreplay.learner import checkpoint as ckpt

# builds a small model and writes versions of it: make test-fast leaves it out
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from prioreplay.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=5)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from prioreplay.models import load_causal_lm, load_tokenizer

    return load_causal_lm(tiny_dir), load_tokenizer(tiny_dir)


def test_a_published_version_holds_the_weights_only_in_the_asked_dtype_with_a_manifest(tmp_path, tiny):
    model, tok = tiny
    path = ckpt.publish_weights(tmp_path / "pub", 7, 7, model, tok, dtype=torch.bfloat16)
    assert path == tmp_path / "pub" / "v-7" and not (path / checkpoints.TRAINER_STATE).exists()
    manifest = checkpoints.verify_weights(path)
    assert manifest["format"] == checkpoints.WEIGHTS_FORMAT and manifest["version"] == 7
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
        names = list(fh.keys())
        assert {fh.get_tensor(n).dtype for n in names} == {torch.bfloat16}
    assert manifest["tensors"] == len(names)
    assert not [p for p in (tmp_path / "pub").iterdir() if p.name.startswith(".tmp")]


def test_a_worker_refuses_a_pruned_partial_or_altered_version_and_keeps_its_weights(tmp_path, tiny, tiny_dir):
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    model, tok = tiny
    backend = TransformersBackend(tiny_dir)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    v1 = ckpt.publish_weights(tmp_path / "pub", 1, 1, model, tok)

    partial = tmp_path / "pub" / "v-2"
    shutil.copytree(v1, partial)
    (partial / checkpoints.MANIFEST).unlink()  # a plain directory is loadable only whole ...
    (partial / "model.safetensors").write_bytes(b"")  # ... and this one is not
    altered = tmp_path / "pub" / "v-3"
    shutil.copytree(v1, altered)
    data = bytearray((altered / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the hash tells
    (altered / "model.safetensors").write_bytes(bytes(data))
    for uri, why in [(tmp_path / "pub" / "v-9", "does not exist"), (partial, "safetensors"), (altered, "crc32")]:
        with pytest.raises(InvalidArgument, match=why):
            backend.load_weights(str(uri), 5)
        assert backend.policy_version == 0
        for k, v in backend.model.state_dict().items():
            assert torch.equal(v, before[k]), k
    backend.load_weights(str(v1), 1)  # the complete one loads
    assert backend.policy_version == 1
    assert not torch.equal(backend.model.state_dict()["lm_head.weight"], before["lm_head.weight"])


def test_vllm_reload_counts_the_tensors_each_engine_worker_applied(tmp_path, tiny):
    """The vLLM path without a GPU: the worker extension against a stand-in model runner, and the
    backend's load against a stand-in engine whose directory vanishes before the engine reads it."""
    from prioreplay.rollout_worker.backends import vllm_backend as vb
    from prioreplay.rollout_worker.backends.base import PartialWeightsLoad

    model, tok = tiny
    v1 = ckpt.publish_weights(tmp_path / "pub", 1, 1, model, tok)
    n = checkpoints.verify_weights(v1)["tensors"]

    class Runner:
        class model:
            got: list = []

            @classmethod
            def load_weights(cls, weights):
                cls.got = [name for name, _ in weights]

    ext = vb.WeightReloadExtension()
    ext.model_runner = Runner
    assert ext.prioreplay_reload_weights(str(v1)) == n and len(Runner.model.got) == n
    assert ext.prioreplay_reload_weights(str(tmp_path / "vanished")) == 0  # what a pruned directory gave: nothing

    class Engine:  # the directory is pruned between the checks and the engine's read
        def collective_rpc(self, method, args):
            shutil.rmtree(args[0])
            return [ext.prioreplay_reload_weights(args[0]) for _ in range(2)]

        def reset_prefix_cache(self):
            raise AssertionError("a refused load must not touch the engine further")

    backend = vb.VLLMBackend.__new__(vb.VLLMBackend)
    backend.llm, backend._policy_version = Engine(), 0
    backend.tied_embeddings = vb.ties_embeddings(v1)
    backend._signature = vb.engine_view(vb.checkpoint_signature(v1), backend.tied_embeddings)
    with pytest.raises(InvalidArgument, match="0 of the model's"):
        backend.load_weights(str(v1), 1)
    assert backend.policy_version == 0
    with pytest.raises(PartialWeightsLoad, match="mixed"):
        vb.check_applied(v1, [n, n - 3], n)
    vb.check_applied(v1, [n, n], n)


def test_pruning_keeps_every_version_a_worker_may_still_load(tmp_path, tiny):
    model, tok = tiny
    root = tmp_path / "pub"
    for v in (1, 2, 3, 4):
        ckpt.publish_weights(root, v, v, model, tok)
    t4 = checkpoints.verify_weights(root / "v-4")["created_unix_s"]
    # keep 1: v-3 was current until v-4 appeared; within the grace period a worker may still load it
    # (and v-1, v-2 were superseded seconds ago too)
    assert ckpt.prune_published(root, keep=1, grace_s=60.0, now=t4 + 1) == []
    assert sorted(p.name for p in root.iterdir()) == ["v-1", "v-2", "v-3", "v-4"]
    # after the grace period, everything but the newest goes (v-2 and v-1 were superseded earlier)
    deleted = ckpt.prune_published(root, keep=1, grace_s=60.0, now=t4 + 61)
    assert sorted(p.name for p in deleted) == ["v-1", "v-2", "v-3"]
    assert [p.name for p in root.iterdir()] == ["v-4"]
    with pytest.raises(InvalidArgument):
        ckpt.prune_published(root, keep=0, grace_s=1.0)
