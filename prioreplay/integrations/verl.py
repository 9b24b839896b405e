"""Prioritized problems for verl's trainers (verified against verl 0.9.1 and TransferQueue 0.1.11).

verl's current trainer, ``verl.trainer.ppo.v1.PPOTrainer`` (``main_ppo``'s default), is hooked by
:class:`LeaseAndReport` (``priority_trainer_cls(mode)``: its train dataloader is rebuilt over
:func:`make_train_sampler`, and the scored groups are reported at ``_compute_advantage``; entry point:
``examples/verl_ppo_prioritized.py``). The rest of this docstring is the legacy ``RayPPOTrainer``.

verl builds its train dataloader from a ``train_sampler`` argument (``RayPPOTrainer(...,
train_sampler=...)``, a ``StatefulDataLoader`` whose state verl checkpoints as ``data.pt``), and
scores every sample on its own. This module gives it:

* :func:`make_train_sampler`: a :class:`~prioreplay.integrations.torch.PrioritySampler` over an
  ``RLHFDataset`` with one lease per dataloader batch (``data.gen_batch_size`` or
  ``data.train_batch_size`` prompts) and ``G = actor_rollout_ref.rollout.n``;
* :class:`RewardReporter`: after verl has scored a step's batch (``token_level_scores``, or the
  reward loop's ``rm_scores``), it sums each sample's token-level scores into its sequence reward,
  groups the samples by the prompt's ``uid`` (as verl's GRPO advantage does), names each group's
  problem from the sample's ``data_source`` and ``extra_info.index``, and reports every group once;
* :class:`ReportRewards`: a mixin for ``RayPPOTrainer`` (and subclasses) that runs the reporter on
  the batch that reaches ``_update_actor`` / ``_update_critic``; ``PriorityRayPPOTrainer`` is
  ``RayPPOTrainer`` with it.

Problem ids are ``<data_source>:<extra_info.index>`` (verl's preprocessing scripts set a unique
``extra_info.index`` per row), so the same problem keeps its statistics across runs and data
files; pass ``problem_key`` for another rule. Keep ``data.dataloader_num_workers=0``: with workers
the dataloader prefetches, and every prefetched batch is a lease taken before the rewards of the
batches before it arrived.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.torch import PrioritySampler

log = logging.getLogger(__name__)

#: Columns of an RLHFDataset row the sampler reads (the rest, e.g. images, is never loaded).
ROW_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")


def problem_id(row: Mapping) -> str:
    """The default problem id of a verl row or sample: ``<data_source>:<extra_info.index>``."""
    extra = row.get("extra_info") or {}
    return f"{row.get('data_source', '')}:{extra.get('index', '')}"


def ground_truth(row: Mapping) -> str:
    """A verl row's reference answer (``reward_model.ground_truth``), or empty."""
    reward_model = row.get("reward_model") or {}
    return str(reward_model.get("ground_truth", "")) if isinstance(reward_model, Mapping) else ""


def make_train_sampler(
    config,
    dataset,
    server: str | ClientSettings | PriorityClient | None = None,
    *,
    problem_key: Callable[[Mapping], str] = problem_id,
    **options,
) -> PrioritySampler:
    """The ``train_sampler`` to give ``RayPPOTrainer`` for prioritized problems.

    Args:
        config: verl's full trainer config (``data.train_batch_size`` / ``data.gen_batch_size``,
            ``actor_rollout_ref.rollout.n`` / ``.temperature`` / ``.top_p`` (sent with every
            group), ``data.dataloader_num_workers`` are read).
        dataset: the train ``RLHFDataset`` (rows are read from its ``dataframe``, after verl's
            filtering, so sampler indices are the dataset's).
        server: ``HOST:PORT``, ``ClientSettings`` or a client; default: the ``PRIOREPLAY_*``
            environment, else ``127.0.0.1:50051``.
        problem_key: row → problem id (default :func:`problem_id`).
        **options: more :class:`PrioritySampler` options (``partial_groups``, ``lease_timeout_s``...).

    Raises:
        InvalidArgument: two rows share a problem id (give each row a unique ``extra_info.index``
            or pass ``problem_key``), or a bad size.
        FailedPrecondition: the server holds problems of other datasets (at construction), or its
            sampler asks for screening probes (first batch: verl generates ``rollout.n`` for
            every prompt; the message names the sampler and the alternative).
    """
    data = config.data
    batch_size = int(data.get("gen_batch_size") or data.train_batch_size)
    rollout = config.actor_rollout_ref.rollout
    group_size = int(rollout.n)
    options.setdefault("temperature", float(rollout.get("temperature", 1.0) or 0.0))
    options.setdefault("top_p", float(rollout.get("top_p", 1.0) or 0.0))
    options.setdefault("accepts_group_size", False)  # verl generates rollout.n for every prompt: probes refused
    if int(data.get("dataloader_num_workers", 0) or 0) > 0:
        log.warning(
            "data.dataloader_num_workers=%s: every batch the workers prefetch is a lease taken before the "
            "rewards of the batches before it arrived; set it to 0",
            data.dataloader_num_workers,
        )
    frame = dataset.dataframe
    prompt_key = data.get("prompt_key", "prompt")
    rows = frame.select_columns([c for c in frame.column_names if c in (*ROW_COLUMNS, prompt_key)]).to_list()
    return PrioritySampler(
        rows,
        server=server if server is not None else ClientSettings(),
        batch_size=batch_size,
        group_size=group_size,
        ids=[problem_key(r) for r in rows],
        prompt_column=prompt_key,
        answer_column=ground_truth,
        source="verl",
        **options,
    )


class RewardReporter:
    """Reports the rewards of a scored verl batch, one group per prompt ``uid``.

    Args:
        sampler: the :class:`PrioritySampler` that served the batch.
        problem_key: sample → problem id (as given to :func:`make_train_sampler`).
        to_success: maps a sequence reward to [0, 1] (e.g. ``lambda r: float(r > 0)`` for ±1 scores).
    """

    def __init__(
        self,
        sampler: PrioritySampler,
        problem_key: Callable[[Mapping], str] = problem_id,
        to_success: Callable[[float], float] | None = None,
    ):
        self.sampler = sampler
        self.problem_key = problem_key
        self.to_success = to_success
        self._last_uids: frozenset = frozenset()
        self._pending: set[str] = set()  # reported (whole_leases) in a lease not yet sent

    def report(self, batch) -> int:
        """Report the groups of ``batch`` (a ``DataProto`` after reward computation).

        Reads ``non_tensor_batch["uid"]`` (one per sample; samples of one prompt share it), the keys
        ``problem_key`` needs, and ``batch["token_level_scores"]`` (else ``batch["rm_scores"]``),
        shape (N, T) with the sequence reward on the last response token: the reward of sample i
        is its row sum. Every leased problem in the batch is sent after this call (a group with
        fewer than G samples as ``partial_groups`` says). Calling it again with the same batch
        (e.g. from both the critic and the actor update) does nothing.

        Returns:
            The number of groups (uids) reported.

        Raises:
            InvalidArgument: no ``uid`` or score tensor; a uid whose samples name different problems.
        """
        ntb = batch.non_tensor_batch
        if "uid" not in ntb:
            raise InvalidArgument("the batch has no non_tensor_batch['uid']; report after verl assigned uids")
        keys = batch.batch.keys()
        name = "token_level_scores" if "token_level_scores" in keys else "rm_scores" if "rm_scores" in keys else None
        if name is None:
            raise InvalidArgument("the batch has neither 'token_level_scores' nor 'rm_scores'; report after scoring")
        uids = [str(u) for u in ntb["uid"]]
        if frozenset(uids) == self._last_uids:
            return 0
        rewards = batch.batch[name].sum(dim=-1).tolist()  # (N,) sequence rewards
        columns = {k: ntb[k] for k in ntb}
        samples = [{k: v[i] for k, v in columns.items()} for i in range(len(uids))]
        groups = self.report_samples(uids, samples, rewards)
        self._last_uids = frozenset(uids)
        return groups

    def report_samples(
        self, uids: Sequence[str], samples: Sequence[Mapping], rewards: Sequence[float], *, whole_leases: bool = False
    ) -> int:
        """Report scored samples, one group per uid, and send every group short or not.

        Args:
            uids: per sample, its prompt's uid (samples of one prompt share it).
            samples: per sample, the columns ``problem_key`` reads (``data_source``, ``extra_info``).
            rewards: per sample, its sequence reward (mapped by ``to_success`` when given).
            whole_leases: False: every lease holding one of these problems is sent now (its problems
                not in this call return unchanged). True: a lease is sent once each of its problems
                has been reported (over several calls: verl v1 splits a step's prompts over
                ``parameter_sync_step`` updates); :meth:`flush_pending` sends the rest.

        Returns:
            The number of groups (uids) reported.

        Raises:
            InvalidArgument: a uid whose samples name different problems; what
                :meth:`PrioritySampler.report` refuses (a problem not leased, more than G rewards).
        """
        groups: dict[str, str] = {}
        ids, values = [], []
        for uid, sample, reward in zip(uids, samples, rewards, strict=True):
            pid = self.problem_key(sample)
            if groups.setdefault(uid, pid) != pid:
                raise InvalidArgument(
                    f"uid {uid!r} groups samples of problems {groups[uid]!r} and {pid!r}; one uid must be one prompt"
                )
            ids.append(pid)
            values.append(self.to_success(reward) if self.to_success is not None else reward)
        self.sampler.report(ids, values)
        if not whole_leases:
            self.sampler.flush(problems=set(ids))  # verl never scores these prompts again: send what is short too
            return len(groups)
        self._pending.update(ids)
        leases = self.sampler.outstanding.values()
        covered = {p for pids in leases if set(pids) <= self._pending for p in pids}
        if covered:
            self.sampler.flush(problems=covered)  # every problem of these leases is in: short groups too
        self._pending &= {p for pids in self.sampler.outstanding.values() for p in pids}
        return len(groups)

    def flush_pending(self) -> int:
        """Send the leases that ``whole_leases`` reports left waiting for problems that never came (a
        group verl dropped, or one without trajectories); those problems return unchanged.

        Returns:
            The number of leases sent.
        """
        sent = self.sampler.flush(problems=self._pending) if self._pending else 0
        self._pending.clear()
        return sent


class ReportRewards:
    """Mixin for verl's ``RayPPOTrainer``: report each step's rewards before its update.

    The trainer's ``train_sampler`` must be a :class:`PrioritySampler` (``make_train_sampler``).
    Hooks ``_update_critic`` and ``_update_actor`` (verl 0.9.1), which receive the step's batch
    after rewards and advantages; a batch is reported once even when both run.
    """

    prioreplay_reporter: RewardReporter | None = None

    def _prioreplay_report(self, batch) -> None:
        if self.prioreplay_reporter is None:
            sampler = getattr(self.train_dataloader, "sampler", None)  # type: ignore[attr-defined]  # a mixin: RayPPOTrainer provides it
            if not isinstance(sampler, PrioritySampler):
                raise InvalidArgument(
                    "the trainer's train_sampler is not a PrioritySampler; pass "
                    "train_sampler=make_train_sampler(config, train_dataset)"
                )
            self.prioreplay_reporter = RewardReporter(sampler)
        self.prioreplay_reporter.report(batch)

    def _update_critic(self, batch):
        self._prioreplay_report(batch)
        return super()._update_critic(batch)  # type: ignore[misc]  # a mixin: RayPPOTrainer, next in the MRO, has it

    def _update_actor(self, batch):
        self._prioreplay_report(batch)
        return super()._update_actor(batch)  # type: ignore[misc]  # a mixin: RayPPOTrainer, next in the MRO, has it


def final_session_rows(keys: Sequence[str]) -> list[int]:
    """Of verl v1 trajectory keys ``{uid}_{session_id}_{index}``, the row of each session's last output.

    An agent loop may put several outputs per session (one per turn); its outcome is the last one's
    reward (verl copies it onto the others). verl's GRPO keeps the same rows
    (``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``).

    Raises:
        InvalidArgument: a key not of that form.
    """
    last: dict[str, tuple[int, int]] = {}
    for row, key in enumerate(keys):
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise InvalidArgument(f"trajectory key {key!r} is not '{{uid}}_{{session_id}}_{{index}}' (verl v1's layout)")
        session, index = f"{parts[0]}_{parts[1]}", int(parts[2])
        if session not in last or last[session][0] < index:
            last[session] = (index, row)
    return sorted(row for _, row in last.values())


class LeaseAndReport:
    """Mixin for verl's current trainer (``verl.trainer.ppo.v1.PPOTrainer`` and its modes).

    verl's ``main_ppo`` runs this trainer by default (``trainer.use_v1=True``): rollouts and scores
    travel through TransferQueue as trajectories keyed ``{uid}_{session_id}_{index}``, and the
    trainer steps on ``KVBatchMeta`` handles. Its methods are hooked (verl 0.9.1):

    * ``_init_dataloader``: verl builds its datasets and dataloader, then the train dataloader is
      built again, with the same arguments, over :func:`make_train_sampler` (one lease per
      dataloader fetch of ``data.gen_batch_size`` prompts; verl sets it to 1 in the async modes);
    * ``_compute_advantage``: the step's groups are complete and scored (``rm_scores``) there;
      before verl's GRPO runs, one sequence reward per session (its last output,
      :func:`final_session_rows`) is read back from TransferQueue and each uid group is reported
      once (:meth:`RewardReporter.report_samples`). verl's padding rows (tag ``is_padding``) are
      left out: they copy a real sample's columns but carry no outcome. A lease is sent when all
      its problems are in (``trainer.v1.<mode>.parameter_sync_step`` > 1 splits a step's prompts
      over several calls); ``step`` (a third hook) sends, after verl's step, what is still waiting.

    The server is the ``server`` key of a ``prioreplay`` section in verl's config (``+prioreplay.server=HOST:PORT`` on the
    command line), else the ``PRIOREPLAY_*`` environment. Groups that verl drops before the
    advantage (DAPO's filter, stale or failed groups) are never reported: their leases expire and
    the server returns those problems unchanged.
    """

    #: the sample columns ``problem_key`` reads, fetched from TransferQueue with the scores
    prioreplay_columns: tuple[str, ...] = ("data_source", "extra_info")
    prioreplay_problem_key: Callable[[Mapping], str] = staticmethod(problem_id)
    #: sequence reward -> [0, 1] (e.g. ``lambda r: float(r > 0)`` for ±1 scores); None: as scored
    prioreplay_to_success: Callable[[float], float] | None = None
    prioreplay_reporter: RewardReporter | None = None
    # set by verl's PPOTrainer (its __init__ and _init_dataloader)
    config: Any
    train_dataset: Any
    train_dataloader: Any

    def _init_dataloader(self):
        super()._init_dataloader()  # type: ignore[misc]  # a mixin: verl's PPOTrainer, next in the MRO, has it
        from omegaconf import OmegaConf
        from torchdata.stateful_dataloader import StatefulDataLoader

        verl_loader = self.train_dataloader
        server = OmegaConf.select(self.config, "prioreplay.server")
        sampler = make_train_sampler(self.config, self.train_dataset, server, problem_key=self.prioreplay_problem_key)
        self.train_dataloader = StatefulDataLoader(
            dataset=verl_loader.dataset,
            batch_size=verl_loader.batch_size,
            num_workers=verl_loader.num_workers,
            drop_last=verl_loader.drop_last,
            collate_fn=verl_loader.collate_fn,
            sampler=sampler,
        )
        self.prioreplay_reporter = RewardReporter(sampler, self.prioreplay_problem_key, self.prioreplay_to_success)

    def _compute_advantage(self, batch, metrics):
        self._prioreplay_report_v1(batch)
        return super()._compute_advantage(batch, metrics)  # type: ignore[misc]  # a mixin: verl's PPOTrainer has it

    def step(self, metrics, timing_raw):
        batch = super().step(metrics, timing_raw)  # type: ignore[misc]  # a mixin: verl's PPOTrainer has it
        if self.prioreplay_reporter is not None:
            self.prioreplay_reporter.flush_pending()  # the step consumed its prompts: what did not come never will
        return batch

    def _prioreplay_report_v1(self, batch) -> int:
        """Report the groups of ``batch`` (a ``KVBatchMeta``); returns the number of uids reported."""
        import transfer_queue as tq

        if self.prioreplay_reporter is None:
            raise InvalidArgument("no priority sampler: LeaseAndReport._init_dataloader did not run (call trainer.init())")
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        keys = [batch.keys[i] for i in real]
        keys = [keys[i] for i in final_session_rows(keys)]
        if not keys:
            return 0
        fields = ["uid", "rm_scores", *self.prioreplay_columns]
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
        rewards = data.select("rm_scores").to_padded_tensor()["rm_scores"].sum(dim=-1).tolist()  # (N,) sequence rewards
        columns = {c: data.get(c).tolist() for c in self.prioreplay_columns}  # NonTensorStack -> list
        samples = [{c: v[i] for c, v in columns.items()} for i in range(len(keys))]
        uids = [str(u) for u in data.get("uid").tolist()]
        return self.prioreplay_reporter.report_samples(uids, samples, rewards, whole_leases=True)


def priority_trainer_cls(trainer_mode: str = "sync") -> type:
    """verl's v1 trainer of ``trainer_mode`` (``trainer.v1.trainer_mode``) with :class:`LeaseAndReport`.

    Raises:
        ValueError: verl has no trainer of that mode (verl's message lists those it has).
    """
    from verl.trainer.ppo.v1 import get_trainer_cls

    base = get_trainer_cls(trainer_mode)
    if trainer_mode not in _V1_CLASSES:
        _V1_CLASSES[trainer_mode] = type(
            f"Priority{base.__name__}",
            (LeaseAndReport, base),
            {"__doc__": f"verl's {base.__name__} with prioritized problems (see LeaseAndReport).", "__module__": __name__},
        )
    return _V1_CLASSES[trainer_mode]


_V1_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``PriorityRayPPOTrainer`` and ``PriorityPPOTrainerSync`` are built on first use: importing verl's trainers imports Ray."""
    if name == "PriorityRayPPOTrainer":
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        cls = type(
            "PriorityRayPPOTrainer",
            (ReportRewards, RayPPOTrainer),
            {"__doc__": "verl's RayPPOTrainer that reports each step's rewards (see ReportRewards).", "__module__": __name__},
        )
        globals()[name] = cls
        return cls
    if name == "PriorityPPOTrainerSync":
        return priority_trainer_cls("sync")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# PriorityRayPPOTrainer and PriorityPPOTrainerSync are made on first access by __getattr__ above (verl is imported only then)
__all__ = [  # noqa: F822
    "LeaseAndReport",
    "PriorityPPOTrainerSync",
    "PriorityRayPPOTrainer",
    "ReportRewards",
    "RewardReporter",
    "final_session_rows",
    "make_train_sampler",
    "priority_trainer_cls",
    "problem_id",
]
