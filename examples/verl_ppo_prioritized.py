"""verl's current PPO / GRPO trainer with problems from a prioreplay server.

This is verl's own entry point (``python -m verl.trainer.main_ppo``, verl 0.9.1) with one change: its
task runner trains with ``priority_trainer_cls(trainer.v1.trainer_mode)``, verl's v1 trainer of that
mode with ``LeaseAndReport`` (prioreplay.integrations.verl): the train dataloader leases its problems
from the server and each prompt's group of scores is reported before verl's advantage. verl's
configuration, overrides and outputs are unchanged; ``+prioreplay.server`` names the server (else the
``PRIOREPLAY_*`` environment of the task runner's Ray actor). Usage, with verl's GSM8K files
(verl's examples/data_preprocess/gsm8k.py) and a server started with ``prioreplay server``:

    python examples/verl_ppo_prioritized.py +prioreplay.server=10.0.0.5:50051 \\
        data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \\
        data.train_batch_size=256 data.dataloader_num_workers=0 \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.rollout.n=8 \\
        algorithm.adv_estimator=grpo trainer.n_gpus_per_node=8 trainer.nnodes=1

It needs what verl's v1 trainer needs (Ray, GPUs, a rollout engine, TransferQueue) and is not run by
the test suite; tests/system/test_integrations_verl.py checks the runner class below and runs the two
hooks on verl's own code.
"""

from pathlib import Path

import hydra
import ray
import verl
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from prioreplay.integrations.verl import priority_trainer_cls

VERL_CONFIG = str(Path(verl.__file__).parent / "trainer" / "config")


@ray.remote
class PriorityTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's ``TaskRunnerV1`` (a Ray actor), building the prioritized trainer of the configured mode."""

    def run(self, config):
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        mode = config.trainer.v1.trainer_mode
        # verl's run() looks the trainer up by mode; in this actor's process the mode names ours
        TRAINER_REGISTRY[mode] = priority_trainer_cls(mode)
        super().run(config)


@hydra.main(config_path=VERL_CONFIG, config_name="ppo_trainer", version_base=None)
def main(config):
    """verl's ``main_ppo.main`` for the v1 trainer, with :class:`PriorityTaskRunner`."""
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if not config.trainer.use_v1:
        raise SystemExit(
            "trainer.use_v1=False selects verl's legacy RayPPOTrainer: use PriorityRayPPOTrainer in your TaskRunner "
            "(docs/INTEGRATIONS.md, verl), or drop the override"
        )
    run_ppo(config, task_runner_class=PriorityTaskRunner)


if __name__ == "__main__":
    main()
