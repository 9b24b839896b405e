"""Learner checkpoints: atomic step-N directories, manifest checks, keep-K pruning."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from prioreplay import checkpoint_reader as checkpoints
from prioreplay.errors import InvalidArgument
from prioreplay.learner import checkpoint as ckpt

# builds a small model and writes checkpoints of it: make test-fast leaves it out
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from prioreplay.models import load_causal_lm, load_tokenizer
    from prioreplay.tiny_model import make_tiny_model

    d = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)
    return load_causal_lm(d), load_tokenizer(d)


def _state(step: int) -> dict:
    return {
        "step": step,
        "policy_version": step,
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {"last_epoch": step},
        "rng": ckpt.rng_state(),
    }


def _save(root, step, tiny, keep=None):
    model, tok = tiny
    return ckpt.save_checkpoint(root, step, model, tok, _state(step), config={"lr": 1e-6}, keep=keep)


def test_save_writes_a_verifiable_step_dir_and_no_temporaries(tmp_path, tiny):
    path = _save(tmp_path, 7, tiny)
    assert path == tmp_path / "step-7"
    manifest = checkpoints.verify(path)
    assert manifest["step"] == 7 and manifest["policy_version"] == 7 and manifest["config"] == {"lr": 1e-6}
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {checkpoints.MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert {"model.safetensors", "config.json", checkpoints.TRAINER_STATE} <= on_disk
    assert [p.name for p in tmp_path.iterdir()] == ["step-7"]
    state = ckpt.load_trainer_state(path)
    assert state["step"] == 7 and torch.equal(state["rng"]["torch"], _state(7)["rng"]["torch"])
    assert checkpoints.latest_complete(tmp_path) == path


def test_weights_round_trip_into_a_fresh_model(tmp_path, tiny):
    from prioreplay.models import load_causal_lm, load_weights
    from prioreplay.tiny_model import make_tiny_model

    model, _ = tiny
    path = _save(tmp_path / "ck", 1, tiny)
    other = load_causal_lm(make_tiny_model(tmp_path / "other", seed=99))
    ids = torch.tensor([[5, 6, 7, 8]])
    assert not torch.allclose(other(ids).logits, model(ids).logits)
    load_weights(other, path)
    torch.testing.assert_close(other(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_latest_complete_skips_temporary_partial_and_tampered(tmp_path, tiny):
    good = _save(tmp_path, 2, tiny)
    assert checkpoints.latest_complete(tmp_path) == good
    # a crash while writing step 3 leaves only a temporary directory
    shutil.copytree(good, tmp_path / ".tmp-step-3-deadbeef")
    # step 4 without its manifest (partial), step 5 with a flipped byte (same size), step 6 misnamed
    shutil.copytree(good, tmp_path / "step-4")
    (tmp_path / "step-4" / checkpoints.MANIFEST).unlink()
    _save(tmp_path, 5, tiny)
    weights = tmp_path / "step-5" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    shutil.copytree(good, tmp_path / "step-6")  # manifest says step 2
    assert checkpoints.latest_complete(tmp_path) == good
    with pytest.raises(checkpoints.CheckpointError, match="sha256"):
        ckpt.load_trainer_state(tmp_path / "step-5")
    with pytest.raises(checkpoints.CheckpointError, match="partial"):
        ckpt.load_trainer_state(tmp_path / "step-4")
    with pytest.raises(checkpoints.CheckpointError, match="step 2"):
        checkpoints.verify(tmp_path / "step-6")
    with pytest.raises(checkpoints.CheckpointError, match="step-N"):
        checkpoints.verify(tmp_path / ".tmp-step-3-deadbeef")


def test_missing_or_resized_file_is_refused(tmp_path, tiny):
    path = _save(tmp_path, 1, tiny)
    (path / "config.json").write_text((path / "config.json").read_text() + " ")
    with pytest.raises(checkpoints.CheckpointError, match="bytes"):
        checkpoints.verify(path)
    path = _save(tmp_path, 2, tiny)
    (path / checkpoints.TRAINER_STATE).unlink()
    with pytest.raises(checkpoints.CheckpointError, match="missing"):
        checkpoints.verify(path)
    assert checkpoints.latest_complete(tmp_path) is None


def test_keep_k_prunes_oldest_complete_only(tmp_path, tiny):
    for step in (1, 2, 3):
        _save(tmp_path, step, tiny, keep=2)
    shutil.copytree(tmp_path / "step-3", tmp_path / "step-9")
    (tmp_path / "step-9" / checkpoints.MANIFEST).unlink()  # a newer partial one: never counts as "newest"
    _save(tmp_path, 4, tiny, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-3", "step-4", "step-9"]
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "step-4"
    deleted = ckpt.prune(tmp_path, keep=1)
    assert deleted == [tmp_path / "step-3"]
    with pytest.raises(InvalidArgument, match="keep"):
        ckpt.prune(tmp_path, keep=0)


def test_rewriting_a_step_replaces_a_partial_leftover(tmp_path, tiny):
    _save(tmp_path, 1, tiny)
    (tmp_path / "step-1" / checkpoints.MANIFEST).unlink()
    assert checkpoints.latest_complete(tmp_path) is None
    path = _save(tmp_path, 1, tiny)
    assert checkpoints.latest_complete(tmp_path) == path
    assert json.loads((path / checkpoints.MANIFEST).read_text())["step"] == 1


def test_state_that_needs_unpickling_is_refused_and_leaves_nothing(tmp_path, tiny):
    model, tok = tiny
    state = _state(1)
    state["bad"] = object()
    with pytest.raises(InvalidArgument, match="plain containers"):
        ckpt.save_checkpoint(tmp_path, 1, model, tok, state)
    assert list(tmp_path.iterdir()) == []
