"""Faults with real processes, the learner's share: a ``prioreplay learner`` SIGKILLed between a
step and its checkpoint, or between a pull and its acknowledgement, trains every group once after
its restart and gets its unacknowledged groups back.

The worker, the server and Redis killed: test_process_kills.py. Here the server is a real
``prioreplay server`` process and the learner the real ``prioreplay learner`` with the tiny random
model.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.v1 import priority_service_pb2 as pb
from tests.conftest import REPO, ServerProcess
from tests.system.faults.test_process_kills import wait_for


# -- the learner killed between pull and acknowledge ---------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from prioreplay.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _feed(client: PriorityClient, start: int, n: int, rng: random.Random) -> None:
    """Register n problems, lease them and report one mixed group each (tokens of the tiny vocab)."""
    client.register([pb.Problem(id=f"q{start + i}", prompt=f"{i} + 1", answer="1") for i in range(n)])
    lease = client.sample(n, lease_timeout_s=60)
    assert len(lease.problems) == n
    outs = []
    for lp in lease.problems:
        comps = [
            pb.Completion(
                reward=r, token_ids=[rng.randrange(5, 60) for _ in range(6)], logprobs=[-rng.uniform(1.0, 4.0) for _ in range(6)]
            )
            for r in (1.0, 0.0, 1.0, 0.0)
        ]
        outs.append(pb.ProblemOutcome(problem_id=lp.problem.id, prompt_token_ids=[4, 10, 11, 12, 3], completions=comps))
    assert client.report(lease.lease_id, outs).groups_queued == n


def _learner(address: str, tiny_dir: Path, tmp_path: Path, max_steps: int, *extra: str) -> subprocess.Popen:
    args = [
        "--server",
        address,
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--batch-groups",
        "2",
        "--micro-batch-size",
        "8",
        "--batch-timeout-s",
        "120",
        "--pull-wait-s",
        "0.5",
        "--consumer",
        "L",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--max-steps",
        str(max_steps),
        "--metrics-port",
        "0",
        "--log-file",
        str(tmp_path / "learner.jsonl"),
        "--lr",
        "1e-3",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "prioreplay.apps.cli", "learner", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
    )


class VersionWatcher(threading.Thread):
    """Polls the server's policy version; records every value seen."""

    def __init__(self, address: str):
        super().__init__(daemon=True)
        self.client = PriorityClient(ClientSettings(server=address), max_retries=5)
        self.seen: list[int] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.seen.append(self.client.stats().policy_version)
            time.sleep(0.05)
        self.client.close()


def _lines(path: Path) -> list[dict]:
    """The learner log's step lines (not the run's end line)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [x for x in lines if "step" in x]


@pytest.mark.timeout(300)
def test_learner_killed_between_step_and_checkpoint_trains_every_group_after_restart(tiny_dir, tmp_path):
    """publish_every = checkpoint_every = 3; SIGKILL after steps 1 and 2 (trained, not checkpointed).

    Acknowledging deletes a group, so the groups of steps 1 and 2 must still be pending at the
    server: the restarted learner (no checkpoint yet: it starts from the base model) gets them
    back and trains every one.
    """
    srv = ServerProcess("--redelivery-timeout-s", "3600")  # only include_own_pending can give them back
    learner = None
    rng = random.Random(17)
    log_file = tmp_path / "learner.jsonl"
    every = ("--publish-every", "3", "--checkpoint-every", "3")
    try:
        srv.start()
        client = PriorityClient(ClientSettings(server=srv.address), max_retries=5)
        _feed(client, 0, 2, rng)
        learner = _learner(srv.address, tiny_dir, tmp_path, 3, *every)
        wait_for(lambda: len(_lines(log_file)) == 1 or learner.poll() is not None, 120, "step 1")
        _feed(client, 2, 2, rng)
        wait_for(lambda: len(_lines(log_file)) == 2 or learner.poll() is not None, 120, "step 2")
        learner.kill()  # after two optimizer steps, before the checkpoint of step 3
        out1, _ = learner.communicate(timeout=30)
        assert learner.returncode == -signal.SIGKILL, out1
        s = client.stats()
        assert (s.groups_acked, s.pending_groups, s.policy_version) == (0, 4, 0), out1  # nothing deleted
        assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").glob("step-*"))

        learner = _learner(srv.address, tiny_dir, tmp_path, 3, *every)
        wait_for(lambda: len(_lines(log_file)) == 4 or learner.poll() is not None, 120, "the 4 groups again")
        _feed(client, 4, 2, rng)
        out2, _ = learner.communicate(timeout=120)
        assert learner.returncode == 0, out2
        again = _lines(log_file)[2:]
        assert [x["step"] for x in again] == [1, 2, 3]  # recomputed from the base model
        assert [x["groups_used"] for x in again] == [2, 2, 2]  # every group trained
        assert [x["checkpointed"] for x in again] == [False, False, True]
        s = client.stats()
        assert (s.groups_mixed, s.groups_acked, s.pending_groups, s.queue_depth) == (6, 6, 0, 0)
        assert s.policy_version == 3 and (tmp_path / "ckpt" / "step-3").is_dir()
    finally:
        if learner is not None and learner.poll() is None:
            learner.kill()
            learner.wait(10)
        srv.kill()


@pytest.mark.timeout(240)
def test_learner_killed_between_pull_and_ack_resumes_and_gets_its_groups(tiny_dir, tmp_path):
    # only include_own_pending can give them back
    srv = ServerProcess("--decay", "1", "--redelivery-timeout-s", "3600")
    learner = watcher = None
    rng = random.Random(13)
    try:
        srv.start()
        client = PriorityClient(ClientSettings(server=srv.address), max_retries=5)
        watcher = VersionWatcher(srv.address)
        watcher.start()
        _feed(client, 0, 2, rng)
        learner = _learner(srv.address, tiny_dir, tmp_path, 5, "--checkpoint-every", "1")
        wait_for(lambda: client.stats().policy_version == 1 or learner.poll() is not None, 120, "step 1")
        _feed(client, 2, 1, rng)  # the learner pulls it and waits for a second group
        wait_for(lambda: client.stats().pending_groups == 1, 60, "the pull")
        learner.kill()  # between pull and ack
        out1, _ = learner.communicate(timeout=30)
        assert learner.returncode == -signal.SIGKILL, out1
        s = client.stats()
        assert (s.groups_acked, s.pending_groups, s.policy_version) == (2, 1, 1)

        learner = _learner(srv.address, tiny_dir, tmp_path, 2, "--checkpoint-every", "1")
        time.sleep(0.5)
        _feed(client, 3, 1, rng)
        out2, _ = learner.communicate(timeout=120)
        assert learner.returncode == 0, out2
        assert "resumed from" in out2 and "step-1" in out2
        s = client.stats()
        # every group reached the learner and was acknowledged exactly once (4 queued, 4 acked)
        assert (s.groups_mixed, s.groups_acked, s.pending_groups, s.queue_depth) == (4, 4, 0, 0)
        assert s.policy_version == 2
        lines = [json.loads(x) for x in (tmp_path / "learner.jsonl").read_text().splitlines()]
        steps = [x for x in lines if "step" in x]  # and the run's end line
        assert [x["step"] for x in steps] == [1, 2] and steps[1]["groups_used"] == 2
    finally:
        if learner is not None and learner.poll() is None:
            learner.kill()
            learner.wait(10)
        if watcher is not None:
            watcher.stop_flag.set()
            watcher.join(10)
        srv.kill()
    assert watcher.seen and watcher.seen == sorted(watcher.seen)  # the version never went backwards
    assert watcher.seen[-1] == 2
