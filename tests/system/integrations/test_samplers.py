"""Every server sampler through every integration (torch, TRL, verl): served correctly, or refused.

For each sampler of the registry (``SAMPLERS``) a real in-process server leases to each adapter.
The torch loop declares ``accepts_group_size`` and generates each problem's own group size (a
screening probe is a smaller group), so it runs every sampler; TRL and verl generate one G for
every prompt, so a sampler with probes is refused with FAILED_PRECONDITION naming the sampler and
the alternative. Every adapter sends the sampling temperature and top-p with each group.

Fast stand-ins where the adapter allows: the torch loop and verl's reporter get rewards written by
the test (no model; verl's ``DataProto`` is a namespace with the same fields); TRL's adapter is
built on a real ``GRPOTrainer`` with the tiny random model, and its wrapped reward function is
called as TRL calls it on one generation batch, without generating.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import FailedPrecondition
from prioreplay.integrations.torch import PrioritySampler
from prioreplay.priority_server.samplers import SAMPLERS
from prioreplay.priority_server.samplers.knapsack import MIN_GROUP_SIZE
from prioreplay.tiny_model import make_tiny_model
from prioreplay.v1 import priority_service_pb2 as pb

ROWS = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(12)]
B, G, STEPS = 3, 4, 6
PROBING = sorted(n for n, s in SAMPLERS.items() if s.probes)
FIXED_G = sorted(n for n, s in SAMPLERS.items() if not s.probes)


def _reward(row: int, k: int) -> float:
    """Completion k of row ``row``: right for rows 0-3 always, never for 4-7, every other one for 8-11
    (so the pools fill and the retests run)."""
    return 1.0 if row < 4 else 0.0 if row < 8 else float(k % 2 == 0)


def _server(memory_server, name: str):
    return memory_server(sampler=name, retest_fraction=0.34, retest_interval=1, seed=3)


def _spy_reports(sampler: PrioritySampler) -> list[pb.ProblemOutcome]:
    """Every outcome the sampler's client reports, in order."""
    sent: list[pb.ProblemOutcome] = []
    report = sampler.client.report_lease

    def spy(lease_id, outcomes, *args, **kwargs):
        sent.extend(outcomes)
        return report(lease_id, outcomes, *args, **kwargs)

    sampler.client.report_lease = spy  # type: ignore[method-assign]  # a test spy
    return sent


def _stats(server) -> pb.GetStatsResponse:
    with PriorityClient(ClientSettings(server=server.address), max_retries=0) as c:
        return c.stats()


def _groups(st: pb.GetStatsResponse) -> int:
    return st.groups_mixed + st.groups_all_correct + st.groups_all_wrong + st.groups_constant


# -- torch ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_a_torch_loop_runs_every_sampler_with_each_problems_group_size(memory_server, name):
    server = _server(memory_server, name)
    sizes: list[int] = []
    with PrioritySampler(
        ROWS, server=server.address, batch_size=B, group_size=G, num_batches=STEPS, temperature=0.7, top_p=0.9
    ) as s:
        sent = _spy_reports(s)
        it = iter(s)
        for _ in range(STEPS):
            for row in [next(it) for _ in range(B)]:
                g = s.group_size_of(row)
                sizes.append(g)
                s.report([row] * g, [_reward(row, k) for k in range(g)])
        assert s.outstanding == {}
    st = _stats(server)
    assert (st.completions_reported, _groups(st), st.active_leases) == (sum(sizes), len(sizes), 0)
    assert {(o.sampling_temperature, o.sampling_top_p) for o in sent} == {(0.7, 0.9)}
    if name == "knapsack":  # a group size per problem from the token budget (mean 8, within [2, 32])
        assert all(MIN_GROUP_SIZE <= g <= 32 for g in sizes)
    elif name in PROBING:  # every problem is new: the first batches are probes of probe_size (2) < G
        assert sizes[:B] == [2] * B and G in sizes
    else:
        assert set(sizes) == {G}


# -- TRL --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def _trl_trainer(tiny_model: str, out, server):
    from trl import GRPOConfig

    from prioreplay.integrations.trl import PriorityGRPOTrainer

    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=B * G,  # one generation batch = B problems × G completions
        num_generations=G,
        max_completion_length=4,
        temperature=0.6,
        top_p=0.8,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    return PriorityGRPOTrainer(
        model=tiny_model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(ROWS),
        priority_server=server.address,
    )


@pytest.mark.slow  # TRL's import and a GRPOTrainer per sampler: about 2 s each
@pytest.mark.parametrize("name", FIXED_G)
def test_trl_serves_every_sampler_without_probes_and_sends_its_sampling(memory_server, tiny_model, tmp_path, name):
    server = _server(memory_server, name)
    trainer = _trl_trainer(tiny_model, tmp_path, server)
    s = trainer.priority.sampler
    sent = _spy_reports(s)
    reward = trainer.reward_funcs[0]
    trainer.model.train()
    it = iter(s)
    for _ in range(3):  # three generation batches, scored as TRL's _calculate_rewards calls the function
        rows = [trainer.train_dataset[next(it)] for _ in range(B * G)]
        assert [r["prioreplay_id"] for r in rows[::G]] == [r["prioreplay_id"] for r in rows[G - 1 :: G]]
        reward(
            prompts=[r["prompt"] for r in rows], completions=["x"] * len(rows), prioreplay_id=[r["prioreplay_id"] for r in rows]
        )
    st = _stats(server)
    assert (st.completions_reported, _groups(st), st.active_leases) == (3 * B * G, 3 * B, 0)
    assert {(o.sampling_temperature, o.sampling_top_p) for o in sent} == {(0.6, 0.8)}


@pytest.mark.slow
@pytest.mark.parametrize("name", PROBING)
def test_trl_refuses_a_sampler_with_probes_naming_it_and_the_alternative(memory_server, tiny_model, tmp_path, name):
    server = _server(memory_server, name)
    trainer = _trl_trainer(tiny_model, tmp_path, server)
    with pytest.raises(FailedPrecondition, match=rf"sampler '{name}'.*trl integration.*--sampler heap"):
        next(iter(trainer.priority.sampler))
    assert _stats(server).active_leases == 0


# -- verl -------------------------------------------------------------------------------------------
VERL_ROWS = [
    {
        "data_source": "add",
        "prompt": [{"role": "user", "content": r["prompt"]}],
        "reward_model": {"ground_truth": r["answer"]},
        "extra_info": {"index": i},
    }
    for i, r in enumerate(ROWS)
]


def _verl_sampler(server) -> PrioritySampler:
    from omegaconf import OmegaConf

    from prioreplay.integrations.verl import make_train_sampler

    config = OmegaConf.create(
        {
            "data": {"train_batch_size": B, "dataloader_num_workers": 0, "prompt_key": "prompt"},
            "actor_rollout_ref": {"rollout": {"n": G, "temperature": 0.8, "top_p": 0.95}},
        }
    )
    return make_train_sampler(config, SimpleNamespace(dataframe=Dataset.from_list(VERL_ROWS)), server.address)


def _verl_batch(step: int, rows: list[int]) -> SimpleNamespace:
    """A scored verl batch as ``RayPPOTrainer.fit`` has it: each prompt's G samples share a uid (new each step);
    the sequence reward sits on the last of 3 response tokens of ``token_level_scores`` (N, 3)."""
    samples = [(r, k) for r in rows for k in range(G)]
    scores = torch.zeros(len(samples), 3)
    scores[:, -1] = torch.tensor([_reward(r, k) for r, k in samples])
    ntb = {
        "uid": np.array([f"{step}-{r}" for r, _ in samples], dtype=object),
        "data_source": np.array(["add"] * len(samples), dtype=object),
        "extra_info": np.array([{"index": r} for r, _ in samples], dtype=object),
    }
    return SimpleNamespace(non_tensor_batch=ntb, batch={"token_level_scores": scores})


@pytest.mark.parametrize("name", FIXED_G)
def test_verl_serves_every_sampler_without_probes_and_sends_its_sampling(memory_server, name):
    from prioreplay.integrations.verl import RewardReporter

    server = _server(memory_server, name)
    with _verl_sampler(server) as s:
        sent = _spy_reports(s)
        reporter, it, steps = RewardReporter(s), iter(s), len(ROWS) // B  # one epoch of verl's dataloader
        for step in range(steps):
            assert reporter.report(_verl_batch(step, [next(it) for _ in range(B)])) == B
        assert s.outstanding == {}
    st = _stats(server)
    assert (st.completions_reported, _groups(st), st.active_leases) == (steps * B * G, steps * B, 0)
    assert {(o.sampling_temperature, o.sampling_top_p) for o in sent} == {(0.8, 0.95)}


@pytest.mark.parametrize("name", PROBING)
def test_verl_refuses_a_sampler_with_probes_naming_it_and_the_alternative(memory_server, name):
    server = _server(memory_server, name)
    with (
        _verl_sampler(server) as s,
        pytest.raises(FailedPrecondition, match=rf"sampler '{name}'.*verl integration.*--sampler heap"),
    ):
        next(iter(s))
    assert _stats(server).active_leases == 0
