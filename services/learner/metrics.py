"""The learner's metrics: its own Prometheus registry (``/metrics`` on ``metrics_port``) and one JSON
line per step in ``log_file``. Metric names are listed in docs/METRICS.md (``prioreplay_learner_*``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from prioreplay.metrics_server import Readiness, serve_metrics

from .filters import FATES

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from prioreplay.reporting import Reporter

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


#: The ``fate`` label values of ``prioreplay_learner_groups_total``: the filters' fates, plus the groups of
#: a step skipped for a non-finite loss or gradient (``used`` counts only groups of applied steps).
GROUP_FATES = (*FATES, "skipped")
#: The ``side`` label values of ``prioreplay_learner_clip_fraction``.
CLIP_SIDES = ("low", "high", "dual")
#: The ``quantile`` label values of ``prioreplay_learner_offpolicy_abs_log_w`` (percentiles).
MISMATCH_QUANTILES = ("0.5", "0.9", "0.99")
#: The ``phase`` label values of ``prioreplay_learner_step_seconds``.
STEP_PHASES = ("wait", "compute", "publish")


class LearnerMetrics:
    """Prometheus metrics of one learner process plus the JSON-lines step log.

    Args:
        log_file: append one JSON object per step here (None: no file). Parent directories are created.
        reporter: also write each step's numbers there as ``learner/<key>`` (TensorBoard, wandb;
            :mod:`prioreplay.reporting`); None: not.
    """

    def __init__(self, log_file: str | os.PathLike | None = None, reporter: Reporter | None = None):
        self.reporter = reporter
        self.registry = r = CollectorRegistry()
        #: ``/ready``: set once the process can do its work (:mod:`prioreplay.metrics_server`).
        self.readiness = Readiness("the model to load and the resume from the newest checkpoint")
        p = "prioreplay_learner_"
        self.loss = Gauge(p + "loss", "total loss of the last step (pg + kl_coef * kl)", registry=r)
        self.pg_loss = Gauge(p + "pg_loss", "clipped policy-gradient loss of the last step", registry=r)
        self.kl = Gauge(p + "kl", "k3 KL to the reference policy, last step (0 without one)", registry=r)
        self.clip_fraction = Gauge(
            p + "clip_fraction",
            "share of completion tokens whose ratio was clipped, last step "
            "(side: low, high, or dual = the dual-clip cap on negative advantages)",
            ["side"],
            registry=r,
        )
        for side in CLIP_SIDES:  # every labelled series exists from the start (dashboards read 0, not "No data")
            self.clip_fraction.labels(side)
        self.mismatch_kl = Gauge(
            p + "offpolicy_mismatch_kl",
            "k3 estimate of KL(behaviour || proximal) on the last step's completion tokens, by policy age "
            "(age: versions between the group's generation and the step; 'all': the whole step)",
            ["age"],
            registry=r,
        )
        self.mismatch_kl.labels("all")
        self.abs_log_w = Gauge(
            p + "offpolicy_abs_log_w",
            "percentile of |log w| = |log proximal - log behaviour| over the last step's completion tokens, nats",
            ["quantile"],
            registry=r,
        )
        for q in MISMATCH_QUANTILES:
            self.abs_log_w.labels(q)
        self.correction_fraction = Gauge(
            p + "offpolicy_correction_fraction",
            "share of the last step's completion tokens whose importance weight the off-policy correction "
            "truncated (kind: truncated, tis) or masked (kind: masked, mis-token, mis-sequence, icepop)",
            ["kind"],
            registry=r,
        )
        for kind in ("truncated", "masked"):
            self.correction_fraction.labels(kind)
        self.entropy = Gauge(p + "entropy", "mean token entropy of the policy on completion tokens, nats", registry=r)
        self.grad_norm = Gauge(p + "grad_norm", "global gradient L2 norm before clipping, last step", registry=r)
        self.learning_rate = Gauge(p + "learning_rate", "learning rate of the last optimizer step", registry=r)
        self.groups = Counter(
            p + "groups",
            "trajectory groups pulled, by fate: used (trained: in an applied optimizer step), stale, zero_variance, "
            "invalid (dropped unused), skipped (in a step whose loss or gradient was not finite: not applied)",
            ["fate"],
            registry=r,
        )
        for fate in GROUP_FATES:
            self.groups.labels(fate)
        #: The same counts as plain numbers since this process started (the JSON lines' ``groups_total``).
        self.totals: dict[str, int] = dict.fromkeys(GROUP_FATES, 0)
        self.truncated_completions = Counter(
            p + "truncated_completions",
            "completions in pulled groups that were cut at max_new_tokens (their tokens: --truncated mask or keep)",
            registry=r,
        )
        self.staleness = Histogram(
            p + "staleness", "policy versions between a group's generation and its use", buckets=STALENESS_BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            p + "step_seconds", "seconds per step phase", ["phase"], buckets=SECONDS_BUCKETS, registry=r
        )
        for phase in STEP_PHASES:
            self.step_seconds.labels(phase)
        self.tokens_per_second = Gauge(
            p + "tokens_per_second", "tokens (prompt + completion) processed per compute second", registry=r
        )
        self.step = Gauge(p + "step", "optimizer steps done", registry=r)
        self.policy_version = Gauge(p + "policy_version", "newest policy version published by this learner", registry=r)
        self.skipped_steps = Counter(
            p + "skipped_steps",
            "steps whose loss or gradient norm was not finite (NaN or inf): "
            "nothing applied, nothing published, their groups acknowledged unused",
            registry=r,
        )
        self.server_unavailable = Counter(
            p + "server_unavailable", "steps (or the resume) that met an unavailable server or store and backed off", registry=r
        )
        self.rpc_seconds = Histogram(
            p + "rpc_seconds", "seconds spent in priority-server RPCs", ["method"], buckets=SECONDS_BUCKETS, registry=r
        )
        self.log_path = Path(log_file) if log_file else None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Start ``/metrics`` and ``/ready`` (:attr:`readiness`) on ``port`` (a daemon thread,
        :func:`prioreplay.metrics_server.serve_metrics`). Returns the server, or None when port is 0."""
        return serve_metrics(self.registry, self.readiness, port, addr)

    def record(self, rec: dict[str, Any]) -> None:
        """Set the gauges from one step record (keys as written by the learner) and log the line."""
        for name in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
            v = rec.get(name)
            if v is not None and math.isfinite(v):
                getattr(self, name).set(v)
        if rec.get("lr") is not None:
            self.learning_rate.set(rec["lr"])
        for side, key in zip(CLIP_SIDES, ("clip_frac_low", "clip_frac_high", "dual_clip_frac"), strict=True):
            if rec.get(key) is not None:
                self.clip_fraction.labels(side).set(rec[key])
        self._record_mismatch(rec)
        if rec.get("tokens_per_s") is not None:
            self.tokens_per_second.set(rec["tokens_per_s"])
        self.step.set(rec.get("step", 0))
        self.policy_version.set(rec.get("policy_version", 0))
        for phase in STEP_PHASES:
            if rec.get(f"{phase}_s") is not None:
                self.step_seconds.labels(phase).observe(rec[f"{phase}_s"])
        if self.reporter is not None:
            self.reporter.scalars("learner", rec, int(rec.get("step", 0)))
        self.write_line(rec)

    def _record_mismatch(self, rec: dict[str, Any]) -> None:
        """Set the off-policy mismatch gauges from a step record (keys of :func:`~.loss.grpo_loss`
        and :func:`~.loss.mismatch_summary`); absent keys leave their gauges as they were."""
        if rec.get("mismatch_kl") is not None:
            self.mismatch_kl.labels("all").set(rec["mismatch_kl"])
        for key, v in rec.items():
            if key.startswith("mismatch_kl_age_") and v is not None:
                self.mismatch_kl.labels(key.removeprefix("mismatch_kl_age_")).set(v)
        for q, pct in zip(MISMATCH_QUANTILES, ("p50", "p90", "p99"), strict=True):
            if rec.get(f"abs_log_w_{pct}") is not None:
                self.abs_log_w.labels(q).set(rec[f"abs_log_w_{pct}"])
        for kind in ("truncated", "masked"):
            if rec.get(f"is_{kind}_frac") is not None:
                self.correction_fraction.labels(kind).set(rec[f"is_{kind}_frac"])

    def count_sorted(self, out) -> None:
        """Count and log the fates of a step's pulled groups (a :class:`~.filters.Sorted`): groups by
        fate (deferred ones are counted when used or dropped later), truncated completions, the
        staleness of the used ones; a warning per malformed group."""
        if out.truncated:
            self.truncated_completions.inc(out.truncated)
        for g, why in out.invalid:
            log.warning("dropping group %s of problem %r: %s", g.group_id, g.problem_id, why)
        if out.deferred:
            n, sampling = len(out.deferred), out.sampling
            log.info("%d groups sampled at another temperature or top-p than %s: deferred to a later step", n, sampling)
        for fate, n in out.counts.items():
            if fate not in ("deferred", "used"):  # used: counted once its step is applied (count_groups)
                self.count_groups(fate, n)
        for a in out.ages:
            self.staleness.observe(max(0, a))

    def count_groups(self, fate: str, n: int) -> None:
        """Count ``n`` groups of ``fate`` (one of :data:`GROUP_FATES`) in the metric and in :attr:`totals`."""
        if n:
            self.groups.labels(fate).inc(n)
            self.totals[fate] += n

    def write_end(self, **extra: Any) -> None:
        """The log's last line of a run: ``{"end": true, "groups_total": {fate: n}, **extra}`` (no
        ``step`` key, so readers of step lines skip it); what a run report charges every group to."""
        self.write_line({"end": True, "groups_total": dict(self.totals), **extra})

    def write_line(self, rec: dict[str, Any]) -> None:
        """Append ``rec`` (with ``time_unix_s``; NaN/inf written as null) as one JSON line to the log file, if any."""
        if self.log_path is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        line = json.dumps({"time_unix_s": round(time.time(), 3), **clean}, allow_nan=False, default=str)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def step_sizes(batch, ages: Sequence[int], t: dict[str, float]) -> dict[str, Any]:
    """Sizes, reward, staleness and phase timings of one trained step, for its JSON log line.

    Args:
        batch: the step's :class:`~.batch.Batch` (B sequences).
        ages: the staleness in versions of each used group (non-empty).
        t: ``time.perf_counter()`` at the start of each phase: wait, compute, publish, checkpoint, end.

    Returns:
        sequences, tokens, completion_tokens, reward_mean, staleness_mean/max, and ``*_s`` seconds
        per phase plus tokens_per_s (tokens over compute seconds).
    """
    tokens = int(batch.attention_mask.sum())
    compute_s = t["publish"] - t["compute"]
    return dict(
        sequences=len(batch),
        tokens=tokens,
        completion_tokens=int(batch.completion_mask.sum()),
        reward_mean=float(batch.rewards.mean()),
        staleness_mean=sum(ages) / len(ages),
        staleness_max=max(ages),
        wait_s=t["compute"] - t["wait"],
        compute_s=compute_s,
        publish_s=t["checkpoint"] - t["publish"],
        checkpoint_s=t["end"] - t["checkpoint"],
        tokens_per_s=tokens / max(compute_s, 1e-9),
    )


def step_summary(record: dict[str, Any]) -> str:
    """The log line of a trained step (rank 0 logs it for the job) from its JSON ``record``."""
    r = record
    seconds = r["wait_s"] + r["compute_s"] + r["publish_s"]
    return (
        f"step {r['step']}: loss {r['loss']:.4f}, groups {r['groups_used']} (stale {r['groups_stale']}, "
        f"zero-variance {r['groups_zero_variance']}), {r['tokens_per_s']:.1f} tok/s, {seconds:.2f}s"
    )
