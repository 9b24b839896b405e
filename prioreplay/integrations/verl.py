"""Prioritized problems for verl's ``RayPPOTrainer`` (verified against verl 0.9.1).

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
from collections.abc import Callable, Mapping
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
        groups: dict[str, str] = {}
        ids, values = [], []
        for i, uid in enumerate(uids):
            pid = self.problem_key({k: v[i] for k, v in columns.items()})
            if groups.setdefault(uid, pid) != pid:
                raise InvalidArgument(
                    f"uid {uid!r} groups samples of problems {groups[uid]!r} and {pid!r}; one uid must be one prompt"
                )
            ids.append(pid)
            values.append(self.to_success(rewards[i]) if self.to_success is not None else rewards[i])
        self.sampler.report(ids, values)
        self.sampler.flush(problems=set(ids))  # verl never scores these prompts again: send what is short too
        self._last_uids = frozenset(uids)
        return len(groups)


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


def __getattr__(name: str) -> Any:
    """``PriorityRayPPOTrainer`` is built on first use: importing verl's trainer imports Ray."""
    if name == "PriorityRayPPOTrainer":
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        cls = type(
            "PriorityRayPPOTrainer",
            (ReportRewards, RayPPOTrainer),
            {"__doc__": "verl's RayPPOTrainer that reports each step's rewards (see ReportRewards).", "__module__": __name__},
        )
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# PriorityRayPPOTrainer is made on first access by __getattr__ above (verl is imported only then)
__all__ = [  # noqa: F822
    "PriorityRayPPOTrainer",
    "ReportRewards",
    "RewardReporter",
    "make_train_sampler",
    "problem_id",
]
