"""The comparison's picture (``compare.png``), drawn from the ``compare.json`` dictionary.

Six panels: effective-group fraction over completion tokens generated (the cost a user pays; runs
made before the workers counted tokens fall back to rollouts consumed); useful (mixed-group)
completion tokens over completion tokens; mean reward per step window; the distribution of served priorities per arm;
held-out accuracy change per run with its interval; effective-group fraction per arm with its
interval across seeds and the ratio to the baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_COLORS = ("#2a7ab9", "#d9534f", "#5cb85c", "#f0ad4e", "#8e44ad", "#555555")


def render(data: dict[str, Any], path: Path) -> Path:
    """Draw ``compare.png`` from a compare.json dictionary (keys ``samplers``, ``runs``, ``arms``,
    ``effective_group_fraction_ratio``). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samplers = data["samplers"]
    color = {s: _COLORS[i % len(_COLORS)] for i, s in enumerate(samplers)}
    cfg = data.get("config", {})
    fig, axes = plt.subplots(2, 3, figsize=(18, 9.5), constrained_layout=True)
    fig.suptitle(
        f"prioreplay compare: {', '.join(samplers)}; model={cfg.get('model')}, dataset={cfg.get('dataset')}, "
        f"G={cfg.get('group_size')}, budget per run: {cfg.get('rollouts')} rollouts / {cfg.get('completion_tokens') or '-'} "
        f"completion tokens (first reached), seeds {data.get('paired_seeds')}",
        fontsize=12,
    )
    by_tokens = any(c.get("completion_tokens") for run in data["runs"] for c in run["curve"])
    useful = ("useful_tokens", "cumulative completion tokens in mixed groups (useful)")
    if not by_tokens:
        useful = ("useful_rollouts", "cumulative rollouts in mixed groups (useful)")
    _curves(axes[0, 0], data, color, "effective_group_fraction", "cumulative effective-group fraction", by_tokens)
    _curves(axes[0, 1], data, color, *useful, by_tokens)
    _curves(axes[0, 2], data, color, "mean_reward_window", "mean reward per step window", by_tokens)
    _served(axes[1, 0], data, color)
    _held_out(axes[1, 1], data, color)
    _eff_bars(axes[1, 2], data, color)
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _curves(ax, data, color, key: str, title: str, by_tokens: bool) -> None:
    labelled = set()
    x = "completion_tokens" if by_tokens else "rollouts"
    for run in data["runs"]:
        pts = [(c[x], c[key]) for c in run["curve"] if c.get(key) is not None and c.get(x) is not None]
        if not pts:
            continue
        s = run["sampler"]
        ax.plot(*zip(*pts, strict=True), color=color[s], alpha=0.8, marker=".", label=None if s in labelled else s)
        labelled.add(s)
    ax.set_title(title)
    ax.set_xlabel("completion tokens generated" if by_tokens else "rollouts consumed (completions reported)")
    if labelled:
        ax.legend()


def _served(ax, data, color) -> None:
    """Share of served problems per priority bucket, per arm (all seeds pooled)."""
    import numpy as np

    width = 0.8 / max(1, len(data["samplers"]))
    edges = None
    for i, s in enumerate(data["samplers"]):
        counts = None
        for run in data["runs"]:
            hist = run.get("served_priority")
            if run["sampler"] != s or not hist or not hist.get("count"):
                continue
            c = np.array(hist["count"], dtype=float)
            counts = c if counts is None else counts + c
            edges = hist["le"]
        if counts is None or counts.sum() == 0:
            continue
        shares = counts[:-1] / counts.sum()  # the +Inf bucket is always empty (priorities <= 0.25)
        ax.bar(np.arange(len(shares)) + i * width, shares, width=width, color=color[s], label=s)
    if edges:
        ax.set_xticks(np.arange(len(edges) - 1) + 0.4)
        ax.set_xticklabels([f"≤{e:.3f}" for e in edges[:-1]], rotation=45, fontsize=8)
        ax.legend()
    ax.set_title("Priority of the problems served (share; unseen ones are 0.25)", fontsize=10)
    ax.set_ylabel("share of served problems")


def _held_out(ax, data, color) -> None:
    """Each run's held-out accuracy change with its Newcombe 95% interval, grouped by arm."""
    x = 0.0
    ticks, labels = [], []
    for s in data["samplers"]:
        for run in (r for r in data["runs"] if r["sampler"] == s):
            if run.get("accuracy_change") is None:
                continue
            lo, hi = run["accuracy_change_ci95"]
            d = run["accuracy_change"]
            ax.errorbar([x], [d * 100], yerr=[[(d - lo) * 100], [(hi - d) * 100]], fmt="o", color=color[s], capsize=5)
            ticks.append(x)
            labels.append(f"{s}\nseed {run['seed']}")
            x += 1
        x += 0.5
    if not ticks:
        ax.text(0.5, 0.5, "held-out accuracy not measured (--eval-size 0)", ha="center", transform=ax.transAxes)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_title("Held-out accuracy change per run (Newcombe paired 95% CI)", fontsize=10)
    ax.set_ylabel("after − before, percentage points")


def _eff_bars(ax, data, color) -> None:
    arms = [s for s in data["samplers"] if "effective_group_fraction" in data["arms"].get(s, {})]
    for i, s in enumerate(arms):
        e = data["arms"][s]["effective_group_fraction"]
        ax.bar([i], [e["mean"]], color=color[s], yerr=[[e["mean"] - e["ci95"][0]], [e["ci95"][1] - e["mean"]]], capsize=8)
        ax.scatter([i] * len(e["values"]), e["values"], color="black", zorder=3, s=12)
        fe = data["arms"][s].get("forgetting_events", {}).get("mean", 0)
        bt = data["arms"][s].get("breakthroughs", {}).get("mean", 0)
        mis = data["arms"][s].get("pool_misfiled_share", {}).get("mean")
        audit = "" if mis is None else f"\npools misfiled {mis:.0%}"
        ax.text(i, 0.02, f"forgetting {fe:.1f}\nbreakthroughs {bt:.1f}{audit}", ha="center", fontsize=8, color="white")
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms)
    ax.set_ylim(0, 1)
    ratios = data.get("effective_group_fraction_ratio", {})
    title = "Effective-group fraction per arm (mean, 95% t-interval, dots: seeds)"
    for s, r in ratios.items():
        title += f"\n{s}/{r['vs']} = {r['ratio']:.2f}x " + (
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r.get("ci95") else "(one seed: no interval)"
        )
    ax.set_title(title, fontsize=10)
