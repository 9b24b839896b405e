"""A learner's state on disk and at the server: resume, publish the weights, checkpoint and acknowledge.

The jobs of a :class:`~.learner.Learner` besides its step, as functions of the learner (its
methods of the same names call them):

- :func:`resume`: load the newest complete checkpoint (found at construction), acknowledge the
  groups it already holds, and never number a version below the server's;
- :func:`publish`: the weights only, as policy version N (``PUBLISH_DIR/v-N/``), then
  ``PublishPolicy`` (with ``background_publish``: a CPU copy written and announced on a
  background thread, :mod:`~.publisher`, which a checkpoint waits for);
- :func:`checkpoint`: the full training state ``step-N``, then acknowledge every group trained
  since the previous checkpoint.

What a checkpoint holds besides the weights is one :class:`CheckpointState`; everything else
these functions use of the learner is its public interface (attributes and methods documented
on :class:`~.learner.Learner`). The file formats are :mod:`~.checkpoint` (writing) and
:mod:`prioreplay.checkpoint_reader` (reading, checks). In a distributed job rank 0 alone writes, publishes and acknowledges; the
other ranks only load checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prioreplay.channel import timed_call
from prioreplay.checkpoint_reader import version_dir
from prioreplay.weights_transport import published_uri

from . import checkpoint as ckpt
from . import distributed, policy

if TYPE_CHECKING:
    from .learner import Learner

log = logging.getLogger(__name__)


@dataclass
class CheckpointState:
    """What a checkpoint's ``trainer_state.pt`` holds: the training state besides the weights.

    Attributes:
        step: optimizer steps done (the checkpoint is ``step-<step>``).
        policy_version: the newest policy version published when it was written (the weights are
            that version when ``policy_version >= step``).
        trained_group_ids: the groups trained since the previous checkpoint, acknowledged only
            after this one is on disk (a resume acknowledges them again: a crash may have come
            between the write and the acknowledgement).
        optimizer: the optimizer's one-process state dict (under FSDP gathered onto rank 0).
        scheduler: the LR scheduler's state dict.
        rng: torch (CPU and CUDA) and python RNG states (:func:`~.checkpoint.rng_state`).

    Every field is a tensor or a plain container, so the dict loads with ``weights_only=True``.
    """

    step: int
    policy_version: int
    trained_group_ids: list[str] = field(default_factory=list)
    optimizer: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``trainer_state.pt`` dict (keys: the field names; the state dicts as they are, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> CheckpointState:
        """Read a ``trainer_state.pt`` dict (a checkpoint without ``trained_group_ids``: none).

        Raises:
            KeyError: ``step``, ``policy_version``, ``optimizer``, ``scheduler`` or ``rng`` is missing.
        """
        return cls(
            step=int(state["step"]),
            policy_version=int(state["policy_version"]),
            trained_group_ids=[str(x) for x in state.get("trained_group_ids", [])],
            optimizer=state["optimizer"],
            scheduler=state["scheduler"],
            rng=state["rng"],
        )


def trainer_state(learner: Learner, version: int, optimizer: dict[str, Any]) -> CheckpointState:
    """The learner's :class:`CheckpointState` now, as policy ``version``, with ``optimizer`` (its
    one-process state dict) and the groups it holds since the previous checkpoint."""
    return CheckpointState(
        step=learner.step_count,
        policy_version=version,
        trained_group_ids=list(learner.feed.held),
        optimizer=optimizer,
        scheduler=learner.scheduler.state_dict(),
        rng=ckpt.rng_state(),
    )


# -- start-up --------------------------------------------------------------------------------------
def resume(learner: Learner) -> Path | None:
    """Load the newest complete checkpoint of ``checkpoint_dir`` (if any), then make sure the
    version never goes below the server's. Returns the checkpoint loaded, or None."""
    path = learner.resume_path  # found (and verified) at construction
    if path is not None:
        load_checkpoint(learner, path)
    if learner.feed is None:  # a rank > 0 of a distributed job: rank 0 alone talks to the server
        return path
    if path is not None:
        ack = learner.feed.acknowledge_checkpointed(learner.trained_at_checkpoint)  # killed before their ack
        if ack is not None:
            log.info("acknowledged %d groups trained into %s (%d already acknowledged)", ack.acked, path, ack.unknown)
    server_stats = learner.rpc("GetStats", learner.client.stats)
    server_version = server_stats.policy_version
    # versions published after this checkpoint came from weights a crash rolled back; the steps
    # that made them are recomputed on the same groups, so those groups keep their original age
    learner.feed.start(getattr(server_stats, "pending_groups", 0), server_version, learner.current_version)
    if server_version > learner.current_version:
        log.warning(
            "the server's policy version (%d) is ahead of this learner's (%d, checkpoint %s): numbering new versions after it",
            server_version,
            learner.current_version,
            path,
        )
        learner.version = server_version
    learner.metrics.step.set(learner.step_count)
    learner.metrics.policy_version.set(learner.version)
    return path


def load_checkpoint(learner: Learner, path: str | Path) -> None:
    """Restore weights, optimizer, scheduler, step, version and RNG states from ``path``.

    Raises:
        CheckpointError: the checkpoint is partial or altered (nothing is changed).
        InvalidArgument: its weights do not fit the model.
    """
    from safetensors.torch import load_file

    from prioreplay import models

    state = CheckpointState.from_dict(ckpt.load_trainer_state(path))  # verifies every file first
    if learner.config.lora:  # the merged weights were loaded before wrapping (see Learner.__init__)
        log.warning("LoRA: %s holds merged weights; adapters and optimizer state restart from zero", path)
    elif _sharded(learner):  # rank 0 reads the whole state, every rank keeps its shard
        main = learner.feed is not None
        weights = load_file(str(Path(path) / models.WEIGHTS_FILE)) if main else {}
        distributed.load_full_state(learner.model, learner.optimizer, weights, state.optimizer if main else {})
    else:
        models.load_weights(learner.model, path)
        learner.optimizer.load_state_dict(state.optimizer)
    learner.scheduler.load_state_dict(state.scheduler)
    learner.step_count, learner.version = state.step, state.policy_version
    # groups whose update this checkpoint holds; a crash may have come before their ack
    learner.trained_at_checkpoint = state.trained_group_ids
    learner.last_checkpoint_step = learner.step_count
    if learner.version >= learner.step_count:  # these weights were published (as this version or before)
        learner.last_publish_step = learner.step_count
    ckpt.set_rng_state(state.rng)
    log.info("resumed from %s: step %d, policy version %d", path, learner.step_count, learner.version)


# -- publish + checkpoint --------------------------------------------------------------------------
def publish(learner: Learner) -> Path | None:
    """Publish the current weights as policy version N = the step (or the next one above the
    server's, if it was ahead): ``PUBLISH_DIR/v-N/`` (weights only, in the publish dtype,
    manifest last, renamed into place), then ``PublishPolicy``. Returns the version directory
    (None on ranks > 0 of a distributed job: rank 0 publishes).

    With ``background_publish`` (:attr:`Learner.publisher` set) the weights are copied to CPU
    here (:func:`snapshot_weights`: the next optimizer step cannot change what is written) and
    the write + ``PublishPolicy`` run on the publisher's thread; the directory returned is then
    complete only once the version is announced. ``learner.version`` is N from now on, so the
    next steps count staleness as if N were out (as the synchronous path does); a failed write or
    announcement rolls it back when the error is raised (:mod:`~.publisher`). The previous
    background publish is waited for first, so versions are announced in increasing order.

    Publishing writes no optimizer state and acknowledges nothing (see :func:`checkpoint`).

    Raises:
        OSError, StoreUnavailable, ...: the write or ``PublishPolicy`` failed (with
            ``background_publish``: the previous version's, raised here or at the next step).
    """
    weights = _whole_weights(learner)  # every rank of an FSDP job gathers
    if learner.feed is None:
        learner.last_publish_step = learner.step_count
        return None
    publisher = learner.publisher
    if publisher is not None:
        publisher.wait()  # the previous version announced first (or its error raised)
    version = learner.step_count if learner.step_count > learner.version else learner.version + 1
    if publisher is None:
        path = _write_and_announce(learner, version, learner.step_count, weights, learner.rpc)
        learner.version = version
        learner.last_publish_step = learner.step_count
        return path
    snapshot = snapshot_weights(weights, learner.publish_dtype)  # (CPU copies) before the next step
    previous, numbered = (learner.version, learner.last_publish_step), (version, learner.step_count)
    learner.version, learner.last_publish_step = numbered

    def rollback() -> None:  # on the learner's thread, when the error is raised
        if (learner.version, learner.last_publish_step) == numbered:
            learner.version, learner.last_publish_step = previous

    def call(method, fn, *args):  # on the publisher's thread: not the step's RPC seconds
        return timed_call(learner.observe_background, method, fn, *args)

    publisher.submit(
        f"policy version {version}",
        lambda: _write_and_announce(learner, version, numbered[1], snapshot, call),
        on_failure=rollback,
    )
    return version_dir(learner.publish_dir, version)


def _write_and_announce(learner: Learner, version: int, step: int, weights: Any, call: Callable) -> Path:
    """Write ``weights`` as ``PUBLISH_DIR/v-N/`` (:func:`~.checkpoint.publish_weights`), then
    announce it with ``PublishPolicy`` through ``call(method, fn, *args)``; set the gauge."""
    cfg = learner.config
    path = ckpt.publish_weights(
        learner.publish_dir,
        version,
        step,
        weights,
        learner.tokenizer,
        dtype=learner.publish_dtype,
        keep=cfg.keep_published,
        grace_s=cfg.publish_grace_s,
    )
    call("PublishPolicy", learner.client.publish, version, published_uri(path, cfg.weights_base_url))
    learner.metrics.policy_version.set(version)
    log.info("step %d: published policy version %d (%s)", step, version, path)
    return path


def snapshot_weights(weights: Any, dtype: Any = None) -> GatheredWeights:
    """A detached CPU copy of ``weights`` (a model, or :class:`GatheredWeights`) for
    :func:`prioreplay.models.save_weights`: every tensor copied once in the publish ``dtype``
    (floating tensors; None: as trained), tied aliases sharing one copy as they shared one
    tensor (so the file stores them once, as the synchronous path does). Costs one copy of the
    weights in host memory (SmolLM2-135M in bfloat16: about 270 MB) while it is written."""
    import torch

    copies: dict[tuple[int, int, tuple[int, ...], str], torch.Tensor] = {}
    state = {}
    for name, t in weights.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), str(t.device))
        if key not in copies or t.numel() == 0:
            to = dtype if dtype is not None and t.is_floating_point() else t.dtype
            copies[key] = t.detach().to(device="cpu", dtype=to, copy=True)
        state[name] = copies[key]
    return GatheredWeights(weights, state)


def checkpoint(learner: Learner) -> Path | None:
    """Write the full training checkpoint ``step-N`` (weights, optimizer, scheduler, step,
    version, RNG; fsynced, renamed into place), then acknowledge every group trained since the
    previous checkpoint: from now on a crash cannot lose their update. Returns the directory
    (None on ranks > 0 of a distributed job: rank 0 checkpoints and acknowledges).
    """
    t0 = time.perf_counter()
    weights, optimizer = _whole_weights(learner), _whole_optimizer(learner)  # every rank of an FSDP job gathers
    if learner.feed is None:
        learner.last_checkpoint_step = learner.step_count
        return None
    if learner.publisher is not None:  # the version it records (and resumes as published) is out first
        learner.publisher.wait()
    cfg = learner.config
    path = ckpt.save_checkpoint(
        cfg.checkpoint_dir,
        learner.step_count,
        weights,
        learner.tokenizer,
        trainer_state(learner, learner.version, optimizer).to_dict(),
        config=cfg.model_dump(mode="json", exclude={"auth_token"}),
        keep=cfg.keep_checkpoints,
    )
    learner.last_checkpoint_step = learner.step_count
    acked = learner.feed.acknowledge_held()
    log.info(
        "step %d: checkpoint %s in %.2f s; acknowledged %d groups", learner.step_count, path, time.perf_counter() - t0, acked
    )
    return path


# -- whole weights and optimizer state, gathered under FSDP ----------------------------------------
def _sharded(learner: Learner) -> bool:
    return learner.dist is not None and learner.dist.sharded


def _whole_weights(learner: Learner) -> Any:
    """What :func:`prioreplay.models.save_weights` writes: the model (LoRA: merged), or under FSDP
    its weights gathered onto rank 0 (:class:`GatheredWeights`; a collective, every rank calls it).
    None on ranks > 0, which write nothing."""
    if _sharded(learner):
        state = distributed.full_model_state(learner.model)
        return GatheredWeights(learner.model, state) if learner.feed is not None else None
    return policy.mergeable(learner.model, learner.config.lora) if learner.feed is not None else None


def _whole_optimizer(learner: Learner) -> dict[str, Any]:
    """The optimizer's one-process state dict (under FSDP gathered onto rank 0; a collective)."""
    if _sharded(learner):
        return distributed.full_optimizer_state(learner.model, learner.optimizer)
    return learner.optimizer.state_dict() if learner.feed is not None else {}


class GatheredWeights:
    """An FSDP-sharded model's whole weights where :func:`prioreplay.models.save_weights` wants a
    model: the gathered ``state`` (CPU tensors, tied aliases left out), the model's config and
    generation config, its architecture named by the class it was before sharding."""

    def __init__(self, model, state: dict[str, Any]):
        self._state = state
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        if not getattr(self.config, "architectures", None):  # fully_shard renamed the class FSDP<name>
            self.config.architectures = [type(model).__name__.removeprefix("FSDP")]

    def state_dict(self, keep_vars: bool = False) -> dict[str, Any]:
        """The gathered weights (``keep_vars`` is accepted and ignored: they are plain tensors)."""
        return self._state
