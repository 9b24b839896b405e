"""The runs of issue 42's decision plan (docs/METHOD.md, "The decision plan"), kept across sessions.

The plan's comparison is 5 arms × 6 seeds of ~10-20 CPU-minutes each: more than one session. Its
amendment counts runs per (seed, arm): each finished run's ``report.json`` (all that
``prioreplay compare --runs`` reads) is committed under ``benchmarks/runs/decision/<arm>-seed<S>/``,
and a seed counts once its five arms are there. Three commands::

    python -m benchmarks.decision_runs status            # what is finished, what is next
    python -m benchmarks.decision_runs next [--seeds N]  # the plan's command for the next missing runs
    python -m benchmarks.decision_runs collect RUN_DIR   # copy RUN_DIR's finished runs' report.json in

and the figures, over the complete seeds only (``compare --runs`` refuses runs whose settings
differ in anything but the sampler and the seed)::

    python -m benchmarks.decision_runs figures --out runs/decision-figures
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

#: The plan's arms, in the order each seed runs them (seed-major).
ARMS = ("grpo", "dapo", "heap", "heap-grpo", "heap-prior")
#: The plan's seeds.
SEEDS = tuple(range(6))
#: Where the finished runs' reports are kept (committed).
KEPT = Path(__file__).resolve().parent / "runs" / "decision"
#: The plan's command but for --samplers, --seed, --seeds and --run-dir (docs/METHOD.md).
PLAN = (
    "prioreplay compare --parallel 2 --threads 1 --backend vllm"
    " --dataset arithmetic:512:0:tiers --rollouts 1024 --eval-points 7 --eval-size 256 --no-pool-audit"
)


def finished(kept: Path = KEPT) -> set[tuple[int, str]]:
    """(seed, arm) of every kept run (a folder ``<arm>-seed<S>`` holding a ``report.json``)."""
    out = set()
    for report in kept.glob("*-seed*/report.json"):
        arm, _, seed = report.parent.name.rpartition("-seed")
        if arm in ARMS and seed.isdigit():
            out.add((int(seed), arm))
    return out


def complete_seeds(done: set[tuple[int, str]]) -> list[int]:
    """The seeds whose five arms are all finished (the only ones the plan counts)."""
    return [s for s in SEEDS if all((s, a) in done for a in ARMS)]


def next_command(done: set[tuple[int, str]], run_dir: str = "runs/decision") -> str | None:
    """The plan's command for the first seed with missing arms (only those arms); None when all are done."""
    for seed in SEEDS:
        missing = [a for a in ARMS if (seed, a) not in done]
        if missing:
            return f"{PLAN} --samplers {','.join(missing)} --seed {seed} --seeds 1 --run-dir {run_dir}/seed{seed}"
    return None


def collect(run_dir: Path, kept: Path = KEPT) -> list[Path]:
    """Copy the ``report.json`` of every finished run under ``run_dir`` (``<arm>-seed<S>/``) into
    ``kept``; returns the copies. Runs without a report (unfinished, failed) are left out.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
    """
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory (give the --run-dir the runs wrote to)")
    out = []
    for report in sorted(run_dir.glob("*-seed*/report.json")):
        arm, _, seed = report.parent.name.rpartition("-seed")
        if arm not in ARMS or not seed.isdigit():
            continue
        dst = kept / report.parent.name / "report.json"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report, dst)
        out.append(dst)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decision_runs", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status", help="finished runs and complete seeds")
    sub.add_parser("next", help="the plan's command for the next missing runs")
    c = sub.add_parser("collect", help="keep the finished runs of a run directory")
    c.add_argument("run_dir", type=Path)
    f = sub.add_parser("figures", help="prioreplay compare --runs over the complete seeds")
    f.add_argument("--out", default="runs/decision-figures", help="compare's --run-dir (default: %(default)s)")
    args = ap.parse_args(argv)
    done = finished()
    if args.cmd == "status":
        for seed in SEEDS:
            print(f"seed {seed}: " + " ".join(f"{a}{'+' if (seed, a) in done else '-'}" for a in ARMS))
        print(f"complete seeds: {complete_seeds(done) or 'none'} (the decision needs {len(SEEDS)})")
    elif args.cmd == "next":
        print(next_command(done) or "every run of the plan is finished")
    elif args.cmd == "collect":
        for path in collect(args.run_dir):
            print(f"kept {path}")
    else:
        seeds = complete_seeds(done)
        if len(seeds) < 2:
            print(f"complete seeds {seeds}: the leave-one-out target needs 2 (docs/METHOD.md)", file=sys.stderr)
            return 1
        runs = ",".join(str(KEPT / f"{a}-seed{s}") for s in seeds for a in ARMS)
        cmd = ["prioreplay", "compare", "--runs", runs, "--run-dir", args.out]
        print(shlex.join(cmd), flush=True)
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
