"""The learner on K processes with torch.distributed: one consumer, the batch split across ranks.

Launched by ``torchrun`` (which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/
``MASTER_PORT`` and restarts every rank when one dies, ``--max-restarts``). Without those variables,
or with ``WORLD_SIZE=1``, :func:`from_env` returns None and the learner is the single process it
always was.

One step on K ranks:

1. **rank 0 owns the feed** (the job's one consumer identity at the server): it pulls and filters
   exactly as a single learner does;
2. it **shares the used groups** with every rank as tensors (:meth:`Distributed.share_groups`):
   a header ``[groups, bytes, stop]``, the groups' protobuf lengths and their concatenated
   protobuf bytes as one uint8 tensor, each a ``broadcast`` from rank 0; receivers parse the
   bytes as ``TrajectoryGroup`` messages. Nothing is pickled;
3. every rank computes the same advantages and collates the same (B, T) batch, and the loss
   normaliser is the whole batch's (token or sequence count over all ranks);
4. rank r trains on its contiguous shard of ceil(B / K) sequences (:meth:`Distributed.micro_batches`;
   every rank runs the same number of micro-batches, a rank short of sequences runs a masked one
   that contributes zero), gradients are all-reduced by ``DistributedDataParallel`` once, after the
   last micro-batch. DDP averages over ranks, so each rank's loss is multiplied by K: the
   gradient is the sum of the shards' gradients = the full-batch gradient of one process;
5. rank 0 publishes, checkpoints (``optimizer.state_dict()`` of a DDP job is the one-process
   format, so a checkpoint is loadable by a job of any size) and acknowledges after the
   checkpoint; other ranks only load checkpoints.

With ``parallelism fsdp`` (FSDP2, for a model whose full fine-tune does not fit one device), step 4
runs on a model sharded in place by :func:`fully_shard_layers` (each decoder layer, then the root;
the optimizer is built after, over the shards): parameters are all-gathered for each layer's
forward and backward, gradients reduce-scattered (averaged, so the loss is scaled by K as under
DDP), and ``set_requires_gradient_sync(False)`` stands in for ``no_sync()``. Step 5 gathers the
whole weights and optimizer state onto rank 0's CPU (:func:`full_model_state`,
:func:`full_optimizer_state`: collectives every rank joins), still in the one-process format;
resuming, rank 0 reads the checkpoint and :func:`load_full_state` broadcasts it, each rank keeping
its shard. The KL reference model (``kl_coef > 0``) is not sharded: a whole copy per rank.

Rank 0 tells the other ranks when it stops (SIGTERM, ``max_steps`` is counted by all ranks alike)
with a header whose stop flag is set; ranks > 0 never stop on their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prioreplay.errors import InvalidArgument

from .batch import Batch

log = logging.getLogger(__name__)


@dataclass
class Distributed:
    """This process's place in a torchrun job.

    Attributes:
        rank: global rank (0 owns the feed, publishes and checkpoints).
        world_size: ranks K (>= 2).
        local_rank: rank on this node (its GPU is ``cuda:local_rank``).
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str = ""
    sharded: bool = False  # FSDP2 (``parallelism fsdp``), set by :meth:`wrap`

    @property
    def is_main(self) -> bool:
        """Rank 0: the feed, publishing, checkpoints, acknowledgements, /metrics and the log file."""
        return self.rank == 0

    # -- set-up --------------------------------------------------------------------------------
    def device(self, device: str) -> torch.device:
        """This rank's device for the learner setting ``device``: ``cuda:LOCAL_RANK`` for ``auto``
        or ``cuda`` on a CUDA machine, else the CPU.

        Raises:
            InvalidArgument: ``cuda:N`` (one rank per GPU is torchrun's job; pass ``cuda`` or ``auto``).
        """
        if device.startswith("cuda:"):
            raise InvalidArgument(
                f"device ({device!r}) under torchrun: each rank takes cuda:LOCAL_RANK; "
                "pass --device cuda (or auto), and CUDA_VISIBLE_DEVICES to choose the GPUs"
            )
        from .policy import pick_device

        if pick_device(device) == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def start(self, device: torch.device) -> None:
        """Join the process group (``env://`` from torchrun): NCCL on CUDA, gloo on the CPU.

        torchrun keeps one store for the whole job across restarts, so the ranks' addresses are
        kept under a prefix per attempt (``TORCHELASTIC_RESTART_COUNT``): a restarted rank never
        reads the address of a rank that died in an earlier attempt.
        """
        import torch.distributed as dist
        from torch.distributed.rendezvous import rendezvous

        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            store, rank, world = next(rendezvous("env://"))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(f"prioreplay/attempt-{attempt}", store),
                rank=rank,
                world_size=world,
                device_id=device if device.type == "cuda" else None,
            )
        log.info(
            "rank %d of %d (local rank %d) on %s, backend %s", self.rank, self.world_size, self.local_rank, device, self.backend
        )

    def wrap(self, model, device: torch.device, parallelism: str = "ddp"):
        """The model that trains. ``ddp``: ``DistributedDataParallel(model)`` (its gradients
        all-reduced); ``model`` itself keeps the weights (saved, loaded, used as the KL reference
        under LoRA). ``fsdp``: ``model`` itself, sharded in place by FSDP2 (:func:`fully_shard` on
        each decoder layer, then the root): each rank holds 1/K of every parameter, gradient and
        (once the optimizer is built over the sharded parameters) optimizer state; its weights are
        read and written only whole (:meth:`full_model_state`, :meth:`load_full_state`)."""
        self.sharded = parallelism == "fsdp"
        if self.sharded:
            return fully_shard_layers(model)
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def close(self, finished: bool = True) -> None:
        """Leave the process group; after a clean finish only once every rank got here (none is
        left inside a collective; a rank leaving early hung its peer's exit). After an error
        (``finished=False``) at once: the other ranks may be inside another collective."""
        import torch.distributed as dist

        if dist.is_initialized():
            if finished:
                dist.barrier()
            dist.destroy_process_group()

    # -- one step ------------------------------------------------------------------------------
    @property
    def _comm_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def share_groups(self, groups: Sequence, stop: bool = False) -> tuple[list, bool]:
        """Rank 0's ``groups`` (``TrajectoryGroup`` messages) on every rank, as protobuf bytes in
        tensors (never pickled), and rank 0's ``stop`` flag. Rank 0 gets its own list back.

        Every rank must call it once per step, in the same order (it is three collectives).
        Returns ``(groups, stop)``.
        """
        import torch.distributed as dist

        from prioreplay.v1.priority_service_pb2 import TrajectoryGroup

        dev = self._comm_device
        blobs = [g.SerializeToString() for g in groups] if self.is_main else []
        header = torch.tensor([len(blobs), sum(map(len, blobs)), int(stop)], dtype=torch.int64, device=dev)  # (3,)
        dist.broadcast(header, src=0)
        n, nbytes, stop_flag = header.tolist()
        if n == 0:
            return [], bool(stop_flag)
        if self.is_main:
            lengths = torch.tensor([len(b) for b in blobs], dtype=torch.int64, device=dev)  # (n,)
            data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).to(dev)  # (nbytes,)
        else:
            lengths = torch.empty(n, dtype=torch.int64, device=dev)  # (n,)
            data = torch.empty(nbytes, dtype=torch.uint8, device=dev)  # (nbytes,)
        dist.broadcast(lengths, src=0)
        dist.broadcast(data, src=0)
        if self.is_main:
            return list(groups), bool(stop_flag)
        raw, out, offset = data.cpu().numpy().tobytes(), [], 0
        for length in lengths.tolist():
            out.append(TrajectoryGroup.FromString(raw[offset : offset + length]))
            offset += length
        return out, bool(stop_flag)

    def shard(self, batch: Batch) -> tuple[int, int]:
        """The sequences [start, stop) of the batch's B that this rank trains on (ceil(B / K) per
        rank, contiguous; the last ranks may get fewer or none)."""
        per_rank = -(-len(batch) // self.world_size)  # ceil(B / K)
        start = min(len(batch), self.rank * per_rank)
        return start, min(len(batch), start + per_rank)

    def micro_batches(self, batch: Batch, size: int, model) -> Iterator[tuple[Batch, contextlib.AbstractContextManager]]:
        """This rank's micro-batches of at most ``size`` sequences, each with the context its
        forward and backward run in: ``model.no_sync()`` for all but the last, so DDP all-reduces
        once. Every rank yields ceil(ceil(B / K) / size) micro-batches; where its shard has run
        out, a copy of sequence 0 with an all-zero completion mask (loss and gradient 0)."""
        start, stop = self.shard(batch)
        per_rank = -(-len(batch) // self.world_size)  # ceil(B / K)
        n_micro = -(-per_rank // size)
        for i in range(n_micro):
            lo = start + i * size
            if lo < stop:
                mb = batch.slice(lo, min(stop, lo + size))
            else:
                mb = batch.slice(0, 1)
                mb.completion_mask = torch.zeros_like(mb.completion_mask)
            yield mb, (self._no_sync(model) if i < n_micro - 1 else contextlib.nullcontext())

    def _no_sync(self, model) -> contextlib.AbstractContextManager:
        """A micro-batch whose gradients are not yet reduced across ranks: ``no_sync()`` under DDP,
        ``set_requires_gradient_sync(False)`` under FSDP2 (unsharded gradients accumulate)."""
        if not self.sharded:
            return model.no_sync()

        @contextlib.contextmanager
        def unsynced():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return unsynced()

    @property
    def loss_scale(self) -> float:
        """K: DDP averages the ranks' gradients, the full-batch gradient is their sum."""
        return float(self.world_size)

    def sum_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Per-rank sums of the step's figures (each already divided by the whole batch's
        normaliser), summed over ranks: the figures of the whole batch, on every rank."""
        import torch.distributed as dist

        keys = sorted(totals)
        values = torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=self._comm_device)  # (M,)
        dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))


# -- FSDP2: sharding, and whole state dicts in the one-process format -------------------------------
def fully_shard_layers(model):
    """Shard ``model`` in place with FSDP2: :func:`torch.distributed.fsdp.fully_shard` on every
    decoder layer (modules whose class name ends in ``DecoderLayer``, as in Hugging Face causal
    LMs), then on the root (embeddings, final norm, head). Returns ``model``.

    Raises:
        InvalidArgument: the model has no decoder layers to shard one by one.
    """
    from torch.distributed.fsdp import fully_shard

    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise InvalidArgument(
            f"parallelism ('fsdp'): {type(model).__name__} has no *DecoderLayer modules to shard; use --parallelism ddp"
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def tied_aliases(model) -> dict[str, str]:
    """{alias name: kept name} of parameters that appear under two names (tied embeddings), the
    first name in module order kept, as :func:`prioreplay.models.save_weights` keeps it."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def full_model_state(model) -> dict[str, Any]:
    """The whole weights of an FSDP2-sharded ``model``, gathered onto rank 0's CPU (every rank
    must call it; ranks > 0 get ``{}``), tied aliases left out as one process saves them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: dict[str, Any] = dict(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    for alias in tied_aliases(model):
        state.pop(alias, None)
    return state


def full_optimizer_state(model, optimizer) -> dict:
    """The whole optimizer state of an FSDP2 job on rank 0 (``{}`` on ranks > 0; every rank must
    call it), in the one-process format ``optimizer.state_dict()`` has: parameters numbered
    0, 1, … in the order of the optimizer's groups, so a job of any size loads it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name: Any = get_optimizer_state_dict(model, optimizer, options=options)
    if not by_name:
        return {}
    ids: dict[str, int] = {}
    groups = [{**g, "params": [ids.setdefault(n, len(ids)) for n in g["params"]]} for g in by_name["param_groups"]]
    return {"state": {ids[n]: v for n, v in by_name["state"].items()}, "param_groups": groups}


def load_full_state(model, optimizer, weights: dict, optimizer_state: dict) -> None:
    """Load whole weights and a one-process optimizer state (``optimizer.state_dict()``'s
    format), read on rank 0, into an FSDP2-sharded ``model`` and its optimizer on every rank
    (broadcast from rank 0, each rank keeping its shard). Ranks > 0 pass ``{}`` and ``{}``.
    Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    for alias, kept in tied_aliases(model).items():
        if kept in weights:
            weights[alias] = weights[kept]
    set_model_state_dict(model, weights, options=options)
    by_name: dict = {}
    if optimizer_state:
        names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order (policy.py)
        by_name = {
            "state": {names[i]: v for i, v in optimizer_state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optimizer_state["param_groups"]],
        }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)


def from_env(env: Mapping[str, str] | None = None) -> Distributed | None:
    """This process's :class:`Distributed` from torchrun's variables, or None outside a job of
    two or more ranks.

    Raises:
        InvalidArgument: a rank outside [0, WORLD_SIZE).
    """
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    if not 0 <= rank < world:
        raise InvalidArgument(f"RANK ({rank}) must be in [0, WORLD_SIZE={world}); start the learner with torchrun")
    return Distributed(rank, world, local)


def follow_claim(settings, device: str, env: MutableMapping[str, str] | None = None) -> None:
    """A rank other than local rank 0: see the GPUs local rank 0 claimed (``learner_gpus``, which
    it locks for the whole job), without locking them again. Nothing when not claiming."""
    from prioreplay.devices import DeviceClaim, parse_ids

    if settings.gpu_claims_dir is None or device == "cpu":
        return
    DeviceClaim(parse_ids(settings.learner_gpus, "learner_gpus"), []).apply(env)
