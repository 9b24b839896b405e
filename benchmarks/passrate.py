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

``--dataset SOURCE`` measures any ``prioreplay load`` source instead (a ``mix:`` mix, a
``reasoning-gym:`` spec, a file; its first ``--problems`` problems) with one ``--stops`` setting,
and adds a ``by_task`` breakdown of the same figures per problem ``task`` (:func:`problem_task`).
With ``--out benchmarks/results.json --name NAME --note "load ..."`` the row goes to the results
file as ``NAME.first_visit.{all_wrong,mixed,all_right}_share``, ``NAME.pass_rate`` and
``NAME.task.<task>.*``; ``--from-json FILE`` records the row of an earlier ``--json`` run instead of
measuring again. The figures of the ``smollm2-tails`` mix (``mix.*`` in benchmarks/RESULTS.md)::

    OMP_NUM_THREADS=1 python -m benchmarks.passrate --dataset mix:smollm2-tails --problems 96 \
        --group-size 4 --stops newline --max-new-tokens 24 --json mix.json
    python -m benchmarks.passrate --from-json mix.json --out benchmarks/results.json --name mix --note "..."
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
    from prioreplay.problems import problem_task
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.verifiers import verify

    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
    rewards, tokens, kinds = [], [], {"mixed": 0, "all_wrong": 0, "all_correct": 0}
    per_task: dict[str, dict[str, int]] = {}
    t0 = time.perf_counter()
    for start in range(0, len(problems), batch_problems):
        chunk = problems[start : start + batch_problems]
        ids = [apply_chat_template(tokenizer, p.prompt) for p in chunk]
        groups = backend.generate(ids, group_size, params)
        for p, group in zip(chunk, groups, strict=True):
            rs = [verify(p.verifier, c.text, p.answer).reward for c in group]
            rewards += rs
            tokens += [len(c.token_ids) for c in group]
            kind = "all_correct" if min(rs) == 1 else "all_wrong" if max(rs) == 0 else "mixed"
            kinds[kind] += 1
            t = per_task.setdefault(problem_task(p), {"groups": 0, "passed": 0, "completions": 0} | dict.fromkeys(kinds, 0))
            t.update(groups=t["groups"] + 1, passed=t["passed"] + sum(r == 1 for r in rs), completions=t["completions"] + len(rs))
            t[kind] += 1
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
        "by_task": {
            name: {
                "groups": t["groups"],
                "pass_rate": t["passed"] / t["completions"],
                **{f"{kind}_fraction": t[kind] / t["groups"] for kind in kinds},
            }
            for name, t in sorted(per_task.items())
        },
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
    ap.add_argument("--dataset", default=None, help="measure this source (first --problems) instead of the levels")
    ap.add_argument("--out", type=Path, default=None, help="with --dataset or --from-json: record the row in this results file")
    ap.add_argument("--name", default="mix", help="figure name prefix for --out")
    ap.add_argument("--note", default="", help="measurement conditions (load) stored with each figure")
    ap.add_argument("--from-json", type=Path, default=None, help="record this earlier --json run's row (no model run)")
    args = ap.parse_args(argv)
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        _record(doc["rows"][0], doc["args"], args)
        return 0

    import torch

    from prioreplay.datasets import arithmetic_problems
    from prioreplay.models import resolve_model
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    torch.manual_seed(args.seed)
    backend = TransformersBackend(resolve_model(args.model))
    if args.dataset:
        return _measure_dataset(args, backend)
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


def _measure_dataset(args: argparse.Namespace, backend) -> int:
    """``--dataset``: one row for the source's first ``--problems`` problems, with its ``by_task`` table."""
    from prioreplay.datasets import iter_problems

    problems = list(iter_problems(args.dataset, limit=args.problems))
    stop = ("\n",) if args.stops == "newline" else ()
    row = measure(backend, backend.tokenizer, problems, args.group_size, args.temperature, args.max_new_tokens, stop, args.seed)
    row.update(dataset=args.dataset, stop=args.stops)
    print(f"{'task':<28} {'groups':>6} {'pass':>6} {'mixed':>6} {'wrong':>6} {'right':>6}")
    for name, t in [*row["by_task"].items(), ("(all)", row)]:
        print(
            f"{name:<28} {t['groups']:>6} {t['pass_rate']:6.1%} {t['mixed_fraction']:6.2f} "
            f"{t['all_wrong_fraction']:6.2f} {t['all_correct_fraction']:6.2f}",
            flush=True,
        )
    run_args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    if args.json:
        args.json.write_text(json.dumps({"args": run_args, "rows": [row]}, indent=1))
    if args.out:
        _record(row, run_args, args)
    return 0


def _command(run: dict) -> str:
    """The command line of a ``--dataset`` measurement, from its arguments."""
    return (
        f"OMP_NUM_THREADS=1 python -m benchmarks.passrate --dataset {run['dataset']} --problems {run['problems']} "
        f"--group-size {run['group_size']} --temperature {run['temperature']} --stops {run['stops']} "
        f"--max-new-tokens {run['max_new_tokens']} --seed {run['seed']} --model {run['model']}"
    )


def _record(row: dict, run: dict, args: argparse.Namespace) -> None:
    """Merge one ``--dataset`` row into ``args.out`` (benchmarks/results.py) under ``args.name``."""
    from benchmarks.results import Results, merge_results

    if args.out is None:
        raise SystemExit("--from-json needs --out, the results file to record in")
    res = Results(_command(run), note=args.note, prefix=args.name + ".")
    extra = {"group_size": run["group_size"], "temperature": run["temperature"], "n": row["groups"], "dataset": run["dataset"]}
    res.add("pass_rate", row["pass_rate"], "fraction", ci95=row["pass_rate_ci95"], **extra)
    for kind, name in (("all_wrong", "all_wrong"), ("mixed", "mixed"), ("all_correct", "all_right")):
        res.add(f"first_visit.{name}_share", row[f"{kind}_fraction"], "fraction", **extra)
    for task, t in row["by_task"].items():
        res.add(f"task.{task}.pass_rate", t["pass_rate"], "fraction", **extra | {"n": t["groups"]})
        for kind, name in (("all_wrong", "all_wrong"), ("mixed", "mixed"), ("all_correct", "all_right")):
            res.add(f"task.{task}.first_visit.{name}_share", t[f"{kind}_fraction"], "fraction", **extra | {"n": t["groups"]})
    merge_results(args.out, res.items)


if __name__ == "__main__":
    raise SystemExit(main())
