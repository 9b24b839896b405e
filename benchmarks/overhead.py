"""Part 4: the priority service's share of a training step, from a ``prioreplay demo`` run directory.

Target: time in priority RPCs < 1% of the worker's and of the learner's step time.

Sources (written by ``prioreplay demo``):

* Worker: ``report.json`` → ``worker_metrics`` → per worker the summed Prometheus samples of its
  ``/metrics`` (last scrape). RPC time is ``prioreplay_worker_rpc_seconds_sum`` (all methods);
  step time is the sum of the worker's phases: ``prioreplay_worker_generation_seconds_sum`` +
  ``prioreplay_worker_verification_seconds_sum`` + ``prioreplay_worker_weight_reload_seconds_sum``
  + the RPC time.
* Learner: ``learner.jsonl``, one JSON line per optimizer step with ``rpc_s`` (seconds in the
  step's priority RPCs other than PullTrajectories: acknowledgements, publishing, stats),
  ``pull_s`` (seconds in PullTrajectories, which long-poll until workers have produced groups,
  so they measure starvation, not service cost) and the phases ``wait_s`` + ``compute_s`` +
  ``publish_s`` + ``checkpoint_s`` (the step time; lines before the checkpoint split lack the last). The
  overhead share is ``rpc_s`` / step time; ``pull_s`` is
  reported beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORKER_PHASES = (
    "prioreplay_worker_generation_seconds_sum",
    "prioreplay_worker_verification_seconds_sum",
    "prioreplay_worker_weight_reload_seconds_sum",
)
WORKER_RPC = "prioreplay_worker_rpc_seconds_sum"


def worker_share(report: dict[str, Any]) -> dict[str, float] | None:
    """RPC seconds / step seconds summed over the workers of a run report (None if no data)."""
    metrics = report.get("worker_metrics") or {}
    rpc = sum(float(m.get(WORKER_RPC, 0.0)) for m in metrics.values())
    other = sum(float(m.get(k, 0.0)) for m in metrics.values() for k in WORKER_PHASES)
    if rpc + other <= 0:
        return None
    return {"rpc_s": rpc, "step_s": rpc + other, "share": rpc / (rpc + other), "workers": len(metrics)}


def learner_share(lines: list[dict[str, Any]]) -> dict[str, float] | None:
    """RPC seconds / step seconds over the learner's step records.

    Returns None when no step has ``rpc_s``, or when the log predates ``pull_s`` (its ``rpc_s``
    counted the long-polling pulls, so it cannot give the overhead).
    """
    steps = [r for r in lines if "step" in r and r.get("rpc_s") is not None]
    if not steps:
        return None
    if any("pull_s" not in r for r in steps):
        return None  # an older learner log: its rpc_s includes the long-polling pulls
    rpc = sum(float(r["rpc_s"]) for r in steps)
    pull = sum(float(r["pull_s"]) for r in steps)
    step = sum(float(r.get(k) or 0.0) for r in steps for k in ("wait_s", "compute_s", "publish_s", "checkpoint_s"))
    compute = sum(float(r.get("compute_s") or 0.0) for r in steps)
    return {
        "rpc_s": rpc,
        "pull_s": pull,
        "step_s": step,
        "share": rpc / step if step > 0 else float("nan"),
        "compute_s": compute,
        "share_of_compute": rpc / compute if compute > 0 else float("nan"),
        "steps": len(steps),
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (lines that do not parse are skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def rpc_share(run_dir: str | Path) -> dict[str, Any]:
    """The worker's and learner's RPC share of step time for a demo run directory.

    Returns:
        {"run_dir", "worker": {...} | None, "learner": {...} | None}; each part has ``rpc_s``,
        ``step_s`` (seconds, summed over the run) and ``share`` (a fraction, target < 0.01).

    Raises:
        FileNotFoundError: neither ``report.json`` nor ``learner.jsonl`` exists in ``run_dir``.
    """
    d = Path(run_dir)
    report_path, learner_path = d / "report.json", d / "learner.jsonl"
    if not report_path.is_file() and not learner_path.is_file():
        raise FileNotFoundError(f"{d} holds neither report.json nor learner.jsonl; pass a `prioreplay demo` run directory")
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    lines = read_jsonl(learner_path) if learner_path.is_file() else []
    return {"run_dir": str(d), "worker": worker_share(report), "learner": learner_share(lines)}
