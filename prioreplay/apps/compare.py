"""``prioreplay compare``: samplers side by side, same model, data, seed and rollout budget.

Runs ``prioreplay demo`` once per (seed, sampler), seed-major (every sampler of seed k before
seed k+1, so a comparison cut short still holds whole pairs), each arm a normal demo run
directory ``<sampler>-seed<k>`` under the compare directory, then writes

* ``compare.json``: per run and per arm (mean and 95% Student-t interval across seeds) the
  effective-group fraction, mixed groups per 1,000 rollouts, useful (mixed-group) rollouts, mean
  reward, held-out accuracy change (with each run's Newcombe interval), forgetting events,
  breakthroughs, unseen problems and the trained share (groups trained / groups queued for the
  learner; each run's ``groups``: where every generated group went, docs/METHOD.md); per arm
  against the baseline (``dapo``, i.e. ``uniform``, when compared, else the last arm) the ratio of
  effective-group fractions with a paired bootstrap interval across seeds;
* ``compare.png``: those figures over rollouts consumed, the served-priority distribution per
  arm, and the held-out changes with their intervals.

The files are rewritten after every arm, so a long comparison can be read while it runs.
``--runs DIR,DIR,...`` (or the flag repeated) compares finished runs; arms whose settings differ in anything but the
sampler and the seed are refused (:func:`check_arms`).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prioreplay.apps.compare_config import CompareConfig, arm_name, arm_settings
from prioreplay.apps.compare_target import rollouts_to_target, target_lines, target_summary
from prioreplay.errors import InvalidArgument

log = logging.getLogger("prioreplay.apps.compare")

#: Settings that may differ between the runs of one comparison (they do not change what is measured,
#: or they are what an arm is: the sampler and the settings of ``compare_config.SETTING_ARMS``).
ARM_KEYS = (
    "sampler",
    "retest_versions",
    "queue_zero_variance",
    "train_zero_variance",
    "pool_evidence",
    "age_decay",
    "heap_age_decay",
    "unseen_prior",
    "off_policy_correction",
    "seed",
    "run_dir",
    "timeout_s",
    "log_level",
    "threads",
    "report_to",
    "keep_trainer_state",
)


def check_arms(reports: list[dict[str, Any]]) -> None:
    """Refuse runs that are not the same experiment but for the arm (``compare_config.arm_name``) and the seed.

    A setting one run lacks (made before the setting existed) counts as its default.

    Raises:
        InvalidArgument: two runs differ in a setting outside :data:`ARM_KEYS` (the message names
            the setting, both values and both runs), or an arm's runs repeat a seed.
    """
    if not reports:
        raise InvalidArgument("compare needs at least one run")
    from prioreplay.apps.demo_config import DemoConfig

    # a setting a run lacks (made before the setting existed) ran as its default
    defaults = {k: f.default for k, f in DemoConfig.model_fields.items() if isinstance(f.default, (bool, int, float, str))}
    defaults["pace_batches"] = 0  # a run from before the pace bound ran unpaced, whatever the default is now
    ref = reports[0]
    ref_cfg = {k: v for k, v in ref["config"].items() if k not in ARM_KEYS}
    for rep in reports[1:]:
        cfg = {k: v for k, v in rep["config"].items() if k not in ARM_KEYS}
        for key in sorted(set(ref_cfg) | set(cfg)):
            if ref_cfg.get(key, defaults.get(key)) != cfg.get(key, defaults.get(key)):
                raise InvalidArgument(
                    f"runs {ref.get('name')!r} and {rep.get('name')!r} differ in {key} ({ref_cfg.get(key)!r} vs "
                    f"{cfg.get(key)!r}); a comparison changes only the sampler (and the seed)"
                )
    seen: set[tuple[str, int]] = set()
    for rep in reports:
        arm = (arm_name(rep["config"]), rep["config"]["seed"])
        if arm in seen:
            raise InvalidArgument(f"two runs of sampler {arm[0]} with seed {arm[1]}; give each (sampler, seed) once")
        seen.add(arm)


def run_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one demo run that a comparison puts side by side."""
    final, cfg = report["final"], report["config"]
    completions = final["completions_reported"]
    tokens = report.get("tokens") or {}
    audit = report.get("pool_audit") or {}
    reward_sum = final.get("reward_sum", report["steps"][-1]["reward_sum"] if report.get("steps") else 0.0)
    curve = [
        {
            "rollouts": s["completions"],
            "effective_group_fraction": s["groups_mixed"] / s["groups"] if s["groups"] else None,
            "useful_rollouts": s["groups_mixed"] * cfg["group_size"],
            "mean_reward_window": s.get("mean_reward_window"),
            "unseen": s.get("unseen"),
            "completion_tokens": s.get("completion_tokens"),
            "useful_tokens": s.get("useful_tokens"),
        }
        for s in report.get("steps", [])
    ]
    if completions and (not curve or curve[-1]["rollouts"] < completions):  # the end of the budget
        curve.append(
            {
                "rollouts": completions,
                "effective_group_fraction": final["effective_group_fraction"],
                "useful_rollouts": final["groups_mixed"] * cfg["group_size"],
                "mean_reward_window": None,
                "unseen": final.get("unseen"),
                "completion_tokens": tokens.get("completion_tokens"),
                "useful_tokens": tokens.get("useful_tokens"),
            }
        )
    return {
        "name": report.get("name"),
        "sampler": arm_name(cfg),  # the arm: a sampler, or a row of compare_config.SETTING_ARMS
        "seed": cfg["seed"],
        "rollouts": completions,
        "rollout_budget": cfg.get("rollouts") or None,
        "effective_group_fraction": final["effective_group_fraction"],
        "mixed_groups_per_1000_rollouts": 1000.0 * final["groups_mixed"] / completions if completions else 0.0,
        "useful_rollouts": final["groups_mixed"] * cfg["group_size"],
        "mean_reward": reward_sum / completions if completions else 0.0,
        "learner_steps": report["steps"][-1]["step"] if report.get("steps") else 0,
        # trained / queued for the learner (demo_report.group_accounting; None for a run from before the counting)
        "trained_share": (report.get("groups") or {}).get("trained_share"),
        "groups": report.get("groups"),
        "unseen_at_end": final.get("unseen"),
        "problems": final["problems"],
        "accuracy_before": report.get("accuracy_before"),
        "accuracy_after": report.get("accuracy_after"),
        "accuracy_change": report.get("accuracy_change"),
        "accuracy_change_ci95": report.get("accuracy_change_ci95"),
        "forgetting_events": report.get("forgetting_events", 0),
        "breakthroughs": report.get("breakthroughs", 0),
        "served_priority": report.get("served_priority"),
        "by_task": report.get("by_task"),  # per-task pass rate, group kinds and served priority (task_report)
        "duration_s": report.get("duration_s"),
        "wall_clock_s": report.get("duration_s"),
        **_token_metrics(tokens),
        "pool_misfiled_share": audit.get("misfiled_share"),
        "pool_lost_opportunity_share": audit.get("lost_opportunity_share"),
        "pool_audit": audit or None,
        "accuracy_after_each": report.get("eval_correct_after"),
        "heldout_curve": report.get("heldout_curve"),
        "curve": curve,
    }


def _token_metrics(tokens: dict[str, int]) -> dict[str, Any]:
    """Completion, prompt and useful tokens of a run, and the useful share of its completion tokens
    (None for a run made before the workers counted tokens)."""
    done = tokens.get("completion_tokens") or 0
    return {
        "completion_tokens": done or None,
        "prompt_tokens": tokens.get("prompt_tokens") if done else None,
        "useful_tokens": tokens.get("useful_tokens") if done else None,
        "useful_token_fraction": tokens.get("useful_tokens", 0) / done if done else None,
    }


_SUMMED = (
    "effective_group_fraction",
    "mixed_groups_per_1000_rollouts",
    "useful_rollouts",
    "mean_reward",
    "accuracy_change",
    "forgetting_events",
    "breakthroughs",
    "rollouts",
    "unseen_at_end",
    "completion_tokens",
    "prompt_tokens",
    "useful_tokens",
    "useful_token_fraction",
    "wall_clock_s",
    "pool_misfiled_share",
    "pool_lost_opportunity_share",
    "accuracy_after",
    "trained_share",
)


def summarize(
    runs: list[dict[str, Any]], samplers: list[str], target_fraction: float = 0.5, target_accuracy: float | None = None
) -> dict[str, Any]:
    """Per-arm means with 95% intervals across seeds, and each arm's effective-group-fraction ratio
    against the baseline over the seeds every arm finished (paired bootstrap); with held-out
    curves, rollouts to target (:func:`rollouts_to_target`; ``target`` says how the target was
    fixed) and, with a ``grpo`` arm, the plateau check at the full budget."""
    from prioreplay.intervals import bootstrap_ratio, mean_interval

    by_arm = {s: {r["seed"]: r for r in runs if r["sampler"] == s} for s in samplers}
    common = sorted(set.intersection(*(set(v) for v in by_arm.values()))) if by_arm else []
    arms: dict[str, Any] = {}
    for s, seeds in by_arm.items():
        arm: dict[str, Any] = {"seeds": sorted(seeds)}
        for key in _SUMMED:
            vals = [seeds[k][key] for k in sorted(seeds) if seeds[k][key] is not None]
            if vals:
                m, lo, hi = mean_interval(vals)
                arm[key] = {"mean": m, "ci95": [lo, hi], "values": vals}
        arms[s] = arm
    baseline = next((b for b in ("dapo", "uniform") if b in samplers), samplers[-1])
    ratios = {}
    for s in samplers:
        if s == baseline or not common:
            continue
        num = [by_arm[s][k]["effective_group_fraction"] for k in common]
        den = [by_arm[baseline][k]["effective_group_fraction"] for k in common]
        r, lo, hi = bootstrap_ratio(num, den, paired=True)
        ratios[s] = {
            "vs": baseline,
            "seeds": common,
            "ratio": r,
            "ci95": [lo, hi] if len(common) > 1 else None,
            "above_1": lo > 1.0 if len(common) > 1 else None,
        }  # one seed: no spread, no interval
    return {
        "target_fraction": target_fraction,
        "target": target_summary(by_arm, target_fraction, target_accuracy),
        "rollouts_to_target": rollouts_to_target(by_arm, samplers, target_fraction, target_accuracy),
        "final_vs_grpo": final_vs_grpo(by_arm, samplers),
        "arms": arms,
        "baseline": baseline,
        "paired_seeds": common,
        "effective_group_fraction_ratio": ratios,
        "vs_baseline": {s: against_baseline(by_arm[s], by_arm[baseline], common) for s in samplers if s != baseline},
    }


def final_vs_grpo(by_arm: dict[str, dict[int, dict]], samplers: list[str]) -> dict[str, Any]:
    """The plateau check: each arm's held-out accuracy at its full budget minus ``grpo``'s, paired by
    seed: :func:`against_baseline`'s ``heldout_change`` against ``grpo`` (mean, 95% t-interval, None
    with one seed; per seed). ``below_grpo`` is True when the interval lies wholly below zero (a
    plateau under plain GRPO's accuracy). Empty without a ``grpo`` arm."""
    grpo = by_arm.get("grpo") or {}
    out: dict[str, Any] = {}
    for arm in samplers:
        mine = by_arm.get(arm) or {}
        if arm == "grpo" or not grpo:
            continue
        held = against_baseline(mine, grpo, sorted(set(mine) & set(grpo)))["heldout_change"]
        if held is None:
            continue
        ci = held["ci95"]
        out[arm] = {**held, "seeds": sorted(set(mine) & set(grpo)), "below_grpo": ci[1] < 0 if ci else None}
    return out


def against_baseline(arm: dict[int, dict], base: dict[int, dict], seeds: list[int]) -> dict[str, Any]:
    """One arm against the baseline on the seeds both finished (docs/METHOD.md, "How a default is chosen").

    * ``useful_tokens_ratio``: useful tokens per completion token, arm over baseline (the ratio of
      useful tokens at equal completion tokens), paired bootstrap across seeds.
    * ``heldout_change``: held-out accuracy after training, arm minus baseline, per seed on the same
      held-out problems; mean with its 95% t-interval across seeds, and Newcombe's paired interval
      over every (seed, problem) pair (``pooled_ci95``: narrower, blind to seed-to-seed spread).
    * ``pool_misfiled_share_change``: the audit's misfiled share, arm minus baseline, t-interval.

    A figure is None where a run lacks it; an interval is None with one seed.
    """
    from prioreplay.intervals import bootstrap_ratio, mean_interval, paired_difference

    def paired(key: str) -> list[tuple[float, float]]:
        return [(arm[k][key], base[k][key]) for k in seeds if arm[k].get(key) is not None and base[k].get(key) is not None]

    out: dict[str, Any] = dict(seeds=seeds, useful_tokens_ratio=None, heldout_change=None, pool_misfiled_share_change=None)
    fr = paired("useful_token_fraction")
    if fr and all(b > 0 for _, b in fr):
        r, lo, hi = bootstrap_ratio([a for a, _ in fr], [b for _, b in fr], paired=True)
        out["useful_tokens_ratio"] = {"ratio": r, "ci95": [lo, hi] if len(fr) > 1 else None, "per_seed": [a / b for a, b in fr]}
    for key, name in (("accuracy_after", "heldout_change"), ("pool_misfiled_share", "pool_misfiled_share_change")):
        pairs = paired(key)
        if pairs:
            m, lo, hi = mean_interval([a - b for a, b in pairs])
            out[name] = {"mean": m, "ci95": [lo, hi] if len(pairs) > 1 else None, "per_seed": [a - b for a, b in pairs]}
    each = [(base[k]["accuracy_after_each"], arm[k]["accuracy_after_each"]) for k in seeds if _same_length(arm[k], base[k])]
    if each and out["heldout_change"] is not None:
        _, lo, hi = paired_difference([x for b, _ in each for x in b], [x for _, a in each for x in a])
        out["heldout_change"]["pooled_ci95"] = [lo, hi]
    return out


def _same_length(a: dict, b: dict) -> bool:
    x, y = a.get("accuracy_after_each") or [], b.get("accuracy_after_each") or []
    return bool(x) and len(x) == len(y)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The comparison's headline, one line per arm plus one per ratio."""
    lines = []
    for s, arm in summary["arms"].items():
        if "effective_group_fraction" not in arm:
            continue
        e = arm["effective_group_fraction"]
        line = (
            f"{s:<10} seeds {arm['seeds']}: effective-group fraction {e['mean']:.3f} "
            f"[{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}], mixed groups per 1,000 rollouts "
            f"{arm['mixed_groups_per_1000_rollouts']['mean']:.1f}, mean reward {arm['mean_reward']['mean']:.3f}"
        )
        if "completion_tokens" in arm:
            line += (
                f", completion tokens {arm['completion_tokens']['mean']:,.0f} (useful "
                f"{arm['useful_token_fraction']['mean']:.0%}), wall-clock {arm['wall_clock_s']['mean']:.0f} s"
            )
        if "pool_misfiled_share" in arm:
            line += f", pool misfiled {arm['pool_misfiled_share']['mean']:.0%}"
        if "trained_share" in arm:  # trained / queued for the learner
            line += f", trained share {arm['trained_share']['mean']:.0%}"
        if "accuracy_change" in arm:
            a = arm["accuracy_change"]
            line += f", held-out change {a['mean'] * 100:+.1f} pts [{a['ci95'][0] * 100:+.1f}, {a['ci95'][1] * 100:+.1f}]"
        lines.append(line)
    lines += _baseline_lines(summary)
    lines += target_lines(summary)
    for s, r in summary.get("final_vs_grpo", {}).items():
        lines.append(
            f"{s} - grpo held-out accuracy at the full budget: {r['mean'] * 100:+.1f} pts ({_ci(r['ci95'], 100.0)} over seeds "
            f"{r['seeds']}){'; below grpo: a plateau' if r['below_grpo'] else ''}"
        )
    for s, r in summary["effective_group_fraction_ratio"].items():
        if r["ci95"] is None:
            lines.append(
                f"{s} / {r['vs']} effective-group fraction: {r['ratio']:.2f}x on one seed {r['seeds']}: "
                "no interval (run --seeds 2 or more)"
            )
            continue
        verdict = "the interval is above 1" if r["above_1"] else "the interval does not exclude 1"
        lines.append(
            f"{s} / {r['vs']} effective-group fraction: {r['ratio']:.2f}x, 95% CI [{r['ci95'][0]:.2f}, "
            f"{r['ci95'][1]:.2f}] over seeds {r['seeds']} (paired bootstrap); {verdict}"
        )
    return lines


def _ci(ci: list[float] | None, scale: float = 1.0, fmt: str = "+.1f") -> str:
    return "no interval (one seed)" if ci is None else f"95% CI [{ci[0] * scale:{fmt}}, {ci[1] * scale:{fmt}}]"


def _baseline_lines(summary: dict[str, Any]) -> list[str]:
    """One line per arm: useful-token ratio and held-out difference against the baseline."""
    lines = []
    for s, v in summary.get("vs_baseline", {}).items():
        parts = []
        if v["useful_tokens_ratio"]:
            u = v["useful_tokens_ratio"]
            parts.append(f"useful tokens per completion token {u['ratio']:.2f}x ({_ci(u['ci95'], 1.0, '.2f')}, paired bootstrap)")
        if v["heldout_change"]:
            h = v["heldout_change"]
            parts.append(f"held-out accuracy {h['mean'] * 100:+.1f} pts ({_ci(h['ci95'], 100.0)} across seeds)")
        if v["pool_misfiled_share_change"]:
            m = v["pool_misfiled_share_change"]
            parts.append(f"pool misfiled share {m['mean'] * 100:+.1f} pts ({_ci(m['ci95'], 100.0)})")
        if parts:
            lines.append(f"{s} vs {summary['baseline']} over seeds {v['seeds']}: " + "; ".join(parts))
    return lines


def write(root: Path, cfg: dict[str, Any], samplers: list[str], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Write compare.json and compare.png from the finished runs; returns the compare.json dict."""
    from prioreplay.apps.compare_figure import render

    runs = [run_metrics(r) for r in reports]
    summary = summarize(runs, samplers, cfg.get("target_fraction", 0.5), cfg.get("target_accuracy"))
    out = {"config": cfg, "samplers": samplers, "runs": runs, **summary}
    (root / "compare.json").write_text(json.dumps(out, indent=1, default=str))
    render(out, root / "compare.png")
    return out


def _arm_config(cfg: CompareConfig, arm: str, seed: int, root: Path):
    from prioreplay.apps.demo_config import DemoConfig

    sampler, settings = arm_settings(arm)
    values = {k: getattr(cfg, k) for k in DemoConfig.model_fields if k != "sampler"}
    values.update(settings, sampler=sampler, seed=seed, run_dir=root / f"{arm}-seed{seed}")
    return DemoConfig(_cli_parse_args=[], **values)


def _demo_args(arm) -> list[str]:
    """``prioreplay demo`` flags that rebuild the arm's settings."""
    from prioreplay.apps.demo_config import escape_stop

    args: list[str] = []
    for name, value in arm.model_dump().items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):  # an implicit flag: --name / --no-name
            args.append(flag if value else "--no-" + flag[2:])
        elif name == "stop":
            args += [a for v in value for a in (flag, escape_stop(v))]
        elif isinstance(value, list):
            args += [a for v in value for a in (flag, str(v))]
        else:
            args += [flag, str(value)]
    return args


def _run_concurrently(arms) -> list[int]:
    """Run each arm as its own ``prioreplay demo`` process (output to ``RUN_DIR/demo.out``); returns
    the exit codes in order. Ctrl-C / SIGTERM is passed on to every arm."""
    import signal
    import subprocess

    def _on_sigterm(signum, frame):  # stop the arms like on Ctrl-C (each stops its children)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    procs = []
    for arm in arms:
        Path(arm.run_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(arm.run_dir) / "demo.out", "ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "prioreplay.apps.cli", "demo", *_demo_args(arm)], stdout=out, stderr=subprocess.STDOUT
                )
            )
    try:
        return [p.wait() for p in procs]
    finally:  # every arm at once: each stops its children within a bounded time (demo_children)
        running = [p for p in procs if p.poll() is None]
        for p in running:
            p.terminate()
        for p in running:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()


def load_report(run_dir: Path) -> dict[str, Any]:
    """The ``report.json`` of a finished demo run directory.

    Raises:
        InvalidArgument: the directory holds no readable report.json (naming it and the fix).
    """
    path = Path(run_dir) / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidArgument(f"{path}: not a finished demo run ({e}); give directories that hold a report.json") from None


def run(cfg: CompareConfig) -> int:
    """Run (or read) every arm, then write the comparison; returns the exit code."""
    from prioreplay.apps import demo
    from prioreplay.process import setup_logging

    setup_logging("INFO")
    if not cfg.runs:
        demo.read_datasets(cfg)  # a malformed line ends here, with its file:line, before any folder is written
    root = Path(cfg.run_dir) if cfg.run_dir else Path("runs") / f"compare-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    root.mkdir(parents=True, exist_ok=True)
    settings = json.loads(cfg.model_dump_json())
    if cfg.runs:
        reports = [load_report(d) for d in cfg.runs]
        check_arms(reports)
        samplers = list(dict.fromkeys(arm_name(r["config"]) for r in reports))
        if len(samplers) < 2:
            raise InvalidArgument(f"the runs use one sampler only ({samplers[0]}); compare needs two or more")
    else:
        samplers, reports = cfg.samplers, []
        arms = [_arm_config(cfg, sampler, cfg.seed + k, root) for k in range(cfg.seeds) for sampler in samplers]
        for start in range(0, len(arms), cfg.parallel):
            batch = arms[start : start + cfg.parallel]
            for arm in batch:
                print(f"\n== arm {arm_name(arm.model_dump())}, seed {arm.seed} -> {arm.run_dir}", flush=True)
            codes = [demo.run(batch[0])] if len(batch) == 1 else _run_concurrently(batch)
            for arm, rc in zip(batch, codes, strict=True):
                if rc != 0:
                    print(
                        f"prioreplay compare: arm {arm_name(arm.model_dump())} seed {arm.seed} failed (exit {rc}); "
                        f"see {arm.run_dir}/logs",
                        file=sys.stderr,
                    )
                    return rc
                reports.append(load_report(arm.run_dir))
            check_arms(reports)
            write(root, settings, samplers, reports)
    out = write(root, settings, samplers, reports)
    print(f"\ncomparison: {root / 'compare.json'}\npicture:    {root / 'compare.png'}")
    for line in summary_lines(out):
        print(line)
    return 0
