"""``python -m benchmarks.passrate``: a model's pass rate on the generated arithmetic problems.

Chooses the demo's default dataset by measurement: for each (level, prompt style, stop strings)
cell it samples G completions of ``--problems`` problems at the demo's temperature with the
worker's own backend, verifier and chat template, and prints a table of

* pass rate (share of completions rewarded 1) with its Wilson 95% interval,
* the share of groups that are mixed (some right, some wrong: the groups GRPO learns from),
* the share of all-wrong / all-correct groups,
* mean completion length (tokens) and seconds per group (shared machine: compare cells only).

Example: ``python -m benchmarks.passrate --levels mixed,easy --styles plain,line --problems 48``.
``--json FILE`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def measure(
    backend,
    tokenizer,
    problems,
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    stop: tuple[str, ...],
    seed: int,
    batch_problems: int = 8,
) -> dict:
    """Sample ``group_size`` completions per problem and score them; returns one table row."""
    from prioreplay.intervals import wilson
    from prioreplay.models import apply_chat_template
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.verifiers import verify

    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
    rewards, tokens, kinds = [], [], {"mixed": 0, "all_wrong": 0, "all_correct": 0}
    t0 = time.perf_counter()
    for start in range(0, len(problems), batch_problems):
        chunk = problems[start : start + batch_problems]
        ids = [apply_chat_template(tokenizer, p.prompt) for p in chunk]
        groups = backend.generate(ids, group_size, params)
        for p, group in zip(chunk, groups, strict=True):
            rs = [verify(p.verifier, c.text, p.answer).reward for c in group]
            rewards += rs
            tokens += [len(c.token_ids) for c in group]
            kinds["all_correct" if min(rs) == 1 else "all_wrong" if max(rs) == 0 else "mixed"] += 1
    seconds = time.perf_counter() - t0
    k, n = int(sum(r == 1 for r in rewards)), len(rewards)
    lo, hi = wilson(k, n)
    groups = len(problems)
    return {
        "pass_rate": k / n,
        "pass_rate_ci95": [lo, hi],
        "completions": n,
        "groups": groups,
        "mixed_fraction": kinds["mixed"] / groups,
        "all_wrong_fraction": kinds["all_wrong"] / groups,
        "all_correct_fraction": kinds["all_correct"] / groups,
        "mean_completion_tokens": sum(tokens) / len(tokens),
        "seconds_per_group": seconds / groups,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--levels", default="mixed,easy")
    ap.add_argument("--styles", default="plain,line")
    ap.add_argument("--stops", default="none,newline", help="comma list of: none, newline")
    ap.add_argument("--problems", type=int, default=48)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    from prioreplay.datasets import arithmetic_problems
    from prioreplay.models import resolve_model
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    torch.manual_seed(args.seed)
    backend = TransformersBackend(resolve_model(args.model))
    rows = []
    print(
        f"{'level':<6} {'style':<6} {'stop':<8} {'pass rate [95% CI]':<22} {'mixed':>6} {'wrong':>6} "
        f"{'right':>6} {'tokens':>7} {'s/group':>8}",
        flush=True,
    )
    for level in args.levels.split(","):
        for style in args.styles.split(","):
            problems = list(arithmetic_problems(args.problems, args.seed, namespace="passrate", level=level, style=style))
            for stop_name in args.stops.split(","):
                stop = ("\n",) if stop_name == "newline" else ()
                row = measure(
                    backend, backend.tokenizer, problems, args.group_size, args.temperature, args.max_new_tokens, stop, args.seed
                )
                row.update(level=level, style=style, stop=stop_name)
                rows.append(row)
                lo, hi = row["pass_rate_ci95"]
                print(
                    f"{level:<6} {style:<6} {stop_name:<8} {row['pass_rate']:6.1%} [{lo:5.1%}, {hi:5.1%}]   "
                    f"{row['mixed_fraction']:6.2f} {row['all_wrong_fraction']:6.2f} {row['all_correct_fraction']:6.2f} "
                    f"{row['mean_completion_tokens']:7.1f} {row['seconds_per_group']:8.2f}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
