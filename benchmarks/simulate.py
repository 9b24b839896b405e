"""Part 2: learning efficiency of the samplers in a simulated GRPO learner.

The simulator replaces the language model by a population of problems with latent success
logits, and drives the REAL store (``MemoryStore`` with its ``heap`` / ``weighted`` / ``uniform``
samplers, retest pools and statistics) through ``MemoryStore.sample`` / ``MemoryStore.report`` with simulated
binary rewards. What is measured is therefore our sampler code, not a re-implementation of it.
It is split by concept:

* ``benchmarks/sim_population.py``: the population (latent logits in skills, held-out problems,
  the update a trained group makes) and its parameters :class:`SimParams`;
* ``benchmarks/sim_arms.py``: the arms (:class:`Method`: sampler, store settings, learner rule);
* ``benchmarks/sim_learner.py``: the learners, synchronous (one step per generation batch, SGD)
  or the real system's (a trajectory queue, steps of ``batch_groups``, staleness, pace, an
  Adam-like step);
* ``benchmarks/sim_loop.py``: one run (:func:`run_one`);
* this module: many runs and their summary over seeds (:func:`run_simulation`), and the plot.

The model's assumptions are in docs/METHOD.md, "How the figures are measured". All methods see
the same populations (the population depends only on the seed: paired design) and the same
rollout budget (completions generated).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from benchmarks.sim_arms import CANDIDATES, METHODS, Method
from benchmarks.sim_learner import SystemModel
from benchmarks.sim_loop import SIM_EPOCH_S, RunResult, memory_store_factory, run_one
from benchmarks.sim_population import POPULATIONS, QUICK, Population, SimParams, problem_records, topic_prompt
from benchmarks.sim_stats import pool_misfiled_share, summarize
from prioreplay.priority_server.store import Store, StoreConfig

#: The names this module has always offered (callers read ``simulate.Population`` and the like).
__all__ = [
    "CANDIDATES",
    "METHODS",
    "POPULATIONS",
    "QUICK",
    "SIM_EPOCH_S",
    "Method",
    "Population",
    "RunResult",
    "SimParams",
    "SystemModel",
    "memory_store_factory",
    "plot_curves",
    "pool_misfiled_share",
    "problem_records",
    "quick_params",
    "run_one",
    "run_simulation",
    "summarize",
    "topic_prompt",
]


def run_simulation(
    params: SimParams | None = None,
    seeds: Sequence[int] = range(10),
    methods: Sequence[Method] = METHODS,
    plot_path: str | None = None,
    store_factory: Callable[[StoreConfig, Callable[[], float]], Store] = memory_store_factory,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every method on every seed; summarize with means and 95% bootstrap intervals.

    Ratios against ``uniform`` are paired per seed (same population), then summarized.
    A run that never reaches the target counts as NaN in ``rollouts_to_target`` (``reached``
    says how many seeds did); a ratio is only formed where both runs reached it.

    Returns:
        {"params", "seeds", "methods": {name: {...summaries..., "runs": [...]}}, "wall_s"}, and
        ``"plot_error"`` (``"PATH: error"``) when ``plot_path`` was given and the plot failed.
    """
    params = params or SimParams()
    t0 = time.perf_counter()
    runs: dict[str, list[RunResult]] = {m.name: [] for m in methods}
    for m in methods:
        for s in seeds:
            runs[m.name].append(asyncio.run(run_one(params, m, s, store_factory)))
        if progress:
            progress(f"simulate: {m.name} done ({time.perf_counter() - t0:.1f}s)")
    out: dict[str, Any] = {"params": asdict(params), "seeds": list(seeds), "methods": {}}
    for m in methods:
        out["methods"][m.name] = _method_summary(m, runs)
    out["wall_s"] = time.perf_counter() - t0
    if plot_path:
        try:
            plot_curves(runs, methods, params, plot_path)
        except Exception as e:  # noqa: BLE001 - minutes of measurement outweigh the picture
            out["plot_error"] = f"{plot_path}: {type(e).__name__}: {e}"
            if progress:
                progress(f"simulate: plot {plot_path} failed ({type(e).__name__}: {e}); the figures are kept")
    return out


#: The RunResult fields summarized per method (mean and 95% bootstrap interval over seeds).
SUMMARIZED = (
    "rollouts_to_target",
    "final_success",
    "effective_group_fraction",
    "forgetting_events",
    "breakthroughs",
    "forgotten_at_end",
    "optimizer_steps",
    "useful_rollout_fraction",
    "probes",
    "pool_misfiled_share",
)


def _paired_ratios(rs: Sequence[RunResult], ref: Sequence[RunResult], name: str) -> dict[str, float]:
    """The summarized per-seed ratio ``r.name / ref.name`` over the seeds both have (a reference
    of 0 is left out)."""
    by_seed = {r.seed: r for r in ref}
    return summarize(
        [
            getattr(r, name) / getattr(by_seed[r.seed], name)
            for r in rs
            if r.seed in by_seed and getattr(by_seed[r.seed], name) > 0
        ]
    )


def _paired_differences(rs: Sequence[RunResult], ref: Sequence[RunResult], name: str) -> dict[str, float]:
    """The summarized per-seed difference ``r.name − ref.name`` over the seeds both have (NaNs left out)."""
    by_seed = {r.seed: r for r in ref}
    return summarize([getattr(r, name) - getattr(by_seed[r.seed], name) for r in rs if r.seed in by_seed])


def _method_summary(m: Method, runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """One method's entry of :func:`run_simulation`: summaries, ratios paired per seed against
    ``heap`` and ``uniform`` (where those ran), and its runs without their curves."""
    rs = runs[m.name]
    entry: dict[str, Any] = {"label": m.label, "reached": int(sum(np.isfinite(r.rollouts_to_target) for r in rs))}
    entry |= {name: summarize([getattr(r, name) for r in rs]) for name in SUMMARIZED}
    if "heap" in runs and m.name != "heap":
        entry["rollouts_ratio_vs_heap"] = _paired_ratios(rs, runs["heap"], "rollouts_to_target")
        entry["misfiled_change_vs_heap"] = _paired_differences(rs, runs["heap"], "pool_misfiled_share")
    if runs.get("uniform"):
        entry["rollouts_ratio_vs_uniform"] = _paired_ratios(rs, runs["uniform"], "rollouts_to_target")
        entry["efg_ratio_vs_uniform"] = _paired_ratios(rs, runs["uniform"], "effective_group_fraction")
    entry["runs"] = [{k: v for k, v in asdict(r).items() if not k.startswith("curve")} for r in rs]
    return entry


def plot_curves(runs: dict[str, list[RunResult]], methods: Sequence[Method], params: SimParams, path: str) -> None:
    """Mean pass@1 vs rollouts (mean over seeds, band = 2.5–97.5 percentile of seeds) and the
    effective-group fraction per method (mean, 95% bootstrap interval), as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for m in methods:
        rs = runs[m.name]
        n = min(len(r.curve_success) for r in rs)
        x = np.asarray(rs[0].curve_rollouts[:n])
        y = np.array([r.curve_success[:n] for r in rs])  # (seeds, points)
        (line,) = ax.plot(x, y.mean(axis=0), label=m.label)
        lo, hi = np.percentile(y, [2.5, 97.5], axis=0)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(params.target_success, color="k", ls=":", lw=1, label=f"target {params.target_success:.2f}")
    ax.set_xlabel("rollouts (completions generated)")
    ax.set_ylabel("mean pass@1 over the population")
    ax.set_title(f"Simulated GRPO: N={params.n_problems}, B={params.batch_size}, G={params.group_size}, {len(rs)} seeds")
    ax.legend(fontsize=8)
    names = [m.name for m in methods]
    stats = [summarize([r.effective_group_fraction for r in runs[n]]) for n in names]
    means = np.array([s["mean"] for s in stats])
    err = np.array([[s["mean"] - s["lo"] for s in stats], [s["hi"] - s["mean"] for s in stats]])
    bx.bar(range(len(names)), means, yerr=err, capsize=4, color="#2a7ab9")
    bx.set_xticks(range(len(names)))
    bx.set_xticklabels(names, rotation=20, fontsize=8)
    bx.set_ylabel("effective-group fraction (mixed groups / groups generated)")
    bx.set_ylim(0, 1)
    bx.set_title("Share of generated groups that carry a GRPO gradient")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def quick_params() -> SimParams:
    """The tiny configuration of ``--quick`` and the tests."""
    return replace(QUICK)
