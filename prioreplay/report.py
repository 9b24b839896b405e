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
        mesh = ax.pcolormesh(x_edges, edges, masked, cmap="viridis", shading="flat",
                             norm=LogNorm(vmin=1, vmax=max(1.0, float(hist.max()))))
        ax.set_xticks(range(len(xs))[:: max(1, len(xs) // 10)])
        ax.set_xticklabels([str(x) for x in xs][:: max(1, len(xs) // 10)])
        fig.colorbar(mesh, ax=ax, label="problems in the heap")
    ax.set_title("Priority p(1−p) of heap problems over learner steps (unseen start at 0.25)")
    ax.set_xlabel("learner step")
    ax.set_ylabel("priority")


def _pools_panel(ax, steps: list[dict], xs: list[int]) -> None:
    """How many problems sit in the heap, each pool and leases, per step."""
    for key, label in (("heap", "heap"), ("solved", "solved pool"), ("unsolved", "unsolved pool"), ("leased", "leased")):
        ax.plot(xs, [s.get(key, 0) for s in steps], marker=".", label=label)
    ax.set_title("Where the problems are")
    ax.set_xlabel("learner step")
    ax.set_ylabel("problems")
    ax.legend()


def _groups_panel(ax, steps: list[dict], xs: list[int]) -> None:
    """The effective-group fraction and the mean reward per step window."""
    ax.plot(xs, [s.get("effective_group_fraction_window") for s in steps], marker="o", label="effective-group fraction (mixed groups)")
    ax.plot(xs, [s.get("mean_reward_window") for s in steps], marker="s", label="mean reward of reported completions")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Groups that carry a gradient, and reward, per step window")
    ax.set_xlabel("learner step")
    ax.legend()


def _accuracy_panel(ax, report: dict[str, Any]) -> None:
    """Held-out greedy accuracy before and after training; forgetting events and breakthroughs."""
    before, after = report.get("accuracy_before"), report.get("accuracy_after")
    vals = [v if v is not None else 0.0 for v in (before, after)]
    bars = ax.bar(["before", "after"], vals, color=["#999999", "#2a7ab9"])
    for bar, v in zip(bars, (before, after)):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.01, "n/a" if v is None else f"{v:.1%}", ha="center")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Held-out accuracy ({report.get('eval_size', 0)} problems, greedy)")
    fe, bt = report.get("forgetting_events", 0), report.get("breakthroughs", 0)
    ax.set_xlabel(f"forgetting events: {fe}   breakthroughs: {bt}")
