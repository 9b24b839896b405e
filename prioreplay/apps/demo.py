"""``prioreplay demo``: the whole system on one machine, then a run report.

This module is the run's phases, in order: read the dataset through (before anything is written),
start the priority server, register the problems, score a held-out slice, start W rollout workers
and the learner as separate processes (the same commands a deployment runs), follow the learner's
steps with a progress bar until the budget, stop the children, score the slice again with the final
policy, audit the pools, and write ``report.json`` and ``report.png`` into the run directory, with
``outcomes.jsonl``: every reported group's rewards (:mod:`~prioreplay.apps.demo_report`: what the
report holds, its summary lines). The child processes are :mod:`~prioreplay.apps.demo_children`
(logs in ``RUN_DIR/logs/``; a stop the demo asks for is a normal end); what the run keeps on disk
is :mod:`~prioreplay.apps.demo_disk`. Ctrl-C or a crashed child stops every child; the demo then
exits non-zero and prints the failing child's log tail.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prioreplay.apps.demo_children import Child, ChildFailed, Children
from prioreplay.apps.demo_config import (
    DemoConfig,
    DemoRunSettings,
    namespace_for,
    resolve_worker_python,
    worker_list_flags,
    worker_seed,
)
from prioreplay.apps.demo_curve import CurveKeeper, curve_points
from prioreplay.apps.demo_disk import disk_line, disk_usage, drop_trainer_state, prune_published
from prioreplay.apps.demo_report import (
    OUTCOMES_FILE,
    OUTCOMES_PART,
    collect_outcomes,
    held_out_summary,
    scrape_served,
    token_totals,
    write_report,
)
from prioreplay.channel import free_port
from prioreplay.errors import PrioreplayError
from prioreplay.process import setup_logging
from prioreplay.reporting import Reporter

log = logging.getLogger("prioreplay.apps.demo")
HIST_BUCKETS = 20


@dataclass
class Demo:
    """The bookkeeping of one demo run: its settings, child processes, recorded steps and reporters."""

    cfg: DemoConfig
    run_dir: Path
    children: Children = field(init=False)
    steps: list[dict[str, Any]] = field(default_factory=list)
    namespace: str = ""
    t0: float = 0.0
    reporter: Reporter = field(default_factory=Reporter)  # --report-to: TensorBoard / wandb
    worker_python: str = sys.executable  # --worker-python / vLLM's environment (resolve_worker_python)
    eval_problems: list = field(default_factory=list)  # the held-out slice (read_datasets)

    def __post_init__(self) -> None:
        self.children = Children(self.run_dir)


def _threads(cfg: DemoConfig) -> int:
    if cfg.threads:
        return cfg.threads
    return max(1, (os.cpu_count() or 2) // (cfg.workers + 1))


def _record_step(demo: Demo, step: int, stats, prev, learner_line: dict[str, Any]) -> dict[str, Any]:
    groups = stats.groups_mixed + stats.groups_all_correct + stats.groups_all_wrong + stats.groups_constant
    pgroups = prev["groups"] if prev else 0
    pmixed = prev["groups_mixed"] if prev else 0
    pcomp = prev["completions"] if prev else 0
    preward = prev["reward_sum"] if prev else 0.0
    dg, dc = groups - pgroups, stats.completions_reported - pcomp
    rec = {
        "step": step,
        "time_s": round(time.time() - demo.t0, 2),
        "heap": stats.heap_size,
        "solved": stats.solved,
        "unsolved": stats.unsolved,
        "leased": stats.leased,
        "unseen": stats.unseen,
        "policy_version": stats.policy_version,
        "priority_histogram": list(stats.priority_histogram),
        "priority_bucket_edges": list(stats.priority_bucket_edges),
        "groups": groups,
        "groups_mixed": stats.groups_mixed,
        "completions": stats.completions_reported,
        "reward_sum": stats.reward_sum,
        "effective_group_fraction_window": (stats.groups_mixed - pmixed) / dg if dg else None,
        "mean_reward_window": (stats.reward_sum - preward) / dc if dc else None,
        "forgetting_events": stats.forgetting_events,
        "breakthroughs": stats.breakthroughs,
        "learner": learner_line,
    }
    demo.steps.append(rec)
    return rec


def _evaluate(cfg: DemoConfig, model_dir: Path, weights_dir: Path | None, problems, label: str) -> list[bool] | None:
    """Per-problem greedy correctness on the held-out slice (None when there is none), with a
    progress bar named ``label``."""
    if not problems:
        return None
    from prioreplay.apps.evaluate import evaluate_each

    return evaluate_each(
        model_dir, problems, weights_dir=weights_dir, max_new_tokens=cfg.max_new_tokens, stop=cfg.stop, progress=label
    )


def run(cfg: DemoConfig) -> int:
    """Run the demo; returns the exit code (0 when every child finished cleanly)."""
    setup_logging("INFO")
    worker_python = resolve_worker_python(cfg)  # InvalidArgument (exit 2, the fix) before any work
    eval_problems = read_datasets(cfg)  # a malformed line ends here, with its file:line, before anything is written
    name = f"{cfg.sampler}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run_dir) if cfg.run_dir else Path("runs") / name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    demo = Demo(cfg, run_dir, worker_python=worker_python, eval_problems=eval_problems)
    demo.t0 = time.time()

    def _on_sigterm(signum, frame):  # children run in their own sessions: stop them like on Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(demo, run_dir.name)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time: it is bounded (demo_children)
        print("\ninterrupted: stopping every child", file=sys.stderr)
        demo.children.stop_all()
        return 130
    except ChildFailed as e:
        demo.children.stop_all()
        print(f"prioreplay demo: {e}", file=sys.stderr)
        return 1
    finally:
        demo.children.stop_all()
        demo.reporter.close()
        signal.signal(signal.SIGTERM, previous)  # compare runs one arm in its own process


def _run(demo: Demo, name: str) -> int:
    """The demo's phases, in order; each child it starts is stopped by :func:`run`."""
    from prioreplay.checkpoint_reader import latest_complete
    from prioreplay.models import resolve_model
    from prioreplay.reporting import open_reporter

    cfg = demo.cfg
    log.info("resolving model %s", cfg.model)
    model_dir = resolve_model(cfg.model)  # converted once, before any child needs it
    demo.reporter = open_reporter(cfg.report_to, demo.run_dir, name, json.loads(cfg.model_dump_json()))
    server, client = _start_server(demo)
    _register_dataset(demo, client)
    eval_problems = demo.eval_problems
    log.info("scoring %d held-out problems before training", len(eval_problems))
    right_before = _evaluate(cfg, model_dir, None, eval_problems, "held-out, before")
    learner, workers = _start_trainers(demo, client.settings.server, model_dir)
    keeper = _curve_keeper(demo)
    worker_metrics = _follow_learner(demo, client, learner, workers, keeper)
    final, server_metrics = _stop_children(demo, client, server, workers, worker_metrics)
    groups_recorded = collect_outcomes(demo.run_dir, cfg.sampler, cfg.seed)
    prune_published(demo.run_dir)
    final_ckpt = latest_complete(demo.run_dir / "checkpoints")
    log.info("scoring %d held-out problems with the final policy (%s)", len(eval_problems), final_ckpt)
    right_after = _evaluate(cfg, model_dir, final_ckpt, eval_problems, "held-out, after")
    curve = keeper.score(lambda w: _evaluate(cfg, model_dir, w, eval_problems, f"held-out, {w.name}")) if keeper else []
    pool_audit = _pool_audit(demo, model_dir, final_ckpt)
    report = _report(
        demo,
        name,
        final,
        len(eval_problems),
        held_out_summary(right_before, right_after),
        final_ckpt,
        worker_metrics,
        server_metrics,
    )
    held = {k: report.get(k) for k in ("accuracy_before", "accuracy_after", "accuracy_change")}
    demo.reporter.scalars("eval", held, demo.steps[-1]["step"] if demo.steps else 0)
    report["pool_audit"] = pool_audit
    if keeper:
        spent = report["tokens"].get("completion_tokens") or 0
        report["heldout_curve"] = curve_points(right_before, curve, right_after, final.completions_reported, spent)
    report["outcomes"] = {"file": OUTCOMES_FILE, "groups": groups_recorded}
    _keep(demo, report)
    write_report(demo.run_dir, report, final)
    return 0


def _keep(demo: Demo, report: dict[str, Any]) -> None:
    """Once the report is scored: drop the trainer state unless ``--keep-trainer-state`` (then the
    final weights are the newest published version's), and record and log what the run keeps."""
    kept = demo.cfg.keep_trainer_state
    if not kept and drop_trainer_state(demo.run_dir):
        report["final_checkpoint"] = None
    report["disk"] = disk_usage(demo.run_dir, kept)
    published = report["disk"]["published"]
    report["final_weights"] = str(demo.run_dir / "checkpoints" / "published" / published[-1]) if published else None
    log.info("%s", disk_line(demo.run_dir, report["disk"]))


def _curve_keeper(demo: Demo) -> CurveKeeper | None:
    """The keeper of ``--eval-points`` versions, by the run's budget (None when off or unbudgeted)."""
    cfg = demo.cfg
    budget = cfg.rollouts or cfg.completion_tokens
    return CurveKeeper(demo.run_dir, float(budget), cfg.eval_points) if cfg.eval_points and budget else None


def _pool_audit(demo: Demo, model_dir: Path, final_ckpt: Path | None) -> dict[str, Any]:
    """Score the pooled problems with the final policy (:mod:`prioreplay.apps.pool_audit`); a run
    on Redis or with ``--no-pool-audit`` gets ``{"skipped": reason}``."""
    from prioreplay.apps.pool_audit import audit

    cfg = demo.cfg
    if not cfg.pool_audit:
        return {"skipped": "--no-pool-audit"}
    if cfg.redis_url:
        return {"skipped": "the audit reads the memory store's snapshot; this run used Redis"}
    log.info("pool audit: scoring the pooled problems with the final policy (G = %d)", cfg.group_size)
    return audit(
        model_dir,
        final_ckpt,
        demo.run_dir / "server-snapshot.json",
        group_size=cfg.group_size,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        stop=cfg.stop,
        seed=cfg.seed + 2,
        progress="pool audit",
    )


#: Seconds the learner gets to finish its step after the budget is reached (its ``--stop-grace-s``), and
#: the workers to finish and report their batch (their ``--batch-grace-s``, 30 s, and a vLLM engine's
#: shutdown): both then abandon the work (nothing is lost but it).
LEARNER_STOP_S, WORKER_STOP_S = 60.0, 45.0

#: Seconds a superseded published version stays for a worker still loading it (the learner's
#: default is 300 s; a demo's worker reloads within one lease, and a version it misses is refused
#: cleanly, the worker keeping its weights).
DEMO_PUBLISH_GRACE_S = 60.0


def _start_server(demo: Demo) -> tuple[Child, Any]:
    """Start the priority server child and wait until it answers. Returns (child, client)."""
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    cfg, run_dir = demo.cfg, demo.run_dir
    port, mport = free_port(), free_port()
    demo.namespace = namespace_for(run_dir)  # a fresh store namespace per run
    server_args = [
        "server",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--metrics-port",
        str(mport),
        "--sampler",
        cfg.sampler,
        "--retest-fraction",
        str(cfg.retest_fraction),
        "--retest-interval",
        str(cfg.retest_interval),
        "--retest-versions",
        str(cfg.retest_versions),
        *(["--queue-zero-variance"] if cfg.queue_zero_variance else []),
        *_flags(pace_batches=cfg.pace_batches, pace_batch_groups=cfg.batch_groups),  # the learner's batch until it pulls
        "--pool-evidence",
        str(cfg.pool_evidence),
        f"--age-decay={cfg.age_decay}",
        f"--heap-age-decay={cfg.heap_age_decay}",
        f"--unseen-prior={cfg.unseen_prior}",
        *(["--warm-start", cfg.warm_start, "--warm-start-shrink", str(cfg.warm_start_shrink)] if cfg.warm_start else []),
        "--seed",
        str(cfg.seed),
        "--namespace",
        demo.namespace,
        "--log-level",
        cfg.log_level,
    ]
    if cfg.redis_url:
        server_args += ["--store", cfg.redis_url]
    else:
        server_args += ["--store", "memory", "--snapshot-path", str(run_dir / "server-snapshot.json")]
    server = demo.children.spawn("server", server_args, mport, threads=1)
    address = f"127.0.0.1:{port}"
    client = PriorityClient(ClientSettings(server=address))
    deadline = time.time() + 60
    while True:
        demo.children.check()
        try:
            client.wait_ready(timeout_s=1.0)
            return server, client
        except PrioreplayError:
            if time.time() > deadline:
                raise ChildFailed(f"server did not answer on {address} within 60 s:\n{server.tail()}") from None


def read_datasets(cfg: DemoRunSettings) -> list:
    """Read the training set through once (streamed, not kept) and take the held-out slice (empty
    when eval_size is 0), before the run writes anything: a malformed line stops the demo with its
    ``file:line`` (exit 2) instead of a gRPC error in the middle of registration.

    Raises:
        InvalidArgument: a missing file or malformed content (:func:`prioreplay.datasets.iter_problems`).
    """
    from prioreplay.datasets import evaluation_slice, iter_problems

    count = sum(1 for _ in iter_problems(cfg.dataset))
    log.info("dataset %s: %d problems", cfg.dataset, count)
    if not cfg.eval_size:
        return []
    return evaluation_slice(cfg.eval_dataset or cfg.dataset, cfg.eval_size, seed=cfg.seed + 1)


def _register_dataset(demo: Demo, client) -> None:
    """Register the training problems (read and checked by :func:`read_datasets`)."""
    from prioreplay.convert import problem_to_proto
    from prioreplay.datasets import iter_problems

    cfg = demo.cfg
    resp = client.register(problem_to_proto(p) for p in iter_problems(cfg.dataset))
    log.info("registered %d problems from %s", resp.total, cfg.dataset)


#: The demo's settings that go to the learner and to every worker unchanged, as flags of the same name.
LEARNER_SETTINGS = ("batch_groups", "lr", "max_staleness", "off_policy_correction", "correction_cap", "kl_coef", "publish_every")
WORKER_SETTINGS = ("backend", "dtype", "group_size", "batch_size", "max_new_tokens", "temperature")


def _flags(**values: object) -> list[str]:
    """``--kebab-case value`` pairs of a child's command line, in the order given."""
    return [a for name, value in values.items() for a in (f"--{name.replace('_', '-')}", str(value))]


def _learner_args(cfg: DemoConfig, run_dir: Path, address: str, model_dir: Path, port: int) -> list[str]:
    """The ``prioreplay learner`` command line of a demo run."""
    return [
        "learner",
        *(["--train-zero-variance"] if cfg.train_zero_variance else []),
        *_flags(
            server=address,
            model=model_dir,
            checkpoint_dir=run_dir / "checkpoints",
            **{name: getattr(cfg, name) for name in LEARNER_SETTINGS},
            max_steps=cfg.steps,
            # disk: a published version of SmolLM2 is ~0.5 GB and a checkpoint with its optimizer state
            # ~1.6 GB; a demo run keeps only what it reports on (see _prune_run)
            keep_checkpoints=1,
            publish_grace_s=DEMO_PUBLISH_GRACE_S,
            stop_grace_s=LEARNER_STOP_S,
            log_file=run_dir / "learner.jsonl",
            metrics_port=port,
            seed=cfg.seed,
            log_level=cfg.log_level,
        ),
    ]


def _worker_args(cfg: DemoConfig, w: int, address: str, model_dir: Path, port: int, run_dir: Path) -> list[str]:
    """The ``prioreplay worker`` command line of the demo's worker ``w``."""
    return [
        "worker",
        *_flags(
            server=address,
            outcomes_file=run_dir / f"{OUTCOMES_PART}{w}.jsonl",
            model=model_dir,
            **{name: getattr(cfg, name) for name in WORKER_SETTINGS},
            seed=worker_seed(cfg.seed, w),
            worker_id=f"worker-{w}",
            metrics_port=port,
            log_level=cfg.log_level,
        ),
        *worker_list_flags(cfg),
    ]


def _start_trainers(demo: Demo, address: str, model_dir: Path) -> tuple[Child, list[Child]]:
    """Start the learner and the W workers; returns (learner, workers)."""
    cfg, run_dir = demo.cfg, demo.run_dir
    threads = _threads(cfg)
    lport = free_port()
    learner = demo.children.spawn("learner", _learner_args(cfg, run_dir, address, model_dir, lport), lport, threads)
    learner.may_exit = True  # at its step limit (--steps)
    workers = []
    for w in range(cfg.workers):
        wport = free_port()
        args = _worker_args(cfg, w, address, model_dir, wport, run_dir)
        workers.append(demo.children.spawn(f"worker-{w}", args, wport, threads, python=demo.worker_python))
    return learner, workers


def _follow_learner(
    demo: Demo, client, learner: Child, workers: list[Child], keeper: CurveKeeper | None = None
) -> dict[str, dict[str, float]]:
    """Record a step (server stats) per line of the learner's log until it exits; show a progress
    bar. Returns each worker's latest /metrics scrape."""
    from tqdm import tqdm

    cfg = demo.cfg
    learner_log = demo.run_dir / "learner.jsonl"
    prev, seen_lines = None, 0
    # the run ends on the rollout budget when there is one: the bar counts what ends it
    by_rollouts = bool(cfg.rollouts)
    bar = tqdm(
        total=cfg.rollouts if by_rollouts else cfg.steps,
        desc="rollouts" if by_rollouts else "learner steps",
        unit="rollout" if by_rollouts else "step",
        dynamic_ncols=True,
    )
    last_metrics: dict[str, dict[str, float]] = {}
    while True:
        demo.children.check()
        for c in workers:  # before the steps: each step records the workers' token counts of now
            last_metrics[c.name] = demo.children.scrape(c) or last_metrics.get(c.name, {})
        lines = learner_log.read_text().splitlines() if learner_log.exists() else []
        for rec in step_lines(lines[seen_lines:]):
            prev = _record_step(demo, int(rec["step"]), client.stats(histogram_buckets=HIST_BUCKETS), prev, rec)
            prev.update(token_totals(last_metrics))
            demo.reporter.demo_step(prev)
            if not by_rollouts:
                bar.update(max(0, prev["step"] - bar.n))
            bar.set_postfix_str(_progress(prev))
        seen_lines = len(lines)
        if learner.proc.poll() is not None:
            break
        done = client.stats(histogram_buckets=1).completions_reported
        tokens = token_totals(last_metrics)["completion_tokens"]
        if keeper:
            keeper.observe(done if cfg.rollouts else tokens, done, tokens)
        if by_rollouts:
            bar.update(max(0, min(done, cfg.rollouts) - bar.n))
            if done >= cfg.rollouts:
                bar.close()  # before the stop, which logs
                _end_at_budget(demo, client, learner, workers, last_metrics)
                break
        if cfg.completion_tokens and tokens >= cfg.completion_tokens:
            bar.close()
            _end_at_budget(demo, client, learner, workers, last_metrics)
            break
        if time.time() - demo.t0 > cfg.timeout_s:
            raise ChildFailed(f"the run passed its time limit ({cfg.timeout_s:.0f} s); learner log tail:\n{learner.tail()}")
        time.sleep(1.0)
    bar.close()
    why = learner.failure()
    if why is not None:
        raise ChildFailed(why)
    return last_metrics


def _end_at_budget(demo: Demo, client, learner: Child, workers: list[Child], last_metrics: dict) -> None:
    """The rollout or token budget is spent: stop the workers (no more reports), then the learner
    (it finishes or abandons its step within ``--stop-grace-s``, checkpoints and exits 0: a normal
    end, :class:`~prioreplay.apps.demo_children.Child`); record the last server state as a step."""
    budgets = [f"{demo.cfg.rollouts} completions"] if demo.cfg.rollouts else []
    budgets += [f"{demo.cfg.completion_tokens} completion tokens"] if demo.cfg.completion_tokens else []
    log.info("budget reached (%s): stopping workers and learner", " or ".join(budgets))
    for c in workers:
        last_metrics[c.name] = demo.children.scrape(c) or last_metrics.get(c.name, {})
    demo.children.stop_all(WORKER_STOP_S, workers)
    demo.children.stop(learner, grace_s=LEARNER_STOP_S + 15.0)


def step_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The learner log's JSON lines that record a step (partial or other lines are skipped)."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in rec:
            out.append(rec)
    return out


def _progress(r: dict[str, Any]) -> str:
    eff, rew = r["effective_group_fraction_window"], r["mean_reward_window"]
    return (
        f"eff={'-' if eff is None else f'{eff:.2f}'} reward={'-' if rew is None else f'{rew:.2f}'} "
        f"heap={r['heap']} solved={r['solved']} unsolved={r['unsolved']} v={r['policy_version']} step={r['step']}"
    )


def _stop_children(demo: Demo, client, server: Child, workers: list[Child], worker_metrics: dict[str, dict[str, float]]):
    """Scrape and stop the workers, read the final server state, stop the server.
    Returns (final GetStats response, the server's /metrics)."""
    for c in workers:
        worker_metrics[c.name] = demo.children.scrape(c) or worker_metrics.get(c.name, {})
    demo.children.stop_all(WORKER_STOP_S, workers)
    final = client.stats(histogram_buckets=HIST_BUCKETS)
    server_metrics = demo.children.scrape(server)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
        server_metrics["served_priority"] = scrape_served(text)  # type: ignore[assignment]  # the report dict mixes values
    except OSError:
        pass
    demo.children.stop(server)
    client.close()
    return final, server_metrics


def _report(
    demo: Demo,
    name: str,
    final,
    eval_size: int,
    held_out: dict[str, Any],
    final_ckpt: Path | None,
    worker_metrics: dict,
    server_metrics: dict[str, float],
) -> dict[str, Any]:
    """The ``report.json`` dictionary of a finished run."""
    return {
        "name": name,
        "namespace": demo.namespace,
        "config": json.loads(demo.cfg.model_dump_json()),
        "duration_s": round(time.time() - demo.t0, 1),
        "tokens": token_totals(worker_metrics),
        "steps": demo.steps,
        "final": {
            "problems": final.problems,
            "heap": final.heap_size,
            "solved": final.solved,
            "unsolved": final.unsolved,
            "leased": final.leased,
            "step": final.step,
            "policy_version": final.policy_version,
            "groups_mixed": final.groups_mixed,
            "groups_all_correct": final.groups_all_correct,
            "groups_all_wrong": final.groups_all_wrong,
            "effective_group_fraction": final.effective_group_fraction,
            "completions_reported": final.completions_reported,
            "lease_expiries": final.lease_expiries,
            "unseen": final.unseen,
            "reward_sum": final.reward_sum,
        },
        "forgetting_events": final.forgetting_events,
        "breakthroughs": final.breakthroughs,
        "eval_size": eval_size,
        **held_out,
        "final_checkpoint": str(final_ckpt) if final_ckpt else None,
        "worker_metrics": worker_metrics,
        "server_metrics": {k: v for k, v in server_metrics.items() if k.startswith("prioreplay_")},
        "served_priority": server_metrics.get("served_priority"),
        "children_exit_codes": {c.name: c.proc.returncode for c in demo.children.members},
    }
