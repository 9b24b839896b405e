"""Part 4: the priority service's share of a training step, from a ``prioreplay demo`` run directory.

Target: time in priority RPCs < 1% of the worker's and of the learner's step time.

``worker_idle_share`` (``python -m benchmarks.overhead worker-idle``) measures the other side of the
worker: the share of its wall time in which the backend is not generating (leasing, reloading,
verifying, reporting while the engine waits), pipelined (the default) and ``--no-pipeline`` side
by side. Target: <= 2% pipelined.

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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
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


# -- worker_idle_share: the share of a worker's wall time its backend does not generate ---------
#: Figure names in results.json: the pipelined worker (the default) and --no-pipeline.
IDLE_FIGURES = {True: "overhead.worker_idle_share", False: "overhead.worker_idle_share_sequential"}


@dataclass(frozen=True)
class IdleParams:
    """One worker run of :func:`worker_idle_run` (CPU, transformers backend, in-process server).

    Attributes:
        model: ``tiny`` (the random test model, written to a temporary directory) or any model
            :func:`prioreplay.models.resolve_model` resolves (e.g. ``smollm2-135m``).
        batches: leases generated and reported per run (the first lease and the last report
            cannot overlap anything, so fewer batches weigh them more).
        batch_size / group_size / max_new_tokens: B, G and the completion length, tokens.
        verifier: the problems' verifier (``math``: math-verify in its process pool; ``gsm8k``).
        problems: arithmetic problems registered (``arithmetic:N:0``).
    """

    model: str = "tiny"
    batches: int = 10
    batch_size: int = 8
    group_size: int = 8
    max_new_tokens: int = 96
    verifier: str = "math"
    problems: int = 256


def _timed_generate(backend: Any) -> list[tuple[float, float]]:
    """Wrap ``backend.generate`` so that each call's (start, end) ``perf_counter`` seconds are
    appended to the returned list."""
    inner = backend.generate
    spans: list[tuple[float, float]] = []

    def generate(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spans.append((t0, time.perf_counter()))

    backend.generate = generate
    return spans


def worker_idle_run(backend: Any, address: str, params: IdleParams, pipeline: bool, worker_id: str) -> dict[str, float]:
    """Run one worker for ``params.batches`` leases against the server at ``address``.

    Returns:
        ``wall_s`` (seconds in ``RolloutWorker.run``, the first lease and the last report
        included), ``generate_s`` (seconds inside the backend's ``generate``), ``idle_s`` =
        wall − generate, ``share`` = idle / wall (the figure), ``share_to_last_generate``: the
        same up to the end of the last ``generate`` (without the final verify-and-report, which
        a worker that keeps running overlaps with its next batch), ``batches``, ``completions``.
    """
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.rollout_worker.config import WorkerConfig
    from prioreplay.rollout_worker.worker import RolloutWorker

    p = params
    cfg = WorkerConfig(
        server=address,
        group_size=p.group_size,
        batch_size=p.batch_size,
        max_new_tokens=p.max_new_tokens,
        max_batches=p.batches,
        pipeline=pipeline,
        worker_id=worker_id,
        metrics_port=0,
    )
    spans = _timed_generate(backend)
    with PriorityClient(ClientSettings(server=address)) as client:
        worker = RolloutWorker(cfg, backend, client)
        t0 = time.perf_counter()
        worker.run()
        wall = time.perf_counter() - t0
        completions = worker.metrics.registry.get_sample_value("prioreplay_worker_completions_total") or 0.0
    del backend.generate  # back to the class's method
    gen = sum(b - a for a, b in spans)
    to_last = spans[-1][1] - t0 if spans else wall
    return {
        "wall_s": wall,
        "generate_s": gen,
        "idle_s": wall - gen,
        "share": (wall - gen) / wall,
        "share_to_last_generate": (to_last - gen) / to_last,
        "batches": len(spans),
        "completions": completions,
    }


def worker_idle_share(params: IdleParams, repeats: int = 3, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The share of worker wall time in which the backend is not generating, pipelined and
    sequential (``--no-pipeline``), side by side: ``repeats`` paired runs, the two modes
    alternating (sequential first in odd pairs), one model and one in-process memory-store server.

    Returns:
        ``{"pipelined": {...}, "sequential": {...}, "params": {...}}``; each mode has ``share``
        (the mean over runs), ``share_lo``/``share_hi`` (its 95% Student-t interval,
        :func:`prioreplay.intervals.mean_interval`), ``runs`` (every run's figures) and
        ``completions_per_s`` (completions / wall seconds, mean); ``share_to_last_generate``
        with its interval likewise (:func:`worker_idle_run`).
    """
    import tempfile

    from prioreplay import models
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.convert import problem_to_proto
    from prioreplay.datasets import iter_problems
    from prioreplay.intervals import mean_interval
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
    from prioreplay.tiny_model import make_tiny_model

    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
        model_dir = make_tiny_model(Path(tmp) / "tiny") if params.model == "tiny" else models.resolve_model(params.model)
        backend = TransformersBackend(model_dir, device="cpu")
        problems = [replace(p, verifier=params.verifier) for p in iter_problems(f"arithmetic:{params.problems}:0")]
        with PriorityClient(ClientSettings(server=srv.address)) as client:
            client.register(problem_to_proto(p) for p in problems)
        for r in range(repeats):
            for pipeline in (False, True) if r % 2 == 0 else (True, False):
                out = worker_idle_run(backend, srv.address, params, pipeline, worker_id=f"bench-{r}-{int(pipeline)}")
                runs[pipeline].append(out)
                if progress:
                    progress(f"worker_idle_share: run {r} {'pipelined' if pipeline else 'sequential'}: {json.dumps(out)}")
    summary: dict[str, Any] = {"params": asdict(params), "repeats": repeats}
    for pipeline, name in ((True, "pipelined"), (False, "sequential")):
        m, lo, hi = mean_interval([x["share"] for x in runs[pipeline]])
        m2, lo2, hi2 = mean_interval([x["share_to_last_generate"] for x in runs[pipeline]])
        rate = sum(x["completions"] / x["wall_s"] for x in runs[pipeline]) / len(runs[pipeline])
        summary[name] = {
            "share": m,
            "share_lo": lo,
            "share_hi": hi,
            "share_to_last_generate": m2,
            "share_to_last_generate_lo": lo2,
            "share_to_last_generate_hi": hi2,
            "completions_per_s": rate,
            "runs": runs[pipeline],
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.overhead worker-idle [...]``: measure :func:`worker_idle_share` and
    write ``overhead.worker_idle_share`` (pipelined) and ``overhead.worker_idle_share_sequential``
    into results.json (``--out``; default: print only)."""
    import argparse
    import os
    import sys

    from benchmarks.results import Results, merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=main.__doc__)
    ap.add_argument("part", choices=["worker-idle"])
    ap.add_argument("--repeats", type=int, default=3, help="paired runs (sequential and pipelined) of the worker")
    for f in fields(IdleParams):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--note", default="", help="measurement conditions (recorded), e.g. the load average")
    ap.add_argument("--out", default=None, help="results.json to merge the figures into (default: print only)")
    a = ap.parse_args(argv)
    params = IdleParams(**{f.name: getattr(a, f.name) for f in fields(IdleParams)})
    load = os.getloadavg()
    out = worker_idle_share(params, a.repeats, progress=lambda m: print(m, file=sys.stderr, flush=True))
    out["load_avg_1_5_15"] = [round(x, 2) for x in (*load, *os.getloadavg())]  # before, after
    res = Results("python -m benchmarks.overhead " + " ".join(argv if argv is not None else sys.argv[1:]), note=a.note)
    for pipeline, name in IDLE_FIGURES.items():
        mode = out["pipelined" if pipeline else "sequential"]
        extra = {k: v for k, v in mode.items() if k != "share"}
        res.add(name, mode["share"], "fraction", params=out["params"], load_avg=out["load_avg_1_5_15"], **extra)
    print(json.dumps(out, indent=1))
    if a.out:
        merge_results(Path(a.out), res.items)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
