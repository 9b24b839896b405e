"""verl's data path with the priority sampler, as far as it runs without GPUs and a Ray cluster.

Real verl 0.9.1 code runs here: its default trainer config, ``create_rl_dataset`` over a parquet in
the layout of verl's GSM8K preprocessing, ``RayPPOTrainer._create_dataloader`` (the
``StatefulDataLoader`` verl trains from, given our ``train_sampler``), ``DataProto`` batches built
with the same calls as ``RayPPOTrainer.fit`` (uids, ``_get_gen_batch``, ``repeat(n, interleave=True)``,
``union``), ``NaiveRewardManager`` scoring with verl's GSM8K rule, and ``compute_advantage`` (GRPO).
Not run: Ray, the rollout engine (its output is written by the test: fixed completions, one right
and one wrong per prompt), the actor/critic updates (a stand-in records the batch) and ``fit``.
"""

from __future__ import annotations

import types
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import verl
from datasets import Dataset
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
from verl.trainer.ppo.utils import create_rl_dataset
from verl.workers.reward_manager import NaiveRewardManager

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.verl import ReportRewards, RewardReporter, make_train_sampler, problem_id
from prioreplay.tiny_model import make_tiny_tokenizer
from prioreplay.v1 import priority_service_pb2 as pb

pytestmark = pytest.mark.slow  # importing verl's trainer imports Ray: tens of seconds

B, N_ROLLOUT, PROMPT_LEN, RESPONSE_LEN = 3, 2, 48, 8
SOURCE = "openai/gsm8k"


def _write_parquet(path: Path, n: int) -> None:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    rows = [
        {
            "data_source": SOURCE,
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]
    Dataset.from_list(rows).to_parquet(str(path))


@pytest.fixture
def verl_setup(memory_server, tmp_path):
    server = memory_server(seed=2)
    _write_parquet(tmp_path / "train.parquet", 10)
    _write_parquet(tmp_path / "val.parquet", 2)
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    config.data.train_files = str(tmp_path / "train.parquet")
    config.data.val_files = str(tmp_path / "val.parquet")
    config.data.train_batch_size = B
    config.data.dataloader_num_workers = 0
    config.actor_rollout_ref.rollout.n = N_ROLLOUT
    tokenizer = make_tiny_tokenizer()
    return types.SimpleNamespace(server=server, config=config, tokenizer=tokenizer)


def _data_path(setup, **options):
    """verl's own dataloader construction, with our sampler: RayPPOTrainer._create_dataloader on a
    stand-in that has only the config (the method reads nothing else)."""
    cfg = setup.config
    train = create_rl_dataset(cfg.data.train_files, cfg.data, setup.tokenizer, None)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, setup.tokenizer, None, is_train=False)
    sampler = make_train_sampler(cfg, train, setup.server.address, **options)
    trainer = types.SimpleNamespace(config=OmegaConf.create(OmegaConf.to_container(cfg)))
    RayPPOTrainer._create_dataloader(trainer, train, val, None, sampler)
    return trainer, sampler


def _pad(rows: list[list[int]], length: int, left: bool, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        r = r[-length:] if left else r[:length]
        sl = slice(length - len(r), length) if left else slice(0, len(r))
        ids[i, sl], mask[i, sl] = torch.tensor(r), 1
    return ids, mask


def _scored_step(batch_dict, tokenizer) -> DataProto:
    """One step of RayPPOTrainer.fit up to the advantages, with a written rollout instead of the engine."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)
    gen_in = gen_batch.repeat(repeat_times=N_ROLLOUT, interleave=True)
    truths = [rm["ground_truth"] for rm in gen_in.non_tensor_batch["reward_model"]]
    prompts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        for m in gen_in.non_tensor_batch["raw_prompt"]
    ]
    texts = [f"#### {t}" if j % 2 == 0 else "#### -1" for j, t in enumerate(truths)]  # one right, one wrong
    p_ids, p_mask = _pad(
        [tokenizer.encode(p, add_special_tokens=False) for p in prompts], PROMPT_LEN, True, tokenizer.pad_token_id
    )
    r_ids, r_mask = _pad(
        [tokenizer.encode(t, add_special_tokens=False) for t in texts], RESPONSE_LEN, False, tokenizer.pad_token_id
    )
    mask = torch.cat([p_mask, r_mask], dim=1)
    gen_out = DataProto.from_dict(
        tensors={
            "prompts": p_ids,
            "responses": r_ids,
            "input_ids": torch.cat([p_ids, r_ids], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        }
    )
    batch = batch.repeat(repeat_times=N_ROLLOUT, interleave=True).union(gen_out)
    batch.batch["response_mask"] = compute_response_mask(batch)
    batch.batch["token_level_scores"] = NaiveRewardManager(tokenizer, num_examine=0)(batch)  # (N, R)
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N_ROLLOUT)


class _Updates:
    """Stands in for the actor/critic updates (they need Ray workers)."""

    def _update_actor(self, batch):
        self.updated = getattr(self, "updated", 0) + 1
        return "actor output"

    def _update_critic(self, batch):
        return "critic output"


class _Trainer(ReportRewards, _Updates):
    pass


def test_verl_trains_from_leases_and_reports_each_uid_group_once(verl_setup):
    stub, sampler = _data_path(verl_setup)
    client = PriorityClient(ClientSettings(server=verl_setup.server.address), max_retries=0)
    assert (client.stats().problems, len(stub.train_dataloader)) == (10, 10 // B)
    leased = []
    sample = sampler.client.sample
    sampler.client.sample = lambda *a, **k: leased.append(sample(*a, **k)) or leased[-1]

    trainer = _Trainer()
    trainer.train_dataloader = stub.train_dataloader
    it = iter(stub.train_dataloader)
    batch = _scored_step(next(it), verl_setup.tokenizer)
    # the batch verl trains on is the lease, in the server's order
    served = [
        f"{s}:{e['index']}"
        for s, e in zip(
            batch.non_tensor_batch["data_source"][::N_ROLLOUT], batch.non_tensor_batch["extra_info"][::N_ROLLOUT], strict=True
        )
    ]
    assert served == [lp.problem.id for lp in leased[0].problems] and len(served) == B
    # verl's GSM8K rule scored one right and one wrong answer per prompt; its GRPO (grouping by uid)
    # gave them opposite advantages
    scores = batch.batch["token_level_scores"].sum(-1)  # (B·n,)
    assert scores.tolist() == [1.0, 0.0] * B
    adv = batch.batch["advantages"][:, 0]  # (B·n,) constant over each response
    assert (adv[0::2] > 0).all() and (adv[1::2] < 0).all()
    assert trainer._update_actor(batch) == "actor output" and trainer._update_critic(batch) == "critic output"

    stats = client.stats()
    assert (stats.completions_reported, stats.reward_sum) == (B * N_ROLLOUT, float(scores.sum()))
    assert (stats.groups_mixed + stats.groups_all_correct, stats.active_leases, stats.queue_depth) == (B, 0, 0)
    verl_client = {c.source: c for c in stats.clients}[pb.CLIENT_SOURCE_VERL]
    assert (verl_client.leases, verl_client.groups) == (1, B)  # the critic and the actor hook: reported once

    # -- resume as verl's _load_checkpoint does: a new dataloader loads the saved data.pt state --------
    state = stub.train_dataloader.state_dict()
    stub2, sampler2 = _data_path(verl_setup, register=False)
    stub2.train_dataloader.load_state_dict(state)
    trainer2 = _Trainer()
    trainer2.train_dataloader = stub2.train_dataloader
    batch2 = _scored_step(next(iter(stub2.train_dataloader)), verl_setup.tokenizer)
    trainer2._update_actor(batch2)
    final = client.stats()
    assert (final.completions_reported, final.late_reports, final.active_leases) == (2 * B * N_ROLLOUT, 0, 0)
    assert sampler2.counters["reports_accepted"] == 1
    client.close()


def test_the_reporter_refuses_a_uid_that_mixes_problems_and_the_trainer_class_hooks_verl(verl_setup):
    from prioreplay.integrations.verl import PriorityRayPPOTrainer

    assert {"_update_actor", "_update_critic"} <= set(vars(RayPPOTrainer))  # the hooks exist in this verl
    assert issubclass(PriorityRayPPOTrainer, RayPPOTrainer)
    assert PriorityRayPPOTrainer._update_actor is ReportRewards._update_actor

    stub, sampler = _data_path(verl_setup)
    batch = _scored_step(next(iter(stub.train_dataloader)), verl_setup.tokenizer)
    batch.non_tensor_batch["uid"][:] = "one uid"
    with pytest.raises(InvalidArgument, match="groups samples of problems"):
        RewardReporter(sampler).report(batch)


def test_duplicate_row_indices_are_refused_with_the_fix(verl_setup, tmp_path):
    rows = [
        {
            "data_source": SOURCE,
            "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": 0},
        }
    ] * 4
    Dataset.from_list(rows).to_parquet(str(tmp_path / "dup.parquet"))
    cfg = verl_setup.config
    train = create_rl_dataset(str(tmp_path / "dup.parquet"), cfg.data, verl_setup.tokenizer, None)
    with pytest.raises(InvalidArgument, match="share the problem id 'openai/gsm8k:0'"):
        make_train_sampler(cfg, train, verl_setup.server.address)


# -- verl's current trainer (verl.trainer.ppo.v1, main_ppo's default with trainer.use_v1=True) ----------
#
# Real verl code runs here: PPOTrainerSync.__init__ and _init_dataloader (with LeaseAndReport's
# override), _next_train_batch (verl's uids), upsample_batch_to_divisible_size (its padding rows),
# verl's GSM8K scoring rule and _compute_advantage (GRPO over TransferQueue rows). Not run: Ray,
# TransferQueue's controller and storage actors (a dict stands in for its kv API, below), the agent
# loop (its rows are written by the test as agent_loop_tq writes them), the actor update and fit.


class _KVStore:
    """Stands in for TransferQueue's kv_batch_put / kv_batch_get (Ray actors in verl's runs): one dict of
    fields per key; a get returns a TensorDict built as verl's agent loop builds the rows it puts
    (list_of_dict_to_tensordict: equal shapes stacked, ragged ones jagged, the rest NonTensorStack)."""

    def __init__(self):
        self.rows: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        if fields is not None:
            for i, key in enumerate(keys):
                row = fields[i]  # one sample: tensors, jagged rows and non-tensor values as they were put
                self.rows.setdefault((partition_id, key), {}).update({name: row[name] for name in row.keys()})
        return KVBatchMeta(partition_id=partition_id, keys=list(keys), tags=list(tags or [{} for _ in keys]))

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = [self.rows[(partition_id, k)] for k in keys]
        names = [f for f in (select_fields or rows[0]) if f in rows[0]]  # a field no row has is left out, as tq does
        return list_of_dict_to_tensordict([{f: r[f] for f in names} for r in rows])


@pytest.fixture
def v1_trainer(verl_setup, monkeypatch):
    """PriorityPPOTrainerSync after verl's __init__ and _init_dataloader, on the stand-in kv store."""
    import transfer_queue

    from prioreplay.integrations.verl import priority_trainer_cls

    store = _KVStore()
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    cfg = verl_setup.config
    cfg.algorithm.adv_estimator = "grpo"
    cfg.prioreplay = {"server": verl_setup.server.address}  # +prioreplay.server=HOST:PORT on verl's command line
    trainer = priority_trainer_cls("sync")(config=cfg)
    trainer.tokenizer, trainer.processor = verl_setup.tokenizer, None  # _init_tokenizer reads a model path
    trainer.global_steps = 1
    trainer._init_dataloader()
    yield types.SimpleNamespace(trainer=trainer, store=store, tokenizer=verl_setup.tokenizer)
    trainer.train_dataloader.sampler.close()  # returns what a failed test left leased, while the server is up


def _rollout_rows(setup, prompts) -> list[str]:
    """Rows as verl's AgentLoopWorkerTQ puts them: keys {uid}_{session}_{index}, the prompt's columns plus
    the response and rm_scores (the sequence score on the last response token). Session 0 answers
    right, session 1 wrong; session 0 of the first prompt is a two-turn loop (two outputs, the score
    copied onto both, as verl does)."""
    from verl.utils.reward_score import default_compute_score

    keys, rows = [], []
    for i in range(len(prompts)):
        uid, source = prompts["uid"][i], prompts["data_source"][i]
        truth = prompts["reward_model"][i]["ground_truth"]
        for session in range(N_ROLLOUT):
            text = f"#### {truth}" if session == 0 else "#### -1"
            ids = torch.tensor(setup.tokenizer.encode(text, add_special_tokens=False))  # (R,)
            score = float(default_compute_score(source, text, truth))
            for index in range(2 if (i, session) == (0, 0) else 1):
                rm_scores = torch.zeros(len(ids))  # (R,)
                rm_scores[-1] = score
                keys.append(f"{uid}_{session}_{index}")
                rows.append(
                    {
                        "uid": uid,
                        "data_source": source,
                        "extra_info": prompts["extra_info"][i],
                        "reward_model": prompts["reward_model"][i],
                        "prompts": torch.tensor([1, 2]),
                        "responses": ids,
                        "response_mask": torch.ones(len(ids), dtype=torch.long),
                        "rm_scores": rm_scores,
                    }
                )
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tags = [{"status": "success", "seq_len": 2 + len(r["responses"])} for r in rows]
    setup.store.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
    return keys


def test_verl_v1_trainer_trains_from_leases_and_reports_each_uid_group_once(v1_trainer, verl_setup):
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    trainer = v1_trainer.trainer
    sampler = trainer.train_dataloader.sampler
    leased = []
    sample = sampler.client.sample
    sampler.client.sample = lambda *a, **k: leased.append(sample(*a, **k)) or leased[-1]

    prompts = trainer._next_train_batch()  # verl's fetch: one lease of train_batch_size prompts, uids assigned
    served = [
        problem_id({"data_source": s, "extra_info": e})
        for s, e in zip(prompts["data_source"], prompts["extra_info"], strict=True)
    ]
    assert served == [lp.problem.id for lp in leased[0].problems] and len(served) == B

    keys = _rollout_rows(v1_trainer, prompts)
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{"status": "success", "seq_len": 4}] * len(keys))
    batch = upsample_batch_to_divisible_size(batch, 4, v1_trainer.tokenizer.eos_token_id)  # verl's padding rows
    assert len(batch) == 8 and batch.tags[-1]["is_padding"]  # 6 sessions + the 2nd turn + 1 padding row
    batch = trainer._compute_advantage(batch, metrics={})

    client = PriorityClient(ClientSettings(server=verl_setup.server.address), max_retries=0)
    stats = client.stats()
    # one reward per session: neither the second turn nor the padding row (a copy of the first prompt's
    # columns) counted; a third reward for a problem of G = 2 would have been refused
    assert (stats.completions_reported, stats.reward_sum) == (B * N_ROLLOUT, float(B))
    assert (stats.groups_mixed, stats.active_leases, stats.queue_depth) == (B, 0, 0)
    verl_client = {c.source: c for c in stats.clients}[pb.CLIENT_SOURCE_VERL]
    assert (verl_client.leases, verl_client.groups) == (1, B)
    # verl's GRPO ran after the report, on the same rows: right answers up, wrong ones down
    adv = {k: float(v1_trainer.store.rows[("train", k)]["advantages"][0]) for k in keys}
    assert all(a > 0 for k, a in adv.items() if k.split("_")[1] == "0")
    assert all(a < 0 for k, a in adv.items() if k.split("_")[1] == "1")
    client.close()


def test_verl_v1_sends_a_lease_split_over_updates_once_whole_and_the_rest_when_the_step_ends(v1_trainer, verl_setup, monkeypatch):
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    trainer = v1_trainer.trainer
    client = PriorityClient(ClientSettings(server=verl_setup.server.address), max_retries=0)

    def part(keys, uids, *prompts):
        """The rows of these prompts: what verl's replay buffer gives one update of parameter_sync_step > 1."""
        chosen = [k for k in keys if k.split("_")[0] in {uids[i] for i in prompts}]
        return KVBatchMeta(partition_id="train", keys=chosen, tags=[{"status": "success", "seq_len": 4}] * len(chosen))

    first = trainer._next_train_batch()  # lease 1: B = 3 problems
    keys = _rollout_rows(v1_trainer, first)
    trainer._compute_advantage(part(keys, first["uid"], 0), metrics={})
    stats = client.stats()
    assert (stats.completions_reported, stats.active_leases) == (0, 1)  # 2 of its 3 groups still to come
    trainer._compute_advantage(part(keys, first["uid"], 1, 2), metrics={})
    stats = client.stats()
    assert (stats.completions_reported, stats.groups_mixed, stats.active_leases) == (B * N_ROLLOUT, B, 0)

    second = trainer._next_train_batch()  # lease 2; prompt 2's group never comes (no trajectory reached verl)
    keys = _rollout_rows(v1_trainer, second)
    trainer._compute_advantage(part(keys, second["uid"], 0, 1), metrics={})
    assert client.stats().active_leases == 1
    monkeypatch.setattr(PPOTrainer, "step", lambda self, metrics, timing_raw: "verl's step")  # it needs Ray workers
    assert trainer.step({}, {}) == "verl's step"  # the step ended: the lease is sent, prompt 2 returned unchanged
    stats = client.stats()
    assert (stats.completions_reported, stats.groups_mixed, stats.active_leases) == ((B + 2) * N_ROLLOUT, B + 2, 0)
    verl_client = {c.source: c for c in stats.clients}[pb.CLIENT_SOURCE_VERL]
    assert (verl_client.leases, verl_client.groups) == (2, B + 2)
    client.close()


def test_the_v1_trainer_class_hooks_verls_current_trainer():
    import inspect

    from verl.trainer.ppo.v1 import PPOTrainer
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from prioreplay.integrations.verl import LeaseAndReport, PriorityPPOTrainerSync, priority_trainer_cls

    # the hooks exist under these names and signatures in this verl, and verl reads the loader it builds
    assert {"_init_dataloader", "_compute_advantage", "step", "_fetch_one_gen_batch"} <= set(vars(PPOTrainer))
    assert list(inspect.signature(PPOTrainer._compute_advantage).parameters) == ["self", "batch", "metrics"]
    assert list(inspect.signature(PPOTrainer.step).parameters) == ["self", "metrics", "timing_raw"]
    assert "self.train_dataloader" in inspect.getsource(PPOTrainer._fetch_one_gen_batch)
    assert {"sync", "colocate_async", "separate_async"} <= set(TRAINER_REGISTRY)
    for mode, base in TRAINER_REGISTRY.items():
        cls = priority_trainer_cls(mode)
        assert issubclass(cls, base) and cls is priority_trainer_cls(mode)
        assert (cls._init_dataloader, cls._compute_advantage, cls.step) == (
            LeaseAndReport._init_dataloader,
            LeaseAndReport._compute_advantage,
            LeaseAndReport.step,
        )
    assert PriorityPPOTrainerSync is priority_trainer_cls("sync")
    with pytest.raises(ValueError, match="Unknown trainer 'nope'"):
        priority_trainer_cls("nope")


def test_final_session_rows_keeps_the_last_output_of_each_session():
    from prioreplay.integrations.verl import final_session_rows

    keys = ["a-1_0_0", "a-1_0_1", "a-1_1_0", "pad9_0_0", "b_1_2", "b_1_0"]
    assert final_session_rows(keys) == [1, 2, 3, 4]
    with pytest.raises(InvalidArgument, match="is not '\\{uid\\}_\\{session_id\\}_\\{index\\}'"):
        final_session_rows(["no-index"])


def test_the_example_runner_makes_verls_task_runner_build_the_prioritized_trainer(monkeypatch):
    """examples/verl_ppo_prioritized.py: its Ray actor class is verl's TaskRunnerV1 whose run() finds
    the prioritized trainer where verl looks the trainer up (verl's run() itself needs Ray: stubbed)."""
    import importlib.util
    import inspect

    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from prioreplay.integrations.verl import priority_trainer_cls

    path = Path(__file__).parents[3] / "examples" / "verl_ppo_prioritized.py"
    spec = importlib.util.spec_from_file_location("verl_ppo_prioritized", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    verl_runner = TaskRunnerV1.__ray_actor_class__
    assert issubclass(example.PriorityTaskRunner.__ray_actor_class__, verl_runner)
    assert "get_trainer_cls(config.trainer.v1.trainer_mode)" in inspect.getsource(verl_runner.run)

    built = []
    monkeypatch.setitem(TRAINER_REGISTRY, "sync", TRAINER_REGISTRY["sync"])  # restored after the test
    monkeypatch.setattr(verl_runner, "run", lambda self, config: built.append(get_trainer_cls(config.trainer.v1.trainer_mode)))
    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}})
    example.PriorityTaskRunner.__ray_actor_class__.run(object.__new__(example.PriorityTaskRunner.__ray_actor_class__), config)
    assert built == [priority_trainer_cls("sync")]


def test_the_server_override_composes_with_verls_config_and_passes_its_validation():
    """``+prioreplay.server=HOST:PORT`` on verl's command line: composed by Hydra from verl's own config
    folder, accepted by verl's validate_config (which main_ppo runs first), at the path LeaseAndReport reads."""
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    overrides = [  # the smallest settings verl's validation accepts (sizes it checks against each other)
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "trainer.n_gpus_per_node=1",
        "+prioreplay.server=10.0.0.5:50051",
    ]
    with initialize_config_dir(str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert OmegaConf.select(config, "prioreplay.server") == "10.0.0.5:50051"
