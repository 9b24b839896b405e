"""The pool audit of a finished run: are the solved and unsolved pools still true of the final policy?

A problem leaves the heap for the unsolved pool after one all-wrong group (the solved pool after
one all-correct group) and waits there for a retest. When the policy improves faster than the
retests come round, the pools fill with problems that the policy would now answer sometimes, or
fail sometimes: they would give a mixed group, a gradient, if they were sampled. The audit scores
every pooled problem with the final policy, G samples each at the run's temperature (the rollout
worker's backend, chat template and verifier), and counts a problem **misfiled** when

* it is in the unsolved pool and p̂ ≥ 1/G (at least one of G completions right), or
* it is in the solved pool and p̂ ≤ 1 − 1/G (at least one of G completions wrong),

where p̂ is the share of its G completions rewarded 1. Pools are read from the memory store's
final snapshot (a leased problem counts in the pool it returns to).

The misfiled share comes with its 95% Wilson interval over the pooled problems. Never pooling
would score 0 misfiled, so the audit also reports what misfiling cost: the **lost opportunity
share**, Σ over misfiled problems of the time since their last test (the pools' clock: batches, or
policy versions with ``--retest-versions``), over problems × the clock at the end — the share of
the run's problem-time during which a problem that would now give a gradient (or is solved) sat
in the wrong pool, at most (it may have become solvable later than its last test).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord, TaskLabels, problem_task
from prioreplay.rules import Pool

#: Fields of a snapshot's problem row (``snapshot.encode``) the audit reads.
_ID, _PROMPT, _ANSWER, _VERIFIER, _METADATA, _HOME, _SCORE = 0, 1, 2, 3, 4, 9, 10


def pooled_problems(snapshot_path: Path) -> dict[str, list[ProblemRecord]]:
    """The problems of the solved and unsolved pools in a memory-store snapshot.

    Returns:
        ``{"solved": [...], "unsolved": [...]}``, in snapshot order; a leased problem is listed
        under the pool it returns to.

    Raises:
        InvalidArgument: the file is missing or not a snapshot (the message names the path).
    """
    try:
        doc = json.loads(Path(snapshot_path).read_text())
        rows = doc["problems"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidArgument(f"{snapshot_path}: not a memory-store snapshot ({e}); audit a run of the memory store") from None
    out: dict[str, list[ProblemRecord]] = {"solved": [], "unsolved": []}
    for row in rows:
        home = Pool(int(row[_HOME]))
        if home in (Pool.SOLVED, Pool.UNSOLVED):
            out["solved" if home is Pool.SOLVED else "unsolved"].append(
                ProblemRecord(
                    id=row[_ID], prompt=row[_PROMPT], answer=row[_ANSWER], verifier=row[_VERIFIER], metadata=dict(row[_METADATA])
                )
            )
    return out


def pool_clock(snapshot_path: Path) -> tuple[dict[str, float], int, float]:
    """Each pooled problem's time since its last test, the number of problems, and the pools'
    clock at the end (the step, or the policy version when the run had ``retest_versions`` >= 1).

    Raises:
        InvalidArgument: the file is missing or not a snapshot.
    """
    try:
        doc = json.loads(Path(snapshot_path).read_text())
        rows = doc["problems"]
        by_version = int((doc.get("settings") or {}).get("retest_versions") or 0) > 0
        now = float(doc["policy"][0] if by_version else doc["step"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise InvalidArgument(f"{snapshot_path}: not a memory-store snapshot ({e}); audit a run of the memory store") from None
    ages = {row[_ID]: max(0.0, now - float(row[_SCORE])) for row in rows if Pool(int(row[_HOME])) in (Pool.SOLVED, Pool.UNSOLVED)}
    return ages, len(rows), now


def misfiled(pool: str, rewards: Sequence[float]) -> bool:
    """Whether a problem of ``pool`` ("solved" / "unsolved") with these G rewards is misfiled.

    Raises:
        InvalidArgument: an unknown pool or an empty group.
    """
    if not rewards:
        raise InvalidArgument("misfiled() needs a group of at least one reward (G >= 1)")
    p, g = sum(1 for r in rewards if r == 1.0) / len(rewards), len(rewards)
    if pool == "unsolved":
        return p >= 1.0 / g
    if pool == "solved":
        return p <= 1.0 - 1.0 / g
    raise InvalidArgument(f"pool ({pool!r}) must be 'solved' or 'unsolved'")


def summarize(
    pools: dict[str, list[ProblemRecord]],
    rewards: dict[str, list[float]],
    clock: tuple[dict[str, float], int, float] | None = None,
) -> dict[str, Any]:
    """The audit's figures from each pooled problem's G rewards (keyed by problem id).

    Args:
        clock: :func:`pool_clock`'s (ages, problems, now), for the lost opportunity share.

    Returns:
        ``pooled``, ``misfiled``, ``misfiled_share`` (None when no problem is pooled) with
        ``misfiled_ci95`` (Wilson) overall and per pool (``solved`` / ``unsolved``: ``pooled``,
        ``misfiled``, ``misfiled_share``, ``mean_pass_rate``), ``misfiled_ids``, ``by_task``
        (``{task: {pool: {"pooled", "misfiled"}}}``, tasks by :func:`problem_task` capped as
        :class:`TaskLabels`), and with ``clock`` ``lost_opportunity_share`` (module docstring;
        None when the clock is still 0).
    """
    from prioreplay.intervals import wilson

    out: dict[str, Any] = {"misfiled_ids": [], "by_task": {}}
    labels = TaskLabels()
    total = bad = 0
    for pool, problems in pools.items():
        flags = [misfiled(pool, rewards[p.id]) for p in problems]
        rates = [sum(rewards[p.id]) / len(rewards[p.id]) for p in problems]
        for p, f in zip(problems, flags, strict=True):
            cell = out["by_task"].setdefault(labels.label(problem_task(p)), {}).setdefault(pool, {"pooled": 0, "misfiled": 0})
            cell["pooled"] += 1
            cell["misfiled"] += int(f)
        out["misfiled_ids"] += [p.id for p, f in zip(problems, flags, strict=True) if f]
        out[pool] = {
            "pooled": len(problems),
            "misfiled": sum(flags),
            "misfiled_share": sum(flags) / len(flags) if flags else None,
            "mean_pass_rate": sum(rates) / len(rates) if rates else None,
        }
        total, bad = total + len(problems), bad + sum(flags)
    out.update(pooled=total, misfiled=bad, misfiled_share=bad / total if total else None)
    out["misfiled_ci95"] = list(wilson(bad, total)) if total else None
    if clock is not None:
        ages, n_problems, now = clock
        lost = sum(ages.get(pid, 0.0) for pid in out["misfiled_ids"])
        out["lost_opportunity_share"] = lost / (n_problems * now) if n_problems and now > 0 else None
    return out


def audit(
    model_dir: Path,
    weights_dir: Path | None,
    snapshot_path: Path,
    *,
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    stop: Sequence[str],
    seed: int,
    progress: str | None = None,
) -> dict[str, Any]:
    """Score every pooled problem of a run with its final policy and return :func:`summarize`'s dict
    (plus ``group_size``, ``temperature`` and ``completions``, the audit's own cost).

    Args:
        model_dir: the base model directory; ``weights_dir``: the final published checkpoint
            (None: the base weights).
        snapshot_path: the memory store's final snapshot of the run.
        group_size: G completions per pooled problem; temperature, max_new_tokens, stop: the run's.
        seed: seeds the sampling (the same weights, problems and seed give the same audit).
        progress: show a progress bar (pooled problems scored) on stderr with this label; None: none.

    Raises:
        InvalidArgument: an unreadable snapshot or checkpoint.
    """
    from prioreplay.models import apply_chat_template, load_weights
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend
    from prioreplay.verifiers import verify

    pools = pooled_problems(snapshot_path)
    problems = pools["solved"] + pools["unsolved"]
    rewards: dict[str, list[float]] = {}
    if problems:
        from tqdm import tqdm

        backend = TransformersBackend(model_dir)
        if weights_dir is not None:
            load_weights(backend.model, weights_dir)  # as the held-out scoring loads it
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop=tuple(stop), seed=seed)
        bar = tqdm(total=len(problems), desc=progress, unit="problem", dynamic_ncols=True, disable=progress is None)
        with bar:
            for start in range(0, len(problems), 8):
                chunk = problems[start : start + 8]
                ids = [apply_chat_template(backend.tokenizer, p.prompt) for p in chunk]
                for p, group in zip(chunk, backend.generate(ids, group_size, params), strict=True):
                    rewards[p.id] = [verify(p.verifier, c.text, p.answer).reward for c in group]
                bar.update(len(chunk))
    out = summarize(pools, rewards, pool_clock(snapshot_path))
    out.update(group_size=group_size, temperature=temperature, completions=group_size * len(problems))
    return out


def audit_line(report_audit: dict[str, Any] | None) -> str:
    """The summary line of a run's pool audit."""
    if not report_audit or report_audit.get("pooled") is None:
        return "pool audit: not run" + (f" ({report_audit['skipped']})" if report_audit and "skipped" in report_audit else "")
    if not report_audit["pooled"]:
        return "pool audit: no problem in the solved or unsolved pool"
    u, s = report_audit["unsolved"], report_audit["solved"]
    ci = report_audit.get("misfiled_ci95")
    lost = report_audit.get("lost_opportunity_share")
    return (
        f"pool audit (final policy, G = {report_audit['group_size']}): {report_audit['misfiled']} of "
        f"{report_audit['pooled']} pooled problems misfiled ({report_audit['misfiled_share']:.0%}"
        + (f", 95% CI [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else "")
        + ")"
        + (f", {lost:.1%} of the run's problem-time lost to them" if lost is not None else "")
        + f"; unsolved {u['misfiled']}/{u['pooled']} answered at least once, solved {s['misfiled']}/{s['pooled']} "
        "failed at least once"
    )
