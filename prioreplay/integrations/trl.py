"""Prioritized problems for TRL's ``GRPOTrainer``: swap the train sampler, report every group's rewards.

The least a GRPOTrainer script changes (``docs/INTEGRATIONS.md``)::

    from prioreplay.integrations.trl import PriorityGRPOTrainer
    trainer = PriorityGRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)  # was GRPOTrainer

or, for a trainer object that exists already (e.g. of your own GRPOTrainer subclass)::

    from prioreplay.integrations.trl import attach
    attach(trainer)

What :func:`attach` does to the trainer:

* its train sampler becomes a :class:`~prioreplay.integrations.torch.PrioritySampler` in TRL's
  ``RepeatSampler`` layout: each lease holds ``B = generation_batch_size // num_generations``
  problems, each index is yielded ``num_generations`` times in a row, the block
  ``num_iterations × steps_per_generation`` times (the repeats TRL consumes before generating
  again), ``len(train_dataset) // B`` leases per epoch;
* a column ``prioreplay_id`` (the problem id) is added to ``train_dataset``; every reward function
  is wrapped so it never sees that column, and the *priority reward* (the first reward function,
  or the one named by ``reward``) also reports its values to the sampler in training mode, so each
  group's G rewards reach the server once (evaluation is never reported);
* ``args.ignore_data_skip`` is set: a priority order cannot be replayed by skipping batches, so a
  resumed run takes new leases instead. Checkpoints get ``prioreplay_sampler.json``; ``train``
  with ``resume_from_checkpoint`` returns the leases saved there (reporting what they buffered),
  and the end of ``train`` returns the lease TRL prefetched but never scored.

Rewards must be in [0, 1] (the server's success statistics); map another scale with
``to_success``, e.g. ``lambda r: float(r > 0)``. A reward plugin (docs/REWARDS.md) goes into
``reward_funcs`` as :class:`prioreplay.rewards.PluginReward` ``(plugin)``; as the priority reward
its pass flags are reported with its rewards. One training process only: under several
processes each would lease its own batches, so :func:`attach` refuses.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

from trl import GRPOTrainer

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.renewal import DEFAULT_LEASE_TIMEOUT_S
from prioreplay.integrations.torch import PrioritySampler

log = logging.getLogger(__name__)

#: The column attach() adds to the train dataset: each row's problem id.
ID_COLUMN = "prioreplay_id"
#: The sampler state written into every checkpoint folder.
STATE_FILE = "prioreplay_sampler.json"


def _reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


class PriorityReplay:
    """What :func:`attach` installs on a ``GRPOTrainer``: the sampler and the hooks around it.

    Attributes:
        trainer: the trainer.
        sampler: the :class:`PrioritySampler` serving its train batches.
        reward_index: which entry of ``trainer.reward_funcs`` is reported.
        reported_calls: training-mode calls of the priority reward (each sends one lease).
    """

    def __init__(
        self,
        trainer,
        server: str | ClientSettings | PriorityClient | None = None,
        *,
        reward: int | str = 0,
        to_success: Callable[[float], float] | None = None,
        id_column: str | None = None,
        register: bool = True,
        lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
    ):
        self.trainer = trainer
        self.to_success = to_success
        self.reported_calls = 0
        args = trainer.args
        self._check(trainer)
        self.reward_index = self._find_reward(trainer, reward)
        dataset = trainer.train_dataset
        g = trainer.num_generations
        b = args.generation_batch_size // g
        self.id_column = id_column or ID_COLUMN
        self.sampler = PrioritySampler(
            dataset,
            server=server if server is not None else ClientSettings(),
            batch_size=b,
            group_size=g,
            ids=id_column,
            repeat_each=g,
            repeat_batch=trainer.num_iterations * args.steps_per_generation,
            num_batches=len(dataset) // b,
            register=register,
            on_resume="return",
            lease_timeout_s=lease_timeout_s,
            source="trl",
            temperature=float(args.temperature or 0.0),
            top_p=float(args.top_p or 0.0),
            accepts_group_size=False,  # TRL generates num_generations for every prompt: probes are refused
        )
        if id_column is None:
            trainer.train_dataset = dataset.add_column(ID_COLUMN, list(self.sampler.table.ids))
        trainer.reward_funcs = [self._wrap(f, i == self.reward_index) for i, f in enumerate(trainer.reward_funcs)]
        if not args.ignore_data_skip:
            log.info("prioreplay: setting ignore_data_skip=True (a resumed run takes new leases)")
            args.ignore_data_skip = True
        trainer._get_train_sampler = self._train_sampler
        trainer.add_callback(self._callback())
        original_train = trainer.train

        @functools.wraps(original_train)
        def train(resume_from_checkpoint: str | bool | None = None, *a, **kw):
            self.resume(resume_from_checkpoint)
            try:
                return original_train(resume_from_checkpoint, *a, **kw)
            finally:
                self.sampler.flush()  # return the lease TRL prefetched and never scored

        trainer.train = train

    @staticmethod
    def _check(trainer) -> None:
        import datasets

        args = trainer.args
        if trainer.accelerator.num_processes > 1:
            raise InvalidArgument(
                f"prioreplay's TRL integration runs in one training process; this run has "
                f"{trainer.accelerator.num_processes} (each would lease its own batches)"
            )
        if not isinstance(trainer.train_dataset, datasets.Dataset):
            raise InvalidArgument(
                f"train_dataset is a {type(trainer.train_dataset).__name__}; prioritized sampling "
                "needs a map-style datasets.Dataset (indices the server can lease)"
            )
        if args.remove_unused_columns:
            raise InvalidArgument(
                f"remove_unused_columns=True would drop the {ID_COLUMN!r} column rewards are "
                "reported by; set remove_unused_columns=False (GRPOConfig's default)"
            )

    @staticmethod
    def _find_reward(trainer, reward: int | str) -> int:
        import torch

        funcs = trainer.reward_funcs
        if isinstance(reward, str):
            names = [_reward_name(f) for f in funcs]
            if reward not in names:
                raise InvalidArgument(f"reward {reward!r} is not a reward function of this trainer ({names})")
            reward = names.index(reward)
        if not (isinstance(reward, int) and 0 <= reward < len(funcs)):
            raise InvalidArgument(f"reward ({reward!r}) must index one of the {len(funcs)} reward functions")
        if isinstance(funcs[reward], torch.nn.Module):
            raise InvalidArgument(
                f"reward function {reward} is a reward model; the reported reward must be a function "
                "(a success signal in [0, 1], e.g. an answer check)"
            )
        return reward

    def _wrap(self, func, report: bool):
        """``func`` without the id column; when ``report``, its training-mode values go to the sampler."""
        import torch

        if isinstance(func, torch.nn.Module):
            return func
        strip = self.id_column == ID_COLUMN

        def split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            ids = kwargs.get(self.id_column)
            return ({k: v for k, v in kwargs.items() if k != ID_COLUMN} if strip else kwargs), ids

        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004 -- asks for an async __call__

            async def wrapped(*args, **kwargs):
                kw, ids = split(kwargs)
                rewards = await func(*args, **kw)
                if report:
                    self._report(ids, rewards, getattr(func, "last_passed", None))
                return rewards
        else:

            def wrapped(*args, **kwargs):  # type: ignore[misc]  # sync and async variants of one wrapper
                kw, ids = split(kwargs)
                rewards = func(*args, **kw)
                if report:
                    self._report(ids, rewards, getattr(func, "last_passed", None))
                return rewards

        wrapped.__name__ = _reward_name(func)
        wrapped.__doc__ = getattr(func, "__doc__", None)
        wrapped.__wrapped__ = func  # type: ignore[attr-defined]  # functools.wraps sets it
        return wrapped

    def _report(self, ids, rewards, passed=None) -> None:
        """Send a training call's rewards to the sampler, with a :class:`~prioreplay.rewards.PluginReward`'s
        pass flags (``passed``, one per reward) when the priority reward is one."""
        if not self.trainer.model.training:
            return  # evaluation: not a leased batch
        if ids is None:
            raise InvalidArgument(
                f"the reward kwargs have no {self.id_column!r} column; was the train dataset replaced after attach()?"
            )
        values = []  # type: ignore[var-annotated]  # element type follows from the first append
        for r in rewards:
            if r is None or (isinstance(r, float) and math.isnan(r)):
                values.append(None)  # TRL's "no reward for this completion": counts toward the group only
            else:
                values.append(self.to_success(r) if self.to_success is not None else r)
        flags = list(passed) if passed is not None and len(passed) == len(values) else None
        self.sampler.report(list(ids), values, passed=flags)
        self.reported_calls += 1

    def _train_sampler(self, dataset=None):
        if dataset is not None and dataset is not self.trainer.train_dataset:
            raise InvalidArgument("attach() serves the trainer's own train_dataset only")
        return self.sampler

    # -- checkpoints ----------------------------------------------------------------------------------
    def _callback(self):
        from transformers import TrainerCallback

        replay = self

        class SaveSamplerState(TrainerCallback):
            """Writes the sampler state into each checkpoint folder the trainer saves."""

            def on_save(self, args, state, control, **kwargs):
                if args.should_save:
                    folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                    if os.path.isdir(folder):
                        with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as f:
                            json.dump(replay.sampler.state_dict(), f)

        return SaveSamplerState()

    def resume(self, checkpoint: str | bool | None) -> bool:
        """Return the leases saved in ``checkpoint`` (``True``: the last one in ``output_dir``).

        Returns:
            Whether a saved sampler state was found and loaded.
        """
        if checkpoint is None or checkpoint is False:
            return False
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.trainer.args.output_dir)
            if checkpoint is None:
                return False
        path = os.path.join(str(checkpoint), STATE_FILE)
        if not os.path.isfile(path):
            log.warning("prioreplay: %s has no %s; starting with new leases", checkpoint, STATE_FILE)
            return False
        with open(path, encoding="utf-8") as f:
            self.sampler.load_state_dict(json.load(f))
        return True


def attach(trainer, server: str | ClientSettings | PriorityClient | None = None, **options) -> PriorityReplay:
    """Make an existing ``GRPOTrainer`` train on the priority server's problems (module docstring).

    Args:
        trainer: a ``trl.GRPOTrainer`` (or subclass), before ``train()``.
        server: ``HOST:PORT``, ``ClientSettings`` or a client; default ``ClientSettings()`` (the
            ``PRIOREPLAY_SERVER``, ``PRIOREPLAY_AUTH_TOKEN``, ``PRIOREPLAY_TLS_CA_FILE`` ...
            environment, else ``127.0.0.1:50051``).
        **options: ``reward`` (index or name of the reported reward function, default 0),
            ``to_success`` (maps a reward to [0, 1]), ``id_column`` (a column of stable problem
            ids; default: row index + dataset fingerprint), ``register`` (default True),
            ``lease_timeout_s`` (default 60 s, renewed while held: ``PrioritySampler``).

    Returns:
        The :class:`PriorityReplay` (also ``trainer.priority``).

    Raises:
        InvalidArgument: several training processes, an iterable or non-``datasets`` train
            dataset, ``remove_unused_columns=True``, an unknown ``reward``, or a reward model as
            the reported reward.
    """
    trainer.priority = PriorityReplay(trainer, server, **options)
    return trainer.priority


class PriorityGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose problems come from the priority server.

    Takes GRPOTrainer's arguments plus ``priority_server`` (``HOST:PORT``, ``ClientSettings`` or a
    client; default: the ``PRIOREPLAY_*`` environment, else ``127.0.0.1:50051``) and
    ``priority_options`` (the options of :func:`attach`). After construction ``trainer.priority``
    is the :class:`PriorityReplay`.
    """

    def __init__(
        self,
        *args,
        priority_server: str | ClientSettings | PriorityClient | None = None,
        priority_options: dict[str, Any] | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        attach(self, priority_server, **(priority_options or {}))


__all__ = ["ID_COLUMN", "STATE_FILE", "PriorityGRPOTrainer", "PriorityReplay", "attach"]
