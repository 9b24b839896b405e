"""Part 5: what the TRL integration adds to a GRPOTrainer step (target: < 1% of the step).

The same tiny model, data, seed and settings train with TRL's own sampling (``GRPOTrainer``) and
with problems from a priority server (``PriorityGRPOTrainer``; ``prioreplay server --store memory``
in its own process as a user runs it, gRPC over loopback), alternating the arms over ``repeats``
runs. Two measures:

* **direct share** (the figure the target is checked on): seconds the integration spends per run —
  leasing batches (SampleProblems, in the dataloader) plus ``report`` (buffering and ReportOutcomes,
  inside the reward function) — over the run's ``train_runtime``. Both come from the same run, so
  load on a shared machine moves them together far less than it moves two separate runs.
* **A/B step time**: ``train_runtime / steps`` of each arm, paired by repeat. Noisy on a shared
  machine; reported beside the direct share, never used alone.

Beside them, the latency of bare SampleProblems(B) and rewards-only ReportOutcomes calls against
the same server with no training running (``rpc_rounds`` round trips): what the calls cost when
they do not wait for a CPU.

The tiny model makes a step short (milliseconds of compute), so the share is an upper bound for a
real model, whose steps are longer while the integration's RPCs stay the same size.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class IntegrationParams:
    """Sizes of one measurement (a TRL step: ``batch`` completions = batch / group_size problems)."""

    steps: int = 10  # optimizer steps per run
    repeats: int = 3  # runs per arm, arms alternating
    problems: int = 64  # rows of the dataset
    batch: int = 8  # per_device_train_batch_size: completions per step
    group_size: int = 4  # num_generations G
    completion_tokens: int = 16  # max_completion_length
    server: str = "subprocess"  # "subprocess": `prioreplay server` in its own process; "inprocess": a thread
    rpc_rounds: int = 300  # bare SampleProblems + ReportOutcomes round trips


QUICK = IntegrationParams(
    steps=1, repeats=1, problems=8, batch=4, group_size=2, completion_tokens=4, server="inprocess", rpc_rounds=20
)


def bare_rpc_ms(address: str, params: IntegrationParams) -> dict[str, float]:
    """p50 / p90 of SampleProblems(B) and a rewards-only ReportOutcomes of its G rewards per problem, ms."""
    import time

    import numpy as np

    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.v1 import priority_service_pb2 as pb

    b, g = params.batch // params.group_size, params.group_size
    sample_s, report_s = [], []
    with PriorityClient(ClientSettings(server=address)) as client:
        client.register(pb.Problem(id=f"rpc-{i}", prompt="x", answer="y") for i in range(4 * b))
        for _ in range(params.rpc_rounds):
            t0 = time.perf_counter()
            lease = client.sample(b, client_source=pb.CLIENT_SOURCE_TRL)
            t1 = time.perf_counter()
            outcomes = [
                pb.ProblemOutcome(problem_id=lp.problem.id, completions=[pb.Completion(reward=float(k % 2)) for k in range(g)])
                for lp in lease.problems
            ]
            client.report(lease.lease_id, outcomes, client_source=pb.CLIENT_SOURCE_TRL, rewards_only=True)
            sample_s.append(t1 - t0)
            report_s.append(time.perf_counter() - t1)
    q = lambda x, p: float(np.percentile(np.asarray(x) * 1000, p))  # noqa: E731
    return {
        "sample_p50": q(sample_s, 50),
        "sample_p90": q(sample_s, 90),
        "report_p50": q(report_s, 50),
        "report_p90": q(report_s, 90),
    }


@contextlib.contextmanager
def _server(kind: str) -> Iterator[str]:
    """A memory-store priority server for the block; yields its address."""
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store

    if kind == "inprocess":
        cfg = ServerConfig(store="memory", metrics_port=0, snapshot_interval_s=0)
        with BackgroundServer(lambda: create_store("memory", cfg.to_store_config()), cfg) as srv:
            yield srv.address
        return
    from prioreplay.channel import free_port

    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prioreplay.apps.cli",
            "server",
            "--store",
            "memory",
            "--port",
            address.rsplit(":", 1)[1],
            "--metrics-port",
            "0",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with PriorityClient(ClientSettings(server=address)) as client:
            client.wait_ready(60.0)
        yield address
    finally:
        proc.terminate()
        proc.wait(30)


def _correct(completions, answer, **kwargs):
    found = [re.search(r"-?\d+", c) for c in completions]
    return [float(m is not None and m.group() == a) for m, a in zip(found, answer, strict=True)]


def _run_arm(arm: str, params: IntegrationParams, model_dir: str, server: str, out_dir: Path) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from prioreplay.integrations.trl import PriorityGRPOTrainer

    data = Dataset.from_dict(
        {
            "prompt": [f"What is {i} + {i}?" for i in range(params.problems)],
            "answer": [str(2 * i) for i in range(params.problems)],
        }
    )
    args = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=params.steps,
        per_device_train_batch_size=params.batch,
        num_generations=params.group_size,
        max_completion_length=params.completion_tokens,
        save_strategy="no",
        logging_steps=params.steps,
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    if arm == "trl":
        trainer = GRPOTrainer(model=model_dir, reward_funcs=_correct, args=args, train_dataset=data)
    else:
        trainer = PriorityGRPOTrainer(
            model=model_dir, reward_funcs=_correct, args=args, train_dataset=data, priority_server=server
        )
    runtime = float(trainer.train().metrics["train_runtime"])
    row: dict[str, Any] = {"arm": arm, "runtime_s": runtime, "step_s": runtime / params.steps}
    if arm == "prioreplay":
        c = trainer.priority.sampler.counters  # type: ignore[attr-defined]  # attribute added by prioreplay.integrations.trl.attach
        row.update(
            lease_s=c["lease_s"], report_s=c["report_s"], rpc_s=c["rpc_s"], leases=int(c["leases"]), groups=int(c["groups"])
        )
    return row


def run_trl_overhead(
    params: IntegrationParams = IntegrationParams(), progress: Callable[[str], None] = lambda m: None
) -> dict[str, Any]:
    """Measure both arms; returns the per-run rows and the summary (see the module docstring).

    Returns:
        {"params", "runs": [...], "share", "lease_ms_per_step", "report_ms_per_step",
        "step_s": {arm: median}, "step_ratio": {"mean", "min", "max"} (prioreplay / trl, paired),
        "bare_rpc_ms": {"sample_p50", "sample_p90", "report_p50", "report_p90"}}.
    """
    from prioreplay.tiny_model import make_tiny_model

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prioreplay-bench-trl-") as tmp, _server(params.server) as address:
        model_dir = str(make_tiny_model(Path(tmp) / "model", seed=0))
        for r in range(params.repeats):
            for arm in ("trl", "prioreplay") if r % 2 == 0 else ("prioreplay", "trl"):
                row = _run_arm(arm, params, model_dir, address, Path(tmp) / f"{arm}-{r}")
                row["repeat"] = r
                runs.append(row)
                progress(f"integration: repeat {r} {arm}: {row['step_s']:.3f} s/step")
        rpc = bare_rpc_ms(address, params)
    pri = [x for x in runs if x["arm"] == "prioreplay"]
    spent = sum(x["lease_s"] + x["report_s"] for x in pri)
    steps = params.steps * len(pri)
    by_repeat = {(x["repeat"], x["arm"]): x["step_s"] for x in runs}
    ratios = [by_repeat[(r, "prioreplay")] / by_repeat[(r, "trl")] for r in range(params.repeats)]
    return {
        "params": asdict(params),
        "runs": runs,
        "share": spent / sum(x["runtime_s"] for x in pri),
        "lease_ms_per_step": 1000 * sum(x["lease_s"] for x in pri) / steps,
        "report_ms_per_step": 1000 * sum(x["report_s"] for x in pri) / steps,
        "step_s": {arm: statistics.median(x["step_s"] for x in runs if x["arm"] == arm) for arm in ("trl", "prioreplay")},
        "step_ratio": {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)},
        "bare_rpc_ms": rpc,
    }
