"""The learner on 2 ranks (torchrun, gloo on the CPU, the tiny model) against an in-process server.

A 2-rank job is ``python -m torch.distributed.run --standalone --nproc-per-node 2 --no-python
prioreplay learner ...``: a real torchrun with real processes. The 1-rank side runs in this
process. Groups are the synthetic ones of ``test_learner.py``; two servers fed with the same
seed hold the same groups in the same order, so two jobs can train on the same data.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from prioreplay import checkpoint_reader
from prioreplay.learner import checkpoint as ckpt
from tests.system.learner import test_learner as tl

# torchrun jobs of 2 processes with torch: tens of seconds each; make test-fast leaves them out
pytestmark = pytest.mark.slow

PRIOREPLAY = str(Path(sys.executable).parent / "prioreplay")

#: Weights after the same steps on 2 ranks and on 1 agree to this (float32; the shards' gradients
#: are summed in another order than one process's micro-batches, and Adam divides by |g|).
ATOL, RTOL = 1e-6, 1e-5


def _flags(cfg) -> list[str]:
    """``prioreplay learner`` flags for the fields of a test LearnerConfig."""
    keys = (
        "server",
        "model",
        "checkpoint_dir",
        "batch_groups",
        "micro_batch_size",
        "parallelism",
        "lr",
        "max_staleness",
        "publish_every",
        "checkpoint_every",
        "keep_checkpoints",
        "metrics_port",
        "pull_wait_s",
        "batch_timeout_s",
        "consumer",
        "device",
        "seed",
        "max_steps",
        "log_file",
    )
    out = []
    for k in keys:
        if getattr(cfg, k) is not None:
            out += [f"--{k.replace('_', '-')}", str(getattr(cfg, k))]
    return out


def torchrun(cfg, ranks: int = 2, max_restarts: int = 0) -> subprocess.Popen:
    """Start ``prioreplay learner`` under torchrun with ``ranks`` processes (gloo, CPU), in its own
    process group, its output in ``CHECKPOINT_DIR/../torchrun.log``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.5",
        "--no-python",
        PRIOREPLAY,
        "learner",
        *_flags(cfg),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PRIOREPLAY_LOG_LEVEL": "INFO"}
    log = Path(cfg.checkpoint_dir).parent / "torchrun.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def finish(proc: subprocess.Popen, timeout: float = 180) -> str:
    """Wait for a torchrun job; on a timeout kill its whole process group. Returns its output.
    Raises AssertionError (with the output's end) unless it exited 0."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"torchrun still running after {timeout} s:\n{proc.log.read_text()[-4000:]}") from None
    out = proc.log.read_text()
    assert proc.returncode == 0, out[-4000:]
    return out


def feed_same(client, tiny_dir, n_groups: int) -> None:
    """The same n groups (ids, prompts, tokens, log-probs) as every other call."""
    tl._fed = 0
    tl.feed(client, tiny_dir, n_groups, seed=7)


def step_log(path) -> list[dict]:
    """The JSON lines of a learner's trained steps (rank 0 writes them for the job)."""
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if "grad_norm" in r]


def weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=rtol, msg=name)


@pytest.fixture
def servers():
    a, b = tl.ServerThread(), tl.ServerThread()
    yield a, b
    a.close()
    b.close()


def _client(server):
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    return PriorityClient(ClientSettings(server=server.address), max_retries=0)


def _one_rank_steps(cfg, steps: int):
    """``steps`` learner steps in this process (one rank), as ``prioreplay learner`` takes them."""
    from prioreplay.learner.learner import Learner

    learner = Learner(cfg.model_copy(update={"max_steps": steps}))
    learner.run()
    learner.client.close()
    return learner


def test_two_ranks_train_as_one_and_checkpoints_move_between_job_sizes(servers, tiny_dir, tmp_path):
    """Step 1 on 2 ranks gives the weights step 1 on 1 rank gives; a 2-rank checkpoint resumed on
    1 rank and a 1-rank checkpoint resumed on 2 ranks give the same step 2 (weights + Adam state)."""
    a, b = servers
    clients = [_client(a), _client(b)]
    for c in clients:
        feed_same(c, tiny_dir, 4)  # 2 steps of 2 groups (16 sequences): shards of 4, micro-batches of 3 + 1
    cfg_a = tl.make_config(a, tiny_dir, tmp_path / "a", lr=1e-3)
    cfg_b = tl.make_config(b, tiny_dir, tmp_path / "b", lr=1e-3)

    job = torchrun(cfg_a.model_copy(update={"max_steps": 1}))  # A: step 1 on 2 ranks ...
    _one_rank_steps(cfg_b, 1)  # B: step 1 on 1 rank (while A runs)
    finish(job)
    assert_same_weights(weights(tmp_path / "a/ckpt/step-1"), weights(tmp_path / "b/ckpt/step-1"))
    two, one = (step_log(tmp_path / name / "learner.jsonl")[0] for name in "ab")
    for key in ("loss", "pg_loss", "grad_norm", "sequences", "completion_tokens"):  # the full batch's figures
        assert two[key] == pytest.approx(one[key], rel=RTOL, abs=ATOL), key
    state = ckpt.load_trainer_state(tmp_path / "a/ckpt/step-1")
    assert len(state["trained_group_ids"]) == 2 and clients[0].stats().pending_groups == 0  # acked once, by rank 0

    job = torchrun(cfg_b.model_copy(update={"max_steps": 2}))  # B: step 2 on 2 ranks from the 1-rank step-1
    _one_rank_steps(cfg_a, 2)  # A: step 2 on 1 rank from the 2-rank step-1
    finish(job)
    assert_same_weights(weights(tmp_path / "a/ckpt/step-2"), weights(tmp_path / "b/ckpt/step-2"))
    for name, c in zip("ab", clients, strict=True):
        assert checkpoint_reader.latest_complete(tmp_path / name / "ckpt") == tmp_path / name / "ckpt/step-2"
        assert c.stats().pending_groups == 0 and c.stats().policy_version == 2
        c.close()


#: FSDP2 on 2 ranks against one process: the gradient is reduce-scattered (summed in another order
#: than one process's micro-batches) and the weights are all-gathered for each forward; float32.
FSDP_ATOL, FSDP_RTOL = 1e-6, 1e-5


def test_fsdp_on_two_ranks_trains_as_one_and_checkpoints_move_between_job_sizes(servers, tiny_dir, tmp_path):
    """``--parallelism fsdp`` (FSDP2, gloo on the CPU): step 1 sharded over 2 ranks gives the
    weights step 1 on 1 rank gives; the sharded job's checkpoint (gathered to the one-process
    format) resumed on 1 rank, and a 1-rank checkpoint resumed sharded on 2 ranks, give the same
    step 2 (weights and Adam state, which step 2's update depends on)."""
    a, b = servers
    clients = [_client(a), _client(b)]
    for c in clients:
        feed_same(c, tiny_dir, 4)  # 2 steps of 2 groups (16 sequences): shards of 4, micro-batches of 3 + 1
    cfg_a = tl.make_config(a, tiny_dir, tmp_path / "a", lr=1e-3, parallelism="fsdp")
    cfg_b = tl.make_config(b, tiny_dir, tmp_path / "b", lr=1e-3, parallelism="fsdp")

    job = torchrun(cfg_a.model_copy(update={"max_steps": 1}))  # A: step 1 sharded on 2 ranks ...
    _one_rank_steps(cfg_b, 1)  # B: step 1 on 1 rank (the setting is ignored in one process)
    finish(job)
    one_step = [weights(tmp_path / name / "ckpt/step-1") for name in "ab"]
    assert_same_weights(*one_step, atol=FSDP_ATOL, rtol=FSDP_RTOL)
    base = weights(tiny_dir)
    assert any(not torch.equal(one_step[0][k], base[k]) for k in base)  # it trained
    published = weights(tmp_path / "a/ckpt/published/v-1")
    assert published.keys() == one_step[0].keys()  # the published version too: whole, tied aliases once
    state = ckpt.load_trainer_state(tmp_path / "a/ckpt/step-1")
    assert sorted(state["optimizer"]["state"]) == list(range(len(state["optimizer"]["state"])))  # one-process format
    assert len(state["trained_group_ids"]) == 2 and clients[0].stats().pending_groups == 0

    job = torchrun(cfg_b.model_copy(update={"max_steps": 2}))  # B: step 2 sharded on 2 ranks from the 1-rank step-1
    _one_rank_steps(cfg_a, 2)  # A: step 2 on 1 rank from the sharded step-1
    finish(job)
    assert_same_weights(weights(tmp_path / "a/ckpt/step-2"), weights(tmp_path / "b/ckpt/step-2"), atol=FSDP_ATOL, rtol=FSDP_RTOL)
    for c in clients:
        assert c.stats().pending_groups == 0 and c.stats().policy_version == 2
        c.close()


def _rank_pid(job: subprocess.Popen, rank: int, timeout: float = 60) -> int:
    """The pid of the process of global rank ``rank`` among torchrun's children (read from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split():
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(child)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} under torchrun {job.pid}")


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_a_rank_killed_mid_step_restarts_the_job_and_no_group_is_lost_or_trained_twice(servers, tiny_dir, tmp_path):
    """SIGKILL rank 1 in step 4, after step 3 trained (held, not checkpointed): torchrun restarts
    both ranks, they resume from step-2, and rank 0 gets step 3's groups back: every group is
    trained into the surviving checkpoints exactly once, and acknowledged."""
    server = servers[0]
    client = _client(server)
    feed_same(client, tiny_dir, 6)  # 3 steps of 2 groups; step 4 waits for more
    cfg = tl.make_config(
        server, tiny_dir, tmp_path, checkpoint_every=2, keep_checkpoints=10, max_steps=4, max_staleness=8, log_file=None
    )
    job = torchrun(cfg, max_restarts=1)
    _wait_for(tmp_path / "ckpt/published/v-3")  # step 3 trained and published; the next checkpoint is step 4's
    assert client.stats().pending_groups == 2  # step 3's groups: held, unacknowledged
    os.kill(_rank_pid(job, 1), 9)  # rank 1 dies while both ranks are in step 4
    tl.feed(client, tiny_dir, 2, versions=[3, 3], seed=8)  # step 4's groups, generated by version 3
    out = finish(job, timeout=150)
    assert "resumed from" in out, out[-3000:]  # the restarted ranks resumed from a checkpoint

    # the surviving lineage: each checkpoint lists the groups trained since the one before
    # (step-2 before the kill, step-4 after the restart)
    steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "ckpt").glob("step-*"))
    assert steps[0] == 2 and steps[-1] == 4, steps
    trained = [i for s in steps for i in ckpt.load_trainer_state(tmp_path / f"ckpt/step-{s}")["trained_group_ids"]]
    assert len(trained) == len(set(trained)) == 8  # none trained twice, none missing
    stats = client.stats()
    assert stats.pending_groups == 0 and stats.queue_depth == 0  # every group acknowledged
    client.close()
