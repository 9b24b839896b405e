"""Compare TRL runs with TRL's own sampling against runs with prioreplay's (docs/INTEGRATIONS.md).

Each run directory holds the ``trainer_state.json`` that ``trainer.save_state()`` writes (its
``log_history`` has TRL's logged metrics). Per arm, over its runs (one per seed, same model, data,
steps and batch, so the same rollout budget), it prints the mean and a 95% percentile-bootstrap
interval of:

* ``effective_group_fraction``: 1 − TRL's ``frac_reward_zero_std``, averaged over the logged steps:
  the share of groups whose rewards differ, the only ones with a GRPO gradient;
* ``final_reward``: TRL's ``reward`` (mean training reward) averaged over the last fifth of the
  logged steps (on each arm's own problems: prioritized problems are harder on purpose);
* ``eval_reward``: the last ``eval_reward`` when the runs evaluated on a held-out ``eval_dataset``
  (the fair accuracy comparison).

Usage:
    python examples/compare_trl_runs.py --trl runs/trl-s0 runs/trl-s1 --prioreplay runs/pr-s0 runs/pr-s1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prioreplay.apps.compare_trl import interval, run_metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl", nargs="+", type=Path, required=True, help="run directories, TRL's sampling")
    ap.add_argument("--prioreplay", nargs="+", type=Path, required=True, help="run directories, prioreplay's")
    args = ap.parse_args(argv)
    arms = {"trl": [run_metrics(d) for d in args.trl], "prioreplay": [run_metrics(d) for d in args.prioreplay]}
    print(f"{'metric':<26} {'arm':<11} {'mean':>8}  95% interval       runs")
    for metric in ("effective_group_fraction", "final_reward", "eval_reward"):
        for arm, runs in arms.items():
            mean, lo, hi, n = interval([r[metric] for r in runs])
            print(f"{metric:<26} {arm:<11} {mean:8.3f}  [{lo:.3f}, {hi:.3f}]  {n:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
