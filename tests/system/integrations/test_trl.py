"""TRL end to end: the real GRPOTrainer on CPU with a tiny model, problems from a real priority server.

Every knob is turned down: a 2-layer random Llama (no download), B = 2 problems × G = 2 completions
of at most 4 tokens per step, a few steps. The checks compare what TRL generated and scored with
the leases the server granted and the statistics it kept.
"""

from __future__ import annotations

import difflib
import json
import runpy
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from trl import GRPOConfig

from prioreplay.apps import cli
from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.integrations.trl import STATE_FILE, PriorityGRPOTrainer, attach
from prioreplay.tiny_model import make_tiny_model
from prioreplay.v1 import priority_service_pb2 as pb
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # TRL's import and real training steps: tens of seconds

ROWS = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(11)]
B, G = 2, 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def _args(out: Path, max_steps: int) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=B * G,
        num_generations=G,  # B problems a step
        max_completion_length=4,
        max_steps=max_steps,
        save_steps=2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )


class Recorder:
    """A reward function: 1, 0, 1, 0 ... per completion (every group mixed); records each call's prompts."""

    __name__ = "alternating"

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, prompts, completions, **kwargs):
        assert "prioreplay_id" not in kwargs  # the id column never reaches the user's function
        self.calls.append(list(prompts))
        return [float(i % 2 == 0) for i in range(len(completions))]


def _seed_priorities(client: PriorityClient, ids: list[str]) -> None:
    """Row j gets a reported group of 22 rewards with j correct: priority (j/22)(1 − j/22), so the
    heap's order is rows 10, 9, 8, ... (row 0, all wrong, goes to the unsolved pool)."""
    lease = client.sample(len(ids))
    row = {pid: j for j, pid in enumerate(ids)}
    outcomes = [
        pb.ProblemOutcome(
            problem_id=lp.problem.id, completions=[pb.Completion(reward=float(k < row[lp.problem.id])) for k in range(22)]
        )
        for lp in lease.problems
    ]
    assert client.report(lease.lease_id, outcomes).accepted


def _spy_on_leases(trainer) -> list[list[int]]:
    """Record every SampleProblems answer of the trainer's sampler as dataset rows, in order."""
    sampler, leases = trainer.priority.sampler, []
    sample = sampler.client.sample

    def spy(*args, **kwargs):
        resp = sample(*args, **kwargs)
        leases.append([sampler.index_of[lp.problem.id] for lp in resp.problems])
        return resp

    sampler.client.sample = spy
    return leases


def _rows_served(recorder: Recorder) -> list[list[int]]:
    """The rows of each scored generation batch (one entry per group of G completions)."""
    return [[ROWS.index(next(r for r in ROWS if r["prompt"] == p)) for p in call[::G]] for call in recorder.calls]


def test_grpo_trains_on_the_servers_problems_counts_each_group_once_and_resumes(memory_server, tiny_model, tmp_path, capsys):
    server = memory_server(retest_fraction=0.0, seed=5)  # no retests: every lease is the heap's top
    client = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    rewards = Recorder()
    trainer = PriorityGRPOTrainer(
        model=tiny_model,
        reward_funcs=rewards,
        args=_args(tmp_path, 3),
        train_dataset=Dataset.from_list(ROWS),
        priority_server=server.address,
    )
    _seed_priorities(client, trainer.priority.sampler.table.ids)
    seeded = client.stats()
    leases = _spy_on_leases(trainer)
    trainer.train()

    # -- the served order is the server's: TRL scored exactly the leased problems, lease by lease ------
    served = _rows_served(rewards)
    assert len(served) == trainer.priority.reported_calls == 3
    assert served == [leases[0], leases[1], leases[2]]
    assert leases[0] == [10, 9] and leases[1] == [8, 7]  # the top of the seeded priorities
    # rows 10 and 9, reported mixed (11/24 and 10/24 correct), stay above every free row: leased again
    assert leases[2] == [10, 9]
    assert len(leases) == 4  # + the batch TRL's dataloader prefetched and never scored

    # -- every group reported exactly once; the prefetched lease went back unchanged ------------------
    after = client.stats()
    assert after.completions_reported - seeded.completions_reported == 3 * B * G
    assert after.groups_mixed - seeded.groups_mixed == 3 * B
    assert (after.active_leases, after.leased, after.late_reports) == (0, 0, 0)
    assert after.queue_depth == seeded.queue_depth  # rewards only: no learner queue fills up
    saved = json.loads((tmp_path / "checkpoint-2" / STATE_FILE).read_text())
    assert [lease["problem_ids"] for lease in saved["leases"]] == [
        [trainer.priority.sampler.problem_id(i) for i in leases[2]]
    ]  # at step 2, lease 3 was prefetched

    # -- a new trainer resumes from checkpoint-2: it returns lease 3 (which the first run reported
    #    after the checkpoint: refused, so counted once) and trains steps 3 and 4 on new leases ---------
    rewards2 = Recorder()
    resumed = PriorityGRPOTrainer(
        model=tiny_model,
        reward_funcs=rewards2,
        args=_args(tmp_path, 4),
        train_dataset=Dataset.from_list(ROWS),
        priority_server=server.address,
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.priority.reported_calls == len(rewards2.calls) == 2
    final = client.stats()
    assert final.completions_reported - seeded.completions_reported == (3 + 2) * B * G
    assert (final.late_reports, final.active_leases, final.leased) == (1, 0, 0)
    trl = {c.source: c for c in final.clients}[pb.CLIENT_SOURCE_TRL]
    assert (trl.groups, trl.completions, trl.late_reports) == (5 * B, 5 * B * G, 1)

    # -- prioreplay stats shows it ----------------------------------------------------------------------
    assert cli.main(["stats", "--server", server.address]) == 0
    out = capsys.readouterr().out
    assert f"trl          leases 6, problems 12, groups {5 * B} (mixed {5 * B}), completions {5 * B * G}" in out
    client.close()


def test_the_example_script_differs_from_plain_trl_in_three_lines_and_trains_on_the_server(
    memory_server, tiny_model, tmp_path, monkeypatch
):
    plain = (REPO / "examples" / "trl_grpo.py").read_text().splitlines()
    prioritized = (REPO / "examples" / "trl_grpo_prioritized.py").read_text().splitlines()
    diff = [
        d
        for d in difflib.unified_diff(plain, prioritized, lineterm="", n=0)
        if d[:1] in "+-" and not d.startswith(("+++", "---")) and d[1:].strip()
    ]
    assert len([d for d in diff if d[0] == "+"]) <= 5 and len([d for d in diff if d[0] == "-"]) <= 5, diff

    server = memory_server()
    monkeypatch.setenv("PRIOREPLAY_SERVER", server.address)  # the script names no server: the environment does
    monkeypatch.setattr(sys, "argv", ["trl_grpo_prioritized.py", tiny_model, str(tmp_path / "run"), "1"])
    runpy.run_path(str(REPO / "examples" / "trl_grpo_prioritized.py"), run_name="__main__")
    stats = PriorityClient(ClientSettings(server=server.address)).stats()
    # the script's batch: 8 completions = 2 problems × G = 4, one step
    assert (stats.problems, stats.completions_reported, stats.active_leases) == (400, 8, 0)
    assert [c.source for c in stats.clients] == [pb.CLIENT_SOURCE_TRL]


def test_reward_plugins_in_reward_funcs_train_and_the_reported_one_sends_its_pass_flags(memory_server, tiny_model, tmp_path):
    """The example plugins go into reward_funcs as PluginReward (docs/REWARDS.md): TRL trains with
    both, and the reported one's pass flags travel with its rewards (``Completion.passed``)."""
    from examples.rewards import answer_format, correct_number
    from prioreplay.rewards import PluginReward

    server = memory_server()
    correct = PluginReward(correct_number)
    trainer = PriorityGRPOTrainer(
        model=tiny_model,
        reward_funcs=[correct, PluginReward(answer_format)],
        args=_args(tmp_path, 2),
        train_dataset=Dataset.from_list(ROWS),
        priority_server=server.address,
    )
    sent: list[pb.ProblemOutcome] = []
    client = trainer.priority.sampler.client
    report_lease = client.report_lease
    client.report_lease = lambda lease_id, outcomes, **kw: (sent.extend(outcomes), report_lease(lease_id, outcomes, **kw))[1]
    trainer.train()
    completions = [c for o in sent for c in o.completions]
    assert len(completions) == 2 * B * G and len(correct.last_passed) == B * G  # 2 steps of B groups of G
    assert all(c.HasField("passed") and c.passed == (c.reward == 1.0) for c in completions)


def test_attach_refuses_what_it_cannot_serve(memory_server, tiny_model, tmp_path):
    from trl import GRPOTrainer

    server = memory_server()
    dataset = Dataset.from_list(ROWS)
    args = _args(tmp_path, 1)
    args.remove_unused_columns = True
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=Recorder(), args=args, train_dataset=dataset)
    with pytest.raises(InvalidArgument, match="remove_unused_columns=True would drop"):
        attach(trainer, server.address)
    trainer.args.remove_unused_columns = False
    with pytest.raises(InvalidArgument, match="reward 'accuracy' is not a reward function"):
        attach(trainer, server.address, reward="accuracy")


def test_the_compare_script_summarizes_each_arm_over_its_runs(tmp_path, capsys):
    compare = runpy.run_path(str(REPO / "examples" / "compare_trl_runs.py"))
    dirs: dict[str, list[str]] = {"trl": [], "prioreplay": []}
    for arm, zero_std in (("trl", 0.8), ("prioreplay", 0.4)):
        for seed in range(2):
            d = tmp_path / f"{arm}-{seed}"
            d.mkdir()
            history = [{"step": i, "frac_reward_zero_std": zero_std, "reward": 0.1 * i} for i in range(1, 11)]
            history.append({"step": 10, "eval_reward": 0.3 + 0.1 * seed})
            (d / "trainer_state.json").write_text(json.dumps({"log_history": history}))
            dirs[arm].append(str(d))
    assert compare["main"](["--trl", *dirs["trl"], "--prioreplay", *dirs["prioreplay"]]) == 0
    lines = {tuple(line.split()[:2]): line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines[("effective_group_fraction", "trl")] == "0.200"
    assert lines[("effective_group_fraction", "prioreplay")] == "0.600"
    assert lines[("final_reward", "trl")] == "0.950"  # the last fifth: steps 9 and 10
    assert lines[("eval_reward", "prioreplay")] == "0.350"
    with pytest.raises(FileNotFoundError, match="save_state"):
        compare["run_metrics"](tmp_path)
