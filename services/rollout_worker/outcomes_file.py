"""The worker's outcomes file (``--outcomes-file``): one JSON line per reported group, rewards only,
for offline analysis (docs/REWARDS.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from prioreplay.v1 import priority_service_pb2 as pb


def append_outcomes(
    path: Path, worker_id: str, lease_id: str, outcomes: Sequence[pb.ProblemOutcome], tasks: Sequence[str]
) -> None:
    """Append one JSON line per reported group to ``path`` (``--outcomes-file``) (the file and its
    folders are created): ``problem_id``, ``task`` (:func:`prioreplay.problems.problem_task`, same order as
    ``outcomes``), ``policy_version``, ``rewards`` (G floats, in completion order), ``passed``
    (G bools; only with ``--reward`` plugins), ``lease_id``, ``worker_id``, ``time_unix_s``.
    Rewards-only: no tokens."""
    now = round(time.time(), 3)
    lines = [
        json.dumps(
            {
                "problem_id": o.problem_id,
                "task": task,
                "policy_version": int(o.policy_version),
                "rewards": [c.reward for c in o.completions],
                **({"passed": [c.passed for c in o.completions]} if o.completions[0].HasField("passed") else {}),
                "lease_id": lease_id,
                "worker_id": worker_id,
                "time_unix_s": now,
            }
        )
        for o, task in zip(outcomes, tasks, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
