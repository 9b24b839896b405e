"""Section 8's decision rule as code: which sampler and retest setting become the default.

docs/METHOD.md ("How a default is chosen") states the rule, written before any of its runs; this module applies it to
finished ``prioreplay compare`` runs, prints the verdict and writes the figures the issue names
into results.json (``compare.<set>.<arm>.useful_tokens_ratio_vs_uniform``,
``compare.<set>.<arm>.heldout_change_vs_uniform``, ``compare.<set>.<arm>.pool_misfiled_share``)::

    python -m benchmarks.decision --mix runs/dr/mix-s* --easy runs/dr/easy-s* --out benchmarks/results.json

The baseline is ``dapo`` (uniform problems, zero-variance groups dropped; ``uniform`` in runs made
before compare named it so); ``grpo`` runs beside it are neither a candidate nor a setting.
``--name demo`` files one set's figures as ``compare.demo.*`` (the retest-setting rule reads one set).

The rule, restated (arms against ``uniform``, the DAPO-filtered baseline, paired by seed):

* A **sampler** replaces ``heap`` as the default only if, on the mix, its held-out accuracy minus
  uniform's has a 95% t-interval across seeds wholly above zero **and** its useful-token ratio
  (useful tokens per completion token, arm over uniform, paired bootstrap) an interval wholly
  above 1, and on the easy set its held-out difference interval does not lie wholly below zero.
  If several pass, the one with the larger mean held-out difference on the mix.
* A **retest setting** (an arm of :data:`SETTING_ARMS`: a sampler run with other retest settings)
  becomes the default only if, on the mix, it lowers the pool audit's misfiled share against the
  same sampler without it (paired difference, interval wholly below zero) and its held-out
  accuracy is not lower (interval of the difference not wholly below zero).
* One seed gives no interval, so nothing changes on one seed: the verdict is "undecided".

The issue's targets are reported beside the rule (met or not, never used to decide): on the
mix, useful tokens ≥ 1.5× uniform's and a held-out difference whose interval excludes zero;
misfiled pooled problems ≤ 10%.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prioreplay.apps.compare_config import SETTING_ARMS as _COMPARE_SETTING_ARMS

#: the DAPO-filtered uniform baseline: ``prioreplay compare`` names it ``dapo``; runs read from before that
#: name carry ``uniform`` and are renamed (:func:`summarize_set`). Figures keep their ``_vs_uniform`` names.
BASELINE = "dapo"
OLD_BASELINE = "uniform"
#: the other baseline, plain GRPO: neither a candidate sampler nor a retest setting
BASELINES = (BASELINE, "grpo")
DEFAULT_SAMPLER = "heap"
#: arms that are a sampler with other retest settings, judged against that sampler without them
SETTING_ARMS = {arm: sampler for arm, (sampler, _) in _COMPARE_SETTING_ARMS.items() if arm not in BASELINES}
USEFUL_TARGET = 1.5
MISFILED_TARGET = 0.10


def load_runs(dirs: list[Path]) -> list[dict[str, Any]]:
    """The per-run figures (:func:`prioreplay.apps.compare.run_metrics`) of every finished demo
    run under ``dirs``: a demo run directory (holding report.json) or a compare directory (whose
    ``<arm>-seed<k>/`` subdirectories hold them).

    Raises:
        InvalidArgument: a directory holds no finished run, or two runs share an arm and seed.
    """
    from prioreplay.apps.compare import check_arms, load_report, run_metrics
    from prioreplay.errors import InvalidArgument

    found: list[Path] = []
    for d in dirs:
        if (d / "report.json").is_file():
            found.append(d)
        else:
            sub = sorted(p.parent for p in d.glob("*/report.json"))
            if not sub:
                raise InvalidArgument(f"{d}: no report.json in it or its subdirectories; give demo or compare run directories")
            found += sub
    reports = [load_report(d) for d in found]
    check_arms(reports)
    return [run_metrics(r) for r in reports]


def _interval(fig: dict[str, Any] | None) -> list[float] | None:
    """A figure's 95% interval; None where the figure is missing or has none (one seed)."""
    return fig.get("ci95") if fig else None


def judge_sampler(mix: dict[str, Any], easy: dict[str, Any] | None, arm: str) -> dict[str, Any]:
    """The rule's verdict for one sampler arm: ``passes`` True/False, or None (undecided: an
    interval is missing, e.g. one seed or a set not run), with each condition's reading."""
    vs = mix["vs_baseline"].get(arm) or {}
    held, useful = vs.get("heldout_change"), vs.get("useful_tokens_ratio")
    hi, ui = _interval(held), _interval(useful)
    conds: dict[str, bool | None] = {
        "mix_heldout_above_zero": hi[0] > 0 if hi else None,
        "mix_useful_ratio_above_1": ui[0] > 1 if ui else None,
    }
    evs = (easy or {}).get("vs_baseline", {}).get(arm) or {}
    ei = _interval(evs.get("heldout_change"))
    conds["easy_heldout_not_below_zero"] = ei[1] >= 0 if ei else None
    return {"arm": arm, "conditions": conds, "passes": _all(conds)}


def judge_setting(summary_vs_sampler: dict[str, Any], arm: str) -> dict[str, Any]:
    """The rule's verdict for a retest-setting arm against the same sampler without it (the
    output of :func:`prioreplay.apps.compare.against_baseline` with that sampler as baseline)."""
    mi = _interval(summary_vs_sampler.get("pool_misfiled_share_change"))
    hi = _interval(summary_vs_sampler.get("heldout_change"))
    conds = {
        "misfiled_share_lower": mi[1] < 0 if mi else None,
        "heldout_not_lower": hi[1] >= 0 if hi else None,
    }
    return {"arm": arm, "against": SETTING_ARMS[arm], "conditions": conds, "passes": _all(conds)}


def _all(conds: dict[str, bool | None]) -> bool | None:
    if any(v is False for v in conds.values()):
        return False
    return None if any(v is None for v in conds.values()) else True


def summarize_set(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`prioreplay.apps.compare.summarize` of one set's runs, plus each setting arm against
    its own sampler (``vs_sampler``).

    Raises:
        InvalidArgument: the runs lack the uniform baseline.
    """
    from prioreplay.apps.compare import against_baseline, summarize
    from prioreplay.errors import InvalidArgument

    runs = [dict(r, sampler=BASELINE) if r["sampler"] == OLD_BASELINE else r for r in runs]
    arms = list(dict.fromkeys(r["sampler"] for r in runs))
    if BASELINE not in arms:
        raise InvalidArgument(
            f"the runs hold arms {arms} but no {BASELINE!r} (uniform, DAPO-filtered): the rule compares every arm with it"
        )
    out = summarize(runs, arms)
    by_arm = {a: {r["seed"]: r for r in runs if r["sampler"] == a} for a in arms}
    out["vs_sampler"] = {}
    for arm, sampler in SETTING_ARMS.items():
        if arm in by_arm and sampler in by_arm:
            common = sorted(set(by_arm[arm]) & set(by_arm[sampler]))
            out["vs_sampler"][arm] = against_baseline(by_arm[arm], by_arm[sampler], common)
    return out


def decide(mix: dict[str, Any], easy: dict[str, Any] | None) -> dict[str, Any]:
    """Apply the rule to the summaries of the mix and the easy set (:func:`summarize_set`).

    Returns ``default_sampler``, ``default_retest_setting`` (None: the paper's step clock stays),
    the verdicts per arm and the targets per arm of the mix."""
    samplers = [a for a in mix["arms"] if a not in (*BASELINES, DEFAULT_SAMPLER) and a not in SETTING_ARMS]
    verdicts = {a: judge_sampler(mix, easy, a) for a in samplers}
    winners = [a for a, v in verdicts.items() if v["passes"]]
    held = {a: mix["vs_baseline"][a]["heldout_change"]["mean"] for a in winners}
    settings = {a: judge_setting(mix["vs_sampler"][a], a) for a in SETTING_ARMS if a in mix.get("vs_sampler", {})}
    return {
        "default_sampler": max(winners, key=held.__getitem__) if winners else DEFAULT_SAMPLER,
        "default_retest_setting": next((a for a, v in settings.items() if v["passes"]), None),
        "samplers": verdicts,
        "settings": settings,
        "targets": {a: targets(mix, a) for a in mix["arms"] if a not in BASELINES},
    }


def targets(summary: dict[str, Any], arm: str) -> dict[str, Any]:
    """The issue's three targets for one arm of a set (reported, never used to decide)."""
    vs = summary["vs_baseline"].get(arm) or {}
    useful, held = vs.get("useful_tokens_ratio"), vs.get("heldout_change")
    mis = summary["arms"][arm].get("pool_misfiled_share")
    hi = _interval(held)
    return {
        "useful_tokens_ratio_ge_1_5": useful["ratio"] >= USEFUL_TARGET if useful else None,
        "heldout_above_uniform_ci_excludes_zero": hi[0] > 0 if hi else None,
        "misfiled_le_10pct": mis["mean"] <= MISFILED_TARGET if mis else None,
    }


def result_items(name: str, summary: dict[str, Any], command: str, note: str) -> list[dict[str, Any]]:
    """results.json entries ``compare.<name>.<arm>.<figure>`` for every arm of one set."""
    from benchmarks.results import Results

    res = Results(command, note=note, prefix=f"compare.{name}.")
    seeds = summary["paired_seeds"]
    for arm, a in summary["arms"].items():
        for key, unit in (
            ("pool_misfiled_share", "fraction"),
            ("useful_token_fraction", "fraction"),
            ("accuracy_after", "fraction"),
            ("completion_tokens", "tokens"),
            ("wall_clock_s", "s"),
        ):
            if key in a:
                res.add(
                    f"{arm}.{key}",
                    a[key]["mean"],
                    unit,
                    ci95=a[key]["ci95"],
                    values=a[key]["values"],
                    seeds=a["seeds"],
                    how="mean over seeds, 95% t-interval across seeds",
                )
        vs = summary["vs_baseline"].get(arm)
        if not vs:
            continue
        if vs["useful_tokens_ratio"]:
            u = vs["useful_tokens_ratio"]
            res.add(
                f"{arm}.useful_tokens_ratio_vs_uniform",
                u["ratio"],
                "ratio",
                ci95=u["ci95"],
                values=u["per_seed"],
                seeds=seeds,
                how="useful tokens per completion token, arm over uniform; paired bootstrap across seeds",
                target=f">= {USEFUL_TARGET} (issue 24, on the mix)",
                met=u["ratio"] >= USEFUL_TARGET,
            )
        if vs["heldout_change"]:
            h = vs["heldout_change"]
            ci = h["ci95"]
            res.add(
                f"{arm}.heldout_change_vs_uniform",
                h["mean"],
                "fraction",
                ci95=ci,
                pooled_ci95=h.get("pooled_ci95"),
                values=h["per_seed"],
                seeds=seeds,
                how=(
                    "held-out accuracy after training, arm minus uniform per seed; mean, 95% t-interval across "
                    "seeds (pooled_ci95: Newcombe over every seed and problem)"
                ),
                target="> 0 with the interval above zero (issue 24, on the mix)",
                met=bool(ci and ci[0] > 0),
            )
    return res.items


def main(argv: list[str] | None = None) -> int:
    """Print the rule's verdict for the runs given; with ``--out`` merge the figures into it."""
    from benchmarks.results import merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.decision", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", nargs="+", type=Path, required=True, help="compare or demo run directories of the mix")
    ap.add_argument(
        "--easy",
        nargs="*",
        type=Path,
        default=[],
        help="the same for the easy set (may be left out: the rule then stays undecided)",
    )
    ap.add_argument(
        "--name",
        default="mix",
        help="the --mix set's name in results.json (compare.<name>.*): e.g. demo when the runs are the default demo's "
        "set (the retest-setting rule reads any one set)",
    )
    ap.add_argument("--out", type=Path, help="results.json to merge the figures into")
    ap.add_argument("--json", type=Path, help="write the summaries and the verdict here")
    ap.add_argument("--note", default="", help="the load and anything else a reader of results.json should know")
    a = ap.parse_args(argv)
    mix = summarize_set(load_runs(a.mix))
    easy = summarize_set(load_runs(a.easy)) if a.easy else None
    verdict = decide(mix, easy)
    print(json.dumps(verdict, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"mix": mix, "easy": easy, "verdict": verdict}, indent=1, default=str))
    if a.out:
        command = "python -m benchmarks.decision " + " ".join(sys.argv[1:] if argv is None else argv)
        items = result_items(a.name, mix, command, a.note) + (result_items("easy", easy, command, a.note) if easy else [])
        merge_results(a.out, items)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
