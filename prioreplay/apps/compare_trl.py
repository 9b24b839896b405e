"""TRL's own sampling against prioritized problems inside TRL, side by side (``make compare-trl``).

Per seed, two arms with the same model, data, seed, steps and batch (so the same generation budget:
``steps × B × G`` completions):

* ``trl``: ``trl.GRPOTrainer`` with its own sampler (a shuffled pass, ``RepeatSampler``);
* ``prioreplay``: ``PriorityGRPOTrainer`` against a fresh in-process priority server (memory
  store, no metrics port, so it never collides with a running server).

The task is the demo's: ``arithmetic:N:SEED:easy`` problems with their verifier, scored on the
text before the first stop string (``\\n``, the demo's ``--stop``), at most ``max_new_tokens``
tokens. A held-out slice (``datasets.evaluation_slice``, the demo's) is scored greedily before
training and after each arm (``apps.evaluate``), with Newcombe's paired interval for the change.

Each run directory keeps ``trainer_state.json`` (TRL's logged metrics), ``held_out.json`` and, for the
prioritized arm, ``server_stats.json`` (GetStats at the end). Disk stays bounded:
``save_strategy="no"`` (no checkpoints) and the final weights are deleted once scored.
``summary.json`` has, per arm, the mean and a 95% bootstrap interval over seeds of the
effective-group fraction (1 − TRL's ``frac_reward_zero_std``), the mean training reward and the
held-out change (``examples/compare_trl_runs.py``'s figures).

Usage::

    python -m prioreplay.apps.compare_trl --model smollm2-135m --seeds 3 --steps 100 --out runs/compare-trl
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger("prioreplay.compare_trl")

#: transformers' deprecation of the ``gradient_checkpointing`` names, which TRL's GRPOConfig and
#: GRPOTrainer use themselves (not ours): four FutureWarnings a run, silenced around those calls.
GC_WARNING = r"`(is_)?gradient_checkpointing\w*` is deprecated"


def run_metrics(run_dir: Path) -> dict[str, float]:
    """TRL's figures of one run from its ``trainer_state.json`` (NaN when it logged none).

    ``effective_group_fraction``: 1 − ``frac_reward_zero_std`` averaged over the logged steps (the
    share of groups whose rewards differ: the only ones with a GRPO gradient); ``final_reward``:
    ``reward`` averaged over the last fifth of the logged steps (on each arm's own problems);
    ``eval_reward``: the last ``eval_reward`` when the run evaluated on an ``eval_dataset``.

    Raises:
        FileNotFoundError: the directory has no trainer_state.json.
    """
    import numpy as np

    path = run_dir / "trainer_state.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: call trainer.save_state() after trainer.train()")
    history = json.loads(path.read_text())["log_history"]
    steps = [h for h in history if "frac_reward_zero_std" in h]
    rewards = [h["reward"] for h in steps if "reward" in h]
    tail = rewards[-max(1, len(rewards) // 5) :] if rewards else []
    evals = [h["eval_reward"] for h in history if "eval_reward" in h]
    return {
        "effective_group_fraction": float(np.mean([1 - h["frac_reward_zero_std"] for h in steps])) if steps else math.nan,
        "final_reward": float(np.mean(tail)) if tail else math.nan,
        "eval_reward": float(evals[-1]) if evals else math.nan,
    }


def interval(values: list[float], seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n): the mean and its 95% percentile-bootstrap interval (Efron), NaNs dropped."""
    import numpy as np

    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan, 0
    means = x[np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(x.mean()), float(lo), float(hi), int(x.size)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (every size has a small default for a CPU run; ``--help`` lists them)."""
    ap = argparse.ArgumentParser(prog="compare-trl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias, model directory or cached HF id (prioreplay model)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm (0 .. N-1 from --seed)")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument(
        "--steps",
        type=int,
        default=60,
        help="optimizer steps per run (the same budget in both arms; 60 ≈ 11 min an arm on 2 quiet CPU cores)",
    )
    ap.add_argument("--problems", type=int, default=64, help="training problems (arithmetic:N:seed:easy)")
    ap.add_argument("--eval-size", type=int, default=64, help="held-out problems scored before and after (0 skips)")
    ap.add_argument("--batch", type=int, default=4, help="problems per step B")
    ap.add_argument("--group-size", type=int, default=4, help="completions per problem G")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="completion length in tokens at most")
    ap.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    ap.add_argument("--out", type=Path, default=Path("runs/compare-trl"), help="where the runs and summary.json go")
    ap.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="summarize the runs of earlier compare-trl outputs (their summary.json) into --out instead of training "
        "(e.g. one process per seed run side by side)",
    )
    args = ap.parse_args(argv)
    for name in ("seeds", "steps", "problems", "batch", "group_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} ({getattr(args, name)}) must be >= 1")
    if args.group_size < 2:
        ap.error(f"--group-size ({args.group_size}) must be >= 2: GRPO needs two completions to compare")
    return args


def task(args: argparse.Namespace, seed: int):
    """(train dataset, reward function, held-out problems) of the demo's easy arithmetic."""
    from datasets import Dataset

    from prioreplay.datasets import evaluation_slice, iter_problems
    from prioreplay.verifiers import verify

    source = f"arithmetic:{args.problems}:{seed}:easy"
    problems = list(iter_problems(source))
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": p.prompt}] for p in problems],
            "answer": [p.answer for p in problems],
            "verifier": [p.verifier for p in problems],
        }
    )

    def correct(completions, answer, verifier, **kwargs):
        """1.0 when the text before the first newline (the demo's stop) verifies, else 0.0."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [verify(v, t.split("\n", 1)[0], a).reward for t, a, v in zip(texts, answer, verifier, strict=True)]

    held_out = evaluation_slice(source, args.eval_size, seed=seed + 1) if args.eval_size else []
    return dataset, correct, held_out


def grpo_config(args: argparse.Namespace, out: Path, seed: int):
    """The GRPOConfig both arms share: no checkpoints, metrics every step, CPU unless CUDA."""
    import torch
    from trl import GRPOConfig

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GC_WARNING, category=FutureWarning)
        return GRPOConfig(
            output_dir=str(out),
            max_steps=args.steps,
            per_device_train_batch_size=args.batch * args.group_size,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            learning_rate=args.lr,
            logging_steps=1,
            save_strategy="no",  # bounded disk: no checkpoints
            report_to="none",
            seed=seed,
            disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),
        )


def run_arm(args: argparse.Namespace, arm: str, seed: int, model_dir: Path, before: list[bool] | None) -> dict[str, Any]:
    """Train one arm for one seed; write its run directory; return its figures."""
    from trl import GRPOTrainer

    from prioreplay.integrations.trl import PriorityGRPOTrainer

    out = args.out / f"{arm}-seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    dataset, correct, held_out = task(args, seed)
    config = grpo_config(args, out, seed)
    server, t0 = None, time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GC_WARNING, category=FutureWarning)
        if arm == "trl":
            trainer = GRPOTrainer(model=str(model_dir), reward_funcs=correct, args=config, train_dataset=dataset)
        else:
            server = start_server(seed)
            trainer = PriorityGRPOTrainer(
                model=str(model_dir), reward_funcs=correct, args=config, train_dataset=dataset, priority_server=server.address
            )
        trainer.train()
    wall = time.perf_counter() - t0
    trainer.save_state()
    if server is not None:
        (out / "server_stats.json").write_text(json.dumps(server_stats(server.address), indent=1))
        server.stop()
    after = score_final(trainer, out, model_dir, held_out, args.max_new_tokens) if held_out else None
    from prioreplay.apps.demo_report import held_out_summary

    held = {**held_out_summary(before, after), "eval_size": len(held_out)}
    (out / "held_out.json").write_text(json.dumps(held, indent=1))
    return {"arm": arm, "seed": seed, "wall_s": wall, **run_metrics(out), **held}


def start_server(seed: int):
    """A fresh in-process priority server (memory store, port 0, no metrics port, no snapshots)."""
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store

    cfg = ServerConfig(store="memory", port=0, metrics_port=0, snapshot_interval_s=0, seed=seed)
    return BackgroundServer(lambda: create_store("memory", cfg.to_store_config(), namespace="compare-trl"), cfg).start()


def server_stats(address: str) -> dict[str, Any]:
    """GetStats of the server at ``address`` as a JSON-ready dict (proto field names)."""
    from google.protobuf.json_format import MessageToDict

    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings

    with PriorityClient(ClientSettings(server=address)) as c:
        return MessageToDict(c.stats(), preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def score_final(trainer, out: Path, model_dir: Path, held_out: list, max_new_tokens: int) -> list[bool]:
    """Greedy held-out correctness of the trained weights; the saved weights are deleted after."""
    from prioreplay.apps.evaluate import evaluate_each

    final = out / "final"
    trainer.save_model(str(final))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        if (model_dir / name).exists() and not (final / name).exists():
            shutil.copy(model_dir / name, final / name)
    try:
        return evaluate_each(final, held_out, max_new_tokens=max_new_tokens, stop=["\n"])
    finally:
        shutil.rmtree(final, ignore_errors=True)  # bounded disk: only the figures are kept


FIGURES = ("effective_group_fraction", "final_reward", "accuracy_change", "accuracy_after", "wall_s")


def _value(run: dict[str, Any], key: str) -> float:
    return float(run[key]) if run.get(key) is not None else math.nan


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and figure: mean, 95% bootstrap interval over seeds, and the number of runs; and under
    ``prioreplay_minus_trl`` the same of the per-seed difference (the paired comparison: both arms
    of a seed share the model, data, held-out set and budget), for the seeds both arms ran."""
    out: dict[str, Any] = {}
    for arm in ("trl", "prioreplay"):
        runs = [r for r in results if r["arm"] == arm]
        out[arm] = {}
        for key in FIGURES:
            mean, lo, hi, n = interval([_value(r, key) for r in runs])
            out[arm][key] = {"mean": mean, "ci95": [lo, hi], "runs": n}
    by_seed = {(r["arm"], r["seed"]): r for r in results}
    seeds = sorted(s for a, s in by_seed if a == "trl" and ("prioreplay", s) in by_seed)
    out["prioreplay_minus_trl"] = {}
    for key in FIGURES:
        diffs = [_value(by_seed["prioreplay", s], key) - _value(by_seed["trl", s], key) for s in seeds]
        mean, lo, hi, n = interval(diffs)
        out["prioreplay_minus_trl"][key] = {"mean": mean, "ci95": [lo, hi], "runs": n, "per_seed": diffs}
    return out


def combine(dirs: list[Path]) -> list[dict[str, Any]]:
    """The runs of earlier outputs' ``summary.json`` files, refused when their settings differ in
    anything but the seeds (so only like runs are summarized together).

    Raises:
        SystemExit: a directory has no summary.json, or the settings differ (both named).
    """
    runs: list[dict[str, Any]] = []
    first: dict[str, str] | None = None
    ignored = {"seed", "seeds", "out", "combine"}
    for d in dirs:
        path = d / "summary.json"
        if not path.is_file():
            raise SystemExit(f"compare-trl --combine: {path} does not exist (run compare-trl with --out {d} first)")
        summary = json.loads(path.read_text())
        settings = {k: v for k, v in summary["settings"].items() if k not in ignored}
        if first is None:
            first = settings
        elif settings != first:
            diff = sorted(k for k in set(settings) | set(first) if settings.get(k) != first.get(k))
            raise SystemExit(f"compare-trl --combine: {d} differs from {dirs[0]} in {', '.join(diff)}; combine like runs only")
        runs += summary["runs"]
    return runs


def main(argv: list[str] | None = None) -> int:
    """Run both arms for every seed, then write and print ``summary.json``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = combine(args.combine) if args.combine else train_all(args)
    arms = summarize(results)
    summary = {"settings": {k: str(v) for k, v in vars(args).items()}, "runs": results, "arms": arms}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for arm, figures in arms.items():
        line = ", ".join(
            f"{k} {v['mean']:.3f} [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}] (n={v['runs']})" for k, v in figures.items()
        )
        print(f"{arm:<10} {line}")
    return 0


def train_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both arms for every seed (``--seed`` .. ``--seed + --seeds − 1``): the runs' figures."""
    from prioreplay.apps.evaluate import evaluate_each
    from prioreplay.models import resolve_model

    model_dir = resolve_model(args.model)
    results = []
    for seed in range(args.seed, args.seed + args.seeds):
        held_out = task(args, seed)[2]
        before = evaluate_each(model_dir, held_out, max_new_tokens=args.max_new_tokens, stop=["\n"]) if held_out else None
        for arm in ("trl", "prioreplay"):
            log.info("seed %d, arm %s: %d steps of B=%d × G=%d", seed, arm, args.steps, args.batch, args.group_size)
            results.append(run_arm(args, arm, seed, model_dir, before))
    return results


if __name__ == "__main__":
    sys.exit(main())
