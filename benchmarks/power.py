"""How many seeds decide a held-out difference, read off a real comparison's learning curves.

Issue 35 asks how many seeds and learner steps detect a 5-point held-out difference between an arm
and a baseline. A ``prioreplay compare`` run with ``--eval-points`` scores every run on the same
held-out problems at the same marks of the budget, so at each mark k the paired difference
d_s(k) = acc_arm,s(k) − acc_base,s(k) over seeds s has a standard deviation σ(k), and a two-sided
paired test at α = 0.05 with 80% power needs about

    n(k) = ((z₀.₉₇₅ + z₀.₈) · σ(k) / δ)²,   z₀.₉₇₅ = 1.96, z₀.₈ = 0.84

seeds to detect a difference δ (the normal approximation docs/METHOD.md used for the mix runs; with
few seeds the t-test needs a little more). σ(k) against the learner steps at mark k shows whether
longer runs shrink the seed-to-seed spread, which is what decides how long runs must be::

    python -m benchmarks.power runs/method-real --base grpo --delta 0.05 --out benchmarks/results.json

writes ``method.power.<arm>_vs_<base>.sigma_at_<i>`` (the paired difference's standard deviation at
kept version i, in accuracy points as a fraction) and ``method.power.<arm>_vs_<base>.seeds_for_5pts``
(the seeds n at the last mark). σ from a handful of seeds is itself uncertain (its relative standard
error is about 1/√(2(n − 1))), which the figures' notes state.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

Z_ALPHA = 1.959963984540054  # two-sided α = 0.05
Z_POWER = 0.8416212335729143  # power 0.8


def seeds_needed(sigma: float, delta: float) -> float:
    """Seeds a paired two-sided test (α = 0.05, power 0.8, normal approximation) needs to detect a
    mean difference ``delta`` when the per-seed differences have standard deviation ``sigma`` (same units).

    Raises:
        ValueError: ``delta`` is not > 0 or ``sigma`` is negative or not finite.
    """
    if not delta > 0:
        raise ValueError(f"delta must be > 0 (got {delta!r}): the difference to detect, e.g. 0.05 for 5 points")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0 (got {sigma!r})")
    return ((Z_ALPHA + Z_POWER) * sigma / delta) ** 2


def paired_spread(runs: list[dict[str, Any]], arm: str, base: str) -> list[dict[str, Any]]:
    """Per held-out evaluation index (before training, each kept version, the end): the paired
    differences arm − base over the seeds both have, their standard deviation σ and the mean
    rollouts and policy versions (learner steps) at that point. Runs are ``compare.json``'s
    ``runs`` (each with ``sampler``, ``seed``, ``heldout_curve``).

    Returns:
        one dict per index with ``index``, ``rollouts``, ``policy_version`` (None at the end),
        ``diffs`` (per seed), ``mean``, ``sigma`` (None with fewer than 2 seeds), ``seeds``.

    Raises:
        ValueError: the two arms' curves differ in length on a seed (not the same evaluation marks).
    """
    by = {(r["sampler"], r["seed"]): r.get("heldout_curve") or [] for r in runs}
    seeds = sorted(s for (a, s), c in by.items() if a == arm and c and by.get((base, s)))
    if not seeds:
        return []
    lengths = {len(by[(arm, s)]) for s in seeds} | {len(by[(base, s)]) for s in seeds}
    if len(lengths) != 1:
        raise ValueError(f"{arm} and {base} curves have {sorted(lengths)} points: compare runs made with one --eval-points")
    out = []
    for i in range(lengths.pop()):
        pairs = [(by[(arm, s)][i], by[(base, s)][i]) for s in seeds]
        diffs = [
            a["accuracy"] - b["accuracy"] for a, b in pairs if a.get("accuracy") is not None and b.get("accuracy") is not None
        ]
        versions = [p.get("policy_version") for pair in pairs for p in pair if p.get("policy_version") is not None]
        out.append(
            {
                "index": i,
                "rollouts": statistics.fmean(p["rollouts"] for pair in pairs for p in pair),
                "policy_version": statistics.fmean(versions) if versions else None,
                "diffs": diffs,
                "mean": statistics.fmean(diffs) if diffs else None,
                "sigma": statistics.stdev(diffs) if len(diffs) > 1 else None,
                "seeds": seeds,
            }
        )
    return out


def result_items(compare: dict[str, Any], base: str, delta: float, command: str, note: str) -> list[dict[str, Any]]:
    """results.json entries (``method.power.*``) for every arm of ``compare`` against ``base``."""
    from benchmarks.results import Results

    res = Results(command, note=note, prefix="method.power.")
    for arm in compare["samplers"]:
        if arm == base:
            continue
        rows = [r for r in paired_spread(compare["runs"], arm, base) if r["sigma"] is not None]
        if not rows:
            continue
        name = f"{arm.replace('-', '_')}_vs_{base}"
        for r in rows[1:]:  # index 0 is before training: both arms are the same model there
            res.add(
                f"{name}.sigma_at_{r['index']}",
                r["sigma"],
                "fraction",
                rollouts=r["rollouts"],
                policy_version=r["policy_version"],
                per_seed=r["diffs"],
                seeds=r["seeds"],
                how="standard deviation over seeds of the paired held-out difference (arm minus base) at this evaluation",
            )
        last = rows[-1]
        res.add(
            f"{name}.seeds_for_{round(delta * 100)}pts",
            seeds_needed(last["sigma"], delta),
            "seeds",
            sigma=last["sigma"],
            n=len(last["diffs"]),
            sigma_rel_se=1 / math.sqrt(2 * (len(last["diffs"]) - 1)),
            how=f"((1.96 + 0.84) sigma / {delta:g})^2 at the end of the run: seeds a paired test (alpha 0.05, power 0.8) "
            "needs to detect the difference",
        )
    return res.items


def _version(v: float | None) -> str:
    return "end" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Print σ and the seeds needed per arm and evaluation; with ``--out`` merge the figures into it."""
    from benchmarks.results import merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.power", description=__doc__.split("\n\n")[0])
    ap.add_argument("compare_dir", type=Path, help="a prioreplay compare directory (holding compare.json)")
    ap.add_argument("--base", default="grpo", help="the baseline arm (default grpo)")
    ap.add_argument("--delta", type=float, default=0.05, help="the held-out difference to detect (0.05: 5 points)")
    ap.add_argument("--out", type=Path, help="results.json to merge the figures into")
    ap.add_argument("--note", default="", help="the load and anything else a reader of results.json should know")
    a = ap.parse_args(argv)
    try:
        compare = json.loads((a.compare_dir / "compare.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{a.compare_dir}: no readable compare.json ({e}); give a prioreplay compare directory") from None
    if a.base not in compare["samplers"]:
        raise SystemExit(f"--base {a.base!r} is not an arm of this comparison ({', '.join(compare['samplers'])})")
    for arm in compare["samplers"]:
        if arm == a.base:
            continue
        for r in paired_spread(compare["runs"], arm, a.base):
            if r["sigma"] is None:
                continue
            print(
                f"{arm} - {a.base} at {r['rollouts']:.0f} rollouts (version {_version(r['policy_version'])}): mean "
                f"{r['mean'] * 100:+.1f} pts, sd {r['sigma'] * 100:.1f} pts over {len(r['diffs'])} seeds -> "
                f"{seeds_needed(r['sigma'], a.delta):.0f} seeds for {a.delta * 100:g} pts"
            )
    if a.out:
        command = "python -m benchmarks.power " + " ".join(sys.argv[1:] if argv is None else argv)
        merge_results(a.out, result_items(compare, a.base, a.delta, command, a.note))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
