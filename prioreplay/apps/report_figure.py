"""The run report's picture: what happened in a training run, one panel per question.

``render(report, path)`` draws ``report.png`` from the ``report.json`` dictionary written by
``prioreplay demo``: the heap's priority distribution over learner steps (heat map), the pool
sizes, the effective-group fraction and mean reward, and held-out accuracy before/after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render(report: dict[str, Any], path: Path) -> Path:
    """Draw the four-panel figure of a run report to ``path`` (PNG). Returns ``path``.

    Args:
        report: the dictionary of ``report.json`` (keys ``steps``, ``accuracy_before``,
            ``accuracy_after``, ``config``).
        path: where the PNG goes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report.get("steps", [])
    xs = [s["step"] for s in steps]
    cfg = report.get("config", {})
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), constrained_layout=True)
    fig.suptitle(
        f"prioreplay run '{report.get('name', '')}': sampler={cfg.get('sampler')}, model={cfg.get('model')}, "
        f"dataset={cfg.get('dataset')}, G={cfg.get('group_size')}",
        fontsize=12,
    )
    _priority_panel(fig, axes[0, 0], steps, xs)
    _pools_panel(axes[0, 1], steps, xs)
    _groups_panel(axes[1, 0], steps, xs)
    _accuracy_panel(axes[1, 1], report)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _priority_panel(fig, ax, steps: list[dict], xs: list[int]) -> None:
    """The heap's priority distribution per learner step, as a heat map (counts on a log scale)."""
    import numpy as np

    if steps and steps[0].get("priority_histogram"):
        from matplotlib.colors import LogNorm

        hist = np.array([s["priority_histogram"] for s in steps], dtype=float).T  # (buckets, steps)
        edges = steps[0]["priority_bucket_edges"]
        x_edges = np.arange(len(xs) + 1) - 0.5
        masked = np.ma.masked_less(hist, 1.0)  # empty buckets stay white; counts on a log scale
        mesh = ax.pcolormesh(
            x_edges, edges, masked, cmap="viridis", shading="flat", norm=LogNorm(vmin=1, vmax=max(1.0, float(hist.max())))
        )
        ax.set_xticks(range(len(xs))[:: max(1, len(xs) // 10)])
        ax.set_xticklabels([str(x) for x in xs][:: max(1, len(xs) // 10)])
        fig.colorbar(mesh, ax=ax, label="problems in the heap")
    unseen = [s.get("unseen") for s in steps]
    if steps and unseen[-1] is not None:
        problems = (
            steps[-1].get("heap", 0) + steps[-1].get("solved", 0) + steps[-1].get("unsolved", 0) + steps[-1].get("leased", 0)
        )
        ax.text(
            0.01,
            0.02,
            f"never tested: {unseen[0]} after step {xs[0]} → {unseen[-1]} of {problems} at the end"
            + ("\n(still a first pass: 'heap' ≈ uniform until it ends)" if unseen[-1] > problems / 4 else ""),
            transform=ax.transAxes,
            fontsize=9,
            va="bottom",
            color="white",
            bbox={"facecolor": "black", "alpha": 0.5, "pad": 3},
        )
    ax.set_title("Priority p(1−p) of heap problems over learner steps (unseen start at 0.25)")
    ax.set_xlabel("learner step")
    ax.set_ylabel("priority")


def _pools_panel(ax, steps: list[dict], xs: list[int]) -> None:
    """How many problems sit in the heap, each pool and leases, per step."""
    for key, label in (("heap", "heap"), ("solved", "solved pool"), ("unsolved", "unsolved pool"), ("leased", "leased")):
        ax.plot(xs, [s.get(key, 0) for s in steps], marker=".", label=label)
    if steps and steps[0].get("unseen") is not None:
        ax.plot(xs, [s["unseen"] for s in steps], linestyle="--", color="black", label="never tested (unseen)")
    ax.set_title("Where the problems are")
    ax.set_xlabel("learner step")
    ax.set_ylabel("problems")
    ax.legend()


def _groups_panel(ax, steps: list[dict], xs: list[int]) -> None:
    """The effective-group fraction and the mean reward per step window."""
    ax.plot(
        xs, [s.get("effective_group_fraction_window") for s in steps], marker="o", label="effective-group fraction (mixed groups)"
    )
    ax.plot(xs, [s.get("mean_reward_window") for s in steps], marker="s", label="mean reward of reported completions")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Groups that carry a gradient, and reward, per step window")
    ax.set_xlabel("learner step")
    ax.legend()


def _accuracy_panel(ax, report: dict[str, Any]) -> None:
    """Held-out greedy accuracy before and after training; forgetting events and breakthroughs."""
    before, after = report.get("accuracy_before"), report.get("accuracy_after")
    vals = [v if v is not None else 0.0 for v in (before, after)]
    cis = [report.get("accuracy_before_ci95"), report.get("accuracy_after_ci95")]
    err = [
        [v - ci[0] if ci else 0.0 for v, ci in zip(vals, cis, strict=True)],
        [ci[1] - v if ci else 0.0 for v, ci in zip(vals, cis, strict=True)],
    ]
    bars = ax.bar(["before", "after"], vals, color=["#999999", "#2a7ab9"], yerr=err, capsize=8)
    for bar, v, ci in zip(bars, (before, after), cis, strict=True):
        top = ci[1] if ci else bar.get_height()
        ax.text(bar.get_x() + bar.get_width() / 2, top + 0.01, "n/a" if v is None else f"{v:.1%}", ha="center")
    ax.set_ylim(0, 1.05)
    change = report.get("accuracy_change")
    title = f"Held-out accuracy ({report.get('eval_size', 0)} problems, greedy; bars: Wilson 95% CI)"
    if change is not None:
        lo, hi = report["accuracy_change_ci95"]
        title += f"\nchange {change * 100:+.1f} pts, 95% CI [{lo * 100:+.1f}, {hi * 100:+.1f}] " + (
            "excludes 0" if report.get("change_excludes_zero") else "includes 0: no measurable change"
        )
    ax.set_title(title)
    fe, bt = report.get("forgetting_events", 0), report.get("breakthroughs", 0)
    label = f"forgetting events: {fe}   breakthroughs: {bt}"
    tokens, audit = report.get("tokens") or {}, report.get("pool_audit") or {}
    if tokens.get("completion_tokens"):
        label += f"\ncompletion tokens {tokens['completion_tokens']:,} ({tokens['useful_tokens']:,} useful)"
    if audit.get("misfiled_share") is not None:
        label += f"\npools misfiled (final policy): {audit['misfiled']} of {audit['pooled']} ({audit['misfiled_share']:.0%})"
    ax.set_xlabel(label)
