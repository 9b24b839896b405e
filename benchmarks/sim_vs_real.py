"""The simulator's prediction for a real comparison, to set beside what the real runs measure.

A real ``prioreplay compare`` is rebuilt in the simulator (:class:`Protocol`): the pool (its size
and the pass-rate tiers of its data set), G, the lease size B, the learner's ``batch_groups``, the
budget 2R in rollouts, the held-out evaluations (``--eval-points N``: N + 2 points in [0, 2R], each
the policy of the moment the rollouts reach the mark, scored on ``eval_size`` problems with their
binomial noise) and the seeds. The learner is the real system's model (``sim_learner.SystemModel``:
a trajectory queue, a step per ``batch_groups`` groups lasting ``step_time`` lease generations,
stale groups dropped, generation paced or not, an Adam-like step). Rollouts to target is read as
compare reads it (:func:`prioreplay.curves.ratio_to_target`, each seed's target grpo's mean
accuracy at R over its other seeds), so the prediction and the measurement are the same figure.

The arms are compare's (:data:`ARMS`): ``grpo`` (every generated group trained once, zero-variance
ones included), ``dapo`` (zero-variance groups filtered, a step per ``batch_groups`` mixed groups),
``heap``, ``heap-grpo`` (heap's selection, GRPO's training rule) and ``heap-prior`` (unseen problems
at the population's fitted prior, the store's ``unseen_prior`` setting).

    python -m benchmarks.sim_vs_real --protocol decision --out benchmarks/results.json
    python -m benchmarks.sim_vs_real --measured runs/decision/compare.json --out benchmarks/results.json

The first prints and records ``method.sim_vs_real.<arm>.predicted`` (ratios against grpo and dapo
with their intervals over the simulated seeds, and the interval a real comparison with the
protocol's seeds would show around the same centre); the second sets a finished comparison's
measured ratios beside the prediction (:func:`measured_items`): ``method.sim_vs_real.<arm>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.sim_arms import Method
from benchmarks.sim_learner import SystemModel
from benchmarks.sim_loop import RunResult, run_one
from benchmarks.sim_population import SimParams
from prioreplay.curves import Curve, leave_one_out_targets, ratio_to_target
from prioreplay.intervals import t975

#: compare's arms (``prioreplay/apps/compare_config.py``) as the simulator runs them.
ARMS: tuple[Method, ...] = (
    Method(
        "grpo",
        "plain GRPO (TRL): uniform, every generated group trained once, zero-variance ones included",
        "uniform",
        0.0,
        dilute=True,
    ),
    Method(
        "dapo", "DAPO: uniform, zero-variance groups filtered at generation, a step per batch of mixed groups", "uniform", 0.0
    ),
    Method("heap", "heap + retest 0.1 (the paper), zero-variance groups filtered", "heap", 0.1),
    Method("heap-grpo", "heap's selection with GRPO's training rule (zero-variance groups trained)", "heap", 0.1, dilute=True),
    Method(
        "heap-prior",
        "heap, unseen problems at the population's fitted prior (--unseen-prior fit)",
        "heap",
        0.1,
        store=(("unseen_prior", "fit"),),
    ),
)

#: arithmetic's ``tiers`` set for SmolLM2-135M-Instruct at temperature 0.7 (``mix.task.arith-*`` in
#: benchmarks/RESULTS.md, first-visit pass rates at G = 4): trivial (pass rate 0.38, 7 of 8 groups
#: mixed), easy (0.16, 5 of 8 all wrong), hard (0: every group all wrong), as logit laws (μ, σ).
TIERS = ((-0.5, 0.5), (-2.4, 1.5), (-6.0, 1.0))
#: arithmetic's ``easy`` set (``demo_defaults.passrate.easy_*``: pass rate 0.25, half the groups all
#: wrong, one in eight all right) as one logit law.
EASY = ((-1.9, 2.7),)


@dataclass(frozen=True)
class Protocol:
    """A real comparison in the simulator's terms (one skill per tier, which the held-out problems
    of the tier share; the learning rates ``lr_problem``, ``lr_skill`` per unit ω̂ of a step after
    the Adam-like normalisation).

    Attributes:
        name, dataset: the protocol and the real data set it stands for.
        tiers: the data set's pass-rate tiers as logit laws (``SimParams.tiers``).
        problems, group_size, lease_size, batch_groups: N, G, the worker's B, the learner's batch.
        rollouts: every arm's budget, 2R (R = half of it: where the target is read).
        eval_points: ``--eval-points`` N (N + 2 evaluations with before and after).
        eval_size: held-out problems per evaluation.
        seeds: the seeds a real comparison of this protocol runs (the width of its intervals).
        pace: the pace K in learner batches (None: unpaced).
        step_time: a learner step in lease generation times (:class:`SystemModel`).
        max_staleness: the learner's ``--max-staleness``.
        adam: the optimizer's normalisation γ (:class:`~benchmarks.sim_learner.StepNorm`; 0: SGD).
        lr_problem, lr_skill: the population's learning rates (``SimParams``); ``lr_skill`` set so
            that the ``demo`` protocol's unpaced dapo gains about 25 points of held-out accuracy by
            2R and grpo about 17, near the first real comparison's accuracies at 2R (0.56 and 0.48).
        eval_noise: score the held-out problems with their binomial noise (False: the exact mean
            pass@1 of the ``eval_size`` problems, to read the learning dynamics alone).
    """

    name: str
    dataset: str
    tiers: tuple[tuple[float, float], ...]
    problems: int
    group_size: int = 4
    lease_size: int = 8
    batch_groups: int = 4
    rollouts: int = 768
    eval_points: int = 5
    eval_size: int = 64
    seeds: int = 3
    pace: int | None = None
    step_time: float = 2.0
    max_staleness: int = 4
    adam: float = 1.0
    lr_problem: float = 3.5
    lr_skill: float = 0.4
    eval_noise: bool = True

    def params(self) -> SimParams:
        """The population and budget (a skill per tier, no drift)."""
        return SimParams(
            n_problems=self.problems,
            n_skills=len(self.tiers),
            skill_sd=0.0,
            group_size=self.group_size,
            batch_size=self.lease_size,
            budget_rollouts=self.rollouts,
            lr_problem=self.lr_problem,
            lr_skill=self.lr_skill,
            forget_drift=0.0,
            n_heldout=self.eval_size,
            tiers=self.tiers,
        )

    def system(self) -> SystemModel:
        """The real learner's model for this protocol."""
        return SystemModel(
            batch_groups=self.batch_groups,
            lease_size=self.lease_size,
            step_time=self.step_time,
            max_staleness=self.max_staleness,
            pace=self.pace,
            adam=self.adam,
        )


PROTOCOLS: dict[str, Protocol] = {
    # the first real comparison (docs/METHOD.md, "The real-run plan"): unpaced, the learner sets the pace
    "demo": Protocol("demo", "arithmetic:64:0:easy, unpaced (the first real comparison)", EASY, 64, seeds=3),
    # issue 42's regime for the decision (docs/METHOD.md, "The decision plan"): 512 problems with both
    # tails, G = 4, 2R = 1,024 rollouts (half an epoch), 256 held-out problems, 6 seeds, paced (K = 1)
    "decision": Protocol(
        "decision",
        "arithmetic:512:0:tiers, paced K = 1, 2R = 1,024 rollouts (issue 42's decision plan)",
        TIERS,
        512,
        rollouts=1024,
        eval_points=7,
        eval_size=256,
        seeds=6,
        pace=1,
    ),
}


def with_overrides(protocol: Protocol, items: list[str]) -> Protocol:
    """``protocol`` with fields set from ``FIELD=VALUE`` strings (``none`` for a field that may be
    None, ``true``/``false`` for a flag).

    Raises:
        SystemExit: an unknown field or a value of the wrong kind (the message names both).
    """
    fields = {f: type(getattr(protocol, f)) for f in asdict(protocol)}
    changes: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        if key not in fields or key in ("name", "tiers"):
            raise SystemExit(
                f"--set {item!r}: unknown field {key!r}; choose from {', '.join(f for f in fields if f not in ('name', 'tiers'))}"
            )
        try:
            if raw.lower() == "none" and key == "pace":
                changes[key] = None
            elif fields[key] is bool:
                changes[key] = {"true": True, "false": False}[raw.lower()]
            else:
                changes[key] = (int if key == "pace" else fields[key])(raw)
        except (KeyError, ValueError):
            raise SystemExit(f"--set {item!r}: {raw!r} is not a value for {key}") from None
    return replace(protocol, **changes)


def eval_curve(run: RunResult, protocol: Protocol, rng: np.random.Generator, before: float) -> Curve:
    """The run's held-out curve as compare reads it: N + 2 marks in [0, 2R], each the policy when
    the rollouts first reach the mark, scored with the binomial noise of ``eval_size`` problems;
    ``before`` (the score of the untrained model, the same for every arm of a seed) at 0."""
    marks = np.linspace(0.0, protocol.rollouts, protocol.eval_points + 2)  # (N + 2,)
    xs = np.asarray(run.curve_rollouts, float)
    at = np.minimum(np.searchsorted(xs, marks, side="left"), xs.size - 1)  # first point at or past each mark
    p = np.clip(np.asarray(run.curve_heldout, float)[at], 0.0, 1.0)  # (N + 2,)
    acc = rng.binomial(protocol.eval_size, p) / protocol.eval_size if protocol.eval_noise else p
    acc[0] = before if protocol.eval_noise else p[0]
    return Curve(tuple(float(m) for m in marks), tuple(float(a) for a in acc))


def predict(protocol: Protocol, seeds: list[int], arms: list[Method], progress: bool = True) -> dict[str, Any]:
    """Run every arm on every seed under the real learner's model; the figures per arm.

    Returns:
        {"protocol", "seeds", "arms": {arm: {"vs_grpo", "vs_dapo" (TargetRatio or absent),
        "trained_share" and "stale_share" (of the groups queued for the learner), "filtered_share"
        (of the groups generated: zero-variance ones the arm does not queue), "steps", "final"
        (held-out at 2R, mean over seeds)}}, "wall_s"}.
    """
    t0 = time.perf_counter()
    params, system = protocol.params(), protocol.system()
    curves: dict[str, dict[int, Curve]] = {m.name: {} for m in arms}
    runs: dict[str, list[RunResult]] = {m.name: [] for m in arms}
    for s in seeds:
        before_rng = np.random.default_rng([s, 7])
        before = None
        for k, m in enumerate(arms):
            r = asyncio.run(run_one(params, m, s, system=system))
            if before is None:
                before = float(
                    before_rng.binomial(protocol.eval_size, min(max(r.curve_heldout[0], 0.0), 1.0)) / protocol.eval_size
                )
            curves[m.name][s] = eval_curve(r, protocol, np.random.default_rng([s, 8, k]), before)
            runs[m.name].append(r)
        if progress:
            print(f"sim_vs_real: seed {s} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    targets = leave_one_out_targets(curves["grpo"], {s: protocol.rollouts / 2 for s in seeds})
    out: dict[str, Any] = {"protocol": asdict(protocol), "seeds": seeds, "arms": {}}
    for m in arms:
        e: dict[str, Any] = {"label": m.label}
        for base in ("grpo", "dapo"):
            if base in curves:
                e[f"vs_{base}"] = ratio_to_target(curves[m.name], curves[base], targets)
        counts = [r.groups for r in runs[m.name]]
        e["trained_share"] = statistics.fmean(c["trained"] / max(c["queued"], 1) for c in counts)
        e["stale_share"] = statistics.fmean(c["stale"] / max(c["queued"], 1) for c in counts)
        e["filtered_share"] = statistics.fmean(1 - c["queued"] / c["generated"] for c in counts)
        e["steps"] = statistics.fmean(r.optimizer_steps for r in runs[m.name])
        e["final"] = statistics.fmean(c.final for c in curves[m.name].values())
        out["arms"][m.name] = e
    out["wall_s"] = time.perf_counter() - t0
    return out


def real_interval(r: Any, n: int) -> list[float]:
    """The 95% interval a real comparison of ``n`` seeds would show around the predicted centre:
    exp(log ratio ± t(n − 1) · sd / √n), sd the per-seed log ratios' spread in the simulation."""
    logs = [math.log(x) for x in r.per_seed]
    if len(logs) < 2 or n < 2:
        return [math.nan, math.nan]
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return [r.ratio * math.exp(-half), r.ratio * math.exp(half)]


def _figure(r: Any, n: int) -> dict[str, Any]:
    return {
        "ratio": r.ratio,
        "ci95": [r.ci_low, r.ci_high],
        "real_seeds_ci95": real_interval(r, n),
        "per_seed": list(r.per_seed),
        "censored_arm": list(r.censored_arm),
        "censored_base": list(r.censored_base),
        "bound": r.bound,
        "left_out": list(r.left_out),
    }


def prefix_of(label: str) -> str:
    """The results.json prefix of a prediction's figures: ``method.sim_vs_real.`` for the
    ``decision`` protocol, ``method.sim_vs_real.<label>.`` for the others (a protocol's name, or
    the ``--label`` of a variant)."""
    return "method.sim_vs_real." + ("" if label == "decision" else f"{label}.")


def predicted_items(out: dict[str, Any], command: str, note: str, label: str = "") -> list[dict[str, Any]]:
    """results.json entries ``<prefix><arm>.predicted``: the value is the ratio against grpo (1 for
    grpo), the ratio against dapo beside it, each with the interval over the simulated seeds and
    the one a real comparison of the protocol's seeds would show; ``label`` names a variant of the
    protocol (default: the protocol's name, :func:`prefix_of`)."""
    from benchmarks.results import Results

    p = out["protocol"]
    res = Results(command, note=note, prefix=prefix_of(label or p["name"]))
    for arm, e in out["arms"].items():
        figs = {base: _figure(e[f"vs_{base}"], p["seeds"]) for base in ("grpo", "dapo") if f"vs_{base}" in e}
        g = figs["grpo"]
        res.add(
            f"{arm.replace('-', '_')}.predicted",
            g["ratio"],
            "ratio",
            ci_low=g["ci95"][0],
            ci_high=g["ci95"][1],
            ci95=g["ci95"],
            vs_grpo=g,
            vs_dapo=figs.get("dapo"),
            trained_share=e["trained_share"],
            stale_share=e["stale_share"],
            filtered_share=e["filtered_share"],
            steps=e["steps"],
            heldout_at_2r=e["final"],
            seeds=out["seeds"],
            protocol=p,
            how=f"simulator, the real learner's model ({p['dataset']}): rollouts to grpo's mean held-out accuracy at R over "
            "its other seeds, grpo's (and dapo's) over the arm's, geometric mean of per-seed ratios with a t-interval of the "
            f"log ratio over {len(out['seeds'])} simulated seeds (ci95); real_seeds_ci95: the interval {p['seeds']} real "
            "seeds would show around the same centre",
        )
    return res.items


def lines(out: dict[str, Any]) -> list[str]:
    """One line per arm."""
    n = out["protocol"]["seeds"]
    text = []
    for arm, e in out["arms"].items():
        parts = [f"{arm:<10}"]
        for base in ("grpo", "dapo"):
            r = e.get(f"vs_{base}")
            if r is not None and arm != base:
                lo, hi = real_interval(r, n)
                parts.append(
                    f"vs {base} {r.ratio:.3f}x [{r.ci_low:.3f}, {r.ci_high:.3f}] ({n} real seeds: [{lo:.2f}, {hi:.2f}]"
                    f"{', censored ' + str(r.censored) if r.censored else ''})"
                )
        parts.append(
            f"filtered {e['filtered_share']:.0%} of groups; of those queued trained {e['trained_share']:.0%}, stale "
            f"{e['stale_share']:.0%}; {e['steps']:.1f} steps"
        )
        parts.append(f"held-out at 2R {e['final']:.3f}")
        text.append("; ".join(parts))
    return text


def measured_items(
    compare: dict[str, Any], results: list[dict[str, Any]], label: str, command: str, note: str
) -> list[dict[str, Any]]:
    """``<prefix><arm>``: a finished comparison's measured ratios (its ``compare.json``'s
    ``rollouts_to_target``) beside the prediction already in ``results``, both with their
    intervals, and whether each predicted ratio lies in the measured interval; ``label``: the
    prediction's (:func:`prefix_of`).

    Raises:
        ValueError: ``results`` holds no prediction for the protocol (run the prediction first).
    """
    from benchmarks.results import Results

    prefix = prefix_of(label)
    predicted = {
        i["name"][len(prefix) : -len(".predicted")]: i
        for i in results
        if i["name"].startswith(prefix) and i["name"].endswith(".predicted")
    }
    if not predicted:
        raise ValueError(
            f"results hold no {prefix}<arm>.predicted: run python -m benchmarks.sim_vs_real (--protocol or --label {label}) first"
        )
    rtt = compare.get("rollouts_to_target") or {}
    res = Results(command, note=note, prefix=prefix)
    for arm in compare.get("samplers", []):
        key = arm.replace("-", "_")
        if key not in predicted:
            continue
        pred, meas = predicted[key], {}
        for base in ("grpo", "dapo"):
            r = rtt.get(f"{arm}_vs_{base}")
            if r and r.get("seeds"):
                meas[f"vs_{base}"] = {
                    k: r.get(k) for k in ("ratio", "ci_low", "ci_high", "per_seed", "seeds", "censored", "bound")
                }
        within = {}
        for base, m in meas.items():
            p = pred.get(base) or {}
            within[base] = bool(p) and m["ci_low"] <= p["ratio"] <= m["ci_high"]
        g = meas.get("vs_grpo", {})
        res.add(
            key,
            g.get("ratio", 1.0 if arm == "grpo" else math.nan),
            "ratio",
            ci_low=g.get("ci_low"),
            ci_high=g.get("ci_high"),
            predicted={"vs_grpo": pred.get("vs_grpo"), "vs_dapo": pred.get("vs_dapo")},
            measured=meas,
            predicted_in_measured_ci95=within,
            how="the measured rollouts-to-target ratios of a real prioreplay compare (value: against grpo) beside the "
            f"simulator's prediction for the same protocol ({prefix}{key}.predicted); predicted_in_measured_ci95: "
            "whether each predicted ratio lies in the measured 95% interval",
        )
    return res.items


def main(argv: list[str] | None = None) -> int:
    """Predict a protocol's comparison, or set a measured one beside the prediction."""
    from benchmarks.results import RESULTS, merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_vs_real", description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="decision", choices=sorted(PROTOCOLS))
    ap.add_argument("--seeds", type=int, default=24, help="simulated paired seeds (default 24)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the protocol (repeatable), e.g. pace=none, rollouts=4096, eval_size=256, adam=0.5",
    )
    ap.add_argument("--exact", action="store_true", help="held-out accuracy without evaluation noise (the dynamics alone)")
    ap.add_argument(
        "--label", default="", help="the figures' name in results.json: method.sim_vs_real.<label>.* (default: the protocol's)"
    )
    ap.add_argument("--measured", type=Path, help="instead: a finished comparison's compare.json to set beside the prediction")
    ap.add_argument("--out", type=Path, help="results.json to merge the figures into")
    ap.add_argument("--note", default="", help="anything a reader of results.json should know")
    a = ap.parse_args(argv)
    command = "python -m benchmarks.sim_vs_real " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.measured:
        results = json.loads((a.out or RESULTS).read_text())
        items = measured_items(json.loads(a.measured.read_text()), results, a.label or a.protocol, command, a.note)
        for i in items:
            print(i["name"], json.dumps({"measured": i["measured"], "within": i["predicted_in_measured_ci95"]}))
        if a.out:
            merge_results(a.out, items)
        return 0
    protocol = with_overrides(PROTOCOLS[a.protocol], [*a.set, *(["eval_noise=false"] if a.exact else [])])
    out = predict(protocol, list(range(a.seeds)), list(ARMS))
    for line in lines(out):
        print(line)
    print(f"wall {out['wall_s']:.0f} s", file=sys.stderr)
    if a.out:
        merge_results(a.out, predicted_items(out, command, a.note, a.label))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
