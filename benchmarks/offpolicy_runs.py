"""Does the off-policy correction pay? The figures of a ``prioreplay compare`` whose arms differ only by
the learner's ``--off-policy-correction`` (``--samplers heap+icepop,heap+tis,heap+none``), with 95%
intervals over seeds, into ``benchmarks/results.json`` as ``offpolicy.run.<arm>.<figure>``.

Per arm (mean, Student-t interval over seeds, :func:`prioreplay.intervals.mean_interval`):

* ``heldout_point<k>``: held-out accuracy at the run's k-th evaluation (its ``heldout_curve``:
  before training, the ``--eval-points`` marks, after), with the rollouts of each seed's point;
* from each run's learner log (``learner.jsonl``, one JSON line per step): ``trained_steps``,
  ``stale_group_share`` (groups pulled but dropped as older than ``--max-staleness``), ``kl_ref_last`` (the k3
  KL to the reference at the last step, nats/token; needs ``--kl-coef`` > 0), ``grad_norm_mean`` and
  ``grad_norm_max`` (the global L2 norm before clipping), ``clipped_share`` (steps whose norm exceeded
  ``max_grad_norm``, so the update was clipped), ``nonfinite_share`` (steps skipped as non-finite),
  ``mismatch_kl_mean`` (k3 KL(μ‖π_prox)), ``truncated_frac_mean`` and ``masked_frac_mean``
  (tokens the correction truncated or masked), ``policy_age_max`` (the oldest group trained);
* against the baseline arm (the last one, ``heap+none``): ``heldout_change_vs_<baseline>``, the
  held-out accuracy after training minus the baseline's on the same seed and problems
  (:func:`prioreplay.apps.compare.summarize`: t-interval over seeds, Newcombe's pooled interval).

    python -m benchmarks.offpolicy_runs runs/COMPARE_DIR --out benchmarks/results.json \\
        --command "prioreplay compare ..." --note "load ..."

Runs that have not finished (no report.json) are left out and the seed count says so.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.results import Results, log, merge_results
from prioreplay.intervals import mean_interval

#: The learner's default gradient-norm clip (``LearnerConfig.max_grad_norm``); the demo does not change it.
MAX_GRAD_NORM = 1.0

#: Per-run learner figures, with their unit (the keys of :func:`learner_figures`).
LEARNER_FIGURES = {
    "trained_steps": "steps",
    "stale_group_share": "fraction of groups pulled",
    "kl_ref_last": "nats/token",
    "grad_norm_mean": "L2 norm",
    "grad_norm_max": "L2 norm",
    "clipped_share": "fraction of steps",
    "nonfinite_share": "fraction of steps",
    "mismatch_kl_mean": "nats/token",
    "truncated_frac_mean": "fraction of tokens",
    "masked_frac_mean": "fraction of tokens",
    "policy_age_max": "versions",
}


def learner_figures(lines: list[dict[str, Any]], max_grad_norm: float = MAX_GRAD_NORM) -> dict[str, float | None]:
    """One run's learner figures from its step lines (the learner log's JSON lines that carry ``step``).

    Args:
        lines: step records in order; a skipped step carries ``skipped`` ("non-finite").
        max_grad_norm: the clip the run used; a step whose ``grad_norm`` (before clipping) is above it
            was clipped.

    Returns:
        :data:`LEARNER_FIGURES` keys; a figure the lines lack is None (``kl_ref_last`` without a
        reference model reads 0 in the log, as the learner reports it).

    Raises:
        ValueError: no step lines (the run made no learner step).
    """
    if not lines:
        raise ValueError("learner_figures needs at least one step line; the run made no learner step")
    trained = [r for r in lines if not r.get("skipped")]
    norms = [float(r["grad_norm"]) for r in trained if math.isfinite(float(r.get("grad_norm", math.nan)))]

    def mean(key: str) -> float | None:
        vals = [float(r[key]) for r in trained if key in r]
        return sum(vals) / len(vals) if vals else None

    ages = [int(k.rsplit("_", 1)[1]) for r in trained for k in r if k.startswith("mismatch_kl_age_")]
    pulled = sum(int(r.get("groups_pulled", 0)) for r in lines)
    return {
        "trained_steps": float(len(trained)),
        "stale_group_share": sum(int(r.get("groups_stale", 0)) for r in lines) / pulled if pulled else None,
        "kl_ref_last": float(trained[-1]["kl"]) if trained and "kl" in trained[-1] else None,
        "grad_norm_mean": sum(norms) / len(norms) if norms else None,
        "grad_norm_max": max(norms) if norms else None,
        "clipped_share": sum(n > max_grad_norm for n in norms) / len(lines),
        "nonfinite_share": sum(r.get("skipped") == "non-finite" for r in lines) / len(lines),
        "mismatch_kl_mean": mean("mismatch_kl"),
        "truncated_frac_mean": mean("is_truncated_frac"),
        "masked_frac_mean": mean("is_masked_frac"),
        "policy_age_max": float(max(ages)) if ages else None,
    }


def summarize_dir(root: Path) -> dict[str, Any]:
    """Every finished run under the compare directory ``root``: compare's own summary (held-out
    change against the last arm, per-arm intervals), the held-out curves at common marks and the
    learner figures, per arm with intervals over seeds.

    Raises:
        InvalidArgument: no finished run, or runs that differ beyond the arm and the seed.
    """
    from prioreplay.apps.compare import check_arms, load_report, run_metrics, summarize
    from prioreplay.apps.demo import step_lines
    from prioreplay.errors import InvalidArgument

    dirs = sorted(d for d in root.iterdir() if (d / "report.json").is_file())
    if not dirs:
        raise InvalidArgument(f"{root}: no finished run (a directory with report.json); wait for the comparison")
    reports = [load_report(d) for d in dirs]
    check_arms(reports)
    runs = [run_metrics(r) for r in reports]
    order = json.loads((root / "compare.json").read_text())["samplers"] if (root / "compare.json").is_file() else []
    arms = [a for a in order if any(r["sampler"] == a for r in runs)] or list(dict.fromkeys(r["sampler"] for r in runs))
    summary = summarize(runs, arms)
    per_run = {d.name: learner_figures(step_lines((d / "learner.jsonl").read_text().splitlines())) for d in dirs}
    out: dict[str, Any] = {"arms": {}, "baseline": summary["baseline"]}
    for arm in arms:
        mine = [(r, d) for r, d in zip(runs, dirs, strict=True) if r["sampler"] == arm]
        figs: dict[str, Any] = {"seeds": sorted(r["seed"] for r, _ in mine)}
        points = [[p for p in r["heldout_curve"] or [] if p.get("accuracy") is not None] for r, _ in mine]
        for k in range(min(map(len, points), default=0)):  # the k-th evaluation of every seed
            figs[f"heldout_point{k}"] = {
                **_interval([pts[k]["accuracy"] for pts in points]),
                "rollouts": [pts[k]["rollouts"] for pts in points],
            }
        for key in LEARNER_FIGURES:
            vals = [v for _, d in mine if (v := per_run[d.name][key]) is not None]
            if vals:
                figs[key] = _interval(vals)
        vs = summary["vs_baseline"].get(arm, {}).get("heldout_change")
        if vs:
            figs[f"heldout_change_vs_{summary['baseline']}"] = {
                "mean": vs["mean"],
                "ci95": vs["ci95"],
                "values": vs["per_seed"],
                "pooled_ci95": vs.get("pooled_ci95"),
            }
        out["arms"][arm] = figs
    return out


def _interval(values: list[float]) -> dict[str, Any]:
    m, lo, hi = mean_interval(values)
    return {"mean": m, "ci95": [lo, hi] if len(values) > 1 else None, "values": values}


def table(summary: dict[str, Any]) -> list[str]:
    """A Markdown table: one row per arm, mean [95% interval] over seeds."""

    def cell(f: dict | None, scale: float = 1.0, fmt: str = ".3g") -> str:
        if not f:
            return "-"
        ci = f.get("ci95")
        return f"{f['mean'] * scale:{fmt}}" + (f" [{ci[0] * scale:{fmt}}, {ci[1] * scale:{fmt}}]" if ci else "")

    base = summary["baseline"]
    first = next(iter(summary["arms"].values()))
    marks = sorted((k for k in first if k.startswith("heldout_point")), key=lambda k: int(k[len("heldout_point") :]))
    head = [
        "arm",
        "seeds",
        "steps",
        *(f"held-out @ ~{sum(first[m]['rollouts']) / len(first[m]['rollouts']):.0f} rollouts, %" for m in marks),
        f"after − {base}, pts",
        "KL to ref (last step)",
        "grad norm mean",
        "grad norm max",
        "clipped steps",
        "non-finite steps",
        "KL(μ‖π_prox)",
        "truncated",
        "masked",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, f in summary["arms"].items():
        row = [
            f"`{arm}`",
            str(len(f["seeds"])),
            f"{f['trained_steps']['mean']:.1f}" if "trained_steps" in f else "-",
            *(cell(f.get(m), 100, ".1f") for m in marks),
            cell(f.get(f"heldout_change_vs_{base}"), 100, "+.1f"),
            cell(f.get("kl_ref_last")),
            cell(f.get("grad_norm_mean")),
            cell(f.get("grad_norm_max")),
            cell(f.get("clipped_share"), 100, ".0f") + "%",
            cell(f.get("nonfinite_share"), 100, ".0f") + "%",
            cell(f.get("mismatch_kl_mean")),
            cell(f.get("truncated_frac_mean"), 100, ".2f") + "%",
            cell(f.get("masked_frac_mean"), 100, ".2f") + "%",
        ]
        rows.append("| " + " | ".join(row) + " |")
    return rows


def result_items(summary: dict[str, Any], command: str, note: str, prefix: str = "offpolicy.run.") -> list[dict[str, Any]]:
    """``<prefix><arm>.<figure>`` entries for results.json: value the mean over seeds, with
    ``ci95`` (None with one seed), the per-seed ``values`` and the ``seeds``."""
    res = Results(command, note=note, prefix=prefix)
    for arm, figs in summary["arms"].items():
        for key, f in figs.items():
            if key == "seeds":
                continue
            unit = LEARNER_FIGURES.get(key, "fraction (accuracy)" if key.startswith("heldout_point") else "fraction (difference)")
            extra = {"ci95": f["ci95"], "values": f["values"], "seeds": figs["seeds"]}
            extra.update({k: f[k] for k in ("pooled_ci95", "rollouts") if f.get(k) is not None})
            res.add(f"{arm}.{key}", f["mean"], unit, **extra)
    return res.items


def main(argv: list[str] | None = None) -> int:
    """Summarize a finished (or partly finished) correction comparison; print the table, write the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("compare_dir", type=Path, help="the compare directory (its <arm>-seed<k> runs)")
    p.add_argument("--out", type=Path, default=None, help="merge the figures into this results.json")
    p.add_argument("--command", default="", help="the compare command that made the runs (stored with each figure)")
    p.add_argument("--note", default="", help="measurement conditions: load (uptime), machine")
    p.add_argument("--prefix", default="offpolicy.run.", help="figure names start with this (e.g. offpolicy.run_long.)")
    a = p.parse_args(argv)
    summary = summarize_dir(a.compare_dir)
    print("\n".join(table(summary)))
    (a.compare_dir / "offpolicy_runs.json").write_text(json.dumps(summary, indent=1))
    if a.out:
        command = f"{a.command}; python -m benchmarks.offpolicy_runs COMPARE_DIR".lstrip("; ")
        merge_results(a.out, result_items(summary, command, a.note, a.prefix))
        log(f"wrote {sum(len(f) - 1 for f in summary['arms'].values())} figures to {a.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
